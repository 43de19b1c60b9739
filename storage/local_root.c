/*
 * local_root: the local backend's root directory and this node's lock in
 * it, at start (local_create): the root made if missing (each new
 * directory durable), opened, and ".node.<node>.lock" taken in it, naming
 * this process (pidlock.c) for the message of an agent refused later.
 * Start-up's thread; nothing here runs after local_create.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "local.h"

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
	int rc;

	rc = make_root(l, root, err);
	if (rc < 0)
		return rc;
	rc = l->rootfd = l->ops->openat(AT_FDCWD, root, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	if (rc < 0) {
		l->rootfd = -1;
		return ipc_errf(err, rc, "cannot open the storage root %s: %s", root, strerror(-rc));
	}
	return lock_node_at(l, l->rootfd, &l->nodefd, err);
}
