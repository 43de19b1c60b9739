/*
 * GET /metrics (metrics.h): histograms of save durations, observed as saves
 * change state (metrics_on_save, a subscriber of the hub's save event, under
 * agent.mu; metrics_on_commit and metrics_on_restore, told the hub's commit
 * and restore ends by agent.c, under agent.mu too), and at scrape
 * time the agent's counters: the I/O engine's (atomics), the pool's (its
 * mutex) and, under agent.mu for a few loads, saves by final state, saves in
 * flight, sessions, plans and the storage root's state. Per job (a `job`
 * label): saves by final state, committed bytes, the time and step of the
 * last commit, kept from the agent's start for every job seen (at most
 * MAX_JOBS; the ones after are counted in the agent's totals only). The
 * root's free space is asked of the filesystem at scrape time. The text is
 * formatted after every lock is let go.
 *
 * libmicrohttpd runs the listening socket on its own thread, one request at
 * a time; the socket is bound here, so that it is exactly HOST:PORT and a
 * failure to bind stops start-up with the reason.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "agent/node/node.h"
#include "agent/node/plan.h"
#include "agent/node/checkpoint.h"
#include "agent/node/save.h"
#include "agent/node/catalog.h"
#include "agent/daemon/config.h"
#include "agent/daemon/metrics.h"
#include "agent/node/upload.h"
#include "ipc/base/log.h"

#ifndef CKPTD_VERSION
#define CKPTD_VERSION "0.0.0"
#endif

/*
 * Upper bounds in seconds, 1 ms .. 25000 s (about 7 h: the persist, commit
 * and restore of a checkpoint of many TB on a slow filesystem); +Inf follows.
 */
static const double bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,  0.1,  0.25,
                                0.5,   1,      2.5,   5,    10,    25,    50,   100,
                                250,   500,    1000,  2500, 5000,  10000, 25000};
#define NBOUNDS (sizeof(bounds) / sizeof(bounds[0]))

struct hist {
	uint64_t n[NBOUNDS + 1]; /* per bucket, not cumulative; the last is +Inf */
	uint64_t count;
	double sum;
};

enum { H_STALL, H_PERSIST, H_COMMIT, H_RESTORE, H_COMMIT_LATENCY, NHIST };

#define MAX_JOBS 1024 /* jobs with series of their own (a node runs a few) */

/* One job's series. */
struct job_stat {
	char job[IPC_MAX_JOB + 1];
	unsigned plans; /* live plans of the job on this node (at a scrape) */
	uint64_t finals[8]; /* saves by final state */
	uint64_t committed_bytes;
	double last_commit_unix; /* 0: none yet */
	int64_t last_commit_step;
};

struct metrics {
	struct agent *a;
	struct MHD_Daemon *d;
	double start_unix; /* seconds */
	pthread_mutex_t mu; /* everything below */
	struct hist h[NHIST];
	uint64_t restores_ok, restores_failed, restored_bytes, restore_read;
	uint64_t restores_absent, restores_damaged, passed_over;
	uint64_t parts_missing;
	struct job_stat *jobs; /* njobs of them, by first save */
	size_t njobs;
};

static const struct {
	const char *name, *help;
} hists[NHIST] = {
    [H_STALL] = {"ckptd_save_stall_seconds",
                 "Time from save to CAPTURED: how long the trainer's tensors were held."},
    [H_PERSIST] = {"ckptd_save_persist_seconds",
                   "Time from save to DURABLE: the rank's shard written and fsync'd."},
    [H_COMMIT] = {"ckptd_save_commit_seconds",
                  "Time from save to COMMITTED: every rank durable and the manifest too."},
    [H_RESTORE] = {"ckptd_restore_seconds",
                   "Time of a successful restore, request to reply, fallbacks included."},
    [H_COMMIT_LATENCY] = {"ckptd_commit_latency_seconds",
                          "Commits this node wrote: the last part durable to the manifest "
                          "durable."},
};

