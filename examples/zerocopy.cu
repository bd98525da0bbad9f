// Zero-copy host memory the app allocates itself (malloc) and registers with cudaHostRegister(Mapped):
// one kernel reads a registered input over the bus and writes device memory, one writes its result
// straight into another registered buffer through its device pointer.
// Usage: zerocopy [n=16384]   (n=8388608: ~1 ms per kernel over PCIe on an H200)
#include "common.h"

__global__ void zeroCopyRead(const float *in, float *out, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * in[i];
}

__global__ void zeroCopyWrite(const float *in, float *host_out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) host_out[i] = in[i] * in[i];
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  const size_t bytes = (size_t)n * sizeof(float);
  // the input from plain malloc (not page-aligned, as apps do it); the result page-aligned, so that the
  // two registrations never share a page (the driver refuses to register a page twice)
  float *in = (float *)malloc(bytes), *result = nullptr;
  if (!in || posix_memalign((void **)&result, 4096, bytes) != 0) return 1;
  fill_unit(in, n, 21);
  memset(result, 0, bytes);
  CHECK(cudaHostRegister(in, bytes, cudaHostRegisterMapped));
  CHECK(cudaHostRegister(result, bytes, cudaHostRegisterMapped));
  float *in_dev, *result_dev, *mid;
  CHECK(cudaHostGetDevicePointer(&in_dev, in, 0));
  CHECK(cudaHostGetDevicePointer(&result_dev, result, 0));
  CHECK(cudaMalloc(&mid, bytes));
  zeroCopyRead<<<(n + 255) / 256, 256>>>(in_dev, mid, 3.0f, n);
  CHECK_LAUNCH();
  zeroCopyWrite<<<(n + 255) / 256, 256>>>(mid, result_dev, n);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  print_checksum(checksum_of(result, n));
  CHECK(cudaFree(mid));
  CHECK(cudaHostUnregister(result));
  CHECK(cudaHostUnregister(in));
  free(in);
  free(result);
  return 0;
}
