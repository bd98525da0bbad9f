// A dynamic work queue: blocks take chunks of blockDim.x items from a global counter (atomicAdd), so
// which block processes which chunk changes from run to run. The output is the same every run; the
// per-item `owner` log (which block did the item: the app's load-balance statistics) is not. It is
// scratch as far as correctness goes: the app never checks it and nothing else the kernel writes
// depends on it. `mneme replay --verify-runs 3` learns that owner varies between identical runs,
// shows with a poisoned run that nothing else depends on it, and skips it (the verdict says so);
// out and the counter are still compared exactly (docs/VERIFY.md).
// Usage: workqueue [chunks=2048] [block=128] [grid=96]
#include "common.h"

__global__ void queueSquare(const float *in, float *out, int *owner, unsigned *next, int nchunks) {
  __shared__ unsigned chunk;
  for (;;) {
    if (threadIdx.x == 0) chunk = atomicAdd(next, 1u);
    __syncthreads();
    const unsigned c = chunk;
    __syncthreads();  // everyone has read `chunk` before thread 0 takes the next one
    if (c >= (unsigned)nchunks) break;
    const int i = (int)c * blockDim.x + threadIdx.x;
    out[i] = 2.0f * in[i] + 1.0f;  // exact in float, contracted or not
    owner[i] = blockIdx.x;
  }
}

int main(int argc, char **argv) {
  const int chunks = (int)arg_long(argc, argv, 1, 2048, "chunks");
  const int block = (int)arg_long(argc, argv, 2, 128, "block");
  const int grid = (int)arg_long(argc, argv, 3, 96, "grid");
  const int n = chunks * block;
  float *hin = (float *)malloc(n * sizeof(float)), *hout = (float *)malloc(n * sizeof(float));
  int *hown = (int *)malloc(n * sizeof(int));
  fill_unit(hin, n, 21);
  float *in, *out;
  int *owner;
  unsigned *next;
  CHECK(cudaMalloc(&in, n * sizeof(float)));
  CHECK(cudaMalloc(&out, n * sizeof(float)));
  CHECK(cudaMalloc(&owner, n * sizeof(int)));
  CHECK(cudaMalloc(&next, sizeof(unsigned)));
  CHECK(cudaMemcpy(in, hin, n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(out, 0, n * sizeof(float)));
  CHECK(cudaMemset(owner, 0xff, n * sizeof(int)));
  CHECK(cudaMemset(next, 0, sizeof(unsigned)));
  queueSquare<<<grid, block>>>(in, out, owner, next, chunks);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(hout, out, n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hown, owner, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    if (hout[i] != 2.0f * hin[i] + 1.0f || hown[i] < 0 || hown[i] >= grid) {
      fprintf(stderr, "workqueue: item %d: out %g owner %d\n", i, hout[i], hown[i]);
      return 1;
    }
  }
  print_checksum(checksum_of(hout, n));
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  CHECK(cudaFree(owner));
  CHECK(cudaFree(next));
  free(hin);
  free(hout);
  free(hown);
  return 0;
}
