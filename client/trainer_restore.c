/*
 * libckpt: restores (ckpt.h). A restore asks the agent for a step of the
 * plan's job (or the newest that restores whole) and waits, without a
 * deadline, for its bytes to be in the plan's memory; what it answers
 * tells "no checkpoint" (-ENOENT) from "damaged" (-EBADMSG). The notes of
 * a restore (steps passed over, copies read from replicas) come back in
 * ckpt_restore_opts, or on stderr to a caller with no place for them.
 * Any thread.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/rpc.h"

/* The reply's notes as lines, malloc'd; NULL if none. */
static char *notes_text(char **v, size_t n)
{
	size_t len = 1;
	char *out;

	if (!n)
		return NULL;
	for (size_t i = 0; i < n; i++)
		len += strlen(v[i]) + 1;
	out = malloc(len);
	if (!out)
		return NULL;
	out[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		strcat(out, v[i]);
		strcat(out, "\n");
	}
	return out;
}

/*
 * The restore, its options taken (o->skipped out); `say`: the notes go to
 * stderr too (a caller with no place for them, ckpt_restore's).
 */
static int restore(struct ckpt_plan *p, int64_t step, struct ckpt_restore_opts *o, bool say,
                   int64_t *restored_step, char **meta_json)
{
	struct restore_spec req = {.step = step};
	struct restore_done rep;
	char err[IPC_ERRLEN];
	int rc;

	if (step != CKPT_LATEST && (rc = ipc_check_step(step, err)))
		return cl_fail(p->c, rc, "restore of job %s: %s", p->job, err);
	if (o->fallback < CKPT_FALLBACK_DAMAGED || o->fallback > CKPT_FALLBACK_ANY)
		return cl_fail(p->c, -EINVAL, "restore of job %s: unknown fallback %d", p->job,
		               o->fallback);
	req.fallback = o->fallback == CKPT_FALLBACK_ANY;
	req.strict = o->fallback == CKPT_FALLBACK_NEVER;
	rc = cl_enter(p->c);
	if (rc)
		return rc;
	req.plan_id = p->id;
	/* No deadline: a restore moves as many bytes as the shard has. */
	rc = p->lost[0] ? cl_fail(p->c, -ESTALE, "restore of job %s: %s", p->job, p->lost)
	                : cl_rpc_restore(p->c, &req, &rep, CL_NO_TIMEOUT);
	cl_leave(p->c);
	if (rc)
		return rc;
	if (restored_step)
		*restored_step = rep.step;
	o->skipped = notes_text(rep.skipped, rep.n_skipped);
	for (size_t i = 0; say && i < rep.n_skipped; i++)
		fprintf(stderr, "libckpt: restore of job %s rank %d, step %lld restored: %s\n",
		        p->job, p->rank, (long long)rep.step, rep.skipped[i]);
	if (meta_json && rep.meta_json && *rep.meta_json) {
		*meta_json = strdup(rep.meta_json);
		if (!*meta_json)
			rc = cl_fail(p->c, -ENOMEM, "out of memory");
	}
	cl_rpc_restore_free(&rep);
	return rc;
}

int ckpt_restore_opts(struct ckpt_plan *p, int64_t step, struct ckpt_restore_opts *opts,
                      int64_t *restored_step, char **meta_json)
{
	struct ckpt_restore_opts o = CKPT_RESTORE_OPTS_INIT;
	char err[IPC_ERRLEN];
	int rc;

	if (meta_json)
		*meta_json = NULL;
	if (opts && opts->size >= offsetof(struct ckpt_restore_opts, skipped) + sizeof(char *))
		opts->skipped = NULL;
	if (!p)
		return -EINVAL;
	if (!p->c)
		return -ENOTCONN;
	if (opts && (rc = cl_opts_take(opts, &o, sizeof(o),
	                               offsetof(struct ckpt_restore_opts, skipped) + sizeof(char *),
	                               "ckpt_restore_opts", err)))
		return cl_fail(p->c, rc, "restore of job %s: %s", p->job, err);
	o.skipped = NULL;
	rc = restore(p, step, &o, !opts, restored_step, meta_json);
	if (opts)
		opts->skipped = o.skipped;
	else
		free(o.skipped);
	return rc;
}

int ckpt_restore2(struct ckpt_plan *p, int64_t step, int fallback, int64_t *restored_step,
                  char **meta_json)
{
	struct ckpt_restore_opts o = CKPT_RESTORE_OPTS_INIT;
	int rc;

	if (!fallback)
		return ckpt_restore_opts(p, step, NULL, restored_step, meta_json);
	o.fallback = CKPT_FALLBACK_ANY;
	rc = ckpt_restore_opts(p, step, &o, restored_step, meta_json);
	free(o.skipped);
	return rc;
}

int ckpt_restore(struct ckpt_plan *p, int64_t step, int64_t *restored_step, char **meta_json)
{
	return ckpt_restore_opts(p, step, NULL, restored_step, meta_json);
}
