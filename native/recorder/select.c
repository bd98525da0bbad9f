#include "select.h"

#include <cuda.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_uint(const char *s, const char *end, long *out) {
  if (s == end) return -1;
  long v = 0;
  for (const char *p = s; p < end; p++) {
    if (!isdigit((unsigned char)*p)) return -1;
    v = v * 10 + (*p - '0');
    if (v > 0x7fffffff) return -1;
  }
  *out = v;
  return 0;
}

int mn_rank_from_env(void) {
  static const char *vars[] = {"FLUX_TASK_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "PMIX_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    long r;
    if (v && parse_uint(v, v + strlen(v), &r) == 0) return (int)r;
  }
  return -1;
}

int mn_rank_selected(const char *spec, int rank) {
  if (rank < 0) rank = 0;
  if (!spec || !*spec) return rank == 0;
  if (strcmp(spec, "all") == 0) return 1;
  int hit = 0;
  const char *p = spec;
  for (;;) {
    const char *comma = strchr(p, ',');
    const char *end = comma ? comma : p + strlen(p);
    const char *dash = memchr(p, '-', (size_t)(end - p));
    long lo, hi;
    if (dash) {
      if (parse_uint(p, dash, &lo) || parse_uint(dash + 1, end, &hi) || hi < lo) return -1;
    } else {
      if (parse_uint(p, end, &lo)) return -1;
      hi = lo;
    }
    if (rank >= lo && rank <= hi) hit = 1;
    if (!comma) break;
    p = comma + 1;
  }
  return hit;
}

static void entry_free(mn_ktab_entry *e) {
  free(e->name);
  free(e->ranges);
  for (uint32_t i = 0; i < e->nvars; i++) free(e->vars[i]);
  free(e->vars);
}

void mn_ktab_free(mn_ktab *t) {
  for (size_t i = 0; i < t->n; i++) entry_free(&t->e[i]);
  free(t->e);
  t->e = NULL;
  t->n = 0;
}

static int cmp_entry(const void *a, const void *b) {
  return strcmp(((const mn_ktab_entry *)a)->name, ((const mn_ktab_entry *)b)->name);
}

/* Splits `s` in place at `sep`; returns the number of fields (up to max). */
static size_t split(char *s, char sep, char **fields, size_t max) {
  size_t n = 0;
  fields[n++] = s;
  for (char *p = s; *p && n < max; p++) {
    if (*p == sep) {
      *p = 0;
      fields[n++] = p + 1;
    }
  }
  return n;
}

static size_t count_items(const char *s) {
  size_t n = 1;
  for (; *s; s++) n += *s == ',';
  return n;
}

static int parse_ranges(mn_ktab_entry *e, char *s) {
  if (strcmp(s, "-") == 0) return 0;
  size_t n = count_items(s);
  e->ranges = calloc(n, sizeof(mn_ptr_range));
  if (!e->ranges) return -1;
  char *item = s;
  for (size_t i = 0; i < n; i++) {
    char *next = strchr(item, ',');
    if (next) *next = 0;
    char *parts[3];
    long v[3];
    if (split(item, ':', parts, 3) != 3) return -1;
    for (int k = 0; k < 3; k++)
      if (parse_uint(parts[k], parts[k] + strlen(parts[k]), &v[k])) return -1;
    if (v[2] == 0 || (uint32_t)v[0] >= e->nparams) return -1;
    e->ranges[i].param = (uint32_t)v[0];
    e->ranges[i].offset = (uint32_t)v[1];
    e->ranges[i].length = (uint32_t)v[2];
    e->nranges++;
    item = next ? next + 1 : item + strlen(item);
  }
  return 0;
}

static int parse_vars(mn_ktab_entry *e, char *s) {
  if (strcmp(s, "-") == 0) return 0;
  size_t n = count_items(s);
  e->vars = calloc(n, sizeof(char *));
  if (!e->vars) return -1;
  char *item = s;
  for (size_t i = 0; i < n; i++) {
    char *next = strchr(item, ',');
    if (next) *next = 0;
    if (!*item) return -1;
    e->vars[i] = strdup(item);
    if (!e->vars[i]) return -1;
    e->nvars++;
    item = next ? next + 1 : item + strlen(item);
  }
  return 0;
}

