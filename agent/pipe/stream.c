/*
 * A save's chunks, from the capture to a durable file: the one place their
 * life is written down. save.c admits the save and runs its capture job; the
 * job takes chunks from the save's reservation and hands them on here, from
 * host memory (stream_capture_host) or from GPU memory (capture_gpu.c). The
 * restore/verify reader, the other way, is stream_read.c.
 *
 * Before the first chunk, the capture worker's stream_setup: the save's
 * reservation, its checksum state, its shard file (pipeline_end undoes them).
 *
 * A chunk (struct pool_chunk, owner = the save):
 *
 *   COPY     capture worker   pool_take, then the shard bytes [off, off+fill)
 *                             copied in (host: the copier's helpers too; GPU:
 *                             the plan's lane). Touches c->buf; reads s->abort.
 *     |      stream_submit    (capture worker): c->busy = 2, s->stages + 1,
 *     |                       the write to the I/O thread, the checksums to
 *     v                       the hasher; c->buf is only read from now on
 *   WRITE    I/O thread       chunk_prep (aborted: length 0, nothing goes out),
 *                             chunk_written: s->io_err, s->bytes_written,
 *                             s->abort (set on an error)
 *     ||
 *   HASH     hasher thread    chunk_hash: s->xs, s->digest, s->hash_next (the
 *                             hasher's alone: one thread, chunks in file order)
 *     v
 *   RELEASE  whichever of WRITE and HASH ends last (c->busy 2 -> 0): chunk_put,
 *                             c->owner cleared, pool_give (back to the pool; a
 *                             capture waiting in pool_take may get it), then
 *                             stage_done
 *
 * A save (s->stages: its capture job + each chunk between stream_submit and
 * RELEASE + the final fsync; save_start sets it to 1 for the capture job):
 *
 *   STREAMING  stages > 0       the capture worker's stream_stage_done, as
 *                               its job returns, and each RELEASE count down
 *   FINISH     stages -> 0      every byte written, no abort, no I/O error:
 *                               stages = 1, shard_finish (exact size + fsync)
 *                               on the I/O thread; whoever brought stages to 0
 *                               (capture worker, I/O thread or hasher) queues it
 *   DURABLE    finish_done      the I/O thread: pipeline_end(durable)
 *   (failed)   stages -> 0      otherwise: pipeline_end with why (none when
 *                               aborted: whoever aborted it said why)
 *
 * pipeline_end runs once, on that thread, without a lock: the reservation
 * ends, the shard is closed, the checksum state freed; then, under agent.mu
 * only, the save moves to DURABLE (or FAILED) and its checkpoint hears.
 *
 * Invariants:
 * - Hash order: chunks are submitted in file order by one capture job and
 *   hashed by one hasher thread, so a tensor that spans chunks is one XXH3
 *   stream (s->xs); its digest is final once its last chunk is hashed.
 * - A chunk goes back to the pool only after both its write and its
 *   checksums are done, never to a save directly.
 * - Abort (s->abort): looked at before each chunk's copy (pool_take), after
 *   it (the chunk is given back, not submitted), and by the I/O thread as
 *   the write is about to go out (chunk_prep); the hasher stops hashing an
 *   aborted save. An aborted save writes at most the chunks already handed
 *   over, and they still go through RELEASE.
 * - No lock is held while a chunk is copied, written or hashed; pipeline_end
 *   takes agent.mu only to move the save and its checkpoint on.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "storage/io/fsops.h"
#include "agent/pipe/stream.h"
#include "agent/pipe/copier.h"

#define ALIGN 4096u

static uint64_t round_up(uint64_t n, uint64_t a)
{
	return (n + a - 1) / a * a;
}

/* ---- before the first chunk ------------------------------------------- */

/*
 * The capture worker, before the first COPY: the save's reservation (waiting
 * its turn, or -EAGAIN under skip), its checksum state and its shard file;
 * pipeline_end undoes all three.
 */
int stream_setup(struct save *s, char *why)
{
	struct agent *a = s->a;
	const struct plan *p = s->plan;
	char err[IPC_ERRLEN];
	bool wait = p->backpressure != BACKPRESSURE_SKIP;
	int rc;

	/* the ranks of one checkpoint (s->cp) share the pool; they never skip each other */
	rc = pool_reserve(a->pool, &s->resv, s->want, s->cp, wait, &s->abort, a->capture);
	if (rc == -EAGAIN) {
		snprintf(why, IPC_ERRLEN, "%s", SAVE_SKIP_REASON);
		return rc;
	}
	if (rc)
		return rc;
	s->xs = XXH3_createState();
	if (!s->xs) {
		snprintf(why, IPC_ERRLEN, "out of memory for checksums");
		return -ENOMEM;
	}
	rc = a->store->ops->shard_create(a->store, p->job, s->step, p->rank, s->lay->shard_bytes,
	                                 s->file, &s->shard, err);
	/* The root made anew since it was last looked at: open again now; once more. */
	if (rc && s->root_again(a, rc, err))
		rc = a->store->ops->shard_create(a->store, p->job, s->step, p->rank,
		                                 s->lay->shard_bytes, s->file, &s->shard, err);
	if (rc)
		snprintf(why, IPC_ERRLEN, "%s", err);
	return rc;
}

