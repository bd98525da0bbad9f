/* librecord: configuration, the raw log, kernels, modules and variables as the driver shows them,
 * flushing, signals and exit.
 *
 * Configuration comes from environment variables that `mneme record` sets (mneme/record/runner.py):
 *   MNEME_RECORD_DIR      raw output directory (unset: the library does nothing at all)
 *   MNEME_RUN_ID          run identifier written to the log
 *   MNEME_RECORD_RANKS    ranks to record ("all", "0,3", "0-3"; default 0)
 *   MNEME_KERNELS         POSIX extended regex for kernels that are not in the kernel table
 *   MNEME_KERNEL_TABLE    kernel table from the app's embedded IR (select.h)
 *   MNEME_MAX_RECORDINGS  instances recorded per kernel (0: no limit)
 *   MNEME_SKIP            launches of each kernel to let pass before recording
 *   MNEME_VA_BASE/MNEME_VA_BYTES      device arena
 *   MNEME_HOST_BASE/MNEME_HOST_BYTES  pinned host region
 *   MNEME_EPILOGUE_FORMAT diff | bytes | best
 *   MNEME_SNAP_POOL       bytes of pinned host memory kept for snapshot buffers across instances (default 2 GiB; 0: none)
 *   MNEME_MAX_SAMPLES     in-app timing samples kept per instance
 *   MNEME_RETIME          extra timed runs of each new instance, at most (default 10)
 *   MNEME_RETIME_BUDGET_US and at most this much wall time per instance, in us (default 1000000; 0: no bound)
 *   MNEME_RECORD_HOLD     0: timed launches are not held behind the host flag (timing.c, native/hold)
 *   MNEME_RECORD_HOLD_MS  the hold watchdog's bound in milliseconds (default 100)
 *   MNEME_SNAPSHOT_FSYNC  1: fsync every snapshot file (default 0: a file survives a crash of the app, not of
 *                         the machine; one cut short reads as truncated and is refused)
 *   MNEME_SNAPSHOT_THREAD 0: write the prologue on the launching thread (default 1: on a thread of its own,
 *                         while the kernel's timing runs, its launch, the epilogue and the app go on)
 */
#include "state.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

mn_state R = {.mu = PTHREAD_MUTEX_INITIALIZER, .device = -1, .log = {.fd = -1}};

const char *const mn_skip_names[MN_SKIP_COUNT] = {
    "graph_capture", "graph_node",    "driver_api", "other_device",   "graph_opaque",  "capture_elsewhere",
    "pending_error", "no_param_info", "failed",     "max_recordings", "skipped"};

static pthread_once_t init_once_ = PTHREAD_ONCE_INIT;
static char linebuf[1 << 16];        /* events written under R.mu */
static char sigbuf[512];             /* the exit event written from a signal handler */
static struct sigaction old_actions[NSIG];
static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGTERM, SIGINT};
static volatile sig_atomic_t in_signal;

uint64_t mn_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts); /* cheap enough for every launch; flushing needs no more */
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------------------- */
/* native/interpose's callbacks                                                                   */

int mn_ip_enabled(void) {
  mn_init();
  return R.active;
}

void mn_ip_bare(const char *name, int version, const char *why) {
  mn_init();
  if (!R.active) return;
  char detail[512];
  snprintf(detail, sizeof detail, "%s (CUDA %d): %s; calls through it are not seen", name, version, why);
  static char seen[64][64];
  static int nseen;
  pthread_mutex_lock(&R.mu);
  for (int i = 0; i < nseen; i++) {
    if (strcmp(seen[i], name) == 0) { /* once per name */
      pthread_mutex_unlock(&R.mu);
      return;
    }
  }
  if (nseen < 64) snprintf(seen[nseen++], sizeof seen[0], "%s", name);
  mn_line l;
  mn_line_begin(&l, linebuf, sizeof linebuf, "warning");
  mn_line_str(&l, "what", "driver entry point left unwrapped");
  mn_line_str(&l, "detail", detail);
  mn_log_event(&l);
  pthread_mutex_unlock(&R.mu);
}

void mn_ip_no_driver(const char *why) {
  mn_init();
  if (!R.active) return;
  pthread_mutex_lock(&R.mu);
  char detail[600];
  snprintf(detail, sizeof detail, "libcuda.so.1 cannot be loaded (%s): no NVIDIA driver on this machine", why);
  mn_error("the app found no CUDA driver; nothing can be recorded", detail);
  pthread_mutex_unlock(&R.mu);
  mn_exit_hook_arm();
}

/* ---------------------------------------------------------------------------------------------- */
/* log                                                                                            */

static void open_log(void) {
  if (R.log_opened) return;
  R.log_opened = 1;
  if (mn_log_open(&R.log, R.logpath) != 0) {
    R.incomplete = 1;
    char msg[4608];
    snprintf(msg, sizeof msg,
             "mneme record: cannot write the record log %s (%s); the app continues, the record will be "
             "incomplete\n",
             R.logpath, strerror(R.log.err));
    if (write(2, msg, strlen(msg)) < 0) { /* stderr closed */ }
  }
}

