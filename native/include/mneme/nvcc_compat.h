/* nvcc builtins that clang-22 lacks, force-included by `mneme cc` into every CUDA translation unit
 * (after clang's CUDA runtime wrapper), so that code written for nvcc compiles unchanged.
 *
 *  - cache-hinted loads/stores missing from clang's __clang_cuda_intrinsics.h:
 *    __ldca, __ldlu (loads) and __stcs, __stcg, __stwb (stores), for any 1/2/4/8/16-byte type;
 *  - the __nv_atomic_* builtins (CUDA 12.8+) with the __NV_ATOMIC_* orders and __NV_THREAD_SCOPE_*
 *    scopes, mapped onto clang's __scoped_atomic_* builtins. clang-22's NVPTX lowering treats every
 *    scope as system scope: stronger than asked, so correct, possibly slower than nvcc.
 * Each group is skipped when the compiler already provides it.
 */
#ifndef MNEME_NVCC_COMPAT_H
#define MNEME_NVCC_COMPAT_H
#if defined(__cplusplus) && defined(__CUDA__) && defined(__clang__)

namespace mneme_compat {
template <class T> struct identity { typedef T type; };
template <unsigned N> struct bytes {};

#define MNEME_CACHE_OPS(X)                                                                          \
  X(1, unsigned short, "h", "b8")                                                                  \
  X(2, unsigned short, "h", "b16")                                                                 \
  X(4, unsigned int, "r", "b32")                                                                   \
  X(8, unsigned long long, "l", "b64")

/* One load and one store per (cache operator, size); the value moves as raw bits. */
#define MNEME_LOAD_STORE(OP)                                                                        \
  __device__ __forceinline__ void ld_##OP(const void *p, void *out, bytes<16>) {                   \
    unsigned long long a, b;                                                                       \
    asm volatile("ld.global." #OP ".v2.b64 {%0,%1}, [%2];" : "=l"(a), "=l"(b) : "l"(p));           \
    __builtin_memcpy(out, &a, 8);                                                                  \
    __builtin_memcpy((char *)out + 8, &b, 8);                                                      \
  }                                                                                                \
  __device__ __forceinline__ void st_##OP(void *p, const void *in, bytes<16>) {                    \
    unsigned long long a, b;                                                                       \
    __builtin_memcpy(&a, in, 8);                                                                   \
    __builtin_memcpy(&b, (const char *)in + 8, 8);                                                 \
    asm volatile("st.global." #OP ".v2.b64 [%0], {%1,%2};" ::"l"(p), "l"(a), "l"(b) : "memory");  \
  }
#define MNEME_LOAD_STORE_N(OP, N, R, C, B)                                                          \
  __device__ __forceinline__ void ld_##OP(const void *p, void *out, bytes<N>) {                    \
    R r;                                                                                           \
    asm volatile("ld.global." #OP "." B " %0, [%1];" : "=" C(r) : "l"(p));                         \
    __builtin_memcpy(out, &r, N);                                                                  \
  }                                                                                                \
  __device__ __forceinline__ void st_##OP(void *p, const void *in, bytes<N>) {                     \
    R r = 0;                                                                                       \
    __builtin_memcpy(&r, in, N);                                                                   \
    asm volatile("st.global." #OP "." B " [%0], %1;" ::"l"(p), C(r) : "memory");                   \
  }
#define MNEME_CA(N, R, C, B) MNEME_LOAD_STORE_N(ca, N, R, C, B)
#define MNEME_LU(N, R, C, B) MNEME_LOAD_STORE_N(lu, N, R, C, B)
#define MNEME_CS(N, R, C, B) MNEME_LOAD_STORE_N(cs, N, R, C, B)
#define MNEME_CG(N, R, C, B) MNEME_LOAD_STORE_N(cg, N, R, C, B)
#define MNEME_WB(N, R, C, B) MNEME_LOAD_STORE_N(wb, N, R, C, B)
MNEME_LOAD_STORE(ca) MNEME_CACHE_OPS(MNEME_CA)
MNEME_LOAD_STORE(lu) MNEME_CACHE_OPS(MNEME_LU)
MNEME_LOAD_STORE(cs) MNEME_CACHE_OPS(MNEME_CS)
MNEME_LOAD_STORE(cg) MNEME_CACHE_OPS(MNEME_CG)
MNEME_LOAD_STORE(wb) MNEME_CACHE_OPS(MNEME_WB)
#undef MNEME_CA
#undef MNEME_LU
#undef MNEME_CS
#undef MNEME_CG
#undef MNEME_WB
#undef MNEME_LOAD_STORE_N
#undef MNEME_LOAD_STORE
#undef MNEME_CACHE_OPS
} /* namespace mneme_compat */

