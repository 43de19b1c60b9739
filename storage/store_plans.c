/*
 * store_plans.c: a run's small files over any backend (store.h): each
 * node's plans file and its summary (many read at once), the run's
 * roster, each node's share of the dedup assignment, the set mark, the
 * plans generation (touched by every put of a plans file), and the nodes
 * that wrote a step's parts. Read as hostile input; written create-once
 * or replaced whole.
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

/* ---- plans ------------------------------------------------------------- */

/* A node's plans file, or its summary: checked to be that node's of that job. */
static int read_plans(struct storage *s, const char *job, const char *node, bool summary,
                      struct plans_file **out, char *err)
{
	char key[STORE_KEY_MAX], why[IPC_ERRLEN], *buf = NULL;
	struct plans_file *f = NULL;
	size_t len = 0;
	int rc;

	*out = NULL;
	if ((rc = ipc_check_job(job, err)) || (rc = ipc_check_node(node, err)))
		return rc;
	if (summary)
		store_plans_summary_key(key, sizeof(key), job, node);
	else
		store_plans_key(key, sizeof(key), job, node);
	rc = s->ops->obj_get(s, key, MANIFEST_MAX_BYTES, &buf, &len, why);
	if (rc)
		return ipc_errf(err, rc, "%s", rc == -ENOENT ? key : why);
	store_parse_enter();
	rc = summary ? plans_summary_from_json(buf, len, &f, why)
	             : plans_from_json(buf, len, &f, why);
	store_parse_leave();
	free(buf);
	if (rc)
		return ipc_errf(err, -EINVAL, "%s: %s", key, why);
	if (strcmp(f->job, job) || strcmp(f->node, node)) {
		rc = ipc_errf(err, -EINVAL, "%s: it is the plans %s of job %s node %s", key,
		              summary ? "summary" : "file", f->job, f->node);
		plans_free(f);
		return rc;
	}
	*out = f;
	return 0;
}

int store_read_plans(struct storage *s, const char *job, const char *node, struct plans_file **out,
                     char *err)
{
	return read_plans(s, job, node, false, out, err);
}

int store_read_plans_summary(struct storage *s, const char *job, const char *node,
                             struct plans_file **out, char *err)
{
	return read_plans(s, job, node, true, out, err);
}

struct plans_many {
	struct storage *s;
	const char *job;
	char *const *nodes;
	bool whole;
	struct store_plans_read *out;
};

static void plans_one(void *arg, size_t i)
{
	const struct plans_many *m = arg;
	struct store_plans_read *o = &m->out[i];

	o->rc = m->whole ? -ENOENT : read_plans(m->s, m->job, m->nodes[i], true, &o->f, o->msg);
	if (o->rc && o->rc != -ENOMEM) /* none, or not one to take: the file says */
		o->rc = read_plans(m->s, m->job, m->nodes[i], false, &o->f, o->msg);
}

void store_read_plans_many(struct storage *s, const char *job, char *const *nodes, size_t n,
                           bool whole, struct store_plans_read *out)
{
	struct plans_many m = {s, job, nodes, whole, out};

	fanout_run(n, FANOUT_WIDTH, plans_one, &m);
}

static int plans_touch(struct storage *s, const char *job, char *err);

int store_put_plans(struct storage *s, struct plans_file *f, bool *written, char *err)
{
	char key[STORE_KEY_MAX], skey[STORE_KEY_MAX], why[IPC_ERRLEN];
	char *json = NULL, *sum = NULL, *old = NULL;
	size_t len = 0, slen = 0, olen = 0;
	bool same = false, wrote_sum = false;
	int rc;

	*written = false;
	rc = plans_to_json(f, &json, &len, err); /* the digest, which the summary names */
	if (!rc && (rc = plans_summary_to_json(f, &sum, &slen, err)))
		free(json);
	if (rc)
		return rc;
	store_plans_key(key, sizeof(key), f->job, f->node);
	store_plans_summary_key(skey, sizeof(skey), f->job, f->node);
	/*
	 * A summary never says what its file does not: any other one goes
	 * before the file may change (a reader without one reads the file), and
	 * this file's comes after. Once per plan set: the same bytes are left.
	 */
	rc = s->ops->obj_get(s, skey, MANIFEST_MAX_BYTES, &old, &olen, why);
	same = rc == 0 && olen == slen && memcmp(old, sum, slen) == 0;
	free(old);
	if (!same && rc != -ENOENT && (rc = s->ops->obj_delete(s, skey, err)) && rc != -ENOENT) {
		free(json);
		free(sum);
		return rc;
	}
	rc = store_put_own(s, key, json, len, NULL, written, err);
	if (rc || same)
		free(sum);
	else /* without it, readers read the file: not a failure of the plans' */
		(void)store_put_own(s, skey, sum, slen, NULL, &wrote_sum, why);
	if (rc || (!*written && !wrote_sum))
		return rc;
	/*
	 * after both: a reader that saw the old number sees them. Where the
	 * number could not be renewed, the summary goes, so that the next
	 * publish does not find the same bytes and renews it then.
	 */
	rc = plans_touch(s, f->job, err);
	if (rc)
		(void)s->ops->obj_delete(s, skey, why);
	return rc;
}

