/* Memory at the recorded addresses (the device arena, registered host regions), pinned staging, and
 * raw allocations. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

struct mnc_arena *mnc_arenas;
struct mnc_host_region *mnc_regions;

int mnc_staging(void) {
  if (mnc_g.staging) return 0;
  MNC_CU(mnc_cu.cuMemAllocHost(&mnc_g.staging, 2 * (size_t)MNC_STAGING_HALF), "cuMemAllocHost(staging)");
  return 0;
}

static int uploader_flush_half(mnc_uploader *u) {
  if (!u->fill) return 0;
  uint8_t *half = (uint8_t *)mnc_g.staging + u->k * (uint64_t)MNC_STAGING_HALF;
  MNC_CU(mnc_cu.cuMemcpyHtoDAsync(u->dst, half, u->fill, mnc_g.stream), "cuMemcpyHtoDAsync");
  MNC_CU(mnc_cu.cuEventRecord(mnc_g.ev_half[u->k], mnc_g.stream), "cuEventRecord");
  u->used[u->k] = 1;
  u->k ^= 1;
  u->fill = 0;
  return 0;
}

int mnc_uploader_begin(mnc_uploader *u) {
  memset(u, 0, sizeof *u);
  return mnc_staging();
}

int mnc_uploader_push(mnc_uploader *u, CUdeviceptr dst, const void *src, uint64_t n) {
  const uint8_t *p = src;
  while (n) {
    if (u->fill) {
      CUdeviceptr end = u->dst + u->fill;
      /* Bridge small gaps (alignment padding) with zeros so neighbours travel in one copy. */
      if (dst > end && dst - end <= 4096 && dst - end < MNC_STAGING_HALF - u->fill) {
        memset((uint8_t *)mnc_g.staging + u->k * (uint64_t)MNC_STAGING_HALF + u->fill, 0, dst - end);
        u->fill += dst - end;
      } else if (dst != end) {
        MNC_TRY(uploader_flush_half(u));
      }
    }
    if (!u->fill) {
      if (u->used[u->k]) MNC_TRY(mnc_wait_event(mnc_g.ev_half[u->k], "host-to-device copy"));
      u->dst = dst;
    }
    uint64_t room = MNC_STAGING_HALF - u->fill, c = n < room ? n : room;
    memcpy((uint8_t *)mnc_g.staging + u->k * (uint64_t)MNC_STAGING_HALF + u->fill, p, c);
    u->fill += c;
    dst += c;
    p += c;
    n -= c;
    if (u->fill == MNC_STAGING_HALF) MNC_TRY(uploader_flush_half(u));
  }
  return 0;
}

int mnc_uploader_flush(mnc_uploader *u) { return uploader_flush_half(u); }

int mnc_uploader_finish(mnc_uploader *u, const char *what) {
  MNC_TRY(uploader_flush_half(u));
  return mnc_wait_stream(what);
}

int mnc_upload(CUdeviceptr dst, const void *src, uint64_t n) {
  mnc_uploader u;
  MNC_TRY(mnc_uploader_begin(&u));
  MNC_TRY(mnc_uploader_push(&u, dst, src, n));
  return mnc_uploader_finish(&u, "host-to-device copy");
}

