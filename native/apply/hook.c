/* libapply on the shared driver-level interposition (native/interpose: the dlsym hook hands out its
 * cuGetProcAddress, which hands out the wrappers of this table). Only the launch entry points are wrapped
 * (cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel); each wrapper knows the real entry point and whether it is the per-thread-default-stream variant.
 * Apps linked with -lcuda that call cuLaunchKernel directly reach the exports at the end. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "../interpose/interpose.h"
#include "apply.h"

#define MN_EXPORT __attribute__((visibility("default")))

static CUresult launch_impl(const mn_ip_slot *slot, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shm, CUstream s, void **p, void **x) {
  return mna_launch((mna_launch_fn)slot->real, mn_ip_stream(slot, s), f, gx, gy, gz, bx, by, bz, shm, s, p, x);
}

static CUresult launch_ex_impl(const mn_ip_slot *slot, const CUlaunchConfig *c, CUfunction f, void **p, void **x) {
  return mna_launch_ex((mna_launch_ex_fn)slot->real, c ? mn_ip_stream(slot, c->hStream) : NULL, c, f, p, x);
}

MN_IP_DEFINE(launch, PFN_cuLaunchKernel_v4000, launch_impl,
             (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
              unsigned int bz, unsigned int shm, CUstream s, void **p, void **x),
             f, gx, gy, gz, bx, by, bz, shm, s, p, x)
MN_IP_DEFINE(launch_ex, PFN_cuLaunchKernelEx_v11060, launch_ex_impl,
             (const CUlaunchConfig *c, CUfunction f, void **p, void **x), c, f, p, x)

static CUresult launch_coop_impl(const mn_ip_slot *slot, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                 unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s, void **p) {
  return mna_launch_coop((mna_launch_coop_fn)slot->real, mn_ip_stream(slot, s), f, gx, gy, gz, bx, by, bz, shm, s, p);
}

MN_IP_DEFINE(launch_coop, PFN_cuLaunchCooperativeKernel_v9000, launch_coop_impl,
             (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
              unsigned int bz, unsigned int shm, CUstream s, void **p),
             f, gx, gy, gz, bx, by, bz, shm, s, p)

mn_ip_entry mn_ip_table[] = {
    MN_IP_ENTRY(launch, "cuLaunchKernel", "", 4000, 0),
    MN_IP_ENTRY(launch_ex, "cuLaunchKernelEx", "", 11060, 0),
    MN_IP_ENTRY(launch_coop, "cuLaunchCooperativeKernel", "", 9000, 0),
};
const size_t mn_ip_table_len = sizeof mn_ip_table / sizeof mn_ip_table[0];

int mn_ip_enabled(void) { return mna_init(); }

void mn_ip_bare(const char *name, int version, const char *why) {
  mna_warn("%s (CUDA %d) is not intercepted (%s): its launches run the original kernels", name, version, why);
}

void mn_ip_no_driver(const char *why) { (void)why; /* the app reports it; nothing to apply without a driver */ }

/* Driver functions libapply calls itself, by their base names (cuGetProcAddress picks the ABI of `version`). */
void *mna_real(const char *name) { return mn_ip_real(name, 12030); }

/* -- apps linked with -lcuda ------------------------------------------------------------------------- */
MN_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned shm, CUstream s, void **p, void **x);
MN_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **x);
MN_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                             unsigned by, unsigned bz, unsigned shm, CUstream s, void **p);

/* The driver's export: the next definition after this library's, or, for a libcuda loaded RTLD_LOCAL, its own
 * (through native/interpose's dlsym: possibly a wrapper, which launch.c's re-entry guard passes through). */
static void *next_export(const char *name, void *self) {
  void *fn = dlsym(RTLD_NEXT, name);
  if (fn && fn != self) return fn;
  void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return NULL;
  fn = dlsym(h, name);
  dlclose(h);
  return fn == self ? NULL : fn;
}

/* next_export, looked up once into *slot */
static void *cached_export(void **slot, const char *name, void *self) {
  void *fn = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (!fn && (fn = next_export(name, self))) __atomic_store_n(slot, fn, __ATOMIC_RELEASE);
  return fn;
}

MN_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned shm, CUstream s, void **p, void **x) {
  static void *real;
  void *fn = cached_export(&real, "cuLaunchKernel", (void *)cuLaunchKernel);
  if (!fn) return CUDA_ERROR_NOT_INITIALIZED;
  if (!mna_init()) return ((mna_launch_fn)fn)(f, gx, gy, gz, bx, by, bz, shm, s, p, x);
  return mna_launch((mna_launch_fn)fn, s, f, gx, gy, gz, bx, by, bz, shm, s, p, x);
}

MN_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **x) {
  static void *real;
  void *fn = cached_export(&real, "cuLaunchKernelEx", (void *)cuLaunchKernelEx);
  if (!fn) return CUDA_ERROR_NOT_INITIALIZED;
  if (!mna_init()) return ((mna_launch_ex_fn)fn)(c, f, p, x);
  return mna_launch_ex((mna_launch_ex_fn)fn, c ? c->hStream : NULL, c, f, p, x);
}

MN_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                             unsigned by, unsigned bz, unsigned shm, CUstream s, void **p) {
  static void *real;
  void *fn = cached_export(&real, "cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel);
  if (!fn) return CUDA_ERROR_NOT_INITIALIZED;
  if (!mna_init()) return ((mna_launch_coop_fn)fn)(f, gx, gy, gz, bx, by, bz, shm, s, p);
  return mna_launch_coop((mna_launch_coop_fn)fn, s, f, gx, gy, gz, bx, by, bz, shm, s, p);
}
