/*
 * The S3 backend's shard writes (s3_shard.h): a shard's name picked and
 * claimed, its multipart upload started (one chunk: a single PUT), each
 * part sent as the save writes its chunk (compressed first on a zstd
 * thread where asked), the upload completed by shard_finish (the seek
 * table first when compressed) and its size read back before DURABLE; an
 * upload not completed is aborted at close, and one whose abort failed
 * tried again by the root check (s3_abort_again).
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
		if (!s3_claim(s, sh->key)) {
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
		s3_unclaim(s, sh->key);
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

int s3_shard_create(struct storage *st, const char *job, int64_t step, int rank, uint64_t size,
                    char *file, struct storage_shard **out, char *err)
{
	struct s3 *s = to_s3(st);
	struct storage_shard *sh;
	char what[32];
	int rc;

	*out = NULL;
	snprintf(what, sizeof(what), "rank %d", rank);
	if ((rc = too_many_parts(s, size, what, err)))
		return rc;
	sh = s3_shard_new(s, true);
	if (!sh)
		return ipc_errf(err, -ENOMEM, "out of memory");
	rc = pick_name(s, sh, job, step, rank, err);
	if (rc) {
		sh->write = false; /* nothing claimed */
		s3_shard_free(sh);
		return rc;
	}
	if ((rc = shard_begin(s, sh, size, err))) {
		s3_shard_free(sh);
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
int s3_shard_create_as(struct storage *st, const char *job, int64_t step, const char *file,
                       uint64_t size, struct storage_shard **out, char *err)
{
	struct s3 *s = to_s3(st);
	struct storage_shard *sh;
	int rc;

	*out = NULL;
	if ((rc = s3_check_file(file, err)) || (rc = too_many_parts(s, size, file, err)))
		return rc;
	sh = s3_shard_new(s, false);
	if (!sh)
		return ipc_errf(err, -ENOMEM, "out of memory");
	snprintf(sh->file, sizeof(sh->file), "%s", file);
	if ((rc = s3_step_key(s, job, step, file, sh->key, sizeof(sh->key), err))) {
		s3_shard_free(sh);
		return rc;
	}
	if (!s3_claim(s, sh->key)) {
		s3_shard_free(sh);
		return ipc_errf(err, -EBUSY, "%s: an upload of it is under way", sh->key);
	}
	sh->write = true;
	if ((rc = shard_begin(s, sh, size, err))) {
		s3_shard_free(sh);
		return rc;
	}
	*out = sh;
	return 0;
}

/* Bytes [off, off + len) of the shard: part off / chunk + 1, cut at the shard's end. */
void s3_shard_write(struct storage_shard *sh, struct io_req *r)
{
	struct s3_io *x;
	uint64_t part = r->off / sh->s->part_bytes;

	if (r->off % sh->s->part_bytes || part >= sh->nparts || !r->len) {
		s3_shard_fail(sh, "a write that is not one whole part (the staging chunk)");
		r->res = -EINVAL;
		r->done(r);
		return;
	}
	x = s3_io_new(sh, r, S3_PUT);
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
		s3_zqueue(sh->s, x); /* compressed there, then sent */
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
		s3_shard_fail(sh, why);
		io->res = q->res;
	} else if (q->length != sh->stored) {
		snprintf(why, sizeof(why), "%s: the store holds %llu bytes, %llu were written",
		         sh->key, (unsigned long long)q->length, (unsigned long long)sh->stored);
		s3_shard_fail(sh, why);
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
		s3_shard_fail(sh, q->err);
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
		s3_shard_fail(sh, "the store's reply to a part has no usable ETag");
	else if (q->res)
		s3_shard_fail(sh, q->err);
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
void s3_shard_finish(struct storage_shard *sh, struct io_req *r)
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
	s3_shard_free(sh);
}

/*
 * Aborts that failed before, tried again (the root check, every few
 * seconds): so that a store that was away keeps no parts of ours.
 */
void s3_abort_again(struct s3 *s)
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

void s3_shard_close(struct storage_shard *sh)
{
	if (!sh)
		return;
	if (!sh->write || sh->completed || !sh->upload[0]) {
		s3_shard_free(sh);
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

const char *s3_shard_error(struct storage_shard *sh)
{
	return sh->why[0] ? sh->why : NULL;
}
