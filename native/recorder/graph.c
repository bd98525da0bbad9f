/* CUDA graphs, part one: plans (graphexec.c: exec updates and launches). A graph's kernels run without
 * passing through the launch entry points, so at
 * instantiation (every cuGraphInstantiate* ABI) the recorder keeps a *plan* of the graph: its nodes in a
 * topological order with their parameters deep-copied (kernel arguments by the kernel's parameter
 * layout: apps destroy the source graph right after instantiating), child graphs as plans of their own.
 * Exec updates (cuGraphExec*SetParams, cuGraphExecNodeSetParams, cuGraphNodeSetEnabled, cuGraphExecUpdate)
 * refresh the plan; cuGraphExecDestroy frees it.
 *
 * A cuGraphLaunch of a plan with a selected kernel not recorded yet runs the plan node by node on the
 * launch stream, in its topological order (one legal execution of the graph): each kernel node through
 * the recorder's launch path, so it is recorded like a stream launch; copies, memsets, host functions,
 * events as the corresponding stream calls. Later launches go to the real cuGraphLaunch and count into
 * the instances recorded (without in-app timing samples: the graph runs its kernels as one unit).
 * A graph with a node that cannot be run so (memory allocation/free, conditional, batch memory
 * operations, external semaphores, a device-launchable graph, a kernel node with launch attributes)
 * always goes to the real cuGraphLaunch, and its selected kernels are counted as graph_opaque with the
 * reason in a "graph" event. All plans are guarded by R.mu. */
#include "graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mn_gdrv G;

int mn_graph_load(void) {
  if (G.state) return G.state > 0;
  char why[256];
  G.state = -1;
  if (mn_drv_load(why, sizeof why)) return 0;
#define GET(field, name, version) G.field = (__typeof__(G.field))mn_ip_real(name, version)
  GET(getNodes, "cuGraphGetNodes", 10000);
  GET(getEdges, "cuGraphGetEdges", 10000);
  GET(getEdges2, "cuGraphGetEdges", 12030);
  GET(nodeType, "cuGraphNodeGetType", 10000);
  GET(kernelParams, "cuGraphKernelNodeGetParams", 12000);
  GET(kernelAttr, "cuGraphKernelNodeGetAttribute", 11000);
  GET(memcpyParams, "cuGraphMemcpyNodeGetParams", 10000);
  GET(memsetParams, "cuGraphMemsetNodeGetParams", 10000);
  GET(hostParams, "cuGraphHostNodeGetParams", 10000);
  GET(childGraph, "cuGraphChildGraphNodeGetGraph", 10000);
  GET(memAllocParams, "cuGraphMemAllocNodeGetParams", 11040);
  GET(recordEvent, "cuGraphEventRecordNodeGetEvent", 11010);
  GET(waitEvent, "cuGraphEventWaitNodeGetEvent", 11010);
  GET(memcpy3DAsync, "cuMemcpy3DAsync", 3020);
  GET(set8, "cuMemsetD2D8Async", 3020);
  GET(set16, "cuMemsetD2D16Async", 3020);
  GET(set32, "cuMemsetD2D32Async", 3020);
  GET(streamWaitEvent, "cuStreamWaitEvent", 3020);
  GET(ctxGetCurrent, "cuCtxGetCurrent", 4000);
#undef GET
  if (G.getNodes && (G.getEdges || G.getEdges2) && G.nodeType && G.kernelParams) G.state = 1;
  return G.state > 0;
}

static gplan *plans;

static void plan_free(gplan *p);

void mn_graph_node_clear(gnode *n) {
  free(n->args);
  free(n->argv);
  n->args = NULL;
  n->argv = NULL;
  if (n->child) plan_free(n->child);
  n->child = NULL;
}

static void plan_free(gplan *p) {
  if (!p) return;
  for (size_t i = 0; i < p->n; i++) mn_graph_node_clear(&p->nodes[i]);
  free(p->nodes);
  free(p);
}

void mn_graph_opaque(gplan *p, int skip, const char *why) {
  if (p->why[0]) return;
  p->why_skip = skip;
  snprintf(p->why, sizeof p->why, "%s", why);
}

