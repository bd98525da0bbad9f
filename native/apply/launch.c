/* The launch path: which entry a launch matches, the tuned launch with the app's device variables mirrored
 * around it, in-app timing, the statistics file.
 *
 * Environment (set by `mneme apply`, mneme/apply/runner.py):
 *   MNEME_APPLY_MANIFEST  the manifest (unset: the library does nothing)
 *   MNEME_APPLY_MODE      apply (swap the tuned kernels in) | observe (time the original launches only)
 *   MNEME_APPLY_STATS     where the statistics go at exit
 *   MNEME_APPLY_CHECK     first K launches of each entry: run original and tuned, compare (check.c)
 *   MNEME_APPLY_DUMP      1: print the parsed manifest to stderr at start (tests)
 *   MNEME_APPLY_HOLD, MNEME_APPLY_HOLD_MS: the timing hold and its watchdog (timing.c) */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "apply.h"
#include "internal.h"

mna_state A = {.mu = PTHREAD_MUTEX_INITIALIZER};

void mna_warn(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n > sizeof buf - 2) n = (int)sizeof buf - 2;
  buf[n++] = '\n';
  if (write(2, "mneme apply: ", 13) < 0 || write(2, buf, (size_t)n) < 0) { /* nothing to do */ }
  if (A.nwarn < MNA_MAX_WARN) snprintf(A.warn[A.nwarn++], sizeof A.warn[0], "%.*s", n - 1, buf);
}

#define LOAD(field, name)                                           \
  do {                                                              \
    A.cu.field = (__typeof__(A.cu.field))mna_real(name);            \
  } while (0)

static int load_driver(void) {
  if (A.cu_loaded) return A.cu_loaded > 0;
  LOAD(funcGetName, "cuFuncGetName");
  LOAD(kernelGetName, "cuKernelGetName");
  LOAD(kernelGetFunction, "cuKernelGetFunction");
  LOAD(funcGetModule, "cuFuncGetModule");
  LOAD(ctxGetCurrent, "cuCtxGetCurrent");
  LOAD(moduleLoad, "cuModuleLoad");
  LOAD(moduleGetFunction, "cuModuleGetFunction");
  LOAD(moduleGetGlobal, "cuModuleGetGlobal");
  LOAD(funcSetAttribute, "cuFuncSetAttribute");
  LOAD(memcpyDtoDAsync, "cuMemcpyDtoDAsync");
  LOAD(memcpyDtoH, "cuMemcpyDtoH");
  LOAD(memcpyHtoD, "cuMemcpyHtoD");
  LOAD(memcpyDtoD, "cuMemcpyDtoD");
  LOAD(memAlloc, "cuMemAlloc");
  LOAD(memFree, "cuMemFree");
  LOAD(memGetAddressRange, "cuMemGetAddressRange");
  LOAD(streamSynchronize, "cuStreamSynchronize");
  LOAD(eventCreate, "cuEventCreate");
  LOAD(eventRecord, "cuEventRecord");
  LOAD(eventQuery, "cuEventQuery");
  LOAD(eventSynchronize, "cuEventSynchronize");
  LOAD(eventElapsed, "cuEventElapsedTime");
  LOAD(getErrorName, "cuGetErrorName");
  LOAD(streamWaitValue32, "cuStreamWaitValue32");
  LOAD(memHostAlloc, "cuMemHostAlloc");
  LOAD(streamQuery, "cuStreamQuery");
  LOAD(streamIsCapturing, "cuStreamIsCapturing");
  LOAD(memHostGetDevicePointer, "cuMemHostGetDevicePointer");
  LOAD(funcIsLoaded, "cuFuncIsLoaded");
  LOAD(funcLoad, "cuFuncLoad");
  LOAD(memFreeHost, "cuMemFreeHost");
  int ok = A.cu.ctxGetCurrent && A.cu.moduleLoad && A.cu.moduleGetFunction && A.cu.moduleGetGlobal &&
           A.cu.memcpyDtoDAsync && (A.cu.funcGetName || A.cu.kernelGetName);
  A.cu_loaded = ok ? 1 : -1;
  if (!ok) mna_warn("libcuda lacks entry points libapply needs; every launch runs the original");
  return ok;
}

const char *mna_err(CUresult r) {
  const char *s = NULL;
  if (A.cu.getErrorName && A.cu.getErrorName(r, &s) == CUDA_SUCCESS && s) return s;
  return "CUDA error";
}

