/*
 * The staging pool: one page-aligned, pre-faulted region of host memory,
 * locked where the limit allows (and pinned for the GPUs by gpu_pin when
 * CUDA plans come), cut into fixed chunks that are registered with io_uring.
 * Captures copy into chunks; writes go out of them; nothing is copied in
 * between and nothing is allocated per I/O.
 *
 * Admission is by reservation, and the pool is shared among the saves and
 * restores that stream through it side by side. A reservation says how many
 * chunks it may hold at once at most (`want`: all of a save that fits, the
 * whole pool for one that does not). Each admitted reservation is sure of a
 * window of chunks (`pool_floor`: `window` chunks, fewer when that many
 * reservations share the pool that each gets n / active, and never fewer
 * than 2: one being filled while another is written); chunks beyond the
 * windows go to the oldest reservation that wants them. A chunk goes back to
 * the pool as soon as its write (or read) and checksums are done, so a
 * streaming save recycles chunks while others stream beside it, and a large
 * save never holds the pool away from a small one.
 *
 * At most n / 2 reservations are admitted at once; more wait in FIFO order
 * (or fail at once with -EAGAIN when the caller must not wait: the "skip"
 * policy). A caller that must not wait is also refused when chunks held by
 * other groups (other checkpoints) leave it no window now: reservations of
 * one group (the ranks of one step) never count against each other.
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

#include "storage/io/ioeng.h"
#include "ipc/base/work.h"

struct pool;

struct pool_chunk {
	void *buf;
	unsigned index; /* position in the pool: the registered buffer index */
	uint64_t fill; /* bytes of data in it (the write may be padded) */
	struct io_req req; /* the I/O this chunk is the buffer of */
	struct work hash; /* saves: its checksum pass, on the hasher thread */
	atomic_int busy; /* saves: its write and its checksums still to finish */
	void *owner; /* the save or restore using it */
	struct pool_chunk *next;
};

struct pool_opts {
	uint64_t bytes; /* rounded down to whole chunks; at least 2 */
	uint64_t chunk_bytes; /* multiple of 4096 */
	bool lock; /* mlock the pool (skipped if the limit is too low) */
	unsigned window; /* chunks each reservation is sure of (enough to keep the disk busy) */
};

struct pool_stats {
	uint64_t bytes;
	uint64_t chunk_bytes;
	unsigned chunks;
	unsigned in_use; /* chunks taken and not yet given back */
	unsigned active; /* reservations admitted and not released */
	unsigned waiters; /* reservations waiting to be admitted */
	uint64_t waits; /* reservations that had to wait, ever */
	bool locked;
};

struct pool_resv {
	struct pool *pool;
	const void *group; /* reservations of one group never keep each other out */
	unsigned want; /* the most chunks it holds at once */
	unsigned held; /* chunks taken and not yet given back */
	bool active; /* admitted and not released: it may take */
	bool listed; /* on the pool's list: active, or chunks still out */
	bool taking; /* a take of it is waiting for a chunk */
	struct pool_resv *prev, *next; /* the pool's list, oldest first */
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
 * Admits r, which will hold at most `want` chunks at once (1 <= want <=
 * pool_nchunks). wait false: -EAGAIN unless it is admitted now, and has a
 * window now that chunks held by other groups leave free. wait true: waits
 * its turn (as a job of q that waits: workq_wait_begin); -ECANCELED once
 * *abort is true (set it, then pool_wake).
 */
int pool_reserve(struct pool *p, struct pool_resv *r, unsigned want, const void *group, bool wait,
                 const atomic_bool *abort, struct workq *q);
/* Whether pool_reserve(..., wait false) would admit it now (it reserves nothing). */
bool pool_may_admit(struct pool *p, const void *group, unsigned want);
/*
 * A chunk for r: within its window, or one no other window needs and no
 * older reservation waits for; waits (a job of q that waits) until there is
 * one. NULL once aborted or released: an aborted capture copies nothing more.
 */
struct pool_chunk *pool_take(struct pool_resv *r, const atomic_bool *abort, struct workq *q);
/* The same, but NULL at once when it would have to wait. */
struct pool_chunk *pool_try_take(struct pool_resv *r);
/* Gives a chunk back to the pool (any thread). */
void pool_give(struct pool_resv *r, struct pool_chunk *c);
/* Ends a reservation: it takes nothing more; chunks still out come back as given. */
void pool_release(struct pool_resv *r);
/* Wakes every waiter so it looks at its abort flag. */
void pool_wake(struct pool *p);
/* The window r is sure of now (changes as reservations come and go). */
unsigned pool_floor(struct pool_resv *r);

#endif /* CKPT_AGENT_POOL_H */
