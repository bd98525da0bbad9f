// Reads every launch dimension and index along x, y and z.
__global__ void dims3d(int *out) {
  int tx = threadIdx.x + blockDim.x * blockIdx.x;
  int ty = threadIdx.y + blockDim.y * blockIdx.y;
  int tz = threadIdx.z + blockDim.z * blockIdx.z;
  int w = blockDim.x * gridDim.x, h = blockDim.y * gridDim.y;
  out[(tz * h + ty) * w + tx] = gridDim.z;
}
