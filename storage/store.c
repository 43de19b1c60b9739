/*
 * store.c: the layout and the commit's files over any backend (store.h).
 * Each function reads or writes by exact key through the backend's object
 * calls and parses what it reads as hostile input; none knows whether the
 * keys are files or objects.
 *
 * Callers: the agent's workers (commit, maint), ckptd's start-up; any
 * thread, several at once. One mutex orders this process's read-modify-
 * write of LATEST; writers on other nodes are ordered by reading back.
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
#include "storage/store.h"

#define LATEST_MAX 64 /* bytes of LATEST we read: "999999999999\n" is 13 */
#define LATEST_TRIES 3

/* ---- keys -------------------------------------------------------------- */

void store_key(char *buf, size_t len, const char *job, int64_t step, const char *leaf)
{
	char sn[32] = "";

	if (step >= 0)
		snprintf(sn, sizeof(sn), "/step-%012" PRId64, step);
	snprintf(buf, len, "%s%s%s%s", job, sn, leaf ? "/" : "", leaf ? leaf : "");
}

void store_part_key(char *buf, size_t len, const char *job, int64_t step, const char *node)
{
	char leaf[IPC_MAX_JOB + 16];

	snprintf(leaf, sizeof(leaf), "parts/%s.json", node);
	store_key(buf, len, job, step, leaf);
}

void store_part_summary_key(char *buf, size_t len, const char *job, int64_t step, const char *node)
{
	char leaf[IPC_MAX_JOB + 16];

	snprintf(leaf, sizeof(leaf), "parts/%s.sum", node);
	store_key(buf, len, job, step, leaf);
}

void store_plans_key(char *buf, size_t len, const char *job, const char *node)
{
	snprintf(buf, len, "%s/plans/%s.json", job, node);
}

void store_plans_summary_key(char *buf, size_t len, const char *job, const char *node)
{
	snprintf(buf, len, "%s/plans/%s.sum", job, node);
}

static int check_job_step(const char *job, int64_t step, char *err)
{
	int rc = ipc_check_job(job, err);

	return rc ? rc : ipc_check_step(step, err);
}

/* ---- manifests --------------------------------------------------------- */

int store_read_manifest_head(struct storage *s, const char *job, int64_t step,
                             struct manifest **out, char *err)
{
	char key[STORE_KEY_MAX], why[IPC_ERRLEN], *buf = NULL;
	struct manifest *m = NULL;
	size_t len = 0;
	int rc;

	*out = NULL;
	if ((rc = check_job_step(job, step, err)))
		return rc;
	store_key(key, sizeof(key), job, step, "manifest.json");
	rc = s->ops->obj_get(s, key, MANIFEST_MAX_BYTES, &buf, &len, why);
	if (rc == -ENOENT)
		return ipc_errf(err, rc, "job '%s' step %" PRId64 " is not committed (no %s)", job,
		                step, key);
	if (rc)
		return ipc_errf(err, rc, "%s", why);
	rc = manifest_from_json(buf, len, &m, why);
	free(buf);
	if (rc)
		return ipc_errf(err, rc, "%s: %s", key, why);
	if (strcmp(m->job, job) != 0 || m->step != step) {
		rc = ipc_errf(err, -EINVAL,
		              "%s names job '%s' step %" PRId64 ": it was copied or moved here; "
		              "delete the step",
		              key, m->job, m->step);
		manifest_free(m);
		return rc;
	}
	*out = m;
	return 0;
}

/* The parts a head names, read at once. */
struct head_read {
	struct storage *s;
	const struct manifest *head;
	struct part **parts;
	int *rc;
	char (*why)[IPC_ERRLEN];
};

static void read_named_part(void *arg, size_t i)
{
	struct head_read *h = arg;

	h->rc[i] = store_read_part(h->s, h->head->job, h->head->step, h->head->parts[i].node,
	                           &h->parts[i], h->why[i]);
}

