/*
 * Restore: the request made a node/restore.c request (uid's plan, the
 * step, how far LATEST falls back), and the reply built from how it ended.
 *
 * Threads: the handler runs on the control thread and only checks and
 * queues; the answer is sent from the capture worker that restored.
 */
#include <errno.h>

#include "agent/node/node.h"
#include "agent/node/restore.h"
#include "agent/rpc/handlers.h"
#include "agent/rpc/server.h"

static void restore_answer(void *ctx, int rc, const char *why, const struct restore_outcome *o)
{
	struct rpc *c = ctx;
	Ckpt__V1__RestoreReply rep = CKPT__V1__RESTORE_REPLY__INIT;

	if (rc) {
		rpc_fail(c, rc, "restore of job %s step %lld rank %d: %s", o->job,
		         (long long)o->step, o->rank, why);
		return;
	}
	rep.step = o->step;
	rep.meta_json = (char *)o->meta;
	rep.bytes = o->bytes;
	rep.n_skipped = o->nskipped;
	rep.skipped = (char **)o->skipped;
	rpc_reply(c, &rep.base);
}

void rpc_restore(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__RestoreRequest *req = (Ckpt__V1__RestoreRequest *)m;
	struct restore_req rq = {
	    .plan_id = req->plan_id,
	    .uid = rpc_peer(c)->uid,
	    .step = req->step,
	    .strict = req->strict,
	    .fallback = req->fallback,
	};
	struct agent *a = ctx;
	char err[IPC_ERRLEN];
	int rc = restore_request(a, &rq, restore_answer, c, err);

	if (rc == -ENOMEM)
		rpc_fail(c, rc, "%s", err);
	else if (rc)
		rpc_fail(c, rc, "restore: %s", err);
	protobuf_c_message_free_unpacked(m, NULL);
}