/* ---- a run's roster ----------------------------------------------------- */

static void roster_key(char *buf, size_t len, const char *job, const char *run)
{
	snprintf(buf, len, "%s/plans/%s.roster", job, run);
}

int store_read_roster(struct storage *s, const char *job, const char *run, struct roster_file **out,
                      char *err)
{
	char key[STORE_KEY_MAX], why[IPC_ERRLEN], *buf = NULL;
	struct roster_file *r = NULL;
	size_t len = 0;
	int rc;

	*out = NULL;
	if ((rc = ipc_check_job(job, err)) || (rc = ipc_check_run(run, err)))
		return rc;
	roster_key(key, sizeof(key), job, run);
	rc = s->ops->obj_get(s, key, MANIFEST_MAX_BYTES, &buf, &len, why);
	if (rc)
		return ipc_errf(err, rc, "%s", rc == -ENOENT ? key : why);
	store_parse_enter();
	rc = roster_file_from_json(buf, len, &r, why);
	store_parse_leave();
	free(buf);
	if (rc)
		return ipc_errf(err, -EINVAL, "%s: %s", key, why);
	if (strcmp(r->job, job) || strcmp(r->run, run)) {
		rc = ipc_errf(err, -EINVAL, "%s: it is the roster of job %s run %s", key, r->job,
		              r->run);
		roster_file_free(r);
		return rc;
	}
	*out = r;
	return 0;
}

int store_put_roster(struct storage *s, const struct roster_file *r, char *err)
{
	char key[STORE_KEY_MAX], *json = NULL;
	size_t len = 0;
	bool written;
	int rc = roster_file_to_json(r, &json, &len, err);

	if (rc)
		return rc;
	roster_key(key, sizeof(key), r->job, r->run);
	return store_put_own(s, key, json, len, NULL, &written, err); /* the same bytes: left */
}

static void share_key(char *buf, size_t len, const char *job, const char *node)
{
	snprintf(buf, len, "%s/plans/%s.share", job, node);
}

int store_read_share(struct storage *s, const char *job, const char *node, struct plans_share **out,
                     char *err)
{
	char key[STORE_KEY_MAX], why[IPC_ERRLEN], *buf = NULL;
	struct plans_share *sh = NULL;
	size_t len = 0;
	int rc;

	*out = NULL;
	if ((rc = ipc_check_job(job, err)) || (rc = ipc_check_node(node, err)))
		return rc;
	share_key(key, sizeof(key), job, node);
	rc = s->ops->obj_get(s, key, MANIFEST_MAX_BYTES, &buf, &len, why);
	if (rc)
		return ipc_errf(err, rc, "%s", rc == -ENOENT ? key : why);
	store_parse_enter();
	rc = share_from_json(buf, len, &sh, why);
	store_parse_leave();
	free(buf);
	if (rc)
		return ipc_errf(err, -EINVAL, "%s: %s", key, why);
	if (strcmp(sh->job, job) || strcmp(sh->node, node)) {
		rc = ipc_errf(err, -EINVAL, "%s: it is the share of job %s node %s", key, sh->job,
		              sh->node);
		share_free(sh);
		return rc;
	}
	*out = sh;
	return 0;
}

struct shares_put {
	struct storage *s;
	struct plans_share *const *v;
	pthread_mutex_t mu;
	size_t failed;
	char *err; /* the first failure's */
};

static void share_one(void *arg, size_t i)
{
	struct shares_put *m = arg;
	const struct plans_share *sh = m->v[i];
	char key[STORE_KEY_MAX], why[IPC_ERRLEN], *json = NULL;
	size_t len = 0;
	int rc = share_to_json(sh, &json, &len, why);

	share_key(key, sizeof(key), sh->job, sh->node);
	if (!rc)
		rc = m->s->ops->obj_put(m->s, key, json, len, OBJ_REPLACE, why);
	free(json);
	if (!rc)
		return;
	pthread_mutex_lock(&m->mu);
	if (!m->failed++)
		ipc_errf(m->err, rc, "%s: %s", key, why);
	pthread_mutex_unlock(&m->mu);
}

