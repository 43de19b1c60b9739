/*
 * The agent's GPUs (gpu.h). CUDA runtime calls (CUDA::cudart), and one
 * driver call (cuMemGetAddressRange) looked up through the runtime; every
 * cudaError_t is turned into a negative errno here, once, with CUDA's own
 * text and code in the message, and cleared so that it names no later call.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <time.h>

#include "agent/pipe/gpu.h"
#include "ipc/ipc.h"
#include "agent/pipe/ipccache.h"
#include "ipc/base/log.h"

#ifdef CKPT_HAVE_CUDA
#include <cuda.h> /* types only: the one driver call is looked up, libcuda is not linked */
#include <cuda_runtime_api.h>

#define MAX_GPUS 64
/* The trainer's events a lane keeps open: libckpt's ring per plan is as long. */
#define LANE_EVENTS 64

typedef CUresult (*range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr p);

struct gpu {
	int n;
	char status[512];
	uint8_t uuid[MAX_GPUS][GPU_UUID_BYTES];
	struct ipc_cache *mem;
	range_fn mem_range; /* cuMemGetAddressRange: an opened allocation's real size */
	pthread_mutex_t mu; /* the cache and the pinning: plans open and close on workers */
	void *pinned; /* the staging pool, once registered */
	int pinned_dev; /* through this device's context */
	bool pin_tried;
};

struct lane_event {
	uint8_t handle[GPU_EVENT_HANDLE_BYTES];
	cudaEvent_t ev; /* opened from handle; NULL: slot empty */
};

struct gpu_lane {
	int dev;
	cudaStream_t stream;
	cudaEvent_t mark[2];
	struct lane_event ev[LANE_EVENTS];
	unsigned next; /* the slot to reuse when all are taken */
};

static int cuda_err(char *err, cudaError_t e, const char *what)
{
	cudaGetLastError(); /* clear it: a sticky last error would name the next call */
	return ipc_errf(err, e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO,
	                "%s: %s (CUDA error %d)", what, cudaGetErrorString(e), (int)e);
}

static int ipc_open(void *ctx, int dev, const uint8_t *handle, void **ptr, uint64_t *size,
                    char *err)
{
	struct gpu *g = ctx;
	cudaIpcMemHandle_t h;
	CUdeviceptr base;
	size_t len;
	cudaError_t e;

	if (!g->mem_range)
		return ipc_errf(err, -ENOTSUP,
		                "the CUDA driver offers no cuMemGetAddressRange: an allocation's "
		                "size cannot be checked");
	memcpy(&h, handle, sizeof(h));
	e = cudaSetDevice(dev);
	if (e == cudaSuccess)
		e = cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess);
	if (e != cudaSuccess)
		return cuda_err(err, e, "cudaIpcOpenMemHandle");
	if (g->mem_range(&base, &len, (CUdeviceptr)(uintptr_t)*ptr) != CUDA_SUCCESS) {
		cudaIpcCloseMemHandle(*ptr);
		return ipc_errf(err, -EIO, "cuMemGetAddressRange refused an opened allocation");
	}
	/* The mapping starts at the allocation's base: what lies before *ptr is not ours. */
	*size = (uint64_t)(base + len - (CUdeviceptr)(uintptr_t)*ptr);
	return 0;
}

static void ipc_close(void *ctx, int dev, void *ptr)
{
	cudaSetDevice(dev);
	cudaIpcCloseMemHandle(ptr);
}

static range_fn find_mem_range(void)
{
	enum cudaDriverEntryPointQueryResult q;
	void *fn;

	/* 12000: the _v2 form, with a 64-bit size */
	if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
	                                     &q) != cudaSuccess ||
	    q != cudaDriverEntryPointSuccess) {
		cudaGetLastError();
		return NULL;
	}
	return (range_fn)fn;
}

