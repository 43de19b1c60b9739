/*
 * Restore: shard files back through the staging pool into a plan's memory.
 *
 * It builds a list of extents (a tensor's bytes in a rank's file, where they
 * go, and the checksum the manifest promises: restore_map.c assembles a
 * tensor of another layout from the saved chunks that overlap it) and runs
 * the reader (stream_read.c, its state table): aligned windows of the files
 * are read through the I/O thread into staging chunks, several in flight,
 * and processed in order, each tensor's XXH3 computed as its bytes pass,
 * then copied into the plan's regions; the first problem stops it, naming
 * the tensor and the file. verify.c reads the same way, copying nothing.
 *
 * A restore runs on a capture worker (it moves the same bytes the other
 * way). Bytes read back are input like any other: sizes, headers and
 * checksums are all checked against the manifest. The call is the edge's
 * (rpc/restore_rpc.c): restore_request, and the end told to the function
 * it gave.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/pipe/stream.h"
#include "agent/node/catalog.h"
#include "agent/node/restore.h"
#include "agent/node/upload.h"
#include "ipc/base/log.h"
#include "storage/store.h"

/* ---- restore ---------------------------------------------------------- */
/*
 * With LATEST, which failures of the newest step send the restore to the
 * next older one (RestoreRequest.strict and .fallback).
 */
enum restore_fallback {
	FB_DAMAGED, /* the default: damage (and a step removed meanwhile), loudly */
	FB_NEVER, /* strict: the newest step, or its error */
	FB_ANY, /* any failure but a plan that does not match (an I/O error too) */
};

struct restore {
	struct work work;
	struct agent *a;
	restore_done_fn done; /* told the end, with ctx */
	void *ctx;
	int64_t t_start; /* monotonic ns of the request */
	struct plan *plan;
	int64_t step;
	bool latest;
	enum restore_fallback fb; /* with LATEST: past which failures to an older step */
	struct storage *tier; /* the upload tier, where the root lacks the step or fails; or NULL */
	bool unlisted; /* not in the catalog when asked: the worker looks at the root */
	bool damage_seen; /* a step it met was damaged: never "no checkpoint" */
	unsigned passed_over; /* newer steps passed over (the notes say why) */
	unsigned relooks; /* LATEST looked for again: its step was removed as it was read */
	char **skipped;
	size_t nskipped;
	uint64_t read, delivered; /* bytes read for it (its share of a group's: 0 or all) */
	size_t together; /* ranks of this node it was read with, itself included (0: alone) */
};

#define MAX_RETRIES 16 /* reads again from other copies, at most */
#define MAX_RELOOKS 8 /* LATEST looked for again after a removal, at most */

/* A note for the reply and the log: what the root said, and that the tier restored. */
static void note(struct restore *rs, const char *text)
{
	char **v = realloc(rs->skipped, (rs->nskipped + 1) * sizeof(*v));

	if (!v)
		return;
	rs->skipped = v;
	if ((v[rs->nskipped] = strdup(text)))
		rs->nskipped++;
}

/*
 * Each file r reads is the one m names (store_check_file: its size, its
 * header, the save it is stamped with), before a byte of its tensors is
 * taken: a manifest copied under another step's name, with the files,
 * restores nothing. One small read of each file's head. 0, or the first
 * that is not (*failed: that file).
 */
static int files_as_named(struct reader *r, struct storage *store, const struct manifest *m,
                          struct bad_chunk *failed, char *err)
{
	unsigned char *seen = calloc(m->nranks ? m->nranks : 1, 1);
	char msg[IPC_ERRLEN];
	int rc = seen ? 0 : ipc_errf(err, -ENOMEM, "out of memory");

	for (size_t i = 0; i < r->n && !rc; i++) {
		const struct manifest_rank *k = &m->ranks[r->ext[i].rank];
		const struct store_claim c = {m->run,  m->step,         k->rank, k->file,
		                              k->size, k->header_bytes, k->save};

		if (seen[k->rank])
			continue;
		seen[k->rank] = 1;
		rc = store_check_file(store, m->job, &c, msg);
		if (rc) {
			*failed = (struct bad_chunk){k->rank, UINT64_MAX};
			rc = ipc_errf(err, rc, "rank %d's shard: %s", k->rank, msg);
		}
	}
	free(seen);
	return rc;
}