static void add(struct hist *h, double v)
{
	size_t i = 0;

	while (i < NBOUNDS && v > bounds[i])
		i++;
	h->n[i]++;
	h->count++;
	h->sum += v;
}

static void observe(struct hist *h, int64_t from_ns, int64_t to_ns)
{
	if (from_ns > 0 && to_ns >= from_ns)
		add(h, (double)(to_ns - from_ns) / 1e9);
}

/* Under m->mu: the series of job, made at its first final save; NULL past MAX_JOBS. */
static struct job_stat *job_of(struct metrics *m, const char *job)
{
	for (size_t i = 0; i < m->njobs; i++)
		if (strcmp(m->jobs[i].job, job) == 0)
			return &m->jobs[i];
	if (m->njobs == MAX_JOBS)
		return NULL;
	if (!m->jobs && !(m->jobs = calloc(MAX_JOBS, sizeof(*m->jobs))))
		return NULL;
	snprintf(m->jobs[m->njobs].job, sizeof(m->jobs[0].job), "%s", job);
	return &m->jobs[m->njobs++];
}

static double unix_now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

void metrics_on_save(struct agent *a, struct save *s, enum save_state state)
{
	struct metrics *m = a->metrics;
	struct job_stat *j;

	if (!m)
		return;
	pthread_mutex_lock(&m->mu);
	if ((ipc_state_final(state) || state == SAVE_UPLOADED) && (j = job_of(m, s->job)) != NULL) {
		j->finals[state]++;
		if (state == SAVE_COMMITTED) {
			j->committed_bytes += s->bytes_total;
			j->last_commit_unix = unix_now();
			if (s->step > j->last_commit_step)
				j->last_commit_step = s->step;
		}
	}
	if (state == SAVE_CAPTURED)
		observe(&m->h[H_STALL], s->t_queued, s->t_captured);
	else if (state == SAVE_DURABLE)
		observe(&m->h[H_PERSIST], s->t_queued, s->t_durable);
	else if (state == SAVE_COMMITTED)
		observe(&m->h[H_COMMIT], s->t_queued, s->t_committed);
	pthread_mutex_unlock(&m->mu);
}

void metrics_on_restore(struct metrics *m, int rc, uint64_t bytes, uint64_t read, int64_t start_ns,
                        unsigned passed_over)
{
	if (!m)
		return;
	pthread_mutex_lock(&m->mu);
	m->restore_read += read;
	m->passed_over += passed_over;
	if (rc == -ENOENT)
		m->restores_absent++;
	else if (rc == -EBADMSG)
		m->restores_damaged++;
	else if (rc)
		m->restores_failed++;
	else {
		m->restores_ok++;
		m->restored_bytes += bytes;
		observe(&m->h[H_RESTORE], start_ns, ipc_mono_ns());
	}
	pthread_mutex_unlock(&m->mu);
}

void metrics_on_commit(struct metrics *m, int64_t latency_ns, unsigned parts_missing)
{
	if (!m)
		return;
	pthread_mutex_lock(&m->mu);
	if (latency_ns >= 0 && parts_missing == 0)
		add(&m->h[H_COMMIT_LATENCY], (double)latency_ns / 1e9);
	m->parts_missing += parts_missing;
	pthread_mutex_unlock(&m->mu);
}

/* ---- a scrape --------------------------------------------------------- */

/* What a scrape shows, copied under the locks. */
struct snapshot {
	struct hist h[NHIST];
	uint64_t restores_ok, restores_failed, restored_bytes, restore_read, parts_missing;
	uint64_t restores_absent, restores_damaged, passed_over;
	size_t damaged; /* listed checkpoints known damaged */
	uint64_t finals[8];
	unsigned inflight, sessions, plans, ckpts;
	uint64_t captured;
	bool root_ok;
	struct ioeng_stats io;
	struct pool_stats pool;
	bool upload_tier;
	struct upload_stats up;
	struct upload_behind *behind; /* malloc'd, nbehind of them */
	size_t nbehind;
	uint64_t gc_removed;
	struct job_stat *jobs; /* a copy (malloc'd), njobs of them */
	size_t njobs;
	char (*plan_jobs)[IPC_MAX_JOB + 1]; /* the job of each live plan (malloc'd) */
	size_t nplan_jobs;
};

