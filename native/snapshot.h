/* The one snapshot format of mneme, shared by the recorder (writes), the replay core (reads,
 * resets, verifies) and Python (reads and compares through cffi).
 *
 * A snapshot is the device-visible state around one kernel launch:
 *   - blobs:      live arena allocations (device) and pinned host allocations, by address;
 *   - variables:  __device__/__constant__ variables by name, with relocations for the words that
 *                 hold addresses of other variables (so replay can move them);
 *   - arguments:  the raw kernel parameter bytes with each parameter's offset and size;
 *   - annotations: tolerances the app attached to device buffers (mneme/tolerance.h).
 * A prologue stores blob contents in full. An epilogue stores each blob either in full (BYTES) or as the
 * byte ranges that differ from the prologue (DIFF); mn_snapshot_apply() rebuilds the full state.
 *
 * File layout (little endian): a 32-byte header, then records, then an END record.
 *   header:  char magic[8] = "MNEMESNP"; u32 version; u32 kind; u32 flags; u32 reserved; u64 created_ns
 *   record:  u32 tag; u32 reserved; u64 payload_len; payload; zero padding to a multiple of 8 bytes;
 *            u64 checksum (mn_checksum, seed 0, of tag..padding). Records start at 8-byte offsets.
 * Payloads (tags are four ASCII characters; "pad8" pads to a multiple of 8 from the payload start):
 *   "BLOB": u64 addr, size; u32 space, encoding; u64 checksum; u32 nranges, reserved;
 *           BYTES: size bytes | DIFF: nranges x {u64 offset, length}, then the ranges' bytes in order
 *   "VAR ": u64 addr, size; u32 is_const, nrelocs, name_len, reserved (name_len counts the NUL);
 *           nrelocs x {u64 offset, target_offset; u32 target_len (0: no target), reserved};
 *           name and targets, each NUL-terminated; pad8; size bytes of contents
 *   "ARGS": u32 count, reserved; u64 total; u32 offsets[count]; u32 sizes[count]; pad8; total bytes
 *   "ANNO": u64 addr, size; u32 elem, mode, norm, reserved; f64 tol; char tag[32] (NUL-terminated)
 *   "ARRY": u64 handle, width, height, depth; u32 format, channels, flags, levels; u64 size; size bytes
 *           (a CUDA array's contents: mn_array below; size must equal mn_array_bytes)
 *   "TEXO": the 176 bytes of mn_texobj below, in its in-memory layout (a texture or surface object)
 *   "END ": u64 number of records before it; u64 mn_checksum of the 32 header bytes
 * The version is checked first: a file of another version is refused (record again), never misread.
 * Every reader error names the file and the byte offset of the record at fault; sizes are checked
 * against the file length before use, so a corrupt length can never cause a huge allocation.
 */
#ifndef MNEME_SNAPSHOT_H
#define MNEME_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MN_SNAPSHOT_MAGIC "MNEMESNP"
#define MN_SNAPSHOT_VERSION 1

enum mn_kind { MN_PROLOGUE = 1, MN_EPILOGUE = 2 };

enum mn_blob_space { MN_SPACE_DEVICE = 0, MN_SPACE_HOST_PINNED = 1, MN_SPACE_MANAGED = 2 };

/* How a blob's contents are stored in the file. */
enum mn_blob_enc { MN_ENC_BYTES = 0, MN_ENC_DIFF = 1 };

/* mn_writer_blob_epilogue's `format`. */
enum mn_epi_format { MN_EPI_DIFF = 0, MN_EPI_BYTES = 1, MN_EPI_BEST = 2 };

/* Element types for tolerant comparison. */
enum mn_elem {
  MN_ELEM_BYTES = 0, MN_ELEM_F32 = 1, MN_ELEM_F64 = 2, MN_ELEM_F16 = 3, MN_ELEM_BF16 = 4,
  MN_ELEM_I8 = 5, MN_ELEM_I16 = 6, MN_ELEM_I32 = 7, MN_ELEM_I64 = 8,
  MN_ELEM_U8 = 9, MN_ELEM_U16 = 10, MN_ELEM_U32 = 11, MN_ELEM_U64 = 12
};

