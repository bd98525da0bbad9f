// A kernel template, instantiated explicitly (what a host-side launch of reduce<256, true> does):
// with -fgpu-rdc clang gives the instantiations weak_odr linkage, unlike the external linkage of plain
// kernels.
template <unsigned Block, bool Pow2>
__device__ float load(const float *in, unsigned i, unsigned n) {
  return (Pow2 || i < n) ? in[i] : 0.0f;
}

template <unsigned Block, bool Pow2>
__global__ void reduce(const float *in, float *out, unsigned n) {
  __shared__ float part[Block];
  unsigned t = threadIdx.x;
  part[t] = load<Block, Pow2>(in, blockIdx.x * Block + t, n);
  __syncthreads();
  for (unsigned s = Block / 2; s > 0; s >>= 1) {
    if (t < s) part[t] += part[t + s];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = part[0];
}

template __global__ void reduce<256, true>(const float *, float *, unsigned);
template __global__ void reduce<32, false>(const float *, float *, unsigned);