static void take_snapshot(struct metrics *m, struct snapshot *s)
{
	struct agent *a = m->a;

	pthread_mutex_lock(&a->mu);
	memcpy(s->finals, a->finals, sizeof(s->finals));
	s->inflight = a->inflight;
	s->sessions = a->nsessions;
	s->plans = a->nplans;
	s->root_ok = a->root.state == ROOT_OK;
	s->ckpts = a->nckpts;
	s->upload_tier = a->up != NULL;
	upload_get_stats(a->up, &s->up);
	s->nbehind = upload_behind(a->up, &s->behind);
	s->gc_removed = a->gc_removed;
	s->damaged = catalog_damaged(a->cat);
	/* each live plan's job, for the jobs' plans gauge (a node has a few hundred at most) */
	s->nplan_jobs = 0;
	s->plan_jobs = a->nplans ? calloc(a->nplans, sizeof(*s->plan_jobs)) : NULL;
	if (s->plan_jobs) {
		struct list *pos;

		list_for_each(pos, &a->plans)
		{
			const struct plan *p = container_of(pos, struct plan, link);

			if (s->nplan_jobs < a->nplans)
				snprintf(s->plan_jobs[s->nplan_jobs++], sizeof(s->plan_jobs[0]),
				         "%s", p->job);
		}
	}
	pthread_mutex_unlock(&a->mu);
	s->captured = atomic_load(&a->captured_bytes);
	pthread_mutex_lock(&m->mu); /* not under agent.mu: no order to keep */
	memcpy(s->h, m->h, sizeof(s->h));
	s->restores_ok = m->restores_ok;
	s->parts_missing = m->parts_missing;
	s->restores_failed = m->restores_failed;
	s->restores_absent = m->restores_absent;
	s->restores_damaged = m->restores_damaged;
	s->passed_over = m->passed_over;
	s->restored_bytes = m->restored_bytes;
	s->restore_read = m->restore_read;
	s->njobs = 0;
	s->jobs = m->njobs ? malloc(m->njobs * sizeof(*s->jobs)) : NULL;
	if (s->jobs) { /* no memory: this scrape goes without the per-job series */
		memcpy(s->jobs, m->jobs, m->njobs * sizeof(*s->jobs));
		s->njobs = m->njobs;
	}
	pthread_mutex_unlock(&m->mu);
	for (size_t i = 0; i < s->njobs; i++)
		for (size_t k = 0; k < s->nplan_jobs; k++)
			s->jobs[i].plans += strcmp(s->jobs[i].job, s->plan_jobs[k]) == 0;
	free(s->plan_jobs);
	s->plan_jobs = NULL;
	ioeng_get_stats(a->io, &s->io);
	if (a->store->ops->stats) { /* an object store: its own transfers, not the engine's */
		struct storage_stats ss;

		a->store->ops->stats(a->store, &ss);
		s->io.bytes_written = ss.bytes_written;
		s->io.bytes_read = ss.bytes_read;
		s->io.errors = ss.errors;
		s->io.retries = ss.retries;
	}
	pool_get_stats(a->pool, &s->pool);
}

static void put_hist(FILE *f, const char *name, const char *help, const struct hist *h)
{
	uint64_t cum = 0;

	fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	for (size_t i = 0; i < NBOUNDS; i++) {
		cum += h->n[i];
		fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)cum);
	}
	fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)h->count);
	fprintf(f, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name,
	        (unsigned long long)h->count);
}