/* ---- RELEASE, and the save's FINISH and end --------------------------- */

/*
 * Any thread, no lock: the last stage has finished. durable: the final fsync
 * succeeded; failure: why not (NULL when the save was aborted and already
 * says why).
 */
static void pipeline_end(struct save *s, bool durable, const char *failure)
{
	struct agent *a = s->a;

	if (s->resv.pool)
		pool_release(&s->resv);
	if (s->shard) {
		a->store->ops->shard_close(s->shard);
		s->shard = NULL;
	}
	XXH3_freeState(s->xs);
	s->xs = NULL;
	pthread_mutex_lock(&a->mu);
	s->ended(a, s, durable, failure); /* whoever started it goes on from there */
	pthread_mutex_unlock(&a->mu);
}

static void io_failure(struct save *s, const char *what, int err, char *buf, size_t len)
{
	const struct storage_ops *ops = s->a->store->ops;
	const char *why = s->shard && ops->shard_error ? ops->shard_error(s->shard) : NULL;
	char path[512];

	ops->shard_path(s->a->store, s->plan->job, s->step, s->file, path, sizeof(path));
	/* the backend's words where it has them (an HTTP status and the store's code) */
	snprintf(buf, len, "%s %s: %s", what, path, why ? why : strerror(-err));
}

static void finish_done(struct io_req *r)
{
	struct save *s = r->ctx;
	char why[IPC_ERRLEN];

	if (r->res < 0) {
		io_failure(s, "making durable", (int)r->res, why, sizeof(why));
		pipeline_end(s, false, why);
	} else {
		pipeline_end(s, true, NULL);
	}
}

/* The capture, a chunk's write or the fsync has finished. */
void stream_stage_done(struct save *s)
{
	char why[IPC_ERRLEN];

	if (atomic_fetch_sub(&s->stages, 1) != 1)
		return;
	if (atomic_load(&s->io_err)) {
		io_failure(s, "writing", atomic_load(&s->io_err), why, sizeof(why));
		pipeline_end(s, false, why);
	} else if (atomic_load(&s->abort)) {
		pipeline_end(s, false, NULL); /* whoever aborted it said why */
	} else if (!s->shard || atomic_load(&s->bytes_written) != s->lay->shard_bytes) {
		pipeline_end(s, false, "the capture stopped before every byte was written");
	} else {
		/* Every byte written: the exact size, then fsync (the shard's durability). */
		atomic_store(&s->stages, 1);
		s->finish = (struct io_req){.done = finish_done, .ctx = s, .buf_index = -1};
		s->a->store->ops->shard_finish(s->shard, &s->finish);
	}
}

/* ---- WRITE || HASH ---------------------------------------------------- */

/*
 * Both finished (any thread): the chunk goes back to the reservation, where
 * the capture of a later chunk may be waiting for it.
 */
static void chunk_put(struct pool_chunk *c)
{
	struct save *s = c->owner;

	if (atomic_fetch_sub(&c->busy, 1) != 1)
		return;
	c->owner = NULL;
	pool_give(&s->resv, c);
	stream_stage_done(s);
}

/*
 * The hasher thread: each tensor's XXH3 as its bytes pass, in file order.
 * Chunks reach it in the order they were captured, so a tensor spanning
 * several chunks is hashed in one stream; it runs at a lower priority than
 * the copies, and while they take every core it waits.
 */
static void chunk_hash(struct work *w)
{
	struct pool_chunk *c = container_of(w, struct pool_chunk, hash);
	struct save *s = c->owner;
	const struct shard_layout *p = s->lay;
	const uint64_t a0 = c->req.off, b0 = c->req.off + c->fill;
	const char *buf = c->buf;
	size_t i = s->hash_next;

	/* Aborted: its checksums will never be used. */
	for (; i < p->n && !atomic_load(&s->abort); i++) {
		const struct plan_tensor *t = &p->t[i];
		uint64_t from, to;

		/* Starts in a later chunk (an empty tensor at b0 belongs to this one). */
		if (t->begin > b0 || (t->begin == b0 && t->end > t->begin))
			break;
		from = t->begin > a0 ? t->begin : a0;
		to = t->end < b0 ? t->end : b0;
		if (from == t->begin && t->end <= b0) { /* whole in this chunk */
			s->digest[i] = XXH3_64bits(buf + (from - a0), to - from);
			continue;
		}
		if (from == t->begin)
			XXH3_64bits_reset(s->xs);
		XXH3_64bits_update(s->xs, buf + (from - a0), to - from);
		if (t->end > b0)
			break; /* goes on in the next chunk */
		s->digest[i] = XXH3_64bits_digest(s->xs);
	}
	s->hash_next = i;
	chunk_put(c);
}