static const char *type_name(CUgraphNodeType t) {
  switch (t) {
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL: return "an external semaphore signal node";
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT: return "an external semaphore wait node";
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: return "a memory allocation node";
    case CU_GRAPH_NODE_TYPE_MEM_FREE: return "a memory free node";
    case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP: return "a batch memory operation node";
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: return "a conditional node";
    default: return "a node of a type the recorder does not know";
  }
}

/* A kernel node's parameters into the plan (deep copy); the plan is made opaque when they cannot be (an
 * opaque plan keeps its first reason). */
void mn_graph_kernel_set(gplan *p, gnode *n, CUfunction func, CUkernel kern, const unsigned grid[3],
                         const unsigned block[3], unsigned shmem, void **params, void **extra) {
  free(n->args);
  free(n->argv);
  n->args = NULL;
  n->argv = NULL;
  n->f = func ? func : (CUfunction)kern;
  memcpy(n->grid, grid, sizeof n->grid);
  memcpy(n->block, block, sizeof n->block);
  n->shmem = shmem;
  n->inst = NULL;
  n->skip = -1;
  n->k = n->f ? mn_kernel_of(n->f) : NULL;
  n->settled = !n->k || !mn_kernel_selected(n->k);
  if (!n->k) {
    mn_graph_opaque(p, MN_SKIP_FAILED, "a kernel node without a kernel (or out of memory)");
    return;
  }
  if (!mn_kernel_layout(n->k, n->f)) {
    mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, "the driver gave no parameter layout of a kernel node");
    return;
  }
  mn_kernel *k = n->k;
  n->args = calloc(k->argbytes + 1, 1);
  n->argv = calloc(k->nparams + 1, sizeof *n->argv);
  if (!n->args || !n->argv) {
    mn_graph_opaque(p, MN_SKIP_FAILED, "out of host memory copying a kernel node");
    return;
  }
  const void *buf = NULL;
  size_t size = 0;
  for (size_t i = 0; !params && extra && extra[i] != CU_LAUNCH_PARAM_END && i < 64; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = extra[i + 1];
    else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1]) size = *(const size_t *)extra[i + 1];
  }
  if (params) {
    for (uint32_t i = 0; i < k->nparams; i++)
      if (params[i]) memcpy(n->args + k->poff[i], params[i], k->psize[i]);
  } else if (buf) {
    memcpy(n->args, buf, size < k->argbytes ? size : k->argbytes);
  } else if (k->nparams) {
    mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, "a kernel node without its arguments");
    return;
  }
  for (uint32_t i = 0; i < k->nparams; i++) n->argv[i] = n->args + k->poff[i];
}

/* A kernel node launched with attributes other than the defaults (clusters, cooperative) would launch
 * differently through cuLaunchKernel: such graphs are not run node by node. */
static int kernel_attributes_default(CUgraphNode node) {
  if (!G.kernelAttr) return 1;
  CUkernelNodeAttrValue v;
  memset(&v, 0, sizeof v);
  if (G.kernelAttr(node, CU_KERNEL_NODE_ATTRIBUTE_CLUSTER_DIMENSION, &v) == CUDA_SUCCESS &&
      (uint64_t)v.clusterDim.x * (v.clusterDim.y ? v.clusterDim.y : 1) * (v.clusterDim.z ? v.clusterDim.z : 1) > 1)
    return 0;
  memset(&v, 0, sizeof v);
  if (G.kernelAttr(node, CU_KERNEL_NODE_ATTRIBUTE_COOPERATIVE, &v) == CUDA_SUCCESS && v.cooperative) return 0;
  return 1;
}

