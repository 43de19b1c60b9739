/*
 * commit/roster.h: who holds which rank of one run of a job, as the commit
 * of many nodes (commit.c) needs it: read once a run from the shared root
 * (roster.c), cached once complete. Internal to commit/. Everything runs on
 * the commit thread but roster_put, which any thread may call.
 */
#ifndef CKPT_COMMIT_ROSTER_H
#define CKPT_COMMIT_ROSTER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/store.h"

struct rnode {
	char *name;
	int *ranks; /* ascending */
	size_t nranks;
	uint64_t
	    *sigs; /* [nranks]: each rank's tensors in its plans (tensors_signature); NULL: ours */
};

/*
 * Who holds which rank of one run of a job. Shared by the steps of the run
 * and the committer's cache, each holding a reference; the last one frees
 * it (commit_destroy may run on another thread than the commit's).
 */
struct roster {
	struct roster *next; /* the cache's list, on the commit thread */
	atomic_int refs;
	char job[IPC_MAX_JOB + 1], run[IPC_MAX_JOB + 1];
	int world;
	size_t nnodes;
	struct rnode *nodes; /* nodes[0] is this node */
	/*
	 * The tensors the other nodes' plans name, counted and checked as a
	 * merge would (names_add): where a node's summary says its ranks hold
	 * what its plans say, its part needs no reading. Counted only where
	 * this node commits (named: roster_name reads the plans files whole;
	 * every other node reads their summaries alone). NULL once named: the
	 * plans do not agree (each part is read whole, and says where).
	 */
	struct names *names;
	bool named;
	bool whole; /* built from the plans files whole, not their summaries */
	/*
	 * Of rank 0's node: every node's plans as read, where they could not be
	 * written as the run's roster file yet (written at the next use).
	 */
	struct roster_file pending;
};

/* The rosters a committer has read: complete ones, per (job, run). */
struct roster_cache {
	struct storage *store;
	const char *node; /* this node's name */
	struct roster *list;
};

/*
 * The roster of (job, run, world) where this node holds `local` (ascending):
 * cached when complete; else read, from the run's roster file where this
 * node does not hold rank 0 (patient: -EAGAIN while it is not there), then
 * from every node's plans summary (whole: every file whole). -EEXIST: two
 * nodes claim one rank. *out holds a reference (roster_put).
 */
int roster_build(struct roster_cache *cache, const char *job, const char *run, int world,
                 const int *local, size_t nlocal, bool whole, bool patient, struct roster **out,
                 char *why);
/*
 * The tensors of the other nodes' plans, counted into r->names from their
 * files whole (named). -ESTALE: a file says otherwise than the roster.
 */
int roster_name(struct roster_cache *cache, struct roster *r, char *why);
bool roster_complete(const struct roster *r);
void roster_put(struct roster *r);
/* r out of the cache (it was wrong); NULL: nothing. */
void roster_uncache(struct roster_cache *cache, struct roster *r);
void roster_cache_clear(struct roster_cache *cache);
/* Ranks no node of the run claims: the first max into out, how many into *n. */
int roster_unclaimed(const struct roster *ro, int *out, size_t max, size_t *n);
/* What each rank of a plans file (or its summary) holds (tensors_signature), malloc'd. */
int plans_sigs(const struct plans_file *f, uint64_t **out);

#endif /* CKPT_COMMIT_ROSTER_H */
