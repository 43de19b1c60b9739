/*
 * agent/node/gc.h: retention and pins (gc.c; the decision in retention.c).
 *
 * Locks: as each call says; GC runs on the maint thread.
 */
#ifndef CKPT_AGENT_NODE_GC_H
#define CKPT_AGENT_NODE_GC_H

#include <stdbool.h>

#include "agent/node/catalog.h"
#include "agent/node/hub.h"
#include "agent/node/retention.h"

/*
 * Removes a checkpoint already out of the catalog (store_remove); one that
 * is still there after all (pinned through another node, a removal that
 * failed before it went) goes back into the catalog. Maint thread.
 */
int gc_remove(struct agent *a, const struct cat_entry *e, char *err);
/*
 * Under mu: this node committed a checkpoint of job; queues its GC (retention,
 * then abandoned uncommitted steps) on the maint thread.
 */
void gc_queue(struct agent *a, const char *job);
/* Under mu: another node committed one: the catalog of job is brought up to date (maint). */
void gc_queue_sync(struct agent *a, const char *job);
/*
 * Under mu (a hub_ckpt_fn): a step committed, retention applied (gc_queue)
 * where this node put its manifest, else the catalog brought up to date
 * (gc_queue_sync): the node that committed applies it, the others look.
 */
void gc_on_ckpt(struct agent *a, const struct hub_ckpt *c);

/* What a GC asked for decided and did (gc_request), for whoever asked. */
struct gc_outcome {
	const char *job;
	const struct ret_policy *pol;
	const struct ret_step *v; /* every committed step, with why it stays */
	size_t n;
	const int64_t *removed; /* the steps removed */
	size_t nremoved;
	char *const *problems; /* the removals that failed, and why */
	size_t nproblems;
	uint64_t bytes; /* removed */
};
/* Maint thread: a GC asked for ended: rc 0 and what it did, or rc < 0 and the whole message (o
 * NULL). */
typedef void (*gc_done_fn)(void *ctx, int rc, const char *why, const struct gc_outcome *o);
/* A pin or unpin asked for ended: 0, or -errno and the whole message. Maint thread. */
typedef void (*pin_done_fn)(void *ctx, int rc, const char *why);
/*
 * Queues a GC of job (retention, then abandoned steps) on the maint thread,
 * then done(ctx, ...): 0, or -ENOMEM (nothing queued, done not called).
 */
int gc_request(struct agent *a, const char *job, gc_done_fn done, void *ctx);
/* Queues (job, step) pinned or unpinned on the maint thread, then done(ctx, ...). */
int pin_request(struct agent *a, const char *job, int64_t step, bool pinned, pin_done_fn done,
                void *ctx);

#endif /* CKPT_AGENT_NODE_GC_H */
