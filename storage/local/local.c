/*
 * local: the local-filesystem backend (docs/DESIGN.md §6), for one node's disk
 * or a filesystem every node of a job shares.
 *
 *   <root>/<job>/step-<12d>/rank-<5d>.<node>.<attempt>.safetensors   a shard
 *   <root>/<job>/step-<12d>/parts/<node>.json     a node's part, written once
 *   <root>/<job>/step-<12d>/manifest.json         written last, once: the commit
 *   <root>/<job>/step-<12d>/pinned                empty; present: kept by retention
 *   <root>/<job>/plans/<node>.json                the plans a node serves
 *   <root>/<job>/LATEST                           "<step>\n", the newest committed
 *
 * Callers: the agent's workers (create, open, objects, list, remove,
 * clean-up: synchronous, on their own thread, several at once); shard
 * writes, reads and finish complete on the I/O engine's thread. Agents of
 * other nodes work in the same directories at the same time: nothing here
 * takes a lock that another node would have to respect, shards are created
 * exclusively, objects appear whole (link or rename), and temporary names
 * carry the node.
 *
 * Map of the backend (local_int.h: what its files share):
 *   local.c        the backend object (local_create, local_direct, the ops
 *                  table); helpers: names, paths, directories, small files;
 *   local_file.c   a regular file opened safely; temporary names;
 *                  shards: create (exclusively, directories made as they
 *                  appear), write, finish (exact size, fsync of the file
 *                  and of the directories that name it), open, read, stat
 *   local_obj.c    small objects by key: put (temporary name, fsync, link
 *                  or rename, fsync the directory), get, stat, delete, list
 *   local_scan.c   walking the tree: list_jobs, list_steps, remove (out of
 *                  sight first), clean-up (what may go, and what may not)
 *   local_root.c   the root and this node's lock in it: made and opened at
 *                  start, checked later, opened again if made anew
 *
 * Everything goes through the root's descriptor (never closed while the
 * backend lives; local_root.c), one path component at a time with O_NOFOLLOW, and through the fsops
 * table (tests inject faults). What is read back (names, objects) is treated as hostile: no symlink
 * is followed, no read is unbounded, no FIFO can block an open.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/local/local_int.h"

struct storage_shard {
	struct local *l;
	int fd;
	int stepfd, jobfd; /* write side: fsync'd after the file, so its name is durable */
	uint64_t size;
	struct io_req sync; /* finish: the directories' fsyncs, one after the other */
	struct io_req *user; /* finish: the caller's request, done at the end */
	int syncing; /* finish: 0 the file, 1 the step directory, 2 the job's */
};

static const struct storage_ops local_ops;

/* ---- names and paths -------------------------------------------------- */

void local_close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

void local_step_name(int64_t step, char *buf, size_t len)
{
	snprintf(buf, len, "step-%012" PRId64, step);
}

bool local_parse_step_name(const char *name, int64_t *step)
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

const char *local_path_of(const struct local *l, char *buf, size_t len, const char *job,
                          int64_t step, const char *leaf)
{
	char sn[32] = "";

	if (step >= 0)
		local_step_name(step, sn, sizeof(sn));
	snprintf(buf, len, "%s/%s%s%s%s%s", l->root, job, sn[0] ? "/" : "", sn, leaf ? "/" : "",
	         leaf ? leaf : "");
	return buf;
}

/* ---- directories ------------------------------------------------------ */

int local_open_dir(struct local *l, int dirfd, const char *name)
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

int local_open_job(struct local *l, const char *job, char *err)
{
	char p[PATH_MAX];
	int fd = local_open_dir(l, l->rootfd, job);

	if (fd == -ENOENT)
		return ipc_errf(err, fd, "no job '%s' under %s", job, l->root);
	return fd < 0 ? dir_error(fd, local_path_of(l, p, sizeof(p), job, -1, NULL), err) : fd;
}

