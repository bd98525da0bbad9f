// Dynamic parallelism in one unit, for the scope of the dims specialization: the parent launches a child with
// another block, both call a helper that reads the launch dimensions, and the child calls a function the parent
// hands it by address; `recurse` launches itself with half its block.
typedef int (*op_t)(int);

__device__ int globalIndex() { return blockIdx.x * blockDim.x + threadIdx.x; }
__device__ int parentOnly() { return gridDim.x * blockDim.x; }
__device__ int scaled(int v) { return v * (int)blockDim.y; }

__global__ void childRow(int *out, int n, op_t op) {
  int i = globalIndex();
  if (i < n) out[i] = op(i) + (int)blockDim.x;
}

__global__ void parentRows(int *out, int n, int *total) {
  int i = globalIndex();
  if (i == 0) childRow<<<(n + 127) / 128, 128>>>(out, n, scaled);
  atomicAdd(total, parentOnly() + scaled(i));
}

__global__ void recurse(int *out, int depth) {
  if (depth > 0 && threadIdx.x == 0) recurse<<<1, blockDim.x / 2>>>(out, depth - 1);
  out[depth] = (int)blockDim.x;
}