/* "heap,printf,launch" or "-": 1 when a rerun of the kernel would change state the prologue cannot restore. */
static int parse_state(const char *s) {
  if (strcmp(s, "-") == 0) return 0;
  return strstr(s, "heap") != NULL || strstr(s, "printf") != NULL;
}

static int parse_line(mn_ktab_entry *e, char *line) {
  char *f[8];
  size_t nf = split(line, '\t', f, 8);
  if ((nf != 6 && nf != 7) || strcmp(f[0], "K") != 0 || !*f[1]) return -1;
  long sel, np;
  if (parse_uint(f[2], f[2] + strlen(f[2]), &sel) || sel > 1) return -1;
  if (parse_uint(f[3], f[3] + strlen(f[3]), &np)) return -1;
  e->name = strdup(f[1]);
  if (!e->name) return -1;
  e->selected = (int)sel;
  e->nparams = (uint32_t)np;
  if (parse_ranges(e, f[4])) return -1;
  e->no_rerun = nf == 7 && parse_state(f[6]);
  e->heap = nf == 7 && strstr(f[6], "heap") != NULL;
  return parse_vars(e, f[5]);
}

int mn_ktab_parse(mn_ktab *t, const char *text, char *err, size_t errlen) {
  t->n = 0;
  t->e = NULL;
  char *copy = strdup(text);
  if (!copy) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  size_t cap = 0, lineno = 0;
  char *save = NULL;
  int rc = 0;
  for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    lineno++;
    size_t len = strlen(line);
    if (len && line[len - 1] == '\r') line[--len] = 0;
    if (!len || line[0] == '#') continue;
    if (t->n == cap) {
      size_t ncap = cap ? cap * 2 : 64;
      mn_ktab_entry *ne = realloc(t->e, ncap * sizeof *ne);
      if (!ne) { snprintf(err, errlen, "out of memory"); rc = -1; break; }
      t->e = ne;
      cap = ncap;
    }
    mn_ktab_entry *e = &t->e[t->n];
    memset(e, 0, sizeof *e);
    if (parse_line(e, line)) {
      entry_free(e);
      snprintf(err, errlen, "line %zu: malformed kernel table entry", lineno);
      rc = -1;
      break;
    }
    t->n++;
  }
  free(copy);
  if (rc) {
    mn_ktab_free(t);
    return -1;
  }
  if (t->n) qsort(t->e, t->n, sizeof *t->e, cmp_entry);
  return 0;
}

int mn_ktab_load(mn_ktab *t, const char *path, char *err, size_t errlen) {
  t->n = 0;
  t->e = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return -1;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  int rc = -1;
  while (buf) {
    size_t r = fread(buf + len, 1, cap - len - 1, f);
    len += r;
    if (len < cap - 1) break;
    char *nb = realloc(buf, cap * 2);
    if (!nb) { free(buf); buf = NULL; break; }
    buf = nb;
    cap *= 2;
  }
  if (buf && !ferror(f)) {
    buf[len] = 0;
    char sub[200];
    rc = mn_ktab_parse(t, buf, sub, sizeof sub);
    if (rc) snprintf(err, errlen, "%s: %s", path, sub);
  } else {
    snprintf(err, errlen, "%s: cannot read", path);
  }
  free(buf);
  fclose(f);
  return rc;
}

const mn_ktab_entry *mn_ktab_find(const mn_ktab *t, const char *name) {
  if (!t || !t->n || !name) return NULL;
  mn_ktab_entry key;
  key.name = (char *)name;
  return bsearch(&key, t->e, t->n, sizeof *t->e, cmp_entry);
}

int mn_capture_verdict(int query, int capturing) {
  if (query == CUDA_SUCCESS) return capturing ? MN_CAPTURE_THIS : MN_CAPTURE_NONE;
  switch (query) {
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
    case CUDA_ERROR_STREAM_CAPTURE_MERGE:
    case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED:
    case CUDA_ERROR_STREAM_CAPTURE_UNJOINED:
    case CUDA_ERROR_STREAM_CAPTURE_ISOLATION:
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD:
    case CUDA_ERROR_CAPTURED_EVENT:
      return MN_CAPTURE_ELSEWHERE;
    default:
      return MN_CAPTURE_CTX_ERROR;
  }
}