int local_open_job_step(struct local *l, const char *job, int64_t step, int *jobfd, int *stepfd,
                        char *err)
{
	char sn[32], p[PATH_MAX];
	int rc;

	*jobfd = *stepfd = -1;
	if ((rc = ipc_check_job(job, err)) || (rc = ipc_check_step(step, err)))
		return rc;
	rc = *jobfd = local_open_job(l, job, err);
	if (rc < 0) {
		*jobfd = -1;
		return rc;
	}
	local_step_name(step, sn, sizeof(sn));
	rc = *stepfd = local_open_dir(l, *jobfd, sn);
	if (rc < 0) {
		*stepfd = -1;
		local_close_fd(jobfd);
		local_path_of(l, p, sizeof(p), job, step, NULL);
		return rc == -ENOENT
		           ? ipc_errf(err, rc, "no checkpoint of job '%s' at step %" PRId64 " (%s)",
		                      job, step, p)
		           : dir_error(rc, p, err);
	}
	return 0;
}

/*
 * A job directory needs durable: no commit ever fsyncs the root, so without
 * it a crash could lose the job and every checkpoint committed in it. A
 * step directory does not at creation: the shard's finish fsyncs the job
 * directory before the shard is DURABLE, and that fsync would otherwise sit
 * in every save's stall, before the first byte is copied.
 */
int local_make_dir(struct local *l, int dirfd, const char *name, const char *path, bool durable,
                   char *err)
{
	int rc = l->ops->mkdirat(dirfd, name, 0755);

	if (rc < 0 && rc != -EEXIST)
		return ipc_errf(err, rc, "cannot create directory %s: %s", path, strerror(-rc));
	if (rc == 0 && durable) {
		rc = l->ops->fsync(dirfd);
		if (rc < 0)
			return ipc_errf(
			    err, rc, "fsync of the directory holding %s failed: %s: check the disk",
			    path, strerror(-rc));
	}
	rc = local_open_dir(l, dirfd, name);
	return rc < 0 ? dir_error(rc, path, err) : rc;
}

int local_list_dir(struct local *l, int dirfd, char ***out, size_t *n)
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
		local_free_names(v, cnt);
		return rc;
	}
	*out = v;
	*n = cnt;
	return 0;
}

