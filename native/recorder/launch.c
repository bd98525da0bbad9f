/* librecord's launches: every launch path of the runtime is interposed; a launch of a selected kernel is
 * either recorded (a new instance: prologue, timed launch, epilogue), counted and timed (a launch of an
 * instance recorded before), or counted as not recorded with the reason (mn_skip).
 *
 * An instance is the kernel with its grid, block, dynamic shared memory, launch attributes and its
 * argument bytes with the pointer bytes masked out; `mneme record` computes the official dynamic hash
 * from the same fields (mneme/record/hashing.py), with the mask logged here. */
#include "state.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MN_EXPORT __attribute__((visibility("default")))
#define MN_MAX_PENDING 8192
#define MN_FLUSH_EVERY 4096
#define MN_FLUSH_NS 1000000000ull

typedef cudaError_t (*func_launch_t)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
typedef cudaError_t (*handle_launch_t)(cudaKernel_t, dim3, dim3, void **, size_t, cudaStream_t);
typedef cudaError_t (*ex_launch_t)(const cudaLaunchConfig_t *, const void *, void **);

enum { SHAPE_FUNC, SHAPE_HANDLE, SHAPE_EX };

typedef struct mn_launch {
  const char *api;
  int shape;
  void *real;
  const void *func;                 /* host stub (FUNC, EX) */
  cudaKernel_t handle;              /* HANDLE */
  const cudaLaunchConfig_t *config; /* EX */
  dim3 grid, block;
  size_t shmem;
  cudaStream_t stream;              /* as the app passed it */
  cudaStream_t ev_stream;           /* the same stream, with the per-thread default stream made explicit */
  void **args;
  uint32_t cluster[3];
  uint32_t coop;
  uint32_t nother;                  /* launch attributes not replayed, by id */
  uint32_t other[16];
} mn_launch;

static cudaError_t fire(const mn_launch *L) {
  switch (L->shape) {
    case SHAPE_FUNC: return ((func_launch_t)L->real)(L->func, L->grid, L->block, L->args, L->shmem, L->stream);
    case SHAPE_HANDLE: return ((handle_launch_t)L->real)(L->handle, L->grid, L->block, L->args, L->shmem, L->stream);
    default: return ((ex_launch_t)L->real)(L->config, L->func, L->args);
  }
}

/* ---------------------------------------------------------------------------------------------- */
/* driver calls that leave the runtime's last-error state alone                                   */