void mn_log_event(mn_line *l) {
  size_t n = mn_line_end(l);
  open_log();
  int was_failed = R.log.failed;
  if (!n) {
    char small[128];
    mn_line e;
    mn_line_begin(&e, small, sizeof small, "error");
    mn_line_str(&e, "what", "event too long for the log; dropped");
    n = mn_line_end(&e);
    if (mn_log_write(&R.log, small, n)) R.incomplete = 1;
    return;
  }
  if (mn_log_write(&R.log, l->buf, n)) {
    R.incomplete = 1;
    if (!was_failed && R.log.fd >= 0) {
      char msg[4608];
      snprintf(msg, sizeof msg,
               "mneme record: writing %s failed (%s); the app continues, the record will be incomplete\n",
               R.logpath, strerror(R.log.err));
      if (write(2, msg, strlen(msg)) < 0) { /* stderr closed */ }
    }
  }
}

void mn_error(const char *what, const char *detail) {
  mn_line l;
  mn_line_begin(&l, linebuf, sizeof linebuf, "error");
  mn_line_str(&l, "what", what);
  if (detail) mn_line_str(&l, "detail", detail);
  mn_log_event(&l);
  char msg[1024];
  snprintf(msg, sizeof msg, "mneme record: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  if (write(2, msg, strlen(msg)) < 0) { /* stderr closed */ }
}

void mn_warn_once(int *flag, const char *what, const char *detail) {
  if (*flag) return;
  *flag = 1;
  mn_line l;
  mn_line_begin(&l, linebuf, sizeof linebuf, "warning");
  mn_line_str(&l, "what", what);
  if (detail) mn_line_str(&l, "detail", detail);
  mn_log_event(&l);
}

/* ---------------------------------------------------------------------------------------------- */
/* configuration                                                                                  */

static uint64_t env_u64(const char *name, uint64_t dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 0);
  if (errno || *end) {
    char msg[256];
    snprintf(msg, sizeof msg, "mneme record: ignoring %s=%s (not a number)\n", name, v);
    if (write(2, msg, strlen(msg)) < 0) { /* stderr closed */ }
    return dflt;
  }
  return x;
}

static void env_str(const char *name, char *out, size_t cap, const char *dflt) {
  const char *v = getenv(name);
  snprintf(out, cap, "%s", v && *v ? v : dflt);
}

static void on_fatal_signal(int sig, siginfo_t *si, void *uc);

static void install_signal_handlers(void) {
  stack_t cur;
  if (sigaltstack(NULL, &cur) == 0 && (cur.ss_flags & SS_DISABLE)) {
    static char altstack[1 << 16];
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
    sigaltstack(&ss, NULL);
  }
  for (size_t i = 0; i < sizeof fatal_signals / sizeof fatal_signals[0]; i++) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(fatal_signals[i], &sa, &old_actions[fatal_signals[i]]);
  }
  /* A file-size limit must show as a failed write (the record is incomplete), not kill the app. */
  signal(SIGXFSZ, SIG_IGN);
}

static void after_fork_in_child(void) {
  /* CUDA does not survive fork; the child must not write into the parent's files. */
  R.active = 0;
}

