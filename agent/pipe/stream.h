/*
 * The data pipeline of saves and restores, between the files that run it:
 *
 *   save.c         admits a save and runs its capture job (the one caller of
 *                  stream_setup and the capture calls below)
 *   stream.c       a save's chunks: COPY -> WRITE || HASH -> RELEASE, then
 *                  the save's FINISH (exact size + fsync) -> DURABLE
 *   capture_gpu.c  COPY for a CUDA plan: the trainer's event, then the copies
 *                  on the plan's lane; the plan's captures one at a time
 *   restore.c      builds the extents of a restore, and answers
 *   restore_group.c the ranks of a node restoring one step read it once
 *   verify.c       builds the extents of a verify, and answers
 *   stream_read.c  the reader: READ -> HASH+COPY -> RELEASE, window by window
 *
 * Included by those files only: it includes the node's headers, never the other way.
 */
#ifndef CKPT_AGENT_STREAM_H
#define CKPT_AGENT_STREAM_H

#include <stdint.h>

#include "agent/node/node.h"
#include "agent/node/plan.h"
#include "agent/node/save.h"
#include "layout/box.h"

/* A save refused a place in the pool under the skip policy: its reason. */
#define SAVE_SKIP_REASON                                                                           \
	"staging pool full (saves of other checkpoints still hold it) and the job's policy is "    \
	"skip"

/* ---- a save's chunks (stream.c) --------------------------------------- */

/*
 * Capture worker: the save's reservation (-EAGAIN under skip, why says so),
 * its checksum state and its shard file. 0 or -errno with why.
 */
int stream_setup(struct save *s, char *why);
/* Capture worker: host memory, every chunk copied, then handed on. -ECANCELED: aborted. */
int stream_capture_host(struct save *s, char *why);
/* Bytes of chunk k (chunks of cb bytes) in the shard. */
uint64_t stream_chunk_fill(const struct save *s, unsigned k, uint64_t cb);
/*
 * Capture worker: chunk c, copied, holds shard bytes [off, off + fill); it
 * goes to its write (I/O thread) and its checksums (hasher), in file order.
 */
void stream_submit(struct save *s, struct pool_chunk *c, uint64_t off, uint64_t fill);
/* Any thread: one of the save's stages (its capture job, a chunk, the fsync) has ended. */
void stream_stage_done(struct save *s);

/* ---- a CUDA plan's capture (capture_gpu.c) ---------------------------- */

/*
 * Capture worker: the trainer's event, stream_setup, then every chunk; the
 * plan's lane and capture lock are the save's meanwhile. *t2: when setup
 * ended. 0, -ECANCELED (aborted) or -errno with why.
 */
int capture_gpu(struct save *s, char *why, int64_t *t2);
/* Under mu: queues s's capture job; a CUDA plan's waits for the plan's earlier ones. */
void capture_queue(struct agent *a, struct save *s);
/* Under mu: a CUDA plan's capture has returned, its fence moved; the plan's next one is queued. */
void capture_next(struct agent *a, struct save *s);

/* ---- the restore/verify reader (stream_read.c) ------------------------ */

#define READ_AHEAD 8u /* windows in flight per reader */
#define READER_MAX_PROBLEMS 100u /* problems kept (and said) per restore or verify */

/* Bytes of one rank's file the reader reads: a tensor's chunk, or a header. */
struct extent {
	int rank;
	uint64_t begin, end; /* bytes of the rank's file */
	char *dst; /* restore: where they go */
	bool device; /* dst is GPU memory: copied on the plan's lane */
	uint64_t xxh3;
	bool nosum; /* a shard header, checked by parsing */
	bool *whole; /* set once every byte of it is in dst (verify's headers) */
	/* restore into another split: the overlap's runs into dst; NULL: the bytes as they are */
	struct box_copy *box;
	bool *good; /* set once all its bytes were read and their checksum matched (verify) */
	const char *tensor;
	/* reader_run: extents of the very same bytes (other ranks'), delivered as these pass */
	struct extent *also;
};

