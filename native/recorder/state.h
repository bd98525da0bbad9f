/* librecord's internal state, shared by its translation units:
 *   driver.c    the driver entry points librecord wraps (its native/interpose table);
 *   calls.c     the driver calls librecord makes itself (never through its own wrappers);
 *   recorder.c  configuration, the raw log, kernels, modules and variables, flushing, signals, exit;
 *   memory.c    the device arena, the pinned host region, memory the recorder cannot place, annotations;
 *   managed.c   managed memory and app-registered host memory: snapshotted by contents, placed by replay;
 *   launch.c    launches: the kernel a launch names, instance keys, the entry points, stream captures;
 *   instance.c  recording a new instance: prologue (on its own thread), timed launch, epilogue, its event;
 *   snapset.c   an instance's snapshot set: blobs and variables read, written, written back;
 *   timing.c    in-app timing: the event pool, pending samples, occurrences, held launches, reruns
 *               (launch.h holds what these four share);
 *   graph.c     CUDA graphs: a plan of each instantiated graph (graph.h), kept current by graphexec.c's exec
 *               updates and run node by node by its launches while the graph has kernels to record;
 *
 * Everything is seen at the driver API (docs/ARCHITECTURE.md says why), so apps linked with the static
 * and with the shared CUDA runtime are recorded the same way. One mutex (R.mu) guards everything that
 * changes after start-up. The recorder never holds it while waiting for anything the app's other
 * threads could need from it, and the callbacks it enqueues on streams (deferred frees) never take it. */
#ifndef MNEME_RECORDER_STATE_H
#define MNEME_RECORDER_STATE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <cuda.h>
#include <cudaTypedefs.h>
#include <pthread.h>
#include <regex.h>
#include <stdint.h>

#include "../hold/hold.h"
#include "../interpose/interpose.h"
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
/* Mapped device memory kept free below the first allocation and behind the last one. cudaMalloc's
 * memory has the driver's own allocations around it, so kernels that read a row before or after their
 * buffers (Rodinia's srad reads J[-cols + tx] for its top row and overwrites the value) run fine plain;
 * in an arena whose first allocation sat at the very start of the mapping they faulted (illegal address). */
#define MN_ARENA_GUARD (2ULL << 20)
#define MN_HOST_ALIGN 4096
#define MN_MERGE_GAP 16

/* Why a launch of a selected kernel was not recorded. The names are the raw log's vocabulary; the
 * first five are launch paths mneme cannot replay (reported as such), the rest are circumstances. */
enum mn_skip {
  MN_SKIP_GRAPH_CAPTURE,     /* no longer produced: kernels of graphs are recorded when the graph is launched */
  MN_SKIP_GRAPH_NODE,        /* no longer produced (as graph_capture; both kept for old logs) */
  MN_SKIP_DRIVER_API,        /* no longer produced: driver-API launches are recorded (kept for old logs) */
  MN_SKIP_OTHER_DEVICE,      /* launched on a device other than the one holding the arena */
  MN_SKIP_GRAPH_OPAQUE,      /* a kernel node of a graph that cannot be run node by node (graph.c says why) */
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
  CUkernel kern;              /* from cuLibraryGetKernel, or NULL */
  CUfunction func;            /* from cuModuleGetFunction / cuKernelGetFunction / a launch, or NULL */
  int selected;               /* -1: not decided yet */
  const mn_ktab_entry *tab;   /* from the app's IR, or NULL */
  int tab_checked;
  int params;                 /* 0 unknown, 1 known, -1 unavailable */
  uint64_t last_run_ns;       /* the last recorded launch's time: retiming is skipped beyond the budget */
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
  int logged;                 /* its instance event is in the log (occurrence lines only after it) */
  uint64_t count;             /* launches of this instance, the recorded one included */
  uint64_t flushed_count;
  uint64_t *samples;          /* in-app times (ns) not yet written */
  uint32_t nsamples, capsamples;
  uint64_t total_samples;
  mn_inst *next_in_kernel;
  mn_inst *next_all;          /* published with release stores; read by the signal handler */
};