static void write_start_event(void) {
  mn_line l;
  mn_line_begin(&l, linebuf, sizeof linebuf, "start");
  mn_line_u64(&l, "v", MN_RAW_VERSION);
  mn_line_str(&l, "run", R.cfg.run_id);
  mn_line_i64(&l, "pid", (int64_t)getpid());
  mn_line_i64(&l, "rank", R.cfg.rank);
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  mn_line_str(&l, "host", host);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  mn_line_u64(&l, "time_ns", (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
  char exe[PATH_MAX] = "";
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) exe[n] = 0;
  mn_line_str(&l, "exe", exe);
  mn_line_hexaddr(&l, "va_base", R.cfg.va_base);
  mn_line_u64(&l, "va_bytes", R.cfg.va_bytes);
  mn_line_hexaddr(&l, "host_base", R.cfg.host_base);
  mn_line_u64(&l, "host_bytes", R.cfg.host_bytes);
  mn_line_i64(&l, "max_recordings", R.cfg.max_recordings);
  mn_line_u64(&l, "skip", R.cfg.skip);
  mn_line_u64(&l, "kernel_table", R.cfg.ktab.n);
  mn_log_event(&l);
}

static void init_once(void) {
  const char *dir = getenv("MNEME_RECORD_DIR");
  if (!dir || !*dir) return;
  mn_config *c = &R.cfg;
  snprintf(c->dir, sizeof c->dir, "%s", dir);
  env_str("MNEME_RUN_ID", c->run_id, sizeof c->run_id, "");
  env_str("MNEME_RECORD_RANKS", c->ranks, sizeof c->ranks, "0");
  c->rank = mn_rank_from_env();
  int sel = mn_rank_selected(c->ranks, c->rank);
  if (sel < 0) {
    char msg[512];
    snprintf(msg, sizeof msg, "mneme record: MNEME_RECORD_RANKS=%s is malformed; recording rank 0 only\n", c->ranks);
    if (write(2, msg, strlen(msg)) < 0) { /* stderr closed */ }
    sel = mn_rank_selected("0", c->rank);
  }
  if (sel != 1) return;
  c->max_recordings = (int)env_u64("MNEME_MAX_RECORDINGS", 10);
  c->skip = env_u64("MNEME_SKIP", 0);
  c->va_base = env_u64("MNEME_VA_BASE", MN_DEFAULT_VA_BASE);
  c->va_bytes = env_u64("MNEME_VA_BYTES", MN_DEFAULT_VA_BYTES);
  c->host_base = env_u64("MNEME_HOST_BASE", MN_DEFAULT_HOST_BASE);
  c->host_bytes = env_u64("MNEME_HOST_BYTES", MN_DEFAULT_HOST_BYTES);
  c->max_samples = (uint32_t)env_u64("MNEME_MAX_SAMPLES", 1000);
  c->retime = (uint32_t)env_u64("MNEME_RETIME", 10);
  c->retime_budget_ns = env_u64("MNEME_RETIME_BUDGET_US", 1000000) * 1000ull;
  c->snap_pool_bytes = env_u64("MNEME_SNAP_POOL", 2ull << 30);
  c->hold = env_u64("MNEME_RECORD_HOLD", 1) != 0;
  c->hold_ms = env_u64("MNEME_RECORD_HOLD_MS", MN_HOLD_MS_DEFAULT);
  c->snapshot_thread = env_u64("MNEME_SNAPSHOT_THREAD", 1) != 0;
  mn_snapshot_set_fsync(env_u64("MNEME_SNAPSHOT_FSYNC", 0) != 0);
  char fmt[16];
  env_str("MNEME_EPILOGUE_FORMAT", fmt, sizeof fmt, "diff");
  c->epilogue_format = strcmp(fmt, "bytes") == 0 ? 1 : strcmp(fmt, "best") == 0 ? 2 : 0;

  int rank = c->rank < 0 ? 0 : c->rank;
  snprintf(R.logpath, sizeof R.logpath, "%s/r%d-p%ld.jsonl", c->dir, rank, (long)getpid());

  install_signal_handlers(); /* first: SIGXFSZ ignored before the first write */
  pthread_mutex_lock(&R.mu);
  R.active = 1;
  char err[512] = "";
  const char *tab = getenv("MNEME_KERNEL_TABLE");
  int tab_failed = tab && *tab && mn_ktab_load(&c->ktab, tab, err, sizeof err) != 0;
  const char *rx = getenv("MNEME_KERNELS");
  int rx_failed = 0;
  if (rx && *rx) {
    rx_failed = regcomp(&c->regex, rx, REG_EXTENDED | REG_NOSUB) != 0;
    c->have_regex = !rx_failed;
  }
  write_start_event();
  if (tab_failed) mn_error("cannot read the kernel table; pointer arguments are found by value", err);
  if (rx_failed) mn_error("MNEME_KERNELS is not a POSIX extended regex; recording every kernel", rx);
  pthread_mutex_unlock(&R.mu);
  pthread_atfork(NULL, NULL, after_fork_in_child);
  char why[256];
  mn_drv_load(why, sizeof why); /* the driver calls librecord makes itself; a missing driver is reported where it matters */
}

void mn_init(void) { pthread_once(&init_once_, init_once); }

/* Nothing happens at load time: configuration is read on the first CUDA call, so processes that never
 * use CUDA (shells, launchers) are untouched even though LD_PRELOAD reaches them. */

/* ---------------------------------------------------------------------------------------------- */
/* kernels                                                                                        */

/* Open-addressing maps to kernels from their handles (CUkernel, CUfunction) and names. */
typedef struct pmap { const void **keys; mn_kernel **vals; size_t cap, n; } pmap;
static pmap by_handle, by_name; /* by_name is keyed by the name's 64-bit hash */

static size_t slot_of(const void *key, size_t cap) {
  uint64_t x = (uint64_t)(uintptr_t)key;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)(x & (cap - 1));
}