/*
 * Every tensor of the plan from step's manifest m, leaving out the chunks
 * bad[0, nbad): 0, or the first problem; *failed, where it was (rank -1:
 * none of the files', e.g. the trainer's memory faulted). The first read
 * of the root's step is done with the other ranks of this node restoring
 * it (restore_group.c).
 */
static int read_all(struct restore *rs, struct storage *store, int64_t step,
                    const struct manifest *m, const struct bad_chunk *bad, size_t nbad,
                    struct bad_chunk *failed, char *err)
{
	const struct plan *p = rs->plan;
	struct reader r;
	bool together;
	int rc;

	*failed = (struct bad_chunk){-1, 0};
	rc = reader_init(&r, rs->a, p->job, step, p->n);
	r.q = rs->a->capture;
	r.store = store;
	r.lane = p->gpu ? p->gpu->lane : NULL;
	if (rc) {
		reader_free(&r);
		return ipc_errf(err, rc, "out of memory");
	}
	/*
	 * Ranks that may read together take the same copy of a replica (the
	 * first good one), so they share its read; alone, each starts at its
	 * rank, so many reading alone spread over the copies.
	 */
	together = !nbad && store == rs->a->store && rs->a->cfg.read_once && !p->gpu;
	rc = restore_map(&r, p, m, bad, nbad, together ? 0 : (unsigned)p->rank, err);
	if (!rc)
		rc = files_as_named(&r, store, m, failed, err);
	if (!rc && together) {
		struct together t = {0};
		bool ok = restore_read_together(rs->a, rs->plan, &r, step, m, &t);

		rs->read += t.read; /* the group's, even where its read failed */
		rs->delivered += t.delivered;
		rs->together = t.n ? t.n : rs->together;
		if (ok) {
			reader_free(&r);
			return 0;
		}
	}
	/* past the gathering (read alone): a group of its job waits for it no more */
	pthread_mutex_lock(&rs->a->mu);
	rs->plan->gathered = true;
	pthread_mutex_unlock(&rs->a->mu);
	if (!rc)
		rc = reader_run(&r, m, READ_AHEAD);
	rs->read += r.bytes;
	rs->delivered += r.delivered;
	if (!rc && r.err) {
		rc = ipc_errf(err, r.err, "%s", r.problems ? r.problems[0] : "read failed");
		*failed = (struct bad_chunk){r.bad_rank, r.bad_begin};
	}
	reader_free(&r);
	return rc;
}

/*
 * Whether a failed read is worth another, without the chunk or file that
 * failed: corrupt or missing, yes; an I/O error once (a bad sector, where
 * the storage itself may be down: each further try would wait out its
 * retries again); a fault of the trainer's memory, out of memory, no.
 */
static bool worth_another_copy(int rc, struct bad_chunk failed, bool *eio)
{
	if (failed.rank < 0)
		return false;
	if (rc == -EIO) {
		if (*eio)
			return false;
		*eio = true;
		return true;
	}
	return rc == -EBADMSG || rc == -ENOENT;
}

/*
 * The plan's tensors from one step of one storage. A chunk whose checksum
 * does not match, or a rank's file that cannot be read, is left out and the
 * read done again from the other copies of its boxes (replicas that saved
 * the same box), while some are left (MAX_RETRIES times at most); a restore
 * that needed them says so (the reply's notes, the log). When none is
 * left, the answer is the failure of the last chunk left out (what cannot
 * be read now); any other failure of a later read is its own answer.
 */
