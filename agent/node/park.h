/*
 * agent/node/park.h: a run's first save, parked until its plan set is
 * complete (park.c).
 *
 * Locks: agent.mu, as each call says.
 */
#ifndef CKPT_AGENT_NODE_PARK_H
#define CKPT_AGENT_NODE_PARK_H

#include <stdbool.h>

#include <stdint.h>

#include "agent/node/plan.h"

/*
 * Under mu: a parked save that goes on (the edge's call and its checked
 * request, as parked): admitted, or refused (its call's deadline passed, its
 * plan gone, the agent stopping). Called exactly once per save parked.
 */
typedef void (*park_admit_fn)(struct agent *a, void *call, void *req);
/*
 * Under mu, rpc_save's: a save of p's (of step) that waits for the run's
 * plan set (its first, where the set is not complete: at most --plans-wait)
 * is parked: true, and admit(a, call, req) is called once it goes on.
 */
bool park_save(struct agent *a, struct plan *p, int64_t step, void *call, void *req,
               park_admit_fn admit);
/*
 * Under mu: parked saves whose set is complete, plan gone, or wait over, go
 * on (all: every one). After each look at the plans, and at the tick.
 */
void park_release(struct agent *a, bool all);

#endif /* CKPT_AGENT_NODE_PARK_H */
