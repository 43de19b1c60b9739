/*
 * Retention and pins: the GC of one job's committed checkpoints, after each
 * commit (gc_queue, from commit_run) and on request (the Gc RPC, `ckptctl gc
 * JOB`), and pinning (the Pin RPC, `ckptctl pin|unpin JOB STEP`).
 *
 * Threads: the requests (gc_request, pin_request: rpc/gc_rpc.c's handlers)
 * come on the control thread and only queue; the work runs on the maint thread, which also runs
 * delete, so GC, pins and deletes of a job never race each other. Verifies and shows run beside
 * them on the reader threads: a step being verified is marked as read (cat_entry.readers), and a GC
 * keeps it, a delete refuses it.
 *
 * A GC decides (retention.c) and takes the checkpoints it removes out of the
 * catalog in one hold of agent.mu: a restore either marked its checkpoint as
 * read first (then it is kept) or no longer finds it. Then the backend
 * removes each one by renaming its step directory out of sight first, so a
 * crash mid-GC leaves either the whole checkpoint or nothing visible
 * (recovery deletes the renamed leftovers at the next start).
 */
#define _GNU_SOURCE /* asprintf */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/node/node.h"
#include "agent/node/checkpoint.h"
#include "agent/node/catalog.h"
#include "agent/node/gc.h"
#include "agent/node/retention.h"
#include "ipc/base/log.h"

struct gc_op {
	struct work work;
	struct agent *a;
	gc_done_fn done; /* whoever asked for a GC; NULL: queued after a commit */
	pin_done_fn pin_done;
	void *ctx;
	char job[IPC_MAX_JOB + 1];
	int64_t step; /* pin */
	bool pinned; /* pin */
};

/* What one GC decided, with copies of the entries it took out of the catalog. */
struct gc_plan {
	struct ret_policy pol;
	struct ret_step *v;
	size_t n;
	struct cat_entry *gone; /* [nremove] */
	size_t nremove;
	int64_t *removed; /* [nremove]: those the backend removed */
	size_t nremoved;
	char **problems; /* [nremove]: those it could not */
	size_t nproblems;
	uint64_t bytes;
};

static struct gc_op *gc_op_new(struct agent *a, const char *job, void (*fn)(struct work *))
{
	struct gc_op *op = calloc(1, sizeof(*op));

	if (!op)
		return NULL;
	op->a = a;
	snprintf(op->job, sizeof(op->job), "%s", job);
	op->work.fn = fn;
	return op;
}

/* Under mu: decides, and takes what goes out of the catalog. */
static int gc_decide(struct agent *a, const char *job, struct gc_plan *g)
{
	struct cat_entry **e = NULL;
	size_t k = 0;

	g->pol = (struct ret_policy){a->cfg.keep_last, a->cfg.keep_every};
	g->n = catalog_list(a->cat, job, &e);
	if (!e)
		return -ENOMEM;
	g->v = calloc(g->n ? g->n : 1, sizeof(*g->v));
	if (!g->v) {
		free(e);
		return -ENOMEM;
	}
	for (size_t i = 0; i < g->n; i++) {
		g->v[i].step = e[i]->step;
		g->v[i].pinned = e[i]->pinned;
		g->v[i].busy = e[i]->readers > 0;
		g->v[i].time_ns = e[i]->time_unix_ns;
		g->v[i].damaged = e[i]->damage[0] != '\0';
	}
	g->nremove = retention_decide(&g->pol, g->v, g->n);
	g->gone = calloc(g->nremove + 1, sizeof(*g->gone));
	g->removed = calloc(g->nremove + 1, sizeof(*g->removed));
	g->problems = calloc(g->nremove + 1, sizeof(*g->problems));
	if (!g->gone || !g->removed || !g->problems) {
		free(e);
		return -ENOMEM; /* nothing taken out of the catalog */
	}
	for (size_t i = 0; i < g->n; i++)
		if (g->v[i].why == RET_REMOVE)
			g->gone[k++] = *e[i];
	free(e); /* pointers into the catalog: invalid once it changes */
	/* Out of the catalog first: no restore or verify can start on them from now on. */
	for (size_t i = 0; i < g->nremove; i++)
		catalog_remove(a->cat, job, g->gone[i].step);
	return 0;
}

/* "1, 2, 3" (cut short with "..." when long). */
static void step_list(const struct gc_plan *g, char *buf, size_t len)
{
	size_t o = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < g->nremoved && o + 32 < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, i ? ", " : "", g->removed[i]);
	if (o + 32 >= len)
		snprintf(buf + o, len - o, ", ...");
}

/* A GC asked for failed: its asker hears why. */
__attribute__((format(printf, 3, 4))) static void gc_fail(const struct gc_op *op, int rc,
                                                          const char *fmt, ...)
{
	char why[IPC_ERRLEN];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	op->done(op->ctx, rc, why, NULL);
}

