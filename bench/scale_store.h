/*
 * scale_store: a struct storage around another that counts every call by
 * kind (and the bytes read and written), and may wait a fixed time in each
 * call before it is made: 1 ms per call models a shared filesystem's
 * metadata server, 10 ms an object store's request (scale_bench.c).
 *
 * Threads: any, several at once (a committer may read parts from several
 * threads); the counters are atomic. The waits are on the calling thread
 * (shard requests: the thread that queues them, not the I/O engine's).
 */
#ifndef CKPT_BENCH_SCALE_STORE_H
#define CKPT_BENCH_SCALE_STORE_H

#include <stdint.h>
#include <stdio.h>

#include "storage/storage.h"

enum cs_kind {
	CS_OBJ_GET,
	CS_OBJ_PUT,
	CS_OBJ_STAT,
	CS_OBJ_LIST,
	CS_OBJ_DELETE,
	CS_OBJ_SYNC,
	CS_SHARD_OPEN,
	CS_SHARD_READ,
	CS_SHARD_STAT,
	CS_SHARD_CREATE,
	CS_SHARD_WRITE,
	CS_SHARD_FINISH,
	CS_SHARD_UNLINK,
	CS_LIST, /* list_jobs, list_steps */
	CS_OTHER, /* step_tidy, remove, cleanup, root_check */
	CS_KINDS
};

struct cs_counts {
	uint64_t calls[CS_KINDS];
	uint64_t bytes[CS_KINDS]; /* read (gets: as returned; shard reads: as asked), written */
};

/*
 * Wraps inner (taken: destroyed with the wrapper); latency_us: the wait in
 * each call (0: none). -ENOMEM.
 */
int cs_create(struct storage *inner, int64_t latency_us, struct storage **out, char *err);
/* The counts so far. */
void cs_counts(struct storage *s, struct cs_counts *out);
/* b - a, into out. */
void cs_diff(const struct cs_counts *b, const struct cs_counts *a, struct cs_counts *out);
/* {"obj_get": {"n": 3, "bytes": 1200}, ...}: the kinds that were called; their total calls. */
uint64_t cs_json(const struct cs_counts *c, FILE *f);
/* The storage wrapped (what its counts leave out). */
struct storage *cs_inner(struct storage *s);

#endif /* CKPT_BENCH_SCALE_STORE_H */
