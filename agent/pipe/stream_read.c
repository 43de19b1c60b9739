/*
 * The restore/verify reader: shard files back through the staging pool, the
 * other way from a save's chunks (stream.c). restore.c builds the extents (a
 * tensor's bytes in a rank's file, where they go, the checksum the manifest
 * promises) and answers; reader_run reads them, file by file, on the
 * caller's thread ("the reader's thread": a capture worker for a restore, a
 * reader thread for a verify).
 *
 * A window (struct window: a pool chunk holding aligned bytes of one file):
 *
 *   READ       reader's thread  read_ahead: a chunk (pool_take; pool_try_take
 *                               while windows of its own are out), the read
 *                               handed to the I/O thread; up to READ_AHEAD in
 *                               flight, each where the last ended
 *              I/O thread       window_done: w->done under r->mu, a broadcast;
 *                               it touches nothing else
 *     v
 *   HASH+COPY  reader's thread  read_file waits for the oldest window (file
 *                               order), consume: each extent's XXH3 as its
 *                               bytes pass (one stream across windows), the
 *                               bytes to dst (host: split across the copier's
 *                               helpers; GPU: queued on the plan's lane, and
 *                               waited for), and to the dst of each extent of
 *                               the same bytes (`also`: ranks restoring
 *                               together, read once), problems noted
 *     v
 *   RELEASE    reader's thread  pool_give: the chunk goes back to the pool
 *
 * Invariants:
 * - A file's windows are consumed in file order, each where the last ended;
 *   after one that failed or came back short before the file's size (the
 *   file changed), the rest of that file is only waited for and released,
 *   and the problem named.
 * - The reader never waits for a chunk while windows of its own, which only
 *   it gives back, are in flight (pool_try_take): it consumes them first.
 * - Abort: a restore stops at its first problem (reader_problem sets abort):
 *   no new window is asked for, those in flight are waited for and released
 *   unread. A verify (collect) goes on and names every problem.
 * - A window goes back to the pool only once the GPU copies out of it have
 *   landed.
 * - r->mu guards the windows' `done` only; the rest is the reader's thread's.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "agent/pipe/safecopy.h"
#include "agent/pipe/stream.h"
#include "agent/pipe/copier.h"

#define ALIGN 4096u

struct window {
	struct reader *r;
	struct pool_chunk *c;
	uint64_t off;
	bool done;
};

void reader_problem(struct reader *r, int err, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	char **v;

	if (!r->err)
		r->err = err;
	if (!r->collect)
		atomic_store(&r->abort, true);
	if (r->nproblems >= READER_MAX_PROBLEMS) {
		r->nmore++;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	v = realloc(r->problems, (r->nproblems + 1) * sizeof(*v));
	if (!v)
		return;
	r->problems = v;
	if ((v[r->nproblems] = strdup(buf)))
		r->nproblems++;
}

void reader_free(struct reader *r)
{
	for (size_t i = 0; i < r->nproblems; i++)
		free(r->problems[i]);
	free(r->problems);
	free(r->ext);
	free(r->dups);
	for (size_t i = 0; i < r->nboxes; i++)
		free(r->boxes[i]);
	free(r->boxes);
	pthread_mutex_destroy(&r->mu);
	pthread_cond_destroy(&r->cv);
}

/* By file, then place in it: extents of the very same bytes side by side. */
static int cmp_extent(const void *x, const void *y)
{
	const struct extent *a = x, *b = y;

	if (a->rank != b->rank)
		return a->rank - b->rank;
	if (a->begin != b->begin)
		return a->begin < b->begin ? -1 : 1;
	return a->end < b->end ? -1 : a->end > b->end;
}

/* Whether b reads the very bytes a reads, checked the same way (its bytes can be a's). */
static bool same_bytes(const struct extent *a, const struct extent *b)
{
	return a->rank == b->rank && a->begin == b->begin && a->end == b->end &&
	       a->nosum == b->nosum && a->xxh3 == b->xxh3;
}

