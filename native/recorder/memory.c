/* librecord's memory: every device allocation of the recorded device comes from one virtual address
 * range reserved at a fixed address with the CUDA VMM driver API and backed chunk by chunk as it fills;
 * pinned host allocations come from a fixed-address host region registered with CUDA. Replay places
 * both at the same addresses, so pointers inside the recorded data stay valid.
 *
 * Managed memory and host memory the app registers itself are snapshotted by contents instead
 * (managed.c). Memory the recorder cannot place at all (allocations on another device or after the
 * arena filled up, pinned memory outside the region) is remembered, so launches that receive pointers
 * into it are marked not replayable.
 *
 * All of it at the driver API (cuMemAlloc_v2 & co., wrapped through native/interpose): the runtime's
 * cudaMalloc, cudaMallocPitch, cudaMalloc3D, cudaMallocAsync, cudaMallocHost... arrive here whether it
 * is linked statically or shared, and so do the runtime's own allocations. */
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

static CUmemAllocationProp prop;

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

/* Called at the first allocation, with the allocating thread's context current (the driver refuses
 * allocations without one). */
static int setup_arena(void) {
  char why[512];
  if (mn_drv_load(why, sizeof why)) {
    mn_error("cannot set up the device arena", why);
    return -1;
  }
  CUresult r = D.ctxGetDevice(&R.cudev);
  if (r != CUDA_SUCCESS) {
    mn_error("no current CUDA context", mn_cu_err(r));
    return -1;
  }
  R.device = (int)R.cudev;
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
    mn_error("cuMemGetAllocationGranularity failed", mn_cu_err(r));
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
  if (!R.backed || !R.handles || mn_arena_init(&R.dev, base, bytes, MN_DEVICE_ALIGN) ||
      (bytes > 2 * MN_ARENA_GUARD && mn_arena_keep_front(&R.dev, MN_ARENA_GUARD))) {
    D.addressFree((CUdeviceptr)base, bytes);
    mn_error("out of host memory setting up the arena", NULL);
    return -1;
  }
  arena_event(got);
  return 0;
}

int mn_arena_ready(void) {
  if (R.arena_state) return R.arena_state > 0;
  char why[256];
  CUdevice d;
  if (mn_drv_load(why, sizeof why) == 0 && D.ctxGetDevice(&d) != CUDA_SUCCESS) return 0; /* no context yet */
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
  snprintf(why, sizeof why, "%s failed: %s (%d)", call, mn_cu_err(r), (int)r);
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
         (R.host_state > 0 && mn_arena_contains(&R.host, addr)) || mn_placed_find(addr);
}

void mn_foreign_note(uint64_t addr, uint64_t size, int kind) { foreign_add(addr, size, kind); }
void mn_foreign_forget(uint64_t addr) { foreign_del(addr); }

static void annots_drop(uint64_t addr, uint64_t size) {
  for (size_t i = 0; i < R.nannots;) {
    if (R.annots[i].addr >= addr && R.annots[i].addr - addr < size)
      R.annots[i] = R.annots[--R.nannots];
    else
      i++;
  }
}

/* Device allocation from the arena; 0 when the arena cannot serve it (the caller falls back). */
static uint64_t dev_alloc(uint64_t size, CUresult *err) {
  *err = CUDA_SUCCESS;
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
    /* out of device memory: the app gets the error; anything else: the driver serves it (foreign) */
    mn_arena_free(&R.dev, a, NULL);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) *err = r;
    return 0;
  }
  /* the guard behind it mapped too, where the arena has room (best effort: the allocation stands) */
  uint64_t end = a + size, room = R.dev.base + R.dev.size - end;
  if (room) (void)back(end, room < MN_ARENA_GUARD ? room : MN_ARENA_GUARD);
  return a;
}

/* The arena serves the calling thread's current device only. */
static int on_arena_device(void) {
  CUdevice d = -1;
  return D.ctxGetDevice(&d) == CUDA_SUCCESS && d == R.cudev;
}

typedef CUresult (*fallback_fn)(const mn_ip_slot *s, CUdeviceptr *p, size_t size, void *ctx);

/* Serves `size` bytes: from the arena when it can, else through the driver's allocator (remembered as
 * foreign memory). */
