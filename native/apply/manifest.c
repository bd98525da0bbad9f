/* The manifest `mneme apply` writes (mneme/apply/manifest.py: write_manifest) and the launch rule. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apply.h"

static int fail(char *err, size_t n, int line, const char *what) {
  snprintf(err, n, "manifest line %d: %s", line, what);
  return -1;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static void *grow(void *p, size_t n, size_t size) { return realloc(p, (n + 1) * size); }

static char *rest_of(const char *line, const char *key) {
  size_t k = strlen(key);
  if (strncmp(line, key, k) != 0 || line[k] != ' ') return NULL;
  return strdup(line + k + 1);
}

int mna_manifest_parse(const char *text, mna_manifest *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  char *copy = strdup(text);
  if (!copy) return fail(err, errlen, 0, "out of memory");
  int lineno = 0, version = 0, rc = 0;
  mna_entry *e = NULL;
  char *save = NULL;
  for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    lineno++;
    if (lineno == 1) {
      if (sscanf(line, "mneme-apply-manifest %d", &version) != 1 || version != 1) {
        rc = fail(err, errlen, lineno, "not a version-1 mneme apply manifest");
        break;
      }
      continue;
    }
    if (!e) {
      int id;
      char name[4096];
      if (sscanf(line, "entry %d %4095s", &id, name) != 2) {
        rc = fail(err, errlen, lineno, "expected 'entry ID KERNEL'");
        break;
      }
      mna_entry *n = grow(m->entries, m->n, sizeof *n);
      if (!n) {
        rc = fail(err, errlen, lineno, "out of memory");
        break;
      }
      m->entries = n;
      e = &m->entries[m->n++];
      memset(e, 0, sizeof *e);
      e->id = id;
      e->kernel = strdup(name);
      continue;
    }
    char *s;
    unsigned a[7];
    if (strcmp(line, "end") == 0) {
      if (!e->cubin || !e->kernel) {
        rc = fail(err, errlen, lineno, "entry without a cubin");
        break;
      }
      e = NULL;
    } else if ((s = rest_of(line, "cubin"))) {
      free(e->cubin);
      e->cubin = s;
    } else if (strcmp(line, "rule exact") == 0 || strcmp(line, "rule scaled") == 0) {
      e->scaled = line[5] == 's';
    } else if (sscanf(line, "rec %u %u %u %u %u %u %u", &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6]) == 7) {
      for (int i = 0; i < 3; i++) e->rec_grid[i] = a[i], e->rec_block[i] = a[3 + i];
      e->rec_shared = a[6];
    } else if (sscanf(line, "tuned %u %u %u %u %u %u %u", &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6]) == 7) {
      for (int i = 0; i < 3; i++) e->tuned_grid[i] = a[i], e->tuned_block[i] = a[3 + i];
      e->tuned_shared = a[6];
    } else if (sscanf(line, "round_up %u", &a[0]) == 1) {
      e->round_up = a[0] != 0;
    } else if (strncmp(line, "params ", 7) == 0) {
      char *p = line + 7, *end;
      unsigned long n = strtoul(p, &end, 10);
      if (end == p || n > MNA_MAX_PARAMS) {
        rc = fail(err, errlen, lineno, "bad 'params N size offset ...' line");
        break;
      }
      e->nparams = (uint32_t)n;
      for (unsigned long i = 0; i < 2 * n && rc == 0; i++) {
        p = end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p) rc = fail(err, errlen, lineno, "'params' line too short");
        else if (i % 2 == 0) e->param_size[i / 2] = (uint32_t)v;
        else e->param_offset[i / 2] = (uint32_t)v;
      }
      if (rc) break;
    } else if (strncmp(line, "match ", 6) == 0) {
      unsigned idx, off;
      int pos = 0;
      if (sscanf(line, "match %u %u %n", &idx, &off, &pos) != 2 || pos == 0) {
        rc = fail(err, errlen, lineno, "bad 'match PARAM OFFSET HEX' line");
        break;
      }
      const char *hex = line + pos;
      size_t hl = strlen(hex);
      if (hl == 0 || hl % 2 || idx >= MNA_MAX_PARAMS) {
        rc = fail(err, errlen, lineno, "bad 'match' bytes");
        break;
      }
      mna_match *n = grow(e->matches, e->nmatches, sizeof *n);
      uint8_t *bytes = malloc(hl / 2);
      if (!n || !bytes) {
        free(bytes);
        if (n) e->matches = n;
        rc = fail(err, errlen, lineno, "out of memory");
        break;
      }
      e->matches = n;
      for (size_t i = 0; i < hl / 2; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
          free(bytes);
          bytes = NULL;
          break;
        }
        bytes[i] = (uint8_t)(hi << 4 | lo);
      }
      if (!bytes) {
        rc = fail(err, errlen, lineno, "'match' bytes are not hex");
        break;
      }
      e->matches[e->nmatches++] = (mna_match){idx, off, (uint32_t)(hl / 2), bytes};
    } else if (strncmp(line, "var ", 4) == 0) {
      unsigned long long size;
      unsigned ro;
      int pos = 0;
      if (sscanf(line, "var %llu %u %n", &size, &ro, &pos) != 2 || pos == 0 || !line[pos]) {
        rc = fail(err, errlen, lineno, "bad 'var SIZE READONLY NAME' line");
        break;
      }
      mna_var *n = grow(e->vars, e->nvars, sizeof *n);
      if (!n) {
        rc = fail(err, errlen, lineno, "out of memory");
        break;
      }
      e->vars = n;
      e->vars[e->nvars++] = (mna_var){.name = strdup(line + pos), .size = size, .readonly = ro != 0};
    } else if (sscanf(line, "ptr %u %u", &a[0], &a[1]) == 2) {
      uint32_t(*n)[2] = grow(e->ptrs, e->nptrs, sizeof *n);
      if (!n) {
        rc = fail(err, errlen, lineno, "out of memory");
        break;
      }
      e->ptrs = n;
      e->ptrs[e->nptrs][0] = a[0];
      e->ptrs[e->nptrs][1] = a[1];
      e->nptrs++;
    } else {
      rc = fail(err, errlen, lineno, "unknown line");
      break;
    }
  }
  if (rc == 0 && e) rc = fail(err, errlen, lineno, "last entry has no 'end'");
  if (rc == 0 && version == 0) rc = fail(err, errlen, 0, "empty manifest");
  free(copy);
  if (rc) mna_manifest_free(m);
  return rc;
}

void mna_manifest_free(mna_manifest *m) {
  for (size_t i = 0; i < m->n; i++) {
    mna_entry *e = &m->entries[i];
    free(e->kernel);
    free(e->cubin);
    for (size_t j = 0; j < e->nmatches; j++) free(e->matches[j].bytes);
    free(e->matches);
    for (size_t j = 0; j < e->nvars; j++) free(e->vars[j].name);
    free(e->vars);
    free(e->ptrs);
  }
  free(m->entries);
  memset(m, 0, sizeof *m);
}

/* The rule (mneme/apply/manifest.py states it; scaled_grid is the same computation). */
static int rule(const mna_entry *e, const uint32_t grid[3], const uint32_t block[3], uint32_t shared,
                uint32_t out_grid[3]) {
  static const uint64_t max_grid[3] = {2147483647ull, 65535ull, 65535ull};
  for (int d = 0; d < 3; d++)
    if (block[d] != e->rec_block[d]) return 0;
  if (shared != e->rec_shared) return 0;
  if (!e->scaled) {
    for (int d = 0; d < 3; d++)
      if (grid[d] != e->rec_grid[d]) return 0;
    memcpy(out_grid, e->tuned_grid, sizeof e->tuned_grid);
    return 1;
  }
  for (int d = 0; d < 3; d++) {
    uint64_t work = (uint64_t)grid[d] * block[d], b = e->tuned_block[d];
    if (b == 0 || (!e->round_up && work % b)) return 0;
    uint64_t g = (work + b - 1) / b;
    if (g == 0) g = 1;
    if (g > max_grid[d]) return 0;
    out_grid[d] = (uint32_t)g;
  }
  return 1;
}

