/* A stand-in libcuda.so.1 for CPU tests of native/interpose (this machine has no NVIDIA driver): it
 * answers cuGetProcAddress for a handful of entry points the way the driver does (legacy and per-thread
 * variants are distinct functions) and fails cuInit with CUDA_ERROR_NO_DEVICE. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdio.h>
#include <string.h>

static CUresult f_init(unsigned int flags) {
  (void)flags;
  return CUDA_ERROR_NO_DEVICE;
}
static CUresult f_version(int *v) {
  *v = 13000;
  return CUDA_SUCCESS;
}
static CUresult launch(const char *which, CUstream s) {
  fprintf(stderr, "driver %s launch stream=%p\n", which, (void *)s);
  return CUDA_SUCCESS;
}
static CUresult f_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shm, CUstream s, void **params, void **extra) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)params, (void)extra;
  return launch("legacy", s);
}
static CUresult f_launch_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)params, (void)extra;
  return launch("ptsz", s);
}
/* Entry points with an older ABI that CUDA 12/13 runtimes still ask for by version: one function per ABI,
 * as in the driver (cuDevicePrimaryCtxRelease at 7000 vs _v2 at 11000, cuStreamBeginCapture at 10000 vs
 * _v2 at 10010). */
static CUresult f_release_v1(CUdevice d) { fprintf(stderr, "driver cuDevicePrimaryCtxRelease v1 dev=%d\n", d); return CUDA_SUCCESS; }
static CUresult f_release_v2(CUdevice d) { fprintf(stderr, "driver cuDevicePrimaryCtxRelease v2 dev=%d\n", d); return CUDA_SUCCESS; }
static CUresult f_reset_v1(CUdevice d) { fprintf(stderr, "driver cuDevicePrimaryCtxReset v1 dev=%d\n", d); return CUDA_SUCCESS; }
static CUresult f_reset_v2(CUdevice d) { fprintf(stderr, "driver cuDevicePrimaryCtxReset v2 dev=%d\n", d); return CUDA_SUCCESS; }
static CUresult f_capture_v1(CUstream s) {
  fprintf(stderr, "driver cuStreamBeginCapture v1 stream=%p\n", (void *)s);
  return CUDA_ERROR_NOT_SUPPORTED;
}
static CUresult f_capture_v2(CUstream s, CUstreamCaptureMode m) {
  fprintf(stderr, "driver cuStreamBeginCapture v2 stream=%p mode=%d\n", (void *)s, (int)m);
  return CUDA_ERROR_NOT_SUPPORTED;
}
static CUresult f_ctx_destroy_v1(CUcontext c) { fprintf(stderr, "driver cuCtxDestroy v1 ctx=%p\n", (void *)c); return CUDA_SUCCESS; }
static CUresult f_host_register_v1(void *p, size_t n, unsigned int f) {
  fprintf(stderr, "driver cuMemHostRegister v1 n=%zu flags=%u\n", n, f);
  (void)p;
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult gpa_old(const char *symbol, void **pfn, int version, cuuint64_t flags) __asm__("cuGetProcAddress");

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  void *p = NULL;
  if (!strcmp(symbol, "cuInit")) p = (void *)f_init;
  else if (!strcmp(symbol, "cuDriverGetVersion")) p = (void *)f_version;
  else if (!strcmp(symbol, "cuGetProcAddress")) p = version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)gpa_old;
  else if (!strcmp(symbol, "cuLaunchKernel"))
    p = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? (void *)f_launch_ptsz : (void *)f_launch;
  else if (!strcmp(symbol, "cuDevicePrimaryCtxRelease")) p = version >= 11000 ? (void *)f_release_v2 : (void *)f_release_v1;
  else if (!strcmp(symbol, "cuDevicePrimaryCtxReset")) p = version >= 11000 ? (void *)f_reset_v2 : (void *)f_reset_v1;
  else if (!strcmp(symbol, "cuStreamBeginCapture")) p = version >= 10010 ? (void *)f_capture_v2 : (void *)f_capture_v1;
  else if (!strcmp(symbol, "cuCtxDestroy") && version < 4000) p = (void *)f_ctx_destroy_v1;
  else if (!strcmp(symbol, "cuMemHostRegister") && version < 6050) p = (void *)f_host_register_v1;
  *pfn = p;
  if (status) *status = p ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
CUresult gpa_old(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
CUresult cuInit(unsigned int flags) { return f_init(flags); }
CUresult cuDriverGetVersion(int *v) { return f_version(v); }
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shm, CUstream s, void **params, void **extra) {
  return f_launch(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
  return f_launch_ptsz(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}
