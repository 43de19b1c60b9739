/*
 * The S3 backend (storage.h, docs/DESIGN.md §8.1): the layout of §6.1 as keys under
 * s3://BUCKET/PREFIX of any S3-compatible store, behind struct storage_ops.
 * This file: the backend, its shards and its small objects; s3_scan.c:
 * listings, removal, clean-up; s3http.c: the requests.
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

#include "storage/s3/s3.h"

struct storage_shard {
	struct s3 *s;
	char key[S3_KEY_MAX];
	char file[SHARD_FILE_MAX];
	uint64_t size;
	bool write;
	unsigned nparts;
	char upload[S3_QUERY_MAX / 2]; /* the upload's id, encoded; "": a single PUT */
	char (*etag)[S3_ETAG_MAX]; /* each part's, once written */
	unsigned nput; /* parts of the upload: nparts, and the seek table's when compressed */
	bool z; /* compressed (s3zstd.c) */
	struct s3z_frame *zf; /* writing: each part's frame */
	struct s3z_table zt; /* reading: where the frames are */
	uint64_t stored; /* the object's size on the store, once known */
	void *ztab; /* the seek table's bytes while it is sent */
	bool completed;
	pthread_mutex_t mu; /* why */
	char why[IPC_ERRLEN]; /* the first failure of its requests */
	struct s3req fin; /* completion, its size check, the abort */
	struct io_req *fin_io;
};

/* One part's write or one range's read in flight. */
struct s3_io {
	struct s3req q;
	struct storage_shard *sh;
	struct io_req *io;
	unsigned part;
	void *zbuf; /* compressed: the part's body, or the frames read */
	uint64_t zoff, zlen; /* a compressed read: the shard bytes wanted */
	unsigned zfirst; /* and the first frame fetched */
	struct s3_io *znext; /* the zstd threads' queue */
};

static void zqueue(struct s3 *s, struct s3_io *x);

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

/* A shard file name of ours: one component, nothing but [A-Za-z0-9._-]. */
static int check_file(const char *file, char *err)
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
static bool claim(struct s3 *s, const char *key)
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

static void unclaim(struct s3 *s, const char *key)
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

static void shard_fail(struct storage_shard *sh, const char *why)
{
	pthread_mutex_lock(&sh->mu);
	if (!sh->why[0])
		snprintf(sh->why, sizeof(sh->why), "%s", why);
	pthread_mutex_unlock(&sh->mu);
}

static void shard_free(struct storage_shard *sh)
{
	if (!sh)
		return;
	if (sh->write)
		unclaim(sh->s, sh->key);
	s3req_clear(&sh->fin);
	pthread_mutex_destroy(&sh->mu);
	free(sh->etag);
	free(sh->zf);
	free(sh->ztab);
	s3z_table_free(&sh->zt);
	free(sh);
}

static struct storage_shard *shard_new(struct s3 *s, bool write)
{
	struct storage_shard *sh = calloc(1, sizeof(*sh));

	if (!sh)
		return NULL;
	sh->s = s;
	sh->write = write;
	pthread_mutex_init(&sh->mu, NULL);
	return sh;
}

/* ---- shards: the write side -------------------------------------------- */

static int open_upload(struct s3 *s, struct storage_shard *sh, char *err)
{
	struct s3req *q = malloc(sizeof(*q));
	char id[S3_QUERY_MAX / 2];
	int rc;

	if (!q)
		return ipc_errf(err, -ENOMEM, "out of memory");
	s3req_init(q, S3_POST, sh->key);
	snprintf(q->query, sizeof(q->query), "uploads=");
	q->meta_zstd = sh->z ? sh->size : 0;
	rc = s3http_do(s->http, q);
	if (rc) {
		ipc_errf(err, rc, "starting the upload: %s", q->err);
		goto out;
	}
	rc = s3xml_text(q->reply ? q->reply : "", q->reply_len, "UploadId", id, sizeof(id) / 3);
	if (rc || !id[0] || s3_encode(id, sh->upload, sizeof(sh->upload))) {
		rc = ipc_errf(err, -EPROTO,
		              "starting the upload of %s: the store's reply has no "
		              "usable UploadId",
		              sh->key);
		goto out;
	}
out:
	s3req_clear(q);
	free(q);
	return rc;
}

