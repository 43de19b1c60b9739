/*
 * local: the local-filesystem backend (DESIGN.md §4.3).
 *
 *   <root>/<job>/step-<12 digits>/rank-<5 digits>.safetensors
 *   <root>/<job>/step-<12 digits>/manifest.json     written last: the commit
 *   <root>/<job>/LATEST                              "<step>\n", newest committed
 *   <root>/<job>/step-<12 digits>/pinned             empty; present: kept by retention
 *
 * Callers: the agent's workers (create, open, commit, list, remove, recover:
 * synchronous, on their own thread, several at once); shard writes, reads and
 * finish complete on the I/O engine's thread. One mutex orders the
 * read-modify-write of LATEST between concurrent commits and removals.
 *
 * Map of the backend (local.h: what the three files share):
 *   local.c        the backend object (local_create, local_direct, the ops
 *                  table); helpers: names, paths, directories, small files;
 *                  shards: create (directories made durable as they appear),
 *                  write, finish (exact size, fsync), open, read
 *   local_commit.c commit: manifest to a temporary name, fsync, rename, fsync
 *                  the directories; then LATEST the same way; undone on
 *                  failure; get/set_latest; set_pinned; remove (out of
 *                  sight first)
 *   local_scan.c   walking directories; read_manifest, list_jobs,
 *                  list_steps; recover (start-up)
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

#include "local.h"

struct storage_shard {
	struct local *l;
	int fd;
	uint64_t size;
};

static const struct storage_ops local_ops;

/* ---- helpers ---------------------------------------------------------- */

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

/* "<root>/<job>[/step-...][/leaf]" for messages. */
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

int local_check_job_step(const char *job, int64_t step, char *err)
{
	int rc = ipc_check_job(job, err);

	return rc ? rc : ipc_check_step(step, err);
}

/* A directory under dirfd, never through a symlink. */
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

int local_open_step(struct local *l, int jobfd, const char *job, int64_t step, char *err)
{
	char sn[32], p[PATH_MAX];
	int fd;

	local_step_name(step, sn, sizeof(sn));
	fd = local_open_dir(l, jobfd, sn);
	if (fd == -ENOENT)
		return ipc_errf(err, fd, "no checkpoint of job '%s' at step %" PRId64 " (%s)", job,
		                step, local_path_of(l, p, sizeof(p), job, step, NULL));
	return fd < 0 ? dir_error(fd, local_path_of(l, p, sizeof(p), job, step, NULL), err) : fd;
}

int local_open_job_step(struct local *l, const char *job, int64_t step, int *jobfd, int *stepfd,
                        char *err)
{
	int rc;

	*jobfd = *stepfd = -1;
	if ((rc = local_check_job_step(job, step, err)))
		return rc;
	rc = *jobfd = local_open_job(l, job, err);
	if (rc < 0) {
		*jobfd = -1;
		return rc;
	}
	rc = *stepfd = local_open_step(l, *jobfd, job, step, err);
	if (rc < 0) {
		*stepfd = -1;
		local_close_fd(jobfd);
		return rc;
	}
	return 0;
}

/*
 * Makes (if needed) and opens directory `name` under dirfd. durable: a new
 * entry is made durable at once by fsyncing dirfd. A job directory needs it:
 * no commit ever fsyncs the root, so without it a crash could lose the job
 * and every checkpoint committed in it. A step directory does not: the
 * commit fsyncs the job directory before the manifest can be seen, and a
 * step directory lost before that was not a checkpoint (and the fsync would
 * sit in every save's stall, before the first byte is copied).
 */
static int make_dir(struct local *l, int dirfd, const char *name, const char *path, bool durable,
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

/*
 * Opens a regular file: O_NONBLOCK so that a FIFO planted under the name
 * cannot hang us, cleared again once fstat shows a regular file (io_uring
 * would answer -EAGAIN on a non-blocking file instead of waiting).
 */
int local_open_regular(struct local *l, int dirfd, const char *name, int flags, mode_t mode,
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

static int check_shard_args(const char *job, int64_t step, int rank, char *err)
{
	int rc = local_check_job_step(job, step, err);

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
		return local_open_regular(l, stepfd, name, flags, 0644, st);
	fd = local_open_regular(l, stepfd, name, flags | O_DIRECT, 0644, st);
	if (fd != -EINVAL)
		return fd;
	/* EINVAL is also "not a regular file": O_DIRECT is to blame only if this works. */
	fd = local_open_regular(l, stepfd, name, flags, 0644, st);
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
	local_step_name(step, sn, sizeof(sn));
	manifest_rank_file(rank, fname, sizeof(fname));
	rc = jobfd = make_dir(l, l->rootfd, job, local_path_of(l, p, sizeof(p), job, -1, NULL),
			      true, err);
	if (rc < 0)
		goto out;
	rc = stepfd = make_dir(l, jobfd, sn, local_path_of(l, p, sizeof(p), job, step, NULL), false,
			       err);
	if (rc < 0)
		goto out;
	local_path_of(l, p, sizeof(p), job, step, fname);
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
		local_close_fd(&fd);
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
	local_close_fd(&stepfd);
	local_close_fd(&jobfd);
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
	local_path_of(l, p, sizeof(p), job, step, fname);
	rc = local_open_job_step(l, job, step, &jobfd, &stepfd, err);
	if (rc < 0)
		return rc;
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
	local_close_fd(&stepfd);
	local_close_fd(&jobfd);
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
	local_close_fd(&sh->fd);
	free(sh);
}

static void local_shard_path(struct storage *s, const char *job, int64_t step, int rank, char *buf,
                             size_t len)
{
	char fname[32];

	manifest_rank_file(rank, fname, sizeof(fname));
	local_path_of(to_local(s), buf, len, job, step, fname);
}

/* ---- the backend ------------------------------------------------------ */

static void local_destroy(struct storage *s)
{
	struct local *l = to_local(s);

	if (!l)
		return;
	local_close_fd(&l->rootfd);
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
    .set_pinned = local_set_pinned,
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