static int assemble(struct storage *s, const struct manifest *head, struct manifest **out,
                    char *err)
{
	size_t n = head->nparts;
	struct head_read h = {s, head, calloc(n, sizeof(*h.parts)), calloc(n, sizeof(int)),
	                      calloc(n, IPC_ERRLEN)};
	int rc = 0;

	if (!h.parts || !h.rc || !h.why) {
		rc = ipc_errf(err, -ENOMEM, "out of memory reading %zu parts", n);
		goto out;
	}
	fanout_run(n, FANOUT_WIDTH, read_named_part, &h);
	for (size_t i = 0; i < n && !rc; i++)
		if (h.rc[i] == -ENOENT && !store_committed(s, head->job, head->step))
			rc = ipc_errf(err, -ENOENT,
			              "job '%s' step %" PRId64 " was removed as it was read",
			              head->job, head->step);
	for (size_t i = 0; i < n && !rc; i++)
		if (h.rc[i])
			/* named by the commit: missing or unreadable is damage, not absence */
			rc = ipc_errf(err, h.rc[i] == -ENOMEM ? -ENOMEM : -EBADMSG,
			              "job '%s' step %" PRId64 ": the part its manifest names for "
			              "node %s: %s",
			              head->job, head->step, head->parts[i].node,
			              h.rc[i] == -ENOENT ? "not there" : h.why[i]);
	if (!rc && (rc = manifest_assemble(head, h.parts, n, out, h.why[0])))
		ipc_errf(err, rc, "job '%s' step %" PRId64 ": %s", head->job, head->step, h.why[0]);
out:
	for (size_t i = 0; h.parts && i < n; i++)
		part_free(h.parts[i]);
	free(h.parts);
	free(h.rc);
	free(h.why);
	return rc;
}

int store_read_manifest(struct storage *s, const char *job, int64_t step, struct manifest **out,
                        char *err)
{
	struct manifest *head = NULL;
	int rc = store_read_manifest_head(s, job, step, &head, err);

	*out = NULL;
	if (rc || !head->head_only) {
		*out = head;
		return rc;
	}
	rc = assemble(s, head, out, err);
	manifest_free(head);
	return rc;
}

int store_read_manifest_rank(struct storage *s, const char *job, int64_t step, int rank,
                             struct manifest **out, char *err)
{
	struct manifest *head = NULL;
	struct part *p = NULL;
	char why[IPC_ERRLEN];
	size_t at = SIZE_MAX;
	int rc = store_read_manifest_head(s, job, step, &head, err);

	*out = NULL;
	if (rc || !head->head_only) {
		*out = head;
		return rc;
	}
	for (size_t i = 0; i < head->nparts && at == SIZE_MAX; i++)
		for (size_t j = 0; j < head->parts[i].nranks; j++)
			at = head->parts[i].ranks[j] == rank ? i : at;
	if (at == SIZE_MAX) { /* a rank past the saving world: what the whole says */
		rc = assemble(s, head, out, err);
		goto out;
	}
	rc = store_read_part(s, job, step, head->parts[at].node, &p, why);
	if (rc == -ENOENT && !store_committed(s, job, step))
		rc = ipc_errf(err, -ENOENT, "job '%s' step %" PRId64 " was removed as it was read",
		              job, step);
	else if (rc && rc != -ENOMEM)
		rc = ipc_errf(err, -EBADMSG,
		              "job '%s' step %" PRId64 ": the part its manifest names for node %s: "
		              "%s",
		              job, step, head->parts[at].node, rc == -ENOENT ? "not there" : why);
	else if (rc)
		ipc_errf(err, rc, "%s", why);
	if (!rc && (rc = manifest_assemble_some(head, &at, &p, 1, out, why)))
		rc = ipc_errf(err, rc, "job '%s' step %" PRId64 ": %s", job, step, why);
out:
	part_free(p);
	manifest_free(head);
	return rc;
}

