/* Verification: every job compares replayed bytes with expected bytes, large ones on the GPU with the
 * kernels of compare.cu (shipped as PTX), the rest on the host through mn_compare_ex. Both answer
 * with mn_compare_ex's semantics (native/snapshot.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

/* Layout shared with struct mn_gpu_cmp in compare.cu. */
typedef struct mnc_gpu_cmp {
  uint64_t mismatches, first, max_abs, max_rel, err_max, ref_max, nonfinite, reserved;
  double err_sum, ref_sum;
} mnc_gpu_cmp;

#define MNC_CMP_THREADS 256
#define MNC_CMP_MAX_BLOCKS 2048
#define MNC_SCRATCH_HALF (32u << 20)

static int compare_load(const void *ptx, uint64_t size) {
  MNC_TRY(mnc_enter());
  if (mnc_g.cmp_module) return 0;
  mnc_module *m = NULL;
  MNC_TRY(mnc_module_load_nolock(ptx, size, &m));
  /* The compare kernels belong to the device, not to a caller's module list. */
  CUmodule mod = m->mod;
  free(m);
  mnc_g.resources--;
  CUresult r;
  if ((r = mnc_cu.cuModuleGetFunction(&mnc_g.cmp_bytes, mod, "mn_cmp_bytes")) != CUDA_SUCCESS ||
      (r = mnc_cu.cuModuleGetFunction(&mnc_g.cmp_values, mod, "mn_cmp_values")) != CUDA_SUCCESS ||
      (r = mnc_cu.cuModuleGetFunction(&mnc_g.hold, mod, "mn_hold")) != CUDA_SUCCESS ||
      (r = mnc_cu.cuMemAlloc(&mnc_g.cmp_out, 256)) != CUDA_SUCCESS) {
    int s = mnc_fail_cu(r, "loading the compare kernels (mneme/data/compare.ptx)");
    mnc_cu.cuModuleUnload(mod);
    mnc_g.cmp_out = 0;
    mnc_g.cmp_bytes = mnc_g.cmp_values = mnc_g.hold = NULL;
    return s;
  }
  mnc_g.cmp_module = mod;
  return 0;
}

int mnc_compare_load(const void *ptx, uint64_t size) {
  mnc_lock();
  int s = compare_load(ptx, size);
  mnc_unlock();
  return s;
}

int mnc_compare_loaded(void) { return mnc_g.cmp_module != NULL; }

static int is_exact(uint32_t elem, double atol, double rtol) {
  return elem == MN_ELEM_BYTES || !(atol >= 0) || !(rtol >= 0);
}

static int launch_cmp(CUdeviceptr e, CUdeviceptr a, uint64_t n, uint64_t base, uint32_t elem, uint32_t norm,
                      double atol, double rtol) {
  uint32_t es = mn_elem_size(elem);
  uint64_t nel = n / es;
  uint64_t blocks = (nel + MNC_CMP_THREADS * 4 - 1) / (MNC_CMP_THREADS * 4);
  if (blocks > MNC_CMP_MAX_BLOCKS) blocks = MNC_CMP_MAX_BLOCKS;
  if (!blocks) return 0;
  CUdeviceptr out = mnc_g.cmp_out;
  int exact = is_exact(elem, atol, rtol);
  void *bytes_params[] = {&e, &a, &nel, &base, &out};
  void *value_params[] = {&e, &a, &nel, &base, &elem, &es, &norm, &exact, &atol, &rtol, &out};
  CUfunction fn = elem == MN_ELEM_BYTES ? mnc_g.cmp_bytes : mnc_g.cmp_values;
  MNC_CU(mnc_cu.cuLaunchKernel(fn, (unsigned)blocks, 1, 1, MNC_CMP_THREADS, 1, 1, 0, mnc_g.stream,
                               elem == MN_ELEM_BYTES ? bytes_params : value_params, NULL),
         "cuLaunchKernel(compare kernel)");
  return 0;
}

static double from_bits(uint64_t b) {
  double d;
  memcpy(&d, &b, sizeof d);
  return d;
}

