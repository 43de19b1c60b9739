/*
 * The S3 backend's shard reads (s3_shard.h): a shard's size and whether it
 * is compressed (HEAD), opened for reading (a compressed one's seek table
 * read and checked), ranges read by GETs straight into the caller's
 * buffer (compressed: the frames holding the range, undone on a zstd
 * thread), its removal and its path in words.
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

/*
 * A shard's HEAD: the object's size on the store, and the shard's (which
 * differ when it is compressed: *zsize is then the shard's, else 0).
 */
static int head_shard(struct s3 *s, const char *key, uint64_t *object, uint64_t *zsize, char *err)
{
	struct s3req *q = malloc(sizeof(*q));
	int rc;

	if (!q)
		return ipc_errf(err, -ENOMEM, "out of memory");
	s3req_init(q, S3_HEAD, key);
	rc = s3http_do(s->http, q);
	if (rc)
		ipc_errf(err, rc, "%s", q->err);
	else if (q->zstd_size == UINT64_MAX || (q->zstd_size && q->length < s3z_table_bytes(1)))
		rc = ipc_errf(err, -EBADMSG,
		              "%s: its x-amz-meta-ckpt-zstd is no size, or it holds no seek table",
		              key);
	*object = q->length;
	*zsize = q->zstd_size;
	free(q);
	return rc;
}

int s3_shard_stat(struct storage *st, const char *job, int64_t step, const char *file,
                  uint64_t *size, char *err)
{
	char key[S3_KEY_MAX];
	uint64_t object, z;
	int rc;

	if ((rc = s3_check_file(file, err)) ||
	    (rc = s3_step_key(to_s3(st), job, step, file, key, sizeof(key), err)) ||
	    (rc = head_shard(to_s3(st), key, &object, &z, err)))
		return rc;
	*size = z ? z : object;
	return 0;
}

/* Bytes [off, off + len) of an object into buf, waited for: exactly len, or an error. */
static int get_range(struct s3 *s, const char *key, uint64_t off, uint64_t len, void *buf,
                     char *err)
{
	struct s3req *q = malloc(sizeof(*q));
	int rc;

	if (!q)
		return ipc_errf(err, -ENOMEM, "out of memory");
	s3req_init(q, S3_GET, key);
	q->ranged = true;
	q->range_off = off;
	q->range_len = len;
	q->into = buf;
	q->into_cap = len;
	rc = s3http_do(s->http, q);
	if (rc)
		ipc_errf(err, rc, "%s", q->err);
	else if (q->length != len)
		rc = ipc_errf(err, -EIO, "%s: %llu bytes at %llu read as %llu", key,
		              (unsigned long long)len, (unsigned long long)off,
		              (unsigned long long)q->length);
	s3req_clear(q);
	free(q);
	return rc;
}

/* A compressed shard's seek table, from the end of its object (object bytes). */
static int read_table(struct storage_shard *sh, uint64_t object, char *err)
{
	unsigned char foot[9];
	char why[IPC_ERRLEN];
	unsigned n;
	uint64_t tb;
	void *t;
	int rc;

	if (object < s3z_table_bytes(1))
		return ipc_errf(err, -EBADMSG, "%s: %llu bytes hold no seek table", sh->key,
		                (unsigned long long)object);
	if ((rc = get_range(sh->s, sh->key, object - sizeof(foot), sizeof(foot), foot, err)))
		return rc;
	if ((rc = s3z_footer(foot, &n, why)))
		return ipc_errf(err, rc, "%s: %s", sh->key, why);
	tb = s3z_table_bytes(n);
	if (tb > object)
		return ipc_errf(err, -EBADMSG, "%s: a seek table of %u frames in %llu bytes",
		                sh->key, n, (unsigned long long)object);
	t = malloc(tb);
	if (!t)
		return ipc_errf(err, -ENOMEM, "out of memory");
	rc = get_range(sh->s, sh->key, object - tb, tb, t, err);
	if (!rc && (rc = s3z_table_parse(t, tb, object, sh->size, &sh->zt, why)))
		ipc_errf(err, rc, "%s: %s", sh->key, why);
	free(t);
	return rc;
}

