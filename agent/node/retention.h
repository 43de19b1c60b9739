/*
 * retention.h: which committed checkpoints of one job the retention policy
 * keeps. A pure decision: no lock, no disk, no agent. gc.c gathers the facts
 * under agent.mu and acts on the answer; tests/unit/agent/test_retention_policy.c checks
 * the decision on its own.
 */
#ifndef CKPT_AGENT_RETENTION_H
#define CKPT_AGENT_RETENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ret_policy {
	unsigned keep_last; /* the newest K committed steps; 0: retention off, keep all */
	int64_t keep_every; /* and every step that is a multiple of M; 0: none */
};

/* Why a step stays, in the order they are checked (the first that holds is given). */
enum ret_why {
	RET_REMOVE = 0, /* nothing keeps it */
	RET_OFF, /* retention is off (keep_last 0) */
	RET_LATEST, /* the newest committed step: what LATEST names */
	RET_PINNED, /* ckptctl pin */
	RET_BUSY, /* being restored or verified */
	RET_LAST, /* among the last keep_last */
	RET_RECENT, /* among the keep_last committed most recently (a run went back) */
	RET_EVERY, /* a multiple of keep_every */
	RET_DAMAGED, /* damaged and newer than any whole step: the operator's to look at */
};

struct ret_step {
	int64_t step; /* in */
	bool latest; /* in: LATEST names it */
	bool pinned; /* in */
	bool busy; /* in: readers */
	int64_t time_ns; /* in: when it was committed (its manifest's time) */
	bool damaged; /* in: known not to restore whole */
	enum ret_why why; /* out */
};

/*
 * Decides for v[0..n): one job's committed steps, ascending and unique.
 * Sets each why; returns how many are RET_REMOVE. The newest step that is
 * not damaged is kept as LATEST even when no entry says latest: what
 * LATEST names never goes. Damaged steps count for neither LATEST nor the
 * last K (K restorable steps are kept); one newer than every whole step is
 * kept all the same, for the operator to look at.
 */
size_t retention_decide(const struct ret_policy *p, struct ret_step *v, size_t n);

/* "LATEST", "pinned", "last 3", "multiple of 100", ... into buf. */
const char *retention_why(enum ret_why w, const struct ret_policy *p, char *buf, size_t len);

#endif /* CKPT_AGENT_RETENTION_H */
