/* libapply's process state (launch.c owns it; check.c uses it). */
#ifndef MNEME_APPLY_INTERNAL_H
#define MNEME_APPLY_INTERNAL_H

#include "../hold/hold.h"
#include "apply.h"

#define MNA_HANDLES 4096
#define MNA_PENDING 4096
#define MNA_EVPOOL 8192
#define MNA_MAX_WARN 32

typedef struct {
  CUfunction f;
  int first;
} mna_handle;

/* One timed launch: its event pair, taken before the hold. */
typedef struct {
  CUevent a, b;
} mna_timing;

typedef struct {
  CUevent start, stop;
  mna_entry *e;
} mna_pending;

typedef struct {
  CUresult (*funcGetName)(const char **, CUfunction);
  CUresult (*kernelGetName)(const char **, CUkernel);
  CUresult (*kernelGetFunction)(CUfunction *, CUkernel);
  CUresult (*funcGetModule)(CUmodule *, CUfunction);
  CUresult (*ctxGetCurrent)(CUcontext *);
  CUresult (*moduleLoad)(CUmodule *, const char *);
  CUresult (*moduleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*moduleGetGlobal)(CUdeviceptr *, size_t *, CUmodule, const char *);
  CUresult (*funcSetAttribute)(CUfunction, CUfunction_attribute, int);
  CUresult (*memcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*memcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*memcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*memcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*memAlloc)(CUdeviceptr *, size_t);
  CUresult (*memFree)(CUdeviceptr);
  CUresult (*memGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
  CUresult (*streamSynchronize)(CUstream);
  CUresult (*eventCreate)(CUevent *, unsigned);
  CUresult (*eventRecord)(CUevent, CUstream);
  CUresult (*eventQuery)(CUevent);
  CUresult (*eventSynchronize)(CUevent);
  CUresult (*eventElapsed)(float *, CUevent, CUevent);
  CUresult (*getErrorName)(CUresult, const char **);
  CUresult (*streamWaitValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
  CUresult (*memHostAlloc)(void **, size_t, unsigned);
  CUresult (*streamQuery)(CUstream);
  CUresult (*streamIsCapturing)(CUstream, CUstreamCaptureStatus *);
  CUresult (*memHostGetDevicePointer)(CUdeviceptr *, void *, unsigned);
  CUresult (*funcIsLoaded)(CUfunctionLoadingState *, CUfunction);
  CUresult (*funcLoad)(CUfunction);
  CUresult (*memFreeHost)(void *);
} mna_driver;

typedef struct {
  pthread_mutex_t mu;
  int enabled, apply, cu_loaded, stats_written, atexit_done;
  const char *stats_path;
  unsigned long check_k;
  uint32_t check_elem, check_norm;
  double check_atol, check_rtol;
  char check_failed[1024];
  mna_manifest m;
  mna_driver cu;
  mna_handle handles[MNA_HANDLES];
  mna_pending pending[MNA_PENDING];
  size_t phead, ptail;
  CUevent evpool[MNA_EVPOOL];
  size_t nevpool;
  uint64_t unmatched;
  mn_hold hold;           /* timing.c; hold.broken: holds the watchdog released (their launches are not timed) */
  char warn[MNA_MAX_WARN][512];
  int nwarn;
} mna_state;

extern mna_state A;

const char *mna_err(CUresult r);
int mna_mirror(mna_entry *e, CUstream s, int after);
/* Call mna_load_function on the function about to be launched first: a launch that loads it may wait for
 * the stream the hold blocks. */
int mna_time_begin(CUstream s, mna_timing *t);
void mna_time_end(CUstream s, mna_timing *t, mna_entry *e, CUresult launched);
void mna_load_function(CUfunction f);
void mna_resolve(int wait);
void mna_finish(void);
/* launch.c's launcher, opaque for check.c */
CUresult mna_fire(const void *c, CUfunction f, const uint32_t g[3], const uint32_t b[3], uint32_t shm, CUstream s,
                  void **p, void **x);
/* check.c */
void mna_check_settings(void);
CUresult mna_check(mna_entry *e, const void *c, CUfunction f, const uint32_t g[3], const uint32_t b[3], uint32_t shm,
                   const uint32_t tg[3], const uint32_t tb[3], uint32_t ts, CUstream s, CUstream os, void **params,
                   void **extra, void **pp);

#endif
