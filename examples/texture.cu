// A kernel reading its input through a texture object (over linear device memory).
// Usage: texture [n=16384]
#include "common.h"

__global__ void textureRead(cudaTextureObject_t tex, float *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * tex1Dfetch<float>(tex, i);
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  const size_t bytes = (size_t)n * sizeof(float);
  float *h = (float *)malloc(bytes);
  fill_unit(h, n, 15);
  float *in, *out;
  CHECK(cudaMalloc(&in, bytes));
  CHECK(cudaMalloc(&out, bytes));
  CHECK(cudaMemcpy(in, h, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(out, 0, bytes));

  cudaResourceDesc res;
  memset(&res, 0, sizeof(res));
  res.resType = cudaResourceTypeLinear;
  res.res.linear.devPtr = in;
  res.res.linear.desc = cudaCreateChannelDesc<float>();
  res.res.linear.sizeInBytes = bytes;
  cudaTextureDesc desc;
  memset(&desc, 0, sizeof(desc));
  desc.readMode = cudaReadModeElementType;
  cudaTextureObject_t tex;
  CHECK(cudaCreateTextureObject(&tex, &res, &desc, nullptr));

  textureRead<<<(n + 255) / 256, 256>>>(tex, out, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(h, out, bytes, cudaMemcpyDeviceToHost));
  print_checksum(checksum_of(h, n));
  CHECK(cudaDestroyTextureObject(tex));
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  free(h);
  return 0;
}
