/*
 * A run's first save, parked until its plan set is complete (layouts.c,
 * docs/DESIGN.md §7.4): where a plan that may hold replicas has no
 * complete set yet, rpc_save parks the save (nothing of it is made; its
 * trainer waits for the reply) until the set is complete, its plan is gone
 * or --plans-wait has passed; then the function it was parked with admits
 * it (or refuses it) as if it came then. The call and its request are the
 * edge's (rpc/save_rpc.c), opaque here.
 *
 * Invariant: a parked save goes on exactly once (its function called once):
 * admitted or refused, at the latest --plans-wait on (the tick), or at a
 * stop. --plans-wait is at most 30 s, half libckpt's call timeout; the
 * function refuses a call whose deadline passed meanwhile, never admits it
 * (its trainer went on, and its memory changes).
 *
 * Under agent.mu, on the control thread (a save parked), the commit thread
 * (after a look at the plans) and the tick.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/node/node.h"
#include "agent/node/plan.h"
#include "agent/node/layouts.h"
#include "agent/node/park.h"
#include "agent/node/save.h"
#include "ipc/base/log.h"

struct parked {
	struct list link; /* agent->parked */
	void *call, *req; /* the edge's call and its request, checked */
	park_admit_fn admit; /* what goes on with it */
	uint64_t plan_id;
	int64_t step;
	int64_t since, until; /* monotonic ns */
};

/* --plans-wait, at most half the commit deadline: the step must still fit in it. */
static unsigned plans_wait_s(const struct agent *a)
{
	const unsigned half = a->cfg.commit_deadline_s / 2;

	return a->cfg.plans_wait_s < half ? a->cfg.plans_wait_s : half;
}

bool park_save(struct agent *a, struct plan *p, int64_t step, void *call, void *req,
               park_admit_fn admit)
{
	const int64_t now = ipc_mono_ns();
	const unsigned wait = plans_wait_s(a);
	struct parked *pk;

	if (!wait || p->set_waited || !layouts_plan_waits(p))
		return false;
	pk = calloc(1, sizeof(*pk));
	if (!pk)
		return false; /* then it writes all it holds */
	pk->call = call;
	pk->req = req;
	pk->admit = admit;
	pk->plan_id = p->id;
	pk->step = step;
	pk->since = now;
	pk->until = now + (int64_t)wait * 1000000000;
	list_add_tail(&a->parked, &pk->link);
	if (p->set_ranks < 0)
		log_msg(
		    LOG_INFO,
		    "job %s rank %d: save of step %lld waits for the plans of every rank of run "
		    "%s (as rank 0's node finds them; at most %u s)",
		    p->job, p->rank, (long long)step, p->run, wait);
	else
		log_msg(
		    LOG_INFO,
		    "job %s rank %d: save of step %lld waits for the plans of every rank of run "
		    "%s (%d of %d known; at most %u s)",
		    p->job, p->rank, (long long)step, p->run, p->set_ranks, p->world, wait);
	return true;
}

/* Under mu: what a parked save of p's did, said as it goes on. */
static void unpark_say(struct agent *a, struct plan *p, const struct parked *pk, int64_t now)
{
	const long long step = (long long)pk->step;
	char known[64];

	if (!layouts_plan_waits(p)) {
		log_msg(LOG_INFO,
		        "job %s rank %d: save of step %lld waited %.3f s for the plans of every "
		        "rank of run %s",
		        p->job, p->rank, step, (double)(now - pk->since) / 1e9, p->run);
		return;
	}
	p->set_waited = true;
	if (p->set_ranks < 0)
		snprintf(known, sizeof(known), "rank 0's node has not said them yet");
	else
		snprintf(known, sizeof(known), "%d of the %d ranks are known", p->set_ranks,
		         p->world);
	log_msg(LOG_WARNING,
	        "job %s rank %d: save of step %lld waited %u s (--plans-wait) for the plans of "
	        "every rank of run %s, and %s: it writes every replica it holds, and the next "
	        "saves do not wait (is a node of the job not started, or its trainers not yet "
	        "planned?)",
	        p->job, p->rank, step, plans_wait_s(a), p->run, known);
}

void park_release(struct agent *a, bool all)
{
	const int64_t now = ipc_mono_ns();
	struct list *pos, *tmp;

	list_for_each_safe(pos, tmp, &a->parked)
	{
		struct parked *pk = container_of(pos, struct parked, link);
		struct plan *p = plan_find(a, pk->plan_id);
		bool live = p && !p->dropped;

		if (!all && live && layouts_plan_waits(p) && now < pk->until)
			continue;
		list_del(&pk->link);
		if (live && !all) /* all: the agent stops, and refuses it */
			unpark_say(a, p, pk, now);
		pk->admit(a, pk->call,
		          pk->req); /* a deadline passed, a plan gone, a stop: refused */
		free(pk);
	}
}
