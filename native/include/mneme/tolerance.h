/* mneme/tolerance.h — tell mneme how exactly a device buffer must be reproduced.
 *
 * A recorded kernel is verified after replay by comparing its output with the recorded epilogue.
 * Byte-exact comparison is right for most buffers, but not for results whose low bits depend on the
 * order of floating-point operations (atomics, reductions, a different optimization level). Mark such
 * a buffer once, after allocating it:
 *
 *   C++:  mneme::annotate(d_sum, 1, mneme::relative(1e-5));              // element type deduced
 *         mneme::annotate(d_out, n, mneme::relative(1e-6, mneme::NORM_L2), "out");
 *   C:    mneme_annotate(d_out, n * sizeof(float), MNEME_ELEM_F32, MNEME_TOL_ABS, MNEME_NORM_ELEMENT,
 *                        1e-6, "out");
 *
 * Tolerance modes: per element, |actual - expected| <= tol (ABS) or <= tol * |expected| (REL); as a
 * norm (L1, L2, Linf) of the error vector, alone (ABS) or against the same norm of the expected vector
 * (REL). The recorder stores the annotation with the buffer's snapshot; replay verification applies it.
 *
 * Without the recorder (an ordinary run) every call does nothing and returns 0. The header needs no
 * library: it finds `mneme_recorder_annotate` in the process once, with dlsym (link with -ldl on
 * glibc < 2.34; `mneme cc` does).
 */
#ifndef MNEME_TOLERANCE_H
#define MNEME_TOLERANCE_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types; the values are those of enum mn_elem in mneme's snapshot format (checked below). */
typedef enum mneme_elem {
  MNEME_ELEM_BYTES = 0, MNEME_ELEM_F32 = 1, MNEME_ELEM_F64 = 2, MNEME_ELEM_F16 = 3, MNEME_ELEM_BF16 = 4,
  MNEME_ELEM_I8 = 5, MNEME_ELEM_I16 = 6, MNEME_ELEM_I32 = 7, MNEME_ELEM_I64 = 8,
  MNEME_ELEM_U8 = 9, MNEME_ELEM_U16 = 10, MNEME_ELEM_U32 = 11, MNEME_ELEM_U64 = 12
} mneme_elem;

typedef enum mneme_tol_mode { MNEME_TOL_ABS = 0, MNEME_TOL_REL = 1 } mneme_tol_mode;

typedef enum mneme_tol_norm {
  MNEME_NORM_ELEMENT = 0, MNEME_NORM_L1 = 1, MNEME_NORM_L2 = 2, MNEME_NORM_LINF = 3
} mneme_tol_norm;

/* The recorder's entry point (exported by librecord.so when it is preloaded). */
typedef int (*mneme_recorder_annotate_fn)(const void *dev_ptr, size_t bytes, int elem, int mode, int norm,
                                          double tol, const char *tag);

#define MNEME_ANNOTATE_SYMBOL "mneme_recorder_annotate"

/* The recorder's function, or NULL when the process runs without it. Looked up once per
 * translation unit; a race between threads only repeats the (idempotent) lookup. */
static inline mneme_recorder_annotate_fn mneme_recorder(void) {
  static mneme_recorder_annotate_fn fn;
  static int looked_up;
  if (!__atomic_load_n(&looked_up, __ATOMIC_ACQUIRE)) {
#ifdef RTLD_DEFAULT
    void *sym = dlsym(RTLD_DEFAULT, MNEME_ANNOTATE_SYMBOL);
#else
    void *sym = dlsym((void *)0, MNEME_ANNOTATE_SYMBOL); /* glibc's RTLD_DEFAULT without _GNU_SOURCE */
#endif
    __atomic_store_n(&fn, (mneme_recorder_annotate_fn)sym, __ATOMIC_RELAXED);
    __atomic_store_n(&looked_up, 1, __ATOMIC_RELEASE);
  }
  return __atomic_load_n(&fn, __ATOMIC_RELAXED);
}

/* 1 when the process runs under `mneme record`. */
static inline int mneme_recording(void) { return mneme_recorder() != (mneme_recorder_annotate_fn)0; }

