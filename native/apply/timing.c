/* In-app timing of the matched launches: an event pair around the launch on the app's stream, resolved
 * lazily in launch order, the launch held behind a host flag so host launch latency stays out of the time.
 *
 * The hold, its growing flag and its watchdog are native/hold (shared with the recorder; hold.h says why
 * each is there). libapply's policy: only a launch on an idle stream is held (a busy stream needs no hold:
 * the start event waits behind earlier work there, and nothing queued behind the wait can fill the launch
 * queue while the host still has to raise the flag); every function is loaded before its first held launch
 * (mna_load_function); a hold the watchdog had to release leaves that launch untimed (`lost`), counts in
 * `holds_broken` and warns, and holds stay off for the rest of the run.
 *
 *   MNEME_APPLY_HOLD     0: no hold at all
 *   MNEME_APPLY_HOLD_MS  the watchdog's bound in milliseconds (default 100) */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "internal.h"

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

/* -- the hold (native/hold) --------------------------------------------------------------------------- */
static mn_hold_calls hold_calls(void) {
  mn_hold_calls c = {A.cu.streamWaitValue32, A.cu.memHostAlloc, A.cu.memHostGetDevicePointer, A.cu.memFreeHost,
                     A.cu.funcIsLoaded, A.cu.funcLoad};
  return c;
}

/* Lazy loading: load `f` now, so that its first launch (possibly a held one) does not. */
void mna_load_function(CUfunction f) {
  mn_hold_calls c = hold_calls();
  CUresult r = mn_hold_load_function(&c, f);
  if (r != CUDA_SUCCESS) mna_warn("loading a function before its timed launch failed (%s)", mna_err(r));
}

static int hold_ready(void) {
  if (!A.hold.state) {
    const char *env = getenv("MNEME_APPLY_HOLD"), *ms = getenv("MNEME_APPLY_HOLD_MS");
    mn_hold_calls c = hold_calls();
    const char *why = mn_hold_setup(&A.hold, &c, !(env && strcmp(env, "0") == 0),
                                    ms && *ms ? strtoull(ms, NULL, 10) : MN_HOLD_MS_DEFAULT);
    if (why) mna_warn("%s; timed launches are not held (host launch latency is timed)", why);
  }
  return mn_hold_on(&A.hold);
}

/* Raises the flag of the current hold; 1 when the watchdog had to (the launch is then not timed). */
static int release_hold(void) {
  if (!mn_hold_release(&A.hold)) return 0;
  mna_warn("a timed launch stayed held for more than %llu ms (the driver waited for the held stream inside the "
           "launch); the watchdog released it, its time is not counted and timed launches are no longer held",
           (unsigned long long)A.hold.ms);
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
  if (hold_ready() && A.cu.streamQuery && A.cu.streamQuery(s) == CUDA_SUCCESS) mn_hold_begin(&A.hold, s);
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
