/*
 * local_root: the local backend's root directory and this node's lock in
 * it, from start to the backend's end.
 *
 *   local_root_open   at start (local_create): the root made if missing
 *                     (each new directory durable), opened, and
 *                     ".node.<node>.lock" taken in it
 *   local_root_check  later, from the agent's root checks (one thread at a
 *                     time; root_mu): the root still there, the same
 *                     directory, writable, and the lock still ours; a root
 *                     made anew under the name is opened again
 *
 * Every other call of the backend goes through l->rootfd, on any thread,
 * at any time. It is never closed while the backend lives: a root opened
 * again replaces what the descriptor refers to with dup3, in one step, so
 * a call in flight sees the old directory or the new one, never a number
 * that is closed or reused.
 *
 * A root that disappears is not made again here (at start it is): an
 * empty directory under a mount point that went away is not the storage,
 * and checkpoints written there would be lost to the other nodes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/local/local_int.h"

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

static void lock_name(const struct local *l, char *buf, size_t len)
{
	snprintf(buf, len, ".node.%s.lock", l->node);
}

/*
 * One agent per node name on a root: a second would take the first's files
 * in flight for its own dead ones. ".node.<node>.lock" under dirfd, locked
 * and naming this process (pidlock_take) as long as the backend lives (a
 * killed agent's lock goes with it): *out its descriptor. Where the
 * filesystem has no locks, nothing is checked (the file is held all the
 * same). -EBUSY, saying which process holds it, if another does.
 */
static int lock_node_at(struct local *l, int dirfd, int *out, char *err)
{
	char name[IPC_MAX_JOB + 16], who[48] = "another ckptd";
	struct stat st;
	long holder;
	int fd, rc;

	lock_name(l, name, sizeof(name));
	/* O_RDWR: over NFS, flock is a POSIX lock, and an exclusive one needs a writer */
	fd = local_open_regular(l, dirfd, name, O_RDWR | O_CREAT, 0644, &st);
	if (fd < 0)
		return ipc_errf(err, fd, "cannot open %s/%s: %s", l->root, name, strerror(-fd));
	rc = pidlock_take(fd, &holder);
	if (rc == 0 || rc != -EBUSY) { /* ENOLCK, EOPNOTSUPP: no locks here */
		*out = fd;
		return 0;
	}
	close(fd);
	if (holder > 0)
		snprintf(who, sizeof(who), "ckptd pid %ld", holder);
	return ipc_errf(err, -EBUSY,
	                "node %s on %s is served by %s (lock %s/%s): another agent runs as node "
	                "%s there; each agent needs a node name of its own (--node)",
	                l->node, l->root, who, l->root, name, l->node);
}

