/* The held launch and its watchdog (hold.h says what and why). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "hold.h"

#include <errno.h>
#include <string.h>

static void *watchdog(void *arg) {
  mn_hold *h = arg;
  pthread_mutex_lock(&h->wd_mu);
  for (;;) {
    while (!h->wd_armed) pthread_cond_wait(&h->wd_cv, &h->wd_mu);
    uint32_t seq = h->wd_armed;
    int rc = pthread_cond_timedwait(&h->wd_cv, &h->wd_mu, &h->wd_deadline);
    if (rc == ETIMEDOUT && h->wd_armed == seq) {
      __sync_synchronize();
      *h->flag = seq; /* the latest hold: writing it never lowers the flag */
      h->wd_fired = seq;
      h->wd_armed = 0;
    }
  }
  return NULL;
}

static int watchdog_start(mn_hold *h) {
  pthread_condattr_t ca;
  pthread_attr_t ta;
  pthread_t t;
  if (pthread_mutex_init(&h->wd_mu, NULL) != 0) return 0;
  if (pthread_condattr_init(&ca) != 0) return 0;
  int ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&h->wd_cv, &ca) == 0;
  pthread_condattr_destroy(&ca);
  if (!ok || pthread_attr_init(&ta) != 0) return 0;
  ok = pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED) == 0 && pthread_create(&t, &ta, watchdog, h) == 0;
  pthread_attr_destroy(&ta);
  return ok;
}

static void watchdog_arm(mn_hold *h, uint32_t seq) {
  pthread_mutex_lock(&h->wd_mu);
  clock_gettime(CLOCK_MONOTONIC, &h->wd_deadline);
  uint64_t ns = (uint64_t)h->wd_deadline.tv_nsec + h->ms * 1000000ull;
  h->wd_deadline.tv_sec += (time_t)(ns / 1000000000ull);
  h->wd_deadline.tv_nsec = (long)(ns % 1000000000ull);
  h->wd_armed = seq;
  pthread_cond_signal(&h->wd_cv);
  pthread_mutex_unlock(&h->wd_mu);
}

/* 1 when the watchdog released hold `seq` before the launch path could */
static int watchdog_disarm(mn_hold *h, uint32_t seq) {
  pthread_mutex_lock(&h->wd_mu);
  int fired = h->wd_fired == seq;
  h->wd_armed = 0;
  pthread_cond_signal(&h->wd_cv);
  pthread_mutex_unlock(&h->wd_mu);
  return fired;
}

const char *mn_hold_setup(mn_hold *h, const mn_hold_calls *cu, int on, uint64_t ms) {
  if (h->state) return NULL;
  h->state = -1;
  if (!on) return NULL;
  if (!cu->streamWaitValue32 || !cu->memHostAlloc || !cu->memHostGetDevicePointer)
    return "the driver lacks cuStreamWaitValue32, cuMemHostAlloc or cuMemHostGetDevicePointer";
  h->ms = ms ? ms : 1;
  void *p = NULL;
  CUdeviceptr d = 0;
  if (cu->memHostAlloc(&p, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS || !p)
    return "cuMemHostAlloc failed for the hold flag";
  if (cu->memHostGetDevicePointer(&d, p, 0) != CUDA_SUCCESS) {
    if (cu->memFreeHost && cu->memFreeHost(p) != CUDA_SUCCESS) { /* nothing more to do: the flag stays allocated */ }
    return "cuMemHostGetDevicePointer failed for the hold flag";
  }
  memset(p, 0, 64);
  h->flag = (volatile uint32_t *)p;
  h->dflag = d;
  h->wait = cu->streamWaitValue32;
  if (!watchdog_start(h)) {
    if (cu->memFreeHost && cu->memFreeHost(p) != CUDA_SUCCESS) { /* nothing more to do: the flag stays allocated */ }
    h->flag = NULL;
    return "cannot start the hold watchdog thread";
  }
  h->state = 1;
  return NULL;
}

int mn_hold_begin(mn_hold *h, CUstream s) {
  if (h->state <= 0 || h->held) return 0;
  uint32_t next = h->seq + 1;
  if (next == 0) { /* after 2^32 - 1 holds the flag cannot grow any more: no more holds */
    h->state = -1;
    return 0;
  }
  if (h->wait(s, h->dflag, next, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS) return 0;
  h->seq = next;
  h->held = 1;
  watchdog_arm(h, next);
  return 1;
}

int mn_hold_release(mn_hold *h) {
  if (!h->held) return 0;
  __sync_synchronize();
  *h->flag = h->seq;
  h->held = 0;
  if (!watchdog_disarm(h, h->seq)) return 0;
  h->broken++;
  h->state = -1;
  return 1;
}

CUresult mn_hold_load_function(const mn_hold_calls *cu, CUfunction f) {
  if (!f || !cu->funcIsLoaded || !cu->funcLoad) return CUDA_SUCCESS;
  CUfunctionLoadingState st = CU_FUNCTION_LOADING_STATE_UNLOADED;
  CUresult r = cu->funcIsLoaded(&st, f);
  if (r == CUDA_SUCCESS && st == CU_FUNCTION_LOADING_STATE_LOADED) return CUDA_SUCCESS;
  return cu->funcLoad(f);
}
