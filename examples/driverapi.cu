// A kernel launched through the driver API (cuLaunchKernel on the CUfunction of a runtime kernel).
// The app does not link libcuda: it gets cuLaunchKernel from the runtime's driver entry point.
// Usage: driverapi [n=16384]
#include <cuda.h>

#include "common.h"

__global__ void driverScale(float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);

int main(int argc, char **argv) {
  int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  const size_t bytes = (size_t)n * sizeof(float);
  float *h = (float *)malloc(bytes);
  fill_unit(h, n, 14);
  float *x;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMemcpy(x, h, bytes, cudaMemcpyHostToDevice));

  cudaFunction_t fn;
  CHECK(cudaGetFuncBySymbol(&fn, (const void *)driverScale));
  void *entry = nullptr;
  cudaDriverEntryPointQueryResult found;
  CHECK(cudaGetDriverEntryPointByVersion("cuLaunchKernel", &entry, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || !entry) {
    fprintf(stderr, "driverapi: cuLaunchKernel not found in the driver\n");
    return 1;
  }
  float a = 3.0f;
  void *params[] = {&x, &a, &n};
  CUresult r = ((launch_fn)entry)((CUfunction)fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "driverapi: cuLaunchKernel failed: %d\n", (int)r);
    return 1;
  }
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(h, x, bytes, cudaMemcpyDeviceToHost));
  print_checksum(checksum_of(h, n));
  CHECK(cudaFree(x));
  free(h);
  return 0;
}
