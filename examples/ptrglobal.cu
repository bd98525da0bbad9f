// __device__ globals initialised to the addresses of other globals (the pattern a replay must
// relocate): g_ptr points at g_value, g_cursor into the middle of g_table.
// Usage: ptrglobal [n=4096]   (n=2097152 runs ~50 us on an H200: the atomics on g_value bound it)
#include "common.h"

__device__ int g_value;
__device__ int *g_ptr = &g_value;
__device__ float g_table[8] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f};
__device__ float *g_cursor = &g_table[2];

__global__ void ptrGlobal(const int *in, float *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  atomicAdd(g_ptr, in[i]);
  out[i] = g_cursor[i % 4] * in[i];
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 4096, "n");
  int *hin = (int *)malloc(n * sizeof(int));
  float *hout = (float *)malloc(n * sizeof(float));
  for (int i = 0; i < n; ++i) hin[i] = (int)(hash_unit(i, 9) * 100.0f);
  int *in;
  float *out;
  CHECK(cudaMalloc(&in, n * sizeof(int)));
  CHECK(cudaMalloc(&out, n * sizeof(float)));
  CHECK(cudaMemcpy(in, hin, n * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(out, 0, n * sizeof(float)));
  const int zero = 0;
  CHECK(cudaMemcpyToSymbol(g_value, &zero, sizeof(zero)));
  ptrGlobal<<<(n + 255) / 256, 256>>>(in, out, n);
  CHECK_LAUNCH();
  int total = 0;
  CHECK(cudaMemcpyFromSymbol(&total, g_value, sizeof(total)));
  CHECK(cudaMemcpy(hout, out, n * sizeof(float), cudaMemcpyDeviceToHost));
  long expected = 0;
  for (int i = 0; i < n; ++i) expected += hin[i];
  if (total != (int)expected) {
    fprintf(stderr, "ptrglobal: g_value = %d, expected %ld\n", total, expected);
    return 1;
  }
  print_checksum(checksum_of(hout, n) + total);
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  free(hin);
  free(hout);
  return 0;
}
