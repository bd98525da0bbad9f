/* Texture and surface objects in replay: the prologue's CUDA arrays are created again with their
 * recorded layout and contents, the objects with their recorded descriptors (core.cdef says what
 * each call does). Copies run on the core's stream and are waited for with the watchdog. */
#include "core.h"

#include <stdlib.h>
#include <string.h>

#define MNC_MAX_LEVELS 16

typedef struct tex_array {
  const mn_array *rec;
  CUarray plain;
  CUmipmappedArray mip;
  CUarray levels[MNC_MAX_LEVELS];
  uint32_t nlevels;
} tex_array;

typedef struct tex_obj {
  uint64_t recorded, now;
  int surface;
} tex_obj;

struct mnc_textures {
  const mn_snapshot *prologue;
  tex_array *arrays;
  uint32_t narrays;
  tex_obj *objs;
  uint32_t nobjs;
};

static int array_copy(tex_array *a, void *host, int to_device) {
  const mn_array *r = a->rec;
  uint64_t elem = (uint64_t)mn_format_bytes(r->format) * r->channels, off = 0;
  for (uint32_t l = 0; l < a->nlevels; l++) {
    uint64_t d[3];
    mn_array_level_dims(r, l, d);
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    if (to_device) {
      c.srcMemoryType = CU_MEMORYTYPE_HOST, c.srcHost = (uint8_t *)host + off, c.srcPitch = d[0] * elem;
      c.srcHeight = d[1];
      c.dstMemoryType = CU_MEMORYTYPE_ARRAY, c.dstArray = a->levels[l];
    } else {
      c.srcMemoryType = CU_MEMORYTYPE_ARRAY, c.srcArray = a->levels[l];
      c.dstMemoryType = CU_MEMORYTYPE_HOST, c.dstHost = (uint8_t *)host + off, c.dstPitch = d[0] * elem;
      c.dstHeight = d[1];
    }
    c.WidthInBytes = d[0] * elem, c.Height = d[1], c.Depth = d[2];
    MNC_CU(mnc_cu.cuMemcpy3DAsync(&c, mnc_g.stream), to_device ? "cuMemcpy3DAsync(to an array)" : "cuMemcpy3DAsync(from an array)");
    off += d[0] * d[1] * d[2] * elem;
  }
  return mnc_wait_stream(to_device ? "uploading an array" : "reading an array");
}

static int array_create(tex_array *a, const mn_array *r) {
  a->rec = r;
  CUDA_ARRAY3D_DESCRIPTOR d;
  memset(&d, 0, sizeof d);
  d.Width = r->width, d.Height = r->height, d.Depth = r->depth;
  d.Format = (CUarray_format)r->format, d.NumChannels = r->channels, d.Flags = r->flags;
  if (!r->levels) {
    MNC_CU(mnc_cu.cuArray3DCreate(&a->plain, &d), "cuArray3DCreate");
    a->levels[0] = a->plain;
    a->nlevels = 1;
  } else {
    if (r->levels > MNC_MAX_LEVELS)
      return mnc_fail(MNC_E_INVALID, "array 0x%llx has %u mipmap levels, more than %d", (unsigned long long)r->handle,
                      r->levels, MNC_MAX_LEVELS);
    MNC_CU(mnc_cu.cuMipmappedArrayCreate(&a->mip, &d, r->levels), "cuMipmappedArrayCreate");
    for (uint32_t l = 0; l < r->levels; l++) {
      MNC_CU(mnc_cu.cuMipmappedArrayGetLevel(&a->levels[l], a->mip, l), "cuMipmappedArrayGetLevel");
      a->nlevels++;
    }
  }
  return array_copy(a, r->data, 1);
}

static const tex_array *find_array(const mnc_textures *t, uint64_t recorded) {
  for (uint32_t i = 0; i < t->narrays; i++)
    if (t->arrays[i].rec->handle == recorded) return &t->arrays[i];
  return NULL;
}

