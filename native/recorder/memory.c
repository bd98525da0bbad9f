/* librecord's memory: every device allocation of the recorded device comes from one virtual address
 * range reserved at a fixed address with the CUDA VMM driver API and backed chunk by chunk as it fills;
 * pinned host allocations come from a fixed-address host region registered with CUDA. Replay places
 * both at the same addresses, so pointers inside the recorded data stay valid.
 *
 * Memory the recorder cannot place (managed memory, host memory the app registers itself, allocations
 * on another device or after the arena filled up) is remembered, so launches that receive pointers into
 * it are marked not replayable. */
#include "state.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define MN_EXPORT __attribute__((visibility("default")))
#define MN_CHUNK_MIN (64ull << 20)

static int warned_full, warned_pinned, warned_capture_free;

/* ---------------------------------------------------------------------------------------------- */
/* driver entry points                                                                            */

static struct {
  CUresult (*ctxGetDevice)(CUdevice *);
  CUresult (*getGranularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
  CUresult (*addressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*addressFree)(CUdeviceptr, size_t);
  CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*setAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*deviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
  CUresult (*getErrorString)(CUresult, const char **);
} D;

static CUmemAllocationProp prop;

static const char *cu_err(CUresult r) {
  const char *s = NULL;
  if (D.getErrorString && D.getErrorString(r, &s) == CUDA_SUCCESS && s) return s;
  return "unknown driver error";
}

static int load_driver(char *why, size_t cap) {
  const char *missing = mn_driver_missing();
  if (missing) {
    snprintf(why, cap, "libcuda.so.1 cannot be loaded (%s): no NVIDIA driver on this machine", missing);
    return -1;
  }
#define LOAD(field, name, version)                                                          \
  do {                                                                                      \
    D.field = (__typeof__(D.field))mn_driver(name, version);                                \
    if (!D.field) {                                                                         \
      snprintf(why, cap, "the driver lacks %s (libcuda.so.1 too old or missing)", name);   \
      return -1;                                                                            \
    }                                                                                       \
  } while (0)
  LOAD(getErrorString, "cuGetErrorString", 6000);
  LOAD(ctxGetDevice, "cuCtxGetDevice", 2000);
  LOAD(getGranularity, "cuMemGetAllocationGranularity", 10020);
  LOAD(addressReserve, "cuMemAddressReserve", 10020);
  LOAD(addressFree, "cuMemAddressFree", 10020);
  LOAD(create, "cuMemCreate", 10020);
  LOAD(release, "cuMemRelease", 10020);
  LOAD(map, "cuMemMap", 10020);
  LOAD(unmap, "cuMemUnmap", 10020);
  LOAD(setAccess, "cuMemSetAccess", 10020);
  LOAD(deviceGetAttribute, "cuDeviceGetAttribute", 2000);
#undef LOAD
  return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* the device arena                                                                               */

static void arena_event(uint64_t granted) {
  mn_line l;
  static char buf[1024];
  mn_line_begin(&l, buf, sizeof buf, "arena");
  mn_line_hexaddr(&l, "base", R.dev.base);
  mn_line_u64(&l, "bytes", R.dev.size);
  mn_line_u64(&l, "chunk", R.chunk);
  mn_line_hexaddr(&l, "granted", granted);
  mn_line_i64(&l, "device", R.device);
  mn_log_event(&l);
}

static int reserve_fixed(uint64_t base, uint64_t bytes, uint64_t *got) {
  /* The driver treats the address as a hint. Retry once with an explicit alignment before giving up. */
  const size_t aligns[] = {0, (size_t)R.chunk, 0};
  for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
    CUdeviceptr p = 0;
    CUresult r = D.addressReserve(&p, bytes, aligns[i], (CUdeviceptr)base, 0);
    if (r == CUDA_SUCCESS && p == base) {
      *got = p;
      return 0;
    }
    if (r == CUDA_SUCCESS) {
      *got = p;
      D.addressFree(p, bytes);
    } else {
      *got = 0;
    }
    usleep(1000);
  }
  return -1;
}

static int setup_arena(void) {
  char why[512];
  if (load_driver(why, sizeof why)) {
    mn_error("cannot set up the device arena", why);
    return -1;
  }
  /* Make sure the runtime has created (and made current) the primary context. */
  cudaError_t e = REAL(cudaFree)(NULL);
  if (e != cudaSuccess) {
    REAL(cudaGetLastError)();
    mn_error("the CUDA runtime could not initialise", REAL(cudaGetErrorString)(e));
    return -1;
  }
  REAL(cudaGetDevice)(&R.device);
  CUresult r = D.ctxGetDevice(&R.cudev);
  if (r != CUDA_SUCCESS) {
    mn_error("no current CUDA context", cu_err(r));
    return -1;
  }
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = R.cudev;
  int rdma = 0;
  if (D.deviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, R.cudev) == CUDA_SUCCESS && rdma)
    prop.allocFlags.gpuDirectRDMACapable = 1; /* MPI transports may then use arena memory like cudaMalloc's */
  size_t gran = 0;
  r = D.getGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r != CUDA_SUCCESS || gran == 0) {
    mn_error("cuMemGetAllocationGranularity failed", cu_err(r));
    return -1;
  }
  R.chunk = mn_round_up(MN_CHUNK_MIN, gran);
  uint64_t bytes = mn_round_up(R.cfg.va_bytes, R.chunk);
  uint64_t base = R.cfg.va_base;
  if (bytes == 0 || base % gran) {
    snprintf(why, sizeof why, "MNEME_VA_BASE 0x%llx must be a multiple of 0x%zx and --va-size positive",
             (unsigned long long)base, gran);
    mn_error("bad arena settings", why);
    return -1;
  }
  uint64_t got = 0;
  if (reserve_fixed(base, bytes, &got)) {
    snprintf(why, sizeof why,
             "could not reserve %llu GiB of device addresses at 0x%llx (the driver offered 0x%llx): another "
             "mapping overlaps that range. Record again with a smaller --va-size (now %.1f GiB), or another "
             "base address in MNEME_VA_BASE",
             (unsigned long long)(bytes >> 30), (unsigned long long)base, (unsigned long long)got,
             (double)bytes / (double)(1ull << 30));
    mn_error("the fixed device address range was not granted", why);
    arena_event(got);
    return -1;
  }
  R.nchunks = (size_t)(bytes / R.chunk);
  R.backed = calloc(R.nchunks, 1);
  R.handles = calloc(R.nchunks, sizeof *R.handles);
  if (!R.backed || !R.handles || mn_arena_init(&R.dev, base, bytes, MN_DEVICE_ALIGN)) {
    D.addressFree((CUdeviceptr)base, bytes);
    mn_error("out of host memory setting up the arena", NULL);
    return -1;
  }
  arena_event(got);
  return 0;
}