size_t store_put_shares(struct storage *s, struct plans_share *const *v, size_t n, char *err)
{
	struct shares_put m = {.s = s, .v = v, .err = err};

	pthread_mutex_init(&m.mu, NULL);
	fanout_run(n, FANOUT_WIDTH, share_one, &m);
	pthread_mutex_destroy(&m.mu);
	return m.failed;
}

static void set_mark_key(char *buf, size_t len, const char *job, const char *run)
{
	snprintf(buf, len, "%s/plans/%s.set", job, run);
}

int store_read_set_mark(struct storage *s, const char *job, const char *run, struct set_mark **out,
                        char *err)
{
	char key[STORE_KEY_MAX], why[IPC_ERRLEN], *buf = NULL;
	struct set_mark *m = NULL;
	size_t len = 0;
	int rc;

	*out = NULL;
	if ((rc = ipc_check_job(job, err)) || (rc = ipc_check_run(run, err)))
		return rc;
	set_mark_key(key, sizeof(key), job, run);
	rc = s->ops->obj_get(s, key, 4096, &buf, &len, why);
	if (rc)
		return ipc_errf(err, rc, "%s", rc == -ENOENT ? key : why);
	rc = set_mark_from_json(buf, len, &m, why);
	free(buf);
	if (rc)
		return ipc_errf(err, -EINVAL, "%s: %s", key, why);
	if (strcmp(m->job, job) || strcmp(m->run, run)) {
		rc = ipc_errf(err, -EINVAL, "%s: it is the set mark of job %s run %s", key, m->job,
		              m->run);
		set_mark_free(m);
		return rc;
	}
	*out = m;
	return 0;
}

int store_put_set_mark(struct storage *s, const struct set_mark *m, char *err)
{
	char key[STORE_KEY_MAX], *json = NULL;
	size_t len = 0;
	int rc = set_mark_to_json(m, &json, &len, err);

	if (rc)
		return rc;
	set_mark_key(key, sizeof(key), m->job, m->run);
	rc = s->ops->obj_put(s, key, json, len, OBJ_REPLACE, err);
	free(json);
	return rc;
}

/* "<job>/plans/generation": a new number each time a node's plans file changes. */
static void generation_key(char *buf, size_t len, const char *job)
{
	snprintf(buf, len, "%s/plans/generation", job);
}

static int plans_touch(struct storage *s, const char *job, char *err)
{
	char key[STORE_KEY_MAX], body[24];
	int len;

	generation_key(key, sizeof(key), job);
	len = snprintf(body, sizeof(body), "%016" PRIx64 "\n", ipc_random_id() | 1);
	return s->ops->obj_put(s, key, body, (size_t)len, OBJ_REPLACE, err);
}

int store_plans_generation(struct storage *s, const char *job, uint64_t *gen, char *err)
{
	char key[STORE_KEY_MAX], *buf = NULL, *end;
	size_t len = 0;
	int rc;

	*gen = 0;
	if ((rc = ipc_check_job(job, err)))
		return rc;
	generation_key(key, sizeof(key), job);
	rc = s->ops->obj_get(s, key, 64, &buf, &len, err);
	if (rc == -ENOENT || rc == -EFBIG)
		return 0; /* none (older agents), or not ours: every file is read */
	if (rc)
		return rc;
	errno = 0;
	*gen = strtoull(buf, &end, 16);
	if (errno || end == buf || (*end && *end != '\n'))
		*gen = 0; /* not a number this code wrote: every file is read */
	free(buf);
	return 0;
}

int store_list_nodes(struct storage *s, const char *job, char ***nodes, size_t *n, char *err)
{
	char dir[STORE_KEY_MAX], **v = NULL;
	size_t cnt = 0, k = 0;
	int rc;

	*nodes = NULL;
	*n = 0;
	if ((rc = ipc_check_job(job, err)))
		return rc;
	snprintf(dir, sizeof(dir), "%s/plans", job);
	rc = s->ops->obj_list(s, dir, &v, &cnt, err);
	if (rc == -ENOENT)
		return 0;
	if (rc)
		return rc;
	for (size_t i = 0; i < cnt; i++) {
		size_t l = strlen(v[i]);

		/* "<node>.json" with a valid node name; anything else is not ours */
		if (l > 5 && strcmp(v[i] + l - 5, ".json") == 0) {
			v[i][l - 5] = '\0';
			if (ipc_check_node(v[i], NULL) == 0) {
				v[k++] = v[i];
				continue;
			}
		}
		free(v[i]);
	}
	if (k == 0) {
		free(v);
		v = NULL;
	}
	*nodes = v;
	*n = k;
	return 0;
}
