/*
 * Verify: every byte of a committed checkpoint read back and checked
 * against its manifest (`ckptctl verify JOB STEP`), on the root or the
 * upload tier, nothing copied anywhere.
 *
 * It builds the extents restore.c builds (each rank's header, then every
 * chunk with the checksum the manifest promises) and runs the reader
 * (stream_read.c) collecting every problem rather than stopping at the
 * first: each names the tensor and the file. Then each header is checked
 * against the manifest, and for a box several ranks saved, how many of its
 * copies are good (a restore reads one of them).
 *
 * Threads: the call (rpc/verify_rpc.c) on the control thread only checks and
 * queues (verify_request), and hears the end through the function it gave;
 * a verify runs on a reader thread (readers queue: several at once, none holding up
 * the maint thread's GC); one of a step not listed looks at the root on
 * the maint thread first. The step read is marked (cat_entry.readers): GC
 * keeps it and delete refuses it until the verify ends.
 */
#define _GNU_SOURCE /* qsort_r */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/pipe/stream.h"
#include "agent/node/catalog.h"
#include "agent/node/upload.h"
#include "agent/node/verify.h"
#include "ipc/base/log.h"
#include "storage/store.h"

struct verify {
	struct work work;
	struct agent *a;
	verify_done_fn done; /* told the end, with ctx */
	void *ctx;
	char job[IPC_MAX_JOB + 1];
	int64_t step;
	struct storage *store; /* the root, or the upload tier */
	bool tier; /* the upload tier: not in the root's catalog */
};

/*
 * A header's stamp (format.h) against what the manifest says of its file:
 * a file of another step or attempt, whatever its bytes, is no part of
 * this checkpoint. A manifest that claims no stamp (as an older agent's
 * does) for a file that carries one is as wrong: a restore refuses it
 * (store_check_file), and so does verify.
 */
static void stamp_disagrees(struct reader *r, const struct st_header *h, const struct manifest *m,
                            const struct manifest_rank *mr)
{
	struct st_stamp st = {0};
	int rc = st_header_stamp(h, &st);

	if (rc == -EINVAL)
		reader_problem(r, -EBADMSG, "%s: its header's step or save is malformed", r->path);
	else if (rc == -ENODATA && mr->save)
		reader_problem(r, -EBADMSG,
		               "%s carries no stamp, yet the manifest names save %016" PRIx64,
		               r->path, mr->save);
	else if (rc == 0 && (st.step != m->step || st.save != mr->save))
		reader_problem(r, -EBADMSG,
		               "%s holds save %016" PRIx64 " of step %" PRId64
		               ", not save %016" PRIx64 " of step %" PRId64
		               " (a file of another step or attempt)",
		               r->path, st.save, st.step, mr->save, m->step);
}

/*
 * Each rank's safetensors header against the manifest: those read whole. A
 * header that could not be read (no file, too short, a read error) was
 * reported as such; its buffer holds nothing to parse.
 */
static void check_headers(struct reader *r, const struct manifest *m, char **hdr, const bool *whole)
{
	for (size_t k = 0; k < m->nranks; k++) {
		const struct manifest_rank *mr = &m->ranks[k];
		struct st_header *h = NULL;
		char err[IPC_ERRLEN];
		size_t nchunks = 0;

		if (!hdr[k] || !whole[k])
			continue;
		r->store->ops->shard_path(r->store, r->job, r->step, mr->file, r->path,
		                          sizeof(r->path));
		if (st_header_parse(hdr[k], mr->header_bytes, mr->size, &h, err)) {
			reader_problem(r, -EBADMSG, "%s: %s", r->path, err);
			continue;
		}
		for (size_t i = 0; i < m->ntensors; i++) {
			const struct manifest_tensor *t = &m->tensors[i];

			for (size_t j = 0; j < t->nchunks; j++) {
				const struct manifest_chunk *ch = &t->chunks[j];
				const struct st_entry *e;

				if (ch->rank != mr->rank)
					continue;
				nchunks++;
				e = st_header_find(h, t->name);
				if (!e || e->dtype != t->dtype || e->ndim != t->ndim ||
				    memcmp(e->shape, ch->shape, t->ndim * sizeof(int64_t)) ||
				    e->begin + h->data_start != ch->begin ||
				    e->end + h->data_start != ch->end)
					reader_problem(
					    r, -EBADMSG,
					    "tensor '%s' in %s: the safetensors header %s", t->name,
					    r->path,
					    e ? "disagrees with the manifest (dtype, shape or "
					        "offsets)"
					      : "does not list it");
			}
		}
		if (h->n != nchunks)
			reader_problem(r, -EBADMSG,
			               "%s: its header lists %zu tensors, the manifest %zu",
			               r->path, h->n, nchunks);
		stamp_disagrees(r, h, m, mr);
		st_header_free(h);
	}
}

