// An app with a kernel of its own that also calls a kernel in a shared library (shlib_kernels.cu).
// Usage: shlib [n=16384]
#include "common.h"

extern "C" int shlib_scale(float *x, float a, int n);

__global__ void shlibOffset(float *x, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += b;
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  const size_t bytes = (size_t)n * sizeof(float);
  float *h = (float *)malloc(bytes);
  fill_unit(h, n, 19);
  float *x;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMemcpy(x, h, bytes, cudaMemcpyHostToDevice));
  CHECK((cudaError_t)shlib_scale(x, 2.0f, n));
  shlibOffset<<<(n + 255) / 256, 256>>>(x, 1.0f, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(h, x, bytes, cudaMemcpyDeviceToHost));
  print_checksum(checksum_of(h, n));
  CHECK(cudaFree(x));
  free(h);
  return 0;
}
