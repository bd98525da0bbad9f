// Parameter kinds and layouts; variables the kernels use by name.
#include <cuda_fp16.h>

struct Inner { int k; float *q; };
struct Outer { char c; Inner in[2]; double d; int *r; };
struct Small { int a, b; };

__device__ int counter;
__constant__ float coeffs[16];
__device__ float other_unused[8];

__global__ void kinds(bool b, char c, short s, long long ll, unsigned u, float f, double d, __half h,
                      float4 v4, Small sm, Outer o, int *p) {
  if (b) p[0] = c + s + ll + u + f + d + (float)h + v4.x + sm.a + o.in[1].k + o.d + *o.r + *o.in[0].q;
}

__global__ void saxpy(float a, const float *x, float *y, int n, int stride) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = a * x[i] * coeffs[i % 16] + y[i];
  if (threadIdx.x == 0) atomicAdd(&counter, 1);
}

__global__ void __launch_bounds__(128, 2) bounded(float *y) { y[threadIdx.x] += 1.0f; }