static int read_copies(struct restore *rs, struct storage *store, int64_t step,
                       const struct manifest *m, char *err)
{
	const struct plan *p = rs->plan;
	char first[IPC_ERRLEN] = "", last[IPC_ERRLEN] = "", line[IPC_ERRLEN + 128];
	struct bad_chunk bad[MAX_RETRIES], failed;
	size_t nbad = 0;
	int rc, last_rc = 0;
	bool eio = false;

	while ((rc = read_all(rs, store, step, m, bad, nbad, &failed, err)) &&
	       worth_another_copy(rc, failed, &eio) && nbad < MAX_RETRIES) {
		if (!nbad)
			snprintf(first, sizeof(first), "%s", err);
		snprintf(last, sizeof(last), "%s", err);
		last_rc = rc;
		bad[nbad++] = failed;
		log_msg(LOG_WARNING,
		        "restore of job %s step %lld rank %d: %s; reading again without %s of rank "
		        "%d's file",
		        p->job, (long long)step, p->rank, err,
		        failed.begin == UINT64_MAX ? "any" : "that chunk", failed.rank);
	}
	if (rc == -EINVAL && nbad) {
		/* no other copy of the last chunk left out: that chunk's failure is the answer */
		rc = ipc_errf(err, last_rc, "%s", last);
	} else if (!rc && nbad) {
		snprintf(line, sizeof(line), "step %lld: %s; restored from other copies",
		         (long long)step, first);
		note(rs, line);
		log_msg(LOG_WARNING, "restore of job %s rank %d: %s", p->job, p->rank, line);
	}
	return rc;
}

/*
 * The step's manifest: of a head (format 4), first what the rank's own
 * layout needs (its node's part: store_read_manifest_rank), then, where
 * that falls short (another layout, a replica's copy, a damaged chunk
 * with copies on other nodes), the whole.
 */
static int restore_one(struct restore *rs, struct storage *store, int64_t step, char **meta,
                       char *err)
{
	const struct plan *p = rs->plan;
	struct manifest *m = NULL;
	char line[IPC_ERRLEN + 128];
	int rc;

	if (p->gpu) { /* the lane is ours alone until the copies are in (plan.h: plan_gpu) */
		pthread_mutex_lock(&p->gpu->capture);
		if (!p->gpu->lane) {
			rc = ipc_errf(err, -EIO,
			              "the plan's GPU stream was lost after a failed "
			              "wait; create the plan again");
			goto out;
		}
	}
	for (bool whole = false;; whole = true) {
		rc = whole ? store_read_manifest(store, p->job, step, &m, line)
		           : store_read_manifest_rank(store, p->job, step, p->rank, &m, line);
		/* there, and no checkpoint can be read from it (a link, a file for its directory)
		 */
		if (rc == -EINVAL || rc == -EFBIG || rc == -ELOOP || rc == -ENOTDIR)
			rc = ipc_errf(err, -EBADMSG, "its manifest cannot be read: %s", line);
		else if (rc)
			snprintf(err, IPC_ERRLEN, "%s", line);
		if (rc)
			goto out;
		rc = read_copies(rs, store, step, m, err);
		if (!rc || !m->partial)
			break;
		manifest_free(m);
		m = NULL;
	}
	/* This rank's own meta (a data loader's position, a seed), not rank 0's. */
	if (!rc && manifest_rank_meta(m, p->rank) &&
	    !(*meta = strdup(manifest_rank_meta(m, p->rank))))
		rc = ipc_errf(err, -ENOMEM, "out of memory");
	/*
	 * A file the manifest names missing, or not what it says: the step is
	 * damaged, unless it went as it was read (retention, a delete: its
	 * manifest goes first).
	 */
	if ((rc == -ENOENT || rc == -EBADMSG) && !store_committed(store, p->job, step))
		rc = ipc_errf(err, -ENOENT, "removed (retention or a delete) as it was read");
	else if (rc == -ENOENT)
		rc = -EBADMSG; /* err says which file */
out:
	if (p->gpu)
		pthread_mutex_unlock(&p->gpu->capture);
	manifest_free(m);
	return rc;
}