int mn_arena_ready(void) {
  if (R.arena_state) return R.arena_state > 0;
  R.arena_state = -1;
  if (setup_arena() == 0) {
    R.arena_state = 1;
  } else {
    R.broken = 1; /* pass everything through: the app still runs */
  }
  mn_write_provenance();
  mn_exit_hook_arm();
  return R.arena_state > 0;
}

static void backing_failed(const char *call, CUresult r) {
  static int reported;
  if (reported++) return;
  char why[256];
  snprintf(why, sizeof why, "%s failed: %s (%d)", call, cu_err(r), (int)r);
  mn_error("cannot back the device arena with memory; allocations are served outside it and kernels using them cannot be replayed", why);
}

/* Maps physical memory under [addr, addr+size) where it is not mapped yet. */
static CUresult back(uint64_t addr, uint64_t size) {
  size_t first = (size_t)((addr - R.dev.base) / R.chunk);
  size_t last = (size_t)((addr + size - 1 - R.dev.base) / R.chunk);
  for (size_t i = first; i <= last; i++) {
    if (R.backed[i]) continue;
    CUdeviceptr at = (CUdeviceptr)(R.dev.base + i * R.chunk);
    CUmemGenericAllocationHandle h;
    CUresult r = D.create(&h, R.chunk, &prop, 0);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY && prop.allocFlags.gpuDirectRDMACapable) {
      prop.allocFlags.gpuDirectRDMACapable = 0; /* some platforms report the capability but refuse it */
      r = D.create(&h, R.chunk, &prop, 0);
    }
    if (r != CUDA_SUCCESS) {
      if (r != CUDA_ERROR_OUT_OF_MEMORY) backing_failed("cuMemCreate", r);
      return r;
    }
    r = D.map(at, R.chunk, 0, h, 0);
    if (r != CUDA_SUCCESS) {
      backing_failed("cuMemMap", r);
      D.release(h);
      return r;
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = R.cudev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = D.setAccess(at, R.chunk, &acc, 1);
    if (r != CUDA_SUCCESS) {
      backing_failed("cuMemSetAccess", r);
      D.unmap(at, R.chunk);
      D.release(h);
      return r;
    }
    R.handles[i] = h;
    R.backed[i] = 1;
  }
  return CUDA_SUCCESS;
}