/* Tolerance: per element (|a-e| <= tol, or <= tol*|e| when relative) or on a norm of the error
 * vector against the same norm of the expected vector (relative) or alone (absolute). */
enum mn_tol_mode { MN_TOL_ABS = 0, MN_TOL_REL = 1 };
enum mn_tol_norm { MN_NORM_ELEMENT = 0, MN_NORM_L1 = 1, MN_NORM_L2 = 2, MN_NORM_LINF = 3 };

typedef struct mn_range { uint64_t offset, length; } mn_range;

typedef struct mn_blob {
  uint64_t addr;        /* device (or host) address in the recorded process */
  uint64_t size;        /* bytes */
  uint32_t space;       /* enum mn_blob_space */
  uint32_t encoding;    /* enum mn_blob_enc as stored; after mn_snapshot_apply always BYTES */
  uint64_t checksum;    /* mn_checksum (seed 0) of the full contents, also for DIFF (of the contents
                           after the diff is applied: mn_snapshot_apply checks it) */
  uint8_t *data;        /* BYTES: size bytes; DIFF: concatenated range payloads. Points into a private
                           copy-on-write mapping of the file (writable; writes never reach the file)
                           or into memory the snapshot owns; valid until mn_snapshot_free */
  uint32_t nranges;     /* DIFF only */
  mn_range *ranges;     /* DIFF only, sorted, non-overlapping */
} mn_blob;

/* A word inside a variable that holds an address: the value at `offset` (8 bytes) equals
 * address(target) + target_offset at record time. target == NULL means "inside a blob"
 * (arena or pinned memory, which replay places at the recorded address: nothing to do). */
typedef struct mn_reloc { uint64_t offset; char *target; uint64_t target_offset; } mn_reloc;

typedef struct mn_var {
  char *name;           /* mangled symbol name, as in the IR */
  uint64_t addr;        /* device address in the recorded process */
  uint64_t size;
  uint32_t is_const;    /* __constant__ */
  uint32_t nrelocs;
  mn_reloc *relocs;
  uint8_t *data;
} mn_var;

typedef struct mn_args {
  uint32_t count;
  uint32_t *offsets;    /* offset of each parameter in `bytes` (cuFuncGetParamInfo) */
  uint32_t *sizes;
  uint64_t total;       /* bytes in `bytes` */
  uint8_t *bytes;
} mn_args;

typedef struct mn_annot {
  uint64_t addr, size;  /* the annotated buffer (inside a blob) */
  uint32_t elem;        /* enum mn_elem */
  uint32_t mode;        /* enum mn_tol_mode */
  uint32_t norm;        /* enum mn_tol_norm */
  uint32_t reserved;
  double tol;
  char tag[32];
} mn_annot;

/* Texture and surface objects a kernel received as arguments, and the CUDA arrays behind them. The
 * CUDA enums and flags (CUarray_format, CUresourcetype, CUaddress_mode, CUfilter_mode, CU_TRSF_*,
 * CUDA_ARRAY3D_*, CUresourceViewFormat) are stored with the driver API's values. A prologue holds
 * every object an argument named and every array behind them; an epilogue holds the arrays again
 * (their contents after the kernel: surface writes). Linear and pitched resources point into a blob. */
enum mn_tex_kind { MN_TEX_TEXTURE = 0, MN_TEX_SURFACE = 1 };
enum mn_res_type { MN_RES_ARRAY = 0, MN_RES_MIPMAPPED = 1, MN_RES_LINEAR = 2, MN_RES_PITCH2D = 3 };

