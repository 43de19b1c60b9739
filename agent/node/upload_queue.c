/*
 * The upload tier's queue and its account (upload_int.h): what is to be
 * uploaded, from a commit (upload_queue) or the resume at start
 * (upload_resume); what will not be; and what status, list and the metrics
 * say of both, so that no step of the root is missing from the tier
 * without a word.
 *
 * The resume, at start and on the upload thread: for each job of the root,
 * one listing of the root and one of the tier (nothing per step beyond
 * what the upload itself does). A committed step of the root that the
 * tier has no manifest of is queued, newest first, unless the tier's
 * retention would drop it (it is noted instead). Its upload then finds
 * whether this node has a part of it (else it is another node's), and
 * what of it the tier has already. A step whose manifest is on the tier
 * is whole there: rank 0's node puts the manifest only once every node's
 * part is there. A tier that cannot be listed (the store away) has the
 * resume tried again after a back-off.
 *
 * The account: each queued step says how its last try went (pending: the
 * error, or what it waits for); each step given up (up_lost) says why, as
 * long as it is in the catalog (on the root): a restart queues it again.
 *
 * Threads: up_resume_run on the upload thread; the rest under agent.mu.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/node/node.h"
#include "agent/node/catalog.h"
#include "agent/node/upload.h"
#include "agent/node/upload_int.h"
#include "ipc/base/log.h"

_Static_assert(sizeof(((struct upload_behind *)0)->job) == IPC_MAX_JOB + 1,
               "upload_behind.job holds a job's name");

/*
 * The store's "no" (HTTP 403, 400, too large, a name it will not take):
 * asked again, it says the same. A refusal counts one more. A try that got
 * no answer, or one that says nothing of the request (the connection
 * broken, refused or timed out; a server error) leaves the count as it
 * was: an S3 server may drop the connection of a refused PUT before its
 * body is sent, and the client then sees the send fail, not the 403. Any
 * other end of a try (the store took the bytes: the step waits for other
 * nodes, or was dropped) starts it again from 0.
 */
unsigned up_refusals_after(unsigned refusals, int rc)
{
	switch (rc) {
	case -EACCES:
	case -EPERM:
	case -EINVAL:
	case -EFBIG:
	case -ENAMETOOLONG:
		return refusals + 1;
	case -EIO:
	case -ECONNREFUSED:
	case -ECONNRESET:
	case -ETIMEDOUT:
	case -EHOSTUNREACH:
		return refusals;
	default:
		return 0;
	}
}

/* ---- the queue ------------------------------------------------------------- */

static struct up_job *find_job(struct uploader *u, const char *job, int64_t step)
{
	struct list *pos;

	list_for_each(pos, &u->jobs)
	{
		struct up_job *j = container_of(pos, struct up_job, link);

		if (j->step == step && strcmp(j->job, job) == 0)
			return j;
	}
	return NULL;
}

static void skip_forget(struct uploader *u, const char *job, int64_t step);

void up_queue(struct uploader *u, const char *job, int64_t step)
{
	struct up_job *j;

	if (u->stopping || find_job(u, job, step))
		return; /* stopping, or queued already */
	j = calloc(1, sizeof(*j));
	if (!j) {
		log_msg(LOG_ERR, "upload of job %s step %lld: out of memory", job, (long long)step);
		return;
	}
	j->u = u;
	snprintf(j->job, sizeof(j->job), "%s", job);
	j->step = step;
	j->first_ns = ipc_mono_ns();
	j->backoff_ns = RETRY_FIRST_NS;
	j->work.fn = up_run;
	list_add_tail(&u->jobs, &j->link);
	if (step >= 0) { /* tried again: what was said of it is old */
		up_lost_forget(u, job, step);
		skip_forget(u, job, step);
	}
	workq_push(u->q, &j->work);
}

void up_job_free(struct up_job *j)
{
	list_del(&j->link);
	free(j);
}

void up_job_note(struct up_job *j, int rc, int64_t delay_ns, const char *why)
{
	char when[32];
	time_t t = (time_t)((ipc_now_ns() + delay_ns) / 1000000000);
	struct tm tm;

	if (rc == -EAGAIN) { /* waiting for other nodes: no failure */
		snprintf(j->note, sizeof(j->note), "upload pending: %s", why);
		return;
	}
	gmtime_r(&t, &tm);
	strftime(when, sizeof(when), "%H:%M:%S", &tm);
	snprintf(j->note, sizeof(j->note), "upload pending (try %u failed, next at %s UTC): %s",
	         j->tries, when, why);
}

