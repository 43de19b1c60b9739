/*
 * The agent's GPUs (gpu.h). CUDA runtime calls only (CUDA::cudart); every
 * cudaError_t is turned into a negative errno here, once, with CUDA's own
 * text and code in the message.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "ipc.h"
#include "ipccache.h"

#ifdef CKPT_HAVE_CUDA
#include <cuda_runtime_api.h>

#define MAX_GPUS 64

struct gpu {
	int n;
	char status[512];
	uint8_t uuid[MAX_GPUS][GPU_UUID_BYTES];
	struct ipc_cache *mem;
	struct pool_alloc alloc;
};

struct gpu_lane {
	int dev;
	cudaStream_t stream;
	cudaEvent_t mark[2];
	cudaEvent_t trainer; /* the trainer's event, opened from its handle */
	uint8_t trainer_handle[GPU_EVENT_HANDLE_BYTES];
};

static int cuda_err(char *err, cudaError_t e, const char *what)
{
	return ipc_errf(err, e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO,
	                "%s: %s (CUDA error %d)", what, cudaGetErrorString(e), (int)e);
}

static int ipc_open(void *ctx, int dev, const uint8_t *handle, void **ptr, char *err)
{
	cudaIpcMemHandle_t h;
	cudaError_t e;

	memcpy(&h, handle, sizeof(h));
	e = cudaSetDevice(dev);
	if (e == cudaSuccess)
		e = cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess);
	return e == cudaSuccess ? 0 : cuda_err(err, e, "cudaIpcOpenMemHandle");
}

static void ipc_close(void *ctx, int dev, void *ptr)
{
	cudaSetDevice(dev);
	cudaIpcCloseMemHandle(ptr);
}

/* Pinned staging: DMA straight from it, and io_uring registers it as well. */
static void *pinned_alloc(void *ctx, uint64_t bytes, char *err)
{
	void *p = NULL;
	cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);

	if (e != cudaSuccess) {
		cuda_err(err, e, "cudaHostAlloc of the staging pool");
		return NULL;
	}
	return p;
}

static void pinned_free(void *ctx, void *p, uint64_t bytes)
{
	cudaFreeHost(p);
}

int gpu_create(struct gpu **out, char *err)
{
	struct ipc_cache_ops ops = {ipc_open, ipc_close, NULL};
	struct gpu *g = calloc(1, sizeof(*g));
	int n = 0, len;
	cudaError_t e;

	if (!g || ipc_cache_create(&ops, &g->mem)) {
		free(g);
		return ipc_errf(err, -ENOMEM, "out of memory");
	}
	g->alloc = (struct pool_alloc){pinned_alloc, pinned_free, g, "cudaHostAlloc"};
	e = cudaGetDeviceCount(&n); /* leaves n alone on failure: it was set to 0 */
	if (e != cudaSuccess || n <= 0) {
		snprintf(g->status, sizeof(g->status),
		         "no usable GPU: cudaGetDeviceCount: %s (CUDA error %d): device plans are "
		         "refused",
		         e != cudaSuccess ? cudaGetErrorString(e) : "no devices", (int)e);
		*out = g;
		return 0;
	}
	g->n = n < MAX_GPUS ? n : MAX_GPUS;
	len = snprintf(g->status, sizeof(g->status), "%d GPU%s:", g->n, g->n > 1 ? "s" : "");
	for (int d = 0; d < g->n; d++) {
		struct cudaDeviceProp p;

		if (cudaGetDeviceProperties(&p, d) != cudaSuccess)
			continue;
		memcpy(g->uuid[d], p.uuid.bytes, GPU_UUID_BYTES);
		if (len < (int)sizeof(g->status))
			len += snprintf(g->status + len, sizeof(g->status) - (size_t)len,
			                "%s %d %s", d ? "," : "", d, p.name);
	}
	*out = g;
	return 0;
}

void gpu_destroy(struct gpu *g)
{
	if (!g)
		return;
	ipc_cache_destroy(g->mem);
	free(g);
}

bool gpu_usable(const struct gpu *g)
{
	return g && g->n > 0;
}

unsigned gpu_count(const struct gpu *g)
{
	return g ? (unsigned)g->n : 0;
}

const char *gpu_status(const struct gpu *g)
{
	return g ? g->status : "no GPU";
}

const struct pool_alloc *gpu_pool_alloc(struct gpu *g)
{
	return gpu_usable(g) ? &g->alloc : NULL;
}

int gpu_device_of(const struct gpu *g, const uint8_t *uuid, size_t len, char *err)
{
	if (!gpu_usable(g))
		return ipc_errf(err, -ENOTSUP, "%s", gpu_status(g));
	for (int d = 0; len == GPU_UUID_BYTES && d < g->n; d++)
		if (memcmp(g->uuid[d], uuid, GPU_UUID_BYTES) == 0)
			return d;
	return ipc_errf(err, -ENODEV,
	                "the trainer's GPU is not one the agent sees (check CUDA_VISIBLE_DEVICES "
	                "and the unit's DeviceAllow)");
}

int gpu_mem_get(struct gpu *g, int dev, const uint8_t *handle, size_t len, void **ptr, char *err)
{
	if (len != IPC_HANDLE_BYTES)
		return ipc_errf(err, -EINVAL, "a CUDA IPC handle is %d bytes, not %zu",
		                IPC_HANDLE_BYTES, len);
	return ipc_cache_get(g->mem, dev, handle, ptr, err);
}

void gpu_mem_put(struct gpu *g, int dev, void *ptr)
{
	ipc_cache_put(g->mem, dev, ptr);
}

