// The core's own kernels: GPU comparison of replayed memory with the expected epilogue (for buffers
// too large to copy back), and the hold kernel of the timed loop.
// Built to PTX by native/core/build_ptx.sh (clang++-22, device only) and shipped as
// mneme/data/compare.ptx; native/core/compare.c loads it and shares the layout of mn_gpu_cmp.
//
// The semantics are mn_compare_ex's (native/snapshot.h, "Semantics"), element by element the same
// decisions as cmp_one() in native/snapshot.c; only the order of the norm sums differs. The host turns
// the sums into the report (compare.c: finish()).

typedef unsigned long long u64;
typedef unsigned int u32;

struct mn_gpu_cmp {
  u64 mismatches;
  u64 first;      // byte offset of the first counted mismatch, ~0 when none
  u64 max_abs;    // bits of non-negative doubles (+inf included): their order is the integers' order
  u64 max_rel;
  u64 err_max;    // Linf accumulators
  u64 ref_max;
  u64 nonfinite;  // elements with a NaN/inf mismatch
  u64 reserved;
  double err_sum;  // L1 sums, or L2 sums of squares
  double ref_sum;
};

// enum mn_elem and enum mn_tol_norm of native/snapshot.h
enum { E_BYTES = 0, E_F32 = 1, E_F64 = 2, E_F16 = 3, E_BF16 = 4, E_I8 = 5, E_I16 = 6, E_I32 = 7, E_I64 = 8,
       E_U8 = 9, E_U16 = 10, E_U32 = 11, E_U64 = 12 };
enum { N_ELEMENT = 0, N_L1 = 1, N_L2 = 2, N_LINF = 3 };

