/* Builds, instantiates and launches CUDA graphs through the driver as a CUDA runtime reaches it (dlsym of
 * cuGetProcAddress_v2, then entry points through the cuGetProcAddress it hands out), against the stand-in
 * driver of fake_libcuda.c:
 *   graph A (cuGraphAddKernelNode): scale(x, 2) -> memcpy x to y -> offset(y, 1), plus a host node after
 *     offset; instantiated, the source graph destroyed, launched 3 times; then offset's b set to 5 with
 *     cuGraphExecKernelNodeSetParams and launched twice more; then cuGraphExecUpdate from a graph of the
 *     same shape with scale(x, 3) and offset(y, 7), launched twice; then offset's b set to 9 through the
 *     original graph's node handle, launched once;
 *   graph B (stream capture): scale(z, 3) captured on a stream, launched twice;
 *   graph C: offset(w, 1) and a memory allocation node, launched twice; with PROBE_GRAPHMEM set, then
 *     scale(the graph's allocation, 4) on a stream, as cuda-samples graphMemoryNodes' validateGPU reads
 *     the graph's memory outside it.
 * Prints the results and the host-computed expectations. FAKE_LOG (the fake's call log) is marked with the
 * phases ("mark ...") so the test can read which calls each launch made. */
#define _GNU_SOURCE
#include <string.h>

#include "getproc.h"

#define N 64
static void mark(const char *what) {
  FILE *f = fopen(getenv("FAKE_LOG"), "a");
  if (f) fprintf(f, "mark %s\n", what), fclose(f);
}
/* Marks the log with the phase ("A0", ...), then launches the exec. */
static CUresult launch_marked(PFN_cuGraphLaunch_v10000 launch, CUgraphExec e, CUstream s, const char *phase, int l) {
  char m[32];
  snprintf(m, sizeof m, "%s%d", phase, l);
  mark(m);
  return launch(e, s);
}
static int host_calls;
static void CUDA_CB on_host(void *data) { (*(int *)data)++; }


