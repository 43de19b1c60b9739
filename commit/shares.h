/*
 * commit/shares.h: a run's dedup assignment through the shared root
 * (docs/DESIGN.md §6.5, §7.4). The node of rank 0 computes it from every
 * node's plans file (layout/assign.h) and puts each node's share; every
 * other node takes its own share where the run's set mark says it is of
 * the plans as they are. The agent (agent/node/layouts.c) and the scale bench
 * use it. Synchronous, any thread.
 */
#ifndef CKPT_COMMIT_SHARES_H
#define CKPT_COMMIT_SHARES_H

#include "layout/assign.h"
#include "storage/store.h"

/* Nodes' shares made and put at once, at most: their memory is bounded at any size. */
#define SHARES_AT_ONCE 256

/*
 * Every node's share of assignment as, computed from files[0..n) (each a
 * node's plans file whole, of run; set: the plan set's key), put
 * SHARES_AT_ONCE at a time, FANOUT_WIDTH in flight. 0; or -errno with err
 * saying how many were not put, and why one was not.
 */
int shares_put(struct storage *s, struct plans_file *const *files, size_t n, const char *run,
               int world, uint64_t set, const struct assignment *as, char *err);

/*
 * What node may take of run's plan set under plans generation gen: the
 * run's set mark, where it is of gen and world; and, where the mark names
 * a complete set with an assignment (set, not writes_all), node's share of
 * that set, of run and world (else *share NULL). 0; -ENOENT where either
 * is not there, -ESTALE where the mark is of another generation or the
 * share of another set, -EINVAL where one cannot be read; why in err.
 * Each share rank is still to be checked against the rank's live plan
 * (assign_rank_of_share). A mark of another generation is left in *mark
 * all the same (the caller frees it): what the run had before.
 */
int shares_get(struct storage *s, const char *job, const char *run, const char *node, int world,
               uint64_t gen, struct set_mark **mark, struct plans_share **share, char *err);

/*
 * What the node of rank 0 assigned to one run's ranks, as signatures: what
 * each holds (its plan in the set) and what it writes (0: all it holds).
 * Its committer checks the parts by these in place of reading them whole
 * (committer_assigned, commit.h).
 */
struct assigned {
	char job[IPC_MAX_JOB + 1], run[IPC_MAX_JOB + 1];
	int world;
	uint64_t set;
	uint64_t *holds, *writes; /* [world]; a rank the set has not: holds 0 */
};

/* The assignment as of in[0..n) (its input, of job and run): -ENOMEM, -EINVAL (a rank past world).
 */
int assigned_make(const struct assign_input *in, size_t n, const struct assignment *as,
                  const char *job, const char *run, int world, uint64_t set, struct assigned **out);
void assigned_free(struct assigned *x);
/*
 * Whether parts v[0..n) (of x's job and run) cover every box their ranks
 * hold by x's assignment alone: each rank holds what x says and wrote
 * either all it holds or what x assigned it (its summary's wsig, or its
 * tensors). False (why says which rank) where any is otherwise, or cannot
 * be told without the part: the caller checks the parts whole.
 */
bool assigned_covers(const struct assigned *x, struct part *const *v, size_t n, char *why);

#endif /* CKPT_COMMIT_SHARES_H */
