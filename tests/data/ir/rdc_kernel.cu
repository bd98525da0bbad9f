// Relocatable device code: the kernel calls a function and reads a variable of another unit.
extern __device__ float scale(float v);
extern __device__ int bias;
template <typename T> __device__ T twice(T v) { return v + v; }

__global__ void rdcKernel(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = twice(scale(x[i])) + bias;
}

__global__ void otherKernel(int *y) { y[0] = 7; }
