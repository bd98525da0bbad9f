/* Internal header of the replay core: the driver table, the process state, and helpers shared by the
 * core's .c files. The public API is core.cdef (included below). */
#ifndef MNEME_CORE_H
#define MNEME_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <cuda.h>
#include <cudaTypedefs.h>

#include "../snapshot.h"
#include "core.cdef"

/* Every driver entry point the core uses, with the ABI of the variant that cuGetProcAddress returns
 * for MNC_CUDA_ABI (CUDA 12.0): X(name, typedef). */
#define MNC_CUDA_ABI 12000
#define MNC_DRIVER_FUNCS(X)                                                  \
  X(cuGetErrorName, PFN_cuGetErrorName_v6000)                                \
  X(cuGetErrorString, PFN_cuGetErrorString_v6000)                            \
  X(cuInit, PFN_cuInit_v2000)                                                \
  X(cuDriverGetVersion, PFN_cuDriverGetVersion_v2020)                        \
  X(cuDeviceGetCount, PFN_cuDeviceGetCount_v2000)                            \
  X(cuDeviceGet, PFN_cuDeviceGet_v2000)                                      \
  X(cuDeviceGetName, PFN_cuDeviceGetName_v2000)                              \
  X(cuDeviceGetAttribute, PFN_cuDeviceGetAttribute_v2000)                    \
  X(cuDeviceGetUuid, PFN_cuDeviceGetUuid_v11040)                             \
  X(cuDeviceGetPCIBusId, PFN_cuDeviceGetPCIBusId_v4010)                      \
  X(cuDeviceTotalMem, PFN_cuDeviceTotalMem_v3020)                            \
  X(cuDevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000)            \
  X(cuDevicePrimaryCtxRelease, PFN_cuDevicePrimaryCtxRelease_v11000)        \
  X(cuCtxSetCurrent, PFN_cuCtxSetCurrent_v4000)                              \
  X(cuCtxGetLimit, PFN_cuCtxGetLimit_v3010)                                  \
  X(cuCtxSetLimit, PFN_cuCtxSetLimit_v3010)                                  \
  X(cuStreamCreate, PFN_cuStreamCreate_v2000)                                \
  X(cuStreamDestroy, PFN_cuStreamDestroy_v4000)                              \
  X(cuStreamQuery, PFN_cuStreamQuery_v2000)                                  \
  X(cuEventCreate, PFN_cuEventCreate_v2000)                                  \
  X(cuEventDestroy, PFN_cuEventDestroy_v4000)                                \
  X(cuEventRecord, PFN_cuEventRecord_v2000)                                  \
  X(cuEventQuery, PFN_cuEventQuery_v2000)                                    \
  X(cuEventElapsedTime, PFN_cuEventElapsedTime_v2000)                        \
  X(cuMemGetAllocationGranularity, PFN_cuMemGetAllocationGranularity_v10020) \
  X(cuMemAddressReserve, PFN_cuMemAddressReserve_v10020)                     \
  X(cuMemAddressFree, PFN_cuMemAddressFree_v10020)                           \
  X(cuMemCreate, PFN_cuMemCreate_v10020)                                     \
  X(cuMemRelease, PFN_cuMemRelease_v10020)                                   \
  X(cuMemMap, PFN_cuMemMap_v10020)                                           \
  X(cuMemUnmap, PFN_cuMemUnmap_v10020)                                       \
  X(cuMemSetAccess, PFN_cuMemSetAccess_v10020)                               \
  X(cuMemAlloc, PFN_cuMemAlloc_v3020)                                        \
  X(cuMemFree, PFN_cuMemFree_v3020)                                          \
  X(cuMemAllocHost, PFN_cuMemAllocHost_v3020)                                \
  X(cuMemFreeHost, PFN_cuMemFreeHost_v2000)                                  \
  X(cuMemHostRegister, PFN_cuMemHostRegister_v6050)                          \
  X(cuMemHostUnregister, PFN_cuMemHostUnregister_v4000)                      \
  X(cuMemHostGetDevicePointer, PFN_cuMemHostGetDevicePointer_v3020)          \
  X(cuMemcpyHtoDAsync, PFN_cuMemcpyHtoDAsync_v3020)                          \
  X(cuMemcpyDtoHAsync, PFN_cuMemcpyDtoHAsync_v3020)                          \
  X(cuMemcpyDtoDAsync, PFN_cuMemcpyDtoDAsync_v3020)                          \
  X(cuMemsetD8Async, PFN_cuMemsetD8Async_v3020)                              \
  X(cuMemsetD32Async, PFN_cuMemsetD32Async_v3020)                            \
  X(cuModuleLoadDataEx, PFN_cuModuleLoadDataEx_v2010)                        \
  X(cuModuleUnload, PFN_cuModuleUnload_v2000)                                \
  X(cuModuleGetFunction, PFN_cuModuleGetFunction_v2000)                      \
  X(cuModuleGetGlobal, PFN_cuModuleGetGlobal_v3020)                          \
  X(cuFuncGetAttribute, PFN_cuFuncGetAttribute_v2020)                        \
  X(cuFuncSetAttribute, PFN_cuFuncSetAttribute_v9000)                        \
  X(cuLaunchKernel, PFN_cuLaunchKernel_v4000)                                \
  X(cuLaunchCooperativeKernel, PFN_cuLaunchCooperativeKernel_v9000)          \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor, PFN_cuOccupancyMaxActiveBlocksPerMultiprocessor_v6050) \
  X(cuArray3DCreate, PFN_cuArray3DCreate_v3020)                              \
  X(cuArrayDestroy, PFN_cuArrayDestroy_v2000)                                \
  X(cuMipmappedArrayCreate, PFN_cuMipmappedArrayCreate_v5000)                \
  X(cuMipmappedArrayGetLevel, PFN_cuMipmappedArrayGetLevel_v5000)            \
  X(cuMipmappedArrayDestroy, PFN_cuMipmappedArrayDestroy_v5000)              \
  X(cuMemcpy3DAsync, PFN_cuMemcpy3DAsync_v3020)                              \
  X(cuTexObjectCreate, PFN_cuTexObjectCreate_v5000)                          \
  X(cuTexObjectDestroy, PFN_cuTexObjectDestroy_v5000)                        \
  X(cuSurfObjectCreate, PFN_cuSurfObjectCreate_v5000)                        \
  X(cuSurfObjectDestroy, PFN_cuSurfObjectDestroy_v5000)