static void restore_reply(struct restore *rs, int rc, int64_t step, char *meta, const char *err)
{
	const struct plan *p = rs->plan;
	struct restore_outcome o = {
	    .job = p->job,
	    .rank = p->rank,
	    .step = step,
	    .meta = meta ? meta : "",
	    .bytes = p->whole.shard_bytes - p->whole.header_len,
	    .skipped = rs->skipped,
	    .nskipped = rs->nskipped,
	};
	struct hub_restore h = {
	    .rc = rc,
	    .bytes = rc ? 0 : o.bytes,
	    .read = rs->read,
	    .start_ns = rs->t_start,
	    .passed_over = rs->passed_over,
	};

	pthread_mutex_lock(&rs->a->mu); /* the metrics hear it before the trainer does */
	hub_restore_end(&rs->a->hub, rs->a, &h);
	pthread_mutex_unlock(&rs->a->mu);
	atomic_fetch_add(&rs->a->restore_read_bytes, rs->read);
	rs->done(rs->ctx, rc, err, &o);
	if (rc)
		return;
	atomic_fetch_add(&rs->a->restored_bytes, o.bytes);
	if (rs->together > 1)
		log_msg(LOG_INFO,
		        "restored job %s step %lld rank %d: %llu bytes (read once with %zu other "
		        "ranks of this node: %llu of the %llu chunk bytes it needed read for it)",
		        p->job, (long long)step, p->rank, (unsigned long long)o.bytes,
		        rs->together - 1, (unsigned long long)rs->read,
		        (unsigned long long)rs->delivered);
	else
		log_msg(LOG_INFO, "restored job %s step %lld rank %d: %llu bytes (%llu read)",
		        p->job, (long long)step, p->rank, (unsigned long long)o.bytes,
		        (unsigned long long)rs->read);
}

/* Whether, with LATEST, a failure of rc sends the restore to an older step. */
static bool falls_back(const struct restore *rs, int rc)
{
	if (!rs->latest || rc == -EINVAL || rc == -ENOMEM)
		return false;
	switch (rs->fb) {
	case FB_DAMAGED:
		return rc == -EBADMSG || rc == -ENOENT; /* damaged, or removed as it was read */
	case FB_ANY:
		return true;
	case FB_NEVER:
		break;
	}
	return false;
}

/*
 * Under mu: step failed with rc (why: err); where a restore of LATEST goes
 * on to the next older step (marked as read), that step into *step, and
 * the one passed over into the reply's notes and the log.
 */
static bool fall_back(struct restore *rs, int64_t *step, int rc, const char *err)
{
	struct cat_entry *e;
	char line[IPC_ERRLEN + 64];

	if (!falls_back(rs, rc))
		return false;
	e = catalog_newest(rs->a->cat, rs->plan->job, *step);
	if (!e)
		return false;
	snprintf(line, sizeof(line), "step %lld: %s", (long long)*step, err);
	note(rs, line);
	rs->passed_over++;
	log_msg(LOG_WARNING, "restore of job %s rank %d: step %lld passed over (%s), trying %lld",
	        rs->plan->job, rs->plan->rank, (long long)*step, err, (long long)e->step);
	*step = e->step;
	e->readers++;
	return true;
}

/*
 * From the upload tier: the step the root could not give (why and root_rc:
 * what the root said; why NULL: it has no committed step of the job), or
 * the tier's LATEST. Where the tier cannot either, the root's answer
 * stands: a step damaged on the root is not made absent by a tier that
 * lacks it.
 */
static int from_tier(struct restore *rs, int64_t *step, char **meta, const char *why, int root_rc,
                     char *err)
{
	const struct plan *p = rs->plan;
	char line[2 * IPC_ERRLEN + 96], terr[IPC_ERRLEN];
	int rc = 0;

	/* the tier's LATEST is a hint: lost or unreadable, its newest manifest stands */
	if (*step < 0 && (rc = store_latest_get(rs->tier, p->job, step, terr)) &&
	    (rc == -ENOENT || rc == -EINVAL))
		rc = store_newest_committed(rs->tier, p->job, step, terr);
	if (rc)
		return ipc_errf(err, rc,
		                "the root has no committed checkpoint and the upload tier "
		                "none either: %s",
		                terr);
	rc = restore_one(rs, rs->tier, *step, meta, terr);
	if (rc)
		return why ? ipc_errf(err, root_rc, "%s; the upload tier could not either: %s", why,
		                      terr)
		           : ipc_errf(err, rc, "not on the root; from the upload tier: %s", terr);
	snprintf(line, sizeof(line), "step %lld restored from the upload tier (the root: %s)",
	         (long long)*step, why ? why : "no such committed step");
	note(rs, line);
	log_msg(LOG_WARNING, "restore of job %s rank %d: %s", p->job, p->rank, line);
	return 0;
}

