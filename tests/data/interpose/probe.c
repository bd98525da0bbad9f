/* Reaches the driver the way every CUDA runtime does (dlopen, dlsym of cuGetProcAddress_v2, then
 * entry points through the cuGetProcAddress it hands out) and prints what it got. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>

int main(void) {
  printf("rtld_next_from_app=%d\n", dlsym(RTLD_NEXT, "dlsym") == (void *)&dlsym);
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) {
    printf("no libcuda\n");
    return 0;
  }
  CUdriverProcAddressQueryResult st;
  PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
  PFN_cuGetProcAddress_v12000 gpa2 = NULL;
  gpa("cuGetProcAddress", (void **)&gpa2, 12000, 0, &st);
  PFN_cuInit_v2000 init = NULL;
  gpa2("cuInit", (void **)&init, 13000, 0, &st);
  printf("cuInit=%d\n", (int)init(0));
  PFN_cuLaunchKernel_v4000 legacy = NULL, ptsz = NULL, dflt = NULL;
  gpa2("cuLaunchKernel", (void **)&legacy, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st);
  gpa2("cuLaunchKernel", (void **)&ptsz, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
  gpa2("cuLaunchKernel", (void **)&dflt, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
  printf("legacy_is_default=%d legacy_is_ptsz=%d\n", legacy == dflt, legacy == ptsz);
  legacy(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
  ptsz(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
  PFN_cuDriverGetVersion_v2020 ver = NULL;
  gpa2("cuDriverGetVersion", (void **)&ver, 1000, 0, &st); /* older than the wrapper's ABI: left bare */
  int v = 0;
  ver(&v);
  printf("version=%d\n", v);
  PFN_cuGetProcAddress_v11030 gpa_old = NULL;
  gpa("cuGetProcAddress", (void **)&gpa_old, 11030, 0, &st);
  PFN_cuInit_v2000 init_old = NULL;
  gpa_old("cuInit", (void **)&init_old, 11030, 0);
  printf("old_abi_cuInit=%d\n", (int)init_old(0));
  PFN_cuLaunchKernel_v4000 by_name = (PFN_cuLaunchKernel_v4000)dlsym(h, "cuLaunchKernel_ptsz");
  by_name(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
  return 0;
}
