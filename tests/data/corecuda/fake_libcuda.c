/* A stand-in libcuda.so.1 for CPU tests of the replay core (native/core, loaded through MNEME_LIBCUDA):
 * device memory is host memory, and every copy is checked the way the driver checks it: each end must lie
 * inside ONE allocation (cuMemAlloc, a mapped cuMemCreate, a module variable), else CUDA_ERROR_INVALID_VALUE.
 * Module variables are placed as the driver does under lazy loading: each its own allocation, 256-byte
 * aligned, one after another in the order cuModuleGetGlobal first asks for them; FAKE_GLOBALS names them
 * ("g_count:8,g_launches:4"); FAKE_RESERVE_HINT_MIN makes small reservations land elsewhere. No kernel runs (cuModuleGetFunction answers NOT_FOUND). */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define EXPORT __attribute__((visibility("default")))
#define MAXA 256

typedef struct { uint64_t base, size; } alloc;
static alloc A[MAXA];
static int nA;

static void add(uint64_t base, uint64_t size) {
  if (nA < MAXA) A[nA++] = (alloc){base, size};
}
static void drop(uint64_t base) {
  for (int i = 0; i < nA; i++)
    if (A[i].base == base) A[i] = A[--nA];
}
/* 1 when [p, p + n) lies inside one allocation */
static int inside(uint64_t p, uint64_t n) {
  for (int i = 0; i < nA; i++)
    if (p >= A[i].base && n <= A[i].size && p - A[i].base <= A[i].size - n) return 1;
  return 0;
}

static CUresult ok(void) { return CUDA_SUCCESS; }
static CUresult unsupported(void) { return CUDA_ERROR_NOT_SUPPORTED; }

static CUresult errname(CUresult r, const char **s) {
  *s = r == CUDA_ERROR_INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_ERROR_OTHER";
  return CUDA_SUCCESS;
}
static CUresult errstring(CUresult r, const char **s) {
  *s = r == CUDA_ERROR_INVALID_VALUE ? "invalid argument" : "error";
  return CUDA_SUCCESS;
}
static CUresult version(int *v) { *v = 13000; return CUDA_SUCCESS; }
static CUresult count(int *n) { *n = 1; return CUDA_SUCCESS; }
static CUresult dev_get(CUdevice *d, int o) { *d = o; return o == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }
static CUresult dev_name(char *s, int n, CUdevice d) { (void)d; snprintf(s, (size_t)n, "stand-in GPU"); return CUDA_SUCCESS; }
static CUresult dev_attr(int *v, CUdevice_attribute a, CUdevice d) {
  (void)d;
  *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? 9 : a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR ? 0
       : a == CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE ? (1 << 20) : 1024;
  return CUDA_SUCCESS;
}
static CUresult dev_uuid(CUuuid *u, CUdevice d) { (void)d; memset(u, 7, sizeof *u); return CUDA_SUCCESS; }
static CUresult dev_pci(char *s, int n, CUdevice d) { (void)d; snprintf(s, (size_t)n, "0000:00:00.0"); return CUDA_SUCCESS; }
static CUresult dev_mem(size_t *b, CUdevice d) { (void)d; *b = (size_t)1 << 34; return CUDA_SUCCESS; }
static CUresult ctx_retain(CUcontext *c, CUdevice d) { (void)d; *c = (CUcontext)0x10; return CUDA_SUCCESS; }
static CUresult ctx_limit(size_t *v, CUlimit l) { (void)l; *v = 1024; return CUDA_SUCCESS; }
static CUresult stream_create(CUstream *s, unsigned f) { (void)f; *s = (CUstream)0x20; return CUDA_SUCCESS; }
static CUresult event_create(CUevent *e, unsigned f) { (void)f; static uintptr_t n = 0x30; *e = (CUevent)n++; return CUDA_SUCCESS; }
static CUresult elapsed(float *ms, CUevent a, CUevent b) { (void)a; (void)b; *ms = 0.001f; return CUDA_SUCCESS; }
static CUresult gran(size_t *g, const CUmemAllocationProp *p, CUmemAllocationGranularity_flags f) {
  (void)p; (void)f; *g = 2u << 20; return CUDA_SUCCESS;
}
/* FAKE_RESERVE_HINT_MIN (bytes): a smaller reservation ignores its address, as the H200's driver (580.159.04)
 * served 2 MB ones from its own pools while it granted 64 MB ones where asked */
