/*
 * The data pipeline of saves and restores, between the files that run it:
 *
 *   save.c         admits a save and runs its capture job (the one caller of
 *                  stream_setup and the capture calls below)
 *   stream.c       a save's chunks: COPY -> WRITE || HASH -> RELEASE, then
 *                  the save's FINISH (exact size + fsync) -> DURABLE
 *
 * Included by those files only: it includes agent.h, never the other way.
 */
#ifndef CKPT_AGENT_STREAM_H
#define CKPT_AGENT_STREAM_H

#include <stdint.h>

#include "agent.h"

/* A save refused a place in the pool under the skip policy: its reason. */
#define SAVE_SKIP_REASON                                                                        \
	"staging pool full (saves of other checkpoints still hold it) and the job's policy is skip"

/* ---- a save's chunks (stream.c) ------------------------------------- */

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

/* ---- save.c, for the pipeline ---------------------------------------- */

/* Under mu: this save fails, and its checkpoint with it. */
void save_fail(struct agent *a, struct save *s, const char *reason);

#endif /* CKPT_AGENT_STREAM_H */
