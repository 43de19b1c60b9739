/*
 * by_hand.c: a step committed by hand (commit_finish, ckptctl commit): from
 * what is in the root, the parts of one run that hold every rank once,
 * each checked against its node's plans and its files; the same manifest
 * bytes the agents would write (write_manifest.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commit/commit.h"
#include "commit/commit_int.h"

/* The parts in the root of (job, step), of every node that published plans. */
static int gather(struct committer *cm, const char *job, int64_t step, struct part ***out,
                  size_t *n, char *problems, size_t plen)
{
	char **names = NULL, msg[IPC_ERRLEN];
	struct part **v, *p;
	size_t cnt = 0, o = 0;
	int rc;

	*out = NULL;
	*n = 0;
	rc = store_list_nodes(cm->o.store, job, &names, &cnt, msg);
	if (rc)
		return ipc_errf(problems, rc, "%s", msg);
	v = calloc(cnt + 1, sizeof(*v));
	for (size_t i = 0; v && i < cnt; i++) {
		rc = store_read_part(cm->o.store, job, step, names[i], &p, msg);
		if (rc == 0 && ((rc = plans_file_disagrees(cm->o.store, p, false, msg)) ||
		                (rc = part_unbound(cm->o.store, p, step, msg))))
			part_free(p);
		if (rc == 0)
			v[(*n)++] = p;
		else if (rc != -ENOENT && o < plen)
			o += (size_t)snprintf(problems + o, plen - o, "%s%s", o ? "; " : "", msg);
	}
	for (size_t i = 0; i < cnt; i++)
		free(names[i]);
	free(names);
	*out = v;
	return v ? 0 : -ENOMEM;
}

/* Of the parts, those of one run that hold every rank once: into sel, how many. */
static size_t pick_run(struct part **v, size_t n, struct part **sel, char *why)
{
	size_t best = 0, bestn = 0;
	const char *bestrun = NULL;

	for (size_t i = 0; i < n; i++) {
		size_t k = 0, ranks = 0;

		for (size_t j = 0; j < n; j++)
			if (strcmp(v[j]->run, v[i]->run) == 0 && v[j]->world == v[i]->world) {
				sel[k++] = v[j];
				ranks += v[j]->nranks;
			}
		if (ranks == (size_t)v[i]->world)
			return k; /* merge checks that each rank is there once */
		if (ranks > best) {
			best = ranks;
			bestn = k;
			bestrun = v[i]->run;
		}
	}
	if (bestrun)
		snprintf(why, IPC_ERRLEN, "the parts of run %s hold %zu of %d ranks (%zu parts)",
		         bestrun, best, v[0]->world, bestn);
	else
		snprintf(why, IPC_ERRLEN, "no node has written a part of this step");
	return 0;
}

int commit_finish(struct committer *cm, const char *job, int64_t step, struct commit_result *r,
                  bool *already, char *err)
{
	char problems[IPC_ERRLEN] = "", why[IPC_ERRLEN];
	struct part **v = NULL, **sel = NULL;
	size_t n = 0, k;
	int rc;

	memset(r, 0, sizeof(*r));
	*already = false;
	if ((rc = ipc_check_job(job, err)) || (rc = ipc_check_step(step, err)))
		return rc;
	rc = store_read_manifest(cm->o.store, job, step, &r->manifest, why);
	if (rc == 0) {
		*already = true;
		r->state = COMMIT_COMMITTED;
		return 0;
	}
	if (rc != -ENOENT)
		return ipc_errf(err, rc, "%s", why);
	rc = gather(cm, job, step, &v, &n, problems, sizeof(problems));
	if (rc)
		return ipc_errf(err, rc, "job %s step %" PRId64 ": %s", job, step, problems);
	sel = calloc(n + 1, sizeof(*sel));
	k = sel ? pick_run(v, n, sel, why) : 0;
	if (!sel)
		rc = ipc_errf(err, -ENOMEM, "out of memory");
	else if (k == 0)
		rc = ipc_errf(err, -ENOENT, "job %s step %" PRId64 " cannot be committed: %s%s%s",
		              job, step, why, problems[0] ? "; " : "", problems);
	else {
		why[0] = '\0';
		/* there after a failed put: committed once it is durable */
		if (write_manifest(cm, sel, k, NULL, true, 0, r, why) &&
		    store_sync_manifest(cm->o.store, job, step, why) == 0)
			why[0] = '\0';
		if (r->state == COMMIT_WAITING && why[0]) {
			rc = ipc_errf(err, -EIO, "job %s step %" PRId64 ": %s", job, step, why);
		} else if (r->state == COMMIT_WAITING) { /* someone else was faster */
			rc = store_read_manifest(cm->o.store, job, step, &r->manifest, why);
			*already = rc == 0;
			r->state = rc == 0 ? COMMIT_COMMITTED : COMMIT_FAILED;
			if (rc)
				rc = ipc_errf(err, rc, "%s", why);
		} else if (r->state == COMMIT_FAILED) {
			rc = ipc_errf(err, -EIO, "job %s step %" PRId64 ": %s", job, step,
			              r->reason);
		}
	}
	for (size_t i = 0; i < n; i++)
		part_free(v[i]);
	free(v);
	free(sel);
	return rc;
}
