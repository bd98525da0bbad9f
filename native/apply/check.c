/* --check: for the first K launches of an entry, the original and the tuned kernel run on the same input and
 * their outputs are compared as replay verification compares (mn_compare_ex, native/snapshot.h).
 *
 * The input is every allocation a pointer argument points into (cuMemGetAddressRange) and the kernel's
 * variables: they are saved, the original runs, its results are kept, the input is written back, the tuned
 * kernel runs, and the two results are compared. Memory reached only through pointers stored in memory is
 * not compared. A mismatch stops the app (exit status MNA_CHECK_EXIT) after the statistics are written.
 *
 *   MNEME_APPLY_CHECK_ELEM / _NORM / _ATOL / _RTOL: mn_compare_ex's elem, norm, atol, rtol (default: exact). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../snapshot.h"
#include "internal.h"

#define MNA_CHECK_EXIT 86
#define MNA_MAX_REGIONS 64

typedef struct {
  CUdeviceptr base, backup;
  size_t size;
  void *expected, *actual;
} region;

void mna_check_settings(void) {
  const char *s;
  A.check_elem = (s = getenv("MNEME_APPLY_CHECK_ELEM")) ? (uint32_t)strtoul(s, NULL, 10) : MN_ELEM_BYTES;
  A.check_norm = (s = getenv("MNEME_APPLY_CHECK_NORM")) ? (uint32_t)strtoul(s, NULL, 10) : 0;
  A.check_atol = (s = getenv("MNEME_APPLY_CHECK_ATOL")) ? strtod(s, NULL) : -1.0;
  A.check_rtol = (s = getenv("MNEME_APPLY_CHECK_RTOL")) ? strtod(s, NULL) : -1.0;
}

static int sync_ok(CUstream s, const char *what, const mna_entry *e) {
  CUresult r = A.cu.streamSynchronize(s);
  if (r != CUDA_SUCCESS) mna_warn("--check of %s: %s failed (%s)", e->kernel, what, mna_err(r));
  return r == CUDA_SUCCESS;
}

static size_t collect(const mna_entry *e, void **pp, region *rg) {
  size_t n = 0;
  for (size_t i = 0; i < e->nptrs && n < MNA_MAX_REGIONS; i++) {
    uint32_t p = e->ptrs[i][0], off = e->ptrs[i][1];
    if (!pp || p >= e->nparams || !pp[p] || off + sizeof(CUdeviceptr) > e->param_size[p]) continue;
    CUdeviceptr ptr;
    memcpy(&ptr, (const uint8_t *)pp[p] + off, sizeof ptr);
    CUdeviceptr base = 0;
    size_t size = 0;
    if (!ptr || !A.cu.memGetAddressRange || A.cu.memGetAddressRange(&base, &size, ptr) != CUDA_SUCCESS || !size) continue;
    int dup = 0;
    for (size_t k = 0; k < n; k++) dup |= rg[k].base == base;
    if (!dup) rg[n++] = (region){.base = base, .size = size};
  }
  return n;
}

static int compare(const void *exp, const void *act, size_t n, mn_cmp_report *rep);

static void release(region *rg, size_t n, void **vbak, void **vexp, size_t nvars) {
  for (size_t i = 0; i < n; i++) {
    if (rg[i].backup) A.cu.memFree(rg[i].backup);
    free(rg[i].expected);
    free(rg[i].actual);
  }
  for (size_t i = 0; i < nvars; i++) {
    free(vbak[i]);
    free(vexp[i]);
  }
  free(vbak);
  free(vexp);
}

static void stop(const mna_entry *e, const char *what, const mn_cmp_report *rep) {
  snprintf(A.check_failed, sizeof A.check_failed,
           "kernel %s (entry %d), checked launch %llu: the tuned kernel's output differs from the original's in %s: "
           "%llu mismatches, first at byte %llu, max abs error %g",
           e->kernel, e->id, (unsigned long long)e->checked, what, (unsigned long long)rep->mismatches,
           (unsigned long long)rep->first_mismatch, rep->max_abs_err);
  mna_warn("--check failed: %s; stopping the app", A.check_failed);
  A.stats_written = 0;
  pthread_mutex_unlock(&A.mu);
  mna_finish();
  _exit(MNA_CHECK_EXIT);
}

CUresult mna_check(mna_entry *e, const void *c, CUfunction f, const uint32_t g[3], const uint32_t b[3], uint32_t shm,
                   const uint32_t tg[3], const uint32_t tb[3], uint32_t ts, CUstream ls, CUstream s, void **params,
                   void **extra, void **pp) {
  region rg[MNA_MAX_REGIONS];
  size_t n = collect(e, pp, rg);
  void **vbak = calloc(e->nvars + 1, sizeof *vbak), **vexp = calloc(e->nvars + 1, sizeof *vexp);
  int ok = vbak && vexp && sync_ok(s, "waiting for earlier work", e);
  for (size_t i = 0; ok && i < n; i++)
    ok = A.cu.memAlloc(&rg[i].backup, rg[i].size) == CUDA_SUCCESS && (rg[i].expected = malloc(rg[i].size)) &&
         (rg[i].actual = malloc(rg[i].size)) && A.cu.memcpyDtoD(rg[i].backup, rg[i].base, rg[i].size) == CUDA_SUCCESS;
  for (size_t i = 0; ok && i < e->nvars; i++) {
    mna_var *v = &e->vars[i];
    if (v->resolved != 1) continue;
    ok = (vbak[i] = malloc(v->size)) && (vexp[i] = malloc(v->size)) &&
         A.cu.memcpyDtoH(vbak[i], v->app, v->size) == CUDA_SUCCESS;
  }
  if (!ok) {
    mna_warn("--check of %s: not enough memory to save the kernel's input; this launch is not checked", e->kernel);
    release(rg, n, vbak, vexp, vbak ? e->nvars : 0);
    if (mna_mirror(e, s, 0) != 0) return mna_fire(c, f, g, b, shm, ls, params, extra);
    CUresult r = mna_fire(c, e->fn, tg, tb, ts, ls, params, extra);
    if (r == CUDA_SUCCESS) e->applied++, mna_mirror(e, s, 1);
    return r;
  }
  /* the original */
  CUresult r = mna_fire(c, f, g, b, shm, ls, params, extra);
  if (r != CUDA_SUCCESS || !sync_ok(s, "the original kernel", e)) {
    release(rg, n, vbak, vexp, e->nvars);
    return r;
  }
  for (size_t i = 0; ok && i < n; i++) ok = A.cu.memcpyDtoH(rg[i].expected, rg[i].base, rg[i].size) == CUDA_SUCCESS;
  for (size_t i = 0; ok && i < e->nvars; i++)
    if (vexp[i]) ok = A.cu.memcpyDtoH(vexp[i], e->vars[i].app, e->vars[i].size) == CUDA_SUCCESS;
  /* the input again */
  for (size_t i = 0; ok && i < n; i++) ok = A.cu.memcpyDtoD(rg[i].base, rg[i].backup, rg[i].size) == CUDA_SUCCESS;
  for (size_t i = 0; ok && i < e->nvars; i++)
    if (vbak[i]) ok = A.cu.memcpyHtoD(e->vars[i].app, vbak[i], e->vars[i].size) == CUDA_SUCCESS;
  if (!ok) {
    mna_warn("--check of %s: saving or restoring the input failed; the original's result stands", e->kernel);
    release(rg, n, vbak, vexp, e->nvars);
    return CUDA_SUCCESS;
  }
  /* the tuned kernel (timed like any applied launch) */
  mna_timing t0;
  int mirrored = mna_mirror(e, s, 0) == 0;
  if (mirrored) {
    mna_time_begin(s, &t0);
    r = mna_fire(c, e->fn, tg, tb, ts, ls, params, extra);
    mna_time_end(s, &t0, e, r);
  }
  if (mirrored && r == CUDA_SUCCESS) {
    e->applied++;
    mna_mirror(e, s, 1);
  } else {
    mna_warn("--check of %s: the tuned kernel failed to launch (%s); stopping", e->kernel, mna_err(r));
    mn_cmp_report none = {0};
    stop(e, "its launch", &none);
  }
  if (!sync_ok(s, "the tuned kernel", e)) {
    mn_cmp_report none = {0};
    stop(e, "its run (a CUDA error)", &none);
  }
  char what[256];
  mn_cmp_report rep;
  for (size_t i = 0; i < n; i++) {
    if (A.cu.memcpyDtoH(rg[i].actual, rg[i].base, rg[i].size) != CUDA_SUCCESS) continue;
    if (!compare(rg[i].expected, rg[i].actual, rg[i].size, &rep)) {
      snprintf(what, sizeof what, "the allocation at 0x%llx (%zu bytes)", (unsigned long long)rg[i].base, rg[i].size);
      stop(e, what, &rep);
    }
  }
  for (size_t i = 0; i < e->nvars; i++) {
    mna_var *v = &e->vars[i];
    if (!vexp[i] || v->readonly) continue;
    if (A.cu.memcpyDtoH(vbak[i], v->app, v->size) != CUDA_SUCCESS) continue;
    if (!compare(vexp[i], vbak[i], v->size, &rep)) {
      snprintf(what, sizeof what, "the variable %s", v->name);
      stop(e, what, &rep);
    }
  }
  release(rg, n, vbak, vexp, e->nvars);
  return CUDA_SUCCESS;
}

static int compare(const void *exp, const void *act, size_t n, mn_cmp_report *rep) {
  memset(rep, 0, sizeof *rep);
  uint32_t es = mn_elem_size(A.check_elem);
  int exact = A.check_elem == MN_ELEM_BYTES || !(A.check_atol >= 0) || !(A.check_rtol >= 0) || es == 0;
  if (exact) return mn_compare_ex(exp, act, n, MN_ELEM_BYTES, 0, -1.0, -1.0, rep) == 1;
  return mn_compare_ex(exp, act, n, A.check_elem, A.check_norm, A.check_atol, A.check_rtol, rep) == 1;
}
