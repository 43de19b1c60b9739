/*
 * A node of the agent without its process, for the node objects' unit
 * tests (agent/node/): the struct agent with its lock and lists, a small
 * staging pool, the hub with a recorder of every save state and checkpoint
 * end published, the commit thread's queue (one real worker, as the
 * agent's) and a committer over an in-memory root (fake_store.h). Plans
 * are made as CreatePlan makes them (host memory, no region: nothing is
 * copied), saves as Save admits them (cp_get, save_new, cp_join); the
 * pipeline that copies and writes a shard is played by hand: fn_start,
 * fn_captured, fn_durable (its file put in the fake root, its header
 * stamped as the pipeline stamps it) or fn_broke.
 *
 * Every fn_* call takes agent.mu itself; hold it (fn_lock) around the
 * cp_* calls a test makes directly, as their callers do. A check that
 * fails under it is fine: fn_destroy lets it go first.
 */
#ifndef CKPT_TEST_FAKE_NODE_H
#define CKPT_TEST_FAKE_NODE_H

#include <stdbool.h>
#include <stdint.h>

#include "agent/node/checkpoint.h"
#include "agent/node/node.h"
#include "agent/node/plan.h"
#include "agent/node/save.h"
#include "support/fake_store.h"

#define FN_MAX_EVENTS 256

/* One save state published (hub_save_new's QUEUED, then hub_save's). */
struct fn_save_event {
	uint64_t id; /* the save's */
	int rank;
	int64_t step;
	enum save_state state;
	char reason[IPC_ERRLEN];
};

/* One checkpoint end published (hub_ckpt). */
struct fn_ckpt_event {
	char job[IPC_MAX_JOB + 1];
	int64_t step;
	enum save_state state;
	bool wrote;
};

struct fake_node {
	struct agent a; /* first: the hub's subscribers find the recorder from it */
	struct fake_store *fs;
	/* what the hub published, under a.mu */
	struct fn_save_event saves[FN_MAX_EVENTS];
	unsigned nsaves;
	struct fn_ckpt_event ckpts[FN_MAX_EVENTS];
	unsigned nckpts;
	bool held; /* the test's thread holds a.mu (fn_lock) */
};

/* A node named `name` whose steps have deadline_s (--commit-deadline). */
struct fake_node *fn_create(const char *name, unsigned deadline_s);
/* Waits for the commit thread, then frees every object and the node. */
void fn_destroy(struct fake_node *n);
void fn_lock(struct fake_node *n);
void fn_unlock(struct fake_node *n);

/*
 * Rank `rank` of (job, run, world) here: one tensor of its own, "r<rank>.w",
 * 16 bytes of F32, laid out as CreatePlan lays it out, listed live.
 */
struct plan *fn_plan(struct fake_node *n, const char *job, const char *run, int rank, int world);
/* The plan dropped (its trainer gone): the hub tells the checkpoints. */
void fn_drop(struct fake_node *n, struct plan *p);

/*
 * p's save of step, QUEUED in its checkpoint, as Save admits it: 0, or
 * cp_get's or the admission's refusal (err). A save of a checkpoint that
 * failed is born FAILED.
 */
int fn_save(struct fake_node *n, struct plan *p, int64_t step, struct save **out, char *err);
/* Its pipeline starts (the capture job queued), as Save starts it. */
void fn_start(struct fake_node *n, struct save *s);
/* Its capture ended: CAPTURED (unless aborted meanwhile). */
void fn_captured(struct fake_node *n, struct save *s);
/* Its shard is durable: its file is in the root; the pipeline stops. */
void fn_durable(struct fake_node *n, struct save *s);
/* The same, under mu (the caller holds it). */
void fn_durable_held(struct fake_node *n, struct save *s);
/* Its pipeline failed (a write): why; the pipeline stops. */
void fn_broke(struct fake_node *n, struct save *s, const char *why);
/* Its pipeline stopped without news (an aborted capture). */
void fn_stopped(struct fake_node *n, struct save *s);

/* Waits (up to 10 s) until the commit queue has nothing queued, timed or running. */
bool fn_settle(struct fake_node *n);
/* Under mu: the checkpoint (job, step) held here (the first of them), or NULL. */
struct checkpoint *fn_ckpt(struct fake_node *n, const char *job, int64_t step);

/* The states published for s, in order, as "QUEUED CAPTURED ..." into buf. */
const char *fn_states(struct fake_node *n, const struct save *s, char *buf, size_t len);
/* How many ends of (job, step) in `state` the hub published. */
unsigned fn_ends(struct fake_node *n, const char *job, int64_t step, enum save_state state);

#endif