static void node_fill(gplan *p, gnode *n, CUgraphNode node, int depth) {
  CUresult r = CUDA_SUCCESS;
  const char *lacks = NULL; /* the driver call missing to read or run the node */
  char why[160];
  n->src = node;
  if (G.nodeType(node, &n->type) != CUDA_SUCCESS) {
    mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, "cuGraphNodeGetType failed");
    return;
  }
  switch (n->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      CUDA_KERNEL_NODE_PARAMS_v2 kp;
      memset(&kp, 0, sizeof kp);
      if ((r = G.kernelParams(node, &kp)) != CUDA_SUCCESS) break;
      CUcontext cur = NULL;
      if (!kp.func && kp.ctx && G.ctxGetCurrent && G.ctxGetCurrent(&cur) == CUDA_SUCCESS && cur != kp.ctx) {
        mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, "a kernel node runs in another context");
      } else if (!kernel_attributes_default(node)) {
        mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, "a kernel node with a cluster or cooperative launch attribute");
      }
      mn_graph_kernel_set(p, n, kp.func, kp.kern, (unsigned[]){kp.gridDimX, kp.gridDimY, kp.gridDimZ},
                          (unsigned[]){kp.blockDimX, kp.blockDimY, kp.blockDimZ}, kp.sharedMemBytes,
                          kp.kernelParams, kp.extra);
      return;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      if (!G.memcpyParams || !G.memcpy3DAsync) lacks = "cuGraphMemcpyNodeGetParams or cuMemcpy3DAsync";
      else r = G.memcpyParams(node, &n->copy);
      break;
    case CU_GRAPH_NODE_TYPE_MEMSET:
      if (!G.memsetParams || !G.set8 || !G.set16 || !G.set32) lacks = "cuGraphMemsetNodeGetParams or cuMemsetD2D*Async";
      else r = G.memsetParams(node, &n->set);
      break;
    case CU_GRAPH_NODE_TYPE_HOST:
      if (!G.hostParams) lacks = "cuGraphHostNodeGetParams";
      else r = G.hostParams(node, &n->host);
      break;
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      if (!G.recordEvent) lacks = "cuGraphEventRecordNodeGetEvent";
      else r = G.recordEvent(node, &n->ev);
      break;
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      if (!G.waitEvent || !G.streamWaitEvent) lacks = "cuGraphEventWaitNodeGetEvent or cuStreamWaitEvent";
      else r = G.waitEvent(node, &n->ev);
      break;
    case CU_GRAPH_NODE_TYPE_EMPTY: return;
    case CU_GRAPH_NODE_TYPE_GRAPH: {
      CUgraph cg = NULL;
      if (!G.childGraph) {
        lacks = "cuGraphChildGraphNodeGetGraph";
        break;
      }
      if ((r = G.childGraph(node, &cg)) != CUDA_SUCCESS) break;
      n->child = calloc(1, sizeof *n->child);
      if (!n->child) {
        mn_graph_opaque(p, MN_SKIP_FAILED, "out of host memory");
        return;
      }
      mn_graph_build(n->child, cg, depth + 1);
      if (n->child->why[0]) mn_graph_opaque(p, n->child->why_skip, n->child->why);
      return;
    }
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
      /* The allocation's address is fixed for the graph's life, and kernels outside the graph may use it
       * until it is freed (cuda-samples graphMemoryNodes' validateGPU); it is not snapshotted, so a launch
       * that receives a pointer into it is reported rather than recorded without that memory. */
      CUDA_MEM_ALLOC_NODE_PARAMS ap;
      memset(&ap, 0, sizeof ap);
      if (G.memAllocParams && G.memAllocParams(node, &ap) == CUDA_SUCCESS && ap.dptr && ap.bytesize)
        mn_foreign_note(ap.dptr, ap.bytesize, MN_FOREIGN_GRAPH_MEMORY);
      mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, "the graph has a memory allocation node");
      return;
    }
    default:
      snprintf(why, sizeof why, "the graph has %s", type_name(n->type));
      mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, why);
      return;
  }
  if (lacks) {
    snprintf(why, sizeof why, "the driver lacks %s", lacks);
    mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, why);
  } else if (r != CUDA_SUCCESS) {
    snprintf(why, sizeof why, "reading a graph node (type %d) failed: %s", (int)n->type, mn_cu_err(r));
    mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, why);
  }
}

typedef struct hidx { CUgraphNode h; size_t i; } hidx;
static int hidx_cmp(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const hidx *)a)->h, y = (uintptr_t)((const hidx *)b)->h;
  return x < y ? -1 : x > y;
}
static size_t index_of(const hidx *sorted, size_t n, CUgraphNode h) {
  hidx key = {h, 0};
  const hidx *f = bsearch(&key, sorted, n, sizeof *sorted, hidx_cmp);
  return f ? f->i : (size_t)-1;
}