static struct {
  int loaded;
  CUresult (*eventQuery)(CUevent);
  CUresult (*eventSynchronize)(CUevent);
  CUresult (*eventElapsed)(float *, CUevent, CUevent);
  CUresult (*funcGetParamInfo)(CUfunction, size_t, size_t *, size_t *);
  CUresult (*funcIsLoaded)(CUfunctionLoadingState *, CUfunction);
  CUresult (*funcLoad)(CUfunction);
  CUresult (*funcGetName)(const char **, CUfunction);
  CUresult (*kernelGetFunction)(CUfunction *, CUkernel);
  CUresult (*kernelGetName)(const char **, CUkernel);
  CUresult (*streamWaitValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
} D;

static void load_driver(void) {
  if (D.loaded) return;
  D.loaded = 1;
  D.eventQuery = (__typeof__(D.eventQuery))mn_driver("cuEventQuery", 2000);
  D.eventSynchronize = (__typeof__(D.eventSynchronize))mn_driver("cuEventSynchronize", 2000);
  D.eventElapsed = (__typeof__(D.eventElapsed))mn_driver("cuEventElapsedTime", 2000);
  D.funcGetParamInfo = (__typeof__(D.funcGetParamInfo))mn_driver("cuFuncGetParamInfo", 12040);
  D.funcIsLoaded = (__typeof__(D.funcIsLoaded))mn_driver("cuFuncIsLoaded", 12040);
  D.funcLoad = (__typeof__(D.funcLoad))mn_driver("cuFuncLoad", 12040);
  D.funcGetName = (__typeof__(D.funcGetName))mn_driver("cuFuncGetName", 12030);
  D.kernelGetFunction = (__typeof__(D.kernelGetFunction))mn_driver("cuKernelGetFunction", 12000);
  D.kernelGetName = (__typeof__(D.kernelGetName))mn_driver("cuKernelGetName", 12030);
  D.streamWaitValue32 = (__typeof__(D.streamWaitValue32))mn_driver("cuStreamWaitValue32", 12000);
}

/* ---------------------------------------------------------------------------------------------- */
/* kernels and their parameter layout                                                             */

static mn_kernel *kernel_of(const mn_launch *L) {
  mn_kernel *k = NULL;
  if (L->shape == SHAPE_HANDLE) {
    k = mn_kernel_by_handle(L->handle);
    if (!k) {
      load_driver();
      const char *name = NULL;
      if (D.kernelGetName && D.kernelGetName(&name, (CUkernel)L->handle) == CUDA_SUCCESS && name)
        k = mn_kernel_by_name(name, 1);
      if (k && !k->handle) k->handle = L->handle;
    }
  } else {
    k = mn_kernel_by_stub(L->func);
    if (!k) {
      char name[64];
      snprintf(name, sizeof name, "unregistered_kernel_%p", L->func);
      k = mn_kernel_by_name(name, 1);
      if (k && !k->stub) k->stub = L->func;
    }
  }
  if (k) mn_kernel_announce(k);
  return k;
}

static CUfunction function_of(mn_kernel *k) {
  load_driver();
  CUfunction f = NULL;
  if (k->stub) {
    cudaFunction_t cf = NULL;
    if (REAL(cudaGetFuncBySymbol)(&cf, k->stub) == cudaSuccess) f = (CUfunction)cf;
    else REAL(cudaGetLastError)();
  }
  if (!f && k->handle && D.kernelGetFunction) {
    if (D.kernelGetFunction(&f, (CUkernel)k->handle) != CUDA_SUCCESS) f = NULL;
  }
  if (f && D.funcIsLoaded && D.funcLoad) {
    CUfunctionLoadingState st;
    if (D.funcIsLoaded(&st, f) == CUDA_SUCCESS && st != CU_FUNCTION_LOADING_STATE_LOADED) D.funcLoad(f);
  }
  return f;
}

/* Parameter offsets and sizes from the driver; 1 when known. */
static int kernel_params(mn_kernel *k) {
  if (k->params) return k->params > 0;
  k->params = -1;
  CUfunction f = function_of(k);
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
  h.grid[0] = L->grid.x; h.grid[1] = L->grid.y; h.grid[2] = L->grid.z;
  h.block[0] = L->block.x; h.block[1] = L->block.y; h.block[2] = L->block.z;
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

static cudaEvent_t ev_get(void) {
  if (R.nevpool) return R.evpool[--R.nevpool];
  cudaEvent_t e = NULL;
  if (REAL(cudaEventCreate)(&e) != cudaSuccess) {
    REAL(cudaGetLastError)();
    return NULL;
  }
  return e;
}

static void ev_put(cudaEvent_t e) {
  if (!e) return;
  if (R.nevpool == R.capevpool) {
    size_t ncap = R.capevpool ? R.capevpool * 2 : 64;
    cudaEvent_t *n = realloc(R.evpool, ncap * sizeof *n);
    if (!n) {
      REAL(cudaEventDestroy)(e);
      return;
    }
    R.evpool = n;
    R.capevpool = ncap;
  }
  R.evpool[R.nevpool++] = e;
}

static int elapsed_ns(cudaEvent_t a, cudaEvent_t b, uint64_t *ns) {
  float ms = 0;
  if (!D.eventElapsed || D.eventElapsed(&ms, (CUevent)a, (CUevent)b) != CUDA_SUCCESS || ms < 0) return 0;
  *ns = (uint64_t)((double)ms * 1e6 + 0.5);
  return 1;
}

void mn_resolve_pending(int wait) {
  load_driver();
  while (R.pending_head < R.npending) {
    mn_pending *p = &R.pending[R.pending_head];
    CUresult q = CUDA_ERROR_NOT_READY;
    if (wait && D.eventSynchronize) q = D.eventSynchronize((CUevent)p->stop);
    else if (D.eventQuery) q = D.eventQuery((CUevent)p->stop);
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

static int push_pending(cudaEvent_t a, cudaEvent_t b, mn_inst *i) {
  if (R.npending - R.pending_head >= MN_MAX_PENDING) {
    mn_resolve_pending(0);
    if (R.npending - R.pending_head >= MN_MAX_PENDING) {
      /* too many in flight: wait for the oldest one */
      CUresult q = D.eventSynchronize ? D.eventSynchronize((CUevent)R.pending[R.pending_head].stop) : CUDA_ERROR_NOT_READY;
      (void)q;
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

static cudaError_t fire_timed(const mn_launch *L, mn_inst *inst) {
  cudaEvent_t a = ev_get(), b = a ? ev_get() : NULL;
  if (!b) {
    ev_put(a);
    return fire(L);
  }
  if (REAL(cudaEventRecord)(a, L->ev_stream) != cudaSuccess) {
    REAL(cudaGetLastError)();
    ev_put(a);
    ev_put(b);
    return fire(L);
  }
  cudaError_t r = fire(L);
  if (r == cudaSuccess && REAL(cudaEventRecord)(b, L->ev_stream) == cudaSuccess && push_pending(a, b, inst) == 0)
    return r;
  if (r == cudaSuccess) REAL(cudaGetLastError)();
  ev_put(a);
  ev_put(b);
  return r;
}

static char occbuf[1 << 16];
static char sigocc[256];

void mn_emit_occurrences(int signal_safe) {
  for (mn_inst *i = __atomic_load_n(&R.all_insts, __ATOMIC_ACQUIRE); i; i = __atomic_load_n(&i->next_all, __ATOMIC_ACQUIRE)) {
    if (!i->recorded) continue;
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

typedef struct blob { uint64_t addr, size; uint32_t space; uint8_t *before; } blob;
typedef struct varsnap { mn_gvar *v; uint8_t *data; uint32_t nrelocs; mn_reloc *relocs; } varsnap;

typedef struct snapshot_set {
  blob *blobs;
  size_t nblobs;
  varsnap *vars;
  size_t nvars;
  uint64_t blob_bytes;
} snapshot_set;

static void set_free(snapshot_set *s) {
  for (size_t i = 0; i < s->nblobs; i++) free(s->blobs[i].before);
  for (size_t i = 0; i < s->nvars; i++) {
    free(s->vars[i].data);
    free(s->vars[i].relocs);
  }
  free(s->blobs);
  free(s->vars);
  memset(s, 0, sizeof *s);
}

static int read_blob(const blob *b, uint8_t *dst) {
  if (b->space == MN_SPACE_HOST_PINNED) {
    memcpy(dst, (const void *)(uintptr_t)b->addr, b->size);
    return 0;
  }
  if (REAL(cudaMemcpy)(dst, (const void *)(uintptr_t)b->addr, b->size, cudaMemcpyDeviceToHost) != cudaSuccess) {
    REAL(cudaGetLastError)();
    return -1;
  }
  return 0;
}

static int collect_blobs(snapshot_set *s) {
  size_t n = (R.arena_state > 0 ? R.dev.nlive : 0) + (R.host_state > 0 ? R.host.nlive : 0);
  s->blobs = calloc(n ? n : 1, sizeof *s->blobs);
  if (!s->blobs) return -1;
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
    s->blobs[i].before = malloc(s->blobs[i].size);
    if (!s->blobs[i].before || read_blob(&s->blobs[i], s->blobs[i].before)) return -1;
    s->blob_bytes += s->blobs[i].size;
  }
  return 0;
}

static int read_var(const mn_gvar *v, uint8_t *dst) {
  if (REAL(cudaMemcpyFromSymbol)(dst, v->host, v->size, 0, cudaMemcpyDeviceToHost) != cudaSuccess) {
    REAL(cudaGetLastError)();
    return -1;
  }
  return 0;
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
      if (v->resolved <= 0 || v->managed || v->size == 0) continue;
      varsnap *vs = &s->vars[s->nvars];
      vs->v = v;
      vs->data = malloc(v->size);
      if (!vs->data) { rc = -1; break; }
      if (read_var(v, vs->data)) {
        free(vs->data);
        vs->data = NULL;
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

static int write_prologue(const char *path, const mn_kernel *k, const snapshot_set *s, const argscan *a, uint64_t *bytes) {
  mn_writer *w = mn_writer_open(path, MN_PROLOGUE);
  if (!w) return -1;
  int rc = 0;
  for (size_t i = 0; !rc && i < s->nblobs; i++)
    rc = mn_writer_blob(w, s->blobs[i].addr, s->blobs[i].size, s->blobs[i].space, s->blobs[i].before);
  for (size_t i = 0; !rc && i < s->nvars; i++) {
    const varsnap *v = &s->vars[i];
    rc = mn_writer_var(w, v->v->name, v->v->addr, v->v->size, (uint32_t)v->v->is_const, v->data, v->nrelocs, v->relocs);
  }
  if (!rc) rc = mn_writer_args(w, k->nparams, k->poff, k->psize, k->argbytes, a->bytes);
  for (size_t i = 0; !rc && i < R.nannots; i++) rc = mn_writer_annot(w, &R.annots[i]);
  if (rc) {
    mn_writer_abort(w);
    return -1;
  }
  *bytes = mn_writer_bytes(w);
  return mn_writer_close(w);
}

static int write_epilogue(const char *path, const snapshot_set *s, uint64_t *bytes) {
  mn_writer *w = mn_writer_open(path, MN_EPILOGUE);
  if (!w) return -1;
  int rc = 0;
  uint64_t maxsize = 0;
  for (size_t i = 0; i < s->nblobs; i++)
    if (s->blobs[i].size > maxsize) maxsize = s->blobs[i].size;
  uint8_t *after = maxsize ? malloc(maxsize) : NULL;
  if (maxsize && !after) rc = -1;
  for (size_t i = 0; !rc && i < s->nblobs; i++) {
    const blob *b = &s->blobs[i];
    rc = read_blob(b, after);
    if (!rc)
      rc = mn_writer_blob_epilogue(w, b->addr, b->size, b->space, b->before, after, R.cfg.epilogue_format, MN_MERGE_GAP);
  }
  free(after);
  for (size_t i = 0; !rc && i < s->nvars; i++) {
    const varsnap *v = &s->vars[i];
    uint8_t *data = malloc(v->v->size);
    rc = !data || read_var(v->v, data);
    if (!rc) rc = mn_writer_var(w, v->v->name, v->v->addr, v->v->size, (uint32_t)v->v->is_const, data, v->nrelocs, v->relocs);
    free(data);
  }
  if (rc) {
    mn_writer_abort(w);
    return -1;
  }
  *bytes = mn_writer_bytes(w);
  return mn_writer_close(w);
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

static void log_instance(const mn_launch *L, const mn_kernel *k, const mn_inst *inst, const argscan *a, const char *pro,
                         const char *epi, uint64_t t_ns, const uint64_t *retimes, uint32_t nretimes,
                         const snapshot_set *s, uint64_t pro_bytes, uint64_t epi_bytes) {
  size_t cap = 8192 + 2 * (size_t)k->argbytes + 48 * (size_t)k->nparams + 64 * (size_t)k->argbytes / 8;
  char *buf = malloc(cap);
  uint64_t *po = malloc((k->nparams + 1) * sizeof *po), *ps = malloc((k->nparams + 1) * sizeof *ps);
  size_t nr = k->argbytes / 8 + 1;
  uint64_t *mo = malloc(nr * sizeof *mo), *ml = malloc(nr * sizeof *ml);
  if (buf && po && ps && mo && ml) {
    for (uint32_t i = 0; i < k->nparams; i++) {
      po[i] = k->poff[i];
      ps[i] = k->psize[i];
    }
    size_t nm;
    mask_ranges(a->mask, k->argbytes, mo, ml, &nm, nr);
    uint64_t fk[32];
    for (size_t i = 0; i < a->nforeign; i++) fk[i] = a->fkind[i];
    mn_line l;
    mn_line_begin(&l, buf, cap, "inst");
    mn_line_u64(&l, "k", k->id);
    mn_line_u64(&l, "i", inst->id);
    mn_line_str(&l, "api", L->api);
    uint32_t g[3] = {L->grid.x, L->grid.y, L->grid.z}, b[3] = {L->block.x, L->block.y, L->block.z};
    mn_line_u32s(&l, "grid", g, 3);
    mn_line_u32s(&l, "block", b, 3);
    mn_line_u64(&l, "shmem", L->shmem);
    if (L->cluster[0]) mn_line_u32s(&l, "cluster", L->cluster, 3);
    if (L->coop) mn_line_u64(&l, "coop", 1);
    if (L->nother) mn_line_u32s(&l, "attrs", L->other, L->nother);
    mn_line_pairs(&l, "params", po, ps, k->nparams);
    mn_line_hex(&l, "args", a->bytes, k->argbytes);
    mn_line_pairs(&l, "ptr", mo, ml, nm);
    mn_line_str(&l, "ptr_src", a->from_ir ? "ir" : "value");
    if (a->nforeign) mn_line_pairs(&l, "foreign", a->foff, fk, a->nforeign);
    if (a->ntex) mn_line_u64s(&l, "tex", a->toff, a->ntex);
    mn_line_str(&l, "pro", pro);
    mn_line_str(&l, "epi", epi);
    mn_line_u64(&l, "t_ns", t_ns);
    if (nretimes) mn_line_u64s(&l, "rt", retimes, nretimes);
    mn_line_u64(&l, "blobs", s->nblobs);
    mn_line_u64(&l, "blob_bytes", s->blob_bytes);
    mn_line_u64(&l, "vars", s->nvars);
    mn_line_u64(&l, "pro_bytes", pro_bytes);
    mn_line_u64(&l, "epi_bytes", epi_bytes);
    mn_log_event(&l);
  } else {
    mn_error("out of memory writing an instance event", k->name);
  }
  free(buf);
  free(po);
  free(ps);
  free(mo);
  free(ml);
}

/* ---- in-app timing of a recorded instance -------------------------------------------------------
 * One cold launch is a poor measure of the kernel (GPU clocks still ramping, caches cold), so before
 * the recorded launch the app's own kernel is run MNEME_RETIME more times on the prologue state, each
 * timed, with the prologue written back after each run; the recorded launch then starts from exactly
 * the prologue. Every timed launch waits behind a host flag (cuStreamWaitValue32) released only once
 * the start event, the launch and the end event are queued, so host launch latency stays out of the
 * timing, as in the replay core. */

static volatile uint32_t *hold_flag;
static CUdeviceptr hold_dflag;
static int hold_state; /* 0 unknown, 1 ready, -1 unavailable */

static int hold_ready(void) {
  if (hold_state) return hold_state > 0;
  hold_state = -1;
  if (!D.streamWaitValue32) return 0;
  void *h = NULL, *d = NULL;
  if (REAL(cudaHostAlloc)(&h, 64, cudaHostAllocMapped) != cudaSuccess) {
    REAL(cudaGetLastError)();
    return 0;
  }
  if (REAL(cudaHostGetDevicePointer)(&d, h, 0) != cudaSuccess) {
    REAL(cudaGetLastError)();
    REAL(cudaFreeHost)(h);
    return 0;
  }
  hold_flag = (volatile uint32_t *)h;
  hold_dflag = (CUdeviceptr)(uintptr_t)d;
  hold_state = 1;
  return 1;
}

/* Launches once, timed with events; fills the launch status, the status after synchronizing, and ns. */
static void held_launch(const mn_launch *L, cudaError_t *r, cudaError_t *after, uint64_t *ns) {
  *ns = 0;
  int held = 0;
  if (hold_ready()) {
    *hold_flag = 0;
    __sync_synchronize();
    held = D.streamWaitValue32((CUstream)L->ev_stream, hold_dflag, 1, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS;
  }
  cudaEvent_t e0 = ev_get(), e1 = ev_get();
  if (e0) REAL(cudaEventRecord)(e0, L->ev_stream);
  *r = fire(L);
  if (e1) REAL(cudaEventRecord)(e1, L->ev_stream);
  if (held) {
    __sync_synchronize();
    *hold_flag = 1; /* always released, whatever happened above */
  }
  *after = *r == cudaSuccess ? REAL(cudaDeviceSynchronize)() : *r;
  if (*after == cudaSuccess && e0 && e1) elapsed_ns(e0, e1, ns);
  ev_put(e0);
  ev_put(e1);
}

/* Writes the prologue back: blobs and variables as they were before the kernel ran. */
static int restore_prologue(const snapshot_set *s) {
  for (size_t i = 0; i < s->nblobs; i++) {
    const blob *b = &s->blobs[i];
    if (b->space == MN_SPACE_HOST_PINNED) {
      memcpy((void *)(uintptr_t)b->addr, b->before, b->size);
    } else if (REAL(cudaMemcpy)((void *)(uintptr_t)b->addr, b->before, b->size, cudaMemcpyHostToDevice) != cudaSuccess) {
      REAL(cudaGetLastError)();
      return -1;
    }
  }
  for (size_t i = 0; i < s->nvars; i++) {
    const varsnap *v = &s->vars[i];
    if (REAL(cudaMemcpyToSymbol)(v->v->host, v->data, v->v->size, 0, cudaMemcpyHostToDevice) != cudaSuccess) {
      REAL(cudaGetLastError)();
      return -1;
    }
  }
  return REAL(cudaDeviceSynchronize)() == cudaSuccess ? 0 : -1;
}

/* Extra timed launches on the prologue state (see above); returns how many were timed. A failure
 * stops the retiming and, if the prologue cannot be written back, disables it for good. */
static uint32_t retime(const mn_launch *L, const snapshot_set *s, uint64_t *out) {
  uint32_t n = R.cfg.retime < MN_RETIME_MAX ? R.cfg.retime : MN_RETIME_MAX, got = 0;
  for (uint32_t i = 0; i < n; i++) {
    cudaError_t r, after;
    uint64_t ns;
    held_launch(L, &r, &after, &ns);
    if (r != cudaSuccess || after != cudaSuccess) {
      REAL(cudaGetLastError)();
      break;
    }
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
static cudaError_t record(const mn_launch *L, mn_kernel *k, mn_inst *inst, const argscan *a) {
  cudaError_t sync = REAL(cudaDeviceSynchronize)();
  if (sync != cudaSuccess) {
    mn_kernel_skip(k, MN_SKIP_PENDING_ERROR);
    return fire(L);
  }
  mn_drain_deferred_frees();
  snapshot_set s;
  memset(&s, 0, sizeof s);
  char pro[4352], epi[4352], why[5120];
  snap_path(pro, sizeof pro, inst, "prologue");
  snap_path(epi, sizeof epi, inst, "epilogue");
  uint64_t pro_bytes = 0, epi_bytes = 0;
  if (collect_blobs(&s) || collect_vars(k, &s)) {
    set_free(&s);
    mn_error("cannot read the device memory for a prologue (out of host memory?)", k->name);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return fire(L);
  }
  if (write_prologue(pro, k, &s, a, &pro_bytes)) {
    snprintf(why, sizeof why, "%s: %s", pro, mn_last_error());
    unlink(pro);
    set_free(&s);
    R.incomplete = 1;
    mn_error("cannot write a prologue; no further instances are recorded", why);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return fire(L);
  }
  uint64_t retimes[MN_RETIME_MAX];
  /* Rerunning is safe only when everything the kernel can reach is restored by the prologue. */
  uint32_t nretimes = a->nforeign || a->ntex ? 0 : retime(L, &s, retimes);
  uint64_t t_ns = 0;
  cudaError_t r, after;
  held_launch(L, &r, &after, &t_ns);
  if (after != cudaSuccess) {
    snprintf(why, sizeof why, "%s: %s", k->name, REAL(cudaGetErrorString)(after));
    mn_error(r != cudaSuccess ? "the recorded launch failed" : "the recorded kernel failed", why);
    unlink(pro);
    set_free(&s);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return r;
  }
  if (write_epilogue(epi, &s, &epi_bytes)) {
    snprintf(why, sizeof why, "%s: %s", epi, mn_last_error());
    unlink(pro);
    unlink(epi);
    set_free(&s);
    R.incomplete = 1;
    mn_error("cannot write an epilogue; no further instances are recorded", why);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return r;
  }
  inst->recorded = 1;
  inst->count = 1;
  inst->flushed_count = 1;
  k->ninst_recorded++;
  k->recorded_launches++;
  R.stored_bytes += pro_bytes + epi_bytes;
  log_instance(L, k, inst, a, basename_of(pro), basename_of(epi), t_ns, retimes, nretimes, &s, pro_bytes, epi_bytes);
  set_free(&s);
  return r;
}

/* 0: not capturing, 1: this stream is capturing, 2: unknown (the query failed: assume a capture) */
static int capture_state(cudaStream_t s) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (REAL(cudaStreamIsCapturing)(s, &st) != cudaSuccess) {
    REAL(cudaGetLastError)();
    return 2;
  }
  return st == cudaStreamCaptureStatusNone ? 0 : 1;
}

static cudaError_t on_launch(mn_launch *L) {
  mn_init();
  if (!R.active || R.broken) return fire(L);
  pthread_mutex_lock(&R.mu);
  cudaError_t r;
  mn_kernel *k = R.exited ? NULL : kernel_of(L);
  if (!k || !mn_kernel_selected(k) || !mn_arena_ready()) {
    pthread_mutex_unlock(&R.mu);
    return fire(L);
  }
  k->launches++;
  k->stats_dirty = 1;
  int cap = capture_state(L->ev_stream);
  int dev = -1;
  if (REAL(cudaGetDevice)(&dev) != cudaSuccess) REAL(cudaGetLastError)();
  argscan a;
  memset(&a, 0, sizeof a);
  uint8_t *key = NULL;
  size_t keylen = 0;
  if (cap == 1) {
    mn_kernel_skip(k, MN_SKIP_GRAPH_CAPTURE);
  } else if (cap == 2 || __atomic_load_n(&R.captures, __ATOMIC_ACQUIRE) > 0) {
    mn_kernel_skip(k, MN_SKIP_CAPTURE_ELSEWHERE);
  } else if (dev != R.device) {
    mn_kernel_skip(k, MN_SKIP_OTHER_DEVICE);
  } else if (!kernel_params(k) || (k->nparams && !L->args)) {
    mn_kernel_skip(k, MN_SKIP_NO_PARAM_INFO);
  } else {
    mn_resolve_vars();
    a.bytes = calloc(k->argbytes + 1, 1);
    a.mask = calloc(k->argbytes + 1, 1);
    if (a.bytes && a.mask) {
      for (uint32_t i = 0; i < k->nparams; i++)
        if (L->args[i]) memcpy(a.bytes + k->poff[i], L->args[i], k->psize[i]);
      scan_args(k, &a);
      key = make_key(L, k, &a, &keylen);
    }
    if (!key) mn_kernel_skip(k, MN_SKIP_FAILED);
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
        if (r == cudaSuccess) {
          inst->count++;
          k->recorded_launches++;
        }
      } else {
        mn_kernel_skip(k, MN_SKIP_FAILED);
        r = fire(L);
      }
    } else if (k->launches <= R.cfg.skip) {
      free(key);
      mn_kernel_skip(k, MN_SKIP_SKIPPED);
      r = fire(L);
    } else if (R.cfg.max_recordings > 0 && k->ninst_recorded >= (uint32_t)R.cfg.max_recordings) {
      free(key);
      mn_kernel_skip(k, MN_SKIP_MAX_RECORDINGS);
      r = fire(L);
    } else if (R.incomplete) {
      free(key);
      mn_kernel_skip(k, MN_SKIP_FAILED);
      r = fire(L);
    } else {
      inst = new_inst(k, key, keylen, h);
      if (!inst) {
        free(key);
        mn_kernel_skip(k, MN_SKIP_FAILED);
        r = fire(L);
      } else {
        r = record(L, k, inst, &a);
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
/* runtime launch entry points                                                                    */

extern cudaError_t cudaLaunchKernel_ptsz(const void *, dim3, dim3, void **, size_t, cudaStream_t);
extern cudaError_t cudaLaunchCooperativeKernel_ptsz(const void *, dim3, dim3, void **, size_t, cudaStream_t);
extern cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *, const void *, void **);
extern cudaError_t __cudaLaunchKernel(cudaKernel_t, dim3, dim3, void **, size_t, cudaStream_t);
extern cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t, dim3, dim3, void **, size_t, cudaStream_t);

static cudaStream_t explicit_stream(cudaStream_t s, int ptsz) { return ptsz && s == 0 ? cudaStreamPerThread : s; }

static void init_func_launch(mn_launch *L, const char *api, void *real, const void *func, dim3 g, dim3 b, void **args,
                             size_t shm, cudaStream_t s, int ptsz) {
  memset(L, 0, sizeof *L);
  L->api = api;
  L->shape = SHAPE_FUNC;
  L->real = real;
  L->func = func;
  L->grid = g;
  L->block = b;
  L->args = args;
  L->shmem = shm;
  L->stream = s;
  L->ev_stream = explicit_stream(s, ptsz);
}

MN_EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t s) {
  mn_launch L;
  init_func_launch(&L, "cudaLaunchKernel", (void *)REAL(cudaLaunchKernel), func, g, b, args, shm, s, 0);
  return on_launch(&L);
}

MN_EXPORT cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t s) {
  mn_launch L;
  init_func_launch(&L, "cudaLaunchKernel", (void *)REAL(cudaLaunchKernel_ptsz), func, g, b, args, shm, s, 1);
  return on_launch(&L);
}

MN_EXPORT cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t s) {
  mn_launch L;
  init_func_launch(&L, "cudaLaunchCooperativeKernel", (void *)REAL(cudaLaunchCooperativeKernel), func, g, b, args, shm, s, 0);
  L.coop = 1;
  return on_launch(&L);
}

MN_EXPORT cudaError_t cudaLaunchCooperativeKernel_ptsz(const void *func, dim3 g, dim3 b, void **args, size_t shm,
                                                       cudaStream_t s) {
  mn_launch L;
  init_func_launch(&L, "cudaLaunchCooperativeKernel", (void *)REAL(cudaLaunchCooperativeKernel_ptsz), func, g, b, args,
                   shm, s, 1);
  L.coop = 1;
  return on_launch(&L);
}

static cudaError_t launch_handle(const char *api, void *real, cudaKernel_t kernel, dim3 g, dim3 b, void **args,
                                 size_t shm, cudaStream_t s, int ptsz) {
  mn_launch L;
  init_func_launch(&L, api, real, NULL, g, b, args, shm, s, ptsz);
  L.shape = SHAPE_HANDLE;
  L.handle = kernel;
  return on_launch(&L);
}

MN_EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t s) {
  return launch_handle("__cudaLaunchKernel", (void *)REAL(__cudaLaunchKernel), kernel, g, b, args, shm, s, 0);
}

MN_EXPORT cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t s) {
  return launch_handle("__cudaLaunchKernel", (void *)REAL(__cudaLaunchKernel_ptsz), kernel, g, b, args, shm, s, 1);
}

static cudaError_t launch_ex(void *real, const cudaLaunchConfig_t *config, const void *func, void **args, int ptsz) {
  if (!config) return ((ex_launch_t)real)(config, func, args);
  mn_launch L;
  init_func_launch(&L, "cudaLaunchKernelEx", real, func, config->gridDim, config->blockDim, args,
                   config->dynamicSmemBytes, config->stream, ptsz);
  L.shape = SHAPE_EX;
  L.config = config;
  for (unsigned i = 0; config->attrs && i < config->numAttrs; i++) {
    const cudaLaunchAttribute *at = &config->attrs[i];
    if (at->id == cudaLaunchAttributeClusterDimension) {
      L.cluster[0] = at->val.clusterDim.x;
      L.cluster[1] = at->val.clusterDim.y;
      L.cluster[2] = at->val.clusterDim.z;
    } else if (at->id == cudaLaunchAttributeCooperative) {
      L.coop = at->val.cooperative != 0;
    } else if (L.nother < sizeof L.other / sizeof L.other[0]) {
      L.other[L.nother++] = (uint32_t)at->id;
    }
  }
  return on_launch(&L);
}

MN_EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args) {
  return launch_ex((void *)REAL(cudaLaunchKernelExC), config, func, args, 0);
}

MN_EXPORT cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config, const void *func, void **args) {
  return launch_ex((void *)REAL(cudaLaunchKernelExC_ptsz), config, func, args, 1);
}

/* ---------------------------------------------------------------------------------------------- */
/* launch paths mneme cannot record: reported per kernel                                          */

static void report_stub(const void *func, int why) {
  mn_init();
  if (!R.active || R.broken || !func) return;
  pthread_mutex_lock(&R.mu);
  mn_kernel *k = mn_kernel_by_stub(func);
  if (k && mn_kernel_selected(k)) {
    k->launches++;
    mn_kernel_skip(k, why);
  }
  pthread_mutex_unlock(&R.mu);
}

static void report_function(CUfunction f, int why) {
  mn_init();
  if (!R.active || R.broken || !f) return;
  load_driver();
  const char *name = NULL;
  if (!D.funcGetName || D.funcGetName(&name, f) != CUDA_SUCCESS || !name) name = "unnamed_driver_kernel";
  pthread_mutex_lock(&R.mu);
  mn_kernel *k = mn_kernel_by_name(name, 1);
  if (k) {
    mn_kernel_announce(k);
    if (mn_kernel_selected(k)) {
      k->launches++;
      mn_kernel_skip(k, why);
      maybe_flush();
    }
  }
  pthread_mutex_unlock(&R.mu);
}

static void capture_begin(cudaError_t r) {
  if (r == cudaSuccess) __atomic_add_fetch(&R.captures, 1, __ATOMIC_RELEASE);
}

static void capture_end(cudaError_t r) {
  /* An invalidated capture still ends here; only "not capturing" leaves the count alone. */
  if (r == cudaErrorIllegalState || r == cudaErrorInvalidValue || r == cudaErrorInvalidResourceHandle) return;
  int c = __atomic_load_n(&R.captures, __ATOMIC_ACQUIRE);
  while (c > 0 && !__atomic_compare_exchange_n(&R.captures, &c, c - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {}
}

extern cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t, enum cudaStreamCaptureMode);
extern cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t, cudaGraph_t, const cudaGraphNode_t *,
                                                      const cudaGraphEdgeData *, size_t, enum cudaStreamCaptureMode);
extern cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t, cudaGraph_t *);
extern cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t, cudaStream_t);

MN_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  mn_init();
  cudaError_t r = REAL(cudaStreamBeginCapture)(stream, mode);
  capture_begin(r);
  return r;
}

MN_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  mn_init();
  cudaError_t r = REAL(cudaStreamBeginCapture_ptsz)(stream, mode);
  capture_begin(r);
  return r;
}

MN_EXPORT cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t *deps,
                                                    const cudaGraphEdgeData *data, size_t n, enum cudaStreamCaptureMode mode) {
  mn_init();
  cudaError_t r = REAL(cudaStreamBeginCaptureToGraph)(stream, graph, deps, data, n, mode);
  capture_begin(r);
  return r;
}

MN_EXPORT cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph, const cudaGraphNode_t *deps,
                                                         const cudaGraphEdgeData *data, size_t n,
                                                         enum cudaStreamCaptureMode mode) {
  mn_init();
  cudaError_t r = REAL(cudaStreamBeginCaptureToGraph_ptsz)(stream, graph, deps, data, n, mode);
  capture_begin(r);
  return r;
}