uint64_t reader_shared(struct reader *r, uint64_t *all)
{
	uint64_t shared = 0;

	qsort(r->ext, r->n, sizeof(*r->ext), cmp_extent);
	*all = 0;
	for (size_t i = 0; i < r->n; i++) {
		*all += r->ext[i].end - r->ext[i].begin;
		if (i > 0 && same_bytes(&r->ext[i - 1], &r->ext[i]))
			shared += r->ext[i].end - r->ext[i].begin;
	}
	return shared;
}

/* A part of a window's copy into the trainer's memory (copier.h). */
static int copy_part(const void *src, uint64_t off, void *dst, uint64_t len)
{
	return safe_copy(dst, (const char *)src + off, len) ? -EFAULT : 0;
}

/* I/O thread: a window has arrived. */
static void window_done(struct io_req *q)
{
	struct window *w = q->ctx;

	pthread_mutex_lock(&w->r->mu);
	w->done = true;
	pthread_cond_broadcast(&w->r->cv);
	pthread_mutex_unlock(&w->r->mu);
}

/* A copy into the trainer's host memory faulted: said once. */
static void host_fault(struct reader *r, const struct extent *e)
{
	r->copy_err = -EFAULT;
	reader_problem(r, -EFAULT,
	               "tensor '%s': the trainer's host memory faulted under the copy (SIGBUS): "
	               "its region was taken away",
	               e->tensor);
}

/* n bytes from a window into the trainer's memory at dst (GPU: on the plan's lane). */
static void copy_out(struct reader *r, const struct extent *e, char *dst, const char *src,
                     uint64_t n)
{
	char why[IPC_ERRLEN];
	int rc;

	if (r->copy_err)
		return; /* said once */
	if (e->device) {
		rc = gpu_lane_copy(r->lane, dst, src, n, false, why);
		if (rc) {
			r->copy_err = rc;
			reader_problem(r, rc, "tensor '%s': %s", e->tensor, why);
		}
	} else if (copier_run(r->a->copier, copy_part, src, 0, dst, n, 1u << 20)) {
		host_fault(r, e);
	}
}

/* A window's part of an extent restored into another split: its runs, and where they go. */
struct runs {
	struct reader *r;
	struct extent *e;
	const char *src; /* the extent's bytes [rel, rel + n) */
	uint64_t rel, n;
	void (*part)(struct runs *w, char *dst, const char *src, uint64_t n);
};

/*
 * Each run of the overlap (or its part) in the window's bytes, in order, to
 * w->part (e->box->next: the first run not yet wholly copied; the windows
 * come in file order).
 */
static void walk_runs(void *arg)
{
	struct runs *w = arg;
	struct box_copy *bc = w->e->box;
	const uint64_t end = w->rel + w->n;

	for (; bc->next < bc->nruns; bc->next++) {
		uint64_t s, d, lo, hi;

		box_copy_run(bc, bc->next, &s, &d);
		if (s >= end)
			return;
		lo = s > w->rel ? s : w->rel;
		hi = s + bc->run < end ? s + bc->run : end;
		if (hi > lo)
			w->part(w, w->e->dst + d + (lo - s), w->src + (lo - w->rel), hi - lo);
		if (s + bc->run > end)
			return; /* the run goes on in the next window */
	}
}

static void part_out(struct runs *w, char *dst, const char *src, uint64_t n)
{
	copy_out(w->r, w->e, dst, src, n);
}

static void part_memcpy(struct runs *w, char *dst, const char *src, uint64_t n)
{
	(void)w;
	memcpy(dst, src, n);
}

/*
 * The extent's bytes [rel, rel + n) (from its start), at src: as they are,
 * or, restoring into another split, the parts of them in the overlap's
 * runs, each to its place. Runs under 1 MiB into host memory are copied
 * under one fault guard for the window (one per run costs a system call
 * each: a column split has a run per row); larger ones, and GPU memory,
 * one by one through the copier or the lane.
 */