static void foreign_add(uint64_t addr, uint64_t size, int kind) {
  if (R.nforeign == R.capforeign) {
    size_t ncap = R.capforeign ? R.capforeign * 2 : 16;
    mn_foreign *n = realloc(R.foreign, ncap * sizeof *n);
    if (!n) return;
    R.foreign = n;
    R.capforeign = ncap;
  }
  R.foreign[R.nforeign].addr = addr;
  R.foreign[R.nforeign].size = size;
  R.foreign[R.nforeign].kind = kind;
  R.nforeign++;
}

static void foreign_del(uint64_t addr) {
  for (size_t i = 0; i < R.nforeign; i++) {
    if (R.foreign[i].addr == addr) {
      R.foreign[i] = R.foreign[--R.nforeign];
      return;
    }
  }
}

const mn_foreign *mn_foreign_find(uint64_t addr) {
  for (size_t i = 0; i < R.nforeign; i++)
    if (addr >= R.foreign[i].addr && addr - R.foreign[i].addr < R.foreign[i].size) return &R.foreign[i];
  return NULL;
}

const mn_gvar *mn_var_containing(uint64_t addr) {
  for (size_t i = 0; i < R.nvars; i++) {
    const mn_gvar *v = &R.vars[i];
    if (v->resolved > 0 && !v->managed && addr >= v->addr && addr - v->addr < v->size) return v;
  }
  return NULL;
}

int mn_is_recorded_memory(uint64_t addr) {
  return (R.arena_state > 0 && mn_arena_contains(&R.dev, addr)) ||
         (R.host_state > 0 && mn_arena_contains(&R.host, addr));
}

static void annots_drop(uint64_t addr, uint64_t size) {
  for (size_t i = 0; i < R.nannots;) {
    if (R.annots[i].addr >= addr && R.annots[i].addr - addr < size)
      R.annots[i] = R.annots[--R.nannots];
    else
      i++;
  }
}

/* Device allocation from the arena; 0 when the arena cannot serve it (the caller falls back). */
static uint64_t dev_alloc(uint64_t size, cudaError_t *err) {
  *err = cudaSuccess;
  mn_drain_deferred_frees();
  uint64_t a = mn_arena_alloc(&R.dev, size);
  if (!a) {
    if (!warned_full) {
      char why[512];
      snprintf(why, sizeof why,
               "an allocation of %llu bytes does not fit (largest free block %llu of %llu bytes); it is served "
               "outside the arena and kernels using it cannot be replayed. Record again with a larger --va-size",
               (unsigned long long)size, (unsigned long long)mn_arena_largest_free(&R.dev),
               (unsigned long long)R.dev.size);
      mn_error("the device arena is full", why);
    }
    mn_warn_once(&warned_full, "arena_full", NULL);
    return 0;
  }
  CUresult r = back(a, size);
  if (r != CUDA_SUCCESS) {
    /* out of device memory: the app gets the error; anything else: the runtime serves it (foreign) */
    mn_arena_free(&R.dev, a, NULL);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) *err = cudaErrorMemoryAllocation;
    return 0;
  }
  return a;
}

/* The arena serves the calling thread's current device only. */
static int on_arena_device(void) {
  int dev = -1;
  if (REAL(cudaGetDevice)(&dev) != cudaSuccess) {
    REAL(cudaGetLastError)();
    return 0;
  }
  return dev == R.device;
}

/* Serves `size` bytes: from the arena when it can, else through the runtime's allocator (remembered as
 * foreign memory). */