/* The outcome of a GC, as its asker hears it. */
static void gc_tell(const struct gc_op *op, const struct gc_plan *g)
{
	struct gc_outcome o = {
	    .job = op->job,
	    .pol = &g->pol,
	    .v = g->v,
	    .n = g->n,
	    .removed = g->removed,
	    .nremoved = g->nremoved,
	    .problems = g->problems,
	    .nproblems = g->nproblems,
	    .bytes = g->bytes,
	};

	op->done(op->ctx, 0, NULL, &o);
}

/* The GC's and delete's removal of a checkpoint out of the catalog (catalog.h). */
int gc_remove(struct agent *a, const struct cat_entry *e, char *err)
{
	struct manifest *m = NULL;
	char ignored[IPC_ERRLEN];
	struct cat_entry back = *e;
	int rc = store_remove(a->store, e->job, e->step, err);

	/* Still there (refused, put back, or failed before it went): back in the catalog. */
	if (rc && rc != -ENOENT &&
	    store_read_manifest_head(a->store, e->job, e->step, &m, ignored) == 0) {
		manifest_free(m);
		back.pinned |= rc == -EBUSY; /* pinned through another node's agent */
		pthread_mutex_lock(&a->mu);
		catalog_add(a->cat, &back);
		pthread_mutex_unlock(&a->mu);
	}
	return rc;
}

/* gc_remove; ENOENT: someone removed it by hand; gone is what we wanted. */
static int gc_remove_one(struct agent *a, const struct cat_entry *e, char *err)
{
	int rc = gc_remove(a, e, err);

	return rc == -ENOENT ? 0 : rc;
}

/* A step the GC meant to remove was pinned meanwhile (on disk): it is kept, as pinned. */
static void gc_kept_pinned(struct gc_plan *g, int64_t step)
{
	for (size_t i = 0; i < g->n; i++)
		if (g->v[i].step == step && g->v[i].why == RET_REMOVE)
			g->v[i].why = RET_PINNED;
}

/* Whether job's clean-up is due (once per `every` seconds), noting it if so. */
static bool scan_due(struct agent *a, const char *job, int64_t now, int64_t every)
{
	struct gc_scan *oldest = &a->scans[0];
	bool due = true;

	pthread_mutex_lock(&a->mu);
	for (size_t i = 0; i < AGENT_SCANS; i++) {
		struct gc_scan *s = &a->scans[i];

		if (strcmp(s->job, job) == 0) {
			due = now - s->at >= every;
			oldest = s;
			break;
		}
		if (s->at < oldest->at)
			oldest = s;
	}
	if (due) {
		snprintf(oldest->job, sizeof(oldest->job), "%s", job);
		oldest->at = now;
	}
	pthread_mutex_unlock(&a->mu);
	return due;
}

/*
 * Uncommitted steps of the job that every node gave up: older than LATEST
 * and untouched for abandon_after (docs/DESIGN.md §6.9: nothing another node may
 * still commit). Runs with retention, on the node that committed.
 */
static void abandoned(struct agent *a, const char *job)
{
	struct storage_cleanup pol = {(int64_t)a->cfg.abandon_after_s, ipc_now_ns() / 1000000000,
	                              false};
	struct storage_recovery rec = {0};
	char err[IPC_ERRLEN];

	/* A step is abandoned after an hour or so: a look every tenth of that is enough. */
	if (!scan_due(a, job, pol.now_unix_s, pol.abandon_after_s / 10))
		return;
	if (store_cleanup(a->store, job, &pol, &rec, err))
		log_msg(LOG_WARNING, "clean-up of job %s: %s", job, err);
	if (rec.partial_removed || rec.temp_removed)
		log_msg(
		    LOG_INFO,
		    "clean-up of job %s: removed %u abandoned uncommitted steps and %u leftovers",
		    job, rec.partial_removed, rec.temp_removed);
}

