__device__ float scale(float v) { return 2.0f * v; }
