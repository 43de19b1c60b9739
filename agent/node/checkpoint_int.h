/*
 * agent/node/checkpoint_int.h: a checkpoint's insides, shared by its two
 * files and by nothing else (the rest of the agent uses agent.h's cp_*):
 *   checkpoint.c         the state machine, under agent.mu on whatever
 *                        thread: saves join, are durable, fail, stop;
 *   checkpoint_commit.c  the commit thread's jobs: the part, the polls,
 *                        the outcome, a failed checkpoint's files.
 */
#ifndef CKPT_AGENT_CHECKPOINT_INT_H
#define CKPT_AGENT_CHECKPOINT_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "agent/node/node.h"
#include "agent/node/checkpoint.h"

/* Commit thread: one turn of cp's commit (cp->work), queued once it is locally complete. */
void cp_commit_work(struct work *w);
/* Commit thread: a failed checkpoint's files, where this node's part was never written. */
void cp_cleanup_run(struct work *w);

/* Under mu: every live plan of the job's run on this node has saved this step. */
bool cp_local_all_saved(struct agent *a, const struct checkpoint *cp);
/* Under mu: every live plan of the job's run on this node has saved, and all are durable. */
bool cp_local_complete(struct agent *a, const struct checkpoint *cp);
/* Frees the n texts of *v, and empties it. */
void cp_free_texts(char ***v, size_t *n);

#endif /* CKPT_AGENT_CHECKPOINT_INT_H */
