// Texture and surface handles reaching texture/surface instructions from parameters and from memory
// (tests/test_ir_textures.py).
#include <cuda_runtime.h>

__global__ void fetch1d(cudaTextureObject_t tex, float *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1Dfetch<float>(tex, i);
}

// a texture read and a surface written, plus an i64 scalar that is no handle
__global__ void copy2d(cudaSurfaceObject_t dst, long long scale, cudaTextureObject_t src, int w) {
  int x = threadIdx.x, y = blockIdx.x;
  if (x < w) surf2Dwrite(tex2D<float>(src, x + 0.5f, y + 0.5f) * (float)scale, dst, x * 4, y);
}

// the handle chosen at run time between two parameters: both are handles
__global__ void pick(cudaTextureObject_t a, cudaTextureObject_t b, int which, float *out) {
  out[threadIdx.x] = tex1Dfetch<float>(which ? a : b, threadIdx.x);
}

__device__ cudaTextureObject_t g_tex;
struct Holder { cudaTextureObject_t t; };

// handles read from memory: a __device__ variable and a struct behind a pointer
__global__ void from_memory(const Holder *h, float *out) {
  out[threadIdx.x] = tex1Dfetch<float>(g_tex, threadIdx.x) + tex1Dfetch<float>(h->t, threadIdx.x);
}

__global__ void no_textures(long long v, float *out) { out[threadIdx.x] = (float)v; }

// handles inside a struct passed by value: they are in the argument bytes, at the fields' offsets
struct Params { float *out; cudaTextureObject_t tex; int n; cudaTextureObject_t tex2; };
__global__ void by_value(Params p) {
  int i = threadIdx.x;
  if (i < p.n) p.out[i] = tex1Dfetch<float>(p.tex, i) + tex1Dfetch<float>(p.tex2, i);
}
