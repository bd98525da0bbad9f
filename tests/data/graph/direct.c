/* Direct launches (and one-node captured graphs) against the stand-in driver of fake_libcuda.c, reached as
 * a CUDA runtime reaches the driver (dlsym of cuGetProcAddress_v2, then its entry points). Each argument
 * is one step:
 *   host      a 16 KiB pinned host allocation (the recorder's pinned region comes alive)
 *   s:V:N     scale(x, V, N) launched on a stream          x, y: 4096 floats each
 *   o:V:N     offset(y, V, N) launched on a stream
 *   g:V:N     scale(x, V, N) captured on the stream, instantiated, the graph destroyed, launched once
 * Prints "direct done" when every step succeeded. */
#define _GNU_SOURCE
#include "getproc.h"

#define CAP 4096

int main(int argc, char **argv) {
  if (open_driver()) return 1;
  PFN_cuInit_v2000 init = get("cuInit", 2000);
  PFN_cuMemAlloc_v3020 alloc = get("cuMemAlloc", 3020);
  PFN_cuMemHostAlloc_v2020 host_alloc = get("cuMemHostAlloc", 2020);
  PFN_cuLaunchKernel_v4000 klaunch = get("cuLaunchKernel", 4000);
  PFN_cuStreamBeginCapture_v10010 begin = get("cuStreamBeginCapture", 10010);
  PFN_cuStreamEndCapture_v10000 end = get("cuStreamEndCapture", 10000);
  PFN_cuGraphInstantiateWithFlags_v11040 inst = get("cuGraphInstantiate", 12000);
  PFN_cuGraphDestroy_v10000 gdestroy = get("cuGraphDestroy", 10000);
  PFN_cuGraphLaunch_v10000 glaunch = get("cuGraphLaunch", 10000);
  PFN_cuGraphExecDestroy_v10000 xdestroy = get("cuGraphExecDestroy", 10000);
  CHECK(init(0));
  CUdeviceptr x, y;
  CHECK(alloc(&x, CAP * 4));
  CHECK(alloc(&y, CAP * 4));
  CUstream s = (CUstream)0x77;
  for (int i = 1; i < argc; i++) {
    char what = argv[i][0];
    if (what == 'h') {
      void *p = NULL;
      CHECK(host_alloc(&p, 16 << 10, 0));
      continue;
    }
    float v = 0;
    int n = 0;
    if (sscanf(argv[i], "%*c:%f:%d", &v, &n) != 2 || n < 0 || n > CAP) return fprintf(stderr, "bad step %s\n", argv[i]), 4;
    CUdeviceptr *buf = what == 'o' ? &y : &x;
    void *params[] = {buf, &v, &n};
    CUfunction f = (CUfunction)(uintptr_t)(what == 'o' ? 0x2000 : 0x1000);
    if (what != 'g') {
      CHECK(klaunch(f, 1, 1, 1, 64, 1, 1, 0, s, params, NULL));
      continue;
    }
    CUgraph g;
    CUgraphExec e;
    CHECK(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(klaunch(f, 1, 1, 1, 64, 1, 1, 0, s, params, NULL));
    CHECK(end(s, &g));
    CHECK(inst(&e, g, 0));
    CHECK(gdestroy(g));
    CHECK(glaunch(e, s));
    CHECK(xdestroy(e));
  }
  printf("direct done\n");
  return 0;
}
