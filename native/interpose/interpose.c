/* Driver-API interposition: the dlsym/dlopen hooks, the cuGetProcAddress wrappers and the binding of
 * the user library's table entries to slots (interpose.h says why and how). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "interpose.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MN_IP_EXPORT __attribute__((visibility("default")))

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlopen_fn)(const char *, int);

static dlsym_fn real_dlsym_;
static dlopen_fn real_dlopen_;

/* glibc's own dlsym/dlopen by version (dlvsym is not hooked): 2.34 moved them into libc. */
static void *libc_fn(const char *name) {
  static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
  for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
    void *p = dlvsym(RTLD_NEXT, name, versions[i]);
    if (p) return p;
  }
  return NULL;
}

static dlsym_fn real_dlsym(void) {
  dlsym_fn f = __atomic_load_n(&real_dlsym_, __ATOMIC_ACQUIRE);
  if (!f) {
    f = (dlsym_fn)libc_fn("dlsym");
    if (!f) {
      static const char msg[] = "mneme: cannot find glibc's dlsym; aborting\n";
      if (write(2, msg, sizeof msg - 1) < 0) { /* stderr closed */ }
      _exit(127);
    }
    __atomic_store_n(&real_dlsym_, f, __ATOMIC_RELEASE);
  }
  return f;
}

static dlopen_fn real_dlopen(void) {
  dlopen_fn f = __atomic_load_n(&real_dlopen_, __ATOMIC_ACQUIRE);
  if (!f) {
    f = (dlopen_fn)libc_fn("dlopen");
    if (!f) {
      static const char msg[] = "mneme: cannot find glibc's dlopen; aborting\n";
      if (write(2, msg, sizeof msg - 1) < 0) { /* stderr closed */ }
      _exit(127);
    }
    __atomic_store_n(&real_dlopen_, f, __ATOMIC_RELEASE);
  }
  return f;
}

/* ---------------------------------------------------------------------------------------------- */
/* libcuda itself                                                                                 */

static void *libcuda;
static char libcuda_error[512];
static pthread_once_t libcuda_once = PTHREAD_ONCE_INIT;
static PFN_cuGetProcAddress_v12000 gpa_v2;
static PFN_cuGetProcAddress_v11030 gpa_old;

static void load_libcuda(void) {
  libcuda = real_dlopen()("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!libcuda) {
    const char *e = dlerror();
    snprintf(libcuda_error, sizeof libcuda_error, "%s", e ? e : "not found");
    return;
  }
  gpa_v2 = (PFN_cuGetProcAddress_v12000)real_dlsym()(libcuda, "cuGetProcAddress_v2");
  gpa_old = (PFN_cuGetProcAddress_v11030)real_dlsym()(libcuda, "cuGetProcAddress");
}

const char *mn_ip_driver_missing(void) {
  pthread_once(&libcuda_once, load_libcuda);
  return libcuda ? NULL : libcuda_error;
}

/* The driver's cuGetProcAddress, whichever ABI it has; *pfn NULL when not found. */
static CUresult real_gpa(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  *pfn = NULL;
  if (mn_ip_driver_missing()) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = CUDA_ERROR_NOT_FOUND;
  if (gpa_v2) {
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    r = gpa_v2(symbol, pfn, version, flags, &st);
    if (r == CUDA_SUCCESS && st != CU_GET_PROC_ADDRESS_SUCCESS) *pfn = NULL;
  } else if (gpa_old) {
    r = gpa_old(symbol, pfn, version, flags);
  }
  if (r != CUDA_SUCCESS) *pfn = NULL;
  return r;
}

