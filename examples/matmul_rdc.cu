// A 32 x 32-tile matrix multiply C = A * B (n x n, row major), built as relocatable device code
// (`mneme nvcc -rdc=true`, examples/Makefile: nvcc_matmul_rdc). ptxas then assembles it with -c and the
// device link places the shared tiles, so it cannot use 128-bit shared loads on them (scalar LDS); the
// replay baseline must compile it the same way (issue 16; tests/gpu/test_baseline_gpu.py compares SASS).
// Usage: nvcc_matmul_rdc [n=512]   (n a multiple of 32; 512 runs about 25 us on an H200)
#include "common.h"

#define TILE32 32

__global__ void matmulTile32(const float *A, const float *B, float *C, int n) {
  __shared__ float As[TILE32][TILE32];
  __shared__ float Bs[TILE32][TILE32];
  int row = blockIdx.y * TILE32 + threadIdx.y, col = blockIdx.x * TILE32 + threadIdx.x;
  float acc = 0.0f;
  for (int k0 = 0; k0 < n; k0 += TILE32) {
    As[threadIdx.y][threadIdx.x] = A[(size_t)row * n + k0 + threadIdx.x];
    Bs[threadIdx.y][threadIdx.x] = B[(size_t)(k0 + threadIdx.y) * n + col];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < TILE32; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  C[(size_t)row * n + col] = acc;
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 512, "n");
  if (n % TILE32) {
    fprintf(stderr, "nvcc_matmul_rdc: n=%d must be a multiple of %d\n", n, TILE32);
    return 2;
  }
  const size_t count = (size_t)n * n, bytes = count * sizeof(float);
  float *hA = (float *)malloc(bytes), *hB = (float *)malloc(bytes), *hC = (float *)malloc(bytes);
  fill_small_ints(hA, count, 6, 2);
  fill_small_ints(hB, count, 7, 2);
  float *A, *B, *C;
  CHECK(cudaMalloc(&A, bytes));
  CHECK(cudaMalloc(&B, bytes));
  CHECK(cudaMalloc(&C, bytes));
  CHECK(cudaMemcpy(A, hA, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(B, hB, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(C, 0, bytes));
  matmulTile32<<<dim3(n / TILE32, n / TILE32), dim3(TILE32, TILE32)>>>(A, B, C, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(hC, C, bytes, cudaMemcpyDeviceToHost));
  for (int r = 0; r < n; ++r) {  // one element per row against the host (small integers: exact)
    int c = (r * 11) % n;
    double ref = 0.0;
    for (int k = 0; k < n; ++k) ref += (double)hA[(size_t)r * n + k] * hB[(size_t)k * n + c];
    if (ref != hC[(size_t)r * n + c]) {
      fprintf(stderr, "nvcc_matmul_rdc: C[%d][%d] = %g, expected %g\n", r, c, hC[(size_t)r * n + c], ref);
      return 1;
    }
  }
  print_checksum(checksum_of(hC, count));
  CHECK(cudaFree(A));
  CHECK(cudaFree(B));
  CHECK(cudaFree(C));
  free(hA);
  free(hB);
  free(hC);
  return 0;
}
