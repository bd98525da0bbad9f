/* librecord's launches, shared by launch.c (the launch path: a launch's kernel, its key, the decision,
 * the entry points), instance.c (recording a new instance), snapset.c (its snapshot set: collected,
 * written, written back) and timing.c (in-app timing, held launches, timing reruns). Called with R.mu
 * held unless said otherwise. */
#ifndef MNEME_RECORDER_LAUNCH_H
#define MNEME_RECORDER_LAUNCH_H

#include "state.h"

enum { SHAPE_LAUNCH, SHAPE_EX, SHAPE_COOP };

typedef struct mn_launch {
  const char *api;
  int shape;
  void *real;
  CUfunction f;                     /* a CUfunction, or a CUkernel passed in its place */
  const CUlaunchConfig *config;     /* EX */
  uint32_t grid[3], block[3];
  uint32_t shmem;
  CUstream stream;                  /* as the app passed it */
  CUstream ev_stream;               /* the same stream, with the per-thread default stream made explicit */
  void **params, **extra;
  uint32_t cluster[3];
  uint32_t coop;
  uint32_t nother;                  /* launch attributes not replayed, by id */
  uint32_t other[16];
  mn_inst *counted;                 /* out: the recorded instance this launch counted into */
  int skip;                         /* out: the reason it was not recorded (mn_skip), -1 when none was given */
} mn_launch;

typedef struct argscan {
  uint8_t *bytes;      /* argbytes */
  uint8_t *mask;       /* 1 where a byte belongs to a pointer */
  int from_ir;
  size_t nforeign;     /* words pointing into memory replay cannot place */
  uint64_t foff[32];
  uint32_t fkind[32];
  size_t ntex;         /* words equal to a live texture/surface object */
  uint64_t toff[32];
} argscan;

/* sum: the prologue's checksum of `before`, valid once sum_ready (set by the thread writing the prologue) */
typedef struct blob { uint64_t addr, size; uint32_t space; uint8_t *before; uint64_t sum; int sum_ready; } blob;
typedef struct varsnap { mn_gvar *v; uint8_t *data; uint32_t nrelocs; mn_reloc *relocs; } varsnap;

typedef struct snapshot_set {
  blob *blobs;
  size_t nblobs;
  varsnap *vars;
  size_t nvars;
  uint64_t blob_bytes;
  int unrestorable; /* a variable the kernel may reach could not be read: its state cannot be written back */
} snapshot_set;

/* ---- launch.c ---- */
CUresult mn_fire(const mn_launch *L);  /* the launch itself, through the real entry point */

/* ---- instance.c ---- */
/* Records a new instance: synchronize, prologue, timed launch, synchronize, epilogue. Returns the
 * launch's result; on a recording failure the launch still happens exactly once. */
CUresult mn_record_instance(const mn_launch *L, mn_kernel *k, mn_inst *inst, const argscan *a);

/* ---- snapset.c ---- */
/* The device copies' time and bytes since instance.c last reset them (read_blob, read_var). */
typedef struct mn_copy_tally { uint64_t copy, copy_bytes; } mn_copy_tally;
extern mn_copy_tally mn_copied;
void mn_set_free(snapshot_set *s);
int mn_collect_blobs(snapshot_set *s);
/* The variables the kernel's IR uses (all of them without IR), closed over relocation targets. */
int mn_collect_vars(const mn_kernel *k, snapshot_set *s);
/* args: the argument bytes; annots: the annotations at the launch; tx NULL: no texture objects. */
int mn_write_prologue(const char *path, const mn_kernel *k, snapshot_set *s, const uint8_t *args,
                      const mn_annot *annots, size_t nannots, const mn_texset *tx, uint64_t *bytes);
int mn_write_epilogue(const char *path, const snapshot_set *s, const mn_texset *tx, uint64_t *bytes);
/* Writes the prologue back: blobs and variables as they were before the kernel ran. */
int mn_restore_prologue(const snapshot_set *s);

/* ---- timing.c ---- */
mn_hold_calls mn_hold_driver_calls(void);             /* the driver calls of the timing hold (native/hold) */
/* Fires a launch of a recorded instance between two pooled events, resolved later into its samples. */
CUresult mn_fire_timed(const mn_launch *L, mn_inst *inst);
/* Launches once, held and timed; the launch status, the status after synchronizing, ns (0: not timed). */
void mn_held_launch(const mn_launch *L, const mn_kernel *k, CUresult *r, CUresult *after, uint64_t *ns);
/* Extra timed launches on the prologue state; how many were timed, their times in out. */
uint32_t mn_retime(const mn_launch *L, mn_kernel *k, const snapshot_set *s, uint64_t *out);

#endif