MN_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) {
  mn_init();
  cudaError_t r = REAL(cudaStreamEndCapture)(stream, pGraph);
  capture_end(r);
  return r;
}

MN_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph) {
  mn_init();
  cudaError_t r = REAL(cudaStreamEndCapture_ptsz)(stream, pGraph);
  capture_end(r);
  return r;
}

MN_EXPORT cudaError_t cudaGraphAddKernelNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                             const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                             const struct cudaKernelNodeParams *pNodeParams) {
  if (pNodeParams) report_stub(pNodeParams->func, MN_SKIP_GRAPH_NODE);
  return REAL(cudaGraphAddKernelNode)(pGraphNode, graph, pDependencies, numDependencies, pNodeParams);
}

MN_EXPORT cudaError_t cudaGraphAddNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph, const cudaGraphNode_t *pDependencies,
                                       const cudaGraphEdgeData *dependencyData, size_t numDependencies,
                                       struct cudaGraphNodeParams *nodeParams) {
  if (nodeParams && nodeParams->type == cudaGraphNodeTypeKernel) report_stub(nodeParams->kernel.func, MN_SKIP_GRAPH_NODE);
  return REAL(cudaGraphAddNode)(pGraphNode, graph, pDependencies, dependencyData, numDependencies, nodeParams);
}

