/* librecord's in-app timing: launches of recorded instances timed with events from a pool, resolved
 * lazily in launch order into each instance's samples and written as "occ" lines (mn_emit_occurrences);
 * the held, timed launch of a new instance and its timing reruns (mn_retime) through native/hold. */
#include "launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MN_MAX_PENDING 8192

/* The driver calls of the timing hold (native/hold). */
mn_hold_calls mn_hold_driver_calls(void) {
  mn_hold_calls c = {D.streamWaitValue32, D.hostAlloc, D.hostGetDevicePointer, D.freeHost, D.funcIsLoaded, D.funcLoad};
  return c;
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

static CUevent ev_get(void) {
  if (R.nevpool) return R.evpool[--R.nevpool];
  CUevent e = NULL;
  if (D.eventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return NULL;
  return e;
}

static void ev_put(CUevent e) {
  if (!e) return;
  if (R.nevpool == R.capevpool) {
    size_t ncap = R.capevpool ? R.capevpool * 2 : 64;
    CUevent *n = realloc(R.evpool, ncap * sizeof *n);
    if (!n) {
      D.eventDestroy(e);
      return;
    }
    R.evpool = n;
    R.capevpool = ncap;
  }
  R.evpool[R.nevpool++] = e;
}

static int elapsed_ns(CUevent a, CUevent b, uint64_t *ns) {
  float ms = 0;
  if (D.eventElapsed(&ms, a, b) != CUDA_SUCCESS || ms < 0) return 0;
  *ns = (uint64_t)((double)ms * 1e6 + 0.5);
  return 1;
}

void mn_resolve_pending(int wait) {
  while (R.pending_head < R.npending) {
    mn_pending *p = &R.pending[R.pending_head];
    CUresult q = CUDA_ERROR_NOT_READY;
    if (wait) q = D.eventSynchronize(p->stop);
    else q = D.eventQuery(p->stop);
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

static int push_pending(CUevent a, CUevent b, mn_inst *i) {
  if (R.npending - R.pending_head >= MN_MAX_PENDING) {
    mn_resolve_pending(0);
    if (R.npending - R.pending_head >= MN_MAX_PENDING) {
      /* too many in flight: wait for the oldest one */
      D.eventSynchronize(R.pending[R.pending_head].stop);
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

CUresult mn_fire_timed(const mn_launch *L, mn_inst *inst) {
  CUevent a = ev_get(), b = a ? ev_get() : NULL;
  if (!b) {
    ev_put(a);
    return mn_fire(L);
  }
  if (D.eventRecord(a, L->ev_stream) != CUDA_SUCCESS) {
    ev_put(a);
    ev_put(b);
    return mn_fire(L);
  }
  CUresult r = mn_fire(L);
  if (r == CUDA_SUCCESS && D.eventRecord(b, L->ev_stream) == CUDA_SUCCESS && push_pending(a, b, inst) == 0)
    return r;
  ev_put(a);
  ev_put(b);
  return r;
}

static char occbuf[1 << 16];
static char sigocc[256];

void mn_emit_occurrences(int signal_safe) {
  for (mn_inst *i = __atomic_load_n(&R.all_insts, __ATOMIC_ACQUIRE); i; i = __atomic_load_n(&i->next_all, __ATOMIC_ACQUIRE)) {
    if (!i->recorded || !__atomic_load_n(&i->logged, __ATOMIC_ACQUIRE)) continue; /* its event comes first */
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

/* ---- in-app timing of a recorded instance -------------------------------------------------------
 * One cold launch is a poor measure of the kernel (GPU clocks still ramping, caches cold), so before
 * the recorded launch the app's own kernel is run MNEME_RETIME more times on the prologue state, each
 * timed, with the prologue written back after each run; the recorded launch then starts from exactly
 * the prologue. Every timed launch waits behind a host flag (cuStreamWaitValue32) released only once
 * the start event, the launch and the end event are queued, so host launch latency stays out of the
 * timing, as in the replay core: native/hold, with its growing flag and its watchdog (MNEME_RECORD_HOLD,
 * MNEME_RECORD_HOLD_MS); the functions are loaded before (launch.c: function_of), and a hold the
 * watchdog released leaves that launch untimed, turns holds off for the rest of the run, warns, and
 * counts in the exit event's holds_broken. */

static int hold_ready(void) {
  if (!R.hold.state) {
    static int warned;
    mn_hold_calls c = mn_hold_driver_calls();
    const char *why = mn_hold_setup(&R.hold, &c, R.cfg.hold != 0, R.cfg.hold_ms);
    if (why) mn_warn_once(&warned, "timed launches are not held (host launch latency is timed)", why);
  }
  return mn_hold_on(&R.hold);
}

/* Raises the flag of the current hold; 1 when the watchdog had to (the launch is then not timed). */
static int release_hold(const mn_kernel *k) {
  if (!mn_hold_release(&R.hold)) return 0;
  static int warned;
  char why[1024];
  snprintf(why, sizeof why,
           "%s: a timed launch stayed held for more than %llu ms (the driver waited for the held stream inside the "
           "launch); the watchdog released it, its time is not counted and timed launches are no longer held "
           "(MNEME_RECORD_HOLD_MS)", k->name, (unsigned long long)R.hold.ms);
  mn_warn_once(&warned, "hold_broken", why);
  return 1;
}

/* Launches once, timed with events; fills the launch status, the status after synchronizing, and ns (0:
 * not timed). Everything that may call the driver comes before the hold: only the launch and two event
 * records follow it. */
void mn_held_launch(const mn_launch *L, const mn_kernel *k, CUresult *r, CUresult *after, uint64_t *ns) {
  *ns = 0;
  CUevent e0 = ev_get(), e1 = e0 ? ev_get() : NULL;
  if (hold_ready()) mn_hold_begin(&R.hold, L->ev_stream);
  int started = e1 && D.eventRecord(e0, L->ev_stream) == CUDA_SUCCESS;
  *r = mn_fire(L);
  int timed = started && *r == CUDA_SUCCESS && D.eventRecord(e1, L->ev_stream) == CUDA_SUCCESS;
  if (release_hold(k)) timed = 0; /* always released, whatever happened above */
  *after = *r == CUDA_SUCCESS ? D.ctxSynchronize() : *r;
  if (*after == CUDA_SUCCESS && timed) elapsed_ns(e0, e1, ns);
  ev_put(e0);
  ev_put(e1);
}

/* Extra timed launches on the prologue state (see above); returns how many were timed. A failure
 * stops the retiming and, if the prologue cannot be written back, disables it for good. */
uint32_t mn_retime(const mn_launch *L, mn_kernel *k, const snapshot_set *s, uint64_t *out) {
  uint32_t n = R.cfg.retime < MN_RETIME_MAX ? R.cfg.retime : MN_RETIME_MAX, got = 0;
  uint64_t budget = R.cfg.retime_budget_ns, t0 = mn_precise_ns();
  /* a kernel whose last recorded launch alone took the whole budget is not rerun at all */
  if (budget && k->last_run_ns >= budget) return 0;
  for (uint32_t i = 0; i < n; i++) {
    if (budget && i && mn_precise_ns() - t0 >= budget) break; /* the time bound comes first */
    CUresult r, after;
    uint64_t ns;
    mn_held_launch(L, k, &r, &after, &ns);
    if (r != CUDA_SUCCESS || after != CUDA_SUCCESS) break;
    if (ns) out[got++] = ns;
    if (mn_restore_prologue(s)) {
      R.cfg.retime = 0;
      mn_error("cannot write the prologue back after a timing run; retiming is off", L->api);
      break;
    }
  }
  return got;
}