typedef struct mnc_driver {
#define MNC_FIELD(name, type) type name;
  MNC_DRIVER_FUNCS(MNC_FIELD)
#undef MNC_FIELD
  /* CUDA 12.4+, NULL on older drivers: parameter layout checks are then skipped. */
  PFN_cuFuncGetParamInfo_v12040 param_info;
} mnc_driver;

extern mnc_driver mnc_cu;

/* Pinned staging: two halves so the CPU fills one while the copy engine drains the other. */
#define MNC_STAGING_HALF (16u << 20)

/* The process's one device. */
typedef struct mnc_process {
  int loaded;            /* driver table filled */
  int unusable;          /* status that broke the context, else 0 */
  int ordinal;           /* -1 when no device is open */
  CUdevice dev;
  CUcontext ctx;
  CUstream stream;
  CUevent ev_start, ev_end;   /* timing */
  CUevent ev_half[2];         /* staging halves */
  void *staging;              /* 2 * MNC_STAGING_HALF pinned bytes, lazily */
  CUdeviceptr flush_buf;      /* L2 flush buffer, lazily */
  uint64_t flush_bytes;
  int l2_size;
  int max_shared_optin;
  double timeout_s;
  uint64_t resources;         /* arenas, regions, modules, states, raw allocations alive */
  uint64_t next_serial;
  /* the compare kernels */
  CUmodule cmp_module;
  CUfunction cmp_bytes, cmp_values, hold;
  CUdeviceptr cmp_out;        /* one mnc_gpu_cmp result */
  CUdeviceptr cmp_scratch;    /* expected bytes uploaded chunk by chunk */
  uint64_t cmp_scratch_bytes;
} mnc_process;

extern mnc_process mnc_g;

/* Registry of arenas and host regions, to check that blobs land in memory we own. */
struct mnc_arena {
  CUdeviceptr base; /* backed with device memory: [base, base + size) */
  uint64_t size;
  CUdeviceptr va_base; /* reserved: [va_base, va_base + va_size), which holds the backed range */
  uint64_t va_size;
  CUmemGenericAllocationHandle handle;
  struct mnc_arena *next;
};
struct mnc_host_region {
  uint64_t addr, size;
  int registered;
  struct mnc_host_region *next;
};
extern struct mnc_arena *mnc_arenas;
extern struct mnc_host_region *mnc_regions;

typedef struct mnc_var_slot {
  const mn_var *rec;     /* the prologue's record */
  CUdeviceptr addr;      /* in this module; 0 when skipped */
  uint64_t size;         /* bytes in the module */
  uint64_t shadow_off;   /* offset of its copy in the module's var shadow */
} mnc_var_slot;

struct mnc_function {
  CUfunction fn;
  struct mnc_module *module;
  uint32_t dyn_shared_set;    /* current MAX_DYNAMIC_SHARED_SIZE_BYTES we set (0: never) */
  char *name;
  int nparams;                /* -1: unknown (driver before CUDA 12.4) */
  int cooperative;            /* launch with cuLaunchCooperativeKernel (grid-wide sync) */
  uint32_t *param_offsets, *param_sizes;
};

struct mnc_module {
  CUmodule mod;
  uint64_t serial;
  mnc_function **funcs;
  uint32_t nfuncs;
  mnc_var_slot *vars;
  uint32_t nvars;
  const mn_snapshot *vars_from;
  CUdeviceptr var_shadow;
  uint64_t var_shadow_bytes;
  char **skipped;
  uint32_t nskipped;
  /* the app's addresses of device functions and this module's (mnc_module_set_code_map) */
  uint64_t *code_from, *code_to;
  uint32_t ncode;
};

