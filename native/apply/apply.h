/* libapply: the LD_PRELOAD library of `mneme apply` (docs/APPLY.md).
 *
 * Python (mneme/apply) decides everything and writes a manifest (mneme/apply/manifest.py documents the
 * format); this library reads it, intercepts kernel launches at the driver API (hook.c on native/interpose),
 * and for a launch
 * an entry matches runs the tuned cubin's kernel instead (launch.c). Every other launch is untouched. */
#ifndef MNEME_APPLY_H
#define MNEME_APPLY_H

#include <cuda.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define MNA_MAX_PARAMS 256
#define MNA_MAX_SAMPLES 4096

typedef struct mna_match {
  uint32_t param, offset, len;
  uint8_t *bytes;
} mna_match;

typedef struct mna_var {
  char *name;
  uint64_t size;
  int readonly;
  /* resolved on the first tuned launch */
  CUdeviceptr tuned, app;
  int resolved; /* 1 both found, -1 not mirrored */
} mna_var;

typedef struct mna_entry {
  int id;
  char *kernel;
  char *cubin;
  int scaled; /* rule: 0 exact, 1 scaled */
  uint32_t rec_grid[3], rec_block[3], rec_shared;
  uint32_t tuned_grid[3], tuned_block[3], tuned_shared;
  int round_up;
  uint32_t nparams, param_size[MNA_MAX_PARAMS], param_offset[MNA_MAX_PARAMS];
  mna_match *matches;
  size_t nmatches;
  mna_var *vars;
  size_t nvars;
  uint32_t (*ptrs)[2];
  size_t nptrs;
  /* the tuned module (loaded in `ctx` on first use) */
  CUcontext ctx;
  CUmodule mod;
  CUfunction fn;
  int load_state; /* 0 not tried, 1 loaded, -1 failed: the original runs */
  /* what happened */
  uint64_t matched, applied, fell_back, checked, timed_lost;
  uint64_t nsamples, total_ns;
  uint32_t samples[MNA_MAX_SAMPLES];
} mna_entry;

typedef struct mna_manifest {
  mna_entry *entries;
  size_t n;
} mna_manifest;

/* manifest.c (no CUDA calls: the CPU tests load it) */
int mna_manifest_parse(const char *text, mna_manifest *m, char *err, size_t errlen);
void mna_manifest_free(mna_manifest *m);
/* Does entry `e` apply to this launch? Fills the tuned grid/block/shared. `params` are the kernelParams
 * pointers (one per parameter). Returns 1 yes, 0 no. */
int mna_entry_matches(const mna_entry *e, const uint32_t grid[3], const uint32_t block[3], uint32_t shared,
                      void *const *params, uint32_t out_grid[3], uint32_t out_block[3], uint32_t *out_shared);
/* For the CPU tests: the same decision from a packed parameter buffer (param_offset layout). */
int mna_entry_matches_buffer(const mna_entry *e, const uint32_t grid[3], const uint32_t block[3], uint32_t shared,
                             const uint8_t *buf, size_t buflen, uint32_t out_grid[3]);
int mna_test_match(const char *text, size_t index, const uint32_t grid[3], const uint32_t block[3], uint32_t shared,
                   const uint8_t *buf, size_t buflen, uint32_t out_grid[3], char *err, size_t errlen);

/* hook.c (on native/interpose): the real driver functions */
typedef CUresult (*mna_launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  CUstream, void **, void **);
typedef CUresult (*mna_launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*mna_launch_coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                       CUstream, void **);
void *mna_real(const char *name); /* from libcuda through the real cuGetProcAddress; NULL if absent */

/* launch.c. `os` is the launch's stream as libapply's own calls (copies, events) must name it: stream 0 of a
 * per-thread-default-stream entry point is CU_STREAM_PER_THREAD. */
int mna_init(void); /* reads the manifest once; 1 when there is something to apply */
CUresult mna_launch(mna_launch_fn real, CUstream os, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                    unsigned by, unsigned bz, unsigned shared, CUstream stream, void **params, void **extra);
CUresult mna_launch_ex(mna_launch_ex_fn real, CUstream os, const CUlaunchConfig *cfg, CUfunction f, void **params,
                       void **extra);
/* a cooperative launch (cuLaunchCooperativeKernel): the tuned kernel only at the launch's own shape */
CUresult mna_launch_coop(mna_launch_coop_fn real, CUstream os, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                         unsigned bx, unsigned by, unsigned bz, unsigned shared, CUstream stream, void **params);
void mna_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
