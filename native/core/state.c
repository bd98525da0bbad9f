/* The replay memory state: the prologue loaded at its recorded addresses, a device-side copy of it,
 * and the resets between runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

static int by_addr(const void *a, const void *b) {
  uint64_t x = ((const mnc_blob_slot *)a)->rec->addr, y = ((const mnc_blob_slot *)b)->rec->addr;
  return x < y ? -1 : x > y;
}

const mnc_blob_slot *mnc_state_find_blob(const mnc_state *s, uint64_t addr, uint64_t n) {
  uint32_t lo = 0, hi = s->nblobs; /* first slot with address > addr */
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (s->blobs[mid].rec->addr <= addr) lo = mid + 1;
    else hi = mid;
  }
  if (!lo) return NULL;
  const mnc_blob_slot *b = &s->blobs[lo - 1];
  uint64_t off = addr - b->rec->addr;
  return n <= b->rec->size && off <= b->rec->size - n ? b : NULL;
}

/* Host copy -> device-side copy -> blobs; host blobs straight from the snapshot. */
static int restore_all(mnc_state *s) {
  mnc_uploader u;
  MNC_TRY(mnc_uploader_begin(&u));
  for (uint32_t i = 0; i < s->nblobs; i++) {
    const mnc_blob_slot *b = &s->blobs[i];
    if (!b->host && b->rec->size) MNC_TRY(mnc_uploader_push(&u, s->shadow + b->shadow_off, b->rec->data, b->rec->size));
  }
  MNC_TRY(mnc_uploader_flush(&u));
  for (uint32_t i = 0; i < s->nblobs; i++) {
    const mnc_blob_slot *b = &s->blobs[i];
    if (!b->rec->size) continue;
    if (b->host)
      memcpy((void *)(uintptr_t)b->rec->addr, b->rec->data, b->rec->size);
    else
      MNC_CU(mnc_cu.cuMemcpyDtoDAsync(b->rec->addr, s->shadow + b->shadow_off, b->rec->size, mnc_g.stream),
             "cuMemcpyDtoDAsync(blob from its device-side copy)");
  }
  return mnc_wait_stream("loading the prologue");
}

static int state_load(const mn_snapshot *pro, mnc_state **out) {
  *out = NULL;
  MNC_TRY(mnc_enter());
  const char *path = pro->path ? pro->path : "<snapshot>";
  if (pro->kind != MN_PROLOGUE)
    return mnc_fail(MNC_E_INVALID, "%s is not a prologue snapshot (kind %u)", path, pro->kind);
  mnc_state *s = calloc(1, sizeof *s);
  mnc_blob_slot *slots = pro->nblobs ? calloc(pro->nblobs, sizeof *slots) : NULL;
  if (!s || (pro->nblobs && !slots)) {
    free(s);
    free(slots);
    return mnc_fail(MNC_E_NOMEM, "out of host memory");
  }
  s->prologue = pro;
  s->blobs = slots;
  s->nblobs = pro->nblobs;
  int st = 0;
  for (uint32_t i = 0; i < pro->nblobs && !st; i++) {
    const mn_blob *b = &pro->blobs[i];
    slots[i].rec = b;
    slots[i].host = b->space == MN_SPACE_HOST_PINNED;
    if (b->encoding != MN_ENC_BYTES || (b->size && !b->data))
      st = mnc_fail(MNC_E_INVALID, "%s: blob 0x%llx has no full contents (encoding %u)", path,
                    (unsigned long long)b->addr, b->encoding);
    else if (slots[i].host ? !mnc_in_region(b->addr, b->size) : !mnc_in_arena(b->addr, b->size))
      st = mnc_fail(MNC_E_INVALID, "%s: %s blob 0x%llx (%llu bytes) lies outside every %s", path,
                    slots[i].host ? "pinned host" : "device", (unsigned long long)b->addr,
                    (unsigned long long)b->size, slots[i].host ? "registered host region" : "arena");
  }
  if (!st && s->nblobs) qsort(slots, s->nblobs, sizeof *slots, by_addr);
  for (uint32_t i = 1; i < s->nblobs && !st; i++)
    if (slots[i].rec->addr - slots[i - 1].rec->addr < slots[i - 1].rec->size)
      st = mnc_fail(MNC_E_INVALID, "%s: blobs 0x%llx and 0x%llx overlap", path,
                    (unsigned long long)slots[i - 1].rec->addr, (unsigned long long)slots[i].rec->addr);
  uint64_t total = 0;
  for (uint32_t i = 0; i < s->nblobs && !st; i++)
    if (!slots[i].host) {
      slots[i].shadow_off = total;
      total += (slots[i].rec->size + 255) / 256 * 256;
    }
  CUresult r;
  if (!st && total) {
    if ((r = mnc_cu.cuMemAlloc(&s->shadow, total)) != CUDA_SUCCESS)
      st = mnc_fail_cu(r, "cuMemAlloc(device-side copy of the prologue)");
    else
      s->shadow_bytes = total;
  }
  if (!st) st = restore_all(s);
  if (st) {
    if (s->shadow && !mnc_g.unusable) mnc_cu.cuMemFree(s->shadow);
    free(slots);
    free(s);
    return st;
  }
  mnc_g.resources++;
  *out = s;
  return 0;
}

