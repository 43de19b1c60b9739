/*
 * commit/shares.h: a run's dedup assignment through the shared root
 * (docs/DESIGN.md §6.5, §7.4). The node of rank 0 computes it from every
 * node's plans file (layout/assign.h) and puts each node's share; every
 * other node takes its own share where the run's set mark says it is of
 * the plans as they are. The agent (agent/layouts.c) and the scale bench
 * use it. Synchronous, any thread.
 */
#ifndef CKPT_COMMIT_SHARES_H
#define CKPT_COMMIT_SHARES_H

#include "assign.h"
#include "store.h"

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
 * (assign_rank_of_share).
 */
int shares_get(struct storage *s, const char *job, const char *run, const char *node, int world,
               uint64_t gen, struct set_mark **mark, struct plans_share **share, char *err);

#endif /* CKPT_COMMIT_SHARES_H */
