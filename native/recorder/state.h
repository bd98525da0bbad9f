/* librecord's internal state, shared by its translation units:
 *   recorder.c  configuration, the raw log, registration (kernels, variables), flushing, signals, exit;
 *   memory.c    the device arena, the pinned host region, memory the recorder cannot place, annotations;
 *   launch.c    launch interposition, instance deduplication, snapshots, occurrence timing.
 *
 * One mutex (R.mu) guards everything that changes after start-up. The recorder never holds it while
 * waiting for anything the app's other threads could need from it, and the callbacks it enqueues on
 * streams (deferred frees) never take it. */
#ifndef MNEME_RECORDER_STATE_H
#define MNEME_RECORDER_STATE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <regex.h>
#include <stdint.h>

#include "../snapshot.h"
#include "arena.h"
#include "rlog.h"
#include "select.h"

#define MN_RAW_VERSION 1
#define MN_DEFAULT_VA_BASE 0x153940000000ULL
#define MN_DEFAULT_VA_BYTES (4ULL << 30)
#define MN_DEFAULT_HOST_BASE 0x100000000000ULL
#define MN_DEFAULT_HOST_BYTES (1ULL << 30)
#define MN_DEVICE_ALIGN 256
#define MN_HOST_ALIGN 4096
#define MN_MERGE_GAP 16

/* Why a launch of a selected kernel was not recorded. The names are the raw log's vocabulary; the
 * first four are launch paths mneme cannot replay (reported as such), the rest are circumstances. */
enum mn_skip {
  MN_SKIP_GRAPH_CAPTURE,     /* launched into a stream being captured into a CUDA graph */
  MN_SKIP_GRAPH_NODE,        /* added to a graph as a kernel node (cudaGraphAddKernelNode) */
  MN_SKIP_DRIVER_API,        /* launched by the app through cuLaunchKernel & co. */
  MN_SKIP_OTHER_DEVICE,      /* launched on a device other than the one holding the arena */
  MN_SKIP_CAPTURE_ELSEWHERE, /* a capture was active on another stream (a sync would break it) */
  MN_SKIP_PENDING_ERROR,     /* the context held an error before the launch */
  MN_SKIP_NO_PARAM_INFO,     /* the driver gave no parameter layout */
  MN_SKIP_FAILED,            /* the launch or the snapshot failed */
  MN_SKIP_MAX_RECORDINGS,    /* a new instance after --max-recordings instances */
  MN_SKIP_SKIPPED,           /* within the first --skip launches */
  MN_SKIP_COUNT
};
extern const char *const mn_skip_names[MN_SKIP_COUNT];

typedef struct mn_inst mn_inst;

typedef struct mn_kernel {
  uint32_t id;
  char *name;                 /* mangled device name */
  const void *stub;           /* host stub registered for it, NULL for kernels seen only via the driver */
  void *handle;               /* cudaKernel_t from __cudaGetKernel (nvcc-built launches), or NULL */
  int selected;               /* -1: not decided yet */
  const mn_ktab_entry *tab;   /* from the app's IR, or NULL */
  int tab_checked;
  int params;                 /* 0 unknown, 1 known, -1 unavailable */
  uint32_t nparams;
  uint32_t *poff, *psize;
  uint32_t argbytes;
  uint64_t launches, recorded_launches;
  uint64_t skips[MN_SKIP_COUNT];
  uint32_t ninst_recorded;
  int announced;              /* "kernel" event written */
  int stats_dirty;
  mn_inst *insts;
  struct mn_kernel *next;
} mn_kernel;

struct mn_inst {
  uint32_t id;
  mn_kernel *k;
  uint64_t hash;
  uint8_t *key;
  size_t keylen;
  int recorded;               /* snapshots written; 0: the recording failed (key kept to not retry) */
  uint64_t count;             /* launches of this instance, the recorded one included */
  uint64_t flushed_count;
  uint64_t *samples;          /* in-app times (ns) not yet written */
  uint32_t nsamples, capsamples;
  uint64_t total_samples;
  mn_inst *next_in_kernel;
  mn_inst *next_all;          /* published with release stores; read by the signal handler */
};

typedef struct mn_gvar {
  const void *host;           /* host shadow */
  char *name;
  uint64_t size;
  int is_const, managed;
  uint64_t addr;
  int resolved;               /* 0 not yet, 1 ok, -1 failed */
} mn_gvar;

/* Memory the recorder does not place at a fixed address; a kernel receiving a pointer into it cannot be
 * replayed. The raw log carries the kind's number (mneme/record/rawlog.py FOREIGN_TEXT says what it is). */
enum mn_foreign_kind { MN_FOREIGN_MANAGED, MN_FOREIGN_HOST_REGISTERED, MN_FOREIGN_PINNED_OUTSIDE, MN_FOREIGN_OTHER_DEVICE };
typedef struct mn_foreign { uint64_t addr, size; int kind; } mn_foreign;

typedef struct mn_pending {
  cudaEvent_t start, stop;
  mn_inst *inst;
} mn_pending;

/* Most extra timed launches of a newly recorded instance (see launch.c: retime). */
#define MN_RETIME_MAX 64