void local_free_names(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

bool local_regular_at(int fd, const char *name)
{
	struct stat st;

	return fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

int local_rename_noreplace(struct local *l, int dirfd, const char *from, const char *to)
{
	struct stat st;
	int rc = l->ops->rename_noreplace(dirfd, from, to);

	if (rc != -EINVAL && rc != -ENOSYS)
		return rc;
	if (fstatat(dirfd, to, &st, AT_SYMLINK_NOFOLLOW) == 0)
		return -EEXIST;
	return errno == ENOENT ? l->ops->renameat(dirfd, from, dirfd, to) : -errno;
}

bool local_maybe_regular_at(int fd, const char *name)
{
	struct stat st;

	if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno != ENOENT;
	return S_ISREG(st.st_mode);
}

bool local_dir_at(int fd, const char *name)
{
	struct stat st;

	return fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

/* ---- small files ------------------------------------------------------ */

int local_read_small(struct local *l, int dirfd, const char *name, size_t max, char **out,
                     size_t *len)
{
	struct stat st;
	size_t got = 0;
	unsigned tries = 0;
	char *buf;
	int fd = local_open_regular(l, dirfd, name, O_RDONLY, 0, &st);

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

/* ---- shards ----------------------------------------------------------- */

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

/*
 * A shard file, then O_DIRECT turned on with fcntl unless the filesystem
 * refuses it (EINVAL): asked of open(), a refusal could come after an
 * exclusive create had made the file, and the file would then be in the way.
 */
static int open_shard_file(struct local *l, int stepfd, const char *name, int flags,
                           struct stat *st)
{
	int fd = local_open_regular(l, stepfd, name, flags, 0644, st), rc;

	if (fd < 0 || !use_direct(l))
		return fd;
	rc = l->ops->direct(fd);
	if (rc < 0)
		direct_refused(l, rc);
	return fd;
}

/* Reserves the blocks now, so a full disk fails the save here, not mid-way. */
static int preallocate(struct local *l, int fd, uint64_t bytes)
{
	int rc = bytes ? l->ops->fallocate(fd, (off_t)bytes) : 0;

	if (rc == -EOPNOTSUPP || rc == -ENOSYS)
		return 0; /* the filesystem cannot: the writes will allocate */
	return rc;
}

/* A shard file name that is no one's yet, created exclusively: its descriptor. */
static int create_exclusive(struct local *l, int stepfd, int rank, char *file, const char *dir,
                            char *err)
{
	struct stat st;
	int fd = -EEXIST;

	for (unsigned k = 0; fd == -EEXIST && k < LOCAL_MAX_ATTEMPTS; k++) {
		if (shard_file_name(rank, l->node, k, file, SHARD_FILE_MAX))
			return ipc_errf(err, -ENAMETOOLONG, "shard name too long for node %s",
			                l->node);
		/* never over an existing file: a manifest may name it */
		fd = open_shard_file(l, stepfd, file, O_WRONLY | O_CREAT | O_EXCL, &st);
	}
	if (fd == -EEXIST)
		return ipc_errf(err, fd,
		                "%d shards of rank %d by node %s are in %s already: clear "
		                "out the step",
		                LOCAL_MAX_ATTEMPTS, rank, l->node, dir);
	if (fd < 0)
		return ipc_errf(err, fd, "cannot create shard %s/%s: %s", dir, file, strerror(-fd));
	return fd;
}

static int local_shard_create(struct storage *s, const char *job, int64_t step, int rank,
                              uint64_t size, char *file, struct storage_shard **out, char *err)
{
	struct local *l = to_local(s);
	char sn[32], p[PATH_MAX], dir[PATH_MAX];
	struct storage_shard *sh = NULL;
	int rc;

	*out = NULL;
	if ((rc = ipc_check_job(job, err)) || (rc = ipc_check_step(step, err)) ||
	    (rc = ipc_check_rank(rank, IPC_MAX_WORLD, err)))
		return rc;
	if (size > (uint64_t)INT64_MAX - LOCAL_ALIGN)
		return ipc_errf(err, -EFBIG, "shard size %" PRIu64 " is too large", size);
	sh = calloc(1, sizeof(*sh));
	if (!sh)
		return ipc_errf(err, -ENOMEM, "out of memory");
	sh->fd = sh->stepfd = sh->jobfd = -1;
	local_step_name(step, sn, sizeof(sn));
	local_path_of(l, dir, sizeof(dir), job, step, NULL);
	/* Twice: a clean-up of another agent may take an empty step directory away. */
	for (int tries = 0; tries < 2; tries++) {
		rc = sh->jobfd = local_make_dir(
		    l, l->rootfd, job, local_path_of(l, p, sizeof(p), job, -1, NULL), true, err);
		if (rc >= 0)
			rc = sh->stepfd = local_make_dir(l, sh->jobfd, sn, dir, false, err);
		if (rc >= 0)
			rc = sh->fd = create_exclusive(l, sh->stepfd, rank, file, dir, err);
		if (rc != -ENOENT)
			break;
		local_close_fd(&sh->stepfd);
		local_close_fd(&sh->jobfd);
	}
	if (rc < 0)
		goto fail;
	/* Whole blocks: the last O_DIRECT write is padded to 4096. */
	rc = preallocate(l, sh->fd, (size + LOCAL_ALIGN - 1) / LOCAL_ALIGN * LOCAL_ALIGN);
	if (rc < 0) {
		ipc_errf(err, rc, "cannot reserve %" PRIu64 " bytes for shard %s/%s: %s%s", size,
		         dir, file, strerror(-rc),
		         rc == -ENOSPC ? ": the disk is full; free space or delete old "
		                         "checkpoints (ckptctl gc JOB)"
		                       : "");
		l->ops->unlinkat(sh->stepfd, file, 0); /* ours, named by nothing */
		goto fail;
	}
	sh->l = l;
	sh->size = size;
	*out = sh;
	return 0;
fail:
	file[0] = '\0'; /* no file of this save's: a name tried may be another's */
	local_close_fd(&sh->fd);
	local_close_fd(&sh->stepfd);
	local_close_fd(&sh->jobfd);
	free(sh);
	return rc;
}

static void shard_submit(struct storage_shard *sh, struct io_req *r)
{
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
	r->fd = sh->fd;
	shard_submit(sh, r);
}

static void fsync_req(struct io_req *r, int fd, void (*done)(struct io_req *), void *ctx)
{
	r->op = IO_FSYNC;
	r->fd = fd;
	r->buf = NULL;
	r->len = 0;
	r->off = 0;
	r->buf_index = -1;
	r->prep = NULL; /* r may be the last write's request: its prep is spent */
	r->done = done;
	r->ctx = ctx;
}

/*
 * I/O thread: the file's fsync, then the step directory's (the file's
 * name), then the job directory's (the step directory's name, made without
 * an fsync). Without the two directories a crash could keep the manifest of
 * a checkpoint and lose a shard's name, or the whole step.
 */
static void synced(struct io_req *r)
{
	struct storage_shard *sh = r->ctx;
	struct io_req *u = sh->user;

	if (r->res >= 0 && ++sh->syncing < 3) {
		fsync_req(&sh->sync, sh->syncing == 1 ? sh->stepfd : sh->jobfd, synced, sh);
		shard_submit(sh, &sh->sync);
		return;
	}
	u->res = r->res < 0 ? r->res : 0;
	if (u->done)
		u->done(u);
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
	sh->user = r;
	sh->syncing = 0;
	fsync_req(&sh->sync, sh->fd, synced, sh);
	shard_submit(sh, &sh->sync);
}

/* [A-Za-z0-9._-], not starting with '.': a name of ours, one component. */
static int check_file(const char *file, char *err)
{
	size_t n = file ? strnlen(file, SHARD_FILE_MAX) : 0;

	if (n == 0 || n >= SHARD_FILE_MAX || file[0] == '.' ||
	    strspn(file, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") != n)
		return ipc_errf(err, -EINVAL, "'%.64s' is not a shard file name", file ? file : "");
	return 0;
}

static int local_shard_open(struct storage *s, const char *job, int64_t step, const char *file,
                            struct storage_shard **out, uint64_t *size, char *err)
{
	struct local *l = to_local(s);
	char p[PATH_MAX];
	int jobfd = -1, stepfd = -1, fd, rc;
	struct storage_shard *sh;
	struct stat st;

	*out = NULL;
	if ((rc = check_file(file, err)))
		return rc;
	local_path_of(l, p, sizeof(p), job, step, file);
	rc = local_open_job_step(l, job, step, &jobfd, &stepfd, err);
	if (rc < 0)
		return rc;
	rc = fd = open_shard_file(l, stepfd, file, O_RDONLY, &st);
	if (rc == -ELOOP || rc == -EINVAL) {
		/* no link is followed: not the file named, damage like a missing one */
		rc = ipc_errf(err, -EBADMSG,
		              "cannot open shard %s: a link or not a regular file, not the file "
		              "its manifest names",
		              p);
		goto out;
	}
	if (rc < 0) {
		ipc_errf(err, rc, "cannot open shard %s: %s", p, strerror(-rc));
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
	sh->stepfd = sh->jobfd = -1;
	sh->size = (uint64_t)st.st_size;
	*size = sh->size;
	*out = sh;
	rc = 0;
out:
	local_close_fd(&stepfd);
	local_close_fd(&jobfd);
	return rc;
}

static void local_shard_read(struct storage_shard *sh, struct io_req *r)
{
	r->op = IO_READ;
	r->fd = sh->fd;
	shard_submit(sh, r);
}

static void local_shard_close(struct storage_shard *sh)
{
	if (!sh)
		return;
	local_close_fd(&sh->fd);
	local_close_fd(&sh->stepfd);
	local_close_fd(&sh->jobfd);
	free(sh);
}

static int local_shard_stat(struct storage *s, const char *job, int64_t step, const char *file,
                            uint64_t *size, char *err)
{
	struct local *l = to_local(s);
	int jobfd, stepfd, rc;
	char p[PATH_MAX];
	struct stat st;

	if ((rc = check_file(file, err)) ||
	    (rc = local_open_job_step(l, job, step, &jobfd, &stepfd, err)))
		return rc;
	local_path_of(l, p, sizeof(p), job, step, file);
	rc = fstatat(stepfd, file, &st, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
	if (rc)
		ipc_errf(err, rc, "shard %s: %s", p, strerror(-rc));
	else if (!S_ISREG(st.st_mode))
		rc = ipc_errf(err, -EINVAL, "shard %s is not a regular file", p);
	else
		*size = (uint64_t)st.st_size;
	close(stepfd);
	close(jobfd);
	return rc;
}

static int local_shard_unlink(struct storage *s, const char *job, int64_t step, const char *file,
                              char *err)
{
	struct local *l = to_local(s);
	int jobfd, stepfd, rc;
	char p[PATH_MAX];

	if ((rc = check_file(file, err)) ||
	    (rc = local_open_job_step(l, job, step, &jobfd, &stepfd, err)))
		return rc;
	rc = l->ops->unlinkat(stepfd, file, 0);
	if (rc < 0)
		ipc_errf(err, rc, "cannot remove %s: %s",
		         local_path_of(l, p, sizeof(p), job, step, file), strerror(-rc));
	close(stepfd);
	close(jobfd);
	return rc;
}

static void local_shard_path(struct storage *s, const char *job, int64_t step, const char *file,
                             char *buf, size_t len)
{
	local_path_of(to_local(s), buf, len, job, step, file);
}

/* ---- the backend ------------------------------------------------------ */

static void local_destroy(struct storage *s)
{
	struct local *l = to_local(s);

	if (!l)
		return;
	local_close_fd(&l->rootfd);
	local_close_fd(&l->nodefd);
	free(l->root);
	free(l->node);
	pthread_mutex_destroy(&l->lock);
	pthread_mutex_destroy(&l->root_mu);
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
    .shard_stat = local_shard_stat,
    .shard_unlink = local_shard_unlink,
    .shard_path = local_shard_path,
    .obj_put = local_obj_put,
    .obj_get = local_obj_get,
    .obj_stat = local_obj_stat,
    .obj_delete = local_obj_delete,
    .obj_sync = local_obj_sync,
    .obj_list = local_obj_list,
    .list_jobs = local_list_jobs,
    .list_steps = local_list_steps,
    .step_tidy = local_step_tidy,
    .remove = local_remove,
    .cleanup = local_cleanup,
    .root_check = local_root_check,
    .destroy = local_destroy,
};

/*
 * Finds out at start-up whether the filesystem takes O_DIRECT, for the
 * status line. Not fatal otherwise: a read-only root still lists and
 * verifies; shard_create finds out (and says) again.
 */
static void probe_direct(struct local *l)
{
	char name[160];
	struct stat st;
	int fd;

	local_tmp_name(l, "direct-probe", name, sizeof(name));
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
	if ((rc = ipc_check_node(o->node, err)))
		return rc;
	l = calloc(1, sizeof(*l));
	if (!l)
		return ipc_errf(err, -ENOMEM, "out of memory creating the local backend");
	storage_init(&l->base, &local_ops);
	l->rootfd = -1;
	l->nodefd = -1;
	l->ops = o->ops ? o->ops : &fsops_posix;
	l->io = o->io;
	pthread_mutex_init(&l->lock, NULL);
	pthread_mutex_init(&l->root_mu, NULL);
	l->root = strdup(o->root);
	l->node = strdup(o->node);
	if (!l->root || !l->node) {
		rc = ipc_errf(err, -ENOMEM, "out of memory creating the local backend");
		goto fail;
	}
	rc = local_root_open(l, o->root, err);
	if (rc < 0)
		goto fail;
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