typedef struct mn_gvar {
  char *name;
  uint64_t size;
  int is_const, managed;
  uint64_t addr;
  int resolved;               /* 1: the driver gave its address */
} mn_gvar;

/* Memory the recorder does not place at a fixed address and does not snapshot (managed.c says which
 * memory it snapshots instead); a kernel receiving a pointer into it cannot be replayed. The raw log
 * carries the kind's number (mneme/record/rawlog.py FOREIGN_TEXT says what it is; MN_FOREIGN_MANAGED
 * only when the managed-memory table ran out of host memory). */
enum mn_foreign_kind {
  MN_FOREIGN_MANAGED, MN_FOREIGN_HOST_REGISTERED, MN_FOREIGN_PINNED_OUTSIDE, MN_FOREIGN_OTHER_DEVICE,
  MN_FOREIGN_GRAPH_MEMORY /* a graph's memory allocation node (graph.c notes it at instantiation) */
};
typedef struct mn_foreign { uint64_t addr, size; int kind; } mn_foreign;

/* A texture or surface object alive now, with the descriptors it was created from. */
typedef struct mn_texentry {
  unsigned long long handle;
  int surface;
  int has_view;
  CUDA_RESOURCE_DESC res;
  CUDA_TEXTURE_DESC tex;
  CUDA_RESOURCE_VIEW_DESC view;
} mn_texentry;

/* The objects one launch's arguments name and the arrays behind them (texture.c). `why` is set when
 * they cannot be captured (the instance is then recorded without them and reported not replayable). */
typedef struct mn_texset {
  mn_texobj *objs;
  size_t nobjs;
  mn_array *arrays;           /* data malloc'd */
  uint64_t *level_handles;    /* MN_TEX_MAX_LEVELS per array: the CUarray of each level */
  size_t narrays;
  char why[256];
} mn_texset;
#define MN_TEX_MAX_LEVELS 16

typedef struct mn_pending {
  CUevent start, stop;
  mn_inst *inst;
} mn_pending;

/* Most extra timed launches of a newly recorded instance (see timing.c: mn_retime). */
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
  uint32_t retime;            /* extra timed launches of a new instance, at most (MNEME_RETIME) */
  uint64_t retime_budget_ns;  /* and at most this long per instance (MNEME_RETIME_BUDGET_US; 0: no bound) */
  int snapshot_thread;        /* the prologue is written on a thread of its own (MNEME_SNAPSHOT_THREAD; instance.c) */
  uint64_t snap_pool_bytes;   /* pinned host memory kept for snapshot buffers across instances (MNEME_SNAP_POOL) */
  uint32_t hold;              /* 0: timed launches are not held (MNEME_RECORD_HOLD) */
  uint64_t hold_ms;           /* the hold watchdog's bound (MNEME_RECORD_HOLD_MS) */
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
  int heap_live;              /* a kernel that allocates from the device heap has run: its objects live outside
                                 every snapshot, so a rerun of any kernel could change them (no retime from then on) */

  /* registration */
  mn_kernel *kernels;
  uint32_t nkernels;
  mn_gvar *vars;
  size_t nvars, capvars;
  CUlibrary *libs;            /* loaded libraries and modules, where variables are looked up by name */
  size_t nlibs, caplibs;
  CUmodule *mods;
  size_t nmods, capmods;

  /* memory */
  int arena_state;            /* 0 not tried, 1 ready, -1 failed */
  int device;                 /* device ordinal holding the arena (-1 before) */
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
  mn_texentry *texs;
  size_t ntex, captex;
  int captures;               /* active stream captures */

  /* instances and timing */
  mn_inst *all_insts, *last_inst;
  uint32_t ninsts;
  mn_pending *pending;
  size_t npending, cappending, pending_head;
  CUevent *evpool;
  size_t nevpool, capevpool;
  mn_hold hold;               /* the timing hold (timing.c, native/hold); hold.broken goes into the exit event */
  uint64_t launches_since_flush;
  uint64_t last_flush_ns;
  int exit_hook;
  int exited;
  int provenance_written;
  uint64_t stored_bytes;
} mn_state;

extern mn_state R;

