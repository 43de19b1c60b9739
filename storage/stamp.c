/*
 * stamp.c: what ties a part or a manifest to the bytes of the shards it
 * names (store.h). Each save stamps its shard's header with its step and a
 * number of its own (format.h, struct st_stamp); its part repeats the
 * number, and the manifest merged from the part too. A part or manifest
 * copied from another step or attempt, a file swapped for another of the
 * same size, a run that is not the file's: each shows here, for one small
 * read of each file's head, never its tensors.
 *
 * Callers: the committer (commit/commit.c, a part before it joins), the
 * start-up repair of LATEST (store.c), the agent's restore and verify. Any
 * thread; each call blocks on the read it makes (through the backend's
 * shard calls, which complete on the I/O engine's or the HTTP thread).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/store.h"

#define HEAD_READ (64u << 10) /* the first read: headers of a few hundred tensors */
#define HEAD_ALIGN 4096u /* O_DIRECT's */

/* One read of a shard, waited for on the caller's thread. */
struct head_io {
	struct io_req r;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
};

static void head_done(struct io_req *r)
{
	struct head_io *x = r->ctx;

	pthread_mutex_lock(&x->mu);
	x->done = true;
	pthread_cond_signal(&x->cv);
	pthread_mutex_unlock(&x->mu);
}

/* Bytes [0, len) of an open shard into buf (aligned); the bytes read, or -errno. */
static int64_t read_head(struct storage *s, struct storage_shard *sh, void *buf, uint64_t len)
{
	struct head_io x = {.r = {.op = IO_READ, .buf = buf, .len = len, .buf_index = -1}};

	pthread_mutex_init(&x.mu, NULL);
	pthread_cond_init(&x.cv, NULL);
	x.r.done = head_done;
	x.r.ctx = &x;
	s->ops->shard_read(sh, &x.r);
	pthread_mutex_lock(&x.mu);
	while (!x.done)
		pthread_cond_wait(&x.cv, &x.mu);
	pthread_mutex_unlock(&x.mu);
	pthread_mutex_destroy(&x.mu);
	pthread_cond_destroy(&x.cv);
	return x.r.res;
}

static uint64_t round_up(uint64_t v)
{
	return (v + HEAD_ALIGN - 1) / HEAD_ALIGN * HEAD_ALIGN;
}

/* The header's length announced by its first 8 bytes (little-endian), and those 8. */
static uint64_t announced(const void *buf)
{
	const uint8_t *b = buf;
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | b[i];
	return 8 + v;
}

int store_read_header(struct storage *s, const char *job, int64_t step, const char *file,
                      uint64_t hint, struct st_header **out, uint64_t *size, char *err)
{
	struct storage_shard *sh = NULL;
	char path[512], why[IPC_ERRLEN] = "";
	uint64_t want = hint && hint <= ST_MAX_HEADER + 8 ? hint : HEAD_READ;
	void *buf = NULL;
	int64_t got;
	int rc;

	*out = NULL;
	if (!s->ops->shard_open || !s->ops->shard_read)
		return ipc_errf(err, -ENOTSUP, "%s: this storage reads no shards", file);
	rc = s->ops->shard_open(s, job, step, file, &sh, size, err);
	if (rc)
		return rc;
	s->ops->shard_path(s, job, step, file, path, sizeof(path));
	for (int tries = 0;; tries++) {
		free(buf);
		buf = NULL;
		/* O_DIRECT: an aligned buffer and length, no further than the file's end */
		want = want < *size ? want : *size;
		if (posix_memalign(&buf, HEAD_ALIGN, round_up(want) ?: HEAD_ALIGN)) {
			rc = ipc_errf(err, -ENOMEM, "out of memory reading the header of %s", path);
			goto out_close;
		}
		got = round_up(want) ? read_head(s, sh, buf, round_up(want)) : 0;
		if (got < 0) {
			const char *detail = s->ops->shard_error ? s->ops->shard_error(sh) : NULL;

			rc = ipc_errf(err, (int)got, "reading the header of %s: %s", path,
			              detail ? detail : strerror((int)-got));
			goto out_close;
		}
		rc = st_header_parse(buf, (size_t)got, *size, out, why);
		if (rc != -ENODATA || tries > 0 || got < 8)
			break;
		/* longer than the first read: its length is bounded by the file's */
		want = announced(buf);
		if (want > *size || want > ST_MAX_HEADER + 8)
			break;
	}
	if (rc == -ENOMEM)
		rc = ipc_errf(err, rc, "%s: %s", path, why);
	else if (rc)
		rc = ipc_errf(err, -EBADMSG, "%s: %s", path,
		              rc == -ENODATA ? "the file ends before its header does" : why);
out_close:
	free(buf);
	if (s->ops->shard_close)
		s->ops->shard_close(sh);
	return rc;
}

