/*
 * Restore and verify: shard files back through the staging pool.
 *
 * Both build a list of extents (a tensor's bytes in a rank's file, where they
 * go, and the checksum the manifest promises) and run the reader: aligned
 * windows of the files are read through the I/O thread into staging chunks,
 * several in flight, and processed in order, each tensor's XXH3 computed as
 * its bytes pass. Restore copies the bytes into the plan's regions and stops
 * at the first problem; verify copies nothing and collects every problem.
 * Every problem names the tensor and the file.
 *
 * A restore runs on a capture worker (it moves the same bytes the other
 * way); a verify on a reader thread (readers queue: several at once, none
 * holding up the maint thread's GC); one of a step not listed looks at the
 * root on the maint thread first. Bytes read back are input like any other:
 * sizes, headers and checksums are all checked against the manifest.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "agent.h"
#include "safecopy.h"

#define ALIGN 4096u
#define READ_AHEAD 8u      /* windows in flight per reader */
#define MAX_PROBLEMS 100u

struct extent {
	int rank;
	uint64_t begin, end; /* bytes of the rank's file */
	char *dst;           /* restore: where they go */
	bool device; /* dst is GPU memory: copied on the plan's lane */
	uint64_t xxh3;
	bool nosum;          /* a shard header, checked by parsing */
	bool *whole;         /* set once every byte of it is in dst (verify's headers) */
	const char *tensor;
};

struct reader {
	struct agent *a;
	const char *job;
	int64_t step;
	struct extent *ext; /* sorted by (rank, begin) */
	size_t n;
	bool collect; /* verify: every problem; restore: stop at the first */
	char **problems;
	size_t nproblems;
	int err; /* the first problem's errno */
	uint64_t bytes;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct pool_resv resv;
	struct workq *q; /* the queue it runs on (its waits for the disk let others run) */
	atomic_bool abort;
	struct gpu_lane *lane; /* a CUDA plan's: copies to GPU memory go there */
	int copy_err; /* the first failed copy to the GPU */
	/* the file being read */
	struct storage_shard *sh;
	uint64_t size;
	char path[512];
};

struct window {
	struct reader *r;
	struct pool_chunk *c;
	uint64_t off;
	bool done;
};

