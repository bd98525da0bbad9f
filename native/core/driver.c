/* Loading libcuda at run time, naming every failure, the watchdog waits, and the process's device. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core.h"

mnc_driver mnc_cu;
mnc_process mnc_g = {.ordinal = -1, .timeout_s = 60.0, .next_serial = 1};

static _Thread_local char err_text[4096];
static void *libcuda;
/* Recursive, so that a locked entry point may call another by mistake without deadlocking. */
static pthread_mutex_t lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;

void mnc_lock(void) { pthread_mutex_lock(&lock); }
void mnc_unlock(void) { pthread_mutex_unlock(&lock); }

const char *mnc_error(void) { return err_text; }

static int set_error(int status, const char *fmt, va_list ap) {
  vsnprintf(err_text, sizeof err_text, fmt, ap);
  return status;
}

int mnc_fail(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_error(status, fmt, ap);
  va_end(ap);
  if (status == MNC_E_TIMEOUT && !mnc_g.unusable) mnc_g.unusable = MNC_E_TIMEOUT;
  return status;
}

void mnc_append_error(const char *fmt, ...) {
  size_t used = strlen(err_text);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_text + used, sizeof err_text - used, fmt, ap);
  va_end(ap);
}

int mnc_is_sticky(int status) {
  switch (status) {
    case MNC_E_TIMEOUT:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
    case CUDA_ERROR_UNKNOWN:
      return 1;
    default:
      return 0;
  }
}

int mnc_unusable(void) { return mnc_g.unusable; }

const char *mnc_status_name(int status) {
  static _Thread_local char buf[48];
  switch (status) {
    case MNC_OK: return "MNEME_OK";
    case MNC_E_NO_DRIVER: return "MNEME_NO_DRIVER";
    case MNC_E_UNUSABLE: return "MNEME_CONTEXT_UNUSABLE";
    case MNC_E_TIMEOUT: return "MNEME_TIMEOUT";
    case MNC_E_NOT_GRANTED: return "MNEME_ADDRESS_NOT_GRANTED";
    case MNC_E_INVALID: return "MNEME_INVALID";
    case MNC_E_NOMEM: return "MNEME_NO_HOST_MEMORY";
    case MNC_E_SYSTEM: return "MNEME_SYSTEM_ERROR";
    case MNC_E_NO_DEVICE: return "MNEME_NO_DEVICE";
    default: break;
  }
  const char *name = NULL;
  if (status > 0 && mnc_g.loaded && mnc_cu.cuGetErrorName((CUresult)status, &name) == CUDA_SUCCESS && name)
    return name;
  snprintf(buf, sizeof buf, "CUDA_ERROR_%d", status);
  return buf;
}

int mnc_fail_cu(CUresult r, const char *what) {
  const char *desc = NULL;
  if (!mnc_g.loaded || mnc_cu.cuGetErrorString(r, &desc) != CUDA_SUCCESS || !desc) desc = "";
  int sticky = mnc_is_sticky((int)r);
  if (sticky && !mnc_g.unusable) mnc_g.unusable = (int)r;
  snprintf(err_text, sizeof err_text, "%s failed: %s (%d)%s%s%s", what, mnc_status_name((int)r), (int)r,
           *desc ? ": " : "", desc,
           sticky ? "; the CUDA context is now unusable, the process must be restarted" : "");
  return (int)r;
}

static int load_driver(void) {
  if (mnc_g.loaded) return 0;
  const char *path = getenv("MNEME_LIBCUDA");
  if (!path || !*path) path = "libcuda.so.1";
  if (!libcuda) libcuda = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!libcuda)
    return mnc_fail(MNC_E_NO_DRIVER,
                    "no NVIDIA driver: %s not found (%s); install the NVIDIA driver or set MNEME_LIBCUDA "
                    "to its libcuda.so.1",
                    path, dlerror());
  PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(libcuda, "cuGetProcAddress_v2");
  if (!gpa)
    return mnc_fail(MNC_E_NO_DRIVER,
                    "the NVIDIA driver in %s is too old: it lacks cuGetProcAddress_v2 (a CUDA 12.0 or newer "
                    "driver is needed)",
                    path);
  CUdriverProcAddressQueryResult found;
  void *fn;
  CUresult r;
#define MNC_RESOLVE(name, type)                                                                       \
  fn = NULL;                                                                                          \
  found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;                                                       \
  r = gpa(#name, &fn, MNC_CUDA_ABI, CU_GET_PROC_ADDRESS_DEFAULT, &found);                             \
  if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || !fn)                               \
    return mnc_fail(MNC_E_NO_DRIVER,                                                                  \
                    "the NVIDIA driver in %s does not provide " #name " for CUDA %d (result %d, "     \
                    "query %d); a CUDA 12.0 or newer driver is needed",                               \
                    path, MNC_CUDA_ABI, (int)r, (int)found);                                          \
  memcpy(&mnc_cu.name, &fn, sizeof fn);
  MNC_DRIVER_FUNCS(MNC_RESOLVE)
