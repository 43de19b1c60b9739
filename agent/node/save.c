/*
 * Saves: one rank's shard of one checkpoint, from trainer memory to a
 * durable file. Here: the save's states and its capture job; admission is
 * save_rpc.c's, the chunks' way from staging to the disk stream.c's (its
 * state table). A save tells its checkpoint what befalls it through the
 * function the checkpoint gave it as it joined (save.tell: cp_join).
 *
 *   control thread   rpc_save (save_rpc.c): checks, admission (skip
 *                    policy), QUEUED; a run's first save may be parked
 *                    until every rank's plan is known (layouts.c: at most
 *                    --plans-wait), then admitted on the commit thread or
 *                    the tick's
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

#include "agent/pipe/stream.h"
#include "agent/node/checkpoint.h"
#include "agent/node/layouts.h"
#include "agent/node/root.h"
#include "ipc/base/log.h"

/* ---- state and its observers ----------------------------------------- */

/* Under mu (a hub_save_fn): the log hears of saves that end other than committed. */
void save_log(struct agent *a, struct save *s, enum save_state state)
{
	(void)a;
	if (state == SAVE_FAILED)
		log_msg(LOG_WARNING, "save of job %s step %lld rank %d FAILED: %s", s->job,
		        (long long)s->step, s->rank, s->reason);
	else if (state == SAVE_SKIPPED)
		log_msg(LOG_NOTICE, "save of job %s step %lld rank %d SKIPPED: %s", s->job,
		        (long long)s->step, s->rank, s->reason);
}

void save_fence_release(struct save *s)
{
	if (s->fenced && !s->fence_done && s->plan) {
		s->fence_done = true;
		plan_fence_finish(s->plan, s->fence_seq);
	}
}

void save_set_state(struct agent *a, struct save *s, enum save_state state, const char *reason)
{
	int64_t now = ipc_mono_ns();
	/* COMMITTED is final, but for the upload tier's UPLOADED after it */
	bool uploaded = s->state == SAVE_COMMITTED && state == SAVE_UPLOADED;

	if ((ipc_state_final(s->state) && !uploaded) || state <= s->state)
		return;
	s->state = state;
	if (reason)
		snprintf(s->reason, sizeof(s->reason), "%s", reason);
	if (state == SAVE_CAPTURED)
		s->t_captured = now;
	else if (state == SAVE_DURABLE)
		s->t_durable = now;
	else if (state == SAVE_COMMITTED)
		s->t_committed = now;
	/*
	 * A CUDA plan's fence moves once this save's copies are done; for a save
	 * that ends otherwise, once its capture job (which may still be about to
	 * wait on the trainer's event) has returned: save_capture.
	 */
	if (state == SAVE_CAPTURED || (ipc_state_final(state) && !s->capturing))
		save_fence_release(s);
	if (uploaded) {
		a->finals[state]++;
	} else if (ipc_state_final(state)) {
		a->inflight--;
		a->nfinished++;
		a->finals[state]++;
	}
	hub_save(&a->hub, a, s, state);
}

void save_upload_failed(struct agent *a, struct save *s, const char *why)
{
	if (s->state != SAVE_COMMITTED || s->upload_failed)
		return;
	s->upload_failed = true;
	snprintf(s->reason, sizeof(s->reason), "not uploaded: %s", why);
	/* no new state: only those who show it to people hear (not the metrics) */
	hub_save_note(&a->hub, a, s, s->state);
}

void save_on_ckpt(struct agent *a, const struct hub_ckpt *c)
{
	struct list *pos;

	if (c->state != SAVE_UPLOADED)
		return;
	list_for_each(pos, &a->saves)
	{
		struct save *s = container_of(pos, struct save, link);

		if (s->step != c->step || strcmp(s->job, c->job) != 0 || s->state != SAVE_COMMITTED)
			continue;
		if (c->why)
			save_upload_failed(a, s, c->why);
		else
			save_set_state(a, s, SAVE_UPLOADED, NULL);
	}
}

/* Under mu: this save fails, and its checkpoint with it. */
void save_fail(struct agent *a, struct save *s, const char *reason)
{
	char why[IPC_ERRLEN + 32];

	atomic_store(&s->abort, true);
	save_set_state(a, s, SAVE_FAILED, reason);
	snprintf(why, sizeof(why), "rank %d: %s", s->rank, reason);
	s->tell(a, s, SAVE_NEWS_FAILED, why);
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
		save_set_state(a, s, SAVE_SKIPPED, why);
		s->tell(a, s, SAVE_NEWS_SKIPPED, why);
	} else if (rc && rc != -ECANCELED) {
		save_fail(a, s, why);
	} else if (!rc) {
		save_set_state(a, s, SAVE_CAPTURED, NULL);
	}
	s->capturing = false;
	if (s->plan->gpu) { /* before plan_idle: the plan's GPU side lives while busy */
		save_fence_release(s);
		capture_next(a, s);
	}
	plan_idle(a, s->plan);
	pthread_mutex_unlock(&a->mu);
	stream_stage_done(s);
}

/* save.image: its shard's bytes from its plan's memory, stamped as its own. */
static int save_image(const struct save *s, uint64_t off, void *dst, uint64_t len, char *err)
{
	return plan_queue_image(s->plan, s->lay, &s->stamp, off, dst, len, err);
}

/*
 * Under mu (save.ended): its pipeline has stopped. A failure fails its
 * checkpoint; durable, the save is DURABLE; its checkpoint hears either,
 * then that it stopped.
 */
static void save_ended(struct agent *a, struct save *s, bool durable, const char *failure)
{
	if (failure) {
		save_fail(a, s, failure);
	} else if (durable && s->state == SAVE_CAPTURED) {
		save_set_state(a, s, SAVE_DURABLE, NULL);
		s->tell(a, s, SAVE_NEWS_DURABLE, NULL);
	}
	s->tell(a, s, SAVE_NEWS_STOPPED, NULL);
}

/* ---- a new save ------------------------------------------------------- */

struct save *save_new(struct agent *a, struct plan *p, int64_t step)
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
	s->ended = save_ended;
	s->image = save_image;
	s->root_again = root_after_failure;
	s->plan = p;
	plan_get(p);
	snprintf(s->job, sizeof(s->job), "%s", p->job);
	s->rank = p->rank;
	s->world = p->world;
	s->bytes_total = lay->shard_bytes;
	s->sess = p->sess;
	s->step = step;
	/* its header's, its part's: a number no other save draws (0 means none) */
	s->stamp = (struct st_stamp){step, ipc_random_id() ?: (uint64_t)ipc_mono_ns() | 1};
	s->state = SAVE_QUEUED;
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
	a->inflight++;
	list_add_tail(&a->saves, &s->link);
	return s;
}
