/*
 * libckpt's CUDA side: finding the allocation a device pointer lies in and
 * exporting it (one IPC handle per allocation), the trainer's interprocess
 * events recorded at saves, and the fence page a stream waits on.
 *
 * In every build; without the CUDA toolkit nothing is device memory and the
 * calls say so. The driver API (the allocation's base, stream waits) comes
 * through cudart's entry-point query: libckpt never links libcuda.
 */
#ifndef CKPT_CLIENT_CUDA_IPC_H
#define CKPT_CLIENT_CUDA_IPC_H

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

/*
 * A save's event: recorded on the trainer's stream at ckpt_save, waited on by
 * the agent's lane. An event may be recorded again only once the agent has
 * queued its wait on the last record (its save is finished on the fence), so
 * a plan has a ring of them, one per save in flight: as many as the agent's
 * fence window.
 */
#define CL_GPU_EVENTS 64

struct cl_gpu_event {
	void *ev; /* cudaEvent_t, interprocess; made when first needed */
	uint8_t handle[CL_GPU_HANDLE];
	uint32_t seq; /* the fence number of its last save, if `saved` */
	bool saved; /* the agent took a save recorded on it */
	bool busy; /* a save is between cl_gpu_event_take and _done */
};

/* A CUDA plan's trainer-side state. */
struct cl_gpu_plan {
	int dev;
	struct cl_gpu_event ev[CL_GPU_EVENTS];
	unsigned next; /* the ring's next slot */
	void *fence; /* the fence word, in a registered host region */
	uintptr_t fence_dev; /* the same word as the GPU sees it */
};

/*
 * Whether [p, p + n) is device memory inside one allocation: 0 and *a filled
 * (handle included), -ENOENT if it is not device memory, another negative
 * errno (and err) if it is but cannot be exported.
 */
int cl_gpu_locate(const void *p, uint64_t n, struct cl_gpu_alloc *a, char *err);
/* A plan on `dev` with its fence; fence: a host page the agent also maps. */
int cl_gpu_plan_init(struct cl_gpu_plan *g, int dev, void *fence, char *err);
/*
 * Waits for the plan's GPU work (the fence word must already be past every
 * number given out, or a stream waiting on it never ends), frees its events
 * and unregisters its fence page. Nothing to do for a plan never set up.
 */
void cl_gpu_plan_free(struct cl_gpu_plan *g);
/* The fence word as the agent last stored it. */
uint32_t cl_gpu_fence_word(const struct cl_gpu_plan *g);
/* Whether the fence word has reached seq (numbers wrap). */
static inline bool cl_gpu_passed(uint32_t word, uint32_t seq)
{
	return (int32_t)(word - seq) >= 0;
}
/*
 * The caller serialises (the client's lock). The next free event of the ring
 * (its last save finished on the fence), or -EBUSY; give it back with _done.
 */
int cl_gpu_event_take(struct cl_gpu_plan *g, char *err);
/* saved: the agent took the save, numbered seq; else the event is free at once. */
void cl_gpu_event_done(struct cl_gpu_plan *g, int slot, bool saved, uint32_t seq);
/* Records event `slot` on `stream` (NULL: the plan's GPU's default stream). */
int cl_gpu_record(struct cl_gpu_plan *g, int slot, void *stream, char *err);
/* Makes `stream` (NULL: dev's default) wait on the GPU until the fence word reaches seq. */
int cl_gpu_fence(int dev, uintptr_t fence_dev, void *stream, uint32_t seq, char *err);
/* Moves the fence word to seq, unless past it (the agent is gone: nothing may wait forever). */
void cl_gpu_release(struct cl_gpu_plan *g, uint32_t seq);

#endif /* CKPT_CLIENT_CUDA_IPC_H */
