/*
 * Verify (`ckptctl verify JOB STEP`): the request checked and its caller's
 * right to read the job, the verify asked of the node (node/verify.c:
 * verify_request), and the reply built from what it found.
 *
 * Threads: the handler runs on the control thread and only checks and
 * queues; the answer is sent from the reader (or maint) thread.
 */
#include <errno.h>

#include "agent/node/node.h"
#include "agent/node/verify.h"
#include "agent/rpc/access.h"
#include "agent/rpc/handlers.h"
#include "agent/rpc/server.h"

static void verify_answer(void *ctx, int rc, const char *why, const struct verify_outcome *o)
{
	struct rpc *c = ctx;
	Ckpt__V1__VerifyReply rep = CKPT__V1__VERIFY_REPLY__INIT;

	if (rc) {
		rpc_fail(c, rc, "%s", why);
		return;
	}
	rep.ok = o->ok;
	rep.bytes_checked = o->bytes;
	rep.tensors_checked = o->tensors;
	rep.n_problems = o->nproblems;
	rep.problems = o->problems;
	rep.more_problems = o->nmore;
	rpc_reply(c, &rep.base);
}

void rpc_verify(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__VerifyRequest *req = (Ckpt__V1__VerifyRequest *)m;
	struct agent *a = ctx;
	char err[IPC_ERRLEN];
	int rc;

	if (!access_check_job_step(a, c, "verify", req->job, &req->step, ACCESS_READ))
		goto out;
	rc = verify_request(a, req->job, req->step, req->tier, verify_answer, c, err);
	if (rc == -ENOMEM)
		rpc_fail(c, rc, "%s", err);
	else if (rc)
		rpc_fail(c, rc, "verify: %s", err);
out:
	protobuf_c_message_free_unpacked(m, NULL);
}