int gpu_create(struct gpu **out, char *err)
{
	struct gpu *g = calloc(1, sizeof(*g));
	struct ipc_cache_ops ops = {ipc_open, ipc_close, g};
	int n = 0, len;
	cudaError_t e;

	if (!g || ipc_cache_create(&ops, &g->mem)) {
		free(g);
		return ipc_errf(err, -ENOMEM, "out of memory");
	}
	pthread_mutex_init(&g->mu, NULL);
	e = cudaGetDeviceCount(&n); /* leaves n alone on failure: it was set to 0 */
	if (e != cudaSuccess || n <= 0) {
		cudaGetLastError();
		snprintf(g->status, sizeof(g->status),
		         "no usable GPU: cudaGetDeviceCount: %s (CUDA error %d): device plans are "
		         "refused",
		         e != cudaSuccess ? cudaGetErrorString(e) : "no devices", (int)e);
		*out = g;
		return 0;
	}
	g->mem_range = find_mem_range();
	g->n = n < MAX_GPUS ? n : MAX_GPUS;
	len = snprintf(g->status, sizeof(g->status), "%d GPU%s:", g->n, g->n > 1 ? "s" : "");
	for (int d = 0; d < g->n; d++) {
		struct cudaDeviceProp p;

		if (cudaGetDeviceProperties(&p, d) != cudaSuccess) {
			cudaGetLastError();
			continue;
		}
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
	if (g->pinned && cudaSetDevice(g->pinned_dev) == cudaSuccess)
		cudaHostUnregister(g->pinned);
	pthread_mutex_destroy(&g->mu);
	free(g);
}

static void pin(struct gpu *g, int dev, void *base, uint64_t len);

void gpu_pin(struct gpu *g, int dev, void *base, uint64_t len)
{
	if (!gpu_usable(g))
		return;
	/* held throughout: a second plan's open waits until the pool is pinned */
	pthread_mutex_lock(&g->mu);
	if (!g->pin_tried)
		pin(g, dev, base, len);
	pthread_mutex_unlock(&g->mu);
}

/* Under g->mu, once. */
static void pin(struct gpu *g, int dev, void *base, uint64_t len)
{
	cudaError_t e;

	g->pin_tried = true;
	/*
	 * Through the plan's GPU (no context made on another one); portable:
	 * pinned for every GPU's context, not only that one.
	 */
	e = cudaSetDevice(dev);
	if (e == cudaSuccess)
		e = cudaHostRegister(base, (size_t)len, cudaHostRegisterPortable);
	if (e != cudaSuccess) {
		cudaGetLastError();
		log_msg(LOG_WARNING,
		        "staging pool not pinned for the GPUs (cudaHostRegister: %s, CUDA error "
		        "%d): copies from GPU memory will be slower",
		        cudaGetErrorString(e), (int)e);
		return;
	}
	g->pinned = base;
	g->pinned_dev = dev;
	log_msg(LOG_INFO, "staging pool pinned for the GPUs (%llu MiB)",
	        (unsigned long long)(len >> 20));
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

int gpu_mem_get(struct gpu *g, int dev, const uint8_t *handle, size_t len, uint64_t claimed,
                void **ptr, char *err)
{
	if (len != IPC_HANDLE_BYTES)
		return ipc_errf(err, -EINVAL, "a CUDA IPC handle is %d bytes, not %zu",
		                IPC_HANDLE_BYTES, len);
	int rc;

	pthread_mutex_lock(&g->mu);
	rc = ipc_cache_get(g->mem, dev, handle, claimed, ptr, err);
	pthread_mutex_unlock(&g->mu);
	return rc;
}

void gpu_mem_put(struct gpu *g, int dev, void *ptr)
{
	pthread_mutex_lock(&g->mu);
	ipc_cache_put(g->mem, dev, ptr);
	pthread_mutex_unlock(&g->mu);
}

unsigned gpu_mem_open(const struct gpu *g)
{
	unsigned n;

	if (!g)
		return 0;
	pthread_mutex_lock((pthread_mutex_t *)&g->mu);
	n = ipc_cache_open_count(g->mem);
	pthread_mutex_unlock((pthread_mutex_t *)&g->mu);
	return n;
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
		int rc = cuda_err(err, e, "creating a copy stream");

		gpu_lane_abandon(l); /* nothing was queued on it */
		return rc;
	}
	*out = l;
	return 0;
}

/* Frees the lane's CUDA objects; work still queued finishes (or not) without it. */
void gpu_lane_abandon(struct gpu_lane *l)
{
	if (!l)
		return;
	cudaSetDevice(l->dev);
	for (int k = 0; k < 2; k++)
		if (l->mark[k])
			cudaEventDestroy(l->mark[k]);
	for (int i = 0; i < LANE_EVENTS; i++)
		if (l->ev[i].ev)
			cudaEventDestroy(l->ev[i].ev);
	if (l->stream)
		cudaStreamDestroy(l->stream); /* returns at once; CUDA frees it when idle */
	cudaGetLastError();
	free(l);
}

void gpu_lane_sync(struct gpu_lane *l)
{
	if (cudaSetDevice(l->dev) != cudaSuccess || cudaStreamSynchronize(l->stream) != cudaSuccess)
		cudaGetLastError();
}

void gpu_lane_destroy(struct gpu_lane *l)
{
	if (!l)
		return;
	gpu_lane_sync(l);
	gpu_lane_abandon(l);
}

/* The trainer's event with this handle, opened on first sight. */
static int lane_event(struct gpu_lane *l, const uint8_t *handle, cudaEvent_t *out, char *err)
{
	struct lane_event *slot = NULL;
	cudaIpcEventHandle_t h;
	cudaError_t e;

	for (int i = 0; i < LANE_EVENTS; i++) {
		if (l->ev[i].ev && !memcmp(l->ev[i].handle, handle, GPU_EVENT_HANDLE_BYTES)) {
			*out = l->ev[i].ev;
			return 0;
		}
		if (!l->ev[i].ev && !slot)
			slot = &l->ev[i];
	}
	if (!slot) {
		/* Safe: a stream's wait took the event's state when it was queued. */
		slot = &l->ev[l->next++ % LANE_EVENTS];
		cudaEventDestroy(slot->ev);
		slot->ev = NULL;
	}
	memcpy(&h, handle, sizeof(h));
	e = cudaIpcOpenEventHandle(&slot->ev, h);
	if (e != cudaSuccess) {
		slot->ev = NULL;
		return cuda_err(err, e, "cudaIpcOpenEventHandle of the trainer's event");
	}
	memcpy(slot->handle, handle, GPU_EVENT_HANDLE_BYTES);
	*out = slot->ev;
	return 0;
}

int gpu_lane_after(struct gpu_lane *l, const uint8_t *handle, size_t len, char *err)
{
	cudaEvent_t ev = NULL;
	cudaError_t e;
	int rc;

	if (len != GPU_EVENT_HANDLE_BYTES)
		return ipc_errf(err, -EINVAL, "a CUDA IPC event handle is %d bytes, not %zu",
		                GPU_EVENT_HANDLE_BYTES, len);
	e = cudaSetDevice(l->dev);
	if (e != cudaSuccess)
		return cuda_err(err, e, "cudaSetDevice");
	rc = lane_event(l, handle, &ev, err);
	if (rc)
		return rc;
	e = cudaStreamWaitEvent(l->stream, ev, 0);
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

int gpu_lane_wait(struct gpu_lane *l, int k, const atomic_bool *abort, char *err)
{
	struct timespec pause = {0, 20 * 1000}; /* 20 us, doubling to 1 ms */
	cudaError_t e = cudaSetDevice(l->dev);

	while (e == cudaSuccess) {
		e = cudaEventQuery(l->mark[k & 1]);
		if (e == cudaSuccess)
			return 0;
		if (e != cudaErrorNotReady)
			break;
		if (abort && atomic_load(abort))
			return ipc_errf(err, -ECANCELED, "aborted waiting for the GPU");
		nanosleep(&pause, NULL);
		if (pause.tv_nsec < 1000 * 1000)
			pause.tv_nsec *= 2;
		e = cudaSuccess;
	}
	return cuda_err(err, e, "waiting for the GPU copies");
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

void gpu_pin(struct gpu *g, int dev, void *base, uint64_t len)
{
}

int gpu_device_of(const struct gpu *g, const uint8_t *uuid, size_t len, char *err)
{
	return ipc_errf(err, -ENOTSUP, "%s", gpu_status(g));
}

int gpu_mem_get(struct gpu *g, int dev, const uint8_t *handle, size_t len, uint64_t claimed,
                void **ptr, char *err)
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

int gpu_lane_wait(struct gpu_lane *l, int k, const atomic_bool *abort, char *err)
{
	return -ENOTSUP;
}

void gpu_lane_sync(struct gpu_lane *l)
{
}

void gpu_lane_abandon(struct gpu_lane *l)
{
}

#endif
