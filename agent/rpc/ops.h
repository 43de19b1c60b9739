/*
 * agent/rpc/ops.h: operations on committed steps (ops.c, show.c): status,
 * list, show, delete and watch; a step's summary; a call handed to a
 * worker.
 *
 * Locks: as each call says; a job_step_op is its worker's alone.
 */
#ifndef CKPT_AGENT_RPC_OPS_H
#define CKPT_AGENT_RPC_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "agent/node/catalog.h"
#include "agent/node/save.h"
#include "agent/rpc/access.h"
#include "ipc/ipc.h"

struct rpc;

/* Under mu: a save as the protocol gives it (strings point into s). */
void save_info(struct save *s, Ckpt__V1__SaveInfo *info);
/* A committed step's summary, as list and show give it (pointers into e). */
void ops_summary(const struct cat_entry *e, bool latest, Ckpt__V1__CheckpointSummary *s);

/* A call about one step of a job, handed to a worker (show, delete). */
struct job_step_op {
	struct work work;
	struct agent *a;
	struct rpc *call;
	char job[IPC_MAX_JOB + 1];
	int64_t step;
	struct storage *store; /* show: the root or the upload tier */
	bool tier; /* the upload tier: the root's catalog says nothing of it */
	bool brief; /* show: the summary only */
};

#define OPS_STREAM 1u /* the call is held open (rpc_stream_hold) for fn, which ends it */
#define OPS_BRIEF 2u /* job_step_op.brief */
/*
 * Checks job, step, tier and access (a refusal answers the call), then
 * queues fn on q with a new job_step_op (flags: OPS_*), which fn frees.
 * 0 or negative errno.
 */
int ops_queue_job_step(struct rpc *c, struct agent *a, const char *what, const char *job,
                       int64_t step, const char *tier, enum access_want want,
                       void (*fn)(struct work *), struct workq *q, unsigned flags);

/* A step's parts, "n0 (ranks 0,1)" for each part m merged: malloc'd array of m->nparts (NULL: no
 * memory). */
char **parts_text(const struct manifest *m);

/* Under mu (a hub_save_fn): sends a save's new state to the watchers of its job. */
void watchers_on_save(struct agent *a, struct save *s, enum save_state state);
/* Under mu: sends watchers the bytes moved by every save in flight (progress = true). */
void watchers_progress(struct agent *a);
/* Under mu: tells only the watchers where s is (a new save's QUEUED: its client has the reply). */
void watchers_tell(struct agent *a, struct save *s, bool progress);

#endif /* CKPT_AGENT_RPC_OPS_H */