int mnc_download(void *dst, CUdeviceptr src, uint64_t n) {
  MNC_TRY(mnc_staging());
  uint8_t *p = dst;
  /* Keep one chunk in flight while the previous one is copied out of its half. */
  uint64_t pending_off = 0, pending_len = 0;
  int pending_k = -1;
  for (uint64_t done = 0, k = 0;; k ^= 1) {
    uint64_t chunk = 0;
    if (done < n) {
      chunk = n - done < MNC_STAGING_HALF ? n - done : MNC_STAGING_HALF;
      uint8_t *half = (uint8_t *)mnc_g.staging + k * (uint64_t)MNC_STAGING_HALF;
      MNC_CU(mnc_cu.cuMemcpyDtoHAsync(half, src + done, chunk, mnc_g.stream), "cuMemcpyDtoHAsync");
      MNC_CU(mnc_cu.cuEventRecord(mnc_g.ev_half[k], mnc_g.stream), "cuEventRecord");
    }
    if (pending_k >= 0) {
      MNC_TRY(mnc_wait_event(mnc_g.ev_half[pending_k], "device-to-host copy"));
      memcpy(p + pending_off, (uint8_t *)mnc_g.staging + (uint64_t)pending_k * MNC_STAGING_HALF, pending_len);
    }
    if (!chunk) break;
    pending_k = (int)k;
    pending_off = done;
    pending_len = chunk;
    done += chunk;
  }
  return 0;
}

int mnc_in_arena(uint64_t addr, uint64_t n) {
  for (struct mnc_arena *a = mnc_arenas; a; a = a->next)
    if (addr >= a->base && n <= a->size && addr - a->base <= a->size - n) return 1;
  return 0;
}

int mnc_in_region(uint64_t addr, uint64_t n) {
  for (struct mnc_host_region *r = mnc_regions; r; r = r->next)
    if (addr >= r->addr && n <= r->size && addr - r->addr <= r->size - n) return 1;
  return 0;
}

/* ---- arena ---- */

static int arena_release(struct mnc_arena *a, int mapped, int reserved) {
  int s = 0;
  CUresult r;
  if (mapped && (r = mnc_cu.cuMemUnmap(a->base, a->size)) != CUDA_SUCCESS) s = mnc_fail_cu(r, "cuMemUnmap(arena)");
  if (a->handle && (r = mnc_cu.cuMemRelease(a->handle)) != CUDA_SUCCESS && !s)
    s = mnc_fail_cu(r, "cuMemRelease(arena)");
  if (reserved && (r = mnc_cu.cuMemAddressFree(a->va_base, a->va_size)) != CUDA_SUCCESS && !s)
    s = mnc_fail_cu(r, "cuMemAddressFree(arena)");
  return s;
}

static void arena_prop(CUmemAllocationProp *prop) {
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = mnc_g.dev;
}