/* The kernel's counts and sums as mn_compare_ex reports them. */
static void finish(const mnc_gpu_cmp *g, uint64_t n, uint32_t elem, uint32_t norm, double atol, double rtol,
                   mn_cmp_report *rep, int *equal) {
  memset(rep, 0, sizeof *rep);
  rep->mismatches = g->mismatches;
  rep->first_mismatch = g->mismatches ? g->first : n;
  rep->max_abs_err = from_bits(g->max_abs);
  rep->max_rel_err = from_bits(g->max_rel);
  if (norm == MN_NORM_ELEMENT || is_exact(elem, atol, rtol)) {
    *equal = g->mismatches == 0;
    return;
  }
  if (norm == MN_NORM_LINF) {
    rep->err_norm = from_bits(g->err_max);
    rep->ref_norm = from_bits(g->ref_max);
  } else {
    rep->err_norm = norm == MN_NORM_L2 ? sqrt(g->err_sum) : g->err_sum;
    rep->ref_norm = norm == MN_NORM_L2 ? sqrt(g->ref_sum) : g->ref_sum;
  }
  if (g->nonfinite) rep->err_norm = INFINITY;
  *equal = !g->nonfinite && rep->err_norm <= atol + (rtol > 0 ? rtol * rep->ref_norm : 0);
}

/* Whether the GPU can take this comparison: known element, whole elements, aligned replayed bytes. */
static int gpu_fits(uint64_t actual, uint64_t n, uint32_t elem, uint32_t norm) {
  uint32_t es = mn_elem_size(elem);
  return es && norm <= MN_NORM_LINF && n % es == 0 && actual % es == 0;
}

int mnc_compare_gpu(CUdeviceptr actual, const void *expected_host, CUdeviceptr expected_dev, uint64_t n,
                    uint32_t elem, uint32_t norm, double atol, double rtol, mn_cmp_report *rep, int *equal) {
  if (!mnc_g.cmp_module) return mnc_fail(MNC_E_INVALID, "the compare kernels are not loaded");
  if (!gpu_fits(actual, n, elem, norm) || expected_dev % (mn_elem_size(elem) ? mn_elem_size(elem) : 1))
    return mnc_fail(MNC_E_INVALID,
                    "GPU compare of %llu bytes at 0x%llx: element type %u / norm %u unknown, or not aligned to "
                    "whole elements",
                    (unsigned long long)n, (unsigned long long)actual, elem, norm);
  MNC_CU(mnc_cu.cuMemsetD8Async(mnc_g.cmp_out, 0, sizeof(mnc_gpu_cmp), mnc_g.stream), "cuMemsetD8Async");
  MNC_CU(mnc_cu.cuMemsetD8Async(mnc_g.cmp_out + 8, 0xff, 8, mnc_g.stream), "cuMemsetD8Async");
  if (expected_dev) {
    MNC_TRY(launch_cmp(expected_dev, actual, n, 0, elem, norm, atol, rtol));
  } else {
    uint64_t half = n < MNC_SCRATCH_HALF ? (n + 255) / 256 * 256 : MNC_SCRATCH_HALF;
    if (mnc_g.cmp_scratch_bytes < 2 * half) {
      if (mnc_g.cmp_scratch) {
        MNC_TRY(mnc_wait_stream("compare"));
        MNC_CU(mnc_cu.cuMemFree(mnc_g.cmp_scratch), "cuMemFree(compare scratch)");
        mnc_g.cmp_scratch = 0;
        mnc_g.cmp_scratch_bytes = 0;
      }
      MNC_CU(mnc_cu.cuMemAlloc(&mnc_g.cmp_scratch, 2 * half), "cuMemAlloc(compare scratch)");
      mnc_g.cmp_scratch_bytes = 2 * half;
    } else {
      half = mnc_g.cmp_scratch_bytes / 2 / 256 * 256;
    }
    /* Upload chunk i into scratch half i%2 while the kernel of chunk i-1 runs: one stream orders them.
     * Halves are multiples of 256 bytes, so every chunk starts on an element boundary. */
    mnc_uploader u;
    MNC_TRY(mnc_uploader_begin(&u));
    const uint8_t *src = expected_host;
    for (uint64_t off = 0, k = 0; off < n; off += half, k ^= 1) {
      uint64_t c = n - off < half ? n - off : half;
      CUdeviceptr dst = mnc_g.cmp_scratch + k * half;
      MNC_TRY(mnc_uploader_push(&u, dst, src + off, c));
      MNC_TRY(mnc_uploader_flush(&u));
      MNC_TRY(launch_cmp(dst, actual + off, c, off, elem, norm, atol, rtol));
    }
    MNC_TRY(mnc_uploader_finish(&u, "compare"));
  }
  mnc_gpu_cmp g;
  MNC_TRY(mnc_wait_stream("compare"));
  MNC_TRY(mnc_download(&g, mnc_g.cmp_out, sizeof g));
  finish(&g, n, elem, norm, atol, rtol, rep, equal);
  return 0;
}