/* ---- steps that will not be uploaded --------------------------------------- */

static void lost_free(struct up_lost *l)
{
	list_del(&l->link);
	free(l);
}

static struct up_lost *find_lost(struct uploader *u, const char *job, int64_t step)
{
	struct list *pos;

	list_for_each(pos, &u->lost)
	{
		struct up_lost *l = container_of(pos, struct up_lost, link);

		if (l->step == step && strcmp(l->job, job) == 0)
			return l;
	}
	return NULL;
}

/* Under mu: the notes of steps no longer on the root go (the catalog says). */
static void lost_prune(struct uploader *u)
{
	struct list *pos, *tmp;

	list_for_each_safe(pos, tmp, &u->lost)
	{
		struct up_lost *l = container_of(pos, struct up_lost, link);

		if (!catalog_find(u->a->cat, l->job, l->step))
			lost_free(l);
	}
}

void up_lost_add(struct uploader *u, const char *job, int64_t step, const char *why)
{
	struct up_lost *l;

	u->st.failed++;
	snprintf(u->st.last_failure, sizeof(u->st.last_failure), "job %s step %lld: %s", job,
	         (long long)step, why);
	if (!catalog_find(u->a->cat, job, step))
		return; /* not on the root (any more): no list row to say it in */
	l = find_lost(u, job, step);
	if (!l) {
		l = calloc(1, sizeof(*l));
		if (!l)
			return; /* counted and logged all the same */
		snprintf(l->job, sizeof(l->job), "%s", job);
		l->step = step;
		list_add_tail(&u->lost, &l->link);
	}
	snprintf(l->note, sizeof(l->note), "not on the upload tier: %s", why);
}

void up_lost_forget(struct uploader *u, const char *job, int64_t step)
{
	struct up_lost *l = find_lost(u, job, step);

	if (l)
		lost_free(l);
}

static void skip_free(struct up_skip *k)
{
	list_del(&k->link);
	free(k->steps);
	free(k);
}

/* Under mu: the steps of job the resume left out (v[0..n), ascending; taken). */
static void skip_set(struct uploader *u, const char *job, int64_t *v, size_t n)
{
	struct up_skip *k = NULL;
	struct list *pos;

	list_for_each(pos, &u->skips)
	{
		struct up_skip *x = container_of(pos, struct up_skip, link);

		if (strcmp(x->job, job) == 0)
			k = x;
	}
	if (k)
		skip_free(k); /* an earlier pass of the resume: this one knows better */
	k = n ? calloc(1, sizeof(*k)) : NULL;
	if (!k) {
		free(v);
		return;
	}
	snprintf(k->job, sizeof(k->job), "%s", job);
	k->steps = v;
	k->n = n;
	list_add_tail(&u->skips, &k->link);
}

static int step_cmp(const void *x, const void *y)
{
	const int64_t *a = x, *b = y;

	return (*a > *b) - (*a < *b);
}

/* Under mu: (job, step) is no longer one the resume left out (it is queued). */
static void skip_forget(struct uploader *u, const char *job, int64_t step)
{
	struct list *pos;

	list_for_each(pos, &u->skips)
	{
		struct up_skip *k = container_of(pos, struct up_skip, link);
		int64_t *at;

		if (strcmp(k->job, job) != 0)
			continue;
		at = k->n ? bsearch(&step, k->steps, k->n, sizeof(*at), step_cmp) : NULL;
		if (at) {
			memmove(at, at + 1, (size_t)(k->steps + k->n - at - 1) * sizeof(*at));
			k->n--;
		}
		return;
	}
}

void up_account_free(struct uploader *u)
{
	while (!list_empty(&u->lost))
		lost_free(container_of(u->lost.next, struct up_lost, link));
	while (!list_empty(&u->skips))
		skip_free(container_of(u->skips.next, struct up_skip, link));
}

/* ---- what status, list and the metrics say --------------------------------- */

void upload_get_stats(struct uploader *u, struct upload_stats *out)
{
	struct list *pos;

	memset(out, 0, sizeof(*out));
	if (!u)
		return;
	lost_prune(u);
	*out = u->st;
	list_for_each(pos, &u->jobs)
	{
		const struct up_job *j = container_of(pos, struct up_job, link);

		out->queued++;
		out->pending += j->note[0] != '\0';
	}
	list_for_each(pos, &u->lost) out->missing++;
}