static int graph_launch_logged;

static void graph_launched(void) {
  mn_init();
  if (!R.active) return;
  pthread_mutex_lock(&R.mu);
  mn_warn_once(&graph_launch_logged, "graph_launch",
               "the app launches CUDA graphs; the kernels inside them are reported as graph_capture/graph_node");
  pthread_mutex_unlock(&R.mu);
}

MN_EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  graph_launched();
  return REAL(cudaGraphLaunch)(graphExec, stream);
}

MN_EXPORT cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream) {
  graph_launched();
  return REAL(cudaGraphLaunch_ptsz)(graphExec, stream);
}

/* The app's own driver-API launches. The runtime reaches the driver through cuGetProcAddress, never
 * through these symbols, so only the app's direct calls arrive here. */

static void *driver_next(void **slot, const char *name, int version) {
  void *p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (!p) {
    p = dlsym(RTLD_NEXT, name);
    if (!p) p = mn_driver(name, version);
    __atomic_store_n(slot, p, __ATOMIC_RELEASE);
  }
  return p;
}
#define DRIVER(f, name, version) ((__typeof__(&f))driver_next(({ static void *mn_slot_; &mn_slot_; }), name, version))

extern CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    CUstream, void **, void **);
extern CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
extern CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                               unsigned, CUstream, void **);