int s3_shard_open(struct storage *st, const char *job, int64_t step, const char *file,
                  struct storage_shard **out, uint64_t *size, char *err)
{
	struct storage_shard *sh = s3_shard_new(to_s3(st), false);
	uint64_t z;
	int rc;

	*out = NULL;
	if (!sh)
		return ipc_errf(err, -ENOMEM, "out of memory");
	snprintf(sh->file, sizeof(sh->file), "%s", file);
	if ((rc = s3_check_file(file, err)) ||
	    (rc = s3_step_key(sh->s, job, step, file, sh->key, sizeof(sh->key), err)) ||
	    (rc = head_shard(sh->s, sh->key, &sh->stored, &z, err))) {
		s3_shard_free(sh);
		return rc;
	}
	sh->size = z ? z : sh->stored;
	sh->z = z != 0;
	if (sh->z && (rc = read_table(sh, sh->stored, err))) {
		s3_shard_free(sh);
		return rc;
	}
	*size = sh->size;
	*out = sh;
	return 0;
}

/*
 * A compressed shard's read: the frames holding the bytes asked for, whole,
 * into a buffer of their own; io_done decompresses them into the caller's.
 */
static int zread(struct storage_shard *sh, struct s3_io *x, uint64_t len)
{
	const struct s3z_table *t = &sh->zt;
	uint64_t off = x->io->off;
	unsigned a = s3z_find(t, off), b = s3z_find(t, off + len - 1);
	uint64_t c0 = a ? t->cend[a - 1] : 0, c1 = t->cend[b];

	x->zoff = off;
	x->zlen = len;
	x->zfirst = a;
	x->zbuf = malloc(c1 - c0);
	if (!x->zbuf)
		return -ENOMEM;
	x->q.ranged = true;
	x->q.range_off = c0;
	x->q.range_len = c1 - c0;
	x->q.into = x->zbuf;
	x->q.into_cap = c1 - c0;
	return 0;
}

/* A ranged GET straight into the caller's buffer; past the end: the bytes there are. */
void s3_shard_read(struct storage_shard *sh, struct io_req *r)
{
	struct s3_io *x = s3_io_new(sh, r, S3_GET);
	uint64_t len = r->off >= sh->size ? 0 : sh->size - r->off;

	if (!x) {
		r->res = -ENOMEM;
		r->done(r);
		return;
	}
	if (len > r->len)
		len = r->len;
	if (sh->z && len) {
		if (zread(sh, x, len)) {
			free(x);
			r->res = -ENOMEM;
			r->done(r);
			return;
		}
		s3http_submit(sh->s->http, &x->q);
		return;
	}
	x->q.ranged = true;
	x->q.range_off = r->off;
	x->q.range_len = len;
	x->q.into = r->buf;
	x->q.into_cap = len;
	x->q.skip = len == 0;
	s3http_submit(sh->s->http, &x->q);
}

int s3_shard_unlink(struct storage *st, const char *job, int64_t step, const char *file, char *err)
{
	struct s3 *s = to_s3(st);
	char key[S3_KEY_MAX];
	int rc;

	if ((rc = s3_check_file(file, err)) ||
	    (rc = s3_step_key(s, job, step, file, key, sizeof(key), err)))
		return rc;
	return s3_call(s, S3_DELETE, key, NULL, NULL, err);
}

void s3_shard_path(struct storage *st, const char *job, int64_t step, const char *file, char *buf,
                   size_t len)
{
	struct s3 *s = to_s3(st);
	char key[S3_KEY_MAX];

	if (s3_step_key(s, job, step, file, key, sizeof(key), NULL))
		snprintf(key, sizeof(key), "%s/...", job);
	s3http_name(s->http, key, buf, len);
}