/* One restore or verify: set up with reader_init, then ext[0, n) filled. */
struct reader {
	struct agent *a;
	struct storage *store; /* the root, or the upload tier (reader_init: the root) */
	const char *job;
	int64_t step;
	struct extent *ext; /* sorted by (rank, begin) */
	size_t n, cap; /* cap: room in ext */
	bool collect; /* verify: every problem; restore: stop at the first */
	char **problems;
	size_t nproblems;
	uint64_t nmore; /* problems past READER_MAX_PROBLEMS: counted, not kept */
	int err; /* the first problem's errno */
	/* where the first problem was: a rank's file, one chunk of it (its first byte) or
	 * all of it (UINT64_MAX); -1: none of the files' (the trainer's memory faulted) */
	int bad_rank;
	uint64_t bad_begin;
	uint64_t bytes; /* read and checked */
	uint64_t delivered; /* copied to where extents go (more than bytes where several share) */
	struct extent *dups; /* extents of bytes another extent reads (their `also` chains) */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct pool_resv resv;
	struct workq *q; /* the queue it runs on (its waits for the disk let others run) */
	atomic_bool abort;
	struct gpu_lane *lane; /* a CUDA plan's: copies to GPU memory go there */
	int copy_err; /* the first failed copy to the GPU */
	struct box_copy **boxes; /* the extents' runs (restore_map.c), freed with the reader */
	size_t nboxes;
	/* the file being read */
	struct storage_shard *sh;
	uint64_t size;
	char path[512];
};

/*
 * Sorts r's extents by file and place; the bytes of those that read the
 * very bytes of the one before (what reader_run reads once for all of
 * them), and *all: every extent's bytes.
 */
uint64_t reader_shared(struct reader *r, uint64_t *all);
/* ext sized for n extents (r->n = 0); 0 or -ENOMEM. reader_free in any case. */
int reader_init(struct reader *r, struct agent *a, const char *job, int64_t step, size_t n);
/*
 * The reader's thread (r->q's): checks empty extents, reserves up to `want`
 * chunks, then reads file by file (m names the files). Problems are noted
 * in r (err, problems); the return is 0, or -errno when it could not start
 * (no memory, the reservation aborted).
 */
int reader_run(struct reader *r, const struct manifest *m, unsigned want);
void reader_free(struct reader *r);
/* A problem, named (at most 100 kept); a restore (not collect) stops at the first. */
void reader_problem(struct reader *r, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- read-once: ranks of this node restoring one step (restore_group.c) */

/* What a read with the other ranks came to, for the restore's account and its log. */
struct together {
	uint64_t read; /* bytes read for it: the group's, for its leader (0 otherwise) */
	uint64_t delivered; /* its own bytes, delivered by the group's read (0: not) */
	size_t n; /* ranks read together, itself included (0: it reads alone) */
};

/*
 * Capture worker: r's extents (plan's, step of the root's manifest m) read
 * with the other ranks of this node restoring that step now: true if they
 * are all in place; false to read alone (no other plan of the job here,
 * out of memory, ranks that share less than a quarter of their bytes, or a
 * problem in the group's read). *t says what came of it either way.
 */
bool restore_read_together(struct agent *a, struct plan *plan, struct reader *r, int64_t step,
                           const struct manifest *m, struct together *t);

/* ---- which saved chunks serve a plan's tensors (restore_map.c) --------- */

/* A chunk that failed a restore: its rank's file, its first byte (UINT64_MAX: the whole file). */
struct bad_chunk {
	int rank;
	uint64_t begin;
};

/*
 * r's extents for every tensor of plan p from manifest m, leaving out the
 * chunks bad[0, nbad): a tensor's own saved chunk as it is, else assembled
 * from the saved chunks that overlap its box, looked at from the chunk at
 * `start` (mod their number) on: ranks that start apart spread their reads
 * over a box's copies, ranks that start alike read the same ones. 0,
 * -EINVAL (the plan does not match the checkpoint: the tensor and box
 * named in err) or -ENOMEM.
 */
int restore_map(struct reader *r, const struct plan *p, const struct manifest *m,
                const struct bad_chunk *bad, size_t nbad, unsigned start, char *err);

/* ---- save.c, for the pipeline ----------------------------------------- */

/* Under mu: this save fails, and its checkpoint with it. */
void save_fail(struct agent *a, struct save *s, const char *reason);
/* Under mu: a CUDA plan's save gives back its number on the fence, once. */
void save_fence_release(struct save *s);

#endif /* CKPT_AGENT_STREAM_H */