MN_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
  report_function(f, MN_SKIP_DRIVER_API);
  __typeof__(&cuLaunchKernel) real = DRIVER(cuLaunchKernel, "cuLaunchKernel", 4000);
  return real ? real(f, gx, gy, gz, bx, by, bz, shm, s, params, extra) : CUDA_ERROR_NOT_INITIALIZED;
}

MN_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                       unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
  report_function(f, MN_SKIP_DRIVER_API);
  __typeof__(&cuLaunchKernel_ptsz) real = DRIVER(cuLaunchKernel_ptsz, "cuLaunchKernel_ptsz", 4000);
  return real ? real(f, gx, gy, gz, bx, by, bz, shm, s, params, extra) : CUDA_ERROR_NOT_INITIALIZED;
}

MN_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
  report_function(f, MN_SKIP_DRIVER_API);
  __typeof__(&cuLaunchKernelEx) real = DRIVER(cuLaunchKernelEx, "cuLaunchKernelEx", 11060);
  return real ? real(config, f, params, extra) : CUDA_ERROR_NOT_INITIALIZED;
}

MN_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
  report_function(f, MN_SKIP_DRIVER_API);
  __typeof__(&cuLaunchKernelEx_ptsz) real = DRIVER(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx_ptsz", 11060);
  return real ? real(config, f, params, extra) : CUDA_ERROR_NOT_INITIALIZED;
}