int store_step_intact(struct storage *s, const char *job, int64_t step, char *err)
{
	struct manifest *m = NULL;
	char why[IPC_ERRLEN];
	int rc = store_read_manifest(s, job, step, &m, why);

	if (rc == -EINVAL || rc == -EFBIG)
		return ipc_errf(err, -EBADMSG, "%s", why);
	if (rc)
		return ipc_errf(err, rc, "%s", why);
	rc = store_files_intact(s, m, err);
	manifest_free(m);
	return rc;
}

int store_retire_manifest(struct storage *s, const char *job, int64_t step, const char *node,
                          char *err)
{
	char key[STORE_KEY_MAX], aside[STORE_KEY_MAX], leaf[IPC_MAX_JOB + 64], *buf = NULL;
	size_t len = 0;
	int rc;

	if ((rc = check_job_step(job, step, err)) || (rc = ipc_check_node(node, err)))
		return rc;
	store_key(key, sizeof(key), job, step, "manifest.json");
	rc = s->ops->obj_get(s, key, MANIFEST_MAX_BYTES, &buf, &len, err);
	if (rc == -ENOENT)
		return 0; /* gone already: nothing to retire */
	if (rc && rc != -EFBIG)
		return rc;
	/*
	 * Its bytes kept beside it first (an operator may want them), then the
	 * commit undone: a crash between leaves both, and the step committed.
	 */
	snprintf(leaf, sizeof(leaf), "manifest.damaged.%s.%" PRId64 ".json", node,
	         ipc_now_ns() / 1000000000);
	store_key(aside, sizeof(aside), job, step, leaf);
	if (!rc)
		rc = s->ops->obj_put(s, aside, buf, len, OBJ_REPLACE | OBJ_IN_PLACE, err);
	free(buf);
	if (!rc || rc == -EFBIG)
		rc = s->ops->obj_delete(s, key, err);
	return rc == -ENOENT ? 0 : rc;
}

int store_put_manifest(struct storage *s, const struct manifest *m, char *err)
{
	char key[STORE_KEY_MAX], *json = NULL;
	size_t len = 0;
	int rc;

	if (m->version == MANIFEST_VERSION_HEAD && !m->head_only)
		return ipc_errf(err, -EINVAL, "a manifest of format 4 is written as its head");
	rc = manifest_to_json(m, &json, &len, err);
	if (rc)
		return rc;
	/* into the step as it is, never a step made anew (see OBJ_IN_PLACE) */
	store_key(key, sizeof(key), m->job, m->step, "manifest.json");
	rc = s->ops->obj_put(s, key, json, len, OBJ_CREATE | OBJ_IN_PLACE, err);
	free(json);
	return rc;
}

int store_sync_manifest(struct storage *s, const char *job, int64_t step, char *err)
{
	char key[STORE_KEY_MAX];

	if (!s->ops->obj_sync)
		return 0; /* durable once visible */
	store_key(key, sizeof(key), job, step, "manifest.json");
	return s->ops->obj_sync(s, key, err);
}

/* ---- parts ------------------------------------------------------------- */

/*
 * Parts and plans files parsed at once, in this process: as many as there
 * are cores. A
 * commit reads FANOUT_WIDTH parts at once to hide the storage's latency;
 * their parse is work for the CPUs, and each parse holds several times
 * the part's bytes: beyond the cores it only adds memory (and contention
 * in malloc).
 */
static pthread_mutex_t parse_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t parse_cv = PTHREAD_COND_INITIALIZER;
static long parsing;

static void parse_enter(void)
{
	static long max;

	pthread_mutex_lock(&parse_mu);
	if (!max)
		max = sysconf(_SC_NPROCESSORS_ONLN) > 0 ? sysconf(_SC_NPROCESSORS_ONLN) : 1;
	while (parsing >= max)
		pthread_cond_wait(&parse_cv, &parse_mu);
	parsing++;
	pthread_mutex_unlock(&parse_mu);
}

static void parse_leave(void)
{
	pthread_mutex_lock(&parse_mu);
	parsing--;
	pthread_cond_signal(&parse_cv);
	pthread_mutex_unlock(&parse_mu);
}

