/*
 * local_scan: what the local backend finds on disk (the layout is in
 * local.c): walking directories (names, step directories, deleting a tree),
 * read_manifest, list_jobs, list_steps, and recover() at start-up, which
 * deletes partial steps and leftovers and puts LATEST right.
 *
 * Callers: the agent's workers through the ops table (synchronous, on their
 * own thread, several at once; recover() before any save starts), and
 * local_commit.c's remove (local_rm_tree, local_newest_committed). Names read back are
 * hostile: no link is followed, no listing is unbounded.
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

#include "local.h"

/* ---- walking directories ---------------------------------------------- */

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

/* Whether a regular file `name` is in directory fd (a link is not). */
static bool regular_at(int fd, const char *name)
{
	struct stat st;

	return fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

/* A step directory with a regular manifest.json in it; *pinned: and a pin marker. */
static bool step_state_at(struct local *l, int jobfd, const char *sname, bool *pinned)
{
	int fd = local_open_dir(l, jobfd, sname);
	bool yes;

	if (pinned)
		*pinned = false;
	if (fd < 0)
		return false;
	yes = regular_at(fd, MANIFEST_NAME);
	if (yes && pinned)
		*pinned = regular_at(fd, PIN_NAME);
	close(fd);
	return yes;
}

static bool committed_at(struct local *l, int jobfd, const char *sname)
{
	return step_state_at(l, jobfd, sname, NULL);
}

/*
 * Deletes name under dirfd and, if a directory, what it holds. Links are
 * removed, never followed; depth bounds what a hostile tree can make us do.
 */
int local_rm_tree(struct local *l, int dirfd, const char *name, int depth)
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
		return fd;
	rc = list_dir(l, fd, &v, &n);
	if (rc == 0) {
		for (size_t i = 0; rc == 0 && i < n; i++)
			rc = local_rm_tree(l, fd, v[i], depth + 1);
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
		v[k].committed = step_state_at(l, jobfd, names[i], &v[k].pinned);
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
int local_newest_committed(struct local *l, int jobfd, int64_t except, int64_t *step)
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

/* ---- reading ---------------------------------------------------------- */

int local_read_manifest(struct storage *s, const char *job, int64_t step, struct manifest **out,
                        char *err)
{
	struct local *l = to_local(s);
	char p[PATH_MAX], why[IPC_ERRLEN] = "";
	int jobfd = -1, stepfd = -1, rc;
	struct manifest *m = NULL;
	char *buf = NULL;
	size_t len = 0;

	*out = NULL;
	local_path_of(l, p, sizeof(p), job, step, MANIFEST_NAME);
	rc = local_open_job_step(l, job, step, &jobfd, &stepfd, err);
	if (rc < 0)
		return rc;
	rc = local_read_small(l, stepfd, MANIFEST_NAME, MANIFEST_MAX_BYTES, &buf, &len);
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
	local_close_fd(&stepfd);
	local_close_fd(&jobfd);
	return rc;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* *jobs: malloc'd array of malloc'd names, sorted (free each, then the array). */
int local_list_jobs(struct storage *s, char ***jobs, size_t *n, char *err)
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
int local_list_steps(struct storage *s, const char *job, struct storage_step **steps, size_t *n,
                     char *err)
{
	struct local *l = to_local(s);
	char p[PATH_MAX];
	int jobfd, rc;

	*steps = NULL;
	*n = 0;
	if ((rc = ipc_check_job(job, err)))
		return rc;
	rc = jobfd = local_open_job(l, job, err);
	if (rc < 0)
		return rc;
	rc = collect_steps(l, jobfd, steps, n);
	close(jobfd);
	if (rc < 0)
		return ipc_errf(err, rc, "cannot list %s: %s",
		                local_path_of(l, p, sizeof(p), job, -1, NULL), strerror(-rc));
	return 0;
}

/* ---- recovery --------------------------------------------------------- */

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
	rc = local_latest_read(l, jobfd, &cur);
	if (newest < 0 && rc != -ENOENT)
		rc = local_latest_remove(l, jobfd, job, err);
	else if (newest >= 0 && (rc != 0 || cur != newest))
		rc = local_latest_write(l, jobfd, job, newest, &renamed, err);
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
			int fd = local_open_dir(l, jobfd, name);

			if (step > *newest)
				*newest = step;
			/* A commit that died before its rename, with a manifest already there. */
			if (fd >= 0 && l->ops->unlinkat(fd, MANIFEST_TMP, 0) == 0)
				rec->temp_removed++;
			local_close_fd(&fd);
			return 0;
		}
		/* No manifest: a save that never committed. Not a checkpoint. */
		rc = local_rm_tree(l, jobfd, name, 0);
		if (rc == 0)
			rec->partial_removed++;
	} else if (is_leftover(name)) {
		/* A removal or a temporary file that a crash interrupted. */
		rc = local_rm_tree(l, jobfd, name, 0);
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

	rc = jobfd = local_open_job(l, job, err);
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

int local_recover(struct storage *s, struct storage_recovery *rec, char *err)
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
