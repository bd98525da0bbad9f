// Texture and surface objects over every kind of memory they can read: linear device memory, pitched 2D
// memory (cudaMallocPitch), a 2D cudaArray (cudaMallocArray), a 3D cudaArray (cudaMalloc3DArray), a
// mipmapped array (cudaMallocMipmappedArray, one level read with tex2DLod), and a surface written into a cudaArray; and one kernel that reads its handle from a __device__ variable, which
// replay cannot follow (mneme reports it by name). Point sampling of small integers: every result is exact,
// checked against the host, and the checksum (the sum of each output's) is the same on every GPU.
// Usage: texture [n=16384] [w=64] [h=48] [d=8]
#include "common.h"

__global__ void textureRead(cudaTextureObject_t tex, float *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * tex1Dfetch<float>(tex, i);
}

__global__ void pitchRead(cudaTextureObject_t tex, float *out, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) out[y * w + x] = tex2D<float>(tex, x + 0.5f, y + 0.5f) + 1.0f;
}

__global__ void arrayRead(cudaTextureObject_t tex, float *out, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) out[y * w + x] = 3.0f * tex2D<float>(tex, x + 0.5f, y + 0.5f);
}

__global__ void volumeRead(cudaTextureObject_t tex, float *out, int w, int h, int d) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y, z = blockIdx.z;
  if (x < w && y < h && z < d) out[(z * h + y) * w + x] = tex3D<float>(tex, x + 0.5f, y + 0.5f, z + 0.5f) - 2.0f;
}

// Reads one array through a texture and writes another through a surface: the written array is an output.
__global__ void surfaceWrite(cudaTextureObject_t src, cudaSurfaceObject_t dst, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < w && y < h) surf2Dwrite(4.0f * tex2D<float>(src, x + 0.5f, y + 0.5f) + (float)(x % 3 + 1), dst,
                                  x * (int)sizeof(float), y);
}

// Level `level` (wl x hl texels) of a mipmapped array, through normalized coordinates.
__global__ void mipRead(cudaTextureObject_t tex, float *out, int wl, int hl, float level) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < wl && y < hl) out[y * wl + x] = tex2DLod<float>(tex, (x + 0.5f) / wl, (y + 0.5f) / hl, level) + 7.0f;
}

// The handle comes from memory, not from an argument.
__device__ cudaTextureObject_t g_tex;
__global__ void globalRead(float *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 5.0f * tex1Dfetch<float>(g_tex, i);
}

static cudaTextureObject_t make_texture(const cudaResourceDesc &res) {
  cudaTextureDesc desc;
  memset(&desc, 0, sizeof(desc));
  desc.addressMode[0] = desc.addressMode[1] = desc.addressMode[2] = cudaAddressModeClamp;
  desc.filterMode = cudaFilterModePoint;
  desc.readMode = cudaReadModeElementType;
  cudaTextureObject_t tex;
  CHECK(cudaCreateTextureObject(&tex, &res, &desc, nullptr));
  return tex;
}

static cudaTextureObject_t array_texture(cudaArray_t a) {
  cudaResourceDesc res;
  memset(&res, 0, sizeof(res));
  res.resType = cudaResourceTypeArray;
  res.res.array.array = a;
  return make_texture(res);
}

