/* An app for the stand-in driver (fake_libcuda.c) as a CUDA runtime reaches it: entry points through
 * cuGetProcAddress, two device buffers (`data`: argv[1] floats 0, 1, 2, ...; `table`: argv[2] floats,
 * default as many, of 7.0, which the kernel only reads), one launch of fill(data, n), the result copied
 * back and checked. With APP_CRASH_AFTER_LAUNCH set the app dies of SIGSEGV right after the launch; with
 * APP_MORE set it launches twice more: the same instance again, then on a grid of 2 (a second instance). */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 1 << 20;
  int nt = argc > 2 ? atoi(argv[2]) : n;
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) return 1;
  CUdriverProcAddressQueryResult st;
  PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2"), gpa2 = NULL;
  gpa("cuGetProcAddress", (void **)&gpa2, 12000, 0, &st);
  PFN_cuInit_v2000 init = NULL;
  PFN_cuMemAlloc_v3020 alloc = NULL;
  PFN_cuMemcpyHtoD_v3020 htod = NULL;
  PFN_cuMemcpyDtoH_v3020 dtoh = NULL;
  PFN_cuLaunchKernel_v4000 launch = NULL;
  gpa2("cuInit", (void **)&init, 2000, 0, &st);
  gpa2("cuMemAlloc", (void **)&alloc, 3020, 0, &st);
  gpa2("cuMemcpyHtoD", (void **)&htod, 3020, 0, &st);
  gpa2("cuMemcpyDtoH", (void **)&dtoh, 3020, 0, &st);
  gpa2("cuLaunchKernel", (void **)&launch, 4000, 0, &st);
  if (!init || !alloc || !htod || !dtoh || !launch) return 2;
  float *host = malloc((size_t)(n > nt ? n : nt) * sizeof *host);
  if (!host || init(0)) return 3;
  CUdeviceptr data = 0, table = 0;
  if (alloc(&data, (size_t)n * sizeof *host) || alloc(&table, (size_t)nt * sizeof *host)) return 4;
  for (int i = 0; i < nt; i++) host[i] = 7.0f;
  if (htod(table, host, (size_t)nt * sizeof *host)) return 5;
  for (int i = 0; i < n; i++) host[i] = (float)i;
  if (htod(data, host, (size_t)n * sizeof *host)) return 5;
  void *params[] = {&data, &n};
  if (launch((CUfunction)(uintptr_t)0x1000, 1, 1, 1, 256, 1, 1, 0, NULL, params, NULL)) return 6;
  if (getenv("APP_CRASH_AFTER_LAUNCH")) {
    printf("data=%llu table=%llu\n", (unsigned long long)data, (unsigned long long)table);
    fflush(stdout);
    raise(SIGSEGV);
  }
  int launches = 1;
  for (unsigned g = 1; getenv("APP_MORE") && g <= 2; g++, launches++)
    if (launch((CUfunction)(uintptr_t)0x1000, g, 1, 1, 256, 1, 1, 0, NULL, params, NULL)) return 6;
  if (dtoh(host, data, (size_t)n * sizeof *host)) return 7;
  int bad = 0;
  for (int i = 0; i < n; i++) bad += host[i] != (float)i + (float)launches;
  printf("data=%llu table=%llu bad=%d\n", (unsigned long long)data, (unsigned long long)table, bad);
  return bad ? 8 : 0;
}