static int obj_create(mnc_textures *t, const mn_texobj *o, tex_obj *out) {
  CUDA_RESOURCE_DESC res;
  memset(&res, 0, sizeof res);
  res.resType = (CUresourcetype)o->res_type;
  if (o->res_type == MN_RES_ARRAY || o->res_type == MN_RES_MIPMAPPED) {
    const tex_array *a = find_array(t, o->array);
    if (!a || (o->res_type == MN_RES_ARRAY) != (a->rec->levels == 0))
      return mnc_fail(MNC_E_INVALID, "%s: object 0x%llx names array 0x%llx, which the prologue does not hold",
                      t->prologue->path, (unsigned long long)o->handle, (unsigned long long)o->array);
    if (o->res_type == MN_RES_ARRAY) res.res.array.hArray = a->plain;
    else res.res.mipmap.hMipmappedArray = a->mip;
  } else if (o->res_type == MN_RES_LINEAR) {
    res.res.linear.devPtr = o->dev_ptr, res.res.linear.sizeInBytes = o->size_bytes;
    res.res.linear.format = (CUarray_format)o->format, res.res.linear.numChannels = o->channels;
  } else {
    res.res.pitch2D.devPtr = o->dev_ptr, res.res.pitch2D.width = o->width, res.res.pitch2D.height = o->height;
    res.res.pitch2D.pitchInBytes = o->pitch;
    res.res.pitch2D.format = (CUarray_format)o->format, res.res.pitch2D.numChannels = o->channels;
  }
  out->recorded = o->handle;
  out->surface = o->kind == MN_TEX_SURFACE;
  if (out->surface) {
    CUsurfObject s = 0;
    MNC_CU(mnc_cu.cuSurfObjectCreate(&s, &res), "cuSurfObjectCreate");
    out->now = s;
    return 0;
  }
  CUDA_TEXTURE_DESC td;
  memset(&td, 0, sizeof td);
  for (int i = 0; i < 3; i++) td.addressMode[i] = (CUaddress_mode)o->address_mode[i];
  td.filterMode = (CUfilter_mode)o->filter_mode;
  td.flags = o->tex_flags;
  td.maxAnisotropy = o->max_anisotropy;
  td.mipmapFilterMode = (CUfilter_mode)o->mipmap_filter_mode;
  td.mipmapLevelBias = o->mipmap_level_bias;
  td.minMipmapLevelClamp = o->min_mipmap_level_clamp;
  td.maxMipmapLevelClamp = o->max_mipmap_level_clamp;
  memcpy(td.borderColor, o->border_color, sizeof td.borderColor);
  CUDA_RESOURCE_VIEW_DESC view;
  memset(&view, 0, sizeof view);
  if (o->has_view) {
    view.format = (CUresourceViewFormat)o->view_format;
    view.width = o->view_width, view.height = o->view_height, view.depth = o->view_depth;
    view.firstMipmapLevel = o->first_mip, view.lastMipmapLevel = o->last_mip;
    view.firstLayer = o->first_layer, view.lastLayer = o->last_layer;
  }
  CUtexObject h = 0;
  MNC_CU(mnc_cu.cuTexObjectCreate(&h, &res, &td, o->has_view ? &view : NULL), "cuTexObjectCreate");
  out->now = h;
  return 0;
}

static void textures_release(mnc_textures *t) {
  for (uint32_t i = 0; i < t->nobjs; i++) {
    if (t->objs[i].surface) mnc_cu.cuSurfObjectDestroy(t->objs[i].now);
    else mnc_cu.cuTexObjectDestroy(t->objs[i].now);
  }
  for (uint32_t i = 0; i < t->narrays; i++) {
    if (t->arrays[i].mip) mnc_cu.cuMipmappedArrayDestroy(t->arrays[i].mip);
    else if (t->arrays[i].plain) mnc_cu.cuArrayDestroy(t->arrays[i].plain);
  }
}

