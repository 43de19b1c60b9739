/*
 * The upload tier (upload.h): committed checkpoints copied from the root to
 * an object store and committed there.
 *
 * One upload of (job, step), on the upload thread, in steps that can each
 * be done again (a retry, a restart) without harm:
 *   1. the root's manifest names this node's part, and so its ranks' files;
 *   2. each file is copied unless the tier has it whole already: read from
 *      the root into the uploader's buffers (O_DIRECT, aligned), sent as
 *      the parts of one multipart upload, several in flight, paced to
 *      max_mbps; a copy that fails is aborted by the backend;
 *   3. this node's part, as the root has it, is put on the tier (create-once);
 *   4. the node hosting rank 0 waits for every node's part on the tier, then
 *      puts the manifest (create-once: the same bytes whoever writes it) and
 *      moves the tier's LATEST, and applies the tier's retention; the other
 *      nodes wait for that manifest;
 *   5. this node's saves of the step go COMMITTED -> UPLOADED.
 * "Not yet" (another node's part, or the manifest, still missing) is looked
 * at again soon, up to the commit deadline; a failure (the store away, a
 * read of the root) after a back-off from 2 s to 5 min, as long as the step
 * is on the root. A step is given up only when it cannot be uploaded: it
 * left the root, the store refused it 3 times in a row (HTTP 403, 400, too
 * large), or the other nodes' parts did not come by the deadline; its saves
 * are told, and status, list and the metrics say so (upload_queue.c). An
 * agent started again resumes every step the tier lacks (upload_queue.c).
 *
 * Threads: the upload thread runs the uploads; upload_queue runs under
 * agent.mu and only queues; the I/O completes on the I/O engine's and the
 * S3 backend's threads and is waited for here.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/node/node.h"
#include "agent/node/retention.h"
#include "agent/node/upload.h"
#include "agent/node/upload_int.h"
#include "agent/pipe/pool.h"
#include "storage/store.h"
#include "ipc/ipc.h"
#include "ipc/base/log.h"

#define UP_ALIGN 4096u
#define RETRY_MAX_NS (300LL * 1000000000)
#define WAIT_NS (500LL * 1000000) /* another node's part, or the manifest, not there yet */
#define REFUSED_TRIES 3 /* the store's "no" this many times in a row: given up */

/* ---- waiting for I/O ------------------------------------------------------- */

