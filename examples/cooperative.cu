// A cooperative launch (cudaLaunchCooperativeKernel) whose kernel synchronizes the whole grid:
// each block writes a partial sum, then after grid.sync() block 0 adds the partials in order
// (deterministic) — recordable.
// Usage: cooperative [n=16384] [blocks=8]   (16777216 1000 runs ~55 us on an H200)
#include <cooperative_groups.h>

#include "common.h"

namespace cg = cooperative_groups;

#define BLOCK 256

__global__ void coopSum(const float *in, float *partial, float *out, int n) {
  __shared__ float buf[BLOCK];
  cg::grid_group grid = cg::this_grid();
  float v = 0.0f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v += in[i];
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = BLOCK / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = buf[0];
  grid.sync();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    float total = 0.0f;
    for (unsigned b = 0; b < gridDim.x; ++b) total += partial[b];
    *out = total;
  }
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  int blocks = (int)arg_long(argc, argv, 2, 8, "blocks");
  int supported = 0, per_sm = 0, sms = 0;
  CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrCooperativeLaunch, 0));
  if (!supported) {
    fprintf(stderr, "cooperative: the device does not support cooperative launches\n");
    return 1;
  }
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, coopSum, BLOCK, 0));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (blocks > per_sm * sms) blocks = per_sm * sms;
  const size_t bytes = (size_t)n * sizeof(float);
  float *h = (float *)malloc(bytes);
  fill_unit(h, n, 18);
  float *in, *partial, *out;
  CHECK(cudaMalloc(&in, bytes));
  CHECK(cudaMalloc(&partial, blocks * sizeof(float)));
  CHECK(cudaMalloc(&out, sizeof(float)));
  CHECK(cudaMemcpy(in, h, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(partial, 0, blocks * sizeof(float)));
  CHECK(cudaMemset(out, 0, sizeof(float)));
  int nn = n;
  void *args[] = {&in, &partial, &out, &nn};
  CHECK(cudaLaunchCooperativeKernel((const void *)coopSum, dim3(blocks), dim3(BLOCK), args, 0, 0));
  float total = 0.0f;
  CHECK(cudaMemcpy(&total, out, sizeof(float), cudaMemcpyDeviceToHost));
  printf("checksum=%.6e\n", (double)total);
  CHECK(cudaFree(in));
  CHECK(cudaFree(partial));
  CHECK(cudaFree(out));
  free(h);
  return 0;
}