/* Marks `bytes` bytes of device memory at `dev_ptr` as elements of `elem` compared under (mode, norm,
 * tol). `tag` (optional, up to 31 characters kept) names the buffer in replay reports. Returns the
 * recorder's status (0 = stored, negative = rejected, e.g. not an arena pointer) or 0 without it. */
static inline int mneme_annotate(const void *dev_ptr, size_t bytes, mneme_elem elem, mneme_tol_mode mode,
                                 mneme_tol_norm norm, double tol, const char *tag) {
  mneme_recorder_annotate_fn fn = mneme_recorder();
  return fn ? fn(dev_ptr, bytes, (int)elem, (int)mode, (int)norm, tol, tag) : 0;
}

/* Per-element shorthands. */
static inline int mneme_annotate_abs(const void *dev_ptr, size_t bytes, mneme_elem elem, double tol) {
  return mneme_annotate(dev_ptr, bytes, elem, MNEME_TOL_ABS, MNEME_NORM_ELEMENT, tol, (const char *)0);
}
static inline int mneme_annotate_rel(const void *dev_ptr, size_t bytes, mneme_elem elem, double tol) {
  return mneme_annotate(dev_ptr, bytes, elem, MNEME_TOL_REL, MNEME_NORM_ELEMENT, tol, (const char *)0);
}

#ifdef __cplusplus
} /* extern "C" */

namespace mneme {

enum Norm { NORM_ELEMENT = MNEME_NORM_ELEMENT, NORM_L1 = MNEME_NORM_L1, NORM_L2 = MNEME_NORM_L2, NORM_LINF = MNEME_NORM_LINF };

/* A tolerance: build it with absolute() or relative(). */
struct Tolerance {
  mneme_tol_mode mode;
  mneme_tol_norm norm;
  double tol;
};
inline Tolerance absolute(double tol, Norm norm = NORM_ELEMENT) {
  Tolerance t = {MNEME_TOL_ABS, (mneme_tol_norm)norm, tol};
  return t;
}
inline Tolerance relative(double tol, Norm norm = NORM_ELEMENT) {
  Tolerance t = {MNEME_TOL_REL, (mneme_tol_norm)norm, tol};
  return t;
}

/* Element type of T; a type without one is a compile error (use annotate_bytes instead). */
template <class T> struct elem_of;
template <unsigned Size, bool Signed> struct int_elem;
template <> struct int_elem<1, true> { static const mneme_elem value = MNEME_ELEM_I8; };
template <> struct int_elem<2, true> { static const mneme_elem value = MNEME_ELEM_I16; };
template <> struct int_elem<4, true> { static const mneme_elem value = MNEME_ELEM_I32; };
template <> struct int_elem<8, true> { static const mneme_elem value = MNEME_ELEM_I64; };
template <> struct int_elem<1, false> { static const mneme_elem value = MNEME_ELEM_U8; };
template <> struct int_elem<2, false> { static const mneme_elem value = MNEME_ELEM_U16; };
template <> struct int_elem<4, false> { static const mneme_elem value = MNEME_ELEM_U32; };
template <> struct int_elem<8, false> { static const mneme_elem value = MNEME_ELEM_U64; };
#define MNEME_INT_ELEM(T) template <> struct elem_of<T> : int_elem<sizeof(T), ((T)-1 < (T)0)> {};
MNEME_INT_ELEM(char)
MNEME_INT_ELEM(signed char)
MNEME_INT_ELEM(unsigned char)
MNEME_INT_ELEM(short)
MNEME_INT_ELEM(unsigned short)
MNEME_INT_ELEM(int)
MNEME_INT_ELEM(unsigned int)
MNEME_INT_ELEM(long)
MNEME_INT_ELEM(unsigned long)
MNEME_INT_ELEM(long long)
MNEME_INT_ELEM(unsigned long long)
#undef MNEME_INT_ELEM
template <> struct elem_of<float> { static const mneme_elem value = MNEME_ELEM_F32; };
template <> struct elem_of<double> { static const mneme_elem value = MNEME_ELEM_F64; };
#if defined(__CUDA_FP16_TYPES_EXIST__)
template <> struct elem_of<__half> { static const mneme_elem value = MNEME_ELEM_F16; };
#endif
#if defined(__CUDA_BF16_TYPES_EXIST__)
template <> struct elem_of<__nv_bfloat16> { static const mneme_elem value = MNEME_ELEM_BF16; };
#endif

/* Annotates `count` elements of T at `dev_ptr`. */
template <class T> inline int annotate(const T *dev_ptr, size_t count, Tolerance t, const char *tag = 0) {
  return mneme_annotate(dev_ptr, count * sizeof(T), elem_of<T>::value, t.mode, t.norm, t.tol, tag);
}
inline int annotate_bytes(const void *dev_ptr, size_t bytes, Tolerance t, const char *tag = 0) {
  return mneme_annotate(dev_ptr, bytes, MNEME_ELEM_BYTES, t.mode, t.norm, t.tol, tag);
}
inline bool recording() { return mneme_recording() != 0; }

} /* namespace mneme */
#endif /* __cplusplus */

