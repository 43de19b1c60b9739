/*
 * agent/rpc/access.h: who may do what (access.c): a job's owner, the
 * agent's admins. The owners and what each user holds are the node's
 * (node/owners.h, included here for the handlers that charge a user).
 *
 * Locks: as each call says; the tables they read are under agent.mu.
 */
#ifndef CKPT_AGENT_RPC_ACCESS_H
#define CKPT_AGENT_RPC_ACCESS_H

#include <stdbool.h>

#include "agent/node/node.h"
#include "agent/node/owners.h"
#include "agent/node/peer.h"

struct rpc;

enum access_want {
	ACCESS_READ, /* list, show, status, watch, verify */
	ACCESS_MANAGE, /* delete, pin, unpin */
	ACCESS_OWN, /* plans, saves, restores, commits */
};

/* Under mu: 0, or -EACCES with why in err. */
int access_job(struct agent *a, const struct peer *p, const char *job, enum access_want w,
               char *err);
bool access_may_read(struct agent *a, const struct peer *p, const char *job);
/* Not under mu: whether the caller may; if not, the call is failed (PERMISSION_DENIED). */
bool access_check(struct agent *a, struct rpc *c, const char *what, const char *job,
                  enum access_want w);
/*
 * Not under mu: a request about job (and step, where not NULL) checked, then
 * the caller's right: false where the call was failed ("what: why").
 */
bool access_check_job_step(struct agent *a, struct rpc *c, const char *what, const char *job,
                           const int64_t *step, enum access_want w);

#endif /* CKPT_AGENT_RPC_ACCESS_H */
