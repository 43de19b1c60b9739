/*
 * local: the local-filesystem backend (DESIGN.md §4.3).
 *
 *   <root>/<job>/step-<12 digits>/rank-<5 digits>.safetensors
 *   <root>/<job>/step-<12 digits>/manifest.json     written last: the commit
 *   <root>/<job>/LATEST                              "<step>\n", newest committed
 *
 * Callers: the agent's workers (create, open, commit, list, remove, recover:
 * synchronous, on their own thread, several at once); shard writes, reads and
 * finish complete on the I/O engine's thread. One mutex orders the
 * read-modify-write of LATEST between concurrent commits and removals.
 *
 * Map of the file:
 *   helpers        names, paths, directories, small files, LATEST
 *   shards         create (directories made durable as they appear), write,
 *                  finish (exact size, fsync), open, read
 *   commit         manifest to a temporary name, fsync, rename, fsync the
 *                  directories; then LATEST the same way; undone on failure
 *   reading        read_manifest, list_jobs, list_steps, get/set_latest
 *   removal        remove (out of sight first), recover (start-up)
 *
 * Everything goes through the root's descriptor, one path component at a
 * time with O_NOFOLLOW, and through the fsops table (tests inject faults).
 * What is read back (names, LATEST, manifests) is treated as hostile: no
 * symlink is followed, no read is unbounded, no FIFO can block an open.
 *
 * Contract details the header leaves open: list_jobs returns a malloc'd
 * array of malloc'd names (free each, then the array) and list_steps a
 * malloc'd array, both NULL when empty; shard_open does not require the
 * step to be committed (restore reads the manifest first); commit refuses
 * (-EEXIST) a step that already has a manifest; recover() must run before
 * any save starts (a save in progress looks like a partial step).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage.h"

#define LOCAL_ALIGN 4096u
#define LOCAL_MAX_ENTRIES (1u << 20) /* directory entries we agree to look at */
#define LOCAL_MAX_DEPTH 8 /* nesting rm_tree descends into */
#define LOCAL_MAX_TRIES 1000 /* -EINTR/-EAGAIN/0-byte answers before we give up */
#define LATEST_MAX 64 /* bytes of LATEST we read: "999999999999\n" is 13 */
#define MANIFEST_NAME "manifest.json"
#define MANIFEST_TMP ".manifest.json.tmp"
#define LATEST_NAME "LATEST"
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

struct storage_shard {
	struct local *l;
	int fd;
	uint64_t size;
};

static const struct storage_ops local_ops;

static struct local *to_local(struct storage *s)
{
	return (struct local *)s;
}

/* ---- helpers ---------------------------------------------------------- */

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

static void step_name(int64_t step, char *buf, size_t len)
{
	snprintf(buf, len, "step-%012" PRId64, step);
}

/* "step-" and exactly 12 digits, nothing else. */
static bool parse_step_name(const char *name, int64_t *step)
{
	int64_t v = 0;

	if (strncmp(name, "step-", 5) != 0 || strlen(name) != 17)
		return false;
	for (int i = 5; i < 17; i++) {
		if (name[i] < '0' || name[i] > '9')
			return false;
		v = v * 10 + (name[i] - '0');
	}
	*step = v;
	return true;
}

/* "<root>/<job>[/step-...][/leaf]" for messages. */
static const char *path_of(const struct local *l, char *buf, size_t len, const char *job,
                           int64_t step, const char *leaf)
{
	char sn[32] = "";

	if (step >= 0)
		step_name(step, sn, sizeof(sn));
	snprintf(buf, len, "%s/%s%s%s%s%s", l->root, job, sn[0] ? "/" : "", sn, leaf ? "/" : "",
	         leaf ? leaf : "");
	return buf;
}

static int check_job_step(const char *job, int64_t step, char *err)
{
	int rc = ipc_check_job(job, err);

	return rc ? rc : ipc_check_step(step, err);
}

/* A directory under dirfd, never through a symlink. */
static int open_dir(struct local *l, int dirfd, const char *name)
{
	return l->ops->openat(dirfd, name, DIR_FLAGS, 0);
}

static int dir_error(int rc, const char *path, char *err)
{
	if (rc == -ENOENT)
		return ipc_errf(err, rc, "%s does not exist", path);
	if (rc == -ELOOP || rc == -ENOTDIR)
		return ipc_errf(
		    err, rc,
		    "%s is not a directory (a symlink or a file?): ckptd does not follow "
		    "links; move it out of the way",
		    path);
	return ipc_errf(err, rc, "cannot open %s: %s", path, strerror(-rc));
}

static int open_job(struct local *l, const char *job, char *err)
{
	char p[PATH_MAX];
	int fd = open_dir(l, l->rootfd, job);

	if (fd == -ENOENT)
		return ipc_errf(err, fd, "no job '%s' under %s", job, l->root);
	return fd < 0 ? dir_error(fd, path_of(l, p, sizeof(p), job, -1, NULL), err) : fd;
}

static int open_step(struct local *l, int jobfd, const char *job, int64_t step, char *err)
{
	char sn[32], p[PATH_MAX];
	int fd;

	step_name(step, sn, sizeof(sn));
	fd = open_dir(l, jobfd, sn);
	if (fd == -ENOENT)
		return ipc_errf(err, fd, "no checkpoint of job '%s' at step %" PRId64 " (%s)", job,
		                step, path_of(l, p, sizeof(p), job, step, NULL));
	return fd < 0 ? dir_error(fd, path_of(l, p, sizeof(p), job, step, NULL), err) : fd;
}

/*
 * Makes (if needed) and opens directory `name` under dirfd. A new entry is
 * made durable at once by fsyncing dirfd: without it a crash could lose the
 * directory, and with it every shard written inside, after the save was
 * told its files were durable.
 */
static int make_dir(struct local *l, int dirfd, const char *name, const char *path, char *err)
{
	int rc = l->ops->mkdirat(dirfd, name, 0755);

	if (rc < 0 && rc != -EEXIST)
		return ipc_errf(err, rc, "cannot create directory %s: %s", path, strerror(-rc));
	if (rc == 0) {
		rc = l->ops->fsync(dirfd);
		if (rc < 0)
			return ipc_errf(
			    err, rc, "fsync of the directory holding %s failed: %s: check the disk",
			    path, strerror(-rc));
	}
	rc = open_dir(l, dirfd, name);
	return rc < 0 ? dir_error(rc, path, err) : rc;
}

