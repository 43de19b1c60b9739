/*
 * s3_call.c: the S3 backend's keys (a path of the layout under the root's
 * prefix) and its one blocking request (s3_call), which every other file
 * of the backend uses; under all of them, it calls none. The caller's
 * thread, blocked until the HTTP thread (s3http.c) has the answer.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "storage/s3/s3_shard.h"

/* ---- names ------------------------------------------------------------- */

int s3_key(const struct s3 *s, const char *rel, char *buf, size_t len, char *err)
{
	int n = snprintf(buf, len, "%s%s%s", s->prefix, *s->prefix ? "/" : "", rel);

	if (n < 0 || (size_t)n >= len)
		return ipc_errf(err, -ENAMETOOLONG, "key %s/%s: longer than %zu bytes", s->prefix,
		                rel, len - 1);
	return 0;
}

int s3_step_key(const struct s3 *s, const char *job, int64_t step, const char *leaf, char *buf,
                size_t len, char *err)
{
	char rel[S3_KEY_MAX];
	int rc;

	if ((rc = ipc_check_job(job, err)))
		return rc;
	snprintf(rel, sizeof(rel), "%s/step-%012lld/%s", job, (long long)step, leaf);
	return s3_key(s, rel, buf, len, err);
}

/* ---- requests ------------------------------------------------------------ */

int s3_call(struct s3 *s, enum s3_method m, const char *key, const char *query, uint64_t *length,
            char *err)
{
	struct s3req *q = malloc(sizeof(*q));
	int rc;

	if (!q)
		return ipc_errf(err, -ENOMEM, "out of memory");
	s3req_init(q, m, key);
	snprintf(q->query, sizeof(q->query), "%s", query ? query : "");
	rc = s3http_do(s->http, q);
	if (rc)
		ipc_errf(err, rc, "%s", q->err);
	else if (length)
		*length = q->length;
	s3req_clear(q);
	free(q);
	return rc;
}