/* The annotation call of mneme/tolerance.h (found with dlsym). */
int mneme_recorder_annotate(const void *dev_ptr, size_t bytes, int elem, int mode, int norm, double tol, const char *tag);

/* ---- calls.c: the driver calls librecord makes itself (legacy-stream variants, unwrapped) ---- */
typedef struct mn_drv {
  PFN_cuGetErrorString_v6000 getErrorString;
  PFN_cuCtxGetDevice_v2000 ctxGetDevice;
  PFN_cuCtxSynchronize_v2000 ctxSynchronize;
  PFN_cuStreamSynchronize_v2000 streamSynchronize;
  PFN_cuStreamIsCapturing_v10000 streamIsCapturing;
  PFN_cuMemcpyDtoH_v3020 memcpyDtoH;
  PFN_cuMemcpyHtoD_v3020 memcpyHtoD;
  PFN_cuEventCreate_v2000 eventCreate;
  PFN_cuEventDestroy_v4000 eventDestroy;
  PFN_cuEventRecord_v2000 eventRecord;
  PFN_cuEventQuery_v2000 eventQuery;
  PFN_cuEventSynchronize_v2000 eventSynchronize;
  PFN_cuEventElapsedTime_v2000 eventElapsed;
  PFN_cuLaunchHostFunc_v10000 launchHostFunc;
  PFN_cuMemHostRegister_v6050 hostRegister;
  PFN_cuMemHostUnregister_v4000 hostUnregister;
  PFN_cuMemHostAlloc_v2020 hostAlloc;
  PFN_cuMemHostGetDevicePointer_v3020 hostGetDevicePointer;
  PFN_cuMemFreeHost_v2000 freeHost;
  PFN_cuMemAllocPitch_v3020 allocPitch;
  PFN_cuMemFree_v3020 memFree;
  PFN_cuLibraryGetGlobal_v12000 libraryGetGlobal;
  PFN_cuModuleGetGlobal_v3020 moduleGetGlobal;
  PFN_cuDeviceGetName_v2000 deviceGetName;
  PFN_cuDeviceGetAttribute_v2000 deviceGetAttribute;
  PFN_cuDeviceTotalMem_v3020 deviceTotalMem;
  PFN_cuDeviceGetUuid_v9020 deviceGetUuid;
  PFN_cuDriverGetVersion_v2020 driverGetVersion;
  PFN_cuMemGetAllocationGranularity_v10020 getGranularity;
  PFN_cuMemAddressReserve_v10020 addressReserve;
  PFN_cuMemAddressFree_v10020 addressFree;
  PFN_cuMemCreate_v10020 create;
  PFN_cuMemRelease_v10020 release;
  PFN_cuMemMap_v10020 map;
  PFN_cuMemUnmap_v10020 unmap;
  PFN_cuMemSetAccess_v10020 setAccess;
  /* optional (NULL on older drivers) */
  PFN_cuCtxGetLimit_v3010 ctxGetLimit;
  PFN_cuStreamWaitValue32_v11070 streamWaitValue32;
  PFN_cuFuncGetParamInfo_v12040 funcGetParamInfo;
  PFN_cuFuncIsLoaded_v12040 funcIsLoaded;
  PFN_cuFuncLoad_v12040 funcLoad;
  PFN_cuFuncGetName_v12030 funcGetName;
  PFN_cuKernelGetFunction_v12000 kernelGetFunction;
  PFN_cuKernelGetName_v12030 kernelGetName;
  PFN_cuArray3DGetDescriptor_v3020 array3DGetDescriptor;
  PFN_cuMipmappedArrayGetLevel_v5000 mipmappedArrayGetLevel;
  PFN_cuMemcpy3D_v3020 memcpy3D;
} mn_drv;
extern mn_drv D;
/* Loads D once; 0 when every required call is there, else -1 with the reason in why. */
int mn_drv_load(char *why, size_t cap);
const char *mn_cu_err(CUresult r);

