/*
 * agent/node/upload.h: the upload tier ([upload] root = s3://BUCKET/PREFIX, behind
 * a filesystem root; docs/DESIGN.md §8.2). Each checkpoint committed on the root
 * is copied to the object store by the agents of the nodes that wrote it,
 * each its own shards, and committed there with its own parts and manifest:
 * the manifest is written by the node hosting rank 0 once every node's part
 * is on the tier, then the tier's LATEST moves. Its saves then reach
 * UPLOADED. The tier has its own retention ([upload] keep_last,
 * keep_every). An upload that fails is tried again with back-off (the store
 * may be away) while the step is on the root; at start, every committed
 * step of the root that the tier lacks and would keep is queued (shards
 * already whole on the tier are not sent again). A step that will not be
 * uploaded (it left the root, the store refused it, the other nodes' parts
 * never came, the tier's retention would drop it) is said in status, list
 * and the metrics, never only in the log.
 *
 * Threads: one upload thread of its own, with its own buffers (never the
 * staging pool: an upload never holds a chunk a save could use) and a
 * throttle ([upload] max_mbps); upload_queue and upload_resume run under
 * agent.mu on any thread, and only queue.
 */
#ifndef CKPT_AGENT_UPLOAD_H
#define CKPT_AGENT_UPLOAD_H

#include <stdbool.h>
#include <stdint.h>

struct agent;
struct hub_ckpt;
struct storage;
struct uploader;

#define UPLOAD_NOTE_LEN 640

struct upload_stats {
	uint64_t uploaded, failed, retried; /* checkpoints: failed = given up */
	uint64_t bytes; /* shard bytes sent */
	unsigned queued; /* waiting or under way */
	unsigned pending; /* of those, tried and to be tried again */
	unsigned missing; /* given up, and still committed on the root */
	char last_failure[UPLOAD_NOTE_LEN]; /* "job J step S: why", or "" */
};

/* A job's steps committed on the root that are not on the tier (metrics). */
struct upload_behind {
	char job[65];
	unsigned pending, missing; /* as in upload_stats */
};

/* Starts the upload thread over the tier (owned from here on, destroyed with it). */
int upload_create(struct agent *a, struct storage *tier, struct uploader **out, char *err);
/*
 * Ends the upload under way at its next chunk, drops what is queued and
 * stops the thread; the tier stays (a restore may still read it). Again is
 * fine; NULL is fine.
 */
void upload_stop(struct uploader *u);
/* upload_stop, then the tier goes. NULL is fine. */
void upload_destroy(struct uploader *u);
/*
 * Under agent.mu (a hub_ckpt_fn): a step committed on the root is queued,
 * to upload this node's part of it.
 */
void upload_on_ckpt(struct agent *a, const struct hub_ckpt *c);
/*
 * At start, after the catalog is loaded: queues the resume, which queues
 * (on the upload thread, newest first) each committed step of the root that
 * the tier has no manifest of and whose retention would keep it.
 */
void upload_resume(struct uploader *u);
struct storage *upload_tier(struct uploader *u);
/*
 * Under agent.mu: the storage a request names ("" or "root": the root;
 * "upload": the upload tier). -EINVAL for another name, -ENOENT when the
 * agent has no upload tier; *is_tier: it is the upload tier.
 */
int upload_pick_tier(struct agent *a, const char *name, struct storage **out, bool *is_tier,
                     char *err);
/* Under agent.mu; u may be NULL (all zeros). */
void upload_get_stats(struct uploader *u, struct upload_stats *out);
/* What a list row of a committed step says of its upload (upload_rows). */
struct upload_row {
	const char *job;
	int64_t step;
	const char *state; /* "queued", "pending" (tried, to be tried again), "not uploaded" */
	const char *note; /* the sentence; "" for queued */
};

/*
 * Under agent.mu: every step the uploader has something to say of (none:
 * no tier, uploaded, or not known), sorted by (job, step), into *out
 * (malloc'd; its strings valid until agent.mu is let go); how many.
 */
size_t upload_rows(struct uploader *u, struct upload_row **out);
/* The row of (job, step) in v[0..n), or NULL. */
const struct upload_row *upload_row_find(const struct upload_row *v, size_t n, const char *job,
                                         int64_t step);
/*
 * Under agent.mu: the jobs with steps pending or missing (upload_behind),
 * malloc'd into *out; how many (0 and NULL without a tier or memory).
 */
size_t upload_behind(struct uploader *u, struct upload_behind **out);

#endif /* CKPT_AGENT_UPLOAD_H */