static cudaError_t serve(void **ptr, size_t size, cudaError_t (*fallback)(void **, size_t, void *), void *ctx) {
  if (!ptr) return cudaErrorInvalidValue;
  mn_init();
  if (!R.active || R.broken || size == 0) return fallback(ptr, size, ctx);
  pthread_mutex_lock(&R.mu);
  if (!mn_arena_ready() || !on_arena_device()) {
    int ready = R.arena_state > 0;
    pthread_mutex_unlock(&R.mu);
    cudaError_t r = fallback(ptr, size, ctx);
    if (r == cudaSuccess && ready) {
      pthread_mutex_lock(&R.mu);
      foreign_add((uint64_t)(uintptr_t)*ptr, size, MN_FOREIGN_OTHER_DEVICE);
      pthread_mutex_unlock(&R.mu);
    }
    return r;
  }
  cudaError_t err;
  uint64_t a = dev_alloc(size, &err);
  if (a) {
    *ptr = (void *)(uintptr_t)a;
    pthread_mutex_unlock(&R.mu);
    return cudaSuccess;
  }
  pthread_mutex_unlock(&R.mu);
  if (err != cudaSuccess) return err;
  cudaError_t r = fallback(ptr, size, ctx);
  if (r == cudaSuccess) {
    pthread_mutex_lock(&R.mu);
    foreign_add((uint64_t)(uintptr_t)*ptr, size, MN_FOREIGN_OTHER_DEVICE);
    pthread_mutex_unlock(&R.mu);
  }
  return r;
}

/* Frees an arena allocation; 1 when `ptr` was one, 0 when it is not arena memory. */
static int arena_release(void *ptr, cudaError_t *err) {
  uint64_t a = (uint64_t)(uintptr_t)ptr;
  *err = cudaSuccess;
  if (!ptr || R.arena_state <= 0 || !mn_arena_contains(&R.dev, a)) return 0;
  mn_alloc dead;
  mn_drain_deferred_frees();
  if (mn_arena_free(&R.dev, a, &dead) != 0) {
    *err = cudaErrorInvalidValue;
    return 1;
  }
  annots_drop(dead.addr, dead.size);
  return 1;
}

/* ---------------------------------------------------------------------------------------------- */
/* frees that wait for their stream (cudaFreeAsync): a host callback queues the address; the queue has
 * its own lock because the callback runs while another thread may hold R.mu in a device synchronize. */

static pthread_mutex_t freeq_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *freeq;
static size_t nfreeq, capfreeq;

static void CUDART_CB deferred_free(void *data) {
  pthread_mutex_lock(&freeq_mu);
  if (nfreeq == capfreeq) {
    size_t ncap = capfreeq ? capfreeq * 2 : 64;
    uint64_t *n = realloc(freeq, ncap * sizeof *n);
    if (n) {
      freeq = n;
      capfreeq = ncap;
    }
  }
  if (nfreeq < capfreeq) freeq[nfreeq++] = (uint64_t)(uintptr_t)data;
  pthread_mutex_unlock(&freeq_mu);
}

void mn_drain_deferred_frees(void) {
  pthread_mutex_lock(&freeq_mu);
  for (size_t i = 0; i < nfreeq; i++) {
    mn_alloc dead;
    if (mn_arena_free(&R.dev, freeq[i], &dead) == 0) annots_drop(dead.addr, dead.size);
  }
  nfreeq = 0;
  pthread_mutex_unlock(&freeq_mu);
}

/* ---------------------------------------------------------------------------------------------- */
/* device allocation entry points                                                                 */

static cudaError_t fb_malloc(void **p, size_t size, void *ctx) {
  (void)ctx;
  return REAL(cudaMalloc)(p, size);
}

MN_EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size) { return serve(devPtr, size, fb_malloc, NULL); }

