/*
 * storage: where checkpoints live, and how bytes get there.
 *
 *   format.h   the bytes: safetensors header, manifest (safetensors.c,
 *              manifest.c)
 *   fsops.h    the syscalls that can fail, in a table tests can replace
 *   ioeng.h    asynchronous I/O: one thread owning an io_uring ring (or,
 *              where io_uring is unavailable, doing pwrite/pread itself)
 *   storage.h  (this file) the backend interface, and the local-filesystem
 *              backend that implements it (local.c, docs/DESIGN.md §6)
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

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/format/format.h"
#include "storage/io/ioeng.h"

/* ---- backends --------------------------------------------------------- */

struct storage;
struct storage_shard;

struct storage_step {
	int64_t step;
	bool committed; /* has a manifest */
	bool pinned; /* committed and pinned (store_set_pinned): retention keeps it */
};

/*
 * What a clean-up may remove (docs/DESIGN.md §6.9): never another node's work in
 * progress. Uncommitted steps older than LATEST and abandon_after go; so do
 * leftovers of interrupted writes and removals that old. At start-up
 * (nothing of this node's in flight) also this node's own: its shard files
 * in a step where it wrote no part, and its temporary files.
 */
struct storage_cleanup {
	int64_t abandon_after_s;
	int64_t now_unix_s; /* this machine's clock: where the storage has none to read */
	bool at_start;
};

struct storage_recovery {
	unsigned partial_removed; /* uncommitted step directories removed */
	unsigned partial_kept; /* uncommitted steps left alone (another node's, or young) */
	unsigned own_removed; /* this node's dead shard files */
	unsigned temp_removed; /* temporary and half-deleted leftovers */
	unsigned latest_fixed; /* LATEST files rewritten */
};

struct storage_stats {
	uint64_t bytes_written, bytes_read;
	uint64_t errors, retries;
};

/* Small objects: plans, parts, manifests, LATEST, pins. */
enum obj_put_mode {
	OBJ_CREATE = 0, /* create-once: -EEXIST if the key exists, nothing changed */
	OBJ_REPLACE = 1, /* atomic replace: readers see the old bytes or the new */
	/*
	 * Or'ed in: the key's directory must be there already (nothing is
	 * made), and still be there once the object is in it: -ESTALE if it
	 * was taken out of sight meanwhile (a manifest must not land in a step
	 * that a clean-up is removing).
	 */
	OBJ_IN_PLACE = 2,
};

/*
 * A backend stores checkpoints under keys that mirror the layout
 * (docs/DESIGN.md §6.1), "<job>/step-<12d>/parts/<node>.json" and so on; a
 * directory on a filesystem, a prefix in an object store. Everything it
 * reads back is hostile input. Calls are synchronous on the caller's thread
 * (any thread, several at once), but shard reads and writes, which go
 * through the I/O engine and complete on its thread.
 */
struct storage_ops {
	const char *name;

