/* nvcc's identity for user code, force-included by `mneme nvcc` after clang's CUDA runtime wrapper
 * (which has already read cuda_runtime.h and the CUDA headers it pulls in) and after nvcc_compat.h.
 *
 * Code written for nvcc tests __NVCC__ to mark functions __host__ __device__, to pick nvcc-only
 * paths, or to check the compiler version (__CUDACC_VER_MAJOR__, set by mneme nvcc with -D). CUDA's
 * own headers (CCCL's compiler detection, <nv/target>) also test __NVCC__ and take
 * it to mean NVIDIA's front end, whose builtins clang lacks: defining it on the command line breaks
 * them. So the headers that decide "which compiler is this" are read here first, with __NVCC__ still
 * undefined (their include guards keep that decision when user code includes them again), and only
 * then is __NVCC__ defined for the rest of the translation unit.
 */
#ifndef MNEME_NVCC_PERSONA_H
#define MNEME_NVCC_PERSONA_H
#if defined(__cplusplus) && !defined(__NVCC__)
#if __has_include(<nv/target>)
#include <nv/target>
#endif
#if __has_include(<cuda/std/__cccl/compiler.h>)
#include <cuda/std/__cccl/compiler.h>
#endif
#endif
#if defined(__CLANG_GPU_APPROX_TRANSCENDENTALS__) && !defined(__USE_FAST_MATH__)
#define __USE_FAST_MATH__ 1 /* nvcc --use_fast_math */
#endif
#ifndef __NVCC__
#define __NVCC__ 1
#endif
#endif
