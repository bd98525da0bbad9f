// One Jacobi step with a float atomicAdd residual (the kind of kernel that is not bit-reproducible):
// xnew[i] = (b[i] + x[i-1] + x[i+1]) / 4, one point per thread (no grid-stride loop: a smaller block
// covers fewer points, so the output really changes with the block size), and the squared update
// summed into *res with one float atomicAdd per warp. The order of those atomics varies from run to
// run, and so do res's last bits. Nothing is annotated: `mneme replay --verify-runs 3` learns from
// replays of the recorded configuration which bytes vary and how much (docs/VERIFY.md).
// Usage: atomicsum [n=1048576] [block=256]   (prints the checksum of xnew; the residual is checked, not printed)
#include <cmath>

#include "common.h"

__global__ void jacobiStep(const float *x, const float *b, float *xnew, float *res, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float d = 0.0f;
  if (i < n) {
    float left = i > 0 ? x[i - 1] : 0.0f, right = i + 1 < n ? x[i + 1] : 0.0f;
    float v = 0.25f * (b[i] + left + right);
    xnew[i] = v;
    d = (v - x[i]) * (v - x[i]);
  }
  for (int off = 16; off > 0; off >>= 1) d += __shfl_down_sync(0xffffffffu, d, off);
  if ((threadIdx.x & 31) == 0) atomicAdd(res, d);
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 20, "n");
  const int block = (int)arg_long(argc, argv, 2, 256, "block");
  if (block % 32) {
    fprintf(stderr, "atomicsum: block=%d must be a multiple of 32\n", block);
    return 2;
  }
  const size_t bytes = (size_t)n * sizeof(float);
  float *hx = (float *)malloc(bytes), *hb = (float *)malloc(bytes), *hn = (float *)malloc(bytes);
  fill_unit(hx, n, 11);
  fill_unit(hb, n, 12);
  float *x, *b, *xnew, *res;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMalloc(&xnew, bytes));
  CHECK(cudaMalloc(&res, sizeof(float)));
  CHECK(cudaMemcpy(x, hx, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b, hb, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(xnew, 0, bytes));
  CHECK(cudaMemset(res, 0, sizeof(float)));
  jacobiStep<<<(n + block - 1) / block, block>>>(x, b, xnew, res, n);
  CHECK_LAUNCH();
  float r = 0.0f;
  CHECK(cudaMemcpy(&r, res, sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hn, xnew, bytes, cudaMemcpyDeviceToHost));
  double ref = 0.0;
  for (int i = 0; i < n; ++i) {
    float left = i > 0 ? hx[i - 1] : 0.0f, right = i + 1 < n ? hx[i + 1] : 0.0f;
    float v = 0.25f * (hb[i] + left + right);
    if (hn[i] != v) {
      fprintf(stderr, "atomicsum: xnew[%d] = %g, expected %g\n", i, hn[i], v);
      return 1;
    }
    ref += (double)(v - hx[i]) * (v - hx[i]);
  }
  if (std::fabs(r - ref) > 1e-3 * ref) {
    fprintf(stderr, "atomicsum: residual %.9g differs from the host's %.9g\n", r, ref);
    return 1;
  }
  print_checksum(checksum_of(hn, n));
  CHECK(cudaFree(x));
  CHECK(cudaFree(b));
  CHECK(cudaFree(xnew));
  CHECK(cudaFree(res));
  free(hx);
  free(hb);
  free(hn);
  return 0;
}
