/*
 * The S3 backend (storage.h, docs/DESIGN.md §8.1): the layout of §6.1 as keys under
 * s3://BUCKET/PREFIX of any S3-compatible store, behind struct storage_ops.
 * This file: the backend (its small objects, the root check, its start:
 * s3_create and the create-once probe, the storage_ops table); s3_call.c:
 * the keys and one request, under all the others;
 * s3_shard.c, s3_upload.c, s3_read.c: its shards (s3_shard.h);
 * s3_conf.c: the root's URL and the credentials; s3_scan.c: listings,
 * removal, clean-up; s3http.c: the requests.
 *
 * A shard is one multipart upload whose parts are the staging chunks the
 * save writes (part n = bytes [(n-1) * chunk, n * chunk), no copy: the
 * body is the chunk itself), several in flight; each part's ETag is kept
 * and the upload completed by shard_finish, which then reads the object's
 * size back (HEAD): DURABLE means the store has the whole shard. A shard
 * of one chunk or less is a single PUT. With [s3]/[upload] compress, each
 * part is its chunk as one zstd frame, and a last part holds the seek
 * table (s3zstd.c); reads then fetch whole frames. Frames are made and
 * undone on the backend's zstd threads, never on the writer's (a save's
 * capture does not wait for them) nor on the HTTP thread. An upload that does not complete is
 * aborted when its shard is closed (no part is left behind); stale ones of this node's keys are
 * aborted by the clean-up. A shard is never written over: its name is one that no object holds
 * (HEAD) and no upload of this agent is open for.
 *
 * Small objects are single PUTs (an object appears whole or not at all).
 * Create-once is If-None-Match: * where the store honours it, which the
 * backend probes at start with a scratch key; where it does not, a HEAD
 * then a PUT, and the committer lets only the node hosting rank 0 write
 * manifests (s3_create_once). Nothing is decided by a listing: readers
 * go by exact keys.
 *
 * Threads: calls run on the caller's thread and block on their requests;
 * shard reads and writes complete on the HTTP thread (s3http.c), or, when
 * compressed, on a zstd thread (S3Z_THREADS of them, always started: an
 * agent that does not compress still reads objects that are).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/s3/s3_shard.h"

/* HEAD of a key: its size; -ENOENT if not there. */
static int head(struct s3 *s, const char *key, uint64_t *size, char *err)
{
	return s3_call(s, S3_HEAD, key, NULL, size, err);
}

/* ---- small objects ------------------------------------------------------- */

static int s3_obj_put(struct storage *st, const char *rel, const void *buf, size_t len,
                      enum obj_put_mode mode, char *err)
{
	struct s3 *s = to_s3(st);
	bool once = !(mode & OBJ_REPLACE);
	struct s3req *q;
	char key[S3_KEY_MAX];
	int rc;

	/* OBJ_IN_PLACE: a store has no directories to be taken out of sight */
	if ((rc = s3_key(s, rel, key, sizeof(key), err)))
		return rc;
	if (once && !s->create_once) { /* a look, then the PUT: one writer (s3_create_once) */
		rc = head(s, key, NULL, err);
		if (rc == 0)
			return ipc_errf(err, -EEXIST, "%s exists", key);
		if (rc != -ENOENT)
			return rc;
	}
	q = malloc(sizeof(*q));
	if (!q)
		return ipc_errf(err, -ENOMEM, "out of memory");
	s3req_init(q, S3_PUT, key);
	q->body = buf;
	q->body_len = len;
	q->if_none_match = once && s->create_once;
	rc = s3http_do(s->http, q);
	if (rc == -EEXIST)
		ipc_errf(err, rc, "%s exists", key);
	else if (rc)
		ipc_errf(err, rc, "%s", q->err);
	s3req_clear(q);
	free(q);
	return rc;
}

static int s3_obj_get(struct storage *st, const char *rel, size_t max, char **buf, size_t *len,
                      char *err)
{
	struct s3 *s = to_s3(st);
	char key[S3_KEY_MAX];
	struct s3req *q;
	int rc;

	*buf = NULL;
	if ((rc = s3_key(s, rel, key, sizeof(key), err)))
		return rc;
	q = malloc(sizeof(*q));
	if (!q)
		return ipc_errf(err, -ENOMEM, "out of memory");
	s3req_init(q, S3_GET, key);
	q->reply_max = max;
	rc = s3http_do(s->http, q);
	if (rc) {
		ipc_errf(err, rc, "%s", q->err);
	} else {
		*buf = q->reply ? q->reply : calloc(1, 1);
		*len = q->reply_len;
		q->reply = NULL;
		if (!*buf)
			rc = ipc_errf(err, -ENOMEM, "out of memory");
	}
	s3req_clear(q);
	free(q);
	return rc;
}

