/*
 * What operators ask: status, list, show, delete, and the live watch of
 * saves. Status and watch answer from memory on the control thread; list,
 * show and delete touch the disk: show runs on a reader thread (it only
 * reads), list (the catalog following the root first) and delete on the
 * maint thread (in order with GC and pins). Watchers
 * get every state change (watchers_on_save, one of save_set_state's
 * observers) and, once a second (the agent's tick), the bytes moved by each
 * save in flight, for progress bars and rates.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"

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

void rpc_status(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__StatusReply rep = CKPT__V1__STATUS_REPLY__INIT;
	Ckpt__V1__StateCount counts[8], *cp[8];
	struct agent *a = ctx;
	struct pool_stats ps;
	struct ioeng_stats is;
	Ckpt__V1__CheckpointSummary *flight = NULL, **pflight = NULL;
	char last[512], io[512], up[768 + UPLOAD_NOTE_LEN], (*notes)[96] = NULL;
	const char *why = NULL;
	size_t n = 0;

	pool_get_stats(a->pool, &ps);
	ioeng_get_stats(a->io, &is);
	log_last_error(last, sizeof(last));
	rep.version = CKPTD_VERSION;
	rep.pid = getpid();
	rep.uptime_seconds = (double)(ipc_mono_ns() - a->started_mono) / 1e9;
	rep.root = (char *)a->cfg.root;
	rep.listen = (char *)a->cfg.listen;
	rep.io_engine = (char *)ioeng_name(a->io);
	/* Direct I/O is learnt on the first shard: say what is known now. */
	if (a->store->ops->describe) {
		rep.io_engine = (char *)a->store->ops->name;
		a->store->ops->describe(a->store, io, sizeof(io));
	} else
		snprintf(io, sizeof(io), "%s; %s", ioeng_detail(a->io),
		         local_direct(a->store, &why) ? "O_DIRECT"
		         : why && *why                ? why
		                                      : "buffered writes (--no-direct)");
	rep.io_detail = io;
	rep.pool_bytes = ps.bytes;
	rep.pool_used_bytes = (uint64_t)ps.in_use * ps.chunk_bytes;
	rep.chunk_bytes = ps.chunk_bytes;
	rep.pool_locked = ps.locked;
	rep.pool_registered = ioeng_registered(a->io);
	rep.pool_detail = (char *)pool_detail(a->pool);
	if (a->store->ops->stats) {
		struct storage_stats ss;

		a->store->ops->stats(a->store, &ss);
		is.bytes_written = ss.bytes_written;
		is.bytes_read = ss.bytes_read;
		is.errors = ss.errors;
		is.retries = ss.retries;
	}
	rep.bytes_written = is.bytes_written;
	rep.bytes_read = is.bytes_read;
	rep.restored_bytes = atomic_load(&a->restored_bytes);
	rep.restore_read_bytes = atomic_load(&a->restore_read_bytes);
	rep.io_errors = is.errors;
	rep.io_retries = is.retries;
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
	for (int s = CKPT__V1__STATE__STATE_QUEUED; s <= CKPT__V1__STATE__STATE_SKIPPED; s++) {
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

static void summary_from_entry(const struct cat_entry *e, bool latest,
                               Ckpt__V1__CheckpointSummary *s)
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
	int slowest = CKPT__V1__STATE__STATE_COMMITTED;

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
	if (cp->state != CKPT__V1__STATE__STATE_QUEUED) {
		s->state = cp->state;
		s->reason = cp->reason;
		return;
	}
	s->state = cp->committing ? slowest : CKPT__V1__STATE__STATE_QUEUED;
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

		if (cp->state == CKPT__V1__STATE__STATE_COMMITTED ||
		    (job && strcmp(job, cp->job)) || !access_may_read(a, who, cp->job))
			continue;
		summary_from_cp(cp, &(*v)[k], (*notes)[k], sizeof((*notes)[k]));
		(*pv)[k] = &(*v)[k];
		k++;
	}
	return k;
}

/* A list, answered on the maint thread once the catalog has looked at the root. */
struct list_op {
	struct work work;
	struct agent *a;
	struct rpc *call;
	char job[IPC_MAX_JOB + 1]; /* "": every job */
};

