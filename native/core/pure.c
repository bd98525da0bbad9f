/* Helpers that need no driver: the kernel parameter array, range coalescing, copy merging. */
#include <stdlib.h>

#include "core.h"

int mnc_args_pointers(const uint8_t *bytes, uint64_t total, const uint32_t *offsets, const uint32_t *sizes,
                      uint32_t count, void **params) {
  if (count && (!offsets || !sizes || !params))
    return mnc_fail(MNC_E_INVALID, "argument buffer: %u parameters but no offsets, sizes or output", count);
  if (total && !bytes) return mnc_fail(MNC_E_INVALID, "argument buffer: %llu bytes announced, none given",
                                       (unsigned long long)total);
  for (uint32_t i = 0; i < count; i++) {
    if ((uint64_t)offsets[i] + sizes[i] > total)
      return mnc_fail(MNC_E_INVALID,
                      "argument buffer: parameter %u (offset %u, %u bytes) ends past the buffer's %llu bytes", i,
                      offsets[i], sizes[i], (unsigned long long)total);
    params[i] = (void *)(bytes + offsets[i]);
  }
  return 0;
}

static int range_order(const void *a, const void *b) {
  const mn_range *x = a, *y = b;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  return x->length < y->length ? -1 : x->length > y->length;
}

uint32_t mnc_coalesce_ranges(mn_range *r, uint32_t n, uint64_t gap) {
  if (!n) return 0;
  qsort(r, n, sizeof *r, range_order);
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (!r[i].length) continue;
    if (k) {
      uint64_t end = r[k - 1].offset + r[k - 1].length;
      if (r[i].offset <= end || r[i].offset - end < gap) {
        uint64_t e = r[i].offset + r[i].length;
        if (e > end) r[k - 1].length = e - r[k - 1].offset;
        continue;
      }
    }
    r[k++] = r[i];
  }
  return k;
}

static int copy_order(const void *a, const void *b) {
  const mnc_copy *x = a, *y = b;
  if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
  if (x->obj != y->obj) return x->obj < y->obj ? -1 : 1;
  if (x->dst != y->dst) return x->dst < y->dst ? -1 : 1;
  return x->length < y->length ? -1 : x->length > y->length;
}

uint32_t mnc_merge_copies(mnc_copy *c, uint32_t n, uint64_t gap) {
  if (!n) return 0;
  qsort(c, n, sizeof *c, copy_order);
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (!c[i].length) continue;
    if (k) {
      mnc_copy *p = &c[k - 1];
      uint64_t end = p->dst + p->length;
      /* Same displacement: the bytes between the two ranges correspond in source and destination.
       * Host copies merge only when they touch: the bytes between two host blobs are not ours. */
      int same_shift = c[i].dst - p->dst == c[i].src - p->src && c[i].src >= p->src;
      uint64_t allowed = c[i].kind == MNC_COPY_HOST ? 0 : gap;
      if (c[i].kind == p->kind && c[i].obj == p->obj && same_shift && (c[i].dst <= end || c[i].dst - end < allowed)) {
        uint64_t e = c[i].dst + c[i].length;
        if (e > end) p->length = e - p->dst;
        continue;
      }
    }
    c[k++] = c[i];
  }
  return k;
}

int mnc_copy_inside(const mnc_copy *c, uint64_t dst, uint64_t src, uint64_t size) {
  return c->length <= size && c->dst >= dst && c->dst - dst <= size - c->length && c->src >= src &&
         c->src - src <= size - c->length;
}
