/*
 * libckpt's CUDA side (cuda_ipc.h). cudart calls only; each cudaError_t becomes a
 * negative errno here with CUDA's text in the message. The two driver calls
 * needed (cuMemGetAddressRange: an allocation's base; cuStreamWaitValue32:
 * the fence) are looked up once through cudaGetDriverEntryPointByVersion.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <pthread.h>

#include "client/cuda_ipc.h"
#include "ipc/ipc.h"

#ifdef CKPT_HAVE_CUDA
#include <cuda.h> /* types and enums only: nothing from libcuda is linked */
#include <cuda_runtime_api.h>

typedef CUresult (*range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr p);
typedef CUresult (*wait_fn)(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned flags);

static range_fn mem_range;
static wait_fn wait_value;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void lookup(void)
{
	enum cudaDriverEntryPointQueryResult q;
	void *fn;

	/* 12000: the _v2 forms, with 64-bit sizes and the current wait semantics */
	if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
	                                     &q) == cudaSuccess &&
	    q == cudaDriverEntryPointSuccess)
		mem_range = (range_fn)fn;
	if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault,
	                                     &q) == cudaSuccess &&
	    q == cudaDriverEntryPointSuccess)
		wait_value = (wait_fn)fn;
}

static int cuda_err(char *err, cudaError_t e, const char *what)
{
	cudaGetLastError(); /* not sticky: the trainer's next CUDA call must not see it */
	return ipc_errf(err, e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO,
	                "%s: %s (CUDA error %d)", what, cudaGetErrorString(e), (int)e);
}

/* The calling thread's device is the trainer's: we switch to dev and back. */
static cudaError_t enter(int dev, int *old)
{
	cudaError_t e = cudaGetDevice(old);

	return e == cudaSuccess && *old != dev ? cudaSetDevice(dev) : e;
}

static void leave(int dev, int old)
{
	if (old != dev)
		cudaSetDevice(old);
}

int cl_gpu_locate(const void *p, uint64_t n, struct cl_gpu_alloc *a, char *err)
{
	struct cudaPointerAttributes attr;
	struct cudaDeviceProp prop;
	cudaIpcMemHandle_t h;
	CUdeviceptr base;
	size_t size;
	cudaError_t e;

	memset(a, 0, sizeof(*a));
	/* Host memory, or no driver at all: not ours to export. */
	if (!p || cudaPointerGetAttributes(&attr, p) != cudaSuccess ||
	    attr.type != cudaMemoryTypeDevice) {
		cudaGetLastError(); /* a failed query must not stick to the next call */
		return -ENOENT;
	}
	pthread_once(&once, lookup);
	if (!mem_range)
		return ipc_errf(err, -ENOTSUP, "the CUDA driver offers no cuMemGetAddressRange");
	if (mem_range(&base, &size, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
		return ipc_errf(err, -EINVAL, "cuMemGetAddressRange refused a device pointer");
	if ((uintptr_t)p + n > base + size)
		return ipc_errf(err, -ERANGE,
		                "%llu bytes at a device pointer run past the end of "
		                "its allocation",
		                (unsigned long long)n);
	e = cudaGetDeviceProperties(&prop, attr.device);
	if (e == cudaSuccess)
		e = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)base);
	if (e != cudaSuccess)
		return cuda_err(err, e,
		                "cudaIpcGetMemHandle (memory from cudaMalloc can be "
		                "shared; from cudaMallocAsync pools or VMM it may not)");
	a->base = (uintptr_t)base;
	a->size = size;
	a->dev = attr.device;
	memcpy(a->uuid, prop.uuid.bytes, CL_GPU_UUID);
	memcpy(a->handle, &h, CL_GPU_HANDLE);
	return 0;
}

int cl_gpu_plan_init(struct cl_gpu_plan *g, int dev, void *fence, char *err)
{
	void *dptr = NULL;
	cudaError_t e;
	int old;

	memset(g, 0, sizeof(*g));
	pthread_once(&once, lookup);
	if (!wait_value)
		return ipc_errf(err, -ENOTSUP,
		                "the CUDA driver offers no cuStreamWaitValue32: "
		                "ckpt_save_fence cannot work");
	e = enter(dev, &old);
	if (e != cudaSuccess)
		return cuda_err(err, e, "cudaSetDevice");
	/* The fence page: pinned and mapped, so a stream can wait on its word. */
	e = cudaHostRegister(fence, 4096, cudaHostRegisterMapped | cudaHostRegisterPortable);
	if (e == cudaSuccess) {
		e = cudaHostGetDevicePointer(&dptr, fence, 0);
		if (e != cudaSuccess)
			cudaHostUnregister(fence);
	}
	leave(dev, old);
	if (e != cudaSuccess)
		return cuda_err(err, e, "registering the plan's fence page");
	g->dev = dev;
	g->fence = fence;
	g->fence_dev = (uintptr_t)dptr;
	return 0;
}

void cl_gpu_plan_free(struct cl_gpu_plan *g)
{
	int old;

	if (!g->fence)
		return; /* never set up */
	if (enter(g->dev, &old) == cudaSuccess) {
		/* No stream may still wait on the page, nor an event be pending. */
		cudaDeviceSynchronize();
		for (unsigned i = 0; i < CL_GPU_EVENTS; i++)
			if (g->ev[i].ev)
				cudaEventDestroy((cudaEvent_t)g->ev[i].ev);
		cudaHostUnregister(g->fence);
		leave(g->dev, old);
	}
	cudaGetLastError();
	memset(g, 0, sizeof(*g));
}

