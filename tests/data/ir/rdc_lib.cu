// The other unit: what rdcKernel needs, plus symbols it must not drag in.
template <typename T> __device__ T twice(T v) { return v + v; }

__device__ int bias = 3;
__device__ float factor = 2.0f;
__device__ int unrelated[100];

__device__ float scale(float v) { return twice(v) * factor; }

__global__ void libKernel(int *y) { y[0] = unrelated[3]; }
