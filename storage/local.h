/*
 * local.h: private to the local backend (local.c, local_commit.c,
 * local_scan.c); nothing outside storage/ includes it. The backend object,
 * the on-disk names, and the helpers the three files share. The public
 * calls (local_create, local_direct) are in storage.h; the layout, callers
 * and threads are described at the top of local.c.
 *
 * Conventions of every helper here: 0 or a descriptor on success, negative
 * errno on failure; those taking `err` fill it in (ipc_errf) with what
 * failed and on which path.
 */
#ifndef CKPT_STORAGE_LOCAL_H
#define CKPT_STORAGE_LOCAL_H

#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "storage.h"

#define LOCAL_ALIGN 4096u
#define LOCAL_MAX_ENTRIES (1u << 20) /* directory entries we agree to look at */
#define LOCAL_MAX_DEPTH 8 /* nesting local_rm_tree descends into */
#define LOCAL_MAX_TRIES 1000 /* -EINTR/-EAGAIN/0-byte answers before we give up */
#define LATEST_MAX 64 /* bytes of LATEST we read: "999999999999\n" is 13 */
#define MANIFEST_NAME "manifest.json"
#define MANIFEST_TMP ".manifest.json.tmp"
#define LATEST_NAME "LATEST"
#define PIN_NAME "pinned" /* an empty file in a step directory: the step is pinned */
#define LATEST_TMP ".LATEST.tmp"
#define TRASH_PREFIX ".trash."
#define DIR_FLAGS (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)

struct local {
	struct storage base; /* first: a struct storage * is a struct local * */
	const struct fsops *ops;
	struct ioeng *io;
	int rootfd;
	char *root;
	pthread_mutex_t lock; /* direct, direct_why, trash_seq, and LATEST updates */
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
/* "<root>/<job>[/step-...][/leaf]" for messages (step < 0, leaf NULL: left out). */
const char *local_path_of(const struct local *l, char *buf, size_t len, const char *job,
                          int64_t step, const char *leaf);
int local_check_job_step(const char *job, int64_t step, char *err);
/* A directory under dirfd, never through a symlink. */
int local_open_dir(struct local *l, int dirfd, const char *name);
/* The job's (step's) directory; a message saying which is missing if not there. */
int local_open_job(struct local *l, const char *job, char *err);
int local_open_step(struct local *l, int jobfd, const char *job, int64_t step, char *err);
/* Checks job and step and opens both directories; on failure neither stays open. */
int local_open_job_step(struct local *l, const char *job, int64_t step, int *jobfd, int *stepfd,
                        char *err);
/* A regular file, never a link, never blocking on a FIFO; *st filled in. */
int local_open_regular(struct local *l, int dirfd, const char *name, int flags, mode_t mode,
                       struct stat *st);
/* Reads a whole small file; -EFBIG beyond max bytes. *out is malloc'd + NUL. */
int local_read_small(struct local *l, int dirfd, const char *name, size_t max, char **out,
                     size_t *len);

/* ---- local_commit.c: LATEST; the commit, LATEST and removal ops -------- */

/* LATEST as a step: 0, -ENOENT (none), -EINVAL (not a step number), or why not. */
int local_latest_read(struct local *l, int jobfd, int64_t *step);
/*
 * Replaces LATEST durably; *renamed says whether the new value became
 * visible, for a caller that must undo it. Callers hold l->lock.
 */
int local_latest_write(struct local *l, int jobfd, const char *job, int64_t step, bool *renamed,
                       char *err);
/* Removes LATEST, durably (none is fine). Callers hold l->lock. */
int local_latest_remove(struct local *l, int jobfd, const char *job, char *err);

int local_commit(struct storage *s, const struct manifest *m, char *err);
int local_get_latest(struct storage *s, const char *job, int64_t *step, char *err);
int local_set_latest(struct storage *s, const char *job, int64_t step, char *err);
int local_remove(struct storage *s, const char *job, int64_t step, char *err);
int local_set_pinned(struct storage *s, const char *job, int64_t step, bool pinned, char *err);

/* ---- local_scan.c: walking directories; the reading and recovery ops --- */

/* Deletes name under dirfd and what it holds; links removed, never followed. */
int local_rm_tree(struct local *l, int dirfd, const char *name, int depth);
/* Newest committed step other than `except`; -ENOENT when there is none. */
int local_newest_committed(struct local *l, int jobfd, int64_t except, int64_t *step);

int local_read_manifest(struct storage *s, const char *job, int64_t step, struct manifest **out,
                        char *err);
int local_list_jobs(struct storage *s, char ***jobs, size_t *n, char *err);
int local_list_steps(struct storage *s, const char *job, struct storage_step **steps, size_t *n,
                     char *err);
int local_recover(struct storage *s, struct storage_recovery *rec, char *err);

#endif /* CKPT_STORAGE_LOCAL_H */
