/*
 * Show: what a committed step is, at any size. Three answers:
 *   - brief (Show with brief): the summary and its counts, a few hundred
 *     bytes however many chunks the step has;
 *   - whole (Show as older clients ask it): the summary and the manifest's
 *     JSON in one reply, refused with IPC_TOO_LARGE's words when that
 *     passes the message limit (a step of millions of chunks);
 *   - streamed (ShowDetail): the summary, then the JSON in pieces of
 *     SHOW_PIECE bytes, at most SHOW_WINDOW of them queued at once.
 *
 * Threads: the RPCs on the control thread check and queue; the reading and
 * the sending run on a reader thread (it only reads). It marks nothing as
 * read (it reads one file, the manifest): a GC or delete meanwhile is as if
 * it came just before or just after. Cost: one manifest read per call,
 * whatever the node count; the JSON is as large as the manifest.
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
#include "storage/store.h"

#define SHOW_PIECE (1u << 20) /* JSON bytes a ShowDetail message carries */
#define SHOW_WINDOW (4u << 20) /* bytes queued for the client, at most (and a piece) */
#define SHOW_STALL_MS 60000 /* a client that reads nothing this long is let go */

/* What a show read: the manifest, and the reply's parts that point into it. */
struct show {
	struct manifest *m;
	Ckpt__V1__CheckpointSummary sum;
	Ckpt__V1__ShowReply rep;
	struct cat_entry e;
	char **parts;
	char *json; /* not brief: the manifest as JSON */
	size_t len;
};

static void show_free(struct show *s)
{
	for (size_t i = 0; s->parts && i < s->m->nparts; i++)
		free(s->parts[i]);
	free(s->parts);
	free(s->json);
	manifest_free(s->m);
}

/* Reads op's step into s: 0, or negative errno with err said. */
static int show_read(struct job_step_op *op, bool json, struct show *s, char *err)
{
	struct agent *a = op->a;
	struct cat_entry *newest, *listed;
	int rc;

	memset(s, 0, sizeof(*s));
	ckpt__v1__show_reply__init(&s->rep);
	rc = store_read_manifest(op->store, op->job, op->step, &s->m, err);
	if (rc == -EINVAL || rc == -EFBIG) /* there, and unreadable: damaged, not absent */
		rc = -EBADMSG;
	if (!rc && json)
		rc = manifest_to_json(s->m, &s->json, &s->len, err);
	if (rc)
		return rc;
	catalog_entry_from_manifest(s->m, &s->e);
	pthread_mutex_lock(&a->mu);
	listed = op->tier ? NULL : catalog_find(a->cat, op->job, op->step);
	s->e.pinned = listed && listed->pinned;
	if (listed) /* what a restore or verify found of it */
		snprintf(s->e.damage, sizeof(s->e.damage), "%s", listed->damage);
	newest = op->tier ? NULL : catalog_newest_whole(a->cat, op->job, INT64_MAX);
	ops_summary(&s->e, newest && newest->step == op->step, &s->sum);
	pthread_mutex_unlock(&a->mu);
	s->parts = parts_text(s->m);
	s->sum.n_parts = s->parts ? s->m->nparts : 0;
	s->sum.parts = s->parts;
	s->rep.summary = &s->sum;
	s->rep.manifest_json = s->json;
	s->rep.ranks = (uint32_t)s->m->nranks;
	for (size_t i = 0; i < s->m->ntensors; i++)
		s->rep.chunks += s->m->tensors[i].nchunks;
	s->rep.meta_bytes = s->m->meta_json ? strlen(s->m->meta_json) : 0;
	return 0;
}

/* Reader thread: Show, brief or whole. */
static void show_run(struct work *w)
{
	struct job_step_op *op = container_of(w, struct job_step_op, work);
	char err[IPC_ERRLEN];
	struct show s;
	size_t size;
	int rc;

	rc = show_read(op, !op->brief, &s, err);
	if (rc) {
		rpc_fail(op->call, rc, "show %s %lld: %s", op->job, (long long)op->step, err);
		goto out_free;
	}
	size = protobuf_c_message_get_packed_size(&s.rep.base);
	if (size > IPC_MAX_MESSAGE) {
		/* what gRPC would say, and what to do: a retry cannot help */
		rpc_fail(op->call, -EMSGSIZE,
		         "show %s %lld: its manifest (%zu bytes of JSON) makes a reply that would "
		         "be a " IPC_TOO_LARGE " (%zu vs. %u bytes): ckptctl show prints its "
		         "summary, ckptctl show --full streams every tensor (ShowDetail)",
		         op->job, (long long)op->step, s.len, size, IPC_MAX_MESSAGE);
		goto out_free;
	}
	rpc_reply(op->call, &s.rep.base);
out_free:
	show_free(&s);
	free(op);
}

/* Reader thread: ShowDetail, the manifest streamed. The call is held; ended here. */
static void show_detail_run(struct work *w)
{
	struct job_step_op *op = container_of(w, struct job_step_op, work);
	Ckpt__V1__ShowPiece p;
	char err[IPC_ERRLEN];
	struct show s;
	size_t off = 0, n;
	int rc;

	rc = show_read(op, true, &s, err);
	if (rc) {
		char msg[IPC_ERRLEN + 128];

		snprintf(msg, sizeof(msg), "show %s %lld: %s", op->job, (long long)op->step, err);
		rpc_stream_end(op->call, rc, msg);
		goto out_free;
	}
	s.rep.manifest_json = ""; /* the pieces carry it */
	do {
		ckpt__v1__show_piece__init(&p);
		if (off == 0) {
			p.head = &s.rep;
			p.manifest_bytes = s.len;
		}
		n = s.len - off < SHOW_PIECE ? s.len - off : SHOW_PIECE;
		p.manifest_json.data = (uint8_t *)s.json + off;
		p.manifest_json.len = n;
		rc = rpc_stream_send_wait(op->call, &p.base, SHOW_WINDOW, SHOW_STALL_MS);
		off += n;
	} while (!rc && off < s.len);
	if (rc == -ETIMEDOUT)
		rpc_stream_end(op->call, rc,
		               "show: the client read nothing for 60 s: the rest of the manifest "
		               "is not sent (show again)");
	else /* sent, or the client left (-EPIPE): then this only lets go */
		rpc_stream_end(op->call, rc == -EPIPE ? 0 : rc,
		               rc ? "show: out of memory sending the manifest" : NULL);
out_free:
	show_free(&s);
	free(op);
}

void rpc_show(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__ShowRequest *req = (Ckpt__V1__ShowRequest *)m;
	struct agent *a = ctx;

	ops_queue_job_step(c, a, "show", req->job, req->step, req->tier, ACCESS_READ, show_run,
	                   a->readers, req->brief ? OPS_BRIEF : 0);
	protobuf_c_message_free_unpacked(m, NULL);
}

void rpc_show_detail(struct rpc *c, ProtobufCMessage *m, void *ctx)
{
	Ckpt__V1__ShowRequest *req = (Ckpt__V1__ShowRequest *)m;
	struct agent *a = ctx;

	ops_queue_job_step(c, a, "show", req->job, req->step, req->tier, ACCESS_READ,
	                   show_detail_run, a->readers, OPS_STREAM);
	protobuf_c_message_free_unpacked(m, NULL);
}