/* Chunks of one tensor in the order of their boxes (offset, then shape). */
static int cmp_box(const void *x, const void *y, void *arg)
{
	const struct manifest_tensor *t = arg;
	const struct manifest_chunk *a = &t->chunks[*(const size_t *)x];
	const struct manifest_chunk *b = &t->chunks[*(const size_t *)y];
	int c = memcmp(a->global_offset, b->global_offset, t->ndim * sizeof(int64_t));

	return c ? c : memcmp(a->shape, b->shape, t->ndim * sizeof(int64_t));
}

/* A tensor's chunks grouped by box (idx: nchunks, sorted); its bad copies named. */
static void tensor_copies(struct reader *r, const struct manifest_tensor *t, const bool *good,
                          size_t *idx)
{
	char box[256], at[256];

	for (size_t j = 0; j < t->nchunks; j++)
		idx[j] = j;
	qsort_r(idx, t->nchunks, sizeof(*idx), cmp_box, (void *)t);
	for (size_t g = 0, e; g < t->nchunks && r->nproblems < READER_MAX_PROBLEMS; g = e) {
		unsigned copies = 0, ok = 0;

		for (e = g; e < t->nchunks && cmp_box(&idx[g], &idx[e], (void *)t) == 0; e++) {
			copies++;
			ok += good[idx[e]];
		}
		if (copies < 2 || ok == copies)
			continue; /* its only copy (the problem above says it all), or all good */
		for (size_t k = g; k < e; k++) {
			const struct manifest_chunk *c = &t->chunks[idx[k]];

			if (good[idx[k]])
				continue;
			box_text(c->shape, t->ndim, box, sizeof(box));
			box_text(c->global_offset, t->ndim, at, sizeof(at));
			reader_problem(
			    r, -EBADMSG,
			    "tensor '%s', box %s at %s: rank %d's copy is bad; %u of its %u "
			    "copies are good%s",
			    t->name, box, at, c->rank, ok, copies,
			    ok ? " (a restore reads one of them)" : ": none left");
		}
	}
}

/*
 * The boxes several ranks saved (replicas): for each copy that failed, how
 * many of its box's copies are good, so the operator knows whether a
 * restore can still read it (restore.c reads another copy). good: per
 * chunk, tensor by tensor in the manifest's order. Only tensors with a bad
 * chunk are sorted; no more than the reader keeps is said.
 */
static void check_copies(struct reader *r, const struct manifest *m, const bool *good)
{
	size_t *idx = NULL, cap = 0;

	for (size_t i = 0, base = 0; i < m->ntensors; base += m->tensors[i++].nchunks) {
		const struct manifest_tensor *t = &m->tensors[i];
		bool any = false;

		for (size_t j = 0; j < t->nchunks && !any; j++)
			any = !good[base + j];
		if (!any || r->nproblems >= READER_MAX_PROBLEMS)
			continue;
		if (t->nchunks > cap) {
			size_t *v = realloc(idx, t->nchunks * sizeof(*idx));

			if (!v)
				break; /* a report the less: the problems are said already */
			idx = v;
			cap = t->nchunks;
		}
		tensor_copies(r, t, good + base, idx);
	}
	free(idx);
}

