// Device function pointers: the host reads the address of a __device__ function from a __device__ variable
// (cudaMemcpyFromSymbol) and passes it as a kernel argument; a second kernel picks its function from a
// __device__ table in memory; a third calls a virtual function of an object it builds in shared memory (the
// class's vtable is a variable of the module). All these addresses are the app module's code: `mneme record`
// keeps the variables that name functions with each kernel that calls through a pointer, and replay relocates
// them to its own module's functions (mneme.replay.codemap).
// Usage: devfnptr [n=65536]
#include <new>
#include "common.h"

typedef float (*unary_fn)(float);

__device__ float twice(float x) { return 2.0f * x; }
__device__ float plusOne(float x) { return x + 1.0f; }

__device__ unary_fn d_twice = twice;           // read by the host, passed back as an argument
__device__ unary_fn d_table[2] = {twice, plusOne};

__global__ void applyFn(float *v, unary_fn f, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = f(v[i]);
}

__global__ void applyTable(float *v, int which, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = d_table[which & 1](v[i]);
}

struct Op {
  __device__ virtual float apply(float x) const { return x; }
};
struct Half : Op {
  __device__ float apply(float x) const override { return 0.5f * x; }
};
__global__ void applyVirtual(float *v, int n) {
  __shared__ alignas(8) unsigned char buf[sizeof(Half)];
  __shared__ Op *op;
  if (threadIdx.x == 0) op = new (buf) Half();
  __syncthreads();
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = op->apply(v[i]);
}
int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 16, "n");
  const size_t bytes = (size_t)n * sizeof(float);
  float *h = (float *)malloc(bytes), *hout = (float *)malloc(bytes);
  fill_small_ints(h, n, 3, 100);
  float *v;
  CHECK(cudaMalloc(&v, bytes));
  CHECK(cudaMemcpy(v, h, bytes, cudaMemcpyHostToDevice));
  unary_fn f = nullptr;
  CHECK(cudaMemcpyFromSymbol(&f, d_twice, sizeof f));
  applyFn<<<(n + 255) / 256, 256>>>(v, f, n);
  CHECK_LAUNCH();
  applyTable<<<(n + 255) / 256, 256>>>(v, 1, n);
  CHECK_LAUNCH();
  applyVirtual<<<(n + 255) / 256, 256>>>(v, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(hout, v, bytes, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i)
    if (hout[i] != 0.5f * (2.0f * h[i] + 1.0f)) {
      fprintf(stderr, "devfnptr: v[%d]=%g, want %g\n", i, hout[i], 0.5f * (2.0f * h[i] + 1.0f));
      return 1;
    }
  print_checksum(checksum_of(hout, n));
  CHECK(cudaFree(v));
  free(h);
  free(hout);
  return 0;
}
