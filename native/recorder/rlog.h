/* The recorder's raw log: one JSON object per line, appended with a single write(2) per event so that a
 * crash leaves every finished line behind. Lines are built in a caller-supplied buffer without malloc
 * or stdio, so the same code can run inside a fatal-signal handler.
 *
 * A write that fails (unwritable directory, disk full, file size limit) marks the log failed; the app
 * keeps running and mneme record marks the record incomplete. */
#ifndef MNEME_RECORDER_RLOG_H
#define MNEME_RECORDER_RLOG_H

#include <stddef.h>
#include <stdint.h>

typedef struct mn_line {
  char *buf;
  size_t len, cap;
  int truncated; /* the line did not fit: it is not written */
  int first;     /* no field written yet */
} mn_line;

void mn_line_begin(mn_line *l, char *buf, size_t cap, const char *event);
void mn_line_str(mn_line *l, const char *key, const char *value); /* JSON-escaped; NULL -> null */
void mn_line_i64(mn_line *l, const char *key, int64_t v);
void mn_line_u64(mn_line *l, const char *key, uint64_t v);
void mn_line_hexaddr(mn_line *l, const char *key, uint64_t v);   /* "0x..." string */
void mn_line_hex(mn_line *l, const char *key, const void *data, size_t n);
void mn_line_u64s(mn_line *l, const char *key, const uint64_t *v, size_t n);
void mn_line_u32s(mn_line *l, const char *key, const uint32_t *v, size_t n);
void mn_line_strs(mn_line *l, const char *key, const char *const *v, size_t n);
/* Pairs as [[a,b],...]. */
void mn_line_pairs(mn_line *l, const char *key, const uint64_t *a, const uint64_t *b, size_t n);
/* Raw JSON value (already valid JSON). */
void mn_line_raw(mn_line *l, const char *key, const char *json);
/* Closes the object and adds the newline; returns the line length, or 0 when it was truncated. */
size_t mn_line_end(mn_line *l);

/* Escapes `s` as a JSON string body into out (cap bytes); returns the length, or (size_t)-1 if it
 * does not fit. */
size_t mn_json_escape(char *out, size_t cap, const char *s);
/* Decimal text of v into out (at least 21 bytes); returns the length. Async-signal-safe. */
size_t mn_fmt_u64(char *out, uint64_t v);

typedef struct mn_log {
  int fd;
  int failed;       /* a write failed: the record is incomplete */
  int err;          /* errno of the first failure */
  uint64_t bytes;   /* bytes written */
} mn_log;

/* Opens (creating, appending) the log; 0, or -1 with log->failed set. */
int mn_log_open(mn_log *log, const char *path);
/* Writes one whole line; 0, or -1 (log->failed set). Never raises SIGPIPE/SIGXFSZ-dependent exits:
 * the caller ignores SIGXFSZ so that a size limit shows as EFBIG here. */
int mn_log_write(mn_log *log, const char *line, size_t n);
void mn_log_close(mn_log *log);

#endif
