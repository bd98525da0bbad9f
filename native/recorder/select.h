/* What the recorder records: which MPI ranks, and what `mneme record` learnt from the app's embedded IR
 * (the kernel table: which kernels the --kernels regex selects, which argument bytes are pointers, and
 * which variables each kernel's IR closure uses). Pure code, unit-tested on the CPU. */
#ifndef MNEME_RECORDER_SELECT_H
#define MNEME_RECORDER_SELECT_H

#include <stddef.h>
#include <stdint.h>

/* Rank of this process from the launcher's variables, in this order: FLUX_TASK_RANK,
 * OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID, PMIX_RANK. -1 when none is set to a number. */
int mn_rank_from_env(void);
/* 1 when `rank` is selected by `spec` ("all", or a list of ranks and ranges such as "0,3,5-7"),
 * 0 when not, -1 when the spec is malformed. An empty or NULL spec selects rank 0 only. */
int mn_rank_selected(const char *spec, int rank);

/* A pointer range inside one parameter, from the IR's parameter types. */
typedef struct mn_ptr_range { uint32_t param, offset, length; } mn_ptr_range;

typedef struct mn_ktab_entry {
  char *name;             /* mangled kernel name */
  int selected;           /* the --kernels regex matched (Python's re.search on mangled or demangled) */
  uint32_t nparams;
  uint32_t nranges;
  mn_ptr_range *ranges;
  uint32_t nvars;
  char **vars;            /* variables the kernel's IR closure references */
  int no_rerun;           /* device state a timing rerun would change (device heap, printf): never rerun */
  int heap;               /* allocates from the device heap: once it ran, no kernel is rerun (its objects are unrecorded) */
} mn_ktab_entry;

typedef struct mn_ktab {
  size_t n;
  mn_ktab_entry *e;       /* sorted by name */
} mn_ktab;

/* Parses the kernel table file written by `mneme record` (format in mneme/record/kerneltable.py):
 *   one line per kernel, tab-separated: "K", name, selected (0/1), nparams,
 *   pointer ranges ("param:offset:length,..." or "-"), variables ("name,..." or "-"), and optionally
 *   the device state the kernel's code touches ("heap,printf,launch" or "-"; heap or printf: no reruns).
 * Lines starting with '#' are comments. Returns 0, or -1 with a message in err (the line number). */
int mn_ktab_load(mn_ktab *t, const char *path, char *err, size_t errlen);
int mn_ktab_parse(mn_ktab *t, const char *text, char *err, size_t errlen);
const mn_ktab_entry *mn_ktab_find(const mn_ktab *t, const char *name);
void mn_ktab_free(mn_ktab *t);

/* Whether a launch can be recorded, from cuStreamIsCapturing on its stream: `query` is the call's
 * CUresult, `capturing` 1 when it succeeded and said the stream is capturing. */
enum {
  MN_CAPTURE_NONE = 0,       /* no capture: record */
  MN_CAPTURE_THIS = 1,       /* this stream is being captured into a graph */
  MN_CAPTURE_ELSEWHERE = 2,  /* the query is refused because another stream captures (STREAM_CAPTURE_*) */
  MN_CAPTURE_CTX_ERROR = 3,  /* the query failed otherwise: the context holds an error (an earlier kernel
                                faulted): nothing can be recorded, and no capture is going on */
};
int mn_capture_verdict(int query, int capturing);

#endif
