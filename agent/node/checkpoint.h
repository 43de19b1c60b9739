/*
 * agent/node/checkpoint.h: checkpoints in flight (checkpoint.c): this
 * node's ranks durable, its part, the many-nodes commit, the end.
 *
 * Locks: every field under agent.mu, but `commit`, the commit thread's
 * alone; `committing` says the commit job owns the outcome.
 */
#ifndef CKPT_AGENT_NODE_CHECKPOINT_H
#define CKPT_AGENT_NODE_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>

#include "agent/node/node.h"
#include "agent/node/plan.h"
#include "commit/commit.h"

struct save;

struct checkpoint {
	struct list link;
	struct agent *a;
	char job[IPC_MAX_JOB + 1];
	char run[IPC_MAX_JOB + 1];
	int64_t step;
	int world;
	struct save **rank; /* [world], NULL until that rank saves here */
	unsigned nsaved, ndurable, nrunning; /* of this node's ranks */
	enum save_state state; /* QUEUED (in flight), COMMITTED, FAILED */
	char reason[IPC_ERRLEN];
	struct work work; /* the commit thread's: part, polls, clean-up */
	int64_t t_first; /* monotonic ns of the first rank's save here */
	/*
	 * The commit job is queued, waiting for its time or running: it decides
	 * the checkpoint's end (a failure meanwhile is noted in `abort`).
	 */
	bool committing;
	bool part_built; /* this node's part is made: no save of this step joins it now */
	bool part_written; /* this node's part is in the root: a manifest may name its files */
	int64_t backoff; /* before the part: the wait for every rank to be claimed */
	bool cleaning, cleaned; /* failed: removal of this node's files queued, done */
	/*
	 * Failed, and none of its missing ranks is waited for any more (a newer
	 * step committed, its deadline passed, or a rank saves the step again):
	 * cp_get passes it over; let go once nothing of it runs.
	 */
	bool retired;
	/*
	 * The step was committed, and damaged (the catalog said so): this
	 * save replaces it, its manifest retired by the commit thread before
	 * this node's part (store_retire_manifest).
	 */
	bool replaces_damaged;
	char abort[IPC_ERRLEN]; /* why to stop committing ("" while it goes on) */
	struct commit *commit; /* the commit thread's alone */
	/* the last poll's view, for list, status and watch */
	char **parts_done, **parts_missing;
	size_t nparts_done, nparts_missing;
};

/* Under mu: the checkpoint (job, step, run), created if new. */
int cp_get(struct agent *a, const char *job, int64_t step, int world, const char *run,
           struct checkpoint **out, char *err);
/* Under mu: a rank is DURABLE; once all of this node's are, the commit starts. */
void cp_rank_durable(struct agent *a, struct checkpoint *cp);
/* Under mu: s, just made, is its rank's save of cp; it tells cp what befalls it (save.tell). */
void cp_join(struct agent *a, struct checkpoint *cp, struct save *s);

/*
 * Under mu (a hub_plan_fn): a plan dropped: its saves not CAPTURED yet fail
 * (they lose their source), and so do the steps in flight its rank had not
 * saved.
 */
void cp_on_plan(struct agent *a, struct plan *p, bool dropped);
/* Under mu: the checkpoint fails; every rank's save with it. */
void cp_fail(struct agent *a, struct checkpoint *cp, const char *reason);
/*
 * Under mu: the plan of (job, run, rank) is gone: steps still missing that
 * rank cannot commit; failed ones waiting for it need not wait.
 */
void cp_rank_gone(struct agent *a, const char *job, const char *run, int rank);
/*
 * Under mu: fails steps that have waited for missing ranks longer than the
 * timeout; failed ones past it wait for no rank any more (let go once idle).
 */
void cp_expire(struct agent *a, int64_t now_mono);
/* Under mu: whether any checkpoint still has I/O running or queued work. */
bool cp_any_busy(struct agent *a);
/* Under mu: a rank's pipeline has stopped (success or not). */
void cp_rank_stopped(struct agent *a, struct checkpoint *cp);
/* Under mu: drop checkpoints that are finished and unreferenced. */
void cp_release(struct agent *a, struct checkpoint *cp);
/* At exit: frees a checkpoint whatever its state. */
void cp_free(struct agent *a, struct checkpoint *cp);

#endif /* CKPT_AGENT_NODE_CHECKPOINT_H */
