/* A stand-in libcuda.so.1 for the CPU tests of libapply's interposition (tests/test_apply_native.py): no GPU
 * exists on the development machine, so these entry points print what the driver was asked to do. Kernel
 * handle 0x1000 is the app's kernel FAKE_KERNEL (module 0x3); a loaded ELF file becomes module 0x2 whose
 * kernel is 0x2000 (FAKE_CUKERNEL: 0x1000 is a CUkernel instead, see below). Variables: "g_count" (8 bytes) and "c_table" (16 bytes) in both modules. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
static const char *kernel_name(void) {
  const char *k = getenv("FAKE_KERNEL");
  return k ? k : "_Z6vecAddPKfS0_Pfi";
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shm, CUstream s, void **p, void **x) {
  (void)s, (void)p, (void)x;
  printf("launch %#lx grid %u %u %u block %u %u %u shared %u\n", (unsigned long)(uintptr_t)f, gx, gy, gz, bx, by, bz, shm);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuFuncGetName(const char **name, CUfunction f) {
  uintptr_t h = (uintptr_t)f;
  if ((h != 0x1000 || getenv("FAKE_CUKERNEL")) && h != 0x2000) return CUDA_ERROR_INVALID_HANDLE;
  *name = kernel_name();
  return CUDA_SUCCESS;
}
/* With FAKE_CUKERNEL set, 0x1000 is a CUkernel (as cudart passes them): its function here is 0x1001. */
EXPORT CUresult cuKernelGetName(const char **name, CUkernel k) {
  if (!getenv("FAKE_CUKERNEL") || (uintptr_t)k != 0x1000) return CUDA_ERROR_INVALID_HANDLE;
  *name = kernel_name();
  return CUDA_SUCCESS;
}
EXPORT CUresult cuKernelGetFunction(CUfunction *f, CUkernel k) {
  if (!getenv("FAKE_CUKERNEL") || (uintptr_t)k != 0x1000) return CUDA_ERROR_INVALID_HANDLE;
  *f = (CUfunction)0x1001;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuFuncGetModule(CUmodule *m, CUfunction f) {
  if ((uintptr_t)f != (getenv("FAKE_CUKERNEL") ? 0x1001u : 0x1000u)) return CUDA_ERROR_INVALID_HANDLE;
  *m = (CUmodule)0x3;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) {
  *c = (CUcontext)0x1;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleLoad(CUmodule *m, const char *path) {
  FILE *fd = fopen(path, "rb");
  char head[4] = {0};
  size_t n = fd ? fread(head, 1, 4, fd) : 0;
  if (fd) fclose(fd);
  if (n != 4 || memcmp(head, "\x7f" "ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
  *m = (CUmodule)0x2;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  if ((uintptr_t)m != 0x2 || strcmp(name, kernel_name()) != 0) return CUDA_ERROR_NOT_FOUND;
  *f = (CUfunction)0x2000;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr *d, size_t *size, CUmodule m, const char *name) {
  uintptr_t base = (uintptr_t)m == 0x2 ? 0x20000 : 0x30000;
  if (strcmp(name, "g_count") == 0) *d = base + 0x100, *size = 8;
  else if (strcmp(name, "c_table") == 0) *d = base + 0x200, *size = 16;
  else return CUDA_ERROR_NOT_FOUND;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)s;
  printf("copy %#llx <- %#llx %zu\n", (unsigned long long)dst, (unsigned long long)src, n);
  return CUDA_SUCCESS;
}
static int events;
EXPORT CUresult cuEventCreate(CUevent *e, unsigned flags) {
  (void)flags;
  *e = (CUevent)(uintptr_t)(0x100 + ++events);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) { return (void)e, (void)s, CUDA_SUCCESS; }
EXPORT CUresult cuEventQuery(CUevent e) { return (void)e, CUDA_SUCCESS; }
EXPORT CUresult cuEventSynchronize(CUevent e) { return (void)e, CUDA_SUCCESS; }
EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
  (void)a, (void)b;
  *ms = 0.004f;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamQuery(CUstream s) { return (void)s, CUDA_SUCCESS; }
EXPORT CUresult cuStreamWaitValue32_v2(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned flags) {
  (void)s, (void)a, (void)flags;
  printf("hold until %u\n", v);
  return CUDA_SUCCESS;
}
EXPORT CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
  (void)flags;
  *p = calloc(1, n);
  return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) {
  (void)flags;
  *d = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorName(CUresult r, const char **s) {
  *s = r == CUDA_ERROR_INVALID_IMAGE ? "CUDA_ERROR_INVALID_IMAGE" : "CUDA_ERROR_FAKE";
  return CUDA_SUCCESS;
}

static const struct {
  const char *name;
  void *fn;
} table[] = {
    {"cuLaunchKernel", (void *)cuLaunchKernel}, {"cuFuncGetName", (void *)cuFuncGetName},
    {"cuFuncGetModule", (void *)cuFuncGetModule}, {"cuCtxGetCurrent", (void *)cuCtxGetCurrent},
    {"cuKernelGetName", (void *)cuKernelGetName}, {"cuKernelGetFunction", (void *)cuKernelGetFunction},
    {"cuModuleLoad", (void *)cuModuleLoad}, {"cuModuleGetFunction", (void *)cuModuleGetFunction},
    {"cuModuleGetGlobal", (void *)cuModuleGetGlobal_v2}, {"cuMemcpyDtoDAsync", (void *)cuMemcpyDtoDAsync_v2},
    {"cuEventCreate", (void *)cuEventCreate}, {"cuEventRecord", (void *)cuEventRecord},
    {"cuEventQuery", (void *)cuEventQuery}, {"cuEventSynchronize", (void *)cuEventSynchronize},
    {"cuEventElapsedTime", (void *)cuEventElapsedTime}, {"cuStreamQuery", (void *)cuStreamQuery},
    {"cuStreamWaitValue32", (void *)cuStreamWaitValue32_v2}, {"cuMemHostAlloc", (void *)cuMemHostAlloc},
    {"cuMemHostGetDevicePointer", (void *)cuMemHostGetDevicePointer_v2}, {"cuGetErrorName", (void *)cuGetErrorName},
};

/* The names libapply asks for carry version suffixes (_v2); the base name is what cuGetProcAddress takes. */
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *st) {
  (void)ver, (void)flags;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(sym, table[i].name) == 0) {
      *pfn = table[i].fn;
      if (st) *st = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  *pfn = NULL;
  if (st) *st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}
