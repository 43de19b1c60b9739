/*
 * commit: one checkpoint across every node of a job, committed through the
 * shared storage alone (docs/DESIGN.md §7.1–7.2). No agent talks to another: each
 * publishes its plans, writes its part once all its ranks of a step are
 * durable, and then either commits (the agent hosting rank 0, or any agent
 * once half the deadline has passed) or watches for the manifest.
 *
 *   plans, once   plans/<node>.json names which ranks of which run each
 *                 node serves; from them every agent learns the same roster
 *   part          step-.../parts/<node>.json, create-once
 *   commit        the expected parts, read by exact name with back-off
 *                 (20 ms doubling to 500 ms), checked (one run, each rank
 *                 once, every shard there at its size), merged
 *                 deterministically, manifest.json written create-once,
 *                 then LATEST moved forward; a racing writer's bytes are
 *                 the same, and the loser's EEXIST is success
 *   deadline      parts still missing: FAILED, naming the nodes and ranks;
 *                 nothing is written
 *
 * The state machine knows nothing of the agent nor of the kind of storage:
 * it calls the backend interface (storage.h, store.h) and is given the
 * time, so tests drive it with a fake backend and a fake clock.
 *
 * Threads: a committer and its steps belong to one thread (the agent's
 * commit thread); they take no lock. Calls block on storage I/O.
 */
#ifndef CKPT_COMMIT_H
#define CKPT_COMMIT_H

#include <stdbool.h>
#include <stdint.h>

#include "storage/store.h"

#define COMMIT_BACKOFF_FIRST_NS (20LL * 1000000)
#define COMMIT_BACKOFF_MAX_NS (500LL * 1000000)
#define COMMIT_WATCH_MAX_NS (200LL * 1000000) /* a node that watches for the manifest */
/*
 * Requests in flight while the committer reads the others' summaries (or
 * parts) and checks their files: one summary and two requests per rank's
 * file (open, its first 4 KiB) per node, ~17 per node of 8 ranks, so
 * 69,632 at 4,096 nodes; at 10 ms a request, 128 in flight make that ~5.4 s.
 */
#define COMMIT_READ_WIDTH 128u

struct committer;
struct commit;

struct commit_opts {
	struct storage *store;
	const char *node; /* this node's name */
	int64_t deadline_ns; /* a step's parts must all be in by then (from this node's) */
	/*
	 * The storage's create-once is not atomic (an object store that ignores
	 * If-None-Match): only the node hosting rank 0 writes manifests; the
	 * others never take over (a `ckptctl commit --finish` still may).
	 */
	bool single_writer;
};

int committer_create(const struct commit_opts *o, struct committer **out, char *err);
void committer_destroy(struct committer *cm);

struct assigned; /* commit/shares.h */
/*
 * The dedup assignment this node made for a run (the node of rank 0 does):
 * a step's parts whose ranks wrote less than they hold are checked by it
 * (assigned_covers) in place of read whole and merged for the cover check.
 * Takes x, replacing the one of its job. Commit thread.
 */
void committer_assigned(struct committer *cm, struct assigned *x);

enum commit_state {
	COMMIT_WAITING, /* call commit_poll again at *next */
	COMMIT_COMMITTED, /* the manifest is durable */
	COMMIT_FAILED, /* reason says why; nothing was written (but this node's part) */
};

/* What a poll found, for the caller to act on and to show. */
struct commit_result {
	enum commit_state state;
	char reason[IPC_ERRLEN]; /* FAILED: why, naming nodes, ranks and files */
	struct manifest *manifest; /* COMMITTED: the manifest as durable (caller frees) */
	bool wrote; /* COMMITTED: this node wrote it */
	/*
	 * wrote: ranks wrote less than they hold, and the assignment this node
	 * made (committer_assigned) told that they cover every box: no part
	 * was read whole.
	 */
	bool by_assignment;
	int64_t latency_ns; /* wrote: the last part durable -> the manifest durable */
	unsigned missing_at_deadline; /* FAILED at the deadline: nodes without a part */
	bool superseded; /* FAILED: the step is committed without this node's files */
	/*
	 * FAILED at the deadline, yet the manifest this node put is there (the
	 * fsync of its directory never succeeded): other nodes, or a restart,
	 * may list it; this node told its trainers FAILED.
	 */
	bool visible;
	/* progress: "n0" done, "n2 (ranks 4,5)" missing; malloc'd, the caller frees */
	char **done, **missing;
	size_t ndone, nmissing;
};

void commit_result_free(struct commit_result *r);

/*
 * Before this node writes its part: which ranks of (job, run, world) no node
 * claims (neither `local`, this node's ranks, ascending, nor another node's
 * plans of this run). A rank may still come to this node (its trainer
 * starts late) or to a node that has not published yet: the part waits
 * until none is left. Into out (at most max), their number in *n; -EEXIST
 * when two nodes claim one rank. Read once a run: where this node does not
 * hold rank 0, from the run's roster file that rank 0's node writes
 * (patient: -EAGAIN while it is not there), else from every node's plans
 * summary.
 */
int commit_unclaimed(struct committer *cm, const char *job, const char *run, int world,
                     const int *local, size_t nlocal, bool patient, int *out, size_t max, size_t *n,
                     char *why);

/*
 * A step as this node sees it once its part is complete: of job, run and
 * world; `part` (taken) holds this node's ranks, all durable; t0: now (the
 * deadline for the other nodes' parts counts from it: a slow write is not
 * held against the step, a node lagging behind the others is). first:
 * this node hosts rank 0, so it commits at once; the others wait half the
 * deadline for it before they commit themselves.
 */
int commit_create(struct committer *cm, struct part *part, bool first, int64_t t0,
                  struct commit **out, char *err);
/*
 * Does what is due at `now` (monotonic ns): writes this node's part (once),
 * looks for the manifest, and if this node commits, for the others' parts;
 * merges, writes the manifest and LATEST. Fills r (commit_result_free it).
 */
void commit_poll(struct commit *c, int64_t now, int64_t *next, struct commit_result *r);
/* Whether this node's part is durable in the root (a commit may use its files). */
bool commit_part_written(const struct commit *c);
void commit_destroy(struct commit *c);

/*
 * `ckptctl commit --finish JOB STEP`: the commit of a step by hand, from
 * what is in the root (the nodes from their plans files, their parts by
 * exact name), whatever agent wrote it. The parts of one run that hold every
 * rank once are merged; the manifest is written create-once and LATEST
 * moved. *already: the step was committed before (r->manifest is that one).
 */
int commit_finish(struct committer *cm, const char *job, int64_t step, struct commit_result *r,
                  bool *already, char *err);

#endif /* CKPT_COMMIT_H */