MN_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                             unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
  report_function(f, MN_SKIP_DRIVER_API);
  __typeof__(&cuLaunchCooperativeKernel) real = DRIVER(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000);
  return real ? real(f, gx, gy, gz, bx, by, bz, shm, s, params) : CUDA_ERROR_NOT_INITIALIZED;
}

MN_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                                  unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
  report_function(f, MN_SKIP_DRIVER_API);
  __typeof__(&cuLaunchCooperativeKernel_ptsz) real = DRIVER(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel_ptsz", 9000);
  return real ? real(f, gx, gy, gz, bx, by, bz, shm, s, params) : CUDA_ERROR_NOT_INITIALIZED;
}

/* Entry points the app asks the runtime or the driver for (cudaGetDriverEntryPoint*, cuGetProcAddress):
 * the launch functions come back wrapped, so that these launches are reported too. Two slots per
 * function cover its legacy- and per-thread-stream variants; a third distinct one is handed out bare. */

typedef CUresult (*cu_launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                CUstream, void **, void **);
typedef CUresult (*cu_launch_ex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*cu_launch_coop_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                     CUstream, void **);

static void *entry_slot[3][2];

#define LAUNCH_WRAPPER(idx, k)                                                                                  \
  static CUresult wrap_launch_##k(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
                                  unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {         \
    report_function(f, MN_SKIP_DRIVER_API);                                                                     \
    return ((cu_launch_t)entry_slot[idx][k])(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);                 \
  }