int main(void) {
  if (open_driver()) return 1;
  PFN_cuInit_v2000 init = get("cuInit", 2000);
  PFN_cuMemAlloc_v3020 alloc = get("cuMemAlloc", 3020);
  PFN_cuMemcpyHtoD_v3020 htod = get("cuMemcpyHtoD", 3020);
  PFN_cuMemcpyDtoH_v3020 dtoh = get("cuMemcpyDtoH", 3020);
  PFN_cuGraphCreate_v10000 gcreate = get("cuGraphCreate", 10000);
  PFN_cuGraphDestroy_v10000 gdestroy = get("cuGraphDestroy", 10000);
  PFN_cuGraphAddKernelNode_v12000 addk = get("cuGraphAddKernelNode", 12000);
  PFN_cuGraphAddMemcpyNode_v10000 addc = get("cuGraphAddMemcpyNode", 10000);
  PFN_cuGraphAddHostNode_v10000 addh = get("cuGraphAddHostNode", 10000);
  PFN_cuGraphAddMemAllocNode_v11040 adda = get("cuGraphAddMemAllocNode", 11040);
  PFN_cuGraphInstantiateWithFlags_v11040 inst = get("cuGraphInstantiateWithFlags", 11040);
  PFN_cuGraphInstantiateWithFlags_v11040 inst12 = get("cuGraphInstantiate", 12000); /* the same ABI from 12.0 */
  PFN_cuGraphExecDestroy_v10000 xdestroy = get("cuGraphExecDestroy", 10000);
  PFN_cuGraphLaunch_v10000 launch = get("cuGraphLaunch", 10000);
  PFN_cuGraphExecKernelNodeSetParams_v12000 kset = get("cuGraphExecKernelNodeSetParams", 12000);
  PFN_cuGraphExecUpdate_v12000 xupdate = get("cuGraphExecUpdate", 12000);
  PFN_cuStreamBeginCapture_v10010 begin = get("cuStreamBeginCapture", 10010);
  PFN_cuStreamEndCapture_v10000 end = get("cuStreamEndCapture", 10000);
  PFN_cuLaunchKernel_v4000 klaunch = get("cuLaunchKernel", 4000);
  CHECK(init(0));

  CUdeviceptr x, y, z, w;
  CHECK(alloc(&x, N * 4));
  CHECK(alloc(&y, N * 4));
  CHECK(alloc(&z, N * 4));
  CHECK(alloc(&w, N * 4));
  float hx[N], hz[N], hw[N], ex[N], ey[N], ez[N], ew[N];
  for (int i = 0; i < N; i++) hx[i] = ex[i] = (float)i, hz[i] = ez[i] = (float)(i + 1), hw[i] = ew[i] = (float)(2 * i);
  CHECK(htod(x, hx, sizeof hx));
  CHECK(htod(z, hz, sizeof hz));
  CHECK(htod(w, hw, sizeof hw));
  CUstream s = (CUstream)0x77;
  int n = N;

  /* graph A */
  CUgraph g;
  CHECK(gcreate(&g, 0));
  float a = 2.0f, b = 1.0f;
  void *pa[] = {&x, &a, &n}, *pb[] = {&y, &b, &n};
  CUDA_KERNEL_NODE_PARAMS_v2 kp;
  memset(&kp, 0, sizeof kp);
  kp.func = (CUfunction)0x1000, kp.gridDimX = 1, kp.gridDimY = 1, kp.gridDimZ = 1;
  kp.blockDimX = N, kp.blockDimY = 1, kp.blockDimZ = 1, kp.kernelParams = pa;
  CUgraphNode ks, kc, ko, kh;
  CHECK(addk(&ks, g, NULL, 0, &kp));
  CUDA_MEMCPY3D cp;
  memset(&cp, 0, sizeof cp);
  cp.srcMemoryType = CU_MEMORYTYPE_DEVICE, cp.srcDevice = x, cp.srcPitch = N * 4;
  cp.dstMemoryType = CU_MEMORYTYPE_DEVICE, cp.dstDevice = y, cp.dstPitch = N * 4;
  cp.WidthInBytes = N * 4, cp.Height = 1, cp.Depth = 1;
  CHECK(addc(&kc, g, &ks, 1, &cp, NULL));
  kp.func = (CUfunction)0x2000, kp.kernelParams = pb;
  CHECK(addk(&ko, g, &kc, 1, &kp));
  CUDA_HOST_NODE_PARAMS hp = {on_host, &host_calls};
  CHECK(addh(&kh, g, &ko, 1, &hp));
  CUgraphExec ea;
  CHECK(inst(&ea, g, 0));
  CUdeviceptr xs = x, ys = y;
  a = -7.0f, b = -7.0f, x = y = 0; /* the graph holds copies: the app's variables may change */
  CHECK(gdestroy(g));
  float lasta = 2.0f, lastb = 1.0f, nb = 5.0f;
  void *pn[] = {&ys, &nb, &n};
  for (int l = 0; l < 8; l++) {
    if (l == 3) {
      mark("update");
      kp.func = (CUfunction)0x2000, kp.kernelParams = pn;
      CHECK(kset(ea, ko, &kp));
      lastb = nb;
    }
    if (l == 5) { /* the same shape from another graph */
      mark("execupdate");
      CUgraph g2;
      CHECK(gcreate(&g2, 0));
      float a2 = 3.0f, b2 = 7.0f;
      void *qa[] = {&xs, &a2, &n}, *qb[] = {&ys, &b2, &n};
      CUgraphNode n1, n2, n3, n4;
      kp.func = (CUfunction)0x1000, kp.kernelParams = qa;
      CHECK(addk(&n1, g2, NULL, 0, &kp));
      cp.srcDevice = xs, cp.dstDevice = ys;
      CHECK(addc(&n2, g2, &n1, 1, &cp, NULL));
      kp.func = (CUfunction)0x2000, kp.kernelParams = qb;
      CHECK(addk(&n3, g2, &n2, 1, &kp));
      CHECK(addh(&n4, g2, &n3, 1, &hp));
      CUgraphExecUpdateResultInfo info;
      CHECK(xupdate(ea, g2, &info));
      CHECK(gdestroy(g2));
      lasta = 3.0f, lastb = 7.0f;
    }
    if (l == 7) { /* the original graph's node still names the node */
      mark("update2");
      nb = 9.0f;
      kp.func = (CUfunction)0x2000, kp.kernelParams = pn;
      CHECK(kset(ea, ko, &kp));
      lastb = nb;
    }
    CHECK(launch_marked(launch, ea, s, "A", l));
    for (int i = 0; i < N; i++) ex[i] *= lasta, ey[i] = ex[i] + lastb;
  }
  CHECK(xdestroy(ea));

  /* graph B: captured */
  float c = 3.0f;
  void *pc[] = {&z, &c, &n};
  mark("capture");
  CHECK(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(klaunch((CUfunction)0x1000, 1, 1, 1, N, 1, 1, 0, s, pc, NULL));
  CHECK(end(s, &g));
  CUgraphExec eb;
  CHECK(inst12(&eb, g, 0));
  CHECK(gdestroy(g));
  for (int l = 0; l < 2; l++) {
    CHECK(launch_marked(launch, eb, s, "B", l));
    for (int i = 0; i < N; i++) ez[i] *= 3.0f;
  }
  CHECK(xdestroy(eb));

  /* graph C: a memory allocation node */
  CHECK(gcreate(&g, 0));
  float d = 1.0f;
  void *pd[] = {&w, &d, &n};
  kp.func = (CUfunction)0x2000, kp.kernelParams = pd;
  CUgraphNode kw, ka;
  CHECK(addk(&kw, g, NULL, 0, &kp));
  CUDA_MEM_ALLOC_NODE_PARAMS ap;
  memset(&ap, 0, sizeof ap);
  ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ap.bytesize = 256;
  CHECK(adda(&ka, g, &kw, 1, &ap));
  CUgraphExec ec;
  CHECK(inst(&ec, g, 0));
  CHECK(gdestroy(g));
  for (int l = 0; l < 2; l++) {
    CHECK(launch_marked(launch, ec, s, "C", l));
    for (int i = 0; i < N; i++) ew[i] += 1.0f;
  }
  CHECK(xdestroy(ec));
  if (getenv("PROBE_GRAPHMEM")) {
    float four = 4.0f; /* a new instance: pointers are masked from the key */
    void *pg[] = {&ap.dptr, &four, &n};
    mark("graphmem");
    CHECK(klaunch((CUfunction)0x1000, 1, 1, 1, N, 1, 1, 0, s, pg, NULL));
    printf("graphmem=%llu ", (unsigned long long)ap.dptr);
  }
  mark("end");

  CHECK(dtoh(hx, xs, sizeof hx));
  float hy[N];
  CHECK(dtoh(hy, ys, sizeof hy));
  CHECK(dtoh(hz, z, sizeof hz));
  CHECK(dtoh(hw, w, sizeof hw));
  int bad = 0;
  for (int i = 0; i < N; i++) bad += hx[i] != ex[i] || hy[i] != ey[i] || hz[i] != ez[i] || hw[i] != ew[i];
  printf("bad=%d host_calls=%d x=%llu y=%llu z=%llu w=%llu\n", bad, host_calls, (unsigned long long)xs,
         (unsigned long long)ys, (unsigned long long)z, (unsigned long long)w);
  return 0;
}
