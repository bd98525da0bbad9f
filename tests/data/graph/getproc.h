/* What the graph test's apps (probe.c, direct.c) share: the driver reached as a CUDA runtime reaches it
 * (dlopen libcuda.so.1, dlsym cuGetProcAddress_v2, every entry point through the cuGetProcAddress that hands
 * out), and a CHECK that returns 3 from main on a failed call. */
#ifndef MNEME_TEST_GRAPH_GETPROC_H
#define MNEME_TEST_GRAPH_GETPROC_H
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static PFN_cuGetProcAddress_v12000 gpa;

/* 0 once gpa is librecord's (or the driver's) cuGetProcAddress. */
static int open_driver(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) return -1;
  PFN_cuGetProcAddress_v12000 first = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
  CUdriverProcAddressQueryResult st;
  return first && first("cuGetProcAddress", (void **)&gpa, 12000, 0, &st) == CUDA_SUCCESS && gpa ? 0 : -1;
}

static void *get(const char *name, int version) {
  void *p = NULL;
  CUdriverProcAddressQueryResult st;
  if (gpa(name, &p, version, 0, &st) != CUDA_SUCCESS || !p) {
    fprintf(stderr, "no %s\n", name);
    exit(2);
  }
  return p;
}

#define CHECK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { fprintf(stderr, "%s: %d\n", #x, (int)r_); return 3; } } while (0)
#endif
