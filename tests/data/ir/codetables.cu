// Device function addresses in variables (mneme.ir.codeaddr): a pointer, a table, a struct with pointers at
// offsets 8 and 32, and the vtables of a small class hierarchy. applyFn calls its parameter, applyTable a table
// entry, virt a virtual function; plain calls nothing through a pointer.
#include <new>
typedef float (*unary_fn)(float);
__device__ float twice(float x) { return 2.0f * x; }
__device__ float plusOne(float x) { return x + 1.0f; }
__device__ unary_fn d_twice = twice;
__device__ unary_fn d_table[2] = {twice, plusOne};
struct Mixed { int a; unary_fn f; double d; unary_fn g[2]; };
__device__ Mixed d_mixed = {3, plusOne, 2.5, {nullptr, twice}};
__device__ int d_plain = 7;
struct Base { __device__ virtual int f(int x) { return x; } __device__ virtual ~Base() {} int pad; };
struct Twice : Base { __device__ int f(int x) override { return 2 * x; } };
__global__ void applyFn(float *v, unary_fn f, int n) { int i = threadIdx.x; if (i < n) v[i] = f(v[i]); }
__global__ void applyTable(float *v, int which) { v[threadIdx.x] = d_table[which & 1](v[threadIdx.x]); }
__global__ void plain(float *v) { v[threadIdx.x] += d_plain; }
__global__ void virt(int *o) {
  __shared__ alignas(8) char buf[sizeof(Twice)];
  Base *p = threadIdx.x == 0 ? new (buf) Twice() : nullptr;
  __syncthreads();
  if (p) o[0] = p->f(3);
}