static int s3_obj_stat(struct storage *st, const char *rel, uint64_t *size, char *err)
{
	char key[S3_KEY_MAX];
	int rc = s3_key(to_s3(st), rel, key, sizeof(key), err);

	return rc ? rc : head(to_s3(st), key, size, err);
}

static int s3_obj_delete(struct storage *st, const char *rel, char *err)
{
	struct s3 *s = to_s3(st);
	char key[S3_KEY_MAX];
	int rc;

	/* S3 answers 204 whether or not the key was there: a look first */
	if ((rc = s3_key(s, rel, key, sizeof(key), err)) || (rc = head(s, key, NULL, err)))
		return rc;
	return s3_call(s, S3_DELETE, key, NULL, NULL, err);
}

static int s3_step_tidy(struct storage *st, const char *job, int64_t step, char *err)
{
	(void)st, (void)job, (void)step, (void)err;
	return 0; /* no directories: nothing of the layout is left behind */
}

/* The bucket is there and ours to write: HEAD of the bucket. */
static int s3_root_check(struct storage *st, bool *reopened, char *err)
{
	struct s3 *s = to_s3(st);
	char why[IPC_ERRLEN];
	unsigned pending;
	int rc;

	*reopened = false;
	rc = s3_call(s, S3_HEAD, "", NULL, NULL, why);
	if (rc == -ENOENT)
		ipc_errf(err, rc, "bucket %s at %s: no such bucket (HTTP 404)", s->bucket,
		         s->endpoint);
	else if (rc)
		ipc_errf(err, rc, "bucket %s at %s: %s", s->bucket, s->endpoint, why);
	pthread_mutex_lock(&s->mu);
	pending = s->nunaborted;
	pthread_mutex_unlock(&s->mu);
	if (!rc && pending)
		s3_abort_again(s);
	return rc;
}

static void s3_describe(struct storage *st, char *buf, size_t len)
{
	struct s3 *s = to_s3(st);
	struct s3http_stats hs;
	char zs[32] = "";

	if (s->zstd_level)
		snprintf(zs, sizeof(zs), " (zstd level %d)", s->zstd_level);
	s3http_get_stats(s->http, &hs);
	snprintf(buf, len,
	         "S3 at %s, %u connections, parts of %llu MiB%s, create-once by %s; %llu requests, "
	         "%llu retried, %llu failed, %u in flight",
	         s->endpoint, s->connections, (unsigned long long)(s->part_bytes >> 20), zs,
	         s->create_once ? "If-None-Match" : "one writer (rank 0's node)",
	         (unsigned long long)hs.requests, (unsigned long long)hs.retries,
	         (unsigned long long)hs.failures, hs.inflight);
}

static void s3_stats(struct storage *st, struct storage_stats *out)
{
	struct s3http_stats hs;

	s3http_get_stats(to_s3(st)->http, &hs);
	out->bytes_written = hs.bytes_up;
	out->bytes_read = hs.bytes_down;
	out->errors = hs.failures;
	out->retries = hs.retries;
}

