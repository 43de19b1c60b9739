/*
 * store_step.c: a job's steps over any backend (store.h): the job's owner
 * and number, LATEST only forward (read back after each write, for
 * writers on other nodes; one mutex orders this process's
 * read-modify-write), the newest committed step, pins, a step's removal
 * (LATEST put right if it named it), and the clean-up rules.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "storage/io/fanout.h"
#include "storage/store_int.h"

#define LATEST_MAX 64 /* bytes of LATEST we read: "999999999999\n" is 13 */
#define LATEST_TRIES 3

/* ---- small numbers: OWNER, LATEST ---------------------------------------- */

/*
 * <job>/<leaf> as "<digits>\n", at most `digits` of them: 0 and *v;
 * -ENOENT (not there, said as `none`); -EBADMSG (not such a number, said
 * with `what`); another error from the backend.
 */
static int job_number_get(struct storage *s, const char *job, const char *leaf, size_t digits,
                          uint64_t *v, const char *none, const char *what, char *err)
{
	char key[STORE_KEY_MAX], *buf = NULL;
	size_t len = 0;
	int rc;

	if ((rc = ipc_check_job(job, err)))
		return rc;
	store_key(key, sizeof(key), job, -1, leaf);
	rc = s->ops->obj_get(s, key, LATEST_MAX, &buf, &len, err);
	if (rc == -ENOENT)
		return ipc_errf(err, rc, "job '%s' has %s", job, none);
	if (rc && rc != -EFBIG)
		return rc;
	if (!rc && len > 0 && buf[len - 1] == '\n')
		len--;
	rc = !rc && len > 0 && len <= digits ? 0 : -EBADMSG;
	*v = 0;
	for (size_t i = 0; rc == 0 && i < len; i++) {
		if (buf[i] < '0' || buf[i] > '9')
			rc = -EBADMSG;
		else
			*v = *v * 10 + (uint64_t)(buf[i] - '0');
	}
	free(buf);
	return rc ? ipc_errf(err, rc, "%s is not %s", key, what) : 0;
}

int store_owner_get(struct storage *s, const char *job, uint32_t *uid, char *err)
{
	uint64_t v;
	int rc = job_number_get(s, job, "OWNER", 10, &v, "no owner recorded",
	                        "a uid: only root may use the job until it is repaired", err);

	if (!rc && v >= UINT32_MAX) /* (uid_t)-1 is nobody's */
		rc = ipc_errf(err, -EBADMSG, "job '%s': OWNER %llu is not a uid", job,
		              (unsigned long long)v);
	if (!rc)
		*uid = (uint32_t)v;
	return rc;
}

int store_owner_claim(struct storage *s, const char *job, uint32_t uid, uint32_t *owner, char *err)
{
	char key[STORE_KEY_MAX], text[16];
	int n = snprintf(text, sizeof(text), "%u\n", uid), rc;

	rc = store_owner_get(s, job, owner, err);
	if (rc != -ENOENT)
		return rc;
	store_key(key, sizeof(key), job, -1, "OWNER");
	/* Create-once: of two first planners (two nodes) one wins, the other reads it. */
	rc = s->ops->obj_put(s, key, text, (size_t)n, OBJ_CREATE, err);
	if (rc == -EEXIST)
		return store_owner_get(s, job, owner, err);
	if (!rc)
		*owner = uid;
	return rc;
}

int store_latest_get(struct storage *s, const char *job, int64_t *step, char *err)
{
	uint64_t v;
	int rc = job_number_get(s, job, "LATEST", 12, &v, "no LATEST (nothing committed yet?)",
	                        "a step number", err);

	if (rc == -EBADMSG)
		rc = -EINVAL; /* what callers of LATEST have always been told */
	if (!rc)
		*step = (int64_t)v;
	return rc;
}

/* Under s->latest_mu. */
static int latest_put(struct storage *s, const char *job, int64_t step, char *err)
{
	char key[STORE_KEY_MAX], text[32];
	int n = snprintf(text, sizeof(text), "%" PRId64 "\n", step);

	store_key(key, sizeof(key), job, -1, "LATEST");
	return s->ops->obj_put(s, key, text, (size_t)n, OBJ_REPLACE, err);
}