unsigned gpu_mem_open(const struct gpu *g)
{
	return g ? ipc_cache_open_count(g->mem) : 0;
}

int gpu_lane_create(struct gpu *g, int dev, struct gpu_lane **out, char *err)
{
	struct gpu_lane *l = calloc(1, sizeof(*l));
	cudaError_t e;

	if (!l)
		return ipc_errf(err, -ENOMEM, "out of memory");
	l->dev = dev;
	e = cudaSetDevice(dev);
	if (e == cudaSuccess)
		e = cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking);
	for (int k = 0; k < 2 && e == cudaSuccess; k++)
		e = cudaEventCreateWithFlags(&l->mark[k], cudaEventDisableTiming);
	if (e != cudaSuccess) {
		gpu_lane_destroy(l);
		return cuda_err(err, e, "creating a copy stream");
	}
	*out = l;
	return 0;
}

void gpu_lane_destroy(struct gpu_lane *l)
{
	if (!l)
		return;
	cudaSetDevice(l->dev);
	if (l->stream)
		cudaStreamSynchronize(l->stream);
	for (int k = 0; k < 2; k++)
		if (l->mark[k])
			cudaEventDestroy(l->mark[k]);
	if (l->trainer)
		cudaEventDestroy(l->trainer);
	if (l->stream)
		cudaStreamDestroy(l->stream);
	free(l);
}

int gpu_lane_after(struct gpu_lane *l, const uint8_t *handle, size_t len, char *err)
{
	cudaIpcEventHandle_t h;
	cudaError_t e = cudaSetDevice(l->dev);

	if (len != GPU_EVENT_HANDLE_BYTES)
		return ipc_errf(err, -EINVAL, "a CUDA IPC event handle is %d bytes, not %zu",
		                GPU_EVENT_HANDLE_BYTES, len);
	/* Opened once per plan: the trainer records the same event at every save. */
	if (e == cudaSuccess && (!l->trainer || memcmp(l->trainer_handle, handle, len))) {
		if (l->trainer)
			cudaEventDestroy(l->trainer);
		l->trainer = NULL;
		memcpy(&h, handle, sizeof(h));
		e = cudaIpcOpenEventHandle(&l->trainer, h);
		if (e == cudaSuccess)
			memcpy(l->trainer_handle, handle, len);
	}
	if (e == cudaSuccess)
		e = cudaStreamWaitEvent(l->stream, l->trainer, 0);
	return e == cudaSuccess ? 0 : cuda_err(err, e, "waiting for the trainer's event");
}

int gpu_lane_copy(struct gpu_lane *l, void *dst, const void *src, size_t n, bool d2h, char *err)
{
	cudaError_t e = cudaSetDevice(l->dev);

	if (e == cudaSuccess)
		e = cudaMemcpyAsync(
		    dst, src, n, d2h ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, l->stream);
	return e == cudaSuccess ? 0
	                        : cuda_err(err, e, d2h ? "copy from the GPU" : "copy to the GPU");
}

int gpu_lane_mark(struct gpu_lane *l, int k, char *err)
{
	/* The current device is per thread: capture workers serve lanes on every GPU. */
	cudaError_t e = cudaSetDevice(l->dev);

	if (e == cudaSuccess)
		e = cudaEventRecord(l->mark[k & 1], l->stream);

	return e == cudaSuccess ? 0 : cuda_err(err, e, "cudaEventRecord");
}

int gpu_lane_wait(struct gpu_lane *l, int k, char *err)
{
	cudaError_t e = cudaEventSynchronize(l->mark[k & 1]);

	return e == cudaSuccess ? 0 : cuda_err(err, e, "waiting for the GPU copies");
}

#else /* no CUDA toolkit at build time */

struct gpu {
	int unused;
};

int gpu_create(struct gpu **out, char *err)
{
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : ipc_errf(err, -ENOMEM, "out of memory");
}

void gpu_destroy(struct gpu *g)
{
	free(g);
}

bool gpu_usable(const struct gpu *g)
{
	return false;
}

unsigned gpu_count(const struct gpu *g)
{
	return 0;
}

const char *gpu_status(const struct gpu *g)
{
	return "no GPU support: ckptd was built without the CUDA toolkit: device plans are refused";
}

const struct pool_alloc *gpu_pool_alloc(struct gpu *g)
{
	return NULL;
}

int gpu_device_of(const struct gpu *g, const uint8_t *uuid, size_t len, char *err)
{
	return ipc_errf(err, -ENOTSUP, "%s", gpu_status(g));
}

int gpu_mem_get(struct gpu *g, int dev, const uint8_t *handle, size_t len, void **ptr, char *err)
{
	return ipc_errf(err, -ENOTSUP, "%s", gpu_status(g));
}

void gpu_mem_put(struct gpu *g, int dev, void *ptr)
{
}

unsigned gpu_mem_open(const struct gpu *g)
{
	return 0;
}

int gpu_lane_create(struct gpu *g, int dev, struct gpu_lane **out, char *err)
{
	return ipc_errf(err, -ENOTSUP, "%s", gpu_status(g));
}

void gpu_lane_destroy(struct gpu_lane *l)
{
}

int gpu_lane_after(struct gpu_lane *l, const uint8_t *h, size_t len, char *err)
{
	return -ENOTSUP;
}

int gpu_lane_copy(struct gpu_lane *l, void *dst, const void *src, size_t n, bool d2h, char *err)
{
	return -ENOTSUP;
}

int gpu_lane_mark(struct gpu_lane *l, int k, char *err)
{
	return -ENOTSUP;
}

int gpu_lane_wait(struct gpu_lane *l, int k, char *err)
{
	return -ENOTSUP;
}

#endif
