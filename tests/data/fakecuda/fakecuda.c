/* A stand-in libcuda.so.1 for the CPU tests of libapply's interposition (tests/test_apply_native.py) and of
 * librecord's timed launches (tests/test_record_hold.py): no GPU exists on the development machine, so these
 * entry points print what the driver was asked to do. Kernel
 * handle 0x1000 is the app's kernel FAKE_KERNEL (module 0x3); a loaded ELF file becomes module 0x2 whose
 * kernel is 0x2000 (FAKE_CUKERNEL: 0x1000 is a CUkernel instead, see below). Variables: "g_count" (8 bytes) and "c_table" (16 bytes) in both modules.
 *
 * Lazy loading as the real driver may do it: every function starts unloaded (cuFuncIsLoaded); cuFuncLoad loads
 * it. With FAKE_LAZY set, a launch of an unloaded function loads it first, which waits for the context's work:
 * behind a queued hold (cuStreamWaitValue32 not yet satisfied by the host flag) it waits until the flag is raised
 * (up to 10 s, then "deadlock"). With FAKE_LAUNCH_SYNCS set, every launch waits so; cuCtxSynchronize always does.
 *
 * For librecord: one device (0) with a current context, an address reservation granted where it is asked for
 * (no memory behind it: the app allocates none), kernel 0x1000's parameter layout (three pointers and an int,
 * as fakeapp passes them); the calls librecord needs but these tests never reach answer NOT_SUPPORTED. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))
static const char *kernel_name(void) {
  const char *k = getenv("FAKE_KERNEL");
  return k ? k : "_Z6vecAddPKfS0_Pfi";
}

/* The host flag libapply holds timed launches behind: a real GPU reaches a queued wait later, so the flag must
 * never go down (a lower value re-blocks a wait not yet reached). Checked at every call that sees it. */
static volatile uint32_t *hold_flag;
static uint32_t hold_max, hold_wait;
static void check_flag(void) {
  if (!hold_flag) return;
  uint32_t v = *hold_flag;
  if (v < hold_max) printf("hold flag went down %u -> %u\n", hold_max, v);
  if (v > hold_max) hold_max = v;
}