/* ---- recorder.c ---- */
void mn_init(void);                          /* idempotent; cheap after the first call */
void mn_log_event(mn_line *l);               /* writes a finished line; marks the record incomplete on failure */
void mn_error(const char *what, const char *detail); /* "error" event + stderr */
void mn_warn_once(int *flag, const char *what, const char *detail);
mn_kernel *mn_kernel_by_handle(const void *handle);  /* a CUkernel or CUfunction seen before */
void mn_kernel_add_handle(mn_kernel *k, const void *handle);
mn_kernel *mn_kernel_by_name(const char *name, int create);
void mn_kernel_announce(mn_kernel *k);
int mn_kernel_selected(mn_kernel *k);
/* The kernel's kernel-table entry (NULL: not in the table), looked up once. */
const mn_ktab_entry *mn_kernel_entry(mn_kernel *k);
/* Every launch of k that runs, selected or not and however it runs (a stream launch, a graph's): once a
 * kernel that allocates from the device heap ran, R.heap_live stops every timing rerun. R.mu held. */
void mn_kernel_runs(mn_kernel *k);
void mn_kernel_skip(mn_kernel *k, int why);
/* The variables the kernel's IR uses that no lookup has shown yet, asked of every loaded library. */
void mn_resolve_vars(const mn_kernel *k);
void mn_flush(int resolve_events, int wait);  /* called with R.mu held */
void mn_exit_hook_arm(void);
void mn_write_provenance(void);
uint64_t mn_now_ns(void);
int mn_texhandle_live(unsigned long long h);
const mn_texentry *mn_tex_find(unsigned long long h);   /* with R.mu held */

/* ---- texture.c ---- */
/* Captures the objects at the argument offsets `toff` (their arrays' contents included). 0, or -1 with
 * t->why set; either way mn_tex_free releases it. */
int mn_tex_capture(const uint8_t *args, const uint64_t *toff, size_t ntex, mn_texset *t);
/* Reads the arrays' contents again (after the launch: surface writes). */
int mn_tex_reread(mn_texset *t);
/* Writes the objects (prologue only) and the arrays. */
int mn_tex_write(mn_writer *w, const mn_texset *t, int prologue);
void mn_tex_free(mn_texset *t);
/* ---- memory.c ---- */
int mn_arena_ready(void);                    /* sets up the arena on first use; 1 ready, 0 not */
int mn_is_recorded_memory(uint64_t addr);    /* inside the arena or the pinned region */
const mn_foreign *mn_foreign_find(uint64_t addr);
const mn_gvar *mn_var_containing(uint64_t addr);
void mn_drain_deferred_frees(void);
void mn_memory_at_exit(void);
void mn_foreign_note(uint64_t addr, uint64_t size, int kind);
void mn_foreign_forget(uint64_t addr);

/* ---- managed.c: managed and app-registered host memory, snapshotted with each recorded launch ---- */
typedef struct mn_placed { uint64_t addr, size; uint32_t space; /* MN_SPACE_MANAGED or _HOST_PINNED */ } mn_placed;
const mn_placed *mn_placed_find(uint64_t addr);
int mn_placed_del(uint64_t addr);            /* 1 when a range started at addr */
size_t mn_placed_count(void);
const mn_placed *mn_placed_at(size_t i);     /* in address order */
void mn_placed_log(mn_line *l);              /* the ranges, their count and bytes per kind, into an "inst" event */

/* ---- copy.c ---- */
/* Copies `size` device bytes at `src` to host memory `dst` (pinned staging, overlapped); 0 or -1. */
int mn_copy_dtoh(void *dst, uint64_t src, uint64_t size);
/* Snapshot buffers: pinned and reused across instances where the pool allows, else malloc'd (copy.c). */
void *mn_snap_alloc(uint64_t size);
void mn_snap_free(void *p);
int mn_copy_htod(uint64_t dst, const void *src, uint64_t size);
uint64_t mn_precise_ns(void);                /* CLOCK_MONOTONIC */

/* ---- timing.c ---- */
void mn_resolve_pending(int wait);
void mn_emit_occurrences(int signal_safe);
/* ---- launch.c ---- */
mn_kernel *mn_kernel_of(CUfunction f);             /* the kernel a launch names (a CUfunction or CUkernel); R.mu held */
int mn_kernel_layout(mn_kernel *k, CUfunction f);  /* its parameter offsets and sizes known: 1; R.mu held */
/* A graph's kernel node run as a stream launch on `st` (graph.c; R.mu not held): recorded, or counted into
 * the recorded instance returned in *counted (NULL: none), or skipped with *why (-1: no reason given). */