/*
 * A step asked for by number that the root's listing does not show: no
 * such checkpoint (-ENOENT) only where its manifest is not there. Its
 * directory or manifest there yet unreadable (a link, a file, a directory
 * where the manifest should be: damage; no permission, an I/O error: that
 * error) is never taken for an absent step.
 */
static int not_listed(struct restore *rs, char *err)
{
	const char *job = rs->plan->job;
	struct manifest *m = NULL;
	char why[IPC_ERRLEN];
	int rc = store_read_manifest(rs->a->store, job, rs->step, &m, why);

	manifest_free(m);
	if (rc == -ENOENT)
		return ipc_errf(err, -ENOENT,
		                "job %s has no committed step %lld (ckptctl list %s shows what "
		                "there is)",
		                job, (long long)rs->step, job);
	if (rc == 0) /* committed as it was looked for */
		return ipc_errf(err, -EAGAIN, "job %s step %lld was committed just now: try again",
		                job, (long long)rs->step);
	if (rc == -EINVAL || rc == -EFBIG || rc == -ELOOP || rc == -ENOTDIR)
		rc = -EBADMSG;
	return ipc_errf(err, rc, "job %s step %lld is there but cannot be read: %s", job,
	                (long long)rs->step, why);
}

/*
 * Nothing of the job is listed, after a look at the root: no checkpoint
 * (-ENOENT), unless the root says one was there: a LATEST naming a step
 * means checkpoints were committed, and whatever became of them, a
 * trainer must not take it for a fresh start (-EBADMSG).
 */
static int nothing_listed(struct restore *rs, char *err)
{
	const char *job = rs->plan->job;
	char why[IPC_ERRLEN];
	int64_t latest = -1;
	int rc;

	if (!rs->latest)
		return not_listed(rs, err);
	rc = store_latest_get(rs->a->store, job, &latest, why);
	if (rc == -ENOENT)
		return ipc_errf(err, -ENOENT, "job %s has no committed checkpoint", job);
	if (rc && rc != -EINVAL)
		return ipc_errf(err, rc, "job %s: cannot tell whether it has checkpoints: %s", job,
		                why);
	return ipc_errf(err, -EBADMSG,
	                "job %s has no checkpoint that can be read, yet its LATEST %s: its "
	                "checkpoints were removed or damaged (ckptctl list %s); nothing was "
	                "restored",
	                job, rc ? "is there (unreadable)" : "names a step", job);
}

/*
 * The restore of one step from the root (or the tier's copy of it): one
 * known damaged is not read again for a restore of LATEST (the catalog
 * says why); asked for by number, it is (what changed may have mended it).
 */
static int restore_step(struct restore *rs, int64_t step, char **meta, char *err)
{
	struct agent *a = rs->a;
	char damage[sizeof(((struct cat_entry *)0)->damage)] = "";
	struct cat_entry *e;
	int rc;

	pthread_mutex_lock(&a->mu);
	e = catalog_find(a->cat, rs->plan->job, step);
	if (e && rs->latest)
		snprintf(damage, sizeof(damage), "%s", e->damage);
	pthread_mutex_unlock(&a->mu);
	rc = damage[0] ? ipc_errf(err, -EBADMSG, "%s", damage)
	               : restore_one(rs, a->store, step, meta, err);
	/* the root failed it (missing, or its bytes do not verify): the tier's copy */
	if (rc && rs->tier && rc != -EINVAL && rc != -ENOMEM) {
		char why[IPC_ERRLEN];

		snprintf(why, sizeof(why), "%s", err);
		rc = from_tier(rs, &step, meta, why, rc, err);
	}
	return rc;
}

