/* Modules from cubin bytes, their kernels, and the recorded variables written into them. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define MNC_JIT_LOG 8192

int mnc_module_load_nolock(const void *image, uint64_t size, mnc_module **out) {
  *out = NULL;
  MNC_TRY(mnc_enter());
  if (!image || !size) return mnc_fail(MNC_E_INVALID, "empty module image");
  /* The driver reads ELF headers in place and PTX up to its NUL: give it an aligned, terminated copy. */
  void *copy = NULL;
  if (posix_memalign(&copy, 64, size + 1) != 0) return mnc_fail(MNC_E_NOMEM, "out of host memory");
  memcpy(copy, image, size);
  ((char *)copy)[size] = 0;
  char *log = calloc(1, MNC_JIT_LOG);
  mnc_module *m = calloc(1, sizeof *m);
  if (!log || !m) {
    free(copy);
    free(log);
    free(m);
    return mnc_fail(MNC_E_NOMEM, "out of host memory");
  }
  CUjit_option opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *vals[2] = {log, (void *)(uintptr_t)(MNC_JIT_LOG - 1)};
  CUresult r = mnc_cu.cuModuleLoadDataEx(&m->mod, copy, 2, opts, vals);
  free(copy);
  if (r != CUDA_SUCCESS) {
    int s = mnc_fail_cu(r, "cuModuleLoadData");
    if (*log) mnc_append_error("; driver log: %s", log);
    free(log);
    free(m);
    return s;
  }
  free(log);
  m->serial = mnc_g.next_serial++;
  mnc_g.resources++;
  *out = m;
  return 0;
}

int mnc_module_load(const void *image, uint64_t size, mnc_module **out) {
  mnc_lock();
  int s = mnc_module_load_nolock(image, size, out);
  mnc_unlock();
  return s;
}

static void free_function(mnc_function *f) {
  free(f->name);
  free(f->param_offsets);
  free(f->param_sizes);
  free(f);
}

static void free_module_host(mnc_module *m) {
  for (uint32_t i = 0; i < m->nfuncs; i++) free_function(m->funcs[i]);
  for (uint32_t i = 0; i < m->nskipped; i++) free(m->skipped[i]);
  free(m->skipped);
  free(m->funcs);
  free(m->vars);
  free(m->code_from);
  free(m->code_to);
  free(m);
}

int mnc_module_unload(mnc_module *m) {
  if (!m) return 0;
  mnc_lock();
  mnc_g.resources--;
  int s = 0;
  if (!mnc_g.unusable && !(s = mnc_enter())) {
    CUresult r;
    if (m->var_shadow && (r = mnc_cu.cuMemFree(m->var_shadow)) != CUDA_SUCCESS) s = mnc_fail_cu(r, "cuMemFree");
    if ((r = mnc_cu.cuModuleUnload(m->mod)) != CUDA_SUCCESS && !s) s = mnc_fail_cu(r, "cuModuleUnload");
  }
  free_module_host(m);
  mnc_unlock();
  return s;
}

/* The kernel's parameter layout from the driver (cuFuncGetParamInfo answers INVALID_VALUE past the last). */
static int read_params(mnc_function *f) {
  if (!mnc_cu.param_info) return 0;
  uint32_t cap = 0, n = 0;
  for (;; n++) {
    size_t off = 0, size = 0;
    CUresult r = mnc_cu.param_info(f->fn, n, &off, &size);
    if (r == CUDA_ERROR_INVALID_VALUE) break;
    if (r != CUDA_SUCCESS) return mnc_fail_cu(r, "cuFuncGetParamInfo");
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      uint32_t *o = realloc(f->param_offsets, cap * sizeof *o);
      if (o) f->param_offsets = o;
      uint32_t *z = realloc(f->param_sizes, cap * sizeof *z);
      if (z) f->param_sizes = z;
      if (!o || !z) return mnc_fail(MNC_E_NOMEM, "out of host memory");
    }
    f->param_offsets[n] = (uint32_t)off;
    f->param_sizes[n] = (uint32_t)size;
  }
  f->nparams = (int)n;
  return 0;
}

int mnc_function_params(mnc_function *f, int *count, uint32_t *offsets, uint32_t *sizes, uint32_t capacity) {
  if (!f) return mnc_fail(MNC_E_INVALID, "no function");
  *count = f->nparams;
  for (int i = 0; i < f->nparams && (uint32_t)i < capacity; i++) {
    offsets[i] = f->param_offsets[i];
    sizes[i] = f->param_sizes[i];
  }
  return 0;
}

