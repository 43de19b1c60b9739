/*
 * What operators ask: status, list, delete, and the live watch of saves
 * (show is show.c's). Status and watch answer from memory on the control
 * thread; list and delete touch the disk, on the maint thread (list: the
 * catalog following the root first; both in order with GC and pins). Watchers
 * get every state change (watchers_on_save, a subscriber of the hub's save
 * and save note events) and, once a second (the agent's tick), the bytes moved by each
 * save in flight, for progress bars and rates.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/node/node.h"
#include "agent/rpc/access.h"
#include "agent/node/checkpoint.h"
#include "agent/node/save.h"
#include "agent/node/catalog.h"
#include "agent/rpc/ops.h"
#include "agent/node/gc.h"
#include "agent/node/root.h"
#include "agent/rpc/handlers.h"
#include "agent/node/upload.h"
#include "agent/rpc/server.h"
#include "ipc/base/log.h"

static double secs(int64_t from, int64_t to)
{
	return from && to ? (double)(to - from) / 1e9 : 0;
}

void save_info(struct save *s, Ckpt__V1__SaveInfo *info)
{
	info->save_id = s->id;
	info->job = s->job;
	info->step = s->step;
	info->rank = s->rank;
	info->world = s->world;
	info->state = (Ckpt__V1__State)s->state; /* the same numbers (ipc/wire.c) */
	info->reason = s->reason;
	info->upload_failed = s->upload_failed;
	info->bytes_total = s->bytes_total;
	info->bytes_captured = atomic_load(&s->bytes_captured);
	info->bytes_written = atomic_load(&s->bytes_written);
	info->queued_unix_ns = s->queued_unix_ns;
	info->capture_seconds = secs(s->t_queued, s->t_captured);
	info->durable_seconds = secs(s->t_queued, s->t_durable);
	info->commit_seconds = secs(s->t_queued, s->t_committed);
	info->pool_limited = s->pool_limited;
	info->run = s->plan ? s->plan->run : "";
	if (s->cp) {
		info->n_parts_done = s->cp->nparts_done;
		info->parts_done = s->cp->parts_done;
		info->n_parts_missing = s->cp->nparts_missing;
		info->parts_missing = s->cp->parts_missing;
	}
}

#ifndef CKPTD_VERSION
#define CKPTD_VERSION "0.0.0"
#endif

/* ---- status ----------------------------------------------------------- */

static size_t in_flight(struct agent *a, const struct peer *who, const char *job,
                        Ckpt__V1__CheckpointSummary **v, Ckpt__V1__CheckpointSummary ***pv,
                        char (**notes)[96]);

/*
 * Under mu: the upload tier as status says it: the store, then the uploads
 * done, retried, waiting, pending after a failed try, and given up (the
 * last one's reason).
 */
static char *upload_detail(struct agent *a, char *buf, size_t len)
{
	struct storage *t = upload_tier(a->up);
	struct upload_stats us;
	size_t o;

	upload_get_stats(a->up, &us);
	t->ops->describe(t, buf, len);
	o = strlen(buf);
	o += (size_t)snprintf(buf + o, len - o,
	                      "; %llu checkpoints uploaded, %llu retried, %u waiting (%u pending "
	                      "after a failed try)",
	                      (unsigned long long)us.uploaded, (unsigned long long)us.retried,
	                      us.queued, us.pending);
	if (o < len && us.failed)
		o += (size_t)snprintf(buf + o, len - o,
		                      "; %llu given up, %u of them on the root and not on the tier "
		                      "(last: %s)",
		                      (unsigned long long)us.failed, us.missing, us.last_failure);
	if (o < len)
		snprintf(buf + o, len - o, "; %llu bytes sent", (unsigned long long)us.bytes);
	return buf;
}

