// A CUDA graph built node by node (cudaGraphAddKernelNode, cudaGraphAddMemcpyNode1D, dependencies),
// instantiated once and launched many times, then one kernel node's arguments changed in the executable
// graph (cudaGraphExecKernelNodeSetParams), the source graph destroyed, and launched again.
// Every kernel node is recorded like a stream launch: three instances (graphScale, graphShift with
// b=1, graphShift with b=-2), their occurrences counted over all launches.
// Usage: graphupdate [n=16384] [launches=4]   (n=16777216 runs for tens of microseconds on an H200)
#include "common.h"

__global__ void graphScale(float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = a * x[i] + 0.5f;
}

__global__ void graphShift(float *y, const float *x, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i] * 0.125f + b;
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  const int launches = (int)arg_long(argc, argv, 2, 4, "launches");
  const size_t bytes = (size_t)n * sizeof(float);
  float *h = (float *)malloc(bytes);
  fill_unit(h, n, 29);
  float *x, *y;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMalloc(&y, bytes));
  CHECK(cudaMemcpy(x, h, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(y, 0, bytes));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // scale(x) -> copy x to y -> shift(y, x): a chain, built node by node
  cudaGraph_t graph;
  CHECK(cudaGraphCreate(&graph, 0));
  float a = 0.75f, b = 1.0f;
  int count = n;
  void *scale_args[] = {&x, &a, &count};
  void *shift_args[] = {&y, &x, &b, &count};
  cudaKernelNodeParams kp = {};
  kp.func = (void *)graphScale;
  kp.gridDim = dim3((n + 255) / 256);
  kp.blockDim = dim3(256);
  kp.kernelParams = scale_args;
  cudaGraphNode_t scale, copy, shift;
  CHECK(cudaGraphAddKernelNode(&scale, graph, nullptr, 0, &kp));
  CHECK(cudaGraphAddMemcpyNode1D(&copy, graph, &scale, 1, y, x, bytes, cudaMemcpyDeviceToDevice));
  kp.func = (void *)graphShift;
  kp.kernelParams = shift_args;
  CHECK(cudaGraphAddKernelNode(&shift, graph, &copy, 1, &kp));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  a = 100.0f;  // the graph holds copies of the arguments: this changes nothing

  for (int i = 0; i < launches; ++i) CHECK(cudaGraphLaunch(exec, stream));
  b = -2.0f;
  CHECK(cudaGraphExecKernelNodeSetParams(exec, shift, &kp));
  CHECK(cudaGraphDestroy(graph));  // the executable graph keeps its own copy
  for (int i = 0; i < launches; ++i) CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));

  CHECK(cudaMemcpy(h, y, bytes, cudaMemcpyDeviceToHost));
  print_checksum(checksum_of(h, n));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  free(h);
  return 0;
}
