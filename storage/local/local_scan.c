/*
 * local_scan: what the local backend finds by walking the tree (the layout
 * is in local.c): list_jobs, list_steps, remove (out of sight first), and
 * the clean-up that start-up and GC run, which on a shared root must tell
 * apart what is dead from another node's work in progress.
 *
 * Callers: store.c through the ops table (synchronous, on any worker
 * thread, several at once). Names read back are hostile: no link is
 * followed, no listing is unbounded. Agents of other nodes may be removing
 * the same leftovers at the same time: a name that vanishes under us is
 * gone, which is what we wanted.
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

#include "storage/local/local_int.h"

/* ---- walking ----------------------------------------------------------- */

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
	fd = local_open_dir(l, dirfd, name);
	if (fd < 0)
		return fd == -ENOENT ? 0 : fd;
	rc = local_list_dir(l, fd, &v, &n);
	if (rc == 0) {
		for (size_t i = 0; rc == 0 && i < n; i++)
			rc = rm_tree(l, fd, v[i], depth + 1);
		local_free_names(v, n);
	}
	close(fd);
	if (rc < 0)
		return rc == -ENOENT ? 0 : rc;
	rc = l->ops->unlinkat(dirfd, name, AT_REMOVEDIR);
	return rc == -ENOENT ? 0 : rc;
}

/* A step directory: whether it has a manifest, and a pin. */
static bool step_state_at(struct local *l, int jobfd, const char *sname, bool *pinned)
{
	int fd = local_open_dir(l, jobfd, sname);
	bool yes;

	*pinned = false;
	if (fd < 0)
		return false;
	yes = local_regular_at(fd, MANIFEST_NAME);
	if (yes)
		*pinned = local_regular_at(fd, PIN_NAME);
	close(fd);
	return yes;
}

/*
 * Whether directory `name` under dirfd holds `leaf` (a manifest, a pin).
 * Unsure (an error other than "not there") counts as yes: what it keeps
 * is kept.
 */
static bool holds(struct local *l, int dirfd, const char *name, const char *leaf)
{
	int fd = local_open_dir(l, dirfd, name);
	bool yes = fd == -ENOENT ? false : fd < 0 || local_maybe_regular_at(fd, leaf);

	if (fd >= 0)
		close(fd);
	return yes;
}