#define LAUNCH_EX_WRAPPER(idx, k)                                                                               \
  static CUresult wrap_launch_ex_##k(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {      \
    report_function(f, MN_SKIP_DRIVER_API);                                                                     \
    return ((cu_launch_ex_t)entry_slot[idx][k])(c, f, params, extra);                                           \
  }
#define LAUNCH_COOP_WRAPPER(idx, k)                                                                             \
  static CUresult wrap_launch_coop_##k(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,        \
                                       unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {     \
    report_function(f, MN_SKIP_DRIVER_API);                                                                     \
    return ((cu_launch_coop_t)entry_slot[idx][k])(f, gx, gy, gz, bx, by, bz, shm, s, params);                   \
  }
LAUNCH_WRAPPER(0, 0)
LAUNCH_WRAPPER(0, 1)
LAUNCH_EX_WRAPPER(1, 0)
LAUNCH_EX_WRAPPER(1, 1)
LAUNCH_COOP_WRAPPER(2, 0)
LAUNCH_COOP_WRAPPER(2, 1)

static const struct {
  const char *name;
  void *wrappers[2];
} wrapped_entries[3] = {
    {"cuLaunchKernel", {(void *)wrap_launch_0, (void *)wrap_launch_1}},
    {"cuLaunchKernelEx", {(void *)wrap_launch_ex_0, (void *)wrap_launch_ex_1}},
    {"cuLaunchCooperativeKernel", {(void *)wrap_launch_coop_0, (void *)wrap_launch_coop_1}},
};

