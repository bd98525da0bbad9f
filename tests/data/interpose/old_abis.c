/* Asks cuGetProcAddress for the older ABIs that CUDA 12/13 runtimes still request by version
 * (cuDevicePrimaryCtxRelease/Reset at 7000, cuStreamBeginCapture at 10000, ...), calls each and prints
 * which library the pointer it got lies in: the preloaded library when it was wrapped. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static void *get(PFN_cuGetProcAddress_v12000 gpa, const char *name, int version) {
  void *p = NULL;
  CUdriverProcAddressQueryResult st;
  CUresult r = gpa(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &st);
  Dl_info info;
  const char *lib = p && dladdr(p, &info) && info.dli_fname ? strrchr(info.dli_fname, '/') : NULL;
  printf("%s@%d r=%d in=%s\n", name, version, (int)r, lib ? lib + 1 : "?");
  return p;
}

int main(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) return 1;
  PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
  typedef CUresult (*dev_fn)(CUdevice);
  typedef CUresult (*capture_v1_fn)(CUstream);
  typedef CUresult (*ctx_fn)(CUcontext);
  typedef CUresult (*register_fn)(void *, size_t, unsigned int);
  ((dev_fn)get(gpa, "cuDevicePrimaryCtxRelease", 7000))(0);
  ((dev_fn)get(gpa, "cuDevicePrimaryCtxRelease", 11000))(1);
  ((dev_fn)get(gpa, "cuDevicePrimaryCtxReset", 7000))(2);
  ((capture_v1_fn)get(gpa, "cuStreamBeginCapture", 10000))((CUstream)0x5);
  ((PFN_cuStreamBeginCapture_v10010)get(gpa, "cuStreamBeginCapture", 10010))((CUstream)0x6, CU_STREAM_CAPTURE_MODE_RELAXED);
  ((ctx_fn)get(gpa, "cuCtxDestroy", 2000))((CUcontext)0x7);
  static char buf[64];
  ((register_fn)get(gpa, "cuMemHostRegister", 4000))(buf, sizeof buf, 0);
  return 0;
}
