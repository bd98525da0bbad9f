/* Launching a kernel once, and the timed loop: reset, flush, hold, event, launch, event, wait (watchdog). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

/* How long the hold kernel keeps the GPU busy before each timed run: longer than the host needs to
 * queue the start event, the launch and the end event. */
#define MNC_HOLD_NS 20000u

static int launch_async(mnc_function *f, const uint32_t *grid, const uint32_t *block, uint32_t shared,
                        void **params) {
  CUresult r = f->cooperative
                   ? mnc_cu.cuLaunchCooperativeKernel(f->fn, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                                      shared, mnc_g.stream, params)
                   : mnc_cu.cuLaunchKernel(f->fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared,
                                           mnc_g.stream, params, NULL);
  if (r != CUDA_SUCCESS) {
    char what[512];
    snprintf(what, sizeof what, "%s(%.300s, grid %ux%ux%u, block %ux%ux%u, %u bytes shared)",
             f->cooperative ? "cuLaunchCooperativeKernel" : "cuLaunchKernel", f->name, grid[0], grid[1], grid[2],
             block[0], block[1], block[2], shared);
    return mnc_fail_cu(r, what);
  }
  return 0;
}

static int check_launch(mnc_function *f, const uint32_t *grid, const uint32_t *block, uint32_t nparams,
                        void **params) {
  if (!f || !grid || !block) return mnc_fail(MNC_E_INVALID, "launch needs a function, grid and block");
  /* The driver reads one pointer per parameter from `params`: a short array would crash it. */
  if (f->nparams >= 0 && nparams != (uint32_t)f->nparams)
    return mnc_fail(MNC_E_INVALID, "kernel %s takes %d parameter(s), %u given", f->name, f->nparams, nparams);
  if (nparams && !params) return mnc_fail(MNC_E_INVALID, "kernel %s: %u parameters but no pointers", f->name, nparams);
  for (int i = 0; i < 3; i++)
    if (!grid[i] || !block[i])
      return mnc_fail(MNC_E_INVALID, "grid %ux%ux%u and block %ux%ux%u must have no zero dimension", grid[0],
                      grid[1], grid[2], block[0], block[1], block[2]);
  return 0;
}

static int launch(mnc_function *f, const uint32_t *grid, const uint32_t *block, uint32_t shared, void **params,
                  uint32_t nparams) {
  MNC_TRY(check_launch(f, grid, block, nparams, params));
  MNC_TRY(mnc_enter());
  MNC_TRY(mnc_set_dynamic_shared(f, shared));
  MNC_TRY(launch_async(f, grid, block, shared, params));
  char what[400];
  snprintf(what, sizeof what, "kernel %.300s", f->name);
  return mnc_wait_stream(what);
}

int mnc_function_set_cooperative(mnc_function *f, int cooperative) {
  if (!f) return mnc_fail(MNC_E_INVALID, "no function");
  f->cooperative = cooperative != 0;
  return 0;
}

int mnc_launch(mnc_function *f, const uint32_t *grid, const uint32_t *block, uint32_t shared_mem, void **params,
               uint32_t nparams) {
  mnc_lock();
  int s = launch(f, grid, block, shared_mem, params, nparams);
  mnc_unlock();
  return s;
}

static int flush_buffer(void) {
  if (mnc_g.flush_buf) return 0;
  uint64_t bytes = mnc_g.l2_size > 0 ? 2 * (uint64_t)mnc_g.l2_size : (64u << 20);
  bytes = (bytes + 4095) / 4096 * 4096;
  MNC_CU(mnc_cu.cuMemAlloc(&mnc_g.flush_buf, bytes), "cuMemAlloc(L2 flush buffer)");
  mnc_g.flush_bytes = bytes;
  return 0;
}

static int profile(mnc_function *f, mnc_state *s, const uint32_t *grid, const uint32_t *block, uint32_t shared,
                   void **params, uint32_t nparams, uint32_t warmup, uint32_t iterations, int l2_flush,
                   uint64_t *ns) {
  MNC_TRY(check_launch(f, grid, block, nparams, params));
  if (iterations && !ns) return mnc_fail(MNC_E_INVALID, "no output for %u timings", iterations);
  MNC_TRY(mnc_enter());
  if (s) MNC_TRY(mnc_state_check_plan(s, f->module));
  MNC_TRY(mnc_set_dynamic_shared(f, shared));
  if (l2_flush) MNC_TRY(flush_buffer());
  char what[400];
  for (uint32_t i = 0; i < warmup + iterations; i++) {
    if (s) MNC_TRY(mnc_state_enqueue_plan(s));
    if (l2_flush)
      MNC_CU(mnc_cu.cuMemsetD32Async(mnc_g.flush_buf, 0x9e3779b9u * (i + 1), mnc_g.flush_bytes / 4, mnc_g.stream),
             "cuMemsetD32Async(L2 flush)");
    if (mnc_g.hold) {
      uint64_t hold_ns = MNC_HOLD_NS;
      void *hold_params[] = {&hold_ns};
      MNC_CU(mnc_cu.cuLaunchKernel(mnc_g.hold, 1, 1, 1, 1, 1, 1, 0, mnc_g.stream, hold_params, NULL),
             "cuLaunchKernel(hold kernel)");
    }
    MNC_CU(mnc_cu.cuEventRecord(mnc_g.ev_start, mnc_g.stream), "cuEventRecord");
    MNC_TRY(launch_async(f, grid, block, shared, params));
    MNC_CU(mnc_cu.cuEventRecord(mnc_g.ev_end, mnc_g.stream), "cuEventRecord");
    snprintf(what, sizeof what, "kernel %.300s (run %u of %u)", f->name, i + 1, warmup + iterations);
    MNC_TRY(mnc_wait_event(mnc_g.ev_end, what));
    if (i >= warmup) {
      float ms = 0;
      MNC_CU(mnc_cu.cuEventElapsedTime(&ms, mnc_g.ev_start, mnc_g.ev_end), "cuEventElapsedTime");
      ns[i - warmup] = (uint64_t)llround((double)ms * 1e6);
    }
  }
  return 0;
}

int mnc_profile(mnc_function *f, mnc_state *s, const uint32_t *grid, const uint32_t *block, uint32_t shared_mem,
                void **params, uint32_t nparams, uint32_t warmup, uint32_t iterations, int l2_flush, uint64_t *ns) {
  mnc_lock();
  int st = profile(f, s, grid, block, shared_mem, params, nparams, warmup, iterations, l2_flush, ns);
  mnc_unlock();
  return st;
}