/*
 * A node's part, its bytes too (*buf, where buf is not NULL: the caller
 * frees them); or its summary (then file_size and file_xxh3 as it says).
 */
static int read_part(struct storage *s, const char *job, int64_t step, const char *node,
                     bool summary, struct part **out, char **bytes, size_t *blen, char *err)
{
	char key[STORE_KEY_MAX], why[IPC_ERRLEN], *buf = NULL;
	struct part *p = NULL;
	size_t len = 0;
	int rc;

	*out = NULL;
	if ((rc = check_job_step(job, step, err)) || (rc = ipc_check_node(node, err)))
		return rc;
	if (summary)
		store_part_summary_key(key, sizeof(key), job, step, node);
	else
		store_part_key(key, sizeof(key), job, step, node);
	rc = s->ops->obj_get(s, key, PART_MAX_BYTES, &buf, &len, why);
	if (rc)
		return ipc_errf(err, rc, "%s", rc == -ENOENT ? key : why);
	parse_enter();
	rc =
	    summary ? part_summary_from_json(buf, len, &p, why) : part_from_json(buf, len, &p, why);
	parse_leave();
	if (rc) {
		free(buf);
		return ipc_errf(err, -EINVAL, "%s: %s", key, why);
	}
	if (!summary) {
		p->file_size = len;
		p->file_xxh3 = XXH3_64bits(buf, len);
	}
	/* a part under another node's or step's name is no part of this one */
	if (strcmp(p->job, job) || p->step != step || strcmp(p->node, node)) {
		rc = ipc_errf(err, -EINVAL,
		              "%s: it is the %s of job %s step %" PRId64 " node %s: copied or "
		              "moved here",
		              key, summary ? "summary" : "part", p->job, p->step, p->node);
		part_free(p);
		free(buf);
		return rc;
	}
	if (bytes) {
		*bytes = buf;
		*blen = len;
	} else {
		free(buf);
	}
	*out = p;
	return 0;
}

int store_read_part(struct storage *s, const char *job, int64_t step, const char *node,
                    struct part **out, char *err)
{
	return read_part(s, job, step, node, false, out, NULL, NULL, err);
}

int store_read_part_summary(struct storage *s, const char *job, int64_t step, const char *node,
                            struct part **out, char *err)
{
	return read_part(s, job, step, node, true, out, NULL, NULL, err);
}

/*
 * A node's own object (its part, its plans): create-once; one of its own
 * from before in the way (an earlier attempt, a run that died, an older
 * plan set) is done if it holds the same bytes, else replaced whole.
 * *written: whether bytes went out. Takes json.
 */
static int put_own(struct storage *s, const char *key, char *json, size_t len, const char *guard,
                   bool *written, char *err)
{
	char *old = NULL;
	size_t olen = 0;
	uint64_t size;
	int rc = s->ops->obj_put(s, key, json, len, OBJ_CREATE, err);

	if (rc == -EEXIST) {
		rc = s->ops->obj_get(s, key, MANIFEST_MAX_BYTES, &old, &olen, err);
		if (rc == 0 && olen == len && memcmp(old, json, len) == 0) {
			free(old);
			free(json);
			*written = false; /* the same: done */
			return 0;
		}
		/* a part a manifest may name by its bytes (format 4) stays as it is */
		if (rc == 0 && guard && s->ops->obj_stat(s, guard, &size, err) == 0)
			rc = ipc_errf(err, -EEXIST,
			              "%s is not replaced: the step is committed (%s is there)",
			              key, guard);
		if (rc == 0)
			rc = s->ops->obj_put(s, key, json, len, OBJ_REPLACE, err);
		else if (rc == -ENOENT) /* gone meanwhile: once more, create-once */
			rc = s->ops->obj_put(s, key, json, len, OBJ_CREATE, err);
	}
	*written = rc == 0;
	free(old);
	free(json);
	return rc;
}

