// Stream-ordered and pitched allocations: cudaMallocAsync from the device's default pool,
// cudaMallocFromPoolAsync from a pool of the app's own (cudaMemPoolCreate), cudaFreeAsync, and the
// pitched cudaMallocPitch (2D) and cudaMalloc3D (3D, a cudaPitchedPtr passed by value).
// Usage: streamalloc [n=16384] [w=256] [h=64] [d=4]
#include "common.h"

__global__ void poolAxpy(float *y, const float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void pitchScale(float *p, size_t pitch, int w, int h, float a) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w && y < h) {
    float *row = (float *)((char *)p + y * pitch);
    row[x] = a * row[x] + (float)y;
  }
}

__global__ void volumeAdd(cudaPitchedPtr v, int w, int h, int d, const float *pitched2d, size_t pitch2d) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y, z = blockIdx.z;
  if (x < w && y < h && z < d) {
    float *row = (float *)((char *)v.ptr + (z * h + y) * v.pitch);
    const float *src = (const float *)((const char *)pitched2d + y * pitch2d);
    row[x] += src[x] * (float)(1 << z);  // powers of two: exact, fused or not
  }
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  const int w = (int)arg_long(argc, argv, 2, 256, "w"), h = (int)arg_long(argc, argv, 3, 64, "h");
  const int d = (int)arg_long(argc, argv, 4, 4, "d");
  const size_t bytes = (size_t)n * sizeof(float);
  int dev = 0;
  CHECK(cudaGetDevice(&dev));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // stream-ordered: x from the default pool, y from a pool of our own
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = dev;
  cudaMemPool_t pool;
  CHECK(cudaMemPoolCreate(&pool, &props));
  float *x, *y, *hx = (float *)malloc(bytes), *hy = (float *)malloc(bytes);
  if (!hx || !hy) return 1;
  fill_unit(hx, n, 31);
  fill_unit(hy, n, 32);
  CHECK(cudaMallocAsync((void **)&x, bytes, s));
  CHECK(cudaMallocFromPoolAsync((void **)&y, bytes, pool, s));
  CHECK(cudaMemcpyAsync(x, hx, bytes, cudaMemcpyHostToDevice, s));
  CHECK(cudaMemcpyAsync(y, hy, bytes, cudaMemcpyHostToDevice, s));
  poolAxpy<<<(n + 255) / 256, 256, 0, s>>>(y, x, 2.0f, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpyAsync(hy, y, bytes, cudaMemcpyDeviceToHost, s));
  CHECK(cudaFreeAsync(x, s));
  CHECK(cudaFreeAsync(y, s));

  // pitched 2D
  float *p2, *h2 = (float *)malloc((size_t)w * h * sizeof(float));
  size_t pitch = 0;
  if (!h2) return 1;
  fill_unit(h2, (size_t)w * h, 33);
  CHECK(cudaMallocPitch((void **)&p2, &pitch, w * sizeof(float), h));
  CHECK(cudaMemcpy2DAsync(p2, pitch, h2, w * sizeof(float), w * sizeof(float), h, cudaMemcpyHostToDevice, s));
  pitchScale<<<dim3((w + 127) / 128, h), 128, 0, s>>>(p2, pitch, w, h, 0.5f);
  CHECK_LAUNCH();

  // pitched 3D
  cudaPitchedPtr v;
  CHECK(cudaMalloc3D(&v, make_cudaExtent(w * sizeof(float), h, d)));
  CHECK(cudaMemset3DAsync(v, 0, make_cudaExtent(w * sizeof(float), h, d), s));
  volumeAdd<<<dim3((w + 127) / 128, h, d), 128, 0, s>>>(v, w, h, d, p2, pitch);
  CHECK_LAUNCH();
  float *h3 = (float *)malloc((size_t)w * h * d * sizeof(float));
  if (!h3) return 1;
  cudaMemcpy3DParms c = {};
  c.srcPtr = v;
  c.dstPtr = make_cudaPitchedPtr(h3, w * sizeof(float), w, h);
  c.extent = make_cudaExtent(w * sizeof(float), h, d);
  c.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaMemcpy3DAsync(&c, s));
  CHECK(cudaStreamSynchronize(s));
  print_checksum(checksum_of(hy, n) + checksum_of(h3, (size_t)w * h * d));
  CHECK(cudaFree(v.ptr));
  CHECK(cudaFree(p2));
  CHECK(cudaMemPoolDestroy(pool));
  CHECK(cudaStreamDestroy(s));
  free(hx);
  free(hy);
  free(h2);
  free(h3);
  return 0;
}