static void problem(struct reader *r, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void problem(struct reader *r, int err, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	char **v;

	if (!r->err)
		r->err = err;
	if (!r->collect)
		atomic_store(&r->abort, true);
	if (r->nproblems >= MAX_PROBLEMS)
		return;
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

static void reader_free(struct reader *r)
{
	for (size_t i = 0; i < r->nproblems; i++)
		free(r->problems[i]);
	free(r->problems);
	free(r->ext);
	pthread_mutex_destroy(&r->mu);
	pthread_cond_destroy(&r->cv);
}

static int cmp_extent(const void *x, const void *y)
{
	const struct extent *a = x, *b = y;

	if (a->rank != b->rank)
		return a->rank - b->rank;
	return a->begin < b->begin ? -1 : a->begin > b->begin;
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

/*
 * The bytes [w->off, w->off + got) of the file, for extents ext[*ei ...]
 * (none empty: those were checked before reading).
 */
static void consume(struct reader *r, const struct window *w, uint64_t got, size_t *ei,
		    size_t last, XXH3_state_t *xs)
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
		if (e->dst && e->device) {
			char why[IPC_ERRLEN];
			int rc = gpu_lane_copy(r->lane, e->dst + (from - e->begin),
			                       buf + (from - a0), to - from, false, why);

			if (rc && !r->copy_err) {
				r->copy_err = rc;
				problem(r, rc, "tensor '%s': %s", e->tensor, why);
			}
		} else if (e->dst &&
			   copier_run(r->a->copier, copy_part, buf + (from - a0), 0,
				      e->dst + (from - e->begin), to - from, 1u << 20) &&
			   !r->copy_err) {
			r->copy_err = -EFAULT;
			problem(r, -EFAULT,
				"tensor '%s': the trainer's host memory faulted under the copy (SIGBUS): "
				"its region was taken away",
				e->tensor);
		}
		r->bytes += to - from;
		if (e->end > b0)
			return; /* goes on in the next window */
		if (e->whole)
			*e->whole = true;
		sum = XXH3_64bits_digest(xs);
		if (!e->nosum && sum != e->xxh3)
			problem(r, -EBADMSG,
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
static bool read_ahead(struct reader *r, struct window *w, size_t *gi, size_t last,
		       uint64_t *pos, bool may_wait)
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
	r->a->store->ops->shard_read(r->sh, &w->c->req);
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
	uint64_t pos = 0;              /* next file byte not yet asked for */
	bool failed = false, ended = false; /* a window failed / the file ended early */
	uint64_t end_at = 0;                /* ended: where */

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
			failed = true;
			problem(r, -EIO, "reading %s at byte %" PRIu64 ": %s", r->path, w->off,
				strerror((int)-got));
		} else if (r->collect || !atomic_load(&r->abort)) {
			consume(r, w, (uint64_t)got, &ei, last, xs);
			end_at = w->off + (uint64_t)got;
			ended = (uint64_t)got < w->c->req.len && end_at < r->size;
		}
		if (r->lane) { /* the GPU copies out of this window land before it is reused */
			char why[IPC_ERRLEN];

			if ((gpu_lane_mark(r->lane, 0, why) || gpu_lane_wait(r->lane, 0, NULL, why)) &&
			    !r->copy_err) {
				r->copy_err = -EIO;
				problem(r, -EIO, "restoring into GPU memory: %s", why);
			}
		}
		pool_give(&r->resv, w->c);
	}
	if (ei < last && !failed && ended && !atomic_load(&r->abort))
		problem(r, -EBADMSG, "tensor '%s' in %s: the file ends before its bytes (at byte %"
			PRIu64 ", %" PRIu64 " bytes long when opened: changed since?)",
			r->ext[ei].tensor, r->path, end_at, r->size);
	else if (ei < last && !failed && !atomic_load(&r->abort))
		problem(r, -EBADMSG, "tensor '%s' in %s: the file ends before its bytes (%" PRIu64
			" bytes long)", r->ext[ei].tensor, r->path, r->size);
}

/* Checks empty tensors (no bytes to read), then reads file by file. */
static int reader_run(struct reader *r, const struct manifest *m, unsigned want)
{
	XXH3_state_t *xs = XXH3_createState();
	size_t i, kept = 0;
	int rc;

	if (!xs)
		return -ENOMEM;
	for (i = 0; i < r->n; i++) {
		if (r->ext[i].end > r->ext[i].begin)
			r->ext[kept++] = r->ext[i];
		else if (!r->ext[i].nosum && r->ext[i].xxh3 != XXH3_64bits(NULL, 0))
			problem(r, -EBADMSG, "tensor '%s' (rank %d): empty, but its checksum in the "
					     "manifest is not that of no bytes",
				r->ext[i].tensor, r->ext[i].rank);
	}
	r->n = kept;
	qsort(r->ext, r->n, sizeof(*r->ext), cmp_extent);
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

		while (j < r->n && r->ext[j].rank == rank)
			j++;
		r->a->store->ops->shard_path(r->a->store, r->job, r->step, m->ranks[rank].file,
					     r->path, sizeof(r->path));
		rc = r->a->store->ops->shard_open(r->a->store, r->job, r->step, m->ranks[rank].file,
						  &r->sh, &r->size, err);
		if (rc)
			problem(r, rc == -ENOENT ? -ENOENT : -EIO, "rank %d (node %s): %s", rank,
				manifest_node_of(m, rank) ?: "-", err);
		else if (r->size != m->ranks[rank].size)
			problem(r, -EBADMSG,
				"%s (rank %d, node %s) is %" PRIu64 " bytes, the manifest says %" PRIu64,
				r->path, rank, manifest_node_of(m, rank) ?: "-", r->size,
				m->ranks[rank].size);
		else
			read_file(r, i, j, xs);
		r->a->store->ops->shard_close(r->sh);
		r->sh = NULL;
		i = j;
	}
	pool_release(&r->resv);
	XXH3_freeState(xs);
	return 0;
}