typedef struct mn_array {
  uint64_t handle;      /* CUarray, or CUmipmappedArray when levels > 0, in the recorded process */
  uint64_t width, height, depth;  /* level 0, as in CUDA_ARRAY3D_DESCRIPTOR (0: dimension unused) */
  uint32_t format;      /* CUarray_format */
  uint32_t channels;    /* 1, 2 or 4 */
  uint32_t flags;       /* CUDA_ARRAY3D_* (LAYERED 1, SURFACE_LDST 2, CUBEMAP 4, ...) */
  uint32_t levels;      /* 0: a plain array; n > 0: a mipmapped array of n levels */
  uint64_t size;        /* bytes of data */
  uint8_t *data;        /* each level's elements, rows of width*element bytes, level 0 first */
} mn_array;

typedef struct mn_texobj {
  uint64_t handle;      /* CUtexObject / CUsurfObject in the recorded process */
  uint64_t array;       /* MN_RES_ARRAY / MIPMAPPED: the mn_array's handle */
  uint64_t dev_ptr;     /* MN_RES_LINEAR / PITCH2D: device address */
  uint64_t size_bytes;  /* MN_RES_LINEAR */
  uint64_t width, height, pitch; /* MN_RES_PITCH2D (width in elements, pitch in bytes) */
  uint32_t format, channels;     /* MN_RES_LINEAR / PITCH2D */
  uint32_t kind;        /* enum mn_tex_kind */
  uint32_t res_type;    /* enum mn_res_type */
  /* texture descriptor (textures only) */
  uint32_t address_mode[3], filter_mode, tex_flags, max_anisotropy, mipmap_filter_mode;
  float mipmap_level_bias, min_mipmap_level_clamp, max_mipmap_level_clamp, border_color[4];
  /* resource view (has_view = 1) */
  uint32_t has_view, view_format, first_mip, last_mip, first_layer, last_layer;
  uint64_t view_width, view_height, view_depth;
} mn_texobj;

typedef struct mn_snapshot {
  uint32_t version, kind, flags, reserved;
  uint64_t created_ns;
  uint32_t nblobs, nvars, nannots, has_args;
  mn_blob *blobs;
  mn_var *vars;
  mn_annot *annots;
  mn_args args;
  char *path;           /* file it was read from, for messages */
  uint32_t narrays, ntexobjs;
  mn_array *arrays;     /* in file order */
  mn_texobj *texobjs;
} mn_snapshot;

/* ---- checksum: 64-bit, word at a time; stable across platforms (little endian) ----
 * The XXH64 algorithm (Yann Collet's xxHash, 64-bit variant): 4 lanes of 8-byte words, so it runs at
 * memory speed; mn_checksum("", 0, 0) = 0xEF46DB3751D8E999. Not cryptographic: it detects corruption,
 * not tampering. */
uint64_t mn_checksum(const void *data, size_t n, uint64_t seed);

/* ---- streaming writer (the recorder never holds a whole snapshot in memory) ----
 * Every function returns 0 on success, -1 on error with a message in mn_last_error(). */
typedef struct mn_writer mn_writer;
mn_writer *mn_writer_open(const char *path, uint32_t kind);
int mn_writer_blob(mn_writer *w, uint64_t addr, uint64_t size, uint32_t space, const void *data);
/* Writes the epilogue of one blob: DIFF against `before` or BYTES, per `format`
 * (0 = diff, 1 = bytes, 2 = best: whichever is smaller). Ranges closer than `merge_gap` bytes merge
 * (16 is a good value: a range costs 16 bytes of table). `before` NULL writes BYTES. A diff of more
 * than 2^32-1 ranges is written as BYTES. Only an EPILOGUE writer accepts this call. */
int mn_writer_blob_epilogue(mn_writer *w, uint64_t addr, uint64_t size, uint32_t space,
                            const void *before, const void *after, int format, uint64_t merge_gap);
