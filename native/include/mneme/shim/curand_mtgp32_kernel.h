/* Empty stand-in for a CUDA header that clang's CUDA runtime wrapper includes but that CUDA roots
 * without cuRAND lack. `mneme cc` puts this directory last on the search path (-idirafter), so a real
 * curand_mtgp32_kernel.h, when the CUDA root has one, still wins. */
