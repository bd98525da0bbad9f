/* Allocates managed memory and registers host memory through the driver as a CUDA runtime reaches it
 * (dlsym of cuGetProcAddress_v2, then entry points through the cuGetProcAddress it hands out): three
 * managed ranges, the middle one freed; two registered buffers, the second unregistered. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) return 1;
  CUdriverProcAddressQueryResult st;
  PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2"), gpa2 = NULL;
  gpa("cuGetProcAddress", (void **)&gpa2, 12000, 0, &st);
  PFN_cuMemAllocManaged_v6000 alloc = NULL;
  PFN_cuMemFree_v3020 mfree = NULL;
  PFN_cuMemHostRegister_v6050 reg = NULL;
  PFN_cuMemHostUnregister_v4000 unreg = NULL;
  gpa2("cuMemAllocManaged", (void **)&alloc, 13000, 0, &st);
  gpa2("cuMemFree", (void **)&mfree, 13000, 0, &st);
  gpa2("cuMemHostRegister", (void **)&reg, 13000, 0, &st);
  gpa2("cuMemHostUnregister", (void **)&unreg, 13000, 0, &st);
  if (!alloc || !mfree || !reg || !unreg) return 2;
  CUdeviceptr m[3];
  int rc = 0;
  for (int i = 0; i < 3; i++) rc |= alloc(&m[i], 4096u << i, CU_MEM_ATTACH_GLOBAL);
  rc |= mfree(m[1]);
  char *a = malloc(10000), *b = malloc(20000);
  rc |= reg(a, 10000, CU_MEMHOSTREGISTER_DEVICEMAP);
  rc |= reg(b, 20000, CU_MEMHOSTREGISTER_DEVICEMAP);
  rc |= unreg(b);
  printf("rc=%d m0=%llu m2=%llu a=%llu\n", rc, (unsigned long long)m[0], (unsigned long long)m[2],
         (unsigned long long)(uintptr_t)a);
  return 0;
}