/* -- which entries a handle's kernel has (cached per handle) ------------------------------------- */
/* cudart (12+) launches CUkernel handles (cuLibraryGetKernel) cast to CUfunction, driver-API apps CUfunctions:
 * the kernel's name is asked as a CUkernel first, as the recorder does for the runtime's handles. */
static const char *kernel_name(CUfunction f) {
  const char *name = NULL;
  if (A.cu.kernelGetName && A.cu.kernelGetName(&name, (CUkernel)f) == CUDA_SUCCESS && name) return name;
  if (A.cu.funcGetName && A.cu.funcGetName(&name, f) == CUDA_SUCCESS && name) return name;
  return NULL;
}

/* The function a launch handle stands for in the current context (a CUkernel's function there). */
static CUfunction app_function(CUfunction f) {
  CUfunction g = NULL;
  if (A.cu.kernelGetFunction && A.cu.kernelGetFunction(&g, (CUkernel)f) == CUDA_SUCCESS && g) return g;
  return f;
}

/* First entry index of f's kernel, -1 none. */
static int entries_of(CUfunction f) {
  size_t h = ((uintptr_t)f >> 4) % MNA_HANDLES;
  for (size_t i = 0; i < MNA_HANDLES; i++) {
    mna_handle *s = &A.handles[(h + i) % MNA_HANDLES];
    if (s->f == f) return s->first;
    if (!s->f) {
      const char *name = kernel_name(f);
      int first = -1;
      for (size_t k = 0; name && k < A.m.n; k++)
        if (strcmp(A.m.entries[k].kernel, name) == 0) {
          first = (int)k;
          break;
        }
      s->f = f;
      s->first = first;
      if (first >= 0) mna_load_function(app_function(f)); /* before its first held launch: timing.c */
      return first;
    }
  }
  return -1; /* table full: treat as unknown (original) */
}

/* -- the tuned module ------------------------------------------------------------------------------ */
/* The module of the app's kernel in the current context: a CUkernel's function there first (see kernel_name). */
static CUmodule app_module(CUfunction f) {
  CUmodule mod = NULL;
  CUfunction g = app_function(f);
  if (!A.cu.funcGetModule) return NULL;
  if (A.cu.funcGetModule(&mod, g) == CUDA_SUCCESS && mod) return mod;
  if (g != f && A.cu.funcGetModule(&mod, f) == CUDA_SUCCESS && mod) return mod;
  return NULL;
}

static int ensure_loaded(mna_entry *e, CUfunction app_f) {
  CUcontext ctx = NULL;
  if (A.cu.ctxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return 0;
  if (e->load_state == 1) return e->ctx == ctx; /* another context: the original runs */
  if (e->load_state < 0) return 0;
  e->load_state = -1;
  CUresult r = A.cu.moduleLoad(&e->mod, e->cubin);
  if (r != CUDA_SUCCESS) {
    mna_warn("the tuned cubin of %s (%s) failed to load (%s); the original kernel runs", e->kernel, e->cubin, mna_err(r));
    return 0;
  }
  if ((r = A.cu.moduleGetFunction(&e->fn, e->mod, e->kernel)) != CUDA_SUCCESS) {
    mna_warn("the tuned cubin %s has no kernel %s (%s); the original kernel runs", e->cubin, e->kernel, mna_err(r));
    return 0;
  }
  mna_load_function(e->fn); /* before its first (held) launch: timing.c */
  if (e->tuned_shared > 48 * 1024 && A.cu.funcSetAttribute &&
      (r = A.cu.funcSetAttribute(e->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)e->tuned_shared)) != CUDA_SUCCESS) {
    mna_warn("%s: cannot allow %u bytes of dynamic shared memory (%s); the original kernel runs", e->kernel,
             e->tuned_shared, mna_err(r));
    return 0;
  }
  CUmodule am = app_module(app_f);
  for (size_t i = 0; i < e->nvars; i++) {
    mna_var *v = &e->vars[i];
    size_t ts = 0, as = 0;
    v->resolved = -1;
    if (A.cu.moduleGetGlobal(&v->tuned, &ts, e->mod, v->name) != CUDA_SUCCESS) continue; /* pruned away */
    if (!am || A.cu.moduleGetGlobal(&v->app, &as, am, v->name) != CUDA_SUCCESS || as != ts) {
      mna_warn("%s: the app's copy of variable %s was not found; the tuned kernel sees its own initial value",
               e->kernel, v->name);
      continue;
    }
    v->resolved = 1;
  }
  e->ctx = ctx;
  e->load_state = 1;
  return 1;
}