static mn_kernel *pmap_get(const pmap *m, const void *key) {
  if (!m->cap) return NULL;
  for (size_t i = slot_of(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
    if (!m->keys[i]) return NULL;
    if (m->keys[i] == key) return m->vals[i];
  }
}

static int pmap_put(pmap *m, const void *key, mn_kernel *val) {
  if ((m->n + 1) * 2 > m->cap) {
    size_t ncap = m->cap ? m->cap * 2 : 256;
    const void **nk = calloc(ncap, sizeof *nk);
    mn_kernel **nv = calloc(ncap, sizeof *nv);
    if (!nk || !nv) {
      free(nk);
      free(nv);
      return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->keys[i]) continue;
      size_t j = slot_of(m->keys[i], ncap);
      while (nk[j]) j = (j + 1) & (ncap - 1);
      nk[j] = m->keys[i];
      nv[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = nk;
    m->vals = nv;
    m->cap = ncap;
  }
  size_t i = slot_of(key, m->cap);
  while (m->keys[i] && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
  if (!m->keys[i]) m->n++;
  m->keys[i] = key;
  m->vals[i] = val;
  return 0;
}

static const void *name_key(const char *name) {
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 1099511628211ull;
  return (const void *)(uintptr_t)(h | 1); /* never NULL */
}

mn_kernel *mn_kernel_by_handle(const void *handle) { return pmap_get(&by_handle, handle); }
void mn_kernel_add_handle(mn_kernel *k, const void *handle) {
  if (handle) pmap_put(&by_handle, handle, k);
}

mn_kernel *mn_kernel_by_name(const char *name, int create) {
  const void *key = name_key(name);
  mn_kernel *k = pmap_get(&by_name, key);
  if (k && strcmp(k->name, name) == 0) return k;
  if (k) { /* 64-bit hash collision: fall back to a scan */
    for (k = R.kernels; k; k = k->next)
      if (strcmp(k->name, name) == 0) return k;
  }
  if (!create) return NULL;
  k = calloc(1, sizeof *k);
  if (!k) return NULL;
  k->name = strdup(name);
  if (!k->name) {
    free(k);
    return NULL;
  }
  k->id = R.nkernels++;
  k->selected = -1;
  k->next = R.kernels;
  R.kernels = k;
  if (!pmap_get(&by_name, key)) pmap_put(&by_name, key, k);
  return k;
}

void mn_kernel_announce(mn_kernel *k) {
  if (k->announced) return;
  k->announced = 1;
  mn_line l;
  mn_line_begin(&l, linebuf, sizeof linebuf, "kernel");
  mn_line_u64(&l, "k", k->id);
  mn_line_str(&l, "name", k->name);
  mn_log_event(&l);
}

static char *demangle(const char *name) {
  static char *(*cxa)(const char *, char *, size_t *, int *);
  static int looked;
  if (!looked) {
    looked = 1;
    cxa = (__typeof__(cxa))dlsym(RTLD_DEFAULT, "__cxa_demangle");
  }
  if (!cxa || strncmp(name, "_Z", 2) != 0) return NULL;
  int status = 0;
  char *d = cxa(name, NULL, NULL, &status);
  if (status != 0) {
    free(d);
    return NULL;
  }
  return d;
}

const mn_ktab_entry *mn_kernel_entry(mn_kernel *k) {
  if (!k->tab_checked) {
    k->tab_checked = 1;
    k->tab = mn_ktab_find(&R.cfg.ktab, k->name);
  }
  return k->tab;
}

void mn_kernel_runs(mn_kernel *k) {
  const mn_ktab_entry *e = mn_kernel_entry(k);
  if (e && e->heap) R.heap_live = 1;
}

int mn_kernel_selected(mn_kernel *k) {
  if (k->selected >= 0) return k->selected;
  if (mn_kernel_entry(k)) {
    k->selected = k->tab->selected;
  } else if (R.cfg.have_regex) {
    int hit = regexec(&R.cfg.regex, k->name, 0, NULL, 0) == 0;
    if (!hit) {
      char *d = demangle(k->name);
      if (d) {
        hit = regexec(&R.cfg.regex, d, 0, NULL, 0) == 0;
        free(d);
      }
    }
    k->selected = hit;
  } else {
    k->selected = 1;
  }
  return k->selected;
}

void mn_kernel_skip(mn_kernel *k, int why) {
  k->stats_dirty = 1;
  if (k->skips[why]++ == 0 && why <= MN_SKIP_GRAPH_OPAQUE) {
    mn_kernel_announce(k);
    mn_line l;
    mn_line_begin(&l, linebuf, sizeof linebuf, "unsupported");
    mn_line_u64(&l, "k", k->id);
    mn_line_str(&l, "why", mn_skip_names[why]);
    mn_log_event(&l);
  }
}

/* ---------------------------------------------------------------------------------------------- */
/* modules, kernels and variables, as the runtime (or the app) asks the driver for them            */

static void remember(void ***arr, size_t *n, size_t *cap, void *h) {
  for (size_t i = 0; i < *n; i++)
    if ((*arr)[i] == h) return;
  if (*n == *cap) {
    size_t ncap = *cap ? *cap * 2 : 16;
    void **na = realloc(*arr, ncap * sizeof *na);
    if (!na) return;
    *arr = na;
    *cap = ncap;
  }
  (*arr)[(*n)++] = h;
}

static void forget(void **arr, size_t *n, void *h) {
  for (size_t i = 0; i < *n; i++) {
    if (arr[i] == h) {
      arr[i] = arr[--*n];
      return;
    }
  }
}

static void loaded_library(CUresult r, CUlibrary *lib) {
  if (r != CUDA_SUCCESS || !lib || !*lib || !R.active) return;
  pthread_mutex_lock(&R.mu);
  remember((void ***)&R.libs, &R.nlibs, &R.caplibs, *lib);
  pthread_mutex_unlock(&R.mu);
}

static void loaded_module(CUresult r, CUmodule *mod) {
  if (r != CUDA_SUCCESS || !mod || !*mod || !R.active) return;
  pthread_mutex_lock(&R.mu);
  remember((void ***)&R.mods, &R.nmods, &R.capmods, *mod);
  pthread_mutex_unlock(&R.mu);
}

/* Before a library or module goes (the runtime unloads them at exit while the context is alive): the
 * moment to read the timing events of launches still in flight. */
static void unloading(void *h, int is_lib) {
  if (!R.active) return;
  pthread_mutex_lock(&R.mu);
  if (!R.exited && R.arena_state > 0) mn_flush(1, 1);
  if (is_lib) forget((void **)R.libs, &R.nlibs, h);
  else forget((void **)R.mods, &R.nmods, h);
  pthread_mutex_unlock(&R.mu);
}

/* Before a context goes (the runtime releases the primary context at exit): the last moment its
 * timing events can be read. */
static void context_going(void) {
  if (!R.active) return;
  pthread_mutex_lock(&R.mu);
  if (!R.exited && R.arena_state > 0) mn_flush(1, 1);
  pthread_mutex_unlock(&R.mu);
}

CUresult mn_cu_primary_ctx_release(const mn_ip_slot *s, CUdevice d) {
  context_going();
  return ((PFN_cuDevicePrimaryCtxRelease_v11000)s->real)(d);
}

CUresult mn_cu_primary_ctx_reset(const mn_ip_slot *s, CUdevice d) {
  context_going();
  return ((PFN_cuDevicePrimaryCtxReset_v11000)s->real)(d);
}

CUresult mn_cu_ctx_destroy(const mn_ip_slot *s, CUcontext c) {
  context_going();
  return ((PFN_cuCtxDestroy_v4000)s->real)(c);
}

CUresult mn_cu_library_load_data(const mn_ip_slot *s, CUlibrary *library, const void *code, CUjit_option *jo,
                                 void **jv, unsigned int njo, CUlibraryOption *lo, void **lv, unsigned int nlo) {
  CUresult r = ((PFN_cuLibraryLoadData_v12000)s->real)(library, code, jo, jv, njo, lo, lv, nlo);
  loaded_library(r, library);
  return r;
}

CUresult mn_cu_library_load_from_file(const mn_ip_slot *s, CUlibrary *library, const char *file, CUjit_option *jo,
                                      void **jv, unsigned int njo, CUlibraryOption *lo, void **lv, unsigned int nlo) {
  CUresult r = ((PFN_cuLibraryLoadFromFile_v12000)s->real)(library, file, jo, jv, njo, lo, lv, nlo);
  loaded_library(r, library);
  return r;
}

CUresult mn_cu_library_unload(const mn_ip_slot *s, CUlibrary library) {
  unloading(library, 1);
  return ((PFN_cuLibraryUnload_v12000)s->real)(library);
}

CUresult mn_cu_module_load_data(const mn_ip_slot *s, CUmodule *module, const void *image) {
  CUresult r = ((PFN_cuModuleLoadData_v2000)s->real)(module, image);
  loaded_module(r, module);
  return r;
}

CUresult mn_cu_module_load_data_ex(const mn_ip_slot *s, CUmodule *module, const void *image, unsigned int n,
                                   CUjit_option *options, void **values) {
  CUresult r = ((PFN_cuModuleLoadDataEx_v2010)s->real)(module, image, n, options, values);
  loaded_module(r, module);
  return r;
}

CUresult mn_cu_module_load_fat_binary(const mn_ip_slot *s, CUmodule *module, const void *fatCubin) {
  CUresult r = ((PFN_cuModuleLoadFatBinary_v2000)s->real)(module, fatCubin);
  loaded_module(r, module);
  return r;
}

CUresult mn_cu_module_load(const mn_ip_slot *s, CUmodule *module, const char *fname) {
  CUresult r = ((PFN_cuModuleLoad_v2000)s->real)(module, fname);
  loaded_module(r, module);
  return r;
}

CUresult mn_cu_module_unload(const mn_ip_slot *s, CUmodule hmod) {
  unloading(hmod, 0);
  return ((PFN_cuModuleUnload_v2000)s->real)(hmod);
}

/* A kernel handle and the name it was asked for by (the runtime asks once per kernel and context). */
static void named_handle(CUresult r, const void *handle, const char *name, int is_kernel) {
  if (r != CUDA_SUCCESS || !handle || !name || !R.active) return;
  pthread_mutex_lock(&R.mu);
  mn_kernel *k = mn_kernel_by_name(name, 1);
  if (k) {
    if (is_kernel && !k->kern) k->kern = (CUkernel)handle;
    if (!is_kernel && !k->func) k->func = (CUfunction)handle;
    mn_kernel_add_handle(k, handle);
    mn_kernel_announce(k);
  }
  pthread_mutex_unlock(&R.mu);
}

CUresult mn_cu_library_get_kernel(const mn_ip_slot *s, CUkernel *pKernel, CUlibrary library, const char *name) {
  CUresult r = ((PFN_cuLibraryGetKernel_v12000)s->real)(pKernel, library, name);
  named_handle(r, pKernel ? (const void *)*pKernel : NULL, name, 1);
  return r;
}

CUresult mn_cu_module_get_function(const mn_ip_slot *s, CUfunction *hfunc, CUmodule hmod, const char *name) {
  CUresult r = ((PFN_cuModuleGetFunction_v2000)s->real)(hfunc, hmod, name);
  named_handle(r, hfunc ? (const void *)*hfunc : NULL, name, 0);
  return r;
}

CUresult mn_cu_kernel_get_function(const mn_ip_slot *s, CUfunction *pFunc, CUkernel kernel) {
  CUresult r = ((PFN_cuKernelGetFunction_v12000)s->real)(pFunc, kernel);
  if (r == CUDA_SUCCESS && pFunc && *pFunc && R.active) {
    pthread_mutex_lock(&R.mu);
    mn_kernel *k = mn_kernel_by_handle(kernel);
    if (k) {
      if (!k->func) k->func = *pFunc;
      mn_kernel_add_handle(k, *pFunc);
    }
    pthread_mutex_unlock(&R.mu);
  }
  return r;
}

static mn_gvar *var_by_name(const char *name) {
  for (size_t i = 0; i < R.nvars; i++)
    if (strcmp(R.vars[i].name, name) == 0) return &R.vars[i];
  return NULL;
}

/* A variable the driver showed at `addr` (called with R.mu held). */
static void add_var(const char *name, uint64_t addr, uint64_t size, int managed) {
  if (!name || !addr) return;
  mn_gvar *v = var_by_name(name);
  if (v && v->addr == addr) return;
  if (!v) {
    if (R.nvars == R.capvars) {
      size_t ncap = R.capvars ? R.capvars * 2 : 64;
      mn_gvar *nv = realloc(R.vars, ncap * sizeof *nv);
      if (!nv) return;
      R.vars = nv;
      R.capvars = ncap;
    }
    v = &R.vars[R.nvars];
    memset(v, 0, sizeof *v);
    v->name = strdup(name);
    if (!v->name) return;
    R.nvars++;
  }
  v->addr = addr;
  v->size = size;
  v->managed = managed;
  v->resolved = 1;
  mn_line l;
  mn_line_begin(&l, linebuf, sizeof linebuf, "var");
  mn_line_str(&l, "name", name);
  mn_line_u64(&l, "size", size);
  mn_line_u64(&l, "const", 0); /* the driver does not say; replay writes both kinds the same way */
  mn_line_u64(&l, "managed", (uint64_t)!!managed);
  mn_log_event(&l);
  mn_line_begin(&l, linebuf, sizeof linebuf, "varaddr");
  mn_line_str(&l, "name", name);
  mn_line_hexaddr(&l, "addr", addr);
  mn_log_event(&l);
}

static void shown_var(CUresult r, const CUdeviceptr *dptr, const size_t *bytes, const char *name, int managed) {
  if (r != CUDA_SUCCESS || !dptr || !R.active) return;
  pthread_mutex_lock(&R.mu);
  add_var(name, (uint64_t)*dptr, bytes ? (uint64_t)*bytes : 0, managed);
  pthread_mutex_unlock(&R.mu);
}

CUresult mn_cu_library_get_global(const mn_ip_slot *s, CUdeviceptr *dptr, size_t *bytes, CUlibrary library,
                                  const char *name) {
  size_t n = 0;
  CUresult r = ((PFN_cuLibraryGetGlobal_v12000)s->real)(dptr, bytes ? bytes : &n, library, name);
  shown_var(r, dptr, bytes ? bytes : &n, name, 0);
  return r;
}

CUresult mn_cu_module_get_global(const mn_ip_slot *s, CUdeviceptr *dptr, size_t *bytes, CUmodule hmod,
                                 const char *name) {
  CUdeviceptr p = 0;
  size_t n = 0;
  CUresult r = ((PFN_cuModuleGetGlobal_v3020)s->real)(dptr ? dptr : &p, bytes ? bytes : &n, hmod, name);
  shown_var(r, dptr ? dptr : &p, bytes ? bytes : &n, name, 0);
  return r;
}

CUresult mn_cu_library_get_managed(const mn_ip_slot *s, CUdeviceptr *dptr, size_t *bytes, CUlibrary library,
                                   const char *name) {
  CUdeviceptr p = 0;
  size_t n = 0;
  CUresult r = ((PFN_cuLibraryGetManaged_v12000)s->real)(dptr ? dptr : &p, bytes ? bytes : &n, library, name);
  shown_var(r, dptr ? dptr : &p, bytes ? bytes : &n, name, 1);
  return r;
}

void mn_resolve_vars(const mn_kernel *k) {
  if (!k->tab) return;
  for (uint32_t j = 0; j < k->tab->nvars; j++) {
    const char *name = k->tab->vars[j];
    if (var_by_name(name)) continue;
    CUdeviceptr p = 0;
    size_t n = 0;
    int found = 0;
    for (size_t i = 0; i < R.nlibs && !found; i++)
      found = D.libraryGetGlobal(&p, &n, R.libs[i], name) == CUDA_SUCCESS;
    for (size_t i = 0; i < R.nmods && !found; i++)
      found = D.moduleGetGlobal(&p, &n, R.mods[i], name) == CUDA_SUCCESS;
    if (found) add_var(name, (uint64_t)p, (uint64_t)n, 0);
  }
}

/* ---------------------------------------------------------------------------------------------- */
/* provenance                                                                                     */

static int write_object(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  (void)data;
  const char *name = info->dlpi_name;
  char exe[PATH_MAX];
  if (!name || !*name) {
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 0;
    exe[n] = 0;
    name = exe;
  }
  if (strstr(name, "linux-vdso") || strstr(name, "linux-gate")) return 0;
  /* each object once per process (this runs at the first launch and again at exit) */
  static uint64_t seen[512];
  static size_t nseen;
  uint64_t key = (uint64_t)(uintptr_t)name_key(name);
  for (size_t i = 0; i < nseen; i++)
    if (seen[i] == key) return 0;
  if (nseen < sizeof seen / sizeof seen[0]) seen[nseen++] = key;
  mn_line l;
  mn_line_begin(&l, linebuf, sizeof linebuf, "object");
  mn_line_str(&l, "path", name);
  mn_log_event(&l);
  return 0;
}

/* Every ELF object loaded now: mneme record reads the embedded IR of the app and its libraries. */
static void write_objects(void) { dl_iterate_phdr(write_object, NULL); }

void mn_write_provenance(void) {
  if (R.provenance_written) return;
  R.provenance_written = 1;
  char why[256];
  mn_line l;
  mn_line_begin(&l, linebuf, sizeof linebuf, "device");
  CUdevice dev = -1;
  int drv = 0;
  if (mn_drv_load(why, sizeof why) == 0 && D.ctxGetDevice(&dev) == CUDA_SUCCESS) {
    mn_line_i64(&l, "device", dev);
    char name[256] = "";
    if (D.deviceGetName(name, (int)sizeof name - 1, dev) == CUDA_SUCCESS) mn_line_str(&l, "gpu", name);
    int major = 0, minor = 0, sms = 0, hpr = 0;
    if (D.deviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) == CUDA_SUCCESS &&
        D.deviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) == CUDA_SUCCESS) {
      char sm[16];
      snprintf(sm, sizeof sm, "sm_%d%d", major, minor);
      mn_line_str(&l, "sm", sm);
    }
    if (D.deviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) == CUDA_SUCCESS)
      mn_line_u64(&l, "sms", (uint64_t)sms);
    size_t mem = 0;
    if (D.deviceTotalMem(&mem, dev) == CUDA_SUCCESS) mn_line_u64(&l, "mem", (uint64_t)mem);
    CUuuid uuid;
    if (D.deviceGetUuid(&uuid, dev) == CUDA_SUCCESS) mn_line_hex(&l, "uuid", uuid.bytes, sizeof uuid.bytes);
    if (D.deviceGetAttribute(&hpr, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, dev) == CUDA_SUCCESS)
      mn_line_u64(&l, "host_ptr_registered", (uint64_t)hpr);
    if (D.driverGetVersion(&drv) == CUDA_SUCCESS) mn_line_i64(&l, "driver", drv);
    if (drv) mn_line_i64(&l, "cu_driver", drv);
  } else {
    mn_line_i64(&l, "device", -1);
  }
  /* the runtime asks cuGetProcAddress with its own CUDA_VERSION: the highest version asked is its version */
  mn_line_i64(&l, "runtime", mn_ip_max_requested_version());
  mn_log_event(&l);
  write_objects();
}