static void io_done(struct io_req *r)
{
	struct up_io *w = r->ctx;

	pthread_mutex_lock(&w->mu);
	w->busy = false;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

static void io_start(struct up_io *w, enum io_op op, void *buf, uint64_t len, uint64_t off)
{
	w->r = (struct io_req){.op = op,
	                       .buf = buf,
	                       .len = len,
	                       .off = off,
	                       .buf_index = -1,
	                       .done = io_done,
	                       .ctx = w};
	w->busy = true;
}

/* Waits for w's request: its result. */
static int64_t io_wait(struct up_io *w)
{
	pthread_mutex_lock(&w->mu);
	while (w->busy)
		pthread_cond_wait(&w->cv, &w->mu);
	pthread_mutex_unlock(&w->mu);
	return w->r.res;
}

/* ---- one shard ----------------------------------------------------------- */

/* The pacer: sleeps until n more bytes keep the rate under max_bps. */
static void pace(struct uploader *u, uint64_t n)
{
	int64_t now = ipc_mono_ns();
	struct timespec ts;

	if (!u->max_bps)
		return;
	/* in slices of at most 100 ms: a stop does not wait for a slow pace */
	while (u->next_send_ns > now && !atomic_load(&u->quit)) {
		int64_t d = u->next_send_ns - now;

		if (d > 100000000)
			d = 100000000;
		ts.tv_sec = 0;
		ts.tv_nsec = d;
		nanosleep(&ts, NULL);
		now = ipc_mono_ns();
	}
	u->next_send_ns = now + (int64_t)(n * 1000000000ull / u->max_bps);
}

/* Waits for every write in flight; the first failure's result. */
static int64_t drain(struct uploader *u)
{
	int64_t first = 0;

	for (unsigned b = 0; b < UP_BUFFERS; b++) {
		int64_t res = io_wait(&u->io[b]);

		if (res < 0 && !first)
			first = res;
	}
	return first;
}

static int copy_failed(struct uploader *u, struct storage_shard *w, int rc, const char *what,
                       const char *file, char *why)
{
	const struct storage_ops *t = u->tier->ops;
	const char *detail = w && t->shard_error ? t->shard_error(w) : NULL;

	return ipc_errf(why, rc, "%s %s: %s", what, file, detail ? detail : strerror(-rc));
}

/*
 * The root's `file` of (job, step) onto the tier, unless it is there whole.
 * *sent: the bytes sent.
 */
static int copy_shard(struct uploader *u, const char *job, int64_t step, const char *file,
                      uint64_t size, uint64_t *sent, char *why)
{
	struct storage *root = u->a->store, *tier = u->tier;
	struct storage_shard *r = NULL, *w = NULL;
	uint64_t have = 0, rsize = 0, off = 0;
	int64_t res = 0;
	int rc;

	rc = tier->ops->shard_stat(tier, job, step, file, &have, why);
	if (rc == 0 && have == size)
		return 0; /* whole on the tier: an earlier try, or another agent's */
	/* what the buffers' last requests said belongs to an earlier copy (all idle now) */
	for (unsigned b = 0; b < UP_BUFFERS; b++)
		u->io[b].r.res = 0;
	rc = root->ops->shard_open(root, job, step, file, &r, &rsize, why);
	if (rc)
		return rc;
	if (rsize != size) {
		root->ops->shard_close(r);
		return ipc_errf(why, -EIO, "%s on the root is %llu bytes, its manifest says %llu",
		                file, (unsigned long long)rsize, (unsigned long long)size);
	}
	rc = tier->ops->shard_create_as(tier, job, step, file, size, &w, why);
	if (rc) {
		root->ops->shard_close(r);
		return rc;
	}
	for (unsigned k = 0; off < size; k++, off += u->chunk) {
		struct up_io *io = &u->io[k % UP_BUFFERS];
		uint64_t n = size - off < u->chunk ? size - off : u->chunk;

		res = io_wait(io); /* this buffer's last part is sent */
		if (res < 0)
			break;
		if (atomic_load(&u->quit)) {
			res = -ECANCELED;
			break;
		}
		io_start(io, IO_READ, u->buf[k % UP_BUFFERS], u->chunk, off);
		root->ops->shard_read(r, &io->r);
		res = io_wait(io);
		if (res >= 0 && (uint64_t)res < n)
			res = -EIO; /* the file is shorter than it was */
		if (res < 0) {
			rc = ipc_errf(why, (int)res, "reading %s from the root: %s", file,
			              strerror((int)-res));
			goto out;
		}
		pace(u, n);
		io_start(io, IO_WRITE, u->buf[k % UP_BUFFERS], n, off);
		tier->ops->shard_write(w, &io->r);
	}
	if (res >= 0) /* every part sent before the upload is completed */
		res = drain(u);
	if (res < 0) {
		rc = copy_failed(u, w, (int)res, "sending", file, why);
		goto out;
	}
	io_start(&u->fin, IO_FSYNC, NULL, 0, 0);
	tier->ops->shard_finish(w, &u->fin.r);
	res = io_wait(&u->fin);
	if (res < 0)
		rc = copy_failed(u, w, (int)res, "completing", file, why);
	else
		*sent += size;
out:
	drain(u);
	root->ops->shard_close(r);
	tier->ops->shard_close(w); /* a copy that did not complete is aborted */
	return rc;
}

/* ---- one checkpoint ------------------------------------------------------- */

static const struct manifest_part *our_part(const struct manifest *m, const char *node)
{
	for (size_t i = 0; i < m->nparts; i++)
		if (strcmp(m->parts[i].node, node) == 0)
			return &m->parts[i];
	return NULL;
}

/* Whether the part brings rank 0 (its node commits on the tier). */
static bool node_has_rank0(const struct manifest_part *p)
{
	return p->nranks && p->ranks[0] == 0;
}

/*
 * A head's part of this node, read (its ranks' files): the part the head
 * names (its length and XXH3-64), holding the ranks it names.
 */
static int own_files(struct storage *s, const struct manifest *m, const struct manifest_part *mine,
                     struct part **out, char *why)
{
	int rc = store_read_part(s, m->job, m->step, mine->node, out, why);

	if (!rc && ((*out)->file_size != mine->size || (*out)->file_xxh3 != mine->xxh3 ||
	            (*out)->nranks != mine->nranks))
		rc = ipc_errf(why, -EBADMSG,
		              "parts/%s.json is not the part the manifest names: replaced or "
		              "damaged since the commit",
		              mine->node);
	return rc;
}

/* The tier's retention for job, after this node committed a step there. */
static void tier_retention(struct uploader *u, const char *job)
{
	struct storage *t = u->tier;
	struct storage_step *v = NULL;
	struct ret_step *rs;
	char err[IPC_ERRLEN];
	size_t n = 0, k = 0;

	if (!u->pol.keep_last || t->ops->list_steps(t, job, &v, &n, err))
		return;
	rs = calloc(n ? n : 1, sizeof(*rs));
	for (size_t i = 0; rs && i < n; i++)
		if (v[i].committed)
			rs[k++] = (struct ret_step){.step = v[i].step, .pinned = v[i].pinned};
	if (rs && k) {
		rs[k - 1].latest = true;
		retention_decide(&u->pol, rs, k);
		for (size_t i = 0; i < k; i++)
			if (rs[i].why == RET_REMOVE) {
				if (store_remove(t, job, rs[i].step, err))
					log_msg(LOG_WARNING, "upload tier: %s", err);
				else
					log_msg(LOG_INFO,
					        "upload tier: removed job %s step %lld (retention)",
					        job, (long long)rs[i].step);
			}
	}
	free(rs);
	free(v);
}

/*
 * 0: uploaded; -ESRCH: nothing of it is this node's; -EAGAIN: not yet (why
 * says what is awaited); -ENOENT: the step is no longer on the root; else
 * failed.
 */
static int upload_one(struct uploader *u, const char *job, int64_t step, uint64_t *sent, char *why)
{
	struct agent *a = u->a;
	const char *me = a->cfg.node;
	const struct manifest_part *mine;
	struct manifest *m = NULL;
	struct part *p = NULL;
	char key[STORE_KEY_MAX];
	uint64_t size;
	int rc;

	/* of several nodes, the head: this node's files are in its own part */
	rc = store_read_manifest_head(a->store, job, step, &m, why);
	if (rc)
		return rc;
	if (!m->nparts) { /* an old single-node manifest: it names no node */
		rc = ipc_errf(why, -ENOTSUP,
		              "its manifest (format %d, an older agent's) names no parts: the "
		              "upload tier takes checkpoints of format 2 and later",
		              m->version);
		manifest_free(m);
		return rc;
	}
	mine = our_part(m, me);
	if (!mine) { /* another node's step: its agent uploads it */
		manifest_free(m);
		return -ESRCH;
	}
	if (m->head_only)
		rc = own_files(a->store, m, mine, &p, why);
	for (size_t i = 0; !rc && i < mine->nranks; i++) {
		const struct manifest_rank *r = m->head_only ? NULL : &m->ranks[mine->ranks[i]];

		rc = copy_shard(u, job, step, r ? r->file : p->ranks[i].file,
		                r ? r->size : p->ranks[i].size, sent, why);
	}
	part_free(p);
	if (!rc)
		rc = store_copy_part(a->store, u->tier, job, step, me, why);
	if (rc)
		goto out;
	if (!node_has_rank0(mine)) {
		/* rank 0's node commits on the tier: ours is done once its manifest is there */
		if (!store_committed(u->tier, job, step))
			rc = ipc_errf(why, -EAGAIN, "waiting for node %s to commit it on the tier",
			              manifest_node_of(m, 0));
		goto out;
	}
	for (size_t i = 0; i < m->nparts; i++) {
		store_part_key(key, sizeof(key), job, step, m->parts[i].node);
		rc = u->tier->ops->obj_stat(u->tier, key, &size, why);
		if (rc == -ENOENT)
			rc = ipc_errf(why, -EAGAIN, "waiting for node %s's part on the tier",
			              m->parts[i].node);
		if (rc)
			goto out;
	}
	rc = store_copy_manifest(a->store, u->tier, job, step, why);
	if (rc == -EEXIST)
		rc = 0; /* the same bytes, from an earlier try */
	if (!rc)
		rc = store_latest_advance(u->tier, job, step, why);
	if (!rc)
		tier_retention(u, job);
out:
	manifest_free(m);
	return rc;
}

/*
 * Under mu: (job, step) is UPLOADED, or (why) will not be: said to whoever
 * listens (this node's saves of it, save.c).
 */
static void uploaded(struct agent *a, const char *job, int64_t step, const char *why)
{
	struct hub_ckpt c = {job, NULL, step, SAVE_UPLOADED, false, why};

	hub_ckpt(&a->hub, a, &c);
}

/*
 * The step left the root before its upload ended (deleted, or removed by
 * the root's retention): what this node put of it on the tier goes, unless
 * the tier committed it (then it is the tier's checkpoint).
 */
static void forget(struct uploader *u, const char *job, int64_t step)
{
	const char *me = u->a->cfg.node;
	struct storage *t = u->tier;
	char err[IPC_ERRLEN], key[STORE_KEY_MAX], **v = NULL;
	size_t n = 0;

	if (store_committed(t, job, step))
		return;
	/* this node's alone: the other nodes forget theirs */
	store_key(key, sizeof(key), job, step, NULL);
	if (t->ops->obj_list(t, key, &v, &n, err) == 0)
		for (size_t i = 0; i < n; i++) {
			if (shard_file_of_node(v[i], me) &&
			    t->ops->shard_unlink(t, job, step, v[i], err))
				log_msg(LOG_WARNING, "upload tier: %s", err);
			free(v[i]);
		}
	free(v);
	store_part_key(key, sizeof(key), job, step, me);
	t->ops->obj_delete(t, key, err); /* not there: nothing to forget */
}

/*
 * The upload thread: the tier's health every few seconds, which also tries
 * again the aborts of uploads that failed while the store was away.
 */
static void tier_check(struct uploader *u)
{
	char err[IPC_ERRLEN];
	bool reopened;

	if (!u->tier->ops->root_check || ipc_mono_ns() - u->checked_ns < 5000000000LL)
		return;
	u->checked_ns = ipc_mono_ns();
	if (u->tier->ops->root_check(u->tier, &reopened, err))
		log_msg(LOG_DEBUG, "upload tier: %s", err);
}

/* Under mu: j will not be uploaded (why): its saves are told, the step is noted. */
static void give_up(struct uploader *u, struct up_job *j, const char *why)
{
	uploaded(u->a, j->job, j->step, why);
	up_lost_add(u, j->job, j->step, why);
}

/* Under mu: the next try of j, rc after a failure, in its back-off. */
static int64_t backoff(struct uploader *u, struct up_job *j, int rc, const char *why)
{
	int64_t delay = j->backoff_ns;

	u->st.retried++;
	log_msg(LOG_WARNING, "upload of job %s step %lld failed (try %u, again in %lld s): %s",
	        j->job, (long long)j->step, j->tries, (long long)(delay / 1000000000), why);
	j->backoff_ns = ipc_backoff_next(j->backoff_ns, RETRY_FIRST_NS, RETRY_MAX_NS);
	up_job_note(j, rc, delay, why);
	return delay;
}

/*
 * Under mu: what follows a try of j that did not upload it (rc, why): 0
 * once j is done with (given up, or not this node's), else the delay
 * before its next try.
 */
static int64_t after_try(struct uploader *u, struct up_job *j, int rc, const char *why)
{
	struct agent *a = u->a;
	int64_t deadline = (int64_t)a->cfg.commit_deadline_s * 1000000000;
	char note[UP_NOTE_LEN];

	if (rc == -ESRCH)
		return 0; /* another node's step: nothing to do here */
	if (rc == -ENOENT) {
		snprintf(note, sizeof(note),
		         "the step left the root (deleted, or removed by retention) before its "
		         "upload: %s",
		         why);
		log_msg(LOG_NOTICE, "upload of job %s step %lld dropped: %s", j->job,
		        (long long)j->step, note);
		give_up(u, j, note);
		return 0;
	}
	if (rc == -EAGAIN && j->waiting_ns && ipc_mono_ns() - j->waiting_ns > deadline) {
		/* the other nodes upload nothing (no tier?), or rank 0's node is gone */
		snprintf(note, sizeof(note), "given up after the commit deadline (%u s): %s",
		         a->cfg.commit_deadline_s, why);
		log_msg(LOG_WARNING, "upload of job %s step %lld %s", j->job, (long long)j->step,
		        note);
		give_up(u, j, note);
		return 0;
	}
	j->refusals = up_refusals_after(j->refusals, rc);
	if (rc == -ENOTSUP || j->refusals >= REFUSED_TRIES) {
		if (rc == -ENOTSUP)
			snprintf(note, sizeof(note), "it cannot be: %s", why);
		else
			snprintf(note, sizeof(note),
			         "the store refused it %u times in a row: %s; the agent tries "
			         "again when it starts next",
			         j->refusals, why);
		log_msg(LOG_ERR, "upload of job %s step %lld given up: %s", j->job,
		        (long long)j->step, note);
		give_up(u, j, note);
		return 0;
	}
	if (u->stopping)
		return 0; /* resumed when the agent starts again */
	if (rc != -EAGAIN)
		return backoff(u, j, rc, why);
	/* "not yet" is looked at again soon; the deadline counts from this node's part sent */
	if (!j->waiting_ns)
		j->waiting_ns = ipc_mono_ns();
	up_job_note(j, rc, WAIT_NS, why);
	return WAIT_NS;
}

/* The upload thread: one try of j's upload (said in the log when it is done). */
static int try_upload(struct uploader *u, struct up_job *j, uint64_t *sent, char *why)
{
	struct agent *a = u->a;
	struct storage_stats s0 = {0}, s1 = {0};
	int64_t t0 = ipc_mono_ns();
	char wire[64] = "";
	int rc;

	tier_check(u);
	if (u->tier->ops->stats)
		u->tier->ops->stats(u->tier, &s0);
	rc = upload_one(u, j->job, j->step, sent, why);
	if (u->tier->ops->stats)
		u->tier->ops->stats(u->tier, &s1);
	/* "not there": the step left the root only if its manifest is gone (not a blip) */
	if (rc == -ENOENT && store_committed(a->store, j->job, j->step))
		rc = -EIO;
	if (rc)
		return rc;
	/* compressed: what went to the store (the upload thread alone writes to the tier) */
	if (a->cfg.upload.zstd_level && *sent)
		snprintf(wire, sizeof(wire), " (%llu compressed)",
		         (unsigned long long)(s1.bytes_written - s0.bytes_written));
	log_msg(LOG_INFO, "uploaded job %s step %lld: %llu bytes sent%s in %.3f s", j->job,
	        (long long)j->step, (unsigned long long)*sent, wire,
	        (double)(ipc_mono_ns() - t0) / 1e9);
	return 0;
}

/* The upload thread: the resume at start, tried again while the tier cannot be listed. */
static void resume(struct uploader *u, struct up_job *j)
{
	struct agent *a = u->a;
	int rc = up_resume_run(u);

	pthread_mutex_lock(&a->mu);
	if (rc && !u->stopping) {
		log_msg(LOG_WARNING,
		        "upload tier: the uploads to resume are looked for again in %lld s",
		        (long long)(j->backoff_ns / 1000000000));
		workq_push_at(u->q, &j->work, ipc_mono_ns() + j->backoff_ns);
		j->backoff_ns = ipc_backoff_next(j->backoff_ns, RETRY_FIRST_NS, RETRY_MAX_NS);
	} else {
		up_job_free(j);
	}
	pthread_mutex_unlock(&a->mu);
}

void up_run(struct work *w)
{
	struct up_job *j = container_of(w, struct up_job, work);
	struct uploader *u = j->u;
	struct agent *a = u->a;
	char why[IPC_ERRLEN] = "", job[IPC_MAX_JOB + 1];
	int64_t step = j->step, delay = 0;
	uint64_t sent = 0;
	int rc;

	if (atomic_load(&u->quit))
		return; /* stopping: upload_destroy frees it */
	if (step < 0) {
		resume(u, j);
		return;
	}
	rc = try_upload(u, j, &sent, why);
	pthread_mutex_lock(&a->mu);
	u->st.bytes += sent;
	j->tries++;
	if (rc == 0) {
		u->st.uploaded++;
		uploaded(a, j->job, step, NULL);
		up_lost_forget(u, j->job, step);
	} else {
		delay = after_try(u, j, rc, why);
	}
	if (delay) {
		workq_push_at(u->q, &j->work, ipc_mono_ns() + delay);
		pthread_mutex_unlock(&a->mu);
		return;
	}
	snprintf(job, sizeof(job), "%s", j->job);
	up_job_free(j);
	pthread_mutex_unlock(&a->mu);
	if (rc == -ENOENT)
		forget(u, job, step);
}

void upload_on_ckpt(struct agent *a, const struct hub_ckpt *c)
{
	if (a->up && c->state == SAVE_COMMITTED)
		up_queue(a->up, c->job, c->step);
}

void upload_resume(struct uploader *u)
{
	if (u)
		up_queue(u, "", -1);
}

/* ---- life ------------------------------------------------------------------ */

int upload_create(struct agent *a, struct storage *tier, struct uploader **out, char *err)
{
	struct uploader *u = calloc(1, sizeof(*u));
	int rc;

	*out = NULL;
	if (!u) {
		storage_destroy(tier);
		return ipc_errf(err, -ENOMEM, "out of memory");
	}
	u->a = a;
	u->tier = tier;
	u->chunk = pool_chunk_bytes(a->pool);
	u->pol = (struct ret_policy){a->cfg.upload.keep_last, a->cfg.upload.keep_every};
	if (u->pol.keep_every)
		snprintf(u->skip_note, sizeof(u->skip_note),
		         "not on the upload tier: the tier's retention (keep_last %u, keep_every "
		         "%lld) keeps newer steps",
		         u->pol.keep_last, (long long)u->pol.keep_every);
	else
		snprintf(u->skip_note, sizeof(u->skip_note),
		         "not on the upload tier: the tier's retention (keep_last %u) keeps newer "
		         "steps",
		         u->pol.keep_last);
	u->max_bps = (uint64_t)a->cfg.upload.max_mbps * 1000000 / 8;
	list_init(&u->jobs);
	list_init(&u->lost);
	list_init(&u->skips);
	pthread_mutex_init(&u->fin.mu, NULL);
	pthread_cond_init(&u->fin.cv, NULL);
	for (unsigned b = 0; b < UP_BUFFERS; b++) {
		if (posix_memalign(&u->buf[b], UP_ALIGN, u->chunk)) {
			upload_destroy(u);
			return ipc_errf(err, -ENOMEM, "upload tier: no memory for its buffers");
		}
		pthread_mutex_init(&u->io[b].mu, NULL);
		pthread_cond_init(&u->io[b].cv, NULL);
	}
	rc = workq_create("ckpt-upload", 1, &u->q, err);
	if (rc) {
		upload_destroy(u);
		return rc;
	}
	*out = u;
	return 0;
}

void upload_stop(struct uploader *u)
{
	struct list *pos, *tmp;

	if (!u || !u->q)
		return;
	pthread_mutex_lock(&u->a->mu);
	u->stopping = true;
	pthread_mutex_unlock(&u->a->mu);
	atomic_store(&u->quit, true);
	workq_destroy(u->q);
	u->q = NULL;
	list_for_each_safe(pos, tmp, &u->jobs) up_job_free(container_of(pos, struct up_job, link));
}

void upload_destroy(struct uploader *u)
{
	if (!u)
		return;
	upload_stop(u);
	for (unsigned b = 0; b < UP_BUFFERS; b++) {
		free(u->buf[b]);
		if (u->buf[b]) {
			pthread_mutex_destroy(&u->io[b].mu);
			pthread_cond_destroy(&u->io[b].cv);
		}
	}
	pthread_mutex_destroy(&u->fin.mu);
	pthread_cond_destroy(&u->fin.cv);
	up_account_free(u);
	storage_destroy(u->tier);
	free(u);
}

struct storage *upload_tier(struct uploader *u)
{
	return u ? u->tier : NULL;
}

int upload_pick_tier(struct agent *a, const char *name, struct storage **out, bool *is_tier,
                     char *err)
{
	*is_tier = name && strcmp(name, "upload") == 0;
	if (!name || !*name || strcmp(name, "root") == 0) {
		*out = a->store;
		return 0;
	}
	if (!*is_tier)
		return ipc_errf(err, -EINVAL, "tier '%.32s': expected root or upload", name);
	if (!a->up)
		return ipc_errf(err, -ENOENT, "this agent has no upload tier ([upload] root)");
	*out = a->up->tier;
	return 0;
}