static int module_function(mnc_module *m, const char *name, mnc_function **out) {
  *out = NULL;
  MNC_TRY(mnc_enter());
  for (uint32_t i = 0; i < m->nfuncs; i++)
    if (!strcmp(m->funcs[i]->name, name)) {
      *out = m->funcs[i];
      return 0;
    }
  CUfunction fn = NULL;
  CUresult r = mnc_cu.cuModuleGetFunction(&fn, m->mod, name);
  if (r != CUDA_SUCCESS) {
    char what[512];
    snprintf(what, sizeof what, "cuModuleGetFunction(\"%.400s\")", name);
    return mnc_fail_cu(r, what);
  }
  mnc_function **grown = realloc(m->funcs, (m->nfuncs + 1) * sizeof *grown);
  mnc_function *f = calloc(1, sizeof *f);
  char *dup = strdup(name);
  if (grown) m->funcs = grown;
  if (!grown || !f || !dup) {
    free(f);
    free(dup);
    return mnc_fail(MNC_E_NOMEM, "out of host memory");
  }
  f->fn = fn;
  f->module = m;
  f->name = dup;
  f->nparams = -1;
  int s = read_params(f);
  if (s) {
    free_function(f);
    return s;
  }
  m->funcs[m->nfuncs++] = f;
  *out = f;
  return 0;
}

int mnc_module_function(mnc_module *m, const char *name, mnc_function **out) {
  mnc_lock();
  int s = m && name ? module_function(m, name, out) : mnc_fail(MNC_E_INVALID, "no module or name");
  mnc_unlock();
  return s;
}

static int func_attr(mnc_function *f, CUfunction_attribute a, int *out, const char *name) {
  CUresult r = mnc_cu.cuFuncGetAttribute(out, a, f->fn);
  if (r != CUDA_SUCCESS) {
    char what[128];
    snprintf(what, sizeof what, "cuFuncGetAttribute(%s)", name);
    return mnc_fail_cu(r, what);
  }
  return 0;
}