/* ---------------------------------------------------------------------------------------------- */
/* flushing, exit, signals                                                                        */

static void write_kstats(void) {
  for (mn_kernel *k = R.kernels; k; k = k->next) {
    if (!k->stats_dirty) continue;
    k->stats_dirty = 0;
    mn_kernel_announce(k);
    char skips[1024];
    size_t n = 0;
    skips[n++] = '{';
    for (int i = 0; i < MN_SKIP_COUNT; i++) {
      if (!k->skips[i]) continue;
      char num[24];
      mn_fmt_u64(num, k->skips[i]);
      int w = snprintf(skips + n, sizeof skips - n, "%s\"%s\":%s", n > 1 ? "," : "", mn_skip_names[i], num);
      if (w < 0 || (size_t)w >= sizeof skips - n - 2) break;
      n += (size_t)w;
    }
    skips[n++] = '}';
    skips[n] = 0;
    mn_line l;
    mn_line_begin(&l, linebuf, sizeof linebuf, "kstat");
    mn_line_u64(&l, "k", k->id);
    mn_line_u64(&l, "launches", k->launches);
    mn_line_u64(&l, "recorded_launches", k->recorded_launches);
    mn_line_u64(&l, "instances", k->ninst_recorded);
    mn_line_raw(&l, "skips", skips);
    mn_log_event(&l);
  }
}