/* What status says of the I/O: the engine, direct I/O, the pool, the bytes and errors. */
static void status_io(struct agent *a, Ckpt__V1__StatusReply *rep, char *io, size_t len)
{
	struct pool_stats ps;
	struct ioeng_stats is;
	const char *why = NULL;

	pool_get_stats(a->pool, &ps);
	ioeng_get_stats(a->io, &is);
	rep->io_engine = (char *)ioeng_name(a->io);
	/* Direct I/O is learnt on the first shard: say what is known now. */
	if (a->store->ops->describe) {
		rep->io_engine = (char *)a->store->ops->name;
		a->store->ops->describe(a->store, io, len);
	} else
		snprintf(io, len, "%s; %s", ioeng_detail(a->io),
		         local_direct(a->store, &why) ? "O_DIRECT"
		         : why && *why                ? why
		                                      : "buffered writes (--no-direct)");
	rep->io_detail = io;
	rep->pool_bytes = ps.bytes;
	rep->pool_used_bytes = (uint64_t)ps.in_use * ps.chunk_bytes;
	rep->chunk_bytes = ps.chunk_bytes;
	rep->pool_locked = ps.locked;
	rep->pool_registered = ioeng_registered(a->io);
	rep->pool_detail = (char *)pool_detail(a->pool);
	if (a->store->ops->stats) {
		struct storage_stats ss;

		a->store->ops->stats(a->store, &ss);
		is.bytes_written = ss.bytes_written;
		is.bytes_read = ss.bytes_read;
		is.errors = ss.errors;
		is.retries = ss.retries;
	}
	rep->bytes_written = is.bytes_written;
	rep->bytes_read = is.bytes_read;
	rep->restored_bytes = atomic_load(&a->restored_bytes);
	rep->restore_read_bytes = atomic_load(&a->restore_read_bytes);
	rep->io_errors = is.errors;
	rep->io_retries = is.retries;
}

void rpc_status(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__StatusReply rep = CKPT__V1__STATUS_REPLY__INIT;
	Ckpt__V1__StateCount counts[8], *cp[8];
	struct agent *a = ctx;
	Ckpt__V1__CheckpointSummary *flight = NULL, **pflight = NULL;
	char last[512], io[512], up[768 + UPLOAD_NOTE_LEN], (*notes)[96] = NULL;
	size_t n = 0;

	log_last_error(last, sizeof(last));
	rep.version = CKPTD_VERSION;
	rep.pid = getpid();
	rep.uptime_seconds = (double)(ipc_mono_ns() - a->started_mono) / 1e9;
	rep.root = (char *)a->cfg.root;
	rep.listen = (char *)a->cfg.listen;
	status_io(a, &rep, io, sizeof(io));
	rep.last_error = last;
	rep.gpu = (char *)gpu_status(a->gpu);
	rep.removed_at_start = a->recovered.partial_removed;
	rep.kept_at_start = a->recovered.partial_kept;
	rep.node = (char *)a->cfg.node;
	rep.commit_deadline = a->cfg.commit_deadline_s;
	rep.abandon_after = a->cfg.abandon_after_s;
	rep.keep_last = a->cfg.keep_last;
	rep.keep_every = a->cfg.keep_every;
	pthread_mutex_lock(&a->mu);
	rep.gc_removed = a->gc_removed;
	rep.root_state = (char *)root_state_name(a->root.state);
	rep.root_since_unix_ns = a->root.since_unix_ns;
	rep.root_error = a->root.error;
	if (a->up) {
		rep.upload_root = (char *)a->cfg.upload.root;
		rep.upload_detail = upload_detail(a, up, sizeof(up));
	}
	for (int s = SAVE_QUEUED; s <= SAVE_SKIPPED; s++) {
		if (!ipc_state_final(s))
			continue;
		ckpt__v1__state_count__init(&counts[n]);
		counts[n].state = s;
		counts[n].count = a->finals[s];
		cp[n] = &counts[n];
		n++;
	}
	rep.n_saves = n;
	rep.saves = cp;
	rep.sessions = a->nsessions;
	rep.plans = a->nplans;
	rep.saves_in_flight = a->inflight;
	rep.n_in_flight = in_flight(a, rpc_peer(c), NULL, &flight, &pflight, &notes);
	rep.in_flight = pflight;
	rpc_reply(c, &rep.base);
	pthread_mutex_unlock(&a->mu);
	free(flight);
	free(pflight);
	free(notes);
	protobuf_c_message_free_unpacked(m, NULL);
}