/* App variables -> tuned copies (before), tuned -> app (after, writable ones only). */
int mna_mirror(mna_entry *e, CUstream s, int after) {
  for (size_t i = 0; i < e->nvars; i++) {
    mna_var *v = &e->vars[i];
    if (v->resolved != 1 || (after && v->readonly)) continue;
    CUresult r = after ? A.cu.memcpyDtoDAsync(v->app, v->tuned, v->size, s) : A.cu.memcpyDtoDAsync(v->tuned, v->app, v->size, s);
    if (r != CUDA_SUCCESS) {
      mna_warn("%s: mirroring variable %s failed (%s)", e->kernel, v->name, mna_err(r));
      return -1;
    }
  }
  return 0;
}

/* -- timing: timing.c ------------------------------------------------------------------------------ */

/* -- statistics --------------------------------------------------------------------------------------- */
static void write_stats(void) {
  if (A.stats_written || !A.stats_path) return;
  A.stats_written = 1;
  if (A.cu_loaded > 0) mna_resolve(1);
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp%d", A.stats_path, (int)getpid());
  FILE *fd = fopen(tmp, "w");
  if (!fd) {
    mna_warn("cannot write the statistics to %s", A.stats_path);
    return;
  }
  fprintf(fd, "mneme-apply-stats 1\nmode %s\n", A.apply ? "apply" : "observe");
  for (size_t i = 0; i < A.m.n; i++) {
    mna_entry *e = &A.m.entries[i];
    fprintf(fd, "entry %d matched %llu applied %llu fell_back %llu checked %llu lost %llu timed %llu total_ns %llu\n",
            e->id, (unsigned long long)e->matched, (unsigned long long)e->applied, (unsigned long long)e->fell_back,
            (unsigned long long)e->checked, (unsigned long long)e->timed_lost, (unsigned long long)e->nsamples,
            (unsigned long long)e->total_ns);
    fprintf(fd, "samples %d", e->id);
    for (uint64_t k = 0; k < e->nsamples && k < MNA_MAX_SAMPLES; k++) fprintf(fd, " %u", e->samples[k]);
    fputc('\n', fd);
  }
  fprintf(fd, "unmatched %llu\n", (unsigned long long)A.unmatched);
  fprintf(fd, "holds_broken %llu\n", (unsigned long long)A.hold.broken);
  for (int i = 0; i < A.nwarn; i++) fprintf(fd, "warn %s\n", A.warn[i]);
  if (A.check_failed[0]) fprintf(fd, "check_failed %s\n", A.check_failed);
  if (fclose(fd) != 0 || rename(tmp, A.stats_path) != 0) mna_warn("cannot write the statistics to %s", A.stats_path);
}

void mna_finish(void) {
  pthread_mutex_lock(&A.mu);
  write_stats();
  pthread_mutex_unlock(&A.mu);
}

static void at_exit(void) { mna_finish(); }
static void init(void);

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

int mna_init(void) {
  pthread_once(&init_once, init);
  return A.enabled;
}

__attribute__((constructor)) static void init_at_load(void) { (void)mna_init(); }

static void init(void) {
  const char *path = getenv("MNEME_APPLY_MANIFEST");
  if (!path || !*path) return;
  const char *mode = getenv("MNEME_APPLY_MODE");
  A.apply = !mode || strcmp(mode, "observe") != 0;
  A.stats_path = getenv("MNEME_APPLY_STATS");
  const char *k = getenv("MNEME_APPLY_CHECK");
  A.check_k = k ? strtoul(k, NULL, 10) : 0;
  mna_check_settings();
  FILE *fd = fopen(path, "r");
  if (!fd) {
    mna_warn("cannot read the manifest %s; nothing is applied", path);
    return;
  }
  char *text = NULL;
  size_t cap = 0, len = 0;
  for (;;) {
    if (len + 4096 + 1 > cap) {
      char *n = realloc(text, cap = cap * 2 + 8192);
      if (!n) break;
      text = n;
    }
    size_t got = fread(text + len, 1, cap - len - 1, fd);
    len += got;
    if (got == 0) break;
  }
  fclose(fd);
  if (!text) return;
  text[len] = 0;
  char err[512];
  if (mna_manifest_parse(text, &A.m, err, sizeof err) != 0) {
    mna_warn("%s: %s; nothing is applied", path, err);
    free(text);
    return;
  }
  free(text);
  A.enabled = 1;
  if (getenv("MNEME_APPLY_DUMP")) {
    for (size_t i = 0; i < A.m.n; i++) {
      mna_entry *e = &A.m.entries[i];
      fprintf(stderr, "entry %d %s %s grid %u %u %u block %u %u %u shared %u -> block %u %u %u shared %u matches %zu vars %zu ptrs %zu\n",
              e->id, e->kernel, e->scaled ? "scaled" : "exact", e->rec_grid[0], e->rec_grid[1], e->rec_grid[2],
              e->rec_block[0], e->rec_block[1], e->rec_block[2], e->rec_shared, e->tuned_block[0], e->tuned_block[1],
              e->tuned_block[2], e->tuned_shared, e->nmatches, e->nvars, e->nptrs);
    }
  }
}