static CUresult serve(const mn_ip_slot *s, CUdeviceptr *ptr, size_t size, fallback_fn fallback, void *ctx) {
  if (!ptr) return CUDA_ERROR_INVALID_VALUE;
  if (!R.active || R.broken || size == 0) return fallback(s, ptr, size, ctx);
  pthread_mutex_lock(&R.mu);
  if (!mn_arena_ready() || !on_arena_device()) {
    int ready = R.arena_state > 0;
    pthread_mutex_unlock(&R.mu);
    CUresult r = fallback(s, ptr, size, ctx);
    if (r == CUDA_SUCCESS && ready) {
      pthread_mutex_lock(&R.mu);
      foreign_add((uint64_t)*ptr, size, MN_FOREIGN_OTHER_DEVICE);
      pthread_mutex_unlock(&R.mu);
    }
    return r;
  }
  CUresult err;
  uint64_t a = dev_alloc(size, &err);
  if (a) {
    *ptr = (CUdeviceptr)a;
    pthread_mutex_unlock(&R.mu);
    return CUDA_SUCCESS;
  }
  pthread_mutex_unlock(&R.mu);
  if (err != CUDA_SUCCESS) return err;
  CUresult r = fallback(s, ptr, size, ctx);
  if (r == CUDA_SUCCESS) {
    pthread_mutex_lock(&R.mu);
    foreign_add((uint64_t)*ptr, size, MN_FOREIGN_OTHER_DEVICE);
    pthread_mutex_unlock(&R.mu);
  }
  return r;
}

/* Frees an arena allocation; 1 when `ptr` was one, 0 when it is not arena memory. */
static int arena_release(uint64_t a, CUresult *err) {
  *err = CUDA_SUCCESS;
  if (!a || R.arena_state <= 0 || !mn_arena_contains(&R.dev, a)) return 0;
  mn_alloc dead;
  mn_drain_deferred_frees();
  if (mn_arena_free(&R.dev, a, &dead) != 0) {
    *err = CUDA_ERROR_INVALID_VALUE;
    return 1;
  }
  annots_drop(dead.addr, dead.size);
  return 1;
}

/* ---------------------------------------------------------------------------------------------- */
/* frees that wait for their stream (cuMemFreeAsync): a host callback queues the address; the queue has
 * its own lock because the callback runs while another thread may hold R.mu in a device synchronize. */

static pthread_mutex_t freeq_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *freeq;
static size_t nfreeq, capfreeq;

static void CUDA_CB deferred_free(void *data) {
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

static CUresult fb_alloc(const mn_ip_slot *s, CUdeviceptr *p, size_t size, void *ctx) {
  (void)ctx;
  return ((PFN_cuMemAlloc_v3020)s->real)(p, size);
}

CUresult mn_cu_mem_alloc(const mn_ip_slot *s, CUdeviceptr *dptr, size_t bytesize) {
  return serve(s, dptr, bytesize, fb_alloc, NULL);
}

CUresult mn_cu_mem_free(const mn_ip_slot *s, CUdeviceptr dptr) {
  uint64_t a = (uint64_t)dptr;
  if (!R.active || R.broken || !a || R.arena_state <= 0 || !mn_arena_contains(&R.dev, a)) {
    CUresult r = ((PFN_cuMemFree_v3020)s->real)(dptr);
    if (r == CUDA_SUCCESS && R.active && a) {
      pthread_mutex_lock(&R.mu);
      if (!mn_placed_del(a)) foreign_del(a); /* managed memory is freed with cuMemFree too */
      pthread_mutex_unlock(&R.mu);
    }
    return r;
  }
  /* cuMemFree waits for the device; keep that, so memory is not reused under a running kernel. A
   * sync would break a stream capture in progress, and freeing is not allowed there anyway. */
  CUresult sync = CUDA_SUCCESS;
  if (__atomic_load_n(&R.captures, __ATOMIC_ACQUIRE) == 0) sync = D.ctxSynchronize();
  CUresult err;
  pthread_mutex_lock(&R.mu);
  arena_release(a, &err);
  pthread_mutex_unlock(&R.mu);
  return err != CUDA_SUCCESS ? err : sync;
}

struct async_ctx { CUstream stream; CUmemoryPool pool; };

static CUresult fb_alloc_async(const mn_ip_slot *s, CUdeviceptr *p, size_t size, void *ctx) {
  struct async_ctx *c = ctx;
  if (c->pool) return ((PFN_cuMemAllocFromPoolAsync_v11020)s->real)(p, size, c->pool, c->stream);
  return ((PFN_cuMemAllocAsync_v11020)s->real)(p, size, c->stream);
}

CUresult mn_cu_mem_alloc_async(const mn_ip_slot *s, CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
  struct async_ctx c = {hStream, NULL};
  return serve(s, dptr, bytesize, fb_alloc_async, &c);
}

/* 1 when the host can access the pool's memory (a host-located pool, CUDA 12.2+): the arena's device
 * memory would not do. Drivers that cannot answer have device pools only. */
static PFN_cuMemPoolGetAccess_v11020 pool_get_access;
static void find_pool_get_access(void) {
  pool_get_access = (PFN_cuMemPoolGetAccess_v11020)mn_ip_real("cuMemPoolGetAccess", 11020);
}

static int pool_host_accessible(CUmemoryPool pool) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, find_pool_get_access);
  PFN_cuMemPoolGetAccess_v11020 get = pool_get_access;
  CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  CUmemLocation host;
  memset(&host, 0, sizeof host);
  host.type = CU_MEM_LOCATION_TYPE_HOST;
  return get && get(&flags, pool, &host) == CUDA_SUCCESS && flags != CU_MEM_ACCESS_FLAGS_PROT_NONE;
}