void mn_flush(int resolve_events, int wait) {
  mn_record_settle(wait);
  if (resolve_events) mn_resolve_pending(wait);
  mn_emit_occurrences(0);
  write_kstats();
  R.launches_since_flush = 0;
  R.last_flush_ns = mn_now_ns();
}

static void write_exit_event(const char *how, int sig, char *buf, size_t cap) {
  mn_line l;
  mn_line_begin(&l, buf, cap, "exit");
  mn_line_str(&l, "how", how);
  if (sig) mn_line_i64(&l, "signal", sig);
  mn_line_u64(&l, "incomplete", (uint64_t)R.incomplete);
  mn_line_u64(&l, "stored_bytes", R.stored_bytes);
  mn_line_u64(&l, "holds_broken", R.hold.broken); /* timed launches the hold watchdog released: not timed */
  size_t n = mn_line_end(&l);
  if (n) {
    open_log();
    if (mn_log_write(&R.log, buf, n)) R.incomplete = 1;
  }
}

static void flush_at_exit(const char *how) {
  pthread_mutex_lock(&R.mu);
  if (R.active && !R.exited) {
    R.exited = 1;
    /* the runtime may have torn its context down already (its exit handler ran first): then the
     * events are gone, and what context_going() resolved is all there is */
    CUdevice d;
    int alive = D.ctxGetDevice && D.ctxGetDevice(&d) == CUDA_SUCCESS;
    mn_record_settle(1); /* the last prologue (no CUDA: host buffers and files only) */
    mn_flush(alive, alive);
    if (R.provenance_written) write_objects();
    mn_memory_at_exit();
    write_exit_event(how, 0, linebuf, sizeof linebuf);
  }
  pthread_mutex_unlock(&R.mu);
}

