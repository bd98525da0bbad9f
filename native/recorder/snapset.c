/* librecord's snapshot set of one recorded instance: the memory a kernel can reach (arena, pinned,
 * managed and app-registered host blobs; the variables it uses, with the relocations between them),
 * read before the launch, written as its prologue and, read again after it, as its epilogue (the writer
 * is native/snapshot.c); and written back to the device between timing reruns (mn_restore_prologue). */
#include "launch.h"

#include <stdlib.h>
#include <string.h>

void mn_set_free(snapshot_set *s) {
  for (size_t i = 0; i < s->nblobs; i++) mn_snap_free(s->blobs[i].before);
  for (size_t i = 0; i < s->nvars; i++) {
    free(s->vars[i].data);
    free(s->vars[i].relocs);
  }
  free(s->blobs);
  free(s->vars);
  memset(s, 0, sizeof *s);
}

/* The recorder's own time per recorded instance copying from the device (instance.c resets and reads it). */
mn_copy_tally mn_copied;

static int read_blob(const blob *b, uint8_t *dst) {
  uint64_t t0 = mn_precise_ns();
  int rc = 0;
  if (b->space == MN_SPACE_HOST_PINNED) memcpy(dst, (const void *)(uintptr_t)b->addr, b->size);
  else rc = mn_copy_dtoh(dst, b->addr, b->size);
  mn_copied.copy += mn_precise_ns() - t0;
  mn_copied.copy_bytes += b->size;
  return rc;
}

int mn_collect_blobs(snapshot_set *s) {
  size_t n = (R.arena_state > 0 ? R.dev.nlive : 0) + (R.host_state > 0 ? R.host.nlive : 0) + mn_placed_count();
  s->blobs = calloc(n ? n : 1, sizeof *s->blobs);
  if (!s->blobs) return -1;
  for (size_t i = 0; i < mn_placed_count(); i++) { /* managed and app-registered host memory (managed.c) */
    blob *b = &s->blobs[s->nblobs++];
    b->addr = mn_placed_at(i)->addr;
    b->size = mn_placed_at(i)->size;
    b->space = mn_placed_at(i)->space;
  }
  for (size_t i = 0; R.arena_state > 0 && i < R.dev.nlive; i++) {
    blob *b = &s->blobs[s->nblobs++];
    b->addr = R.dev.live[i].addr;
    b->size = R.dev.live[i].size;
    b->space = MN_SPACE_DEVICE;
  }
  for (size_t i = 0; R.host_state > 0 && i < R.host.nlive; i++) {
    blob *b = &s->blobs[s->nblobs++];
    b->addr = R.host.live[i].addr;
    b->size = R.host.live[i].size;
    b->space = MN_SPACE_HOST_PINNED;
  }
  for (size_t i = 0; i < s->nblobs; i++) {
    s->blobs[i].before = mn_snap_alloc(s->blobs[i].size);
    if (!s->blobs[i].before || read_blob(&s->blobs[i], s->blobs[i].before)) return -1;
    s->blob_bytes += s->blobs[i].size;
  }
  return 0;
}

static int read_var(const mn_gvar *v, uint8_t *dst) {
  uint64_t t0 = mn_precise_ns();
  int rc = D.memcpyDtoH(dst, (CUdeviceptr)v->addr, v->size) == CUDA_SUCCESS ? 0 : -1;
  mn_copied.copy += mn_precise_ns() - t0;
  mn_copied.copy_bytes += v->size;
  return rc;
}

/* Words of a variable that hold addresses: of another variable (relocated by replay) or of arena/pinned
 * memory (placed at the same address by replay: target NULL). */
static int find_relocs(varsnap *vs, uint8_t *use) {
  const mn_gvar *v = vs->v;
  if (v->addr % 8 || v->size < 8) return 0;
  uint32_t cap = 0;
  for (uint64_t o = 0; o + 8 <= v->size; o += 8) {
    uint64_t w;
    memcpy(&w, vs->data + o, 8);
    if (!w) continue;
    const mn_gvar *t = mn_var_containing(w);
    int in_blob = !t && mn_is_recorded_memory(w);
    if (!t && !in_blob) continue;
    if (vs->nrelocs == cap) {
      cap = cap ? cap * 2 : 4;
      mn_reloc *n = realloc(vs->relocs, cap * sizeof *n);
      if (!n) return -1;
      vs->relocs = n;
    }
    mn_reloc *r = &vs->relocs[vs->nrelocs++];
    r->offset = o;
    r->target = t ? t->name : NULL;
    r->target_offset = t ? w - t->addr : 0;
    if (t) use[t - R.vars] = 1;
  }
  return 0;
}