/* Pool allocations are served from the arena too (the pool's own properties are not kept), except from
 * pools of host memory, which stay the driver's (foreign: pinned memory outside the region). */
CUresult mn_cu_mem_alloc_from_pool_async(const mn_ip_slot *s, CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                         CUstream hStream) {
  struct async_ctx c = {hStream, pool};
  if (R.active && !R.broken && dptr && bytesize && pool_host_accessible(pool)) {
    CUresult r = fb_alloc_async(s, dptr, bytesize, &c);
    if (r == CUDA_SUCCESS) {
      pthread_mutex_lock(&R.mu);
      foreign_add((uint64_t)*dptr, bytesize, MN_FOREIGN_PINNED_OUTSIDE);
      pthread_mutex_unlock(&R.mu);
    }
    return r;
  }
  return serve(s, dptr, bytesize, fb_alloc_async, &c);
}

static int stream_capturing(CUstream s) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (D.streamIsCapturing(s, &st) != CUDA_SUCCESS) return 1;
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

CUresult mn_cu_mem_free_async(const mn_ip_slot *slot, CUdeviceptr dptr, CUstream hStream) {
  uint64_t a = (uint64_t)dptr;
  if (!R.active || R.broken || !a || R.arena_state <= 0 || !mn_arena_contains(&R.dev, a)) {
    CUresult r = ((PFN_cuMemFreeAsync_v11020)slot->real)(dptr, hStream);
    if (r == CUDA_SUCCESS && R.active && a) { /* e.g. from a pool of host memory */
      pthread_mutex_lock(&R.mu);
      foreign_del(a);
      pthread_mutex_unlock(&R.mu);
    }
    return r;
  }
  CUstream s = mn_ip_stream(slot, hStream);
  if (__atomic_load_n(&R.captures, __ATOMIC_ACQUIRE) > 0 || stream_capturing(s)) {
    /* A graph would free it on every replay: keep it allocated instead. */
    pthread_mutex_lock(&R.mu);
    mn_warn_once(&warned_capture_free, "cudaFreeAsync during stream capture: the arena keeps that memory", NULL);
    pthread_mutex_unlock(&R.mu);
    return CUDA_SUCCESS;
  }
  pthread_mutex_lock(&R.mu);
  const mn_alloc *al = mn_arena_find(&R.dev, a);
  int valid = al && al->addr == a;
  pthread_mutex_unlock(&R.mu);
  if (!valid) return CUDA_ERROR_INVALID_VALUE;
  if (D.launchHostFunc(s, deferred_free, (void *)(uintptr_t)a) == CUDA_SUCCESS) return CUDA_SUCCESS;
  CUresult r = D.streamSynchronize(s);
  CUresult err;
  pthread_mutex_lock(&R.mu);
  arena_release(a, &err);
  pthread_mutex_unlock(&R.mu);
  return err != CUDA_SUCCESS ? err : r;
}

/* Row pitch the driver would choose: probed once from the real cuMemAllocPitch. */
static uint64_t pitch_align(unsigned int elem) {
  if (R.pitch_align) return R.pitch_align;
  CUdeviceptr p = 0;
  size_t pitch = 0;
  R.pitch_align = 512;
  if (D.allocPitch(&p, &pitch, 1, 1, elem) == CUDA_SUCCESS) {
    if (pitch && (pitch & (pitch - 1)) == 0) R.pitch_align = pitch;
    D.memFree(p);
  }
  return R.pitch_align;
}

struct pitch_ctx { size_t *pitch; size_t width, height; unsigned int elem; };

static CUresult fb_pitch(const mn_ip_slot *s, CUdeviceptr *p, size_t size, void *ctx) {
  (void)size;
  struct pitch_ctx *c = ctx;
  return ((PFN_cuMemAllocPitch_v3020)s->real)(p, c->pitch, c->width, c->height, c->elem);
}

