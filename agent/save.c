/*
 * Saves: one rank's shard of one checkpoint, from trainer memory to a
 * durable file. Here: admission, the save's states and its capture job; the
 * chunks' way from staging to the disk is stream.c's (its state table).
 *
 *   control thread   rpc_save: checks, admission (skip policy), QUEUED; a
 *                    run's first save may be parked until every rank's plan
 *                    is known (layouts.c: at most --plans-wait), then
 *                    admitted on the commit thread or the tick's
 *   capture worker   save_capture: the pool, the shard file, then each chunk
 *                    in file order copied in and handed on (stream.c; a
 *                    CUDA plan's: capture_gpu.c); after the last one: CAPTURED
 *   I/O thread and   each chunk's write and checksums, then exact size +
 *   hasher           fsync: DURABLE (stream.c)
 *
 * Copy and write overlap: chunk k+1 is copied while chunk k is written. The
 * pool is shared by windows (pool.h): a save alone in a pool it fits in takes
 * every chunk it needs at once, so its capture never waits for the disk;
 * saves that together do not fit stream side by side, each sure of its
 * window, the oldest taking what the windows leave.
 *
 * An abort (trainer gone before CAPTURED, its checkpoint failed, the agent
 * stopping at its limit) is looked at before each chunk's copy, before its
 * write is handed over and as the I/O thread is about to send it: an aborted
 * save copies and writes at most the chunk in hand, and every chunk it is
 * not writing goes back to the pool as soon as its capture returns.
 *
 * `stages` counts what is still running (the capture, each chunk in flight,
 * the final fsync); whoever brings it to zero moves the save on.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stream.h"

static double secs(int64_t from, int64_t to)
{
	return from && to ? (double)(to - from) / 1e9 : 0;
}

/* ---- state and its observers ----------------------------------------- */

