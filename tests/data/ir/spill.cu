// Local memory (a private array written at a data-dependent index) and, under tight launch bounds,
// register spills.
__global__ void pressure(const float *in, float *out, int n, int k) {
  float acc[48];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
#pragma unroll
  for (int j = 0; j < 48; ++j) acc[j] = in[(i + j * 131) % n];
  acc[(int)in[i] % 48] += 1.0f;
#pragma unroll 1
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int j = 0; j < 48; ++j) acc[j] = acc[j] * acc[(j + 7) % 48] + acc[(j + 13) % 48];
  out[i] = acc[k % 48] + acc[(k + 1) % 48];
}

// A private array too large for registers, indexed by data: it lives in the stack frame under any assembler.
__global__ void scratch(const int *idx, float *out, int n) {
  float buf[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  for (int j = 0; j < 256; ++j) buf[j] = j * 0.5f + i;
  for (int j = 0; j < n; ++j) buf[idx[(i + j) % n] & 255] += 1.0f;
  out[i] = buf[idx[i] & 255];
}
