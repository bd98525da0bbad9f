// Dynamic parallelism across translation units: the parent launches a kernel of dynpar_child.cu.
__global__ void fillChild(int *out, int n, int value);

__global__ void launchFill(int *out, int n) {
  if (threadIdx.x == 0) fillChild<<<(n + 127) / 128, 128>>>(out, n, (int)blockIdx.x);
}