MN_EXPORT cudaError_t cudaFree(void *devPtr) {
  mn_init();
  if (!R.active || R.broken || !devPtr) return REAL(cudaFree)(devPtr);
  if (R.arena_state <= 0 || !mn_arena_contains(&R.dev, (uint64_t)(uintptr_t)devPtr)) {
    cudaError_t r = REAL(cudaFree)(devPtr);
    if (r == cudaSuccess) {
      pthread_mutex_lock(&R.mu);
      foreign_del((uint64_t)(uintptr_t)devPtr);
      pthread_mutex_unlock(&R.mu);
    }
    return r;
  }
  /* cudaFree synchronizes the device; keep that, so memory is not reused under a running kernel. A
   * sync would break a stream capture in progress, and cudaFree is not allowed there anyway. */
  cudaError_t sync = cudaSuccess;
  if (__atomic_load_n(&R.captures, __ATOMIC_ACQUIRE) == 0) sync = REAL(cudaDeviceSynchronize)();
  cudaError_t err;
  pthread_mutex_lock(&R.mu);
  arena_release(devPtr, &err);
  pthread_mutex_unlock(&R.mu);
  return err != cudaSuccess ? err : sync;
}

struct async_ctx { cudaStream_t stream; int ptsz; cudaMemPool_t pool; };

extern cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
extern cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);
extern cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream);

static cudaError_t fb_malloc_async(void **p, size_t size, void *ctx) {
  struct async_ctx *c = ctx;
  if (c->pool) return c->ptsz ? REAL(cudaMallocFromPoolAsync_ptsz)(p, size, c->pool, c->stream)
                              : REAL(cudaMallocFromPoolAsync)(p, size, c->pool, c->stream);
  return c->ptsz ? REAL(cudaMallocAsync_ptsz)(p, size, c->stream) : REAL(cudaMallocAsync)(p, size, c->stream);
}

MN_EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) {
  struct async_ctx c = {hStream, 0, NULL};
  return serve(devPtr, size, fb_malloc_async, &c);
}

MN_EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream) {
  struct async_ctx c = {hStream, 1, NULL};
  return serve(devPtr, size, fb_malloc_async, &c);
}

/* Pool allocations are served from the arena too (the pool's own properties are not kept). */
MN_EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
  struct async_ctx c = {stream, 0, memPool};
  return serve(ptr, size, fb_malloc_async, &c);
}

MN_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
  struct async_ctx c = {stream, 1, memPool};
  return serve(ptr, size, fb_malloc_async, &c);
}

static int stream_capturing(cudaStream_t s) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (REAL(cudaStreamIsCapturing)(s, &st) != cudaSuccess) {
    REAL(cudaGetLastError)();
    return 1;
  }
  return st != cudaStreamCaptureStatusNone;
}

static cudaError_t free_async(void *devPtr, cudaStream_t stream, int ptsz) {
  mn_init();
  uint64_t a = (uint64_t)(uintptr_t)devPtr;
  if (!R.active || R.broken || !devPtr || R.arena_state <= 0 || !mn_arena_contains(&R.dev, a))
    return ptsz ? REAL(cudaFreeAsync_ptsz)(devPtr, stream) : REAL(cudaFreeAsync)(devPtr, stream);
  cudaStream_t s = ptsz && stream == 0 ? cudaStreamPerThread : stream;
  if (__atomic_load_n(&R.captures, __ATOMIC_ACQUIRE) > 0 || stream_capturing(s)) {
    /* A graph would free it on every replay: keep it allocated instead. */
    pthread_mutex_lock(&R.mu);
    mn_warn_once(&warned_capture_free, "cudaFreeAsync during stream capture: the arena keeps that memory", NULL);
    pthread_mutex_unlock(&R.mu);
    return cudaSuccess;
  }
  pthread_mutex_lock(&R.mu);
  const mn_alloc *al = mn_arena_find(&R.dev, a);
  int valid = al && al->addr == a;
  pthread_mutex_unlock(&R.mu);
  if (!valid) return cudaErrorInvalidValue;
  if (REAL(cudaLaunchHostFunc)(s, deferred_free, devPtr) == cudaSuccess) return cudaSuccess;
  REAL(cudaGetLastError)();
  cudaError_t r = REAL(cudaStreamSynchronize)(s);
  cudaError_t err;
  pthread_mutex_lock(&R.mu);
  arena_release(devPtr, &err);
  pthread_mutex_unlock(&R.mu);
  return err != cudaSuccess ? err : r;
}

MN_EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) { return free_async(devPtr, hStream, 0); }
MN_EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream) { return free_async(devPtr, hStream, 1); }

