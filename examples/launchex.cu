// A launch through cudaLaunchKernelEx (launch configuration with attributes and dynamic shared
// memory) — recordable.
// Usage: launchex [n=16384] [block=256]   (n=33554432 runs ~120 us on an H200)
#include "common.h"

__global__ void exScale(const float *in, float *out, int n, float alpha) {
  extern __shared__ float stage[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  stage[threadIdx.x] = i < n ? in[i] : 0.0f;
  __syncthreads();
  // Each thread combines its value with its mirror in the block.
  float mirror = stage[blockDim.x - 1 - threadIdx.x];
  if (i < n) out[i] = alpha * stage[threadIdx.x] + mirror;
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  const int block = (int)arg_long(argc, argv, 2, 256, "block");
  const size_t bytes = (size_t)n * sizeof(float);
  float *h = (float *)malloc(bytes);
  fill_unit(h, n, 17);
  float *in, *out;
  CHECK(cudaMalloc(&in, bytes));
  CHECK(cudaMalloc(&out, bytes));
  CHECK(cudaMemcpy(in, h, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(out, 0, bytes));

  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.gridDim = dim3((n + block - 1) / block);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = block * sizeof(float);
  cfg.stream = 0;
  cudaLaunchAttribute attrs[1];
  attrs[0].id = cudaLaunchAttributePriority;
  attrs[0].val.priority = 0;
  cfg.attrs = attrs;
  cfg.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&cfg, exScale, (const float *)in, out, n, 1.5f));
  CHECK(cudaMemcpy(h, out, bytes, cudaMemcpyDeviceToHost));
  print_checksum(checksum_of(h, n));
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  free(h);
  return 0;
}