/*
 * Under mu: what a restore of step learnt of it: damaged (the catalog says
 * so from now on: list, status, metrics, the next restore of LATEST), whole
 * again (restored), or gone.
 */
static void learnt(struct restore *rs, int64_t step, int rc, const char *err)
{
	struct cat_entry *e = catalog_find(rs->a->cat, rs->plan->job, step);

	if (!e)
		return;
	e->readers--;
	if (rc == -EBADMSG) {
		rs->damage_seen = true;
		if (!e->damage[0])
			log_msg(LOG_ERR, "job %s step %lld is damaged: %s", rs->plan->job,
			        (long long)step, err);
		catalog_set_damage(rs->a->cat, rs->plan->job, step, err);
	} else if (rc == 0 && e->damage[0] && !e->unreadable) {
		catalog_set_damage(rs->a->cat, rs->plan->job, step, NULL);
	} else if (rc == -ENOENT && !e->readers) {
		catalog_remove(rs->a->cat, rs->plan->job, step); /* removed as it was read */
	}
}

/*
 * A restore of LATEST whose step was removed as it was read (retention,
 * perhaps on another node, or a delete): LATEST is what the root holds
 * now, which may be newer (the commit that let retention remove it).
 * Going on to the next older step the catalog listed could end at
 * "no checkpoint" while the job has one. The root is looked at again,
 * and its newest step taken (marked as read): true; false where nothing
 * is left (the answer then says why, as for a job with nothing listed).
 */
static bool look_again(struct restore *rs, int64_t *step)
{
	struct agent *a = rs->a;
	struct cat_entry *e;

	log_msg(LOG_NOTICE,
	        "restore of job %s rank %d: step %lld was removed as it was read; looking "
	        "for the newest step again",
	        rs->plan->job, rs->plan->rank, (long long)*step);
	catalog_sync_job(a, rs->plan->job);
	pthread_mutex_lock(&a->mu);
	e = catalog_newest(a->cat, rs->plan->job, INT64_MAX);
	if (e) {
		e->readers++;
		*step = e->step;
	}
	pthread_mutex_unlock(&a->mu);
	return e != NULL;
}

/* A restore of LATEST that found nothing whole: every step passed over, in the answer. */
static int none_whole(struct restore *rs, int rc, char *err)
{
	char all[IPC_ERRLEN];
	size_t o = 0;

	if (!rs->nskipped)
		return rc;
	o = (size_t)snprintf(all, sizeof(all), "%s", err);
	for (size_t i = 0; i < rs->nskipped && o < sizeof(all); i++)
		o += (size_t)snprintf(all + o, sizeof(all) - o, "%s%s",
		                      i ? "; " : "; newer steps passed over: ", rs->skipped[i]);
	/* damage met on the way: this job had checkpoints, it is not a fresh start */
	return ipc_errf(err, rs->damage_seen && rc == -ENOENT ? -EBADMSG : rc, "%s", all);
}