static void at_exit(void) { flush_at_exit("exit"); }

void mn_exit_hook_arm(void) {
  /* Registered after the runtime initialised, so it runs before the runtime's own teardown. */
  if (R.exit_hook) return;
  R.exit_hook = 1;
  atexit(at_exit);
}

__attribute__((destructor)) static void at_unload(void) {
  /* Last resort when exit handlers did not run (the runtime may be gone: no CUDA calls here). */
  if (!R.active || R.exited || in_signal) return;
  if (pthread_mutex_trylock(&R.mu) != 0) return;
  if (!R.exited) {
    R.exited = 1;
    mn_record_settle(1);
    mn_emit_occurrences(0);
    write_kstats();
    write_exit_event("unload", 0, linebuf, sizeof linebuf);
  }
  pthread_mutex_unlock(&R.mu);
}

static void on_fatal_signal(int sig, siginfo_t *si, void *uc) {
  int saved_errno = errno;
  if (R.active && !R.exited && !in_signal) {
    in_signal = 1;
    /* No locks and no CUDA here: a prologue still being written is waited for (its instance event
     * first), then the counts written so far plus the current ones, from static memory. */
    mn_record_settle_signal();
    mn_emit_occurrences(1);
    write_exit_event("signal", sig, sigbuf, sizeof sigbuf);
    in_signal = 0;
  }
  struct sigaction *old = &old_actions[sig];
  void (*h)(int) = old->sa_handler;
  if (h == SIG_IGN) {
    /* the app ignores it */
  } else if (h == SIG_DFL) {
    sigaction(sig, old, NULL);
    raise(sig); /* delivered when this handler returns (or at once for a fault that repeats) */
  } else if (old->sa_flags & SA_SIGINFO) {
    old->sa_sigaction(sig, si, uc);
  } else {
    h(sig);
  }
  errno = saved_errno;
}

