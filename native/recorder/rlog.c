#include "rlog.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

static void put(mn_line *l, const char *s, size_t n) {
  if (l->truncated) return;
  if (l->len + n + 3 > l->cap) { /* keep room for "}\n" and the terminator */
    l->truncated = 1;
    return;
  }
  memcpy(l->buf + l->len, s, n);
  l->len += n;
  l->buf[l->len] = 0;
}

static void puts_(mn_line *l, const char *s) { put(l, s, strlen(s)); }

size_t mn_fmt_u64(char *out, uint64_t v) {
  char tmp[24];
  size_t n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  for (size_t i = 0; i < n; i++) out[i] = tmp[n - 1 - i];
  out[n] = 0;
  return n;
}

size_t mn_json_escape(char *out, size_t cap, const char *s) {
  static const char hex[] = "0123456789abcdef";
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    char esc[7];
    size_t k;
    unsigned char c = *p;
    if (c == '"' || c == '\\') { esc[0] = '\\'; esc[1] = (char)c; k = 2; }
    else if (c == '\n') { esc[0] = '\\'; esc[1] = 'n'; k = 2; }
    else if (c == '\t') { esc[0] = '\\'; esc[1] = 't'; k = 2; }
    else if (c == '\r') { esc[0] = '\\'; esc[1] = 'r'; k = 2; }
    else if (c < 0x20 || c >= 0x80) {
      /* Bytes >= 0x80 are escaped one by one, so any byte string survives as valid JSON text; the
       * reader maps \u00XX back to the byte (names are ASCII in practice). */
      esc[0] = '\\'; esc[1] = 'u'; esc[2] = '0'; esc[3] = '0';
      esc[4] = hex[c >> 4]; esc[5] = hex[c & 15]; k = 6;
    } else { esc[0] = (char)c; k = 1; }
    if (n + k >= cap) return (size_t)-1;
    memcpy(out + n, esc, k);
    n += k;
  }
  if (n >= cap) return (size_t)-1;
  out[n] = 0;
  return n;
}

static void key(mn_line *l, const char *k) {
  if (!l->first) put(l, ",", 1);
  l->first = 0;
  put(l, "\"", 1);
  puts_(l, k);
  put(l, "\":", 2);
}

void mn_line_begin(mn_line *l, char *buf, size_t cap, const char *event) {
  l->buf = buf;
  l->cap = cap;
  l->len = 0;
  l->truncated = cap < 8;
  l->first = 1;
  if (!l->truncated) buf[0] = 0;
  put(l, "{", 1);
  mn_line_str(l, "ev", event);
}

void mn_line_str(mn_line *l, const char *k, const char *value) {
  key(l, k);
  if (!value) { put(l, "null", 4); return; }
  if (l->truncated) return;
  put(l, "\"", 1);
  if (l->truncated) return;
  size_t room = l->cap - l->len;
  size_t n = room > 4 ? mn_json_escape(l->buf + l->len, room - 4, value) : (size_t)-1;
  if (n == (size_t)-1) { l->truncated = 1; return; }
  l->len += n;
  put(l, "\"", 1);
}

void mn_line_u64(mn_line *l, const char *k, uint64_t v) {
  char tmp[24];
  key(l, k);
  put(l, tmp, mn_fmt_u64(tmp, v));
}

void mn_line_i64(mn_line *l, const char *k, int64_t v) {
  char tmp[24];
  key(l, k);
  if (v < 0) {
    put(l, "-", 1);
    put(l, tmp, mn_fmt_u64(tmp, (uint64_t)(-(v + 1)) + 1));
  } else {
    put(l, tmp, mn_fmt_u64(tmp, (uint64_t)v));
  }
}

void mn_line_hexaddr(mn_line *l, const char *k, uint64_t v) {
  static const char hex[] = "0123456789abcdef";
  char tmp[24];
  size_t n = 0;
  int started = 0;
  tmp[n++] = '"'; tmp[n++] = '0'; tmp[n++] = 'x';
  for (int shift = 60; shift >= 0; shift -= 4) {
    unsigned d = (unsigned)(v >> shift) & 15;
    if (d || started || shift == 0) { tmp[n++] = hex[d]; started = 1; }
  }
  tmp[n++] = '"';
  key(l, k);
  put(l, tmp, n);
}

