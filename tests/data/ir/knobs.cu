// Kernels on which each code knob (mneme/ir/knobs.py) visibly changes the code (tests/test_ir_knobs.py).
__global__ void dot_loop(const float *x, const float *w, float *y, int n, int m) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = 0.0f;
  for (int k = 0; k < m; ++k) acc += x[i + k] * w[k];
  y[i] = acc;
}

// pairs of adjacent scalar loads and stores: what the SLP vectorizer turns into ld/st.v2
__global__ void pairs(const float *__restrict__ x, float *__restrict__ y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  y[2 * i] = a * x[2 * i] + 1.0f;
  y[2 * i + 1] = a * x[2 * i + 1] + 1.0f;
}

__device__ float poly(float v, const float *c, int n) {
  float r = 0.0f;
  for (int k = 0; k < n; ++k) r = r * v + c[k] + sinf(r * c[k]);
  return r > 1.0f ? r / (1.0f + v) : r * 2.0f - sqrtf(v);
}

__global__ void calls(const float *x, const float *c, float *y, int n, int m) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = poly(x[i], c, m) + poly(x[i] * 0.5f, c + 1, m) + poly(x[i] + 2.0f, c, m - 1);
}