typedef struct mn_config {
  char dir[4096];
  char run_id[128];
  char ranks[256];
  int rank;
  int max_recordings;         /* 0: no limit */
  uint64_t skip;
  uint64_t va_base, va_bytes, host_base, host_bytes;
  int epilogue_format;        /* 0 diff, 1 bytes, 2 best */
  uint32_t max_samples;
  uint32_t retime;            /* extra timed launches of a new instance (MNEME_RETIME) */
  int have_regex;
  regex_t regex;
  mn_ktab ktab;
} mn_config;

typedef struct mn_state {
  pthread_mutex_t mu;
  mn_config cfg;
  int active;                 /* this process records (dir set, rank selected) */
  int broken;                 /* a fatal recorder error: pass everything through */
  mn_log log;
  char logpath[4352];
  int log_opened;
  int incomplete;             /* some write failed */

  /* registration */
  mn_kernel *kernels;
  uint32_t nkernels;
  mn_gvar *vars;
  size_t nvars, capvars;
  int vars_resolved;

  /* memory */
  int arena_state;            /* 0 not tried, 1 ready, -1 failed */
  int device;                 /* device ordinal holding the arena */
  CUdevice cudev;
  mn_arena dev;
  uint64_t chunk;             /* physical backing granularity of the arena */
  uint8_t *backed;            /* per chunk */
  CUmemGenericAllocationHandle *handles;
  size_t nchunks;
  int host_state;
  mn_arena host;
  uint64_t pitch_align;
  mn_foreign *foreign;
  size_t nforeign, capforeign;
  mn_annot *annots;
  size_t nannots, capannots;
  unsigned long long *texhandles;
  size_t ntex, captex;
  int captures;               /* active stream captures */

  /* instances and timing */
  mn_inst *all_insts, *last_inst;
  uint32_t ninsts;
  mn_pending *pending;
  size_t npending, cappending, pending_head;
  cudaEvent_t *evpool;
  size_t nevpool, capevpool;
  uint64_t launches_since_flush;
  uint64_t last_flush_ns;
  int exit_hook;
  int exited;
  int provenance_written;
  uint64_t stored_bytes;
} mn_state;

extern mn_state R;

/* Entry points that no CUDA C header declares: the registration calls every translation unit's
 * module constructor makes (crt/host_runtime.h, C++ only) and the annotation call of mneme/tolerance.h. */
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun, const char *deviceName,
                            int thread_limit, uint3 *tid, uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize);
void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress, const char *deviceName, int ext,
                       size_t size, int constant, int global);
void __cudaRegisterManagedVar(void **fatCubinHandle, void **hostVarPtrAddress, char *deviceAddress,
                              const char *deviceName, int ext, size_t size, int constant, int global);
void __cudaUnregisterFatBinary(void **fatCubinHandle);
int mneme_recorder_annotate(const void *dev_ptr, size_t bytes, int elem, int mode, int norm, double tol, const char *tag);

/* ---- recorder.c ---- */
void mn_init(void);                          /* idempotent; cheap after the first call */
void mn_log_event(mn_line *l);               /* writes a finished line; marks the record incomplete on failure */
void mn_error(const char *what, const char *detail); /* "error" event + stderr */
void mn_warn_once(int *flag, const char *what, const char *detail);
mn_kernel *mn_kernel_by_stub(const void *stub);
mn_kernel *mn_kernel_by_handle(const void *handle);
mn_kernel *mn_kernel_by_name(const char *name, int create);
void mn_kernel_announce(mn_kernel *k);
int mn_kernel_selected(mn_kernel *k);
void mn_kernel_skip(mn_kernel *k, int why);
void mn_resolve_vars(void);
void mn_flush(int resolve_events, int wait);  /* called with R.mu held */
void mn_exit_hook_arm(void);
void mn_write_provenance(void);
uint64_t mn_now_ns(void);
int mn_texhandle_live(unsigned long long h);

/* The real implementation of `f` (the next definition after this library, else libcudart's), looked up
 * once per call site. NULL when no library defines it. */
void *mn_real_lookup(void **slot, const char *name);
#define REAL(f) ((__typeof__(&f))mn_real_lookup(({ static void *mn_slot_; &mn_slot_; }), #f))
/* Driver entry point through cuGetProcAddress (libcuda is dlopen'd), or NULL. `version` is the CUDA
 * version whose prototype the caller uses (cudaTypedefs.h's PFN_<name>_v<version>): asking for a newer
 * one can return a different ABI (cuCtxGetDevice at 13000 takes a second argument). */
void *mn_driver(const char *name, int version);
/* Why libcuda.so.1 could not be loaded, or NULL when it is loaded. */
const char *mn_driver_missing(void);

/* ---- memory.c ---- */
int mn_arena_ready(void);                    /* sets up the arena on first use; 1 ready, 0 not */
int mn_is_recorded_memory(uint64_t addr);    /* inside the arena or the pinned region */
const mn_foreign *mn_foreign_find(uint64_t addr);
const mn_gvar *mn_var_containing(uint64_t addr);
void mn_drain_deferred_frees(void);
void mn_memory_at_exit(void);

/* ---- launch.c ---- */
void mn_resolve_pending(int wait);
void mn_emit_occurrences(int signal_safe);

#endif