#undef MNC_RESOLVE
  fn = NULL;
  if (gpa("cuFuncGetParamInfo", &fn, 12040, CU_GET_PROC_ADDRESS_DEFAULT, &found) == CUDA_SUCCESS &&
      found == CU_GET_PROC_ADDRESS_SUCCESS && fn)
    memcpy(&mnc_cu.param_info, &fn, sizeof fn);
  mnc_g.loaded = 1;
  return 0;
}

static int init_driver(void) {
  MNC_TRY(load_driver());
  MNC_CU(mnc_cu.cuInit(0), "cuInit");
  return 0;
}

int mnc_driver_load(void) {
  mnc_lock();
  int s = init_driver();
  mnc_unlock();
  return s;
}

int mnc_driver_version(int *version) {
  mnc_lock();
  int s = load_driver();
  if (!s && mnc_cu.cuDriverGetVersion(version) != CUDA_SUCCESS)
    s = mnc_fail(MNC_E_NO_DRIVER, "cuDriverGetVersion failed");
  mnc_unlock();
  return s;
}

int mnc_device_count(int *count) {
  mnc_lock();
  *count = 0;
  int s = init_driver();
  if (!s) {
    CUresult r = mnc_cu.cuDeviceGetCount(count);
    if (r != CUDA_SUCCESS) s = mnc_fail_cu(r, "cuDeviceGetCount");
  }
  mnc_unlock();
  return s;
}

int mnc_enter(void) {
  if (!mnc_g.loaded) {
    MNC_TRY(load_driver());
  }
  if (mnc_g.unusable)
    return mnc_fail(MNC_E_UNUSABLE,
                    "refused: the CUDA context is unusable since %s (%d); restart the process to use the GPU "
                    "again",
                    mnc_status_name(mnc_g.unusable), mnc_g.unusable);
  if (mnc_g.ordinal < 0)
    return mnc_fail(MNC_E_NO_DEVICE, "no device is open in this process (open one with Device(ordinal))");
  MNC_CU(mnc_cu.cuCtxSetCurrent(mnc_g.ctx), "cuCtxSetCurrent");
  return 0;
}

static int ctx_limit(int which, uint64_t value, uint64_t *now) {
  MNC_TRY(mnc_enter());
  size_t cur = 0;
  MNC_CU(mnc_cu.cuCtxGetLimit(&cur, (CUlimit)which), "cuCtxGetLimit");
  if (value != UINT64_MAX && (uint64_t)cur != value) {
    CUresult r = mnc_cu.cuCtxSetLimit((CUlimit)which, (size_t)value);
    if (r != CUDA_SUCCESS) {
      *now = (uint64_t)cur;
      return mnc_fail_cu(r, "cuCtxSetLimit");
    }
    MNC_CU(mnc_cu.cuCtxGetLimit(&cur, (CUlimit)which), "cuCtxGetLimit");
  }
  *now = (uint64_t)cur;
  return 0;
}

int mnc_ctx_limit(int which, uint64_t value, uint64_t *now) {
  if (!now) return mnc_fail(MNC_E_INVALID, "mnc_ctx_limit: now is NULL");
  mnc_lock();
  int s = ctx_limit(which, value, now);
  mnc_unlock();
  return s;
}

