/*
 * storage: where checkpoints live, and how bytes get there.
 *
 *   safetensors.c  the shard header: built once per plan, parsed (as hostile
 *                  input) by verify and restore
 *   manifest.c     manifest.json: the checkpoint's table of contents
 *   fsops.c        the syscalls that can fail, in a table tests can replace
 *   ioeng.c        asynchronous I/O: one thread owning an io_uring ring (or,
 *                  where io_uring is unavailable, doing pwrite/pread itself)
 *   local.c        the local-filesystem backend (DESIGN.md §4.3)
 *
 * Threads: the I/O engine runs one thread of its own; requests are handed to
 * it from any thread and their completions run on it. The backend's other
 * calls are synchronous and run on the caller's thread (the agent calls them
 * from its worker threads, never from the gRPC thread).
 *
 * Errors: negative errno, and a sentence in `err` (IPC_ERRLEN bytes).
 */
#ifndef CKPT_STORAGE_H
#define CKPT_STORAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

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

/* ---- syscalls, replaceable by tests ----------------------------------- */

struct io_req;

struct fsops {
	int (*openat)(int dirfd, const char *path, int flags, mode_t mode);
	ssize_t (*pwrite)(int fd, const void *buf, size_t n, off_t off);
	ssize_t (*pread)(int fd, void *buf, size_t n, off_t off);
	int (*fsync)(int fd);
	int (*ftruncate)(int fd, off_t len);
	int (*renameat)(int olddirfd, const char *oldpath, int newdirfd, const char *newpath);
	int (*mkdirat)(int dirfd, const char *path, mode_t mode);
	int (*unlinkat)(int dirfd, const char *path, int flags);
	/*
	 * The result of an asynchronous request before the engine acts on it;
	 * tests return an error or a short count here. NULL: as it came.
	 */
	int64_t (*io_result)(const struct io_req *r, int64_t res);
};

extern const struct fsops fsops_posix;

/* ---- asynchronous I/O ------------------------------------------------- */

enum io_op {
	IO_WRITE,
	IO_READ,
	IO_FSYNC,
};

/*
 * One request. The submitter owns the memory (embed it in a longer-lived
 * object: the engine allocates nothing per request). Short transfers and
 * -EAGAIN are retried by the engine; a read that meets the end of the file
 * finishes with the bytes it got.
 */
struct io_req {
	enum io_op op;
	int fd;
	void *buf;
	uint64_t len;
	uint64_t off;
	int buf_index; /* registered buffer, or -1 */
	void (*prep)(struct io_req *); /* optional: I/O thread, before the first submission */
	void (*done)(struct io_req *); /* I/O thread, once finished */
	void *ctx;
	int64_t res; /* bytes (writes: == len) or negative errno */
	/* engine-private */
	uint64_t xfer;
	unsigned tries;
	struct io_req *next;
};

enum ioeng_kind {
	IOENG_AUTO,
	IOENG_URING,
	IOENG_PWRITE,
};

struct ioeng_opts {
	enum ioeng_kind kind;
	unsigned queue_depth; /* requests in flight, 1..256 */
	const struct fsops *ops;
};

struct ioeng_stats {
	uint64_t bytes_written, bytes_read;
	uint64_t writes, reads, fsyncs;
	uint64_t retries, errors;
	unsigned inflight;
};

struct ioeng;

/*
 * Starts the engine and its thread. AUTO tries io_uring and falls back to
 * pwrite, saying why in ioeng_detail(); URING fails if io_uring does.
 */
int ioeng_create(const struct ioeng_opts *o, struct ioeng **out, char *err);
/*
 * Registers buffers (the staging pool's chunks, buf_index = position). On
 * failure (RLIMIT_MEMLOCK, no io_uring) requests go out unregistered and the
 * detail says why; the call then returns the error for the caller's log.
 */
