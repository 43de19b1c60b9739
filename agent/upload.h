/*
 * agent/upload.h: the upload tier ([upload] root = s3://BUCKET/PREFIX, behind
 * a filesystem root; docs/DESIGN.md §8.2). Each checkpoint committed on the root
 * is copied to the object store by the agents of the nodes that wrote it,
 * each its own shards, and committed there with its own parts and manifest:
 * the manifest is written by the node hosting rank 0 once every node's part
 * is on the tier, then the tier's LATEST moves. Its saves then reach
 * UPLOADED. The tier has its own retention ([upload] keep_last,
 * keep_every). An upload that fails is tried again with back-off (the store
 * may be away) while the step is on the root; uploads missing at start are
 * resumed (shards already whole on the tier are not sent again).
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
struct storage;
struct uploader;

struct upload_stats {
	uint64_t uploaded, failed, retried; /* checkpoints */
	uint64_t bytes; /* shard bytes sent */
	unsigned queued; /* waiting or under way */
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
/* Under agent.mu: (job, step) was committed on the root: upload this node's part of it. */
void upload_queue(struct uploader *u, const char *job, int64_t step);
/*
 * At start, after the catalog is loaded: each job's committed steps newer
 * than the tier's LATEST (the newest keep_last of them) are queued.
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

#endif /* CKPT_AGENT_UPLOAD_H */