int store_put_part(struct storage *s, const struct part *p, char *err)
{
	char key[STORE_KEY_MAX], skey[STORE_KEY_MAX], guard[STORE_KEY_MAX], *json = NULL;
	char *sum = NULL;
	struct part id = *p; /* its bytes' length and sum, for the summary */
	size_t len = 0, slen = 0;
	bool written;
	int rc;

	rc = part_to_json(p, &json, &len, err);
	if (rc)
		return rc;
	id.file_size = len;
	id.file_xxh3 = XXH3_64bits(json, len);
	if ((rc = part_summary_to_json(&id, &sum, &slen, err))) {
		free(json);
		return rc;
	}
	store_part_key(key, sizeof(key), p->job, p->step, p->node);
	store_part_summary_key(skey, sizeof(skey), p->job, p->step, p->node);
	store_key(guard, sizeof(guard), p->job, p->step, "manifest.json");
	/*
	 * A summary is never of another part: whatever summary is there goes
	 * first (one of an earlier attempt, or left where its part went), then
	 * the part, then its summary. Without a summary a committer reads the part.
	 */
	if ((rc = s->ops->obj_delete(s, skey, err)) && rc != -ENOENT) {
		free(json);
		free(sum);
		return rc;
	}
	rc = put_own(s, key, json, len, guard, &written, err);
	if (rc) {
		free(sum);
		return rc;
	}
	return put_own(s, skey, sum, slen, guard, &written, err);
}

int store_copy_part(struct storage *from, struct storage *to, const char *job, int64_t step,
                    const char *node, char *err)
{
	char key[STORE_KEY_MAX], guard[STORE_KEY_MAX], *buf = NULL;
	struct part *p = NULL;
	size_t len = 0;
	bool written;
	int rc = read_part(from, job, step, node, false, &p, &buf, &len, err); /* checked */

	part_free(p);
	if (rc)
		return rc;
	store_part_key(key, sizeof(key), job, step, node);
	store_key(guard, sizeof(guard), job, step, "manifest.json");
	return put_own(to, key, buf, len, guard, &written, err); /* takes buf */
}

int store_copy_manifest(struct storage *from, struct storage *to, const char *job, int64_t step,
                        char *err)
{
	char key[STORE_KEY_MAX], why[IPC_ERRLEN], *buf = NULL;
	struct manifest *m = NULL;
	size_t len = 0;
	int rc = store_read_manifest_head(from, job, step, &m, err); /* checked */

	manifest_free(m);
	if (rc)
		return rc;
	store_key(key, sizeof(key), job, step, "manifest.json");
	rc = from->ops->obj_get(from, key, MANIFEST_MAX_BYTES, &buf, &len, why);
	if (rc)
		return ipc_errf(err, rc, "%s", why);
	rc = to->ops->obj_put(to, key, buf, len, OBJ_CREATE | OBJ_IN_PLACE, err);
	free(buf);
	return rc;
}

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
	parse_enter();
	rc = summary ? plans_summary_from_json(buf, len, &f, why)
	             : plans_from_json(buf, len, &f, why);
	parse_leave();
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
	rc = put_own(s, key, json, len, NULL, written, err);
	if (rc || same)
		free(sum);
	else /* without it, readers read the file: not a failure of the plans' */
		(void)put_own(s, skey, sum, slen, NULL, &wrote_sum, why);
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
	parse_enter();
	rc = roster_file_from_json(buf, len, &r, why);
	parse_leave();
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
	return put_own(s, key, json, len, NULL, &written, err); /* the same bytes: left */
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
	parse_enter();
	rc = share_from_json(buf, len, &sh, why);
	parse_leave();
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

	if ((rc = check_job_step(job, step, err)))
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

bool store_committed(struct storage *s, const char *job, int64_t step)
{
	char key[STORE_KEY_MAX], why[IPC_ERRLEN];
	uint64_t size;

	store_key(key, sizeof(key), job, step, "manifest.json");
	return s->ops->obj_stat(s, key, &size, why) == 0;
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

	if ((rc = check_job_step(job, step, err)))
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

	if ((rc = check_job_step(job, step, err)))
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
