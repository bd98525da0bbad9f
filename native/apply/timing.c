/* In-app timing of the matched launches: an event pair around the launch on the app's stream, resolved
 * lazily in launch order, the launch held behind a host flag so host launch latency stays out of the time,
 * and the watchdog that makes the hold safe.
 *
 * The hold: on an idle stream the launch waits behind cuStreamWaitValue32 on a host flag that is raised once
 * the start event, the launch and the end event are queued (as the recorder's retimed launches and the
 * replay core do). A busy stream needs no hold: the start event waits behind earlier work there.
 *
 * The flag only ever grows: hold n waits for flag >= n and is released by writing n (resetting it to 0 for
 * the next hold re-blocked an earlier wait the GPU had not reached yet, on a stream nobody released again).
 *
 * The watchdog: while the stream is held, a driver call that waits for that stream never returns, since the
 * flag is raised only after the launch call returns. A launch that loads its function (lazy loading, the
 * default since CUDA 12.2: cuModuleGetFunction / cuKernelGetFunction may hand out a function that its first
 * launch loads) may synchronize the context: the app hung on the H200. Functions are loaded before any hold
 * (mna_load_function), and a thread of libapply's own releases a hold still up after MNEME_APPLY_HOLD_MS
 * (default 100 ms): that launch is not timed, holds stay off for the rest of the run, and the statistics and
 * a warning say so.
 *
 *   MNEME_APPLY_HOLD     0: no hold at all
 *   MNEME_APPLY_HOLD_MS  the watchdog's bound in milliseconds (default 100) */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define MNA_HOLD_MS_DEFAULT 100

static CUevent ev_get(void) {
  if (A.nevpool) return A.evpool[--A.nevpool];
  CUevent ev = NULL;
  if (!A.cu.eventCreate || A.cu.eventCreate(&ev, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return NULL;
  return ev;
}

static void ev_put(CUevent ev) {
  if (ev && A.nevpool < MNA_EVPOOL) A.evpool[A.nevpool++] = ev;
}

void mna_resolve(int wait) {
  while (A.phead != A.ptail) {
    mna_pending *p = &A.pending[A.phead];
    CUresult q = wait ? A.cu.eventSynchronize(p->stop) : A.cu.eventQuery(p->stop);
    if (q == CUDA_ERROR_NOT_READY && !wait) break;
    float ms = 0;
    if (q == CUDA_SUCCESS && A.cu.eventElapsed(&ms, p->start, p->stop) == CUDA_SUCCESS && ms >= 0) {
      uint64_t ns = (uint64_t)((double)ms * 1e6 + 0.5);
      mna_entry *e = p->e;
      if (e->nsamples < MNA_MAX_SAMPLES) e->samples[e->nsamples] = ns > UINT32_MAX ? UINT32_MAX : (uint32_t)ns;
      e->nsamples++;
      e->total_ns += ns;
    } else {
      p->e->timed_lost++;
    }
    ev_put(p->start);
    ev_put(p->stop);
    A.phead = (A.phead + 1) % MNA_PENDING;
  }
}

/* Lazy loading: load `f` now, so that its first launch (possibly a held one) does not. */
void mna_load_function(CUfunction f) {
  CUfunctionLoadingState st = CU_FUNCTION_LOADING_STATE_UNLOADED;
  if (!f || !A.cu.funcIsLoaded || !A.cu.funcLoad) return;
  if (A.cu.funcIsLoaded(&st, f) == CUDA_SUCCESS && st == CU_FUNCTION_LOADING_STATE_LOADED) return;
  CUresult r = A.cu.funcLoad(f);
  if (r != CUDA_SUCCESS) mna_warn("loading a function before its timed launch failed (%s)", mna_err(r));
}

/* -- the watchdog ---------------------------------------------------------------------------------- */
/* Its own lock (the launch path holds A.mu while a launch may block), taken only briefly by the launch path. */
static pthread_mutex_t wd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wd_cv;
static uint32_t wd_armed, wd_fired; /* the hold being watched (0: none), the last one the watchdog released */
static struct timespec wd_deadline;

static void *watchdog(void *arg) {
  (void)arg;
  pthread_mutex_lock(&wd_mu);
  for (;;) {
    while (!wd_armed) pthread_cond_wait(&wd_cv, &wd_mu);
    uint32_t seq = wd_armed;
    int rc = pthread_cond_timedwait(&wd_cv, &wd_mu, &wd_deadline);
    if (rc == ETIMEDOUT && wd_armed == seq) {
      __sync_synchronize();
      *A.hold_flag = seq; /* the latest hold: writing it never lowers the flag */
      wd_fired = seq;
      wd_armed = 0;
    }
  }
  return NULL;
}

static int watchdog_start(void) {
  pthread_condattr_t ca;
  pthread_attr_t ta;
  pthread_t t;
  if (pthread_condattr_init(&ca) != 0) return 0;
  int ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&wd_cv, &ca) == 0;
  pthread_condattr_destroy(&ca);
  if (!ok || pthread_attr_init(&ta) != 0) return 0;
  ok = pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED) == 0 && pthread_create(&t, &ta, watchdog, NULL) == 0;
  pthread_attr_destroy(&ta);
  return ok;
}

