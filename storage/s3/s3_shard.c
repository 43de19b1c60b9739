/*
 * The S3 backend's shards (s3_shard.h), what their writes and reads share:
 * the shard object and the keys this agent's uploads claim, one part's
 * write or one range's read in flight (prepared and completed on the HTTP
 * thread), and the zstd threads (S3Z_THREADS, started by s3_create) that
 * compress a part before it is sent and undo the frames a read fetched.
 * The write side is s3_upload.c, the read side s3_read.c; the layout and
 * the threads are described at the top of s3.c.
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

/* A shard file name of ours: one component, nothing but [A-Za-z0-9._-]. */
int s3_check_file(const char *file, char *err)
{
	size_t n = strnlen(file, SHARD_FILE_MAX);

	if (n == 0 || n >= SHARD_FILE_MAX || file[0] == '.')
		return ipc_errf(err, -EINVAL, "shard name '%.64s': not a shard file name", file);
	for (size_t i = 0; i < n; i++)
		if (!((file[i] >= 'a' && file[i] <= 'z') || (file[i] >= 'A' && file[i] <= 'Z') ||
		      (file[i] >= '0' && file[i] <= '9') || file[i] == '.' || file[i] == '_' ||
		      file[i] == '-'))
			return ipc_errf(err, -EINVAL,
			                "shard name '%.64s': byte %zu (0x%02x) is not allowed",
			                file, i, (unsigned char)file[i]);
	return 0;
}

bool s3_writing(struct s3 *s, const char *key)
{
	bool found = false;

	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < s->nwriting && !found; i++)
		found = strcmp(s->writing[i], key) == 0;
	pthread_mutex_unlock(&s->mu);
	return found;
}

/* Claims key for an upload of this agent: false if one is open for it already. */
bool s3_claim(struct s3 *s, const char *key)
{
	bool ok = true;

	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < s->nwriting && ok; i++)
		ok = strcmp(s->writing[i], key) != 0;
	if (ok && s->nwriting == s->capwriting) {
		size_t cap = s->capwriting ? s->capwriting * 2 : 16;
		char(*v)[S3_KEY_MAX] = realloc(s->writing, cap * sizeof(*v));

		if (v)
			s->writing = v, s->capwriting = cap;
		else
			ok = false;
	}
	if (ok)
		snprintf(s->writing[s->nwriting++], S3_KEY_MAX, "%s", key);
	pthread_mutex_unlock(&s->mu);
	return ok;
}

void s3_unclaim(struct s3 *s, const char *key)
{
	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < s->nwriting; i++)
		if (strcmp(s->writing[i], key) == 0) {
			memmove(s->writing[i], s->writing[s->nwriting - 1], S3_KEY_MAX);
			s->nwriting--;
			break;
		}
	pthread_mutex_unlock(&s->mu);
}

void s3_shard_fail(struct storage_shard *sh, const char *why)
{
	pthread_mutex_lock(&sh->mu);
	if (!sh->why[0])
		snprintf(sh->why, sizeof(sh->why), "%s", why);
	pthread_mutex_unlock(&sh->mu);
}

void s3_shard_free(struct storage_shard *sh)
{
	if (!sh)
		return;
	if (sh->write)
		s3_unclaim(sh->s, sh->key);
	s3req_clear(&sh->fin);
	pthread_mutex_destroy(&sh->mu);
	free(sh->etag);
	free(sh->zf);
	free(sh->ztab);
	s3z_table_free(&sh->zt);
	free(sh);
}

struct storage_shard *s3_shard_new(struct s3 *s, bool write)
{
	struct storage_shard *sh = calloc(1, sizeof(*sh));

	if (!sh)
		return NULL;
	sh->s = s;
	sh->write = write;
	pthread_mutex_init(&sh->mu, NULL);
	return sh;
}

/* The HTTP thread: before the request goes out, the caller's prep (a save aborted). */
static void io_prep(struct s3req *q)
{
	struct s3_io *x = q->ctx;

	if (x->io->prep)
		x->io->prep(x->io);
	if (!x->io->len)
		q->skip = true;
}

/* The HTTP thread: a compressed read's frames came; the bytes asked for from them. */
static int64_t unzip(struct s3_io *x)
{
	struct storage_shard *sh = x->sh;
	char why[IPC_ERRLEN], msg[IPC_ERRLEN];
	int rc;

	if (x->q.length != x->q.range_len) {
		snprintf(msg, sizeof(msg), "%s: %llu bytes of frames read as %llu", sh->key,
		         (unsigned long long)x->q.range_len, (unsigned long long)x->q.length);
		s3_shard_fail(sh, msg);
		return -EIO;
	}
	rc = s3z_inflate(&sh->zt, x->zfirst, x->zbuf, x->zoff, x->io->buf, x->zlen, why);
	if (rc) {
		snprintf(msg, sizeof(msg), "%s: %s", sh->key, why);
		s3_shard_fail(sh, msg);
		return rc;
	}
	return (int64_t)x->zlen;
}