/* Row pitch the runtime would choose: probed once from the real cudaMallocPitch. */
static uint64_t pitch_align(void) {
  if (R.pitch_align) return R.pitch_align;
  void *p = NULL;
  size_t pitch = 0;
  R.pitch_align = 512;
  if (REAL(cudaMallocPitch)(&p, &pitch, 1, 1) == cudaSuccess) {
    if (pitch && (pitch & (pitch - 1)) == 0) R.pitch_align = pitch;
    REAL(cudaFree)(p);
  } else {
    REAL(cudaGetLastError)();
  }
  return R.pitch_align;
}

struct pitch_ctx { size_t *pitch; size_t width, height; };

static cudaError_t fb_pitch(void **p, size_t size, void *ctx) {
  (void)size;
  struct pitch_ctx *c = ctx;
  return REAL(cudaMallocPitch)(p, c->pitch, c->width, c->height);
}

MN_EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
  mn_init();
  if (!R.active || R.broken || !devPtr || !pitch || width == 0 || height == 0)
    return REAL(cudaMallocPitch)(devPtr, pitch, width, height);
  pthread_mutex_lock(&R.mu);
  int ready = mn_arena_ready();
  uint64_t p = ready ? mn_pitch(width, pitch_align()) : 0;
  pthread_mutex_unlock(&R.mu);
  if (!ready || p == 0 || height > UINT64_MAX / p) return REAL(cudaMallocPitch)(devPtr, pitch, width, height);
  struct pitch_ctx c = {pitch, width, height};
  size_t keep = *pitch;
  *pitch = (size_t)p;
  cudaError_t r = serve(devPtr, (size_t)(p * height), fb_pitch, &c);
  if (r != cudaSuccess) *pitch = keep;
  return r;
}

struct m3d_ctx { struct cudaPitchedPtr *pp; struct cudaExtent ext; };

static cudaError_t fb_3d(void **p, size_t size, void *ctx) {
  (void)size;
  struct m3d_ctx *c = ctx;
  cudaError_t r = REAL(cudaMalloc3D)(c->pp, c->ext);
  if (r == cudaSuccess) *p = c->pp->ptr;
  return r;
}

MN_EXPORT cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent) {
  mn_init();
  if (!R.active || R.broken || !pitchedDevPtr || extent.width == 0 || extent.height == 0 || extent.depth == 0)
    return REAL(cudaMalloc3D)(pitchedDevPtr, extent);
  pthread_mutex_lock(&R.mu);
  int ready = mn_arena_ready();
  uint64_t p = ready ? mn_pitch(extent.width, pitch_align()) : 0;
  pthread_mutex_unlock(&R.mu);
  if (!ready || p == 0 || extent.height > UINT64_MAX / p || extent.depth > UINT64_MAX / (p * extent.height))
    return REAL(cudaMalloc3D)(pitchedDevPtr, extent);
  struct m3d_ctx c = {pitchedDevPtr, extent};
  void *ptr = NULL;
  cudaError_t r = serve(&ptr, (size_t)(p * extent.height * extent.depth), fb_3d, &c);
  if (r == cudaSuccess && mn_arena_contains(&R.dev, (uint64_t)(uintptr_t)ptr)) {
    pitchedDevPtr->ptr = ptr;
    pitchedDevPtr->pitch = (size_t)p;
    pitchedDevPtr->xsize = extent.width;
    pitchedDevPtr->ysize = extent.height;
  }
  return r;
}

MN_EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
  mn_init();
  cudaError_t r = REAL(cudaMallocManaged)(devPtr, size, flags);
  if (r == cudaSuccess && R.active && devPtr) {
    pthread_mutex_lock(&R.mu);
    foreign_add((uint64_t)(uintptr_t)*devPtr, size, MN_FOREIGN_MANAGED);
    pthread_mutex_unlock(&R.mu);
  }
  return r;
}

/* ---------------------------------------------------------------------------------------------- */
/* pinned host memory                                                                             */

