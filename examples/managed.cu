// A kernel on managed (unified) memory from cudaMallocManaged.
// Usage: managed [n=16384]
#include "common.h"

__global__ void managedUpdate(float *data, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = a * data[i] + 0.5f;
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  float *data;
  CHECK(cudaMallocManaged(&data, (size_t)n * sizeof(float)));
  fill_unit(data, n, 16);
  managedUpdate<<<(n + 255) / 256, 256>>>(data, 2.0f, n);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  print_checksum(checksum_of(data, n));
  CHECK(cudaFree(data));
  return 0;
}
