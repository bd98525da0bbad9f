/* Driver-level interposition (minimal; meant to be folded into the shared one the recorder gets).
 *
 * cudart (static and shared) opens libcuda.so.1, takes cuGetProcAddress_v2 from it with dlsym and gets every
 * other entry point through it. So: `dlsym` is wrapped and hands out our cuGetProcAddress for
 * "cuGetProcAddress[_v2]"; ours asks the real one, and for the launch entry points it hands out wrappers that
 * remember the real function (one slot per name and per-thread-default-stream flag: the _ptsz variants).
 * Apps that call cuLaunchKernel from libcuda directly reach the exported wrappers below.
 *
 * Known limit: a caller's dlsym(RTLD_NEXT, ...) is answered from this library's position in the link map. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "apply.h"

#define MN_EXPORT __attribute__((visibility("default")))

typedef void *(*dlsym_fn)(void *, const char *);
typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static dlsym_fn real_dlsym_;
static getproc_fn real_getproc_;
static void *libcuda_;
static pthread_once_t once_ = PTHREAD_ONCE_INIT;

static void init_real(void) {
  real_dlsym_ = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (!real_dlsym_) real_dlsym_ = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  libcuda_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!libcuda_) libcuda_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (libcuda_ && real_dlsym_) real_getproc_ = (getproc_fn)real_dlsym_(libcuda_, "cuGetProcAddress_v2");
}

static dlsym_fn real_dlsym(void) {
  pthread_once(&once_, init_real);
  return real_dlsym_;
}

static int ours(const void *fn);

void *mna_real(const char *name) {
  pthread_once(&once_, init_real);
  void *fn = NULL;
  if (real_getproc_) {
    CUdriverProcAddressQueryResult st;
    if (real_getproc_(name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS)
      fn = NULL;
  }
  /* a driver whose own references to its exports bind to ours (no -Bsymbolic) hands out our wrappers: the
   * library's own symbol table has the real one */
  if ((!fn || ours(fn)) && libcuda_ && real_dlsym_) fn = real_dlsym_(libcuda_, name);
  return ours(fn) ? NULL : fn;
}

/* slots: [0] default stream semantics, [1] per-thread default stream */
static void *real_launch[2], *real_launch_ex[2];

#define LAUNCH_WRAPPER(NAME, SLOT)                                                                              \
  static CUresult NAME(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                       unsigned shm, CUstream s, void **p, void **x) {                                           \
    mna_launch_fn real = (mna_launch_fn)__atomic_load_n(&real_launch[SLOT], __ATOMIC_ACQUIRE);                 \
    if (!real) return CUDA_ERROR_NOT_INITIALIZED;                                                              \
    return mna_launch(real, f, gx, gy, gz, bx, by, bz, shm, s, p, x);                                          \
  }
LAUNCH_WRAPPER(wrap_launch0, 0)
LAUNCH_WRAPPER(wrap_launch1, 1)

#define LAUNCH_EX_WRAPPER(NAME, SLOT)                                                              \
  static CUresult NAME(const CUlaunchConfig *c, CUfunction f, void **p, void **x) {                \
    mna_launch_ex_fn real = (mna_launch_ex_fn)__atomic_load_n(&real_launch_ex[SLOT], __ATOMIC_ACQUIRE); \
    if (!real) return CUDA_ERROR_NOT_INITIALIZED;                                                 \
    return mna_launch_ex(real, c, f, p, x);                                                       \
  }
LAUNCH_EX_WRAPPER(wrap_launch_ex0, 0)
LAUNCH_EX_WRAPPER(wrap_launch_ex1, 1)

static CUresult wrap_getproc(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st);
static CUresult wrap_getproc_v1(const char *sym, void **pfn, int ver, cuuint64_t flags);
typedef CUresult (*getproc_v1_fn)(const char *, void **, int, cuuint64_t);
static getproc_v1_fn real_getproc_v1_;
MN_EXPORT CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  CUstream, void **, void **);
MN_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);

static int ours(const void *fn) { return fn && (fn == (void *)cuLaunchKernel || fn == (void *)cuLaunchKernelEx); }

