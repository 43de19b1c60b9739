/*
 * storage/format.h: what ckptd writes and reads back, as bytes: the shard's
 * safetensors header (safetensors.c) and the checkpoint's manifest.json
 * (manifest.c). Pure functions, any thread; what is parsed is hostile input.
 *
 * Errors: negative errno, and a sentence in `err` (IPC_ERRLEN bytes).
 */
#ifndef CKPT_STORAGE_FORMAT_H
#define CKPT_STORAGE_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ipc.h"

/* ---- safetensors ------------------------------------------------------ */

/* The largest header the safetensors library accepts. */
#define ST_MAX_HEADER 100000000u

struct st_tensor {
	const char *name;
	int dtype;
	size_t ndim;
	const int64_t *shape;
	uint64_t begin, end; /* relative to the start of the data */
};

struct st_meta {
	const char *key;
	const char *value;
};

/*
 * Builds the bytes that open a shard: the 8-byte little-endian header length,
 * then the JSON header (with __metadata__ when nmeta > 0), padded with spaces
 * so that the data starts at a multiple of 8. *out is malloc'd; *len is where
 * the data starts. Tensors must be contiguous from 0 in the order given.
 */
int st_header_build(const struct st_tensor *t, size_t n, const struct st_meta *meta, size_t nmeta,
                    void **out, size_t *len, char *err);

struct st_entry {
	char *name;
	int dtype;
	size_t ndim;
	int64_t shape[IPC_MAX_NDIM];
	uint64_t begin, end; /* relative to data_start */
};

struct st_header {
	uint64_t data_start; /* 8 + header length */
	size_t n;
	struct st_entry *v; /* sorted by begin */
	size_t nmeta;
	char **meta_keys;
	char **meta_values;
};

/*
 * Parses a header the way the safetensors library checks it: length within
 * bounds and the file, a JSON object, known dtypes, shape x dtype = the
 * range, ranges contiguous from 0 to the end of the file. buf holds the
 * first len bytes of a file of file_size bytes; -ENODATA if len is too short
 * for the header (read 8 + the length it announces, and call again).
 */
int st_header_parse(const void *buf, size_t len, uint64_t file_size, struct st_header **out,
                    char *err);
/* Reads and parses the header of an open file. */
int st_header_read(int fd, uint64_t file_size, struct st_header **out, char *err);
void st_header_free(struct st_header *h);
const struct st_entry *st_header_find(const struct st_header *h, const char *name);

/* ---- manifest --------------------------------------------------------- */

#define MANIFEST_FORMAT "ckptd-manifest"
#define MANIFEST_VERSION 1
#define MANIFEST_MAX_BYTES (256u << 20)

struct manifest_chunk {
	int rank;
	int64_t global_offset[IPC_MAX_NDIM]; /* zeros unless sharded */
	int64_t shape[IPC_MAX_NDIM]; /* this rank's local shape */
	uint64_t begin, end; /* byte range in the rank's file */
	uint64_t xxh3; /* XXH3-64 of those bytes */
};

struct manifest_tensor {
	char *name;
	int dtype;
	size_t ndim;
	int64_t global_shape[IPC_MAX_NDIM];
	bool sharded;
	size_t nchunks;
	struct manifest_chunk *chunks;
};

struct manifest_rank {
	int rank;
	char *file; /* "rank-00000.safetensors" */
	uint64_t size;
	uint64_t header_bytes;
};

struct manifest {
	int version;
	char *job;
	int64_t step;
	int world;
	int64_t time_unix_ns;
	char *meta_json; /* the user's JSON value as text; NULL if none */
	size_t nranks; /* == world, sorted by rank */
	struct manifest_rank *ranks;
	size_t ntensors; /* sorted by name */
	struct manifest_tensor *tensors;
	uint64_t bytes; /* sum of the shards' sizes */
	double capture_seconds, durable_seconds, commit_seconds;
};

/* Structural checks of a manifest built in memory or parsed. */
int manifest_check(const struct manifest *m, char *err);
int manifest_to_json(const struct manifest *m, char **out, size_t *len, char *err);
/* Parses and checks (manifest_check) bytes read back from disk. */
int manifest_from_json(const char *buf, size_t len, struct manifest **out, char *err);
void manifest_free(struct manifest *m);
const struct manifest_tensor *manifest_find(const struct manifest *m, const char *name);
/* The chunk of `t` saved by `rank` (sharded: the one at global_offset). */
const struct manifest_chunk *manifest_find_chunk(const struct manifest_tensor *t, int rank,
                                                 const int64_t *global_offset);
/* "rank-00003.safetensors" into buf (at least 32 bytes). */
void manifest_rank_file(int rank, char *buf, size_t len);

#endif /* CKPT_STORAGE_FORMAT_H */