#endif /* MNEME_TOLERANCE_H */

/* The recorder includes both this header and the snapshot format (native/snapshot.h): their numbering
 * must agree. Checked once both are seen (this part sits outside the include guard, so including
 * this header again after snapshot.h runs the check). */
#if defined(MNEME_SNAPSHOT_H) && !defined(MNEME_TOLERANCE_CHECKED)
#define MNEME_TOLERANCE_CHECKED
#if defined(__cplusplus)
#define MNEME_TOL_ASSERT(c, m) static_assert(c, m)
#else
#define MNEME_TOL_ASSERT(c, m) _Static_assert(c, m)
#endif
#define MNEME_SAME(a, b) ((int)(a) == (int)(b))
MNEME_TOL_ASSERT(MNEME_SAME(MNEME_ELEM_BYTES, MN_ELEM_BYTES) && MNEME_SAME(MNEME_ELEM_F32, MN_ELEM_F32) && MNEME_SAME(MNEME_ELEM_F64, MN_ELEM_F64) &&
                     MNEME_SAME(MNEME_ELEM_F16, MN_ELEM_F16) && MNEME_SAME(MNEME_ELEM_BF16, MN_ELEM_BF16) && MNEME_SAME(MNEME_ELEM_I8, MN_ELEM_I8) &&
                     MNEME_SAME(MNEME_ELEM_I16, MN_ELEM_I16) && MNEME_SAME(MNEME_ELEM_I32, MN_ELEM_I32) && MNEME_SAME(MNEME_ELEM_I64, MN_ELEM_I64) &&
                     MNEME_SAME(MNEME_ELEM_U8, MN_ELEM_U8) && MNEME_SAME(MNEME_ELEM_U16, MN_ELEM_U16) && MNEME_SAME(MNEME_ELEM_U32, MN_ELEM_U32) &&
                     MNEME_SAME(MNEME_ELEM_U64, MN_ELEM_U64),
                 "mneme/tolerance.h element types differ from snapshot.h (enum mn_elem)");
MNEME_TOL_ASSERT(MNEME_SAME(MNEME_TOL_ABS, MN_TOL_ABS) && MNEME_SAME(MNEME_TOL_REL, MN_TOL_REL),
                 "mneme/tolerance.h tolerance modes differ from snapshot.h (enum mn_tol_mode)");
MNEME_TOL_ASSERT(MNEME_SAME(MNEME_NORM_ELEMENT, MN_NORM_ELEMENT) && MNEME_SAME(MNEME_NORM_L1, MN_NORM_L1) && MNEME_SAME(MNEME_NORM_L2, MN_NORM_L2) &&
                     MNEME_SAME(MNEME_NORM_LINF, MN_NORM_LINF),
                 "mneme/tolerance.h norms differ from snapshot.h (enum mn_tol_norm)");
#undef MNEME_SAME
#undef MNEME_TOL_ASSERT
#endif