int local_root_open(struct local *l, const char *root, char *err)
{
	struct stat st;
	int rc;

	rc = make_root(l, root, err);
	if (rc < 0)
		return rc;
	rc = l->rootfd = l->ops->openat(AT_FDCWD, root, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	if (rc < 0) {
		l->rootfd = -1;
		return ipc_errf(err, rc, "cannot open the storage root %s: %s", root,
		                strerror(-rc));
	}
	if (fstat(l->rootfd, &st) < 0)
		return ipc_errf(err, -errno, "cannot stat the storage root %s: %s", root,
		                strerror(errno));
	l->root_dev = st.st_dev;
	l->root_ino = st.st_ino;
	return lock_node_at(l, l->rootfd, &l->nodefd, err);
}

/* ---- checks, once it runs --------------------------------------------- */

/* Makes *fd refer to what nfd refers to, in one step (nfd is closed). */
static int replace_fd(int *fd, int nfd)
{
	int rc = dup3(nfd, *fd, O_CLOEXEC) < 0 ? -errno : 0;

	close(nfd);
	return rc;
}

/*
 * The root's name leads to another directory (removed and made again,
 * mounted anew): this node's lock there first, then the root's descriptor
 * moves to it. Nothing changes if the lock cannot be had.
 */
static int reopen(struct local *l, char *err)
{
	struct stat st;
	int fd, lock = -1, rc;

	fd = l->ops->openat(AT_FDCWD, l->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	if (fd < 0)
		return ipc_errf(err, fd, "cannot open the storage root %s again: %s", l->root,
		                strerror(-fd));
	rc = fstat(fd, &st) < 0 ? -errno : 0;
	if (!rc)
		rc = lock_node_at(l, fd, &lock, err);
	if (rc) {
		close(fd);
		return rc == -EBUSY ? rc : ipc_errf(err, rc, "%s: %s", l->root, strerror(-rc));
	}
	rc = replace_fd(&l->nodefd, lock);
	if (!rc)
		rc = replace_fd(&l->rootfd, fd);
	else
		close(fd);
	if (rc)
		return ipc_errf(err, rc, "cannot switch to the storage root %s made anew: %s",
		                l->root, strerror(-rc));
	l->root_dev = st.st_dev;
	l->root_ino = st.st_ino;
	return 0;
}

/* The lock file this node holds is still the one under its name in the root. */
static int check_lock(struct local *l, char *err)
{
	char name[IPC_MAX_JOB + 16];
	struct stat there, held;
	int lock = -1, rc;

	lock_name(l, name, sizeof(name));
	if (fstatat(l->rootfd, name, &there, AT_SYMLINK_NOFOLLOW) == 0 &&
	    fstat(l->nodefd, &held) == 0 && there.st_dev == held.st_dev &&
	    there.st_ino == held.st_ino)
		return 0;
	/* Removed (or replaced) under us: another agent of this name could take it now. */
	rc = lock_node_at(l, l->rootfd, &lock, err);
	if (!rc)
		rc = replace_fd(&l->nodefd, lock);
	return rc;
}

/* A file made and removed in the root: what a save does first, minus the bytes. */
static int probe_write(struct local *l, char *err)
{
	char name[160];
	int fd, rc;

	local_tmp_name(l, "root-probe", name, sizeof(name));
	fd = l->ops->openat(l->rootfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
	                    0600);
	if (fd < 0)
		return ipc_errf(
		    err, fd,
		    "storage root %s is not writable (creating a file in it: %s): saves "
		    "fail until it is; check its permissions, its mount and free space",
		    l->root, strerror(-fd));
	close(fd);
	rc = l->ops->unlinkat(l->rootfd, name, 0);
	if (rc < 0)
		return ipc_errf(err, rc, "storage root %s: removing %s: %s", l->root, name,
		                strerror(-rc));
	return 0;
}

int local_root_check(struct storage *s, bool *reopened, char *err)
{
	struct local *l = to_local(s);
	struct stat st;
	int rc = 0;

	*reopened = false;
	pthread_mutex_lock(&l->root_mu);
	if (stat(l->root, &st) < 0) {
		rc = -errno;
		if (rc == -ENOENT || rc == -ESTALE)
			ipc_errf(err, rc,
			         "storage root %s is missing (%s): saves fail until it is there "
			         "again (made anew or mounted); ckptd opens it again by itself",
			         l->root, strerror(-rc));
		else
			ipc_errf(err, rc, "cannot reach the storage root %s: %s", l->root,
			         strerror(-rc));
	} else if (!S_ISDIR(st.st_mode)) {
		rc = ipc_errf(err, -ENOTDIR,
		              "storage root %s is no longer a directory: move what is there out "
		              "of the way",
		              l->root);
	} else if (st.st_dev != l->root_dev || st.st_ino != l->root_ino) {
		rc = reopen(l, err);
		*reopened = rc == 0;
	}
	if (!rc)
		rc = check_lock(l, err);
	if (!rc)
		rc = probe_write(l, err);
	pthread_mutex_unlock(&l->root_mu);
	return rc;
}