static int row_cmp(const void *x, const void *y)
{
	const struct upload_row *a = x, *b = y;
	int r = strcmp(a->job, b->job);

	return r ? r : (a->step > b->step) - (a->step < b->step);
}

/* Rows of queued jobs and steps given up into v (room for them); how many. */
static size_t rows_of_lists(struct uploader *u, struct upload_row *v)
{
	struct list *pos;
	size_t n = 0;

	list_for_each(pos, &u->jobs)
	{
		const struct up_job *j = container_of(pos, struct up_job, link);

		if (j->step >= 0)
			v[n++] = (struct upload_row){j->job, j->step,
			                             j->note[0] ? "pending" : "queued", j->note};
	}
	list_for_each(pos, &u->lost)
	{
		const struct up_lost *l = container_of(pos, struct up_lost, link);

		v[n++] = (struct upload_row){l->job, l->step, "not uploaded", l->note};
	}
	return n;
}

size_t upload_rows(struct uploader *u, struct upload_row **out)
{
	struct upload_row *v;
	struct list *pos;
	size_t n = 0, cap = 0;

	*out = NULL;
	if (!u)
		return 0;
	list_for_each(pos, &u->jobs) cap++;
	list_for_each(pos, &u->lost) cap++;
	list_for_each(pos, &u->skips) cap += container_of(pos, struct up_skip, link)->n;
	v = cap ? malloc(cap * sizeof(*v)) : NULL;
	if (!v)
		return 0;
	n = rows_of_lists(u, v);
	list_for_each(pos, &u->skips)
	{
		const struct up_skip *k = container_of(pos, struct up_skip, link);

		for (size_t i = 0; i < k->n; i++)
			v[n++] =
			    (struct upload_row){k->job, k->steps[i], "not uploaded", u->skip_note};
	}
	qsort(v, n, sizeof(*v), row_cmp);
	*out = v;
	return n;
}

const struct upload_row *upload_row_find(const struct upload_row *v, size_t n, const char *job,
                                         int64_t step)
{
	struct upload_row key = {job, step, NULL, NULL};

	return n ? bsearch(&key, v, n, sizeof(*v), row_cmp) : NULL;
}

/* The entry of job in v[0..*n), added if it is not there; NULL: no room. */
static struct upload_behind *behind_of(struct upload_behind *v, size_t *n, size_t cap,
                                       const char *job)
{
	for (size_t i = 0; i < *n; i++)
		if (strcmp(v[i].job, job) == 0)
			return &v[i];
	if (*n == cap)
		return NULL;
	snprintf(v[*n].job, sizeof(v[*n].job), "%s", job);
	return &v[(*n)++];
}

size_t upload_behind(struct uploader *u, struct upload_behind **out)
{
	struct upload_behind *v, *b;
	struct list *pos;
	size_t n = 0, cap = 0;

	*out = NULL;
	if (!u)
		return 0;
	lost_prune(u);
	list_for_each(pos, &u->jobs) cap++;
	list_for_each(pos, &u->lost) cap++;
	v = cap ? calloc(cap, sizeof(*v)) : NULL;
	if (!v)
		return 0;
	list_for_each(pos, &u->jobs)
	{
		const struct up_job *j = container_of(pos, struct up_job, link);

		if (j->step >= 0 && j->note[0] && (b = behind_of(v, &n, cap, j->job)))
			b->pending++;
	}
	list_for_each(pos, &u->lost)
	{
		const struct up_lost *l = container_of(pos, struct up_lost, link);

		if ((b = behind_of(v, &n, cap, l->job)))
			b->missing++;
	}
	*out = v;
	return n;
}

/* ---- the resume at start ---------------------------------------------------- */

/*
 * The steps of one job to look at: the tier's committed ones and the
 * root's committed ones the tier has no manifest of (want), ascending.
 */
struct resume_set {
	struct ret_step *v;
	bool *want;
	size_t n;
};

static int merge(const struct storage_step *rv, size_t nr, const struct storage_step *tv, size_t nt,
                 struct resume_set *rs)
{
	size_t i = 0, k = 0;

