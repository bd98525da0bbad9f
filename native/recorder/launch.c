/* librecord's launches: every launch entry point of the driver (cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel: what every runtime's cudaLaunchKernel & co. and the app's own driver calls
 * end in) is wrapped; a launch of a selected kernel is either recorded (a new instance: prologue, timed
 * launch, epilogue), counted and timed (a launch of an instance recorded before), or counted as not
 * recorded with the reason (mn_skip).
 *
 * An instance is the kernel with its grid, block, dynamic shared memory, launch attributes and its
 * argument bytes with the pointer bytes masked out; `mneme record` computes the official dynamic hash
 * from the same fields (mneme/record/hashing.py), with the mask logged here. */
#include "state.h"

#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MN_EXPORT __attribute__((visibility("default")))
#define MN_MAX_PENDING 8192
#define MN_FLUSH_EVERY 4096
#define MN_FLUSH_NS 1000000000ull

enum { SHAPE_LAUNCH, SHAPE_EX, SHAPE_COOP };

typedef struct mn_launch {
  const char *api;
  int shape;
  void *real;
  CUfunction f;                     /* a CUfunction, or a CUkernel passed in its place */
  const CUlaunchConfig *config;     /* EX */
  uint32_t grid[3], block[3];
  uint32_t shmem;
  CUstream stream;                  /* as the app passed it */
  CUstream ev_stream;               /* the same stream, with the per-thread default stream made explicit */
  void **params, **extra;
  uint32_t cluster[3];
  uint32_t coop;
  uint32_t nother;                  /* launch attributes not replayed, by id */
  uint32_t other[16];
  mn_inst *counted;                 /* out: the recorded instance this launch counted into */
  int skip;                         /* out: the reason it was not recorded (mn_skip), -1 when none was given */
} mn_launch;

static CUresult fire(const mn_launch *L) {
  switch (L->shape) {
    case SHAPE_LAUNCH:
      return ((PFN_cuLaunchKernel_v4000)L->real)(L->f, L->grid[0], L->grid[1], L->grid[2], L->block[0], L->block[1],
                                                 L->block[2], L->shmem, L->stream, L->params, L->extra);
    case SHAPE_COOP:
      return ((PFN_cuLaunchCooperativeKernel_v9000)L->real)(L->f, L->grid[0], L->grid[1], L->grid[2], L->block[0],
                                                            L->block[1], L->block[2], L->shmem, L->stream, L->params);
    default: return ((PFN_cuLaunchKernelEx_v11060)L->real)(L->config, L->f, L->params, L->extra);
  }
}

/* ---------------------------------------------------------------------------------------------- */
/* kernels and their parameter layout                                                             */

/* The kernel a launch names: by the handle the runtime got from cuLibraryGetKernel/cuModuleGetFunction
 * (recorder.c), else by asking the driver for the handle's name. */
mn_kernel *mn_kernel_of(CUfunction f) {
  mn_kernel *k = mn_kernel_by_handle(f);
  if (!k) {
    const char *name = NULL;
    int is_kernel = 0;
    if (D.funcGetName && D.funcGetName(&name, f) == CUDA_SUCCESS && name) {
      is_kernel = 0;
    } else if (D.kernelGetName && D.kernelGetName(&name, (CUkernel)f) == CUDA_SUCCESS && name) {
      is_kernel = 1;
    } else {
      name = NULL;
    }
    char unnamed[64];
    if (!name) {
      snprintf(unnamed, sizeof unnamed, "unnamed_kernel_%p", (void *)f);
      name = unnamed;
    }
    k = mn_kernel_by_name(name, 1);
    if (k) {
      if (is_kernel && !k->kern) k->kern = (CUkernel)f;
      if (!is_kernel && !k->func) k->func = f;
      mn_kernel_add_handle(k, f);
    }
  }
  if (k) mn_kernel_announce(k);
  return k;
}

/* The driver calls of the timing hold (native/hold). */
static mn_hold_calls hold_calls(void) {
  mn_hold_calls c = {D.streamWaitValue32, D.hostAlloc, D.hostGetDevicePointer, D.freeHost, D.funcIsLoaded, D.funcLoad};
  return c;
}

/* A CUfunction for the kernel in the current context, loaded. */
static CUfunction function_of(mn_kernel *k, CUfunction launched) {
  CUfunction f = NULL;
  if (k->kern && D.kernelGetFunction && D.kernelGetFunction(&f, k->kern) != CUDA_SUCCESS) f = NULL;
  if (!f && k->func) f = k->func;
  if (!f && (CUkernel)launched != k->kern) f = launched;
  mn_hold_calls c = hold_calls();
  CUresult r = mn_hold_load_function(&c, f); /* lazy loading: before its first held launch (native/hold) */
  if (r != CUDA_SUCCESS) {
    static int warned;
    char why[512];
    snprintf(why, sizeof why, "%s: %s", k->name, mn_cu_err(r));
    mn_warn_once(&warned, "cannot load a function before its timed launch (its first launch may load it)", why);
  }
  return f;
}

/* Parameter offsets and sizes from the driver; 1 when known. */
int mn_kernel_layout(mn_kernel *k, CUfunction launched) {
  if (k->params) return k->params > 0;
  k->params = -1;
  CUfunction f = function_of(k, launched);
  if (!f || !D.funcGetParamInfo) return 0;
  uint32_t cap = 16, n = 0;
  uint32_t *off = malloc(cap * sizeof *off), *size = malloc(cap * sizeof *size);
  uint64_t total = 0;
  int ok = off && size;
  while (ok) {
    size_t o = 0, s = 0;
    if (D.funcGetParamInfo(f, n, &o, &s) != CUDA_SUCCESS) break; /* past the last parameter */
    if (n == cap) {
      cap *= 2;
      uint32_t *no = realloc(off, cap * sizeof *no);
      if (no) off = no;
      uint32_t *ns = no ? realloc(size, cap * sizeof *ns) : NULL;
      if (ns) size = ns;
      if (!no || !ns) { ok = 0; break; }
    }
    off[n] = (uint32_t)o;
    size[n] = (uint32_t)s;
    if (o + s > total) total = o + s;
    n++;
  }
  if (!ok) {
    free(off);
    free(size);
    return 0;
  }
  k->poff = off;
  k->psize = size;
  k->nparams = n;
  k->argbytes = (uint32_t)total;
  k->params = 1;
  if (k->tab && k->tab->nparams != n) {
    char why[512];
    snprintf(why, sizeof why, "%s: the IR has %u parameters, the driver %u; pointer arguments are found by value",
             k->name, k->tab->nparams, n);
    mn_error("kernel table does not match the binary", why);
  }
  return 1;
}

/* ---------------------------------------------------------------------------------------------- */
/* instances                                                                                      */

typedef struct keyhdr {
  uint32_t grid[3], block[3], cluster[3], coop;
  uint64_t shmem;
} keyhdr;