	/*
	 * Creates the shard of (job, step, rank) exclusively, never over an
	 * existing file: its name ("rank-...<node>.<attempt>.safetensors",
	 * SHARD_FILE_MAX bytes) goes to `file`. The blocks are reserved.
	 */
	int (*shard_create)(struct storage *s, const char *job, int64_t step, int rank,
	                    uint64_t size, char *file, struct storage_shard **out, char *err);
	/*
	 * The shard `file` of (job, step) by that exact name, a copy of one
	 * another backend holds (the upload tier); what the key held before
	 * is replaced once the copy completes. NULL: the backend makes no
	 * copies.
	 */
	int (*shard_create_as)(struct storage *s, const char *job, int64_t step, const char *file,
	                       uint64_t size, struct storage_shard **out, char *err);
	/* Queues r (buf, len, off set by the caller; aligned) to the shard. */
	void (*shard_write)(struct storage_shard *sh, struct io_req *r);
	/*
	 * After the last write completed: the exact size, then the shard and its
	 * name durable (file, then the directories holding it); r->done.
	 */
	void (*shard_finish)(struct storage_shard *sh, struct io_req *r);
	/*
	 * Read side: opens the shard `file` of (job, step); *size its length.
	 * -ENOENT: not there; -EBADMSG: something else under its name (a link,
	 * a directory: nothing a reader may take for the file).
	 */
	int (*shard_open)(struct storage *s, const char *job, int64_t step, const char *file,
	                  struct storage_shard **out, uint64_t *size, char *err);
	void (*shard_read)(struct storage_shard *sh, struct io_req *r);
	/* Either side; NULL is fine. */
	void (*shard_close)(struct storage_shard *sh);
	/* Whether `file` of (job, step) is there, and its size: -ENOENT if not. */
	int (*shard_stat)(struct storage *s, const char *job, int64_t step, const char *file,
	                  uint64_t *size, char *err);
	/* Removes a shard this node made and nothing names (a failed attempt's). */
	int (*shard_unlink)(struct storage *s, const char *job, int64_t step, const char *file,
	                    char *err);
	/* "<root>/<job>/step-.../<file>", for messages. */
	void (*shard_path)(struct storage *s, const char *job, int64_t step, const char *file,
	                   char *buf, size_t len);
	/*
	 * Why a request of the shard failed, in words (the HTTP status and the
	 * store's error code, say), once one has; NULL: only the errno says.
	 * NULL op: the backend's errors are all in their errno.
	 */
	const char *(*shard_error)(struct storage_shard *sh);

	/* Small objects, by exact key: durable when the call returns. */
	int (*obj_put)(struct storage *s, const char *key, const void *buf, size_t len,
	               enum obj_put_mode mode, char *err);
	/* The object's bytes (malloc'd, NUL after them); -ENOENT, -EFBIG beyond max. */
	int (*obj_get)(struct storage *s, const char *key, size_t max, char **buf, size_t *len,
	               char *err);
	/* Whether the object is there, and its size: -ENOENT if not. */
	int (*obj_stat)(struct storage *s, const char *key, uint64_t *size, char *err);
	/* Removed durably; -ENOENT if it was not there. */
	int (*obj_delete)(struct storage *s, const char *key, char *err);
	/*
	 * Makes an object that is there durable under its key, again: for a
	 * put that failed after the object became visible (the fsync of its
	 * directory). NULL: a backend whose objects are durable once visible.
	 */
	int (*obj_sync)(struct storage *s, const char *key, char *err);
	/*
	 * Names of the objects directly under `dir` ("<job>/plans"), malloc'd
	 * array of malloc'd names, sorted; for discovery only: no decision rests
	 * on a listing.
	 */
	int (*obj_list)(struct storage *s, const char *dir, char ***names, size_t *n, char *err);

	int (*list_jobs)(struct storage *s, char ***jobs, size_t *n, char *err);
	int (*list_steps)(struct storage *s, const char *job, struct storage_step **steps,
	                  size_t *n, char *err);
	/*
	 * An uncommitted step this node gave up: what it holds of the step's own
	 * layout (its directory, parts/) goes if nothing is left in it.
	 */
	int (*step_tidy)(struct storage *s, const char *job, int64_t step, char *err);
	/* Removes a checkpoint, committed or not, out of sight first. */
	int (*remove)(struct storage *s, const char *job, int64_t step, char *err);
	/* Clean-up of one job (latest: its LATEST, -1 if none) under pol's rules. */
	int (*cleanup)(struct storage *s, const char *job, int64_t latest,
	               const struct storage_cleanup *pol, struct storage_recovery *rec, char *err);
	/*
	 * Whether the root is still usable: there, the same directory as the
	 * one opened, writable, and this node's lock on it still held. A root
	 * made anew under its name is opened again and the node's lock taken
	 * in it (*reopened: what was listed before is gone). 0: usable;
	 * -ENOENT, -ESTALE, -ENOTDIR: missing; -EBUSY: another agent holds
	 * this node's lock there; else not writable (-EACCES, -EROFS ...).
	 * NULL: the backend cannot tell (taken as usable).
	 */
	int (*root_check)(struct storage *s, bool *reopened, char *err);
	/* What the backend is and how it is doing, one line for status; NULL: none. */
	void (*describe)(struct storage *s, char *buf, size_t len);
	/* Its own transfer counters; NULL: the I/O engine's are the backend's. */
	void (*stats)(struct storage *s, struct storage_stats *out);
	void (*destroy)(struct storage *s);
};

