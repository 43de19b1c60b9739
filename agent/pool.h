/*
 * The staging pool: one page-aligned, pre-faulted region of host memory,
 * locked where the limit allows (and pinned for the GPUs by gpu_pin when
 * CUDA plans come), cut into fixed chunks that are registered with io_uring.
 * Captures copy into chunks; writes go out of them; nothing is copied in
 * between and nothing is allocated per I/O.
 *
 * Admission is by reservation: a save reserves the chunks it needs (all of
 * them when it fits, the whole pool when it does not and must stream),
 * waiting in FIFO order behind earlier saves, or failing at once with
 * -EAGAIN when the caller must not wait (the "skip" policy). A reservation
 * is a count of credits: taking a chunk spends one, giving a written chunk
 * back returns it, so a streaming save recycles its own chunks and never
 * starves another.
 *
 * Threads: every call is safe from any thread (one mutex, two condition
 * variables); pool_give runs on the I/O thread.
 */
#ifndef CKPT_AGENT_POOL_H
#define CKPT_AGENT_POOL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "ioeng.h"
#include "work.h"

struct pool;

struct pool_chunk {
	void *buf;
	unsigned index; /* position in the pool: the registered buffer index */
	uint64_t fill; /* bytes of data in it (the write may be padded) */
	struct io_req req; /* the I/O this chunk is the buffer of */
	struct work hash; /* saves: its checksum pass, on the hasher thread */
	atomic_int busy;  /* saves: its write and its checksums still to finish */
	void *owner; /* the save or restore using it */
	struct pool_chunk *next;
};

struct pool_opts {
	uint64_t bytes; /* rounded down to whole chunks; at least 2 */
	uint64_t chunk_bytes; /* multiple of 4096 */
	bool lock; /* mlock the pool (skipped if the limit is too low) */
};

struct pool_stats {
	uint64_t bytes;
	uint64_t chunk_bytes;
	unsigned chunks;
	unsigned free_credits; /* chunks no reservation holds */
	unsigned in_use; /* chunks taken and not yet given back */
	unsigned waiters; /* reservations waiting for room */
	uint64_t waits; /* reservations that had to wait, ever */
	bool locked;
};

struct pool_resv {
	struct pool *pool;
	unsigned credits; /* chunks this reservation may still take */
	unsigned held; /* chunks reserved in all */
	bool active;
};

int pool_create(const struct pool_opts *o, struct pool **out, char *err);
/* All chunks must have been given back. NULL is fine. */
void pool_destroy(struct pool *p);

/* The chunks as iovecs, for ioeng_register_buffers. */
const struct iovec *pool_iovecs(const struct pool *p, unsigned *n);
/* Chunk by index. */
struct pool_chunk *pool_chunk_at(struct pool *p, unsigned index);
/* "mmap, 2 MiB pages advised, mlock'd" or why not. */
const char *pool_detail(const struct pool *p);
void pool_get_stats(struct pool *p, struct pool_stats *out);
unsigned pool_nchunks(const struct pool *p);
uint64_t pool_chunk_bytes(const struct pool *p);

/*
 * Reserves n chunks (1 <= n <= pool_nchunks). wait false: -EAGAIN unless
 * they are free now and nobody waits before us. wait true: waits its turn;
 * -ECANCELED once *abort is true (set it, then pool_wake).
 */
int pool_reserve(struct pool *p, struct pool_resv *r, unsigned n, bool wait,
                 const atomic_bool *abort);
/*
 * A chunk of the reservation; waits for one to come back. NULL once aborted,
 * even with credits left: an aborted capture copies nothing more.
 */
struct pool_chunk *pool_take(struct pool_resv *r, const atomic_bool *abort);
/* Gives a chunk back: to its reservation if still active, else to the pool. */
void pool_give(struct pool_resv *r, struct pool_chunk *c);
/* Ends a reservation: unused credits back to the pool; chunks still out follow when given. */
void pool_release(struct pool_resv *r);
/* Wakes every waiter so it looks at its abort flag. */
void pool_wake(struct pool *p);

#endif /* CKPT_AGENT_POOL_H */