/* The graph's nodes in a topological order (Kahn), each filled in. 0, or -1 with p->why set. */
int mn_graph_build(gplan *p, CUgraph g, int depth) {
  if (depth > 32) {
    mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, "child graphs nested too deeply");
    return -1;
  }
  size_t n = 0, ne = 0;
  CUgraphNode *nodes = NULL, *from = NULL, *to = NULL;
  hidx *sorted = NULL;
  size_t *indeg = NULL, *order = NULL;
  int rc = -1;
  CUresult r = G.getNodes(g, NULL, &n);
  if (r != CUDA_SUCCESS) goto fail;
  nodes = calloc(n + 1, sizeof *nodes);
  if (!nodes) goto oom;
  /* the driver refuses arrays with a count of 0 (invalid argument: on the H200, every graph without edges) */
  if (n && (r = G.getNodes(g, nodes, &n)) != CUDA_SUCCESS) goto fail;
  r = G.getEdges2 ? G.getEdges2(g, NULL, NULL, NULL, &ne) : G.getEdges(g, NULL, NULL, &ne);
  if (r != CUDA_SUCCESS) goto fail;
  from = calloc(ne + 1, sizeof *from);
  to = calloc(ne + 1, sizeof *to);
  if (!from || !to) goto oom;
  /* edge data (programmatic dependencies) only loosen the order: a sequential run satisfies them */
  if (!ne) {
    r = CUDA_SUCCESS;
  } else if (G.getEdges2) {
    CUgraphEdgeData *data = calloc(ne + 1, sizeof *data);
    if (!data) goto oom;
    r = G.getEdges2(g, from, to, data, &ne);
    free(data);
  } else {
    r = G.getEdges(g, from, to, &ne);
  }
  if (r != CUDA_SUCCESS) goto fail;
  sorted = calloc(n + 1, sizeof *sorted);
  indeg = calloc(n + 1, sizeof *indeg);
  order = calloc(n + 1, sizeof *order);
  p->nodes = calloc(n + 1, sizeof *p->nodes);
  if (!sorted || !indeg || !order || !p->nodes) goto oom;
  for (size_t i = 0; i < n; i++) sorted[i] = (hidx){nodes[i], i};
  qsort(sorted, n, sizeof *sorted, hidx_cmp);
  for (size_t e = 0; e < ne; e++) {
    size_t t = index_of(sorted, n, to[e]);
    if (t == (size_t)-1 || index_of(sorted, n, from[e]) == (size_t)-1) {
      mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, "an edge names a node the graph does not list");
      goto out;
    }
    indeg[t]++;
  }
  size_t head = 0, tail = 0;
  for (size_t i = 0; i < n; i++)
    if (!indeg[i]) order[tail++] = i;
  while (head < tail) {
    size_t u = order[head++];
    for (size_t e = 0; e < ne; e++)
      if (from[e] == nodes[u]) {
        size_t t = index_of(sorted, n, to[e]);
        if (--indeg[t] == 0) order[tail++] = t;
      }
  }
  if (tail != n) {
    mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, "the graph's edges form a cycle");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    gnode *gn = &p->nodes[p->n++];
    gn->place = order[i];
    gn->skip = -1;
    gn->settled = 1;
    node_fill(p, gn, nodes[order[i]], depth);
  }
  rc = p->why[0] ? -1 : 0;
  goto out;
oom:
  mn_graph_opaque(p, MN_SKIP_FAILED, "out of host memory reading a graph");
  goto out;
fail: {
  char why[160];
  snprintf(why, sizeof why, "reading the graph failed: %s", mn_cu_err(r));
  mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, why);
}
out:
  free(nodes);
  free(from);
  free(to);
  free(sorted);
  free(indeg);
  free(order);
  return rc;
}

static gplan **plan_slot(CUgraphExec e) {
  for (gplan **p = &plans; *p; p = &(*p)->next)
    if ((*p)->exec == e) return p;
  return NULL;
}