int store_latest_advance(struct storage *s, const char *job, int64_t step, char *err)
{
	char why[IPC_ERRLEN];
	int64_t cur;
	int rc = 0;

	if ((rc = store_check_job_step(job, step, err)))
		return rc;
	pthread_mutex_lock(&s->latest_mu);
	for (int i = 0; i < LATEST_TRIES; i++) {
		/*
		 * An agent of another node may have moved it meanwhile: read it back
		 * after each write, and never write over a newer step.
		 */
		if (store_latest_get(s, job, &cur, why) == 0 && cur >= step) {
			rc = 0;
			break;
		}
		rc = latest_put(s, job, step, err);
		if (rc)
			break;
	}
	pthread_mutex_unlock(&s->latest_mu);
	return rc;
}

/*
 * The newest committed step of job other than `except`: -ENOENT if none.
 * With `whole`, the newest whose files are there as its manifest says
 * (store_step_intact), but for `trusted` (what LATEST names already): a
 * manifest copied under another step's name, or one whose files were
 * lost, is passed over. That is one small read per rank of each step
 * looked at, newest first: only steps newer than LATEST are, normally none.
 */
static int newest_committed(struct storage *s, const char *job, int64_t except, bool whole,
                            int64_t trusted, int64_t *step, char *err)
{
	struct storage_step *v = NULL;
	char why[IPC_ERRLEN];
	size_t n = 0;
	int rc = s->ops->list_steps(s, job, &v, &n, err);

	if (rc)
		return rc;
	rc = -ENOENT;
	for (size_t i = n; i-- > 0;) {
		if (!v[i].committed || v[i].step == except)
			continue;
		if (whole && v[i].step != trusted && store_step_intact(s, job, v[i].step, why))
			continue; /* not a step LATEST may name: a restore says why */
		*step = v[i].step;
		rc = 0;
		break;
	}
	free(v);
	return rc;
}

int store_newest_committed(struct storage *s, const char *job, int64_t *step, char *err)
{
	int rc = newest_committed(s, job, -1, false, -1, step, err);

	return rc == -ENOENT ? ipc_errf(err, rc, "job '%s' has no committed step", job) : rc;
}

/*
 * Under s->latest_mu: LATEST := the newest committed step other than `except`
 * whose files are there as its manifest says (or none), unless it names a
 * committed step newer still (a commit of another node that our listing
 * came too early to see). A manifest that names no such files (copied under
 * another step's name, its files lost) never becomes LATEST here. Another node may
 * also commit, and move LATEST, between our look and our write: we look
 * again after writing, and move it on to what is there now, so that it
 * never stays behind a commit it saw.
 */
static int latest_fix(struct storage *s, const char *job, int64_t except, bool *changed, char *err)
{
	char key[STORE_KEY_MAX], why[IPC_ERRLEN];
	int64_t cur = -1, newest = -1, wrote;
	int had, rc;

	*changed = false;
	had = store_latest_get(s, job, &cur, why);
	rc = newest_committed(s, job, except, true, had == 0 ? cur : -1, &newest, err);
	if (rc && rc != -ENOENT)
		return rc;
	if (had == 0 && cur != except && cur >= newest && store_committed(s, job, cur))
		return 0;
	if (newest < 0) {
		if (had == -ENOENT)
			return 0;
		store_key(key, sizeof(key), job, -1, "LATEST");
		rc = s->ops->obj_delete(s, key, err);
		if (rc && rc != -ENOENT)
			return rc;
		*changed = rc == 0;
	} else {
		if ((rc = latest_put(s, job, newest, err)))
			return rc;
		*changed = true;
	}
	wrote = newest;
	for (int i = 0; i < LATEST_TRIES; i++) {
		if (newest_committed(s, job, except, true, wrote, &newest, why) || newest <= wrote)
			break;
		if (latest_put(s, job, newest, why))
			break; /* LATEST is a hint: the next commit or clean-up moves it on */
		wrote = newest;
	}
	return 0;
}

/* ---- pins and removal -------------------------------------------------- */

