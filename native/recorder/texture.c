/* librecord's texture and surface objects: at a recorded launch, the objects whose handles the
 * arguments hold (recorder.c keeps the live ones with their descriptors) are turned into the
 * snapshot's mn_texobj records, and the CUDA arrays behind them are read back whole (every level
 * of a mipmapped array) with cuMemcpy3D, before the launch for the prologue and after it for the
 * epilogue. Linear and pitched resources point into arena memory, which the blobs already hold.
 * Called with R.mu held. */
#include "state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(mn_texset *t, const char *fmt, unsigned long long a, const char *b) {
  snprintf(t->why, sizeof t->why, fmt, a, b);
  return -1;
}

/* The array behind `handle` (a CUarray, or a CUmipmappedArray when mip), added once. */
static int add_array(mn_texset *t, uint64_t handle, int mip) {
  for (size_t i = 0; i < t->narrays; i++)
    if (t->arrays[i].handle == handle) return 0;
  if (!D.array3DGetDescriptor || !D.memcpy3D || (mip && !D.mipmappedArrayGetLevel))
    return fail(t, "the driver lacks the array calls (object 0x%llx)%s", handle, "");
  uint64_t levels[MN_TEX_MAX_LEVELS];
  uint32_t nlev = 0;
  if (mip) {
    for (; nlev < MN_TEX_MAX_LEVELS; nlev++) {
      CUarray a = NULL;
      if (D.mipmappedArrayGetLevel(&a, (CUmipmappedArray)(uintptr_t)handle, nlev) != CUDA_SUCCESS || !a) break;
      levels[nlev] = (uint64_t)(uintptr_t)a;
    }
    if (!nlev) return fail(t, "mipmapped array 0x%llx has no level the driver can name%s", handle, "");
  } else {
    levels[0] = handle;
  }
  CUDA_ARRAY3D_DESCRIPTOR d;
  CUresult r = D.array3DGetDescriptor(&d, (CUarray)(uintptr_t)levels[0]);
  if (r != CUDA_SUCCESS) return fail(t, "cuArray3DGetDescriptor of array 0x%llx failed: %s", handle, mn_cu_err(r));
  mn_array *n = realloc(t->arrays, (t->narrays + 1) * sizeof *n);
  if (!n) return fail(t, "out of memory (array 0x%llx)%s", handle, "");
  t->arrays = n;
  uint64_t *lh = realloc(t->level_handles, (t->narrays + 1) * MN_TEX_MAX_LEVELS * sizeof *lh);
  if (!lh) return fail(t, "out of memory (array 0x%llx)%s", handle, "");
  t->level_handles = lh;
  mn_array *a = &t->arrays[t->narrays];
  memset(a, 0, sizeof *a);
  a->handle = handle;
  a->width = d.Width, a->height = d.Height, a->depth = d.Depth;
  a->format = (uint32_t)d.Format, a->channels = d.NumChannels, a->flags = d.Flags;
  a->levels = mip ? nlev : 0;
  a->size = mn_array_bytes(a);
  if (!a->size) {
    char what[96];
    snprintf(what, sizeof what, "format 0x%x x %u channels", a->format, a->channels);
    return fail(t, "array 0x%llx has a layout mneme does not store (%s)", handle, what);
  }
  a->data = malloc(a->size);
  if (!a->data) return fail(t, "out of memory for the contents of array 0x%llx%s", handle, "");
  memcpy(lh + t->narrays * MN_TEX_MAX_LEVELS, levels, sizeof levels);
  t->narrays++;
  return 0;
}

static int read_array(mn_texset *t, size_t i) {
  mn_array *a = &t->arrays[i];
  uint64_t elem = (uint64_t)mn_format_bytes(a->format) * a->channels, off = 0;
  for (uint32_t l = 0; l < (a->levels ? a->levels : 1); l++) {
    uint64_t dims[3];
    mn_array_level_dims(a, l, dims);
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c.srcArray = (CUarray)(uintptr_t)t->level_handles[i * MN_TEX_MAX_LEVELS + l];
    c.dstMemoryType = CU_MEMORYTYPE_HOST;
    c.dstHost = a->data + off;
    c.dstPitch = dims[0] * elem;
    c.dstHeight = dims[1];
    c.WidthInBytes = dims[0] * elem;
    c.Height = dims[1];
    c.Depth = dims[2];
    CUresult r = D.memcpy3D(&c);
    if (r != CUDA_SUCCESS) return fail(t, "reading array 0x%llx with cuMemcpy3D failed: %s", a->handle, mn_cu_err(r));
    off += dims[0] * dims[1] * dims[2] * elem;
  }
  return 0;
}