int mna_entry_matches(const mna_entry *e, const uint32_t grid[3], const uint32_t block[3], uint32_t shared,
                      void *const *params, uint32_t out_grid[3], uint32_t out_block[3], uint32_t *out_shared) {
  if (!rule(e, grid, block, shared, out_grid)) return 0;
  for (size_t i = 0; i < e->nmatches; i++) {
    const mna_match *mt = &e->matches[i];
    if (mt->param >= e->nparams || !params || !params[mt->param]) return 0;
    if ((uint64_t)mt->offset + mt->len > e->param_size[mt->param]) return 0;
    if (memcmp((const uint8_t *)params[mt->param] + mt->offset, mt->bytes, mt->len) != 0) return 0;
  }
  memcpy(out_block, e->tuned_block, sizeof e->tuned_block);
  *out_shared = e->tuned_shared;
  return 1;
}

int mna_entry_matches_buffer(const mna_entry *e, const uint32_t grid[3], const uint32_t block[3], uint32_t shared,
                             const uint8_t *buf, size_t buflen, uint32_t out_grid[3]) {
  void *params[MNA_MAX_PARAMS] = {0};
  for (uint32_t i = 0; i < e->nparams; i++)
    if ((uint64_t)e->param_offset[i] + e->param_size[i] <= buflen) params[i] = (void *)(buf + e->param_offset[i]);
  uint32_t ob[3], os;
  return mna_entry_matches(e, grid, block, shared, params, out_grid, ob, &os);
}

/* For the CPU tests (ctypes): parse `text`, decide for entry `index`; -2 on a parse error (message in err). */
int mna_test_match(const char *text, size_t index, const uint32_t grid[3], const uint32_t block[3], uint32_t shared,
                   const uint8_t *buf, size_t buflen, uint32_t out_grid[3], char *err, size_t errlen) {
  mna_manifest m;
  if (mna_manifest_parse(text, &m, err, errlen) != 0) return -2;
  int r = index < m.n ? mna_entry_matches_buffer(&m.entries[index], grid, block, shared, buf, buflen, out_grid) : -1;
  mna_manifest_free(&m);
  return r;
}