int store_check_file(struct storage *s, const char *job, const struct store_claim *c, char *err)
{
	struct st_header *h = NULL;
	struct st_stamp st = {0};
	const char *run, *rank;
	char path[512], want[16];
	uint64_t size = UINT64_MAX; /* as long as it is not opened */
	int rc, has;

	rc = store_read_header(s, job, c->step, c->file, c->header_bytes, &h, &size, err);
	s->ops->shard_path(s, job, c->step, c->file, path, sizeof(path));
	/* what is wrong first: its size (where it was opened) */
	if (rc == -EBADMSG && size != UINT64_MAX && size != c->size)
		return ipc_errf(err, rc, "%s is %" PRIu64 " bytes, not %" PRIu64, path, size,
		                c->size);
	if (rc)
		return rc;
	has = st_header_stamp(h, &st);
	run = st_header_meta(h, "run");
	rank = st_header_meta(h, "rank");
	snprintf(want, sizeof(want), "%d", c->rank);
	if (size != c->size)
		rc = ipc_errf(err, -EBADMSG, "%s is %" PRIu64 " bytes, not %" PRIu64, path, size,
		              c->size);
	else if (h->data_start != c->header_bytes)
		rc = ipc_errf(err, -EBADMSG, "%s: its header is %" PRIu64 " bytes, not %" PRIu64,
		              path, h->data_start, c->header_bytes);
	else if (has == -EINVAL)
		rc = ipc_errf(err, -EBADMSG, "%s: its header's step or save is malformed", path);
	else if (has == -ENODATA && c->save)
		rc = ipc_errf(err, -EBADMSG,
		              "%s carries no stamp, yet save %016" PRIx64 " is claimed for it",
		              path, c->save);
	else if (has == 0 && (st.step != c->step || st.save != c->save))
		rc = ipc_errf(err, -EBADMSG,
		              "%s holds save %016" PRIx64 " of step %" PRId64
		              ", not save %016" PRIx64 " of step %" PRId64
		              " (copied from another step or attempt?)",
		              path, st.save, st.step, c->save, c->step);
	else if ((run && strcmp(run, c->run) != 0) || (rank && strcmp(rank, want) != 0))
		rc = ipc_errf(err, -EBADMSG, "%s is of run %s rank %s, not run %s rank %d", path,
		              run ? run : "?", rank ? rank : "?", c->run, c->rank);
	st_header_free(h);
	return rc;
}

int store_files_intact(struct storage *s, const struct manifest *m, char *err)
{
	char why[IPC_ERRLEN];
	int rc = 0;

	for (size_t i = 0; i < m->nranks && !rc; i++) {
		const struct manifest_rank *k = &m->ranks[i];
		const struct store_claim c = {m->run,  m->step,         k->rank, k->file,
		                              k->size, k->header_bytes, k->save};

		rc = store_check_file(s, m->job, &c, why);
		if (rc == -ENOENT)
			rc = -EBADMSG; /* named by a manifest, and not there */
		if (rc)
			ipc_errf(err, rc, "rank %d's shard: %s", k->rank, why);
	}
	return rc;
}

/* `"key":"value"` exactly once in buf[0, len) (st_said_once). */
static bool said_once(const char *buf, size_t len, const char *key, const char *value)
{
	size_t at;

	return st_said_once(buf, len, key, value, &at) == 0;
}

/*
 * The first block of c's file says what c claims: its size, its header's
 * length, and "step", "save", "run" and "rank" each once with c's values
 * (a shard's __metadata__ comes first in its header). One aligned read of
 * HEAD_ALIGN bytes; no JSON parsed.
 */
static bool bound_quickly(struct storage *s, const char *job, const struct store_claim *c)
{
	struct storage_shard *sh = NULL;
	char step[16], save[24], rank[16], why[IPC_ERRLEN];
	uint64_t size = 0;
	void *buf = NULL;
	int64_t got = -1;
	bool bound = false;

	if (!c->save || !s->ops->shard_open || !s->ops->shard_read || ipc_check_run(c->run, why) ||
	    s->ops->shard_open(s, job, c->step, c->file, &sh, &size, why))
		return false;
	if (size == c->size && size >= 8 && posix_memalign(&buf, HEAD_ALIGN, HEAD_ALIGN) == 0)
		got = read_head(s, sh, buf, round_up(size < HEAD_ALIGN ? size : HEAD_ALIGN));
	if (s->ops->shard_close)
		s->ops->shard_close(sh);
	if (got >= 8 && announced(buf) == c->header_bytes) {
		size_t n = (uint64_t)got < c->header_bytes ? (size_t)got : (size_t)c->header_bytes;

		snprintf(step, sizeof(step), "%012" PRId64, c->step);
		snprintf(save, sizeof(save), "%016" PRIx64, c->save);
		snprintf(rank, sizeof(rank), "%d", c->rank);
		bound = said_once(buf, n, "step", step) && said_once(buf, n, "save", save) &&
		        said_once(buf, n, "run", c->run) && said_once(buf, n, "rank", rank);
	}
	free(buf);
	return bound;
}

int store_check_bound(struct storage *s, const char *job, const struct store_claim *c, char *err)
{
	return bound_quickly(s, job, c) ? 0 : store_check_file(s, job, c, err);
}