int store_set_pinned(struct storage *s, const char *job, int64_t step, bool pinned, char *err)
{
	char key[STORE_KEY_MAX];
	int rc;

	if ((rc = store_check_job_step(job, step, err)))
		return rc;
	if (!store_committed(s, job, step))
		return ipc_errf(err, -ENOENT,
		                "job '%s' step %" PRId64 " is not committed: only a checkpoint can "
		                "be pinned",
		                job, step);
	/*
	 * A pin is an empty object in the step: it lives and goes with the step
	 * (removal takes it along) and needs no index to keep in step. Durable
	 * when this returns, or retention could delete a step we said is kept.
	 */
	store_key(key, sizeof(key), job, step, "pinned");
	if (!pinned) {
		rc = s->ops->obj_delete(s, key, err);
		return rc == -ENOENT ? 0 : rc;
	}
	/*
	 * Into the step as it is, never a directory made anew: a removal on
	 * another node may take the step out of sight as we pin it. It looks
	 * for a pin once the step is out of sight, and puts it back if it
	 * finds one; if it went first, the pin fails here.
	 */
	rc = s->ops->obj_put(s, key, "", 0, OBJ_REPLACE | OBJ_IN_PLACE, err);
	if (rc == -ENOENT || rc == -ESTALE || (!rc && !store_committed(s, job, step)))
		return ipc_errf(err, -ENOENT,
		                "job '%s' step %" PRId64 " was removed as it was being pinned", job,
		                step);
	return rc;
}

int store_remove(struct storage *s, const char *job, int64_t step, char *err)
{
	char key[STORE_KEY_MAX], why[IPC_ERRLEN];
	bool changed, was_latest;
	uint64_t size;
	int64_t cur;
	int rc;

	if ((rc = store_check_job_step(job, step, err)))
		return rc;
	/*
	 * Pinned, perhaps through another node's agent: kept. (A pin that comes
	 * after this look is seen once the step is out of sight; it goes back.)
	 */
	store_key(key, sizeof(key), job, step, "pinned");
	rc = s->ops->obj_stat(s, key, &size, why);
	if (rc && rc != -ENOENT)
		return ipc_errf(err, rc, "cannot tell whether it is pinned: %s", why);
	if (rc == 0)
		return ipc_errf(err, -EBUSY,
		                "job '%s' step %" PRId64 " is pinned (perhaps through another "
		                "node's agent): unpin it first",
		                job, step);
	/* LATEST first: it never names a step that is not there, crash or no crash. */
	pthread_mutex_lock(&s->latest_mu);
	was_latest = store_latest_get(s, job, &cur, err) == 0 && cur == step;
	rc = was_latest ? latest_fix(s, job, step, &changed, err) : 0;
	pthread_mutex_unlock(&s->latest_mu);
	if (rc)
		return rc;
	rc = s->ops->remove(s, job, step, err);
	/* Kept after all (pinned meanwhile, put back): LATEST names it again. */
	if ((rc == -EBUSY || rc == -EEXIST) && was_latest && store_committed(s, job, step))
		store_latest_advance(s, job, step, why);
	return rc;
}

/* ---- clean-up ---------------------------------------------------------- */

static int cleanup_job(struct storage *s, const char *job, const struct storage_cleanup *pol,
                       struct storage_recovery *rec, char *err)
{
	char why[IPC_ERRLEN];
	int64_t latest = -1;
	bool changed;
	int rc, rc2;

	/*
	 * What is older than LATEST may be abandoned: a LATEST that names no
	 * checkpoint (damaged, planted, or its step removed by hand) says
	 * nothing, and the newest committed step stands in for it.
	 */
	if (store_latest_get(s, job, &latest, why))
		latest = -1;
	if (latest >= 0 && !store_committed(s, job, latest) &&
	    newest_committed(s, job, -1, false, -1, &latest, why))
		latest = -1;
	rc = s->ops->cleanup(s, job, latest, pol, rec, err);
	pthread_mutex_lock(&s->latest_mu);
	rc2 = latest_fix(s, job, -1, &changed, rc ? why : err);
	pthread_mutex_unlock(&s->latest_mu);
	if (changed)
		rec->latest_fixed++;
	return rc ? rc : rc2;
}

int store_cleanup(struct storage *s, const char *job, const struct storage_cleanup *pol,
                  struct storage_recovery *rec, char *err)
{
	char why[IPC_ERRLEN];
	char **jobs = NULL;
	size_t n = 0;
	int rc, first = 0;

	if (job)
		return ipc_check_job(job, err) ?: cleanup_job(s, job, pol, rec, err);
	rc = s->ops->list_jobs(s, &jobs, &n, err);
	if (rc)
		return rc;
	/* Keeps going past an error: one bad job must not block the rest. */
	for (size_t i = 0; i < n; i++) {
		rc = cleanup_job(s, jobs[i], pol, rec, first ? why : err);
		if (rc && !first)
			first = rc;
		free(jobs[i]);
	}
	free(jobs);
	return first;
}