int mnc_compare_device(uint64_t expected, uint64_t actual, uint64_t n, uint32_t elem, uint32_t norm, double atol,
                       double rtol, mn_cmp_report *report, int *equal) {
  mnc_lock();
  int s = mnc_enter();
  if (!s && !expected) s = mnc_fail(MNC_E_INVALID, "no expected device address");
  if (!s) s = mnc_compare_gpu(actual, NULL, expected, n, elem, norm, atol, rtol, report, equal);
  mnc_unlock();
  return s;
}

/* ---- verification of a replay state ---- */

static int host_compare(const void *expected, const void *actual, const mnc_cmp_job *j, mn_cmp_report *rep,
                        int *equal) {
  int r = mn_compare_ex(expected, actual, j->length, j->elem, j->norm, j->atol, j->rtol, rep);
  if (r < 0)
    return mnc_fail(MNC_E_INVALID, "comparing 0x%llx+%llu: %s", (unsigned long long)j->addr,
                    (unsigned long long)j->length, mn_last_error());
  *equal = r;
  return 0;
}

static int verify_job(mnc_state *s, mnc_module *m, const mnc_cmp_job *j, uint64_t gpu_min, mn_cmp_report *rep,
                      int *equal) {
  memset(rep, 0, sizeof *rep);
  *equal = 0;
  if (!j->length) return host_compare("", "", j, rep, equal);
  if (!j->expected) return mnc_fail(MNC_E_INVALID, "job 0x%llx has no expected bytes", (unsigned long long)j->addr);
  const mnc_blob_slot *b = mnc_state_find_blob(s, j->addr, j->length);
  const mnc_var_slot *v = b ? NULL : mnc_module_find_var(m, j->addr, j->length);
  if (b && b->host) return host_compare(j->expected, (const void *)(uintptr_t)j->addr, j, rep, equal);
  if (!b && !v)
    return mnc_fail(MNC_E_INVALID, "0x%llx+%llu lies inside no single blob of %s%s", (unsigned long long)j->addr,
                    (unsigned long long)j->length, s->prologue->path ? s->prologue->path : "the prologue",
                    m ? " and no variable of the module" : " (no module given for variables)");
  CUdeviceptr actual = j->addr;
  const void *expected = j->expected;
  uint8_t *relocated = NULL;
  if (v) {
    /* Expected words that point at variables hold the recorded addresses: move them like the load did. */
    uint64_t off = j->addr - v->rec->addr;
    uint8_t *full = malloc(2 * v->rec->size);
    if (!full) return mnc_fail(MNC_E_NOMEM, "out of host memory");
    memcpy(full, v->rec->data, v->rec->size);
    memcpy(full + off, j->expected, j->length);
    int st = mnc_relocate(m, v->rec, full, full + v->rec->size);
    if (st) {
      free(full);
      return st;
    }
    relocated = full;
    expected = full + v->rec->size + off;
    actual = v->addr + off;
  }
  int st;
  if (mnc_g.cmp_module && j->length >= gpu_min && gpu_fits(actual, j->length, j->elem, j->norm)) {
    st = mnc_compare_gpu(actual, expected, 0, j->length, j->elem, j->norm, j->atol, j->rtol, rep, equal);
  } else {
    uint8_t *buf = malloc(j->length);
    if (!buf) st = mnc_fail(MNC_E_NOMEM, "out of host memory for %llu bytes", (unsigned long long)j->length);
    else if (!(st = mnc_download(buf, actual, j->length)))
      st = host_compare(expected, buf, j, rep, equal);
    free(buf);
  }
  free(relocated);
  return st;
}

int mnc_verify(mnc_state *s, mnc_module *m, const mnc_cmp_job *jobs, uint32_t n, uint64_t gpu_min_bytes,
               mn_cmp_report *reports, int *equal) {
  mnc_lock();
  int st = s && (jobs || !n) ? mnc_enter() : mnc_fail(MNC_E_INVALID, "no state or jobs");
  for (uint32_t i = 0; i < n && !st; i++) st = verify_job(s, m, &jobs[i], gpu_min_bytes, &reports[i], &equal[i]);
  mnc_unlock();
  return st;
}
