// The device heap across launches: one kernel allocates per-block tables with malloc in device code and
// keeps their pointers in device memory, a later kernel reads them, a third frees them. The app raises
// the heap limit (cudaLimitMallocHeapSize) first. The heap is not recorded: `mneme record` names the
// allocating kernel, runs it once (no timing reruns, which would allocate again), and records the limit.
// Usage: devheap [blocks=128] [per_block=1024]
#include "common.h"

// Block b allocates a table of per_block floats, fills it from in[], and stores its address in tables[b].
__global__ void heapFill(float **tables, const float *in, int per_block) {
  __shared__ float *table;
  if (threadIdx.x == 0) table = (float *)malloc((size_t)per_block * sizeof(float));
  __syncthreads();
  if (!table) return;  // heap exhausted: tables[b] stays null and the host reports it
  for (int i = threadIdx.x; i < per_block; i += blockDim.x) table[i] = in[(size_t)blockIdx.x * per_block + i] * 2.0f;
  __syncthreads();
  if (threadIdx.x == 0) tables[blockIdx.x] = table;
}

// Reads the tables an earlier launch allocated: out[b] = sum of table b.
__global__ void heapSum(float *const *tables, float *out, int per_block) {
  const float *table = tables[blockIdx.x];
  float s = 0.0f;
  if (threadIdx.x == 0 && table)
    for (int i = 0; i < per_block; ++i) s += table[i];
  if (threadIdx.x == 0) out[blockIdx.x] = table ? s : -1.0f;
}

__global__ void heapFree(float **tables) {
  if (threadIdx.x == 0) {
    free(tables[blockIdx.x]);
    tables[blockIdx.x] = nullptr;
  }
}

int main(int argc, char **argv) {
  const int blocks = (int)arg_long(argc, argv, 1, 128, "blocks");
  const int per_block = (int)arg_long(argc, argv, 2, 1024, "per_block");
  const size_t n = (size_t)blocks * per_block;
  float *hin = (float *)malloc(n * sizeof(float)), *hout = (float *)malloc(blocks * sizeof(float));
  fill_small_ints(hin, n, 5, 8);
  CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, n * sizeof(float) * 2 + (16u << 20)));
  float *in, *out, **tables;
  CHECK(cudaMalloc(&in, n * sizeof(float)));
  CHECK(cudaMalloc(&out, blocks * sizeof(float)));
  CHECK(cudaMalloc(&tables, blocks * sizeof(float *)));
  CHECK(cudaMemcpy(in, hin, n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(tables, 0, blocks * sizeof(float *)));
  heapFill<<<blocks, 128>>>(tables, in, per_block);
  CHECK_LAUNCH();
  heapSum<<<blocks, 32>>>(tables, out, per_block);
  CHECK_LAUNCH();
  heapFree<<<blocks, 32>>>(tables);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(hout, out, blocks * sizeof(float), cudaMemcpyDeviceToHost));
  for (int b = 0; b < blocks; ++b) {
    float want = 0.0f;
    for (int i = 0; i < per_block; ++i) want += hin[(size_t)b * per_block + i] * 2.0f;
    if (hout[b] != want) {
      fprintf(stderr, "devheap: block %d summed %g, want %g%s\n", b, hout[b], want,
              hout[b] == -1.0f ? " (its heap table was not allocated)" : "");
      return 1;
    }
  }
  print_checksum(checksum_of(hout, blocks));
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  CHECK(cudaFree(tables));
  free(hin);
  free(hout);
  return 0;
}
