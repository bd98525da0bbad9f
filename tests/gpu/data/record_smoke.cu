// The recorder's awkward corners in one app, built on the GPU machine with nvcc (so it also covers
// apps not built with `mneme cc`: no IR; the shared and the static runtime, seen at the driver).
//   nvcc -arch=sm_90 -cudart shared -o record_smoke record_smoke.cu -ldl
// Prints "pitch ..." lines comparing the recorder's pitch with the real runtime's, "arena ..." lines
// with allocation addresses, and a final "checksum ..." line; exits 1 on any CUDA error.
// `record_smoke crash` dies of SIGSEGV right after the repeated launches (step 4).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                 \
  do {                                                                           \
    cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) {                                                     \
      printf("FAIL line %d: %s: %s\n", __LINE__, #x, cudaGetErrorString(e_));    \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

__device__ float g_acc[4];
__device__ float *g_where = &g_acc[1];  // a pointer global: must be recorded with a relocation

__global__ void axpy(float *y, const float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}

__global__ void readPinned(float *out, const float *pinned, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * pinned[i];
}

__global__ void bump(int n) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *g_where += (float)n;
}

typedef cudaError_t (*pitch_fn)(void **, size_t *, size_t, size_t);

static int in_arena(const void *p) {
  uint64_t a = (uint64_t)(uintptr_t)p, base = 0x153940000000ull;
  return a >= base && a < base + (64ull << 30);
}

int main(int argc, char **argv) {
  const int crash = argc > 1 && argv[1][0] == 'c';
  const int n = 4096;
  const size_t bytes = n * sizeof(float);

  // 1. pitched allocations: the recorder's pitch against the real runtime's
  void *rt = dlopen("libcudart.so.13", RTLD_LAZY | RTLD_NOLOAD);
  pitch_fn real_pitch = rt ? (pitch_fn)dlsym(rt, "cudaMallocPitch") : NULL;
  const size_t widths[] = {1, 100, 511, 512, 513, 4000, 70000};
  for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) {
    void *p = NULL, *q = NULL;
    size_t pitch = 0, rpitch = 0;
    CHECK(cudaMallocPitch(&p, &pitch, widths[i], 3));
    if (real_pitch) CHECK(real_pitch(&q, &rpitch, widths[i], 3));
    printf("pitch width=%zu ours=%zu real=%zu arena=%d\n", widths[i], pitch, rpitch, in_arena(p));
    CHECK(cudaFree(p));
    if (q) CHECK(cudaFree(q));
  }
  cudaPitchedPtr pp;
  CHECK(cudaMalloc3D(&pp, make_cudaExtent(300, 4, 5)));
  printf("malloc3d pitch=%zu xsize=%zu ysize=%zu arena=%d\n", pp.pitch, pp.xsize, pp.ysize, in_arena(pp.ptr));
  CHECK(cudaMemset3D(pp, 0, make_cudaExtent(300, 4, 5)));
  CHECK(cudaFree(pp.ptr));

  // 2. stream-ordered allocations, freed and reused
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  float *x, *y, *tmp;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMalloc(&y, bytes));
  float *h = (float *)malloc(bytes);
  for (int i = 0; i < n; i++) h[i] = (float)(i % 17) * 0.25f;
  CHECK(cudaMemcpy(x, h, bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(y, 0, bytes));
  CHECK(cudaMallocAsync(&tmp, bytes, s));
  printf("arena malloc=%d async=%d\n", in_arena(x), in_arena(tmp));
  CHECK(cudaMemsetAsync(tmp, 0, bytes, s));
  axpy<<<(n + 255) / 256, 256, 0, s>>>(tmp, x, 1.0f, n);
  CHECK(cudaGetLastError());
  CHECK(cudaFreeAsync(tmp, s));
  CHECK(cudaMallocAsync(&tmp, bytes, s));
  CHECK(cudaFreeAsync(tmp, s));
  CHECK(cudaStreamSynchronize(s));

  // 3. pinned host memory read by a kernel
  float *pinned;
  CHECK(cudaMallocHost(&pinned, bytes));
  for (int i = 0; i < n; i++) pinned[i] = (float)i;
  printf("pinned=%p\n", (void *)pinned);
  float *out;
  CHECK(cudaMalloc(&out, bytes));
  readPinned<<<(n + 255) / 256, 256>>>(out, pinned, n);
  CHECK(cudaGetLastError());

  // 4. one instance launched five times, a second instance (other scalar) twice
  for (int r = 0; r < 5; r++) axpy<<<(n + 255) / 256, 256>>>(y, x, 2.0f, n);
  for (int r = 0; r < 2; r++) axpy<<<(n + 255) / 256, 256>>>(y, x, 3.0f, n);
  bump<<<1, 32>>>(7);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  if (crash) {
    printf("crashing\n");
    fflush(stdout);
    *(volatile int *)(uintptr_t)argc = 0; /* SIGSEGV */
  }

  // 5. a launch inside a CUDA graph capture: recorded when the graph is launched
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  axpy<<<(n + 255) / 256, 256, 0, s>>>(y, x, 0.5f, n);
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&ge, g, 0));
  CHECK(cudaGraphLaunch(ge, s));
  CHECK(cudaStreamSynchronize(s));

  // 6. results
  float acc[4];
  CHECK(cudaMemcpyFromSymbol(acc, g_acc, sizeof acc));
  CHECK(cudaMemcpy(h, y, bytes, cudaMemcpyDeviceToHost));
  double sum = acc[1];
  for (int i = 0; i < n; i++) sum += h[i];
  CHECK(cudaMemcpy(h, out, bytes, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) sum += h[i];
  CHECK(cudaGetLastError());
  printf("checksum %.6f\n", sum);
  CHECK(cudaGraphExecDestroy(ge));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  CHECK(cudaFree(out));
  free(h);
  return 0;
}
