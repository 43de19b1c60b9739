/*
 * A storage backend in memory, for the commit's unit tests: objects by key,
 * shards as (key, size) only, the calls counted and faults injected by key.
 * Several committers (one per "node") may share one: that is the shared
 * root. Every call takes one lock: a commit thread may run beside the test.
 */
#ifndef CKPT_TEST_FAKE_STORE_H
#define CKPT_TEST_FAKE_STORE_H

#include "storage/storage.h"

struct fake_store;

struct fake_store *fake_create(void);
void fake_destroy(struct fake_store *f);
struct storage *fake_storage(struct fake_store *f);

/* A shard of (job, step, file) that is there, of `size` bytes (zeros). */
void fake_add_shard(struct fake_store *f, const char *job, int64_t step, const char *file,
                    uint64_t size);
/* The same, its first len bytes those of head (a safetensors header, say). */
void fake_add_shard_bytes(struct fake_store *f, const char *job, int64_t step, const char *file,
                          const void *head, size_t len, uint64_t size);
/* Puts raw bytes under key (create or replace), bypassing every check. */
void fake_put(struct fake_store *f, const char *key, const void *buf, size_t len);
/* The bytes under key (NUL-terminated, owned by the fake), NULL if none. */
const char *fake_get(struct fake_store *f, const char *key, size_t *len);
void fake_delete(struct fake_store *f, const char *key);
/* The next put of a key containing `needle` fails with err (a create of a key there: EEXIST first).
 */
void fake_fail_put(struct fake_store *f, const char *needle, int err);

/* Counts of calls, by kind. */
struct fake_counts {
	unsigned puts, gets, stats, lists, deletes, shard_stats, shard_reads;
	unsigned part_gets, summary_gets; /* of those gets: parts/<node>.json, parts/<node>.sum */
	unsigned plans_gets, plans_summary_gets; /* and plans/<node>.json, plans/<node>.sum */
	uint64_t shard_read_bytes; /* asked for by the shard reads */
	unsigned shard_unlinks, step_tidies; /* a failed save's file removed, its step tidied */
};
void fake_counts(struct fake_store *f, struct fake_counts *out);

#endif