void mnc_set_timeout(double seconds) {
  mnc_lock();
  mnc_g.timeout_s = seconds > 0 ? seconds : 60.0;
  mnc_unlock();
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Polls `query` until it stops answering NOT_READY. Yields for the first millisecond (short kernels
 * finish there), then sleeps in growing steps up to 1 ms; never blocks inside the driver. */
static int poll_until(CUresult (*query)(void *), void *arg, const char *what) {
  double start = now_s(), deadline = start + mnc_g.timeout_s;
  for (;;) {
    CUresult r = query(arg);
    if (r == CUDA_SUCCESS) return 0;
    if (r != CUDA_ERROR_NOT_READY) return mnc_fail_cu(r, what);
    double t = now_s();
    if (t > deadline)
      return mnc_fail(MNC_E_TIMEOUT,
                      "%s: still running after %.1f s (watchdog); the CUDA context is now unusable, the process "
                      "must be restarted",
                      what, t - start);
    double waited = t - start;
    if (waited < 1e-3) {
      sched_yield();
    } else {
      long ns = waited < 0.1 ? 20000L : 1000000L;
      struct timespec ts = {0, ns};
      nanosleep(&ts, NULL);
    }
  }
}

static CUresult query_stream(void *s) { return mnc_cu.cuStreamQuery((CUstream)s); }
static CUresult query_event(void *e) { return mnc_cu.cuEventQuery((CUevent)e); }

int mnc_wait_stream(const char *what) { return poll_until(query_stream, mnc_g.stream, what); }
int mnc_wait_event(CUevent ev, const char *what) { return poll_until(query_event, ev, what); }

static int attr(CUdevice dev, int *out, CUdevice_attribute a, const char *name) {
  CUresult r = mnc_cu.cuDeviceGetAttribute(out, a, dev);
  if (r != CUDA_SUCCESS) {
    char what[128];
    snprintf(what, sizeof what, "cuDeviceGetAttribute(%s)", name);
    return mnc_fail_cu(r, what);
  }
  return 0;
}

static int fill_info(CUdevice dev, int ordinal, mnc_device_info *info) {
  memset(info, 0, sizeof *info);
  info->ordinal = ordinal;
  MNC_CU(mnc_cu.cuDeviceGetName(info->name, (int)sizeof info->name - 1, dev), "cuDeviceGetName");
  MNC_CU(mnc_cu.cuDeviceGetPCIBusId(info->pci_bus_id, (int)sizeof info->pci_bus_id - 1, dev),
         "cuDeviceGetPCIBusId");
  CUuuid uuid;
  MNC_CU(mnc_cu.cuDeviceGetUuid(&uuid, dev), "cuDeviceGetUuid");
  memcpy(info->uuid, uuid.bytes, sizeof info->uuid);
  size_t total = 0;
  MNC_CU(mnc_cu.cuDeviceTotalMem(&total, dev), "cuDeviceTotalMem");
  info->total_mem = total;
  MNC_CU(mnc_cu.cuDriverGetVersion(&info->driver_version), "cuDriverGetVersion");
#define MNC_ATTR(field, a) MNC_TRY(attr(dev, &info->field, a, #a));
  MNC_ATTR(cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
  MNC_ATTR(cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
  MNC_ATTR(sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
  MNC_ATTR(l2_size, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
  MNC_ATTR(max_shared_per_block, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)
  MNC_ATTR(max_shared_per_block_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
  MNC_ATTR(max_shared_per_sm, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
  MNC_ATTR(max_threads_per_block, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
  MNC_ATTR(max_threads_per_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
  MNC_ATTR(max_blocks_per_sm, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)
  MNC_ATTR(max_regs_per_block, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK)
  MNC_ATTR(max_regs_per_sm, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)
  MNC_ATTR(warp_size, CU_DEVICE_ATTRIBUTE_WARP_SIZE)
  MNC_ATTR(clock_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
  MNC_ATTR(mem_clock_khz, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)
  MNC_ATTR(mem_bus_width, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
  MNC_ATTR(unified_addressing, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)
  MNC_ATTR(host_pointer_for_registered_mem, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM)
  MNC_ATTR(virtual_memory_management, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
#undef MNC_ATTR
  return 0;
}

static void release_device(void) {
  /* Best effort: a broken context may refuse these; the process is then about to end anyway. */
  if (mnc_g.cmp_module) mnc_cu.cuModuleUnload(mnc_g.cmp_module);
  if (mnc_g.cmp_out) mnc_cu.cuMemFree(mnc_g.cmp_out);
  if (mnc_g.cmp_scratch) mnc_cu.cuMemFree(mnc_g.cmp_scratch);
  if (mnc_g.flush_buf) mnc_cu.cuMemFree(mnc_g.flush_buf);
  if (mnc_g.staging) mnc_cu.cuMemFreeHost(mnc_g.staging);
  for (int i = 0; i < 2; i++)
    if (mnc_g.ev_half[i]) mnc_cu.cuEventDestroy(mnc_g.ev_half[i]);
  if (mnc_g.ev_start) mnc_cu.cuEventDestroy(mnc_g.ev_start);
  if (mnc_g.ev_end) mnc_cu.cuEventDestroy(mnc_g.ev_end);
  if (mnc_g.stream) mnc_cu.cuStreamDestroy(mnc_g.stream);
  if (mnc_g.ctx) mnc_cu.cuDevicePrimaryCtxRelease(mnc_g.dev);
  mnc_g.cmp_module = NULL;
  mnc_g.cmp_bytes = mnc_g.cmp_values = mnc_g.hold = NULL;
  mnc_g.cmp_out = mnc_g.cmp_scratch = mnc_g.flush_buf = 0;
  mnc_g.cmp_scratch_bytes = mnc_g.flush_bytes = 0;
  mnc_g.staging = NULL;
  mnc_g.ev_half[0] = mnc_g.ev_half[1] = mnc_g.ev_start = mnc_g.ev_end = NULL;
  mnc_g.stream = NULL;
  mnc_g.ctx = NULL;
  mnc_g.ordinal = -1;
}

static int open_device(int ordinal, mnc_device_info *info) {
  MNC_TRY(init_driver());
  if (mnc_g.unusable) return mnc_enter();
  if (mnc_g.ordinal == ordinal) {
    MNC_CU(mnc_cu.cuCtxSetCurrent(mnc_g.ctx), "cuCtxSetCurrent");
    return info ? fill_info(mnc_g.dev, ordinal, info) : 0;
  }
  if (mnc_g.ordinal >= 0) {
    if (mnc_g.resources)
      return mnc_fail(MNC_E_INVALID,
                      "cannot switch from device %d to %d: %llu arena(s), module(s) or state(s) of device %d "
                      "are still alive; free them first",
                      mnc_g.ordinal, ordinal, (unsigned long long)mnc_g.resources, mnc_g.ordinal);
    release_device();
  }
  int count = 0;
  MNC_CU(mnc_cu.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (ordinal < 0 || ordinal >= count)
    return mnc_fail(MNC_E_INVALID, "device %d does not exist: this machine has %d CUDA device(s)", ordinal, count);
  MNC_CU(mnc_cu.cuDeviceGet(&mnc_g.dev, ordinal), "cuDeviceGet");
  MNC_CU(mnc_cu.cuDevicePrimaryCtxRetain(&mnc_g.ctx, mnc_g.dev), "cuDevicePrimaryCtxRetain");
  mnc_g.ordinal = ordinal;
  int s = 0;
  CUresult r;
  if ((r = mnc_cu.cuCtxSetCurrent(mnc_g.ctx)) != CUDA_SUCCESS) s = mnc_fail_cu(r, "cuCtxSetCurrent");
  else if ((r = mnc_cu.cuStreamCreate(&mnc_g.stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
    s = mnc_fail_cu(r, "cuStreamCreate");
  else if ((r = mnc_cu.cuEventCreate(&mnc_g.ev_start, CU_EVENT_DEFAULT)) != CUDA_SUCCESS ||
           (r = mnc_cu.cuEventCreate(&mnc_g.ev_end, CU_EVENT_DEFAULT)) != CUDA_SUCCESS ||
           (r = mnc_cu.cuEventCreate(&mnc_g.ev_half[0], CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS ||
           (r = mnc_cu.cuEventCreate(&mnc_g.ev_half[1], CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS)
    s = mnc_fail_cu(r, "cuEventCreate");
  else if ((r = mnc_cu.cuDeviceGetAttribute(&mnc_g.l2_size, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, mnc_g.dev)) !=
               CUDA_SUCCESS ||
           (r = mnc_cu.cuDeviceGetAttribute(&mnc_g.max_shared_optin,
                                            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, mnc_g.dev)) !=
               CUDA_SUCCESS)
    s = mnc_fail_cu(r, "cuDeviceGetAttribute");
  else if (info)
    s = fill_info(mnc_g.dev, ordinal, info);
  if (s) release_device();
  return s;
}

static int device_info(int ordinal, mnc_device_info *info) {
  MNC_TRY(init_driver());
  int count = 0;
  MNC_CU(mnc_cu.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (ordinal < 0 || ordinal >= count)
    return mnc_fail(MNC_E_INVALID, "device %d does not exist: this machine has %d CUDA device(s)", ordinal, count);
  CUdevice dev;
  MNC_CU(mnc_cu.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  return fill_info(dev, ordinal, info);
}

int mnc_device_query(int ordinal, mnc_device_info *info) {
  mnc_lock();
  int s = device_info(ordinal, info);
  mnc_unlock();
  return s;
}

int mnc_device_open(int ordinal, mnc_device_info *info) {
  mnc_lock();
  int s = open_device(ordinal, info);
  mnc_unlock();
  return s;
}

int mnc_device_close(void) {
  mnc_lock();
  int s = 0;
  if (mnc_g.ordinal >= 0) {
    if (mnc_g.resources)
      s = mnc_fail(MNC_E_INVALID, "device %d still holds %llu arena(s), module(s) or state(s); free them first",
                   mnc_g.ordinal, (unsigned long long)mnc_g.resources);
    else if (!mnc_g.unusable)
      release_device();
  }
  mnc_unlock();
  return s;
}

int mnc_device_current(void) { return mnc_g.ordinal; }
