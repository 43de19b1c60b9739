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
 * Threads: gpu_create/destroy on the main thread; memory and lane calls
 * under agent.mu (plans) or from the capture worker that owns the lane.
 */
#ifndef CKPT_AGENT_GPU_H
#define CKPT_AGENT_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pool.h"

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
/* cudaHostAlloc for the staging pool when a GPU is usable; NULL otherwise. */
const struct pool_alloc *gpu_pool_alloc(struct gpu *g);

/* The agent's device index for a client's device UUID; -ENODEV with a message. */
int gpu_device_of(const struct gpu *g, const uint8_t *uuid, size_t len, char *err);
/* A trainer's allocation, opened once however many plans use it (ipccache.h). */
int gpu_mem_get(struct gpu *g, int dev, const uint8_t *handle, size_t len, void **ptr,
		char *err);
void gpu_mem_put(struct gpu *g, int dev, void *ptr);
unsigned gpu_mem_open(const struct gpu *g);

/* A stream on `dev` with two events, for one plan's copies. */
int gpu_lane_create(struct gpu *g, int dev, struct gpu_lane **out, char *err);
void gpu_lane_destroy(struct gpu_lane *l);
/* The stream waits (on the GPU) for the trainer's interprocess event. */
int gpu_lane_after(struct gpu_lane *l, const uint8_t *event_handle, size_t len, char *err);
/* Queues a copy device -> host (d2h) or host -> device on the stream. */
int gpu_lane_copy(struct gpu_lane *l, void *dst, const void *src, size_t n, bool d2h,
		  char *err);
/* Marks everything queued so far with event k (0 or 1); waits for mark k. */
int gpu_lane_mark(struct gpu_lane *l, int k, char *err);
int gpu_lane_wait(struct gpu_lane *l, int k, char *err);

#endif /* CKPT_AGENT_GPU_H */
