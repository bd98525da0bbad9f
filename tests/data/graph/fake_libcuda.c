/* A stand-in libcuda.so.1 for the CPU test of librecord's CUDA-graph recording (tests/test_record_graph.py).
 * "Device" memory is host memory: cuMemAddressReserve maps host pages at the asked address, copies are
 * memcpy, and the two kernels run on the host at launch:
 *   0x1000 _Z5scalePffi(float *x, float a, int n): x[i] *= a
 *   0x2000 _Z6offsetPffi(float *y, float b, int n): y[i] += b
 * Graphs are node lists with edges; cuGraphGetNodes answers in reverse creation order, so a caller that runs
 * nodes in that order breaks the dependencies. Stream capture turns launches on the captured stream into
 * kernel nodes. A destroyed graph's nodes are overwritten before they are freed (the recorder must have
 * copied what it needs). cuGraphExecUpdate takes a graph of the same shape. Every call that does work appends a line to $FAKE_LOG. */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static FILE *logf_;
static void logline(const char *fmt, ...) {
  if (!logf_) {
    const char *p = getenv("FAKE_LOG");
    logf_ = fopen(p ? p : "/dev/null", "a");
    if (!logf_) return;
  }
  va_list ap;
  va_start(ap, fmt);
  vfprintf(logf_, fmt, ap);
  va_end(ap);
  fputc('\n', logf_);
  fflush(logf_);
}

/* ---- kernels ---- */
#define SCALE ((CUfunction)0x1000)
#define OFFSET ((CUfunction)0x2000)
static const char *kname(CUfunction f) { return f == SCALE ? "_Z5scalePffi" : f == OFFSET ? "_Z6offsetPffi" : NULL; }

static CUresult run_kernel(CUfunction f, unsigned gx, unsigned bx, void **params) {
  if (!kname(f)) return CUDA_ERROR_INVALID_HANDLE;
  float *x;
  float v;
  int n;
  memcpy(&x, params[0], 8);
  memcpy(&v, params[1], 4);
  memcpy(&n, params[2], 4);
  unsigned char bytes[16];
  memcpy(bytes, &x, 8), memcpy(bytes + 8, &v, 4), memcpy(bytes + 12, &n, 4);
  char hex[33];
  for (int i = 0; i < 16; i++) sprintf(hex + 2 * i, "%02x", bytes[i]);
  logline("launch %s grid=%u block=%u args=%s", kname(f), gx, bx, hex);
  for (int i = 0; i < n; i++) x[i] = f == SCALE ? x[i] * v : x[i] + v;
  return CUDA_SUCCESS;
}

