// Tiled matrix multiply C = A * B (n x n, row major), three ways: static shared memory, dynamic
// shared memory, and K panels in 64 KiB of dynamic shared memory (above the 48 KiB default, so
// the kernel opts in with cudaFuncSetAttribute). All three must agree exactly (small-integer data).
// Usage: matmul [n=128]   (n must be a multiple of 32; 2048 runs 2-4 ms per kernel on an H200)
#include "common.h"

#define TILE 16
#define PANEL_ROWS 32
#define PANEL_K 256

__global__ void matmulStatic(const float *A, const float *B, float *C, int n) {
  __shared__ float As[TILE][TILE];
  __shared__ float Bs[TILE][TILE];
  int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.0f;
  for (int k0 = 0; k0 < n; k0 += TILE) {
    As[threadIdx.y][threadIdx.x] = A[(size_t)row * n + k0 + threadIdx.x];
    Bs[threadIdx.y][threadIdx.x] = B[(size_t)(k0 + threadIdx.y) * n + col];
    __syncthreads();
    for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  C[(size_t)row * n + col] = acc;
}

// tile x tile threads; 2 * tile * tile floats of dynamic shared memory.
__global__ void matmulDynamic(const float *A, const float *B, float *C, int n, int tile) {
  extern __shared__ float smem[];
  float *As = smem, *Bs = smem + tile * tile;
  int tx = threadIdx.x, ty = threadIdx.y;
  int row = blockIdx.y * tile + ty, col = blockIdx.x * tile + tx;
  float acc = 0.0f;
  for (int k0 = 0; k0 < n; k0 += tile) {
    As[ty * tile + tx] = A[(size_t)row * n + k0 + tx];
    Bs[ty * tile + tx] = B[(size_t)(k0 + ty) * n + col];
    __syncthreads();
    for (int k = 0; k < tile; ++k) acc += As[ty * tile + k] * Bs[k * tile + tx];
    __syncthreads();
  }
  C[(size_t)row * n + col] = acc;
}

// A block of 32 x 8 threads computes a 32 x 32 tile of C (4 rows per thread), staging a
// 32 x PANEL_K panel of A and a PANEL_K x 32 panel of B: 64 KiB of dynamic shared memory.
__global__ void matmulPanel(const float *A, const float *B, float *C, int n) {
  extern __shared__ float panel[];
  float *Ap = panel, *Bp = panel + PANEL_ROWS * PANEL_K;
  int tx = threadIdx.x, ty = threadIdx.y;
  int row0 = blockIdx.y * PANEL_ROWS, col = blockIdx.x * PANEL_ROWS + tx;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k0 = 0; k0 < n; k0 += PANEL_K) {
    int kc = min(PANEL_K, n - k0);
    for (int idx = ty * blockDim.x + tx; idx < PANEL_ROWS * kc; idx += blockDim.x * blockDim.y) {
      int r = idx / kc, k = idx % kc;  // A panel: row r, column k
      Ap[r * PANEL_K + k] = A[(size_t)(row0 + r) * n + k0 + k];
      int kb = idx / PANEL_ROWS, c = idx % PANEL_ROWS;  // B panel: row kb, column c
      Bp[kb * PANEL_ROWS + c] = B[(size_t)(k0 + kb) * n + blockIdx.x * PANEL_ROWS + c];
    }
    __syncthreads();
    for (int k = 0; k < kc; ++k) {
      float b = Bp[k * PANEL_ROWS + tx];
      for (int i = 0; i < 4; ++i) acc[i] += Ap[(ty * 4 + i) * PANEL_K + k] * b;
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) C[(size_t)(row0 + ty * 4 + i) * n + col] = acc[i];
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 128, "n");
  if (n % 32) {
    fprintf(stderr, "matmul: n=%d must be a multiple of 32\n", n);
    return 2;
  }
  const size_t count = (size_t)n * n, bytes = count * sizeof(float);
  float *hA = (float *)malloc(bytes), *hB = (float *)malloc(bytes), *hC[3];
  fill_small_ints(hA, count, 4, 2);
  fill_small_ints(hB, count, 5, 2);
  float *A, *B, *C[3];
  CHECK(cudaMalloc(&A, bytes));
  CHECK(cudaMalloc(&B, bytes));
  CHECK(cudaMemcpy(A, hA, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(B, hB, bytes, cudaMemcpyHostToDevice));
  for (int i = 0; i < 3; ++i) {
    CHECK(cudaMalloc(&C[i], bytes));
    CHECK(cudaMemset(C[i], 0, bytes));
    hC[i] = (float *)malloc(bytes);
  }

  matmulStatic<<<dim3(n / TILE, n / TILE), dim3(TILE, TILE)>>>(A, B, C[0], n);
  CHECK_LAUNCH();

  const int tile = 32;
  matmulDynamic<<<dim3(n / tile, n / tile), dim3(tile, tile), 2 * tile * tile * sizeof(float)>>>(A, B, C[1], n, tile);
  CHECK_LAUNCH();

  const int panel_bytes = 2 * PANEL_ROWS * PANEL_K * sizeof(float);  // 64 KiB
  CHECK(cudaFuncSetAttribute(matmulPanel, cudaFuncAttributeMaxDynamicSharedMemorySize, panel_bytes));
  matmulPanel<<<dim3(n / PANEL_ROWS, n / PANEL_ROWS), dim3(PANEL_ROWS, 8), panel_bytes>>>(A, B, C[2], n);
  CHECK_LAUNCH();

  double sum = 0.0;
  for (int i = 0; i < 3; ++i) {
    CHECK(cudaMemcpy(hC[i], C[i], bytes, cudaMemcpyDeviceToHost));
    sum += checksum_of(hC[i], count);
  }
  for (size_t j = 0; j < count; ++j)
    if (hC[0][j] != hC[1][j] || hC[0][j] != hC[2][j]) {
      fprintf(stderr, "matmul: kernels disagree at %zu: %g %g %g\n", j, hC[0][j], hC[1][j], hC[2][j]);
      return 1;
    }
  // Spot-check one element per row against the host.
  for (int r = 0; r < n; ++r) {
    int c = (r * 7) % n;
    double ref = 0.0;
    for (int k = 0; k < n; ++k) ref += (double)hA[(size_t)r * n + k] * hB[(size_t)k * n + c];
    if (ref != hC[0][(size_t)r * n + c]) {
      fprintf(stderr, "matmul: C[%d][%d] = %g, expected %g\n", r, c, hC[0][(size_t)r * n + c], ref);
      return 1;
    }
  }
  print_checksum(sum);
  for (int i = 0; i < 3; ++i) {
    CHECK(cudaFree(C[i]));
    free(hC[i]);
  }
  CHECK(cudaFree(A));
  CHECK(cudaFree(B));
  free(hA);
  free(hB);
  return 0;
}