enum mnc_copy_kind { MNC_COPY_D2D = 0, MNC_COPY_HOST = 1 };

typedef struct mnc_blob_slot {
  const mn_blob *rec;
  int host;              /* 1: pinned host blob */
  uint64_t shadow_off;   /* device blobs: offset in the state's shadow */
} mnc_blob_slot;

struct mnc_state {
  const mn_snapshot *prologue;
  mnc_blob_slot *blobs;  /* sorted by address */
  uint32_t nblobs;
  CUdeviceptr shadow;
  uint64_t shadow_bytes;
  mnc_copy *plan;
  uint32_t nplan;
  uint64_t plan_serial;  /* module serial the plan was made for; 0 = no variables in it */
  uint64_t plan_bytes;
};

/* ---- driver.c ---- */
/* Records `what` failed with r; marks the context unusable when r is sticky; returns r. */
int mnc_fail_cu(CUresult r, const char *what);
/* printf-style message for an mnc_status; returns status. */
int mnc_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mnc_append_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Guard at the top of every driver-using call: driver loaded, context usable, device open, current. */
int mnc_enter(void);
/* Polls the stream (or an event when ev != NULL) until done, an error, or the watchdog deadline. */
int mnc_wait_stream(const char *what);
int mnc_wait_event(CUevent ev, const char *what);
void mnc_lock(void);
void mnc_unlock(void);

#define MNC_CU(call, what)                          \
  do {                                              \
    CUresult mnc_r_ = (call);                       \
    if (mnc_r_ != CUDA_SUCCESS) return mnc_fail_cu(mnc_r_, (what)); \
  } while (0)

#define MNC_TRY(expr)               \
  do {                              \
    int mnc_s_ = (expr);            \
    if (mnc_s_ != 0) return mnc_s_; \
  } while (0)

/* ---- memory.c ---- */
int mnc_staging(void);
/* Streams many host ranges to the device through the staging halves; contiguous destinations share
 * one copy, and so do those across gaps of up to 4 KiB, which get zeros: use it only for buffers whose
 * gaps are ours (the shadow copies, scratch). Stream-ordered: flush, then enqueue work that reads them. */
typedef struct mnc_uploader {
  CUdeviceptr dst;   /* destination of the bytes in the current half */
  uint64_t fill;     /* bytes in the current half */
  uint32_t k;        /* current half */
  int used[2];       /* half has a copy in flight (its event was recorded) */
} mnc_uploader;
int mnc_uploader_begin(mnc_uploader *u);
int mnc_uploader_push(mnc_uploader *u, CUdeviceptr dst, const void *src, uint64_t n);
int mnc_uploader_flush(mnc_uploader *u);
int mnc_uploader_finish(mnc_uploader *u, const char *what);
/* Host -> device through the pinned staging halves; waits. */
int mnc_upload(CUdeviceptr dst, const void *src, uint64_t n);
/* Device -> host through the staging halves; waits. */
int mnc_download(void *dst, CUdeviceptr src, uint64_t n);
/* Whether [addr, addr+n) lies inside one arena / one host region. */
int mnc_in_arena(uint64_t addr, uint64_t n);
int mnc_in_region(uint64_t addr, uint64_t n);

/* ---- module.c ---- */
int mnc_module_load_nolock(const void *image, uint64_t size, mnc_module **out);
const mnc_var_slot *mnc_module_find_var(const mnc_module *m, uint64_t recorded_addr, uint64_t n);
/* Copies a variable's recorded bytes into out (size bytes) with its address words relocated: words that held
 * another variable's address, and words that equal an app code address of the module's code map. */
int mnc_relocate(const mnc_module *m, const mn_var *v, const uint8_t *data, uint8_t *out);
int mnc_set_dynamic_shared(mnc_function *f, uint32_t bytes);
/* Writes the variables again from the snapshot they were loaded from (after a failure). */
int mnc_module_reload_vars(mnc_module *m);

/* ---- state.c ---- */
const mnc_blob_slot *mnc_state_find_blob(const mnc_state *s, uint64_t addr, uint64_t n);
int mnc_state_enqueue_plan(mnc_state *s);
/* MNC_E_INVALID when the plan holds variables of a module other than m. */
int mnc_state_check_plan(const mnc_state *s, const mnc_module *m);

/* ---- compare.c ---- */
/* Compares n bytes at `actual` with expected bytes on the host (uploaded chunk by chunk) or on the
 * device (expected_dev != 0), like mn_compare_ex; waits. */
int mnc_compare_gpu(CUdeviceptr actual, const void *expected_host, CUdeviceptr expected_dev, uint64_t n,
                    uint32_t elem, uint32_t norm, double atol, double rtol, mn_cmp_report *rep, int *equal);

#endif