int mnc_state_load(const mn_snapshot *prologue, mnc_state **out) {
  mnc_lock();
  int s = prologue ? state_load(prologue, out) : mnc_fail(MNC_E_INVALID, "no prologue snapshot");
  mnc_unlock();
  return s;
}

int mnc_state_free(mnc_state *s) {
  if (!s) return 0;
  mnc_lock();
  mnc_g.resources--;
  int st = 0;
  CUresult r;
  if (s->shadow && !mnc_g.unusable && !(st = mnc_enter()) && (r = mnc_cu.cuMemFree(s->shadow)) != CUDA_SUCCESS)
    st = mnc_fail_cu(r, "cuMemFree(device-side copy)");
  free(s->plan);
  free(s->blobs);
  free(s);
  mnc_unlock();
  return st;
}

/* Where copy object `obj` of a plan lies: blobs first (slot order), then the module's variables. */
static void copy_object(const mnc_state *s, const mnc_module *m, uint32_t obj, uint64_t *dst, uint64_t *src,
                        uint64_t *size, char *name, size_t cap) {
  if (obj < s->nblobs) {
    const mnc_blob_slot *b = &s->blobs[obj];
    *dst = b->rec->addr;
    *src = b->host ? (uint64_t)(uintptr_t)b->rec->data : s->shadow + b->shadow_off;
    *size = b->rec->size;
    snprintf(name, cap, "blob 0x%llx (%llu bytes)", (unsigned long long)b->rec->addr, (unsigned long long)*size);
  } else {
    const mnc_var_slot *v = &m->vars[obj - s->nblobs];
    *dst = v->addr;
    *src = m->var_shadow + v->shadow_off;
    *size = v->rec->size;
    snprintf(name, cap, "variable %s (%llu bytes at 0x%llx in the module)", v->rec->name ? v->rec->name : "?",
             (unsigned long long)*size, (unsigned long long)v->addr);
  }
}

/* Every copy of a plan must stay inside its one object at both ends: the driver refuses a copy over two
 * allocations, and one past an object's end would overwrite what lies behind it. */
static int check_plan(const mnc_state *s, const mnc_module *m, const mnc_copy *ops, uint32_t k) {
  for (uint32_t i = 0; i < k; i++) {
    uint64_t dst = 0, src = 0, size = 0;
    char name[512];
    copy_object(s, m, ops[i].obj, &dst, &src, &size, name, sizeof name);
    if (!dst || !src || !mnc_copy_inside(&ops[i], dst, src, size))
      return mnc_fail(MNC_E_INVALID,
                      "reset plan: the copy of %llu bytes to 0x%llx from 0x%llx leaves %s (source at 0x%llx); the "
                      "written ranges of %s do not fit this state and module",
                      (unsigned long long)ops[i].length, (unsigned long long)ops[i].dst,
                      (unsigned long long)ops[i].src, name, (unsigned long long)src,
                      s->prologue->path ? s->prologue->path : "the prologue");
  }
  return 0;
}

