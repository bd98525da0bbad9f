/* librecord's CUDA graphs, shared by graph.c (plans: reading a graph at instantiation, keeping it per exec)
 * and graphexec.c (exec updates and launches). Everything here is guarded by R.mu. */
#ifndef MNEME_RECORDER_GRAPH_H
#define MNEME_RECORDER_GRAPH_H

#include "state.h"

/* the driver calls that read and run a graph's nodes (mn_graph_load) */
typedef struct mn_gdrv {
  int state; /* 0 not loaded, 1 loaded, -1 a required call is missing */
  PFN_cuGraphGetNodes_v10000 getNodes;
  PFN_cuGraphGetEdges_v10000 getEdges;
  PFN_cuGraphGetEdges_v12030 getEdges2;
  PFN_cuGraphNodeGetType_v10000 nodeType;
  PFN_cuGraphKernelNodeGetParams_v12000 kernelParams;
  PFN_cuGraphKernelNodeGetAttribute_v11000 kernelAttr;
  PFN_cuGraphMemcpyNodeGetParams_v10000 memcpyParams;
  PFN_cuGraphMemsetNodeGetParams_v10000 memsetParams;
  PFN_cuGraphHostNodeGetParams_v10000 hostParams;
  PFN_cuGraphChildGraphNodeGetGraph_v10000 childGraph;
  PFN_cuGraphMemAllocNodeGetParams_v11040 memAllocParams; /* optional: notes the allocation as foreign */
  PFN_cuGraphEventRecordNodeGetEvent_v11010 recordEvent;
  PFN_cuGraphEventWaitNodeGetEvent_v11010 waitEvent;
  PFN_cuMemcpy3DAsync_v3020 memcpy3DAsync;
  PFN_cuMemsetD2D8Async_v3020 set8;
  PFN_cuMemsetD2D16Async_v3020 set16;
  PFN_cuMemsetD2D32Async_v3020 set32;
  PFN_cuStreamWaitEvent_v3020 streamWaitEvent;
  PFN_cuCtxGetCurrent_v4000 ctxGetCurrent;
} mn_gdrv;
extern mn_gdrv G;


typedef struct gplan gplan;

typedef struct gnode {
  CUgraphNode src;        /* the node of the graph the plan was built from */
  CUgraphNode alias;      /* after cuGraphExecUpdate: the original graph's node at the same place (or NULL) */
  size_t place;           /* its position in cuGraphGetNodes' answer */
  CUgraphNodeType type;
  int disabled;
  /* kernel */
  mn_kernel *k;
  CUfunction f;           /* a CUfunction, or a CUkernel in its place */
  unsigned grid[3], block[3], shmem;
  uint8_t *args;
  void **argv;
  mn_inst *inst;          /* the recorded instance its launches count into */
  int settled;            /* nothing (more) to record for it */
  int skip;               /* settled without an instance: what its launches are counted as */
  /* other kinds */
  CUDA_MEMCPY3D copy;
  CUDA_MEMSET_NODE_PARAMS set;
  CUDA_HOST_NODE_PARAMS host;
  CUevent ev;
  gplan *child;
} gnode;

struct gplan {
  CUgraphExec exec;
  unsigned long long flags; /* instantiation flags */
  gnode *nodes;
  size_t n;
  char why[192];          /* set: cannot be run node by node */
  int why_skip;           /* then its selected kernels are counted as this */
  gplan *next;
};


int mn_graph_load(void);                      /* 1 when the calls reading a graph are there */
static inline int mn_graph_recording(void) { return R.active && !R.broken; }
/* Marks the plan as not runnable node by node (the first reason stays); its kernels count as `skip`. */
void mn_graph_opaque(gplan *p, int skip, const char *why);
/* A kernel node's parameters into the plan (deep copy); opaque when they cannot be. */
void mn_graph_kernel_set(gplan *p, gnode *n, CUfunction func, CUkernel kern, const unsigned grid[3],
                         const unsigned block[3], unsigned shmem, void **params, void **extra);
int mn_graph_build(gplan *p, CUgraph g, int depth);   /* the graph's nodes into p; 0, or -1 with p->why set */
void mn_graph_node_clear(gnode *n);
gplan *mn_graph_plan(CUgraphExec e);
gnode *mn_graph_node(gplan *p, CUgraphNode h);       /* by the source node (or its alias after an update) */
void mn_graph_log(const gplan *p, const char *what); /* a "graph" event */
/* A new plan for `e` from graph `g`, replacing the one `e` had (its node aliases kept); NULL: out of memory. */
gplan *mn_graph_plan_new(CUgraphExec e, CUgraph g, unsigned long long flags, const char *what);

#endif
