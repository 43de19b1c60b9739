/*
 * store.c: the layout and the commit's files over any backend (store.h).
 * Each function reads or writes by exact key through the backend's object
 * calls and parses what it reads as hostile input; none knows whether the
 * keys are files or objects. This file: the manifests (whether a step has
 * one; a head read alone, or whole with the parts it names; copied to the
 * upload tier); store_key.c: the keys, under all the others;
 * store_part.c: parts, and their copies to the upload tier;
 * store_plans.c: a run's plans files, roster and shares; store_step.c:
 * owners, LATEST, pins, removal, clean-up (it asks this file, never the
 * other way); stamp.c: a file's header checked against what is claimed of
 * it. Their shared helpers: store_int.h.
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
#include "storage/store_int.h"

/* ---- manifests --------------------------------------------------------- */

bool store_committed(struct storage *s, const char *job, int64_t step)
{
	char key[STORE_KEY_MAX], why[IPC_ERRLEN];
	uint64_t size;

	store_key(key, sizeof(key), job, step, "manifest.json");
	return s->ops->obj_stat(s, key, &size, why) == 0;
}

int store_read_manifest_head(struct storage *s, const char *job, int64_t step,
                             struct manifest **out, char *err)
{
	char key[STORE_KEY_MAX], why[IPC_ERRLEN], *buf = NULL;
	struct manifest *m = NULL;
	size_t len = 0;
	int rc;

	*out = NULL;
	if ((rc = store_check_job_step(job, step, err)))
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

	if ((rc = store_check_job_step(job, step, err)) || (rc = ipc_check_node(node, err)))
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
