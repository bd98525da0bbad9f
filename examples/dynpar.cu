// Dynamic parallelism: a parent kernel launches one child grid per row from device code (cudadevrt);
// replay runs the parent with its child launches, so the rows the children wrote are what verify.
// Usage: dynpar [rows=256] [cols=4096] [block=128]
#include "common.h"

// Each child scales one row and adds the row's index; rows are independent.
__global__ void scaleRow(float *out, const float *in, int cols, float factor, int row) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < cols) out[(size_t)row * cols + j] = in[(size_t)row * cols + j] * factor + (float)row;
}

// One thread per row launches that row's child grid; the parent records how many it launched.
__global__ void launchRows(float *out, const float *in, int rows, int cols, float factor, int block,
                           unsigned *launched) {
  int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  scaleRow<<<(cols + block - 1) / block, block>>>(out, in, cols, factor, row);
  if (cudaGetLastError() == cudaSuccess) atomicAdd(launched, 1u);
}

int main(int argc, char **argv) {
  const int rows = (int)arg_long(argc, argv, 1, 256, "rows");
  const int cols = (int)arg_long(argc, argv, 2, 4096, "cols");
  const int block = (int)arg_long(argc, argv, 3, 128, "block");
  const float factor = 1.5f;
  const size_t n = (size_t)rows * cols, bytes = n * sizeof(float);
  float *hin = (float *)malloc(bytes), *hout = (float *)malloc(bytes);
  fill_small_ints(hin, n, 11, 100);  // exact: in * 1.5 + row rounds the same with or without an fma
  float *in, *out;
  unsigned *launched, hl = 0;
  CHECK(cudaMalloc(&in, bytes));
  CHECK(cudaMalloc(&out, bytes));
  CHECK(cudaMalloc(&launched, sizeof(unsigned)));
  CHECK(cudaMemcpy(in, hin, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(out, 0, bytes));
  CHECK(cudaMemset(launched, 0, sizeof(unsigned)));
  // more pending child launches than the default 2048 (one per row)
  CHECK(cudaDeviceSetLimit(cudaLimitDevRuntimePendingLaunchCount, (size_t)rows + 64));
  launchRows<<<(rows + 63) / 64, 64>>>(out, in, rows, cols, factor, block, launched);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(hout, out, bytes, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(&hl, launched, sizeof hl, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) {
    float want = hin[i] * factor + (float)(i / cols);
    if (hout[i] != want) {
      fprintf(stderr, "dynpar: out[%zu]=%g, want %g (a child grid did not run)\n", i, hout[i], want);
      return 1;
    }
  }
  if (hl != (unsigned)rows) {
    fprintf(stderr, "dynpar: %u child launches, want %d\n", hl, rows);
    return 1;
  }
  print_checksum(checksum_of(hout, n));
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  CHECK(cudaFree(launched));
  free(hin);
  free(hout);
  return 0;
}
