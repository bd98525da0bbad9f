// A kernel taking a struct by value and a device array of device pointers.
// Usage: structarg [n=16384] [inputs=3]   (n=16777216 runs ~105 us on an H200)
#include "common.h"

struct Params {
  float scale;
  int n;
  float3 shift;
  double bias;
  unsigned char flags;  // bit 0: add the bias
};

__global__ void structArg(Params p, const float *const *inputs, int ninputs, float *out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.n) return;
  float acc = 0.0f;
  for (int k = 0; k < ninputs; ++k) acc += inputs[k][i] * (k + 1);
  float v = p.scale * acc + p.shift.x - p.shift.y + 0.5f * p.shift.z;
  if (p.flags & 1) v += (float)p.bias;
  out[i] = v;
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  const int ninputs = (int)arg_long(argc, argv, 2, 3, "inputs");
  const size_t bytes = (size_t)n * sizeof(float);
  float *h = (float *)malloc(bytes);
  float **dev_inputs = (float **)malloc(ninputs * sizeof(float *));
  for (int k = 0; k < ninputs; ++k) {
    fill_unit(h, n, 10 + k);
    CHECK(cudaMalloc(&dev_inputs[k], bytes));
    CHECK(cudaMemcpy(dev_inputs[k], h, bytes, cudaMemcpyHostToDevice));
  }
  float **table;  // the pointer array itself lives in device memory
  CHECK(cudaMalloc(&table, ninputs * sizeof(float *)));
  CHECK(cudaMemcpy(table, dev_inputs, ninputs * sizeof(float *), cudaMemcpyHostToDevice));
  float *out;
  CHECK(cudaMalloc(&out, bytes));
  CHECK(cudaMemset(out, 0, bytes));
  Params p;
  memset(&p, 0, sizeof(p));  // padding bytes too: the recorded argument bytes are deterministic
  p.scale = 0.75f;
  p.n = n;
  p.shift = make_float3(1.0f, 0.5f, 0.25f);
  p.bias = 2.0;
  p.flags = 1;
  structArg<<<(n + 255) / 256, 256>>>(p, table, ninputs, out);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(h, out, bytes, cudaMemcpyDeviceToHost));
  print_checksum(checksum_of(h, n));
  for (int k = 0; k < ninputs; ++k) CHECK(cudaFree(dev_inputs[k]));
  CHECK(cudaFree(table));
  CHECK(cudaFree(out));
  free(dev_inputs);
  free(h);
  return 0;
}
