// Kernels on managed (unified) memory from cudaMallocManaged: a buffer the host fills, advised to live
// on the GPU and prefetched there before the first kernel; a table of row pointers (itself managed)
// that points into the buffer, so the data holds pointers that replay must keep valid; and a buffer the
// kernel touches first, without a prefetch (its pages migrate on first touch in the app).
// Usage: managed [n=16384]   (n=16777216: ~100 us per kernel on an H200)
#include "common.h"

__global__ void managedUpdate(float *data, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = a * data[i] + 0.5f;
}

// rows[r] points into managed memory; each row has `cols` floats.
__global__ void managedRows(float *const *rows, const float *weights, int nrows, int cols) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < nrows * cols) {
    int r = i / cols, c = i % cols;
    rows[r][c] += weights[r];
  }
}

static cudaError_t advise_and_prefetch(const void *p, size_t bytes, int dev, cudaStream_t s) {
#if CUDART_VERSION >= 13000
  cudaMemLocation loc = {};
  loc.type = cudaMemLocationTypeDevice;
  loc.id = dev;
  cudaError_t e = cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, loc);
  if (e == cudaSuccess) e = cudaMemAdvise(p, bytes, cudaMemAdviseSetAccessedBy, loc);
  return e == cudaSuccess ? cudaMemPrefetchAsync(p, bytes, loc, 0, s) : e;
#else
  cudaError_t e = cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, dev);
  if (e == cudaSuccess) e = cudaMemAdvise(p, bytes, cudaMemAdviseSetAccessedBy, dev);
  return e == cudaSuccess ? cudaMemPrefetchAsync(p, bytes, dev, s) : e;
#endif
}

int main(int argc, char **argv) {
  const int n = (int)arg_long(argc, argv, 1, 1 << 14, "n");
  const int cols = 256, nrows = (n + cols - 1) / cols;
  int dev = 0;
  CHECK(cudaGetDevice(&dev));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));

  float *data, *table, **rows, *weights;
  CHECK(cudaMallocManaged(&data, (size_t)n * sizeof(float)));
  CHECK(cudaMallocManaged(&table, (size_t)nrows * cols * sizeof(float)));
  CHECK(cudaMallocManaged(&rows, (size_t)nrows * sizeof(float *)));
  CHECK(cudaMallocManaged(&weights, (size_t)nrows * sizeof(float)));
  fill_unit(data, n, 16);
  fill_unit(table, (size_t)nrows * cols, 17);
  fill_unit(weights, nrows, 18);
  for (int r = 0; r < nrows; ++r) rows[r] = table + (size_t)r * cols;

  int managed_ok = 0;
  CHECK(cudaDeviceGetAttribute(&managed_ok, cudaDevAttrConcurrentManagedAccess, dev));
  if (managed_ok) CHECK(advise_and_prefetch(data, (size_t)n * sizeof(float), dev, s));
  managedUpdate<<<(n + 255) / 256, 256, 0, s>>>(data, 2.0f, n);
  CHECK_LAUNCH();
  // table, rows and weights are not prefetched: their pages move to the GPU when the kernel touches them
  managedRows<<<(nrows * cols + 255) / 256, 256, 0, s>>>(rows, weights, nrows, cols);
  CHECK_LAUNCH();
  CHECK(cudaStreamSynchronize(s));
  print_checksum(checksum_of(data, n) + checksum_of(table, (size_t)nrows * cols));
  CHECK(cudaFree(weights));
  CHECK(cudaFree(rows));
  CHECK(cudaFree(table));
  CHECK(cudaFree(data));
  CHECK(cudaStreamDestroy(s));
  return 0;
}
