/*
 * agent/node/hub.h: the agent's events, published where a state changes and
 * heard by whoever subscribed at start, so that the part that changes a
 * state never calls up into those that show it or act on it:
 *
 *   save new   a save was made, QUEUED (save_rpc.c): ckptctl watch (its
 *              client learns it from the reply);
 *   save       a save reached a state (save.c): the log, the metrics, the
 *              client's session stream, ckptctl watch;
 *   save note  a save says more without a new state (its upload given
 *              up): the session stream and watch;
 *   ckpt       a checkpoint ended on this node (checkpoint.c: committed;
 *              upload.c: uploaded to the tier, or given up): the upload
 *              tier and retention hear a commit, the saves an upload;
 *   plan       a plan was made or dropped (plan.c): its job's plans file
 *              is written again; the checkpoints in flight that wait for a
 *              dropped plan's rank fail;
 *   root back  the storage root is usable again, or new, and the catalog
 *              follows it (root.c): every live plan's plans file is
 *              written again (a root made anew lacks them);
 *   commit end a checkpoint's commit ended here, before its trainers are
 *              told (checkpoint_commit.c): the metrics;
 *   restore end a restore ended, before its trainer is told (restore.c):
 *              the metrics.
 *
 * Subscribers are told in the order they subscribed (agent.c wires them,
 * once, before any other thread runs). A publisher calls hub_* under
 * agent.mu, and each subscriber runs under it, on the publisher's thread:
 * it does what it does without waiting (changes state, queues work, wakes
 * a stream).
 */
#ifndef CKPT_AGENT_HUB_H
#define CKPT_AGENT_HUB_H

#include <stdbool.h>
#include <stdint.h>

#include "ipc/base/base.h"

struct agent;
struct plan;
struct save;

#define HUB_MAX 8 /* subscribers of one event */

/* A checkpoint that ended on this node. */
struct hub_ckpt {
	const char *job, *run; /* run: NULL where not known (an upload's) */
	int64_t step;
	enum save_state state; /* COMMITTED or UPLOADED (why: not uploaded) */
	bool wrote; /* COMMITTED: this node put the manifest */
	const char *why; /* UPLOADED: NULL, or why the step will not be uploaded */
};

/* A commit that ended on this node (the metrics). */
struct hub_commit {
	int64_t
	    latency_ns; /* this node put the manifest: last part durable to it durable; else -1 */
	unsigned parts_missing; /* other nodes' parts missing at the deadline */
};

/* A restore that ended (the metrics). */
struct hub_restore {
	int rc; /* 0, or its error */
	uint64_t bytes; /* restored (rc 0) */
	uint64_t read; /* read for it (a group's, for one of its ranks) */
	int64_t start_ns; /* monotonic, at the request */
	unsigned passed_over; /* damaged newer steps passed over */
};

typedef void (*hub_save_fn)(struct agent *a, struct save *s, enum save_state state);
typedef void (*hub_ckpt_fn)(struct agent *a, const struct hub_ckpt *c);
typedef void (*hub_plan_fn)(struct agent *a, struct plan *p, bool dropped);
typedef void (*hub_root_fn)(struct agent *a);
typedef void (*hub_commit_fn)(struct agent *a, const struct hub_commit *c);
typedef void (*hub_restore_fn)(struct agent *a, const struct hub_restore *r);

struct hub {
	hub_save_fn made[HUB_MAX], save[HUB_MAX], note[HUB_MAX];
	hub_ckpt_fn ckpt[HUB_MAX];
	hub_plan_fn plan[HUB_MAX];
	hub_root_fn root[HUB_MAX];
	hub_commit_fn commit[HUB_MAX];
	hub_restore_fn restore[HUB_MAX];
	unsigned nmade, nsave, nnote, nckpt, nplan, nroot, ncommit, nrestore;
};

/* At start, before any other thread: fn hears the event from then on. */
void hub_on_save_new(struct hub *h, hub_save_fn fn);
void hub_on_save(struct hub *h, hub_save_fn fn);
void hub_on_save_note(struct hub *h, hub_save_fn fn);
void hub_on_ckpt(struct hub *h, hub_ckpt_fn fn);
void hub_on_plan(struct hub *h, hub_plan_fn fn);
void hub_on_root_back(struct hub *h, hub_root_fn fn);
void hub_on_commit_end(struct hub *h, hub_commit_fn fn);
void hub_on_restore_end(struct hub *h, hub_restore_fn fn);

/* Under agent.mu: every subscriber of the event told, in order. */
void hub_save_new(const struct hub *h, struct agent *a, struct save *s, enum save_state state);
void hub_save(const struct hub *h, struct agent *a, struct save *s, enum save_state state);
void hub_save_note(const struct hub *h, struct agent *a, struct save *s, enum save_state state);
void hub_ckpt(const struct hub *h, struct agent *a, const struct hub_ckpt *c);
void hub_plan(const struct hub *h, struct agent *a, struct plan *p, bool dropped);
void hub_root_back(const struct hub *h, struct agent *a);
void hub_commit_end(const struct hub *h, struct agent *a, const struct hub_commit *c);
void hub_restore_end(const struct hub *h, struct agent *a, const struct hub_restore *r);

#endif /* CKPT_AGENT_HUB_H */
