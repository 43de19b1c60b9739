/*
 * agent/node/restore.h: a plan's memory restored from a committed step
 * (restore.c), asked for by the edge (rpc/restore_rpc.c), which hears the
 * end through the function it gave.
 *
 * Locks: restore_request takes agent.mu itself; the end is told on the
 * capture worker, agent.mu not held.
 */
#ifndef CKPT_AGENT_NODE_RESTORE_H
#define CKPT_AGENT_NODE_RESTORE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent/node/node.h"

/* What is asked: uid's plan, a step (-1: the newest), how far LATEST falls back. */
struct restore_req {
	uint64_t plan_id;
	uid_t uid;
	int64_t step;
	bool strict; /* with LATEST: the newest step, or its error */
	bool fallback; /* with LATEST: past any failure but a plan that does not match */
};

/* How a restore ended, for whoever asked (also on a failure: which job, step, rank). */
struct restore_outcome {
	const char *job;
	int rank;
	int64_t step; /* the step restored, or the last one tried */
	const char *meta; /* the step's metadata (JSON), "" if none */
	uint64_t bytes; /* the plan's bytes restored */
	char *const *skipped; /* newer steps passed over, and why */
	size_t nskipped;
};

/*
 * Capture worker, agent.mu not held: a restore ended: rc 0, or -errno with
 * why (the whole reason, without the job, step and rank in o).
 */
typedef void (*restore_done_fn)(void *ctx, int rc, const char *why,
                                const struct restore_outcome *o);

/*
 * Not under mu: the restore checked (plan, step) and queued on a capture
 * worker, then done(ctx, ...): 0; -ENOMEM (nothing queued, "out of memory"
 * in err); or -errno with why in err (done not called).
 */
int restore_request(struct agent *a, const struct restore_req *req, restore_done_fn done, void *ctx,
                    char *err);

#endif /* CKPT_AGENT_NODE_RESTORE_H */
