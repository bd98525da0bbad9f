/* Driver-API interposition for LD_PRELOAD libraries (librecord; `mneme apply`'s library).
 *
 * Why the driver: every CUDA runtime, shared (libcudart.so), static (libcudart_static.a, nvcc's and
 * CMake's default) or rdc-built, reaches the driver the same way: dlopen("libcuda.so.1"), then
 * dlsym(handle, "cuGetProcAddress_v2"), then every entry point through cuGetProcAddress. The static
 * runtime's own symbols (cudaLaunchKernel, __cudaRegisterFunction, ...) live inside the app binary and
 * cannot be interposed, but its dlsym call goes through the app's PLT (dlsym@GLIBC_2.34), so a dlsym
 * defined by the preloaded library sees it. This room therefore defines:
 *   - dlsym / dlvsym: cuGetProcAddress(_v2) and the table's export names come back wrapped; every other
 *     lookup is forwarded untouched (RTLD_NEXT lookups by a sibling call, so the caller stays the app);
 *   - dlopen: forwarded; a failed load of libcuda.so* is reported to the user library (no driver);
 *   - cuGetProcAddress_v2 (CUDA >= 12.0 ABI) and cuGetProcAddress (11.3 ABI, no status argument), both
 *     as wrappers handed out by the above and as exported symbols for apps linked with -lcuda: a
 *     request for a table entry returns that entry's wrapper, so the ~440 entry points the runtime asks
 *     for arrive unwrapped except the ones the library wants.
 *
 * The user library (one per process: two libraries defining dlsym cannot both see the runtime) defines
 * the table and three callbacks (below), and writes its wrappers with MN_IP_DEFINE. A wrapper is bound
 * to a slot: the real entry point it forwards to and whether that is the per-thread-default-stream
 * variant (_ptsz/_ptds: stream 0 then means CU_STREAM_PER_THREAD). An entry has MN_IP_SLOTS wrappers,
 * so up to that many distinct real pointers (legacy and per-thread variants) are served; beyond that,
 * or for a request whose version is outside [min_version, max_version), the driver's own pointer is
 * handed out and mn_ip_bare() says which name was left unwrapped and why.
 *
 * Build: compile interpose.c into the library with -fvisibility=hidden and -O2 (the RTLD_NEXT
 * forwarding relies on the sibling call; tests/test_interpose.py checks it). Link with -ldl -lpthread. */
#ifndef MNEME_INTERPOSE_H
#define MNEME_INTERPOSE_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include <stddef.h>

#define MN_IP_SLOTS 3

/* Prototypes of older ABIs that cudaTypedefs.h declares only under __CUDA_API_VERSION_INTERNAL (the
 * same declarations: C11 allows a typedef to be repeated). CUDA 12/13 runtimes still ask
 * cuGetProcAddress for some of them (cuDevicePrimaryCtxRelease at 7000, cuStreamBeginCapture at 10000);
 * only the 32-bit-size ABIs (CUdeviceptr_v1, unsigned int byte counts) are never wrapped. */
typedef CUresult (CUDAAPI *PFN_cuDevicePrimaryCtxRelease_v7000)(CUdevice_v1 dev);
typedef CUresult (CUDAAPI *PFN_cuDevicePrimaryCtxReset_v7000)(CUdevice_v1 dev);
typedef CUresult (CUDAAPI *PFN_cuStreamBeginCapture_v10000)(CUstream hStream);
typedef CUresult (CUDAAPI *PFN_cuCtxDestroy_v2000)(CUcontext ctx);
typedef CUresult (CUDAAPI *PFN_cuMemHostRegister_v4000)(void *p, size_t bytesize, unsigned int Flags);
typedef CUresult (CUDAAPI *PFN_cuGraphInstantiate_v10000)(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize);
typedef CUresult (CUDAAPI *PFN_cuGraphInstantiate_v11000)(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize);

typedef struct mn_ip_slot {
  void *real;   /* the driver's entry point this wrapper forwards to; NULL while unused */
  int ptsz;     /* 1: the per-thread-default-stream variant */
} mn_ip_slot;