struct storage {
	const struct storage_ops *ops;
	/*
	 * store.c's: LATEST's read-write-read of this storage, one at a time
	 * (storage_init; a slow upload tier never holds up the root's).
	 */
	pthread_mutex_t latest_mu;
};

/* A backend's constructor sets up its struct storage (ops, and store.c's lock). */
static inline void storage_init(struct storage *s, const struct storage_ops *ops)
{
	s->ops = ops;
	pthread_mutex_init(&s->latest_mu, NULL);
}

struct local_opts {
	const char *root;
	const char *node; /* this node: names its shards and temporary files */
	struct ioeng *io; /* asynchronous shard I/O */
	const struct fsops *ops; /* synchronous calls; NULL: fsops_posix */
	bool direct; /* O_DIRECT for shards (falls back when refused) */
};

/* Opens (creating if needed) the root directory. */
int local_create(const struct local_opts *o, struct storage **out, char *err);
/* Whether shard files are opened with O_DIRECT, and why not. */
bool local_direct(const struct storage *s, const char **why);

struct s3_opts {
	const char *root; /* "s3://BUCKET[/PREFIX]" */
	const char *endpoint; /* "http://host:port", "https://host" */
	const char *region; /* NULL: us-east-1 */
	const char *credentials; /* a file, mode 0600: access_key = ..., secret_key = ... */
	bool virtual_host; /* BUCKET.host/key instead of host/BUCKET/key */
	unsigned connections; /* requests in flight (0: 8) */
	unsigned max_tries; /* of a request the store or the network answers "later" */
	unsigned timeout_s; /* a request that moves no byte this long is tried again */
	unsigned backoff_ms; /* the first retry's delay ceiling, doubled per try */
	const char *node; /* this node: names its shards */
	uint64_t part_bytes; /* the staging chunk: a part of a shard's upload, >= 5 MiB */
	int zstd_level; /* shards written as one zstd frame per part at this level; 0: not */
};

/* Whether root names an object store ("s3://..."). */
static inline bool storage_is_s3(const char *root)
{
	return root && root[0] == 's' && root[1] == '3' && root[2] == ':' && root[3] == '/' &&
	       root[4] == '/';
}

/*
 * The S3 backend (s3.c, docs/DESIGN.md §8): checks the bucket is there and
 * writable with these credentials, and probes whether the store honours
 * If-None-Match on PUT.
 */
int s3_create(const struct s3_opts *o, struct storage **out, char *err);
/* Splits "s3://BUCKET[/PREFIX]", checking both. */
int s3_root_parse(const char *root, char *bucket, size_t blen, char *prefix, size_t plen,
                  char *err);
/*
 * Whether create-once objects are atomic (a filesystem; a store that
 * honours If-None-Match): else only one node may write manifests.
 */
bool s3_create_once(const struct storage *s);

/*
 * Lock files that name their holder (pidlock.c): an exclusive flock on the
 * open file fd, then this process's pid written into it. 0: held until fd
 * is closed; -EBUSY: another process holds it, *holder its pid (0: not
 * known); else flock's error (-ENOLCK, -EOPNOTSUPP: no locks there).
 */
int pidlock_take(int fd, long *holder);

static inline void storage_destroy(struct storage *s)
{
	if (s)
		s->ops->destroy(s);
}

#endif /* CKPT_STORAGE_H */
