/*
 * agent/node/layouts.h: replicas written once (layouts.c): the plan set of
 * a run, the assignment of its replicated boxes, and who waits for it.
 *
 * Locks: as each call says (agent.mu, or the commit thread's).
 */
#ifndef CKPT_AGENT_NODE_LAYOUTS_H
#define CKPT_AGENT_NODE_LAYOUTS_H

#include <stdbool.h>
#include <stdint.h>

#include "agent/node/plan.h"

/*
 * Commit thread: the plans files of every node of (job, run) read; where
 * they make a complete plan set, each of this node's plans of that run
 * gets the layout of what the assignment (layout/assign.h) gives its rank
 * to write, made once per plan set. Where the set is not complete, saves
 * write their whole plan. The files are read only where the job's plans
 * generation moved since each plan's last look, or `force`. Saves parked
 * for the set go on once it is complete.
 */
void layouts_refresh(struct agent *a, const char *job, const char *run, bool force);
/*
 * Under mu: whether a save of (job, run) would wait for its plan set now:
 * some plan of it that may hold replicas has no complete set yet.
 */
bool layouts_waiting(struct agent *a, const char *job, const char *run);
/*
 * Under mu: whether this node holds rank 0 of (job, run), of a world of
 * more than one: it looks at the job's plans generation every second while
 * it does (one small read), so that the run's set mark follows the other
 * nodes' plans, whatever its own plans wait for.
 */
bool layouts_rank0(struct agent *a, const char *job, const char *run);
/*
 * Under mu: whether p's run has no complete plan set yet, and p holds a
 * tensor that may have replicas: its run's first save waits (park.c).
 */
bool layouts_plan_waits(const struct plan *p);
/*
 * Under mu: a CUDA plan's save is done with the trainer's memory and event
 * (captured, or ended with no capture job left); moves the trainer's fence.
 */
void plan_fence_finish(struct plan *p, uint32_t seq);
/* Where shard bytes [off, ...) of tensor i live in memory. No lock. */
void *plan_tensor_addr(const struct plan *p, size_t i);

#endif /* CKPT_AGENT_NODE_LAYOUTS_H */
