/*
 * agent/node/verify.h: a committed step read back whole and checked
 * (verify.c), asked for by the edge (rpc/verify_rpc.c), which hears the
 * end through the function it gave.
 *
 * Locks: verify_request takes agent.mu itself; the end is told on a reader
 * (or the maint) thread, agent.mu not held.
 */
#ifndef CKPT_AGENT_NODE_VERIFY_H
#define CKPT_AGENT_NODE_VERIFY_H

#include <stdbool.h>
#include <stdint.h>

#include "agent/node/node.h"

/* What a verify found, for whoever asked. */
struct verify_outcome {
	bool ok;
	uint64_t bytes; /* checked */
	uint32_t tensors; /* checked */
	char **problems; /* each names the tensor and the file: at most READER_MAX_PROBLEMS */
	size_t nproblems;
	uint64_t nmore; /* problems past those listed: counted, not kept */
};

/*
 * A verify ended: rc 0 and what it found, or rc < 0 and the whole message (o
 * NULL). agent.mu not held.
 */
typedef void (*verify_done_fn)(void *ctx, int rc, const char *why, const struct verify_outcome *o);

/*
 * Not under mu: a verify of (job, step) on tier ("" or "root": the root;
 * "upload": the upload tier) queued, then done(ctx, ...): 0; -ENOMEM
 * (nothing queued, "out of memory" in err); or -errno with why in err (done
 * not called).
 * The job and step are checked by the caller, and who may read it.
 */
int verify_request(struct agent *a, const char *job, int64_t step, const char *tier,
                   verify_done_fn done, void *ctx, char *err);

#endif /* CKPT_AGENT_NODE_VERIFY_H */