/*
 * Opens a regular file: O_NONBLOCK so that a FIFO planted under the name
 * cannot hang us, cleared again once fstat shows a regular file (io_uring
 * would answer -EAGAIN on a non-blocking file instead of waiting).
 */
static int open_regular(struct local *l, int dirfd, const char *name, int flags, mode_t mode,
                        struct stat *st)
{
	int fd = l->ops->openat(dirfd, name, flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, mode);

	if (fd < 0)
		return fd;
	if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode) ||
	    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0) {
		close(fd);
		return -EINVAL;
	}
	return fd;
}

/* Reads a whole small file; -EFBIG beyond max bytes. *out is malloc'd + NUL. */
static int read_small(struct local *l, int dirfd, const char *name, size_t max, char **out,
                      size_t *len)
{
	struct stat st;
	size_t got = 0;
	unsigned tries = 0;
	char *buf;
	int fd = open_regular(l, dirfd, name, O_RDONLY, 0, &st);

	if (fd < 0)
		return fd;
	if ((uint64_t)st.st_size > max) {
		close(fd);
		return -EFBIG;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	while (got < (size_t)st.st_size) {
		ssize_t n = l->ops->pread(fd, buf + got, (size_t)st.st_size - got, (off_t)got);

		if ((n == -EINTR || n == -EAGAIN) && ++tries < LOCAL_MAX_TRIES)
			continue;
		if (n < 0) {
			close(fd);
			free(buf);
			return (int)n;
		}
		if (n == 0)
			break; /* shrank under us: what is there is checked by the parser */
		got += (size_t)n;
	}
	close(fd);
	buf[got] = '\0';
	*out = buf;
	*len = got;
	return 0;
}

static int pwrite_all(struct local *l, int fd, const char *buf, size_t len)
{
	size_t done = 0;
	unsigned tries = 0;

	while (done < len) {
		ssize_t n = l->ops->pwrite(fd, buf + done, len - done, (off_t)done);

		if ((n == -EINTR || n == -EAGAIN) && ++tries < LOCAL_MAX_TRIES)
			continue;
		if (n < 0)
			return (int)n;
		if (n == 0 && ++tries >= LOCAL_MAX_TRIES)
			return -EIO; /* no progress and no reason: give up */
		done += (size_t)n;
	}
	return 0;
}

/*
 * Writes a temporary file and fsyncs it: its bytes must be on disk before
 * any rename can make them visible under the real name, or a crash could
 * leave the real name pointing at an empty or torn file.
 */
static int write_tmp(struct local *l, int dirfd, const char *tmp, const void *buf, size_t len,
                     const char *path, char *err)
{
	struct stat st;
	int fd = open_regular(l, dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644, &st);
	int rc;

	if (fd < 0)
		return ipc_errf(err, fd, "cannot create %s: %s", path, strerror(-fd));
	rc = pwrite_all(l, fd, buf, len);
	if (rc < 0) {
		ipc_errf(err, rc, "writing %s failed: %s%s", path, strerror(-rc),
		         rc == -ENOSPC ? ": the disk is full; free space or delete old checkpoints"
		                       : "");
		goto fail;
	}
	rc = l->ops->fsync(fd);
	if (rc < 0) {
		ipc_errf(err, rc, "fsync of %s failed: %s: check the disk", path, strerror(-rc));
		goto fail;
	}
	close(fd);
	return 0;
fail:
	close(fd);
	l->ops->unlinkat(dirfd, tmp, 0);
	return rc;
}

/* LATEST as a step: 0, -ENOENT (none), -EINVAL (not a step number), or why not. */
static int latest_read(struct local *l, int jobfd, int64_t *step)
{
	char *buf = NULL;
	size_t len, i;
	int64_t v = 0;
	int rc = read_small(l, jobfd, LATEST_NAME, LATEST_MAX, &buf, &len);

	if (rc == -EFBIG)
		return -EINVAL;
	if (rc < 0)
		return rc;
	if (len > 0 && buf[len - 1] == '\n')
		len--;
	rc = len > 0 && len <= 12 ? 0 : -EINVAL;
	for (i = 0; rc == 0 && i < len; i++) {
		if (buf[i] < '0' || buf[i] > '9')
			rc = -EINVAL;
		else
			v = v * 10 + (buf[i] - '0');
	}
	free(buf);
	if (rc == 0)
		*step = v;
	return rc;
}

/*
 * Replaces LATEST: written to a temporary name and fsync'd (else a crash
 * could leave LATEST empty), renamed over (readers see the old or the new
 * value, never a mix), then the job directory fsync'd (else a crash could
 * bring back the old value). *renamed says whether the new value became
 * visible, for a caller that must undo it.
 */
static int latest_write(struct local *l, int jobfd, const char *job, int64_t step, bool *renamed,
                        char *err)
{
	char text[32], p[PATH_MAX];
	int n = snprintf(text, sizeof(text), "%" PRId64 "\n", step);
	int rc;

	*renamed = false;
	rc = write_tmp(l, jobfd, LATEST_TMP, text, (size_t)n,
	               path_of(l, p, sizeof(p), job, -1, LATEST_TMP), err);
	if (rc < 0)
		return rc;
	rc = l->ops->renameat(jobfd, LATEST_TMP, jobfd, LATEST_NAME);
	if (rc < 0) {
		l->ops->unlinkat(jobfd, LATEST_TMP, 0);
		return ipc_errf(err, rc, "renaming %s to LATEST failed: %s", p, strerror(-rc));
	}
	*renamed = true;
	rc = l->ops->fsync(jobfd);
	if (rc < 0)
		return ipc_errf(err, rc,
		                "fsync of %s after replacing LATEST failed: %s: check the disk",
		                path_of(l, p, sizeof(p), job, -1, NULL), strerror(-rc));
	return 0;
}

/* Removes LATEST, durably: else it could come back after a crash. */
static int latest_remove(struct local *l, int jobfd, const char *job, char *err)
{
	char p[PATH_MAX];
	int rc = l->ops->unlinkat(jobfd, LATEST_NAME, 0);

	path_of(l, p, sizeof(p), job, -1, LATEST_NAME);
	if (rc == -ENOENT)
		return 0;
	if (rc == 0)
		rc = l->ops->fsync(jobfd);
	return rc < 0 ? ipc_errf(err, rc, "removing %s failed: %s", p, strerror(-rc)) : 0;
}

/* Every name in a directory but . and .. (malloc'd array of malloc'd names). */
static int list_dir(struct local *l, int dirfd, char ***out, size_t *n)
{
	int fd = l->ops->openat(dirfd, ".", DIR_FLAGS, 0);
	char **v = NULL, **nv;
	size_t cap = 0, cnt = 0;
	struct dirent *de;
	DIR *d;
	int rc = 0;

	if (fd < 0)
		return fd;
	d = fdopendir(fd);
	if (!d) {
		rc = -errno;
		close(fd);
		return rc;
	}
	for (;;) {
		errno = 0;
		de = readdir(d);
		if (!de) {
			rc = -errno; /* 0 at the end */
			break;
		}
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (cnt == LOCAL_MAX_ENTRIES) {
			rc = -E2BIG;
			break;
		}
		if (cnt == cap) {
			cap = cap ? cap * 2 : 16;
			nv = realloc(v, cap * sizeof(*v));
			if (!nv) {
				rc = -ENOMEM;
				break;
			}
			v = nv;
		}
		if (!(v[cnt] = strdup(de->d_name))) {
			rc = -ENOMEM;
			break;
		}
		cnt++;
	}
	closedir(d);
	if (rc < 0) {
		while (cnt)
			free(v[--cnt]);
		free(v);
		return rc;
	}
	*out = v;
	*n = cnt;
	return 0;
}

static void free_names(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

static bool is_dir_at(int dirfd, const char *name)
{
	struct stat st;

	return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

/* A step directory with a regular manifest.json in it. */
static bool committed_at(struct local *l, int jobfd, const char *sname)
{
	struct stat st;
	int fd = open_dir(l, jobfd, sname);
	bool yes;

	if (fd < 0)
		return false;
	yes = fstatat(fd, MANIFEST_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
	close(fd);
	return yes;
}

/*
 * Deletes name under dirfd and, if a directory, what it holds. Links are
 * removed, never followed; depth bounds what a hostile tree can make us do.
 */
static int rm_tree(struct local *l, int dirfd, const char *name, int depth)
{
	char **v;
	size_t n;
	int fd, rc = l->ops->unlinkat(dirfd, name, 0);

	if (rc != -EISDIR && rc != -EPERM)
		return rc == -ENOENT ? 0 : rc;
	if (depth >= LOCAL_MAX_DEPTH)
		return -ELOOP;
	fd = open_dir(l, dirfd, name);
	if (fd < 0)
		return fd;
	rc = list_dir(l, fd, &v, &n);
	if (rc == 0) {
		for (size_t i = 0; rc == 0 && i < n; i++)
			rc = rm_tree(l, fd, v[i], depth + 1);
		free_names(v, n);
	}
	close(fd);
	if (rc < 0)
		return rc;
	rc = l->ops->unlinkat(dirfd, name, AT_REMOVEDIR);
	return rc == -ENOENT ? 0 : rc;
}

static int cmp_step(const void *a, const void *b)
{
	const struct storage_step *x = a, *y = b;

	return x->step < y->step ? -1 : x->step > y->step;
}

/* The step directories of a job, sorted (malloc'd; NULL when none). */
static int collect_steps(struct local *l, int jobfd, struct storage_step **out, size_t *n)
{
	struct storage_step *v = NULL;
	char **names;
	size_t cnt, k = 0;
	int rc = list_dir(l, jobfd, &names, &cnt);

	if (rc < 0)
		return rc;
	if (cnt && !(v = calloc(cnt, sizeof(*v)))) {
		free_names(names, cnt);
		return -ENOMEM;
	}
	for (size_t i = 0; i < cnt; i++) {
		int64_t step;

		if (!parse_step_name(names[i], &step) || !is_dir_at(jobfd, names[i]))
			continue; /* not ours: junk, a link, a file */
		v[k].step = step;
		v[k].committed = committed_at(l, jobfd, names[i]);
		k++;
	}
	free_names(names, cnt);
	if (k)
		qsort(v, k, sizeof(*v), cmp_step);
	else {
		free(v);
		v = NULL;
	}
	*out = v;
	*n = k;
	return 0;
}

/* Newest committed step other than `except`; -ENOENT when there is none. */
static int newest_committed(struct local *l, int jobfd, int64_t except, int64_t *step)
{
	struct storage_step *v;
	size_t n;
	int rc = collect_steps(l, jobfd, &v, &n);

	if (rc < 0)
		return rc;
	rc = -ENOENT;
	for (size_t i = n; i-- > 0;) {
		if (v[i].committed && v[i].step != except) {
			*step = v[i].step;
			rc = 0;
			break;
		}
	}
	free(v);
	return rc;
}

/* ---- shards ----------------------------------------------------------- */

static int check_shard_args(const char *job, int64_t step, int rank, char *err)
{
	int rc = check_job_step(job, step, err);

	return rc ? rc : ipc_check_rank(rank, IPC_MAX_WORLD, err);
}

/* Remembers, for the backend's life, that the filesystem refused O_DIRECT. */
static void direct_refused(struct local *l, int rc)
{
	pthread_mutex_lock(&l->lock);
	if (l->direct) {
		l->direct = false;
		/* Written once, before direct_why points at it. */
		snprintf(l->refused_why, sizeof(l->refused_why),
		         "O_DIRECT refused under %s (%s; tmpfs or a filesystem without direct "
		         "I/O?): shards are written through the page cache and fsync'd",
		         l->root, strerror(-rc));
		l->direct_why = l->refused_why;
	}
	pthread_mutex_unlock(&l->lock);
}

static bool use_direct(struct local *l)
{
	bool d;

	pthread_mutex_lock(&l->lock);
	d = l->direct;
	pthread_mutex_unlock(&l->lock);
	return d;
}

/* A shard file, O_DIRECT unless the filesystem refuses it (EINVAL). */
static int open_shard_file(struct local *l, int stepfd, const char *name, int flags,
                           struct stat *st)
{
	int fd;

	if (!use_direct(l))
		return open_regular(l, stepfd, name, flags, 0644, st);
	fd = open_regular(l, stepfd, name, flags | O_DIRECT, 0644, st);
	if (fd != -EINVAL)
		return fd;
	/* EINVAL is also "not a regular file": O_DIRECT is to blame only if this works. */
	fd = open_regular(l, stepfd, name, flags, 0644, st);
	if (fd >= 0)
		direct_refused(l, -EINVAL);
	return fd;
}

/* Reserves the blocks now, so a full disk fails the save here, not mid-way. */
static int preallocate(int fd, uint64_t bytes)
{
	if (bytes == 0 || fallocate(fd, 0, 0, (off_t)bytes) == 0)
		return 0;
	if (errno == EOPNOTSUPP || errno == ENOSYS)
		return 0; /* the filesystem cannot: the writes will allocate */
	return -errno;
}

static int local_shard_create(struct storage *s, const char *job, int64_t step, int rank,
                              uint64_t size, struct storage_shard **out, char *err)
{
	struct local *l = to_local(s);
	char sn[32], fname[32], p[PATH_MAX];
	int jobfd = -1, stepfd = -1, fd = -1, rc;
	struct storage_shard *sh = NULL;
	struct stat st;

	*out = NULL;
	if ((rc = check_shard_args(job, step, rank, err)))
		return rc;
	if (size > (uint64_t)INT64_MAX - LOCAL_ALIGN)
		return ipc_errf(err, -EFBIG, "shard size %" PRIu64 " is too large", size);
	step_name(step, sn, sizeof(sn));
	manifest_rank_file(rank, fname, sizeof(fname));
	rc = jobfd = make_dir(l, l->rootfd, job, path_of(l, p, sizeof(p), job, -1, NULL), err);
	if (rc < 0)
		goto out;
	rc = stepfd = make_dir(l, jobfd, sn, path_of(l, p, sizeof(p), job, step, NULL), err);
	if (rc < 0)
		goto out;
	path_of(l, p, sizeof(p), job, step, fname);
	sh = calloc(1, sizeof(*sh));
	if (!sh) {
		rc = ipc_errf(err, -ENOMEM, "out of memory opening %s", p);
		goto out;
	}
	rc = fd = open_shard_file(l, stepfd, fname, O_WRONLY | O_CREAT | O_TRUNC, &st);
	if (rc < 0) {
		ipc_errf(err, rc, "cannot create shard %s: %s", p, strerror(-rc));
		goto out;
	}
	/* Whole blocks: the last O_DIRECT write is padded to 4096. */
	rc = preallocate(fd, (size + LOCAL_ALIGN - 1) / LOCAL_ALIGN * LOCAL_ALIGN);
	if (rc < 0) {
		ipc_errf(err, rc, "cannot reserve %" PRIu64 " bytes for shard %s: %s%s", size, p,
		         strerror(-rc),
		         rc == -ENOSPC ? ": the disk is full; free space or delete old "
		                         "checkpoints (ckptctl gc JOB)"
		                       : "");
		close_fd(&fd);
		l->ops->unlinkat(stepfd, fname, 0);
		goto out;
	}
	sh->l = l;
	sh->fd = fd;
	sh->size = size;
	*out = sh;
	sh = NULL;
	rc = 0;
out:
	free(sh);
	close_fd(&stepfd);
	close_fd(&jobfd);
	return rc;
}

static void shard_submit(struct storage_shard *sh, struct io_req *r)
{
	r->fd = sh->fd;
	if (!sh->l->io) {
		r->res = -EINVAL; /* a backend made without an engine cannot move bytes */
		if (r->done)
			r->done(r);
		return;
	}
	ioeng_submit(sh->l->io, r);
}

static void local_shard_write(struct storage_shard *sh, struct io_req *r)
{
	r->op = IO_WRITE;
	shard_submit(sh, r);
}

/*
 * On the I/O thread, after the last write. The size first: the last write
 * was padded to a whole block and the preallocation rounded up, and a
 * safetensors file must end where its data ends. Then fsync: O_DIRECT skips
 * the page cache, not the drive's write cache nor the file's metadata (its
 * size, its extents); without it the shard is not DURABLE.
 */
static void local_shard_finish(struct storage_shard *sh, struct io_req *r)
{
	int rc = sh->l->ops->ftruncate(sh->fd, (off_t)sh->size);

	if (rc < 0) {
		r->res = rc;
		if (r->done)
			r->done(r);
		return;
	}
	r->op = IO_FSYNC;
	r->buf = NULL;
	r->len = 0;
	r->off = 0;
	r->buf_index = -1;
	r->prep = NULL; /* r may be the last write's request: its prep is spent */
	shard_submit(sh, r);
}

static int local_shard_open(struct storage *s, const char *job, int64_t step, int rank,
                            struct storage_shard **out, uint64_t *size, char *err)
{
	struct local *l = to_local(s);
	char fname[32], p[PATH_MAX];
	int jobfd = -1, stepfd = -1, fd, rc;
	struct storage_shard *sh;
	struct stat st;

	*out = NULL;
	if ((rc = check_shard_args(job, step, rank, err)))
		return rc;
	manifest_rank_file(rank, fname, sizeof(fname));
	path_of(l, p, sizeof(p), job, step, fname);
	rc = jobfd = open_job(l, job, err);
	if (rc < 0)
		return rc;
	rc = stepfd = open_step(l, jobfd, job, step, err);
	if (rc < 0)
		goto out;
	rc = fd = open_shard_file(l, stepfd, fname, O_RDONLY, &st);
	if (rc < 0) {
		ipc_errf(err, rc, "cannot open shard %s: %s%s", p, strerror(-rc),
		         rc == -ELOOP || rc == -EINVAL ? " (a link or not a regular file)" : "");
		goto out;
	}
	sh = calloc(1, sizeof(*sh));
	if (!sh) {
		close(fd);
		rc = ipc_errf(err, -ENOMEM, "out of memory opening %s", p);
		goto out;
	}
	sh->l = l;
	sh->fd = fd;
	sh->size = (uint64_t)st.st_size;
	*size = sh->size;
	*out = sh;
	rc = 0;
out:
	close_fd(&stepfd);
	close_fd(&jobfd);
	return rc;
}

static void local_shard_read(struct storage_shard *sh, struct io_req *r)
{
	r->op = IO_READ;
	shard_submit(sh, r);
}

static void local_shard_close(struct storage_shard *sh)
{
	if (!sh)
		return;
	close_fd(&sh->fd);
	free(sh);
}

static void local_shard_path(struct storage *s, const char *job, int64_t step, int rank, char *buf,
                             size_t len)
{
	char fname[32];

	manifest_rank_file(rank, fname, sizeof(fname));
	path_of(to_local(s), buf, len, job, step, fname);
}

/* ---- commit ----------------------------------------------------------- */

/* Adds to a message already in err (what the failure means for the caller). */
static void err_append(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void err_append(char *err, const char *fmt, ...)
{
	size_t n;
	va_list ap;

	if (!err)
		return;
	n = strnlen(err, IPC_ERRLEN);
	if (n + 1 >= IPC_ERRLEN)
		return;
	va_start(ap, fmt);
	vsnprintf(err + n, IPC_ERRLEN - n, fmt, ap);
	va_end(ap);
}

/* Every rank's shard is there: a regular file of the size the manifest says. */
static int check_shards(struct local *l, int stepfd, const struct manifest *m, char *err)
{
	char want[32], p[PATH_MAX];
	struct stat st;

	if (m->nranks == 0 || !m->ranks)
		return ipc_errf(err, -EINVAL,
		                "the manifest of job '%s' step %" PRId64 " lists no shards", m->job,
		                m->step);
	for (size_t i = 0; i < m->nranks; i++) {
		const struct manifest_rank *r = &m->ranks[i];

		if (ipc_check_rank(r->rank, IPC_MAX_WORLD, err))
			return -EINVAL;
		manifest_rank_file(r->rank, want, sizeof(want));
		path_of(l, p, sizeof(p), m->job, m->step, want);
		if (!r->file || strcmp(r->file, want) != 0)
			return ipc_errf(err, -EINVAL,
			                "the manifest names file '%.64s' for rank %d, not %s",
			                r->file ? r->file : "(none)", r->rank, want);
		if (fstatat(stepfd, want, &st, AT_SYMLINK_NOFOLLOW) < 0)
			return ipc_errf(err, -errno,
			                "shard %s is missing (%s): the step cannot be committed", p,
			                strerror(errno));
		if (!S_ISREG(st.st_mode))
			return ipc_errf(err, -EINVAL, "shard %s is not a regular file", p);
		if ((uint64_t)st.st_size != r->size)
			return ipc_errf(err, -EIO,
			                "shard %s is %lld bytes but the manifest says %" PRIu64
			                ": it was not written completely",
			                p, (long long)st.st_size, r->size);
	}
	return 0;
}

/*
 * The commit proper. Each step says what a crash (or a reader) would meet
 * without it. *visible: manifest.json exists (the caller undoes it if a
 * later step fails).
 */
static int publish_manifest(struct local *l, int jobfd, int stepfd, const struct manifest *m,
                            const char *json, size_t len, bool *visible, char *err)
{
	char tmp[PATH_MAX], dir[PATH_MAX];
	int rc;

	*visible = false;
	path_of(l, tmp, sizeof(tmp), m->job, m->step, MANIFEST_TMP);
	path_of(l, dir, sizeof(dir), m->job, m->step, NULL);
	/*
	 * 1-2. The manifest under a temporary name, written and fsync'd
	 * (write_tmp): without the fsync, a crash after the rename could
	 * leave manifest.json empty or torn while its name says "committed".
	 */
	rc = write_tmp(l, stepfd, MANIFEST_TMP, json, len, tmp, err);
	if (rc < 0)
		return rc;
	/*
	 * 3. The step directory BEFORE the rename: the shard files' entries
	 * must be durable before the manifest can be. Nothing orders
	 * directory updates on disk; without this a crash could keep the
	 * manifest and lose a rank file: a committed checkpoint that
	 * cannot be loaded.
	 */
	rc = l->ops->fsync(stepfd);
	if (rc < 0) {
		ipc_errf(err, rc, "fsync of %s failed: %s: check the disk", dir, strerror(-rc));
		goto drop_tmp;
	}
	/*
	 * 4. The rename is the commit: atomic, so readers see no manifest or
	 * the whole of it, never a part.
	 */
	rc = l->ops->renameat(stepfd, MANIFEST_TMP, stepfd, MANIFEST_NAME);
	if (rc < 0) {
		ipc_errf(err, rc, "renaming %s to %s failed: %s", tmp, MANIFEST_NAME,
		         strerror(-rc));
		goto drop_tmp;
	}
	*visible = true;
	/*
	 * 5. The step directory again: makes the rename durable. Without it
	 * a crash could lose manifest.json after the save was reported
	 * COMMITTED, and recovery would then delete the step as partial.
	 */
	rc = l->ops->fsync(stepfd);
	if (rc < 0)
		return ipc_errf(err, rc, "fsync of %s after the rename failed: %s: check the disk",
		                dir, strerror(-rc));
	/*
	 * 6. The job directory: it holds the step directory's own entry.
	 * Without it a crash could lose the whole step directory, manifest
	 * and shards, of a checkpoint reported COMMITTED.
	 */
	rc = l->ops->fsync(jobfd);
	if (rc < 0)
		return ipc_errf(err, rc, "fsync of %s failed: %s: check the disk",
		                path_of(l, dir, sizeof(dir), m->job, -1, NULL), strerror(-rc));
	return 0;

drop_tmp:
	l->ops->unlinkat(stepfd, MANIFEST_TMP, 0);
	return rc;
}

/*
 * A commit that failed after the rename: the manifest goes back out of
 * sight, so that a FAILED save leaves no checkpoint visible. Best effort:
 * the disk has just failed us; if this does not stick either, what stays
 * visible is complete (every shard was durable before the commit began).
 */
static void unpublish(struct local *l, int stepfd)
{
	l->ops->unlinkat(stepfd, MANIFEST_NAME, 0);
	l->ops->fsync(stepfd);
}

/*
 * 7-10. LATEST, the same way (latest_write), and only forward: an older
 * step that commits late must not hide a newer one. Under the lock: two
 * commits of one job read and replace it one after the other. On failure
 * after LATEST was replaced, the old value is put back (best effort).
 */
static int advance_latest(struct local *l, int jobfd, const struct manifest *m, char *err)
{
	char ignored[IPC_ERRLEN];
	int64_t cur = -1;
	bool renamed, again;
	int rc, had;

	pthread_mutex_lock(&l->lock);
	had = latest_read(l, jobfd, &cur);
	if (had == 0 && cur >= m->step) {
		pthread_mutex_unlock(&l->lock);
		return 0;
	}
	rc = latest_write(l, jobfd, m->job, m->step, &renamed, err);
	if (rc < 0 && renamed) {
		if (had == 0)
			latest_write(l, jobfd, m->job, cur, &again, ignored);
		else
			latest_remove(l, jobfd, m->job, ignored);
	}
	pthread_mutex_unlock(&l->lock);
	return rc;
}

static int local_commit(struct storage *s, const struct manifest *m, char *err)
{
	struct local *l = to_local(s);
	int jobfd = -1, stepfd = -1, rc;
	char *json = NULL, p[PATH_MAX];
	bool visible = false;
	struct stat st;
	size_t len = 0;

	if (!m)
		return ipc_errf(err, -EINVAL, "no manifest to commit");
	if ((rc = check_job_step(m->job, m->step, err)))
		return rc;
	rc = jobfd = open_job(l, m->job, err);
	if (rc < 0)
		return rc;
	rc = stepfd = open_step(l, jobfd, m->job, m->step, err);
	if (rc < 0)
		goto out;
	if (fstatat(stepfd, MANIFEST_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		/* Replacing it would also make our undo delete a good checkpoint. */
		rc = ipc_errf(
		    err, -EEXIST,
		    "job '%s' step %" PRId64 " is already committed (%s exists): delete it "
		    "first to save it again",
		    m->job, m->step, path_of(l, p, sizeof(p), m->job, m->step, MANIFEST_NAME));
		goto out;
	}
	/* Checks the manifest (manifest_check) before we look at files it names. */
	rc = manifest_to_json(m, &json, &len, err);
	if (rc < 0)
		goto out;
	rc = check_shards(l, stepfd, m, err);
	if (rc < 0)
		goto out;
	rc = publish_manifest(l, jobfd, stepfd, m, json, len, &visible, err);
	if (rc == 0)
		rc = advance_latest(l, jobfd, m, err);
	if (rc < 0) {
		if (visible)
			unpublish(l, stepfd);
		err_append(err, "; job '%s' step %" PRId64 " was not committed", m->job, m->step);
	}
out:
	free(json);
	close_fd(&stepfd);
	close_fd(&jobfd);
	return rc;
}

/* ---- reading ---------------------------------------------------------- */

static int local_read_manifest(struct storage *s, const char *job, int64_t step,
                               struct manifest **out, char *err)
{
	struct local *l = to_local(s);
	char p[PATH_MAX], why[IPC_ERRLEN] = "";
	int jobfd = -1, stepfd = -1, rc;
	struct manifest *m = NULL;
	char *buf = NULL;
	size_t len = 0;

	*out = NULL;
	if ((rc = check_job_step(job, step, err)))
		return rc;
	path_of(l, p, sizeof(p), job, step, MANIFEST_NAME);
	rc = jobfd = open_job(l, job, err);
	if (rc < 0)
		return rc;
	rc = stepfd = open_step(l, jobfd, job, step, err);
	if (rc < 0)
		goto out;
	rc = read_small(l, stepfd, MANIFEST_NAME, MANIFEST_MAX_BYTES, &buf, &len);
	if (rc == -ENOENT)
		ipc_errf(err, rc, "job '%s' step %" PRId64 " is not committed (no %s)", job, step,
		         p);
	else if (rc == -EFBIG)
		ipc_errf(err, rc, "%s is larger than %u MiB: not a manifest ckptd wrote", p,
		         MANIFEST_MAX_BYTES >> 20);
	else if (rc == -ELOOP || rc == -EINVAL)
		ipc_errf(err, rc, "%s is not a regular file (a link?): ckptd does not follow links",
		         p);
	else if (rc < 0)
		ipc_errf(err, rc, "cannot read %s: %s", p, strerror(-rc));
	if (rc < 0)
		goto out;
	rc = manifest_from_json(buf, len, &m, why);
	if (rc < 0) {
		ipc_errf(err, rc, "%s: %s", p, why);
		goto out;
	}
	if (!m->job || strcmp(m->job, job) != 0 || m->step != step) {
		rc = ipc_errf(err, -EINVAL,
		              "%s names job '%.64s' step %" PRId64 ", not job '%s' step %" PRId64
		              ": it was copied or moved here; delete the step",
		              p, m->job ? m->job : "", m->step, job, step);
		manifest_free(m);
		goto out;
	}
	*out = m;
out:
	free(buf);
	close_fd(&stepfd);
	close_fd(&jobfd);
	return rc;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* *jobs: malloc'd array of malloc'd names, sorted (free each, then the array). */
static int local_list_jobs(struct storage *s, char ***jobs, size_t *n, char *err)
{
	struct local *l = to_local(s);
	char **v;
	size_t cnt, k = 0;
	int rc = list_dir(l, l->rootfd, &v, &cnt);

	*jobs = NULL;
	*n = 0;
	if (rc < 0)
		return ipc_errf(err, rc, "cannot list %s: %s", l->root, strerror(-rc));
	for (size_t i = 0; i < cnt; i++) {
		if (ipc_check_job(v[i], NULL) == 0 && is_dir_at(l->rootfd, v[i]))
			v[k++] = v[i];
		else
			free(v[i]); /* not a job: a file, a link, a name we never make */
	}
	if (k == 0) {
		free(v);
		return 0;
	}
	qsort(v, k, sizeof(*v), cmp_name);
	*jobs = v;
	*n = k;
	return 0;
}

/* *steps: malloc'd, sorted by step; NULL when there are none. */
static int local_list_steps(struct storage *s, const char *job, struct storage_step **steps,
                            size_t *n, char *err)
{
	struct local *l = to_local(s);
	char p[PATH_MAX];
	int jobfd, rc;

	*steps = NULL;
	*n = 0;
	if ((rc = ipc_check_job(job, err)))
		return rc;
	rc = jobfd = open_job(l, job, err);
	if (rc < 0)
		return rc;
	rc = collect_steps(l, jobfd, steps, n);
	close(jobfd);
	if (rc < 0)
		return ipc_errf(err, rc, "cannot list %s: %s",
		                path_of(l, p, sizeof(p), job, -1, NULL), strerror(-rc));
	return 0;
}

static int local_get_latest(struct storage *s, const char *job, int64_t *step, char *err)
{
	struct local *l = to_local(s);
	char p[PATH_MAX];
	int jobfd, rc;

	if ((rc = ipc_check_job(job, err)))
		return rc;
	rc = jobfd = open_job(l, job, err);
	if (rc < 0)
		return rc;
	path_of(l, p, sizeof(p), job, -1, LATEST_NAME);
	rc = latest_read(l, jobfd, step);
	close(jobfd);
	if (rc == -ENOENT)
		return ipc_errf(err, rc, "job '%s' has no LATEST (nothing committed yet?)", job);
	if (rc == -EINVAL || rc == -ELOOP)
		return ipc_errf(err, rc,
		                "%s is not a regular file holding a step number: restart the agent "
		                "(recovery rewrites it)",
		                p);
	if (rc < 0)
		return ipc_errf(err, rc, "cannot read %s: %s", p, strerror(-rc));
	return 0;
}

static int local_set_latest(struct storage *s, const char *job, int64_t step, char *err)
{
	struct local *l = to_local(s);
	bool renamed;
	int jobfd, rc;

	if ((rc = ipc_check_job(job, err)) || (step >= 0 && (rc = ipc_check_step(step, err))))
		return rc;
	rc = jobfd = open_job(l, job, err);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&l->lock);
	if (step < 0)
		rc = latest_remove(l, jobfd, job, err);
	else
		rc = latest_write(l, jobfd, job, step, &renamed, err);
	pthread_mutex_unlock(&l->lock);
	close(jobfd);
	return rc;
}

/* ---- removal ---------------------------------------------------------- */

/*
 * If LATEST names `step`, points it at the newest other committed step (or
 * removes it). Done before the step goes, so that LATEST never names a
 * step that is not there, crash or no crash.
 */
static int repoint_latest(struct local *l, int jobfd, const char *job, int64_t step, char *err)
{
	int64_t cur, newest;
	bool renamed;
	int rc;

	pthread_mutex_lock(&l->lock);
	rc = latest_read(l, jobfd, &cur);
	if (rc == 0 && cur == step) {
		rc = newest_committed(l, jobfd, step, &newest);
		if (rc == 0)
			rc = latest_write(l, jobfd, job, newest, &renamed, err);
		else if (rc == -ENOENT)
			rc = latest_remove(l, jobfd, job, err);
		else
			ipc_errf(err, rc, "cannot list the steps of job '%s': %s", job,
			         strerror(-rc));
	} else {
		rc = 0; /* not LATEST, or LATEST unreadable: recovery fixes that */
	}
	pthread_mutex_unlock(&l->lock);
	return rc;
}

static int local_remove(struct storage *s, const char *job, int64_t step, char *err)
{
	struct local *l = to_local(s);
	char sn[32], trash[96], p[PATH_MAX];
	int jobfd, stepfd, rc;
	uint64_t seq;

	if ((rc = check_job_step(job, step, err)))
		return rc;
	rc = jobfd = open_job(l, job, err);
	if (rc < 0)
		return rc;
	rc = stepfd = open_step(l, jobfd, job, step, err);
	if (rc < 0)
		goto out;
	close(stepfd);
	rc = repoint_latest(l, jobfd, job, step, err);
	if (rc < 0)
		goto out;
	pthread_mutex_lock(&l->lock);
	seq = ++l->trash_seq;
	pthread_mutex_unlock(&l->lock);
	step_name(step, sn, sizeof(sn));
	snprintf(trash, sizeof(trash), "%s%s.%d.%" PRIu64, TRASH_PREFIX, sn, (int)getpid(), seq);
	path_of(l, p, sizeof(p), job, step, NULL);
	/* One rename takes the whole step out of sight at once. */
	rc = l->ops->renameat(jobfd, sn, jobfd, trash);
	if (rc < 0) {
		ipc_errf(err, rc, "cannot remove %s (rename failed): %s", p, strerror(-rc));
		goto out;
	}
	/*
	 * Durably out of sight: without this fsync a crash during the
	 * deletion below could bring the step back under its name with part
	 * of its files gone, a manifest naming shards that are not there.
	 */
	rc = l->ops->fsync(jobfd);
	if (rc < 0) {
		ipc_errf(err, rc, "fsync of the directory of %s failed: %s: check the disk", p,
		         strerror(-rc));
		goto out;
	}
	rc = rm_tree(l, jobfd, trash, 0);
	if (rc < 0)
		ipc_errf(err, rc,
		         "%s is out of sight, but deleting its files failed: %s; the agent deletes "
		         "them at its next start",
		         p, strerror(-rc));
out:
	close(jobfd);
	return rc;
}

static bool is_leftover(const char *name)
{
	size_t n = strlen(name);

	return strncmp(name, TRASH_PREFIX, strlen(TRASH_PREFIX)) == 0 ||
	       (name[0] == '.' && n > 5 && strcmp(name + n - 4, ".tmp") == 0);
}

/* LATEST = the newest committed step, or no LATEST when there is none. */
static int fix_latest(struct local *l, int jobfd, const char *job, int64_t newest,
                      struct storage_recovery *rec, char *err)
{
	int64_t cur = -1;
	bool renamed;
	int rc;

	pthread_mutex_lock(&l->lock);
	rc = latest_read(l, jobfd, &cur);
	if (newest < 0 && rc != -ENOENT)
		rc = latest_remove(l, jobfd, job, err);
	else if (newest >= 0 && (rc != 0 || cur != newest))
		rc = latest_write(l, jobfd, job, newest, &renamed, err);
	else
		rc = 1; /* already right */
	pthread_mutex_unlock(&l->lock);
	if (rc == 0)
		rec->latest_fixed++;
	return rc < 0 ? rc : 0;
}

/* One entry of a job directory at start-up. */
static int recover_entry(struct local *l, int jobfd, const char *job, const char *name,
                         int64_t *newest, struct storage_recovery *rec, char *err)
{
	char p[PATH_MAX];
	int64_t step;
	int rc;

	snprintf(p, sizeof(p), "%s/%s/%s", l->root, job, name);
	if (parse_step_name(name, &step)) {
		if (!is_dir_at(jobfd, name))
			return 0; /* not ours: left alone */
		if (committed_at(l, jobfd, name)) {
			int fd = open_dir(l, jobfd, name);

			if (step > *newest)
				*newest = step;
			/* A commit that died before its rename, with a manifest already there. */
			if (fd >= 0 && l->ops->unlinkat(fd, MANIFEST_TMP, 0) == 0)
				rec->temp_removed++;
			close_fd(&fd);
			return 0;
		}
		/* No manifest: a save that never committed. Not a checkpoint. */
		rc = rm_tree(l, jobfd, name, 0);
		if (rc == 0)
			rec->partial_removed++;
	} else if (is_leftover(name)) {
		/* A removal or a temporary file that a crash interrupted. */
		rc = rm_tree(l, jobfd, name, 0);
		if (rc == 0)
			rec->temp_removed++;
	} else {
		return 0;
	}
	return rc < 0 ? ipc_errf(err, rc, "cannot remove %s: %s", p, strerror(-rc)) : 0;
}

static int recover_job(struct local *l, const char *job, struct storage_recovery *rec, char *err)
{
	char why[IPC_ERRLEN];
	int64_t newest = -1;
	int jobfd, rc, first = 0;
	char **v;
	size_t n;

	rc = jobfd = open_job(l, job, err);
	if (rc < 0)
		return rc;
	rc = list_dir(l, jobfd, &v, &n);
	if (rc < 0) {
		close(jobfd);
		return ipc_errf(err, rc, "cannot list %s/%s: %s", l->root, job, strerror(-rc));
	}
	/* Keeps going past an error: one bad entry must not block the rest. */
	for (size_t i = 0; i < n; i++) {
		rc = recover_entry(l, jobfd, job, v[i], &newest, rec, first ? why : err);
		if (rc < 0 && !first)
			first = rc;
	}
	free_names(v, n);
	rc = fix_latest(l, jobfd, job, newest, rec, first ? why : err);
	close(jobfd);
	return first ? first : rc;
}

static int local_recover(struct storage *s, struct storage_recovery *rec, char *err)
{
	struct local *l = to_local(s);
	char why[IPC_ERRLEN];
	int rc, first = 0;
	char **jobs;
	size_t n;

	memset(rec, 0, sizeof(*rec));
	rc = local_list_jobs(s, &jobs, &n, err);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < n; i++) {
		rc = recover_job(l, jobs[i], rec, first ? why : err);
		if (rc < 0 && !first)
			first = rc;
	}
	free_names(jobs, n);
	return first;
}

/* ---- the backend ------------------------------------------------------ */

static void local_destroy(struct storage *s)
{
	struct local *l = to_local(s);

	if (!l)
		return;
	close_fd(&l->rootfd);
	free(l->root);
	pthread_mutex_destroy(&l->lock);
	free(l);
}

static const struct storage_ops local_ops = {
    .name = "local",
    .shard_create = local_shard_create,
    .shard_write = local_shard_write,
    .shard_finish = local_shard_finish,
    .shard_open = local_shard_open,
    .shard_read = local_shard_read,
    .shard_close = local_shard_close,
    .shard_path = local_shard_path,
    .commit = local_commit,
    .read_manifest = local_read_manifest,
    .list_jobs = local_list_jobs,
    .list_steps = local_list_steps,
    .get_latest = local_get_latest,
    .set_latest = local_set_latest,
    .remove = local_remove,
    .recover = local_recover,
    .destroy = local_destroy,
};

/*
 * mkdir -p, each new directory made durable in its parent: a root that
 * vanishes in a crash takes every checkpoint in it along.
 */
static int make_root(struct local *l, const char *root, char *err)
{
	char p[PATH_MAX];
	size_t n = strlen(root);
	struct stat st;
	int rc, fd;

	if (n >= sizeof(p))
		return ipc_errf(err, -ENAMETOOLONG, "storage root '%.64s...' is too long", root);
	memcpy(p, root, n + 1);
	for (size_t i = 1; i <= n; i++) {
		char c = p[i], *slash;

		if ((c != '/' && c != '\0') || p[i - 1] == '/')
			continue;
		p[i] = '\0';
		rc = l->ops->mkdirat(AT_FDCWD, p, 0755);
		if (rc < 0 && rc != -EEXIST && !(stat(p, &st) == 0 && S_ISDIR(st.st_mode)))
			return ipc_errf(err, rc, "cannot create the storage root %s (at %s): %s",
			                root, p, strerror(-rc));
		if (rc == 0) {
			slash = strrchr(p, '/');
			if (slash == p)
				fd = l->ops->openat(AT_FDCWD, "/", DIR_FLAGS & ~O_NOFOLLOW, 0);
			else if (slash) {
				*slash = '\0';
				fd = l->ops->openat(AT_FDCWD, p, DIR_FLAGS & ~O_NOFOLLOW, 0);
				*slash = '/';
			} else {
				fd = l->ops->openat(AT_FDCWD, ".", DIR_FLAGS & ~O_NOFOLLOW, 0);
			}
			rc = fd < 0 ? fd : l->ops->fsync(fd);
			if (fd >= 0)
				close(fd);
			if (rc < 0)
				return ipc_errf(err, rc, "fsync of the parent of %s failed: %s", p,
				                strerror(-rc));
		}
		p[i] = c;
	}
	return 0;
}

/*
 * Finds out at start-up whether the filesystem takes O_DIRECT, for the
 * status line. Not fatal otherwise: a read-only root still lists and
 * verifies; shard_create finds out (and says) again.
 */
static void probe_direct(struct local *l)
{
	char name[64];
	struct stat st;
	int fd;

	snprintf(name, sizeof(name), ".ckptd-direct-probe.%d", (int)getpid());
	fd = open_shard_file(l, l->rootfd, name, O_WRONLY | O_CREAT | O_TRUNC, &st);
	if (fd >= 0) {
		close(fd);
		l->ops->unlinkat(l->rootfd, name, 0);
	}
}

int local_create(const struct local_opts *o, struct storage **out, char *err)
{
	struct local *l;
	int rc;

	*out = NULL;
	if (!o || !o->root || !o->root[0])
		return ipc_errf(err, -EINVAL, "no storage root given: set --root DIR");
	l = calloc(1, sizeof(*l));
	if (!l)
		return ipc_errf(err, -ENOMEM, "out of memory creating the local backend");
	l->base.ops = &local_ops;
	l->rootfd = -1;
	l->ops = o->ops ? o->ops : &fsops_posix;
	l->io = o->io;
	pthread_mutex_init(&l->lock, NULL);
	l->root = strdup(o->root);
	if (!l->root) {
		rc = ipc_errf(err, -ENOMEM, "out of memory creating the local backend");
		goto fail;
	}
	rc = make_root(l, o->root, err);
	if (rc < 0)
		goto fail;
	rc = l->rootfd = l->ops->openat(AT_FDCWD, o->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	if (rc < 0) {
		ipc_errf(err, rc, "cannot open the storage root %s: %s", o->root, strerror(-rc));
		goto fail;
	}
	l->direct = o->direct;
	if (o->direct) {
		l->direct_why = "O_DIRECT";
		probe_direct(l);
	} else {
		l->direct_why = "O_DIRECT off in the configuration: shards are written through the "
		                "page cache and fsync'd";
	}
	*out = &l->base;
	return 0;
fail:
	local_destroy(&l->base);
	return rc;
}

bool local_direct(const struct storage *s, const char **why)
{
	struct local *l = (struct local *)s;
	bool d;

	if (!s || s->ops != &local_ops) {
		if (why)
			*why = "not a local backend";
		return false;
	}
	pthread_mutex_lock(&l->lock);
	d = l->direct;
	if (why)
		*why = l->direct_why; /* never rewritten once it is pointed at */
	pthread_mutex_unlock(&l->lock);
	return d;
}
