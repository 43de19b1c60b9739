/*
 * libckpt's CUDA side: finding the allocation a device pointer lies in and
 * exporting it (one IPC handle per allocation), the trainer's interprocess
 * event recorded at each save, and the fence page a stream waits on.
 *
 * In every build; without the CUDA toolkit nothing is device memory and the
 * calls say so. The driver API (the allocation's base, stream waits) comes
 * through cudart's entry-point query: libckpt never links libcuda.
 */
#ifndef CKPT_CLIENT_GPU_H
#define CKPT_CLIENT_GPU_H

#include <stdbool.h>
#include <stdint.h>

#define CL_GPU_HANDLE 64
#define CL_GPU_UUID 16

struct cl_gpu_alloc {
	uintptr_t base;
	uint64_t size;
	int dev;
	uint8_t uuid[CL_GPU_UUID];
	uint8_t handle[CL_GPU_HANDLE];
};

/* A CUDA plan's trainer-side state. */
struct cl_gpu_plan {
	int dev;
	void *event; /* cudaEvent_t, interprocess */
	uint8_t event_handle[CL_GPU_HANDLE];
	void *fence;        /* the fence word, in a registered host region */
	uintptr_t fence_dev; /* the same word as the GPU sees it */
};

/*
 * Whether [p, p + n) is device memory inside one allocation: 0 and *a filled
 * (handle included), -ENOENT if it is not device memory, another negative
 * errno (and err) if it is but cannot be exported.
 */
int cl_gpu_locate(const void *p, uint64_t n, struct cl_gpu_alloc *a, char *err);
/* Event and fence for a plan on `dev`; fence: a host page the agent also maps. */
int cl_gpu_plan_init(struct cl_gpu_plan *g, int dev, void *fence, char *err);
void cl_gpu_plan_free(struct cl_gpu_plan *g);
/* Records the plan's event on `stream` (NULL: the default stream). */
int cl_gpu_record(struct cl_gpu_plan *g, void *stream, char *err);
/* Makes `stream` wait, on the GPU, until the fence word at fence_dev reaches seq. */
int cl_gpu_fence(uintptr_t fence_dev, void *stream, uint32_t seq, char *err);
/* Stores seq in the fence word (the agent is gone: nothing may wait forever). */
void cl_gpu_release(struct cl_gpu_plan *g, uint32_t seq);

#endif /* CKPT_CLIENT_GPU_H */