/* ---------------------------------------------------------------------------------------------- */
/* texture and surface objects: handles alive now                                                 */

/* Texture and surface handles are small integers the driver may reuse once destroyed: the table holds
 * exactly the live ones, with what they were created from. */
static void texhandle_add(unsigned long long h, int surface, const CUDA_RESOURCE_DESC *res,
                          const CUDA_TEXTURE_DESC *tex, const CUDA_RESOURCE_VIEW_DESC *view) {
  static int full_logged;
  pthread_mutex_lock(&R.mu);
  if (R.ntex == R.captex) {
    size_t ncap = R.captex ? R.captex * 2 : 16;
    mn_texentry *n = realloc(R.texs, ncap * sizeof *n);
    if (!n) {
      mn_warn_once(&full_logged, "out of memory for the texture table", "objects created from now on are not recorded");
      pthread_mutex_unlock(&R.mu);
      return;
    }
    R.texs = n;
    R.captex = ncap;
  }
  mn_texentry *e = &R.texs[R.ntex++];
  memset(e, 0, sizeof *e);
  e->handle = h;
  e->surface = surface;
  if (res) e->res = *res;
  if (tex) e->tex = *tex;
  if (view) e->view = *view, e->has_view = 1;
  pthread_mutex_unlock(&R.mu);
}

static void texhandle_del(unsigned long long h) {
  pthread_mutex_lock(&R.mu);
  for (size_t i = 0; i < R.ntex; i++) {
    if (R.texs[i].handle == h) {
      R.texs[i] = R.texs[--R.ntex];
      break;
    }
  }
  pthread_mutex_unlock(&R.mu);
}

const mn_texentry *mn_tex_find(unsigned long long h) {
  for (size_t i = 0; i < R.ntex; i++)
    if (R.texs[i].handle == h) return &R.texs[i];
  return NULL;
}

int mn_texhandle_live(unsigned long long h) { return mn_tex_find(h) != NULL; }

CUresult mn_cu_tex_object_create(const mn_ip_slot *s, CUtexObject *pTexObject, const CUDA_RESOURCE_DESC *pResDesc,
                                 const CUDA_TEXTURE_DESC *pTexDesc, const CUDA_RESOURCE_VIEW_DESC *pResViewDesc) {
  CUresult r = ((PFN_cuTexObjectCreate_v5000)s->real)(pTexObject, pResDesc, pTexDesc, pResViewDesc);
  if (r == CUDA_SUCCESS && R.active && pTexObject) texhandle_add(*pTexObject, 0, pResDesc, pTexDesc, pResViewDesc);
  return r;
}

CUresult mn_cu_tex_object_destroy(const mn_ip_slot *s, CUtexObject texObject) {
  if (R.active) texhandle_del(texObject);
  return ((PFN_cuTexObjectDestroy_v5000)s->real)(texObject);
}

CUresult mn_cu_surf_object_create(const mn_ip_slot *s, CUsurfObject *pSurfObject, const CUDA_RESOURCE_DESC *pResDesc) {
  CUresult r = ((PFN_cuSurfObjectCreate_v5000)s->real)(pSurfObject, pResDesc);
  if (r == CUDA_SUCCESS && R.active && pSurfObject) texhandle_add(*pSurfObject, 1, pResDesc, NULL, NULL);
  return r;
}

CUresult mn_cu_surf_object_destroy(const mn_ip_slot *s, CUsurfObject surfObject) {
  if (R.active) texhandle_del(surfObject);
  return ((PFN_cuSurfObjectDestroy_v5000)s->real)(surfObject);
}