CUresult mn_cu_mem_alloc_pitch(const mn_ip_slot *s, CUdeviceptr *dptr, size_t *pPitch, size_t width, size_t height,
                               unsigned int elem) {
  struct pitch_ctx c = {pPitch, width, height, elem};
  if (!R.active || R.broken || !dptr || !pPitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
    return fb_pitch(s, dptr, 0, &c);
  pthread_mutex_lock(&R.mu);
  int ready = mn_arena_ready();
  uint64_t p = ready ? mn_pitch(width, pitch_align(elem)) : 0;
  pthread_mutex_unlock(&R.mu);
  if (!ready || p == 0 || height > UINT64_MAX / p) return fb_pitch(s, dptr, 0, &c);
  size_t keep = *pPitch;
  *pPitch = (size_t)p;
  CUresult r = serve(s, dptr, (size_t)(p * height), fb_pitch, &c);
  if (r != CUDA_SUCCESS) *pPitch = keep;
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
    snprintf(why, sizeof why, "mmap at 0x%llx: %s; pinned allocations are served by the driver and kernels using them cannot be replayed",
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

/* `alloc_host`: cuMemAllocHost_v2 (no flags) when set, else cuMemHostAlloc. */
static CUresult host_alloc(const mn_ip_slot *s, void **pp, size_t size, unsigned int flags, int alloc_host) {
#define FALLBACK() (alloc_host ? ((PFN_cuMemAllocHost_v3020)s->real)(pp, size) : ((PFN_cuMemHostAlloc_v2020)s->real)(pp, size, flags))
  char why[256];
  if (!R.active || R.broken || !pp || size == 0 || mn_drv_load(why, sizeof why)) return FALLBACK();
  pthread_mutex_lock(&R.mu);
  uint64_t a = host_ready() ? mn_arena_alloc(&R.host, size) : 0;
  if (!a && R.host_state > 0 && !warned_pinned) {
    snprintf(why, sizeof why, "%llu bytes do not fit in the %llu-byte pinned region (MNEME_HOST_BYTES)",
             (unsigned long long)size, (unsigned long long)R.host.size);
    mn_error("the pinned host region is full", why);
    warned_pinned = 1;
  }
  pthread_mutex_unlock(&R.mu);
  if (a) {
    size_t bytes = (size_t)mn_round_up(size, MN_HOST_ALIGN);
    /* portable and mapped whatever was asked: a superset of every flag combination's guarantees */
    if (D.hostRegister((void *)(uintptr_t)a, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP) == CUDA_SUCCESS) {
      *pp = (void *)(uintptr_t)a;
      return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&R.mu);
    mn_arena_free(&R.host, a, NULL);
    pthread_mutex_unlock(&R.mu);
  }
  CUresult r = FALLBACK();
  if (r == CUDA_SUCCESS) {
    pthread_mutex_lock(&R.mu);
    foreign_add((uint64_t)(uintptr_t)*pp, size, MN_FOREIGN_PINNED_OUTSIDE);
    pthread_mutex_unlock(&R.mu);
  }
  return r;
#undef FALLBACK
}

CUresult mn_cu_mem_alloc_host(const mn_ip_slot *s, void **pp, size_t bytesize) { return host_alloc(s, pp, bytesize, 0, 1); }
CUresult mn_cu_mem_host_alloc(const mn_ip_slot *s, void **pp, size_t bytesize, unsigned int flags) {
  return host_alloc(s, pp, bytesize, flags, 0);
}

CUresult mn_cu_mem_free_host(const mn_ip_slot *s, void *p) {
  uint64_t a = (uint64_t)(uintptr_t)p;
  if (!R.active || !p || R.host_state <= 0 || !mn_arena_contains(&R.host, a)) {
    CUresult r = ((PFN_cuMemFreeHost_v2000)s->real)(p);
    if (r == CUDA_SUCCESS && R.active && p) {
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
  if (!reserved) return CUDA_ERROR_INVALID_VALUE;
  D.hostUnregister(p);
  madvise(p, reserved, MADV_DONTNEED);
  pthread_mutex_lock(&R.mu);
  mn_alloc dead;
  if (mn_arena_free(&R.host, a, &dead) == 0) annots_drop(dead.addr, dead.size);
  pthread_mutex_unlock(&R.mu);
  return CUDA_SUCCESS;
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
  const mn_placed *pl = al ? NULL : mn_placed_find(a); /* managed or app-registered host memory */
  uint64_t end = al ? al->addr + al->size : pl ? pl->addr + pl->size : 0;
  if ((!al && !pl) || bytes > end - a) {
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
  mn_placed_log(&l); /* managed and registered host memory still live */
  mn_log_event(&l);
}
