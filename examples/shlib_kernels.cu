// The kernels of a shared library (libmnemeshlib.so); the app shlib_main.cu calls into it. Its
// device IR is embedded in the library, not in the app.
#include "common.h"

__global__ void shlibScale(float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = a * x[i];
}

extern "C" int shlib_scale(float *x, float a, int n) {
  shlibScale<<<(n + 255) / 256, 256>>>(x, a, n);
  return (int)cudaGetLastError();
}