typedef struct mn_ip_entry {
  const char *name;        /* as asked of cuGetProcAddress ("cuMemAlloc") */
  const char *suffix;      /* the exported symbol of this ABI is name+suffix ("_v2"), plus _ptsz/_ptds */
  int min_version;         /* requests for CUDA versions in [min_version, max_version) get this ABI */
  int max_version;         /* 0: no upper bound */
  void *wrappers[MN_IP_SLOTS];
  mn_ip_slot *slots;       /* MN_IP_SLOTS of them */
} mn_ip_entry;

/* ---- defined by the user library ---- */
extern mn_ip_entry mn_ip_table[];
extern const size_t mn_ip_table_len;
/* 1: wrap; 0: hand out the driver's pointers (a process that is not recorded pays nothing). Called on
 * the first request of each wrapped name; may initialise the library. */
int mn_ip_enabled(void);
/* `name` (asked for `version`) was handed out unwrapped; `why` says why. */
void mn_ip_bare(const char *name, int version, const char *why);
/* dlopen of libcuda failed: no driver (`why` is dlerror's text). */
void mn_ip_no_driver(const char *why);

/* ---- provided by interpose.c ---- */
/* The driver's real (unwrapped) entry point for `name` with the prototype of CUDA `version`
 * (cudaTypedefs.h's PFN_<name>_v<version>), legacy default stream; NULL when libcuda lacks it. */
void *mn_ip_real(const char *name, int version);
/* Why libcuda.so.1 cannot be loaded, or NULL when it is loaded. */
const char *mn_ip_driver_missing(void);
/* The highest CUDA version a caller asked cuGetProcAddress for (the runtime asks with its own
 * CUDA_VERSION), 0 before any request. */
int mn_ip_max_requested_version(void);
/* The stream the slot's variant means by `s` (0 becomes CU_STREAM_PER_THREAD for _ptsz variants). */
static inline CUstream mn_ip_stream(const mn_ip_slot *slot, CUstream s) {
  return slot->ptsz && s == NULL ? CU_STREAM_PER_THREAD : s;
}
/* The wrapper for `symbol` as cuGetProcAddress(symbol, version, flags) returned `*pfn` (replaced in
 * place); used by the cuGetProcAddress wrappers, exposed for cudaGetDriverEntryPoint-like paths. */
void mn_ip_wrap(const char *symbol, int version, cuuint64_t flags, void **pfn);

/* Defines the MN_IP_SLOTS wrappers of table entry `id`. `pfn` is cudaTypedefs.h's prototype of the
 * ABI (checked at compile time), `impl` the function doing the work:
 *   static CUresult impl(const mn_ip_slot *slot, <the entry point's parameters>);
 * `params` the parenthesised parameter list, then the argument names.
 *   MN_IP_DEFINE(mem_alloc, PFN_cuMemAlloc_v3020, rec_mem_alloc, (CUdeviceptr *p, size_t n), p, n)
 *   ... mn_ip_entry mn_ip_table[] = { MN_IP_ENTRY(mem_alloc, "cuMemAlloc", "_v2", 3020, 0), ... }; */
#define MN_IP_DEFINE(id, pfn, impl, params, ...)                                                      \
  static mn_ip_slot mn_ip_slots_##id[MN_IP_SLOTS];                                                   \
  static CUresult mn_ip_w0_##id params { return impl(&mn_ip_slots_##id[0], __VA_ARGS__); }           \
  static CUresult mn_ip_w1_##id params { return impl(&mn_ip_slots_##id[1], __VA_ARGS__); }           \
  static CUresult mn_ip_w2_##id params { return impl(&mn_ip_slots_##id[2], __VA_ARGS__); }           \
  _Static_assert(__builtin_types_compatible_p(__typeof__(&mn_ip_w0_##id), pfn),                      \
                 #id ": the wrapper's parameters do not match " #pfn);
#define MN_IP_ENTRY(id, name, suffix, minv, maxv)                                                     \
  { name, suffix, minv, maxv, {(void *)mn_ip_w0_##id, (void *)mn_ip_w1_##id, (void *)mn_ip_w2_##id},  \
    mn_ip_slots_##id }

#endif
