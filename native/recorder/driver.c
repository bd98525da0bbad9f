/* The driver entry points librecord wraps: its native/interpose table. Each wrapper is bound to a slot
 * (the real entry point and its stream variant) and calls the mn_cu_* function that does the work
 * (memory.c, managed.c, recorder.c, launch.c). An entry's versions are those whose prototype it has
 * (tests/test_interpose.py checks them against cudaTypedefs.h); requests outside them are handed out
 * unwrapped and logged as a warning naming the entry point. Older ABIs with the same parameters share the
 * mn_cu_* function (it calls the slot's real pointer, which is the older entry point). */
#include "state.h"

MN_IP_DEFINE(mem_alloc, PFN_cuMemAlloc_v3020, mn_cu_mem_alloc, (CUdeviceptr *p, size_t n), p, n)
MN_IP_DEFINE(mem_alloc_pitch, PFN_cuMemAllocPitch_v3020, mn_cu_mem_alloc_pitch, (CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e), p, pitch, w, h, e)
MN_IP_DEFINE(mem_free, PFN_cuMemFree_v3020, mn_cu_mem_free, (CUdeviceptr p), p)
MN_IP_DEFINE(mem_alloc_async, PFN_cuMemAllocAsync_v11020, mn_cu_mem_alloc_async, (CUdeviceptr *p, size_t n, CUstream s), p, n, s)
MN_IP_DEFINE(mem_alloc_pool, PFN_cuMemAllocFromPoolAsync_v11020, mn_cu_mem_alloc_from_pool_async, (CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s), p, n, pool, s)
MN_IP_DEFINE(mem_free_async, PFN_cuMemFreeAsync_v11020, mn_cu_mem_free_async, (CUdeviceptr p, CUstream s), p, s)
MN_IP_DEFINE(mem_alloc_managed, PFN_cuMemAllocManaged_v6000, mn_cu_mem_alloc_managed, (CUdeviceptr *p, size_t n, unsigned int f), p, n, f)
MN_IP_DEFINE(mem_alloc_host, PFN_cuMemAllocHost_v3020, mn_cu_mem_alloc_host, (void **p, size_t n), p, n)
MN_IP_DEFINE(mem_host_alloc, PFN_cuMemHostAlloc_v2020, mn_cu_mem_host_alloc, (void **p, size_t n, unsigned int f), p, n, f)
MN_IP_DEFINE(mem_free_host, PFN_cuMemFreeHost_v2000, mn_cu_mem_free_host, (void *p), p)
MN_IP_DEFINE(mem_host_register_v1, PFN_cuMemHostRegister_v4000, mn_cu_mem_host_register, (void *p, size_t n, unsigned int f), p, n, f)
MN_IP_DEFINE(mem_host_register, PFN_cuMemHostRegister_v6050, mn_cu_mem_host_register, (void *p, size_t n, unsigned int f), p, n, f)
MN_IP_DEFINE(mem_host_unregister, PFN_cuMemHostUnregister_v4000, mn_cu_mem_host_unregister, (void *p), p)
MN_IP_DEFINE(launch, PFN_cuLaunchKernel_v4000, mn_cu_launch_kernel, (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s, void **params, void **extra), f, gx, gy, gz, bx, by, bz, shm, s, params, extra)
MN_IP_DEFINE(launch_ex, PFN_cuLaunchKernelEx_v11060, mn_cu_launch_kernel_ex, (const CUlaunchConfig *c, CUfunction f, void **params, void **extra), c, f, params, extra)
MN_IP_DEFINE(launch_coop, PFN_cuLaunchCooperativeKernel_v9000, mn_cu_launch_cooperative_kernel, (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s, void **params), f, gx, gy, gz, bx, by, bz, shm, s, params)
MN_IP_DEFINE(library_load_data, PFN_cuLibraryLoadData_v12000, mn_cu_library_load_data, (CUlibrary *lib, const void *code, CUjit_option *jo, void **jv, unsigned int njo, CUlibraryOption *lo, void **lv, unsigned int nlo), lib, code, jo, jv, njo, lo, lv, nlo)
MN_IP_DEFINE(library_load_file, PFN_cuLibraryLoadFromFile_v12000, mn_cu_library_load_from_file, (CUlibrary *lib, const char *file, CUjit_option *jo, void **jv, unsigned int njo, CUlibraryOption *lo, void **lv, unsigned int nlo), lib, file, jo, jv, njo, lo, lv, nlo)
MN_IP_DEFINE(library_unload, PFN_cuLibraryUnload_v12000, mn_cu_library_unload, (CUlibrary lib), lib)
MN_IP_DEFINE(library_get_kernel, PFN_cuLibraryGetKernel_v12000, mn_cu_library_get_kernel, (CUkernel *k, CUlibrary lib, const char *name), k, lib, name)
MN_IP_DEFINE(library_get_global, PFN_cuLibraryGetGlobal_v12000, mn_cu_library_get_global, (CUdeviceptr *p, size_t *n, CUlibrary lib, const char *name), p, n, lib, name)
MN_IP_DEFINE(library_get_managed, PFN_cuLibraryGetManaged_v12000, mn_cu_library_get_managed, (CUdeviceptr *p, size_t *n, CUlibrary lib, const char *name), p, n, lib, name)
MN_IP_DEFINE(module_load_data, PFN_cuModuleLoadData_v2000, mn_cu_module_load_data, (CUmodule *m, const void *image), m, image)
MN_IP_DEFINE(module_load_data_ex, PFN_cuModuleLoadDataEx_v2010, mn_cu_module_load_data_ex, (CUmodule *m, const void *image, unsigned int n, CUjit_option *o, void **v), m, image, n, o, v)
MN_IP_DEFINE(module_load_fatbin, PFN_cuModuleLoadFatBinary_v2000, mn_cu_module_load_fat_binary, (CUmodule *m, const void *fatbin), m, fatbin)
MN_IP_DEFINE(module_load, PFN_cuModuleLoad_v2000, mn_cu_module_load, (CUmodule *m, const char *fname), m, fname)
MN_IP_DEFINE(module_unload, PFN_cuModuleUnload_v2000, mn_cu_module_unload, (CUmodule m), m)
MN_IP_DEFINE(module_get_function, PFN_cuModuleGetFunction_v2000, mn_cu_module_get_function, (CUfunction *f, CUmodule m, const char *name), f, m, name)
MN_IP_DEFINE(module_get_global, PFN_cuModuleGetGlobal_v3020, mn_cu_module_get_global, (CUdeviceptr *p, size_t *n, CUmodule m, const char *name), p, n, m, name)
MN_IP_DEFINE(kernel_get_function, PFN_cuKernelGetFunction_v12000, mn_cu_kernel_get_function, (CUfunction *f, CUkernel k), f, k)
MN_IP_DEFINE(tex_create, PFN_cuTexObjectCreate_v5000, mn_cu_tex_object_create, (CUtexObject *t, const CUDA_RESOURCE_DESC *r, const CUDA_TEXTURE_DESC *d, const CUDA_RESOURCE_VIEW_DESC *v), t, r, d, v)
MN_IP_DEFINE(tex_destroy, PFN_cuTexObjectDestroy_v5000, mn_cu_tex_object_destroy, (CUtexObject t), t)
MN_IP_DEFINE(surf_create, PFN_cuSurfObjectCreate_v5000, mn_cu_surf_object_create, (CUsurfObject *t, const CUDA_RESOURCE_DESC *r), t, r)
MN_IP_DEFINE(surf_destroy, PFN_cuSurfObjectDestroy_v5000, mn_cu_surf_object_destroy, (CUsurfObject t), t)
MN_IP_DEFINE(begin_capture_v1, PFN_cuStreamBeginCapture_v10000, mn_cu_stream_begin_capture_v1, (CUstream s), s)
MN_IP_DEFINE(begin_capture, PFN_cuStreamBeginCapture_v10010, mn_cu_stream_begin_capture, (CUstream s, CUstreamCaptureMode mode), s, mode)
MN_IP_DEFINE(begin_capture_graph, PFN_cuStreamBeginCaptureToGraph_v12030, mn_cu_stream_begin_capture_to_graph, (CUstream s, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode), s, g, deps, data, n, mode)
MN_IP_DEFINE(end_capture, PFN_cuStreamEndCapture_v10000, mn_cu_stream_end_capture, (CUstream s, CUgraph *g), s, g)
MN_IP_DEFINE(graph_inst_v1, PFN_cuGraphInstantiate_v10000, mn_cu_graph_instantiate_v1, (CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t n), e, g, err, log, n)
MN_IP_DEFINE(graph_inst_v2, PFN_cuGraphInstantiate_v11000, mn_cu_graph_instantiate_v1, (CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log, size_t n), e, g, err, log, n)
MN_IP_DEFINE(graph_inst_flags, PFN_cuGraphInstantiateWithFlags_v11040, mn_cu_graph_instantiate_with_flags, (CUgraphExec *e, CUgraph g, unsigned long long f), e, g, f)
MN_IP_DEFINE(graph_inst_v3, PFN_cuGraphInstantiateWithFlags_v11040, mn_cu_graph_instantiate_with_flags, (CUgraphExec *e, CUgraph g, unsigned long long f), e, g, f)
MN_IP_DEFINE(graph_inst_params, PFN_cuGraphInstantiateWithParams_v12000, mn_cu_graph_instantiate_with_params, (CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p), e, g, p)
MN_IP_DEFINE(graph_exec_destroy, PFN_cuGraphExecDestroy_v10000, mn_cu_graph_exec_destroy, (CUgraphExec e), e)
MN_IP_DEFINE(graph_kset_v1, PFN_cuGraphExecKernelNodeSetParams_v10010, mn_cu_graph_exec_kernel_set_v1, (CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v1 *p), e, n, p)
MN_IP_DEFINE(graph_kset, PFN_cuGraphExecKernelNodeSetParams_v12000, mn_cu_graph_exec_kernel_set, (CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS_v2 *p), e, n, p)
MN_IP_DEFINE(graph_cset, PFN_cuGraphExecMemcpyNodeSetParams_v10020, mn_cu_graph_exec_memcpy_set, (CUgraphExec e, CUgraphNode n, const CUDA_MEMCPY3D *p, CUcontext c), e, n, p, c)
MN_IP_DEFINE(graph_sset, PFN_cuGraphExecMemsetNodeSetParams_v10020, mn_cu_graph_exec_memset_set, (CUgraphExec e, CUgraphNode n, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext c), e, n, p, c)
MN_IP_DEFINE(graph_hset, PFN_cuGraphExecHostNodeSetParams_v10020, mn_cu_graph_exec_host_set, (CUgraphExec e, CUgraphNode n, const CUDA_HOST_NODE_PARAMS *p), e, n, p)
MN_IP_DEFINE(graph_gset, PFN_cuGraphExecChildGraphNodeSetParams_v11010, mn_cu_graph_exec_child_set, (CUgraphExec e, CUgraphNode n, CUgraph g), e, n, g)
MN_IP_DEFINE(graph_rset, PFN_cuGraphExecEventRecordNodeSetEvent_v11010, mn_cu_graph_exec_record_set, (CUgraphExec e, CUgraphNode n, CUevent ev), e, n, ev)
MN_IP_DEFINE(graph_wset, PFN_cuGraphExecEventWaitNodeSetEvent_v11010, mn_cu_graph_exec_wait_set, (CUgraphExec e, CUgraphNode n, CUevent ev), e, n, ev)
MN_IP_DEFINE(graph_nset, PFN_cuGraphExecNodeSetParams_v12020, mn_cu_graph_exec_node_set, (CUgraphExec e, CUgraphNode n, CUgraphNodeParams *p), e, n, p)
MN_IP_DEFINE(graph_enable, PFN_cuGraphNodeSetEnabled_v11060, mn_cu_graph_node_set_enabled, (CUgraphExec e, CUgraphNode n, unsigned int on), e, n, on)
MN_IP_DEFINE(graph_update_v1, PFN_cuGraphExecUpdate_v10020, mn_cu_graph_exec_update_v1, (CUgraphExec e, CUgraph g, CUgraphNode *err, CUgraphExecUpdateResult *res), e, g, err, res)
MN_IP_DEFINE(graph_update, PFN_cuGraphExecUpdate_v12000, mn_cu_graph_exec_update, (CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info), e, g, info)
MN_IP_DEFINE(graph_launch, PFN_cuGraphLaunch_v10000, mn_cu_graph_launch, (CUgraphExec e, CUstream s), e, s)
MN_IP_DEFINE(primary_release_v1, PFN_cuDevicePrimaryCtxRelease_v7000, mn_cu_primary_ctx_release, (CUdevice d), d)
MN_IP_DEFINE(primary_reset_v1, PFN_cuDevicePrimaryCtxReset_v7000, mn_cu_primary_ctx_reset, (CUdevice d), d)
MN_IP_DEFINE(primary_release, PFN_cuDevicePrimaryCtxRelease_v11000, mn_cu_primary_ctx_release, (CUdevice d), d)
MN_IP_DEFINE(primary_reset, PFN_cuDevicePrimaryCtxReset_v11000, mn_cu_primary_ctx_reset, (CUdevice d), d)
MN_IP_DEFINE(ctx_destroy_v1, PFN_cuCtxDestroy_v2000, mn_cu_ctx_destroy, (CUcontext c), c)
MN_IP_DEFINE(ctx_destroy, PFN_cuCtxDestroy_v4000, mn_cu_ctx_destroy, (CUcontext c), c)

