/*
 * agent/daemon/agent.h: the agent started, run and stopped (agent.c): its
 * objects made, its threads started, its listeners wired to the hub.
 */
#ifndef CKPT_AGENT_DAEMON_AGENT_H
#define CKPT_AGENT_DAEMON_AGENT_H

#include <stdatomic.h>

#include "agent/node/node.h"

int agent_start(const struct agent_config *cfg, struct agent **out, char *err);
/* Serves until *stop; then lets saves in flight finish and stops. */
void agent_run(struct agent *a, atomic_bool *stop);
void agent_destroy(struct agent *a);

#endif /* CKPT_AGENT_DAEMON_AGENT_H */
