// A vertical 3-point smoothing that, like stencil codes such as Rodinia's srad, loads the rows above and
// below every point unconditionally and then replaces what lies outside the image: its top row reads a
// row before its input (the process's first allocation), its bottom row a row past it. Plain cudaMalloc
// memory has the driver's own allocations around it, so such code runs; the recorder's arena keeps a
// mapped guard below its first allocation for it (native/recorder/state.h: MN_ARENA_GUARD). The kernel
// is a template built with -fgpu-rdc, which gives its instantiation weak_odr linkage in the IR.
// Usage: halo [cols=1024] [rows=512]    prints the input's address (in=0x...) and a checksum
#include "common.h"

template <int TILE>
__global__ void haloSmooth(const float *in, float *out, int cols, int rows) {
  int x = blockIdx.x * TILE + threadIdx.x, y = blockIdx.y * TILE + threadIdx.y;
  if (x >= cols || y >= rows) return;
  const volatile float *v = in;  // volatile: every load below happens, out of range or not
  float up = v[(long)(y - 1) * cols + x], down = v[(long)(y + 1) * cols + x], c = v[(long)y * cols + x];
  if (y == 0) up = c;
  if (y == rows - 1) down = c;
  out[(long)y * cols + x] = 0.25f * up + 0.5f * c + 0.25f * down;
}

int main(int argc, char **argv) {
  const int cols = (int)arg_long(argc, argv, 1, 1024, "cols");
  const int rows = (int)arg_long(argc, argv, 2, 512, "rows");
  const size_t count = (size_t)cols * rows, bytes = count * sizeof(float);
  float *h = (float *)malloc(bytes), *want = (float *)malloc(bytes);
  fill_unit(h, count, 5);
  float *in, *out;
  CHECK(cudaMalloc(&in, bytes));  // first: nothing of the app's below it
  CHECK(cudaMalloc(&out, bytes));
  printf("in=%p\n", (void *)in);
  CHECK(cudaMemcpy(in, h, bytes, cudaMemcpyHostToDevice));
  dim3 block(16, 16), grid((cols + 15) / 16, (rows + 15) / 16);
  haloSmooth<16><<<grid, block>>>(in, out, cols, rows);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  for (int y = 0; y < rows; ++y)
    for (int x = 0; x < cols; ++x) {
      float c = h[(size_t)y * cols + x];
      float up = y ? h[(size_t)(y - 1) * cols + x] : c, down = y < rows - 1 ? h[(size_t)(y + 1) * cols + x] : c;
      want[(size_t)y * cols + x] = 0.25f * up + 0.5f * c + 0.25f * down;
    }
  CHECK(cudaMemcpy(h, out, bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; ++i)
    if (h[i] != want[i]) {
      fprintf(stderr, "halo: mismatch at %zu: %g != %g\n", i, h[i], want[i]);
      return 1;
    }
  print_checksum(checksum_of(h, count));
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  free(h);
  free(want);
  return 0;
}
