// Kernels whose code ties them to their launch in different ways (read by tests/test_ir_launchsafety.py).
__global__ void __launch_bounds__(256, 2) bounded(float *a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] *= 2.0f;
}

// indexes with a compile-time block size: only a block of 256 covers the work
__global__ void fixed256(float *a, int n) {
  int i = blockIdx.x * 256 + threadIdx.x;
  if (i < n) a[i] += 1.0f;
}

// reads blockDim, but stages through a 256-element shared array indexed by threadIdx.x
__global__ void smallbuf(const float *in, float *out) {
  __shared__ float buf[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  buf[threadIdx.x] = in[i];
  __syncthreads();
  out[i] = buf[blockDim.x - 1 - threadIdx.x];
}

// a 2-D kernel that reads blockDim on both axes (any covering shape works)
__global__ void scale2d(float *a, int nx, int ny) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < nx && y < ny) a[y * nx + x] *= 3.0f;
}

// two elements per thread: blockIdx is scaled by a value derived from blockDim (the block's share follows it)
__global__ void pairs(float *a, int n) {
  int i = blockIdx.x * (blockDim.x * 2) + threadIdx.x;
  if (i < n) a[i] += 1.0f;
  if (i + blockDim.x < n) a[i + blockDim.x] += 1.0f;
}

// reads blockDim (a grid-stride loop) but starts each block at blockIdx * 128: only 128 threads cover it
__global__ void strided128(float *a, int n) {
  for (int i = blockIdx.x * 128 + threadIdx.x; i < n; i += blockDim.x * gridDim.x) a[i] *= 0.5f;
}

// a grid-stride sum per block, written at out[blockIdx.x]: each partial depends on the launch shape
__global__ void blockPartials(const float *in, double *out, int n) {
  __shared__ double part[256];
  double s = 0.0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) s += in[i];
  part[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int k = 0; k < blockDim.x; k++) t += part[k];
    out[blockIdx.x] = t;
  }
}
