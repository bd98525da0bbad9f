// Shared by the example apps: checked CUDA calls, size arguments, deterministic data and checksums.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CHECK(call)                                                                                  \
  do {                                                                                               \
    cudaError_t err_ = (call);                                                                       \
    if (err_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call, cudaGetErrorName(err_), \
              cudaGetErrorString(err_));                                                             \
      exit(1);                                                                                       \
    }                                                                                                \
  } while (0)

// After a <<<>>> launch: launch errors now, execution errors at the next synchronizing call.
#define CHECK_LAUNCH() CHECK(cudaGetLastError())

// argv[i] as a positive integer, or `dflt` when absent; anything else ends the program with a usage line.
static long arg_long(int argc, char **argv, int i, long dflt, const char *name) {
  if (i >= argc) return dflt;
  char *end = nullptr;
  long v = strtol(argv[i], &end, 10);
  if (!end || *end || v <= 0) {
    fprintf(stderr, "%s: argument %d (%s) must be a positive integer, got '%s'\n", argv[0], i, name, argv[i]);
    exit(2);
  }
  return v;
}

// Deterministic pseudo-random values in [0, 1) (a 32-bit hash of the index and a seed).
static inline float hash_unit(unsigned i, unsigned seed) {
  unsigned x = i * 2654435761u ^ (seed * 0x9E3779B9u + 0x7F4A7C15u);
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  return (x >> 8) * (1.0f / 16777216.0f);
}

static void fill_unit(float *h, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i) h[i] = hash_unit((unsigned)i, seed);
}

// Small integers in [-range, range]: sums and products stay exact in float whatever the order.
static void fill_small_ints(float *h, size_t n, unsigned seed, int range) {
  for (size_t i = 0; i < n; ++i) h[i] = (float)((int)(hash_unit((unsigned)i, seed) * (2 * range + 1)) - range);
}

// Position-weighted sum in double, in index order: identical for identical data, and a permutation
// of the data changes it.
template <class T> static double checksum_of(const T *h, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += (double)h[i] * (double)(1 + i % 7);
  return s;
}

static void print_checksum(double v) { printf("checksum=%.10e\n", v); }