/* One metric without labels. */
static void put(FILE *f, const char *name, const char *type, const char *help, double v)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* The final states counted, as their label says them. */
static const struct {
	int state;
	const char *label;
} final_states[] = {{SAVE_COMMITTED, "committed"},
                    {SAVE_UPLOADED, "uploaded"},
                    {SAVE_FAILED, "failed"},
                    {SAVE_SKIPPED, "skipped"}};

#define NFINALS (sizeof(final_states) / sizeof(final_states[0]))

static void put_saves(FILE *f, const struct snapshot *s)
{
	fprintf(f, "# HELP ckptd_saves_total Saves (one rank of one step) by final state.\n"
	           "# TYPE ckptd_saves_total counter\n");
	for (size_t i = 0; i < NFINALS; i++)
		fprintf(f, "ckptd_saves_total{state=\"%s\"} %llu\n", final_states[i].label,
		        (unsigned long long)s->finals[final_states[i].state]);
	fprintf(f,
	        "# HELP ckptd_restores_total Restores run, by result: ok; absent (no such "
	        "checkpoint); damaged (a committed checkpoint that cannot be read whole); failed "
	        "(anything else). Requests refused at once (a bad plan) are not counted.\n"
	        "# TYPE ckptd_restores_total counter\n"
	        "ckptd_restores_total{result=\"ok\"} %llu\n"
	        "ckptd_restores_total{result=\"absent\"} %llu\n"
	        "ckptd_restores_total{result=\"damaged\"} %llu\n"
	        "ckptd_restores_total{result=\"failed\"} %llu\n",
	        (unsigned long long)s->restores_ok, (unsigned long long)s->restores_absent,
	        (unsigned long long)s->restores_damaged, (unsigned long long)s->restores_failed);
	fprintf(f,
	        "# HELP ckptd_restore_passed_over_total Damaged newer steps a restore of LATEST "
	        "passed over for an older one.\n"
	        "# TYPE ckptd_restore_passed_over_total counter\n"
	        "ckptd_restore_passed_over_total %llu\n"
	        "# HELP ckptd_checkpoints_damaged Committed checkpoints listed here and known not "
	        "to restore whole (ckptctl list says why).\n"
	        "# TYPE ckptd_checkpoints_damaged gauge\n"
	        "ckptd_checkpoints_damaged %zu\n",
	        (unsigned long long)s->passed_over, s->damaged);
}

static void put_jobs(FILE *f, const struct snapshot *s)
{
	/* job names are [A-Za-z0-9._-]: nothing to escape in a label */
	fprintf(f, "# HELP ckptd_job_saves_total A job's saves (one rank of one step) by final "
	           "state.\n# TYPE ckptd_job_saves_total counter\n");
	for (size_t i = 0; i < s->njobs; i++)
		for (size_t k = 0; k < NFINALS; k++)
			fprintf(f, "ckptd_job_saves_total{job=\"%s\",state=\"%s\"} %llu\n",
			        s->jobs[i].job, final_states[k].label,
			        (unsigned long long)s->jobs[i].finals[final_states[k].state]);
	fprintf(f, "# HELP ckptd_job_plans A job's live plans on this node (trainers that may "
	           "save): 0 once they are gone.\n# TYPE ckptd_job_plans gauge\n");
	for (size_t i = 0; i < s->njobs; i++)
		fprintf(f, "ckptd_job_plans{job=\"%s\"} %u\n", s->jobs[i].job, s->jobs[i].plans);
	fprintf(f, "# HELP ckptd_job_committed_bytes_total Bytes of a job's saves that were "
	           "committed.\n# TYPE ckptd_job_committed_bytes_total counter\n");
	for (size_t i = 0; i < s->njobs; i++)
		fprintf(f, "ckptd_job_committed_bytes_total{job=\"%s\"} %llu\n", s->jobs[i].job,
		        (unsigned long long)s->jobs[i].committed_bytes);
	fprintf(f, "# HELP ckptd_job_last_commit_timestamp_seconds When a save of the job last "
	           "reached COMMITTED on this node, in Unix seconds (absent: none since the "
	           "agent started).\n# TYPE ckptd_job_last_commit_timestamp_seconds gauge\n");
	for (size_t i = 0; i < s->njobs; i++)
		if (s->jobs[i].last_commit_unix > 0)
			fprintf(f, "ckptd_job_last_commit_timestamp_seconds{job=\"%s\"} %.3f\n",
			        s->jobs[i].job, s->jobs[i].last_commit_unix);
	fprintf(f, "# HELP ckptd_job_last_commit_step The newest step of the job committed on "
	           "this node since the agent started.\n"
	           "# TYPE ckptd_job_last_commit_step gauge\n");
	for (size_t i = 0; i < s->njobs; i++)
		if (s->jobs[i].last_commit_unix > 0)
			fprintf(f, "ckptd_job_last_commit_step{job=\"%s\"} %lld\n", s->jobs[i].job,
			        (long long)s->jobs[i].last_commit_step);
}