static void textures_free_host(mnc_textures *t) {
  free(t->arrays);
  free(t->objs);
  free(t);
}

static int textures_create(const mn_snapshot *p, mnc_textures **out) {
  MNC_TRY(mnc_enter());
  mnc_textures *t = (mnc_textures *)calloc(1, sizeof *t);
  if (t) t->arrays = (tex_array *)calloc(p->narrays ? p->narrays : 1, sizeof *t->arrays);
  if (t) t->objs = (tex_obj *)calloc(p->ntexobjs ? p->ntexobjs : 1, sizeof *t->objs);
  if (!t || !t->arrays || !t->objs) {
    if (t) textures_free_host(t);
    return mnc_fail(MNC_E_NOMEM, "out of host memory for %u texture objects", p->ntexobjs);
  }
  t->prologue = p;
  int s = 0;
  for (uint32_t i = 0; !s && i < p->narrays; i++) {
    s = array_create(&t->arrays[i], &p->arrays[i]);
    if (t->arrays[i].plain || t->arrays[i].mip) t->narrays = i + 1;
  }
  for (uint32_t i = 0; !s && i < p->ntexobjs; i++) {
    s = obj_create(t, &p->texobjs[i], &t->objs[i]);
    if (!s) t->nobjs = i + 1;
  }
  if (s) {
    if (!mnc_g.unusable) textures_release(t);
    textures_free_host(t);
    return s;
  }
  mnc_g.resources++;
  *out = t;
  return 0;
}

int mnc_textures_create(const mn_snapshot *prologue, mnc_textures **out) {
  if (!prologue || !out) return mnc_fail(MNC_E_INVALID, "mnc_textures_create: no prologue");
  mnc_lock();
  int s = textures_create(prologue, out);
  mnc_unlock();
  return s;
}

int mnc_textures_handle(const mnc_textures *t, uint64_t recorded, uint64_t *now) {
  if (!t) return mnc_fail(MNC_E_INVALID, "no textures");
  for (uint32_t i = 0; i < t->nobjs; i++)
    if (t->objs[i].recorded == recorded) {
      *now = t->objs[i].now;
      return 0;
    }
  return mnc_fail(MNC_E_INVALID, "%s holds no texture or surface object 0x%llx", t->prologue->path,
                  (unsigned long long)recorded);
}

int mnc_textures_reset(mnc_textures *t) {
  if (!t) return mnc_fail(MNC_E_INVALID, "no textures");
  mnc_lock();
  int s = mnc_enter();
  for (uint32_t i = 0; !s && i < t->narrays; i++) s = array_copy(&t->arrays[i], (void *)t->arrays[i].rec->data, 1);
  mnc_unlock();
  return s;
}

int mnc_textures_read(mnc_textures *t, uint64_t recorded, void *dst, uint64_t size) {
  if (!t || !dst) return mnc_fail(MNC_E_INVALID, "mnc_textures_read: no textures or no buffer");
  mnc_lock();
  int s = mnc_enter();
  tex_array *a = NULL;
  for (uint32_t i = 0; !s && i < t->narrays; i++)
    if (t->arrays[i].rec->handle == recorded) a = &t->arrays[i];
  if (!s && !a)
    s = mnc_fail(MNC_E_INVALID, "%s holds no array 0x%llx", t->prologue->path, (unsigned long long)recorded);
  else if (!s && size != a->rec->size)
    s = mnc_fail(MNC_E_INVALID, "array 0x%llx holds %llu bytes, not %llu", (unsigned long long)recorded,
                 (unsigned long long)a->rec->size, (unsigned long long)size);
  if (!s) s = array_copy(a, dst, 0);
  mnc_unlock();
  return s;
}

int mnc_textures_free(mnc_textures *t) {
  if (!t) return 0;
  mnc_lock();
  mnc_g.resources--;
  int s = 0;
  if (!mnc_g.unusable && !(s = mnc_enter())) textures_release(t);
  textures_free_host(t);
  mnc_unlock();
  return s;
}