static void watchdog_arm(uint32_t seq) {
  pthread_mutex_lock(&wd_mu);
  clock_gettime(CLOCK_MONOTONIC, &wd_deadline);
  uint64_t ns = (uint64_t)wd_deadline.tv_nsec + A.hold_ms * 1000000ull;
  wd_deadline.tv_sec += (time_t)(ns / 1000000000ull);
  wd_deadline.tv_nsec = (long)(ns % 1000000000ull);
  wd_armed = seq;
  pthread_cond_signal(&wd_cv);
  pthread_mutex_unlock(&wd_mu);
}

/* 1 when the watchdog released hold `seq` before the launch path could */
static int watchdog_disarm(uint32_t seq) {
  pthread_mutex_lock(&wd_mu);
  int fired = wd_fired == seq;
  wd_armed = 0;
  pthread_cond_signal(&wd_cv);
  pthread_mutex_unlock(&wd_mu);
  return fired;
}

/* -- the hold ----------------------------------------------------------------------------------------- */
static int hold_ready(void) {
  if (A.hold_state) return A.hold_state > 0;
  A.hold_state = -1;
  const char *env = getenv("MNEME_APPLY_HOLD");
  if ((env && strcmp(env, "0") == 0) || !A.cu.streamWaitValue32 || !A.cu.memHostAlloc || !A.cu.memHostGetDevicePointer)
    return 0;
  const char *ms = getenv("MNEME_APPLY_HOLD_MS");
  A.hold_ms = ms && *ms ? strtoull(ms, NULL, 10) : MNA_HOLD_MS_DEFAULT;
  if (A.hold_ms == 0) A.hold_ms = 1;
  void *h = NULL;
  CUdeviceptr d = 0;
  if (A.cu.memHostAlloc(&h, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS) return 0;
  if (A.cu.memHostGetDevicePointer(&d, h, 0) != CUDA_SUCCESS) return 0;
  memset(h, 0, 64);
  A.hold_flag = (volatile uint32_t *)h;
  A.hold_dflag = d;
  if (!watchdog_start()) {
    mna_warn("cannot start the hold watchdog; timed launches are not held (host launch latency is timed)");
    return 0;
  }
  A.hold_state = 1;
  return 1;
}

/* Raises the flag of the current hold; 1 when the watchdog had to (the launch is then not timed). */
static int release_hold(void) {
  if (!A.held) return 0;
  __sync_synchronize();
  *A.hold_flag = A.hold_seq;
  A.held = 0;
  if (!watchdog_disarm(A.hold_seq)) return 0;
  A.holds_broken++;
  A.hold_state = -1;
  mna_warn("a timed launch stayed held for more than %llu ms (the driver waited for the held stream inside the "
           "launch); the watchdog released it, its time is not counted and timed launches are no longer held",
           (unsigned long long)A.hold_ms);
  return 1;
}

int mna_time_begin(CUstream s, mna_timing *t) {
  memset(t, 0, sizeof *t);
  if (!A.cu.eventRecord || !A.cu.eventQuery || !A.cu.eventSynchronize || !A.cu.eventElapsed) return 0;
  mna_resolve(0);
  if ((A.ptail + 1) % MNA_PENDING == A.phead) mna_resolve(1);
  /* everything that may call the driver comes before the hold: only the launch and two event records follow */
  t->a = ev_get();
  t->b = t->a ? ev_get() : NULL;
  if (!t->b) {
    ev_put(t->a);
    t->a = NULL;
    return 0;
  }
  /* only on an idle stream: there the gap would be timed, and nothing queued behind the wait can fill the
   * launch queue while the host still has to raise the flag */
  if (hold_ready() && A.cu.streamQuery && A.cu.streamQuery(s) == CUDA_SUCCESS) {
    uint32_t next = A.hold_seq + 1;
    if (next == 0) { /* after 2^32 - 1 holds the flag cannot grow any more: no more holds */
      A.hold_state = -1;
    } else if (A.cu.streamWaitValue32(s, A.hold_dflag, next, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS) {
      A.hold_seq = t->seq = next;
      A.held = 1;
      watchdog_arm(next);
    }
  }
  if (A.cu.eventRecord(t->a, s) != CUDA_SUCCESS) {
    release_hold();
    ev_put(t->a);
    ev_put(t->b);
    t->a = t->b = NULL;
    return 0;
  }
  return 1;
}

void mna_time_end(CUstream s, mna_timing *t, mna_entry *e, CUresult launched) {
  if (!t->a) {
    release_hold();
    return;
  }
  int recorded = launched == CUDA_SUCCESS && A.cu.eventRecord(t->b, s) == CUDA_SUCCESS;
  int broken = release_hold(); /* always, whatever happened above */
  if (!recorded || broken) {
    if (broken) e->timed_lost++;
    ev_put(t->a);
    ev_put(t->b);
    return;
  }
  A.pending[A.ptail] = (mna_pending){t->a, t->b, e};
  A.ptail = (A.ptail + 1) % MNA_PENDING;
}
