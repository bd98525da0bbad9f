/* The driver calls librecord makes itself: the legacy-stream variants, asked of libcuda's own
 * cuGetProcAddress (native/interpose: mn_ip_real), so they never pass through librecord's wrappers.
 * The version of each is the CUDA version whose prototype the field has (cudaTypedefs.h): asking for a
 * newer one can return another ABI (cuCtxGetDevice at 13000 takes a second argument). */
#include "state.h"

#include <stdio.h>

mn_drv D;
static int loaded; /* 0 not yet, 1 ok, -1 failed */
static char load_error[256];

const char *mn_cu_err(CUresult r) {
  const char *s = NULL;
  if (D.getErrorString && D.getErrorString(r, &s) == CUDA_SUCCESS && s) return s;
  return "unknown driver error";
}

int mn_drv_load(char *why, size_t cap) {
  if (loaded) {
    if (loaded < 0) snprintf(why, cap, "%s", load_error);
    return loaded > 0 ? 0 : -1;
  }
  const char *missing = mn_ip_driver_missing();
  if (missing) {
    snprintf(load_error, sizeof load_error, "libcuda.so.1 cannot be loaded (%s): no NVIDIA driver on this machine", missing);
    snprintf(why, cap, "%s", load_error);
    loaded = -1;
    return -1;
  }
#define NEED(field, name, version)                                                                     \
  do {                                                                                                 \
    D.field = (__typeof__(D.field))mn_ip_real(name, version);                                          \
    if (!D.field) {                                                                                    \
      snprintf(load_error, sizeof load_error, "the driver lacks %s (libcuda.so.1 too old)", name);     \
      snprintf(why, cap, "%s", load_error);                                                            \
      loaded = -1;                                                                                     \
      return -1;                                                                                       \
    }                                                                                                  \
  } while (0)
#define WANT(field, name, version) D.field = (__typeof__(D.field))mn_ip_real(name, version)
  NEED(getErrorString, "cuGetErrorString", 6000);
  NEED(ctxGetDevice, "cuCtxGetDevice", 2000);
  NEED(ctxSynchronize, "cuCtxSynchronize", 2000);
  NEED(streamSynchronize, "cuStreamSynchronize", 2000);
  NEED(streamIsCapturing, "cuStreamIsCapturing", 10000);
  NEED(memcpyDtoH, "cuMemcpyDtoH", 3020);
  NEED(memcpyHtoD, "cuMemcpyHtoD", 3020);
  NEED(eventCreate, "cuEventCreate", 2000);
  NEED(eventDestroy, "cuEventDestroy", 4000);
  NEED(eventRecord, "cuEventRecord", 2000);
  NEED(eventQuery, "cuEventQuery", 2000);
  NEED(eventSynchronize, "cuEventSynchronize", 2000);
  NEED(eventElapsed, "cuEventElapsedTime", 2000);
  NEED(launchHostFunc, "cuLaunchHostFunc", 10000);
  NEED(hostRegister, "cuMemHostRegister", 6050);
  NEED(hostUnregister, "cuMemHostUnregister", 4000);
  NEED(hostAlloc, "cuMemHostAlloc", 2020);
  NEED(hostGetDevicePointer, "cuMemHostGetDevicePointer", 3020);
  NEED(freeHost, "cuMemFreeHost", 2000);
  NEED(allocPitch, "cuMemAllocPitch", 3020);
  NEED(memFree, "cuMemFree", 3020);
  NEED(libraryGetGlobal, "cuLibraryGetGlobal", 12000);
  NEED(moduleGetGlobal, "cuModuleGetGlobal", 3020);
  NEED(deviceGetName, "cuDeviceGetName", 2000);
  NEED(deviceGetAttribute, "cuDeviceGetAttribute", 2000);
  NEED(deviceTotalMem, "cuDeviceTotalMem", 3020);
  NEED(deviceGetUuid, "cuDeviceGetUuid", 9020);
  NEED(driverGetVersion, "cuDriverGetVersion", 2020);
  NEED(getGranularity, "cuMemGetAllocationGranularity", 10020);
  NEED(addressReserve, "cuMemAddressReserve", 10020);
  NEED(addressFree, "cuMemAddressFree", 10020);
  NEED(create, "cuMemCreate", 10020);
  NEED(release, "cuMemRelease", 10020);
  NEED(map, "cuMemMap", 10020);
  NEED(unmap, "cuMemUnmap", 10020);
  NEED(setAccess, "cuMemSetAccess", 10020);
  WANT(ctxGetLimit, "cuCtxGetLimit", 3010);
  WANT(streamWaitValue32, "cuStreamWaitValue32", 11070);
  WANT(funcGetParamInfo, "cuFuncGetParamInfo", 12040);
  WANT(funcIsLoaded, "cuFuncIsLoaded", 12040);
  WANT(funcLoad, "cuFuncLoad", 12040);
  WANT(funcGetName, "cuFuncGetName", 12030);
  WANT(kernelGetFunction, "cuKernelGetFunction", 12000);
  WANT(kernelGetName, "cuKernelGetName", 12030);
  WANT(array3DGetDescriptor, "cuArray3DGetDescriptor", 3020);
  WANT(mipmappedArrayGetLevel, "cuMipmappedArrayGetLevel", 5000);
  WANT(memcpy3D, "cuMemcpy3D", 3020);
#undef NEED
#undef WANT
  loaded = 1;
  return 0;
}