static int host_ready(void) {
  if (R.host_state) return R.host_state > 0;
  R.host_state = -1;
  uint64_t bytes = mn_round_up(R.cfg.host_bytes, MN_HOST_ALIGN);
  void *want = (void *)(uintptr_t)R.cfg.host_base;
  void *p = mmap(want, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (p == MAP_FAILED || p != want) {
    char why[256];
    snprintf(why, sizeof why, "mmap at 0x%llx: %s; pinned allocations are served by the runtime and kernels using them cannot be replayed",
             (unsigned long long)R.cfg.host_base, p == MAP_FAILED ? strerror(errno) : "placed elsewhere");
    if (p != MAP_FAILED) munmap(p, bytes);
    mn_error("the fixed pinned host region was not granted", why);
    return 0;
  }
  if (mn_arena_init(&R.host, R.cfg.host_base, bytes, MN_HOST_ALIGN)) {
    munmap(p, bytes);
    return 0;
  }
  R.host_state = 1;
  mn_line l;
  static char buf[512];
  mn_line_begin(&l, buf, sizeof buf, "pinned_region");
  mn_line_hexaddr(&l, "base", R.host.base);
  mn_line_u64(&l, "bytes", R.host.size);
  mn_log_event(&l);
  return 1;
}

static cudaError_t host_alloc(void **ptr, size_t size, unsigned int flags, int via_malloc_host) {
  mn_init();
  if (!R.active || R.broken || !ptr || size == 0)
    return via_malloc_host ? REAL(cudaMallocHost)(ptr, size) : REAL(cudaHostAlloc)(ptr, size, flags);
  pthread_mutex_lock(&R.mu);
  uint64_t a = host_ready() ? mn_arena_alloc(&R.host, size) : 0;
  if (!a && R.host_state > 0 && !warned_pinned) {
    char why[256];
    snprintf(why, sizeof why, "%llu bytes do not fit in the %llu-byte pinned region (MNEME_HOST_BYTES)",
             (unsigned long long)size, (unsigned long long)R.host.size);
    mn_error("the pinned host region is full", why);
    warned_pinned = 1;
  }
  pthread_mutex_unlock(&R.mu);
  if (a) {
    size_t bytes = (size_t)mn_round_up(size, MN_HOST_ALIGN);
    cudaError_t r = REAL(cudaHostRegister)((void *)(uintptr_t)a, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (r == cudaSuccess) {
      *ptr = (void *)(uintptr_t)a;
      return cudaSuccess;
    }
    REAL(cudaGetLastError)();
    pthread_mutex_lock(&R.mu);
    mn_arena_free(&R.host, a, NULL);
    pthread_mutex_unlock(&R.mu);
  }
  cudaError_t r = via_malloc_host ? REAL(cudaMallocHost)(ptr, size) : REAL(cudaHostAlloc)(ptr, size, flags);
  if (r == cudaSuccess) {
    pthread_mutex_lock(&R.mu);
    foreign_add((uint64_t)(uintptr_t)*ptr, size, MN_FOREIGN_PINNED_OUTSIDE);
    pthread_mutex_unlock(&R.mu);
  }
  return r;
}

MN_EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size) { return host_alloc(ptr, size, 0, 1); }
MN_EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) { return host_alloc(pHost, size, flags, 0); }

MN_EXPORT cudaError_t cudaFreeHost(void *ptr) {
  mn_init();
  uint64_t a = (uint64_t)(uintptr_t)ptr;
  if (!R.active || !ptr || R.host_state <= 0 || !mn_arena_contains(&R.host, a)) {
    cudaError_t r = REAL(cudaFreeHost)(ptr);
    if (r == cudaSuccess && R.active && ptr) {
      pthread_mutex_lock(&R.mu);
      foreign_del(a);
      pthread_mutex_unlock(&R.mu);
    }
    return r;
  }
  pthread_mutex_lock(&R.mu);
  const mn_alloc *al = mn_arena_find(&R.host, a);
  uint64_t reserved = al && al->addr == a ? al->reserved : 0;
  pthread_mutex_unlock(&R.mu);
  if (!reserved) return cudaErrorInvalidValue;
  cudaError_t r = REAL(cudaHostUnregister)(ptr);
  if (r != cudaSuccess) REAL(cudaGetLastError)();
  madvise(ptr, reserved, MADV_DONTNEED);
  pthread_mutex_lock(&R.mu);
  mn_alloc dead;
  if (mn_arena_free(&R.host, a, &dead) == 0) annots_drop(dead.addr, dead.size);
  pthread_mutex_unlock(&R.mu);
  return cudaSuccess;
}

