/*
 * Kernels for the GPU tests: fill a buffer with values that are a function
 * of (seed, index), on a stream, so a test can tell which step's values a
 * checkpoint holds; and spin a while, so that a copy that does not wait for
 * the trainer's work would read the old values. C linkage: the tests are C.
 */
#include <cuda_runtime.h>
#include <stdint.h>

__device__ __host__ static inline uint32_t mix(uint32_t seed, uint64_t i)
{
	uint64_t x = (uint64_t)seed * 0x9e3779b97f4a7c15ull + i;

	x ^= x >> 31;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 29;
	return (uint32_t)x;
}

__global__ static void fill(uint32_t *d, uint64_t n, uint32_t seed)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		d[i] = mix(seed, i);
}

__global__ static void spin(uint64_t ns)
{
	uint64_t t0, t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
	do
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	while (t - t0 < ns);
}

extern "C" int gpu_test_spin(uint64_t ns, cudaStream_t s)
{
	spin<<<1, 1, 0, s>>>(ns);
	return (int)cudaGetLastError();
}

extern "C" int gpu_test_fill(uint32_t *d, uint64_t n, uint32_t seed, cudaStream_t s)
{
	fill<<<256, 256, 0, s>>>(d, n, seed);
	return (int)cudaGetLastError();
}

extern "C" uint32_t gpu_test_value(uint32_t seed, uint64_t i)
{
	return mix(seed, i);
}