void *mn_ip_real(const char *name, int version) {
  void *fn = NULL;
  real_gpa(name, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
  if (!fn && libcuda) fn = real_dlsym()(libcuda, name);
  return fn;
}

static int max_requested;

int mn_ip_max_requested_version(void) { return __atomic_load_n(&max_requested, __ATOMIC_RELAXED); }

static void note_version(int v) {
  int cur = __atomic_load_n(&max_requested, __ATOMIC_RELAXED);
  while (v > cur && !__atomic_compare_exchange_n(&max_requested, &cur, v, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}

/* ---------------------------------------------------------------------------------------------- */
/* cuGetProcAddress itself: wrapped, so that what it hands out can be wrapped                     */

static CUresult gpa_v2_impl(const mn_ip_slot *s, const char *symbol, void **pfn, int version, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status) {
  CUresult r = ((PFN_cuGetProcAddress_v12000)s->real)(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && (!status || *status == CU_GET_PROC_ADDRESS_SUCCESS)) mn_ip_wrap(symbol, version, flags, pfn);
  return r;
}

static CUresult gpa_old_impl(const mn_ip_slot *s, const char *symbol, void **pfn, int version, cuuint64_t flags) {
  CUresult r = ((PFN_cuGetProcAddress_v11030)s->real)(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS) mn_ip_wrap(symbol, version, flags, pfn);
  return r;
}

MN_IP_DEFINE(gpa_v2, PFN_cuGetProcAddress_v12000, gpa_v2_impl,
             (const char *symbol, void **pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult *st),
             symbol, pfn, version, flags, st)
MN_IP_DEFINE(gpa_old, PFN_cuGetProcAddress_v11030, gpa_old_impl,
             (const char *symbol, void **pfn, int version, cuuint64_t flags), symbol, pfn, version, flags)

static mn_ip_entry own_table[] = {
    MN_IP_ENTRY(gpa_v2, "cuGetProcAddress", "_v2", 12000, 0),
    MN_IP_ENTRY(gpa_old, "cuGetProcAddress", "", 11030, 12000),
};
#define OWN_LEN (sizeof own_table / sizeof own_table[0])

static mn_ip_entry *entry_at(size_t i) { return i < OWN_LEN ? &own_table[i] : &mn_ip_table[i - OWN_LEN]; }
static size_t nentries(void) { return OWN_LEN + mn_ip_table_len; }

/* ---------------------------------------------------------------------------------------------- */
/* binding a driver pointer to a wrapper                                                          */

static pthread_mutex_t bind_mu = PTHREAD_MUTEX_INITIALIZER;

/* 1 when `p` is code of this library (its own exports found by a lookup): never wrapped twice. */
static int ours(void *p) {
  static void *base;
  Dl_info self, it;
  if (!base && dladdr((void *)&mn_ip_wrap, &self)) base = self.dli_fbase;
  return base && dladdr(p, &it) && it.dli_fbase == base;
}

static void *bind(mn_ip_entry *e, void *real, int ptsz, const char *symbol, int version) {
  if (ours(real)) return real;
  void *out = real;
  int full = 0;
  pthread_mutex_lock(&bind_mu);
  size_t i;
  for (i = 0; i < MN_IP_SLOTS; i++) {
    void *cur = __atomic_load_n(&e->slots[i].real, __ATOMIC_ACQUIRE);
    if (cur == real) break;
    if (!cur) {
      e->slots[i].ptsz = ptsz;
      __atomic_store_n(&e->slots[i].real, real, __ATOMIC_RELEASE);
      break;
    }
  }
  if (i < MN_IP_SLOTS) out = e->wrappers[i];
  else full = 1;
  pthread_mutex_unlock(&bind_mu);
  if (full) mn_ip_bare(symbol, version, "more distinct driver entry points for this name than wrappers");
  return out;
}

/* 1 when `p` is the per-thread-default-stream variant of `symbol` (asked with the default flags). */
static int is_ptsz(const char *symbol, int version, void *p) {
  void *legacy = NULL, *pt = NULL;
  real_gpa(symbol, &legacy, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
  if (legacy == p) return 0;
  real_gpa(symbol, &pt, version, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  return pt == p;
}

void mn_ip_wrap(const char *symbol, int version, cuuint64_t flags, void **pfn) {
  if (!symbol || !pfn || !*pfn) return;
  note_version(version);
  mn_ip_entry *hit = NULL;
  int named = 0;
  for (size_t i = 0; i < nentries() && !hit; i++) {
    mn_ip_entry *e = entry_at(i);
    if (strcmp(e->name, symbol) != 0) continue;
    named = 1;
    if (version >= e->min_version && (e->max_version == 0 || version < e->max_version)) hit = e;
  }
  if (!named || !mn_ip_enabled()) return;
  if (!hit) {
    mn_ip_bare(symbol, version, "no wrapper for the ABI of this CUDA version");
    return;
  }
  int ptsz;
  if (flags & CU_GET_PROC_ADDRESS_LEGACY_STREAM) {
    ptsz = 0;
  } else if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
    /* "the per-thread version, or the legacy one where there is none": tell them apart */
    void *legacy = NULL;
    real_gpa(symbol, &legacy, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    ptsz = legacy != *pfn;
  } else {
    ptsz = is_ptsz(symbol, version, *pfn);
  }
  *pfn = bind(hit, *pfn, ptsz, symbol, version);
}

/* An exported symbol looked up by name (dlsym): "<name><suffix>[_ptsz|_ptds]". */
static __attribute__((noinline)) void *wrap_export(const char *symbol, void *p) {
  size_t n = strlen(symbol);
  int ptsz = 0;
  if (n > 5 && (strcmp(symbol + n - 5, "_ptsz") == 0 || strcmp(symbol + n - 5, "_ptds") == 0)) {
    ptsz = 1;
    n -= 5;
  }
  mn_ip_entry *hit = NULL;
  for (size_t i = 0; i < nentries() && !hit; i++) {
    mn_ip_entry *e = entry_at(i);
    size_t ln = strlen(e->name), ls = strlen(e->suffix);
    if (ln + ls == n && strncmp(symbol, e->name, ln) == 0 && strncmp(symbol + ln, e->suffix, ls) == 0) hit = e;
  }
  if (!hit || !mn_ip_enabled()) return p;
  return bind(hit, p, ptsz, symbol, hit->min_version);
}

/* ---------------------------------------------------------------------------------------------- */
/* the hooks                                                                                      */

MN_IP_EXPORT void *dlsym(void *handle, const char *name) {
  dlsym_fn real = real_dlsym();
  __asm__("" : "+r"(name)); /* glibc declares `name` nonnull; keep the NULL check anyway */
  /* RTLD_NEXT depends on who calls: a sibling call leaves the app's return address in place. */
  if (handle == RTLD_NEXT || !name || name[0] != 'c' || name[1] != 'u') return real(handle, name);
  void *p = real(handle, name);
  return p ? wrap_export(name, p) : p;
}

static int is_libcuda(const char *file) {
  const char *b = strrchr(file, '/');
  b = b ? b + 1 : file;
  return strncmp(b, "libcuda.so", 10) == 0;
}

static __attribute__((noinline)) void *open_libcuda(const char *file, int mode) {
  dlopen_fn real = real_dlopen();
  void *h = real(file, mode);
  if (!h) {
    char why[512];
    const char *e = dlerror();
    snprintf(why, sizeof why, "%s", e ? e : "not found");
    mn_ip_no_driver(why);
    h = real(file, mode); /* fails again: the caller's dlerror() sees the loader's own message */
  }
  return h;
}

MN_IP_EXPORT void *dlopen(const char *file, int mode) {
  /* Only libcuda is looked at; everything else keeps its caller (RUNPATH, $ORIGIN) by a sibling call. */
  if (!file || !is_libcuda(file)) return real_dlopen()(file, mode);
  return open_libcuda(file, mode);
}

/* Apps linked with -lcuda that call cuGetProcAddress themselves. */
MN_IP_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                          CUdriverProcAddressQueryResult *status) {
  if (mn_ip_driver_missing() || !gpa_v2) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = gpa_v2(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && (!status || *status == CU_GET_PROC_ADDRESS_SUCCESS)) mn_ip_wrap(symbol, version, flags, pfn);
  return r;
}

MN_IP_EXPORT CUresult mn_ip_export_gpa_old(const char *symbol, void **pfn, int version, cuuint64_t flags)
    __asm__("cuGetProcAddress");
MN_IP_EXPORT CUresult mn_ip_export_gpa_old(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  if (mn_ip_driver_missing() || !gpa_old) return CUDA_ERROR_NOT_INITIALIZED;
  CUresult r = gpa_old(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS) mn_ip_wrap(symbol, version, flags, pfn);
  return r;
}