static void deliver(struct reader *r, struct extent *e, const char *src, uint64_t rel, uint64_t n)
{
	struct runs w = {r, e, src, rel, n, part_out};

	if (!e->dst)
		return;
	if (!e->box) {
		copy_out(r, e, e->dst + rel, src, n);
		return;
	}
	if (e->device || e->box->run >= (1u << 20)) {
		walk_runs(&w);
		return;
	}
	w.part = part_memcpy;
	if (!r->copy_err && safe_run(walk_runs, &w))
		host_fault(r, e);
}

/*
 * The bytes [w->off, w->off + got) of the file, for extents ext[*ei ...]
 * (none empty: those were checked before reading).
 */
static void consume(struct reader *r, const struct window *w, uint64_t got, size_t *ei, size_t last,
                    XXH3_state_t *xs)
{
	const char *buf = w->c->buf;
	const uint64_t a0 = w->off, b0 = w->off + got;

	for (; *ei < last; (*ei)++) {
		struct extent *e = &r->ext[*ei];
		uint64_t from, to, sum;

		if (e->begin >= b0)
			return;
		from = e->begin > a0 ? e->begin : a0;
		to = e->end < b0 ? e->end : b0;
		if (from == e->begin)
			XXH3_64bits_reset(xs);
		XXH3_64bits_update(xs, buf + (from - a0), to - from);
		for (struct extent *f = e; f; f = f->also) {
			deliver(r, f, buf + (from - a0), from - e->begin, to - from);
			r->delivered += to - from;
		}
		r->bytes += to - from;
		if (e->end > b0)
			return; /* goes on in the next window */
		for (struct extent *f = e; f; f = f->also)
			if (f->whole)
				*f->whole = true;
		if (e->nosum)
			continue;
		sum = XXH3_64bits_digest(xs);
		if (sum == e->xxh3) {
			for (struct extent *f = e; f; f = f->also)
				if (f->good)
					*f->good = true;
			continue;
		}
		if (r->bad_rank < 0 && !r->err) {
			r->bad_rank = e->rank; /* this chunk alone: the rest of its file is good */
			r->bad_begin = e->begin;
		}
		reader_problem(r, -EBADMSG,
		               "tensor '%s' in %s: checksum mismatch (manifest xxh3 %016" PRIx64
		               ", file %016" PRIx64 ")",
		               e->tensor, r->path, e->xxh3, sum);
	}
}

/*
 * Asks for the next window an extent needs, at or after *pos; false if none.
 * may_wait false (windows of ours are in flight, and only we give them
 * back): no chunk now is no window now.
 */
static bool read_ahead(struct reader *r, struct window *w, size_t *gi, size_t last, uint64_t *pos,
                       bool may_wait)
{
	const uint64_t cb = pool_chunk_bytes(r->a->pool);
	const uint64_t fend = (r->size + ALIGN - 1) / ALIGN * ALIGN;
	uint64_t need;

	while (*gi < last && r->ext[*gi].end <= *pos)
		(*gi)++;
	if (*gi == last)
		return false;
	need = r->ext[*gi].begin > *pos ? r->ext[*gi].begin : *pos;
	w->off = need / ALIGN * ALIGN; /* O_DIRECT: aligned offset, length and buffer */
	if (w->off >= fend)
		return false; /* past the end of the file: the caller says so */
	w->c = may_wait ? pool_take(&r->resv, &r->abort, r->q) : pool_try_take(&r->resv);
	if (!w->c)
		return false;
	w->r = r;
	w->done = false;
	w->c->req = (struct io_req){.op = IO_READ,
	                            .buf = w->c->buf,
	                            .len = fend - w->off < cb ? fend - w->off : cb,
	                            .off = w->off,
	                            .buf_index = (int)w->c->index,
	                            .done = window_done,
	                            .ctx = w};
	*pos = w->off + w->c->req.len;
	r->store->ops->shard_read(r->sh, &w->c->req);
	return true;
}

/*
 * Reads the extents ext[first, last) of one file, READ_AHEAD windows in
 * flight. consume() takes the windows in file order, each where the last
 * ended: after one that failed, or came back short before the end of the
 * file (the file shrank under us), the rest of the file is only waited for.
 */