static void wrap_entry(const char *symbol, void **pfn) {
  if (!symbol || !pfn || !*pfn) return;
  mn_init();
  if (!R.active) return;
  for (int i = 0; i < 3; i++) {
    if (strcmp(symbol, wrapped_entries[i].name) != 0) continue;
    pthread_mutex_lock(&R.mu);
    for (int k = 0; k < 2; k++) {
      if (!entry_slot[i][k]) entry_slot[i][k] = *pfn;
      if (entry_slot[i][k] == *pfn) {
        *pfn = wrapped_entries[i].wrappers[k];
        break;
      }
    }
    pthread_mutex_unlock(&R.mu);
    return;
  }
}

extern cudaError_t cudaGetDriverEntryPoint_ptsz(const char *, void **, unsigned long long, enum cudaDriverEntryPointQueryResult *);
extern cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *, void **, unsigned int, unsigned long long,
                                                         enum cudaDriverEntryPointQueryResult *);

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* deprecated, but apps still call it */
MN_EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                              enum cudaDriverEntryPointQueryResult *driverStatus) {
  cudaError_t r = REAL(cudaGetDriverEntryPoint)(symbol, funcPtr, flags, driverStatus);
  if (r == cudaSuccess) wrap_entry(symbol, funcPtr);
  return r;
}
#pragma GCC diagnostic pop

MN_EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr, unsigned long long flags,
                                                   enum cudaDriverEntryPointQueryResult *driverStatus) {
  cudaError_t r = REAL(cudaGetDriverEntryPoint_ptsz)(symbol, funcPtr, flags, driverStatus);
  if (r == cudaSuccess) wrap_entry(symbol, funcPtr);
  return r;
}

MN_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                                       unsigned long long flags,
                                                       enum cudaDriverEntryPointQueryResult *driverStatus) {
  cudaError_t r = REAL(cudaGetDriverEntryPointByVersion)(symbol, funcPtr, cudaVersion, flags, driverStatus);
  if (r == cudaSuccess) wrap_entry(symbol, funcPtr);
  return r;
}

MN_EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                                            unsigned long long flags,
                                                            enum cudaDriverEntryPointQueryResult *driverStatus) {
  cudaError_t r = REAL(cudaGetDriverEntryPointByVersion_ptsz)(symbol, funcPtr, cudaVersion, flags, driverStatus);
  if (r == cudaSuccess) wrap_entry(symbol, funcPtr);
  return r;
}

/* The app's own cuGetProcAddress (the runtime and this library reach libcuda's through dlsym on its
 * handle, never through this symbol). */
MN_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus) {
  __typeof__(&cuGetProcAddress_v2) real = DRIVER(cuGetProcAddress_v2, "cuGetProcAddress_v2", 12000);
  if (!real) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
  if (r == CUDA_SUCCESS) wrap_entry(symbol, pfn);
  return r;
}