void save_info(struct save *s, Ckpt__V1__SaveInfo *info)
{
	info->save_id = s->id;
	info->job = s->job;
	info->step = s->step;
	info->rank = s->rank;
	info->world = s->world;
	info->state = s->state;
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

/* Under mu (save_observer_fn): the log hears of saves that end other than committed. */
static void save_log(struct agent *a, struct save *s, int state)
{
	(void)a;
	if (state == CKPT__V1__STATE__STATE_FAILED)
		log_msg(LOG_WARNING, "save of job %s step %lld rank %d FAILED: %s", s->job,
		        (long long)s->step, s->rank, s->reason);
	else if (state == CKPT__V1__STATE__STATE_SKIPPED)
		log_msg(LOG_NOTICE, "save of job %s step %lld rank %d SKIPPED: %s", s->job,
		        (long long)s->step, s->rank, s->reason);
}

/* Told of each state a save reaches, in this order. */
static const save_observer_fn observers[] = {
    save_log, /* here */
    metrics_on_save, /* metrics.c: the durations' histograms */
    session_on_save, /* session.c: the client's Attach stream */
    watchers_on_save, /* ops.c: ckptctl watch */
};

void save_fence_release(struct save *s)
{
	if (s->fenced && !s->fence_done && s->plan) {
		s->fence_done = true;
		plan_fence_finish(s->plan, s->fence_seq);
	}
}

void save_set_state(struct agent *a, struct save *s, int state, const char *reason)
{
	int64_t now = ipc_mono_ns();
	/* COMMITTED is final, but for the upload tier's UPLOADED after it */
	bool uploaded = s->state == CKPT__V1__STATE__STATE_COMMITTED &&
	                state == CKPT__V1__STATE__STATE_UPLOADED;

	if ((ipc_state_final(s->state) && !uploaded) || state <= s->state)
		return;
	s->state = state;
	if (reason)
		snprintf(s->reason, sizeof(s->reason), "%s", reason);
	if (state == CKPT__V1__STATE__STATE_CAPTURED)
		s->t_captured = now;
	else if (state == CKPT__V1__STATE__STATE_DURABLE)
		s->t_durable = now;
	else if (state == CKPT__V1__STATE__STATE_COMMITTED)
		s->t_committed = now;
	/*
	 * A CUDA plan's fence moves once this save's copies are done; for a save
	 * that ends otherwise, once its capture job (which may still be about to
	 * wait on the trainer's event) has returned: save_capture.
	 */
	if (state == CKPT__V1__STATE__STATE_CAPTURED || (ipc_state_final(state) && !s->capturing))
		save_fence_release(s);
	if (uploaded) {
		a->finals[state]++;
	} else if (ipc_state_final(state)) {
		a->inflight--;
		a->nfinished++;
		a->finals[state]++;
	}
	for (size_t i = 0; i < sizeof(observers) / sizeof(observers[0]); i++)
		observers[i](a, s, state);
}

void save_upload_failed(struct agent *a, struct save *s, const char *why)
{
	if (s->state != CKPT__V1__STATE__STATE_COMMITTED || s->upload_failed)
		return;
	s->upload_failed = true;
	snprintf(s->reason, sizeof(s->reason), "not uploaded: %s", why);
	/* no new state: only those who show it to people hear (not the metrics) */
	session_on_save(a, s, s->state);
	watchers_on_save(a, s, s->state);
}

/* Under mu: this save fails, and its checkpoint with it. */
void save_fail(struct agent *a, struct save *s, const char *reason)
{
	char why[IPC_ERRLEN + 32];

	atomic_store(&s->abort, true);
	save_set_state(a, s, CKPT__V1__STATE__STATE_FAILED, reason);
	snprintf(why, sizeof(why), "rank %d: %s", s->rank, reason);
	cp_fail(a, s->cp, why);
}

void save_forget_session(struct agent *a, struct session *sess)
{
	struct list *pos;

	list_for_each(pos, &a->saves)
	{
		struct save *s = container_of(pos, struct save, link);

		if (s->sess == sess)
			s->sess = NULL;
	}
}

void save_detach(struct agent *a, struct save *s)
{
	if (s->plan && s->lay != &s->plan->whole)
		layout_put(s->lay);
	s->lay = NULL;
	if (s->plan)
		plan_put(a, s->plan);
	s->plan = NULL;
	free(s->digest);
	s->digest = NULL;
	s->cp = NULL;
}

void save_free(struct agent *a, struct save *s)
{
	list_del(&s->link);
	save_detach(a, s);
	free(s->meta);
	free(s);
}

void save_trim(struct agent *a)
{
	struct list *pos, *tmp;

	list_for_each_safe(pos, tmp, &a->saves)
	{
		struct save *s = container_of(pos, struct save, link);

		if (a->nfinished <= AGENT_KEEP_FINISHED)
			break;
		if (ipc_state_final(s->state) && !s->cp && atomic_load(&s->stages) == 0) {
			a->nfinished--;
			save_free(a, s);
		}
	}
}

static void save_capture(struct work *w)
{
	struct save *s = container_of(w, struct save, work);
	struct agent *a = s->a;
	char why[IPC_ERRLEN] = "";
	int64_t t1 = ipc_mono_ns(), t2, t3;
	int rc;

	if (s->plan->gpu) {
		rc = capture_gpu(s, why, &t2);
	} else {
		rc = stream_setup(s, why);
		t2 = ipc_mono_ns();
		if (!rc)
			rc = stream_capture_host(s, why);
	}
	t3 = ipc_mono_ns();
	log_msg(LOG_DEBUG,
	        "capture of job %s step %lld rank %d: %.2f ms queued, %.2f ms pool and file, "
	        "%.2f ms copying %llu of %llu bytes",
	        s->job, (long long)s->step, s->rank, (double)(t1 - s->t_queued) / 1e6,
	        (double)(t2 - t1) / 1e6, (double)(t3 - t2) / 1e6,
	        (unsigned long long)atomic_load(&s->bytes_captured),
	        (unsigned long long)s->bytes_total);
	/*
	 * The capture takes no more chunks: the credits it has not spent go
	 * back to the pool now, and each chunk in flight as its write ends
	 * (an aborted save's at once: chunk_prep skips their writes).
	 */
	if (s->resv.pool)
		pool_release(&s->resv);
	pthread_mutex_lock(&a->mu);
	if (rc == -EAGAIN && !atomic_load(&s->abort)) {
		atomic_store(&s->abort, true);
		save_set_state(a, s, CKPT__V1__STATE__STATE_SKIPPED, why);
		cp_fail(a, s->cp, "a rank was SKIPPED (staging pool full)");
	} else if (rc && rc != -ECANCELED) {
		save_fail(a, s, why);
	} else if (!rc) {
		save_set_state(a, s, CKPT__V1__STATE__STATE_CAPTURED, NULL);
	}
	if (s->plan->gpu) /* before plan_idle: the plan's GPU side lives while busy */
		capture_next(a, s);
	s->capturing = false;
	plan_idle(a, s->plan);
	pthread_mutex_unlock(&a->mu);
	stream_stage_done(s);
}

/* ---- the RPCs --------------------------------------------------------- */

static struct save *save_new(struct agent *a, struct plan *p, struct checkpoint *cp, int64_t step)
{
	struct save *s = calloc(1, sizeof(*s));
	/* replicas written once where the plan set allows (layouts.c); else the whole plan */
	struct shard_layout *lay = p->dedup ? p->dedup : &p->whole;

	if (!s || !(s->digest = calloc(lay->n ? lay->n : 1, sizeof(uint64_t)))) {
		free(s);
		return NULL;
	}
	s->lay = lay;
	if (lay != &p->whole)
		lay->refs++;
	s->id = ipc_random_id();
	s->a = a;
	s->plan = p;
	plan_get(p);
	snprintf(s->job, sizeof(s->job), "%s", p->job);
	s->rank = p->rank;
	s->world = p->world;
	s->bytes_total = lay->shard_bytes;
	s->cp = cp;
	s->sess = p->sess;
	s->step = step;
	/* its header's, its part's: a number no other save draws (0 means none) */
	s->stamp = (struct st_stamp){step, ipc_random_id() ?: (uint64_t)ipc_mono_ns() | 1};
	s->state = CKPT__V1__STATE__STATE_QUEUED;
	s->t_queued = ipc_mono_ns();
	s->queued_unix_ns = ipc_now_ns();
	s->nchunks = (unsigned)((lay->shard_bytes + pool_chunk_bytes(a->pool) - 1) /
	                        pool_chunk_bytes(a->pool));
	s->pool_limited = s->nchunks > pool_nchunks(a->pool);
	s->want = s->pool_limited ? pool_nchunks(a->pool) : s->nchunks;
	if (s->pool_limited) /* a note, not a failure: CAPTURED comes later */
		snprintf(s->reason, sizeof(s->reason),
		         "larger than the staging pool (%u of %u chunks): streamed through it",
		         s->nchunks, pool_nchunks(a->pool));
	s->work.fn = save_capture;
	cp->rank[p->rank] = s;
	cp->nsaved++;
	a->inflight++;
	list_add_tail(&a->saves, &s->link);
	watchers_tell(a, s, false); /* QUEUED: the client learns it from the reply */
	return s;
}

/*
 * Under mu: a save of cp's step by this rank, whose earlier one ended in a
 * failed checkpoint: the step starts anew (a new attempt, in a file of its
 * own; the failed one's files go with it). Not where this node's part was
 * written: a commit elsewhere may still use that attempt.
 */
static bool retry_of_failed(const struct checkpoint *cp, int rank)
{
	const struct save *s = cp->rank[rank];

	return s && cp->state == CKPT__V1__STATE__STATE_FAILED && !cp->part_built &&
	       (s->state == CKPT__V1__STATE__STATE_FAILED ||
	        s->state == CKPT__V1__STATE__STATE_SKIPPED);
}

/*
 * Under mu: a save of a step that is committed is refused (-EEXIST), but
 * of one known damaged (a restore or verify found it; not pinned, not
 * being read) that one node's part made: that one this save replaces
 * (*replaces): out of the catalog once the save is made, its manifest
 * retired before this node's part is written. A trainer
 * that went back past a damaged step saves it again as it trains on.
 */
static int committed_before(struct agent *a, const struct plan *p, int64_t step, bool *replaces,
                            char *err)
{
	struct cat_entry *e = catalog_find(a->cat, p->job, step);

	*replaces = false;
	if (!e)
		return 0;
	if (!e->damage[0])
		return ipc_errf(err, -EEXIST,
		                "job %s step %lld is already committed: delete it first to save "
		                "it again",
		                p->job, (long long)step);
	if (e->pinned || e->readers)
		return ipc_errf(err, -EEXIST,
		                "job %s step %lld is committed and damaged (%s), and %s: it cannot "
		                "be saved again now",
		                p->job, (long long)step, e->damage,
		                e->pinned ? "pinned (unpin it first)" : "being read");
	/*
	 * Of several nodes (or parts not known): their old parts stay in the
	 * step, and the other nodes may not know it is damaged; a step saved
	 * anew from some of them could mix two saves. An operator removes it.
	 */
	if (e->nparts != 1)
		return ipc_errf(err, -EEXIST,
		                "job %s step %lld is committed and damaged (%s), and %s: delete it "
		                "(ckptctl delete --force %s %lld, on any node) to save it again",
		                p->job, (long long)step, e->damage,
		                e->nparts ? "its parts are of several nodes"
		                          : "its parts are not known",
		                p->job, (long long)step);
	*replaces = true; /* once the save is made: out of the catalog (save_start) */
	return 0;
}

/* Under mu: the checks that need the agent's state; creates and queues the save. */
static int save_start(struct agent *a, struct rpc *c, const Ckpt__V1__SaveRequest *req,
                      struct save **out, char *err)
{
	struct checkpoint *cp;
	struct plan *p;
	struct save *s;
	bool replaces;
	int rc;

	p = plan_of(a, c, req->plan_id);
	if (!p)
		return ipc_errf(err, -ENOENT, "no plan %llu (destroyed, or the agent restarted)",
		                (unsigned long long)req->plan_id);
	if (a->stopping)
		return ipc_errf(err, -EAGAIN, "the agent is stopping");
	if ((rc = committed_before(a, p, req->step, &replaces, err)))
		return rc;
	/* Before cp_get: a refusal must not leave an empty checkpoint behind. */
	if (p->restoring)
		return ipc_errf(err, -EBUSY,
		                "job %s rank %d: a restore is writing this plan's memory: save "
		                "after it returns",
		                p->job, p->rank);
	if (!p->gpu && req->cuda_event.len)
		return ipc_errf(err, -EINVAL, "a CUDA event for a host-memory plan");
	if (p->gpu && req->cuda_event.len != GPU_EVENT_HANDLE_BYTES)
		return ipc_errf(
		    err, -EINVAL,
		    "a save of a CUDA plan carries the trainer's event handle (%d bytes): "
		    "libckpt records it",
		    GPU_EVENT_HANDLE_BYTES);
	if (p->gpu && p->gpu->fence.issued - p->gpu->fence.released >= FENCE_WINDOW)
		return ipc_errf(err, -EBUSY,
		                "job %s rank %d: %d saves of this plan not yet captured", p->job,
		                p->rank, FENCE_WINDOW);
	rc = cp_get(a, p->job, req->step, p->world, p->run, &cp, err);
	if (!rc && retry_of_failed(cp, p->rank)) {
		cp->retired = true; /* passed over from now on, let go once its files are gone */
		cp_release(a, cp);
		rc = cp_get(a, p->job, req->step, p->world, p->run, &cp, err);
	}
	if (rc)
		return rc;
	if (cp->rank[p->rank])
		return ipc_errf(err, -EEXIST, "job %s step %lld rank %d is already saved (%s)",
		                p->job, (long long)req->step, p->rank,
		                ipc_state_name(cp->rank[p->rank]->state));
	if (cp->part_built)
		return ipc_errf(
		    err, -EALREADY,
		    "job %s step %lld: node %s's part of it was written without rank %d "
		    "(its plan came after the step's other saves here): this step "
		    "cannot take it",
		    p->job, (long long)req->step, a->cfg.node, p->rank);
	s = save_new(a, p, cp, req->step);
	if (!s) {
		if (cp->nsaved == 0) /* new and empty: nobody else knows it */
			cp_free(a, cp);
		return ipc_errf(err, -ENOMEM, "out of memory");
	}
	if (p->gpu) { /* room checked above: this cannot fail */
		fence_issue(&p->gpu->fence, &s->fence_seq);
		s->fenced = true;
		memcpy(s->cuda_event, req->cuda_event.data, GPU_EVENT_HANDLE_BYTES);
	}
	if (replaces) {
		log_msg(LOG_WARNING, "job %s step %lld is damaged: this save replaces it", p->job,
		        (long long)req->step);
		catalog_remove(a->cat, p->job, req->step);
		cp->replaces_damaged = true;
	}
	/* Each rank's meta is its own: restore gives it back to that rank. */
	if (req->meta_json && *req->meta_json)
		s->meta = strdup(req->meta_json);
	*out = s;
	if (cp->state == CKPT__V1__STATE__STATE_FAILED) {
		char why[IPC_ERRLEN + 64];

		snprintf(why, sizeof(why), "checkpoint %s step %lld failed: %s", cp->job,
		         (long long)cp->step, cp->reason);
		atomic_store(&s->abort, true);
		save_set_state(a, s, CKPT__V1__STATE__STATE_FAILED, why);
		return 0; /* the caller answers, then lets the checkpoint go */
	}
	if (p->backpressure == CKPT__V1__BACKPRESSURE__BACKPRESSURE_SKIP &&
	    !pool_may_admit(a->pool, cp, s->want)) {
		atomic_store(&s->abort, true);
		save_set_state(a, s, CKPT__V1__STATE__STATE_SKIPPED, SAVE_SKIP_REASON);
		cp_fail(a, cp, "a rank was SKIPPED (staging pool full)");
		return 0;
	}
	/* Running: the capture stage holds the plan's regions until CAPTURED. */
	atomic_store(&s->stages, 1);
	cp->nrunning++;
	plan_busy(p);
	capture_queue(a, s);
	return 0;
}

void save_admit(struct agent *a, struct rpc *c, ProtobufCMessage *m)
{
	Ckpt__V1__SaveRequest *req = (Ckpt__V1__SaveRequest *)m;
	Ckpt__V1__SaveReply rep = CKPT__V1__SAVE_REPLY__INIT;
	char err[IPC_ERRLEN];
	struct save *s = NULL;
	int rc;

	rc = save_start(a, c, req, &s, err);
	if (!rc) {
		rep.save_id = s->id;
		rep.state = s->state;
		rep.reason = s->reason;
		rep.fence_seq = s->fence_seq;
		/* the reply is packed now, under the lock: s may change right after */
		rpc_reply(c, &rep.base);
		/* born failed (its checkpoint had failed): nothing will run for it */
		if (s->state == CKPT__V1__STATE__STATE_FAILED && s->cp && !atomic_load(&s->stages))
			cp_release(a, s->cp);
	} else {
		rpc_fail(c, rc, "save: %s", err);
	}
	protobuf_c_message_free_unpacked(m, NULL);
}

void rpc_save(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__SaveRequest *req = (Ckpt__V1__SaveRequest *)m;
	struct agent *a = ctx;
	char err[IPC_ERRLEN];
	struct plan *p;
	int rc;

	rc = ipc_check_step(req->step, err);
	if (!rc)
		rc = ipc_check_meta(req->meta_json, err);
	if (rc) {
		rpc_fail(c, rc, "save: %s", err);
		protobuf_c_message_free_unpacked(m, NULL);
		return;
	}
	pthread_mutex_lock(&a->mu);
	/* a run's first save may wait for every rank's plan (layouts.c) */
	p = plan_of(a, c, req->plan_id);
	if (!p || a->stopping || !layouts_park(a, p, c, m))
		save_admit(a, c, m);
	pthread_mutex_unlock(&a->mu);
}

void rpc_get_save(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__GetSaveRequest *req = (Ckpt__V1__GetSaveRequest *)m;
	Ckpt__V1__SaveInfo info = CKPT__V1__SAVE_INFO__INIT;
	struct agent *a = ctx;
	struct list *pos;
	bool found = false;

	pthread_mutex_lock(&a->mu);
	list_for_each(pos, &a->saves)
	{
		struct save *s = container_of(pos, struct save, link);

		if (s->id == req->save_id && access_may_read(a, rpc_peer(c), s->job)) {
			save_info(s, &info);
			rpc_reply(c, &info.base);
			found = true;
			break;
		}
	}
	pthread_mutex_unlock(&a->mu);
	if (!found)
		rpc_fail(c, -ENOENT, "no save %llu (unknown, or long finished)",
		         (unsigned long long)req->save_id);
	protobuf_c_message_free_unpacked(m, NULL);
}