static void read_file(struct reader *r, size_t first, size_t last, XXH3_state_t *xs)
{
	struct window win[READ_AHEAD];
	unsigned head = 0, tail = 0;
	unsigned depth = r->resv.want < READ_AHEAD ? r->resv.want : READ_AHEAD;
	size_t gi = first, ei = first; /* next extent to read ahead for / to consume */
	uint64_t pos = 0; /* next file byte not yet asked for */
	bool failed = false, ended = false; /* a window failed / the file ended early */
	uint64_t end_at = 0; /* ended: where */

	for (;;) {
		while (tail - head < depth && !atomic_load(&r->abort) && !failed && !ended &&
		       read_ahead(r, &win[tail % READ_AHEAD], &gi, last, &pos, tail == head))
			tail++;
		if (head == tail)
			break;
		struct window *w = &win[head++ % READ_AHEAD];
		int64_t got;

		pthread_mutex_lock(&r->mu);
		if (!w->done) {
			pthread_mutex_unlock(&r->mu);
			workq_wait_begin(r->q);
			pthread_mutex_lock(&r->mu);
			while (!w->done)
				pthread_cond_wait(&r->cv, &r->mu);
			pthread_mutex_unlock(&r->mu);
			workq_wait_end(r->q);
		} else {
			pthread_mutex_unlock(&r->mu);
		}
		got = w->c->req.res;
		if (failed || ended) {
			/* past a gap: nothing more of this file is taken */
		} else if (got < 0) {
			/* the backend's words where it has them (an HTTP status, a store's code) */
			const struct storage_ops *ops = r->store->ops;
			const char *why = ops->shard_error ? ops->shard_error(r->sh) : NULL;

			failed = true;
			reader_problem(r, -EIO, "reading %s at byte %" PRIu64 ": %s", r->path,
			               w->off, why ? why : strerror((int)-got));
		} else if (r->collect || !atomic_load(&r->abort)) {
			consume(r, w, (uint64_t)got, &ei, last, xs);
			end_at = w->off + (uint64_t)got;
			ended = (uint64_t)got < w->c->req.len && end_at < r->size;
		}
		if (r->lane) { /* the GPU copies out of this window land before it is reused */
			char why[IPC_ERRLEN];

			if ((gpu_lane_mark(r->lane, 0, why) ||
			     gpu_lane_wait(r->lane, 0, NULL, why)) &&
			    !r->copy_err) {
				r->copy_err = -EIO;
				reader_problem(r, -EIO, "restoring into GPU memory: %s", why);
			}
		}
		pool_give(&r->resv, w->c);
	}
	if (ei < last && !failed && ended && !atomic_load(&r->abort))
		reader_problem(r, -EBADMSG,
		               "tensor '%s' in %s: the file ends before its bytes (at byte %" PRIu64
		               ", %" PRIu64 " bytes long when opened: changed since?)",
		               r->ext[ei].tensor, r->path, end_at, r->size);
	else if (ei < last && !failed && !atomic_load(&r->abort))
		reader_problem(r, -EBADMSG,
		               "tensor '%s' in %s: the file ends before its bytes (%" PRIu64
		               " bytes long)",
		               r->ext[ei].tensor, r->path, r->size);
}

/*
 * Extents of the very same bytes of one file (ranks restoring together that
 * each need one saved chunk: restore.c's read-once) become one: the first
 * is read and checked, and its bytes go to the others' places too (`also`).
 * ext sorted. 0 or -ENOMEM.
 */
