/* A stand-in libcuda.so.1 for the CPU test of librecord's managed-memory bookkeeping
 * (tests/test_record_managed.py): cuGetProcAddress over the memory calls the test makes. Managed memory
 * is plain host memory here; cuInit fails with CUDA_ERROR_NO_DEVICE as on this machine. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdlib.h>
#include <string.h>

static CUresult f_init(unsigned int flags) {
  (void)flags;
  return CUDA_ERROR_NO_DEVICE;
}
static CUresult f_managed(CUdeviceptr *p, size_t n, unsigned int flags) {
  (void)flags;
  void *m = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  *p = (CUdeviceptr)(uintptr_t)m;
  return m ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_free(CUdeviceptr p) {
  free((void *)(uintptr_t)p);
  return CUDA_SUCCESS;
}
static CUresult f_register(void *p, size_t n, unsigned int flags) {
  (void)p, (void)n, (void)flags;
  return CUDA_SUCCESS;
}
static CUresult f_unregister(void *p) {
  (void)p;
  return CUDA_SUCCESS;
}

CUresult gpa_old(const char *symbol, void **pfn, int version, cuuint64_t flags) __asm__("cuGetProcAddress");

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  (void)flags;
  void *p = NULL;
  if (!strcmp(symbol, "cuInit")) p = (void *)f_init;
  else if (!strcmp(symbol, "cuGetProcAddress")) p = version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)gpa_old;
  else if (!strcmp(symbol, "cuMemAllocManaged")) p = (void *)f_managed;
  else if (!strcmp(symbol, "cuMemFree")) p = (void *)f_free;
  else if (!strcmp(symbol, "cuMemHostRegister")) p = (void *)f_register;
  else if (!strcmp(symbol, "cuMemHostUnregister")) p = (void *)f_unregister;
  *pfn = p;
  if (status) *status = p ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
CUresult gpa_old(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
CUresult cuInit(unsigned int flags) { return f_init(flags); }