/* The variables the kernel's IR uses (all of them without IR), closed over relocation targets. */
int mn_collect_vars(const mn_kernel *k, snapshot_set *s) {
  if (!R.nvars) return 0;
  uint8_t *use = calloc(R.nvars, 1), *done = calloc(R.nvars, 1);
  s->vars = calloc(R.nvars, sizeof *s->vars);
  int rc = 0;
  if (!use || !done || !s->vars) rc = -1;
  for (size_t i = 0; !rc && i < R.nvars; i++) {
    if (!k->tab) {
      use[i] = 1;
      continue;
    }
    for (uint32_t j = 0; j < k->tab->nvars; j++)
      if (strcmp(k->tab->vars[j], R.vars[i].name) == 0) use[i] = 1;
  }
  for (int again = 1; !rc && again;) {
    again = 0;
    for (size_t i = 0; !rc && i < R.nvars; i++) {
      mn_gvar *v = &R.vars[i];
      if (!use[i] || done[i]) continue;
      done[i] = 1;
      if (v->resolved <= 0 || v->managed || v->size == 0) {
        if (v->size) s->unrestorable = 1;
        continue;
      }
      varsnap *vs = &s->vars[s->nvars];
      vs->v = v;
      vs->data = malloc(v->size);
      if (!vs->data) { rc = -1; break; }
      if (read_var(v, vs->data)) {
        free(vs->data);
        vs->data = NULL;
        s->unrestorable = 1;
        continue;
      }
      s->nvars++;
      if (find_relocs(vs, use)) rc = -1;
      again = 1;
    }
  }
  free(use);
  free(done);
  return rc;
}

/* args: the argument bytes; annots: the annotations at the launch; tx NULL: no texture objects. */
int mn_write_prologue(const char *path, const mn_kernel *k, snapshot_set *s, const uint8_t *args,
                          const mn_annot *annots, size_t nannots, const mn_texset *tx, uint64_t *bytes) {
  mn_writer *w = mn_writer_open(path, MN_PROLOGUE);
  if (!w) return -1;
  int rc = 0;
  for (size_t i = 0; !rc && i < s->nblobs; i++) {
    blob *b = &s->blobs[i];
    rc = mn_writer_blob(w, b->addr, b->size, b->space, b->before);
    if (!rc) {
      b->sum = mn_writer_last_checksum(w);
      __atomic_store_n(&b->sum_ready, 1, __ATOMIC_RELEASE);
    }
  }
  for (size_t i = 0; !rc && i < s->nvars; i++) {
    const varsnap *v = &s->vars[i];
    rc = mn_writer_var(w, v->v->name, v->v->addr, v->v->size, (uint32_t)v->v->is_const, v->data, v->nrelocs, v->relocs);
  }
  if (!rc) rc = mn_writer_args(w, k->nparams, k->poff, k->psize, k->argbytes, args);
  for (size_t i = 0; !rc && i < nannots; i++) rc = mn_writer_annot(w, &annots[i]);
  if (!rc && tx && !tx->why[0]) rc = mn_tex_write(w, tx, 1);
  if (rc) {
    mn_writer_abort(w);
    return -1;
  }
  *bytes = mn_writer_bytes(w);
  return mn_writer_close(w);
}

int mn_write_epilogue(const char *path, const snapshot_set *s, const mn_texset *tx, uint64_t *bytes) {
  mn_writer *w = mn_writer_open(path, MN_EPILOGUE);
  if (!w) return -1;
  int rc = 0;
  uint64_t maxsize = 0;
  for (size_t i = 0; i < s->nblobs; i++)
    if (s->blobs[i].size > maxsize) maxsize = s->blobs[i].size;
  uint8_t *after = maxsize ? mn_snap_alloc(maxsize) : NULL;
  if (maxsize && !after) rc = -1;
  for (size_t i = 0; !rc && i < s->nblobs; i++) {
    const blob *b = &s->blobs[i];
    rc = read_blob(b, after);
    /* an unchanged blob reuses the prologue's checksum when the prologue got that far already */
    if (!rc && __atomic_load_n(&b->sum_ready, __ATOMIC_ACQUIRE))
      rc = mn_writer_blob_epilogue_sum(w, b->addr, b->size, b->space, b->before, b->sum, after,
                                       R.cfg.epilogue_format, MN_MERGE_GAP);
    else if (!rc)
      rc = mn_writer_blob_epilogue(w, b->addr, b->size, b->space, b->before, after, R.cfg.epilogue_format, MN_MERGE_GAP);
  }
  mn_snap_free(after);
  for (size_t i = 0; !rc && i < s->nvars; i++) {
    const varsnap *v = &s->vars[i];
    uint8_t *data = malloc(v->v->size);
    rc = !data || read_var(v->v, data);
    if (!rc) rc = mn_writer_var(w, v->v->name, v->v->addr, v->v->size, (uint32_t)v->v->is_const, data, v->nrelocs, v->relocs);
    free(data);
  }
  if (!rc && !tx->why[0]) rc = mn_tex_write(w, tx, 0);
  if (rc) {
    mn_writer_abort(w);
    return -1;
  }
  *bytes = mn_writer_bytes(w);
  return mn_writer_close(w);
}

/* Writes the prologue back: blobs and variables as they were before the kernel ran. */
int mn_restore_prologue(const snapshot_set *s) {
  for (size_t i = 0; i < s->nblobs; i++) {
    const blob *b = &s->blobs[i];
    if (b->space == MN_SPACE_HOST_PINNED) {
      memcpy((void *)(uintptr_t)b->addr, b->before, b->size);
    } else if (mn_copy_htod(b->addr, b->before, b->size)) {
      return -1;
    }
  }
  for (size_t i = 0; i < s->nvars; i++) {
    const varsnap *v = &s->vars[i];
    if (D.memcpyHtoD((CUdeviceptr)v->v->addr, v->data, v->v->size) != CUDA_SUCCESS) return -1;
  }
  return D.ctxSynchronize() == CUDA_SUCCESS ? 0 : -1;
}
