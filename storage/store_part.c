/*
 * store_part.c: a node's part of a step over any backend (store.h): read
 * and parsed as hostile input (its summary alone, for a committer of many
 * nodes), put create-once as this node's own object (store_put_own, also
 * the plans files'), and a part or a manifest copied byte for byte to
 * another store (the upload tier). The gate on parses at once
 * (store_parse_enter) is here, for parts and plans files alike.
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

void store_parse_enter(void)
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

void store_parse_leave(void)
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
	if ((rc = store_check_job_step(job, step, err)) || (rc = ipc_check_node(node, err)))
		return rc;
	if (summary)
		store_part_summary_key(key, sizeof(key), job, step, node);
	else
		store_part_key(key, sizeof(key), job, step, node);
	rc = s->ops->obj_get(s, key, PART_MAX_BYTES, &buf, &len, why);
	if (rc)
		return ipc_errf(err, rc, "%s", rc == -ENOENT ? key : why);
	store_parse_enter();
	rc =
	    summary ? part_summary_from_json(buf, len, &p, why) : part_from_json(buf, len, &p, why);
	store_parse_leave();
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
int store_put_own(struct storage *s, const char *key, char *json, size_t len, const char *guard,
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
	rc = store_put_own(s, key, json, len, guard, &written, err);
	if (rc) {
		free(sum);
		return rc;
	}
	return store_put_own(s, skey, sum, slen, guard, &written, err);
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
	return store_put_own(to, key, buf, len, guard, &written, err); /* takes buf */
}
