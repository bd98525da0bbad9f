/* Snapshot copies from the device. The snapshot buffers themselves come from a pool of pinned host
 * blocks that outlives an instance (mn_snap_alloc): the device copies into them at pinned bandwidth,
 * and the next instance reuses them instead of faulting in fresh pages (freshly malloc'd buffers held
 * the H200's snapshot copies to 1.0-2.2 GB/s: issue #16). What does not fit the pool (MNEME_SNAP_POOL
 * bytes, default 2 GiB) is malloc'd and copied through two pinned staging buffers on a stream of
 * librecord's own, the DMA of one chunk overlapping the host copy-out of the previous one; plain
 * cuMemcpyDtoH when the staging cannot be set up. Called with R.mu held, after the device was synchronized. */
#include "state.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MN_STAGE_BYTES (32ull << 20)
#define MN_POOL_BLOCKS 64
#define MN_POOL_ALIGN (2ull << 20)

typedef struct pool_block { uint8_t *p; uint64_t cap; int used; } pool_block;
static pool_block pool[MN_POOL_BLOCKS];
static uint64_t pool_bytes; /* pinned bytes the pool holds, at most R.cfg.snap_pool_bytes */

static int pool_find(const void *p) {
  for (int i = 0; i < MN_POOL_BLOCKS; i++)
    if (pool[i].p && pool[i].p == p) return i;
  return -1;
}

void *mn_snap_alloc(uint64_t size) {
  int best = -1, empty = -1;
  for (int i = 0; i < MN_POOL_BLOCKS; i++) {
    if (!pool[i].p) { if (empty < 0) empty = i; continue; }
    if (!pool[i].used && pool[i].cap >= size && (best < 0 || pool[i].cap < pool[best].cap)) best = i;
  }
  if (best < 0 && size && empty >= 0) {
    uint64_t cap = (size + MN_POOL_ALIGN - 1) / MN_POOL_ALIGN * MN_POOL_ALIGN;
    void *p = NULL;
    if (pool_bytes + cap <= R.cfg.snap_pool_bytes && D.hostAlloc(&p, cap, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS && p) {
      pool[empty].p = p;
      pool[empty].cap = cap;
      pool_bytes += cap;
      best = empty;
    }
  }
  if (best >= 0) {
    pool[best].used = 1;
    return pool[best].p;
  }
  return malloc(size ? size : 1);
}

void mn_snap_free(void *p) {
  if (!p) return;
  int i = pool_find(p);
  if (i >= 0) pool[i].used = 0; /* kept for the next instance */
  else free(p);
}

static int stage_state; /* 0 not tried, 1 ready, -1 unavailable */
static uint8_t *stage[2];
static CUstream stream;
static CUevent done[2];
static PFN_cuMemcpyDtoHAsync_v3020 dtoh_async;
static PFN_cuStreamCreate_v2000 stream_create;

uint64_t mn_precise_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int stage_ready(void) {
  if (stage_state) return stage_state > 0;
  stage_state = -1;
  dtoh_async = (PFN_cuMemcpyDtoHAsync_v3020)mn_ip_real("cuMemcpyDtoHAsync", 3020);
  stream_create = (PFN_cuStreamCreate_v2000)mn_ip_real("cuStreamCreate", 2000);
  if (!dtoh_async || !stream_create || stream_create(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return 0;
  for (int i = 0; i < 2; i++) {
    void *p = NULL;
    if (D.hostAlloc(&p, MN_STAGE_BYTES, CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS) return 0;
    stage[i] = p;
    if (D.eventCreate(&done[i], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return 0;
  }
  stage_state = 1;
  return 1;
}

int mn_copy_dtoh(void *dst, uint64_t src, uint64_t size) {
  /* small copies, or into pinned pool memory: one call is as fast */
  if (size < (1u << 20) || pool_find(dst) >= 0 || !stage_ready())
    return D.memcpyDtoH(dst, (CUdeviceptr)src, size) == CUDA_SUCCESS ? 0 : -1;
  uint8_t *out = dst;
  uint64_t prev_off = 0, prev_len = 0;
  int j = 0, rc = 0;
  for (uint64_t off = 0; off < size || prev_len; j ^= 1) {
    uint64_t len = size - off < MN_STAGE_BYTES ? size - off : MN_STAGE_BYTES;
    if (len) {
      if (dtoh_async(stage[j], (CUdeviceptr)(src + off), len, stream) != CUDA_SUCCESS ||
          D.eventRecord(done[j], stream) != CUDA_SUCCESS)
        rc = -1;
    }
    if (prev_len) { /* the previous chunk, in the other buffer, while this one is in flight */
      if (D.eventSynchronize(done[j ^ 1]) != CUDA_SUCCESS) rc = -1;
      else memcpy(out + prev_off, stage[j ^ 1], prev_len);
    }
    if (rc) {
      D.streamSynchronize(stream);
      return -1;
    }
    prev_off = off;
    prev_len = len;
    off += len;
  }
  return 0;
}

int mn_copy_htod(uint64_t dst, const void *src, uint64_t size) {
  static PFN_cuMemcpyHtoDAsync_v3020 htod_async;
  if (size < (1u << 20) || pool_find(src) >= 0 || !stage_ready() ||
      (!htod_async && !(htod_async = (PFN_cuMemcpyHtoDAsync_v3020)mn_ip_real("cuMemcpyHtoDAsync", 3020))))
    return D.memcpyHtoD((CUdeviceptr)dst, src, size) == CUDA_SUCCESS ? 0 : -1;
  const uint8_t *in = src;
  int used[2] = {0, 0};
  for (uint64_t off = 0; off < size;) {
    for (int j = 0; j < 2 && off < size; j++) {
      uint64_t len = size - off < MN_STAGE_BYTES ? size - off : MN_STAGE_BYTES;
      /* the buffer's previous DMA must be done before it is refilled */
      if (used[j] && D.eventSynchronize(done[j]) != CUDA_SUCCESS) return -1;
      memcpy(stage[j], in + off, len);
      if (htod_async((CUdeviceptr)(dst + off), stage[j], len, stream) != CUDA_SUCCESS ||
          D.eventRecord(done[j], stream) != CUDA_SUCCESS) {
        D.streamSynchronize(stream);
        return -1;
      }
      used[j] = 1;
      off += len;
    }
  }
  return D.streamSynchronize(stream) == CUDA_SUCCESS ? 0 : -1;
}