/* The root's filesystem: free and total bytes (a directory root only). */
static void put_root_space(FILE *f, const char *root)
{
	struct statvfs vs;

	if (!root || strncmp(root, "s3://", 5) == 0 || statvfs(root, &vs) != 0)
		return;
	put(f, "ckptd_root_free_bytes", "gauge",
	    "Bytes free for the agent's user on the root's filesystem.",
	    (double)vs.f_bavail * (double)vs.f_frsize);
	put(f, "ckptd_root_size_bytes", "gauge", "Size of the root's filesystem.",
	    (double)vs.f_blocks * (double)vs.f_frsize);
}

static void put_behind_job(FILE *f, const char *job, unsigned pending, unsigned failed)
{
	fprintf(f,
	        "ckptd_job_uploads_missing{job=\"%s\",state=\"pending\"} %u\n"
	        "ckptd_job_uploads_missing{job=\"%s\",state=\"failed\"} %u\n",
	        job, pending, job, failed);
}

/*
 * A job's committed steps of the root not on the upload tier, pending and
 * given up: for every job saved since start (0 when none), and any other
 * job the resume at start found behind.
 */
static void put_behind(FILE *f, const struct snapshot *s)
{
	fprintf(f, "# HELP ckptd_job_uploads_missing A job's checkpoints committed on the root "
	           "and not on the upload tier: pending (tried and to be tried again) or failed "
	           "(given up; ckptctl list says why).\n"
	           "# TYPE ckptd_job_uploads_missing gauge\n");
	for (size_t i = 0; i < s->njobs; i++) {
		const struct upload_behind *b = NULL;

		for (size_t k = 0; k < s->nbehind && !b; k++)
			if (strcmp(s->behind[k].job, s->jobs[i].job) == 0)
				b = &s->behind[k];
		put_behind_job(f, s->jobs[i].job, b ? b->pending : 0, b ? b->missing : 0);
	}
	for (size_t k = 0; k < s->nbehind; k++) {
		bool known = false;

		for (size_t i = 0; i < s->njobs && !known; i++)
			known = strcmp(s->behind[k].job, s->jobs[i].job) == 0;
		if (!known)
			put_behind_job(f, s->behind[k].job, s->behind[k].pending,
			               s->behind[k].missing);
	}
}

/* The upload tier's series (only with one). */
static void put_uploads(FILE *f, const struct snapshot *s)
{
	put(f, "ckptd_uploads_total", "counter",
	    "Checkpoints this node uploaded and saw committed on the upload tier.",
	    (double)s->up.uploaded);
	put(f, "ckptd_upload_retries_total", "counter",
	    "Uploads that failed and were queued again after a back-off.", (double)s->up.retried);
	put(f, "ckptd_uploads_failed_total", "counter",
	    "Checkpoints this node gave up uploading: the step left the root first, the store "
	    "refused it, or the other nodes' parts did not come by the commit deadline.",
	    (double)s->up.failed);
	put(f, "ckptd_upload_bytes_total", "counter", "Shard bytes sent to the upload tier.",
	    (double)s->up.bytes);
	put(f, "ckptd_uploads_queued", "gauge", "Uploads waiting or under way.", s->up.queued);
	put_behind(f, s);
}