/* At exit after cudart's own teardown the events are gone: the statistics are written from an atexit
 * handler registered at the first launch (after cudart registered its own, so ours runs first); the
 * destructor covers a process that never launched. */
__attribute__((destructor)) static void fini(void) {
  if (A.enabled) mna_finish();
}

/* -- the launch ------------------------------------------------------------------------------------------ */
typedef struct {
  mna_launch_fn real;
  mna_launch_ex_fn real_ex;
  const CUlaunchConfig *cfg;
  mna_launch_coop_fn real_coop;
  /* a grid-synchronizing launch: its grid must be co-resident, and the tuned shapes were searched with the
   * recorded one fixed (mneme/ir/launchsafety.py), so only a tuned entry of the launch's own shape applies */
  int same_shape_only;
} fire_ctx;

static CUresult fire(const fire_ctx *c, CUfunction f, const uint32_t g[3], const uint32_t b[3], uint32_t shm,
                     CUstream s, void **p, void **x) {
  if (c->real) return c->real(f, g[0], g[1], g[2], b[0], b[1], b[2], shm, s, p, x);
  if (c->real_coop) return c->real_coop(f, g[0], g[1], g[2], b[0], b[1], b[2], shm, s, p);
  CUlaunchConfig cfg = *c->cfg;
  cfg.gridDimX = g[0], cfg.gridDimY = g[1], cfg.gridDimZ = g[2];
  cfg.blockDimX = b[0], cfg.blockDimY = b[1], cfg.blockDimZ = b[2];
  cfg.sharedMemBytes = shm;
  return c->real_ex(&cfg, f, p, x);
}

/* kernelParams from `extra` (CU_LAUNCH_PARAM_BUFFER_POINTER) laid out as the manifest says */
static void **params_of(const mna_entry *e, void **params, void **extra, void **out) {
  if (params) return params;
  if (!extra) return NULL;
  uint8_t *buf = NULL;
  size_t size = 0;
  for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = extra[i + 1];
    else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1]) size = *(size_t *)extra[i + 1];
  }
  if (!buf) return NULL;
  for (uint32_t i = 0; i < e->nparams; i++)
    out[i] = (uint64_t)e->param_offset[i] + e->param_size[i] <= size ? buf + e->param_offset[i] : NULL;
  return out;
}

static CUresult decide(const fire_ctx *c, CUstream os, CUfunction f, const uint32_t g[3], const uint32_t b[3],
                       uint32_t shm, CUstream s, void **params, void **extra);

static CUresult launch(const fire_ctx *c, CUstream os, CUfunction f, const uint32_t g[3], const uint32_t b[3],
                       uint32_t shm, CUstream s, void **params, void **extra) {
  /* a launch libapply makes itself (the original or the tuned kernel) may come back through a wrapper: never
   * decide twice */
  static __thread int inside;
  if (!A.enabled || inside) return fire(c, f, g, b, shm, s, params, extra);
  inside = 1;
  CUresult r = decide(c, os, f, g, b, shm, s, params, extra);
  inside = 0;
  return r;
}