CUresult mn_launch_graph_kernel(CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shmem,
                                CUstream st, void **params, mn_inst **counted, int *why);
/* ---- instance.c ---- */
/* The instance whose prologue is written on its own thread: finished at once (wait) or when
 * done; R.mu held. The fatal-signal path waits for it (bounded) and writes its event, signal-safely. */
void mn_record_settle(int wait);
void mn_record_settle_signal(void);

/* ---- the work behind driver.c's wrappers (memory.c, recorder.c, launch.c) ---- */
CUresult mn_cu_mem_alloc(const mn_ip_slot *slot, CUdeviceptr *p, size_t n);
CUresult mn_cu_mem_alloc_pitch(const mn_ip_slot *slot, CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e);
CUresult mn_cu_mem_free(const mn_ip_slot *slot, CUdeviceptr p);
CUresult mn_cu_mem_alloc_async(const mn_ip_slot *slot, CUdeviceptr *p, size_t n, CUstream s);
CUresult mn_cu_mem_alloc_from_pool_async(const mn_ip_slot *slot, CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s);
CUresult mn_cu_mem_free_async(const mn_ip_slot *slot, CUdeviceptr p, CUstream s);
CUresult mn_cu_mem_alloc_managed(const mn_ip_slot *slot, CUdeviceptr *p, size_t n, unsigned int f);
CUresult mn_cu_mem_alloc_host(const mn_ip_slot *slot, void **p, size_t n);
CUresult mn_cu_mem_host_alloc(const mn_ip_slot *slot, void **p, size_t n, unsigned int f);
CUresult mn_cu_mem_free_host(const mn_ip_slot *slot, void *p);
CUresult mn_cu_mem_host_register(const mn_ip_slot *slot, void *p, size_t n, unsigned int f);
CUresult mn_cu_mem_host_unregister(const mn_ip_slot *slot, void *p);
CUresult mn_cu_launch_kernel(const mn_ip_slot *slot, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s, void **params, void **extra);
CUresult mn_cu_launch_kernel_ex(const mn_ip_slot *slot, const CUlaunchConfig *c, CUfunction f, void **params, void **extra);
CUresult mn_cu_launch_cooperative_kernel(const mn_ip_slot *slot, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s, void **params);
CUresult mn_cu_library_load_data(const mn_ip_slot *slot, CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned int njo, CUlibraryOption *lo, void **lv, unsigned int nlo);
CUresult mn_cu_library_load_from_file(const mn_ip_slot *slot, CUlibrary *lib, const char *file, CUjit_option *jo, void **jv, unsigned int njo, CUlibraryOption *lo, void **lv, unsigned int nlo);
CUresult mn_cu_library_unload(const mn_ip_slot *slot, CUlibrary lib);
CUresult mn_cu_library_get_kernel(const mn_ip_slot *slot, CUkernel *k, CUlibrary lib, const char *name);
CUresult mn_cu_library_get_global(const mn_ip_slot *slot, CUdeviceptr *p, size_t *n, CUlibrary lib, const char *name);
CUresult mn_cu_library_get_managed(const mn_ip_slot *slot, CUdeviceptr *p, size_t *n, CUlibrary lib, const char *name);
CUresult mn_cu_module_load_data(const mn_ip_slot *slot, CUmodule *m, const void *image);
CUresult mn_cu_module_load_data_ex(const mn_ip_slot *slot, CUmodule *m, const void *image, unsigned int n, CUjit_option *o, void **v);
CUresult mn_cu_module_load_fat_binary(const mn_ip_slot *slot, CUmodule *m, const void *fatbin);
CUresult mn_cu_module_load(const mn_ip_slot *slot, CUmodule *m, const char *fname);
CUresult mn_cu_module_unload(const mn_ip_slot *slot, CUmodule m);
CUresult mn_cu_module_get_function(const mn_ip_slot *slot, CUfunction *f, CUmodule m, const char *name);
CUresult mn_cu_module_get_global(const mn_ip_slot *slot, CUdeviceptr *p, size_t *n, CUmodule m, const char *name);
CUresult mn_cu_kernel_get_function(const mn_ip_slot *slot, CUfunction *f, CUkernel k);
CUresult mn_cu_tex_object_create(const mn_ip_slot *slot, CUtexObject *t, const CUDA_RESOURCE_DESC *r, const CUDA_TEXTURE_DESC *d, const CUDA_RESOURCE_VIEW_DESC *v);
CUresult mn_cu_tex_object_destroy(const mn_ip_slot *slot, CUtexObject t);
CUresult mn_cu_surf_object_create(const mn_ip_slot *slot, CUsurfObject *t, const CUDA_RESOURCE_DESC *r);
CUresult mn_cu_surf_object_destroy(const mn_ip_slot *slot, CUsurfObject t);
CUresult mn_cu_stream_begin_capture(const mn_ip_slot *slot, CUstream s, CUstreamCaptureMode mode);
CUresult mn_cu_stream_begin_capture_v1(const mn_ip_slot *slot, CUstream s);
CUresult mn_cu_stream_begin_capture_to_graph(const mn_ip_slot *slot, CUstream s, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode);
CUresult mn_cu_stream_end_capture(const mn_ip_slot *slot, CUstream s, CUgraph *g);
/* graph.c */
CUresult mn_cu_graph_instantiate_v1(const mn_ip_slot *slot, CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t n);
CUresult mn_cu_graph_instantiate_with_flags(const mn_ip_slot *slot, CUgraphExec *e, CUgraph g, unsigned long long flags);
CUresult mn_cu_graph_instantiate_with_params(const mn_ip_slot *slot, CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p);
CUresult mn_cu_graph_exec_destroy(const mn_ip_slot *slot, CUgraphExec e);
CUresult mn_cu_graph_exec_kernel_set_v1(const mn_ip_slot *slot, CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v1 *p);
CUresult mn_cu_graph_exec_kernel_set(const mn_ip_slot *slot, CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v2 *p);
CUresult mn_cu_graph_exec_memcpy_set(const mn_ip_slot *slot, CUgraphExec e, CUgraphNode n, const CUDA_MEMCPY3D *p, CUcontext c);
CUresult mn_cu_graph_exec_memset_set(const mn_ip_slot *slot, CUgraphExec e, CUgraphNode n, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext c);
CUresult mn_cu_graph_exec_host_set(const mn_ip_slot *slot, CUgraphExec e, CUgraphNode n, const CUDA_HOST_NODE_PARAMS *p);
CUresult mn_cu_graph_exec_child_set(const mn_ip_slot *slot, CUgraphExec e, CUgraphNode n, CUgraph child);
CUresult mn_cu_graph_exec_record_set(const mn_ip_slot *slot, CUgraphExec e, CUgraphNode n, CUevent ev);
CUresult mn_cu_graph_exec_wait_set(const mn_ip_slot *slot, CUgraphExec e, CUgraphNode n, CUevent ev);
CUresult mn_cu_graph_exec_node_set(const mn_ip_slot *slot, CUgraphExec e, CUgraphNode n, CUgraphNodeParams *p);
CUresult mn_cu_graph_node_set_enabled(const mn_ip_slot *slot, CUgraphExec e, CUgraphNode n, unsigned int on);
CUresult mn_cu_graph_exec_update_v1(const mn_ip_slot *slot, CUgraphExec e, CUgraph g, CUgraphNode *err, CUgraphExecUpdateResult *res);
CUresult mn_cu_graph_exec_update(const mn_ip_slot *slot, CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info);
CUresult mn_cu_graph_launch(const mn_ip_slot *slot, CUgraphExec e, CUstream s);

CUresult mn_cu_primary_ctx_release(const mn_ip_slot *slot, CUdevice d);
CUresult mn_cu_primary_ctx_reset(const mn_ip_slot *slot, CUdevice d);
CUresult mn_cu_ctx_destroy(const mn_ip_slot *slot, CUcontext c);

#endif
