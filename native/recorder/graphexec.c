/* librecord's CUDA graphs, part two (graph.c has the plans): exec updates refresh the plan of the exec they
 * change; a cuGraphLaunch runs the plan node by node while it has a selected kernel to record, else it is the
 * driver's launch, counted into the recorded instances. Graph objects are not thread-safe (the app serializes
 * calls on one exec), so a plan is read without R.mu while it runs; its bookkeeping is under R.mu. */
#include "graph.h"

#include <string.h>

/* ---- exec updates -------------------------------------------------------------------------------- */

/* The plan node an update names, with R.mu taken (NULL, unlocked, when there is none). */
static gnode *updating(CUresult r, CUgraphExec e, CUgraphNode h, gplan **p) {
  if (r != CUDA_SUCCESS || !mn_graph_recording()) return NULL;
  pthread_mutex_lock(&R.mu);
  *p = mn_graph_plan(e);
  gnode *n = mn_graph_node(*p, h);
  if (!n) pthread_mutex_unlock(&R.mu);
  return n;
}

/* After the real call `r` of an update of node h of exec e: the statement given on the plan node n (and
 * plan p), when `ok` (the parameters were given) and the call succeeded. */
#define UPDATE(ok, ...)                                                                              \
  do {                                                                                               \
    gplan *p = NULL;                                                                                 \
    gnode *n = (ok) ? updating(r, e, h, &p) : NULL;                                                  \
    if (n) {                                                                                         \
      (void)p;                                                                                       \
      __VA_ARGS__;                                                                                   \
      pthread_mutex_unlock(&R.mu);                                                                   \
    }                                                                                                \
  } while (0)

static void kernel_update(gplan *p, gnode *n, CUfunction f, CUkernel kern, unsigned gx, unsigned gy, unsigned gz,
                          unsigned bx, unsigned by, unsigned bz, unsigned shm, void **params, void **extra) {
  if (n->type != CU_GRAPH_NODE_TYPE_KERNEL) return;
  mn_graph_kernel_set(p, n, f, kern, (unsigned[]){gx, gy, gz}, (unsigned[]){bx, by, bz}, shm, params, extra);
  if (p->why[0]) mn_graph_log(p, "update");
}

CUresult mn_cu_graph_exec_kernel_set_v1(const mn_ip_slot *s, CUgraphExec e, CUgraphNode h, const CUDA_KERNEL_NODE_PARAMS_v1 *kp) {
  CUresult r = ((PFN_cuGraphExecKernelNodeSetParams_v10010)s->real)(e, h, kp);
  UPDATE(kp, kernel_update(p, n, kp->func, NULL, kp->gridDimX, kp->gridDimY, kp->gridDimZ, kp->blockDimX, kp->blockDimY,
                kp->blockDimZ, kp->sharedMemBytes, kp->kernelParams, kp->extra));
  return r;
}

CUresult mn_cu_graph_exec_kernel_set(const mn_ip_slot *s, CUgraphExec e, CUgraphNode h, const CUDA_KERNEL_NODE_PARAMS_v2 *kp) {
  CUresult r = ((PFN_cuGraphExecKernelNodeSetParams_v12000)s->real)(e, h, kp);
  UPDATE(kp, kernel_update(p, n, kp->func, kp->kern, kp->gridDimX, kp->gridDimY, kp->gridDimZ, kp->blockDimX, kp->blockDimY,
                kp->blockDimZ, kp->sharedMemBytes, kp->kernelParams, kp->extra));
  return r;
}

CUresult mn_cu_graph_exec_memcpy_set(const mn_ip_slot *s, CUgraphExec e, CUgraphNode h, const CUDA_MEMCPY3D *cp, CUcontext c) {
  CUresult r = ((PFN_cuGraphExecMemcpyNodeSetParams_v10020)s->real)(e, h, cp, c);
  UPDATE(cp, n->copy = *cp);
  return r;
}

CUresult mn_cu_graph_exec_memset_set(const mn_ip_slot *s, CUgraphExec e, CUgraphNode h, const CUDA_MEMSET_NODE_PARAMS *sp, CUcontext c) {
  CUresult r = ((PFN_cuGraphExecMemsetNodeSetParams_v10020)s->real)(e, h, sp, c);
  UPDATE(sp, n->set = *sp);
  return r;
}

CUresult mn_cu_graph_exec_host_set(const mn_ip_slot *s, CUgraphExec e, CUgraphNode h, const CUDA_HOST_NODE_PARAMS *hp) {
  CUresult r = ((PFN_cuGraphExecHostNodeSetParams_v10020)s->real)(e, h, hp);
  UPDATE(hp, n->host = *hp);
  return r;
}

static void child_update(gplan *p, gnode *n, CUgraph child) {
  if (n->type != CU_GRAPH_NODE_TYPE_GRAPH) return;
  mn_graph_node_clear(n);
  n->child = calloc(1, sizeof *n->child);
  if (!n->child) mn_graph_opaque(p, MN_SKIP_FAILED, "out of host memory");
  else if (mn_graph_build(n->child, child, 1)) mn_graph_opaque(p, n->child->why_skip, n->child->why);
  if (p->why[0]) mn_graph_log(p, "update");
}