static CUresult decide(const fire_ctx *c, CUstream os, CUfunction f, const uint32_t g[3], const uint32_t b[3],
                       uint32_t shm, CUstream s, void **params, void **extra) {
  pthread_mutex_lock(&A.mu);
  if (!A.atexit_done) {
    A.atexit_done = 1;
    if (A.stats_path && atexit(at_exit) != 0) mna_warn("cannot register the exit handler; statistics may be lost");
  }
  if (!load_driver()) {
    pthread_mutex_unlock(&A.mu);
    return fire(c, f, g, b, shm, s, params, extra);
  }
  int first = entries_of(f);
  mna_entry *e = NULL;
  uint32_t tg[3], tb[3], ts = 0;
  void *pbuf[MNA_MAX_PARAMS];
  for (int i = first; i >= 0 && (size_t)i < A.m.n; i++) {
    mna_entry *cand = &A.m.entries[i];
    if (strcmp(cand->kernel, A.m.entries[first].kernel) != 0) continue;
    void **p = params_of(cand, params, extra, pbuf);
    if (mna_entry_matches(cand, g, b, shm, p, tg, tb, &ts)) {
      e = cand;
      break;
    }
  }
  if (!e) {
    if (first >= 0) A.unmatched++;
    pthread_mutex_unlock(&A.mu);
    return fire(c, f, g, b, shm, s, params, extra);
  }
  e->matched++;
  if (c->same_shape_only && (memcmp(tg, g, sizeof tg) != 0 || memcmp(tb, b, sizeof tb) != 0 || ts != shm)) {
    if (!e->fell_back) mna_warn("%s: a cooperative launch keeps its shape; the tuned entry changes it, so the original "
                                "kernel runs", e->kernel);
    e->fell_back++;
    pthread_mutex_unlock(&A.mu);
    return fire(c, f, g, b, shm, s, params, extra);
  }
  CUresult r;
  mna_timing t0;
  /* a stream being captured into a graph must not be queried or synchronized: no timing, no check there (the
   * swap and the variable copies become part of the graph) */
  CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
  int capturing = A.cu.streamIsCapturing && A.cu.streamIsCapturing(os, &cap) == CUDA_SUCCESS &&
                  cap != CU_STREAM_CAPTURE_STATUS_NONE;
  if (!A.apply) { /* observe: the original, timed */
    if (!capturing) mna_time_begin(os, &t0);
    r = fire(c, f, g, b, shm, s, params, extra);
    if (!capturing) mna_time_end(os, &t0, e, r);
  } else if (!ensure_loaded(e, f)) {
    e->fell_back++;
    r = fire(c, f, g, b, shm, s, params, extra);
  } else if (e->checked < A.check_k && !capturing) {
    e->checked++;
    r = mna_check(e, c, f, g, b, shm, tg, tb, ts, s, os, params, extra, params_of(e, params, extra, pbuf));
  } else {
    if (mna_mirror(e, os, 0) != 0) {
      e->fell_back++;
      r = fire(c, f, g, b, shm, s, params, extra);
    } else {
      if (!capturing) mna_time_begin(os, &t0);
      r = fire(c, e->fn, tg, tb, ts, s, params, extra);
      if (!capturing) mna_time_end(os, &t0, e, r);
      if (r == CUDA_SUCCESS) {
        e->applied++;
        mna_mirror(e, os, 1);
      } else { /* e.g. too many resources for this shape: the original from now on */
        mna_warn("the tuned %s did not launch (%s); the original kernel runs from now on", e->kernel, mna_err(r));
        e->load_state = -1;
        e->fell_back++;
        r = fire(c, f, g, b, shm, s, params, extra);
      }
    }
  }
  pthread_mutex_unlock(&A.mu);
  return r;
}

CUresult mna_fire(const void *c, CUfunction f, const uint32_t g[3], const uint32_t b[3], uint32_t shm, CUstream s,
                  void **p, void **x) {
  return fire((const fire_ctx *)c, f, g, b, shm, s, p, x);
}

CUresult mna_launch(mna_launch_fn real, CUstream os, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                    unsigned by, unsigned bz, unsigned shared, CUstream stream, void **params, void **extra) {
  fire_ctx c = {real, NULL, NULL, NULL, 0};
  uint32_t g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
  return launch(&c, os, f, g, b, shared, stream, params, extra);
}

CUresult mna_launch_coop(mna_launch_coop_fn real, CUstream os, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                         unsigned bx, unsigned by, unsigned bz, unsigned shared, CUstream stream, void **params) {
  fire_ctx c = {NULL, NULL, NULL, real, 1};
  uint32_t g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
  return launch(&c, os, f, g, b, shared, stream, params, NULL);
}

CUresult mna_launch_ex(mna_launch_ex_fn real, CUstream os, const CUlaunchConfig *cfg, CUfunction f, void **params,
                       void **extra) {
  fire_ctx c = {NULL, real, cfg, NULL, 0};
  if (!cfg) return real(cfg, f, params, extra);
  for (unsigned i = 0; i < cfg->numAttrs; i++) {
    CUlaunchAttributeID id = cfg->attrs[i].id;
    if (id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
      return real(cfg, f, params, extra); /* the tuned shapes were not searched for clusters */
    if (id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && cfg->attrs[i].value.cooperative) c.same_shape_only = 1;
  }
  uint32_t g[3] = {cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ}, b[3] = {cfg->blockDimX, cfg->blockDimY, cfg->blockDimZ};
  return launch(&c, os, f, g, b, cfg->sharedMemBytes, cfg->hStream, params, extra);
}
