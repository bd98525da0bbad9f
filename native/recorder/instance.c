/* librecord's recording of one new instance (mn_record_instance): synchronize, the snapshot set
 * (snapset.c), the prologue (on a thread of its own where it can be), the timing reruns and the timed
 * launch (timing.c), the epilogue, and the instance event once the prologue is on disk (mn_record_settle,
 * and mn_record_settle_signal on the fatal-signal path). */
#include "launch.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The recorder's own time per recorded instance, by what it was spent on (logged with the instance). */
typedef struct rec_time { uint64_t copy, copy_bytes, diff, write, retime, hidden, other, total; } rec_time;

static void snap_path(char *out, size_t cap, const mn_inst *i, const char *kind) {
  snprintf(out, cap, "%s/r%d-p%ld-i%u.%s", R.cfg.dir, R.cfg.rank < 0 ? 0 : R.cfg.rank, (long)getpid(), i->id, kind);
}

static const char *basename_of(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

/* ---- the prologue, written on a thread of its own while the app thread goes on with the timing runs,
 * the recorded launch and the epilogue (which only read the prologue's buffers). mn_record_instance()
 * may return while it still runs: at most one prologue is in flight, and it is finished (mn_record_settle)
 * by the next recorded instance, a flush, the exit paths or a context's teardown; the fatal-signal path
 * waits for it (bounded). Its instance event is written only once the file is complete, so every exit and
 * crash path sees complete files or a torn one that no instance event names and that reads as truncated.
 * The thread blocks the asynchronous signals, which stay the app's. */

/* What the prologue is written from: the instance's own copies (the app thread goes on meanwhile). */
typedef struct pro_job {
  const char *path;
  const mn_kernel *k;
  snapshot_set *s;
  uint8_t *args;        /* the argument bytes */
  mn_annot *annots;     /* the annotations at the launch */
  size_t nannots;
  const mn_texset *tx;  /* NULL: none (a prologue with textures is written before the launch) */
  uint64_t bytes, io_ns, wall_ns;
  int rc;
  char err[1024];
} pro_job;

/* One recorded instance from its prologue to its instance event. With the prologue on its own thread the
 * event waits in P until that thread is done: mn_record_instance() returns at once and the app goes on
 * while the prologue is written; the next mn_record_instance() (so at most one instance's buffers are
 * held), a flush that finds it done, the exit paths and a context's teardown finish it
 * (mn_record_settle), and a fatal signal waits for it (mn_record_settle_signal) so that a crash loses no
 * instance whose files could be completed. */
typedef struct pending {
  pro_job job;
  pthread_t thread;
  int threaded;
  int done;             /* the prologue's thread finished (release store) */
  int taken;            /* the event was finished and written, by mn_record_settle or the signal handler */
  char pro[4352], epi[4352];
  snapshot_set s;
  mn_kernel *k;
  mn_inst *inst;
  uint64_t epi_bytes;
  rec_time rt;          /* the instance's split without the prologue's figures */
  char *buf;            /* the instance event (begin_event) */
  mn_line l;
} pending;

static pending *P;

static void run_pro_job(pro_job *j) {
  uint64_t t0 = mn_precise_ns(), io0 = mn_snapshot_io_ns();
  j->rc = mn_write_prologue(j->path, j->k, j->s, j->args, j->annots, j->nannots, j->tx, &j->bytes);
  if (j->rc) snprintf(j->err, sizeof j->err, "%s", mn_last_error());
  j->io_ns = mn_snapshot_io_ns() - io0; /* per thread: this thread's writes */
  j->wall_ns = mn_precise_ns() - t0;
}

static void *pro_thread(void *p) {
  pending *pr = (pending *)p;
  run_pro_job(&pr->job);
  __atomic_store_n(&pr->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* 1 when the thread runs; 0: nothing started (the caller writes the prologue itself). */
static int start_pro_job(pending *pr) {
  sigset_t all, old;
  sigfillset(&all);
  static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
  for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) sigdelset(&all, faults[i]);
  if (pthread_sigmask(SIG_SETMASK, &all, &old) != 0) return 0;
  int ok = pthread_create(&pr->thread, NULL, pro_thread, pr) == 0;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return ok;
}

static void mask_ranges(const uint8_t *mask, uint32_t n, uint64_t *off, uint64_t *len, size_t *count, size_t cap) {
  *count = 0;
  for (uint32_t i = 0; i < n && *count < cap;) {
    if (!mask[i]) { i++; continue; }
    uint32_t j = i;
    while (j < n && mask[j]) j++;
    off[*count] = i;
    len[*count] = j - i;
    (*count)++;
    i = j;
  }
}

/* The context's limits at the launch (CUlimit id, value): the device heap size, the device runtime's
 * pending-launch count and sync depth, the stack and printf FIFO sizes. Replay sets the same ones. */
static void log_limits(mn_line *l) {
  static const CUlimit which[] = {CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE, CU_LIMIT_MALLOC_HEAP_SIZE,
                                  CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT};
  uint64_t ids[5], vals[5];
  size_t n = 0;
  for (size_t i = 0; D.ctxGetLimit && i < 5; i++) {
    size_t v = 0;
    if (D.ctxGetLimit(&v, which[i]) != CUDA_SUCCESS) continue;
    ids[n] = (uint64_t)which[i];
    vals[n++] = (uint64_t)v;
  }
  if (n) mn_line_pairs(l, "limits", ids, vals, n);
}

/* The instance event up to the prologue's figures, into pr->l (finished by finish_event when the
 * prologue is on disk); 0 when out of memory. */
static int begin_event(pending *pr, const mn_launch *L, const mn_kernel *k, const mn_inst *inst, const argscan *a,
                       const char *pro, const char *epi, uint64_t t_ns, const uint64_t *retimes, uint32_t nretimes,
                       const mn_texset *tx) {
  const snapshot_set *s = &pr->s;
  size_t cap = 8192 + 2 * (size_t)k->argbytes + 48 * (size_t)k->nparams + 64 * (size_t)k->argbytes / 8;
  char *buf = malloc(cap);
  uint64_t *po = malloc((k->nparams + 1) * sizeof *po), *ps = malloc((k->nparams + 1) * sizeof *ps);
  size_t nr = k->argbytes / 8 + 1;
  uint64_t *mo = malloc(nr * sizeof *mo), *ml = malloc(nr * sizeof *ml);
  int ok = buf && po && ps && mo && ml;
  if (ok) {
    for (uint32_t i = 0; i < k->nparams; i++) {
      po[i] = k->poff[i];
      ps[i] = k->psize[i];
    }
    size_t nm;
    mask_ranges(a->mask, k->argbytes, mo, ml, &nm, nr);
    uint64_t fk[32];
    for (size_t i = 0; i < a->nforeign; i++) fk[i] = a->fkind[i];
    mn_line *l = &pr->l;
    mn_line_begin(l, buf, cap, "inst");
    mn_line_u64(l, "k", k->id);
    mn_line_u64(l, "i", inst->id);
    mn_line_str(l, "api", L->api);
    mn_line_u32s(l, "grid", L->grid, 3);
    mn_line_u32s(l, "block", L->block, 3);
    mn_line_u64(l, "shmem", L->shmem);
    if (L->cluster[0]) mn_line_u32s(l, "cluster", L->cluster, 3);
    if (L->coop) mn_line_u64(l, "coop", 1);
    if (L->nother) mn_line_u32s(l, "attrs", L->other, L->nother);
    mn_line_pairs(l, "params", po, ps, k->nparams);
    mn_line_hex(l, "args", a->bytes, k->argbytes);
    mn_line_pairs(l, "ptr", mo, ml, nm);
    mn_line_str(l, "ptr_src", a->from_ir ? "ir" : "value");
    if (a->nforeign) mn_line_pairs(l, "foreign", a->foff, fk, a->nforeign);
    if (a->ntex) mn_line_u64s(l, "tex", a->toff, a->ntex);
    mn_placed_log(l);
    if (a->ntex) mn_line_u64(l, "texobjs", tx->why[0] ? 0 : tx->nobjs);
    if (a->ntex) mn_line_u64(l, "arrays", tx->why[0] ? 0 : tx->narrays);
    if (tx->why[0]) mn_line_str(l, "tex_why", tx->why);
    mn_line_str(l, "pro", pro);
    mn_line_str(l, "epi", epi);
    mn_line_u64(l, "t_ns", t_ns);
    if (nretimes) mn_line_u64s(l, "rt", retimes, nretimes);
    mn_line_u64(l, "blobs", s->nblobs);
    mn_line_u64(l, "blob_bytes", s->blob_bytes);
    mn_line_u64(l, "vars", s->nvars);
    mn_line_u64(l, "epi_bytes", pr->epi_bytes);
    log_limits(l);
    pr->buf = buf;
  } else {
    free(buf);
  }
  free(po);
  free(ps);
  free(mo);
  free(ml);
  return ok;
}

/* The prologue's figures and the time split; async-signal-safe (the fatal-signal path finishes the
 * event of a prologue that completed while the app was dying). */
static void finish_event(pending *pr, uint64_t wait_ns) {
  const pro_job *j = &pr->job;
  rec_time rt = pr->rt;
  rt.write += j->io_ns;
  rt.diff += j->wall_ns - j->io_ns;
  rt.hidden = pr->threaded && j->wall_ns > wait_ns ? j->wall_ns - wait_ns : 0;
  mn_line *l = &pr->l;
  mn_line_u64(l, "pro_bytes", j->bytes);
  /* the recorder's own time for this instance (ns): copies from the device (and their bytes),
   * checksums/diffs/encoding and disk writes (work on both threads), timing reruns, the prologue work
   * the app did not wait for, the rest, the wait for this prologue at the next instance or at exit, and
   * all of mn_record_instance(): copy + diff + write + retime + other + the kernel - hidden = record + wait */
  mn_line_u64(l, "t_copy", rt.copy);
  mn_line_u64(l, "copy_bytes", rt.copy_bytes);
  mn_line_u64(l, "t_diff", rt.diff);
  mn_line_u64(l, "t_write", rt.write);
  mn_line_u64(l, "t_retime", rt.retime);
  mn_line_u64(l, "t_hidden", rt.hidden);
  mn_line_u64(l, "t_other", rt.other);
  mn_line_u64(l, "t_wait", wait_ns);
  mn_line_u64(l, "t_record", rt.total);
}

/* Ends a recorded instance: its instance event once the prologue is on disk, or the cleanup of one
 * whose prologue failed; frees its buffers. Called with R.mu held. */
static void settle(pending *pr) {
  uint64_t t0 = mn_precise_ns();
  if (pr->threaded) pthread_join(pr->thread, NULL);
  uint64_t wait = pr->threaded ? mn_precise_ns() - t0 : 0;
  mn_inst *inst = pr->inst;
  if (pr->job.rc) {
    char why[4352 + 1152];
    snprintf(why, sizeof why, "%s: %s", pr->pro, pr->job.err);
    unlink(pr->pro);
    unlink(pr->epi);
    R.incomplete = 1;
    mn_error("cannot write a prologue; no further instances are recorded", why);
    mn_kernel_skip(pr->k, MN_SKIP_FAILED);
    pr->k->ninst_recorded--;
    pr->k->recorded_launches -= inst->count;
    inst->recorded = 0;
  } else if (!__atomic_exchange_n(&pr->taken, 1, __ATOMIC_ACQ_REL)) {
    finish_event(pr, wait);
    mn_log_event(&pr->l);
    R.stored_bytes += pr->job.bytes + pr->epi_bytes;
    __atomic_store_n(&inst->logged, 1, __ATOMIC_RELEASE);
  }
  mn_set_free(&pr->s);
  free(pr->job.args);
  free(pr->job.annots);
  free(pr->buf);
  free(pr);
}

void mn_record_settle(int wait) {
  pending *pr = P;
  if (!pr || (!wait && !__atomic_load_n(&pr->done, __ATOMIC_ACQUIRE))) return;
  __atomic_store_n(&P, NULL, __ATOMIC_RELEASE);
  settle(pr);
}

void mn_record_settle_signal(void) {
  pending *pr = __atomic_load_n(&P, __ATOMIC_ACQUIRE);
  if (!pr || pthread_equal(pthread_self(), pr->thread)) return;
  uint64_t waited = 0;
  struct timespec ms = {0, 1000000};
  for (; waited < 60000 && !__atomic_load_n(&pr->done, __ATOMIC_ACQUIRE); waited++) nanosleep(&ms, NULL);
  if (!__atomic_load_n(&pr->done, __ATOMIC_ACQUIRE) || pr->job.rc || __atomic_exchange_n(&pr->taken, 1, __ATOMIC_ACQ_REL))
    return;
  finish_event(pr, waited * 1000000ull);
  size_t n = mn_line_end(&pr->l);
  if (n && mn_log_write(&R.log, pr->l.buf, n)) R.incomplete = 1;
  __atomic_store_n(&pr->inst->logged, 1, __ATOMIC_RELEASE);
}

static CUresult drop(pending *pr, mn_texset *tx, CUresult r) {
  mn_tex_free(tx);
  mn_set_free(&pr->s);
  free(pr->job.args);
  free(pr->job.annots);
  free(pr->buf);
  free(pr);
  return r;
}

/* Records a new instance: synchronize, prologue, timed launch, synchronize, epilogue. Returns the
 * launch's result; on a recording failure the launch still happens exactly once. */
CUresult mn_record_instance(const mn_launch *L, mn_kernel *k, mn_inst *inst, const argscan *a) {
  mn_record_settle(1); /* the previous instance's prologue first: its buffers go back to the pool */
  uint64_t t_start = mn_precise_ns();
  memset(&mn_copied, 0, sizeof mn_copied);
  CUresult sync = D.ctxSynchronize();
  if (sync != CUDA_SUCCESS) {
    mn_kernel_skip(k, MN_SKIP_PENDING_ERROR);
    return mn_fire(L);
  }
  mn_drain_deferred_frees();
  mn_texset tx;
  memset(&tx, 0, sizeof tx);
  pending *pr = calloc(1, sizeof *pr);
  if (!pr) {
    mn_error("out of host memory recording an instance", k->name);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return mn_fire(L);
  }
  snapshot_set *s = &pr->s;
  char *pro = pr->pro, *epi = pr->epi, why[4352 + 1152];
  snap_path(pro, sizeof pr->pro, inst, "prologue");
  snap_path(epi, sizeof pr->epi, inst, "epilogue");
  if (a->ntex && mn_tex_capture(a->bytes, a->toff, a->ntex, &tx)) mn_tex_free(&tx); /* tx.why says why */
  if (mn_collect_blobs(s) || mn_collect_vars(k, s)) {
    mn_error("cannot read the device memory for a prologue (out of host memory?)", k->name);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return drop(pr, &tx, mn_fire(L));
  }
  pro_job *pj = &pr->job;
  pj->path = pro, pj->k = k, pj->s = s, pj->tx = a->ntex ? &tx : NULL, pj->nannots = R.nannots;
  pj->args = malloc(k->argbytes + 1u);
  pj->annots = malloc((R.nannots + 1) * sizeof *pj->annots);
  if (!pj->args || !pj->annots) {
    mn_error("out of host memory recording an instance", k->name);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return drop(pr, &tx, mn_fire(L));
  }
  memcpy(pj->args, a->bytes, k->argbytes);
  if (R.nannots) memcpy(pj->annots, R.annots, R.nannots * sizeof *pj->annots);
  /* texture arrays are reread after the launch (mn_tex_reread): their prologue is written first */
  pr->threaded = R.cfg.snapshot_thread && !a->ntex && start_pro_job(pr);
  if (!pr->threaded) run_pro_job(pj);
  if (!pr->threaded && pj->rc) {
    snprintf(why, sizeof why, "%s: %s", pro, pj->err);
    unlink(pro);
    R.incomplete = 1;
    mn_error("cannot write a prologue; no further instances are recorded", why);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return drop(pr, &tx, mn_fire(L));
  }
  uint64_t retimes[MN_RETIME_MAX];
  /* Rerunning is safe only when everything the kernel can reach is restored by the prologue: not for a
   * kernel without IR (the variables it reaches are unknown: at the driver API a module's variables are
   * seen only when the app asks for them, e.g. by cudaMemcpyFromSymbol after the launch), nor when a
   * variable could not be read. */
  uint64_t t_rt = mn_precise_ns();
  /* Nor for a kernel that allocates from the device heap or prints (kernel table): a rerun would allocate
   * again or print again, which no prologue undoes. */
  uint32_t nretimes =
      a->nforeign || a->ntex || !k->tab || k->tab->no_rerun || R.heap_live || s->unrestorable ? 0 : mn_retime(L, k, s, retimes);
  t_rt = mn_precise_ns() - t_rt;
  uint64_t t_ns = 0;
  CUresult r, after;
  mn_held_launch(L, k, &r, &after, &t_ns);
  if (t_ns) k->last_run_ns = t_ns;
  if (after != CUDA_SUCCESS) {
    if (pr->threaded) pthread_join(pr->thread, NULL);
    snprintf(why, sizeof why, "%s: %s", k->name, mn_cu_err(after));
    mn_error(r != CUDA_SUCCESS ? "the recorded launch failed" : "the recorded kernel failed", why);
    unlink(pro);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return drop(pr, &tx, r);
  }
  if (!tx.why[0] && mn_tex_reread(&tx)) mn_tex_free(&tx); /* the prologue has the objects: reported by tex_why */
  uint64_t t_epi = mn_precise_ns(), io_epi = mn_snapshot_io_ns(), copy_epi = mn_copied.copy;
  int epi_rc = mn_write_epilogue(epi, s, &tx, &pr->epi_bytes);
  if (epi_rc) snprintf(why, sizeof why, "%s: %s", epi, mn_last_error());
  io_epi = mn_snapshot_io_ns() - io_epi;
  copy_epi = mn_copied.copy - copy_epi;
  t_epi = mn_precise_ns() - t_epi;
  if (epi_rc) {
    if (pr->threaded) pthread_join(pr->thread, NULL);
    unlink(pro);
    unlink(epi);
    R.incomplete = 1;
    mn_error("cannot write an epilogue; no further instances are recorded", why);
    mn_kernel_skip(k, MN_SKIP_FAILED);
    return drop(pr, &tx, r);
  }
  rec_time *rt = &pr->rt;
  rt->copy = mn_copied.copy;
  rt->copy_bytes = mn_copied.copy_bytes;
  /* the epilogue's share here; finish_event adds the prologue's (on whichever thread wrote it) */
  rt->write = io_epi;
  rt->diff = t_epi > io_epi + copy_epi ? t_epi - io_epi - copy_epi : 0;
  rt->retime = t_rt;
  rt->total = mn_precise_ns() - t_start;
  /* the rest: synchronizing, pinned allocations, variables, textures (not the kernel itself) */
  uint64_t known = rt->retime + rt->copy + rt->write + rt->diff + t_ns + (pr->threaded ? 0 : pj->wall_ns);
  rt->other = rt->total > known ? rt->total - known : 0;
  inst->recorded = 1;
  inst->count = 1;
  inst->flushed_count = 1;
  k->ninst_recorded++;
  k->recorded_launches++;
  pr->k = k;
  pr->inst = inst;
  if (!begin_event(pr, L, k, inst, a, basename_of(pro), basename_of(epi), t_ns, retimes, nretimes, &tx))
    mn_error("out of memory writing an instance event", k->name);
  if (!pr->buf) {
    if (pr->threaded) pthread_join(pr->thread, NULL);
    return drop(pr, &tx, r);
  }
  mn_tex_free(&tx); /* a prologue with textures was written on this thread, before the launch */
  if (pr->threaded) __atomic_store_n(&P, pr, __ATOMIC_RELEASE); /* finished later: mn_record_settle */
  else settle(pr);
  return r;
}
