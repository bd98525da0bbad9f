// Division, square roots and transcendentals, built twice through `mneme nvcc` (examples/Makefile):
// nvcc_fastmath with --use_fast_math (ftz, approximate division and sqrt, __expf/__sinf) and nvcc_precmath
// with nvcc's defaults (IEEE division and sqrt) plus ptxas options (-maxrregcount, -Xptxas -dlcm=ca). The
// replay baseline must compile each as it was built (issue 16; tests/test_baseline.py reads the PTX).
// Usage: nvcc_fastmath [n=1048576] [rounds=64]
#include <cmath>

#include "common.h"

__global__ void fastMath(const float *x, float *y, int n, int rounds) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i], acc = 0.0f;
  for (int r = 0; r < rounds; ++r) {
    acc += sqrtf(v + r) / (1.0f + v * r) + expf(-v) * sinf(v + 0.5f * r);
    v = v * 0.999f + 0.001f;
  }
  y[i] = acc;
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 20, "n");
  const int rounds = (int)arg_long(argc, argv, 2, 64, "rounds");
  const size_t bytes = (size_t)n * sizeof(float);
  float *hx = (float *)malloc(bytes), *hy = (float *)malloc(bytes);
  fill_unit(hx, n, 3);
  float *x, *y;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMalloc(&y, bytes));
  CHECK(cudaMemcpy(x, hx, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(y, 0, bytes));
  fastMath<<<(n + 255) / 256, 256>>>(x, y, n, rounds);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(hy, y, bytes, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i += 4099) {  // against the host in double, to the accuracy fast math keeps
    double v = hx[i], ref = 0.0;
    for (int r = 0; r < rounds; ++r) {
      ref += std::sqrt(v + r) / (1.0 + v * r) + std::exp(-v) * std::sin(v + 0.5 * r);
      v = (float)(v * 0.999f) + 0.001f;
    }
    if (std::fabs(hy[i] - ref) > 1e-3 * (1.0 + std::fabs(ref))) {
      fprintf(stderr, "fastmath: y[%d] = %.7g, expected %.7g\n", i, hy[i], ref);
      return 1;
    }
  }
  printf("checksum=%.4e\n", checksum_of(hy, n));
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  free(hx);
  free(hy);
  return 0;
}