static int function_attrs(mnc_function *f, mnc_func_attrs *o) {
  MNC_TRY(mnc_enter());
  memset(o, 0, sizeof *o);
#define MNC_FA(field, a) MNC_TRY(func_attr(f, a, &o->field, #a));
  MNC_FA(num_regs, CU_FUNC_ATTRIBUTE_NUM_REGS)
  MNC_FA(local_bytes, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
  MNC_FA(const_bytes, CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES)
  MNC_FA(static_shared_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
  MNC_FA(max_threads_per_block, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
  MNC_FA(ptx_version, CU_FUNC_ATTRIBUTE_PTX_VERSION)
  MNC_FA(binary_version, CU_FUNC_ATTRIBUTE_BINARY_VERSION)
  MNC_FA(max_dynamic_shared_bytes, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
#undef MNC_FA
  return 0;
}

int mnc_function_attrs(mnc_function *f, mnc_func_attrs *out) {
  mnc_lock();
  int s = f ? function_attrs(f, out) : mnc_fail(MNC_E_INVALID, "no function");
  mnc_unlock();
  return s;
}

int mnc_set_dynamic_shared(mnc_function *f, uint32_t bytes) {
  if (bytes <= 48u * 1024u || bytes <= f->dyn_shared_set) return 0;
  if (mnc_g.max_shared_optin > 0 && bytes > (uint32_t)mnc_g.max_shared_optin)
    return mnc_fail(MNC_E_INVALID,
                    "dynamic shared memory of %u bytes exceeds this device's opt-in limit of %d bytes per block",
                    bytes, mnc_g.max_shared_optin);
  MNC_CU(mnc_cu.cuFuncSetAttribute(f->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)bytes),
         "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
  f->dyn_shared_set = bytes;
  return 0;
}

static int occupancy(mnc_function *f, int block_threads, uint64_t dyn, int *blocks) {
  *blocks = 0;
  MNC_TRY(mnc_enter());
  if (dyn > 0xffffffffu) return mnc_fail(MNC_E_INVALID, "dynamic shared memory %llu too large", (unsigned long long)dyn);
  MNC_TRY(mnc_set_dynamic_shared(f, (uint32_t)dyn));
  MNC_CU(mnc_cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(blocks, f->fn, block_threads, (size_t)dyn),
         "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  return 0;
}

int mnc_function_occupancy(mnc_function *f, int block_threads, uint64_t dynamic_shared, int *blocks) {
  mnc_lock();
  int s = f ? occupancy(f, block_threads, dynamic_shared, blocks) : mnc_fail(MNC_E_INVALID, "no function");
  mnc_unlock();
  return s;
}

/* ---- variables ---- */

static const mnc_var_slot *slot_by_name(const mnc_module *m, const char *name) {
  for (uint32_t i = 0; i < m->nvars; i++)
    if (m->vars[i].rec && m->vars[i].rec->name && !strcmp(m->vars[i].rec->name, name)) return &m->vars[i];
  return NULL;
}

const mnc_var_slot *mnc_module_find_var(const mnc_module *m, uint64_t addr, uint64_t n) {
  if (!m) return NULL;
  for (uint32_t i = 0; i < m->nvars; i++) {
    const mnc_var_slot *v = &m->vars[i];
    if (v->addr && addr >= v->rec->addr && n <= v->rec->size && addr - v->rec->addr <= v->rec->size - n) return v;
  }
  return NULL;
}

/* Address words whose recorded value still points at (target + target_offset) are moved to the
 * target's address in this module; other values (the kernel stored something else) stay. */
int mnc_relocate(const mnc_module *m, const mn_var *v, const uint8_t *data, uint8_t *out) {
  memcpy(out, data, v->size);
  for (uint32_t k = 0; k < v->nrelocs; k++) {
    const mn_reloc *rl = &v->relocs[k];
    if (!rl->target) continue;
    if (rl->offset > v->size || v->size - rl->offset < 8)
      return mnc_fail(MNC_E_INVALID, "variable %s: relocation at offset %llu lies outside its %llu bytes", v->name,
                      (unsigned long long)rl->offset, (unsigned long long)v->size);
    const mnc_var_slot *t = slot_by_name(m, rl->target);
    if (!t || !t->addr) continue; /* target optimized away: nothing can dereference it */
    uint64_t old, now;
    memcpy(&old, out + rl->offset, 8);
    if (old != t->rec->addr + rl->target_offset) continue;
    now = t->addr + rl->target_offset;
    memcpy(out + rl->offset, &now, 8);
  }
  if (m->ncode && v->addr % 8 == 0)
    for (uint64_t o = 0; o + 8 <= v->size; o += 8) {
      uint64_t w;
      memcpy(&w, out + o, 8);
      for (uint32_t k = 0; w && k < m->ncode; k++)
        if (w == m->code_from[k]) {
          memcpy(out + o, &m->code_to[k], 8);
          break;
        }
    }
  return 0;
}

int mnc_module_set_code_map(mnc_module *m, uint32_t n, const uint64_t *from, const uint64_t *to) {
  mnc_lock();
  int s = 0;
  uint64_t *f = NULL, *t = NULL;
  if (!m || (n && (!from || !to)))
    s = mnc_fail(MNC_E_INVALID, "no module or no addresses");
  else if (m->vars_from)
    s = mnc_fail(MNC_E_INVALID, "the code map must be set before the variables are loaded");
  else if (n && (!(f = malloc(n * sizeof *f)) || !(t = malloc(n * sizeof *t))))
    s = mnc_fail(MNC_E_NOMEM, "out of host memory");
  if (!s) {
    if (n) {
      memcpy(f, from, n * sizeof *f);
      memcpy(t, to, n * sizeof *t);
    }
    free(m->code_from);
    free(m->code_to);
    m->code_from = f;
    m->code_to = t;
    m->ncode = n;
  } else {
    free(f);
    free(t);
  }
  mnc_unlock();
  return s;
}

static int add_skipped(mnc_module *m, const char *name) {
  char **grown = realloc(m->skipped, (m->nskipped + 1) * sizeof *grown);
  if (!grown) return mnc_fail(MNC_E_NOMEM, "out of host memory");
  m->skipped = grown;
  if (!(m->skipped[m->nskipped] = strdup(name))) return mnc_fail(MNC_E_NOMEM, "out of host memory");
  m->nskipped++;
  return 0;
}

/* Uploads every present variable (relocated) to the module and to its device-side copy. */
static int write_vars(mnc_module *m) {
  uint8_t *buf = m->var_shadow_bytes ? calloc(1, m->var_shadow_bytes) : NULL;
  if (m->var_shadow_bytes && !buf) return mnc_fail(MNC_E_NOMEM, "out of host memory for variables");
  int s = 0;
  for (uint32_t i = 0; i < m->nvars && !s; i++) {
    mnc_var_slot *v = &m->vars[i];
    if (v->addr) s = mnc_relocate(m, v->rec, v->rec->data, buf + v->shadow_off);
  }
  if (!s && m->var_shadow_bytes) s = mnc_upload(m->var_shadow, buf, m->var_shadow_bytes);
  for (uint32_t i = 0; i < m->nvars && !s; i++) {
    mnc_var_slot *v = &m->vars[i];
    if (!v->addr) continue;
    CUresult r = mnc_cu.cuMemcpyDtoDAsync(v->addr, m->var_shadow + v->shadow_off, v->rec->size, mnc_g.stream);
    if (r != CUDA_SUCCESS) s = mnc_fail_cu(r, "cuMemcpyDtoDAsync(variable)");
  }
  if (!s) s = mnc_wait_stream("writing variables");
  free(buf);
  return s;
}

int mnc_module_reload_vars(mnc_module *m) { return m && m->vars_from ? write_vars(m) : 0; }

static int load_vars(mnc_module *m, const mn_snapshot *pro, uint32_t *skipped) {
  MNC_TRY(mnc_enter());
  if (m->vars_from) return mnc_fail(MNC_E_INVALID, "variables were already loaded into this module");
  mnc_var_slot *slots = pro->nvars ? calloc(pro->nvars, sizeof *slots) : NULL;
  if (pro->nvars && !slots) return mnc_fail(MNC_E_NOMEM, "out of host memory");
  m->vars = slots;
  m->nvars = pro->nvars;
  uint64_t total = 0;
  for (uint32_t i = 0; i < pro->nvars; i++) {
    const mn_var *v = &pro->vars[i];
    slots[i].rec = v;
    CUdeviceptr d = 0;
    size_t bytes = 0;
    CUresult r = mnc_cu.cuModuleGetGlobal(&d, &bytes, m->mod, v->name);
    if (r == CUDA_ERROR_NOT_FOUND) {
      MNC_TRY(add_skipped(m, v->name));
      continue;
    }
    if (r != CUDA_SUCCESS) {
      char what[512];
      snprintf(what, sizeof what, "cuModuleGetGlobal(\"%.400s\")", v->name);
      return mnc_fail_cu(r, what);
    }
    if (bytes != v->size)
      return mnc_fail(MNC_E_INVALID,
                      "variable %s has %zu bytes in the module but %llu in the snapshot %s; the IR and the "
                      "recording do not belong together",
                      v->name, bytes, (unsigned long long)v->size, pro->path ? pro->path : "");
    slots[i].addr = d;
    slots[i].size = bytes;
    slots[i].shadow_off = total;
    total += (v->size + 255) / 256 * 256;
  }
  if (total) {
    MNC_CU(mnc_cu.cuMemAlloc(&m->var_shadow, total), "cuMemAlloc(variable copies)");
    m->var_shadow_bytes = total;
  }
  m->vars_from = pro;
  *skipped = m->nskipped;
  return write_vars(m);
}

int mnc_module_load_vars(mnc_module *m, const mn_snapshot *prologue, uint32_t *skipped) {
  mnc_lock();
  *skipped = 0;
  int s = m && prologue ? load_vars(m, prologue, skipped) : mnc_fail(MNC_E_INVALID, "no module or snapshot");
  mnc_unlock();
  return s;
}

const char *mnc_module_skipped(const mnc_module *m, uint32_t i) {
  return m && i < m->nskipped ? m->skipped[i] : NULL;
}

int mnc_module_global(mnc_module *m, const char *name, uint64_t *addr, uint64_t *size) {
  mnc_lock();
  *addr = *size = 0;
  int s = mnc_enter();
  if (!s) {
    CUdeviceptr d = 0;
    size_t bytes = 0;
    CUresult r = mnc_cu.cuModuleGetGlobal(&d, &bytes, m->mod, name);
    if (r == CUDA_ERROR_NOT_FOUND)
      s = mnc_fail(MNC_E_INVALID, "the module has no variable %s", name);
    else if (r != CUDA_SUCCESS)
      s = mnc_fail_cu(r, "cuModuleGetGlobal");
    *addr = d;
    *size = bytes;
  }
  mnc_unlock();
  return s;
}