CUresult mn_cu_graph_exec_child_set(const mn_ip_slot *s, CUgraphExec e, CUgraphNode h, CUgraph child) {
  CUresult r = ((PFN_cuGraphExecChildGraphNodeSetParams_v11010)s->real)(e, h, child);
  UPDATE(1, child_update(p, n, child));
  return r;
}

CUresult mn_cu_graph_exec_record_set(const mn_ip_slot *s, CUgraphExec e, CUgraphNode h, CUevent ev) {
  CUresult r = ((PFN_cuGraphExecEventRecordNodeSetEvent_v11010)s->real)(e, h, ev);
  UPDATE(1, n->ev = ev);
  return r;
}

CUresult mn_cu_graph_exec_wait_set(const mn_ip_slot *s, CUgraphExec e, CUgraphNode h, CUevent ev) {
  CUresult r = ((PFN_cuGraphExecEventWaitNodeSetEvent_v11010)s->real)(e, h, ev);
  UPDATE(1, n->ev = ev);
  return r;
}

/* cuGraphExecNodeSetParams' parameters, by node type, into the plan node. */
static void node_update(gplan *p, gnode *n, const CUgraphNodeParams *np) {
  if (np->type != n->type) {
    mn_graph_opaque(p, MN_SKIP_GRAPH_OPAQUE, "a node's parameters were set with another node type");
    mn_graph_log(p, "update");
    return;
  }
  switch (np->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      const CUDA_KERNEL_NODE_PARAMS_v3 *kp = &np->kernel;
      kernel_update(p, n, kp->func, kp->kern, kp->gridDimX, kp->gridDimY, kp->gridDimZ, kp->blockDimX, kp->blockDimY,
                    kp->blockDimZ, kp->sharedMemBytes, kp->kernelParams, kp->extra);
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: n->copy = np->memcpy.copyParams; break;
    case CU_GRAPH_NODE_TYPE_MEMSET:
      n->set.dst = np->memset.dst, n->set.pitch = np->memset.pitch, n->set.value = np->memset.value;
      n->set.elementSize = np->memset.elementSize, n->set.width = np->memset.width, n->set.height = np->memset.height;
      break;
    case CU_GRAPH_NODE_TYPE_HOST: n->host.fn = np->host.fn, n->host.userData = np->host.userData; break;
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: n->ev = np->eventRecord.event; break;
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: n->ev = np->eventWait.event; break;
    case CU_GRAPH_NODE_TYPE_GRAPH: child_update(p, n, np->graph.graph); break;
    default: break; /* empty; the other kinds made the plan opaque when it was built */
  }
}

CUresult mn_cu_graph_exec_node_set(const mn_ip_slot *s, CUgraphExec e, CUgraphNode h, CUgraphNodeParams *np) {
  CUresult r = ((PFN_cuGraphExecNodeSetParams_v12020)s->real)(e, h, np);
  UPDATE(np, node_update(p, n, np));
  return r;
}

CUresult mn_cu_graph_node_set_enabled(const mn_ip_slot *s, CUgraphExec e, CUgraphNode h, unsigned int on) {
  CUresult r = ((PFN_cuGraphNodeSetEnabled_v11060)s->real)(e, h, on);
  UPDATE(1, n->disabled = !on);
  return r;
}

static void updated(CUresult r, CUgraphExec e, CUgraph g) {
  if (r != CUDA_SUCCESS || !mn_graph_recording()) return;
  pthread_mutex_lock(&R.mu);
  gplan *p = mn_graph_plan(e);
  if (p && !mn_graph_plan_new(e, g, p->flags, "update")) mn_error("out of host memory keeping a graph", NULL);
  pthread_mutex_unlock(&R.mu);
}

CUresult mn_cu_graph_exec_update_v1(const mn_ip_slot *s, CUgraphExec e, CUgraph g, CUgraphNode *err, CUgraphExecUpdateResult *res) {
  CUresult r = ((PFN_cuGraphExecUpdate_v10020)s->real)(e, g, err, res);
  updated(r, e, g);
  return r;
}

CUresult mn_cu_graph_exec_update(const mn_ip_slot *s, CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info) {
  CUresult r = ((PFN_cuGraphExecUpdate_v12000)s->real)(e, g, info);
  updated(r, e, g);
  return r;
}

/* ---- launches ------------------------------------------------------------------------------------ */

/* 1: a selected kernel of the plan may still be recorded. */
static int wants_run(const gplan *p) {
  for (size_t i = 0; i < p->n; i++) {
    const gnode *n = &p->nodes[i];
    if (n->disabled) continue;
    if (n->child && wants_run(n->child)) return 1;
    if (n->type == CU_GRAPH_NODE_TYPE_KERNEL && !n->settled) return 1;
  }
  return 0;
}

/* A launch of the whole graph by the driver: each selected kernel counted as `skip` (>= 0), or into its
 * recorded instance or as the reason it settled without one. */