static void restore_run(struct work *w)
{
	struct restore *rs = container_of(w, struct restore, work);
	struct agent *a = rs->a;
	char err[IPC_ERRLEN] = "", *meta = NULL;
	int64_t step = rs->step;
	struct cat_entry *e;
	bool again;
	int rc;

	/*
	 * LATEST is the newest manifest: one another node committed since this
	 * agent last looked (its ranks were not in that step) counts, one
	 * removed since does not (the step chosen at the request is let go for
	 * the look: a step being read is not dropped). A step not listed when
	 * asked may be on the root all the same.
	 */
	if (rs->latest || rs->unlisted) {
		pthread_mutex_lock(&a->mu);
		e = rs->unlisted ? NULL : catalog_find(a->cat, rs->plan->job, step);
		if (e)
			e->readers--;
		pthread_mutex_unlock(&a->mu);
		catalog_sync_job(a, rs->plan->job);
		pthread_mutex_lock(&a->mu);
		e = rs->latest ? catalog_newest(a->cat, rs->plan->job, INT64_MAX)
		               : catalog_find(a->cat, rs->plan->job, step);
		if (e) {
			e->readers++;
			step = e->step;
		}
		rs->unlisted = !e;
		pthread_mutex_unlock(&a->mu);
	}
	if (rs->unlisted) {
		/* only what the root lacks, from the tier: else ranks could restore different steps
		 */
		rc = rs->tier ? from_tier(rs, &step, &meta, NULL, -ENOENT, err) : -ENOENT;
		if (rc == -ENOENT)
			rc = nothing_listed(rs, err);
		goto reply;
	}
	do {
		bool removed;

		rc = restore_step(rs, step, &meta, err);
		pthread_mutex_lock(&a->mu);
		learnt(rs, step, rc, err);
		removed = rc == -ENOENT && rs->latest && rs->relooks < MAX_RELOOKS;
		again = rc && !removed && fall_back(rs, &step, rc, err);
		pthread_mutex_unlock(&a->mu);
		if (removed) {
			rs->relooks++;
			again = look_again(rs, &step);
			if (!again)
				rc = nothing_listed(rs, err);
		}
	} while (again);
	if (rc)
		rc = none_whole(rs, rc, err);
reply:
	/*
	 * The plan is idle before the trainer hears: a save it sends as soon as
	 * the restore returns must not find the restore still writing.
	 */
	pthread_mutex_lock(&a->mu);
	rs->plan->restoring--;
	plan_idle(a, rs->plan);
	pthread_mutex_unlock(&a->mu);
	restore_reply(rs, rc, step, meta, err);
	free(meta);
	pthread_mutex_lock(&a->mu);
	plan_put(a, rs->plan); /* the reply read its job and rank */
	pthread_mutex_unlock(&a->mu);
	for (size_t i = 0; i < rs->nskipped; i++)
		free(rs->skipped[i]);
	free(rs->skipped);
	free(rs);
}

/* Under mu: which step, marked as being read so nobody deletes it meanwhile. */
static int restore_prepare(struct agent *a, const struct restore_req *req, struct restore *rs,
                           char *err)
{
	struct cat_entry *e;
	struct plan *p;

	p = plan_of(a, req->uid, req->plan_id);
	if (!p)
		return ipc_errf(err, -ENOENT, "no plan %llu (destroyed, or the agent restarted)",
		                (unsigned long long)req->plan_id);
	if (p->active)
		return ipc_errf(err, -EBUSY,
		                "job %s rank %d: a save or restore of this plan is "
		                "using its memory: wait for CAPTURED",
		                p->job, p->rank);
	rs->tier = upload_tier(a->up);
	if (req->step == -1) { /* CKPT_LATEST */
		e = catalog_newest(a->cat, p->job, INT64_MAX);
	} else {
		int rc = ipc_check_step(req->step, err);

		if (rc)
			return rc;
		e = catalog_find(a->cat, p->job, req->step);
	}
	rs->a = a;
	rs->plan = p;
	rs->unlisted = !e; /* the worker looks at the root: it may have it, or say why not */
	rs->step = e ? e->step : req->step;
	rs->latest = req->step < 0;
	rs->fb = req->strict ? FB_NEVER : req->fallback ? FB_ANY : FB_DAMAGED;
	rs->work.fn = restore_run;
	if (e)
		e->readers++;
	plan_get(p);
	plan_busy(p);
	p->restoring++;
	p->gathered = false;
	return 0;
}

int restore_request(struct agent *a, const struct restore_req *req, restore_done_fn done, void *ctx,
                    char *err)
{
	struct restore *rs = calloc(1, sizeof(*rs));
	int rc;

	if (!rs)
		return ipc_errf(err, -ENOMEM, "out of memory");
	rs->done = done;
	rs->ctx = ctx;
	rs->t_start = ipc_mono_ns();
	pthread_mutex_lock(&a->mu);
	rc = restore_prepare(a, req, rs, err);
	pthread_mutex_unlock(&a->mu);
	if (rc) {
		free(rs);
		return rc;
	}
	workq_push(a->capture, &rs->work);
	return 0;
}
