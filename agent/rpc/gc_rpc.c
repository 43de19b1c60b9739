/*
 * Gc and Pin (`ckptctl gc JOB`, `ckptctl pin|unpin JOB STEP`): the request
 * checked and its caller's right to manage the job, the work asked of the
 * node (node/gc.c: gc_request, pin_request), and the answer built from
 * what it did.
 *
 * Threads: the handlers run on the control thread and only check and
 * queue; the answers are sent from the maint thread, where the work ran.
 */
#include <errno.h>
#include <stdlib.h>

#include "agent/node/gc.h"
#include "agent/node/node.h"
#include "agent/rpc/access.h"
#include "agent/rpc/handlers.h"
#include "agent/rpc/server.h"

static void gc_answer(void *ctx, int rc, const char *why, const struct gc_outcome *o)
{
	struct rpc *c = ctx;
	Ckpt__V1__GcReply rep = CKPT__V1__GC_REPLY__INIT;
	Ckpt__V1__GcKept *kept, **pk;
	char(*reason)[64];
	size_t k = 0;

	if (rc) {
		rpc_fail(c, rc, "%s", why);
		return;
	}
	kept = calloc(o->n ? o->n : 1, sizeof(*kept));
	pk = calloc(o->n ? o->n : 1, sizeof(*pk));
	reason = calloc(o->n ? o->n : 1, sizeof(*reason));
	if (!kept || !pk || !reason) {
		rpc_fail(c, -ENOMEM, "gc %s: out of memory for the reply (the GC ran)", o->job);
		goto out;
	}
	for (size_t i = 0; i < o->n; i++) {
		if (o->v[i].why == RET_REMOVE)
			continue;
		ckpt__v1__gc_kept__init(&kept[k]);
		kept[k].step = o->v[i].step;
		kept[k].reason =
		    (char *)retention_why(o->v[i].why, o->pol, reason[k], sizeof(reason[k]));
		pk[k] = &kept[k];
		k++;
	}
	rep.n_removed = o->nremoved;
	rep.removed = (int64_t *)o->removed;
	rep.n_kept = k;
	rep.kept = pk;
	rep.bytes_removed = o->bytes;
	rep.keep_last = o->pol->keep_last;
	rep.keep_every = o->pol->keep_every;
	rep.n_problems = o->nproblems;
	rep.problems = (char **)o->problems;
	rpc_reply(c, &rep.base);
out:
	free(kept);
	free(pk);
	free(reason);
}

void rpc_gc(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__GcRequest *req = (Ckpt__V1__GcRequest *)m;
	struct agent *a = ctx;

	if (access_check_job_step(a, c, "gc", req->job, NULL, ACCESS_MANAGE) &&
	    gc_request(a, req->job, gc_answer, c))
		rpc_fail(c, -ENOMEM, "gc: out of memory");
	protobuf_c_message_free_unpacked(m, NULL);
}

static void pin_answer(void *ctx, int rc, const char *why)
{
	struct rpc *c = ctx;
	Ckpt__V1__Empty rep = CKPT__V1__EMPTY__INIT;

	if (rc)
		rpc_fail(c, rc, "%s", why);
	else
		rpc_reply(c, &rep.base);
}

void rpc_pin(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__PinRequest *req = (Ckpt__V1__PinRequest *)m;
	const char *what = req->pinned ? "pin" : "unpin";
	struct agent *a = ctx;

	if (access_check_job_step(a, c, what, req->job, &req->step, ACCESS_MANAGE) &&
	    pin_request(a, req->job, req->step, req->pinned, pin_answer, c))
		rpc_fail(c, -ENOMEM, "%s: out of memory", what);
	protobuf_c_message_free_unpacked(m, NULL);
}