static void count_launch(const gplan *p, int skip) {
  for (size_t i = 0; i < p->n; i++) {
    const gnode *n = &p->nodes[i];
    if (n->disabled) continue;
    if (n->child) count_launch(n->child, skip);
    if (n->type != CU_GRAPH_NODE_TYPE_KERNEL || !n->k) continue;
    mn_kernel_runs(n->k);
    if (!mn_kernel_selected(n->k)) continue;
    n->k->launches++;
    n->k->stats_dirty = 1;
    if (skip >= 0) {
      mn_kernel_skip(n->k, skip);
    } else if (n->inst) {
      __atomic_add_fetch(&n->inst->count, 1, __ATOMIC_RELAXED);
      n->k->recorded_launches++;
    } else {
      mn_kernel_skip(n->k, n->skip >= 0 ? n->skip : MN_SKIP_FAILED);
    }
  }
}

static CUresult memset_node(const CUDA_MEMSET_NODE_PARAMS *m, CUstream s) {
  size_t pitch = m->height > 1 ? m->pitch : m->width * m->elementSize, h = m->height ? m->height : 1;
  switch (m->elementSize) {
    case 1: return G.set8(m->dst, pitch, (unsigned char)m->value, m->width, h, s);
    case 2: return G.set16(m->dst, pitch, (unsigned short)m->value, m->width, h, s);
    case 4: return G.set32(m->dst, pitch, m->value, m->width, h, s);
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

/* Runs the plan's nodes in order on stream `s` (R.mu not held: kernels go through the launch path). */
static CUresult run(gplan *p, CUstream s) {
  CUresult r = CUDA_SUCCESS;
  for (size_t i = 0; i < p->n && r == CUDA_SUCCESS; i++) {
    gnode *n = &p->nodes[i];
    if (n->disabled) continue;
    switch (n->type) {
      case CU_GRAPH_NODE_TYPE_KERNEL: {
        mn_inst *inst = NULL;
        int why = -1;
        r = mn_launch_graph_kernel(n->f, n->grid, n->block, n->shmem, s, n->argv, &inst, &why);
        pthread_mutex_lock(&R.mu);
        if (!n->settled) {
          /* within --skip or a passing circumstance (a capture elsewhere, an error): try again next launch */
          int again = !inst && (why == MN_SKIP_SKIPPED || why == MN_SKIP_CAPTURE_ELSEWHERE || why == MN_SKIP_PENDING_ERROR);
          if (r == CUDA_SUCCESS && !again) {
            n->settled = 1;
            n->inst = inst;
            n->skip = inst ? -1 : why;
          }
        }
        pthread_mutex_unlock(&R.mu);
        break;
      }
      case CU_GRAPH_NODE_TYPE_MEMCPY: r = G.memcpy3DAsync(&n->copy, s); break;
      case CU_GRAPH_NODE_TYPE_MEMSET: r = memset_node(&n->set, s); break;
      case CU_GRAPH_NODE_TYPE_HOST: r = D.launchHostFunc(s, n->host.fn, n->host.userData); break;
      case CU_GRAPH_NODE_TYPE_EVENT_RECORD: r = D.eventRecord(n->ev, s); break;
      case CU_GRAPH_NODE_TYPE_WAIT_EVENT: r = G.streamWaitEvent(s, n->ev, 0); break;
      case CU_GRAPH_NODE_TYPE_GRAPH: r = n->child ? run(n->child, s) : CUDA_ERROR_INVALID_VALUE; break;
      default: break; /* empty */
    }
  }
  return r;
}

static int graph_unknown_logged;

CUresult mn_cu_graph_launch(const mn_ip_slot *s, CUgraphExec e, CUstream st) {
  PFN_cuGraphLaunch_v10000 real = (PFN_cuGraphLaunch_v10000)s->real;
  if (!mn_graph_recording()) return real(e, st);
  CUstream es = mn_ip_stream(s, st);
  pthread_mutex_lock(&R.mu);
  gplan *p = mn_graph_plan(e);
  if (!p) {
    mn_warn_once(&graph_unknown_logged, "graph_launch",
                 "the app launches a CUDA graph whose instantiation the recorder did not see; its kernels are not counted");
    pthread_mutex_unlock(&R.mu);
    return real(e, st);
  }
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  if (R.exited || !mn_graph_load() || D.streamIsCapturing(es, &cs) != CUDA_SUCCESS || cs != CU_STREAM_CAPTURE_STATUS_NONE) {
    /* launched into a capture: becomes a child graph of the graph being captured, counted when that one runs */
    pthread_mutex_unlock(&R.mu);
    return real(e, st);
  }
  int elsewhere = __atomic_load_n(&R.captures, __ATOMIC_ACQUIRE) > 0;
  int skip = p->why[0] ? p->why_skip : elsewhere ? MN_SKIP_CAPTURE_ELSEWHERE : -1;
  int go = !p->why[0] && !elsewhere && wants_run(p) && mn_arena_ready();
  pthread_mutex_unlock(&R.mu);
  if (go) return run(p, es);
  CUresult r = real(e, st);
  if (r == CUDA_SUCCESS) {
    pthread_mutex_lock(&R.mu);
    if ((p = mn_graph_plan(e))) count_launch(p, skip);
    pthread_mutex_unlock(&R.mu);
  }
  return r;
}
