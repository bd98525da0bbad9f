/* A stand-in libcuda.so.1 for CPU tests of librecord's recording path (tests/test_record_writer.py):
 * enough of the driver for one instance to be recorded end to end. Device memory is host memory: the
 * arena's address range is an anonymous mapping at the fixed address librecord asks for, so copies are
 * memcpy. Kernel 0x1000 ("_Z4fillPfi", parameters float *p at 0 and int n at 8) adds 1 to p[0..n).
 * With FAKE_CRASH set, the launch waits until the recorder's prologue file under MNEME_RECORD_DIR has
 * bytes on disk (the prologue is then being written) and the process dies of SIGSEGV. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#define OK CUDA_SUCCESS
#define KERNEL ((CUfunction)(uintptr_t)0x1000)

static CUresult f_init(unsigned int flags) { (void)flags; return OK; }
static CUresult f_err(CUresult r, const char **s) { (void)r; *s = "fake error"; return OK; }
static CUresult f_ctx_dev(CUdevice *d) { *d = 0; return OK; }
static CUresult f_sync(void) { return OK; }
static CUresult f_stream_sync(CUstream s) { (void)s; return OK; }
static CUresult f_capturing(CUstream s, CUstreamCaptureStatus *st) { (void)s; *st = CU_STREAM_CAPTURE_STATUS_NONE; return OK; }
static CUresult f_dtoh(void *d, CUdeviceptr s, size_t n) { memcpy(d, (void *)(uintptr_t)s, n); return OK; }
static CUresult f_htod(CUdeviceptr d, const void *s, size_t n) { memcpy((void *)(uintptr_t)d, s, n); return OK; }
static CUresult f_dtoh_async(void *d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return f_dtoh(d, s, n); }
static CUresult f_htod_async(CUdeviceptr d, const void *s, size_t n, CUstream st) { (void)st; return f_htod(d, s, n); }
static CUresult f_stream_create(CUstream *s, unsigned int flags) { (void)flags; *s = (CUstream)(uintptr_t)0x77; return OK; }
static CUresult f_ev_create(CUevent *e, unsigned int flags) { (void)flags; *e = (CUevent)malloc(8); return *e ? OK : CUDA_ERROR_OUT_OF_MEMORY; }
static CUresult f_ev_destroy(CUevent e) { free(e); return OK; }
static CUresult f_ev_record(CUevent e, CUstream s) { (void)e, (void)s; return OK; }
static CUresult f_ev_one(CUevent e) { (void)e; return OK; }
static CUresult f_ev_elapsed(float *ms, CUevent a, CUevent b) { (void)a, (void)b; *ms = 0.005f; return OK; }
static CUresult f_host_func(CUstream s, CUhostFn fn, void *data) { (void)s; fn(data); return OK; }
static CUresult f_host_register(void *p, size_t n, unsigned int f) { (void)p, (void)n, (void)f; return OK; }
static CUresult f_host_unregister(void *p) { (void)p; return OK; }
static CUresult f_host_alloc(void **p, size_t n, unsigned int f) {
  (void)f;
  *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  return *p ? OK : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_host_devptr(CUdeviceptr *d, void *p, unsigned int f) { (void)f; *d = (CUdeviceptr)(uintptr_t)p; return OK; }
static CUresult f_free_host(void *p) { free(p); return OK; }
static CUresult f_alloc(CUdeviceptr *p, size_t n) { return f_host_alloc((void **)p, n, 0); }
static CUresult f_alloc_pitch(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e) {
  (void)e;
  *pitch = (w + 511) / 512 * 512;
  return f_alloc(p, *pitch * h);
}
static CUresult f_free(CUdeviceptr p) { free((void *)(uintptr_t)p); return OK; }
static CUresult f_no_global(CUdeviceptr *p, size_t *n, void *where, const char *name) {
  (void)p, (void)n, (void)where, (void)name;
  return CUDA_ERROR_NOT_FOUND;
}
static CUresult f_dev_name(char *s, int n, CUdevice d) { (void)d; snprintf(s, (size_t)n, "fake GPU"); return OK; }
static CUresult f_dev_attr(int *v, CUdevice_attribute a, CUdevice d) { (void)a, (void)d; *v = 0; return OK; }
static CUresult f_dev_mem(size_t *n, CUdevice d) { (void)d; *n = 16ull << 30; return OK; }
static CUresult f_dev_uuid(CUuuid *u, CUdevice d) { (void)d; memset(u, 0, sizeof *u); return OK; }
static CUresult f_version(int *v) { *v = 12040; return OK; }
static CUresult f_gran(size_t *g, const CUmemAllocationProp *p, CUmemAllocationGranularity_flags o) {
  (void)p, (void)o;
  *g = 2u << 20;
  return OK;
}
static CUresult f_reserve(CUdeviceptr *p, size_t n, size_t align, CUdeviceptr addr, unsigned long long flags) {
  (void)align, (void)flags;
  void *m = mmap((void *)(uintptr_t)addr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE |
                 (addr ? MAP_FIXED_NOREPLACE : 0), -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = (CUdeviceptr)(uintptr_t)m;
  return OK;
}
static CUresult f_addr_free(CUdeviceptr p, size_t n) { munmap((void *)(uintptr_t)p, n); return OK; }
static CUresult f_create(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *p, unsigned long long f) {
  static CUmemGenericAllocationHandle next = 1;
  (void)n, (void)p, (void)f;
  *h = next++;
  return OK;
}
static CUresult f_release(CUmemGenericAllocationHandle h) { (void)h; return OK; }
static CUresult f_map(CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h, unsigned long long f) {
  (void)p, (void)n, (void)off, (void)h, (void)f;
  return OK;
}
static CUresult f_unmap(CUdeviceptr p, size_t n) { (void)p, (void)n; return OK; }
static CUresult f_access(CUdeviceptr p, size_t n, const CUmemAccessDesc *d, size_t c) { (void)p, (void)n, (void)d, (void)c; return OK; }
static CUresult f_param(CUfunction f, size_t i, size_t *off, size_t *size) {
  if (f != KERNEL || i > 1) return CUDA_ERROR_INVALID_VALUE;
  *off = i ? 8 : 0;
  *size = i ? 4 : 8;
  return OK;
}
static CUresult f_name(const char **name, CUfunction f) {
  if (f != KERNEL) return CUDA_ERROR_INVALID_HANDLE;
  *name = "_Z4fillPfi";
  return OK;
}

/* Bytes of the first *.prologue file under MNEME_RECORD_DIR (0: none yet). */
static long long prologue_bytes(void) {
  const char *dir = getenv("MNEME_RECORD_DIR");
  DIR *d = dir ? opendir(dir) : NULL;
  long long n = 0;
  for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
    size_t len = strlen(e->d_name);
    if (len < 9 || strcmp(e->d_name + len - 9, ".prologue")) continue;
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (stat(path, &st) == 0) n = st.st_size;
  }
  if (d) closedir(d);
  return n;
}