/* ---- list ------------------------------------------------------------- */

void ops_summary(const struct cat_entry *e, bool latest, Ckpt__V1__CheckpointSummary *s)
{
	ckpt__v1__checkpoint_summary__init(s);
	s->job = (char *)e->job;
	s->step = e->step;
	s->world = e->world;
	s->state = CKPT__V1__STATE__STATE_COMMITTED;
	s->bytes = e->bytes;
	s->time_unix_ns = e->time_unix_ns;
	s->latest = latest;
	s->tensors = e->tensors;
	s->capture_seconds = e->capture_seconds;
	s->durable_seconds = e->durable_seconds;
	s->commit_seconds = e->commit_seconds;
	s->pinned = e->pinned;
	s->reason = (char *)e->damage; /* "" unless damaged: why */
	s->damaged = e->damage[0] != '\0';
	s->run = (char *)e->run;
	s->nodes = e->nparts;
}

/*
 * A checkpoint in flight is as far as its slowest rank (QUEUED while ranks
 * are missing); `note` says how many ranks are where.
 */
static void summary_from_cp(struct checkpoint *cp, Ckpt__V1__CheckpointSummary *s, char *note,
                            size_t len)
{
	enum save_state slowest = SAVE_COMMITTED;

	ckpt__v1__checkpoint_summary__init(s);
	s->job = cp->job;
	s->step = cp->step;
	s->world = cp->world;
	s->run = cp->run;
	s->n_parts_done = cp->nparts_done;
	s->parts_done = cp->parts_done;
	s->n_parts_missing = cp->nparts_missing;
	s->parts_missing = cp->parts_missing;
	for (int r = 0; r < cp->world; r++)
		if (cp->rank[r]) {
			s->bytes += cp->rank[r]->bytes_total;
			if (cp->rank[r]->state < slowest)
				slowest = cp->rank[r]->state;
		}
	if (cp->state != SAVE_QUEUED) {
		s->state = (Ckpt__V1__State)cp->state; /* the same numbers (ipc/wire.c) */
		s->reason = cp->reason;
		return;
	}
	s->state = (Ckpt__V1__State)(cp->committing ? slowest : SAVE_QUEUED);
	if (cp->committing)
		snprintf(note, len, "node %s: %u rank%s durable, part %s; %zu of %zu parts in",
		         cp->a->cfg.node, cp->nsaved, cp->nsaved == 1 ? "" : "s",
		         cp->part_written ? "written" : "being written", cp->nparts_done,
		         cp->nparts_done + cp->nparts_missing);
	else
		snprintf(note, len, "node %s: %u rank%s saved here, %u durable", cp->a->cfg.node,
		         cp->nsaved, cp->nsaved == 1 ? "" : "s", cp->ndurable);
	s->reason = note;
}

/* Under mu: the checkpoints in flight (of job; NULL: all who may read), malloc'd arrays. */
static size_t in_flight(struct agent *a, const struct peer *who, const char *job,
                        Ckpt__V1__CheckpointSummary **v, Ckpt__V1__CheckpointSummary ***pv,
                        char (**notes)[96])
{
	struct list *pos;
	size_t n = 0, k = 0;

	list_for_each(pos, &a->ckpts) n++;
	*v = calloc(n + 1, sizeof(**v));
	*pv = calloc(n + 1, sizeof(**pv));
	*notes = calloc(n + 1, sizeof(**notes));
	if (!*v || !*pv || !*notes)
		return 0;
	list_for_each(pos, &a->ckpts)
	{
		struct checkpoint *cp = container_of(pos, struct checkpoint, link);

		if (cp->state == SAVE_COMMITTED || (job && strcmp(job, cp->job)) ||
		    !access_may_read(a, who, cp->job))
			continue;
		summary_from_cp(cp, &(*v)[k], (*notes)[k], sizeof((*notes)[k]));
		(*pv)[k] = &(*v)[k];
		k++;
	}
	return k;
}