int ioeng_register_buffers(struct ioeng *e, const struct iovec *iov, unsigned n, char *err);
/* Queues a request; any thread; never blocks. */
void ioeng_submit(struct ioeng *e, struct io_req *r);
const char *ioeng_name(const struct ioeng *e); /* "io_uring" or "pwrite" */
const char *ioeng_detail(const struct ioeng *e); /* what is in use and why */
bool ioeng_registered(const struct ioeng *e);
void ioeng_get_stats(struct ioeng *e, struct ioeng_stats *out);
/* Waits for requests in flight, stops the thread. NULL is fine. */
void ioeng_destroy(struct ioeng *e);

/* ---- backends --------------------------------------------------------- */

struct storage;
struct storage_shard;

struct storage_step {
	int64_t step;
	bool committed; /* has a manifest */
	bool pinned; /* committed and pinned (set_pinned): retention keeps it */
};

struct storage_recovery {
	unsigned partial_removed; /* step directories without a manifest */
	unsigned temp_removed; /* temporary and half-deleted leftovers */
	unsigned latest_fixed; /* LATEST files rewritten */
};

struct storage_ops {
	const char *name;
	/* Write side: creates the step directory as needed and the shard. */
	int (*shard_create)(struct storage *s, const char *job, int64_t step, int rank,
	                    uint64_t size, struct storage_shard **out, char *err);
	/* Queues r (buf, len, off set by the caller; aligned) to the shard. */
	void (*shard_write)(struct storage_shard *sh, struct io_req *r);
	/* After the last write completed: exact size, then durable; r->done. */
	void (*shard_finish)(struct storage_shard *sh, struct io_req *r);
	/* Read side: opens a committed shard; *size its length. */
	int (*shard_open)(struct storage *s, const char *job, int64_t step, int rank,
	                  struct storage_shard **out, uint64_t *size, char *err);
	void (*shard_read)(struct storage_shard *sh, struct io_req *r);
	/* Either side; NULL is fine. */
	void (*shard_close)(struct storage_shard *sh);
	/* "<root>/<job>/step-.../rank-....safetensors", for messages. */
	void (*shard_path)(struct storage *s, const char *job, int64_t step, int rank, char *buf,
	                   size_t len);

	/* Makes the checkpoint visible: manifest, then LATEST if newer. */
	int (*commit)(struct storage *s, const struct manifest *m, char *err);
	int (*read_manifest)(struct storage *s, const char *job, int64_t step,
	                     struct manifest **out, char *err);
	int (*list_jobs)(struct storage *s, char ***jobs, size_t *n, char *err);
	int (*list_steps)(struct storage *s, const char *job, struct storage_step **steps,
	                  size_t *n, char *err);
	/* -ENOENT when the job has no LATEST. */
	int (*get_latest)(struct storage *s, const char *job, int64_t *step, char *err);
	/* step < 0: remove LATEST. */
	int (*set_latest)(struct storage *s, const char *job, int64_t step, char *err);
	/*
	 * Pins (or unpins) a committed checkpoint, durably: list_steps reports
	 * it after a restart. -ENOENT when the step is not committed.
	 */
	int (*set_pinned)(struct storage *s, const char *job, int64_t step, bool pinned, char *err);
	/* Removes a checkpoint, committed or not, out of sight first. */
	int (*remove)(struct storage *s, const char *job, int64_t step, char *err);
	/* Start-up: removes what is not a checkpoint, makes LATEST right. */
	int (*recover)(struct storage *s, struct storage_recovery *r, char *err);
	void (*destroy)(struct storage *s);
};

struct storage {
	const struct storage_ops *ops;
};

struct local_opts {
	const char *root;
	struct ioeng *io; /* asynchronous shard I/O */
	const struct fsops *ops; /* synchronous calls; NULL: fsops_posix */
	bool direct; /* O_DIRECT for shards (falls back when refused) */
};

/* Opens (creating if needed) the root directory. */
int local_create(const struct local_opts *o, struct storage **out, char *err);
/* Whether shard files are opened with O_DIRECT, and why not. */
bool local_direct(const struct storage *s, const char **why);

/* The calls, so callers read as storage_commit(s, ...). */
static inline int storage_commit(struct storage *s, const struct manifest *m, char *err)
{
	return s->ops->commit(s, m, err);
}

static inline void storage_destroy(struct storage *s)
{
	if (s)
		s->ops->destroy(s);
}

#endif /* CKPT_STORAGE_H */
