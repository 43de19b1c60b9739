/*
 * Who may do what: the decisions about a caller. The owners of jobs and
 * what each user holds are the node's (node/owners.c).
 *
 * The rules (access_job):
 *   - root and the agent's own user: everything;
 *   - the owner: everything on the job (plans, saves, restores, commits,
 *     list, show, verify, delete, pin);
 *   - a member of [agent] admin_group: reads every job (list, show, status,
 *     watch, verify) and may delete and pin; never plans, saves, restores or
 *     commits another user's job;
 *   - anyone else: PERMISSION_DENIED, and the job is not listed to them.
 *
 * Under agent.mu, every function here, unless it says otherwise.
 */
#include <errno.h>

#include "agent/node/node.h"
#include "agent/node/owners.h"
#include "agent/rpc/access.h"
#include "agent/rpc/server.h"

static const char *const wants[] = {
    [ACCESS_READ] = "read",
    [ACCESS_MANAGE] = "delete or pin",
    [ACCESS_OWN] = "plan, save, restore or commit",
};

int access_job(struct agent *a, const struct peer *p, const char *job, enum access_want w,
               char *err)
{
	uint32_t owner;
	int rc;

	if (!p->known)
		return ipc_errf(err, -EACCES, "the call carries no credentials");
	if (p->super || (w != ACCESS_OWN && p->admin))
		return 0;
	rc = owner_lookup(a, job, &owner);
	if (rc == 0 && owner == (uint32_t)p->uid)
		return 0;
	/* One answer whether the job is another user's or ownerless: nothing to probe. */
	return ipc_errf(err, -EACCES,
	                "job %s is another user's (or has no owner): uid %u may not "
	                "%s it",
	                job, (unsigned)p->uid, wants[w]);
}

bool access_check(struct agent *a, struct rpc *c, const char *what, const char *job,
                  enum access_want w)
{
	char err[IPC_ERRLEN];
	int rc;

	pthread_mutex_lock(&a->mu);
	rc = access_job(a, rpc_peer(c), job, w, err);
	pthread_mutex_unlock(&a->mu);
	if (rc)
		rpc_fail(c, rc, "%s: %s", what, err);
	return rc == 0;
}

bool access_check_job_step(struct agent *a, struct rpc *c, const char *what, const char *job,
                           const int64_t *step, enum access_want w)
{
	char err[IPC_ERRLEN];
	int rc = ipc_check_job(job, err);

	if (!rc && step)
		rc = ipc_check_step(*step, err);
	if (rc) {
		rpc_fail(c, rc, "%s: %s", what, err);
		return false;
	}
	return access_check(a, c, what, job, w);
}

bool access_may_read(struct agent *a, const struct peer *p, const char *job)
{
	char err[IPC_ERRLEN];

	return access_job(a, p, job, ACCESS_READ, err) == 0;
}
