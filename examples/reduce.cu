// Float sum reduction: a shared-memory tree per block, then one atomicAdd per block into the result.
// The order of those atomics varies from run to run, and so do the result's last bits: the app marks
// the result with a relative tolerance (mneme/tolerance.h) so that replay verification accepts that.
// The checksum is printed to 4 significant digits, well above that noise.
// Usage: reduce [n=65536] [block=256]   (n=67108864 runs ~115 us on an H200)
#include <mneme/tolerance.h>

#include <cmath>

#include "common.h"

#define MAX_BLOCK 1024

__global__ void reduceSum(const float *in, float *out, int n) {
  __shared__ float buf[MAX_BLOCK];
  float v = 0.0f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v += in[i];
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, buf[0]);
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 16, "n");
  const int block = (int)arg_long(argc, argv, 2, 256, "block");
  if (block > MAX_BLOCK || (block & (block - 1))) {
    fprintf(stderr, "reduce: block=%d must be a power of two <= %d\n", block, MAX_BLOCK);
    return 2;
  }
  const size_t bytes = (size_t)n * sizeof(float);
  float *h = (float *)malloc(bytes);
  fill_unit(h, n, 6);
  float *in, *out;
  CHECK(cudaMalloc(&in, bytes));
  CHECK(cudaMalloc(&out, sizeof(float)));
  if (mneme::annotate(out, 1, mneme::relative(1e-5), "sum") < 0) fprintf(stderr, "reduce: mneme rejected the annotation\n");
  CHECK(cudaMemcpy(in, h, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(out, 0, sizeof(float)));
  int blocks = (n + block * 4 - 1) / (block * 4);
  if (blocks > 1024) blocks = 1024;
  reduceSum<<<blocks, block>>>(in, out, n);
  CHECK_LAUNCH();
  float sum = 0.0f;
  CHECK(cudaMemcpy(&sum, out, sizeof(float), cudaMemcpyDeviceToHost));
  double ref = 0.0;
  for (int i = 0; i < n; ++i) ref += h[i];
  if (std::fabs(sum - ref) > 1e-4 * std::fabs(ref)) {
    fprintf(stderr, "reduce: sum %.9g differs from the host's %.9g\n", sum, ref);
    return 1;
  }
  printf("checksum=%.3e\n", (double)sum);
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  free(h);
  return 0;
}