static int loaded[4]; /* 0x1000, 0x1001, 0x2000, other */
static int *loaded_slot(CUfunction f) {
  uintptr_t h = (uintptr_t)f;
  return &loaded[h == 0x1000 ? 0 : h == 0x1001 ? 1 : h == 0x2000 ? 2 : 3];
}
EXPORT CUresult cuFuncIsLoaded(CUfunctionLoadingState *st, CUfunction f) {
  *st = *loaded_slot(f) ? CU_FUNCTION_LOADING_STATE_LOADED : CU_FUNCTION_LOADING_STATE_UNLOADED;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuFuncLoad(CUfunction f) {
  *loaded_slot(f) = 1;
  printf("load %#lx\n", (unsigned long)(uintptr_t)f);
  return CUDA_SUCCESS;
}
/* Waits, as a context synchronization would, until a queued hold is released (10 s at most). `who`: "launch
 * 0x1000", "cuCtxSynchronize". */
static int wait_for_held_stream(const char *who) {
  if (!hold_flag || *hold_flag >= hold_wait) return 0;
  printf("%s waits for the held stream\n", who);
  fflush(stdout);
  struct timespec ts = {0, 1000000};
  for (int i = 0; i < 10000 && *hold_flag < hold_wait; i++) nanosleep(&ts, NULL);
  if (*hold_flag < hold_wait) {
    printf("deadlock\n");
    return -1;
  }
  return 0;
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shm, CUstream s, void **p, void **x) {
  (void)s, (void)p, (void)x;
  check_flag();
  /* a CUkernel launches its function in the context: 0x1001 */
  int *ld = loaded_slot(getenv("FAKE_CUKERNEL") && (uintptr_t)f == 0x1000 ? (CUfunction)0x1001 : f);
  if ((getenv("FAKE_LAZY") && !*ld) || getenv("FAKE_LAUNCH_SYNCS")) {
    char who[64];
    snprintf(who, sizeof who, "launch %#lx", (unsigned long)(uintptr_t)f);
    if (wait_for_held_stream(who)) return CUDA_ERROR_LAUNCH_TIMEOUT;
  }
  *ld = 1;
  printf("launch %#lx grid %u %u %u block %u %u %u shared %u\n", (unsigned long)(uintptr_t)f, gx, gy, gz, bx, by, bz, shm);
  return CUDA_SUCCESS;
}
/* cuLaunchCooperativeKernel: the same, marked "coop" */
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                          unsigned bz, unsigned shm, CUstream s, void **p) {
  (void)s, (void)p;
  check_flag();
  *loaded_slot(f) = 1;
  printf("coop launch %#lx grid %u %u %u block %u %u %u shared %u\n", (unsigned long)(uintptr_t)f, gx, gy, gz, bx, by, bz,
         shm);
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
  (void)s, (void)flags;
  hold_flag = (volatile uint32_t *)(uintptr_t)a;
  hold_wait = v;
  check_flag();
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

/* -- what librecord asks for besides (see the top) -------------------------------------------------------- */
EXPORT CUresult cuCtxGetDevice(CUdevice *d) { return *d = 0, CUDA_SUCCESS; }
EXPORT CUresult cuCtxSynchronize(void) {
  check_flag();
  return wait_for_held_stream("cuCtxSynchronize") ? CUDA_ERROR_LAUNCH_TIMEOUT : CUDA_SUCCESS;
}
EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st) {
  return (void)s, *st = CU_STREAM_CAPTURE_STATUS_NONE, CUDA_SUCCESS;
}
EXPORT CUresult cuFuncGetParamInfo(CUfunction f, size_t i, size_t *off, size_t *size) {
  if ((uintptr_t)f != 0x1000 || i >= 4) return CUDA_ERROR_INVALID_VALUE;
  *off = 8 * i;
  *size = i < 3 ? 8 : 4;
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) { return (void)a, (void)d, *v = 0, CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetName(char *name, int n, CUdevice d) {
  (void)d;
  snprintf(name, (size_t)n, "fake");
  return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { return (void)d, *b = 1ull << 30, CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { return (void)d, memset(u, 0, sizeof *u), CUDA_SUCCESS; }
EXPORT CUresult cuDriverGetVersion(int *v) { return *v = 13000, CUDA_SUCCESS; }
EXPORT CUresult cuGetErrorString(CUresult r, const char **s) { return cuGetErrorName(r, s); }
EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p, CUmemAllocationGranularity_flags o) {
  return (void)p, (void)o, *g = 2u << 20, CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t align, CUdeviceptr addr, unsigned long long flags) {
  return (void)n, (void)align, (void)flags, *p = addr, CUDA_SUCCESS;
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t n) { return (void)p, (void)n, CUDA_SUCCESS; }
EXPORT CUresult cuMemFreeHost(void *p) { return free(p), CUDA_SUCCESS; }
#define NOT_SUPPORTED return CUDA_ERROR_NOT_SUPPORTED
EXPORT CUresult cuStreamSynchronize(CUstream s) { (void)s; NOT_SUPPORTED; }
EXPORT CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { (void)d, (void)s, (void)n; NOT_SUPPORTED; }
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { (void)d, (void)s, (void)n; NOT_SUPPORTED; }
EXPORT CUresult cuEventDestroy_v2(CUevent e) { return (void)e, CUDA_SUCCESS; }
EXPORT CUresult cuLaunchHostFunc(CUstream s, CUhostFn f, void *u) { (void)s, (void)f, (void)u; NOT_SUPPORTED; }
EXPORT CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned fl) { (void)p, (void)n, (void)fl; NOT_SUPPORTED; }
EXPORT CUresult cuMemHostUnregister(void *p) { (void)p; NOT_SUPPORTED; }
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *d, size_t *pitch, size_t w, size_t h, unsigned e) {
  (void)d, (void)pitch, (void)w, (void)h, (void)e;
  NOT_SUPPORTED;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr d) { (void)d; NOT_SUPPORTED; }
