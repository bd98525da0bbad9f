/* The snapshot format: checksum, streaming writer, validating reader, apply, compare, diff.
 * The layout is documented in snapshot.h. Plain C11 that also compiles as C++; no CUDA. */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif

#include "snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "snapshot.c reads and writes the little-endian format in place; port it for big-endian hosts"
#endif

#ifdef __cplusplus
#define MN_TLS thread_local
#define MN_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define MN_TLS _Thread_local
#define MN_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

MN_STATIC_ASSERT(sizeof(size_t) == 8, "snapshots need a 64-bit size_t");
MN_STATIC_ASSERT(sizeof(mn_range) == 16, "mn_range is read in place from the file");
MN_STATIC_ASSERT(sizeof(mn_texobj) == 176, "mn_texobj is stored in its in-memory layout");

#define FOURCC(a, b, c, d) ((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)
#define TAG_BLOB FOURCC('B', 'L', 'O', 'B')
#define TAG_VAR FOURCC('V', 'A', 'R', ' ')
#define TAG_ARGS FOURCC('A', 'R', 'G', 'S')
#define TAG_ANNOT FOURCC('A', 'N', 'N', 'O')
#define TAG_END FOURCC('E', 'N', 'D', ' ')
#define TAG_ARRAY FOURCC('A', 'R', 'R', 'Y')
#define TAG_TEXOBJ FOURCC('T', 'E', 'X', 'O')

#define HEADER_SIZE 32u
#define REC_HEAD 16u
#define BLOB_META 40u
#define VAR_META 32u
#define RELOC_SIZE 24u
#define ARGS_META 16u
#define ANNOT_SIZE 72u
#define END_SIZE 16u
#define ARRAY_META 56u
#define TEXOBJ_SIZE 176u
#define ELEM_MAX MN_ELEM_U64

/* ------------------------------------------------------------------ errors */

static MN_TLS char g_err[1024];

const char *mn_last_error(void) { return g_err; }

void mn_free(void *p) { free(p); }

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static int set_err(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_err, sizeof g_err, fmt, ap);
  va_end(ap);
  return -1;
}

