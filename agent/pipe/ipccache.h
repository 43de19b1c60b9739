/*
 * The CUDA IPC handle cache: each allocation a trainer exports is opened
 * once in the agent however many plans name it (opening is expensive, and
 * before CUDA 11.x could not be done twice in one process), counted, and
 * closed when the last plan using it goes: an open mapping keeps the
 * trainer's freed GPU memory alive, so none is kept longer than a plan.
 *
 * Pure C behind an ops table (the CUDA calls), so the logic is tested
 * without a GPU. Callers serialise access (gpu.c holds its own mutex).
 */
#ifndef CKPT_AGENT_IPCCACHE_H
#define CKPT_AGENT_IPCCACHE_H

#include <stdint.h>

#define IPC_HANDLE_BYTES 64 /* sizeof(cudaIpcMemHandle_t) */

struct ipc_cache_ops {
	/*
	 * Opens `handle` on device `dev`: *ptr the mapping, *size the bytes of
	 * the allocation (as the driver says, not the client); negative errno
	 * and err on failure.
	 */
	int (*open)(void *ctx, int dev, const uint8_t *handle, void **ptr, uint64_t *size,
	            char *err);
	void (*close)(void *ctx, int dev, void *ptr);
	void *ctx;
};

struct ipc_cache;

int ipc_cache_create(const struct ipc_cache_ops *ops, struct ipc_cache **out);
/* Closes whatever is still open. NULL is fine. */
void ipc_cache_destroy(struct ipc_cache *c);
/*
 * The mapping of (dev, handle), opened if new; every get needs a put.
 * -ERANGE when the allocation is smaller than `need` bytes (what the client
 * claimed, and the plan's tensors were checked against).
 */
int ipc_cache_get(struct ipc_cache *c, int dev, const uint8_t *handle, uint64_t need, void **ptr,
                  char *err);
/* Drops a reference taken by get; closes the mapping with the last. */
void ipc_cache_put(struct ipc_cache *c, int dev, void *ptr);
/* Mappings open now. */
unsigned ipc_cache_open_count(const struct ipc_cache *c);

#endif /* CKPT_AGENT_IPCCACHE_H */
