// The other half of the RDC example: a device function and the global it reads.
__device__ float rdc_gain = 1.5f;

__device__ float rdc_transform(float x) { return x * rdc_gain + 0.25f; }