/* The wrapper for `sym` (whose real function is `fn`), or `fn` itself. */
static void *wrap(const char *sym, void *fn, int ver, cuuint64_t flags) {
  if (!fn || !sym) return fn;
  if (ours(fn)) { /* see mna_real */
    void *real = mna_real(sym);
    if (!real) return fn;
    fn = real;
  }
  int slot = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? 1 : 0;
  if (strcmp(sym, "cuLaunchKernel") == 0 || strcmp(sym, "cuLaunchKernel_ptsz") == 0) {
    if (strcmp(sym, "cuLaunchKernel_ptsz") == 0) slot = 1;
    __atomic_store_n(&real_launch[slot], fn, __ATOMIC_RELEASE);
    return slot ? (void *)wrap_launch1 : (void *)wrap_launch0;
  }
  if (strcmp(sym, "cuLaunchKernelEx") == 0 || strcmp(sym, "cuLaunchKernelEx_ptsz") == 0) {
    if (strcmp(sym, "cuLaunchKernelEx_ptsz") == 0) slot = 1;
    __atomic_store_n(&real_launch_ex[slot], fn, __ATOMIC_RELEASE);
    return slot ? (void *)wrap_launch_ex1 : (void *)wrap_launch_ex0;
  }
  if ((strcmp(sym, "cuGetProcAddress") == 0 && ver >= 12000) || strcmp(sym, "cuGetProcAddress_v2") == 0) {
    if (!real_getproc_) real_getproc_ = (getproc_fn)fn;
    return (void *)wrap_getproc;
  }
  if (strcmp(sym, "cuGetProcAddress") == 0) { /* the 11.x signature, without the status argument */
    if (!real_getproc_v1_) real_getproc_v1_ = (getproc_v1_fn)fn;
    return (void *)wrap_getproc_v1;
  }
  return fn;
}

static CUresult wrap_getproc(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st) {
  pthread_once(&once_, init_real);
  if (!real_getproc_) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real_getproc_(sym, pfn, ver, flags, st);
  if (r == CUDA_SUCCESS && pfn) *pfn = wrap(sym, *pfn, ver, flags);
  return r;
}

static CUresult wrap_getproc_v1(const char *sym, void **pfn, int ver, cuuint64_t flags) {
  if (!real_getproc_v1_) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = real_getproc_v1_(sym, pfn, ver, flags);
  if (r == CUDA_SUCCESS && pfn) *pfn = wrap(sym, *pfn, ver, flags);
  return r;
}

MN_EXPORT void *dlsym(void *handle, const char *name) {
  dlsym_fn real = real_dlsym();
  if (!real) return NULL;
  void *fn = real(handle, name);
  if (fn && strncmp(name, "cu", 2) == 0) {
    /* the exported "cuGetProcAddress" is the 11.x signature; "_v2" the current one */
    return wrap(name, fn, strcmp(name, "cuGetProcAddress") == 0 ? 11000 : 12000, CU_GET_PROC_ADDRESS_DEFAULT);
  }
  return fn;
}

/* Apps linked against libcuda call these directly. */
MN_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned shm, CUstream s, void **p, void **x) {
  if (!__atomic_load_n(&real_launch[0], __ATOMIC_ACQUIRE)) {
    void *fn = mna_real("cuLaunchKernel");
    if (!fn) return CUDA_ERROR_NOT_INITIALIZED;
    __atomic_store_n(&real_launch[0], fn, __ATOMIC_RELEASE);
  }
  return wrap_launch0(f, gx, gy, gz, bx, by, bz, shm, s, p, x);
}

MN_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **x) {
  if (!__atomic_load_n(&real_launch_ex[0], __ATOMIC_ACQUIRE)) {
    void *fn = mna_real("cuLaunchKernelEx");
    if (!fn) return CUDA_ERROR_NOT_INITIALIZED;
    __atomic_store_n(&real_launch_ex[0], fn, __ATOMIC_RELEASE);
  }
  return wrap_launch_ex0(c, f, p, x);
}