static CUresult f_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shm, CUstream s, void **params, void **extra) {
  (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)s, (void)extra;
  if (f != KERNEL || !params) return CUDA_ERROR_INVALID_VALUE;
  if (getenv("FAKE_CRASH")) {
    for (int i = 0; i < 5000 && prologue_bytes() == 0; i++) nanosleep(&(struct timespec){0, 1000000}, NULL);
    printf("crashing with %lld prologue bytes on disk\n", prologue_bytes());
    fflush(stdout);
    raise(SIGSEGV);
  }
  float *p = *(float **)params[0];
  int n = *(int *)params[1];
  for (int i = 0; i < n; i++) p[i] += 1.0f;
  return OK;
}

CUresult gpa_old(const char *symbol, void **pfn, int version, cuuint64_t flags) __asm__("cuGetProcAddress");

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  (void)flags;
  static const struct { const char *name; void *fn; } table[] = {
      {"cuInit", (void *)f_init}, {"cuGetErrorString", (void *)f_err}, {"cuCtxGetDevice", (void *)f_ctx_dev},
      {"cuCtxSynchronize", (void *)f_sync}, {"cuStreamSynchronize", (void *)f_stream_sync},
      {"cuStreamIsCapturing", (void *)f_capturing}, {"cuMemcpyDtoH", (void *)f_dtoh}, {"cuMemcpyHtoD", (void *)f_htod},
      {"cuMemcpyDtoHAsync", (void *)f_dtoh_async}, {"cuMemcpyHtoDAsync", (void *)f_htod_async},
      {"cuStreamCreate", (void *)f_stream_create}, {"cuEventCreate", (void *)f_ev_create},
      {"cuEventDestroy", (void *)f_ev_destroy}, {"cuEventRecord", (void *)f_ev_record},
      {"cuEventQuery", (void *)f_ev_one}, {"cuEventSynchronize", (void *)f_ev_one},
      {"cuEventElapsedTime", (void *)f_ev_elapsed}, {"cuLaunchHostFunc", (void *)f_host_func},
      {"cuMemHostRegister", (void *)f_host_register}, {"cuMemHostUnregister", (void *)f_host_unregister},
      {"cuMemHostAlloc", (void *)f_host_alloc}, {"cuMemHostGetDevicePointer", (void *)f_host_devptr},
      {"cuMemFreeHost", (void *)f_free_host}, {"cuMemAlloc", (void *)f_alloc}, {"cuMemAllocPitch", (void *)f_alloc_pitch},
      {"cuMemFree", (void *)f_free}, {"cuLibraryGetGlobal", (void *)f_no_global},
      {"cuModuleGetGlobal", (void *)f_no_global}, {"cuDeviceGetName", (void *)f_dev_name},
      {"cuDeviceGetAttribute", (void *)f_dev_attr}, {"cuDeviceTotalMem", (void *)f_dev_mem},
      {"cuDeviceGetUuid", (void *)f_dev_uuid}, {"cuDriverGetVersion", (void *)f_version},
      {"cuMemGetAllocationGranularity", (void *)f_gran}, {"cuMemAddressReserve", (void *)f_reserve},
      {"cuMemAddressFree", (void *)f_addr_free}, {"cuMemCreate", (void *)f_create}, {"cuMemRelease", (void *)f_release},
      {"cuMemMap", (void *)f_map}, {"cuMemUnmap", (void *)f_unmap}, {"cuMemSetAccess", (void *)f_access},
      {"cuFuncGetParamInfo", (void *)f_param}, {"cuFuncGetName", (void *)f_name}, {"cuLaunchKernel", (void *)f_launch},
  };
  void *p = NULL;
  if (!strcmp(symbol, "cuGetProcAddress")) p = version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)gpa_old;
  for (size_t i = 0; !p && i < sizeof table / sizeof table[0]; i++)
    if (!strcmp(symbol, table[i].name)) p = table[i].fn;
  *pfn = p;
  if (status) *status = p ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return p ? OK : CUDA_ERROR_NOT_FOUND;
}
CUresult gpa_old(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
CUresult cuInit(unsigned int flags) { return f_init(flags); }
