// A kernel launched once directly and then inside a CUDA graph (stream capture + cudaGraphLaunch): the
// recorder records the graph's kernel nodes at its first launch (run node by node) and counts the others.
// Usage: graph [n=16384] [launches=3]
#include "common.h"

__global__ void graphStep(float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = a * x[i] + 1.0f;
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  const int launches = (int)arg_long(argc, argv, 2, 3, "launches");
  const size_t bytes = (size_t)n * sizeof(float);
  float *h = (float *)malloc(bytes);
  fill_unit(h, n, 13);
  float *x;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMemcpy(x, h, bytes, cudaMemcpyHostToDevice));
  const int grid = (n + 255) / 256;

  graphStep<<<grid, 256>>>(x, 0.5f, n);  // an ordinary launch
  CHECK_LAUNCH();

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  graphStep<<<grid, 256, 0, stream>>>(x, 0.25f, n);
  graphStep<<<grid, 256, 0, stream>>>(x, 2.0f, n);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < launches; ++i) CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));

  CHECK(cudaMemcpy(h, x, bytes, cudaMemcpyDeviceToHost));
  print_checksum(checksum_of(h, n));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(x));
  free(h);
  return 0;
}
