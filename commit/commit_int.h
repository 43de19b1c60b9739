/*
 * commit_int.h: what the files of the commit share, private to commit/
 * (commit.h is the interface). commit.c runs a step's state machine;
 * read_parts.c reads and judges the other nodes' parts (and plans);
 * write_manifest.c finds, merges and writes the manifest and moves LATEST;
 * by_hand.c commits a step from what the root holds (commit_finish).
 *
 * Threads: as commit.h (one thread per committer), but for the reads of a
 * poll (read_parts.c), which run on COMMIT_READ_WIDTH threads at once.
 */
#ifndef CKPT_COMMIT_INT_H
#define CKPT_COMMIT_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "commit/commit.h"
#include "commit/roster.h"

struct committer {
	struct commit_opts o;
	char node[IPC_MAX_JOB + 1];
	struct roster_cache rosters; /* complete ones, per (job, run) */
	struct assigned **assigned; /* at most one per job (committer_assigned) */
	size_t nassigned;
};

struct commit {
	struct committer *cm;
	struct part *own;
	int64_t step;
	bool first;
	bool part_tried, part_done; /* this node's part: written (or tried), and known durable */
	int64_t t0, takeover_at, deadline;
	int64_t backoff;
	unsigned polls;
	struct roster *roster; /* complete: cached in cm; else ours to free */
	bool whole; /* a roster was wrong: the step's next one from the plans files whole */
	/*
	 * [roster->nnodes]: those read (where this node commits). Of several
	 * nodes, each part's tensors go once names counted and checked them
	 * (part_strip): the commit holds the parts' ranks, not their chunks.
	 */
	struct part **parts;
	struct names *names; /* the tensors of the parts read, counted */
	bool holds; /* a part read says what its ranks hold: the commit reads them whole */
	bool reading; /* this node commits (or took over): it reads the others' parts */
	char merge[IPC_ERRLEN]; /* the parts read cannot make one checkpoint: why */
	bool *seen; /* [roster->nnodes]: there (a stat is enough) */
	uint64_t *bad; /* [roster->nnodes]: the size of a part that did not parse; 0 */
	char problem[IPC_ERRLEN]; /* the last thing wrong with a part or plans file */
	bool unsynced; /* this node's put of the manifest failed after it was visible */
};

/* read_parts.c: the others' parts. */

/* What the step looked at under its roster (the others' parts read, seen, bad): gone. */
void forget_parts(struct commit *c);
/*
 * Where this node commits, reads every part not in yet; else looks at none.
 * *in: how many parts are in. -ESTALE: the roster is wrong.
 */
int look_parts(struct commit *c, bool reading, size_t *in);
/* Whether a part's ranks hold what its node's plans file names: 0, or why. */
int plans_file_disagrees(struct storage *s, const struct part *p, bool need, char *why);
/* Whether each of a part's files is what the part says: 0, or why not. */
int part_unbound(struct storage *s, const struct part *p, int64_t step, char *why);

/* write_manifest.c: the manifest and LATEST. */

/* 1: the manifest is there, and r says what it means for this run; 0: not (yet). */
int find_manifest(struct commit *c, struct commit_result *r);
/*
 * Merges parts[0..n), writes the manifest create-once and moves LATEST;
 * true when the put failed after the manifest became visible.
 */
bool write_manifest(struct committer *cm, struct part *const *v, size_t n,
                    const struct names *names, bool holds, int64_t deadline_ns,
                    struct commit_result *r, char *problem);

#endif