/* Each rank's header into hdr[k] (whole[k] once all of it was read), and every chunk. */
static int verify_extents(struct reader *r, const struct manifest *m, char **hdr, bool *whole,
                          bool *good)
{
	size_t g = 0;

	for (size_t k = 0; k < m->nranks; k++) {
		if (m->ranks[k].header_bytes > ST_MAX_HEADER + 8 ||
		    !(hdr[k] = malloc(m->ranks[k].header_bytes)))
			return -ENOMEM;
		r->ext[r->n++] = (struct extent){.rank = m->ranks[k].rank,
		                                 .begin = 0,
		                                 .end = m->ranks[k].header_bytes,
		                                 .dst = hdr[k],
		                                 .nosum = true,
		                                 .whole = &whole[k],
		                                 .tensor = "(header)"};
	}
	for (size_t i = 0; i < m->ntensors; i++)
		for (size_t j = 0; j < m->tensors[i].nchunks; j++) {
			const struct manifest_chunk *ch = &m->tensors[i].chunks[j];

			r->ext[r->n++] = (struct extent){.rank = ch->rank,
			                                 .begin = ch->begin,
			                                 .end = ch->end,
			                                 .xxh3 = ch->xxh3,
			                                 .good = &good[g++],
			                                 .tensor = m->tensors[i].name};
		}
	return 0;
}

/*
 * The answer, once everything was read. Problems met while the step went
 * (retention on another node, a delete: its manifest goes first) are no
 * damage: the step is not there any more, and that is what is said
 * (NOT_FOUND), never CORRUPT. On the root, a step found whole is whole
 * again in the catalog (a file put back); one found damaged is marked so by
 * the restore that cannot read it (a bad copy of a replica may still be
 * restored from another).
 */
static void verify_reply(struct verify *v, struct reader *r, const struct manifest *m)
{
	struct verify_outcome o = {.ok = r->nproblems == 0 && r->err == 0};
	struct agent *a = v->a;
	char why[IPC_ERRLEN];

	if (!o.ok && !store_committed(v->store, v->job, v->step)) {
		v->done(
		    v->ctx,
		    ipc_errf(why, -ENOENT,
		             "job %s step %lld was removed (retention, perhaps on another node, "
		             "or a delete) while it was being verified: nothing can be said of it",
		             v->job, (long long)v->step),
		    why, NULL);
		log_msg(LOG_INFO, "verify of job %s step %lld: removed while it was read", v->job,
		        (long long)v->step);
		return;
	}
	o.bytes = r->bytes;
	o.tensors = m ? (uint32_t)m->ntensors : 0;
	o.nproblems = r->nproblems; /* at most READER_MAX_PROBLEMS: the reply stays small */
	o.problems = r->problems;
	o.nmore = r->nmore;
	v->done(v->ctx, 0, NULL, &o);
	log_msg(o.ok ? LOG_INFO : LOG_WARNING, "verify of job %s step %lld: %s (%zu problems)",
	        v->job, (long long)v->step, o.ok ? "ok" : "CORRUPT",
	        r->nproblems + (size_t)r->nmore);
	if (v->tier || !o.ok || !m)
		return; /* a bad copy of a replica may still restore: a restore says */
	pthread_mutex_lock(&a->mu);
	catalog_set_damage(a->cat, v->job, v->step, NULL); /* whole again, whatever was found */
	pthread_mutex_unlock(&a->mu);
}

/*
 * Reader thread, the step marked as read (cat_entry.readers): neither GC nor
 * delete removes it meanwhile, so other verifies, shows and GCs may run.
 */
