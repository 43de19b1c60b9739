/*
 * local_obj: the local backend's small objects (plans, parts, manifests,
 * LATEST, pins), by key: "<job>/step-<12d>/parts/<node>.json" is that path
 * under the root. Each component is checked (our characters, never a
 * leading '.', which is for temporary and removed things) and opened
 * without following links; directories are made as needed, each new one
 * durable in its parent.
 *
 * A put writes a temporary name (unique across nodes: it carries this
 * node's name and a random number), fsyncs it, makes it visible under the
 * key (create-once: link(), which fails if the name exists, on every POSIX
 * filesystem, NFS included; replace: rename()), and fsyncs the directory.
 * Readers therefore see the whole object or nothing, never a part of it.
 *
 * Callers: store.c through the ops table, on any worker thread.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/local/local_int.h"

#define KEY_DEPTH 4 /* <job>/step-<12d>/parts/<node>.json */

struct key {
	char c[KEY_DEPTH][LOCAL_NAME_MAX + 1];
	size_t n;
	char path[PATH_MAX]; /* "<root>/<key>", for messages */
};

/* A key into its components: 2..KEY_DEPTH of them, each a name of ours. */
static int split_key(const struct local *l, const char *key, struct key *k, char *err)
{
	const char *p = key;
	size_t len;

	k->n = 0;
	snprintf(k->path, sizeof(k->path), "%s/%.200s", l->root, key ? key : "");
	if (!key)
		return ipc_errf(err, -EINVAL, "no key");
	for (;;) {
		len = strcspn(p, "/");
		if (k->n == KEY_DEPTH || len == 0 || len > LOCAL_NAME_MAX || p[0] == '.' ||
		    strspn(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") <
		        len)
			return ipc_errf(err, -EINVAL, "'%.200s' is not a key of ours", key);
		memcpy(k->c[k->n], p, len);
		k->c[k->n++][len] = '\0';
		if (!p[len])
			break;
		p += len + 1;
	}
	if (k->n < 2 || ipc_check_job(k->c[0], NULL))
		return ipc_errf(err, -EINVAL, "'%.200s' is not a key of ours", key);
	return 0;
}

/* The directory holding the key's last component (made if `make`): its descriptor. */
static int open_parent(struct local *l, const struct key *k, size_t upto, bool make, char *err)
{
	char p[PATH_MAX];
	size_t o = (size_t)snprintf(p, sizeof(p), "%s", l->root);
	int fd = l->rootfd, next;

	for (size_t i = 0; i < upto; i++) {
		o += (size_t)snprintf(p + o, o < sizeof(p) ? sizeof(p) - o : 0, "/%s", k->c[i]);
		next = make ? local_make_dir(l, fd, k->c[i], p, true, err)
		            : local_open_dir(l, fd, k->c[i]);
		if (fd != l->rootfd)
			close(fd);
		if (next < 0)
			return make ? next : ipc_errf(err, next, "%s: %s", p, strerror(-next));
		fd = next;
	}
	return fd == l->rootfd ? l->ops->openat(l->rootfd, ".", DIR_FLAGS, 0) : fd;
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
 * The bytes under a temporary name, fsync'd: they must be on disk before a
 * link or rename can make them visible under the key, or a crash could
 * leave the key naming an empty or torn file.
 */
static int write_tmp(struct local *l, int dirfd, const char *tmp, const void *buf, size_t len,
                     const char *path, char *err)
{
	struct stat st;
	int fd = local_open_regular(l, dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL, 0644, &st);
	int rc;

	if (fd < 0)
		return ipc_errf(err, fd, "cannot create a temporary file for %s: %s", path,
		                strerror(-fd));
	rc = pwrite_all(l, fd, buf, len);
	if (rc < 0)
		ipc_errf(err, rc, "writing %s failed: %s%s", path, strerror(-rc),
		         rc == -ENOSPC ? ": the disk is full; free space or delete old checkpoints"
		                       : "");
	else if ((rc = l->ops->fsync(fd)) < 0)
		ipc_errf(err, rc, "fsync of %s failed: %s: check the disk", path, strerror(-rc));
	close(fd);
	if (rc < 0)
		l->ops->unlinkat(dirfd, tmp, 0);
	return rc;
}

/*
 * The directory we wrote into is still the one at the key's path: a
 * clean-up may have renamed it out of sight (to delete it) while we wrote.
 */
static int still_there(struct local *l, const struct key *k, int dirfd, char *err)
{
	struct stat a, b;
	char why[IPC_ERRLEN];
	int fd = open_parent(l, k, k->n - 1, false, why);
	int rc = fd < 0 ? fd : 0;

	if (fd >= 0) {
		if (fstat(dirfd, &a) < 0 || fstat(fd, &b) < 0 || a.st_dev != b.st_dev ||
		    a.st_ino != b.st_ino)
			rc = -ESTALE;
		close(fd);
	}
	if (rc == -ENOENT || rc == -ESTALE)
		return ipc_errf(err, -ESTALE,
		                "%s: its directory was taken out of sight (removed) while it was "
		                "written: it is not there",
		                k->path);
	return rc < 0 ? ipc_errf(err, rc, "%s", why) : 0;
}

/* Create-once: link, or where the filesystem has no links, rename that never replaces. */
static int publish_once(struct local *l, int dirfd, const char *tmp, const char *leaf)
{
	int rc = l->ops->linkat(dirfd, tmp, dirfd, leaf);

	if (rc == -EPERM || rc == -EOPNOTSUPP || rc == -ENOSYS || rc == -EMLINK) {
		rc = local_rename_noreplace(l, dirfd, tmp, leaf);
		if (rc == 0)
			return 0;
	}
	l->ops->unlinkat(dirfd, tmp, 0);
	return rc;
}

/* The key checked and its directory opened (made if `make`): its descriptor. */
static int open_key(struct local *l, const char *key, struct key *k, bool make, char *err)
{
	int rc = split_key(l, key, k, err);

	return rc ? rc : open_parent(l, k, k->n - 1, make, err);
}

int local_obj_put(struct storage *s, const char *key, const void *buf, size_t len,
                  enum obj_put_mode mode, char *err)
{
	struct local *l = to_local(s);
	char tmp[LOCAL_NAME_MAX + IPC_MAX_JOB + 40];
	const char *leaf;
	struct key k;
	int dirfd, rc;

	rc = dirfd = open_key(l, key, &k, !(mode & OBJ_IN_PLACE), err);
	if (rc < 0)
		return rc;
	leaf = k.c[k.n - 1];
	local_tmp_name(l, leaf, tmp, sizeof(tmp));
	rc = write_tmp(l, dirfd, tmp, buf, len, k.path, err);
	if (rc < 0)
		goto out;
	/* The object appears whole under its key, at once. */
	if (!(mode & OBJ_REPLACE)) {
		rc = publish_once(l, dirfd, tmp, leaf);
		if (rc == -EEXIST) {
			ipc_errf(err, rc, "%s exists already (written once)", k.path);
			goto out;
		}
	} else {
		rc = l->ops->renameat(dirfd, tmp, dirfd, leaf);
		if (rc < 0)
			l->ops->unlinkat(dirfd, tmp, 0);
	}
	if (rc < 0) {
		ipc_errf(err, rc, "cannot make %s visible: %s", k.path, strerror(-rc));
		goto out;
	}
	/*
	 * The directory: makes the new name durable. Without it a crash could
	 * lose the object after the caller was told it is there (a manifest
	 * lost after COMMITTED).
	 */
	rc = l->ops->fsync(dirfd);
	if (rc < 0)
		ipc_errf(err, rc, "fsync of the directory of %s failed: %s: check the disk", k.path,
		         strerror(-rc));
	else if (mode & OBJ_IN_PLACE)
		rc = still_there(l, &k, dirfd, err);
out:
	close(dirfd);
	return rc;
}

int local_obj_get(struct storage *s, const char *key, size_t max, char **buf, size_t *len,
                  char *err)
{
	struct local *l = to_local(s);
	struct key k;
	int dirfd, rc;

	*buf = NULL;
	*len = 0;
	rc = dirfd = open_key(l, key, &k, false, err);
	if (rc < 0)
		return rc == -ENOENT ? ipc_errf(err, rc, "%s does not exist", k.path) : rc;
	rc = local_read_small(l, dirfd, k.c[k.n - 1], max, buf, len);
	close(dirfd);
	if (rc == -ENOENT)
		return ipc_errf(err, rc, "%s does not exist", k.path);
	if (rc == -EFBIG)
		return ipc_errf(err, rc, "%s is larger than %zu bytes: not a file ckptd wrote",
		                k.path, max);
	if (rc == -ELOOP || rc == -EINVAL)
		return ipc_errf(err, rc,
		                "%s is not a regular file (a link?): ckptd does not "
		                "follow links",
		                k.path);
	if (rc < 0)
		return ipc_errf(err, rc, "cannot read %s: %s", k.path, strerror(-rc));
	return 0;
}

int local_obj_stat(struct storage *s, const char *key, uint64_t *size, char *err)
{
	struct local *l = to_local(s);
	struct stat st;
	struct key k;
	int dirfd, rc;

	rc = dirfd = open_key(l, key, &k, false, err);
	if (rc < 0)
		return rc;
	rc = fstatat(dirfd, k.c[k.n - 1], &st, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
	close(dirfd);
	if (rc == 0 && !S_ISREG(st.st_mode)) /* no object of ours, and in the way of one */
		return ipc_errf(err, -EINVAL,
		                "%s is not a regular file (a link, a directory, a FIFO?): not "
		                "written by ckptd; remove it",
		                k.path);
	if (rc)
		return ipc_errf(err, rc, "%s: %s", k.path, strerror(-rc));
	*size = (uint64_t)st.st_size;
	return 0;
}

int local_obj_delete(struct storage *s, const char *key, char *err)
{
	struct local *l = to_local(s);
	struct key k;
	int dirfd, rc;

	rc = dirfd = open_key(l, key, &k, false, err);
	if (rc < 0)
		return rc;
	rc = l->ops->unlinkat(dirfd, k.c[k.n - 1], 0);
	/* Durably gone: else it could come back after a crash (a pin, a LATEST). */
	if (rc == 0)
		rc = l->ops->fsync(dirfd);
	close(dirfd);
	if (rc < 0)
		return ipc_errf(err, rc, "cannot remove %s: %s", k.path, strerror(-rc));
	return 0;
}

/*
 * The directory's fsync once more, for an object a put made visible before
 * that fsync failed: until it succeeds, a crash may lose the name.
 */
int local_obj_sync(struct storage *s, const char *key, char *err)
{
	struct local *l = to_local(s);
	struct key k;
	int dirfd, rc;

	rc = dirfd = open_key(l, key, &k, false, err);
	if (rc < 0)
		return rc;
	rc = l->ops->fsync(dirfd);
	close(dirfd);
	if (rc < 0)
		return ipc_errf(err, rc, "fsync of the directory of %s failed: %s: check the disk",
		                k.path, strerror(-rc));
	return 0;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int local_obj_list(struct storage *s, const char *dir, char ***names, size_t *n, char *err)
{
	struct local *l = to_local(s);
	char **v = NULL;
	size_t cnt = 0, k2 = 0;
	struct key k;
	int fd, rc;

	*names = NULL;
	*n = 0;
	if (!dir || ipc_check_job(dir, NULL) == 0) {
		/* a job's own directory has keys of two levels: the split needs two */
		rc = -EINVAL;
	} else {
		rc = split_key(l, dir, &k, err);
	}
	if (rc)
		return ipc_errf(err, -EINVAL, "'%.200s' is not a directory key of ours",
		                dir ? dir : "");
	rc = fd = open_parent(l, &k, k.n, false, err);
	if (rc < 0)
		return rc;
	rc = local_list_dir(l, fd, &v, &cnt);
	if (rc == 0) {
		for (size_t i = 0; i < cnt; i++) {
			if (v[i][0] != '.' && local_regular_at(fd, v[i]))
				v[k2++] = v[i];
			else
				free(v[i]); /* temporary, or not an object */
		}
		if (k2)
			qsort(v, k2, sizeof(*v), cmp_name);
		else {
			free(v);
			v = NULL;
		}
		*names = v;
		*n = k2;
	}
	close(fd);
	return rc < 0 ? ipc_errf(err, rc, "cannot list %s: %s", k.path, strerror(-rc)) : 0;
}