static void io_done(struct s3req *q)
{
	struct s3_io *x = q->ctx;
	struct io_req *io = x->io;

	if (q->skip) {
		io->res = 0;
	} else if (q->res) {
		s3_shard_fail(x->sh, q->err);
		io->res = q->res;
	} else if (q->method == S3_GET && x->zbuf) {
		s3_zqueue(x->sh->s, x); /* the frames undone there; it completes io */
		return;
	} else if (q->method == S3_GET) {
		io->res = (int64_t)q->length;
	} else if (x->sh->upload[0] && !q->etag[0]) {
		s3_shard_fail(x->sh, "the store's reply to a part has no usable ETag");
		io->res = -EPROTO;
	} else {
		snprintf(x->sh->etag[x->part], S3_ETAG_MAX, "%s", q->etag);
		io->res = (int64_t)io->len;
	}
	s3req_clear(q);
	free(x->zbuf);
	free(x);
	io->done(io);
}

struct s3_io *s3_io_new(struct storage_shard *sh, struct io_req *r, enum s3_method m)
{
	struct s3_io *x = malloc(sizeof(*x));

	if (!x)
		return NULL;
	s3req_init(&x->q, m, sh->key);
	x->sh = sh;
	x->io = r;
	x->zbuf = NULL;
	x->q.prep = io_prep;
	x->q.done = io_done;
	x->q.ctx = x;
	return x;
}

static int compress_part(struct storage_shard *sh, struct s3_io *x);

/* A zstd thread's job: a write's part to compress and send, or a read's frames to undo. */
static void zjob(struct s3_io *x)
{
	struct io_req *r = x->io;

	if (x->q.method == S3_GET) {
		r->res = unzip(x);
		s3req_clear(&x->q);
		free(x->zbuf);
		free(x);
		r->done(r);
		return;
	}
	/* a save aborted while its part waited here: nothing is compressed or sent */
	if (r->prep)
		r->prep(r);
	r->res = r->len ? compress_part(x->sh, x) : 0;
	if (r->res < 0 || !r->len) {
		free(x);
		r->done(r);
		return;
	}
	s3http_submit(x->sh->s->http, &x->q);
}

/* Hands x to the zstd threads; once they are stopped, does it here. */
void s3_zqueue(struct s3 *s, struct s3_io *x)
{
	bool inline_ = false;

	x->znext = NULL;
	pthread_mutex_lock(&s->zmu);
	if (s->zquit) {
		inline_ = true;
	} else {
		if (s->ztail)
			s->ztail->znext = x;
		else
			s->zhead = x;
		s->ztail = x;
		pthread_cond_signal(&s->zcv);
	}
	pthread_mutex_unlock(&s->zmu);
	if (inline_)
		zjob(x);
}

void *s3_zthread(void *arg)
{
	struct s3 *s = arg;
	struct s3_io *x;

	pthread_mutex_lock(&s->zmu);
	for (;;) {
		while (!s->zhead && !s->zquit)
			pthread_cond_wait(&s->zcv, &s->zmu);
		if (!(x = s->zhead))
			break; /* stopping, and nothing left */
		s->zhead = x->znext;
		if (!s->zhead)
			s->ztail = NULL;
		pthread_mutex_unlock(&s->zmu);
		zjob(x);
		pthread_mutex_lock(&s->zmu);
	}
	pthread_mutex_unlock(&s->zmu);
	return NULL;
}

/*
 * A compressed shard's part (s3zstd.c), on a zstd thread: its chunk
 * as one frame, padded to a part where more follow; a shard of one part
 * has the seek table after its frame. 0, or a negative errno (said).
 */
static int compress_part(struct storage_shard *sh, struct s3_io *x)
{
	uint64_t n = x->q.body_len, len;
	size_t cap = s3z_bound(n);
	char why[IPC_ERRLEN];
	int rc;

	x->zbuf = malloc(cap);
	if (!x->zbuf) {
		s3_shard_fail(sh, "out of memory for a compressed part");
		return -ENOMEM;
	}
	rc =
	    s3z_frame(sh->s->zstd_level, x->q.body, n, x->zbuf, cap, sh->upload[0] != 0, &len, why);
	if (rc) {
		free(x->zbuf);
		s3_shard_fail(sh, why);
		return rc;
	}
	sh->zf[x->part] = (struct s3z_frame){(uint32_t)len, (uint32_t)n};
	if (!sh->upload[0]) { /* the single PUT: the object whole, its table included */
		s3z_table_write(sh->zf, 1, (char *)x->zbuf + len);
		len += s3z_table_bytes(1);
		sh->stored = len;
		x->q.meta_zstd = sh->size;
	}
	x->q.body = x->zbuf;
	x->q.body_len = len;
	return 0;
}
