// A kernel that counts in __device__ variables across launches: a kernel swapped in by `mneme apply` must
// start from what earlier launches left and leave its counts in the app's variables.
// Usage: devcounter [n=65536] [block=256] [launches=5]
#include "common.h"

__device__ unsigned long long g_count;  // elements above the threshold, over all launches
__device__ unsigned g_launches;         // launches so far (block 0, thread 0 counts)

__global__ void countAbove(const float *in, float *out, int n, float threshold) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i == 0) out[n] = (float)atomicAdd(&g_launches, 1u);  // the launch's number, as this kernel saw it
  if (i < n && in[i] > threshold) {
    atomicAdd(&g_count, 1ull);
    out[i] = in[i];
  }
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 16, "n");
  const int block = (int)arg_long(argc, argv, 2, 256, "block");
  const int launches = (int)arg_long(argc, argv, 3, 5, "launches");
  const float threshold = 0.75f;
  const size_t bytes = (size_t)n * sizeof(float);
  float *hin = (float *)malloc(bytes), *hout = (float *)malloc(bytes + sizeof(float));
  fill_unit(hin, n, 4);
  unsigned long long above = 0;
  for (int i = 0; i < n; ++i) above += hin[i] > threshold;
  float *in, *out;
  CHECK(cudaMalloc(&in, bytes));
  CHECK(cudaMalloc(&out, bytes + sizeof(float)));
  CHECK(cudaMemcpy(in, hin, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(out, 0, bytes + sizeof(float)));
  for (int l = 0; l < launches; ++l) {
    countAbove<<<(n + block - 1) / block, block>>>(in, out, n, threshold);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(hout, out, bytes + sizeof(float), cudaMemcpyDeviceToHost));
    if (hout[n] != (float)l) {
      fprintf(stderr, "devcounter: launch %d saw g_launches=%g (earlier launches' count lost)\n", l, hout[n]);
      return 1;
    }
  }
  unsigned long long count = 0;
  unsigned nl = 0;
  CHECK(cudaMemcpyFromSymbol(&count, g_count, sizeof count));
  CHECK(cudaMemcpyFromSymbol(&nl, g_launches, sizeof nl));
  if (count != above * (unsigned long long)launches || nl != (unsigned)launches) {
    fprintf(stderr, "devcounter: g_count=%llu (want %llu), g_launches=%u (want %d)\n", count,
            above * (unsigned long long)launches, nl, launches);
    return 1;
  }
  fprintf(stderr, "devcounter: counted %llu in %u launches\n", count, nl);  // stdout holds the checksum only
  print_checksum(checksum_of(hout, n));
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  free(hin);
  free(hout);
  return 0;
}