static void render(struct metrics *m, FILE *f)
{
	const struct pool_stats *p;
	struct snapshot s;

	take_snapshot(m, &s);
	p = &s.pool;
	put(f, "ckptd_up", "gauge", "1 while the agent serves.", 1);
	put(f, "ckptd_start_time_seconds", "gauge", "When the agent started, in Unix seconds.",
	    m->start_unix);
	fprintf(f,
	        "# HELP ckptd_info The agent's version and the I/O engine in use.\n"
	        "# TYPE ckptd_info gauge\nckptd_info{version=\"%s\",io_engine=\"%s\"} 1\n",
	        CKPTD_VERSION, ioeng_name(m->a->io));
	for (int i = 0; i < NHIST; i++)
		put_hist(f, hists[i].name, hists[i].help, &s.h[i]);
	put_saves(f, &s);
	put(f, "ckptd_commit_parts_missing_total", "counter",
	    "Parts of other nodes still missing when a step's commit deadline passed.",
	    (double)s.parts_missing);
	put(f, "ckptd_restored_bytes_total", "counter", "Tensor bytes restored into trainers.",
	    (double)s.restored_bytes);
	put(f, "ckptd_restore_read_bytes_total", "counter",
	    "Shard bytes read for restores (ranks of this node restoring one step together "
	    "read each saved chunk once).",
	    (double)s.restore_read);
	put(f, "ckptd_captured_bytes_total", "counter",
	    "Bytes copied from trainers' memory into the staging pool.", (double)s.captured);
	put(f, "ckptd_written_bytes_total", "counter", "Bytes written to shard files.",
	    (double)s.io.bytes_written);
	put(f, "ckptd_read_bytes_total", "counter", "Bytes read from shard files.",
	    (double)s.io.bytes_read);
	put(f, "ckptd_fsyncs_total", "counter",
	    "fsyncs the I/O engine made: shard files and the directories that name them.",
	    (double)s.io.fsyncs);
	put(f, "ckptd_io_errors_total", "counter", "Reads, writes and fsyncs that failed.",
	    (double)s.io.errors);
	put(f, "ckptd_io_retries_total", "counter", "Short or interrupted I/O resubmitted.",
	    (double)s.io.retries);
	put(f, "ckptd_pool_bytes", "gauge", "Size of the staging pool.", (double)p->bytes);
	put(f, "ckptd_pool_used_bytes", "gauge",
	    "Staging pool bytes holding data of saves and restores (copied, not yet written; "
	    "read, not yet copied).",
	    (double)((uint64_t)p->in_use * p->chunk_bytes));
	put(f, "ckptd_pool_streams", "gauge",
	    "Saves and restores streaming through the staging pool, each sure of a window.",
	    p->active);
	put(f, "ckptd_pool_waits_total", "counter",
	    "Reservations that had to wait for room in the pool.", (double)p->waits);
	put(f, "ckptd_saves_in_flight", "gauge", "Saves not yet in a final state.", s.inflight);
	put(f, "ckptd_checkpoints_held", "gauge",
	    "Checkpoints (steps) held in memory: in flight, or failed and not yet let go.",
	    s.ckpts);
	put(f, "ckptd_sessions", "gauge", "Clients attached.", s.sessions);
	put(f, "ckptd_plans", "gauge", "Plans registered.", s.plans);
	put(f, "ckptd_root_available", "gauge",
	    "1 while the storage root is there, the same directory and writable; 0 while saves "
	    "fail for want of it (ckptctl status says why).",
	    s.root_ok);
	put_root_space(f, m->a->cfg.root);
	put(f, "ckptd_retention_removed_total", "counter",
	    "Checkpoints retention removed (after commits and ckptctl gc).", (double)s.gc_removed);
	put_jobs(f, &s);
	if (s.upload_tier)
		put_uploads(f, &s);
	free(s.jobs);
	free(s.behind);
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, char *body, size_t len,
                             const char *type)
{
	struct MHD_Response *r;
	enum MHD_Result ret;

	if (!body)
		return MHD_NO; /* out of memory: drop the connection */
	r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

/* libmicrohttpd's thread: one request. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **req_cls)
{
	struct metrics *m = cls;
	char *body = NULL;
	size_t len = 0;
	FILE *f;

	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
		return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, strdup("GET /metrics\n"), 13,
		             "text/plain");
	if (strcmp(url, "/metrics") != 0)
		return reply(conn, MHD_HTTP_NOT_FOUND, strdup("not found: try /metrics\n"), 24,
		             "text/plain");
	f = open_memstream(&body, &len);
	if (!f)
		return MHD_NO;
	render(m, f);
	if (fclose(f)) {
		free(body);
		return MHD_NO;
	}
	return reply(conn, MHD_HTTP_OK, body, len, "text/plain; version=0.0.4; charset=utf-8");
}

/* ---- start and stop --------------------------------------------------- */

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char line[512];

	vsnprintf(line, sizeof(line), fmt, ap);
	line[strcspn(line, "\n")] = '\0';
	log_msg(LOG_WARNING, "metrics endpoint: %s", line);
}