static void describe(const mn_texentry *e, mn_texobj *o) {
  memset(o, 0, sizeof *o);
  o->handle = e->handle;
  o->kind = e->surface ? MN_TEX_SURFACE : MN_TEX_TEXTURE;
  o->res_type = (uint32_t)e->res.resType;
  switch (e->res.resType) {
    case CU_RESOURCE_TYPE_ARRAY: o->array = (uint64_t)(uintptr_t)e->res.res.array.hArray; break;
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY: o->array = (uint64_t)(uintptr_t)e->res.res.mipmap.hMipmappedArray; break;
    case CU_RESOURCE_TYPE_LINEAR:
      o->dev_ptr = e->res.res.linear.devPtr;
      o->size_bytes = e->res.res.linear.sizeInBytes;
      o->format = (uint32_t)e->res.res.linear.format;
      o->channels = e->res.res.linear.numChannels;
      break;
    default:
      o->dev_ptr = e->res.res.pitch2D.devPtr;
      o->width = e->res.res.pitch2D.width;
      o->height = e->res.res.pitch2D.height;
      o->pitch = e->res.res.pitch2D.pitchInBytes;
      o->format = (uint32_t)e->res.res.pitch2D.format;
      o->channels = e->res.res.pitch2D.numChannels;
  }
  if (!e->surface) {
    for (int i = 0; i < 3; i++) o->address_mode[i] = (uint32_t)e->tex.addressMode[i];
    o->filter_mode = (uint32_t)e->tex.filterMode;
    o->tex_flags = e->tex.flags;
    o->max_anisotropy = e->tex.maxAnisotropy;
    o->mipmap_filter_mode = (uint32_t)e->tex.mipmapFilterMode;
    o->mipmap_level_bias = e->tex.mipmapLevelBias;
    o->min_mipmap_level_clamp = e->tex.minMipmapLevelClamp;
    o->max_mipmap_level_clamp = e->tex.maxMipmapLevelClamp;
    memcpy(o->border_color, e->tex.borderColor, sizeof o->border_color);
  }
  if (e->has_view) {
    o->has_view = 1;
    o->view_format = (uint32_t)e->view.format;
    o->view_width = e->view.width, o->view_height = e->view.height, o->view_depth = e->view.depth;
    o->first_mip = e->view.firstMipmapLevel, o->last_mip = e->view.lastMipmapLevel;
    o->first_layer = e->view.firstLayer, o->last_layer = e->view.lastLayer;
  }
}

int mn_tex_capture(const uint8_t *args, const uint64_t *toff, size_t ntex, mn_texset *t) {
  memset(t, 0, sizeof *t);
  if (!ntex) return 0;
  t->objs = calloc(ntex, sizeof *t->objs);
  if (!t->objs) return fail(t, "out of memory (%llu texture objects)%s", (unsigned long long)ntex, "");
  for (size_t i = 0; i < ntex; i++) {
    uint64_t h;
    memcpy(&h, args + toff[i], 8);
    const mn_texentry *e = mn_tex_find(h);
    int seen = 0;
    for (size_t j = 0; j < t->nobjs; j++) seen |= t->objs[j].handle == h;
    if (!e || seen) continue;
    describe(e, &t->objs[t->nobjs]);
    mn_texobj *o = &t->objs[t->nobjs++];
    if (o->res_type > MN_RES_PITCH2D) return fail(t, "object 0x%llx has an unknown resource type%s", h, "");
    if (o->res_type <= MN_RES_MIPMAPPED && add_array(t, o->array, o->res_type == MN_RES_MIPMAPPED)) return -1;
    if (o->res_type >= MN_RES_LINEAR && !mn_format_bytes(o->format))
      return fail(t, "object 0x%llx has an element format mneme does not store%s", h, "");
  }
  return mn_tex_reread(t);
}

int mn_tex_reread(mn_texset *t) {
  for (size_t i = 0; i < t->narrays; i++)
    if (read_array(t, i)) return -1;
  return 0;
}

int mn_tex_write(mn_writer *w, const mn_texset *t, int prologue) {
  for (size_t i = 0; prologue && i < t->nobjs; i++)
    if (mn_writer_texobj(w, &t->objs[i])) return -1;
  for (size_t i = 0; i < t->narrays; i++)
    if (mn_writer_array(w, &t->arrays[i])) return -1;
  return 0;
}

void mn_tex_free(mn_texset *t) {
  for (size_t i = 0; i < t->narrays; i++) free(t->arrays[i].data);
  free(t->arrays);
  free(t->level_handles);
  free(t->objs);
  t->arrays = NULL, t->level_handles = NULL, t->objs = NULL;
  t->narrays = t->nobjs = 0;
}