gplan *mn_graph_plan(CUgraphExec e) {
  gplan **p = plan_slot(e);
  return p ? *p : NULL;
}

gnode *mn_graph_node(gplan *p, CUgraphNode h) {
  for (size_t i = 0; p && i < p->n; i++)
    if (p->nodes[i].src == h || (p->nodes[i].alias && p->nodes[i].alias == h)) return &p->nodes[i];
  return NULL;
}

static char gbuf[1024];

void mn_graph_log(const gplan *p, const char *what) {
  uint64_t kernels = 0;
  for (size_t i = 0; i < p->n; i++) kernels += p->nodes[i].type == CU_GRAPH_NODE_TYPE_KERNEL;
  mn_line l;
  mn_line_begin(&l, gbuf, sizeof gbuf, "graph");
  mn_line_u64(&l, "exec", (uint64_t)(uintptr_t)p->exec);
  mn_line_str(&l, "at", what);
  mn_line_u64(&l, "nodes", p->n);
  mn_line_u64(&l, "kernels", kernels);
  if (p->why[0]) mn_line_str(&l, "why", p->why);
  mn_log_event(&l);
}

/* A new plan for `e` from graph `g`, replacing any plan `e` had; R.mu held. */
gplan *mn_graph_plan_new(CUgraphExec e, CUgraph g, unsigned long long flags, const char *what) {
  gplan **old = plan_slot(e);
  gplan *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->exec = e;
  p->flags = flags;
  if (!mn_graph_load()) mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, "the driver lacks the calls that read a graph");
  else if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, "instantiated for device launch");
  else mn_graph_build(p, g, 0);
  if (old) {
    gplan *o = *old;
    /* updated in place: the original graph's nodes keep naming the same places */
    for (size_t i = 0; i < p->n && o->n == p->n; i++)
      for (size_t j = 0; j < o->n; j++)
        if (o->nodes[j].place == p->nodes[i].place && o->nodes[j].type == p->nodes[i].type)
          p->nodes[i].alias = o->nodes[j].alias ? o->nodes[j].alias : o->nodes[j].src;
    p->next = o->next;
    *old = p;
    plan_free(o);
  } else {
    p->next = plans;
    plans = p;
  }
  mn_graph_log(p, what);
  return p;
}


static void instantiated(CUresult r, CUgraphExec *e, CUgraph g, unsigned long long flags) {
  if (r != CUDA_SUCCESS || !e || !mn_graph_recording()) return;
  pthread_mutex_lock(&R.mu);
  if (!mn_graph_plan_new(*e, g, flags, "instantiate")) mn_error("out of host memory keeping a graph", NULL);
  pthread_mutex_unlock(&R.mu);
}

CUresult mn_cu_graph_instantiate_v1(const mn_ip_slot *s, CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t n) {
  CUresult r = ((PFN_cuGraphInstantiate_v11000)s->real)(e, g, err, log, n);
  instantiated(r, e, g, 0);
  return r;
}

CUresult mn_cu_graph_instantiate_with_flags(const mn_ip_slot *s, CUgraphExec *e, CUgraph g, unsigned long long flags) {
  CUresult r = ((PFN_cuGraphInstantiateWithFlags_v11040)s->real)(e, g, flags);
  instantiated(r, e, g, flags);
  return r;
}

CUresult mn_cu_graph_instantiate_with_params(const mn_ip_slot *s, CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
  CUresult r = ((PFN_cuGraphInstantiateWithParams_v12000)s->real)(e, g, p);
  instantiated(p && p->result_out != CUDA_GRAPH_INSTANTIATE_SUCCESS ? CUDA_ERROR_INVALID_VALUE : r, e, g, p ? p->flags : 0);
  return r;
}

CUresult mn_cu_graph_exec_destroy(const mn_ip_slot *s, CUgraphExec e) {
  if (mn_graph_recording()) {
    pthread_mutex_lock(&R.mu);
    gplan **p = plan_slot(e);
    if (p) {
      gplan *o = *p;
      *p = o->next;
      plan_free(o);
    }
    pthread_mutex_unlock(&R.mu);
  }
  return ((PFN_cuGraphExecDestroy_v10000)s->real)(e);
}