/* A socket bound to exactly HOST:PORT and listening; the fd, or -errno with err. */
static int listen_on(const char *spec, char *err)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo *res, *ai;
	char host[256], why[160], port_s[8];
	unsigned port;
	int fd = -1, e = EADDRNOTAVAIL, one = 1, g;

	if (config_split_hostport(spec, host, sizeof(host), &port, why, sizeof(why)))
		return ipc_errf(err, -EINVAL, "metrics listen address '%s': %s", spec, why);
	snprintf(port_s, sizeof(port_s), "%u", port);
	g = getaddrinfo(host, port_s, &hints, &res);
	if (g)
		return ipc_errf(err, -EINVAL, "metrics listen address '%s': %s", spec,
		                gai_strerror(g));
	for (ai = res; ai && fd < 0; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0) {
			e = errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (ai->ai_family == AF_INET6) /* [::]:P is IPv6 only: bind only what was named */
			setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 16)) {
			e = errno;
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(res);
	if (fd < 0)
		return ipc_errf(err, -e, "metrics: cannot listen on %s: %s", spec, strerror(e));
	return fd;
}

int metrics_create(struct agent *a, const char *listen, struct metrics **out, char *err)
{
	struct metrics *m;
	struct timespec now;
	int fd;

	m = calloc(1, sizeof(*m));
	if (!m)
		return ipc_errf(err, -ENOMEM, "out of memory");
	m->a = a;
	clock_gettime(CLOCK_REALTIME, &now);
	m->start_unix = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
	pthread_mutex_init(&m->mu, NULL);
	fd = listen_on(listen, err);
	if (fd < 0) {
		metrics_destroy(m);
		return fd;
	}
	m->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
	                        on_request, m, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
	                        MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT, 16u,
	                        MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
	if (!m->d) {
		close(fd);
		metrics_destroy(m);
		return ipc_errf(err, -EIO, "metrics: libmicrohttpd did not start on %s", listen);
	}
	log_msg(LOG_INFO, "metrics: http://%s/metrics", listen);
	*out = m;
	return 0;
}

void metrics_destroy(struct metrics *m)
{
	if (!m)
		return;
	if (m->d)
		MHD_stop_daemon(m->d); /* waits for a request in progress; closes the socket */
	pthread_mutex_destroy(&m->mu);
	free(m->jobs);
	free(m);
}
