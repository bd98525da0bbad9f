// A CUDA graph with memory nodes (cudaGraphAddMemAllocNode / cudaGraphAddMemFreeNode): the graph allocates
// a scratch buffer, fills it, adds it into x and frees it. The recorder cannot run such a graph node by node
// (the allocation belongs to the graph), so it is launched whole and its kernels are reported as
// graph_opaque, by name, with the reason; the app's result is unchanged.
// Usage: graphmem [n=16384] [launches=2]
#include "common.h"

__global__ void graphFill(float *tmp, float v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) tmp[i] = v * (float)(i % 5);
}

__global__ void graphAccum(float *x, const float *tmp, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += tmp[i];
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  const int launches = (int)arg_long(argc, argv, 2, 2, "launches");
  const size_t bytes = (size_t)n * sizeof(float);
  float *h = (float *)malloc(bytes);
  fill_unit(h, n, 31);
  float *x;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMemcpy(x, h, bytes, cudaMemcpyHostToDevice));
  int dev = 0;
  CHECK(cudaGetDevice(&dev));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  cudaGraph_t graph;
  CHECK(cudaGraphCreate(&graph, 0));
  cudaMemAllocNodeParams ap = {};
  ap.poolProps.allocType = cudaMemAllocationTypePinned;
  ap.poolProps.location.type = cudaMemLocationTypeDevice;
  ap.poolProps.location.id = dev;
  ap.bytesize = bytes;
  cudaGraphNode_t alloc, fill, accum, release;
  CHECK(cudaGraphAddMemAllocNode(&alloc, graph, nullptr, 0, &ap));
  float *tmp = (float *)ap.dptr;
  float v = 0.5f;
  int count = n;
  void *fill_args[] = {&tmp, &v, &count};
  void *accum_args[] = {&x, &tmp, &count};
  cudaKernelNodeParams kp = {};
  kp.func = (void *)graphFill;
  kp.gridDim = dim3((n + 255) / 256);
  kp.blockDim = dim3(256);
  kp.kernelParams = fill_args;
  CHECK(cudaGraphAddKernelNode(&fill, graph, &alloc, 1, &kp));
  kp.func = (void *)graphAccum;
  kp.kernelParams = accum_args;
  CHECK(cudaGraphAddKernelNode(&accum, graph, &fill, 1, &kp));
  CHECK(cudaGraphAddMemFreeNode(&release, graph, &accum, 1, tmp));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphDestroy(graph));
  for (int i = 0; i < launches; ++i) CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));

  CHECK(cudaMemcpy(h, x, bytes, cudaMemcpyDeviceToHost));
  print_checksum(checksum_of(h, n));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(x));
  free(h);
  return 0;
}