/* Under mu: the reply to a list of job (NULL: all), from the catalog and what is in flight. */
static void list_reply(struct agent *a, struct rpc *c, const char *job)
{
	Ckpt__V1__ListReply rep = CKPT__V1__LIST_REPLY__INIT;
	Ckpt__V1__CheckpointSummary *v = NULL, **pv = NULL, *f = NULL, **pf = NULL;
	char(*notes)[96] = NULL;
	struct cat_entry **e = NULL;
	struct upload_row *rows = NULL;
	const struct upload_row *row;
	size_t ncat, nf, nrows, k = 0;

	ncat = catalog_list(a->cat, job, &e);
	nrows = upload_rows(a->up, &rows); /* none: the rows say nothing of uploads */
	nf = in_flight(a, rpc_peer(c), job, &f, &pf, &notes);
	v = calloc(ncat + 1, sizeof(*v));
	pv = calloc(ncat + nf + 1, sizeof(*pv));
	if (!e || !v || !pv || !f || !pf || !notes) {
		rpc_fail(c, -ENOMEM, "list: out of memory");
		goto out;
	}
	for (size_t i = 0; i < ncat; i++) {
		/* LATEST: what a restore of LATEST takes, the newest not known damaged */
		bool latest =
		    !e[i]->damage[0] && catalog_newest_whole(a->cat, e[i]->job, INT64_MAX) == e[i];

		if (!access_may_read(a, rpc_peer(c), e[i]->job))
			continue; /* a whole job at a time: its LATEST stays right */
		summary_from_entry(e[i], latest, &v[k]);
		row = upload_row_find(rows, nrows, e[i]->job, e[i]->step);
		if (row) { /* the upload tier's word on it: queued, pending, not uploaded */
			v[k].upload = (char *)row->state;
			if (!v[k].damaged) /* its damage says more */
				v[k].reason = (char *)row->note;
		}
		pv[k] = &v[k];
		k++;
	}
	for (size_t i = 0; i < nf; i++)
		pv[k++] = pf[i];
	rep.n_checkpoints = k;
	rep.checkpoints = pv;
	rpc_reply(c, &rep.base);
out:
	free(rows);
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
	char **jobs = NULL;
	size_t n = 0;
	bool root_ok;

	pthread_mutex_lock(&a->mu);
	root_ok = a->root.state == ROOT_OK;
	pthread_mutex_unlock(&a->mu);
	if (root_ok && op->job[0])
		catalog_sync_job(a, op->job);
	else if (root_ok) /* every job: those listed here and those the root holds */
		n = catalog_jobs(a, &jobs);
	for (size_t i = 0; i < n; i++) {
		if (jobs[i])
			catalog_sync_job(a, jobs[i]);
		free(jobs[i]);
	}
	free(jobs);
	pthread_mutex_lock(&a->mu);
	list_reply(a, op->call, op->job[0] ? op->job : NULL);
	pthread_mutex_unlock(&a->mu);
	free(op);
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
	op->work.fn = list_run;
	workq_push(a->maint, &op->work);
out:
	protobuf_c_message_free_unpacked(m, NULL);
}

/* ---- show (a reader thread) and delete (the maint thread) -------------- */

struct job_step_op {
	struct work work;
	struct agent *a;
	struct rpc *call;
	char job[IPC_MAX_JOB + 1];
	int64_t step;
	struct storage *store; /* show: the root or the upload tier */
	bool tier; /* the upload tier: the root's catalog says nothing of it */
};

/*
 * Marks nothing as read (it reads one file, the manifest): a GC or delete
 * meanwhile is as if it came just before or just after.
 */
static void show_run(struct work *w)
{
	struct job_step_op *op = container_of(w, struct job_step_op, work);
	Ckpt__V1__ShowReply rep = CKPT__V1__SHOW_REPLY__INIT;
	Ckpt__V1__CheckpointSummary sum;
	struct agent *a = op->a;
	struct manifest *m = NULL;
	struct cat_entry e, *newest, *pinned;
	char err[IPC_ERRLEN], *json = NULL, **parts = NULL;
	size_t len;
	int rc;

	rc = store_read_manifest(op->store, op->job, op->step, &m, err);
	if (rc == -EINVAL || rc == -EFBIG) /* there, and unreadable: damaged, not absent */
		rc = -EBADMSG;
	if (!rc)
		rc = manifest_to_json(m, &json, &len, err);
	if (rc) {
		rpc_fail(op->call, rc, "show %s %lld: %s", op->job, (long long)op->step, err);
		goto out;
	}
	catalog_entry_from_manifest(m, &e);
	pthread_mutex_lock(&a->mu);
	pinned = op->tier ? NULL : catalog_find(a->cat, op->job, op->step);
	e.pinned = pinned && pinned->pinned;
	if (pinned) /* what a restore or verify found of it */
		snprintf(e.damage, sizeof(e.damage), "%s", pinned->damage);
	newest = op->tier ? NULL : catalog_newest_whole(a->cat, op->job, INT64_MAX);
	summary_from_entry(&e, newest && newest->step == op->step, &sum);
	pthread_mutex_unlock(&a->mu);
	parts = parts_text(m);
	sum.n_parts = parts ? m->nparts : 0;
	sum.parts = parts;
	rep.summary = &sum;
	rep.manifest_json = json;
	rpc_reply(op->call, &rep.base);
out:
	for (size_t i = 0; parts && i < m->nparts; i++)
		free(parts[i]);
	free(parts);
	free(json);
	manifest_free(m);
	free(op);
}

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

static void queue_job_step(struct rpc *c, struct agent *a, const char *what, const char *job,
                           int64_t step, const char *tier, enum access_want want,
                           void (*fn)(struct work *), struct workq *q)
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
		return;
	}
	if (!access_check(a, c, what, job, want))
		return;
	op = calloc(1, sizeof(*op));
	if (!op) {
		rpc_fail(c, -ENOMEM, "%s: out of memory", what);
		return;
	}
	op->a = a;
	op->call = c;
	snprintf(op->job, sizeof(op->job), "%s", job);
	op->step = step;
	op->store = store;
	op->tier = is_tier;
	op->work.fn = fn;
	workq_push(q, &op->work);
}

void rpc_show(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__ShowRequest *req = (Ckpt__V1__ShowRequest *)m;
	struct agent *a = ctx;

	queue_job_step(c, a, "show", req->job, req->step, req->tier, ACCESS_READ, show_run,
	               a->readers);
	protobuf_c_message_free_unpacked(m, NULL);
}

void rpc_delete(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__DeleteRequest *req = (Ckpt__V1__DeleteRequest *)m;
	struct agent *a = ctx;

	queue_job_step(c, a, "delete", req->job, req->step, NULL, ACCESS_MANAGE, delete_run,
	               a->maint);
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

void watchers_on_save(struct agent *a, struct save *s, int state)
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