static CUresult reserve(CUdeviceptr *got, size_t size, size_t align, CUdeviceptr want, unsigned long long f) {
  (void)align; (void)f;
  const char *min = getenv("FAKE_RESERVE_HINT_MIN");
  if (min && size < strtoull(min, NULL, 0)) want = 0;
  void *p = mmap((void *)(uintptr_t)want, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  *got = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}
static CUresult addr_free(CUdeviceptr p, size_t size) { return munmap((void *)(uintptr_t)p, size) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; }
static CUresult mem_create(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *p, unsigned long long f) {
  (void)p; (void)f; *h = size; return CUDA_SUCCESS;
}
static CUresult mem_map(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h, unsigned long long f) {
  (void)off; (void)h; (void)f;
  if (mprotect((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE)) return CUDA_ERROR_INVALID_VALUE;
  add(p, size);
  return CUDA_SUCCESS;
}
static CUresult mem_unmap(CUdeviceptr p, size_t size) { drop(p); mprotect((void *)(uintptr_t)p, size, PROT_NONE); return CUDA_SUCCESS; }
static CUresult mem_alloc(CUdeviceptr *p, size_t size) {
  void *m = aligned_alloc(256, (size + 255) / 256 * 256);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = (CUdeviceptr)(uintptr_t)m;
  add(*p, size);
  return CUDA_SUCCESS;
}
static CUresult mem_free(CUdeviceptr p) { drop(p); free((void *)(uintptr_t)p); return CUDA_SUCCESS; }
static CUresult host_alloc(void **p, size_t size) { *p = malloc(size); return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY; }
static CUresult host_free(void *p) { free(p); return CUDA_SUCCESS; }
static CUresult htod(CUdeviceptr d, const void *s, size_t n, CUstream st) {
  (void)st;
  if (!inside(d, n)) return CUDA_ERROR_INVALID_VALUE;
  memcpy((void *)(uintptr_t)d, s, n);
  return CUDA_SUCCESS;
}
static CUresult dtoh(void *d, CUdeviceptr s, size_t n, CUstream st) {
  (void)st;
  if (!inside(s, n)) return CUDA_ERROR_INVALID_VALUE;
  memcpy(d, (const void *)(uintptr_t)s, n);
  return CUDA_SUCCESS;
}
static CUresult dtod(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
  (void)st;
  if (!inside(d, n) || !inside(s, n)) {
    fprintf(stderr, "fake_libcuda: cuMemcpyDtoDAsync(0x%llx, 0x%llx, %zu) leaves an allocation\n",
            (unsigned long long)d, (unsigned long long)s, n);
    return CUDA_ERROR_INVALID_VALUE;
  }
  memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n);
  return CUDA_SUCCESS;
}
static CUresult memset8(CUdeviceptr d, unsigned char v, size_t n, CUstream st) {
  (void)st;
  if (!inside(d, n)) return CUDA_ERROR_INVALID_VALUE;
  memset((void *)(uintptr_t)d, v, n);
  return CUDA_SUCCESS;
}

/* ---- one module at a time; its variables from FAKE_GLOBALS, placed lazily ---- */
static uint8_t *pool;
static size_t pool_used;
static struct { char name[64]; uint64_t addr, size; } G[32];
static int nG;

static CUresult mod_load(CUmodule *m, const void *img, unsigned n, CUjit_option *o, void **v) {
  (void)img; (void)n; (void)o; (void)v;
  if (!pool) pool = aligned_alloc(4096, 1 << 16);
  pool_used = 0;
  nG = 0;
  *m = (CUmodule)0x40;
  return CUDA_SUCCESS;
}
static CUresult mod_unload(CUmodule m) {
  (void)m;
  for (int i = 0; i < nG; i++) drop(G[i].addr);
  nG = 0;
  return CUDA_SUCCESS;
}
static CUresult mod_global(CUdeviceptr *p, size_t *bytes, CUmodule m, const char *name) {
  (void)m;
  for (int i = 0; i < nG; i++)
    if (!strcmp(G[i].name, name)) {
      *p = G[i].addr, *bytes = G[i].size;
      return CUDA_SUCCESS;
    }
  const char *spec = getenv("FAKE_GLOBALS");
  size_t len = strlen(name);
  for (const char *s = spec ? strstr(spec, name) : NULL; s; s = strstr(s + 1, name)) {
    if ((s != spec && s[-1] != ',') || s[len] != ':') continue;
    uint64_t size = strtoull(s + len + 1, NULL, 10);
    if (nG == 32 || pool_used + size > (1 << 16)) return CUDA_ERROR_OUT_OF_MEMORY;
    snprintf(G[nG].name, sizeof G[nG].name, "%s", name);
    G[nG].addr = (uint64_t)(uintptr_t)(pool + pool_used);
    G[nG].size = size;
    memset(pool + pool_used, 0, size);
    add(G[nG].addr, size);
    pool_used += (size + 255) / 256 * 256;
    *p = G[nG].addr, *bytes = size;
    nG++;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_NOT_FOUND;
}
static CUresult mod_function(CUfunction *f, CUmodule m, const char *name) { (void)f; (void)m; (void)name; return CUDA_ERROR_NOT_FOUND; }

static const struct { const char *name; void *fn; } T[] = {
    {"cuGetErrorName", (void *)errname}, {"cuGetErrorString", (void *)errstring}, {"cuInit", (void *)ok},
    {"cuDriverGetVersion", (void *)version}, {"cuDeviceGetCount", (void *)count}, {"cuDeviceGet", (void *)dev_get},
    {"cuDeviceGetName", (void *)dev_name}, {"cuDeviceGetAttribute", (void *)dev_attr},
    {"cuDeviceGetUuid", (void *)dev_uuid}, {"cuDeviceGetPCIBusId", (void *)dev_pci},
    {"cuDeviceTotalMem", (void *)dev_mem}, {"cuDevicePrimaryCtxRetain", (void *)ctx_retain},
    {"cuDevicePrimaryCtxRelease", (void *)ok}, {"cuCtxSetCurrent", (void *)ok}, {"cuCtxGetLimit", (void *)ctx_limit},
    {"cuCtxSetLimit", (void *)ok}, {"cuStreamCreate", (void *)stream_create}, {"cuStreamDestroy", (void *)ok},
    {"cuStreamQuery", (void *)ok}, {"cuEventCreate", (void *)event_create}, {"cuEventDestroy", (void *)ok},
    {"cuEventRecord", (void *)ok}, {"cuEventQuery", (void *)ok}, {"cuEventElapsedTime", (void *)elapsed},
    {"cuMemGetAllocationGranularity", (void *)gran}, {"cuMemAddressReserve", (void *)reserve},
    {"cuMemAddressFree", (void *)addr_free}, {"cuMemCreate", (void *)mem_create}, {"cuMemRelease", (void *)ok},
    {"cuMemMap", (void *)mem_map}, {"cuMemUnmap", (void *)mem_unmap}, {"cuMemSetAccess", (void *)ok},
    {"cuMemAlloc", (void *)mem_alloc}, {"cuMemFree", (void *)mem_free}, {"cuMemAllocHost", (void *)host_alloc},
    {"cuMemFreeHost", (void *)host_free}, {"cuMemcpyHtoDAsync", (void *)htod}, {"cuMemcpyDtoHAsync", (void *)dtoh},
    {"cuMemcpyDtoDAsync", (void *)dtod}, {"cuMemsetD8Async", (void *)memset8},
    {"cuModuleLoadDataEx", (void *)mod_load}, {"cuModuleUnload", (void *)mod_unload},
    {"cuModuleGetFunction", (void *)mod_function}, {"cuModuleGetGlobal", (void *)mod_global},
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **fn, int ver, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
  (void)ver; (void)flags;
  *fn = (void *)unsupported; /* every other entry point the core resolves: never reached by these tests */
  for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
    if (!strcmp(T[i].name, symbol)) *fn = T[i].fn;
  if (!strcmp(symbol, "cuFuncGetParamInfo")) *fn = NULL;
  if (status) *status = *fn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return *fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
