// Kernels on pinned host memory: one buffer from cudaMallocHost (read through unified addressing),
// one from cudaHostAlloc(cudaHostAllocMapped) (read and then written through its device pointer).
// Usage: pinned [n=16384]   (n=8388608: ~1 ms per kernel over PCIe on an H200)
#include "common.h"

__global__ void readPinned(const float *pinned, const float *mapped, float *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * pinned[i] + mapped[i];
}

__global__ void scaleMapped(float *mapped, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) mapped[i] *= a;
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  const size_t bytes = (size_t)n * sizeof(float);
  float *pinned, *mapped, *mapped_dev, *out;
  CHECK(cudaMallocHost(&pinned, bytes));
  CHECK(cudaHostAlloc(&mapped, bytes, cudaHostAllocMapped));
  CHECK(cudaHostGetDevicePointer(&mapped_dev, mapped, 0));
  fill_unit(pinned, n, 11);
  fill_unit(mapped, n, 12);
  CHECK(cudaMalloc(&out, bytes));
  CHECK(cudaMemset(out, 0, bytes));
  readPinned<<<(n + 255) / 256, 256>>>(pinned, mapped_dev, out, n);
  CHECK_LAUNCH();
  scaleMapped<<<(n + 255) / 256, 256>>>(mapped_dev, 3.0f, n);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  float *h = (float *)malloc(bytes);
  CHECK(cudaMemcpy(h, out, bytes, cudaMemcpyDeviceToHost));
  print_checksum(checksum_of(h, n) + checksum_of(mapped, n));
  CHECK(cudaFree(out));
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaFreeHost(mapped));
  free(h);
  return 0;
}