static void verify_run(struct work *w)
{
	struct verify *v = container_of(w, struct verify, work);
	struct agent *a = v->a;
	struct manifest *m = NULL;
	char err[IPC_ERRLEN], **hdr = NULL;
	bool *whole = NULL, *good = NULL;
	size_t n = 0;
	struct reader r;
	struct cat_entry *e;
	int rc;

	memset(&r, 0, sizeof(r));
	rc = store_read_manifest(v->store, v->job, v->step, &m, err);
	if (rc == -ENOENT) { /* listed when asked: gone since */
		ipc_errf(err, rc, "job %s has no committed step %lld %s", v->job,
		         (long long)v->step,
		         v->tier ? "on the upload tier" : "(removed: retention or a delete)");
		v->done(v->ctx, rc, err, NULL);
		goto out;
	}
	if (rc == 0) {
		for (size_t i = 0; i < m->ntensors; i++)
			n += m->tensors[i].nchunks;
		hdr = calloc(m->nranks, sizeof(*hdr));
		whole = calloc(m->nranks ? m->nranks : 1, sizeof(*whole));
		good = calloc(n ? n : 1, sizeof(*good));
	}
	if (reader_init(&r, a, v->job, v->step, n + (m ? m->nranks : 0)) ||
	    (m && (!hdr || !whole || !good))) {
		v->done(v->ctx, ipc_errf(err, -ENOMEM, "verify: out of memory"), err, NULL);
		goto out;
	}
	r.collect = true;
	r.store = v->store;
	if (!m)
		reader_problem(&r, -EBADMSG, "%s", err);
	else if (verify_extents(&r, m, hdr, whole, good) || reader_run(&r, m, 2))
		reader_problem(&r, -ENOMEM, "verify: out of memory or interrupted");
	else {
		check_headers(&r, m, hdr, whole);
		check_copies(&r, m, good);
	}
	verify_reply(v, &r, m);
out:
	for (size_t k = 0; hdr && k < m->nranks; k++)
		free(hdr[k]);
	free(hdr);
	free(whole);
	free(good);
	manifest_free(m);
	reader_free(&r);
	pthread_mutex_lock(&a->mu);
	e = v->tier ? NULL : catalog_find(a->cat, v->job, v->step);
	if (e)
		e->readers--;
	pthread_mutex_unlock(&a->mu);
	free(v);
}

/*
 * Maint thread: a step not listed when asked, committed perhaps by another
 * node after this one last looked (or restarted). The root is looked at
 * here, where no GC or delete of the job runs meanwhile (a sync while one
 * removes would list again a step on its way out); then it is read on a
 * reader thread like any other.
 */
static void verify_find(struct work *w)
{
	struct verify *v = container_of(w, struct verify, work);
	struct agent *a = v->a;
	struct cat_entry *e;

	catalog_sync_job(a, v->job);
	pthread_mutex_lock(&a->mu);
	e = catalog_find(a->cat, v->job, v->step);
	if (e)
		e->readers++;
	pthread_mutex_unlock(&a->mu);
	if (!e) {
		char why[IPC_ERRLEN];

		ipc_errf(why, -ENOENT, "job %s has no committed step %lld", v->job,
		         (long long)v->step);
		v->done(v->ctx, -ENOENT, why, NULL);
		free(v);
		return;
	}
	v->work.fn = verify_run;
	workq_push(a->readers, &v->work);
}

int verify_request(struct agent *a, const char *job, int64_t step, const char *tier,
                   verify_done_fn done, void *ctx, char *err)
{
	struct verify *v = calloc(1, sizeof(*v));
	struct cat_entry *e = NULL;
	int rc;

	if (!v)
		return ipc_errf(err, -ENOMEM, "out of memory");
	pthread_mutex_lock(&a->mu);
	rc = upload_pick_tier(a, tier, &v->store, &v->tier, err);
	e = rc || v->tier ? NULL : catalog_find(a->cat, job, step);
	if (e)
		e->readers++;
	pthread_mutex_unlock(&a->mu);
	if (rc) {
		free(v);
		return rc;
	}
	v->a = a;
	v->done = done;
	v->ctx = ctx;
	snprintf(v->job, sizeof(v->job), "%s", job);
	v->step = step;
	/*
	 * Listed: marked as read, straight to a reader. Not: the maint thread
	 * looks first. The upload tier: a reader reads its manifest, or says
	 * it has none.
	 */
	v->work.fn = e || v->tier ? verify_run : verify_find;
	workq_push(e || v->tier ? a->readers : a->maint, &v->work);
	return 0;
}