static void expect(const float *got, const float *want, size_t n, const char *what) {
  for (size_t i = 0; i < n; ++i)
    if (got[i] != want[i]) {
      fprintf(stderr, "texture: %s differs at element %zu: %g, expected %g\n", what, i, got[i], want[i]);
      exit(1);
    }
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  const int w = (int)arg_long(argc, argv, 2, 64, "w"), h = (int)arg_long(argc, argv, 3, 48, "h");
  const int d = (int)arg_long(argc, argv, 4, 8, "d");
  const size_t plane = (size_t)w * h, vol = plane * d;
  float *lin = (float *)malloc(n * sizeof(float)), *img = (float *)malloc(plane * sizeof(float));
  float *arr = (float *)malloc(plane * sizeof(float)), *cube = (float *)malloc(vol * sizeof(float));
  float *got = (float *)malloc((vol > (size_t)n ? vol : n) * sizeof(float));
  float *want = (float *)malloc((vol > (size_t)n ? vol : n) * sizeof(float));
  fill_unit(lin, n, 15);
  fill_small_ints(img, plane, 21, 8);
  fill_small_ints(arr, plane, 22, 8);
  fill_small_ints(cube, vol, 23, 8);
  const cudaChannelFormatDesc f32 = cudaCreateChannelDesc<float>();
  double sum = 0.0;

  // linear memory
  float *in, *out;
  CHECK(cudaMalloc(&in, n * sizeof(float)));
  CHECK(cudaMalloc(&out, vol * sizeof(float) > n * sizeof(float) ? vol * sizeof(float) : n * sizeof(float)));
  CHECK(cudaMemcpy(in, lin, n * sizeof(float), cudaMemcpyHostToDevice));
  cudaResourceDesc res;
  memset(&res, 0, sizeof(res));
  res.resType = cudaResourceTypeLinear;
  res.res.linear.devPtr = in;
  res.res.linear.desc = f32;
  res.res.linear.sizeInBytes = n * sizeof(float);
  cudaTextureObject_t tlin = make_texture(res);
  textureRead<<<(n + 255) / 256, 256>>>(tlin, out, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(got, out, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) want[i] = 2.0f * lin[i];
  expect(got, want, n, "textureRead (linear)");
  sum += checksum_of(got, n);
  CHECK(cudaMemcpyToSymbol(g_tex, &tlin, sizeof(tlin)));
  globalRead<<<(n + 255) / 256, 256>>>(out, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(got, out, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) want[i] = 5.0f * lin[i];
  expect(got, want, n, "globalRead (a handle in a __device__ variable)");
  sum += checksum_of(got, n);

  // pitched 2D memory
  float *pitched;
  size_t pitch;
  CHECK(cudaMallocPitch(&pitched, &pitch, w * sizeof(float), h));
  CHECK(cudaMemcpy2D(pitched, pitch, img, w * sizeof(float), w * sizeof(float), h, cudaMemcpyHostToDevice));
  memset(&res, 0, sizeof(res));
  res.resType = cudaResourceTypePitch2D;
  res.res.pitch2D.devPtr = pitched;
  res.res.pitch2D.desc = f32;
  res.res.pitch2D.width = w;
  res.res.pitch2D.height = h;
  res.res.pitch2D.pitchInBytes = pitch;
  cudaTextureObject_t tpitch = make_texture(res);
  dim3 block2(32, 4), grid2((w + 31) / 32, (h + 3) / 4);
  pitchRead<<<grid2, block2>>>(tpitch, out, w, h);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(got, out, plane * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < plane; ++i) want[i] = img[i] + 1.0f;
  expect(got, want, plane, "pitchRead (pitched 2D)");
  sum += checksum_of(got, plane);

  // a 2D cudaArray
  cudaArray_t a2;
  CHECK(cudaMallocArray(&a2, &f32, w, h));
  CHECK(cudaMemcpy2DToArray(a2, 0, 0, arr, w * sizeof(float), w * sizeof(float), h, cudaMemcpyHostToDevice));
  cudaTextureObject_t tarr = array_texture(a2);
  arrayRead<<<grid2, block2>>>(tarr, out, w, h);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(got, out, plane * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < plane; ++i) want[i] = 3.0f * arr[i];
  expect(got, want, plane, "arrayRead (2D array)");
  sum += checksum_of(got, plane);

  // a 3D cudaArray
  cudaArray_t a3;
  CHECK(cudaMalloc3DArray(&a3, &f32, make_cudaExtent(w, h, d)));
  cudaMemcpy3DParms copy;
  memset(&copy, 0, sizeof(copy));
  copy.srcPtr = make_cudaPitchedPtr(cube, w * sizeof(float), w, h);
  copy.dstArray = a3;
  copy.extent = make_cudaExtent(w, h, d);
  copy.kind = cudaMemcpyHostToDevice;
  CHECK(cudaMemcpy3D(&copy));
  cudaTextureObject_t tvol = array_texture(a3);
  volumeRead<<<dim3((w + 31) / 32, (h + 3) / 4, d), block2>>>(tvol, out, w, h, d);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(got, out, vol * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < vol; ++i) want[i] = cube[i] - 2.0f;
  expect(got, want, vol, "volumeRead (3D array)");
  sum += checksum_of(got, vol);

  // a mipmapped array of 3 levels; level 1 is read
  cudaMipmappedArray_t mip;
  CHECK(cudaMallocMipmappedArray(&mip, &f32, make_cudaExtent(w, h, 0), 3));
  float *lvl[3];
  for (unsigned l = 0; l < 3; ++l) {
    int wl = w >> l ? w >> l : 1, hl = h >> l ? h >> l : 1;
    lvl[l] = (float *)malloc((size_t)wl * hl * sizeof(float));
    fill_small_ints(lvl[l], (size_t)wl * hl, 30 + l, 8);
    cudaArray_t level;
    CHECK(cudaGetMipmappedArrayLevel(&level, mip, l));
    CHECK(cudaMemcpy2DToArray(level, 0, 0, lvl[l], wl * sizeof(float), wl * sizeof(float), hl, cudaMemcpyHostToDevice));
  }
  memset(&res, 0, sizeof(res));
  res.resType = cudaResourceTypeMipmappedArray;
  res.res.mipmap.mipmap = mip;
  cudaTextureDesc mdesc;
  memset(&mdesc, 0, sizeof(mdesc));
  mdesc.addressMode[0] = mdesc.addressMode[1] = cudaAddressModeClamp;
  mdesc.filterMode = mdesc.mipmapFilterMode = cudaFilterModePoint;
  mdesc.readMode = cudaReadModeElementType;
  mdesc.normalizedCoords = 1;
  mdesc.maxMipmapLevelClamp = 2.0f;
  cudaTextureObject_t tmip;
  CHECK(cudaCreateTextureObject(&tmip, &res, &mdesc, nullptr));
  const int w1 = w > 1 ? w / 2 : 1, h1 = h > 1 ? h / 2 : 1;
  mipRead<<<dim3((w1 + 31) / 32, (h1 + 3) / 4), block2>>>(tmip, out, w1, h1, 1.0f);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(got, out, (size_t)w1 * h1 * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < (size_t)w1 * h1; ++i) want[i] = lvl[1][i] + 7.0f;
  expect(got, want, (size_t)w1 * h1, "mipRead (level 1 of a mipmapped array)");
  sum += checksum_of(got, (size_t)w1 * h1);

  // a surface written into a cudaArray (zeroed first, so the output is deterministic)
  cudaArray_t as;
  CHECK(cudaMallocArray(&as, &f32, w, h, cudaArraySurfaceLoadStore));
  memset(got, 0, plane * sizeof(float));
  CHECK(cudaMemcpy2DToArray(as, 0, 0, got, w * sizeof(float), w * sizeof(float), h, cudaMemcpyHostToDevice));
  memset(&res, 0, sizeof(res));
  res.resType = cudaResourceTypeArray;
  res.res.array.array = as;
  cudaSurfaceObject_t surf;
  CHECK(cudaCreateSurfaceObject(&surf, &res));
  dim3 block16(16, 16), grid16((w + 15) / 16, (h + 15) / 16);
  surfaceWrite<<<grid16, block16>>>(tarr, surf, w, h);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy2DFromArray(got, w * sizeof(float), as, 0, 0, w * sizeof(float), h, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < plane; ++i) want[i] = 4.0f * arr[i] + (float)((i % w) % 3 + 1);
  expect(got, want, plane, "surfaceWrite (surface over a 2D array)");
  sum += checksum_of(got, plane);

  print_checksum(sum);
  CHECK(cudaDestroySurfaceObject(surf));
  for (cudaTextureObject_t t : {tlin, tpitch, tarr, tvol, tmip}) CHECK(cudaDestroyTextureObject(t));
  CHECK(cudaFreeMipmappedArray(mip));
  for (float *p : lvl) free(p);
  CHECK(cudaFreeArray(as));
  CHECK(cudaFreeArray(a3));
  CHECK(cudaFreeArray(a2));
  CHECK(cudaFree(pitched));
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  free(lin), free(img), free(arr), free(cube), free(got), free(want);
  return 0;
}