/* The same, given mn_checksum(before) (the prologue's checksum of the blob, mn_writer_last_checksum):
 * a blob the kernel did not change is then not hashed again. A wrong before_sum makes the epilogue
 * fail its checksum when applied (refused, never misread). */
int mn_writer_blob_epilogue_sum(mn_writer *w, uint64_t addr, uint64_t size, uint32_t space, const void *before,
                                uint64_t before_sum, const void *after, int format, uint64_t merge_gap);
/* The content checksum (mn_checksum, seed 0) of the blob the last mn_writer_blob* call wrote. */
uint64_t mn_writer_last_checksum(const mn_writer *w);
int mn_writer_var(mn_writer *w, const char *name, uint64_t addr, uint64_t size, uint32_t is_const,
                  const void *data, uint32_t nrelocs, const mn_reloc *relocs);
/* At most once per file; every offsets[i] + sizes[i] must lie inside `total`. */
int mn_writer_args(mn_writer *w, uint32_t count, const uint32_t *offsets, const uint32_t *sizes,
                   uint64_t total, const void *bytes);
int mn_writer_annot(mn_writer *w, const mn_annot *a);
/* An array's contents (a->data, a->size bytes; size must equal mn_array_bytes(a)). */
int mn_writer_array(mn_writer *w, const mn_array *a);
/* A texture or surface object (prologues only). */
int mn_writer_texobj(mn_writer *w, const mn_texobj *t);
/* Bytes of one channel of a CUarray_format (0 for formats mneme does not store: NV12, BC, ...). */
uint32_t mn_format_bytes(uint32_t format);
/* Bytes of an array's contents over all levels (0 for an unknown format or a zero width). */
uint64_t mn_array_bytes(const mn_array *a);
/* Dimensions of level `level` (width, height, depth; unused ones 1): halved per level, except the
 * layer count of layered arrays and the 6 faces of cubemaps. */
void mn_array_level_dims(const mn_array *a, uint32_t level, uint64_t dims[3]);
const mn_array *mn_snapshot_find_array(const mn_snapshot *s, uint64_t handle);
/* Writes the END record, flushes, fsyncs (unless mn_snapshot_set_fsync(0)) and closes; the file is
 * complete only after this. Without fsync a file survives the process (a crash included) but not a
 * crash of the machine: a file cut short there reads as truncated (refused), never as good. */
int mn_writer_close(mn_writer *w);
/* Closes without END (the file then reads as truncated); for error paths. */
void mn_writer_abort(mn_writer *w);
/* Bytes written so far (for "stored bytes" accounting). */
uint64_t mn_writer_bytes(const mn_writer *w);
/* Nanoseconds the calling thread's writers have spent in write, fsync and close so far (the disk's
 * share of writing a snapshot; the rest is checksums, diffs and encoding). */
uint64_t mn_snapshot_io_ns(void);
/* Whether mn_writer_close fsyncs each file (default 1); process-wide. */
void mn_snapshot_set_fsync(int on);

/* ---- reader ---- */
mn_snapshot *mn_snapshot_read(const char *path);     /* NULL on error, see mn_last_error() */
void mn_snapshot_free(mn_snapshot *s);
/* Rebuilds the full epilogue state from a prologue and a (DIFF or BYTES) epilogue, in place in
 * `epilogue`: afterwards every blob is BYTES. Blobs present only in the prologue are copied, and so
 * are variables, arguments and annotations that the epilogue lacks. Each rebuilt blob's checksum is
 * checked, so an epilogue applied to a prologue of another launch is refused. All or nothing: on error
 * the epilogue is unchanged. Pointers into the epilogue's blob array are invalid afterwards. */
int mn_snapshot_apply(const mn_snapshot *prologue, mn_snapshot *epilogue);
/* Blobs are sorted by address (the reader sorts them; duplicate addresses are refused). Returns the
 * blob that contains `addr` (addr <= a < addr + size, or addr itself for an empty blob), else NULL. */