/*
 * A paged reply stays under this (a Python grpcio client's default limit is
 * 4 MiB); one of all (an older client's) under the message limit, or it is
 * refused, saying so.
 */
#define LIST_PAGE_BYTES (3u << 20)

/* A list, answered on the maint thread once the catalog has looked at the root. */
struct list_op {
	struct work work;
	struct agent *a;
	struct rpc *call;
	char job[IPC_MAX_JOB + 1]; /* "": every job */
	bool paged; /* a limit or a page token: cut at LIST_PAGE_BYTES, with a token */
	uint32_t limit; /* 0: as many as fit */
	char after_job[IPC_MAX_JOB + 1]; /* the page token: after (after_job, after_step) */
	int64_t after_step;
};

/* Whether entry e comes after the page token (the catalog's order: job, then step). */
static bool after_token(const struct list_op *op, const struct cat_entry *e)
{
	int r = strcmp(e->job, op->after_job);

	return r > 0 || (r == 0 && e->step > op->after_step);
}

/*
 * Under mu: the committed steps of the page into v/pv from e[0, ncat):
 * their number; *cut when more remain.
 */
static size_t list_page(struct agent *a, struct list_op *op, struct cat_entry **e, size_t ncat,
                        Ckpt__V1__CheckpointSummary *v, Ckpt__V1__CheckpointSummary **pv, bool *cut)
{
	size_t budget = op->paged ? LIST_PAGE_BYTES : IPC_MAX_MESSAGE - 4096, used = 0, k = 0;
	struct upload_row *rows = NULL;
	const struct upload_row *row;
	size_t nrows = upload_rows(a->up, &rows); /* none: the rows say nothing of uploads */

	*cut = false;
	for (size_t i = 0; i < ncat; i++) {
		/* LATEST: what a restore of LATEST takes, the newest not known damaged */
		bool latest;
		size_t size;

		if (op->after_job[0] && !after_token(op, e[i]))
			continue;
		if (!access_may_read(a, rpc_peer(op->call), e[i]->job))
			continue; /* a whole job at a time: its LATEST stays right */
		latest =
		    !e[i]->damage[0] && catalog_newest_whole(a->cat, e[i]->job, INT64_MAX) == e[i];
		ops_summary(e[i], latest, &v[k]);
		row = upload_row_find(rows, nrows, e[i]->job, e[i]->step);
		if (row) { /* the upload tier's word on it: queued, pending, not uploaded */
			v[k].upload = (char *)row->state;
			if (!v[k].damaged) /* its damage says more */
				v[k].reason = (char *)row->note;
		}
		size = protobuf_c_message_get_packed_size(&v[k].base) + 8;
		if (k && (used + size > budget || (op->limit && k >= op->limit))) {
			*cut = true;
			break;
		}
		used += size;
		pv[k] = &v[k];
		k++;
	}
	free(rows); /* the rows' strings are static or the queue's: the reply is sent under mu */
	return k;
}

/*
 * Under mu: the reply to a list, from the catalog and what is in flight
 * (on the last page): a page, or all of it for a client that asks no page.
 */