uint32_t cl_gpu_fence_word(const struct cl_gpu_plan *g)
{
	return g->fence ? __atomic_load_n((const uint32_t *)g->fence, __ATOMIC_ACQUIRE) : 0;
}

int cl_gpu_event_take(struct cl_gpu_plan *g, char *err)
{
	uint32_t word = cl_gpu_fence_word(g);

	/* In ring order; a slot whose save timed out stays busy and is passed over. */
	for (unsigned k = 0; k < CL_GPU_EVENTS; k++) {
		unsigned i = (g->next + k) % CL_GPU_EVENTS;
		struct cl_gpu_event *ev = &g->ev[i];

		if (ev->busy || (ev->saved && !cl_gpu_passed(word, ev->seq)))
			continue;
		ev->busy = true;
		g->next = i + 1;
		return (int)i;
	}
	return ipc_errf(err, -EBUSY, "%d saves of this plan not yet captured", CL_GPU_EVENTS);
}

void cl_gpu_event_done(struct cl_gpu_plan *g, int slot, bool saved, uint32_t seq)
{
	g->ev[slot].busy = false;
	g->ev[slot].saved = saved;
	g->ev[slot].seq = seq;
}

int cl_gpu_record(struct cl_gpu_plan *g, int slot, void *stream, char *err)
{
	struct cl_gpu_event *ev = &g->ev[slot];
	cudaIpcEventHandle_t h;
	cudaEvent_t made = NULL;
	cudaError_t e;
	int old;

	e = enter(g->dev, &old);
	if (e != cudaSuccess)
		return cuda_err(err, e, "cudaSetDevice");
	if (!ev->ev) {
		e = cudaEventCreateWithFlags(&made, cudaEventDisableTiming | cudaEventInterprocess);
		if (e == cudaSuccess)
			e = cudaIpcGetEventHandle(&h, made);
		if (e == cudaSuccess) {
			ev->ev = made;
			memcpy(ev->handle, &h, CL_GPU_HANDLE);
		} else if (made) {
			cudaEventDestroy(made);
		}
	}
	if (e == cudaSuccess)
		e = cudaEventRecord((cudaEvent_t)ev->ev, (cudaStream_t)stream);
	leave(g->dev, old);
	return e == cudaSuccess ? 0 : cuda_err(err, e, "recording the save's event");
}

int cl_gpu_fence(int dev, uintptr_t fence_dev, void *stream, uint32_t seq, char *err)
{
	CUresult r;
	int old;

	if (enter(dev, &old) != cudaSuccess) {
		cudaGetLastError();
		return ipc_errf(err, -EIO, "cudaSetDevice(%d) failed", dev);
	}
	/* GEQ compares (int32_t)(*word - seq) >= 0: wraps like the agent's numbers. */
	r = wait_value((CUstream)stream, (CUdeviceptr)fence_dev, seq, CU_STREAM_WAIT_VALUE_GEQ);
	leave(dev, old);
	if (r != CUDA_SUCCESS)
		return ipc_errf(err, -EIO,
		                "cuStreamWaitValue32 on the fence failed (CUDA driver "
		                "error %d)",
		                (int)r);
	return 0;
}

void cl_gpu_release(struct cl_gpu_plan *g, uint32_t seq)
{
	if (g->fence && !cl_gpu_passed(cl_gpu_fence_word(g), seq))
		__atomic_store_n((uint32_t *)g->fence, seq, __ATOMIC_RELEASE);
}

#else /* no CUDA toolkit at build time: nothing is device memory */

int cl_gpu_locate(const void *p, uint64_t n, struct cl_gpu_alloc *a, char *err)
{
	memset(a, 0, sizeof(*a));
	return -ENOENT;
}

int cl_gpu_plan_init(struct cl_gpu_plan *g, int dev, void *fence, char *err)
{
	memset(g, 0, sizeof(*g));
	return ipc_errf(err, -ENOTSUP, "libckpt was built without CUDA");
}

void cl_gpu_plan_free(struct cl_gpu_plan *g)
{
}

uint32_t cl_gpu_fence_word(const struct cl_gpu_plan *g)
{
	return 0;
}

int cl_gpu_event_take(struct cl_gpu_plan *g, char *err)
{
	return ipc_errf(err, -ENOTSUP, "libckpt was built without CUDA");
}

void cl_gpu_event_done(struct cl_gpu_plan *g, int slot, bool saved, uint32_t seq)
{
}

int cl_gpu_record(struct cl_gpu_plan *g, int slot, void *stream, char *err)
{
	return ipc_errf(err, -ENOTSUP, "libckpt was built without CUDA");
}

int cl_gpu_fence(int dev, uintptr_t fence_dev, void *stream, uint32_t seq, char *err)
{
	return ipc_errf(err, -ENOTSUP, "libckpt was built without CUDA");
}

void cl_gpu_release(struct cl_gpu_plan *g, uint32_t seq)
{
}

#endif
