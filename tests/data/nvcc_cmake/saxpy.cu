#include <cstdio>
#include <cuda_runtime.h>
extern __device__ float scale(float v);
__global__ void saxpyScaled(float a, const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * scale(x[i]) + y[i];
}
int run_saxpy(int n) {
  float *x = nullptr, *y = nullptr;
  if (cudaMalloc(&x, n * sizeof(float)) != cudaSuccess || cudaMalloc(&y, n * sizeof(float)) != cudaSuccess) {
    std::printf("no GPU\n");
    return 1;
  }
  saxpyScaled<<<(n + 255) / 256, 256>>>(3.0f, x, y, n);
  return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