static void list_reply(struct agent *a, struct list_op *op)
{
	Ckpt__V1__ListReply rep = CKPT__V1__LIST_REPLY__INIT;
	Ckpt__V1__CheckpointSummary *v = NULL, **pv = NULL, *f = NULL, **pf = NULL;
	const char *job = op->job[0] ? op->job : NULL;
	char(*notes)[96] = NULL, token[IPC_MAX_JOB + 32];
	struct cat_entry **e = NULL;
	size_t ncat, nf, k;
	bool cut;

	ncat = catalog_list(a->cat, job, &e);
	nf = in_flight(a, rpc_peer(op->call), job, &f, &pf, &notes);
	v = calloc(ncat + 1, sizeof(*v));
	pv = calloc(ncat + nf + 1, sizeof(*pv));
	if (!e || !v || !pv || !f || !pf || !notes) {
		rpc_fail(op->call, -ENOMEM, "list: out of memory");
		goto out_free;
	}
	k = list_page(a, op, e, ncat, v, pv, &cut);
	if (cut && !op->paged) {
		rpc_fail(op->call, -EMSGSIZE,
		         "list%s%s: its %zu committed checkpoints make a reply that would be a "
		         "message larger than max (%u bytes): list one job, or use a ckptctl "
		         "that pages (ListRequest.limit)",
		         job ? " " : "", job ? job : "", ncat, IPC_MAX_MESSAGE);
		goto out_free;
	}
	if (cut) {
		snprintf(token, sizeof(token), "%s:%lld", pv[k - 1]->job,
		         (long long)pv[k - 1]->step);
		rep.next_page_token = token;
	}
	for (size_t i = 0; !cut && i < nf; i++)
		pv[k++] = pf[i];
	rep.n_checkpoints = k;
	rep.checkpoints = pv;
	rpc_reply(op->call, &rep.base);
out_free:
	free(e);
	free(v);
	free(pv);
	free(f);
	free(pf);
	free(notes);
}

/*
 * Maint thread (in order with GC and delete: a step on its way out is never
 * listed again): the job's steps as the root has them now, or every job's
 * (those listed here and those the root holds), then the answer. Steps another node's retention
 * removed go, steps another node committed come: a list is never staler than the root. One listing
 * of each job's steps per list (`ckptctl list` is an operator's call, not a per-step one).
 */
static void list_run(struct work *w)
{
	struct list_op *op = container_of(w, struct list_op, work);
	struct agent *a = op->a;
	bool root_ok;

	pthread_mutex_lock(&a->mu);
	root_ok = a->root.state == ROOT_OK;
	pthread_mutex_unlock(&a->mu);
	if (root_ok && op->job[0])
		catalog_sync_job(a, op->job);
	else if (root_ok) /* every job: those listed here and those the root holds */
		catalog_sync_all(a);
	pthread_mutex_lock(&a->mu);
	list_reply(a, op);
	pthread_mutex_unlock(&a->mu);
	free(op);
}

/* A page token ("JOB:STEP", from next_page_token) into op; false (err said) if it is none. */
static bool page_token_take(struct list_op *op, const char *token, char *err)
{
	const char *colon = strrchr(token, ':');
	char *end;
	long long step;

	if (colon && (size_t)(colon - token) < sizeof(op->after_job)) {
		snprintf(op->after_job, sizeof(op->after_job), "%.*s", (int)(colon - token), token);
		errno = 0;
		step = strtoll(colon + 1, &end, 10);
		if (!errno && end != colon + 1 && !*end && !ipc_check_job(op->after_job, NULL) &&
		    !ipc_check_step(step, NULL)) {
			op->after_step = step;
			return true;
		}
	}
	ipc_errf(err, -EINVAL,
	         "page_token '%.80s' is not one a list gave (JOB:STEP, from next_page_token)",
	         token);
	return false;
}

void rpc_list(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__ListRequest *req = (Ckpt__V1__ListRequest *)m;
	const char *job = req->job && *req->job ? req->job : NULL;
	struct agent *a = ctx;
	char err[IPC_ERRLEN];
	struct list_op *op;

	if (job && ipc_check_job(job, err)) {
		rpc_fail(c, -EINVAL, "list: %s", err);
		goto out;
	}
	if (job && !access_check(a, c, "list", job, ACCESS_READ))
		goto out;
	op = calloc(1, sizeof(*op));
	if (!op) {
		rpc_fail(c, -ENOMEM, "list: out of memory");
		goto out;
	}
	op->a = a;
	op->call = c;
	snprintf(op->job, sizeof(op->job), "%s", job ? job : "");
	op->limit = req->limit;
	op->paged = req->limit || (req->page_token && *req->page_token);
	if (req->page_token && *req->page_token && !page_token_take(op, req->page_token, err)) {
		rpc_fail(c, -EINVAL, "list: %s", err);
		free(op);
		goto out;
	}
	op->work.fn = list_run;
	workq_push(a->maint, &op->work);
out:
	protobuf_c_message_free_unpacked(m, NULL);
}