static int share_same_bytes(struct reader *r)
{
	size_t np = 0, nd = 0, *of;

	for (size_t i = 1; i < r->n && !nd; i++)
		nd = same_bytes(&r->ext[i - 1], &r->ext[i]);
	if (!nd)
		return 0; /* the usual case: one rank's extents, none shared */
	r->dups = malloc(r->n * sizeof(*r->dups));
	of = malloc(r->n * sizeof(*of));
	if (!r->dups || !of) {
		free(of);
		return -ENOMEM;
	}
	nd = 0;
	for (size_t i = 0; i < r->n; i++) {
		const struct extent *e = &r->ext[i], *p = np ? &r->ext[np - 1] : NULL;

		if (p && same_bytes(p, e)) {
			of[nd] = np - 1;
			r->dups[nd++] = *e;
		} else {
			r->ext[np++] = *e;
		}
	}
	/* in place now: link each to the extent that reads its bytes */
	for (size_t d = nd; d-- > 0;) {
		r->dups[d].also = r->ext[of[d]].also;
		r->ext[of[d]].also = &r->dups[d];
	}
	r->n = np;
	free(of);
	return 0;
}

/* Checks empty tensors (no bytes to read), then reads file by file. */
int reader_run(struct reader *r, const struct manifest *m, unsigned want)
{
	XXH3_state_t *xs = XXH3_createState();
	const uint64_t none = XXH3_64bits(NULL, 0);
	size_t i, kept = 0;
	int rc;

	if (!xs)
		return -ENOMEM;
	for (i = 0; i < r->n; i++) {
		struct extent *e = &r->ext[i];

		if (e->end > e->begin)
			r->ext[kept++] = *e;
		else if (e->nosum)
			continue;
		else if (e->xxh3 == none && e->good)
			*e->good = true;
		else if (e->xxh3 != none)
			reader_problem(r, -EBADMSG,
			               "tensor '%s' (rank %d): empty, but its checksum in the "
			               "manifest is not that of no bytes",
			               e->tensor, e->rank);
	}
	r->n = kept;
	qsort(r->ext, r->n, sizeof(*r->ext), cmp_extent);
	rc = share_same_bytes(r);
	if (rc) {
		XXH3_freeState(xs);
		return rc;
	}
	if (want > pool_nchunks(r->a->pool))
		want = pool_nchunks(r->a->pool);
	rc = pool_reserve(r->a->pool, &r->resv, want, r, true, &r->abort, r->q);
	if (rc) {
		XXH3_freeState(xs);
		return rc;
	}
	for (i = 0; i < r->n && (r->collect || !atomic_load(&r->abort));) {
		int rank = r->ext[i].rank;
		size_t j = i;
		char err[IPC_ERRLEN];
		int before = r->err;

		while (j < r->n && r->ext[j].rank == rank)
			j++;
		r->store->ops->shard_path(r->store, r->job, r->step, m->ranks[rank].file, r->path,
		                          sizeof(r->path));
		rc = r->store->ops->shard_open(r->store, r->job, r->step, m->ranks[rank].file,
		                               &r->sh, &r->size, err);
		if (rc)
			reader_problem(r, rc == -ENOENT ? -ENOENT : -EIO, "rank %d (node %s): %s",
			               rank, manifest_node_of(m, rank) ?: "-", err);
		else if (r->size != m->ranks[rank].size)
			reader_problem(r, -EBADMSG,
			               "%s (rank %d, node %s) is %" PRIu64
			               " bytes, the manifest says %" PRIu64,
			               r->path, rank, manifest_node_of(m, rank) ?: "-", r->size,
			               m->ranks[rank].size);
		else
			read_file(r, i, j, xs);
		/* the first problem was this file's (not a copy into the trainer's memory) */
		if (!before && r->err && !r->copy_err && r->bad_rank < 0) {
			r->bad_rank = rank;
			r->bad_begin = UINT64_MAX;
		}
		r->store->ops->shard_close(r->sh);
		r->sh = NULL;
		i = j;
	}
	pool_release(&r->resv);
	XXH3_freeState(xs);
	return 0;
}

int reader_init(struct reader *r, struct agent *a, const char *job, int64_t step, size_t n)
{
	memset(r, 0, sizeof(*r));
	r->a = a;
	r->store = a->store;
	r->job = job;
	r->step = step;
	r->bad_rank = -1;
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	r->ext = calloc(n ? n : 1, sizeof(*r->ext));
	r->cap = r->ext ? (n ? n : 1) : 0;
	return r->ext ? 0 : -ENOMEM;
}