#define MNEME_DEFINE_LOAD(NAME, OP)                                                                 \
  template <class T> __device__ __forceinline__ T NAME(const T *p) {                               \
    T v;                                                                                           \
    mneme_compat::ld_##OP(p, &v, mneme_compat::bytes<sizeof(T)>());                                \
    return v;                                                                                      \
  }
#define MNEME_DEFINE_STORE(NAME, OP)                                                                \
  template <class T>                                                                               \
  __device__ __forceinline__ void NAME(T *p, typename mneme_compat::identity<T>::type v) {         \
    mneme_compat::st_##OP(p, &v, mneme_compat::bytes<sizeof(T)>());                                \
  }
MNEME_DEFINE_LOAD(__ldca, ca)
MNEME_DEFINE_LOAD(__ldlu, lu)
MNEME_DEFINE_STORE(__stcs, cs)
MNEME_DEFINE_STORE(__stcg, cg)
MNEME_DEFINE_STORE(__stwb, wb)
#undef MNEME_DEFINE_LOAD
#undef MNEME_DEFINE_STORE

/* ---- __nv_atomic_* ---- */
#if !__has_builtin(__nv_atomic_load_n)
/* CUDA's crt/device_functions.h declares these only for nvcc; clang's wrapper includes it without. */
enum {
  __NV_ATOMIC_RELAXED, __NV_ATOMIC_CONSUME, __NV_ATOMIC_ACQUIRE,
  __NV_ATOMIC_RELEASE, __NV_ATOMIC_ACQ_REL, __NV_ATOMIC_SEQ_CST
};
enum {
  __NV_THREAD_SCOPE_THREAD, __NV_THREAD_SCOPE_BLOCK, __NV_THREAD_SCOPE_CLUSTER,
  __NV_THREAD_SCOPE_DEVICE, __NV_THREAD_SCOPE_SYSTEM
};
static_assert(__NV_ATOMIC_RELAXED == __ATOMIC_RELAXED && __NV_ATOMIC_SEQ_CST == __ATOMIC_SEQ_CST,
              "nvcc and clang memory orders differ");
namespace mneme_compat {
/* nvcc's scope numbering onto clang's; the orders are numbered alike. */
__device__ __forceinline__ constexpr int scope(int s) {
  return s == __NV_THREAD_SCOPE_THREAD    ? __MEMORY_SCOPE_SINGLE
         : s == __NV_THREAD_SCOPE_BLOCK   ? __MEMORY_SCOPE_WRKGRP
         : s == __NV_THREAD_SCOPE_CLUSTER ? __MEMORY_SCOPE_CLUSTR
         : s == __NV_THREAD_SCOPE_DEVICE  ? __MEMORY_SCOPE_DEVICE
                                          : __MEMORY_SCOPE_SYSTEM;
}
} /* namespace mneme_compat */

#define MNEME_SCOPE(s) mneme_compat::scope(s)
template <class T>
__device__ __forceinline__ T __nv_atomic_load_n(T *p, int order, int scope = __NV_THREAD_SCOPE_SYSTEM) {
  return __scoped_atomic_load_n(p, order, MNEME_SCOPE(scope));
}
template <class T>
__device__ __forceinline__ void __nv_atomic_load(T *p, T *ret, int order, int scope = __NV_THREAD_SCOPE_SYSTEM) {
  __scoped_atomic_load(p, ret, order, MNEME_SCOPE(scope));
}
template <class T>
__device__ __forceinline__ void __nv_atomic_store_n(T *p, typename mneme_compat::identity<T>::type v, int order,
                                                    int scope = __NV_THREAD_SCOPE_SYSTEM) {
  __scoped_atomic_store_n(p, v, order, MNEME_SCOPE(scope));
}
template <class T>
__device__ __forceinline__ void __nv_atomic_store(T *p, T *v, int order, int scope = __NV_THREAD_SCOPE_SYSTEM) {
  __scoped_atomic_store(p, v, order, MNEME_SCOPE(scope));
}
template <class T>
__device__ __forceinline__ T __nv_atomic_exchange_n(T *p, typename mneme_compat::identity<T>::type v, int order,
                                                    int scope = __NV_THREAD_SCOPE_SYSTEM) {
  return __scoped_atomic_exchange_n(p, v, order, MNEME_SCOPE(scope));
}
template <class T>
__device__ __forceinline__ void __nv_atomic_exchange(T *p, T *v, T *ret, int order,
                                                     int scope = __NV_THREAD_SCOPE_SYSTEM) {
  __scoped_atomic_exchange(p, v, ret, order, MNEME_SCOPE(scope));
}
template <class T>
__device__ __forceinline__ bool __nv_atomic_compare_exchange_n(T *p, T *expected,
                                                               typename mneme_compat::identity<T>::type desired,
                                                               bool weak, int success, int failure,
                                                               int scope = __NV_THREAD_SCOPE_SYSTEM) {
  return __scoped_atomic_compare_exchange_n(p, expected, desired, weak, success, failure, MNEME_SCOPE(scope));
}
template <class T>
__device__ __forceinline__ bool __nv_atomic_compare_exchange(T *p, T *expected, T *desired, bool weak, int success,
                                                             int failure, int scope = __NV_THREAD_SCOPE_SYSTEM) {
  return __scoped_atomic_compare_exchange(p, expected, desired, weak, success, failure, MNEME_SCOPE(scope));
}
#define MNEME_NV_FETCH(OP)                                                                          \
  template <class T>                                                                               \
  __device__ __forceinline__ T __nv_atomic_fetch_##OP(T *p, typename mneme_compat::identity<T>::type v, int order, \
                                                      int scope = __NV_THREAD_SCOPE_SYSTEM) {      \
    return __scoped_atomic_fetch_##OP(p, v, order, MNEME_SCOPE(scope));                            \
  }
