#include "arena.h"

#include <stdlib.h>
#include <string.h>

uint64_t mn_round_up(uint64_t x, uint64_t align) {
  if (align == 0) return x;
  uint64_t r = x % align;
  if (r == 0) return x;
  if (x > UINT64_MAX - (align - r)) return 0;
  return x + (align - r);
}

uint64_t mn_pitch(uint64_t width, uint64_t pitch_align) {
  if (width == 0) return 0;
  return mn_round_up(width, pitch_align ? pitch_align : 1);
}

static int grow(void **arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t n = *cap ? *cap * 2 : 16;
  while (n < need) n *= 2;
  void *p = realloc(*arr, n * elem);
  if (!p) return -1;
  *arr = p;
  *cap = n;
  return 0;
}

int mn_arena_init(mn_arena *a, uint64_t base, uint64_t size, uint64_t align) {
  memset(a, 0, sizeof *a);
  if (align == 0 || (align & (align - 1)) != 0 || size == 0 || base > UINT64_MAX - size) return -1;
  a->base = base;
  a->size = size;
  a->align = align;
  if (grow((void **)&a->free, &a->capfree, 1, sizeof(mn_span))) return -1;
  a->free[0].addr = base;
  a->free[0].size = size;
  a->nfree = 1;
  a->top = base;
  return 0;
}

int mn_arena_keep_front(mn_arena *a, uint64_t bytes) {
  uint64_t n = mn_round_up(bytes, a->align);
  if (a->nlive || a->nfree != 1 || a->free[0].addr != a->base || (bytes && n == 0) || n >= a->free[0].size) return -1;
  a->free[0].addr += n;
  a->free[0].size -= n;
  return 0;
}

void mn_arena_destroy(mn_arena *a) {
  free(a->free);
  free(a->live);
  memset(a, 0, sizeof *a);
}

/* Index of the first live allocation whose address is >= addr. */
static size_t live_lower_bound(const mn_arena *a, uint64_t addr) {
  size_t lo = 0, hi = a->nlive;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (a->live[mid].addr < addr) lo = mid + 1; else hi = mid;
  }
  return lo;
}

static size_t free_lower_bound(const mn_arena *a, uint64_t addr) {
  size_t lo = 0, hi = a->nfree;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (a->free[mid].addr < addr) lo = mid + 1; else hi = mid;
  }
  return lo;
}

uint64_t mn_arena_alloc(mn_arena *a, uint64_t size) {
  if (size == 0 || size > a->size) return 0;
  uint64_t need = mn_round_up(size, a->align);
  if (need == 0) return 0;
  size_t best = a->nfree;
  for (size_t i = 0; i < a->nfree; i++) {
    if (a->free[i].size >= need && (best == a->nfree || a->free[i].size < a->free[best].size)) {
      best = i;
      if (a->free[i].size == need) break;
    }
  }
  if (best == a->nfree) return 0;
  if (grow((void **)&a->live, &a->caplive, a->nlive + 1, sizeof(mn_alloc))) return 0;
  uint64_t addr = a->free[best].addr;
  if (a->free[best].size == need) {
    memmove(&a->free[best], &a->free[best + 1], (a->nfree - best - 1) * sizeof(mn_span));
    a->nfree--;
  } else {
    a->free[best].addr += need;
    a->free[best].size -= need;
  }
  size_t at = live_lower_bound(a, addr);
  memmove(&a->live[at + 1], &a->live[at], (a->nlive - at) * sizeof(mn_alloc));
  a->live[at].addr = addr;
  a->live[at].size = size;
  a->live[at].reserved = need;
  a->nlive++;
  a->in_use += need;
  if (addr + need > a->top) a->top = addr + need;
  return addr;
}

int mn_arena_free(mn_arena *a, uint64_t addr, mn_alloc *out) {
  size_t at = live_lower_bound(a, addr);
  if (at >= a->nlive || a->live[at].addr != addr) return -1;
  /* Reserve room for a new free block first so that a failure leaves everything unchanged. */
  if (grow((void **)&a->free, &a->capfree, a->nfree + 1, sizeof(mn_span))) return -1;
  mn_alloc dead = a->live[at];
  memmove(&a->live[at], &a->live[at + 1], (a->nlive - at - 1) * sizeof(mn_alloc));
  a->nlive--;
  a->in_use -= dead.reserved;
  if (out) *out = dead;

  size_t f = free_lower_bound(a, dead.addr);
  int merge_prev = f > 0 && a->free[f - 1].addr + a->free[f - 1].size == dead.addr;
  int merge_next = f < a->nfree && dead.addr + dead.reserved == a->free[f].addr;
  if (merge_prev && merge_next) {
    a->free[f - 1].size += dead.reserved + a->free[f].size;
    memmove(&a->free[f], &a->free[f + 1], (a->nfree - f - 1) * sizeof(mn_span));
    a->nfree--;
  } else if (merge_prev) {
    a->free[f - 1].size += dead.reserved;
  } else if (merge_next) {
    a->free[f].addr = dead.addr;
    a->free[f].size += dead.reserved;
  } else {
    memmove(&a->free[f + 1], &a->free[f], (a->nfree - f) * sizeof(mn_span));
    a->free[f].addr = dead.addr;
    a->free[f].size = dead.reserved;
    a->nfree++;
  }
  return 0;
}

const mn_alloc *mn_arena_find(const mn_arena *a, uint64_t addr) {
  if (a->nlive == 0 || !mn_arena_contains(a, addr)) return NULL;
  size_t at = live_lower_bound(a, addr + 1); /* first allocation starting after addr */
  if (at == 0) return NULL;
  const mn_alloc *c = &a->live[at - 1];
  return addr < c->addr + c->size ? c : NULL;
}

int mn_arena_contains(const mn_arena *a, uint64_t addr) {
  return a->size != 0 && addr >= a->base && addr - a->base < a->size;
}

uint64_t mn_arena_largest_free(const mn_arena *a) {
  uint64_t m = 0;
  for (size_t i = 0; i < a->nfree; i++)
    if (a->free[i].size > m) m = a->free[i].size;
  return m;
}