static int reader_init(struct reader *r, struct agent *a, const char *job, int64_t step,
		       size_t n)
{
	memset(r, 0, sizeof(*r));
	r->a = a;
	r->job = job;
	r->step = step;
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	r->ext = calloc(n ? n : 1, sizeof(*r->ext));
	return r->ext ? 0 : -ENOMEM;
}

/* ---- restore ---------------------------------------------------------- */

struct restore {
	struct work work;
	struct agent *a;
	struct rpc *call;
	int64_t t_start; /* monotonic ns of the request */
	struct plan *plan;
	int64_t step;
	bool latest, fallback;
	char **skipped;
	size_t nskipped;
};

static void shape_text(const int64_t *v, size_t n, char *buf, size_t len)
{
	size_t o = (size_t)snprintf(buf, len, "[");

	for (size_t i = 0; i < n && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? "," : "", (long long)v[i]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
}

/* The plan's tensor i against the manifest: where its bytes are. */
static int match_tensor(const struct plan *p, size_t i, const struct manifest *m,
			struct extent *e, char *err)
{
	const struct plan_tensor *t = &p->t[i];
	const struct manifest_tensor *mt = manifest_find(m, t->name);
	const struct manifest_chunk *ch;
	char want[256], have[256];

	if (!mt)
		return ipc_errf(err, -ENOENT, "tensor '%s' is not in the checkpoint", t->name);
	shape_text(t->global_shape, t->ndim, want, sizeof(want));
	shape_text(mt->global_shape, mt->ndim, have, sizeof(have));
	if (mt->dtype != t->dtype || mt->ndim != t->ndim ||
	    memcmp(mt->global_shape, t->global_shape, t->ndim * sizeof(int64_t)))
		return ipc_errf(err, -EINVAL, "tensor '%s': the checkpoint has %s %s, the plan %s %s",
				t->name, ipc_dtype_name(mt->dtype), have, ipc_dtype_name(t->dtype),
				want);
	ch = manifest_find_chunk(mt, p->rank, t->sharded ? t->global_offset : NULL);
	if (!ch || memcmp(ch->shape, t->shape, t->ndim * sizeof(int64_t)))
		return ipc_errf(err, -EINVAL,
				"tensor '%s': the checkpoint has no chunk of it for rank %d with "
				"this plan's offset and shape",
				t->name, p->rank);
	*e = (struct extent){.rank = ch->rank,
			     .begin = ch->begin,
			     .end = ch->end,
			     .dst = t->dptr ? t->dptr : plan_tensor_addr(p, i),
	                     .device = t->dptr != NULL,
			     .xxh3 = ch->xxh3,
			     .tensor = t->name};
	return 0;
}

static int restore_one(struct restore *rs, int64_t step, char **meta, char *err)
{
	struct agent *a = rs->a;
	const struct plan *p = rs->plan;
	struct manifest *m = NULL;
	struct reader r;
	int rc;

	rc = reader_init(&r, a, p->job, step, p->n);
	r.q = a->capture;
	if (rc)
		return ipc_errf(err, rc, "out of memory");
	if (p->gpu) { /* the lane is ours alone until the copies are in (agent.h) */
		pthread_mutex_lock(&p->gpu->capture);
		r.lane = p->gpu->lane;
		if (!r.lane) {
			rc = ipc_errf(err, -EIO, "the plan's GPU stream was lost after a failed "
						 "wait; create the plan again");
			goto out;
		}
	}
	rc = store_read_manifest(a->store, p->job, step, &m, err);
	if (rc)
		goto out;
	if (m->world != p->world) {
		rc = ipc_errf(err, -EINVAL, "the checkpoint has world %d, the plan %d", m->world,
			      p->world);
		goto out;
	}
	for (size_t i = 0; i < p->n && !rc; i++)
		rc = match_tensor(p, i, m, &r.ext[r.n++], err);
	if (rc)
		goto out;
	rc = reader_run(&r, m, READ_AHEAD);
	if (!rc && r.err)
		rc = ipc_errf(err, r.err, "%s", r.problems ? r.problems[0] : "read failed");
	/* This rank's own meta (a data loader's position, a seed), not rank 0's. */
	if (!rc && manifest_rank_meta(m, p->rank) && !(*meta = strdup(manifest_rank_meta(m, p->rank))))
		rc = ipc_errf(err, -ENOMEM, "out of memory");
out:
	if (p->gpu)
		pthread_mutex_unlock(&p->gpu->capture);
	manifest_free(m);
	reader_free(&r);
	return rc;
}

static void restore_reply(struct restore *rs, int rc, int64_t step, char *meta, const char *err)
{
	Ckpt__V1__RestoreReply rep = CKPT__V1__RESTORE_REPLY__INIT;
	const struct plan *p = rs->plan;

	metrics_on_restore(rs->a->metrics, rc, rc ? 0 : p->shard_bytes - p->header_len, rs->t_start);
	if (rc) {
		rpc_fail(rs->call, rc, "restore of job %s step %lld rank %d: %s", p->job,
			 (long long)step, p->rank, err);
		return;
	}
	rep.step = step;
	rep.meta_json = meta ? meta : "";
	rep.bytes = p->shard_bytes - p->header_len;
	rep.n_skipped = rs->nskipped;
	rep.skipped = rs->skipped;
	rpc_reply(rs->call, &rep.base);
	log_msg(LOG_INFO, "restored job %s step %lld rank %d: %llu bytes", p->job, (long long)step,
		p->rank, (unsigned long long)rep.bytes);
}

/* Under mu: the next older checkpoint to fall back to, marked as being read. */
static bool fall_back(struct restore *rs, int64_t *step, int rc, const char *err)
{
	struct cat_entry *e;
	char **v, line[IPC_ERRLEN + 64];

	if (!rs->latest || !rs->fallback || rc == -EINVAL || rc == -ENOMEM)
		return false;
	e = catalog_newest(rs->a->cat, rs->plan->job, *step);
	if (!e)
		return false;
	snprintf(line, sizeof(line), "step %lld: %s", (long long)*step, err);
	v = realloc(rs->skipped, (rs->nskipped + 1) * sizeof(*v));
	if (!v || !(v[rs->nskipped] = strdup(line))) {
		rs->skipped = v ? v : rs->skipped;
		return false;
	}
	rs->skipped = v;
	rs->nskipped++;
	log_msg(LOG_WARNING, "restore of job %s rank %d: step %lld skipped (%s), trying %lld",
		rs->plan->job, rs->plan->rank, (long long)*step, err, (long long)e->step);
	*step = e->step;
	e->readers++;
	return true;
}

static void restore_run(struct work *w)
{
	struct restore *rs = container_of(w, struct restore, work);
	struct agent *a = rs->a;
	char err[IPC_ERRLEN] = "", *meta = NULL;
	int64_t step = rs->step;
	struct cat_entry *e;
	bool again;
	int rc;

	if (rs->latest) {
		/*
		 * LATEST is the newest manifest: one another node committed since
		 * this agent last looked (its ranks were not in that step) counts.
		 */
		catalog_sync_job(a, rs->plan->job);
		pthread_mutex_lock(&a->mu);
		e = catalog_newest(a->cat, rs->plan->job, INT64_MAX);
		if (e && e->step > step) {
			struct cat_entry *old = catalog_find(a->cat, rs->plan->job, step);

			if (old)
				old->readers--;
			e->readers++;
			step = e->step;
		}
		pthread_mutex_unlock(&a->mu);
	}
	do {
		rc = restore_one(rs, step, &meta, err);
		pthread_mutex_lock(&a->mu);
		e = catalog_find(a->cat, rs->plan->job, step);
		if (e)
			e->readers--;
		again = rc && fall_back(rs, &step, rc, err);
		pthread_mutex_unlock(&a->mu);
	} while (again);
	/*
	 * The plan is idle before the trainer hears: a save it sends as soon as
	 * the restore returns must not find the restore still writing.
	 */
	pthread_mutex_lock(&a->mu);
	rs->plan->restoring--;
	plan_idle(a, rs->plan);
	pthread_mutex_unlock(&a->mu);
	restore_reply(rs, rc, step, meta, err);
	free(meta);
	pthread_mutex_lock(&a->mu);
	plan_put(a, rs->plan); /* the reply read its job and rank */
	pthread_mutex_unlock(&a->mu);
	for (size_t i = 0; i < rs->nskipped; i++)
		free(rs->skipped[i]);
	free(rs->skipped);
	free(rs);
}

/* Under mu: which step, marked as being read so nobody deletes it meanwhile. */
static int restore_prepare(struct agent *a, struct rpc *c, const Ckpt__V1__RestoreRequest *req,
			   struct restore *rs, char *err)
{
	struct cat_entry *e;
	struct plan *p;

	p = plan_of(a, c, req->plan_id);
	if (!p)
		return ipc_errf(err, -ENOENT, "no plan %llu (destroyed, or the agent restarted)",
				(unsigned long long)req->plan_id);
	if (p->active)
		return ipc_errf(err, -EBUSY, "job %s rank %d: a save or restore of this plan is "
					     "using its memory: wait for CAPTURED",
				p->job, p->rank);
	if (req->step == -1) { /* CKPT_LATEST */
		e = catalog_newest(a->cat, p->job, INT64_MAX);
		if (!e)
			return ipc_errf(err, -ENOENT, "job %s has no committed checkpoint", p->job);
	} else {
		int rc = ipc_check_step(req->step, err);

		if (rc)
			return rc;
		e = catalog_find(a->cat, p->job, req->step);
		if (!e)
			return ipc_errf(err, -ENOENT,
					"job %s has no committed step %lld (ckptctl list %s shows "
					"what there is)",
					p->job, (long long)req->step, p->job);
	}
	rs->a = a;
	rs->plan = p;
	rs->step = e->step;
	rs->latest = req->step < 0;
	rs->fallback = req->fallback;
	rs->work.fn = restore_run;
	e->readers++;
	plan_get(p);
	plan_busy(p);
	p->restoring++;
	return 0;
}

void rpc_restore(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__RestoreRequest *req = (Ckpt__V1__RestoreRequest *)m;
	struct agent *a = ctx;
	char err[IPC_ERRLEN];
	struct restore *rs = calloc(1, sizeof(*rs));
	int rc;

	if (!rs) {
		rpc_fail(c, -ENOMEM, "out of memory");
		goto out;
	}
	rs->call = c;
	rs->t_start = ipc_mono_ns();
	pthread_mutex_lock(&a->mu);
	rc = restore_prepare(a, c, req, rs, err);
	pthread_mutex_unlock(&a->mu);
	if (rc) {
		free(rs);
		rpc_fail(c, rc, "restore: %s", err);
		goto out;
	}
	workq_push(a->capture, &rs->work);
out:
	protobuf_c_message_free_unpacked(m, NULL);
}

/* ---- verify ----------------------------------------------------------- */

struct verify {
	struct work work;
	struct agent *a;
	struct rpc *call;
	char job[IPC_MAX_JOB + 1];
	int64_t step;
};

/*
 * Each rank's safetensors header against the manifest: those read whole. A
 * header that could not be read (no file, too short, a read error) was
 * reported as such; its buffer holds nothing to parse.
 */
static void check_headers(struct reader *r, const struct manifest *m, char **hdr,
			  const bool *whole)
{
	for (size_t k = 0; k < m->nranks; k++) {
		const struct manifest_rank *mr = &m->ranks[k];
		struct st_header *h = NULL;
		char err[IPC_ERRLEN];
		size_t nchunks = 0;

		if (!hdr[k] || !whole[k])
			continue;
		r->a->store->ops->shard_path(r->a->store, r->job, r->step, mr->file, r->path,
					     sizeof(r->path));
		if (st_header_parse(hdr[k], mr->header_bytes, mr->size, &h, err)) {
			problem(r, -EBADMSG, "%s: %s", r->path, err);
			continue;
		}
		for (size_t i = 0; i < m->ntensors; i++) {
			const struct manifest_tensor *t = &m->tensors[i];

			for (size_t j = 0; j < t->nchunks; j++) {
				const struct manifest_chunk *ch = &t->chunks[j];
				const struct st_entry *e;

				if (ch->rank != mr->rank)
					continue;
				nchunks++;
				e = st_header_find(h, t->name);
				if (!e || e->dtype != t->dtype || e->ndim != t->ndim ||
				    memcmp(e->shape, ch->shape, t->ndim * sizeof(int64_t)) ||
				    e->begin + h->data_start != ch->begin ||
				    e->end + h->data_start != ch->end)
					problem(r, -EBADMSG,
						"tensor '%s' in %s: the safetensors header %s",
						t->name, r->path,
						e ? "disagrees with the manifest (dtype, shape or "
						    "offsets)"
						  : "does not list it");
			}
		}
		if (h->n != nchunks)
			problem(r, -EBADMSG, "%s: its header lists %zu tensors, the manifest %zu",
				r->path, h->n, nchunks);
		st_header_free(h);
	}
}

/* Each rank's header into hdr[k] (whole[k] once all of it was read), and every chunk. */
static int verify_extents(struct reader *r, const struct manifest *m, char **hdr, bool *whole)
{
	for (size_t k = 0; k < m->nranks; k++) {
		if (m->ranks[k].header_bytes > ST_MAX_HEADER + 8 ||
		    !(hdr[k] = malloc(m->ranks[k].header_bytes)))
			return -ENOMEM;
		r->ext[r->n++] = (struct extent){.rank = m->ranks[k].rank,
						 .begin = 0,
						 .end = m->ranks[k].header_bytes,
						 .dst = hdr[k],
						 .nosum = true,
						 .whole = &whole[k],
						 .tensor = "(header)"};
	}
	for (size_t i = 0; i < m->ntensors; i++)
		for (size_t j = 0; j < m->tensors[i].nchunks; j++) {
			const struct manifest_chunk *ch = &m->tensors[i].chunks[j];

			r->ext[r->n++] = (struct extent){.rank = ch->rank,
							 .begin = ch->begin,
							 .end = ch->end,
							 .xxh3 = ch->xxh3,
							 .tensor = m->tensors[i].name};
		}
	return 0;
}

static void verify_reply(struct verify *v, struct reader *r, const struct manifest *m)
{
	Ckpt__V1__VerifyReply rep = CKPT__V1__VERIFY_REPLY__INIT;

	rep.ok = r->nproblems == 0 && r->err == 0;
	rep.bytes_checked = r->bytes;
	rep.tensors_checked = m ? (uint32_t)m->ntensors : 0;
	rep.n_problems = r->nproblems;
	rep.problems = r->problems;
	rpc_reply(v->call, &rep.base);
	log_msg(rep.ok ? LOG_INFO : LOG_WARNING, "verify of job %s step %lld: %s (%zu problems)",
		v->job, (long long)v->step, rep.ok ? "ok" : "CORRUPT", r->nproblems);
}

/*
 * Reader thread, the step marked as read (cat_entry.readers): neither GC nor
 * delete removes it meanwhile, so other verifies, shows and GCs may run.
 */
static void verify_run(struct work *w)
{
	struct verify *v = container_of(w, struct verify, work);
	struct agent *a = v->a;
	struct manifest *m = NULL;
	char err[IPC_ERRLEN], **hdr = NULL;
	bool *whole = NULL;
	size_t n = 0;
	struct reader r;
	struct cat_entry *e;

	memset(&r, 0, sizeof(r));
	if (store_read_manifest(a->store, v->job, v->step, &m, err) == 0) {
		for (size_t i = 0; i < m->ntensors; i++)
			n += m->tensors[i].nchunks;
		hdr = calloc(m->nranks, sizeof(*hdr));
		whole = calloc(m->nranks ? m->nranks : 1, sizeof(*whole));
	}
	if (reader_init(&r, a, v->job, v->step, n + (m ? m->nranks : 0)) ||
	    (m && (!hdr || !whole))) {
		rpc_fail(v->call, -ENOMEM, "verify: out of memory");
		goto out;
	}
	r.collect = true;
	if (!m)
		problem(&r, -EBADMSG, "%s", err);
	else if (verify_extents(&r, m, hdr, whole) || reader_run(&r, m, 2))
		problem(&r, -ENOMEM, "verify: out of memory or interrupted");
	else
		check_headers(&r, m, hdr, whole);
	verify_reply(v, &r, m);
out:
	for (size_t k = 0; hdr && k < m->nranks; k++)
		free(hdr[k]);
	free(hdr);
	free(whole);
	manifest_free(m);
	reader_free(&r);
	pthread_mutex_lock(&a->mu);
	e = catalog_find(a->cat, v->job, v->step);
	if (e)
		e->readers--;
	pthread_mutex_unlock(&a->mu);
	free(v);
}

/*
 * Maint thread: a step not listed when asked, committed perhaps by another
 * node after this one last looked (or restarted). The root is looked at
 * here, where no GC or delete of the job runs meanwhile (a sync while one
 * removes would list again a step on its way out); then it is read on a
 * reader thread like any other.
 */
static void verify_find(struct work *w)
{
	struct verify *v = container_of(w, struct verify, work);
	struct agent *a = v->a;
	struct cat_entry *e;

	catalog_sync_job(a, v->job);
	pthread_mutex_lock(&a->mu);
	e = catalog_find(a->cat, v->job, v->step);
	if (e)
		e->readers++;
	pthread_mutex_unlock(&a->mu);
	if (!e) {
		rpc_fail(v->call, -ENOENT, "job %s has no committed step %lld", v->job,
			 (long long)v->step);
		free(v);
		return;
	}
	v->work.fn = verify_run;
	workq_push(a->readers, &v->work);
}

void rpc_verify(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__VerifyRequest *req = (Ckpt__V1__VerifyRequest *)m;
	struct agent *a = ctx;
	char err[IPC_ERRLEN];
	struct verify *v;
	struct cat_entry *e = NULL;
	int rc;

	rc = ipc_check_job(req->job, err);
	if (!rc)
		rc = ipc_check_step(req->step, err);
	if (rc) {
		rpc_fail(c, rc, "verify: %s", err);
		goto out;
	}
	if (!access_check(a, c, "verify", req->job, ACCESS_READ))
		goto out;
	v = calloc(1, sizeof(*v));
	if (!v) {
		rpc_fail(c, -ENOMEM, "out of memory");
		goto out;
	}
	pthread_mutex_lock(&a->mu);
	e = catalog_find(a->cat, req->job, req->step);
	if (e)
		e->readers++;
	pthread_mutex_unlock(&a->mu);
	v->a = a;
	v->call = c;
	snprintf(v->job, sizeof(v->job), "%s", req->job);
	v->step = req->step;
	/* Listed: marked as read, straight to a reader. Not: the maint thread looks first. */
	v->work.fn = e ? verify_run : verify_find;
	workq_push(e ? a->readers : a->maint, &v->work);
out:
	protobuf_c_message_free_unpacked(m, NULL);
}