/* The first name rank-R.<node>.<attempt> that no object holds and no upload of ours claims. */
static int pick_name(struct s3 *s, struct storage_shard *sh, const char *job, int64_t step,
                     int rank, char *err)
{
	struct s3req *q = malloc(sizeof(*q));
	int rc = -EEXIST;

	if (!q)
		return ipc_errf(err, -ENOMEM, "out of memory");
	for (unsigned attempt = 0; attempt < 1000 && rc == -EEXIST; attempt++) {
		if ((rc = shard_file_name(rank, s->node, attempt, sh->file, sizeof(sh->file))) ||
		    (rc = s3_step_key(s, job, step, sh->file, sh->key, sizeof(sh->key), err)))
			break;
		if (!claim(s, sh->key)) {
			rc = -EEXIST;
			continue;
		}
		s3req_init(q, S3_HEAD, sh->key);
		rc = s3http_do(s->http, q);
		s3req_clear(q);
		if (rc == -ENOENT) {
			rc = 0;
			break;
		}
		unclaim(s, sh->key);
		if (rc == 0)
			rc = -EEXIST;
		else
			ipc_errf(err, rc, "%s", q->err);
	}
	free(q);
	if (rc == -EEXIST)
		ipc_errf(err, rc, "no free shard name for rank %d of %s step %lld after 1000 tries",
		         rank, job, (long long)step);
	return rc;
}

static int too_many_parts(const struct s3 *s, uint64_t size, const char *file, char *err)
{
	/* no overflow: a size near 2^64 is as many parts as its whole chunks */
	uint64_t parts = size / s->part_bytes + (size % s->part_bytes != 0);

	if (parts + (s->zstd_level && parts > 1) <= S3_MAX_PARTS)
		return 0;
	return ipc_errf(err, -EFBIG,
	                "%s: a shard of %llu bytes would be %llu parts of %llu MiB; S3 allows %u: "
	                "raise --chunk-mb to %llu or more",
	                file, (unsigned long long)size, (unsigned long long)parts,
	                (unsigned long long)(s->part_bytes >> 20), S3_MAX_PARTS,
	                (unsigned long long)((size / S3_MAX_PARTS >> 20) + 1));
}

/* A claimed shard's parts, and its upload when it has more than one. */
static int shard_begin(struct s3 *s, struct storage_shard *sh, uint64_t size, char *err)
{
	uint64_t parts = size / s->part_bytes + (size % s->part_bytes != 0);

	sh->size = size;
	sh->stored = size;
	sh->nparts = parts ? (unsigned)parts : 1;
	sh->z = s->zstd_level != 0;
	sh->nput = sh->nparts + (sh->z && sh->nparts > 1);
	sh->etag = calloc(sh->nput, sizeof(*sh->etag));
	if (sh->z)
		sh->zf = calloc(sh->nparts, sizeof(*sh->zf));
	if (!sh->etag || (sh->z && !sh->zf))
		return ipc_errf(err, -ENOMEM, "out of memory");
	return sh->nparts > 1 ? open_upload(s, sh, err) : 0;
}

static int s3_shard_create(struct storage *st, const char *job, int64_t step, int rank,
                           uint64_t size, char *file, struct storage_shard **out, char *err)
{
	struct s3 *s = to_s3(st);
	struct storage_shard *sh;
	char what[32];
	int rc;

	*out = NULL;
	snprintf(what, sizeof(what), "rank %d", rank);
	if ((rc = too_many_parts(s, size, what, err)))
		return rc;
	sh = shard_new(s, true);
	if (!sh)
		return ipc_errf(err, -ENOMEM, "out of memory");
	rc = pick_name(s, sh, job, step, rank, err);
	if (rc) {
		sh->write = false; /* nothing claimed */
		shard_free(sh);
		return rc;
	}
	if ((rc = shard_begin(s, sh, size, err))) {
		shard_free(sh);
		return rc;
	}
	snprintf(file, SHARD_FILE_MAX, "%s", sh->file);
	*out = sh;
	return 0;
}

