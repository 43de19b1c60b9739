/*
 * agent/node/publish.h: each job's plans file on the root (publish.c).
 *
 * Locks: as each call says; the file is written by the commit thread.
 */
#ifndef CKPT_AGENT_NODE_PUBLISH_H
#define CKPT_AGENT_NODE_PUBLISH_H

#include <stdbool.h>

#include "agent/node/plan.h"

/* Under mu: plans of job (of run) changed: its plans file is written again (commit thread). */
void plans_publish(struct agent *a, const char *job, const char *run);
/* Commit thread: the plans file of (job, run), written if it changed. 0 or -errno (err). */
int plans_put(struct agent *a, const char *job, const char *run, char *err);
/* Under mu (a hub_plan_fn): a plan made: its job's plans file written again. */
void plans_on_plan(struct agent *a, struct plan *p, bool dropped);
/* Under mu (a hub_root_fn): the root is back: every live plan's plans file written again. */
void plans_on_root_back(struct agent *a);

#endif /* CKPT_AGENT_NODE_PUBLISH_H */
