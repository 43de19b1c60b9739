/*
 * The save RPCs: Save (checks, the step's checkpoint found or made, the
 * save admitted under the skip policy or refused, then QUEUED and its
 * capture queued; a run's first save may be parked until every rank's plan
 * is known: layouts.c, at most --plans-wait; node/park.c holds it, and
 * save_unpark refuses it if its call's deadline passed meanwhile, else
 * admits it) and GetSave. The save itself, once made, is save.c's; its
 * checkpoint, checkpoint.c's.
 *
 * Control thread; a parked save is admitted on the commit thread or the
 * tick's, under agent.mu.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/pipe/stream.h"
#include "agent/node/checkpoint.h"
#include "agent/node/catalog.h"
#include "agent/rpc/handlers.h"
#include "agent/rpc/ops.h"
#include "agent/rpc/server.h"
#include "agent/node/park.h"
#include "agent/node/publish.h"
#include "agent/rpc/access.h"
#include "ipc/base/log.h"

/*
 * Under mu: a save of cp's step by this rank, whose earlier one ended in a
 * failed checkpoint: the step starts anew (a new attempt, in a file of its
 * own; the failed one's files go with it). Not where this node's part was
 * written: a commit elsewhere may still use that attempt.
 */
static bool retry_of_failed(const struct checkpoint *cp, int rank)
{
	const struct save *s = cp->rank[rank];

	return s && cp->state == SAVE_FAILED && !cp->part_built &&
	       (s->state == SAVE_FAILED || s->state == SAVE_SKIPPED);
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
/* Under mu: why p may not save now (0: it may). Before cp_get: a refusal leaves nothing behind. */
static int plan_refuses(const struct plan *p, const Ckpt__V1__SaveRequest *req, char *err)
{
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
	return 0;
}

/*
 * Under mu: the checkpoint of the step p's rank saves (a failed attempt of
 * it that this rank retries passed over for a new one), where it can take
 * that rank's save.
 */
static int step_of(struct agent *a, const struct plan *p, int64_t step, struct checkpoint **out,
                   char *err)
{
	struct checkpoint *cp;
	int rc = cp_get(a, p->job, step, p->world, p->run, &cp, err);

	if (!rc && retry_of_failed(cp, p->rank)) {
		cp->retired = true; /* passed over from now on, let go once its files are gone */
		cp_release(a, cp);
		rc = cp_get(a, p->job, step, p->world, p->run, &cp, err);
	}
	if (rc)
		return rc;
	if (cp->rank[p->rank])
		return ipc_errf(err, -EEXIST, "job %s step %lld rank %d is already saved (%s)",
		                p->job, (long long)step, p->rank,
		                ipc_state_name(cp->rank[p->rank]->state));
	if (cp->part_built)
		return ipc_errf(
		    err, -EALREADY,
		    "job %s step %lld: node %s's part of it was written without rank %d "
		    "(its plan came after the step's other saves here): this step "
		    "cannot take it",
		    p->job, (long long)step, a->cfg.node, p->rank);
	*out = cp;
	return 0;
}

/*
 * Under mu: s, QUEUED in its checkpoint cp, born FAILED (cp failed before),
 * SKIPPED (no room under the skip policy), or running: its capture queued.
 */
static void save_go(struct agent *a, struct plan *p, struct checkpoint *cp, struct save *s)
{
	if (cp->state == SAVE_FAILED) {
		char why[IPC_ERRLEN + 64];

		snprintf(why, sizeof(why), "checkpoint %s step %lld failed: %s", cp->job,
		         (long long)cp->step, cp->reason);
		atomic_store(&s->abort, true);
		save_set_state(a, s, SAVE_FAILED, why);
		return; /* the caller answers, then lets the checkpoint go */
	}
	if (p->backpressure == BACKPRESSURE_SKIP && !pool_may_admit(a->pool, cp, s->want)) {
		atomic_store(&s->abort, true);
		save_set_state(a, s, SAVE_SKIPPED, SAVE_SKIP_REASON);
		cp_fail(a, cp, "a rank was SKIPPED (staging pool full)");
		return;
	}
	/* Running: the capture stage holds the plan's regions until CAPTURED. */
	atomic_store(&s->stages, 1);
	cp->nrunning++;
	plan_busy(p);
	capture_queue(a, s);
}

static int save_start(struct agent *a, struct rpc *c, const Ckpt__V1__SaveRequest *req,
                      struct save **out, char *err)
{
	struct checkpoint *cp = NULL;
	struct plan *p;
	struct save *s;
	bool replaces;
	int rc;

	p = plan_of(a, rpc_peer(c)->uid, req->plan_id);
	if (!p)
		return ipc_errf(err, -ENOENT, "no plan %llu (destroyed, or the agent restarted)",
		                (unsigned long long)req->plan_id);
	if (a->stopping)
		return ipc_errf(err, -EAGAIN, "the agent is stopping");
	if ((rc = committed_before(a, p, req->step, &replaces, err)) ||
	    (rc = plan_refuses(p, req, err)) || (rc = step_of(a, p, req->step, &cp, err)))
		return rc;
	s = save_new(a, p, req->step);
	if (!s) {
		if (cp->nsaved == 0) /* new and empty: nobody else knows it */
			cp_free(a, cp);
		return ipc_errf(err, -ENOMEM, "out of memory");
	}
	cp_join(a, cp, s);
	/* QUEUED: the client learns it from the reply; watchers from the hub */
	hub_save_new(&a->hub, a, s, s->state);
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
	save_go(a, p, cp, s);
	return 0;
}

/* Under mu: a checked SaveRequest admitted (or refused) and answered; m freed. */
static void save_admit(struct agent *a, struct rpc *c, ProtobufCMessage *m)
{
	Ckpt__V1__SaveRequest *req = (Ckpt__V1__SaveRequest *)m;
	Ckpt__V1__SaveReply rep = CKPT__V1__SAVE_REPLY__INIT;
	char err[IPC_ERRLEN];
	struct save *s = NULL;
	int rc;

	rc = save_start(a, c, req, &s, err);
	if (!rc) {
		rep.save_id = s->id;
		rep.state = (Ckpt__V1__State)s->state; /* the same numbers (ipc/wire.c) */
		rep.reason = s->reason;
		rep.fence_seq = s->fence_seq;
		/* the reply is packed now, under the lock: s may change right after */
		rpc_reply(c, &rep.base);
		/* born failed (its checkpoint had failed): nothing will run for it */
		if (s->state == SAVE_FAILED && s->cp && !atomic_load(&s->stages))
			cp_release(a, s->cp);
	} else {
		rpc_fail(c, rc, "save: %s", err);
	}
	protobuf_c_message_free_unpacked(m, NULL);
}

/*
 * Under mu: a parked save goes on (park.c): refused where its call's deadline
 * passed meanwhile (its trainer went on: its memory changes), else admitted.
 */
static void save_unpark(struct agent *a, void *call, void *req)
{
	struct rpc *c = call;

	if (rpc_deadline_passed(c)) {
		rpc_fail(c, -ETIMEDOUT,
		         "save: the call's deadline passed while it waited for the plans of "
		         "every rank (--plans-wait): not saved");
		protobuf_c_message_free_unpacked(req, NULL);
	} else {
		save_admit(a, c, req); /* a plan gone, a stop: refused there */
	}
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
	p = plan_of(a, rpc_peer(c)->uid, req->plan_id);
	if (!p || a->stopping || !park_save(a, p, req->step, c, m, save_unpark))
		save_admit(a, c, m);
	else /* and the root looked at until its plan set is there */
		plans_publish(a, p->job, p->run);
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
