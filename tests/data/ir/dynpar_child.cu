__global__ void fillChild(int *out, int n, int value) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}
