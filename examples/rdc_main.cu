// Relocatable device code (-fgpu-rdc): rdcApply calls rdc_transform, defined in rdc_lib.cu, which
// reads a __device__ global of that other translation unit.
// Usage: rdc [n=16384]   (n=33554432 runs ~120 us on an H200)
#include "common.h"

extern __device__ float rdc_transform(float x);

__global__ void rdcApply(const float *in, float *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = rdc_transform(in[i]);
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  const size_t bytes = (size_t)n * sizeof(float);
  float *h = (float *)malloc(bytes);
  fill_unit(h, n, 7);
  float *in, *out;
  CHECK(cudaMalloc(&in, bytes));
  CHECK(cudaMalloc(&out, bytes));
  CHECK(cudaMemcpy(in, h, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(out, 0, bytes));
  rdcApply<<<(n + 255) / 256, 256>>>(in, out, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(h, out, bytes, cudaMemcpyDeviceToHost));
  print_checksum(checksum_of(h, n));
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  free(h);
  return 0;
}
