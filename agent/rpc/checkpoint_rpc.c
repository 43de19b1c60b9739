/*
 * `ckptctl commit --finish` (rpc_commit): a step's commit finished by hand
 * on the commit thread, which alone touches the committer; and the parts
 * of a manifest as text, for it and show.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/node/node.h"
#include "agent/rpc/access.h"
#include "agent/node/catalog.h"
#include "agent/rpc/ops.h"
#include "agent/rpc/handlers.h"
#include "agent/rpc/server.h"
#include "commit/commit.h"
#include "ipc/base/log.h"

struct finish_op {
	struct work work;
	struct agent *a;
	struct rpc *call;
	char job[IPC_MAX_JOB + 1];
	int64_t step;
};

char **parts_text(const struct manifest *m)
{
	char **v = calloc(m->nparts + 1, sizeof(*v)), text[IPC_MAX_JOB + 160];

	for (size_t i = 0; v && i < m->nparts; i++) {
		part_node_text(m->parts[i].node, m->parts[i].ranks, m->parts[i].nranks, text,
		               sizeof(text));
		v[i] = strdup(text);
	}
	return v;
}

static void finish_run(struct work *w)
{
	struct finish_op *op = container_of(w, struct finish_op, work);
	Ckpt__V1__CommitReply rep = CKPT__V1__COMMIT_REPLY__INIT;
	struct agent *a = op->a;
	struct commit_result r;
	char err[IPC_ERRLEN], **parts;
	struct cat_entry ce;
	bool already;
	int rc;

	rc = commit_finish(a->cm, op->job, op->step, &r, &already, err);
	if (rc) {
		rpc_fail(op->call, rc, "commit --finish: %s", err);
		goto out;
	}
	catalog_entry_from_manifest(r.manifest, &ce);
	pthread_mutex_lock(&a->mu);
	if (!catalog_find(a->cat, op->job, op->step))
		catalog_add(a->cat, &ce);
	pthread_mutex_unlock(&a->mu);
	log_msg(LOG_NOTICE, "commit --finish of job %s step %lld: %s", op->job, (long long)op->step,
	        already ? "already committed" : "committed");
	parts = parts_text(r.manifest);
	rep.already = already;
	rep.run = r.manifest->run;
	rep.world = r.manifest->world;
	rep.bytes = r.manifest->bytes;
	rep.n_parts = parts ? r.manifest->nparts : 0;
	rep.parts = parts;
	rpc_reply(op->call, &rep.base);
	for (size_t i = 0; parts && i < r.manifest->nparts; i++)
		free(parts[i]);
	free(parts);
out:
	commit_result_free(&r);
	free(op);
}

void rpc_commit(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__CommitRequest *req = (Ckpt__V1__CommitRequest *)m;
	struct agent *a = ctx;
	struct finish_op *op;

	if (!access_check_job_step(a, c, "commit", req->job, &req->step, ACCESS_OWN))
		goto out;
	op = calloc(1, sizeof(*op));
	if (!op) {
		rpc_fail(c, -ENOMEM, "commit: out of memory");
		goto out;
	}
	op->a = a;
	op->call = c;
	snprintf(op->job, sizeof(op->job), "%s", req->job);
	op->step = req->step;
	op->work.fn = finish_run;
	workq_push(a->commit, &op->work); /* the committer is the commit thread's */
out:
	protobuf_c_message_free_unpacked(m, NULL);
}