/* ---- delete (the maint thread; show is show.c's) ------------------------ */

static void delete_run(struct work *w)
{
	struct job_step_op *op = container_of(w, struct job_step_op, work);
	Ckpt__V1__Empty rep = CKPT__V1__EMPTY__INIT;
	struct agent *a = op->a;
	struct cat_entry *e, saved;
	char err[IPC_ERRLEN];
	int rc = 0;

	pthread_mutex_lock(&a->mu);
	e = catalog_find(a->cat, op->job, op->step);
	if (!e)
		rc = ipc_errf(err, -ENOENT, "job %s has no committed step %lld", op->job,
		              (long long)op->step);
	else if (e->readers)
		rc = ipc_errf(err, -EBUSY, "job %s step %lld is being restored or verified",
		              op->job, (long long)op->step);
	else if (e->pinned)
		rc = ipc_errf(err, -EBUSY, "job %s step %lld is pinned: unpin it first", op->job,
		              (long long)op->step);
	if (!rc) {
		/* Out of the catalog first: no restore can start on it from now on. */
		saved = *e;
		catalog_remove(a->cat, op->job, op->step);
	}
	pthread_mutex_unlock(&a->mu);
	if (!rc)
		rc = gc_remove(a, &saved, err);
	if (rc) {
		rpc_fail(op->call, rc, "delete: %s", err);
	} else {
		log_msg(LOG_INFO, "deleted job %s step %lld", op->job, (long long)op->step);
		rpc_reply(op->call, &rep.base);
	}
	free(op);
}

int ops_queue_job_step(struct rpc *c, struct agent *a, const char *what, const char *job,
                       int64_t step, const char *tier, enum access_want want,
                       void (*fn)(struct work *), struct workq *q, unsigned flags)
{
	struct storage *store = NULL;
	struct job_step_op *op;
	char err[IPC_ERRLEN];
	bool is_tier = false;
	int rc;

	rc = ipc_check_job(job, err);
	if (!rc)
		rc = ipc_check_step(step, err);
	if (!rc) {
		pthread_mutex_lock(&a->mu);
		rc = upload_pick_tier(a, tier, &store, &is_tier, err);
		pthread_mutex_unlock(&a->mu);
	}
	if (rc) {
		rpc_fail(c, rc, "%s: %s", what, err);
		return rc;
	}
	if (!access_check(a, c, what, job, want))
		return -EACCES;
	op = calloc(1, sizeof(*op));
	if (!op) {
		rpc_fail(c, -ENOMEM, "%s: out of memory", what);
		return -ENOMEM;
	}
	op->a = a;
	op->call = c;
	snprintf(op->job, sizeof(op->job), "%s", job);
	op->step = step;
	op->store = store;
	op->tier = is_tier;
	op->work.fn = fn;
	op->brief = flags & OPS_BRIEF;
	if (flags & OPS_STREAM) /* held open for the worker, which ends it (rpc_stream_end) */
		rpc_stream_hold(c, NULL, NULL);
	workq_push(q, &op->work);
	return 0;
}

void rpc_delete(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__DeleteRequest *req = (Ckpt__V1__DeleteRequest *)m;
	struct agent *a = ctx;

	ops_queue_job_step(c, a, "delete", req->job, req->step, NULL, ACCESS_MANAGE, delete_run,
	                   a->maint, 0);
	protobuf_c_message_free_unpacked(m, NULL);
}

/* ---- watch ------------------------------------------------------------ */

