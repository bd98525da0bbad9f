// Any CUDA runtime call makes the runtime find the driver; built here with nvcc -cudart static|shared.
#include <cstdio>
#include <cuda_runtime.h>
int main() {
  int n = -1;
  cudaError_t e = cudaGetDeviceCount(&n);
  printf("cudaGetDeviceCount=%d\n", (int)e);
  return 0;
}