static CUresult f_func_get_name(const char **name, CUfunction f) {
  *name = kname(f);
  return *name ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
static CUresult f_param_info(CUfunction f, size_t i, size_t *off, size_t *size) {
  static const size_t o[] = {0, 8, 12}, s[] = {8, 4, 4};
  if (!kname(f) || i >= 3) return CUDA_ERROR_INVALID_VALUE;
  *off = o[i], *size = s[i];
  return CUDA_SUCCESS;
}

/* ---- graphs ---- */
typedef struct fnode {
  CUgraphNodeType type;
  struct fnode *src; /* in an exec: the node it was instantiated from */
  CUfunction f;
  unsigned g[3], b[3], shm;
  unsigned char args[16];
  void *argp[3];
  CUDA_MEMCPY3D copy;
  CUDA_HOST_NODE_PARAMS host;
  CUDA_MEM_ALLOC_NODE_PARAMS alloc;
} fnode;
typedef struct fgraph {
  fnode *nodes[32];
  int n;
  int from[64], to[64];
  int ne;
} fgraph;

static fnode *node_new(fgraph *g, CUgraphNodeType t, const CUgraphNode *deps, size_t nd) {
  if (g->n == 32) return NULL;
  fnode *n = calloc(1, sizeof *n);
  n->type = t;
  for (size_t d = 0; d < nd; d++)
    for (int i = 0; i < g->n; i++)
      if ((CUgraphNode)g->nodes[i] == deps[d]) g->from[g->ne] = i, g->to[g->ne++] = g->n;
  g->nodes[g->n++] = n;
  return n;
}
static void kernel_fill(fnode *n, CUfunction f, unsigned gx, unsigned bx, void **params) {
  n->f = f, n->g[0] = gx, n->g[1] = n->g[2] = 1, n->b[0] = bx, n->b[1] = n->b[2] = 1;
  memcpy(n->args, params[0], 8), memcpy(n->args + 8, params[1], 4), memcpy(n->args + 12, params[2], 4);
  n->argp[0] = n->args, n->argp[1] = n->args + 8, n->argp[2] = n->args + 12;
}

static CUresult f_graph_create(CUgraph *g, unsigned flags) {
  (void)flags;
  *g = (CUgraph)calloc(1, sizeof(fgraph));
  return CUDA_SUCCESS;
}
static void graph_free(fgraph *g) {
  for (int i = 0; i < g->n; i++) {
    memset(g->nodes[i], 0xab, sizeof *g->nodes[i]);
    free(g->nodes[i]);
  }
  free(g);
}
static CUresult f_graph_destroy(CUgraph g) {
  logline("graph_destroy");
  graph_free((fgraph *)g);
  return CUDA_SUCCESS;
}
static CUresult f_add_kernel(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_KERNEL_NODE_PARAMS_v2 *p) {
  fnode *n = node_new((fgraph *)g, CU_GRAPH_NODE_TYPE_KERNEL, deps, nd);
  if (!n || !kname(p->func)) return CUDA_ERROR_INVALID_VALUE;
  kernel_fill(n, p->func, p->gridDimX, p->blockDimX, p->kernelParams);
  *out = (CUgraphNode)n;
  return CUDA_SUCCESS;
}
static CUresult f_add_memcpy(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_MEMCPY3D *c, CUcontext ctx) {
  (void)ctx;
  fnode *n = node_new((fgraph *)g, CU_GRAPH_NODE_TYPE_MEMCPY, deps, nd);
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  n->copy = *c;
  *out = (CUgraphNode)n;
  return CUDA_SUCCESS;
}
static CUresult f_add_host(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_HOST_NODE_PARAMS *h) {
  fnode *n = node_new((fgraph *)g, CU_GRAPH_NODE_TYPE_HOST, deps, nd);
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  n->host = *h;
  *out = (CUgraphNode)n;
  return CUDA_SUCCESS;
}
static CUresult f_add_mem_alloc(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t nd, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
  fnode *n = node_new((fgraph *)g, CU_GRAPH_NODE_TYPE_MEM_ALLOC, deps, nd);
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  static char pool[1 << 16];
  if (p->bytesize > sizeof pool) return CUDA_ERROR_OUT_OF_MEMORY;
  p->dptr = (CUdeviceptr)(uintptr_t)pool;
  n->alloc = *p;
  *out = (CUgraphNode)n;
  return CUDA_SUCCESS;
}
static CUresult f_get_nodes(CUgraph g, CUgraphNode *nodes, size_t *n) {
  fgraph *G = (fgraph *)g;
  if (nodes && !*n) return CUDA_ERROR_INVALID_VALUE; /* as the H200's driver: an array with a count of 0 */
  if (nodes)
    for (int i = 0; i < G->n && (size_t)i < *n; i++) nodes[i] = (CUgraphNode)G->nodes[G->n - 1 - i];
  *n = (size_t)G->n;
  return CUDA_SUCCESS;
}
static CUresult f_get_edges2(CUgraph g, CUgraphNode *from, CUgraphNode *to, CUgraphEdgeData *data, size_t *n) {
  fgraph *G = (fgraph *)g;
  /* the H200's driver refuses edge arrays with a count of 0: a graph without edges failed to read there */
  if ((from || to) && !*n) return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; from && i < G->ne && (size_t)i < *n; i++) {
    from[i] = (CUgraphNode)G->nodes[G->from[i]];
    to[i] = (CUgraphNode)G->nodes[G->to[i]];
    if (data) memset(&data[i], 0, sizeof data[i]);
  }
  *n = (size_t)G->ne;
  return CUDA_SUCCESS;
}
static CUresult f_get_edges(CUgraph g, CUgraphNode *from, CUgraphNode *to, size_t *n) { return f_get_edges2(g, from, to, NULL, n); }
static CUresult f_node_type(CUgraphNode n, CUgraphNodeType *t) {
  *t = ((fnode *)n)->type;
  return CUDA_SUCCESS;
}
static CUresult f_kernel_params(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v2 *p) {
  fnode *n = (fnode *)node;
  if (n->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
  memset(p, 0, sizeof *p);
  p->func = n->f, p->gridDimX = n->g[0], p->gridDimY = n->g[1], p->gridDimZ = n->g[2];
  p->blockDimX = n->b[0], p->blockDimY = n->b[1], p->blockDimZ = n->b[2], p->sharedMemBytes = n->shm;
  p->kernelParams = n->argp;
  return CUDA_SUCCESS;
}
static CUresult f_memcpy_params(CUgraphNode node, CUDA_MEMCPY3D *c) {
  *c = ((fnode *)node)->copy;
  return CUDA_SUCCESS;
}
static CUresult f_host_params(CUgraphNode node, CUDA_HOST_NODE_PARAMS *h) {
  *h = ((fnode *)node)->host;
  return CUDA_SUCCESS;
}

static CUresult f_mem_alloc_params(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
  if (((fnode *)node)->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
  *p = ((fnode *)node)->alloc;
  return CUDA_SUCCESS;
}

static CUresult do_copy(const CUDA_MEMCPY3D *c) {
  const char *src = c->srcMemoryType == CU_MEMORYTYPE_HOST ? (const char *)c->srcHost : (const char *)(uintptr_t)c->srcDevice;
  char *dst = c->dstMemoryType == CU_MEMORYTYPE_HOST ? (char *)c->dstHost : (char *)(uintptr_t)c->dstDevice;
  size_t rows = (c->Height ? c->Height : 1) * (c->Depth ? c->Depth : 1);
  for (size_t r = 0; r < rows; r++)
    memcpy(dst + c->dstXInBytes + (c->dstY + r) * c->dstPitch, src + c->srcXInBytes + (c->srcY + r) * c->srcPitch, c->WidthInBytes);
  return CUDA_SUCCESS;
}
static CUresult f_memcpy3d_async(const CUDA_MEMCPY3D *c, CUstream s) {
  (void)s;
  logline("memcpy3d bytes=%zu", c->WidthInBytes * (c->Height ? c->Height : 1));
  return do_copy(c);
}

static CUresult run_node(fnode *n) {
  switch (n->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      /* the driver's own launch of a node: not through cuLaunchKernel, so not seen by the recorder */
      float *x;
      float v;
      int cnt;
      memcpy(&x, n->args, 8), memcpy(&v, n->args + 8, 4), memcpy(&cnt, n->args + 12, 4);
      for (int i = 0; i < cnt; i++) x[i] = n->f == SCALE ? x[i] * v : x[i] + v;
      return CUDA_SUCCESS;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: return do_copy(&n->copy);
    case CU_GRAPH_NODE_TYPE_HOST: n->host.fn(n->host.userData); return CUDA_SUCCESS;
    default: return CUDA_SUCCESS;
  }
}

static int execs;
static CUresult f_instantiate(CUgraphExec *e, CUgraph g, unsigned long long flags) {
  (void)flags;
  fgraph *G = (fgraph *)g, *x = calloc(1, sizeof *x);
  *x = *G;
  for (int i = 0; i < G->n; i++) {
    x->nodes[i] = malloc(sizeof(fnode));
    *x->nodes[i] = *G->nodes[i];
    x->nodes[i]->src = G->nodes[i];
    for (int a = 0; a < 3; a++) x->nodes[i]->argp[a] = x->nodes[i]->args + (a ? 4 + 4 * a : 0);
  }
  *e = (CUgraphExec)x;
  logline("instantiate exec=%d nodes=%d", ++execs, G->n);
  return CUDA_SUCCESS;
}
static CUresult f_exec_destroy(CUgraphExec e) {
  logline("exec_destroy");
  graph_free((fgraph *)e);
  return CUDA_SUCCESS;
}
static CUresult f_graph_launch(CUgraphExec e, CUstream s) {
  (void)s;
  fgraph *x = (fgraph *)e;
  logline("graph_launch nodes=%d", x->n);
  for (int i = 0; i < x->n; i++) run_node(x->nodes[i]); /* creation order is topological */
  return CUDA_SUCCESS;
}
static CUresult f_exec_kernel_set(CUgraphExec e, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v2 *p) {
  fgraph *x = (fgraph *)e;
  for (int i = 0; i < x->n; i++)
    if ((CUgraphNode)x->nodes[i]->src == node) {
      kernel_fill(x->nodes[i], p->func, p->gridDimX, p->blockDimX, p->kernelParams);
      logline("exec_kernel_set");
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_VALUE;
}

/* Same topology: the exec takes the graph's parameters node by node; its nodes keep their identity. */
static CUresult f_exec_update(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info) {
  fgraph *x = (fgraph *)e, *G = (fgraph *)g;
  if (info) memset(info, 0, sizeof *info);
  if (x->n != G->n) return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  for (int i = 0; i < x->n; i++) {
    fnode *src = x->nodes[i]->src;
    *x->nodes[i] = *G->nodes[i];
    x->nodes[i]->src = src;
    for (int a = 0; a < 3; a++) x->nodes[i]->argp[a] = x->nodes[i]->args + (a ? 4 + 4 * a : 0);
  }
  logline("exec_update");
  return CUDA_SUCCESS;
}

/* ---- streams and capture ---- */
static CUstream capturing;
static fgraph *capture_graph;
static CUresult f_begin_capture(CUstream s, CUstreamCaptureMode mode) {
  (void)mode;
  capturing = s;
  capture_graph = calloc(1, sizeof *capture_graph);
  logline("begin_capture");
  return CUDA_SUCCESS;
}
static CUresult f_end_capture(CUstream s, CUgraph *g) {
  if (s != capturing || !capture_graph) return CUDA_ERROR_ILLEGAL_STATE;
  *g = (CUgraph)capture_graph;
  capture_graph = NULL;
  capturing = NULL;
  logline("end_capture");
  return CUDA_SUCCESS;
}
static CUresult f_is_capturing(CUstream s, CUstreamCaptureStatus *st) {
  *st = capture_graph && s == capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
static CUresult f_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shm, CUstream s, void **params, void **extra) {
  (void)gy, (void)gz, (void)by, (void)bz, (void)shm, (void)extra;
  if (capture_graph && s == capturing) {
    CUgraphNode last = capture_graph->n ? (CUgraphNode)capture_graph->nodes[capture_graph->n - 1] : NULL;
    fnode *n = node_new(capture_graph, CU_GRAPH_NODE_TYPE_KERNEL, &last, last ? 1 : 0);
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    kernel_fill(n, f, gx, bx, params);
    logline("captured %s", kname(f));
    return CUDA_SUCCESS;
  }
  return run_kernel(f, gx, bx, params);
}
static CUresult f_host_func(CUstream s, CUhostFn fn, void *data) {
  (void)s;
  logline("host_func");
  fn(data);
  return CUDA_SUCCESS;
}

/* ---- memory ---- */
static CUresult f_reserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
  (void)align, (void)flags;
  void *m = mmap((void *)(uintptr_t)addr, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | (addr ? MAP_FIXED_NOREPLACE : 0), -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = (CUdeviceptr)(uintptr_t)m;
  return CUDA_SUCCESS;
}
static CUresult f_addr_free(CUdeviceptr p, size_t size) { return munmap((void *)(uintptr_t)p, size) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; }
static CUresult f_granularity(size_t *g, const CUmemAllocationProp *p, CUmemAllocationGranularity_flags o) {
  (void)p, (void)o;
  *g = 2u << 20;
  return CUDA_SUCCESS;
}
static unsigned long long handles;
static CUresult f_create(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *p, unsigned long long f) {
  (void)size, (void)p, (void)f;
  *h = ++handles;
  return CUDA_SUCCESS;
}
static CUresult f_ok_h(CUmemGenericAllocationHandle h) { (void)h; return CUDA_SUCCESS; }
static CUresult f_map(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h, unsigned long long f) {
  (void)p, (void)size, (void)off, (void)h, (void)f;
  return CUDA_SUCCESS;
}
static CUresult f_unmap(CUdeviceptr p, size_t size) { (void)p, (void)size; return CUDA_SUCCESS; }
static CUresult f_set_access(CUdeviceptr p, size_t size, const CUmemAccessDesc *d, size_t n) {
  (void)p, (void)size, (void)d, (void)n;
  return CUDA_SUCCESS;
}
static CUresult f_mem_alloc(CUdeviceptr *p, size_t n) {
  void *m = calloc(1, n ? n : 1);
  *p = (CUdeviceptr)(uintptr_t)m;
  return m ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_mem_free(CUdeviceptr p) { free((void *)(uintptr_t)p); return CUDA_SUCCESS; }
static CUresult f_alloc_pitch(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e) {
  (void)e;
  *pitch = w;
  return f_mem_alloc(p, w * h);
}
static CUresult f_dtoh(void *dst, CUdeviceptr src, size_t n) { memcpy(dst, (void *)(uintptr_t)src, n); return CUDA_SUCCESS; }
static CUresult f_htod(CUdeviceptr dst, const void *src, size_t n) { memcpy((void *)(uintptr_t)dst, src, n); return CUDA_SUCCESS; }
static CUresult f_host_alloc(void **p, size_t n, unsigned f) {
  (void)f;
  *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_free_host(void *p) { free(p); return CUDA_SUCCESS; }
static CUresult f_host_dev_ptr(CUdeviceptr *d, void *p, unsigned f) {
  (void)f;
  *d = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}
static CUresult f_register(void *p, size_t n, unsigned f) { (void)p, (void)n, (void)f; return CUDA_SUCCESS; }
static CUresult f_unregister(void *p) { (void)p; return CUDA_SUCCESS; }
static CUresult f_get_global(CUdeviceptr *p, size_t *n, void *lib, const char *name) {
  (void)p, (void)n, (void)lib, (void)name;
  return CUDA_ERROR_NOT_FOUND;
}

/* ---- context, device, events ---- */
static CUresult f_init(unsigned f) { (void)f; return CUDA_SUCCESS; }
static CUresult f_ctx_device(CUdevice *d) { *d = 0; return CUDA_SUCCESS; }
static CUresult f_ok(void) { return CUDA_SUCCESS; }
static CUresult f_ok_s(CUstream s) { (void)s; return CUDA_SUCCESS; }
static CUresult f_err_string(CUresult r, const char **s) { (void)r; *s = "fake error"; return CUDA_SUCCESS; }
static CUresult f_dev_name(char *name, int len, CUdevice d) { (void)d; snprintf(name, (size_t)len, "Fake GPU"); return CUDA_SUCCESS; }
static CUresult f_dev_attr(int *v, CUdevice_attribute a, CUdevice d) {
  (void)d;
  *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? 9 : 0;
  return CUDA_SUCCESS;
}
static CUresult f_total_mem(size_t *n, CUdevice d) { (void)d; *n = 1ull << 34; return CUDA_SUCCESS; }
static CUresult f_uuid(CUuuid *u, CUdevice d) { (void)d; memset(u, 7, sizeof *u); return CUDA_SUCCESS; }
static CUresult f_version(int *v) { *v = 13000; return CUDA_SUCCESS; }
static CUresult f_event_create(CUevent *e, unsigned f) { (void)f; *e = (CUevent)malloc(8); return CUDA_SUCCESS; }
static CUresult f_event_destroy(CUevent e) { free(e); return CUDA_SUCCESS; }
static CUresult f_event_record(CUevent e, CUstream s) { (void)e, (void)s; return CUDA_SUCCESS; }
static CUresult f_event_q(CUevent e) { (void)e; return CUDA_SUCCESS; }
static CUresult f_elapsed(float *ms, CUevent a, CUevent b) { (void)a, (void)b; *ms = 0.001f; return CUDA_SUCCESS; }
static CUresult f_wait_event(CUstream s, CUevent e, unsigned f) { (void)s, (void)e, (void)f; logline("wait_event"); return CUDA_SUCCESS; }

CUresult gpa_old(const char *symbol, void **pfn, int version, cuuint64_t flags) __asm__("cuGetProcAddress");

static const struct { const char *name; void *fn; } table[] = {
    {"cuInit", (void *)f_init},
    {"cuGetErrorString", (void *)f_err_string},
    {"cuCtxGetDevice", (void *)f_ctx_device},
    {"cuCtxSynchronize", (void *)f_ok},
    {"cuStreamSynchronize", (void *)f_ok_s},
    {"cuStreamIsCapturing", (void *)f_is_capturing},
    {"cuMemcpyDtoH", (void *)f_dtoh},
    {"cuMemcpyHtoD", (void *)f_htod},
    {"cuEventCreate", (void *)f_event_create},
    {"cuEventDestroy", (void *)f_event_destroy},
    {"cuEventRecord", (void *)f_event_record},
    {"cuEventQuery", (void *)f_event_q},
    {"cuEventSynchronize", (void *)f_event_q},
    {"cuEventElapsedTime", (void *)f_elapsed},
    {"cuLaunchHostFunc", (void *)f_host_func},
    {"cuMemHostRegister", (void *)f_register},
    {"cuMemHostUnregister", (void *)f_unregister},
    {"cuMemHostAlloc", (void *)f_host_alloc},
    {"cuMemHostGetDevicePointer", (void *)f_host_dev_ptr},
    {"cuMemFreeHost", (void *)f_free_host},
    {"cuMemAllocPitch", (void *)f_alloc_pitch},
    {"cuMemAlloc", (void *)f_mem_alloc},
    {"cuMemFree", (void *)f_mem_free},
    {"cuLibraryGetGlobal", (void *)f_get_global},
    {"cuModuleGetGlobal", (void *)f_get_global},
    {"cuDeviceGetName", (void *)f_dev_name},
    {"cuDeviceGetAttribute", (void *)f_dev_attr},
    {"cuDeviceTotalMem", (void *)f_total_mem},
    {"cuDeviceGetUuid", (void *)f_uuid},
    {"cuDriverGetVersion", (void *)f_version},
    {"cuMemGetAllocationGranularity", (void *)f_granularity},
    {"cuMemAddressReserve", (void *)f_reserve},
    {"cuMemAddressFree", (void *)f_addr_free},
    {"cuMemCreate", (void *)f_create},
    {"cuMemRelease", (void *)f_ok_h},
    {"cuMemMap", (void *)f_map},
    {"cuMemUnmap", (void *)f_unmap},
    {"cuMemSetAccess", (void *)f_set_access},
    {"cuFuncGetName", (void *)f_func_get_name},
    {"cuFuncGetParamInfo", (void *)f_param_info},
    {"cuLaunchKernel", (void *)f_launch},
    {"cuStreamBeginCapture", (void *)f_begin_capture},
    {"cuStreamEndCapture", (void *)f_end_capture},
    {"cuStreamWaitEvent", (void *)f_wait_event},
    {"cuMemcpy3DAsync", (void *)f_memcpy3d_async},
    {"cuGraphCreate", (void *)f_graph_create},
    {"cuGraphDestroy", (void *)f_graph_destroy},
    {"cuGraphAddKernelNode", (void *)f_add_kernel},
    {"cuGraphAddMemcpyNode", (void *)f_add_memcpy},
    {"cuGraphAddHostNode", (void *)f_add_host},
    {"cuGraphAddMemAllocNode", (void *)f_add_mem_alloc},
    {"cuGraphGetNodes", (void *)f_get_nodes},
    {"cuGraphNodeGetType", (void *)f_node_type},
    {"cuGraphKernelNodeGetParams", (void *)f_kernel_params},
    {"cuGraphMemcpyNodeGetParams", (void *)f_memcpy_params},
    {"cuGraphHostNodeGetParams", (void *)f_host_params},
    {"cuGraphMemAllocNodeGetParams", (void *)f_mem_alloc_params},
    {"cuGraphInstantiate", (void *)f_instantiate},
    {"cuGraphInstantiateWithFlags", (void *)f_instantiate},
    {"cuGraphExecDestroy", (void *)f_exec_destroy},
    {"cuGraphLaunch", (void *)f_graph_launch},
    {"cuGraphExecKernelNodeSetParams", (void *)f_exec_kernel_set},
    {"cuGraphExecUpdate", (void *)f_exec_update},
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  (void)flags;
  void *p = NULL;
  if (!strcmp(symbol, "cuGetProcAddress")) p = version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)gpa_old;
  else if (!strcmp(symbol, "cuGraphGetEdges")) p = version >= 12030 ? (void *)f_get_edges2 : (void *)f_get_edges;
  for (size_t i = 0; !p && i < sizeof table / sizeof table[0]; i++)
    if (!strcmp(symbol, table[i].name)) p = table[i].fn;
  *pfn = p;
  if (status) *status = p ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
CUresult gpa_old(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
CUresult cuInit(unsigned int flags) { return f_init(flags); }