MN_EXPORT cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
  mn_init();
  cudaError_t r = REAL(cudaHostRegister)(ptr, size, flags);
  if (r == cudaSuccess && R.active) {
    pthread_mutex_lock(&R.mu);
    foreign_add((uint64_t)(uintptr_t)ptr, size, MN_FOREIGN_HOST_REGISTERED);
    pthread_mutex_unlock(&R.mu);
  }
  return r;
}

MN_EXPORT cudaError_t cudaHostUnregister(void *ptr) {
  mn_init();
  cudaError_t r = REAL(cudaHostUnregister)(ptr);
  if (r == cudaSuccess && R.active) {
    pthread_mutex_lock(&R.mu);
    foreign_del((uint64_t)(uintptr_t)ptr);
    pthread_mutex_unlock(&R.mu);
  }
  return r;
}

/* ---------------------------------------------------------------------------------------------- */
/* tolerance annotations (mneme/tolerance.h finds this with dlsym)                                */

MN_EXPORT int mneme_recorder_annotate(const void *dev_ptr, size_t bytes, int elem, int mode, int norm, double tol,
                                      const char *tag) {
  mn_init();
  if (!R.active) return 0;
  uint64_t a = (uint64_t)(uintptr_t)dev_ptr;
  if (!dev_ptr || bytes == 0 || elem < MN_ELEM_BYTES || elem > MN_ELEM_U64 || mode < MN_TOL_ABS || mode > MN_TOL_REL ||
      norm < MN_NORM_ELEMENT || norm > MN_NORM_LINF)
    return -1;
  pthread_mutex_lock(&R.mu);
  mn_drain_deferred_frees();
  const mn_alloc *al = R.arena_state > 0 ? mn_arena_find(&R.dev, a) : NULL;
  if (!al && R.host_state > 0) al = mn_arena_find(&R.host, a);
  if (!al || bytes > al->addr + al->size - a) {
    pthread_mutex_unlock(&R.mu);
    return -1;
  }
  size_t i;
  for (i = 0; i < R.nannots && R.annots[i].addr != a; i++) {}
  if (i == R.nannots) {
    if (R.nannots == R.capannots) {
      size_t ncap = R.capannots ? R.capannots * 2 : 16;
      mn_annot *n = realloc(R.annots, ncap * sizeof *n);
      if (!n) {
        pthread_mutex_unlock(&R.mu);
        return -1;
      }
      R.annots = n;
      R.capannots = ncap;
    }
    R.nannots++;
  }
  mn_annot *an = &R.annots[i];
  memset(an, 0, sizeof *an);
  an->addr = a;
  an->size = bytes;
  an->elem = (uint32_t)elem;
  an->mode = (uint32_t)mode;
  an->norm = (uint32_t)norm;
  an->tol = tol;
  if (tag) snprintf(an->tag, sizeof an->tag, "%s", tag);
  mn_line l;
  static char buf[512];
  mn_line_begin(&l, buf, sizeof buf, "annotation");
  mn_line_hexaddr(&l, "addr", a);
  mn_line_u64(&l, "bytes", bytes);
  mn_line_u64(&l, "elem", (uint64_t)elem);
  mn_line_u64(&l, "mode", (uint64_t)mode);
  mn_line_u64(&l, "norm", (uint64_t)norm);
  mn_line_str(&l, "tag", an->tag);
  mn_log_event(&l);
  pthread_mutex_unlock(&R.mu);
  return 0;
}

void mn_memory_at_exit(void) {
  mn_line l;
  static char buf[512];
  mn_line_begin(&l, buf, sizeof buf, "memory");
  mn_line_u64(&l, "arena_top", R.arena_state > 0 ? R.dev.top - R.dev.base : 0);
  mn_line_u64(&l, "arena_live", R.arena_state > 0 ? R.dev.nlive : 0);
  mn_line_u64(&l, "pinned_top", R.host_state > 0 ? R.host.top - R.host.base : 0);
  mn_line_u64(&l, "foreign", R.nforeign);
  mn_log_event(&l);
}