struct watcher {
	struct list link;
	struct agent *a;
	struct rpc *stream;
	char job[IPC_MAX_JOB + 1]; /* "" for every job */
	struct peer who; /* sees only the jobs it may read */
};

static void watchers_publish(struct agent *a, const Ckpt__V1__SaveInfo *info)
{
	struct list *pos;

	list_for_each(pos, &a->watchers)
	{
		struct watcher *w = container_of(pos, struct watcher, link);

		if ((!w->job[0] || strcmp(w->job, info->job) == 0) &&
		    access_may_read(a, &w->who, info->job))
			rpc_stream_send(w->stream, &info->base);
	}
}

void watchers_on_save(struct agent *a, struct save *s, enum save_state state)
{
	(void)state; /* s->state */
	watchers_tell(a, s, false);
}

void watchers_tell(struct agent *a, struct save *s, bool progress)
{
	Ckpt__V1__SaveInfo info = CKPT__V1__SAVE_INFO__INIT;

	if (list_empty(&a->watchers))
		return;
	save_info(s, &info);
	info.progress = progress;
	watchers_publish(a, &info);
}

void watchers_progress(struct agent *a)
{
	struct list *pos;

	if (list_empty(&a->watchers))
		return;
	list_for_each(pos, &a->saves)
	{
		struct save *s = container_of(pos, struct save, link);

		if (!ipc_state_final(s->state))
			watchers_tell(a, s, true);
	}
}

static void on_watch_close(struct rpc *c, void *ctx)
{
	struct watcher *w = ctx;
	struct agent *a = w->a;

	pthread_mutex_lock(&a->mu);
	list_del(&w->link);
	usage_release(a, w->who.uid, USE_WATCHERS, 1);
	pthread_mutex_unlock(&a->mu);
	rpc_release(c);
	free(w);
}

void rpc_watch(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__WatchRequest *req = (Ckpt__V1__WatchRequest *)m;
	struct agent *a = ctx;
	struct watcher *w;
	char err[IPC_ERRLEN], cut[160];
	struct list *pos;

	if (req->job && *req->job && ipc_check_job(req->job, err)) {
		rpc_fail(c, -EINVAL, "watch: %s", err);
		goto out;
	}
	if (req->job && *req->job && !access_check(a, c, "watch", req->job, ACCESS_READ))
		goto out;
	w = calloc(1, sizeof(*w));
	if (!w) {
		rpc_fail(c, -ENOMEM, "watch: out of memory");
		goto out;
	}
	w->a = a;
	w->stream = c;
	w->who = *rpc_peer(c);
	snprintf(w->job, sizeof(w->job), "%s", req->job ? req->job : "");
	snprintf(cut, sizeof(cut),
	         "this watcher fell behind: more than %llu KiB waited for it ([limits] "
	         "watch_buffer_kb); watch again to resume from the current state",
	         (unsigned long long)(a->cfg.lim.watch_bytes >> 10));
	pthread_mutex_lock(&a->mu);
	if (usage_charge(a, w->who.uid, USE_WATCHERS, 1, err)) {
		pthread_mutex_unlock(&a->mu);
		free(w);
		rpc_fail(c, -EAGAIN, "watch: %s", err);
		goto out;
	}
	list_add_tail(&a->watchers, &w->link);
	rpc_stream_hold(c, on_watch_close, w);
	rpc_stream_limit(c, a->cfg.lim.watch_bytes, cut);
	/* First what is in flight now, then every change. */
	list_for_each(pos, &a->saves)
	{
		struct save *s = container_of(pos, struct save, link);
		Ckpt__V1__SaveInfo info = CKPT__V1__SAVE_INFO__INIT;

		if (ipc_state_final(s->state) || (w->job[0] && strcmp(w->job, s->job)) ||
		    !access_may_read(a, &w->who, s->job))
			continue;
		save_info(s, &info);
		rpc_stream_send(c, &info.base);
	}
	pthread_mutex_unlock(&a->mu);
out:
	protobuf_c_message_free_unpacked(m, NULL);
}