EXPORT CUresult cuLibraryGetGlobal(CUdeviceptr *d, size_t *n, CUlibrary l, const char *name) {
  (void)d, (void)n, (void)l, (void)name;
  NOT_SUPPORTED;
}
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *p, unsigned long long fl) {
  (void)h, (void)n, (void)p, (void)fl;
  NOT_SUPPORTED;
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { (void)h; NOT_SUPPORTED; }
EXPORT CUresult cuMemMap(CUdeviceptr p, size_t n, size_t o, CUmemGenericAllocationHandle h, unsigned long long fl) {
  (void)p, (void)n, (void)o, (void)h, (void)fl;
  NOT_SUPPORTED;
}
EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t n) { (void)p, (void)n; NOT_SUPPORTED; }
EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t n, const CUmemAccessDesc *d, size_t c) {
  (void)p, (void)n, (void)d, (void)c;
  NOT_SUPPORTED;
}

static const struct {
  const char *name;
  void *fn;
} table[] = {
    {"cuLaunchKernel", (void *)cuLaunchKernel}, {"cuFuncGetName", (void *)cuFuncGetName},
    {"cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel},
    {"cuFuncGetModule", (void *)cuFuncGetModule}, {"cuCtxGetCurrent", (void *)cuCtxGetCurrent},
    {"cuKernelGetName", (void *)cuKernelGetName}, {"cuKernelGetFunction", (void *)cuKernelGetFunction},
    {"cuModuleLoad", (void *)cuModuleLoad}, {"cuModuleGetFunction", (void *)cuModuleGetFunction},
    {"cuModuleGetGlobal", (void *)cuModuleGetGlobal_v2}, {"cuMemcpyDtoDAsync", (void *)cuMemcpyDtoDAsync_v2},
    {"cuEventCreate", (void *)cuEventCreate}, {"cuEventRecord", (void *)cuEventRecord},
    {"cuEventQuery", (void *)cuEventQuery}, {"cuEventSynchronize", (void *)cuEventSynchronize},
    {"cuEventElapsedTime", (void *)cuEventElapsedTime}, {"cuStreamQuery", (void *)cuStreamQuery},
    {"cuStreamWaitValue32", (void *)cuStreamWaitValue32_v2}, {"cuMemHostAlloc", (void *)cuMemHostAlloc},
    {"cuMemHostGetDevicePointer", (void *)cuMemHostGetDevicePointer_v2}, {"cuGetErrorName", (void *)cuGetErrorName},
    {"cuFuncIsLoaded", (void *)cuFuncIsLoaded}, {"cuFuncLoad", (void *)cuFuncLoad},
    /* librecord's */
    {"cuCtxGetDevice", (void *)cuCtxGetDevice}, {"cuCtxSynchronize", (void *)cuCtxSynchronize},
    {"cuStreamIsCapturing", (void *)cuStreamIsCapturing}, {"cuFuncGetParamInfo", (void *)cuFuncGetParamInfo},
    {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute}, {"cuDeviceGetName", (void *)cuDeviceGetName},
    {"cuDeviceTotalMem", (void *)cuDeviceTotalMem_v2}, {"cuDeviceGetUuid", (void *)cuDeviceGetUuid},
    {"cuDriverGetVersion", (void *)cuDriverGetVersion}, {"cuGetErrorString", (void *)cuGetErrorString},
    {"cuMemGetAllocationGranularity", (void *)cuMemGetAllocationGranularity},
    {"cuMemAddressReserve", (void *)cuMemAddressReserve}, {"cuMemAddressFree", (void *)cuMemAddressFree},
    {"cuMemFreeHost", (void *)cuMemFreeHost}, {"cuStreamSynchronize", (void *)cuStreamSynchronize},
    {"cuMemcpyDtoH", (void *)cuMemcpyDtoH_v2}, {"cuMemcpyHtoD", (void *)cuMemcpyHtoD_v2},
    {"cuEventDestroy", (void *)cuEventDestroy_v2}, {"cuLaunchHostFunc", (void *)cuLaunchHostFunc},
    {"cuMemHostRegister", (void *)cuMemHostRegister_v2}, {"cuMemHostUnregister", (void *)cuMemHostUnregister},
    {"cuMemAllocPitch", (void *)cuMemAllocPitch_v2}, {"cuMemFree", (void *)cuMemFree_v2},
    {"cuLibraryGetGlobal", (void *)cuLibraryGetGlobal}, {"cuMemCreate", (void *)cuMemCreate},
    {"cuMemRelease", (void *)cuMemRelease}, {"cuMemMap", (void *)cuMemMap}, {"cuMemUnmap", (void *)cuMemUnmap},
    {"cuMemSetAccess", (void *)cuMemSetAccess},
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