/*
 * The I/O thread, as the write is about to go out: a save aborted since its
 * chunk was queued writes nothing more. A length of 0 makes the engine end
 * the request at once with 0 bytes, without I/O (storage/io/ioeng.c, begin).
 */
static void chunk_prep(struct io_req *r)
{
	struct pool_chunk *c = r->ctx;
	struct save *s = c->owner;

	if (atomic_load(&s->abort))
		r->len = 0;
}

/*
 * The I/O thread (an S3 store's writes end on its HTTP thread, or on a zstd
 * thread when compressing failed): the chunk is on disk (or not, or skipped
 * by chunk_prep).
 */
static void chunk_written(struct io_req *r)
{
	struct pool_chunk *c = r->ctx;
	struct save *s = c->owner;

	if (r->res < 0) {
		int none = 0;

		/* the first error: writes may end on more than one thread (an S3 store's) */
		atomic_compare_exchange_strong(&s->io_err, &none, (int)r->res);
		atomic_store(&s->abort, true);
	} else if (r->len) {
		atomic_fetch_add(&s->bytes_written, c->fill);
	}
	chunk_put(c);
}

/* ---- COPY (the capture worker) ---------------------------------------- */

/* A part of a chunk's copy (copier.h): header and tensor bytes of the save's shard. */
static int image_part(const void *save, uint64_t off, void *dst, uint64_t len)
{
	const struct save *s = save;

	return s->image(s, off, dst, len, NULL); /* host: only a fault */
}

/* A chunk holding shard bytes [off, off + fill) goes to its write and its checksums. */
void stream_submit(struct save *s, struct pool_chunk *c, uint64_t off, uint64_t fill)
{
	struct agent *a = s->a;
	uint64_t len = round_up(fill, ALIGN); /* O_DIRECT: the file is cut to size at the end */

	memset((char *)c->buf + fill, 0, len - fill);
	c->fill = fill;
	c->owner = s;
	c->req = (struct io_req){.op = IO_WRITE,
	                         .buf = c->buf,
	                         .len = len,
	                         .off = off,
	                         .buf_index = (int)c->index,
	                         .prep = chunk_prep,
	                         .done = chunk_written,
	                         .ctx = c};
	c->hash.fn = chunk_hash;
	atomic_store(&c->busy, 2); /* the write and the checksums */
	atomic_fetch_add(&s->stages, 1);
	atomic_fetch_add(&s->bytes_captured, fill);
	a->store->ops->shard_write(s->shard, &c->req);
	workq_push(a->hasher, &c->hash);
}

uint64_t stream_chunk_fill(const struct save *s, unsigned k, uint64_t cb)
{
	uint64_t off = (uint64_t)k * cb;

	return s->lay->shard_bytes - off < cb ? s->lay->shard_bytes - off : cb;
}

/* Host memory: each chunk copied (split across the copier's threads), then written. */
int stream_capture_host(struct save *s, char *why)
{
	struct agent *a = s->a;
	const uint64_t cb = pool_chunk_bytes(a->pool);

	for (unsigned k = 0; k < s->nchunks; k++) {
		struct pool_chunk *c = pool_take(&s->resv, &s->abort, a->capture);

		if (!c)
			return -ECANCELED;
		fsops_capture_wait(s->plan->job, s->step, s->plan->rank, k); /* tests only */
		/* the trainer's stall is this copy: split across the copier's threads */
		if (copier_run(a->copier, image_part, s, (uint64_t)k * cb, c->buf,
		               stream_chunk_fill(s, k, cb), 1u << 20)) {
			pool_give(&s->resv, c);
			return ipc_errf(
			    why, -EFAULT,
			    "the trainer's host memory faulted under the copy (SIGBUS) "
			    "in bytes %llu..%llu of the shard: its region was taken away",
			    (unsigned long long)k * cb,
			    (unsigned long long)(k * cb + stream_chunk_fill(s, k, cb)));
		}
		atomic_fetch_add(&a->captured_bytes, stream_chunk_fill(s, k, cb));
		if (atomic_load(&s->abort)) { /* aborted during the copy: not written */
			pool_give(&s->resv, c);
			return -ECANCELED;
		}
		stream_submit(s, c, (uint64_t)k * cb, stream_chunk_fill(s, k, cb));
	}
	return 0;
}
