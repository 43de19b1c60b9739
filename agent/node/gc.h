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

#endif /* CKPT_AGENT_NODE_GC_H */
