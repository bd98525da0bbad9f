/* The held launch, shared by the LD_PRELOAD libraries that time launches in the app (librecord's recorded
 * launch and its reruns, native/recorder/timing.c; libapply's matched launches, native/apply/timing.c).
 *
 * A timed launch waits behind cuStreamWaitValue32 on a host-mapped flag that the host raises only once the
 * start event, the launch and the end event are queued, so host launch latency stays out of the event time
 * (replay's core does the same with a spin kernel).
 *
 * The flag only ever grows: hold n waits for flag >= n and is released by writing n. Resetting it to 0 for
 * the next hold re-blocked an earlier wait the GPU had not reached yet, on a stream nobody released again.
 *
 * While the stream is held, a driver call that waits for that stream never returns, since the flag goes up
 * only after the launch call returns. A launch that loads its function (lazy loading, the default since
 * CUDA 12.2: a function handed out unloaded is loaded by its first launch) may synchronize the context: an
 * app hung so on the H200. So the libraries load every function before its first held launch
 * (mn_hold_load_function), and a watchdog thread releases a hold still up after `ms` milliseconds: that
 * launch is not timed (mn_hold_release says so), holds are off for the rest of the run (`broken` counts it),
 * and the library reports it in its statistics and with a warning.
 *
 * Each library keeps its own policy (when to hold, what to do with the times) and its own settings; the
 * calls of one mn_hold come from one thread at a time (the library's lock), the watchdog has its own. */
#ifndef MNEME_HOLD_H
#define MNEME_HOLD_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#define MN_HOLD_MS_DEFAULT 100

/* The driver calls the hold makes, unwrapped (the library's own copies of the real entry points). */
typedef struct mn_hold_calls {
  PFN_cuStreamWaitValue32_v11070 streamWaitValue32;
  PFN_cuMemHostAlloc_v2020 memHostAlloc;
  PFN_cuMemHostGetDevicePointer_v3020 memHostGetDevicePointer;
  PFN_cuMemFreeHost_v2000 memFreeHost;   /* optional: frees the flag when setting up fails */
  PFN_cuFuncIsLoaded_v12040 funcIsLoaded; /* optional (drivers before 12.4: no lazy-loading queries) */
  PFN_cuFuncLoad_v12040 funcLoad;
} mn_hold_calls;

typedef struct mn_hold {
  int state;                 /* 0 not set up, 1 holds on, -1 off (turned off, unavailable, or broken) */
  int held;                  /* a hold is queued and not released yet */
  uint32_t seq;              /* the last hold's number: the flag holds it once released */
  uint64_t ms;               /* the watchdog's bound */
  uint64_t broken;           /* holds the watchdog released (their launches are not timed) */
  volatile uint32_t *flag;
  CUdeviceptr dflag;
  PFN_cuStreamWaitValue32_v11070 wait;
  /* the watchdog's own lock: the library's lock may be held while a launch blocks */
  pthread_mutex_t wd_mu;
  pthread_cond_t wd_cv;
  uint32_t wd_armed, wd_fired; /* the hold being watched (0: none), the last one the watchdog released */
  struct timespec wd_deadline;
} mn_hold;

/* Sets the hold up, once (later calls return at once, NULL): the host flag and the watchdog thread. `on` 0:
 * no holds at all. `ms` 0 means 1. Returns NULL when holds are on or turned off, else why they are off. */
const char *mn_hold_setup(mn_hold *h, const mn_hold_calls *cu, int on, uint64_t ms);
static inline int mn_hold_on(const mn_hold *h) { return h->state > 0; }

/* Queues the wait for the next hold on `s`; 1 when `s` is held now (release it with mn_hold_release after
 * the launch and the end event are queued, whatever happened), 0 when not (holds off, or the wait failed). */
int mn_hold_begin(mn_hold *h, CUstream s);

/* Raises the flag of the current hold (nothing when none is up). 1 when the watchdog had released it
 * first: the launch behind it waited inside the launch call, its time is not to be counted, and holds are
 * off from now on. */
int mn_hold_release(mn_hold *h);

/* Loads `f` if the driver says it is not loaded (lazy loading), so that its first launch, possibly a held
 * one, does not. CUDA_SUCCESS also when the driver cannot say (no cuFuncIsLoaded/cuFuncLoad) or f is NULL. */
CUresult mn_hold_load_function(const mn_hold_calls *cu, CUfunction f);

#endif