	rs->v = calloc(nr + nt + 1, sizeof(*rs->v));
	rs->want = calloc(nr + nt + 1, sizeof(*rs->want));
	if (!rs->v || !rs->want)
		return -ENOMEM;
	for (size_t t = 0; t <= nt; t++) {
		/* the root's steps below the tier's next one, then that one */
		for (; i < nr && (t == nt || rv[i].step < tv[t].step); i++)
			if (rv[i].committed) {
				rs->v[k].step = rv[i].step;
				rs->want[k++] = true;
			}
		if (t == nt)
			break;
		if (i < nr && rv[i].step == tv[t].step && !tv[t].committed && rv[i].committed) {
			rs->v[k].step = rv[i].step;
			rs->want[k++] = true;
		} else if (tv[t].committed) {
			rs->v[k].step = tv[t].step;
			rs->v[k++].pinned = tv[t].pinned;
		}
		i += i < nr && rv[i].step == tv[t].step;
	}
	rs->n = k;
	return 0;
}

/*
 * The wanted steps of rs queued, newest first, each under mu (a long
 * backlog does not hold the lock); those the tier's retention would drop
 * at once are noted instead.
 */
static void resume_queue(struct uploader *u, const char *job, struct resume_set *rs)
{
	struct agent *a = u->a;
	int64_t *skipped = calloc(rs->n + 1, sizeof(*skipped));
	size_t queued = 0, dropped = 0;

	for (size_t i = rs->n; i-- > 0;) {
		if (!rs->want[i])
			continue;
		if (rs->v[i].why == RET_REMOVE) {
			if (skipped) /* no memory: left out all the same, and logged */
				skipped[rs->n - 1 - dropped] = rs->v[i].step;
			dropped++;
			continue;
		}
		pthread_mutex_lock(&a->mu);
		up_queue(u, job, rs->v[i].step);
		pthread_mutex_unlock(&a->mu);
		queued++;
	}
	/* ascending: the newest were found first, at the end */
	if (skipped && dropped)
		memmove(skipped, skipped + rs->n - dropped, dropped * sizeof(*skipped));
	pthread_mutex_lock(&a->mu);
	skip_set(u, job, skipped, skipped ? dropped : 0);
	pthread_mutex_unlock(&a->mu);
	if (queued || dropped)
		log_msg(LOG_NOTICE,
		        "upload tier: job %s: %zu committed steps of the root to upload, %zu the "
		        "tier would not keep",
		        job, queued, dropped);
}

/* One job: 0, or the listing that failed (err). */
static int resume_job(struct uploader *u, const char *job, char *err)
{
	struct storage *root = u->a->store, *tier = u->tier;
	struct storage_step *rv = NULL, *tv = NULL;
	struct resume_set rs = {0};
	size_t nr = 0, nt = 0;
	int rc;

	rc = root->ops->list_steps(root, job, &rv, &nr, err);
	if (!rc)
		rc = tier->ops->list_steps(tier, job, &tv, &nt, err);
	if (rc == -ENOENT) /* nothing of the job there yet */
		rc = 0, nt = 0;
	if (!rc)
		rc = merge(rv, nr, tv, nt, &rs);
	if (rc == -ENOMEM)
		ipc_errf(err, rc, "job %s: out of memory", job);
	if (!rc && rs.n) {
		rs.v[rs.n - 1].latest = true;
		retention_decide(&u->pol, rs.v, rs.n);
		resume_queue(u, job, &rs);
	}
	free(rs.v);
	free(rs.want);
	free(rv);
	free(tv);
	return rc;
}

int up_resume_run(struct uploader *u)
{
	struct storage *root = u->a->store;
	char **jobs = NULL, err[IPC_ERRLEN];
	size_t nj = 0;
	int rc = root->ops->list_jobs(root, &jobs, &nj, err), first = 0;

	if (rc) {
		log_msg(LOG_WARNING, "upload tier: cannot resume uploads: %s", err);
		return -EAGAIN;
	}
	for (size_t i = 0; i < nj; i++) {
		/* the tier away: the jobs left are looked at in the next try */
		if (!first && (rc = resume_job(u, jobs[i], err))) {
			log_msg(LOG_WARNING, "upload tier: job %s not resumed yet: %s", jobs[i],
			        err);
			first = -EAGAIN;
		}
		free(jobs[i]);
	}
	free(jobs);
	return first;
}