static inline uint64_t ld64(const void *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t ld32(const void *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint16_t ld16(const void *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline void st64(void *p, uint64_t v) { memcpy(p, &v, 8); }
static inline void st32(void *p, uint32_t v) { memcpy(p, &v, 4); }
static inline uint64_t pad8(uint64_t n) { return (8 - (n & 7)) & 7; }

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = (char *)malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static void *dup_mem(const void *p, uint64_t n) {
  void *d = malloc(n ? n : 1);
  if (d && n) memcpy(d, p, n);
  return d;
}

/* ------------------------------------------------------------------ checksum (XXH64) */

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t xround(uint64_t acc, uint64_t in) { return rotl64(acc + in * P2, 31) * P1; }
static inline uint64_t xmerge(uint64_t h, uint64_t v) { return (h ^ xround(0, v)) * P1 + P4; }

static uint64_t xlanes(const uint64_t v[4]) {
  uint64_t h = rotl64(v[0], 1) + rotl64(v[1], 7) + rotl64(v[2], 12) + rotl64(v[3], 18);
  for (int i = 0; i < 4; i++) h = xmerge(h, v[i]);
  return h;
}

static void xstripes(uint64_t v[4], const uint8_t *p, size_t nstripes) {
  uint64_t a = v[0], b = v[1], c = v[2], d = v[3];
  for (size_t i = 0; i < nstripes; i++, p += 32) {
    a = xround(a, ld64(p));
    b = xround(b, ld64(p + 8));
    c = xround(c, ld64(p + 16));
    d = xround(d, ld64(p + 24));
  }
  v[0] = a, v[1] = b, v[2] = c, v[3] = d;
}

static uint64_t xfinish(uint64_t h, const uint8_t *p, size_t len) {
  for (; len >= 8; p += 8, len -= 8) h = rotl64(h ^ xround(0, ld64(p)), 27) * P1 + P4;
  if (len >= 4) {
    h = rotl64(h ^ (uint64_t)ld32(p) * P1, 23) * P2 + P3;
    p += 4, len -= 4;
  }
  for (; len; p++, len--) h = rotl64(h ^ (uint64_t)*p * P5, 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  return h ^ (h >> 32);
}

static void xinit(uint64_t v[4], uint64_t seed) {
  v[0] = seed + P1 + P2, v[1] = seed + P2, v[2] = seed, v[3] = seed - P1;
}

uint64_t mn_checksum(const void *data, size_t n, uint64_t seed) {
  const uint8_t *p = (const uint8_t *)data;
  uint64_t h;
  if (n >= 32) {
    uint64_t v[4];
    xinit(v, seed);
    xstripes(v, p, n / 32);
    h = xlanes(v);
    p += n / 32 * 32;
  } else {
    h = seed + P5;
  }
  return xfinish(h + n, p, n & 31);
}

/* Streaming form for the writer: equal to mn_checksum over the concatenation of all updates. */
typedef struct xstate {
  uint64_t v[4];
  uint64_t total;
  uint8_t mem[32];
  uint32_t memsize;
} xstate;

static void xs_init(xstate *s, uint64_t seed) {
  memset(s, 0, sizeof *s);
  xinit(s->v, seed);
}

static void xs_update(xstate *s, const uint8_t *p, size_t len) {
  if (!len) return;
  s->total += len;
  if (s->memsize + len < 32) {
    memcpy(s->mem + s->memsize, p, len);
    s->memsize += (uint32_t)len;
    return;
  }
  if (s->memsize) {
    size_t fill = 32 - s->memsize;
    memcpy(s->mem + s->memsize, p, fill);
    xstripes(s->v, s->mem, 1);
    p += fill, len -= fill;
    s->memsize = 0;
  }
  xstripes(s->v, p, len / 32);
  p += len / 32 * 32, len &= 31;
  if (len) memcpy(s->mem, p, len);
  s->memsize = (uint32_t)len;
}

static uint64_t xs_digest(const xstate *s) {
  uint64_t h = s->total >= 32 ? xlanes(s->v) : s->v[2] + P5;
  return xfinish(h + s->total, s->mem, s->memsize);
}

/* ------------------------------------------------------------------ diff */

typedef struct rangevec {
  mn_range *r;
  uint64_t n, cap;
  uint64_t payload;     /* 16 bytes of table + the bytes, per pushed range */
  uint64_t max_payload; /* stop (return -2) beyond this */
  uint64_t max_ranges;
  int have;
  uint64_t s, e;        /* range being grown */
  uint64_t gap;         /* effective merge gap, >= 1 */
} rangevec;

static int rv_push(rangevec *v) {
  if (v->n == v->cap) {
    uint64_t cap = v->cap ? v->cap * 2 : 64;
    mn_range *r = (mn_range *)realloc(v->r, cap * sizeof *r);
    if (!r) return -1;
    v->r = r, v->cap = cap;
  }
  v->r[v->n].offset = v->s;
  v->r[v->n].length = v->e - v->s;
  v->n++;
  v->payload += 16 + (v->e - v->s);
  if (v->payload > v->max_payload || v->n > v->max_ranges) return -2;
  return 0;
}

static inline int rv_seg(rangevec *v, uint64_t s, uint64_t e) {
  if (v->have && s - v->e < v->gap) {
    v->e = e;
    return 0;
  }
  int rc = v->have ? rv_push(v) : 0;
  v->have = 1, v->s = s, v->e = e;
  return rc;
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
static inline int has_zero_byte(uint64_t x) { return ((x - ONES) & ~x & HIGHS) != 0; }

/* x = a ^ b of the 8 bytes at offset o; x != 0. */
static inline int rv_word(rangevec *v, uint64_t o, uint64_t x) {
  if (!has_zero_byte(x)) return rv_seg(v, o, o + 8);
  if (v->gap >= 8) {
    uint64_t f = (uint64_t)__builtin_ctzll(x) / 8, l = 7 - (uint64_t)__builtin_clzll(x) / 8;
    return rv_seg(v, o + f, o + l + 1);
  }
  for (uint64_t j = 0; j < 8; j++)
    if ((x >> (8 * j)) & 0xff) {
      int rc = rv_seg(v, o + j, o + j + 1);
      if (rc) return rc;
    }
  return 0;
}

#define DIFF_BLOCK 4096u

/* The differing words and bytes of [i, n) into v. */
static int diff_words(rangevec *v, const uint8_t *a, const uint8_t *b, uint64_t i, uint64_t n) {
  int rc = 0;
  for (; i + 32 <= n && !rc; i += 32) {
    uint64_t x0 = ld64(a + i) ^ ld64(b + i), x1 = ld64(a + i + 8) ^ ld64(b + i + 8);
    uint64_t x2 = ld64(a + i + 16) ^ ld64(b + i + 16), x3 = ld64(a + i + 24) ^ ld64(b + i + 24);
    if (!(x0 | x1 | x2 | x3)) continue;
    /* inside a changed region: 32 bytes that all differ extend the open range at once */
    if (v->have && v->e == i && !has_zero_byte(x0) && !has_zero_byte(x1) && !has_zero_byte(x2) &&
        !has_zero_byte(x3)) {
      v->e = i + 32;
      continue;
    }
    if (x0 && !rc) rc = rv_word(v, i, x0);
    if (x1 && !rc) rc = rv_word(v, i + 8, x1);
    if (x2 && !rc) rc = rv_word(v, i + 16, x2);
    if (x3 && !rc) rc = rv_word(v, i + 24, x3);
  }
  for (; i + 8 <= n && !rc; i += 8) {
    uint64_t x = ld64(a + i) ^ ld64(b + i);
    if (x) rc = rv_word(v, i, x);
  }
  for (; i < n && !rc; i++)
    if (a[i] != b[i]) rc = rv_seg(v, i, i + 1);
  return rc;
}

/* Returns the count, -1 on allocation failure, -2 when the limits were exceeded. */
static int64_t diff_ranges(const uint8_t *a, const uint8_t *b, uint64_t n, uint64_t merge_gap,
                           uint64_t max_payload, uint64_t max_ranges, mn_range **out) {
  rangevec v;
  memset(&v, 0, sizeof v);
  v.max_payload = max_payload, v.max_ranges = max_ranges;
  v.gap = merge_gap ? merge_gap : 1;
  *out = NULL;
  int rc = 0;
  uint64_t i = 0;
  /* Equal blocks (most of a buffer the kernel only read) are skipped at memcmp speed; only a block
   * that differs is scanned word by word. Ranges merge by offset, so skipping cannot change them. */
  for (; i + DIFF_BLOCK <= n && !rc; i += DIFF_BLOCK) {
    if (memcmp(a + i, b + i, DIFF_BLOCK) == 0) continue;
    rc = diff_words(&v, a, b, i, i + DIFF_BLOCK);
  }
  if (!rc) rc = diff_words(&v, a, b, i, n);
  if (!rc && v.have) rc = rv_push(&v);
  if (rc) {
    free(v.r);
    return rc;
  }
  *out = v.r;
  return (int64_t)v.n;
}

int64_t mn_diff_ranges(const void *a, const void *b, uint64_t n, uint64_t merge_gap, mn_range **out) {
  if (!out || (n && (!a || !b))) {
    set_err("mn_diff_ranges: NULL buffer or output pointer");
    return -1;
  }
  int64_t rc = diff_ranges((const uint8_t *)a, (const uint8_t *)b, n, merge_gap, UINT64_MAX, UINT64_MAX, out);
  if (rc < 0) set_err("mn_diff_ranges: out of memory for the ranges of a %" PRIu64 "-byte buffer", n);
  return rc < 0 ? -1 : rc;
}

/* ------------------------------------------------------------------ writer */

#define WBUF_SIZE (1u << 20)

struct mn_writer {
  int fd;
  int failed;
  int has_args;
  uint32_t kind;
  char *path;
  uint8_t *buf;
  size_t used;
  uint64_t written;  /* bytes accepted (flushed or buffered) */
  uint64_t flushed;  /* bytes handed to the kernel */
  uint64_t nrecords;
  uint64_t header_sum;
  uint64_t rec_off, rec_len, rec_done;
  uint32_t rec_tag;
  uint64_t last_sum; /* content checksum of the last blob written */
  xstate xs;
  char err[1024]; /* the first error, repeated by every later call */
};

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int w_fail(mn_writer *w, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_err, sizeof g_err, fmt, ap);
  va_end(ap);
  if (w) {
    memcpy(w->err, g_err, sizeof w->err);
    w->failed = 1;
  }
  return -1;
}

/* -1 when the writer is unusable (the first error is repeated). */
static int w_ok(mn_writer *w, const char *fn) {
  if (!w) return set_err("%s: writer is NULL", fn);
  if (w->failed) {
    memcpy(g_err, w->err, sizeof g_err);
    return -1;
  }
  return 0;
}

/* Time spent in write/fsync/close by this thread's writers (mn_snapshot_io_ns). */
static MN_TLS uint64_t g_io_ns;

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t mn_snapshot_io_ns(void) { return g_io_ns; }

/* Whether mn_writer_close fsyncs (default yes); process-wide. */
static int g_fsync = 1;

void mn_snapshot_set_fsync(int on) { __atomic_store_n(&g_fsync, on ? 1 : 0, __ATOMIC_RELAXED); }

static int w_write_all(mn_writer *w, const uint8_t *p, size_t n) {
  uint64_t t0 = mono_ns();
  int rc = 0;
  while (n && !rc) {
    ssize_t k = write(w->fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (k < 0) {
      if (errno == EINTR) continue;
      rc = w_fail(w, "%s: writing the snapshot failed at byte %" PRIu64 ": %s", w->path, w->flushed,
                  strerror(errno));
      break;
    }
    p += k, n -= (size_t)k, w->flushed += (uint64_t)k;
  }
  g_io_ns += mono_ns() - t0;
  return rc;
}

static int w_flush(mn_writer *w) {
  int rc = w_write_all(w, w->buf, w->used);
  w->used = 0;
  return rc;
}

static int w_raw(mn_writer *w, const void *data, size_t n) {
  const uint8_t *p = (const uint8_t *)data;
  w->written += n;
  if (w->used + n <= WBUF_SIZE) {
    if (n) memcpy(w->buf + w->used, p, n);
    w->used += n;
    return 0;
  }
  if (w_flush(w)) return -1;
  if (n >= WBUF_SIZE) return w_write_all(w, p, n);
  memcpy(w->buf, p, n);
  w->used = n;
  return 0;
}

static int rec_begin(mn_writer *w, uint32_t tag, uint64_t len) {
  uint8_t h[REC_HEAD];
  st32(h, tag);
  st32(h + 4, 0);
  st64(h + 8, len);
  xs_init(&w->xs, 0);
  xs_update(&w->xs, h, sizeof h);
  w->rec_off = w->written, w->rec_len = len, w->rec_done = 0, w->rec_tag = tag;
  return w_raw(w, h, sizeof h);
}

static int rec_put(mn_writer *w, const void *p, uint64_t n) {
  if (w->rec_done + n > w->rec_len)
    return w_fail(w, "%s: internal error: record at byte %" PRIu64 " overran its declared length", w->path,
                  w->rec_off);
  xs_update(&w->xs, (const uint8_t *)p, n);
  w->rec_done += n;
  return w_raw(w, p, n);
}

static int rec_pad(mn_writer *w) {
  static const uint8_t zeros[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  return rec_put(w, zeros, pad8(w->rec_done));
}

static int rec_end(mn_writer *w) {
  static const uint8_t zeros[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (w->rec_done != w->rec_len)
    return w_fail(w, "%s: internal error: record at byte %" PRIu64 " is %" PRIu64 " bytes, declared %" PRIu64,
                  w->path, w->rec_off, w->rec_done, w->rec_len);
  uint64_t pad = pad8(w->rec_len);
  xs_update(&w->xs, zeros, pad);
  if (w_raw(w, zeros, pad)) return -1;
  uint8_t sum[8];
  st64(sum, xs_digest(&w->xs));
  w->nrecords++;
  return w_raw(w, sum, sizeof sum);
}

mn_writer *mn_writer_open(const char *path, uint32_t kind) {
  if (!path) {
    set_err("mn_writer_open: path is NULL");
    return NULL;
  }
  if (kind != MN_PROLOGUE && kind != MN_EPILOGUE) {
    set_err("%s: unknown snapshot kind %u (1 = prologue, 2 = epilogue)", path, kind);
    return NULL;
  }
  mn_writer *w = (mn_writer *)calloc(1, sizeof *w);
  if (w) w->path = dup_str(path);
  if (w) w->buf = (uint8_t *)malloc(WBUF_SIZE);
  if (!w || !w->path || !w->buf) {
    set_err("%s: out of memory opening a snapshot writer", path);
    if (w) free(w->path), free(w->buf), free(w);
    return NULL;
  }
  w->kind = kind;
  w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0) {
    set_err("%s: cannot create the snapshot file: %s", path, strerror(errno));
    free(w->path), free(w->buf), free(w);
    return NULL;
  }
  uint8_t h[HEADER_SIZE];
  struct timespec ts;
  memset(h, 0, sizeof h);
  memcpy(h, MN_SNAPSHOT_MAGIC, 8);
  st32(h + 8, MN_SNAPSHOT_VERSION);
  st32(h + 12, kind);
  clock_gettime(CLOCK_REALTIME, &ts);
  st64(h + 24, (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
  w->header_sum = mn_checksum(h, sizeof h, 0);
  w_raw(w, h, sizeof h);
  return w;
}

static int blob_record(mn_writer *w, uint64_t addr, uint64_t size, uint32_t space, uint32_t enc,
                       uint64_t checksum, const mn_range *ranges, uint32_t nranges, const uint8_t *data) {
  uint64_t len = BLOB_META;
  if (enc == MN_ENC_BYTES) {
    len += size;
  } else {
    len += (uint64_t)nranges * 16;
    for (uint32_t i = 0; i < nranges; i++) len += ranges[i].length;
  }
  uint8_t m[BLOB_META];
  st64(m, addr);
  st64(m + 8, size);
  st32(m + 16, space);
  st32(m + 20, enc);
  st64(m + 24, checksum);
  st32(m + 32, nranges);
  st32(m + 36, 0);
  if (rec_begin(w, TAG_BLOB, len) || rec_put(w, m, sizeof m)) return -1;
  if (enc == MN_ENC_BYTES) {
    if (rec_put(w, data, size)) return -1;
  } else {
    if (nranges && rec_put(w, ranges, (uint64_t)nranges * 16)) return -1;
    for (uint32_t i = 0; i < nranges; i++)
      if (rec_put(w, data + ranges[i].offset, ranges[i].length)) return -1;
  }
  return rec_end(w);
}

static int check_blob_args(mn_writer *w, const char *fn, uint64_t addr, uint64_t size, uint32_t space,
                           const void *data) {
  if (w_ok(w, fn)) return -1;
  if (space > MN_SPACE_MANAGED)
    return set_err("%s: %s: blob 0x%" PRIx64 " has unknown space %u", w->path, fn, addr, space);
  if (size && !data) return set_err("%s: %s: blob 0x%" PRIx64 " has no contents", w->path, fn, addr);
  return 0;
}

int mn_writer_blob(mn_writer *w, uint64_t addr, uint64_t size, uint32_t space, const void *data) {
  if (check_blob_args(w, "mn_writer_blob", addr, size, space, data)) return -1;
  w->last_sum = mn_checksum(data, size, 0);
  return blob_record(w, addr, size, space, MN_ENC_BYTES, w->last_sum, NULL, 0, (const uint8_t *)data);
}

uint64_t mn_writer_last_checksum(const mn_writer *w) { return w ? w->last_sum : 0; }

/* before_sum (NULL: unknown) is mn_checksum of `before`: a blob without differences has that checksum,
 * so it is not hashed again. */
static int blob_epilogue(mn_writer *w, uint64_t addr, uint64_t size, uint32_t space, const void *before,
                         const uint64_t *before_sum, const void *after, int format, uint64_t merge_gap) {
  if (check_blob_args(w, "mn_writer_blob_epilogue", addr, size, space, after)) return -1;
  if (w->kind != MN_EPILOGUE)
    return set_err("%s: mn_writer_blob_epilogue: a prologue stores blobs in full (use mn_writer_blob)", w->path);
  if (format < MN_EPI_DIFF || format > MN_EPI_BEST)
    return set_err("%s: mn_writer_blob_epilogue: unknown format %d (0 = diff, 1 = bytes, 2 = best)", w->path,
                   format);
  mn_range *ranges = NULL;
  int64_t n = -2;
  if (before && format != MN_EPI_BYTES) {
    uint64_t max_payload = format == MN_EPI_BEST ? (size ? size - 1 : 0) : UINT64_MAX;
    n = diff_ranges((const uint8_t *)before, (const uint8_t *)after, size, merge_gap, max_payload, UINT32_MAX,
                    &ranges);
    if (n == -1)
      return set_err("%s: out of memory diffing blob 0x%" PRIx64 " (%" PRIu64 " bytes)", w->path, addr, size);
  }
  uint64_t sum = n == 0 && before_sum ? *before_sum : mn_checksum(after, size, 0);
  w->last_sum = sum;
  int rc = n >= 0 ? blob_record(w, addr, size, space, MN_ENC_DIFF, sum, ranges, (uint32_t)n, (const uint8_t *)after)
                  : blob_record(w, addr, size, space, MN_ENC_BYTES, sum, NULL, 0, (const uint8_t *)after);
  free(ranges);
  return rc;
}

int mn_writer_blob_epilogue(mn_writer *w, uint64_t addr, uint64_t size, uint32_t space, const void *before,
                            const void *after, int format, uint64_t merge_gap) {
  return blob_epilogue(w, addr, size, space, before, NULL, after, format, merge_gap);
}

int mn_writer_blob_epilogue_sum(mn_writer *w, uint64_t addr, uint64_t size, uint32_t space, const void *before,
                                uint64_t before_sum, const void *after, int format, uint64_t merge_gap) {
  return blob_epilogue(w, addr, size, space, before, &before_sum, after, format, merge_gap);
}

int mn_writer_var(mn_writer *w, const char *name, uint64_t addr, uint64_t size, uint32_t is_const,
                  const void *data, uint32_t nrelocs, const mn_reloc *relocs) {
  if (w_ok(w, "mn_writer_var")) return -1;
  if (!name || !*name) return set_err("%s: mn_writer_var: variable at 0x%" PRIx64 " has no name", w->path, addr);
  if (size && !data) return set_err("%s: mn_writer_var: variable %s has no contents", w->path, name);
  if (nrelocs && !relocs) return set_err("%s: mn_writer_var: variable %s: relocs is NULL", w->path, name);
  if (is_const > 1) return set_err("%s: mn_writer_var: variable %s: is_const must be 0 or 1", w->path, name);
  uint64_t strings = strlen(name) + 1;
  for (uint32_t i = 0; i < nrelocs; i++) {
    if (size < 8 || relocs[i].offset > size - 8)
      return set_err("%s: mn_writer_var: variable %s (%" PRIu64 " bytes) has a relocation at offset %" PRIu64
                     " that does not fit an 8-byte address",
                     w->path, name, size, relocs[i].offset);
    if (relocs[i].target) strings += strlen(relocs[i].target) + 1;
  }
  uint64_t head = VAR_META + (uint64_t)nrelocs * RELOC_SIZE + strings;
  uint8_t m[VAR_META];
  st64(m, addr);
  st64(m + 8, size);
  st32(m + 16, is_const);
  st32(m + 20, nrelocs);
  st32(m + 24, (uint32_t)(strlen(name) + 1));
  st32(m + 28, 0);
  if (rec_begin(w, TAG_VAR, head + pad8(head) + size) || rec_put(w, m, sizeof m)) return -1;
  for (uint32_t i = 0; i < nrelocs; i++) {
    uint8_t r[RELOC_SIZE];
    st64(r, relocs[i].offset);
    st64(r + 8, relocs[i].target_offset);
    st32(r + 16, relocs[i].target ? (uint32_t)(strlen(relocs[i].target) + 1) : 0);
    st32(r + 20, 0);
    if (rec_put(w, r, sizeof r)) return -1;
  }
  if (rec_put(w, name, strlen(name) + 1)) return -1;
  for (uint32_t i = 0; i < nrelocs; i++)
    if (relocs[i].target && rec_put(w, relocs[i].target, strlen(relocs[i].target) + 1)) return -1;
  if (rec_pad(w) || rec_put(w, data, size)) return -1;
  return rec_end(w);
}

int mn_writer_args(mn_writer *w, uint32_t count, const uint32_t *offsets, const uint32_t *sizes, uint64_t total,
                   const void *bytes) {
  if (w_ok(w, "mn_writer_args")) return -1;
  if (w->has_args) return set_err("%s: mn_writer_args: the arguments were already written", w->path);
  if (count && (!offsets || !sizes)) return set_err("%s: mn_writer_args: offsets or sizes is NULL", w->path);
  if (total && !bytes) return set_err("%s: mn_writer_args: bytes is NULL", w->path);
  for (uint32_t i = 0; i < count; i++)
    if ((uint64_t)offsets[i] + sizes[i] > total)
      return set_err("%s: mn_writer_args: parameter %u (offset %u, %u bytes) lies outside the %" PRIu64
                     " argument bytes",
                     w->path, i, offsets[i], sizes[i], total);
  uint64_t head = ARGS_META + (uint64_t)count * 8;
  uint8_t m[ARGS_META];
  st32(m, count);
  st32(m + 4, 0);
  st64(m + 8, total);
  if (rec_begin(w, TAG_ARGS, head + pad8(head) + total) || rec_put(w, m, sizeof m)) return -1;
  if (count && (rec_put(w, offsets, (uint64_t)count * 4) || rec_put(w, sizes, (uint64_t)count * 4))) return -1;
  if (rec_pad(w) || rec_put(w, bytes, total) || rec_end(w)) return -1;
  w->has_args = 1;
  return 0;
}

static int annot_problem(const mn_annot *a, char *why, size_t n) {
  if (a->elem > ELEM_MAX) return snprintf(why, n, "unknown element type %u", a->elem), 1;
  if (a->mode > MN_TOL_REL) return snprintf(why, n, "unknown tolerance mode %u", a->mode), 1;
  if (a->norm > MN_NORM_LINF) return snprintf(why, n, "unknown norm %u", a->norm), 1;
  if (isnan(a->tol)) return snprintf(why, n, "tolerance is NaN"), 1;
  if (!memchr(a->tag, 0, sizeof a->tag)) return snprintf(why, n, "tag is not NUL-terminated"), 1;
  return 0;
}

int mn_writer_annot(mn_writer *w, const mn_annot *a) {
  char why[96];
  if (w_ok(w, "mn_writer_annot")) return -1;
  if (!a) return set_err("%s: mn_writer_annot: annotation is NULL", w->path);
  if (annot_problem(a, why, sizeof why))
    return set_err("%s: mn_writer_annot: annotation of 0x%" PRIx64 ": %s", w->path, a->addr, why);
  uint8_t m[ANNOT_SIZE];
  st64(m, a->addr);
  st64(m + 8, a->size);
  st32(m + 16, a->elem);
  st32(m + 20, a->mode);
  st32(m + 24, a->norm);
  st32(m + 28, 0);
  memcpy(m + 32, &a->tol, 8);
  memcpy(m + 40, a->tag, 32);
  if (rec_begin(w, TAG_ANNOT, sizeof m) || rec_put(w, m, sizeof m)) return -1;
  return rec_end(w);
}

/* ------------------------------------------------------------------ arrays and texture objects */

uint32_t mn_format_bytes(uint32_t format) {
  switch (format) {
    case 0x01: case 0x08: return 1;            /* UNSIGNED_INT8, SIGNED_INT8 */
    case 0x02: case 0x09: case 0x10: return 2; /* UNSIGNED_INT16, SIGNED_INT16, HALF */
    case 0x03: case 0x0a: case 0x20: return 4; /* UNSIGNED_INT32, SIGNED_INT32, FLOAT */
    default: return 0;
  }
}

void mn_array_level_dims(const mn_array *a, uint32_t level, uint64_t dims[3]) {
  uint64_t w = a->width, h = a->height, d = a->depth;
  int keep_depth = (a->flags & 0x05u) != 0; /* LAYERED or CUBEMAP: depth counts layers or faces */
  for (uint32_t l = 0; l < level && l < 64; l++) {
    w = w > 1 ? w / 2 : w;
    h = h > 1 ? h / 2 : h;
    if (!keep_depth) d = d > 1 ? d / 2 : d;
  }
  dims[0] = w ? w : 1, dims[1] = h ? h : 1, dims[2] = d ? d : 1;
}

uint64_t mn_array_bytes(const mn_array *a) {
  uint64_t elem = (uint64_t)mn_format_bytes(a->format) * a->channels, total = 0;
  if (!elem || !a->width || a->levels > 64 || (a->channels != 1 && a->channels != 2 && a->channels != 4)) return 0;
  for (uint32_t l = 0; l < (a->levels ? a->levels : 1); l++) {
    uint64_t d[3];
    mn_array_level_dims(a, l, d);
    if (d[0] > (1ull << 20) || d[1] > (1ull << 20) || d[2] > (1ull << 20)) return 0; /* no real array is this big */
    total += d[0] * d[1] * d[2] * elem;
  }
  return total;
}

static int array_problem(const mn_array *a, char *why, size_t n) {
  uint64_t want = mn_array_bytes(a);
  if (!want)
    return snprintf(why, n, "format 0x%x with %u channels, %" PRIu64 "x%" PRIu64 "x%" PRIu64 " and %u levels is "
                    "not an array mneme stores", a->format, a->channels, a->width, a->height, a->depth, a->levels), 1;
  if (want != a->size) return snprintf(why, n, "holds %" PRIu64 " bytes, its dimensions need %" PRIu64, a->size, want), 1;
  return 0;
}

int mn_writer_array(mn_writer *w, const mn_array *a) {
  char why[192];
  if (w_ok(w, "mn_writer_array")) return -1;
  if (!a || (a->size && !a->data)) return set_err("%s: mn_writer_array: array or its data is NULL", w->path);
  if (array_problem(a, why, sizeof why))
    return set_err("%s: mn_writer_array: array 0x%" PRIx64 ": %s", w->path, a->handle, why);
  uint8_t m[ARRAY_META];
  st64(m, a->handle);
  st64(m + 8, a->width);
  st64(m + 16, a->height);
  st64(m + 24, a->depth);
  st32(m + 32, a->format);
  st32(m + 36, a->channels);
  st32(m + 40, a->flags);
  st32(m + 44, a->levels);
  st64(m + 48, a->size);
  if (rec_begin(w, TAG_ARRAY, ARRAY_META + a->size) || rec_put(w, m, sizeof m) || rec_put(w, a->data, a->size))
    return -1;
  return rec_end(w);
}

static int texobj_problem(const mn_texobj *t, char *why, size_t n) {
  if (t->kind > MN_TEX_SURFACE) return snprintf(why, n, "unknown kind %u", t->kind), 1;
  if (t->res_type > MN_RES_PITCH2D) return snprintf(why, n, "unknown resource type %u", t->res_type), 1;
  if (t->res_type <= MN_RES_MIPMAPPED && !t->array) return snprintf(why, n, "names no array"), 1;
  if (t->res_type >= MN_RES_LINEAR && !mn_format_bytes(t->format))
    return snprintf(why, n, "unknown element format 0x%x", t->format), 1;
  return 0;
}

int mn_writer_texobj(mn_writer *w, const mn_texobj *t) {
  char why[96];
  if (w_ok(w, "mn_writer_texobj")) return -1;
  if (!t) return set_err("%s: mn_writer_texobj: object is NULL", w->path);
  if (w->kind != MN_PROLOGUE) return set_err("%s: mn_writer_texobj: only a prologue holds texture objects", w->path);
  if (texobj_problem(t, why, sizeof why))
    return set_err("%s: mn_writer_texobj: object 0x%" PRIx64 ": %s", w->path, t->handle, why);
  if (rec_begin(w, TAG_TEXOBJ, TEXOBJ_SIZE) || rec_put(w, t, TEXOBJ_SIZE)) return -1;
  return rec_end(w);
}

static void w_free(mn_writer *w) {
  if (w->fd >= 0) close(w->fd);
  free(w->path);
  free(w->buf);
  free(w);
}

int mn_writer_close(mn_writer *w) {
  if (!w) return set_err("mn_writer_close: writer is NULL");
  int rc = w_ok(w, "mn_writer_close");
  if (!rc) {
    uint8_t e[END_SIZE];
    st64(e, w->nrecords);
    st64(e + 8, w->header_sum);
    rc = rec_begin(w, TAG_END, sizeof e) || rec_put(w, e, sizeof e) || rec_end(w) || w_flush(w) ? -1 : 0;
  }
  uint64_t t0 = mono_ns();
  if (!rc && __atomic_load_n(&g_fsync, __ATOMIC_RELAXED) && fsync(w->fd) != 0)
    rc = w_fail(w, "%s: fsync of the snapshot failed: %s", w->path, strerror(errno));
  if (!rc && close(w->fd) != 0)
    rc = w_fail(w, "%s: closing the snapshot failed: %s", w->path, strerror(errno));
  else if (!rc)
    w->fd = -1;
  g_io_ns += mono_ns() - t0;
  if (rc) {
    w_free(w); /* g_err still holds the cause */
    return -1;
  }
  w_free(w);
  return 0;
}

void mn_writer_abort(mn_writer *w) {
  if (!w) return;
  if (!w->failed) w_flush(w);
  w_free(w);
}

uint64_t mn_writer_bytes(const mn_writer *w) { return w ? w->written : 0; }

/* ------------------------------------------------------------------ reader */

typedef struct snap_impl {
  mn_snapshot pub; /* first: mn_snapshot * and snap_impl * convert */
  uint8_t *map;
  uint64_t maplen;
} snap_impl;

/* Everything the snapshot points at either lies in the file mapping or was malloc'd by it. */
static int in_map(const snap_impl *s, const void *p) {
  const uint8_t *q = (const uint8_t *)p;
  return s->map && q >= s->map && q <= s->map + s->maplen;
}

static void s_free(const snap_impl *s, void *p) {
  if (p && !in_map(s, p)) free(p);
}

static void free_var(const snap_impl *s, mn_var *v) {
  for (uint32_t j = 0; j < v->nrelocs; j++) s_free(s, v->relocs[j].target);
  s_free(s, v->relocs);
  s_free(s, v->name);
  s_free(s, v->data);
}

void mn_snapshot_free(mn_snapshot *snap) {
  if (!snap) return;
  snap_impl *s = (snap_impl *)snap;
  for (uint32_t i = 0; snap->blobs && i < snap->nblobs; i++) {
    s_free(s, snap->blobs[i].data);
    s_free(s, snap->blobs[i].ranges);
  }
  for (uint32_t i = 0; snap->vars && i < snap->nvars; i++) free_var(s, &snap->vars[i]);
  s_free(s, snap->args.offsets);
  s_free(s, snap->args.sizes);
  s_free(s, snap->args.bytes);
  free(snap->blobs);
  free(snap->vars);
  free(snap->annots);
  free(snap->arrays);
  free(snap->texobjs);
  free(snap->path);
  if (s->map) munmap(s->map, s->maplen);
  free(s);
}

/* A cursor over one record's payload; errors name the file and the record's offset. */
typedef struct cur {
  const snap_impl *s;
  const uint8_t *base, *p;
  uint64_t left;
  uint64_t rec;
  const char *what;
} cur;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int rec_err(const cur *c, const char *fmt, ...) {
  char msg[640];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return set_err("%s: byte %" PRIu64 ": %s record: %s; the file is corrupt, record the kernel again",
                 c->s->pub.path, c->rec, c->what, msg);
}

static const uint8_t *take(cur *c, uint64_t n) {
  if (n > c->left) {
    rec_err(c, "needs %" PRIu64 " more bytes than its payload holds (%" PRIu64 " left)", n, c->left);
    return NULL;
  }
  const uint8_t *p = c->p;
  c->p += n, c->left -= n;
  return p;
}

static int take_pad(cur *c) { return take(c, pad8((uint64_t)(c->p - c->base))) ? 0 : -1; }

/* A NUL-terminated string of exactly len bytes (len counts the NUL). */
static char *take_str(cur *c, uint32_t len, const char *what) {
  const uint8_t *p = take(c, len);
  if (!p) return NULL;
  if (!len || memchr(p, 0, len) != p + len - 1) {
    rec_err(c, "%s is not a NUL-terminated string of %u bytes", what, len);
    return NULL;
  }
  return (char *)p;
}

static int parse_blob(cur *c, mn_blob *b) {
  const uint8_t *m = take(c, BLOB_META);
  if (!m) return -1;
  b->addr = ld64(m), b->size = ld64(m + 8), b->space = ld32(m + 16), b->encoding = ld32(m + 20);
  b->checksum = ld64(m + 24), b->nranges = ld32(m + 32);
  if (b->space > MN_SPACE_MANAGED) return rec_err(c, "blob 0x%" PRIx64 " has unknown space %u", b->addr, b->space);
  if (b->encoding == MN_ENC_BYTES) {
    if (b->nranges) return rec_err(c, "blob 0x%" PRIx64 " stored in full declares %u ranges", b->addr, b->nranges);
    if (c->left != b->size)
      return rec_err(c, "blob 0x%" PRIx64 " declares %" PRIu64 " bytes but holds %" PRIu64, b->addr, b->size,
                     c->left);
    b->data = b->size ? (uint8_t *)take(c, b->size) : NULL;
    return 0;
  }
  if (b->encoding != MN_ENC_DIFF)
    return rec_err(c, "blob 0x%" PRIx64 " has unknown encoding %u", b->addr, b->encoding);
  if (c->s->pub.kind != MN_EPILOGUE) return rec_err(c, "a prologue cannot hold a diff (blob 0x%" PRIx64 ")", b->addr);
  if (b->nranges > c->left / 16)
    return rec_err(c, "blob 0x%" PRIx64 " declares %u ranges, more than its payload can hold", b->addr, b->nranges);
  b->ranges = (mn_range *)take(c, (uint64_t)b->nranges * 16);
  uint64_t end = 0, bytes = 0;
  for (uint32_t i = 0; i < b->nranges; i++) {
    const mn_range *r = &b->ranges[i];
    if (!r->length || r->offset < end || r->offset > b->size || r->length > b->size - r->offset)
      return rec_err(c, "blob 0x%" PRIx64 " (%" PRIu64 " bytes): range %u (offset %" PRIu64 ", %" PRIu64
                        " bytes) is empty, out of order or outside the blob",
                     b->addr, b->size, i, r->offset, r->length);
    end = r->offset + r->length;
    bytes += r->length;
  }
  if (bytes != c->left)
    return rec_err(c, "blob 0x%" PRIx64 ": ranges cover %" PRIu64 " bytes but %" PRIu64 " follow them", b->addr,
                   bytes, c->left);
  if (!b->nranges) b->ranges = NULL;
  b->data = bytes ? (uint8_t *)take(c, bytes) : NULL;
  return 0;
}

static int parse_var(cur *c, mn_var *v) {
  const uint8_t *m = take(c, VAR_META);
  if (!m) return -1;
  uint32_t n = ld32(m + 20), name_len = ld32(m + 24); /* v->nrelocs is set once the array exists */
  v->addr = ld64(m), v->size = ld64(m + 8), v->is_const = ld32(m + 16);
  if (v->is_const > 1) return rec_err(c, "is_const is %u (0 or 1)", v->is_const);
  if (n > c->left / RELOC_SIZE) return rec_err(c, "declares %u relocations, more than fit", n);
  const uint8_t *rt = take(c, (uint64_t)n * RELOC_SIZE);
  if (!(v->name = take_str(c, name_len, "the variable name"))) return -1;
  if (n) {
    mn_reloc *r = (mn_reloc *)calloc(n, sizeof *r);
    if (!r) return set_err("%s: out of memory reading variable %s", c->s->pub.path, v->name);
    v->relocs = r, v->nrelocs = n;
    for (uint32_t j = 0; j < n; j++, rt += RELOC_SIZE) {
      uint32_t tlen = ld32(rt + 16);
      r[j].offset = ld64(rt), r[j].target_offset = ld64(rt + 8);
      if (v->size < 8 || r[j].offset > v->size - 8)
        return rec_err(c, "variable %s (%" PRIu64 " bytes): relocation at offset %" PRIu64 " lies outside it",
                       v->name, v->size, r[j].offset);
      if (tlen && !(r[j].target = take_str(c, tlen, "a relocation target"))) return -1;
    }
  }
  if (take_pad(c)) return -1;
  if (c->left != v->size)
    return rec_err(c, "variable %s declares %" PRIu64 " bytes but holds %" PRIu64, v->name, v->size, c->left);
  v->data = v->size ? (uint8_t *)take(c, v->size) : NULL;
  return 0;
}

static int parse_args(cur *c, mn_args *a) {
  const uint8_t *m = take(c, ARGS_META);
  if (!m) return -1;
  uint32_t count = ld32(m);
  a->total = ld64(m + 8);
  if (count > c->left / 8) return rec_err(c, "declares %u parameters, more than fit", count);
  uint32_t *off = (uint32_t *)take(c, (uint64_t)count * 4), *sz = (uint32_t *)take(c, (uint64_t)count * 4);
  if (take_pad(c)) return -1;
  if (c->left != a->total) return rec_err(c, "declares %" PRIu64 " bytes but holds %" PRIu64, a->total, c->left);
  for (uint32_t i = 0; i < count; i++)
    if ((uint64_t)off[i] + sz[i] > a->total)
      return rec_err(c, "parameter %u (offset %u, %u bytes) lies outside the %" PRIu64 " argument bytes", i, off[i],
                     sz[i], a->total);
  a->count = count;
  a->offsets = count ? off : NULL;
  a->sizes = count ? sz : NULL;
  a->bytes = a->total ? (uint8_t *)take(c, a->total) : NULL;
  return 0;
}

static int parse_annot(cur *c, mn_annot *a) {
  char why[96];
  if (c->left != ANNOT_SIZE) return rec_err(c, "is %" PRIu64 " bytes, not %u", c->left, ANNOT_SIZE);
  const uint8_t *m = take(c, ANNOT_SIZE);
  a->addr = ld64(m), a->size = ld64(m + 8), a->elem = ld32(m + 16), a->mode = ld32(m + 20);
  a->norm = ld32(m + 24), a->reserved = 0;
  memcpy(&a->tol, m + 32, 8);
  memcpy(a->tag, m + 40, 32);
  if (annot_problem(a, why, sizeof why)) return rec_err(c, "annotation of 0x%" PRIx64 ": %s", a->addr, why);
  return 0;
}

static int parse_array(cur *c, mn_array *a) {
  char why[192];
  const uint8_t *m = take(c, ARRAY_META);
  if (!m) return -1;
  a->handle = ld64(m), a->width = ld64(m + 8), a->height = ld64(m + 16), a->depth = ld64(m + 24);
  a->format = ld32(m + 32), a->channels = ld32(m + 36), a->flags = ld32(m + 40), a->levels = ld32(m + 44);
  a->size = ld64(m + 48);
  if (c->left != a->size) return rec_err(c, "array 0x%" PRIx64 " declares %" PRIu64 " bytes but holds %" PRIu64,
                                         a->handle, a->size, c->left);
  if (array_problem(a, why, sizeof why)) return rec_err(c, "array 0x%" PRIx64 ": %s", a->handle, why);
  a->data = a->size ? (uint8_t *)take(c, a->size) : NULL;
  return 0;
}

static int parse_texobj(cur *c, mn_texobj *t) {
  char why[96];
  if (c->left != TEXOBJ_SIZE) return rec_err(c, "is %" PRIu64 " bytes, not %u", c->left, TEXOBJ_SIZE);
  memcpy(t, take(c, TEXOBJ_SIZE), TEXOBJ_SIZE);
  if (texobj_problem(t, why, sizeof why)) return rec_err(c, "object 0x%" PRIx64 ": %s", t->handle, why);
  return 0;
}

const mn_array *mn_snapshot_find_array(const mn_snapshot *s, uint64_t handle) {
  for (uint32_t i = 0; s && i < s->narrays; i++)
    if (s->arrays[i].handle == handle) return &s->arrays[i];
  return NULL;
}

static int cmp_blob_addr(const void *x, const void *y) {
  uint64_t a = ((const mn_blob *)x)->addr, b = ((const mn_blob *)y)->addr;
  return a < b ? -1 : a > b;
}

/* Pass 1: framing, checksums, END; counts per tag. Nothing is trusted before this succeeds. */
static int check_framing(snap_impl *s, uint64_t counts[6]) {
  const char *path = s->pub.path;
  const uint8_t *map = s->map;
  uint64_t size = s->maplen, off = HEADER_SIZE, nrec = 0;
  for (;;) {
    uint64_t left = size - off;
    if (left == 0)
      return set_err("%s: byte %" PRIu64 ": the file ends without an END record: the recording was interrupted "
                     "(crash, kill or full disk); record the kernel again",
                     path, off);
    if (left < REC_HEAD + 8)
      return set_err("%s: byte %" PRIu64 ": truncated record header (%" PRIu64 " bytes left): the recording was "
                     "interrupted; record the kernel again",
                     path, off, left);
    uint32_t tag = ld32(map + off);
    uint64_t len = ld64(map + off + 8);
    if (len > left - REC_HEAD - 8 || len + pad8(len) > left - REC_HEAD - 8)
      return set_err("%s: byte %" PRIu64 ": record declares %" PRIu64 " payload bytes but the file ends %" PRIu64
                     " bytes later: truncated or corrupt; record the kernel again",
                     path, off, len, left - REC_HEAD);
    uint64_t body = REC_HEAD + len + pad8(len);
    uint64_t want = ld64(map + off + body), got = mn_checksum(map + off, body, 0);
    if (want != got)
      return set_err("%s: byte %" PRIu64 ": checksum mismatch in a record of %" PRIu64 " bytes (stored %016" PRIx64
                     ", computed %016" PRIx64 "): the file is corrupt; record the kernel again",
                     path, off, body + 8, want, got);
    if (tag == TAG_END) {
      if (len != END_SIZE)
        return set_err("%s: byte %" PRIu64 ": END record of %" PRIu64 " bytes; the file is corrupt", path, off, len);
      if (ld64(map + off + REC_HEAD) != nrec)
        return set_err("%s: byte %" PRIu64 ": END record counts %" PRIu64 " records but the file holds %" PRIu64
                       "; the file is corrupt, record the kernel again",
                       path, off, ld64(map + off + REC_HEAD), nrec);
      if (ld64(map + off + REC_HEAD + 8) != mn_checksum(map, HEADER_SIZE, 0))
        return set_err("%s: byte 0: header checksum mismatch (checked against the END record at byte %" PRIu64
                       "): the header is corrupt; record the kernel again",
                       path, off);
      off += body + 8;
      if (off != size)
        return set_err("%s: byte %" PRIu64 ": %" PRIu64 " unexpected bytes after the END record; the file is "
                       "corrupt, record the kernel again",
                       path, off, size - off);
      return 0;
    }
    int k = tag == TAG_BLOB ? 0 : tag == TAG_VAR ? 1 : tag == TAG_ARGS ? 2 : tag == TAG_ANNOT ? 3
          : tag == TAG_ARRAY ? 4 : tag == TAG_TEXOBJ ? 5 : -1;
    if (k < 0)
      return set_err("%s: byte %" PRIu64 ": unknown record tag 0x%08x; the file is corrupt, record the kernel again",
                     path, off, tag);
    if (++counts[k] > UINT32_MAX)
      return set_err("%s: byte %" PRIu64 ": more than 2^32-1 records of one kind", path, off);
    nrec++;
    off += body + 8;
  }
}

static int parse(snap_impl *s) {
  mn_snapshot *p = &s->pub;
  const uint8_t *map = s->map;
  if (memcmp(map, MN_SNAPSHOT_MAGIC, 8) != 0)
    return set_err("%s: byte 0: not a mneme snapshot (magic %02x%02x%02x%02x%02x%02x%02x%02x, expected \"%s\")",
                   p->path, map[0], map[1], map[2], map[3], map[4], map[5], map[6], map[7], MN_SNAPSHOT_MAGIC);
  p->version = ld32(map + 8);
  if (p->version != MN_SNAPSHOT_VERSION)
    return set_err("%s: byte 8: snapshot format version %u, but this mneme reads version %d only; record the "
                   "kernel again with this mneme",
                   p->path, p->version, MN_SNAPSHOT_VERSION);
  p->kind = ld32(map + 12), p->flags = ld32(map + 16), p->reserved = ld32(map + 20), p->created_ns = ld64(map + 24);
  if (p->kind != MN_PROLOGUE && p->kind != MN_EPILOGUE)
    return set_err("%s: byte 12: unknown snapshot kind %u (1 = prologue, 2 = epilogue); the file is corrupt, "
                   "record the kernel again",
                   p->path, p->kind);
  uint64_t counts[6] = {0, 0, 0, 0, 0, 0};
  if (check_framing(s, counts)) return -1;
  if (counts[2] > 1) return set_err("%s: %" PRIu64 " argument records (at most one); the file is corrupt", p->path, counts[2]);
  p->blobs = counts[0] ? (mn_blob *)calloc(counts[0], sizeof(mn_blob)) : NULL;
  p->vars = counts[1] ? (mn_var *)calloc(counts[1], sizeof(mn_var)) : NULL;
  p->annots = counts[3] ? (mn_annot *)calloc(counts[3], sizeof(mn_annot)) : NULL;
  p->arrays = counts[4] ? (mn_array *)calloc(counts[4], sizeof(mn_array)) : NULL;
  p->texobjs = counts[5] ? (mn_texobj *)calloc(counts[5], sizeof(mn_texobj)) : NULL;
  if ((counts[0] && !p->blobs) || (counts[1] && !p->vars) || (counts[3] && !p->annots) ||
      (counts[4] && !p->arrays) || (counts[5] && !p->texobjs))
    return set_err("%s: out of memory reading the snapshot", p->path);
  for (uint64_t off = HEADER_SIZE;;) {
    uint32_t tag = ld32(map + off);
    uint64_t len = ld64(map + off + 8);
    cur c;
    c.s = s, c.base = c.p = map + off + REC_HEAD, c.left = len, c.rec = off;
    int rc = 0;
    if (tag == TAG_END) break;
    if (tag == TAG_BLOB) {
      c.what = "blob";
      rc = parse_blob(&c, &p->blobs[p->nblobs++]);
    } else if (tag == TAG_VAR) {
      c.what = "variable";
      rc = parse_var(&c, &p->vars[p->nvars++]);
    } else if (tag == TAG_ARGS) {
      c.what = "arguments";
      rc = parse_args(&c, &p->args);
      p->has_args = 1;
    } else if (tag == TAG_ARRAY) {
      c.what = "array";
      rc = parse_array(&c, &p->arrays[p->narrays++]);
    } else if (tag == TAG_TEXOBJ) {
      c.what = "texture object";
      rc = parse_texobj(&c, &p->texobjs[p->ntexobjs++]);
    } else {
      c.what = "annotation";
      rc = parse_annot(&c, &p->annots[p->nannots++]);
    }
    if (rc) return -1;
    off += REC_HEAD + len + pad8(len) + 8;
  }
  if (p->nblobs) qsort(p->blobs, p->nblobs, sizeof *p->blobs, cmp_blob_addr);
  for (uint32_t i = 1; i < p->nblobs; i++)
    if (p->blobs[i].addr == p->blobs[i - 1].addr)
      return set_err("%s: two blobs at address 0x%" PRIx64 "; the file is corrupt, record the kernel again", p->path,
                     p->blobs[i].addr);
  return 0;
}

mn_snapshot *mn_snapshot_read(const char *path) {
  if (!path) {
    set_err("mn_snapshot_read: path is NULL");
    return NULL;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    set_err("%s: cannot open the snapshot: %s", path, strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    set_err("%s: not a regular file", path);
    close(fd);
    return NULL;
  }
  uint64_t size = (uint64_t)st.st_size;
  if (size < HEADER_SIZE) {
    set_err("%s: byte %" PRIu64 ": the file is %" PRIu64 " bytes, shorter than the %u-byte header: truncated "
            "(the recording did not finish); record the kernel again",
            path, size, size, HEADER_SIZE);
    close(fd);
    return NULL;
  }
  void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  close(fd);
  if (map == MAP_FAILED) {
    set_err("%s: cannot map the snapshot (%" PRIu64 " bytes): %s", path, size, strerror(map_errno));
    return NULL;
  }
  snap_impl *s = (snap_impl *)calloc(1, sizeof *s);
  if (s) s->pub.path = dup_str(path);
  if (!s || !s->pub.path) {
    set_err("%s: out of memory reading the snapshot", path);
    munmap(map, size);
    free(s);
    return NULL;
  }
  s->map = (uint8_t *)map, s->maplen = size;
  if (parse(s)) {
    mn_snapshot_free(&s->pub);
    return NULL;
  }
  return &s->pub;
}

static int64_t blob_index(const mn_snapshot *s, uint64_t addr, int exact) {
  uint64_t lo = 0, hi = s->nblobs; /* first blob with addr > x is at lo */
  while (lo < hi) {
    uint64_t mid = (lo + hi) / 2;
    if (s->blobs[mid].addr <= addr) lo = mid + 1;
    else hi = mid;
  }
  if (!lo) return -1;
  const mn_blob *b = &s->blobs[lo - 1];
  if (b->addr == addr) return (int64_t)lo - 1;
  return !exact && addr - b->addr < b->size ? (int64_t)lo - 1 : -1;
}

const mn_blob *mn_snapshot_find_blob(const mn_snapshot *s, uint64_t addr) {
  int64_t i = s ? blob_index(s, addr, 0) : -1;
  return i < 0 ? NULL : &s->blobs[i];
}

const mn_var *mn_snapshot_find_var(const mn_snapshot *s, const char *name) {
  for (uint32_t i = 0; s && name && i < s->nvars; i++)
    if (!strcmp(s->vars[i].name, name)) return &s->vars[i];
  return NULL;
}

/* ------------------------------------------------------------------ apply */

static int copy_var(const mn_var *src, mn_var *dst) {
  memset(dst, 0, sizeof *dst);
  *dst = *src;
  dst->name = dup_str(src->name);
  dst->data = (uint8_t *)dup_mem(src->data, src->size);
  dst->relocs = src->nrelocs ? (mn_reloc *)calloc(src->nrelocs, sizeof(mn_reloc)) : NULL;
  int ok = dst->name && dst->data && (!src->nrelocs || dst->relocs);
  dst->nrelocs = dst->relocs ? src->nrelocs : 0;
  for (uint32_t j = 0; ok && j < dst->nrelocs; j++) {
    dst->relocs[j] = src->relocs[j];
    dst->relocs[j].target = NULL;
    if (src->relocs[j].target) ok = (dst->relocs[j].target = dup_str(src->relocs[j].target)) != NULL;
  }
  return ok ? 0 : -1;
}

static int copy_args(const mn_args *src, mn_args *dst) {
  memset(dst, 0, sizeof *dst);
  dst->offsets = (uint32_t *)dup_mem(src->offsets, (uint64_t)src->count * 4);
  dst->sizes = (uint32_t *)dup_mem(src->sizes, (uint64_t)src->count * 4);
  dst->bytes = (uint8_t *)dup_mem(src->bytes, src->total);
  dst->count = src->count, dst->total = src->total;
  return dst->offsets && dst->sizes && dst->bytes ? 0 : -1;
}

/* Staged results of an apply, committed only when everything succeeded. */
typedef struct staged {
  uint8_t **rebuilt;     /* per epilogue blob: full contents of DIFF blobs */
  mn_blob *extra_blobs;  /* prologue-only blobs (owned copies) */
  uint32_t nextra_blobs;
  mn_var *extra_vars;
  uint32_t nextra_vars;
  mn_args args;
  int has_args;
  mn_annot *annots;
} staged;

static void staged_free(staged *st, uint32_t nblobs) {
  for (uint32_t i = 0; st->rebuilt && i < nblobs; i++) free(st->rebuilt[i]);
  for (uint32_t i = 0; i < st->nextra_blobs; i++) free(st->extra_blobs[i].data);
  for (uint32_t i = 0; i < st->nextra_vars; i++) {
    mn_var *v = &st->extra_vars[i];
    for (uint32_t j = 0; j < v->nrelocs; j++) free(v->relocs[j].target);
    free(v->relocs), free(v->name), free(v->data);
  }
  free(st->rebuilt), free(st->extra_blobs), free(st->extra_vars), free(st->annots);
  free(st->args.offsets), free(st->args.sizes), free(st->args.bytes);
}

static int stage(const mn_snapshot *pro, const mn_snapshot *epi, staged *st) {
  const char *pp = pro->path ? pro->path : "(prologue)", *ep = epi->path ? epi->path : "(epilogue)";
  st->rebuilt = (uint8_t **)calloc(epi->nblobs ? epi->nblobs : 1, sizeof(uint8_t *));
  if (!st->rebuilt) return set_err("%s: out of memory applying the epilogue", ep);
  for (uint32_t i = 0; i < epi->nblobs; i++) {
    const mn_blob *b = &epi->blobs[i];
    if (b->encoding != MN_ENC_DIFF) continue;
    int64_t k = blob_index(pro, b->addr, 1);
    if (k < 0)
      return set_err("%s: blob 0x%" PRIx64 " is stored as a diff but the prologue %s has no blob there: the two "
                     "files are not from the same launch",
                     ep, b->addr, pp);
    const mn_blob *base = &pro->blobs[k];
    if (base->size != b->size || base->encoding != MN_ENC_BYTES)
      return set_err("%s: blob 0x%" PRIx64 " is %" PRIu64 " bytes but the prologue %s holds %" PRIu64 " there: the "
                     "two files are not from the same launch",
                     ep, b->addr, b->size, pp, base->size);
    uint8_t *full = (uint8_t *)dup_mem(base->data, b->size);
    if (!full) return set_err("%s: out of memory rebuilding blob 0x%" PRIx64 " (%" PRIu64 " bytes)", ep, b->addr, b->size);
    st->rebuilt[i] = full;
    const uint8_t *src = b->data;
    for (uint32_t r = 0; r < b->nranges; r++) {
      memcpy(full + b->ranges[r].offset, src, b->ranges[r].length);
      src += b->ranges[r].length;
    }
    if (mn_checksum(full, b->size, 0) != b->checksum)
      return set_err("%s: blob 0x%" PRIx64 " does not match its checksum after applying the diff to the prologue "
                     "%s: the two files are not from the same launch",
                     ep, b->addr, pp);
  }
  uint32_t nb = 0, nv = 0;
  for (uint32_t i = 0; i < pro->nblobs; i++) nb += blob_index(epi, pro->blobs[i].addr, 1) < 0;
  for (uint32_t i = 0; i < pro->nvars; i++) nv += !mn_snapshot_find_var(epi, pro->vars[i].name);
  if (nb && !(st->extra_blobs = (mn_blob *)calloc(nb, sizeof(mn_blob))))
    return set_err("%s: out of memory applying the epilogue", ep);
  for (uint32_t i = 0; i < pro->nblobs; i++) {
    const mn_blob *b = &pro->blobs[i];
    if (blob_index(epi, b->addr, 1) >= 0) continue;
    mn_blob *d = &st->extra_blobs[st->nextra_blobs];
    *d = *b;
    d->data = (uint8_t *)dup_mem(b->data, b->size);
    if (!d->data) return set_err("%s: out of memory copying blob 0x%" PRIx64 " (%" PRIu64 " bytes)", ep, b->addr, b->size);
    st->nextra_blobs++;
  }
  if (nv && !(st->extra_vars = (mn_var *)calloc(nv, sizeof(mn_var))))
    return set_err("%s: out of memory applying the epilogue", ep);
  for (uint32_t i = 0; i < pro->nvars; i++) {
    if (mn_snapshot_find_var(epi, pro->vars[i].name)) continue;
    int rc = copy_var(&pro->vars[i], &st->extra_vars[st->nextra_vars]);
    st->nextra_vars++;
    if (rc) return set_err("%s: out of memory copying variable %s", ep, pro->vars[i].name);
  }
  if (!epi->has_args && pro->has_args) {
    st->has_args = 1;
    if (copy_args(&pro->args, &st->args)) return set_err("%s: out of memory copying the arguments", ep);
  }
  if (!epi->nannots && pro->nannots) {
    st->annots = (mn_annot *)dup_mem(pro->annots, (uint64_t)pro->nannots * sizeof(mn_annot));
    if (!st->annots) return set_err("%s: out of memory copying the annotations", ep);
  }
  return 0;
}

int mn_snapshot_apply(const mn_snapshot *pro, mn_snapshot *epi) {
  if (!pro || !epi) return set_err("mn_snapshot_apply: NULL snapshot");
  if (pro->kind != MN_PROLOGUE) return set_err("%s: mn_snapshot_apply: not a prologue", pro->path);
  if (epi->kind != MN_EPILOGUE) return set_err("%s: mn_snapshot_apply: not an epilogue", epi->path);
  snap_impl *s = (snap_impl *)epi;
  staged st;
  memset(&st, 0, sizeof st);
  if (stage(pro, epi, &st)) {
    staged_free(&st, epi->nblobs);
    return -1;
  }
  mn_blob *blobs = epi->blobs;
  mn_var *vars = epi->vars;
  if (st.nextra_blobs) {
    blobs = (mn_blob *)malloc(((uint64_t)epi->nblobs + st.nextra_blobs) * sizeof(mn_blob));
    if (!blobs) {
      staged_free(&st, epi->nblobs);
      return set_err("%s: out of memory applying the epilogue", epi->path);
    }
  }
  if (st.nextra_vars) {
    vars = (mn_var *)malloc(((uint64_t)epi->nvars + st.nextra_vars) * sizeof(mn_var));
    if (!vars) {
      if (blobs != epi->blobs) free(blobs);
      staged_free(&st, epi->nblobs);
      return set_err("%s: out of memory applying the epilogue", epi->path);
    }
  }
  /* commit: nothing below fails */
  for (uint32_t i = 0; i < epi->nblobs; i++) {
    mn_blob *b = &epi->blobs[i];
    if (!st.rebuilt[i]) continue;
    s_free(s, b->data);
    s_free(s, b->ranges);
    b->data = st.rebuilt[i], b->ranges = NULL, b->nranges = 0, b->encoding = MN_ENC_BYTES;
  }
  if (st.nextra_blobs) {
    if (epi->nblobs) memcpy(blobs, epi->blobs, epi->nblobs * sizeof(mn_blob));
    memcpy(blobs + epi->nblobs, st.extra_blobs, st.nextra_blobs * sizeof(mn_blob));
    free(epi->blobs);
    epi->blobs = blobs, epi->nblobs += st.nextra_blobs;
    qsort(epi->blobs, epi->nblobs, sizeof(mn_blob), cmp_blob_addr);
  }
  if (st.nextra_vars) {
    if (epi->nvars) memcpy(vars, epi->vars, epi->nvars * sizeof(mn_var));
    memcpy(vars + epi->nvars, st.extra_vars, st.nextra_vars * sizeof(mn_var));
    free(epi->vars);
    epi->vars = vars, epi->nvars += st.nextra_vars;
  }
  if (st.has_args) epi->args = st.args, epi->has_args = 1;
  if (st.annots) epi->annots = st.annots, epi->nannots = pro->nannots;
  free(st.rebuilt), free(st.extra_blobs), free(st.extra_vars);
  return 0;
}

/* ------------------------------------------------------------------ compare */

uint32_t mn_elem_size(uint32_t elem) {
  switch (elem) {
    case MN_ELEM_BYTES: case MN_ELEM_I8: case MN_ELEM_U8: return 1;
    case MN_ELEM_F16: case MN_ELEM_BF16: case MN_ELEM_I16: case MN_ELEM_U16: return 2;
    case MN_ELEM_F32: case MN_ELEM_I32: case MN_ELEM_U32: return 4;
    case MN_ELEM_F64: case MN_ELEM_I64: case MN_ELEM_U64: return 8;
    default: return 0;
  }
}

static double half_value(uint16_t h) {
  int e = (h >> 10) & 0x1f;
  uint32_t m = h & 0x3ff;
  double v = e == 0 ? ldexp((double)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp((double)(m | 0x400), e - 25);
  return h & 0x8000 ? -v : v;
}

static double elem_value(uint32_t elem, const uint8_t *p) {
  switch (elem) {
    case MN_ELEM_F32: { float f; memcpy(&f, p, 4); return f; }
    case MN_ELEM_F64: { double d; memcpy(&d, p, 8); return d; }
    case MN_ELEM_F16: return half_value(ld16(p));
    case MN_ELEM_BF16: { float f; uint32_t u = (uint32_t)ld16(p) << 16; memcpy(&f, &u, 4); return f; }
    case MN_ELEM_I8: return (int8_t)*p;
    case MN_ELEM_I16: return (int16_t)ld16(p);
    case MN_ELEM_I32: return (int32_t)ld32(p);
    case MN_ELEM_I64: return (double)(int64_t)ld64(p);
    case MN_ELEM_U8: return *p;
    case MN_ELEM_U16: return ld16(p);
    case MN_ELEM_U32: return ld32(p);
    default: return (double)ld64(p);
  }
}

static int elem_is_float(uint32_t elem) { return elem >= MN_ELEM_F32 && elem <= MN_ELEM_BF16; }

/* |a - e| without rounding trouble: integers as exact unsigned distances. */
static double int_distance(uint32_t elem, const uint8_t *e, const uint8_t *a) {
  if (elem == MN_ELEM_I64) {
    int64_t x = (int64_t)ld64(e), y = (int64_t)ld64(a);
    return x < y ? (double)((uint64_t)y - (uint64_t)x) : (double)((uint64_t)x - (uint64_t)y);
  }
  if (elem == MN_ELEM_U64) {
    uint64_t x = ld64(e), y = ld64(a);
    return x < y ? (double)(y - x) : (double)(x - y);
  }
  return fabs(elem_value(elem, a) - elem_value(elem, e));
}

typedef struct cmpstate {
  uint32_t elem, norm;
  uint32_t es;
  int exact;
  double atol, rtol;
  double err_acc, ref_acc; /* L1 sums, L2 sums of squares, Linf maxima */
  int nonfinite;
  mn_cmp_report *r;
} cmpstate;

static inline void norm_add(uint32_t norm, double *acc, double v) {
  if (norm == MN_NORM_L1) *acc += v;
  else if (norm == MN_NORM_L2) *acc += v * v;
  else if (v > *acc) *acc = v;
}

static void count_mismatch(cmpstate *c, uint64_t off) {
  if (!c->r->mismatches) c->r->first_mismatch = off;
  c->r->mismatches++;
}

static void cmp_one(cmpstate *c, const uint8_t *e, const uint8_t *a, uint64_t off) {
  int same_bits = memcmp(e, a, c->es) == 0;
  double ev = elem_value(c->elem, e), d = 0;
  int bad = 0; /* NaN or infinity mismatch */
  if (!same_bits) {
    if (elem_is_float(c->elem)) {
      double av = elem_value(c->elem, a);
      if (isnan(ev) && isnan(av)) d = 0;
      else if (isnan(ev) || isnan(av)) d = INFINITY, bad = 1;
      else if (ev == av) d = 0;
      else if (isinf(ev) || isinf(av)) d = INFINITY, bad = 1;
      else d = fabs(av - ev);
    } else {
      d = int_distance(c->elem, e, a);
    }
  }
  if (c->norm != MN_NORM_ELEMENT && !c->exact) {
    if (isfinite(ev)) norm_add(c->norm, &c->ref_acc, fabs(ev));
    if (!bad) norm_add(c->norm, &c->err_acc, d);
    c->nonfinite |= bad;
  }
  if (d > 0) {
    double rel = ev != 0 ? d / fabs(ev) : INFINITY;
    if (d > c->r->max_abs_err) c->r->max_abs_err = d;
    if (rel > c->r->max_rel_err) c->r->max_rel_err = rel;
  }
  int mismatch;
  if (c->exact) mismatch = !same_bits;
  else if (c->norm != MN_NORM_ELEMENT) mismatch = d > 0;
  else mismatch = bad || !(d <= c->atol + (c->rtol > 0 ? c->rtol * fabs(ev) : 0));
  if (mismatch) count_mismatch(c, off);
}

static uint64_t nonzero_bytes(uint64_t x) {
  x |= x >> 4;
  x |= x >> 2;
  x |= x >> 1;
  return (uint64_t)__builtin_popcountll(x & ONES);
}

static void cmp_bytes(cmpstate *c, const uint8_t *e, const uint8_t *a, uint64_t n) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x = ld64(e + i) ^ ld64(a + i);
    if (!x) continue;
    if (!c->r->mismatches) c->r->first_mismatch = i + (uint64_t)__builtin_ctzll(x) / 8;
    c->r->mismatches += nonzero_bytes(x);
  }
  for (; i < n; i++)
    if (e[i] != a[i]) count_mismatch(c, i);
}

#define CMP_CHUNK 4096u

int mn_compare_ex(const void *expected, const void *actual, uint64_t n, uint32_t elem, uint32_t norm, double atol,
                  double rtol, mn_cmp_report *report) {
  if (!report) return set_err("mn_compare: report is NULL");
  memset(report, 0, sizeof *report);
  report->first_mismatch = n;
  if (n && (!expected || !actual)) return set_err("mn_compare: NULL buffer");
  if (elem > ELEM_MAX) return set_err("mn_compare: unknown element type %u", elem);
  if (norm > MN_NORM_LINF) return set_err("mn_compare: unknown norm %u", norm);
  const uint8_t *e = (const uint8_t *)expected, *a = (const uint8_t *)actual;
  cmpstate c;
  memset(&c, 0, sizeof c);
  c.elem = elem, c.norm = norm, c.es = mn_elem_size(elem), c.r = report;
  c.exact = elem == MN_ELEM_BYTES || !(atol >= 0) || !(rtol >= 0);
  c.atol = atol, c.rtol = rtol;
  if (elem == MN_ELEM_BYTES) {
    cmp_bytes(&c, e, a, n);
    return report->mismatches == 0;
  }
  uint64_t whole = n / c.es * c.es;
  int full_pass = norm != MN_NORM_ELEMENT && !c.exact; /* the reference norm needs every element */
  for (uint64_t i = 0; i < whole; i += CMP_CHUNK) {
    uint64_t len = whole - i < CMP_CHUNK ? whole - i : CMP_CHUNK;
    if (!full_pass && memcmp(e + i, a + i, len) == 0) continue;
    for (uint64_t j = i; j < i + len; j += c.es) cmp_one(&c, e + j, a + j, j);
  }
  int tail_differs = n > whole && memcmp(e + whole, a + whole, n - whole) != 0;
  if (tail_differs) count_mismatch(&c, whole);
  if (full_pass) {
    report->err_norm = norm == MN_NORM_L2 ? sqrt(c.err_acc) : c.err_acc;
    report->ref_norm = norm == MN_NORM_L2 ? sqrt(c.ref_acc) : c.ref_acc;
    if (c.nonfinite) report->err_norm = INFINITY;
    return !c.nonfinite && !tail_differs &&
           report->err_norm <= atol + (rtol > 0 ? rtol * report->ref_norm : 0);
  }
  return report->mismatches == 0;
}

int mn_compare(const void *expected, const void *actual, uint64_t n, uint32_t elem, uint32_t mode, uint32_t norm,
               double tol, mn_cmp_report *report) {
  if (mode > MN_TOL_REL) {
    if (report) memset(report, 0, sizeof *report);
    return set_err("mn_compare: unknown tolerance mode %u", mode);
  }
  if (!(tol >= 0)) return mn_compare_ex(expected, actual, n, elem, norm, -1, -1, report);
  return mode == MN_TOL_ABS ? mn_compare_ex(expected, actual, n, elem, norm, tol, 0, report)
                            : mn_compare_ex(expected, actual, n, elem, norm, 0, tol, report);
}