MNEME_NV_FETCH(add)
MNEME_NV_FETCH(sub)
MNEME_NV_FETCH(and)
MNEME_NV_FETCH(or)
MNEME_NV_FETCH(xor)
MNEME_NV_FETCH(min)
MNEME_NV_FETCH(max)
#undef MNEME_NV_FETCH
__device__ __forceinline__ void __nv_atomic_thread_fence(int order, int scope = __NV_THREAD_SCOPE_SYSTEM) {
  __scoped_atomic_thread_fence(order, MNEME_SCOPE(scope));
}
#undef MNEME_SCOPE
#endif /* !__has_builtin(__nv_atomic_load_n) */

/* Device-side virtual functions: the vtable of a class with a pure (or deleted) virtual function names
 * __cxa_pure_virtual, which nvcc's device runtime defines and clang's CUDA does not. Weak, so that every
 * translation unit may carry it and the device link keeps one. */
#if defined(__CUDA_ARCH__)
extern "C" __device__ __attribute__((weak, noreturn)) void __cxa_pure_virtual(void) { __trap(); }
extern "C" __device__ __attribute__((weak, noreturn)) void __cxa_deleted_virtual(void) { __trap(); }
#endif

/* Host-side min/max. CUDA's crt/math_functions.hpp declares these overloads __host__ __device__ for
 * nvcc, so host code calls max(float, float) or min(int, unsigned); clang reads that header as
 * device-only. The same overloads (same return types) for the host side: */
#define MNEME_HOST_MINMAX(R, A, B, MIN, MAX)                                                        \
  static inline __host__ R min(A a, B b) { return MIN; }                                           \
  static inline __host__ R max(A a, B b) { return MAX; }
#define MNEME_HOST_MINMAX_INT(R, A, B) MNEME_HOST_MINMAX(R, A, B, (R)a < (R)b ? (R)a : (R)b, (R)a > (R)b ? (R)a : (R)b)
MNEME_HOST_MINMAX_INT(int, int, int)
MNEME_HOST_MINMAX_INT(unsigned int, unsigned int, unsigned int)
MNEME_HOST_MINMAX_INT(unsigned int, int, unsigned int)
MNEME_HOST_MINMAX_INT(unsigned int, unsigned int, int)
MNEME_HOST_MINMAX_INT(long int, long int, long int)
MNEME_HOST_MINMAX_INT(unsigned long int, unsigned long int, unsigned long int)
MNEME_HOST_MINMAX_INT(unsigned long int, long int, unsigned long int)
MNEME_HOST_MINMAX_INT(unsigned long int, unsigned long int, long int)
MNEME_HOST_MINMAX_INT(long long int, long long int, long long int)
MNEME_HOST_MINMAX_INT(unsigned long long int, unsigned long long int, unsigned long long int)
MNEME_HOST_MINMAX_INT(unsigned long long int, long long int, unsigned long long int)
MNEME_HOST_MINMAX_INT(unsigned long long int, unsigned long long int, long long int)
MNEME_HOST_MINMAX(float, float, float, __builtin_fminf(a, b), __builtin_fmaxf(a, b))
MNEME_HOST_MINMAX(double, double, double, __builtin_fmin(a, b), __builtin_fmax(a, b))
MNEME_HOST_MINMAX(double, float, double, __builtin_fmin(a, b), __builtin_fmax(a, b))
MNEME_HOST_MINMAX(double, double, float, __builtin_fmin(a, b), __builtin_fmax(a, b))
#undef MNEME_HOST_MINMAX_INT
#undef MNEME_HOST_MINMAX

#endif /* C++ CUDA under clang */
#endif /* MNEME_NVCC_COMPAT_H */
