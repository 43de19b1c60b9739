/*
 * agent/node/upload_int.h: the uploader's insides, shared by its two files and by
 * nothing else (the rest of the agent uses upload.h):
 *   upload.c        one upload of (job, step), the upload thread, the
 *                   uploader's life;
 *   upload_queue.c  what is to be uploaded and what will not be: the queue,
 *                   the resume at start, the steps given up, and what
 *                   status, list and the metrics say of them.
 *
 * Locks: the fields marked "mu" are under agent.mu; the rest belong to the
 * upload thread (or are set once at creation).
 */
#ifndef CKPT_AGENT_UPLOAD_INT_H
#define CKPT_AGENT_UPLOAD_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "agent/node/node.h"
#include "agent/node/retention.h"
#include "agent/node/upload.h"

#define UP_BUFFERS 4 /* chunks read ahead of the parts in flight */
#define UP_NOTE_LEN UPLOAD_NOTE_LEN
#define RETRY_FIRST_NS (2LL * 1000000000) /* the first back-off */

/* A step to upload (step >= 0), or the resume at start (step -1). */
struct up_job {
	struct work work;
	struct uploader *u;
	struct list link; /* uploader.jobs */
	char job[IPC_MAX_JOB + 1];
	int64_t step;
	int64_t first_ns; /* when it was queued */
	int64_t waiting_ns; /* since when it waits for other nodes (its own part sent); 0: not */
	int64_t backoff_ns;
	unsigned tries;
	unsigned refusals; /* the store's "no" in a row (up_refusals_after) */
	/* mu: what list and status say of it; "" until a try did not end it */
	char note[UP_NOTE_LEN];
};

/*
 * A committed step of the root that this node gave up uploading (until a
 * restart tries again): said in list while the step is in the catalog.
 */
struct up_lost {
	struct list link; /* uploader.lost */
	char job[IPC_MAX_JOB + 1];
	int64_t step;
	char note[UP_NOTE_LEN];
};

/*
 * A job's committed steps of the root that the resume at start left out:
 * the tier's retention would drop them at once. Ascending.
 */
struct up_skip {
	struct list link; /* uploader.skips */
	char job[IPC_MAX_JOB + 1];
	int64_t *steps;
	size_t n;
};

/* A request waited for on the upload thread. */
struct up_io {
	struct io_req r;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool busy;
};

struct uploader {
	struct agent *a;
	struct storage *tier;
	struct workq *q;
	uint64_t chunk; /* bytes read and sent at a time: the tier's part */
	void *buf[UP_BUFFERS];
	struct up_io io[UP_BUFFERS], fin;
	int64_t next_send_ns; /* the pacer: when the next chunk may go */
	int64_t checked_ns; /* the tier's last root check (it retries failed aborts) */
	struct ret_policy pol;
	uint64_t max_bps; /* 0: unlimited */
	atomic_bool quit; /* stopping: a copy under way ends at its next chunk */
	/* mu */
	struct list jobs;
	struct list lost;
	struct list skips;
	char skip_note[UP_NOTE_LEN]; /* what list says of a skipped step */
	bool stopping;
	struct upload_stats st;
};

/* ---- upload.c ---------------------------------------------------------------- */

/* The upload thread: one try of a job (its work.fn). */
void up_run(struct work *w);

/* ---- upload_queue.c ---------------------------------------------------------- */

/* Under mu: queues (job, step) unless it is queued already; what was said of it goes. */
void up_queue(struct uploader *u, const char *job, int64_t step);
/* Under mu: frees a job that is in no queue. */
void up_job_free(struct up_job *j);
/*
 * The upload thread: queues every committed step of the root that the tier
 * lacks and would keep; notes those it would not. 0, or -EAGAIN when the
 * tier could not be listed (try again later).
 */
int up_resume_run(struct uploader *u);
/*
 * Under mu: (job, step) will not be uploaded (why): counted as a failure,
 * said in list while the step is in the catalog.
 */
void up_lost_add(struct uploader *u, const char *job, int64_t step, const char *why);
/* Under mu: (job, step) reached the tier: nothing more to say of it. */
void up_lost_forget(struct uploader *u, const char *job, int64_t step);
/* Under mu: what the job's list row says after a try that did not end it. */
void up_job_note(struct up_job *j, int rc, int64_t delay_ns, const char *why);
/* The store's refusals of a step in a row, after a try that failed with rc. */
unsigned up_refusals_after(unsigned refusals, int rc);
/* Frees what is said of steps given up or skipped (the uploader goes). */
void up_account_free(struct uploader *u);

#endif /* CKPT_AGENT_UPLOAD_INT_H */