static void s3_destroy(struct storage *st)
{
	struct s3 *s = to_s3(st);

	/* the zstd threads first: what they hold goes to the HTTP thread */
	pthread_mutex_lock(&s->zmu);
	s->zquit = true;
	pthread_cond_broadcast(&s->zcv);
	pthread_mutex_unlock(&s->zmu);
	for (unsigned i = 0; i < s->nz; i++)
		pthread_join(s->zthr[i], NULL);
	s3http_destroy(s->http);
	pthread_mutex_destroy(&s->zmu);
	pthread_cond_destroy(&s->zcv);
	while (s->unaborted) {
		struct s3_unaborted *u = s->unaborted;

		s->unaborted = u->next;
		free(u);
	}
	free(s->writing);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

static const struct storage_ops s3_ops = {
    .name = "s3",
    .shard_create = s3_shard_create,
    .shard_create_as = s3_shard_create_as,
    .shard_write = s3_shard_write,
    .shard_finish = s3_shard_finish,
    .shard_open = s3_shard_open,
    .shard_read = s3_shard_read,
    .shard_close = s3_shard_close,
    .shard_stat = s3_shard_stat,
    .shard_unlink = s3_shard_unlink,
    .shard_path = s3_shard_path,
    .shard_error = s3_shard_error,
    .obj_put = s3_obj_put,
    .obj_get = s3_obj_get,
    .obj_stat = s3_obj_stat,
    .obj_delete = s3_obj_delete,
    .obj_sync = NULL,
    .obj_list = s3_obj_list,
    .list_jobs = s3_list_jobs,
    .list_steps = s3_list_steps,
    .step_tidy = s3_step_tidy,
    .remove = s3_remove,
    .cleanup = s3_cleanup,
    .root_check = s3_root_check,
    .describe = s3_describe,
    .stats = s3_stats,
    .destroy = s3_destroy,
};

/*
 * Whether the store honours If-None-Match: * on PUT: a scratch key put
 * twice; the second must be refused (412).
 */
static int probe_create_once(struct s3 *s, char *err)
{
	char rel[128], key[S3_KEY_MAX], why[IPC_ERRLEN];
	uint64_t rnd = 0;
	int rc, again;

	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
		rnd = (uint64_t)getpid();
	snprintf(rel, sizeof(rel), ".ckptd/probe.%s.%016llx", s->node, (unsigned long long)rnd);
	if ((rc = s3_key(s, rel, key, sizeof(key), err)))
		return rc;
	s->create_once = true;
	rc = s3_obj_put(&s->base, rel, "probe", 5, OBJ_CREATE, err);
	if (rc)
		return rc;
	again = s3_obj_put(&s->base, rel, "probe", 5, OBJ_CREATE, why);
	s->create_once = again == -EEXIST;
	if (again && again != -EEXIST)
		rc = ipc_errf(err, again, "%s", why);
	s3_obj_delete(&s->base, rel, why);
	return rc;
}

/* What s3_create refuses before it makes anything: 0, or -EINVAL and why. */
static int check_opts(const struct s3_opts *o, char *err)
{
	if (!o->endpoint || !*o->endpoint)
		return ipc_errf(err, -EINVAL,
		                "root %s: no endpoint: set [s3] endpoint (http://host:port or "
		                "https://host)",
		                o->root);
	if (strncmp(o->endpoint, "http://", 7) && strncmp(o->endpoint, "https://", 8))
		return ipc_errf(err, -EINVAL,
		                "[s3] endpoint %s: expected http://HOST[:PORT] or "
		                "https://HOST[:PORT]",
		                o->endpoint);
	if (!o->credentials || !*o->credentials)
		return ipc_errf(err, -EINVAL,
		                "root %s: no credentials: set [s3] credentials = FILE (access_key "
		                "= ... and secret_key = ... lines, mode 0600)",
		                o->root);
	if (o->part_bytes < S3_MIN_PART)
		return ipc_errf(err, -EINVAL,
		                "root %s: the staging chunk (%llu MiB) is each part of an upload, "
		                "and S3 parts are at least 5 MiB: --chunk-mb 5 or more",
		                o->root, (unsigned long long)(o->part_bytes >> 20));
	return 0;
}

int s3_create(const struct s3_opts *o, struct storage **out, char *err)
{
	struct s3http_opts ho = {0};
	char access[256], secret[256], why[IPC_ERRLEN];
	bool reopened;
	struct s3 *s;
	int rc;

	*out = NULL;
	if ((rc = check_opts(o, err)))
		return rc;
	s = calloc(1, sizeof(*s));
	if (!s)
		return ipc_errf(err, -ENOMEM, "out of memory");
	storage_init(&s->base, &s3_ops);
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->zmu, NULL);
	pthread_cond_init(&s->zcv, NULL);
	s->part_bytes = o->part_bytes;
	s->zstd_level = o->zstd_level;
	s->connections = o->connections ? o->connections : 8;
	snprintf(s->node, sizeof(s->node), "%s", o->node);
	snprintf(s->endpoint, sizeof(s->endpoint), "%s", o->endpoint);
	rc =
	    s3_root_parse(o->root, s->bucket, sizeof(s->bucket), s->prefix, sizeof(s->prefix), err);
	if (rc)
		goto fail;
	rc = s3_read_credentials(o->credentials, access, secret, sizeof(access), err);
	if (rc)
		goto fail;
	ho = (struct s3http_opts){
	    o->endpoint,  s->bucket,    o->virtual_host, o->region ? o->region : "us-east-1",
	    access,       secret,       s->connections,  o->max_tries,
	    o->timeout_s, o->backoff_ms};
	rc = s3http_create(&ho, &s->http, err);
	explicit_bzero(access, sizeof(access));
	explicit_bzero(secret, sizeof(secret));
	if (rc)
		goto fail;
	rc = s3_root_check(&s->base, &reopened, err);
	if (rc)
		goto fail;
	rc = probe_create_once(s, why);
	if (rc) {
		rc = ipc_errf(err, rc, "root %s: cannot write to it: %s", o->root, why);
		goto fail;
	}
	for (unsigned i = 0; i < S3Z_THREADS; i++) {
		if ((rc = -pthread_create(&s->zthr[i], NULL, s3_zthread, s))) {
			ipc_errf(err, rc, "root %s: no zstd thread: %s", o->root, strerror(-rc));
			goto fail;
		}
		s->nz++;
	}
	*out = &s->base;
	return 0;
fail:
	s3_destroy(&s->base);
	return rc;
}

bool s3_create_once(const struct storage *st)
{
	return st->ops != &s3_ops || ((const struct s3 *)st)->create_once;
}
