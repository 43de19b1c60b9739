/*
 * The agent's GPUs: what is usable and why not, pinned staging memory, the
 * trainers' allocations opened through CUDA IPC (once each: ipccache.h),
 * and lanes: a plan's stream on its device, where its copies are queued
 * after the trainer's pending work and waited for by the capture worker.
 *
 * Built in every build: with the CUDA toolkit the calls are real; without
 * it every call says "built without CUDA". Where CUDA is built but no GPU
 * works (no driver, no device), gpu_status() gives CUDA's own error text.
 *
 * Threads: gpu_create/destroy on the main thread; pinning and the handle
 * cache from capture workers (plans open and close their GPU side there,
 * never under agent.mu), serialised by the gpu's own mutex; lane calls from
 * the worker that owns the lane.
 */
#ifndef CKPT_AGENT_GPU_H
#define CKPT_AGENT_GPU_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/pipe/pool.h"

#define GPU_UUID_BYTES 16
#define GPU_EVENT_HANDLE_BYTES 64 /* sizeof(cudaIpcEventHandle_t) */

struct gpu;
struct gpu_lane;

/* Finds the GPUs. Fails only for want of memory: no GPU is a status. */
int gpu_create(struct gpu **out, char *err);
void gpu_destroy(struct gpu *g);
bool gpu_usable(const struct gpu *g);
unsigned gpu_count(const struct gpu *g);
/* "1 GPU: NVIDIA H100 80GB HBM3 (GPU-...)" or why none is usable. */
const char *gpu_status(const struct gpu *g);
/*
 * Pins the staging pool for the GPUs (cudaHostRegister, through device
 * dev), once, when the first CUDA plan comes: a node that only checkpoints
 * host memory never makes a CUDA context. Failing leaves the pool pageable
 * (slower copies) and is logged; later calls do nothing. gpu_destroy unpins it: call it before the
 * pool goes.
 */
void gpu_pin(struct gpu *g, int dev, void *base, uint64_t len);

/* The agent's device index for a client's device UUID; -ENODEV with a message. */
int gpu_device_of(const struct gpu *g, const uint8_t *uuid, size_t len, char *err);
/*
 * A trainer's allocation, opened once however many plans use it (ipccache.h);
 * refused if the client claims more bytes than the allocation has.
 */
int gpu_mem_get(struct gpu *g, int dev, const uint8_t *handle, size_t len, uint64_t claimed,
                void **ptr, char *err);
void gpu_mem_put(struct gpu *g, int dev, void *ptr);
unsigned gpu_mem_open(const struct gpu *g);

/* A stream on `dev` with two events, for one plan's copies. */
int gpu_lane_create(struct gpu *g, int dev, struct gpu_lane **out, char *err);
/* Waits for what is queued (gpu_lane_sync), then frees the lane. */
void gpu_lane_destroy(struct gpu_lane *l);
/*
 * The stream waits (on the GPU) for the trainer's interprocess event (one of
 * the plan's ring, opened once each).
 */
int gpu_lane_after(struct gpu_lane *l, const uint8_t *event_handle, size_t len, char *err);
/* Queues a copy device -> host (d2h) or host -> device on the stream. */
int gpu_lane_copy(struct gpu_lane *l, void *dst, const void *src, size_t n, bool d2h, char *err);
/* Marks everything queued so far with event k (0 or 1). */
int gpu_lane_mark(struct gpu_lane *l, int k, char *err);
/*
 * Waits for mark k by polling, so that *abort (may be NULL) can end the wait:
 * a trainer that dies with work queued before its event may never let it
 * fire. -ECANCELED when aborted: the lane is then unusable (gpu_lane_abandon).
 */
int gpu_lane_wait(struct gpu_lane *l, int k, const atomic_bool *abort, char *err);
/* Waits for everything queued on the lane (finite: the agent's own copies). */
void gpu_lane_sync(struct gpu_lane *l);
/* Lets go of a lane whose queue may never drain, without waiting for it. */
void gpu_lane_abandon(struct gpu_lane *l);

#endif /* CKPT_AGENT_GPU_H */
