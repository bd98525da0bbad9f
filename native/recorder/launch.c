/* librecord's launches: every launch entry point of the driver (cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel: what every runtime's cudaLaunchKernel & co. and the app's own driver calls
 * end in) is wrapped; a launch of a selected kernel is either recorded (a new instance: instance.c),
 * counted and timed (a launch of an instance recorded before: timing.c), or counted as not recorded with
 * the reason (mn_skip). Here: the kernel a launch names and its parameter layout, instance keys, the
 * decision per launch, the entry points (driver.c's wrappers, the direct exports, graph kernel nodes)
 * and the count of active stream captures.
 *
 * An instance is the kernel with its grid, block, dynamic shared memory, launch attributes and its
 * argument bytes with the pointer bytes masked out; `mneme record` computes the official dynamic hash
 * from the same fields (mneme/record/hashing.py), with the mask logged here (instance.c). */
#include "launch.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MN_EXPORT __attribute__((visibility("default")))
#define MN_FLUSH_EVERY 4096
#define MN_FLUSH_NS 1000000000ull

CUresult mn_fire(const mn_launch *L) {
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

/* A CUfunction for the kernel in the current context, loaded. */
static CUfunction function_of(mn_kernel *k, CUfunction launched) {
  CUfunction f = NULL;
  if (k->kern && D.kernelGetFunction && D.kernelGetFunction(&f, k->kern) != CUDA_SUCCESS) f = NULL;
  if (!f && k->func) f = k->func;
  if (!f && (CUkernel)launched != k->kern) f = launched;
  mn_hold_calls c = mn_hold_driver_calls();
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

static void maybe_flush(void) {
  uint64_t now = mn_now_ns();
  if (++R.launches_since_flush >= MN_FLUSH_EVERY || (now > R.last_flush_ns && now - R.last_flush_ns > MN_FLUSH_NS))
    mn_flush(1, 0);
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
  if (!R.active || R.broken) return mn_fire(L);
  pthread_mutex_lock(&R.mu);
  CUresult r;
  mn_kernel *k = R.exited || !L->f ? NULL : mn_kernel_of(L->f);
  if (k) mn_kernel_runs(k); /* binds its table entry first: k->tab is not looked up before this launch */
  if (!k || !mn_kernel_selected(k) || !mn_arena_ready()) {
    pthread_mutex_unlock(&R.mu);
    return mn_fire(L);
  }
  int cap = capture_state(L->ev_stream);
  if (cap == MN_CAPTURE_THIS) {
    /* becomes a kernel node of the graph being captured: counted (and recorded) when that graph is
     * launched (graph.c), not now */
    pthread_mutex_unlock(&R.mu);
    return mn_fire(L);
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
    r = mn_fire(L);
  } else {
    uint64_t h = fnv1a(key, keylen);
    mn_inst *inst = find_inst(k, key, keylen, h);
    if (inst) {
      free(key);
      if (inst->recorded) {
        r = mn_fire_timed(L, inst);
        if (r == CUDA_SUCCESS) {
          inst->count++;
          k->recorded_launches++;
          L->counted = inst;
        }
      } else {
        skip(L, k, MN_SKIP_FAILED);
        r = mn_fire(L);
      }
    } else if (k->launches <= R.cfg.skip) {
      free(key);
      skip(L, k, MN_SKIP_SKIPPED);
      r = mn_fire(L);
    } else if (R.cfg.max_recordings > 0 && k->ninst_recorded >= (uint32_t)R.cfg.max_recordings) {
      free(key);
      skip(L, k, MN_SKIP_MAX_RECORDINGS);
      r = mn_fire(L);
    } else if (R.incomplete) {
      free(key);
      skip(L, k, MN_SKIP_FAILED);
      r = mn_fire(L);
    } else {
      inst = new_inst(k, key, keylen, h);
      if (!inst) {
        free(key);
        skip(L, k, MN_SKIP_FAILED);
        r = mn_fire(L);
      } else {
        r = mn_record_instance(L, k, inst, &a);
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
