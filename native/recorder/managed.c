/* Memory the app gets outside librecord's arena and pinned region that replay can still place, because
 * its contents are snapshotted with every recorded launch like the arena's allocations:
 *   - managed memory (cuMemAllocManaged: cudaMallocManaged), blob space MN_SPACE_MANAGED. It stays the
 *     driver's managed memory in the app (host access, cudaMemAdvise, cudaMemPrefetchAsync all work as
 *     before); the snapshot copies go through cuMemcpy, which reads managed pointers wherever the pages
 *     are. Replay backs each range with device memory reserved at the recorded address;
 *   - host memory the app registers itself (cuMemHostRegister: cudaHostRegister), blob space
 *     MN_SPACE_HOST_PINNED, when the device sees it at its host address (unified addressing). Replay
 *     maps and registers host memory at the recorded address, so the kernel reads it over the bus as
 *     in the app (zero-copy stays zero-copy).
 * Registered ranges the device sees elsewhere, and I/O memory, stay foreign (memory.c): kernels reading
 * them are reported as not replayable.
 *
 * Guarded by R.mu like the rest of the memory bookkeeping. */
#include "state.h"

#include <stdlib.h>
#include <string.h>

/* Most ranges of one kind named in an instance event (the counts and bytes cover all of them). */
#define MN_PLACED_LOGGED 32

static mn_placed *tab;
static size_t ntab, captab;

static void placed_add(uint64_t addr, uint64_t size, uint32_t space) {
  if (ntab == captab) {
    size_t ncap = captab ? captab * 2 : 16;
    mn_placed *n = realloc(tab, ncap * sizeof *n);
    if (!n) {
      mn_error("out of host memory for the managed-memory table; a kernel using this range cannot be replayed", NULL);
      mn_foreign_note(addr, size, space == MN_SPACE_MANAGED ? MN_FOREIGN_MANAGED : MN_FOREIGN_HOST_REGISTERED);
      return;
    }
    tab = n;
    captab = ncap;
  }
  /* kept sorted by address: snapshots and logs list the ranges in address order */
  size_t at = ntab;
  while (at > 0 && tab[at - 1].addr > addr) at--;
  memmove(&tab[at + 1], &tab[at], (ntab - at) * sizeof *tab);
  tab[at].addr = addr;
  tab[at].size = size;
  tab[at].space = space;
  ntab++;
  mn_exit_hook_arm(); /* the exit event then lists what is still live, even if nothing was launched */
}

/* Forgets the range starting at addr; 1 when there was one. */
int mn_placed_del(uint64_t addr) {
  for (size_t i = 0; i < ntab; i++) {
    if (tab[i].addr == addr) {
      memmove(&tab[i], &tab[i + 1], (ntab - i - 1) * sizeof *tab);
      ntab--;
      return 1;
    }
  }
  return 0;
}

const mn_placed *mn_placed_find(uint64_t addr) {
  for (size_t i = 0; i < ntab; i++)
    if (addr >= tab[i].addr && addr - tab[i].addr < tab[i].size) return &tab[i];
  return NULL;
}

size_t mn_placed_count(void) { return ntab; }

const mn_placed *mn_placed_at(size_t i) { return i < ntab ? &tab[i] : NULL; }

static void log_kind(mn_line *l, uint32_t space, const char *key, const char *key_n, const char *key_bytes) {
  uint64_t a[MN_PLACED_LOGGED], b[MN_PLACED_LOGGED], n = 0, bytes = 0;
  size_t k = 0;
  for (size_t i = 0; i < ntab; i++) {
    if (tab[i].space != space) continue;
    if (k < MN_PLACED_LOGGED) {
      a[k] = tab[i].addr;
      b[k++] = tab[i].size;
    }
    n++;
    bytes += tab[i].size;
  }
  if (!n) return;
  mn_line_pairs(l, key, a, b, k);
  mn_line_u64(l, key_n, n);
  mn_line_u64(l, key_bytes, bytes);
}

void mn_placed_log(mn_line *l) {
  log_kind(l, MN_SPACE_MANAGED, "managed", "managed_n", "managed_bytes");
  log_kind(l, MN_SPACE_HOST_PINNED, "registered", "registered_n", "registered_bytes");
}

/* ---------------------------------------------------------------------------------------------- */
/* entry points                                                                                   */

CUresult mn_cu_mem_alloc_managed(const mn_ip_slot *s, CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
  CUresult r = ((PFN_cuMemAllocManaged_v6000)s->real)(dptr, bytesize, flags);
  if (r == CUDA_SUCCESS && R.active && dptr && bytesize) {
    pthread_mutex_lock(&R.mu);
    placed_add((uint64_t)*dptr, bytesize, MN_SPACE_MANAGED);
    pthread_mutex_unlock(&R.mu);
  }
  return r;
}

/* Where the device sees registered host memory: its host address when the driver says so (or, without
 * an answer, when the device can use host pointers for registered memory); 0 when unknown. */
static uint64_t device_address(void *p) {
  char why[256];
  if (mn_drv_load(why, sizeof why)) return 0;
  CUdeviceptr d = 0;
  if (D.hostGetDevicePointer(&d, p, 0) == CUDA_SUCCESS) return (uint64_t)d;
  CUdevice dev;
  int can = 0;
  if (D.ctxGetDevice(&dev) == CUDA_SUCCESS &&
      D.deviceGetAttribute(&can, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, dev) == CUDA_SUCCESS && can)
    return (uint64_t)(uintptr_t)p;
  return 0;
}

CUresult mn_cu_mem_host_register(const mn_ip_slot *s, void *p, size_t bytesize, unsigned int flags) {
  CUresult r = ((PFN_cuMemHostRegister_v6050)s->real)(p, bytesize, flags);
  if (r != CUDA_SUCCESS || !R.active || !p || !bytesize) return r;
  uint64_t host = (uint64_t)(uintptr_t)p;
  uint64_t dev = (flags & CU_MEMHOSTREGISTER_IOMEMORY) ? 0 : device_address(p);
  pthread_mutex_lock(&R.mu);
  if (dev == host) {
    placed_add(host, bytesize, MN_SPACE_HOST_PINNED);
  } else {
    mn_foreign_note(host, bytesize, MN_FOREIGN_HOST_REGISTERED);
    if (dev) mn_foreign_note(dev, bytesize, MN_FOREIGN_HOST_REGISTERED);
  }
  pthread_mutex_unlock(&R.mu);
  return r;
}

CUresult mn_cu_mem_host_unregister(const mn_ip_slot *s, void *p) {
  uint64_t dev = R.active && p ? device_address(p) : 0;
  CUresult r = ((PFN_cuMemHostUnregister_v4000)s->real)(p);
  if (r == CUDA_SUCCESS && R.active && p) {
    uint64_t host = (uint64_t)(uintptr_t)p;
    pthread_mutex_lock(&R.mu);
    if (!mn_placed_del(host)) {
      mn_foreign_forget(host);
      if (dev && dev != host) mn_foreign_forget(dev);
    }
    pthread_mutex_unlock(&R.mu);
  }
  return r;
}
