// A __constant__ lookup table the app sets with cudaMemcpyToSymbol, and changes between launches: a kernel
// swapped in by `mneme apply` must see the table the app set last.  Usage: consttable [n=65536] [block=256]
#include "common.h"

#define TABLE 16
__constant__ float c_table[TABLE];

__global__ void tableMap(const float *in, float *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float x = in[i];
    int k = (int)(x * TABLE) & (TABLE - 1);
    out[i] = fmaf(c_table[k], x, c_table[(k + 1) & (TABLE - 1)]);  // explicit: the host check uses fmaf too
  }
}

static int check(const float *in, const float *out, const float *table, int n, int round) {
  for (int i = 0; i < n; ++i) {
    int k = (int)(in[i] * TABLE) & (TABLE - 1);
    float want = fmaf(table[k], in[i], table[(k + 1) & (TABLE - 1)]);  // bit-exact with the device's fma
    if (out[i] != want) {
      fprintf(stderr, "consttable: round %d mismatch at %d: %g != %g\n", round, i, out[i], want);
      return 1;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 16, "n");
  const int block = (int)arg_long(argc, argv, 2, 256, "block");
  const size_t bytes = (size_t)n * sizeof(float);
  float *hin = (float *)malloc(bytes), *hout = (float *)malloc(bytes), table[TABLE];
  fill_unit(hin, n, 3);
  float *in, *out;
  CHECK(cudaMalloc(&in, bytes));
  CHECK(cudaMalloc(&out, bytes));
  CHECK(cudaMemcpy(in, hin, bytes, cudaMemcpyHostToDevice));
  double sum = 0.0;
  for (int round = 0; round < 3; ++round) {  // a new table before every launch
    for (int k = 0; k < TABLE; ++k) table[k] = (float)((k * 7 + round * 5) % 11) - 3.0f;
    CHECK(cudaMemcpyToSymbol(c_table, table, sizeof table));
    tableMap<<<(n + block - 1) / block, block>>>(in, out, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(hout, out, bytes, cudaMemcpyDeviceToHost));
    if (check(hin, hout, table, n, round)) return 1;
    sum += checksum_of(hout, n);
  }
  print_checksum(sum);
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  free(hin);
  free(hout);
  return 0;
}