static int cmp_step(const void *a, const void *b)
{
	const struct storage_step *x = a, *y = b;

	return x->step < y->step ? -1 : x->step > y->step;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* ---- listing ----------------------------------------------------------- */

/* *jobs: malloc'd array of malloc'd names, sorted (free each, then the array). */
int local_list_jobs(struct storage *s, char ***jobs, size_t *n, char *err)
{
	struct local *l = to_local(s);
	char **v;
	size_t cnt, k = 0;
	int rc = local_list_dir(l, l->rootfd, &v, &cnt);

	*jobs = NULL;
	*n = 0;
	if (rc < 0)
		return ipc_errf(err, rc, "cannot list %s: %s", l->root, strerror(-rc));
	for (size_t i = 0; i < cnt; i++) {
		if (ipc_check_job(v[i], NULL) == 0 && local_dir_at(l->rootfd, v[i]))
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
int local_list_steps(struct storage *s, const char *job, struct storage_step **steps, size_t *n,
                     char *err)
{
	struct local *l = to_local(s);
	struct storage_step *v = NULL;
	char p[PATH_MAX], **names;
	size_t cnt, k = 0;
	int jobfd, rc;

	*steps = NULL;
	*n = 0;
	if ((rc = ipc_check_job(job, err)))
		return rc;
	rc = jobfd = local_open_job(l, job, err);
	if (rc < 0)
		return rc;
	rc = local_list_dir(l, jobfd, &names, &cnt);
	if (rc < 0) {
		close(jobfd);
		return ipc_errf(err, rc, "cannot list %s: %s",
		                local_path_of(l, p, sizeof(p), job, -1, NULL), strerror(-rc));
	}
	if (cnt && !(v = calloc(cnt, sizeof(*v)))) {
		local_free_names(names, cnt);
		close(jobfd);
		return ipc_errf(err, -ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < cnt; i++) {
		int64_t step;

		if (!local_parse_step_name(names[i], &step) || !local_dir_at(jobfd, names[i]))
			continue; /* not ours: junk, a link, a file */
		v[k].step = step;
		v[k].committed = step_state_at(l, jobfd, names[i], &v[k].pinned);
		k++;
	}
	local_free_names(names, cnt);
	close(jobfd);
	if (k)
		qsort(v, k, sizeof(*v), cmp_step);
	else {
		free(v);
		v = NULL;
	}
	*steps = v;
	*n = k;
	return 0;
}

/* ---- removal ----------------------------------------------------------- */

/*
 * A step that went out of sight and must come back (a late commit landed in
 * it, a pin on another node): under its name again, whole. If something
 * made the name anew meanwhile (a late writer's part), that goes out of
 * sight instead: the step that comes back is the one the manifest names.
 */
static int put_back(struct local *l, int jobfd, const char *trash, const char *sname,
                    const char *path, const char *why, char *err)
{
	char late[LOCAL_NAME_MAX + IPC_MAX_JOB + 64];
	int rc = local_rename_noreplace(l, jobfd, trash, sname);

	for (int i = 0; rc == -EEXIST && i < 3; i++) {
		snprintf(late, sizeof(late), "%s.late%d", trash, i);
		rc = local_rename_noreplace(l, jobfd, sname, late);
		if (rc == 0) {
			rm_tree(l, jobfd, late, 0);
			rc = local_rename_noreplace(l, jobfd, trash, sname);
		} else if (rc == -ENOENT) {
			rc = local_rename_noreplace(l, jobfd, trash, sname); /* gone meanwhile */
		}
	}
	if (rc == 0)
		rc = l->ops->fsync(jobfd);
	if (rc < 0)
		return ipc_errf(err, rc == -EEXIST ? -EIO : rc,
		                "%s %s as it was being removed, and cannot go back under its name: "
		                "%s; it is whole in %.*s/%s: move it back by hand",
		                path, why, strerror(-rc), (int)(strrchr(path, '/') - path), path,
		                trash);
	return 0;
}

/*
 * One rename takes the whole step out of sight at once; the name carries
 * the node and the process, so that agents sharing the root never collide.
 * The step is touched first, so that its trash looks fresh to other nodes'
 * clean-ups (which delete others' trash only once old): it may yet go back.
 * keep: TRASH_UNLESS_COMMITTED (the clean-up of an abandoned step: a late
 * commit may land as we look), TRASH_UNLESS_PINNED (a removal: another
 * node's agent may have pinned it); once out of sight, a step that is so
 * goes back, and -EEXIST or -EBUSY says why.
 */
enum { TRASH_UNLESS_COMMITTED = 1, TRASH_UNLESS_PINNED = 2 };

static int to_trash(struct local *l, int jobfd, const char *sname, const char *path, int keep,
                    char *err)
{
	char trash[LOCAL_NAME_MAX + IPC_MAX_JOB + 64];
	uint64_t seq;
	int rc;

	pthread_mutex_lock(&l->lock);
	seq = ++l->trash_seq;
	pthread_mutex_unlock(&l->lock);
	snprintf(trash, sizeof(trash), "%s%s.%s.%d.%" PRIu64, TRASH_PREFIX, sname, l->node,
	         (int)getpid(), seq);
	utimensat(jobfd, sname, NULL, AT_SYMLINK_NOFOLLOW); /* best effort: see above */
	rc = l->ops->renameat(jobfd, sname, jobfd, trash);
	if (rc < 0)
		return ipc_errf(err, rc, "cannot remove %s (rename failed): %s", path,
		                strerror(-rc));
	/*
	 * Durably out of sight: without this fsync a crash during the
	 * deletion below could bring the step back under its name with part
	 * of its files gone, a manifest naming shards that are not there.
	 */
	rc = l->ops->fsync(jobfd);
	if (rc < 0)
		return ipc_errf(err, rc, "fsync of the directory of %s failed: %s: check the disk",
		                path, strerror(-rc));
	if ((keep & TRASH_UNLESS_COMMITTED) && holds(l, jobfd, trash, MANIFEST_NAME))
		return put_back(l, jobfd, trash, sname, path, "was committed", err) ?: -EEXIST;
	if ((keep & TRASH_UNLESS_PINNED) && holds(l, jobfd, trash, PIN_NAME)) {
		rc = put_back(l, jobfd, trash, sname, path, "was pinned", err);
		return rc
		           ?: ipc_errf(err, -EBUSY,
		                       "%s is pinned (perhaps through another node's "
		                       "agent): unpin it first",
		                       path);
	}
	rc = rm_tree(l, jobfd, trash, 0);
	if (rc < 0)
		ipc_errf(err, rc,
		         "%s is out of sight, but deleting its files failed: %s; a later clean-up "
		         "deletes them",
		         path, strerror(-rc));
	return rc;
}

int local_remove(struct storage *s, const char *job, int64_t step, char *err)
{
	struct local *l = to_local(s);
	char sn[32], p[PATH_MAX];
	int jobfd, stepfd, rc;

	rc = local_open_job_step(l, job, step, &jobfd, &stepfd, err);
	if (rc < 0)
		return rc;
	close(stepfd);
	local_step_name(step, sn, sizeof(sn));
	rc = to_trash(l, jobfd, sn, local_path_of(l, p, sizeof(p), job, step, NULL),
	              TRASH_UNLESS_PINNED, err);
	close(jobfd);
	return rc;
}

int local_step_tidy(struct storage *s, const char *job, int64_t step, char *err)
{
	struct local *l = to_local(s);
	char sn[32];
	int jobfd, stepfd, rc;

	rc = local_open_job_step(l, job, step, &jobfd, &stepfd, err);
	if (rc < 0)
		return rc == -ENOENT ? 0 : rc;
	/* Not empty (another node's files, a manifest): rmdir says so and nothing goes. */
	l->ops->unlinkat(stepfd, PARTS_DIR, AT_REMOVEDIR);
	close(stepfd);
	local_step_name(step, sn, sizeof(sn));
	rc = l->ops->unlinkat(jobfd, sn, AT_REMOVEDIR);
	close(jobfd);
	return rc == -ENOTEMPTY || rc == -EEXIST || rc == -ENOENT ? 0 : rc;
}

/* ---- clean-up ---------------------------------------------------------- */

/* One pass over a directory's entries: what is old, what is ours. */
struct scan {
	struct local *l;
	const struct storage_cleanup *pol;
	struct storage_recovery *rec;
	int64_t now; /* on the storage's clock (unix seconds) */
	int64_t newest; /* the newest mtime seen */
};

/*
 * "Now" on the clock that stamps the files' mtimes: a shared filesystem's
 * server may be set apart from this machine (or this machine from the
 * others), and ages measured across two clocks would call another node's
 * fresh files old. A file made here and looked at says the storage's time;
 * if that fails, the caller's clock.
 */
static int64_t storage_now(struct local *l, int jobfd, int64_t fallback)
{
	char name[LOCAL_NAME_MAX];
	struct stat st;
	int fd;

	local_tmp_name(l, "clock", name, sizeof(name));
	fd = local_open_regular(l, jobfd, name, O_WRONLY | O_CREAT | O_EXCL, 0600, &st);
	if (fd < 0)
		return fallback;
	close(fd);
	l->ops->unlinkat(jobfd, name, 0);
	return (int64_t)st.st_mtime;
}

static bool old(const struct scan *c, int64_t mtime)
{
	return c->now - mtime > c->pol->abandon_after_s;
}

/* An entry's mtime; one that cannot be read counts as new (it is kept). */
static int64_t mtime_at(const struct scan *c, int fd, const char *name)
{
	struct stat st;

	return fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 ? (int64_t)st.st_mtime : c->now;
}

/*
 * Temporary files in a directory: this node's at start-up (nothing of ours
 * is being written), anyone's once old (its writer died long ago).
 */
static void drop_tmp(struct scan *c, int fd, char **v, size_t n)
{
	bool own;

	for (size_t i = 0; i < n; i++) {
		int64_t t = mtime_at(c, fd, v[i]);

		c->newest = t > c->newest ? t : c->newest;
		if (!v[i][0] || !local_is_tmp(c->l, v[i], &own) || !local_regular_at(fd, v[i]))
			continue;
		if ((own && c->pol->at_start) || old(c, t)) {
			if (c->l->ops->unlinkat(fd, v[i], 0) == 0)
				c->rec->temp_removed++;
			v[i][0] = '\0'; /* gone: no longer an entry */
		}
	}
}

/* Entries left that are neither empty nor gone. */
static size_t left(char **v, size_t n)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++)
		k += v[i][0] != '\0';
	return k;
}

/*
 * At start-up, this node's shard files in a step where it wrote no part:
 * their saves died with the agent, and a part that never was cannot have
 * been merged, so nothing names them. (With a part of ours there, its files
 * stay: a commit may be using it; older attempts' go with the step.)
 */
static void drop_own_shards(struct scan *c, int stepfd, char **v, size_t n)
{
	char part[IPC_MAX_JOB + 16];
	int pfd;

	if (!c->pol->at_start)
		return;
	snprintf(part, sizeof(part), "%s.json", c->l->node);
	/* Unsure whether we wrote a part (an error but "not there"): they stay. */
	pfd = local_open_dir(c->l, stepfd, PARTS_DIR);
	if (pfd < 0 && pfd != -ENOENT)
		return;
	if (pfd >= 0) {
		bool mine = local_maybe_regular_at(pfd, part);

		close(pfd);
		if (mine)
			return;
	}
	for (size_t i = 0; i < n; i++)
		if (v[i][0] && shard_file_of_node(v[i], c->l->node) &&
		    local_regular_at(stepfd, v[i]) && c->l->ops->unlinkat(stepfd, v[i], 0) == 0) {
			c->rec->own_removed++;
			v[i][0] = '\0';
		}
}

/* parts/: its temporary files; whether anything else is in it. */
static bool scan_parts(struct scan *c, int stepfd)
{
	char **v;
	size_t n;
	bool rest;
	int fd = local_open_dir(c->l, stepfd, PARTS_DIR);

	if (fd < 0)
		return false;
	if (local_list_dir(c->l, fd, &v, &n) < 0) {
		close(fd);
		return true; /* unreadable: leave it be */
	}
	drop_tmp(c, fd, v, n);
	rest = left(v, n) > 0;
	local_free_names(v, n);
	close(fd);
	return rest;
}

static int cleanup_step(struct scan *c, int jobfd, const char *sname, int64_t step, int64_t latest,
                        const char *path, char *err)
{
	int fd = local_open_dir(c->l, jobfd, sname);
	bool committed, parts;
	char **v;
	size_t n;
	int rc;

	if (fd < 0)
		return fd == -ENOENT ? 0
		                     : ipc_errf(err, fd, "cannot open %s: %s", path, strerror(-fd));
	committed = local_maybe_regular_at(fd, MANIFEST_NAME); /* unsure: it is */
	if (committed && !c->pol->at_start) { /* a checkpoint: nothing to do while running */
		close(fd);
		return 0;
	}
	rc = local_list_dir(c->l, fd, &v, &n);
	if (rc < 0) {
		close(fd);
		return ipc_errf(err, rc, "cannot list %s: %s", path, strerror(-rc));
	}
	c->newest = mtime_at(c, jobfd, sname);
	drop_tmp(c, fd, v, n);
	parts = scan_parts(c, fd);
	if (!committed)
		drop_own_shards(c, fd, v, n);
	local_free_names(v, n);
	if (committed) {
		close(fd);
		return 0;
	}
	/*
	 * Abandoned: uncommitted, older than LATEST (a newer step committed, so
	 * this one's writers moved on), and untouched for abandon_after. Nothing
	 * else of another node's goes: it may still be saving or committing.
	 */
	if (latest >= 0 && step < latest && old(c, c->newest)) {
		close(fd);
		rc = to_trash(c->l, jobfd, sname, path, TRASH_UNLESS_COMMITTED, err);
		if (rc == 0)
			c->rec->partial_removed++;
		else if (rc == -EEXIST)
			c->rec->partial_kept++; /* committed as we looked: a checkpoint */
		return rc == -ENOENT || rc == -EEXIST ? 0 : rc;
	}
	/* Left empty (our own files gone): the directory goes too. */
	rc = local_list_dir(c->l, fd, &v, &n);
	if (rc == 0 && (n == 0 || (n == 1 && strcmp(v[0], PARTS_DIR) == 0 && !parts))) {
		if (n == 1)
			c->l->ops->unlinkat(fd, PARTS_DIR, AT_REMOVEDIR);
		if (c->l->ops->unlinkat(jobfd, sname, AT_REMOVEDIR) == 0) {
			c->rec->partial_removed++;
			local_free_names(v, n);
			close(fd);
			return 0;
		}
	}
	if (rc == 0)
		local_free_names(v, n);
	c->rec->partial_kept++;
	close(fd);
	return 0;
}

/* Whether a trash name (".trash.<step>.<node>.<pid>.<seq>") is this node's. */
static bool trash_of(const struct local *l, const char *name)
{
	const char *p = name + strlen(TRASH_PREFIX), *end = name + strlen(name);
	size_t k = strlen(l->node);
	int64_t step;
	char sn[32];

	/* back over ".<seq>" and ".<pid>": digits both */
	for (int dots = 0; dots < 2; dots++) {
		const char *q = end;

		while (q > p && q[-1] >= '0' && q[-1] <= '9')
			q--;
		if (q == end || q == p || q[-1] != '.')
			return false;
		end = q - 1;
	}
	if (strlen(p) < 18 || p[17] != '.')
		return false;
	snprintf(sn, sizeof(sn), "%.17s", p);
	return local_parse_step_name(sn, &step) && (size_t)(end - (p + 18)) == k &&
	       strncmp(p + 18, l->node, k) == 0;
}

/* One entry of a job directory. */
static int cleanup_entry(struct scan *c, int jobfd, const char *job, const char *name,
                         int64_t latest, char *err)
{
	char p[PATH_MAX];
	int64_t step;
	bool own;
	int rc;

	snprintf(p, sizeof(p), "%s/%s/%s", c->l->root, job, name);
	if (local_parse_step_name(name, &step))
		return local_dir_at(jobfd, name)
		           ? cleanup_step(c, jobfd, name, step, latest, p, err)
		           : 0;
	if (strncmp(name, TRASH_PREFIX, strlen(TRASH_PREFIX)) == 0) {
		/*
		 * Out of sight already: a removal a crash interrupted. Ours at
		 * start-up (no removal of ours is running); anyone's once old: a
		 * removal may be deleting it right now, or about to put it back.
		 */
		if (!(c->pol->at_start && trash_of(c->l, name)) &&
		    !old(c, mtime_at(c, jobfd, name)))
			return 0;
		/* a pinned step that could not go back (said when it failed): never deleted */
		if (holds(c->l, jobfd, name, PIN_NAME))
			return ipc_errf(err, -EBUSY,
			                "%s holds a pinned checkpoint: move it back "
			                "under its step name by hand",
			                p);
		rc = rm_tree(c->l, jobfd, name, 0);
		if (rc == 0)
			c->rec->temp_removed++;
		return rc < 0 ? ipc_errf(err, rc, "cannot remove %s: %s", p, strerror(-rc)) : 0;
	}
	if (local_is_tmp(c->l, name, &own)) {
		char copy[NAME_MAX + 1], *one[1] = {copy};

		snprintf(copy, sizeof(copy), "%s", name);
		drop_tmp(c, jobfd, one, 1);
		return 0;
	}
	if (strcmp(name, "plans") == 0 && local_dir_at(jobfd, name)) {
		int fd = local_open_dir(c->l, jobfd, name);
		char **v;
		size_t n;

		if (fd >= 0 && local_list_dir(c->l, fd, &v, &n) == 0) {
			drop_tmp(c, fd, v, n);
			local_free_names(v, n);
		}
		if (fd >= 0)
			close(fd);
	}
	return 0;
}

int local_cleanup(struct storage *s, const char *job, int64_t latest,
                  const struct storage_cleanup *pol, struct storage_recovery *rec, char *err)
{
	struct local *l = to_local(s);
	struct scan c = {l, pol, rec, pol->now_unix_s, 0};
	char why[IPC_ERRLEN];
	int jobfd, rc, first = 0;
	char **v;
	size_t n;

	if ((rc = ipc_check_job(job, err)))
		return rc;
	rc = jobfd = local_open_job(l, job, err);
	if (rc < 0)
		return rc;
	c.now = storage_now(l, jobfd, pol->now_unix_s);
	rc = local_list_dir(l, jobfd, &v, &n);
	if (rc < 0) {
		close(jobfd);
		return ipc_errf(err, rc, "cannot list %s/%s: %s", l->root, job, strerror(-rc));
	}
	/* Keeps going past an error: one bad entry must not block the rest. */
	for (size_t i = 0; i < n; i++) {
		rc = cleanup_entry(&c, jobfd, job, v[i], latest, first ? why : err);
		if (rc < 0 && !first)
			first = rc;
	}
	local_free_names(v, n);
	close(jobfd);
	return first;
}