static void gc_run(struct work *w)
{
	struct gc_op *op = container_of(w, struct gc_op, work);
	struct agent *a = op->a;
	struct gc_plan g = {0};
	char err[IPC_ERRLEN], list[400];
	int rc;

	/* Pins are on disk, and another node's agent may have set or cleared one. */
	if (a->cfg.keep_last)
		catalog_sync_job(a, op->job);
	pthread_mutex_lock(&a->mu);
	rc = gc_decide(a, op->job, &g);
	pthread_mutex_unlock(&a->mu);
	if (rc) {
		log_msg(LOG_ERR, "gc of job %s: out of memory", op->job);
		if (op->done)
			gc_fail(op, rc, "gc %s: out of memory", op->job);
		goto out;
	}
	if (g.n == 0 && op->done) { /* a typo in the job's name, most likely */
		gc_fail(op, -ENOENT,
		        "gc: job %s has no committed checkpoint (ckptctl list shows every job)",
		        op->job);
		goto out;
	}
	for (size_t i = 0; i < g.nremove; i++) {
		const struct cat_entry *e = &g.gone[i];

		rc = gc_remove_one(a, e, err);
		if (rc == 0) {
			g.removed[g.nremoved++] = e->step;
			g.bytes += e->bytes;
			continue;
		}
		if (rc == -EBUSY) {
			log_msg(LOG_INFO, "gc of job %s: step %" PRId64 " kept: %s", op->job,
			        e->step, err);
			gc_kept_pinned(&g, e->step);
			continue;
		}
		log_msg(LOG_WARNING, "gc of job %s: step %" PRId64 ": %s", op->job, e->step, err);
		if (asprintf(&g.problems[g.nproblems], "step %" PRId64 ": %s", e->step, err) >= 0)
			g.nproblems++;
	}
	pthread_mutex_lock(&a->mu);
	a->gc_removed += g.nremoved;
	pthread_mutex_unlock(&a->mu);
	step_list(&g, list, sizeof(list));
	log_msg(g.nremoved || g.nproblems || op->done ? LOG_INFO : LOG_DEBUG,
	        "gc of job %s (keep_last %u, keep_every %" PRId64
	        "): removed %zu checkpoint%s%s%s%s "
	        "(%" PRIu64 " bytes), kept %zu%s",
	        op->job, g.pol.keep_last, g.pol.keep_every, g.nremoved, g.nremoved == 1 ? "" : "s",
	        g.nremoved ? " (steps " : "", list, g.nremoved ? ")" : "", g.bytes,
	        g.n - g.nremoved - g.nproblems,
	        g.nproblems ? "; some removals failed (see above)" : "");
	abandoned(a, op->job);
	if (op->done)
		gc_tell(op, &g);
out:
	for (size_t i = 0; i < g.nproblems; i++)
		free(g.problems[i]);
	free(g.problems);
	free(g.removed);
	free(g.gone);
	free(g.v);
	free(op);
}

void gc_on_ckpt(struct agent *a, const struct hub_ckpt *c)
{
	if (c->state != SAVE_COMMITTED)
		return;
	if (c->wrote)
		gc_queue(a, c->job);
	else
		gc_queue_sync(a, c->job);
}

void gc_queue(struct agent *a, const char *job)
{
	struct gc_op *op = gc_op_new(a, job, gc_run);

	if (!op) {
		log_msg(LOG_ERR, "gc of job %s not queued: out of memory (the next commit retries)",
		        job);
		return;
	}
	workq_push(a->maint, &op->work);
}

static void sync_run(struct work *w)
{
	struct gc_op *op = container_of(w, struct gc_op, work);

	catalog_sync_job(op->a, op->job);
	free(op);
}

void gc_queue_sync(struct agent *a, const char *job)
{
	struct gc_op *op = gc_op_new(a, job, sync_run);

	if (op)
		workq_push(a->maint, &op->work);
}

int gc_request(struct agent *a, const char *job, gc_done_fn done, void *ctx)
{
	struct gc_op *op = gc_op_new(a, job, gc_run);

	if (!op)
		return -ENOMEM;
	op->done = done;
	op->ctx = ctx;
	workq_push(a->maint, &op->work);
	return 0;
}

/* ---- pins ------------------------------------------------------------- */

static void pin_run(struct work *w)
{
	struct gc_op *op = container_of(w, struct gc_op, work);
	const char *what = op->pinned ? "pin" : "unpin";
	struct agent *a = op->a;
	struct cat_entry *e;
	char err[IPC_ERRLEN];
	int rc = 0;

	pthread_mutex_lock(&a->mu);
	e = catalog_find(a->cat, op->job, op->step);
	pthread_mutex_unlock(&a->mu);
	if (!e) /* committed by another node, perhaps, and not seen here yet */
		catalog_sync_job(a, op->job);
	pthread_mutex_lock(&a->mu);
	if (!catalog_find(a->cat, op->job, op->step))
		rc =
		    ipc_errf(err, -ENOENT,
		             "job %s has no committed step %" PRId64 " (ckptctl list %s shows what "
		             "there is)",
		             op->job, op->step, op->job);
	pthread_mutex_unlock(&a->mu);
	/* The marker on disk first: the answer, and the catalog, say what a restart finds. */
	if (!rc)
		rc = store_set_pinned(a->store, op->job, op->step, op->pinned, err);
	if (!rc) {
		pthread_mutex_lock(&a->mu);
		e = catalog_find(a->cat, op->job, op->step);
		if (e)
			e->pinned = op->pinned;
		pthread_mutex_unlock(&a->mu);
	}
	if (!rc)
		log_msg(LOG_INFO, "%sned job %s step %" PRId64, what, op->job, op->step);
	if (rc) {
		char why[IPC_ERRLEN + 8];

		snprintf(why, sizeof(why), "%s: %s", what, err);
		op->pin_done(op->ctx, rc, why);
	} else {
		op->pin_done(op->ctx, 0, NULL);
	}
	free(op);
}

int pin_request(struct agent *a, const char *job, int64_t step, bool pinned, pin_done_fn done,
                void *ctx)
{
	struct gc_op *op = gc_op_new(a, job, pin_run);

	if (!op)
		return -ENOMEM;
	op->step = step;
	op->pinned = pinned;
	op->pin_done = done;
	op->ctx = ctx;
	workq_push(a->maint, &op->work);
	return 0;
}
