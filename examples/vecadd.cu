// vecAdd: c = a + b.  Usage: vecadd [n=16384] [block=256]   (n=33554432 runs ~125 us on an H200)
#include "common.h"

__global__ void vecAdd(const float *a, const float *b, float *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  const int block = (int)arg_long(argc, argv, 2, 256, "block");
  const size_t bytes = (size_t)n * sizeof(float);
  float *ha = (float *)malloc(bytes), *hb = (float *)malloc(bytes), *hc = (float *)malloc(bytes);
  fill_unit(ha, n, 1);
  fill_unit(hb, n, 2);
  float *a, *b, *c;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMalloc(&c, bytes));
  CHECK(cudaMemcpy(a, ha, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b, hb, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(c, 0, bytes));
  vecAdd<<<(n + block - 1) / block, block>>>(a, b, c, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(hc, c, bytes, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i)
    if (hc[i] != ha[i] + hb[i]) {
      fprintf(stderr, "vecadd: mismatch at %d: %g != %g\n", i, hc[i], ha[i] + hb[i]);
      return 1;
    }
  print_checksum(checksum_of(hc, n));
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  CHECK(cudaFree(c));
  free(ha);
  free(hb);
  free(hc);
  return 0;
}