void mn_line_hex(mn_line *l, const char *k, const void *data, size_t n) {
  static const char hex[] = "0123456789abcdef";
  const unsigned char *p = data;
  key(l, k);
  put(l, "\"", 1);
  if (l->truncated) return;
  if (l->len + 2 * n + 4 > l->cap) { l->truncated = 1; return; }
  for (size_t i = 0; i < n; i++) {
    l->buf[l->len++] = hex[p[i] >> 4];
    l->buf[l->len++] = hex[p[i] & 15];
  }
  put(l, "\"", 1);
}

/* A JSON array of n unsigned integers of `width` bytes (4 or 8) each. */
static void uints(mn_line *l, const char *k, const void *v, size_t width, size_t n) {
  char tmp[24];
  key(l, k);
  put(l, "[", 1);
  for (size_t i = 0; i < n; i++) {
    uint64_t x = width == 8 ? ((const uint64_t *)v)[i] : ((const uint32_t *)v)[i];
    if (i) put(l, ",", 1);
    put(l, tmp, mn_fmt_u64(tmp, x));
  }
  put(l, "]", 1);
}

void mn_line_u64s(mn_line *l, const char *k, const uint64_t *v, size_t n) { uints(l, k, v, 8, n); }

void mn_line_u32s(mn_line *l, const char *k, const uint32_t *v, size_t n) { uints(l, k, v, 4, n); }

void mn_line_strs(mn_line *l, const char *k, const char *const *v, size_t n) {
  key(l, k);
  put(l, "[", 1);
  for (size_t i = 0; i < n; i++) {
    if (i) put(l, ",", 1);
    if (l->truncated) return;
    put(l, "\"", 1);
    if (l->truncated) return;
    size_t room = l->cap - l->len;
    size_t m = room > 5 ? mn_json_escape(l->buf + l->len, room - 5, v[i]) : (size_t)-1;
    if (m == (size_t)-1) { l->truncated = 1; return; }
    l->len += m;
    put(l, "\"", 1);
  }
  put(l, "]", 1);
}

void mn_line_pairs(mn_line *l, const char *k, const uint64_t *a, const uint64_t *b, size_t n) {
  char tmp[24];
  key(l, k);
  put(l, "[", 1);
  for (size_t i = 0; i < n; i++) {
    put(l, i ? ",[" : "[", i ? 2 : 1);
    put(l, tmp, mn_fmt_u64(tmp, a[i]));
    put(l, ",", 1);
    put(l, tmp, mn_fmt_u64(tmp, b[i]));
    put(l, "]", 1);
  }
  put(l, "]", 1);
}

void mn_line_raw(mn_line *l, const char *k, const char *json) {
  key(l, k);
  puts_(l, json);
}

size_t mn_line_end(mn_line *l) {
  if (l->truncated) return 0;
  /* put() always leaves room for these two bytes and the terminator. */
  l->buf[l->len++] = '}';
  l->buf[l->len++] = '\n';
  l->buf[l->len] = 0;
  return l->len;
}

int mn_log_open(mn_log *log, const char *path) {
  log->failed = 0;
  log->err = 0;
  log->bytes = 0;
  log->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log->fd < 0) {
    log->failed = 1;
    log->err = errno;
    return -1;
  }
  return 0;
}

int mn_log_write(mn_log *log, const char *line, size_t n) {
  if (log->fd < 0) {
    log->failed = 1;
    return -1;
  }
  size_t done = 0;
  while (done < n) {
    ssize_t w = write(log->fd, line + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (!log->failed) log->err = w < 0 ? errno : ENOSPC;
      log->failed = 1;
      return -1;
    }
    done += (size_t)w;
    log->bytes += (uint64_t)w;
  }
  return 0;
}

void mn_log_close(mn_log *log) {
  if (log->fd >= 0) close(log->fd);
  log->fd = -1;
}