mn_ip_entry mn_ip_table[] = {
    MN_IP_ENTRY(mem_alloc, "cuMemAlloc", "_v2", 3020, 0),
    MN_IP_ENTRY(mem_alloc_pitch, "cuMemAllocPitch", "_v2", 3020, 0),
    MN_IP_ENTRY(mem_free, "cuMemFree", "_v2", 3020, 0),
    MN_IP_ENTRY(mem_alloc_async, "cuMemAllocAsync", "", 11020, 0),
    MN_IP_ENTRY(mem_alloc_pool, "cuMemAllocFromPoolAsync", "", 11020, 0),
    MN_IP_ENTRY(mem_free_async, "cuMemFreeAsync", "", 11020, 0),
    MN_IP_ENTRY(mem_alloc_managed, "cuMemAllocManaged", "", 6000, 0),
    MN_IP_ENTRY(mem_alloc_host, "cuMemAllocHost", "_v2", 3020, 0),
    MN_IP_ENTRY(mem_host_alloc, "cuMemHostAlloc", "", 2020, 0),
    MN_IP_ENTRY(mem_free_host, "cuMemFreeHost", "", 2000, 0),
    MN_IP_ENTRY(mem_host_register_v1, "cuMemHostRegister", "", 4000, 6050),
    MN_IP_ENTRY(mem_host_register, "cuMemHostRegister", "_v2", 6050, 0),
    MN_IP_ENTRY(mem_host_unregister, "cuMemHostUnregister", "", 4000, 0),
    MN_IP_ENTRY(launch, "cuLaunchKernel", "", 4000, 0),
    MN_IP_ENTRY(launch_ex, "cuLaunchKernelEx", "", 11060, 0),
    MN_IP_ENTRY(launch_coop, "cuLaunchCooperativeKernel", "", 9000, 0),
    MN_IP_ENTRY(library_load_data, "cuLibraryLoadData", "", 12000, 0),
    MN_IP_ENTRY(library_load_file, "cuLibraryLoadFromFile", "", 12000, 0),
    MN_IP_ENTRY(library_unload, "cuLibraryUnload", "", 12000, 0),
    MN_IP_ENTRY(library_get_kernel, "cuLibraryGetKernel", "", 12000, 0),
    MN_IP_ENTRY(library_get_global, "cuLibraryGetGlobal", "", 12000, 0),
    MN_IP_ENTRY(library_get_managed, "cuLibraryGetManaged", "", 12000, 0),
    MN_IP_ENTRY(module_load_data, "cuModuleLoadData", "", 2000, 0),
    MN_IP_ENTRY(module_load_data_ex, "cuModuleLoadDataEx", "", 2010, 0),
    MN_IP_ENTRY(module_load_fatbin, "cuModuleLoadFatBinary", "", 2000, 0),
    MN_IP_ENTRY(module_load, "cuModuleLoad", "", 2000, 0),
    MN_IP_ENTRY(module_unload, "cuModuleUnload", "", 2000, 0),
    MN_IP_ENTRY(module_get_function, "cuModuleGetFunction", "", 2000, 0),
    MN_IP_ENTRY(module_get_global, "cuModuleGetGlobal", "_v2", 3020, 0),
    MN_IP_ENTRY(kernel_get_function, "cuKernelGetFunction", "", 12000, 0),
    MN_IP_ENTRY(tex_create, "cuTexObjectCreate", "", 5000, 0),
    MN_IP_ENTRY(tex_destroy, "cuTexObjectDestroy", "", 5000, 0),
    MN_IP_ENTRY(surf_create, "cuSurfObjectCreate", "", 5000, 0),
    MN_IP_ENTRY(surf_destroy, "cuSurfObjectDestroy", "", 5000, 0),
    MN_IP_ENTRY(begin_capture_v1, "cuStreamBeginCapture", "", 10000, 10010),
    MN_IP_ENTRY(begin_capture, "cuStreamBeginCapture", "_v2", 10010, 0),
    MN_IP_ENTRY(begin_capture_graph, "cuStreamBeginCaptureToGraph", "", 12030, 0),
    MN_IP_ENTRY(end_capture, "cuStreamEndCapture", "", 10000, 0),
    MN_IP_ENTRY(graph_inst_v1, "cuGraphInstantiate", "", 10000, 11000),
    MN_IP_ENTRY(graph_inst_v2, "cuGraphInstantiate", "_v2", 11000, 12000),
    MN_IP_ENTRY(graph_inst_flags, "cuGraphInstantiateWithFlags", "", 11040, 0),
    /* from 12.0 on, the name "cuGraphInstantiate" has cuGraphInstantiateWithFlags' ABI (cuda.h #defines one as
     * the other; tests/test_interpose.py ALIASES) */
    MN_IP_ENTRY(graph_inst_v3, "cuGraphInstantiate", "WithFlags", 12000, 0),
    MN_IP_ENTRY(graph_inst_params, "cuGraphInstantiateWithParams", "", 12000, 0),
    MN_IP_ENTRY(graph_exec_destroy, "cuGraphExecDestroy", "", 10000, 0),
    MN_IP_ENTRY(graph_kset_v1, "cuGraphExecKernelNodeSetParams", "", 10010, 12000),
    MN_IP_ENTRY(graph_kset, "cuGraphExecKernelNodeSetParams", "_v2", 12000, 0),
    MN_IP_ENTRY(graph_cset, "cuGraphExecMemcpyNodeSetParams", "", 10020, 0),
    MN_IP_ENTRY(graph_sset, "cuGraphExecMemsetNodeSetParams", "", 10020, 0),
    MN_IP_ENTRY(graph_hset, "cuGraphExecHostNodeSetParams", "", 10020, 0),
    MN_IP_ENTRY(graph_gset, "cuGraphExecChildGraphNodeSetParams", "", 11010, 0),
    MN_IP_ENTRY(graph_rset, "cuGraphExecEventRecordNodeSetEvent", "", 11010, 0),
    MN_IP_ENTRY(graph_wset, "cuGraphExecEventWaitNodeSetEvent", "", 11010, 0),
    MN_IP_ENTRY(graph_nset, "cuGraphExecNodeSetParams", "", 12020, 0),
    MN_IP_ENTRY(graph_enable, "cuGraphNodeSetEnabled", "", 11060, 0),
    MN_IP_ENTRY(graph_update_v1, "cuGraphExecUpdate", "", 10020, 12000),
    MN_IP_ENTRY(graph_update, "cuGraphExecUpdate", "_v2", 12000, 0),
    MN_IP_ENTRY(graph_launch, "cuGraphLaunch", "", 10000, 0),
    MN_IP_ENTRY(primary_release_v1, "cuDevicePrimaryCtxRelease", "", 7000, 11000),
    MN_IP_ENTRY(primary_reset_v1, "cuDevicePrimaryCtxReset", "", 7000, 11000),
    MN_IP_ENTRY(primary_release, "cuDevicePrimaryCtxRelease", "_v2", 11000, 0),
    MN_IP_ENTRY(primary_reset, "cuDevicePrimaryCtxReset", "_v2", 11000, 0),
    MN_IP_ENTRY(ctx_destroy_v1, "cuCtxDestroy", "", 2000, 4000),
    MN_IP_ENTRY(ctx_destroy, "cuCtxDestroy", "_v2", 4000, 0),
};
const size_t mn_ip_table_len = sizeof mn_ip_table / sizeof mn_ip_table[0];
