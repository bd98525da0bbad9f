/* An "app" that reaches the driver as cudart does: dlopen libcuda.so.1, dlsym cuGetProcAddress_v2, get
 * cuLaunchKernel through it, launch kernel handle 0x1000 with the grid/block/scalar of argv (with FAKE_APP_COOP
 * set, through cuLaunchCooperativeKernel). */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef CUresult (*getproc)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void **, void **);
typedef CUresult (*launch_coop)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                CUstream, void **);

int main(int argc, char **argv) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) return fprintf(stderr, "no libcuda: %s\n", dlerror()), 2;
  getproc gp = (getproc)dlsym(h, "cuGetProcAddress_v2");
  launch lk = NULL;
  CUdriverProcAddressQueryResult st;
  if (!gp || gp("cuLaunchKernel", (void **)&lk, 12000, 0, &st) != CUDA_SUCCESS || !lk) return 3;
  launch_coop lc = NULL;
  if (getenv("FAKE_APP_COOP") && (gp("cuLaunchCooperativeKernel", (void **)&lc, 12000, 0, &st) != CUDA_SUCCESS || !lc))
    return 3;
  for (int i = 1; i + 2 < argc; i += 3) {
    unsigned grid = (unsigned)atoi(argv[i]), block = (unsigned)atoi(argv[i + 1]);
    int n = atoi(argv[i + 2]);
    void *a = (void *)0x7000, *b = (void *)0x8000, *c = (void *)0x9000;
    void *params[] = {&a, &b, &c, &n};
    CUresult r = lc ? lc((CUfunction)0x1000, grid, 1, 1, block, 1, 1, 0, NULL, params)
                    : lk((CUfunction)0x1000, grid, 1, 1, block, 1, 1, 0, NULL, params, NULL);
    if (r != CUDA_SUCCESS) return 4;
  }
  printf("app done\n");
  return 0;
}