const mn_blob *mn_snapshot_find_blob(const mn_snapshot *s, uint64_t addr);
const mn_var *mn_snapshot_find_var(const mn_snapshot *s, const char *name);

/* ---- comparison ----
 * Compares `actual` with `expected` (n bytes) as elements of `elem`, under tolerance (mode, norm,
 * tol); MN_ELEM_BYTES or tol < 0 (or NaN) means byte-exact. Fills the report; returns 1 when equal
 * within tolerance, 0 when not, -1 on bad arguments. Equivalent to mn_compare_ex with
 * (atol, rtol) = (tol, 0) for MN_TOL_ABS and (0, tol) for MN_TOL_REL.
 *
 * Semantics (the definition of "verified"; the GPU compare kernel implements the same):
 *  - exact (MN_ELEM_BYTES, or a negative/NaN tolerance): bitwise. With MN_ELEM_BYTES `mismatches`
 *    counts bytes; with a typed elem it counts elements whose bits differ (so -0.0 != 0.0 and NaN
 *    payloads must match), and the error fields are filled as below for information.
 *  - values: floats (f16 and bf16 widened exactly) and integers are compared as numbers. NaN equals
 *    NaN at the same position (any payload, any sign); NaN against a number is a mismatch with error
 *    +inf. Infinities equal only the same infinity; inf against anything else is a mismatch with
 *    error +inf. -0.0 equals 0.0. Integer errors are exact distances (as doubles).
 *  - per element (MN_NORM_ELEMENT): element i passes when |a-e| <= atol + rtol*|e|; mismatches
 *    counts failing elements; equal when none fails.
 *  - norm (L1/L2/Linf): err_norm = norm of (a-e) over all elements, ref_norm = the same norm of e over
 *    its finite elements; equal when err_norm <= atol + rtol*ref_norm and no NaN/inf mismatch exists.
 *    mismatches counts elements that differ at all (information only).
 *  - n not a multiple of the element size: the trailing bytes are compared exactly and, if they
 *    differ, count as one mismatching element (the comparison then fails).
 *  - max_abs_err = max |a-e|; max_rel_err = max |a-e|/|e| over differing elements (+inf where e=0).
 *  - first_mismatch = byte offset of the first counted mismatch, or n when there is none. */
typedef struct mn_cmp_report {
  uint64_t mismatches;       /* elements (bytes for MN_ELEM_BYTES) outside tolerance */
  uint64_t first_mismatch;   /* byte offset of the first one */
  double max_abs_err, max_rel_err;
  double err_norm, ref_norm; /* for norm modes */
} mn_cmp_report;
int mn_compare(const void *expected, const void *actual, uint64_t n, uint32_t elem, uint32_t mode,
               uint32_t norm, double tol, mn_cmp_report *report);
/* The general form: absolute and relative tolerance together (|a-e| <= atol + rtol*|e|, as numpy's
 * isclose); a negative or NaN atol or rtol means exact. */
int mn_compare_ex(const void *expected, const void *actual, uint64_t n, uint32_t elem, uint32_t norm,
                  double atol, double rtol, mn_cmp_report *report);
/* Size in bytes of one element of `elem` (1 for MN_ELEM_BYTES), 0 for an unknown elem. */
uint32_t mn_elem_size(uint32_t elem);

/* Byte ranges where two buffers differ, merged across gaps shorter than merge_gap (0 or 1: only
 * adjacent bytes merge, i.e. maximal runs). Sorted by offset. The caller frees *out with free()
 * (*out is NULL when there are none). Returns the number of ranges, or -1 on allocation failure. */
int64_t mn_diff_ranges(const void *a, const void *b, uint64_t n, uint64_t merge_gap, mn_range **out);

/* free() for memory this module handed out (mn_diff_ranges' *out), for bindings without libc. */
void mn_free(void *p);

/* Thread-local text of the last error ("" when none yet). */
const char *mn_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