static uint64_t fnv1a(const uint8_t *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static int is_pointer_value(uint64_t w) {
  return w && (mn_is_recorded_memory(w) || mn_var_containing(w) || mn_foreign_find(w));
}

typedef struct argscan {
  uint8_t *bytes;      /* argbytes */
  uint8_t *mask;       /* 1 where a byte belongs to a pointer */
  int from_ir;
  size_t nforeign;     /* words pointing into memory replay cannot place */
  uint64_t foff[32];
  uint32_t fkind[32];
  size_t ntex;         /* words equal to a live texture/surface object */
  uint64_t toff[32];
} argscan;

static void scan_args(const mn_kernel *k, argscan *a) {
  a->from_ir = k->tab && k->tab->nparams == k->nparams;
  if (a->from_ir) {
    for (uint32_t r = 0; r < k->tab->nranges; r++) {
      const mn_ptr_range *pr = &k->tab->ranges[r];
      uint32_t psz = k->psize[pr->param];
      if (pr->offset >= psz) continue;
      uint32_t len = pr->length < psz - pr->offset ? pr->length : psz - pr->offset;
      memset(a->mask + k->poff[pr->param] + pr->offset, 1, len);
    }
  }
  for (uint32_t i = 0; i < k->nparams; i++) {
    uint64_t start = (k->poff[i] + 7u) & ~7ull, end = (uint64_t)k->poff[i] + k->psize[i];
    for (uint64_t o = start; o + 8 <= end; o += 8) {
      uint64_t w;
      memcpy(&w, a->bytes + o, 8);
      if (!w) continue;
      if (!a->from_ir && is_pointer_value(w)) memset(a->mask + o, 1, 8);
      const mn_foreign *f = mn_foreign_find(w);
      if (f && a->nforeign < 32) {
        a->foff[a->nforeign] = o;
        a->fkind[a->nforeign++] = (uint32_t)f->kind;
      }
      if (R.ntex && mn_texhandle_live(w) && a->ntex < 32) a->toff[a->ntex++] = o;
    }
  }
}

static uint8_t *make_key(const mn_launch *L, const mn_kernel *k, const argscan *a, size_t *len) {
  keyhdr h;
  memset(&h, 0, sizeof h);
  memcpy(h.grid, L->grid, sizeof h.grid);
  memcpy(h.block, L->block, sizeof h.block);
  memcpy(h.cluster, L->cluster, sizeof h.cluster);
  h.coop = L->coop;
  h.shmem = L->shmem;
  *len = sizeof h + k->argbytes;
  uint8_t *key = malloc(*len);
  if (!key) return NULL;
  memcpy(key, &h, sizeof h);
  for (uint32_t i = 0; i < k->argbytes; i++) key[sizeof h + i] = a->mask[i] ? 0 : a->bytes[i];
  return key;
}

static mn_inst *find_inst(mn_kernel *k, const uint8_t *key, size_t len, uint64_t hash) {
  for (mn_inst *i = k->insts; i; i = i->next_in_kernel)
    if (i->hash == hash && i->keylen == len && memcmp(i->key, key, len) == 0) return i;
  return NULL;
}

static mn_inst *new_inst(mn_kernel *k, uint8_t *key, size_t len, uint64_t hash) {
  mn_inst *i = calloc(1, sizeof *i);
  if (!i) return NULL;
  i->id = R.ninsts++;
  i->k = k;
  i->key = key;
  i->keylen = len;
  i->hash = hash;
  i->next_in_kernel = k->insts;
  k->insts = i;
  /* append to the list the signal handler walks */
  if (R.last_inst) __atomic_store_n(&R.last_inst->next_all, i, __ATOMIC_RELEASE);
  else __atomic_store_n(&R.all_insts, i, __ATOMIC_RELEASE);
  R.last_inst = i;
  return i;
}

static void add_sample(mn_inst *i, uint64_t ns) {
  if (i->total_samples >= R.cfg.max_samples) return;
  if (i->nsamples == i->capsamples) {
    uint32_t ncap = i->capsamples ? i->capsamples * 2 : 16;
    uint64_t *n = realloc(i->samples, ncap * sizeof *n);
    if (!n) return;
    i->samples = n;
    i->capsamples = ncap;
  }
  i->samples[i->nsamples++] = ns;
  i->total_samples++;
}

/* ---------------------------------------------------------------------------------------------- */
/* in-app timing of repeated launches: events resolved lazily, in launch order                     */

static CUevent ev_get(void) {
  if (R.nevpool) return R.evpool[--R.nevpool];
  CUevent e = NULL;
  if (D.eventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return NULL;
  return e;
}

static void ev_put(CUevent e) {
  if (!e) return;
  if (R.nevpool == R.capevpool) {
    size_t ncap = R.capevpool ? R.capevpool * 2 : 64;
    CUevent *n = realloc(R.evpool, ncap * sizeof *n);
    if (!n) {
      D.eventDestroy(e);
      return;
    }
    R.evpool = n;
    R.capevpool = ncap;
  }
  R.evpool[R.nevpool++] = e;
}

static int elapsed_ns(CUevent a, CUevent b, uint64_t *ns) {
  float ms = 0;
  if (D.eventElapsed(&ms, a, b) != CUDA_SUCCESS || ms < 0) return 0;
  *ns = (uint64_t)((double)ms * 1e6 + 0.5);
  return 1;
}

void mn_resolve_pending(int wait) {
  while (R.pending_head < R.npending) {
    mn_pending *p = &R.pending[R.pending_head];
    CUresult q = CUDA_ERROR_NOT_READY;
    if (wait) q = D.eventSynchronize(p->stop);
    else q = D.eventQuery(p->stop);
    if (q == CUDA_ERROR_NOT_READY && !wait) break;
    uint64_t ns;
    if (q == CUDA_SUCCESS && elapsed_ns(p->start, p->stop, &ns)) add_sample(p->inst, ns);
    ev_put(p->start);
    ev_put(p->stop);
    R.pending_head++;
  }
  if (R.pending_head == R.npending) {
    R.pending_head = R.npending = 0;
  } else if (R.pending_head > R.cappending / 2) {
    memmove(R.pending, R.pending + R.pending_head, (R.npending - R.pending_head) * sizeof *R.pending);
    R.npending -= R.pending_head;
    R.pending_head = 0;
  }
}

static int push_pending(CUevent a, CUevent b, mn_inst *i) {
  if (R.npending - R.pending_head >= MN_MAX_PENDING) {
    mn_resolve_pending(0);
    if (R.npending - R.pending_head >= MN_MAX_PENDING) {
      /* too many in flight: wait for the oldest one */
      D.eventSynchronize(R.pending[R.pending_head].stop);
      mn_resolve_pending(0);
    }
  }
  if (R.npending == R.cappending) {
    size_t ncap = R.cappending ? R.cappending * 2 : 256;
    mn_pending *n = realloc(R.pending, ncap * sizeof *n);
    if (!n) return -1;
    R.pending = n;
    R.cappending = ncap;
  }
  R.pending[R.npending].start = a;
  R.pending[R.npending].stop = b;
  R.pending[R.npending].inst = i;
  R.npending++;
  return 0;
}

static CUresult fire_timed(const mn_launch *L, mn_inst *inst) {
  CUevent a = ev_get(), b = a ? ev_get() : NULL;
  if (!b) {
    ev_put(a);
    return fire(L);
  }
  if (D.eventRecord(a, L->ev_stream) != CUDA_SUCCESS) {
    ev_put(a);
    ev_put(b);
    return fire(L);
  }
  CUresult r = fire(L);
  if (r == CUDA_SUCCESS && D.eventRecord(b, L->ev_stream) == CUDA_SUCCESS && push_pending(a, b, inst) == 0)
    return r;
  ev_put(a);
  ev_put(b);
  return r;
}

static char occbuf[1 << 16];
static char sigocc[256];

void mn_emit_occurrences(int signal_safe) {
  for (mn_inst *i = __atomic_load_n(&R.all_insts, __ATOMIC_ACQUIRE); i; i = __atomic_load_n(&i->next_all, __ATOMIC_ACQUIRE)) {
    if (!i->recorded || !__atomic_load_n(&i->logged, __ATOMIC_ACQUIRE)) continue; /* its event comes first */
    uint64_t n = __atomic_load_n(&i->count, __ATOMIC_RELAXED);
    mn_line l;
    if (signal_safe) {
      if (n == i->flushed_count) continue;
      mn_line_begin(&l, sigocc, sizeof sigocc, "occ");
      mn_line_u64(&l, "i", i->id);
      mn_line_u64(&l, "n", n);
      size_t len = mn_line_end(&l);
      if (len && mn_log_write(&R.log, sigocc, len)) R.incomplete = 1;
      continue;
    }
    if (n == i->flushed_count && !i->nsamples) continue;
    uint32_t done = 0;
    do {
      uint32_t m = i->nsamples - done < 2000 ? i->nsamples - done : 2000;
      mn_line_begin(&l, occbuf, sizeof occbuf, "occ");
      mn_line_u64(&l, "i", i->id);
      mn_line_u64(&l, "n", n);
      mn_line_u64s(&l, "t", i->samples + done, m);
      mn_log_event(&l);
      done += m;
    } while (done < i->nsamples);
    i->flushed_count = n;
    i->nsamples = 0;
  }
}

static void maybe_flush(void) {
  uint64_t now = mn_now_ns();
  if (++R.launches_since_flush >= MN_FLUSH_EVERY || (now > R.last_flush_ns && now - R.last_flush_ns > MN_FLUSH_NS))
    mn_flush(1, 0);
}

/* ---------------------------------------------------------------------------------------------- */
/* recording one instance                                                                         */

/* sum: the prologue's checksum of `before`, valid once sum_ready (set by the thread writing the prologue) */
typedef struct blob { uint64_t addr, size; uint32_t space; uint8_t *before; uint64_t sum; int sum_ready; } blob;
typedef struct varsnap { mn_gvar *v; uint8_t *data; uint32_t nrelocs; mn_reloc *relocs; } varsnap;

typedef struct snapshot_set {
  blob *blobs;
  size_t nblobs;
  varsnap *vars;
  size_t nvars;
  uint64_t blob_bytes;
  int unrestorable; /* a variable the kernel may reach could not be read: its state cannot be written back */
} snapshot_set;

static void set_free(snapshot_set *s) {
  for (size_t i = 0; i < s->nblobs; i++) mn_snap_free(s->blobs[i].before);
  for (size_t i = 0; i < s->nvars; i++) {
    free(s->vars[i].data);
    free(s->vars[i].relocs);
  }
  free(s->blobs);
  free(s->vars);
  memset(s, 0, sizeof *s);
}

/* The recorder's own time per recorded instance, by what it was spent on (logged with the instance). */
static struct { uint64_t copy, copy_bytes; } T;
typedef struct rec_time { uint64_t copy, copy_bytes, diff, write, retime, hidden, other, total; } rec_time;

static int read_blob(const blob *b, uint8_t *dst) {
  uint64_t t0 = mn_precise_ns();
  int rc = 0;
  if (b->space == MN_SPACE_HOST_PINNED) memcpy(dst, (const void *)(uintptr_t)b->addr, b->size);
  else rc = mn_copy_dtoh(dst, b->addr, b->size);
  T.copy += mn_precise_ns() - t0;
  T.copy_bytes += b->size;
  return rc;
}

static int collect_blobs(snapshot_set *s) {
  size_t n = (R.arena_state > 0 ? R.dev.nlive : 0) + (R.host_state > 0 ? R.host.nlive : 0) + mn_placed_count();
  s->blobs = calloc(n ? n : 1, sizeof *s->blobs);
  if (!s->blobs) return -1;
  for (size_t i = 0; i < mn_placed_count(); i++) { /* managed and app-registered host memory (managed.c) */
    blob *b = &s->blobs[s->nblobs++];
    b->addr = mn_placed_at(i)->addr;
    b->size = mn_placed_at(i)->size;
    b->space = mn_placed_at(i)->space;
  }
  for (size_t i = 0; R.arena_state > 0 && i < R.dev.nlive; i++) {
    blob *b = &s->blobs[s->nblobs++];
    b->addr = R.dev.live[i].addr;
    b->size = R.dev.live[i].size;
    b->space = MN_SPACE_DEVICE;
  }
  for (size_t i = 0; R.host_state > 0 && i < R.host.nlive; i++) {
    blob *b = &s->blobs[s->nblobs++];
    b->addr = R.host.live[i].addr;
    b->size = R.host.live[i].size;
    b->space = MN_SPACE_HOST_PINNED;
  }
  for (size_t i = 0; i < s->nblobs; i++) {
    s->blobs[i].before = mn_snap_alloc(s->blobs[i].size);
    if (!s->blobs[i].before || read_blob(&s->blobs[i], s->blobs[i].before)) return -1;
    s->blob_bytes += s->blobs[i].size;
  }
  return 0;
}

static int read_var(const mn_gvar *v, uint8_t *dst) {
  uint64_t t0 = mn_precise_ns();
  int rc = D.memcpyDtoH(dst, (CUdeviceptr)v->addr, v->size) == CUDA_SUCCESS ? 0 : -1;
  T.copy += mn_precise_ns() - t0;
  T.copy_bytes += v->size;
  return rc;
}

/* Words of a variable that hold addresses: of another variable (relocated by replay) or of arena/pinned
 * memory (placed at the same address by replay: target NULL). */
static int find_relocs(varsnap *vs, uint8_t *use) {
  const mn_gvar *v = vs->v;
  if (v->addr % 8 || v->size < 8) return 0;
  uint32_t cap = 0;
  for (uint64_t o = 0; o + 8 <= v->size; o += 8) {
    uint64_t w;
    memcpy(&w, vs->data + o, 8);
    if (!w) continue;
    const mn_gvar *t = mn_var_containing(w);
    int in_blob = !t && mn_is_recorded_memory(w);
    if (!t && !in_blob) continue;
    if (vs->nrelocs == cap) {
      cap = cap ? cap * 2 : 4;
      mn_reloc *n = realloc(vs->relocs, cap * sizeof *n);
      if (!n) return -1;
      vs->relocs = n;
    }
    mn_reloc *r = &vs->relocs[vs->nrelocs++];
    r->offset = o;
    r->target = t ? t->name : NULL;
    r->target_offset = t ? w - t->addr : 0;
    if (t) use[t - R.vars] = 1;
  }
  return 0;
}

/* The variables the kernel's IR uses (all of them without IR), closed over relocation targets. */
static int collect_vars(const mn_kernel *k, snapshot_set *s) {
  if (!R.nvars) return 0;
  uint8_t *use = calloc(R.nvars, 1), *done = calloc(R.nvars, 1);
  s->vars = calloc(R.nvars, sizeof *s->vars);
  int rc = 0;
  if (!use || !done || !s->vars) rc = -1;
  for (size_t i = 0; !rc && i < R.nvars; i++) {
    if (!k->tab) {
      use[i] = 1;
      continue;
    }
    for (uint32_t j = 0; j < k->tab->nvars; j++)
      if (strcmp(k->tab->vars[j], R.vars[i].name) == 0) use[i] = 1;
  }
  for (int again = 1; !rc && again;) {
    again = 0;
    for (size_t i = 0; !rc && i < R.nvars; i++) {
      mn_gvar *v = &R.vars[i];
      if (!use[i] || done[i]) continue;
      done[i] = 1;
      if (v->resolved <= 0 || v->managed || v->size == 0) {
        if (v->size) s->unrestorable = 1;
        continue;
      }
      varsnap *vs = &s->vars[s->nvars];
      vs->v = v;
      vs->data = malloc(v->size);
      if (!vs->data) { rc = -1; break; }
      if (read_var(v, vs->data)) {
        free(vs->data);
        vs->data = NULL;
        s->unrestorable = 1;
        continue;
      }
      s->nvars++;
      if (find_relocs(vs, use)) rc = -1;
      again = 1;
    }
  }
  free(use);
  free(done);
  return rc;
}

static void snap_path(char *out, size_t cap, const mn_inst *i, const char *kind) {
  snprintf(out, cap, "%s/r%d-p%ld-i%u.%s", R.cfg.dir, R.cfg.rank < 0 ? 0 : R.cfg.rank, (long)getpid(), i->id, kind);
}

static const char *basename_of(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

/* args: the argument bytes; annots: the annotations at the launch; tx NULL: no texture objects. */
static int write_prologue(const char *path, const mn_kernel *k, snapshot_set *s, const uint8_t *args,
                          const mn_annot *annots, size_t nannots, const mn_texset *tx, uint64_t *bytes) {
  mn_writer *w = mn_writer_open(path, MN_PROLOGUE);
  if (!w) return -1;
  int rc = 0;
  for (size_t i = 0; !rc && i < s->nblobs; i++) {
    blob *b = &s->blobs[i];
    rc = mn_writer_blob(w, b->addr, b->size, b->space, b->before);
    if (!rc) {
      b->sum = mn_writer_last_checksum(w);
      __atomic_store_n(&b->sum_ready, 1, __ATOMIC_RELEASE);
    }
  }
  for (size_t i = 0; !rc && i < s->nvars; i++) {
    const varsnap *v = &s->vars[i];
    rc = mn_writer_var(w, v->v->name, v->v->addr, v->v->size, (uint32_t)v->v->is_const, v->data, v->nrelocs, v->relocs);
  }
  if (!rc) rc = mn_writer_args(w, k->nparams, k->poff, k->psize, k->argbytes, args);
  for (size_t i = 0; !rc && i < nannots; i++) rc = mn_writer_annot(w, &annots[i]);
  if (!rc && tx && !tx->why[0]) rc = mn_tex_write(w, tx, 1);
  if (rc) {
    mn_writer_abort(w);
    return -1;
  }
  *bytes = mn_writer_bytes(w);
  return mn_writer_close(w);
}

static int write_epilogue(const char *path, const snapshot_set *s, const mn_texset *tx, uint64_t *bytes) {
  mn_writer *w = mn_writer_open(path, MN_EPILOGUE);
  if (!w) return -1;
  int rc = 0;
  uint64_t maxsize = 0;
  for (size_t i = 0; i < s->nblobs; i++)
    if (s->blobs[i].size > maxsize) maxsize = s->blobs[i].size;
  uint8_t *after = maxsize ? mn_snap_alloc(maxsize) : NULL;
  if (maxsize && !after) rc = -1;
  for (size_t i = 0; !rc && i < s->nblobs; i++) {
    const blob *b = &s->blobs[i];
    rc = read_blob(b, after);
    /* an unchanged blob reuses the prologue's checksum when the prologue got that far already */
    if (!rc && __atomic_load_n(&b->sum_ready, __ATOMIC_ACQUIRE))
      rc = mn_writer_blob_epilogue_sum(w, b->addr, b->size, b->space, b->before, b->sum, after,
                                       R.cfg.epilogue_format, MN_MERGE_GAP);
    else if (!rc)
      rc = mn_writer_blob_epilogue(w, b->addr, b->size, b->space, b->before, after, R.cfg.epilogue_format, MN_MERGE_GAP);
  }
  mn_snap_free(after);
  for (size_t i = 0; !rc && i < s->nvars; i++) {
    const varsnap *v = &s->vars[i];
    uint8_t *data = malloc(v->v->size);
    rc = !data || read_var(v->v, data);
    if (!rc) rc = mn_writer_var(w, v->v->name, v->v->addr, v->v->size, (uint32_t)v->v->is_const, data, v->nrelocs, v->relocs);
    free(data);
  }
  if (!rc && !tx->why[0]) rc = mn_tex_write(w, tx, 0);
  if (rc) {
    mn_writer_abort(w);
    return -1;
  }
  *bytes = mn_writer_bytes(w);
  return mn_writer_close(w);
}

/* ---- the prologue, written on a thread of its own while the app thread goes on with the timing runs,
 * the recorded launch and the epilogue (which only read the prologue's buffers). record() joins it
 * before it returns, so no snapshot work outlives the instance: every exit and crash path sees the
 * same files as without the thread (complete ones, or a torn one that no instance event names and
 * that reads as truncated). The thread blocks the asynchronous signals, which stay the app's. */

/* What the prologue is written from: the instance's own copies (the app thread goes on meanwhile). */
typedef struct pro_job {
  const char *path;
  const mn_kernel *k;
  snapshot_set *s;
  uint8_t *args;        /* the argument bytes */
  mn_annot *annots;     /* the annotations at the launch */
  size_t nannots;
  const mn_texset *tx;  /* NULL: none (a prologue with textures is written before the launch) */
  uint64_t bytes, io_ns, wall_ns;
  int rc;
  char err[1024];
} pro_job;

/* One recorded instance from its prologue to its instance event. With the prologue on its own thread
 * the event waits in P until that thread is done: record() returns at once and the app goes on while
 * the prologue is written; the next record() (so at most one instance's buffers are held), a flush
 * that finds it done, the exit paths and a context's teardown finish it (mn_record_settle), and a
 * fatal signal waits for it (mn_record_settle_signal) so that a crash loses no instance whose files
 * could be completed. */
typedef struct pending {
  pro_job job;
  pthread_t thread;
  int threaded;
  int done;             /* the prologue's thread finished (release store) */
  int taken;            /* the event was finished and written, by mn_record_settle or the signal handler */
  char pro[4352], epi[4352];
  snapshot_set s;
  mn_kernel *k;
  mn_inst *inst;
  uint64_t epi_bytes;
  rec_time rt;          /* the instance's split without the prologue's figures */
  char *buf;            /* the instance event (begin_event) */
  mn_line l;
} pending;

static pending *P;

static void run_pro_job(pro_job *j) {
  uint64_t t0 = mn_precise_ns(), io0 = mn_snapshot_io_ns();
  j->rc = write_prologue(j->path, j->k, j->s, j->args, j->annots, j->nannots, j->tx, &j->bytes);
  if (j->rc) snprintf(j->err, sizeof j->err, "%s", mn_last_error());
  j->io_ns = mn_snapshot_io_ns() - io0; /* per thread: this thread's writes */
  j->wall_ns = mn_precise_ns() - t0;
}

static void *pro_thread(void *p) {
  pending *pr = (pending *)p;
  run_pro_job(&pr->job);
  __atomic_store_n(&pr->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* 1 when the thread runs; 0: nothing started (the caller writes the prologue itself). */
static int start_pro_job(pending *pr) {
  sigset_t all, old;
  sigfillset(&all);
  static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
  for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) sigdelset(&all, faults[i]);
  if (pthread_sigmask(SIG_SETMASK, &all, &old) != 0) return 0;
  int ok = pthread_create(&pr->thread, NULL, pro_thread, pr) == 0;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return ok;
}

static void mask_ranges(const uint8_t *mask, uint32_t n, uint64_t *off, uint64_t *len, size_t *count, size_t cap) {
  *count = 0;
  for (uint32_t i = 0; i < n && *count < cap;) {
    if (!mask[i]) { i++; continue; }
    uint32_t j = i;
    while (j < n && mask[j]) j++;
    off[*count] = i;
    len[*count] = j - i;
    (*count)++;
    i = j;
  }
}

/* The context's limits at the launch (CUlimit id, value): the device heap size, the device runtime's
 * pending-launch count and sync depth, the stack and printf FIFO sizes. Replay sets the same ones. */
static void log_limits(mn_line *l) {
  static const CUlimit which[] = {CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE, CU_LIMIT_MALLOC_HEAP_SIZE,
                                  CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT};
  uint64_t ids[5], vals[5];
  size_t n = 0;
  for (size_t i = 0; D.ctxGetLimit && i < 5; i++) {
    size_t v = 0;
    if (D.ctxGetLimit(&v, which[i]) != CUDA_SUCCESS) continue;
    ids[n] = (uint64_t)which[i];
    vals[n++] = (uint64_t)v;
  }
  if (n) mn_line_pairs(l, "limits", ids, vals, n);
}

/* The instance event up to the prologue's figures, into pr->l (finished by finish_event when the
 * prologue is on disk); 0 when out of memory. */
static int begin_event(pending *pr, const mn_launch *L, const mn_kernel *k, const mn_inst *inst, const argscan *a,
                       const char *pro, const char *epi, uint64_t t_ns, const uint64_t *retimes, uint32_t nretimes,
                       const mn_texset *tx) {
  const snapshot_set *s = &pr->s;
  size_t cap = 8192 + 2 * (size_t)k->argbytes + 48 * (size_t)k->nparams + 64 * (size_t)k->argbytes / 8;
  char *buf = malloc(cap);
  uint64_t *po = malloc((k->nparams + 1) * sizeof *po), *ps = malloc((k->nparams + 1) * sizeof *ps);
  size_t nr = k->argbytes / 8 + 1;
  uint64_t *mo = malloc(nr * sizeof *mo), *ml = malloc(nr * sizeof *ml);
  int ok = buf && po && ps && mo && ml;
  if (ok) {
    for (uint32_t i = 0; i < k->nparams; i++) {
      po[i] = k->poff[i];
      ps[i] = k->psize[i];
    }
    size_t nm;
    mask_ranges(a->mask, k->argbytes, mo, ml, &nm, nr);
    uint64_t fk[32];
    for (size_t i = 0; i < a->nforeign; i++) fk[i] = a->fkind[i];
    mn_line *l = &pr->l;
    mn_line_begin(l, buf, cap, "inst");
    mn_line_u64(l, "k", k->id);
    mn_line_u64(l, "i", inst->id);
    mn_line_str(l, "api", L->api);
    mn_line_u32s(l, "grid", L->grid, 3);
    mn_line_u32s(l, "block", L->block, 3);
    mn_line_u64(l, "shmem", L->shmem);
    if (L->cluster[0]) mn_line_u32s(l, "cluster", L->cluster, 3);
    if (L->coop) mn_line_u64(l, "coop", 1);
    if (L->nother) mn_line_u32s(l, "attrs", L->other, L->nother);
    mn_line_pairs(l, "params", po, ps, k->nparams);
    mn_line_hex(l, "args", a->bytes, k->argbytes);
    mn_line_pairs(l, "ptr", mo, ml, nm);
    mn_line_str(l, "ptr_src", a->from_ir ? "ir" : "value");
    if (a->nforeign) mn_line_pairs(l, "foreign", a->foff, fk, a->nforeign);
    if (a->ntex) mn_line_u64s(l, "tex", a->toff, a->ntex);
    mn_placed_log(l);
    if (a->ntex) mn_line_u64(l, "texobjs", tx->why[0] ? 0 : tx->nobjs);
    if (a->ntex) mn_line_u64(l, "arrays", tx->why[0] ? 0 : tx->narrays);
    if (tx->why[0]) mn_line_str(l, "tex_why", tx->why);
    mn_line_str(l, "pro", pro);
    mn_line_str(l, "epi", epi);
    mn_line_u64(l, "t_ns", t_ns);
    if (nretimes) mn_line_u64s(l, "rt", retimes, nretimes);
    mn_line_u64(l, "blobs", s->nblobs);
    mn_line_u64(l, "blob_bytes", s->blob_bytes);
    mn_line_u64(l, "vars", s->nvars);
    mn_line_u64(l, "epi_bytes", pr->epi_bytes);
    log_limits(l);
    pr->buf = buf;
  } else {
    free(buf);
  }
  free(po);
  free(ps);
  free(mo);
  free(ml);
  return ok;
}

/* The prologue's figures and the time split; async-signal-safe (the fatal-signal path finishes the
 * event of a prologue that completed while the app was dying). */
static void finish_event(pending *pr, uint64_t wait_ns) {
  const pro_job *j = &pr->job;
  rec_time rt = pr->rt;
  rt.write += j->io_ns;
  rt.diff += j->wall_ns - j->io_ns;
  rt.hidden = pr->threaded && j->wall_ns > wait_ns ? j->wall_ns - wait_ns : 0;
  mn_line *l = &pr->l;
  mn_line_u64(l, "pro_bytes", j->bytes);
  /* the recorder's own time for this instance (ns): copies from the device (and their bytes),
   * checksums/diffs/encoding and disk writes (work on both threads), timing reruns, the prologue work
   * the app did not wait for, the rest, the wait for this prologue at the next instance or at exit, and
   * all of record(): copy + diff + write + retime + other + the kernel - hidden = record + wait */
  mn_line_u64(l, "t_copy", rt.copy);
  mn_line_u64(l, "copy_bytes", rt.copy_bytes);
  mn_line_u64(l, "t_diff", rt.diff);
  mn_line_u64(l, "t_write", rt.write);
  mn_line_u64(l, "t_retime", rt.retime);
  mn_line_u64(l, "t_hidden", rt.hidden);
  mn_line_u64(l, "t_other", rt.other);
  mn_line_u64(l, "t_wait", wait_ns);
  mn_line_u64(l, "t_record", rt.total);
}

/* ---- in-app timing of a recorded instance -------------------------------------------------------
 * One cold launch is a poor measure of the kernel (GPU clocks still ramping, caches cold), so before
 * the recorded launch the app's own kernel is run MNEME_RETIME more times on the prologue state, each
 * timed, with the prologue written back after each run; the recorded launch then starts from exactly
 * the prologue. Every timed launch waits behind a host flag (cuStreamWaitValue32) released only once
 * the start event, the launch and the end event are queued, so host launch latency stays out of the
 * timing, as in the replay core: native/hold, with its growing flag and its watchdog (MNEME_RECORD_HOLD,
 * MNEME_RECORD_HOLD_MS); the functions are loaded before (function_of), and a hold the watchdog released
 * leaves that launch untimed, turns holds off for the rest of the run, warns, and counts in the exit
 * event's holds_broken. */

static int hold_ready(void) {
  if (!R.hold.state) {
    static int warned;
    mn_hold_calls c = hold_calls();
    const char *why = mn_hold_setup(&R.hold, &c, R.cfg.hold != 0, R.cfg.hold_ms);
    if (why) mn_warn_once(&warned, "timed launches are not held (host launch latency is timed)", why);
  }
  return mn_hold_on(&R.hold);
}

/* Raises the flag of the current hold; 1 when the watchdog had to (the launch is then not timed). */
static int release_hold(const mn_kernel *k) {
  if (!mn_hold_release(&R.hold)) return 0;
  static int warned;
  char why[1024];
  snprintf(why, sizeof why,
           "%s: a timed launch stayed held for more than %llu ms (the driver waited for the held stream inside the "
           "launch); the watchdog released it, its time is not counted and timed launches are no longer held "
           "(MNEME_RECORD_HOLD_MS)", k->name, (unsigned long long)R.hold.ms);
  mn_warn_once(&warned, "hold_broken", why);
  return 1;
}

/* Launches once, timed with events; fills the launch status, the status after synchronizing, and ns (0:
 * not timed). Everything that may call the driver comes before the hold: only the launch and two event
 * records follow it. */
static void held_launch(const mn_launch *L, const mn_kernel *k, CUresult *r, CUresult *after, uint64_t *ns) {
  *ns = 0;
  CUevent e0 = ev_get(), e1 = e0 ? ev_get() : NULL;
  if (hold_ready()) mn_hold_begin(&R.hold, L->ev_stream);
  int started = e1 && D.eventRecord(e0, L->ev_stream) == CUDA_SUCCESS;
  *r = fire(L);
  int timed = started && *r == CUDA_SUCCESS && D.eventRecord(e1, L->ev_stream) == CUDA_SUCCESS;
  if (release_hold(k)) timed = 0; /* always released, whatever happened above */
  *after = *r == CUDA_SUCCESS ? D.ctxSynchronize() : *r;
  if (*after == CUDA_SUCCESS && timed) elapsed_ns(e0, e1, ns);
  ev_put(e0);
  ev_put(e1);
}

/* Writes the prologue back: blobs and variables as they were before the kernel ran. */
static int restore_prologue(const snapshot_set *s) {
  for (size_t i = 0; i < s->nblobs; i++) {
    const blob *b = &s->blobs[i];
    if (b->space == MN_SPACE_HOST_PINNED) {
      memcpy((void *)(uintptr_t)b->addr, b->before, b->size);
    } else if (mn_copy_htod(b->addr, b->before, b->size)) {
      return -1;
    }
  }
  for (size_t i = 0; i < s->nvars; i++) {
    const varsnap *v = &s->vars[i];
    if (D.memcpyHtoD((CUdeviceptr)v->v->addr, v->data, v->v->size) != CUDA_SUCCESS) return -1;
  }
  return D.ctxSynchronize() == CUDA_SUCCESS ? 0 : -1;
}

/* Extra timed launches on the prologue state (see above); returns how many were timed. A failure
 * stops the retiming and, if the prologue cannot be written back, disables it for good. */
static uint32_t retime(const mn_launch *L, mn_kernel *k, const snapshot_set *s, uint64_t *out) {
  uint32_t n = R.cfg.retime < MN_RETIME_MAX ? R.cfg.retime : MN_RETIME_MAX, got = 0;
  uint64_t budget = R.cfg.retime_budget_ns, t0 = mn_precise_ns();
  /* a kernel whose last recorded launch alone took the whole budget is not rerun at all */
  if (budget && k->last_run_ns >= budget) return 0;
  for (uint32_t i = 0; i < n; i++) {
    if (budget && i && mn_precise_ns() - t0 >= budget) break; /* the time bound comes first */
    CUresult r, after;
    uint64_t ns;
    held_launch(L, k, &r, &after, &ns);
    if (r != CUDA_SUCCESS || after != CUDA_SUCCESS) break;
    if (ns) out[got++] = ns;
    if (restore_prologue(s)) {
      R.cfg.retime = 0;
      mn_error("cannot write the prologue back after a timing run; retiming is off", L->api);
      break;
    }
  }
  return got;
}

/* Records a new instance: synchronize, prologue, timed launch, synchronize, epilogue. Returns the
 * launch's result; on a recording failure the launch still happens exactly once. */
/* Ends a recorded instance: its instance event once the prologue is on disk, or the cleanup of one
 * whose prologue failed; frees its buffers. Called with R.mu held. */
static void settle(pending *pr) {
  uint64_t t0 = mn_precise_ns();
  if (pr->threaded) pthread_join(pr->thread, NULL);
  uint64_t wait = pr->threaded ? mn_precise_ns() - t0 : 0;
  mn_inst *inst = pr->inst;
  if (pr->job.rc) {
    char why[4352 + 1152];
    snprintf(why, sizeof why, "%s: %s", pr->pro, pr->job.err);
    unlink(pr->pro);
    unlink(pr->epi);
    R.incomplete = 1;
    mn_error("cannot write a prologue; no further instances are recorded", why);
    mn_kernel_skip(pr->k, MN_SKIP_FAILED);
    pr->k->ninst_recorded--;
    pr->k->recorded_launches -= inst->count;
    inst->recorded = 0;
  } else if (!__atomic_exchange_n(&pr->taken, 1, __ATOMIC_ACQ_REL)) {
    finish_event(pr, wait);
    mn_log_event(&pr->l);
    R.stored_bytes += pr->job.bytes + pr->epi_bytes;
    __atomic_store_n(&inst->logged, 1, __ATOMIC_RELEASE);
  }
  set_free(&pr->s);
  free(pr->job.args);
  free(pr->job.annots);
  free(pr->buf);
  free(pr);
}

void mn_record_settle(int wait) {
  pending *pr = P;
  if (!pr || (!wait && !__atomic_load_n(&pr->done, __ATOMIC_ACQUIRE))) return;
  __atomic_store_n(&P, NULL, __ATOMIC_RELEASE);
  settle(pr);
}

void mn_record_settle_signal(void) {
  pending *pr = __atomic_load_n(&P, __ATOMIC_ACQUIRE);
  if (!pr || pthread_equal(pthread_self(), pr->thread)) return;
  uint64_t waited = 0;
  struct timespec ms = {0, 1000000};
  for (; waited < 60000 && !__atomic_load_n(&pr->done, __ATOMIC_ACQUIRE); waited++) nanosleep(&ms, NULL);
  if (!__atomic_load_n(&pr->done, __ATOMIC_ACQUIRE) || pr->job.rc || __atomic_exchange_n(&pr->taken, 1, __ATOMIC_ACQ_REL))
    return;
  finish_event(pr, waited * 1000000ull);
  size_t n = mn_line_end(&pr->l);
  if (n && mn_log_write(&R.log, pr->l.buf, n)) R.incomplete = 1;
  __atomic_store_n(&pr->inst->logged, 1, __ATOMIC_RELEASE);
}

static CUresult drop(pending *pr, mn_texset *tx, CUresult r) {
  mn_tex_free(tx);
  set_free(&pr->s);
  free(pr->job.args);
  free(pr->job.annots);
  free(pr->buf);
  free(pr);
  return r;
}

/* Records a new instance: synchronize, prologue, timed launch, synchronize, epilogue. Returns the
 * launch's result; on a recording failure the launch still happens exactly once. */
static CUresult record(const mn_launch *L, mn_kernel *k, mn_inst *inst, const argscan *a) {
  mn_record_settle(1); /* the previous instance's prologue first: its buffers go back to the pool */
  uint64_t t_start = mn_precise_ns();
  memset(&T, 0, sizeof T);
  CUresult sync = D.ctxSynchronize();
  if (sync != CUDA_SUCCESS) {
    mn_kernel_skip(k, MN_SKIP_PENDING_ERROR);
    return fire(L);
  }
  mn_drain_deferred_frees();
  mn_texset tx;
  memset(&tx, 0, sizeof tx);
  pending *pr = calloc(1, sizeof *pr);
  if (!pr) {
    mn_error("out of host memory recording an instance", k->name);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return fire(L);
  }
  snapshot_set *s = &pr->s;
  char *pro = pr->pro, *epi = pr->epi, why[4352 + 1152];
  snap_path(pro, sizeof pr->pro, inst, "prologue");
  snap_path(epi, sizeof pr->epi, inst, "epilogue");
  if (a->ntex && mn_tex_capture(a->bytes, a->toff, a->ntex, &tx)) mn_tex_free(&tx); /* tx.why says why */
  if (collect_blobs(s) || collect_vars(k, s)) {
    mn_error("cannot read the device memory for a prologue (out of host memory?)", k->name);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return drop(pr, &tx, fire(L));
  }
  pro_job *pj = &pr->job;
  pj->path = pro, pj->k = k, pj->s = s, pj->tx = a->ntex ? &tx : NULL, pj->nannots = R.nannots;
  pj->args = malloc(k->argbytes + 1u);
  pj->annots = malloc((R.nannots + 1) * sizeof *pj->annots);
  if (!pj->args || !pj->annots) {
    mn_error("out of host memory recording an instance", k->name);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return drop(pr, &tx, fire(L));
  }
  memcpy(pj->args, a->bytes, k->argbytes);
  if (R.nannots) memcpy(pj->annots, R.annots, R.nannots * sizeof *pj->annots);
  /* texture arrays are reread after the launch (mn_tex_reread): their prologue is written first */
  pr->threaded = R.cfg.snapshot_thread && !a->ntex && start_pro_job(pr);
  if (!pr->threaded) run_pro_job(pj);
  if (!pr->threaded && pj->rc) {
    snprintf(why, sizeof why, "%s: %s", pro, pj->err);
    unlink(pro);
    R.incomplete = 1;
    mn_error("cannot write a prologue; no further instances are recorded", why);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return drop(pr, &tx, fire(L));
  }
  uint64_t retimes[MN_RETIME_MAX];
  /* Rerunning is safe only when everything the kernel can reach is restored by the prologue: not for a
   * kernel without IR (the variables it reaches are unknown: at the driver API a module's variables are
   * seen only when the app asks for them, e.g. by cudaMemcpyFromSymbol after the launch), nor when a
   * variable could not be read. */
  uint64_t t_rt = mn_precise_ns();
  /* Nor for a kernel that allocates from the device heap or prints (kernel table): a rerun would allocate
   * again or print again, which no prologue undoes. */
  uint32_t nretimes =
      a->nforeign || a->ntex || !k->tab || k->tab->no_rerun || R.heap_live || s->unrestorable ? 0 : retime(L, k, s, retimes);
  t_rt = mn_precise_ns() - t_rt;
  uint64_t t_ns = 0;
  CUresult r, after;
  held_launch(L, k, &r, &after, &t_ns);
  if (t_ns) k->last_run_ns = t_ns;
  if (after != CUDA_SUCCESS) {
    if (pr->threaded) pthread_join(pr->thread, NULL);
    snprintf(why, sizeof why, "%s: %s", k->name, mn_cu_err(after));
    mn_error(r != CUDA_SUCCESS ? "the recorded launch failed" : "the recorded kernel failed", why);
    unlink(pro);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return drop(pr, &tx, r);
  }
  if (!tx.why[0] && mn_tex_reread(&tx)) mn_tex_free(&tx); /* the prologue has the objects: reported by tex_why */
  uint64_t t_epi = mn_precise_ns(), io_epi = mn_snapshot_io_ns(), copy_epi = T.copy;
  int epi_rc = write_epilogue(epi, s, &tx, &pr->epi_bytes);
  if (epi_rc) snprintf(why, sizeof why, "%s: %s", epi, mn_last_error());
  io_epi = mn_snapshot_io_ns() - io_epi;
  copy_epi = T.copy - copy_epi;
  t_epi = mn_precise_ns() - t_epi;
  if (epi_rc) {
    if (pr->threaded) pthread_join(pr->thread, NULL);
    unlink(pro);
    unlink(epi);
    R.incomplete = 1;
    mn_error("cannot write an epilogue; no further instances are recorded", why);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return drop(pr, &tx, r);
  }
  rec_time *rt = &pr->rt;
  rt->copy = T.copy;
  rt->copy_bytes = T.copy_bytes;
  /* the epilogue's share here; finish_event adds the prologue's (on whichever thread wrote it) */
  rt->write = io_epi;
  rt->diff = t_epi > io_epi + copy_epi ? t_epi - io_epi - copy_epi : 0;
  rt->retime = t_rt;
  rt->total = mn_precise_ns() - t_start;
  /* the rest: synchronizing, pinned allocations, variables, textures (not the kernel itself) */
  uint64_t known = rt->retime + rt->copy + rt->write + rt->diff + t_ns + (pr->threaded ? 0 : pj->wall_ns);
  rt->other = rt->total > known ? rt->total - known : 0;
  inst->recorded = 1;
  inst->count = 1;
  inst->flushed_count = 1;
  k->ninst_recorded++;
  k->recorded_launches++;
  pr->k = k;
  pr->inst = inst;
  if (!begin_event(pr, L, k, inst, a, basename_of(pro), basename_of(epi), t_ns, retimes, nretimes, &tx))
    mn_error("out of memory writing an instance event", k->name);
  if (!pr->buf) {
    if (pr->threaded) pthread_join(pr->thread, NULL);
    return drop(pr, &tx, r);
  }
  mn_tex_free(&tx); /* a prologue with textures was written on this thread, before the launch */
  if (pr->threaded) __atomic_store_n(&P, pr, __ATOMIC_RELEASE); /* finished later: mn_record_settle */
  else settle(pr);
  return r;
}

/* MN_CAPTURE_* (select.h): a failed query is a capture elsewhere only when the driver says so; after a
 * kernel faulted every query fails with the context's error, which is no capture. */
static int capture_state(CUstream s) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = D.streamIsCapturing(s, &st);
  return mn_capture_verdict((int)r, r == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE);
}

/* The argument bytes, from kernelParams or from extra's CU_LAUNCH_PARAM_BUFFER_POINTER; 0 when absent. */
static int copy_args(const mn_launch *L, const mn_kernel *k, uint8_t *bytes) {
  if (L->params) {
    for (uint32_t i = 0; i < k->nparams; i++)
      if (L->params[i]) memcpy(bytes + k->poff[i], L->params[i], k->psize[i]);
    return 1;
  }
  const void *buf = NULL;
  size_t size = 0;
  for (size_t i = 0; L->extra && L->extra[i] != CU_LAUNCH_PARAM_END && i < 64; i += 2) {
    if (L->extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = L->extra[i + 1];
    else if (L->extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && L->extra[i + 1]) size = *(const size_t *)L->extra[i + 1];
  }
  if (!buf) return k->nparams == 0;
  memcpy(bytes, buf, size < k->argbytes ? size : k->argbytes);
  return 1;
}

static void skip(mn_launch *L, mn_kernel *k, int why) {
  L->skip = why;
  mn_kernel_skip(k, why);
}

static CUresult on_launch(mn_launch *L) {
  if (!R.active || R.broken) return fire(L);
  pthread_mutex_lock(&R.mu);
  CUresult r;
  mn_kernel *k = R.exited || !L->f ? NULL : mn_kernel_of(L->f);
  if (k && k->tab && k->tab->heap) R.heap_live = 1; /* selected or not: the heap now holds the app's objects */
  if (!k || !mn_kernel_selected(k) || !mn_arena_ready()) {
    pthread_mutex_unlock(&R.mu);
    return fire(L);
  }
  int cap = capture_state(L->ev_stream);
  if (cap == MN_CAPTURE_THIS) {
    /* becomes a kernel node of the graph being captured: counted (and recorded) when that graph is
     * launched (graph.c), not now */
    pthread_mutex_unlock(&R.mu);
    return fire(L);
  }
  k->launches++;
  k->stats_dirty = 1;
  CUdevice dev = -1;
  if (D.ctxGetDevice(&dev) != CUDA_SUCCESS) dev = -1;
  argscan a;
  memset(&a, 0, sizeof a);
  uint8_t *key = NULL;
  size_t keylen = 0;
  if (cap == MN_CAPTURE_CTX_ERROR) {
    skip(L, k, MN_SKIP_PENDING_ERROR);
  } else if (cap == MN_CAPTURE_ELSEWHERE || __atomic_load_n(&R.captures, __ATOMIC_ACQUIRE) > 0) {
    skip(L, k, MN_SKIP_CAPTURE_ELSEWHERE);
  } else if (dev != R.cudev) {
    skip(L, k, MN_SKIP_OTHER_DEVICE);
  } else if (!mn_kernel_layout(k, L->f)) {
    skip(L, k, MN_SKIP_NO_PARAM_INFO);
  } else {
    mn_resolve_vars(k);
    a.bytes = calloc(k->argbytes + 1, 1);
    a.mask = calloc(k->argbytes + 1, 1);
    if (a.bytes && a.mask && copy_args(L, k, a.bytes)) {
      scan_args(k, &a);
      key = make_key(L, k, &a, &keylen);
    }
    if (!key) skip(L, k, a.bytes && a.mask ? MN_SKIP_NO_PARAM_INFO : MN_SKIP_FAILED);
  }
  if (!key) {
    r = fire(L);
  } else {
    uint64_t h = fnv1a(key, keylen);
    mn_inst *inst = find_inst(k, key, keylen, h);
    if (inst) {
      free(key);
      if (inst->recorded) {
        r = fire_timed(L, inst);
        if (r == CUDA_SUCCESS) {
          inst->count++;
          k->recorded_launches++;
          L->counted = inst;
        }
      } else {
        skip(L, k, MN_SKIP_FAILED);
        r = fire(L);
      }
    } else if (k->launches <= R.cfg.skip) {
      free(key);
      skip(L, k, MN_SKIP_SKIPPED);
      r = fire(L);
    } else if (R.cfg.max_recordings > 0 && k->ninst_recorded >= (uint32_t)R.cfg.max_recordings) {
      free(key);
      skip(L, k, MN_SKIP_MAX_RECORDINGS);
      r = fire(L);
    } else if (R.incomplete) {
      free(key);
      skip(L, k, MN_SKIP_FAILED);
      r = fire(L);
    } else {
      inst = new_inst(k, key, keylen, h);
      if (!inst) {
        free(key);
        skip(L, k, MN_SKIP_FAILED);
        r = fire(L);
      } else {
        r = record(L, k, inst, &a);
        if (inst->recorded) L->counted = inst;
        mn_flush(0, 0);
      }
    }
  }
  free(a.bytes);
  free(a.mask);
  maybe_flush();
  pthread_mutex_unlock(&R.mu);
  return r;
}

/* ---------------------------------------------------------------------------------------------- */
/* launch entry points                                                                            */

static void init_launch(mn_launch *L, const char *api, int shape, const mn_ip_slot *s, CUfunction f, unsigned gx,
                        unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream st,
                        void **params, void **extra) {
  memset(L, 0, sizeof *L);
  L->api = api;
  L->shape = shape;
  L->real = s->real;
  L->f = f;
  L->grid[0] = gx, L->grid[1] = gy, L->grid[2] = gz;
  L->block[0] = bx, L->block[1] = by, L->block[2] = bz;
  L->shmem = shm;
  L->stream = st;
  L->ev_stream = mn_ip_stream(s, st);
  L->params = params;
  L->extra = extra;
  L->skip = -1;
}

CUresult mn_cu_launch_kernel(const mn_ip_slot *s, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned shm, CUstream st, void **params, void **extra) {
  mn_launch L;
  init_launch(&L, "cuLaunchKernel", SHAPE_LAUNCH, s, f, gx, gy, gz, bx, by, bz, shm, st, params, extra);
  return on_launch(&L);
}

CUresult mn_cu_launch_cooperative_kernel(const mn_ip_slot *s, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                         unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream st,
                                         void **params) {
  mn_launch L;
  init_launch(&L, "cuLaunchCooperativeKernel", SHAPE_COOP, s, f, gx, gy, gz, bx, by, bz, shm, st, params, NULL);
  L.coop = 1;
  return on_launch(&L);
}

CUresult mn_cu_launch_kernel_ex(const mn_ip_slot *s, const CUlaunchConfig *c, CUfunction f, void **params,
                                void **extra) {
  if (!c) return ((PFN_cuLaunchKernelEx_v11060)s->real)(c, f, params, extra);
  mn_launch L;
  init_launch(&L, "cuLaunchKernelEx", SHAPE_EX, s, f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX,
              c->blockDimY, c->blockDimZ, c->sharedMemBytes, c->hStream, params, extra);
  L.config = c;
  for (unsigned i = 0; c->attrs && i < c->numAttrs; i++) {
    const CUlaunchAttribute *at = &c->attrs[i];
    if (at->id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      L.cluster[0] = at->value.clusterDim.x;
      L.cluster[1] = at->value.clusterDim.y;
      L.cluster[2] = at->value.clusterDim.z;
    } else if (at->id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE) {
      L.coop = at->value.cooperative != 0;
    } else if (L.nother < sizeof L.other / sizeof L.other[0]) {
      L.other[L.nother++] = (uint32_t)at->id;
    }
  }
  return on_launch(&L);
}

/* Apps linked with -lcuda that call the launch functions by name (the runtime and everything that
 * asks cuGetProcAddress get the wrappers of driver.c instead). */
static mn_ip_slot direct_slot[6];

static const mn_ip_slot *direct(int i, const char *name, int version, int ptsz) {
  mn_ip_slot *s = &direct_slot[i];
  if (!__atomic_load_n(&s->real, __ATOMIC_ACQUIRE)) {
    void *p = dlsym(RTLD_NEXT, name);
    if (!p) p = mn_ip_real(name, version);
    s->ptsz = ptsz;
    __atomic_store_n(&s->real, p, __ATOMIC_RELEASE);
  }
  return s;
}

#define DIRECT_LAUNCH(sym, i, ptsz)                                                                        \
  MN_EXPORT CUresult sym(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,     \
                         unsigned bz, unsigned shm, CUstream st, void **params, void **extra) {             \
    const mn_ip_slot *s = direct(i, #sym, 4000, ptsz);                                                     \
    if (!s->real) return CUDA_ERROR_NOT_INITIALIZED;                                                       \
    mn_init();                                                                                             \
    return mn_cu_launch_kernel(s, f, gx, gy, gz, bx, by, bz, shm, st, params, extra);                     \
  }
#define DIRECT_COOP(sym, i, ptsz)                                                                          \
  MN_EXPORT CUresult sym(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,     \
                         unsigned bz, unsigned shm, CUstream st, void **params) {                           \
    const mn_ip_slot *s = direct(i, #sym, 9000, ptsz);                                                     \
    if (!s->real) return CUDA_ERROR_NOT_INITIALIZED;                                                       \
    mn_init();                                                                                             \
    return mn_cu_launch_cooperative_kernel(s, f, gx, gy, gz, bx, by, bz, shm, st, params);                \
  }
#define DIRECT_EX(sym, i, ptsz)                                                                            \
  MN_EXPORT CUresult sym(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {              \
    const mn_ip_slot *s = direct(i, #sym, 11060, ptsz);                                                    \
    if (!s->real) return CUDA_ERROR_NOT_INITIALIZED;                                                       \
    mn_init();                                                                                             \
    return mn_cu_launch_kernel_ex(s, c, f, params, extra);                                                \
  }
extern CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    CUstream, void **, void **);
extern CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
extern CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                               unsigned, CUstream, void **);
DIRECT_LAUNCH(cuLaunchKernel, 0, 0)
DIRECT_LAUNCH(cuLaunchKernel_ptsz, 1, 1)
DIRECT_COOP(cuLaunchCooperativeKernel, 2, 0)
DIRECT_COOP(cuLaunchCooperativeKernel_ptsz, 3, 1)
DIRECT_EX(cuLaunchKernelEx, 4, 0)
DIRECT_EX(cuLaunchKernelEx_ptsz, 5, 1)

/* ---------------------------------------------------------------------------------------------- */
/* kernel nodes of graphs run node by node (graph.c), and stream captures                         */

static mn_ip_slot graph_slot;

CUresult mn_launch_graph_kernel(CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shmem,
                                CUstream st, void **params, mn_inst **counted, int *why) {
  if (!__atomic_load_n(&graph_slot.real, __ATOMIC_ACQUIRE))
    __atomic_store_n(&graph_slot.real, mn_ip_real("cuLaunchKernel", 4000), __ATOMIC_RELEASE);
  if (!graph_slot.real) return CUDA_ERROR_NOT_FOUND;
  mn_launch L;
  init_launch(&L, "cuLaunchKernel", SHAPE_LAUNCH, &graph_slot, f, grid[0], grid[1], grid[2], block[0], block[1],
              block[2], shmem, st, params, NULL);
  CUresult r = on_launch(&L);
  *counted = L.counted;
  *why = L.skip;
  return r;
}

static void capture_begin(CUresult r) {
  if (r == CUDA_SUCCESS) __atomic_add_fetch(&R.captures, 1, __ATOMIC_RELEASE);
}

static void capture_end(CUresult r) {
  /* An invalidated capture still ends here; only "not capturing" leaves the count alone. */
  if (r == CUDA_ERROR_ILLEGAL_STATE || r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_INVALID_HANDLE ||
      r == CUDA_ERROR_NOT_INITIALIZED || r == CUDA_ERROR_INVALID_CONTEXT)
    return;
  int c = __atomic_load_n(&R.captures, __ATOMIC_ACQUIRE);
  while (c > 0 && !__atomic_compare_exchange_n(&R.captures, &c, c - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {}
}

CUresult mn_cu_stream_begin_capture(const mn_ip_slot *s, CUstream st, CUstreamCaptureMode mode) {
  CUresult r = ((PFN_cuStreamBeginCapture_v10010)s->real)(st, mode);
  capture_begin(r);
  return r;
}

/* The CUDA 10.0 ABI: no mode (the driver captures in global mode). */
CUresult mn_cu_stream_begin_capture_v1(const mn_ip_slot *s, CUstream st) {
  CUresult r = ((PFN_cuStreamBeginCapture_v10000)s->real)(st);
  capture_begin(r);
  return r;
}

CUresult mn_cu_stream_begin_capture_to_graph(const mn_ip_slot *s, CUstream st, CUgraph g, const CUgraphNode *deps,
                                             const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode) {
  CUresult r = ((PFN_cuStreamBeginCaptureToGraph_v12030)s->real)(st, g, deps, data, n, mode);
  capture_begin(r);
  return r;
}

CUresult mn_cu_stream_end_capture(const mn_ip_slot *s, CUstream st, CUgraph *g) {
  CUresult r = ((PFN_cuStreamEndCapture_v10000)s->real)(st, g);
  capture_end(r);
  return r;
}