__device__ static inline u64 warp_sum(u64 v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}
__device__ static inline u64 warp_min(u64 v) {
  for (int o = 16; o > 0; o >>= 1) {
    u64 w = __shfl_down_sync(0xffffffffu, v, o);
    v = w < v ? w : v;
  }
  return v;
}
__device__ static inline u64 warp_max(u64 v) {
  for (int o = 16; o > 0; o >>= 1) {
    u64 w = __shfl_down_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}
__device__ static inline double warp_fsum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

// Every thread of the block reaches this (grid-stride loops, no early return) and blocks are whole
// warps, so full-mask shuffles are safe; lane 0 of each warp publishes.
__device__ static inline void publish_count(mn_gpu_cmp *out, u64 count, u64 first) {
  count = warp_sum(count);
  first = warp_min(first);
  if ((threadIdx.x & 31) == 0) {
    if (count) atomicAdd(&out->mismatches, count);
    if (first != ~0ull) atomicMin(&out->first, first);
  }
}

// MN_ELEM_BYTES: counts differing bytes, 8 at a time when both pointers allow it.
extern "C" __global__ void mn_cmp_bytes(const unsigned char *e, const unsigned char *a, u64 n, u64 base,
                                        mn_gpu_cmp *out) {
  u64 count = 0, first = ~0ull;
  u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x, stride = (u64)gridDim.x * blockDim.x;
  u64 done = 0;
  if ((((u64)e | (u64)a) & 7) == 0) {
    const u64 *e8 = (const u64 *)e, *a8 = (const u64 *)a;
    u64 words = n / 8;
    for (u64 i = tid; i < words; i += stride) {
      u64 x = e8[i] ^ a8[i];
      if (x) {
        u64 at = base + i * 8 + (u64)(__ffsll((long long)x) - 1) / 8;
        if (at < first) first = at;
        for (int b = 0; b < 8; b++) count += ((x >> (8 * b)) & 0xff) != 0;
      }
    }
    done = words * 8;
  }
  for (u64 i = done + tid; i < n; i += stride)
    if (e[i] != a[i]) {
      count++;
      if (base + i < first) first = base + i;
    }
  publish_count(out, count, first);
}

__device__ static inline double half_value(unsigned short h) {
  int ex = (h >> 10) & 0x1f;
  u32 m = h & 0x3ff;
  double v = ex == 0 ? ldexp((double)m, -24)
             : ex == 31 ? (m ? __longlong_as_double(0x7ff8000000000000ll) : __longlong_as_double(0x7ff0000000000000ll))
                       : ldexp((double)(m | 0x400), ex - 25);
  return h & 0x8000 ? -v : v;
}

__device__ static inline double value(u32 elem, const unsigned char *p) {
  switch (elem) {
    case E_F32: return (double)*(const float *)p;
    case E_F64: return *(const double *)p;
    case E_F16: return half_value(*(const unsigned short *)p);
    case E_BF16: return (double)__uint_as_float((u32)(*(const unsigned short *)p) << 16);
    case E_I8: return (double)*(const signed char *)p;
    case E_I16: return (double)*(const short *)p;
    case E_I32: return (double)*(const int *)p;
    case E_I64: return (double)*(const long long *)p;
    case E_U8: return (double)*p;
    case E_U16: return (double)*(const unsigned short *)p;
    case E_U32: return (double)*(const u32 *)p;
    default: return (double)*(const u64 *)p;
  }
}

__device__ static inline u64 bits(u32 es, const unsigned char *p) {
  switch (es) {
    case 1: return *p;
    case 2: return *(const unsigned short *)p;
    case 4: return *(const u32 *)p;
    default: return *(const u64 *)p;
  }
}

__device__ static inline double int_distance(u32 elem, const unsigned char *e, const unsigned char *a,
                                             double ev) {
  if (elem == E_I64) {
    long long x = *(const long long *)e, y = *(const long long *)a;
    return x < y ? (double)((u64)y - (u64)x) : (double)((u64)x - (u64)y);
  }
  if (elem == E_U64) {
    u64 x = *(const u64 *)e, y = *(const u64 *)a;
    return x < y ? (double)(y - x) : (double)(x - y);
  }
  return fabs(value(elem, a) - ev);
}

__device__ static inline void norm_add(u32 norm, double *acc, double v) {
  if (norm == N_L1) *acc += v;
  else if (norm == N_L2) *acc += v * v;
  else if (v > *acc) *acc = v;
}

__device__ static inline u64 dbits(double v) { return (u64)__double_as_longlong(v); }

// Typed elements: e and a are aligned to es bytes (the host checks), nel elements from byte `base`.
extern "C" __global__ void mn_cmp_values(const unsigned char *e, const unsigned char *a, u64 nel, u64 base,
                                         u32 elem, u32 es, u32 norm, int exact, double atol, double rtol,
                                         mn_gpu_cmp *out) {
  const double inf = __longlong_as_double(0x7ff0000000000000ll);
  const bool is_float = elem >= E_F32 && elem <= E_BF16;
  const bool full = norm != N_ELEMENT && !exact;
  u64 count = 0, first = ~0ull, nonfinite = 0;
  double max_abs = 0, max_rel = 0, err_acc = 0, ref_acc = 0;
  u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x, stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = tid; i < nel; i += stride) {
    const unsigned char *pe = e + i * es, *pa = a + i * es;
    bool same_bits = bits(es, pe) == bits(es, pa);
    double ev = value(elem, pe), d = 0;
    bool bad = false;
    if (!same_bits) {
      if (is_float) {
        double av = value(elem, pa);
        if (isnan(ev) && isnan(av)) d = 0;
        else if (isnan(ev) || isnan(av)) d = inf, bad = true;
        else if (ev == av) d = 0;
        else if (isinf(ev) || isinf(av)) d = inf, bad = true;
        else d = fabs(av - ev);
      } else {
        d = int_distance(elem, pe, pa, ev);
      }
    }
    if (full) {
      if (isfinite(ev)) norm_add(norm, &ref_acc, fabs(ev));
      if (!bad) norm_add(norm, &err_acc, d);
      nonfinite += bad;
    }
    if (d > 0) {
      double rel = ev != 0 ? d / fabs(ev) : inf;
      if (d > max_abs) max_abs = d;
      if (rel > max_rel) max_rel = rel;
    }
    bool mismatch;
    if (exact) mismatch = !same_bits;
    else if (norm != N_ELEMENT) mismatch = d > 0;
    else mismatch = bad || !(d <= atol + (rtol > 0 ? rtol * fabs(ev) : 0));
    if (mismatch) {
      count++;
      u64 at = base + i * es;
      if (at < first) first = at;
    }
  }
  publish_count(out, count, first);
  u64 b_abs = warp_max(dbits(max_abs)), b_rel = warp_max(dbits(max_rel));
  nonfinite = warp_sum(nonfinite);
  u64 b_err = 0, b_ref = 0;
  if (norm == N_LINF) {
    b_err = warp_max(dbits(err_acc));
    b_ref = warp_max(dbits(ref_acc));
  } else {
    err_acc = warp_fsum(err_acc);
    ref_acc = warp_fsum(ref_acc);
  }
  if ((threadIdx.x & 31) == 0) {
    if (b_abs) atomicMax(&out->max_abs, b_abs);
    if (b_rel) atomicMax(&out->max_rel, b_rel);
    if (full) {
      if (nonfinite) atomicAdd(&out->nonfinite, nonfinite);
      if (norm == N_LINF) {
        if (b_err) atomicMax(&out->err_max, b_err);
        if (b_ref) atomicMax(&out->ref_max, b_ref);
      } else {
        atomicAdd(&out->err_sum, err_acc);
        atomicAdd(&out->ref_sum, ref_acc);
      }
    }
  }
}

// Keeps the GPU busy for `ns` nanoseconds. The timed loop launches it before its start event so that
// the event, the kernel and the end event are queued while the GPU is busy and run back to back:
// an idle GPU would otherwise time the host's launch latency too (microseconds).
extern "C" __global__ void mn_hold(u64 ns) {
  u64 t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
