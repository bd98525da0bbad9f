// vecAdd plus an unrelated kernel and variable: the static hash of vecAdd must not see them.
__device__ float unused_table[64];

__global__ void scaleKernel(float *x, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * s + unused_table[i % 64];
}

__global__ void vecAdd(const float *a, const float *b, float *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