/*
 * The shard `file` of (job, step), by that name: a copy of another tier's
 * (the upload tier). An object there already is replaced when this one
 * completes: it is derived data, never named by a manifest of the tier
 * until every copy is whole.
 */
static int s3_shard_create_as(struct storage *st, const char *job, int64_t step, const char *file,
                              uint64_t size, struct storage_shard **out, char *err)
{
	struct s3 *s = to_s3(st);
	struct storage_shard *sh;
	int rc;

	*out = NULL;
	if ((rc = check_file(file, err)) || (rc = too_many_parts(s, size, file, err)))
		return rc;
	sh = shard_new(s, false);
	if (!sh)
		return ipc_errf(err, -ENOMEM, "out of memory");
	snprintf(sh->file, sizeof(sh->file), "%s", file);
	if ((rc = s3_step_key(s, job, step, file, sh->key, sizeof(sh->key), err))) {
		shard_free(sh);
		return rc;
	}
	if (!claim(s, sh->key)) {
		shard_free(sh);
		return ipc_errf(err, -EBUSY, "%s: an upload of it is under way", sh->key);
	}
	sh->write = true;
	if ((rc = shard_begin(s, sh, size, err))) {
		shard_free(sh);
		return rc;
	}
	*out = sh;
	return 0;
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
		shard_fail(sh, msg);
		return -EIO;
	}
	rc = s3z_inflate(&sh->zt, x->zfirst, x->zbuf, x->zoff, x->io->buf, x->zlen, why);
	if (rc) {
		snprintf(msg, sizeof(msg), "%s: %s", sh->key, why);
		shard_fail(sh, msg);
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
		shard_fail(x->sh, q->err);
		io->res = q->res;
	} else if (q->method == S3_GET && x->zbuf) {
		zqueue(x->sh->s, x); /* the frames undone there; it completes io */
		return;
	} else if (q->method == S3_GET) {
		io->res = (int64_t)q->length;
	} else if (x->sh->upload[0] && !q->etag[0]) {
		shard_fail(x->sh, "the store's reply to a part has no usable ETag");
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

static struct s3_io *io_new(struct storage_shard *sh, struct io_req *r, enum s3_method m)
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
static void zqueue(struct s3 *s, struct s3_io *x)
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

static void *zthread(void *arg)
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
		shard_fail(sh, "out of memory for a compressed part");
		return -ENOMEM;
	}
	rc =
	    s3z_frame(sh->s->zstd_level, x->q.body, n, x->zbuf, cap, sh->upload[0] != 0, &len, why);
	if (rc) {
		free(x->zbuf);
		shard_fail(sh, why);
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

/* Bytes [off, off + len) of the shard: part off / chunk + 1, cut at the shard's end. */
static void s3_shard_write(struct storage_shard *sh, struct io_req *r)
{
	struct s3_io *x;
	uint64_t part = r->off / sh->s->part_bytes;

	if (r->off % sh->s->part_bytes || part >= sh->nparts || !r->len) {
		shard_fail(sh, "a write that is not one whole part (the staging chunk)");
		r->res = -EINVAL;
		r->done(r);
		return;
	}
	x = io_new(sh, r, S3_PUT);
	if (!x) {
		r->res = -ENOMEM;
		r->done(r);
		return;
	}
	x->part = (unsigned)part;
	x->q.body = r->buf;
	x->q.body_len = sh->size - r->off < r->len ? sh->size - r->off : r->len;
	if (sh->upload[0])
		snprintf(x->q.query, sizeof(x->q.query), "partNumber=%u&uploadId=%s",
		         (unsigned)part + 1, sh->upload);
	if (sh->z)
		zqueue(sh->s, x); /* compressed there, then sent */
	else
		s3http_submit(sh->s->http, &x->q);
}

static void fin_checked(struct s3req *q)
{
	struct storage_shard *sh = q->ctx;
	struct io_req *io = sh->fin_io;
	char why[IPC_ERRLEN];

	if (q->res) {
		snprintf(why, sizeof(why), "reading back the completed upload: %s", q->err);
		shard_fail(sh, why);
		io->res = q->res;
	} else if (q->length != sh->stored) {
		snprintf(why, sizeof(why), "%s: the store holds %llu bytes, %llu were written",
		         sh->key, (unsigned long long)q->length, (unsigned long long)sh->stored);
		shard_fail(sh, why);
		io->res = -EIO;
	} else {
		io->res = 0;
	}
	io->done(io);
}

static void fin_completed(struct s3req *q)
{
	struct storage_shard *sh = q->ctx;
	struct io_req *io = sh->fin_io;

	free((void *)q->body);
	q->body = NULL;
	if (q->res) {
		shard_fail(sh, q->err);
		io->res = q->res;
		io->done(io);
		return;
	}
	sh->completed = true;
	/* the size as the store has it: what DURABLE promises */
	s3req_clear(q);
	s3req_init(q, S3_HEAD, sh->key);
	q->done = fin_checked;
	q->ctx = sh;
	s3http_submit(sh->s->http, q);
}

/* The upload completed (its parts in order, with their ETags). */
static void complete(struct storage_shard *sh)
{
	size_t cap = 128 + (size_t)sh->nput * (64 + S3_ETAG_MAX), o;
	struct io_req *r = sh->fin_io;
	char *xml;

	xml = malloc(cap);
	if (!xml) {
		r->res = -ENOMEM;
		r->done(r);
		return;
	}
	o = (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
	for (unsigned i = 0; i < sh->nput; i++)
		o += (size_t)snprintf(xml + o, cap - o,
		                      "<Part><PartNumber>%u</PartNumber><ETag>\"%s\"</ETag></Part>",
		                      i + 1, sh->etag[i]);
	o += (size_t)snprintf(xml + o, cap - o, "</CompleteMultipartUpload>");
	s3req_init(&sh->fin, S3_POST, sh->key);
	snprintf(sh->fin.query, sizeof(sh->fin.query), "uploadId=%s", sh->upload);
	sh->fin.body = xml;
	sh->fin.body_len = o;
	sh->fin.content_type = "application/xml";
	sh->fin.done = fin_completed;
	sh->fin.ctx = sh;
	s3http_submit(sh->s->http, &sh->fin);
}

/* The HTTP thread: the seek table is the upload's last part; then it completes. */
static void table_sent(struct s3req *q)
{
	struct storage_shard *sh = q->ctx;
	struct io_req *r = sh->fin_io;

	free(sh->ztab);
	sh->ztab = NULL;
	if (!q->res && !q->etag[0])
		shard_fail(sh, "the store's reply to a part has no usable ETag");
	else if (q->res)
		shard_fail(sh, q->err);
	if (q->res || !q->etag[0]) {
		r->res = q->res ? q->res : -EPROTO;
		r->done(r);
		return;
	}
	snprintf(sh->etag[sh->nparts], S3_ETAG_MAX, "%s", q->etag);
	s3req_clear(q);
	complete(sh);
}

/* After the last part: a compressed shard's seek table, then the completion. */
static void s3_shard_finish(struct storage_shard *sh, struct io_req *r)
{
	uint64_t tb = s3z_table_bytes(sh->nparts), c = 0;

	sh->fin_io = r;
	if (!sh->upload[0]) { /* a single PUT: the store had it when the PUT returned */
		sh->completed = true;
		r->res = 0;
		r->done(r);
		return;
	}
	if (!sh->z) {
		complete(sh);
		return;
	}
	sh->ztab = malloc(tb);
	if (!sh->ztab) {
		r->res = -ENOMEM;
		r->done(r);
		return;
	}
	for (unsigned i = 0; i < sh->nparts; i++)
		c += sh->zf[i].csize;
	sh->stored = c + tb;
	s3z_table_write(sh->zf, sh->nparts, sh->ztab);
	s3req_init(&sh->fin, S3_PUT, sh->key);
	snprintf(sh->fin.query, sizeof(sh->fin.query), "partNumber=%u&uploadId=%s", sh->nput,
	         sh->upload);
	sh->fin.body = sh->ztab;
	sh->fin.body_len = tb;
	sh->fin.done = table_sent;
	sh->fin.ctx = sh;
	s3http_submit(sh->s->http, &sh->fin);
}

/* The HTTP thread: an abort that failed is remembered, to be tried again. */
static void aborted(struct s3req *q)
{
	struct storage_shard *sh = q->ctx;
	struct s3 *s = sh->s;
	struct s3_unaborted *u;

	if (q->res && q->res != -ENOENT && (u = calloc(1, sizeof(*u)))) {
		snprintf(u->key, sizeof(u->key), "%s", sh->key);
		snprintf(u->upload, sizeof(u->upload), "%s", sh->upload);
		pthread_mutex_lock(&s->mu);
		u->next = s->unaborted;
		s->unaborted = u;
		s->nunaborted++;
		pthread_mutex_unlock(&s->mu);
	}
	shard_free(sh);
}

/*
 * Aborts that failed before, tried again (the root check, every few
 * seconds): so that a store that was away keeps no parts of ours.
 */
static void abort_again(struct s3 *s)
{
	struct s3_unaborted *list, *u, *keep = NULL;
	char query[S3_QUERY_MAX], why[IPC_ERRLEN];
	unsigned left = 0;

	pthread_mutex_lock(&s->mu);
	list = s->unaborted;
	s->unaborted = NULL;
	s->nunaborted = 0;
	pthread_mutex_unlock(&s->mu);
	while ((u = list)) {
		int rc;

		list = u->next;
		snprintf(query, sizeof(query), "uploadId=%s", u->upload);
		rc = s3_call(s, S3_DELETE, u->key, query, NULL, why);
		if (rc == 0 || rc == -ENOENT) {
			free(u);
		} else {
			u->next = keep;
			keep = u;
			left++;
		}
	}
	if (!keep)
		return;
	pthread_mutex_lock(&s->mu);
	for (u = keep; u->next; u = u->next)
		;
	u->next = s->unaborted;
	s->unaborted = keep;
	s->nunaborted += left;
	pthread_mutex_unlock(&s->mu);
}

static void s3_shard_close(struct storage_shard *sh)
{
	if (!sh)
		return;
	if (!sh->write || sh->completed || !sh->upload[0]) {
		shard_free(sh);
		return;
	}
	/* never completed: its parts go (the HTTP thread frees the shard after) */
	s3req_clear(&sh->fin);
	s3req_init(&sh->fin, S3_DELETE, sh->key);
	snprintf(sh->fin.query, sizeof(sh->fin.query), "uploadId=%s", sh->upload);
	sh->fin.done = aborted;
	sh->fin.ctx = sh;
	s3http_submit(sh->s->http, &sh->fin);
}

static const char *s3_shard_error(struct storage_shard *sh)
{
	return sh->why[0] ? sh->why : NULL;
}

/* ---- shards: the read side --------------------------------------------- */

/* HEAD of a key: its size; -ENOENT if not there. */
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

static int head(struct s3 *s, const char *key, uint64_t *size, char *err)
{
	return s3_call(s, S3_HEAD, key, NULL, size, err);
}

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

static int s3_shard_stat(struct storage *st, const char *job, int64_t step, const char *file,
                         uint64_t *size, char *err)
{
	char key[S3_KEY_MAX];
	uint64_t object, z;
	int rc;

	if ((rc = check_file(file, err)) ||
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

static int s3_shard_open(struct storage *st, const char *job, int64_t step, const char *file,
                         struct storage_shard **out, uint64_t *size, char *err)
{
	struct storage_shard *sh = shard_new(to_s3(st), false);
	uint64_t z;
	int rc;

	*out = NULL;
	if (!sh)
		return ipc_errf(err, -ENOMEM, "out of memory");
	snprintf(sh->file, sizeof(sh->file), "%s", file);
	if ((rc = check_file(file, err)) ||
	    (rc = s3_step_key(sh->s, job, step, file, sh->key, sizeof(sh->key), err)) ||
	    (rc = head_shard(sh->s, sh->key, &sh->stored, &z, err))) {
		shard_free(sh);
		return rc;
	}
	sh->size = z ? z : sh->stored;
	sh->z = z != 0;
	if (sh->z && (rc = read_table(sh, sh->stored, err))) {
		shard_free(sh);
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
static void s3_shard_read(struct storage_shard *sh, struct io_req *r)
{
	struct s3_io *x = io_new(sh, r, S3_GET);
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

static int s3_shard_unlink(struct storage *st, const char *job, int64_t step, const char *file,
                           char *err)
{
	struct s3 *s = to_s3(st);
	char key[S3_KEY_MAX];
	int rc;

	if ((rc = check_file(file, err)) ||
	    (rc = s3_step_key(s, job, step, file, key, sizeof(key), err)))
		return rc;
	return s3_call(s, S3_DELETE, key, NULL, NULL, err);
}

static void s3_shard_path(struct storage *st, const char *job, int64_t step, const char *file,
                          char *buf, size_t len)
{
	struct s3 *s = to_s3(st);
	char key[S3_KEY_MAX];

	if (s3_step_key(s, job, step, file, key, sizeof(key), NULL))
		snprintf(key, sizeof(key), "%s/...", job);
	s3http_name(s->http, key, buf, len);
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
		abort_again(s);
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

/* ---- start-up ------------------------------------------------------------ */

int s3_root_parse(const char *root, char *bucket, size_t blen, char *prefix, size_t plen, char *err)
{
	const char *b = root + 5, *slash;
	size_t n, p = 0;

	if (strncmp(root, "s3://", 5) != 0)
		return ipc_errf(err, -EINVAL, "%s: expected s3://BUCKET[/PREFIX]", root);
	slash = strchr(b, '/');
	n = slash ? (size_t)(slash - b) : strlen(b);
	if (n < 3 || n > 63 || n >= blen)
		return ipc_errf(err, -EINVAL, "%s: a bucket name has 3 to 63 characters", root);
	for (size_t i = 0; i < n; i++)
		if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '.' ||
		      b[i] == '-'))
			return ipc_errf(err, -EINVAL,
			                "%s: a bucket name is lower-case letters, digits, '.' and "
			                "'-' (byte %zu is 0x%02x)",
			                root, 5 + i, (unsigned char)b[i]);
	memcpy(bucket, b, n);
	bucket[n] = '\0';
	prefix[0] = '\0';
	/* PREFIX: components of [A-Za-z0-9._-], none empty, "." or ".."; a final '/' dropped */
	for (const char *c = slash ? slash + 1 : b + n; *c;) {
		const char *e = strchr(c, '/');
		size_t k = e ? (size_t)(e - c) : strlen(c);

		if (k == 0 || (k == 1 && c[0] == '.') || (k == 2 && c[0] == '.' && c[1] == '.'))
			return ipc_errf(err, -EINVAL,
			                "%s: an empty, '.' or '..' component in the prefix", root);
		for (size_t i = 0; i < k; i++)
			if (!((c[i] >= 'a' && c[i] <= 'z') || (c[i] >= 'A' && c[i] <= 'Z') ||
			      (c[i] >= '0' && c[i] <= '9') || c[i] == '.' || c[i] == '_' ||
			      c[i] == '-'))
				return ipc_errf(err, -EINVAL,
				                "%s: the prefix is made of [A-Za-z0-9._-] and '/' "
				                "(byte %zu is 0x%02x)",
				                root, (size_t)(c - root) + i, (unsigned char)c[i]);
		if (p + k + 2 >= plen)
			return ipc_errf(err, -ENAMETOOLONG, "%s: the prefix is too long", root);
		if (p)
			prefix[p++] = '/';
		memcpy(prefix + p, c, k);
		p += k;
		prefix[p] = '\0';
		c += k + (e ? 1 : 0);
	}
	return 0;
}

/* The lines of a credentials file, read into buf (its keys into access and secret). */
static int parse_credentials(char *buf, const char *path, char *access, char *secret, size_t len,
                             char *err)
{
	char *line, *save = NULL;
	unsigned lineno = 0;

	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *k = line, *eq, *v, *end;

		lineno++;
		while (*k == ' ' || *k == '\t')
			k++;
		if (!*k || *k == '#' || *k == ';' || *k == '[' || *k == '\r')
			continue;
		eq = strchr(k, '=');
		if (!eq)
			return ipc_errf(err, -EINVAL, "credentials %s:%u: expected key = value",
			                path, lineno);
		for (end = eq; end > k && (end[-1] == ' ' || end[-1] == '\t'); end--)
			;
		*end = '\0';
		for (v = eq + 1; *v == ' ' || *v == '\t'; v++)
			;
		for (end = v + strlen(v);
		     end > v && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'); end--)
			;
		*end = '\0';
		if (strlen(v) >= len)
			return ipc_errf(err, -EINVAL, "credentials %s:%u: the value is too long",
			                path, lineno);
		if (!strcmp(k, "access_key") || !strcmp(k, "aws_access_key_id"))
			snprintf(access, len, "%s", v);
		else if (!strcmp(k, "secret_key") || !strcmp(k, "aws_secret_access_key"))
			snprintf(secret, len, "%s", v);
		else
			return ipc_errf(err, -EINVAL,
			                "credentials %s:%u: unknown key '%.32s' (access_key, "
			                "secret_key)",
			                path, lineno, k);
	}
	if (!access[0] || !secret[0])
		return ipc_errf(err, -EINVAL, "credentials %s: needs access_key and secret_key",
		                path);
	return 0;
}

/*
 * The credentials file: "access_key = ..." and "secret_key = ..." lines
 * (aws_access_key_id and aws_secret_access_key too), '#' comments. Refused
 * unless only its owner (this user, or root) may read it. Its values are
 * never put in a message.
 */
static int read_credentials(const char *path, char *access, char *secret, size_t len, char *err)
{
	char buf[8192];
	struct stat st;
	ssize_t n;
	int rc, fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);

	access[0] = secret[0] = '\0';
	if (fd < 0)
		return ipc_errf(err, -errno, "credentials %s: %s", path, strerror(errno));
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		close(fd);
		return ipc_errf(err, -EINVAL, "credentials %s: not a regular file", path);
	}
	if (st.st_mode & 0077) {
		close(fd);
		return ipc_errf(err, -EPERM,
		                "credentials %s: mode %04o lets others read it; chmod 600 %s (and "
		                "change the keys if others did)",
		                path, (unsigned)(st.st_mode & 07777), path);
	}
	if (st.st_uid != geteuid() && st.st_uid != 0) {
		close(fd);
		return ipc_errf(err, -EPERM,
		                "credentials %s: owned by uid %u, not by this user (%u)", path,
		                (unsigned)st.st_uid, (unsigned)geteuid());
	}
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0)
		return ipc_errf(err, -EIO, "credentials %s: cannot read it", path);
	if ((size_t)n == sizeof(buf) - 1)
		return ipc_errf(err, -EFBIG, "credentials %s: larger than %zu bytes", path,
		                sizeof(buf) - 2);
	buf[n] = '\0';
	rc = parse_credentials(buf, path, access, secret, len, err);
	/* the keys live in access and secret alone, and only if they are whole */
	explicit_bzero(buf, sizeof(buf));
	if (rc) {
		explicit_bzero(access, len);
		explicit_bzero(secret, len);
	}
	return rc;
}

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

int s3_create(const struct s3_opts *o, struct storage **out, char *err)
{
	struct s3http_opts ho = {0};
	char access[256], secret[256], why[IPC_ERRLEN];
	bool reopened;
	struct s3 *s;
	int rc;

	*out = NULL;
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
	rc = read_credentials(o->credentials, access, secret, sizeof(access), err);
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
		if ((rc = -pthread_create(&s->zthr[i], NULL, zthread, s))) {
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
