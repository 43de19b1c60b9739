/*
 * agent/node/root.h: the storage root's health (root.c): checked, opened
 * again, followed.
 *
 * Locks: the state is agent.root, under agent.mu; the checks have their own.
 */
#ifndef CKPT_AGENT_NODE_ROOT_H
#define CKPT_AGENT_NODE_ROOT_H

#include <stdbool.h>

#include "agent/node/node.h"

/* Starts the root's checks (the root was opened at start: ROOT_OK). */
int root_watch_start(struct agent *a, char *err);
void root_watch_stop(struct agent *a);
/* Checks the root now, on a thread that may wait for the disk; 0: usable. No lock held. */
int root_check_now(struct agent *a, bool *reopened, char *err);
/*
 * A shard could not be created (rc): if the root may be why, it is checked
 * now. True: it is usable now and may not have been (made anew and open
 * again): create once more. Else err says what is wrong with the root,
 * when something is. No lock held.
 */
bool root_after_failure(struct agent *a, int rc, char *err);
const char *root_state_name(int state);

#endif /* CKPT_AGENT_NODE_ROOT_H */