static int state_plan(mnc_state *s, mnc_module *m, const mn_range *ranges, uint32_t n, uint64_t gap) {
  mnc_copy *ops = n ? calloc(n, sizeof *ops) : NULL;
  if (n && !ops) return mnc_fail(MNC_E_NOMEM, "out of host memory");
  int uses_vars = 0;
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint64_t a = ranges[i].offset, len = ranges[i].length;
    if (!len) continue;
    const mnc_blob_slot *b = mnc_state_find_blob(s, a, len);
    const mnc_var_slot *v = b ? NULL : mnc_module_find_var(m, a, len);
    if (b) {
      uint64_t off = a - b->rec->addr;
      ops[k].dst = a;
      ops[k].kind = b->host ? MNC_COPY_HOST : MNC_COPY_D2D;
      ops[k].src = b->host ? (uint64_t)(uintptr_t)(b->rec->data + off) : s->shadow + b->shadow_off + off;
      ops[k].obj = (uint32_t)(b - s->blobs);
    } else if (v) {
      uint64_t off = a - v->rec->addr;
      ops[k].dst = v->addr + off;
      ops[k].kind = MNC_COPY_D2D;
      ops[k].src = m->var_shadow + v->shadow_off + off;
      ops[k].obj = s->nblobs + (uint32_t)(v - m->vars);
      uses_vars = 1;
    } else {
      free(ops);
      return mnc_fail(MNC_E_INVALID,
                      "written range 0x%llx+%llu lies inside no single blob of %s%s", (unsigned long long)a,
                      (unsigned long long)len, s->prologue->path ? s->prologue->path : "the prologue",
                      m ? " and no variable of the module" : " (no module given for variables)");
    }
    ops[k++].length = len;
  }
  k = mnc_merge_copies(ops, k, gap);
  int st = check_plan(s, m, ops, k);
  if (st) {
    free(ops);
    return st;
  }
  free(s->plan);
  s->plan = ops;
  s->nplan = k;
  s->plan_serial = uses_vars ? m->serial : 0;
  s->plan_bytes = 0;
  for (uint32_t i = 0; i < k; i++) s->plan_bytes += ops[i].length;
  return 0;
}

int mnc_state_plan(mnc_state *s, mnc_module *m, const mn_range *ranges, uint32_t n, uint64_t merge_gap) {
  mnc_lock();
  int st = s && (ranges || !n) ? state_plan(s, m, ranges, n, merge_gap) : mnc_fail(MNC_E_INVALID, "no state");
  mnc_unlock();
  return st;
}

int mnc_state_plan_size(const mnc_state *s, uint32_t *ops, uint64_t *bytes) {
  if (!s) return mnc_fail(MNC_E_INVALID, "no state");
  *ops = s->nplan;
  *bytes = s->plan_bytes;
  return 0;
}

int mnc_state_enqueue_plan(mnc_state *s) {
  for (uint32_t i = 0; i < s->nplan; i++) {
    const mnc_copy *c = &s->plan[i];
    if (c->kind == MNC_COPY_HOST)
      memcpy((void *)(uintptr_t)c->dst, (const void *)(uintptr_t)c->src, c->length);
    else {
      CUresult r = mnc_cu.cuMemcpyDtoDAsync(c->dst, c->src, c->length, mnc_g.stream);
      if (r != CUDA_SUCCESS) {
        char what[160];
        snprintf(what, sizeof what, "cuMemcpyDtoDAsync(reset of written bytes: %llu to 0x%llx from 0x%llx)",
                 (unsigned long long)c->length, (unsigned long long)c->dst, (unsigned long long)c->src);
        return mnc_fail_cu(r, what);
      }
    }
  }
  return 0;
}

static int check_plan_module(const mnc_state *s, const mnc_module *m) {
  if (s->plan_serial && (!m || m->serial != s->plan_serial))
    return mnc_fail(MNC_E_INVALID, "the reset plan covers variables of another module; plan again for this one");
  return 0;
}

int mnc_state_check_plan(const mnc_state *s, const mnc_module *m) { return check_plan_module(s, m); }

int mnc_state_reset_written(mnc_state *s, mnc_module *m) {
  mnc_lock();
  int st = s ? mnc_enter() : mnc_fail(MNC_E_INVALID, "no state");
  if (!st) st = check_plan_module(s, m);
  if (!st) st = mnc_state_enqueue_plan(s);
  if (!st) st = mnc_wait_stream("reset of written bytes");
  mnc_unlock();
  return st;
}

int mnc_state_reset_all(mnc_state *s, mnc_module *m) {
  mnc_lock();
  int st = s ? mnc_enter() : mnc_fail(MNC_E_INVALID, "no state");
  if (!st) st = restore_all(s);
  if (!st && m) st = mnc_module_reload_vars(m);
  mnc_unlock();
  return st;
}
