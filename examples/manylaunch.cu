// One kernel launched many times: `sizes` distinct problem sizes (distinct instances: grid and the
// scalar arguments differ), each launched `repeats` times, interleaved (repeated occurrences).
// Usage: manylaunch [sizes=3] [repeats=5] [base=1024]   (base=8388608: 30, 60, 120 us per launch on an H200)
#include "common.h"

__global__ void scaleAdd(float *y, const float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

int main(int argc, char **argv) {
  const int sizes = (int)arg_long(argc, argv, 1, 3, "sizes");
  const int repeats = (int)arg_long(argc, argv, 2, 5, "repeats");
  const long base = arg_long(argc, argv, 3, 1024, "base");
  const long nmax = base << (sizes - 1);
  const size_t bytes = (size_t)nmax * sizeof(float);
  float *h = (float *)malloc(bytes);
  fill_unit(h, nmax, 8);
  float *x, *y;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMalloc(&y, bytes));
  CHECK(cudaMemcpy(x, h, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(y, 0, bytes));
  for (int r = 0; r < repeats; ++r)
    for (int s = 0; s < sizes; ++s) {
      int n = (int)(base << s);
      scaleAdd<<<(n + 255) / 256, 256>>>(y, x, 0.5f * (s + 1), n);
      CHECK_LAUNCH();
    }
  CHECK(cudaMemcpy(h, y, bytes, cudaMemcpyDeviceToHost));
  print_checksum(checksum_of(h, nmax));
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  free(h);
  return 0;
}
