/*
 * storage/local/local_int.h: private to the local backend (local.c, local_file.c,
 * local_obj.c, local_scan.c, local_root.c); nothing outside storage/
 * includes it. The backend object, the on-disk names, and the helpers of
 * local.c and local_file.c the others use (local_obj.c and local_scan.c
 * never call each other; local_root.c calls only local_file.c's). The public
 * calls (local_create, local_direct) are in storage.h; the layout, callers
 * and threads are described at the top of local.c.
 *
 * Conventions of every helper here: 0 or a descriptor on success, negative
 * errno on failure; those taking `err` fill it in (ipc_errf) with what
 * failed and on which path.
 */
#ifndef CKPT_STORAGE_LOCAL_INT_H
#define CKPT_STORAGE_LOCAL_INT_H

#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "storage/storage.h"

#define LOCAL_ALIGN 4096u
#define LOCAL_MAX_ENTRIES (1u << 20) /* directory entries we agree to look at */
#define LOCAL_MAX_DEPTH 8 /* nesting local_rm_tree descends into */
#define LOCAL_MAX_TRIES 1000 /* -EINTR/-EAGAIN/0-byte answers before we give up */
#define LOCAL_MAX_ATTEMPTS 1000 /* shard names tried before a save gives up */
#define LOCAL_NAME_MAX 128 /* a component of a key */
#define MANIFEST_NAME "manifest.json"
#define PARTS_DIR "parts"
#define PIN_NAME "pinned" /* an empty file in a step directory: the step is pinned */
#define TRASH_PREFIX ".trash."
#define TMP_SUFFIX ".tmp"
#define DIR_FLAGS (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)

struct local {
	struct storage base; /* first: a struct storage * is a struct local * */
	const struct fsops *ops;
	struct ioeng *io;
	int rootfd; /* the root; what it refers to changes only by dup3 (local_root.c) */
	int nodefd; /* the node's lock file, held while this backend lives */
	char *root;
	char *node;
	pthread_mutex_t root_mu; /* local_root_check: one at a time; root_dev, root_ino */
	dev_t root_dev;
	ino_t root_ino; /* the directory rootfd refers to */
	pthread_mutex_t lock; /* direct, direct_why, trash_seq */
	bool direct;
	const char *direct_why; /* a constant, or refused_why once written */
	char refused_why[IPC_ERRLEN];
	uint64_t trash_seq;
};

static inline struct local *to_local(struct storage *s)
{
	return (struct local *)s;
}

/* ---- local.c: names, paths, directories, small files ------------------ */

/* Closes *fd if open and sets it to -1. */
void local_close_fd(int *fd);
/* "step-" and 12 digits. */
void local_step_name(int64_t step, char *buf, size_t len);
/* "step-" and exactly 12 digits, nothing else. */
bool local_parse_step_name(const char *name, int64_t *step);
/* "<root>/<job>[/step-...][/leaf]" for messages (step < 0, leaf NULL: left out). */
const char *local_path_of(const struct local *l, char *buf, size_t len, const char *job,
                          int64_t step, const char *leaf);
/* A directory under dirfd, never through a symlink. */
int local_open_dir(struct local *l, int dirfd, const char *name);
/*
 * Makes (if needed) and opens directory `name` under dirfd; durable: a new
 * entry is made durable at once by fsyncing dirfd. `path` is for messages.
 */
int local_make_dir(struct local *l, int dirfd, const char *name, const char *path, bool durable,
                   char *err);
/* The job's (step's) directory; a message saying which is missing if not there. */
int local_open_job(struct local *l, const char *job, char *err);
/* Checks job and step and opens both directories; on failure neither stays open. */
int local_open_job_step(struct local *l, const char *job, int64_t step, int *jobfd, int *stepfd,
                        char *err);
/* A regular file, never a link, never blocking on a FIFO; *st filled in. */
int local_open_regular(struct local *l, int dirfd, const char *name, int flags, mode_t mode,
                       struct stat *st);
/* Reads a whole small file; -EFBIG beyond max bytes. *out is malloc'd + NUL. */
int local_read_small(struct local *l, int dirfd, const char *name, size_t max, char **out,
                     size_t *len);
/* Every name in a directory but . and .. (malloc'd array of malloc'd names). */
int local_list_dir(struct local *l, int dirfd, char ***out, size_t *n);
void local_free_names(char **v, size_t n);
/* Whether `name` under fd is a regular file (a directory); links are neither. */
bool local_regular_at(int fd, const char *name);
bool local_dir_at(int fd, const char *name);
/*
 * rename that never replaces: renameat2 where the filesystem knows it (NFS
 * says EINVAL to any flag); else a look first, and a plain rename (a
 * window: for what only this node renames, or writes the same bytes).
 */
int local_rename_noreplace(struct local *l, int dirfd, const char *from, const char *to);
/* Regular, or unsure (fstatat failed but not with ENOENT): for what must be kept if there. */
bool local_maybe_regular_at(int fd, const char *name);
/*
 * A temporary name for `leaf` in a shared directory, unique across nodes:
 * ".<node>~<random>~<leaf>.tmp". Whether `name` is one, and whether this
 * node's (own).
 */
void local_tmp_name(const struct local *l, const char *leaf, char *buf, size_t len);
bool local_is_tmp(const struct local *l, const char *name, bool *own);

/* ---- local_root.c: the root and the node's lock ----------------------- */

/* At start: makes the root if missing, opens it, takes the node's lock in it. */
int local_root_open(struct local *l, const char *root, char *err);
/* storage_ops.root_check. */
int local_root_check(struct storage *s, bool *reopened, char *err);

/* ---- local_obj.c: small objects by key -------------------------------- */

int local_obj_put(struct storage *s, const char *key, const void *buf, size_t len,
                  enum obj_put_mode mode, char *err);
int local_obj_get(struct storage *s, const char *key, size_t max, char **buf, size_t *len,
                  char *err);
int local_obj_stat(struct storage *s, const char *key, uint64_t *size, char *err);
int local_obj_delete(struct storage *s, const char *key, char *err);
int local_obj_sync(struct storage *s, const char *key, char *err);
int local_obj_list(struct storage *s, const char *dir, char ***names, size_t *n, char *err);

/* ---- local_scan.c: walking the tree; listing, removal, clean-up -------- */

int local_list_jobs(struct storage *s, char ***jobs, size_t *n, char *err);
int local_list_steps(struct storage *s, const char *job, struct storage_step **steps, size_t *n,
                     char *err);
int local_remove(struct storage *s, const char *job, int64_t step, char *err);
int local_step_tidy(struct storage *s, const char *job, int64_t step, char *err);
int local_cleanup(struct storage *s, const char *job, int64_t latest,
                  const struct storage_cleanup *pol, struct storage_recovery *rec, char *err);

#endif /* CKPT_STORAGE_LOCAL_INT_H */
