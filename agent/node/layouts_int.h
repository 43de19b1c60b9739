/*
 * agent/node/layouts_int.h: replicas written once, the insides shared by
 * its two files and by nothing else (the rest of the agent uses agent.h's
 * layouts_*):
 *   layouts.c        the looks and what they decide, the layouts installed;
 *   layouts_files.c  the plans files read, a plan's layout made, the
 *                    shares and the set mark put.
 *
 * Commit thread. "Under mu": called with agent.mu held; the others take it
 * where they touch a plan.
 */
#ifndef CKPT_AGENT_LAYOUTS_INT_H
#define CKPT_AGENT_LAYOUTS_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "agent/node/node.h"
#include "agent/node/plan.h"
#include "commit/shares.h"
#include "layout/assign.h"

/* Every node's plans of (job, run): the files read, their ranks as assign's input. */
struct plan_set {
	struct plans_file **files;
	size_t nfiles;
	struct assign_input *in;
	size_t n;
	unsigned copies; /* the largest any rank asks for, at most the world */
	uint64_t key; /* 0: not a complete set */
	bool older; /* a node's agent does not write replicas once: complete or not, no key */
};

void lay_set_free(struct plan_set *ps);
/* The plans of (job, run) of world ranks, summaries or (whole) files; key 0: not a set. */
int lay_set_read(struct agent *a, const char *job, const char *run, int world, bool whole,
                 struct plan_set *ps, char *err);
/* ps, read again whole (their tensors); -ESTALE where the files make another set. */
int lay_set_whole(struct agent *a, const char *job, const char *run, int world, struct plan_set *ps,
                  char *err);
/* Whether this node's file says of p's rank what p holds. */
bool lay_file_says(const struct plan_set *ps, const char *node, const struct plan *p);
/* p's layout for what r writes; NULL in *out when r writes all it holds. */
int lay_layout_make(struct agent *a, const struct plan *p, const struct assign_rank *r,
                    uint64_t key, struct shard_layout **out, char *err);
/* Rank 0's node: every node's share of set ps->key put; false where they were not. */
bool lay_shares_done(struct agent *a, const char *job, const char *run, int world,
                     const struct plan_set *ps, const struct assignment *as);
/* The assignment made here, to this node's committer. */
void lay_give_committer(struct agent *a, const struct plan_set *ps, const char *job,
                        const char *run, int world, const struct assignment *as);
/* Rank 0's node: the run's set mark of generation gen put; true where the put failed. */
bool lay_mark_write(struct agent *a, const char *job, const char *run, int world,
                    const struct plan_set *ps, uint64_t gen, bool all);
/* p's layout from this node's share sh of set key (*l NULL: it writes all it holds). */
void lay_from_share(struct agent *a, struct plan *p, const struct plans_share *sh, uint64_t key,
                    struct shard_layout **l);

#endif /* CKPT_AGENT_LAYOUTS_INT_H */