static int granularity(size_t *gran) {
  CUmemAllocationProp prop;
  arena_prop(&prop);
  *gran = 0;
  MNC_CU(mnc_cu.cuMemGetAllocationGranularity(gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
         "cuMemGetAllocationGranularity");
  if (!*gran) *gran = 2u << 20;
  return 0;
}

int mnc_arena_granularity(uint64_t *out) {
  mnc_lock();
  size_t gran = 0;
  int s = mnc_enter();
  if (!s) s = granularity(&gran);
  *out = gran;
  mnc_unlock();
  return s;
}

static int arena_create(uint64_t vaddr, uint64_t vasize, uint64_t wbase, uint64_t wsize, mnc_arena **out) {
  *out = NULL;
  MNC_TRY(mnc_enter());
  if (!vasize) return mnc_fail(MNC_E_INVALID, "arena size is 0 (the record DB's VASize)");
  CUmemAllocationProp prop;
  arena_prop(&prop);
  size_t gran = 0;
  MNC_TRY(granularity(&gran));
  if (vaddr % gran)
    return mnc_fail(MNC_E_NOT_GRANTED, "arena address 0x%llx is not a multiple of the allocation granularity %zu",
                    (unsigned long long)vaddr, gran);
  uint64_t size = (vasize + gran - 1) / gran * gran;
  if (!wsize) wbase = vaddr, wsize = size;
  if (wbase % gran || wsize % gran || vaddr < wbase || size > wsize || vaddr - wbase > wsize - size)
    return mnc_fail(MNC_E_INVALID, "arena 0x%llx+%llu does not lie in its window 0x%llx+%llu of granularity multiples",
                    (unsigned long long)vaddr, (unsigned long long)size, (unsigned long long)wbase,
                    (unsigned long long)wsize);
  for (struct mnc_arena *a = mnc_arenas; a; a = a->next)
    if (wbase < a->va_base + a->va_size && a->va_base < wbase + wsize)
      return mnc_fail(MNC_E_INVALID, "arena 0x%llx+%llu overlaps the live arena 0x%llx+%llu",
                      (unsigned long long)wbase, (unsigned long long)wsize, (unsigned long long)a->va_base,
                      (unsigned long long)a->va_size);
  struct mnc_arena *a = calloc(1, sizeof *a);
  if (!a) return mnc_fail(MNC_E_NOMEM, "out of host memory for the arena");
  a->size = size;
  a->va_size = wsize;
  CUdeviceptr got = 0;
  CUresult r = mnc_cu.cuMemAddressReserve(&got, wsize, 0, wbase, 0);
  if (r != CUDA_SUCCESS) {
    char what[128];
    snprintf(what, sizeof what, "cuMemAddressReserve(0x%llx, %llu bytes) for the arena", (unsigned long long)wbase,
             (unsigned long long)wsize);
    int s = mnc_fail_cu(r, what);
    free(a);
    return s;
  }
  if (got != wbase) {
    mnc_cu.cuMemAddressFree(got, wsize);
    free(a);
    return mnc_fail(MNC_E_NOT_GRANTED,
                    "address 0x%llx not granted for the arena (%llu bytes reserved): the driver offered 0x%llx; "
                    "something else in this process already uses that range (replay in a fresh process, or record "
                    "again with another VA base)",
                    (unsigned long long)wbase, (unsigned long long)wsize, (unsigned long long)got);
  }
  a->va_base = got;
  a->base = vaddr;
  if ((r = mnc_cu.cuMemCreate(&a->handle, a->size, &prop, 0)) != CUDA_SUCCESS) {
    int s = mnc_fail_cu(r, "cuMemCreate(arena backing)");
    a->handle = 0;
    arena_release(a, 0, 1);
    free(a);
    return s;
  }
  if ((r = mnc_cu.cuMemMap(a->base, a->size, 0, a->handle, 0)) != CUDA_SUCCESS) {
    int s = mnc_fail_cu(r, "cuMemMap(arena)");
    arena_release(a, 0, 1);
    free(a);
    return s;
  }
  CUmemAccessDesc access;
  memset(&access, 0, sizeof access);
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = mnc_g.dev;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if ((r = mnc_cu.cuMemSetAccess(a->base, a->size, &access, 1)) != CUDA_SUCCESS) {
    int s = mnc_fail_cu(r, "cuMemSetAccess(arena)");
    arena_release(a, 1, 1);
    free(a);
    return s;
  }
  a->next = mnc_arenas;
  mnc_arenas = a;
  mnc_g.resources++;
  *out = a;
  return 0;
}

int mnc_arena_create(uint64_t vaddr, uint64_t vasize, mnc_arena **out) {
  mnc_lock();
  int s = arena_create(vaddr, vasize, 0, 0, out);
  mnc_unlock();
  return s;
}

int mnc_arena_create_within(uint64_t vaddr, uint64_t vasize, uint64_t wbase, uint64_t wsize, mnc_arena **out) {
  mnc_lock();
  int s = wsize ? arena_create(vaddr, vasize, wbase, wsize, out)
                : mnc_fail(MNC_E_INVALID, "arena window size is 0");
  mnc_unlock();
  return s;
}

int mnc_arena_size(const mnc_arena *a, uint64_t *base, uint64_t *size) {
  if (!a) return mnc_fail(MNC_E_INVALID, "no arena");
  *base = a->base;
  *size = a->size;
  return 0;
}

int mnc_arena_destroy(mnc_arena *a) {
  if (!a) return 0;
  mnc_lock();
  int s = 0;
  for (struct mnc_arena **p = &mnc_arenas; *p; p = &(*p)->next)
    if (*p == a) {
      *p = a->next;
      break;
    }
  mnc_g.resources--;
  /* A broken context cannot free anything; the process is about to be replaced. */
  if (!mnc_g.unusable && !(s = mnc_enter())) s = arena_release(a, 1, 1);
  free(a);
  mnc_unlock();
  return s;
}

/* ---- address space kept free for recorded addresses ---- */

/* MNC_E_INVALID unless [addr, addr + size) is whole pages, at least one. */
static int whole_pages(uint64_t addr, uint64_t size, const char *what) {
  long page = sysconf(_SC_PAGESIZE);
  if (page <= 0) page = 4096;
  if (!size || addr % (uint64_t)page || size % (uint64_t)page)
    return mnc_fail(MNC_E_INVALID, "%s 0x%llx+%llu must be page-aligned (%ld) and non-empty", what,
                    (unsigned long long)addr, (unsigned long long)size, page);
  return 0;
}

int mnc_va_hold(uint64_t addr, uint64_t size) {
  MNC_TRY(whole_pages(addr, size, "address hold"));
  void *want = (void *)(uintptr_t)addr;
  void *p = mmap(want, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (p == MAP_FAILED)
    return mnc_fail(errno == EEXIST ? MNC_E_NOT_GRANTED : MNC_E_SYSTEM, "host address 0x%llx+%llu cannot be held: %s",
                    (unsigned long long)addr, (unsigned long long)size, strerror(errno));
  if (p != want) { /* a kernel older than 4.17 takes MAP_FIXED_NOREPLACE as a hint */
    munmap(p, size);
    return mnc_fail(MNC_E_NOT_GRANTED, "host address 0x%llx+%llu cannot be held: the kernel offered %p",
                    (unsigned long long)addr, (unsigned long long)size, p);
  }
  return 0;
}

int mnc_va_release(uint64_t addr, uint64_t size) {
  if (munmap((void *)(uintptr_t)addr, size) != 0)
    return mnc_fail(MNC_E_SYSTEM, "munmap(0x%llx, %llu) of an address hold: %s", (unsigned long long)addr,
                    (unsigned long long)size, strerror(errno));
  return 0;
}

/* ---- registered host memory at recorded host addresses ---- */

static int region_create(uint64_t addr, uint64_t size, mnc_host_region **out) {
  *out = NULL;
  MNC_TRY(mnc_enter());
  MNC_TRY(whole_pages(addr, size, "host region"));
  void *want = (void *)(uintptr_t)addr;
  void *p = mmap(want, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p == MAP_FAILED)
    return mnc_fail(errno == EEXIST ? MNC_E_NOT_GRANTED : MNC_E_SYSTEM,
                    "host address 0x%llx not granted for %llu bytes of pinned memory: mmap: %s%s",
                    (unsigned long long)addr, (unsigned long long)size, strerror(errno),
                    errno == EEXIST ? " (something in this process already lives there; replay in a fresh process)"
                                    : "");
  if (p != want) { /* kernels before 4.17 treat the flag as a hint */
    munmap(p, size);
    return mnc_fail(MNC_E_NOT_GRANTED, "host address 0x%llx not granted: the kernel offered %p",
                    (unsigned long long)addr, p);
  }
  CUresult r = mnc_cu.cuMemHostRegister(p, size, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE);
  if (r != CUDA_SUCCESS) {
    int s = mnc_fail_cu(r, "cuMemHostRegister(pinned region)");
    munmap(p, size);
    return s;
  }
  CUdeviceptr dptr = 0;
  r = mnc_cu.cuMemHostGetDevicePointer(&dptr, p, 0);
  if (r != CUDA_SUCCESS || dptr != addr) {
    int s = r != CUDA_SUCCESS ? mnc_fail_cu(r, "cuMemHostGetDevicePointer(pinned region)")
                              : mnc_fail(MNC_E_NOT_GRANTED,
                                         "pinned host memory at 0x%llx is seen by the device at 0x%llx, not at the "
                                         "same address; the recorded host pointers cannot work on this system",
                                         (unsigned long long)addr, (unsigned long long)dptr);
    mnc_cu.cuMemHostUnregister(p);
    munmap(p, size);
    return s;
  }
  struct mnc_host_region *reg = calloc(1, sizeof *reg);
  if (!reg) {
    mnc_cu.cuMemHostUnregister(p);
    munmap(p, size);
    return mnc_fail(MNC_E_NOMEM, "out of host memory");
  }
  reg->addr = addr;
  reg->size = size;
  reg->registered = 1;
  reg->next = mnc_regions;
  mnc_regions = reg;
  mnc_g.resources++;
  *out = reg;
  return 0;
}

int mnc_host_region_create(uint64_t addr, uint64_t size, mnc_host_region **out) {
  mnc_lock();
  int s = region_create(addr, size, out);
  mnc_unlock();
  return s;
}

int mnc_host_region_destroy(mnc_host_region *reg) {
  if (!reg) return 0;
  mnc_lock();
  int s = 0;
  for (struct mnc_host_region **p = &mnc_regions; *p; p = &(*p)->next)
    if (*p == reg) {
      *p = reg->next;
      break;
    }
  mnc_g.resources--;
  void *p = (void *)(uintptr_t)reg->addr;
  if (!mnc_g.unusable && !(s = mnc_enter())) {
    CUresult r = mnc_cu.cuMemHostUnregister(p);
    if (r != CUDA_SUCCESS) s = mnc_fail_cu(r, "cuMemHostUnregister(pinned region)");
  }
  /* Still registered with a broken context: leave the mapping, the device may reach it. */
  if (!mnc_g.unusable && munmap(p, reg->size) != 0 && !s)
    s = mnc_fail(MNC_E_SYSTEM, "munmap(0x%llx): %s", (unsigned long long)reg->addr, strerror(errno));
  free(reg);
  mnc_unlock();
  return s;
}

/* ---- raw device memory ---- */

int mnc_mem_alloc(uint64_t size, uint64_t *addr) {
  mnc_lock();
  *addr = 0;
  int s = mnc_enter();
  CUdeviceptr d = 0;
  CUresult r;
  if (!s && (r = mnc_cu.cuMemAlloc(&d, size ? size : 1)) != CUDA_SUCCESS) s = mnc_fail_cu(r, "cuMemAlloc");
  if (!s) {
    *addr = d;
    mnc_g.resources++;
  }
  mnc_unlock();
  return s;
}

int mnc_mem_free(uint64_t addr) {
  if (!addr) return 0;
  mnc_lock();
  mnc_g.resources--;
  int s = mnc_g.unusable ? 0 : mnc_enter();
  CUresult r;
  if (!s && !mnc_g.unusable && (r = mnc_cu.cuMemFree(addr)) != CUDA_SUCCESS) s = mnc_fail_cu(r, "cuMemFree");
  mnc_unlock();
  return s;
}

int mnc_memcpy_htod(uint64_t dst, const void *src, uint64_t n) {
  mnc_lock();
  int s = mnc_enter();
  if (!s) s = mnc_upload(dst, src, n);
  mnc_unlock();
  return s;
}

int mnc_memcpy_dtoh(void *dst, uint64_t src, uint64_t n) {
  mnc_lock();
  int s = mnc_enter();
  if (!s) s = mnc_download(dst, src, n);
  mnc_unlock();
  return s;
}

int mnc_memset(uint64_t dst, uint8_t value, uint64_t n) {
  mnc_lock();
  int s = mnc_enter();
  CUresult r;
  if (!s && (r = mnc_cu.cuMemsetD8Async(dst, value, n, mnc_g.stream)) != CUDA_SUCCESS)
    s = mnc_fail_cu(r, "cuMemsetD8Async");
  if (!s) s = mnc_wait_stream("memset");
  mnc_unlock();
  return s;
}
