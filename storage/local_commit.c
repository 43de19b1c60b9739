/*
 * local_commit: what the local backend makes visible or takes out of sight
 * (the layout is in local.c): commit (the manifest, then LATEST: each
 * written to a temporary name, fsync'd, renamed, its directory fsync'd;
 * undone on failure), get/set_latest, set_pinned (a marker file, made
 * durable), remove (out of sight first).
 *
 * Callers: the agent's workers through the ops table (commit, get/set_latest,
 * set_pinned, remove: synchronous, on their own thread, several at once), and
 * local_scan.c's recover() for LATEST. l->lock orders every read-modify-write
 * of LATEST.
 */
#define _GNU_SOURCE
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

#include "local.h"

/* ---- small files and LATEST ------------------------------------------- */

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
	int fd = local_open_regular(l, dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644, &st);
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
int local_latest_read(struct local *l, int jobfd, int64_t *step)
{
	char *buf = NULL;
	size_t len, i;
	int64_t v = 0;
	int rc = local_read_small(l, jobfd, LATEST_NAME, LATEST_MAX, &buf, &len);

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
int local_latest_write(struct local *l, int jobfd, const char *job, int64_t step, bool *renamed,
                       char *err)
{
	char text[32], p[PATH_MAX];
	int n = snprintf(text, sizeof(text), "%" PRId64 "\n", step);
	int rc;

	*renamed = false;
	rc = write_tmp(l, jobfd, LATEST_TMP, text, (size_t)n,
	               local_path_of(l, p, sizeof(p), job, -1, LATEST_TMP), err);
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
		                local_path_of(l, p, sizeof(p), job, -1, NULL), strerror(-rc));
	return 0;
}

/* Removes LATEST, durably: else it could come back after a crash. */
int local_latest_remove(struct local *l, int jobfd, const char *job, char *err)
{
	char p[PATH_MAX];
	int rc = l->ops->unlinkat(jobfd, LATEST_NAME, 0);

	local_path_of(l, p, sizeof(p), job, -1, LATEST_NAME);
	if (rc == -ENOENT)
		return 0;
	if (rc == 0)
		rc = l->ops->fsync(jobfd);
	return rc < 0 ? ipc_errf(err, rc, "removing %s failed: %s", p, strerror(-rc)) : 0;
}

int local_get_latest(struct storage *s, const char *job, int64_t *step, char *err)
{
	struct local *l = to_local(s);
	char p[PATH_MAX];
	int jobfd, rc;

	if ((rc = ipc_check_job(job, err)))
		return rc;
	rc = jobfd = local_open_job(l, job, err);
	if (rc < 0)
		return rc;
	local_path_of(l, p, sizeof(p), job, -1, LATEST_NAME);
	rc = local_latest_read(l, jobfd, step);
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

int local_set_latest(struct storage *s, const char *job, int64_t step, char *err)
{
	struct local *l = to_local(s);
	bool renamed;
	int jobfd, rc;

	if ((rc = ipc_check_job(job, err)) || (step >= 0 && (rc = ipc_check_step(step, err))))
		return rc;
	rc = jobfd = local_open_job(l, job, err);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&l->lock);
	if (step < 0)
		rc = local_latest_remove(l, jobfd, job, err);
	else
		rc = local_latest_write(l, jobfd, job, step, &renamed, err);
	pthread_mutex_unlock(&l->lock);
	close(jobfd);
	return rc;
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
		local_path_of(l, p, sizeof(p), m->job, m->step, want);
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
	local_path_of(l, tmp, sizeof(tmp), m->job, m->step, MANIFEST_TMP);
	local_path_of(l, dir, sizeof(dir), m->job, m->step, NULL);
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
		                local_path_of(l, dir, sizeof(dir), m->job, -1, NULL),
		                strerror(-rc));
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
 * 7-10. LATEST, the same way (local_latest_write), and only forward: an older
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
	had = local_latest_read(l, jobfd, &cur);
	if (had == 0 && cur >= m->step) {
		pthread_mutex_unlock(&l->lock);
		return 0;
	}
	rc = local_latest_write(l, jobfd, m->job, m->step, &renamed, err);
	if (rc < 0 && renamed) {
		if (had == 0)
			local_latest_write(l, jobfd, m->job, cur, &again, ignored);
		else
			local_latest_remove(l, jobfd, m->job, ignored);
	}
	pthread_mutex_unlock(&l->lock);
	return rc;
}

int local_commit(struct storage *s, const struct manifest *m, char *err)
{
	struct local *l = to_local(s);
	int jobfd = -1, stepfd = -1, rc;
	char *json = NULL, p[PATH_MAX];
	bool visible = false;
	struct stat st;
	size_t len = 0;

	if (!m)
		return ipc_errf(err, -EINVAL, "no manifest to commit");
	rc = local_open_job_step(l, m->job, m->step, &jobfd, &stepfd, err);
	if (rc < 0)
		return rc;
	if (fstatat(stepfd, MANIFEST_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		/* Replacing it would also make our undo delete a good checkpoint. */
		rc = ipc_errf(err, -EEXIST,
		              "job '%s' step %" PRId64
		              " is already committed (%s exists): delete it "
		              "first to save it again",
		              m->job, m->step,
		              local_path_of(l, p, sizeof(p), m->job, m->step, MANIFEST_NAME));
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
	local_close_fd(&stepfd);
	local_close_fd(&jobfd);
	return rc;
}

/* ---- pins ------------------------------------------------------------- */

/*
 * A pin is an empty regular file, PIN_NAME, in the step directory: it lives
 * and goes with the step (the rename that takes a step out of sight takes
 * its pin along) and needs no index of its own to keep in step. Pinning:
 * the file is created and fsync'd (its inode), then the step directory is
 * fsync'd (its entry); without the latter a crash could forget a pin the
 * operator was told about, and retention would then delete the checkpoint.
 * Unpinning: unlink, then the directory fsync'd, so that the answer given
 * is what a restart finds. A failed pin is undone (best effort): it was not
 * reported, so it must not appear after a restart either.
 */
int local_set_pinned(struct storage *s, const char *job, int64_t step, bool pinned, char *err)
{
	struct local *l = to_local(s);
	int jobfd, stepfd = -1, fd, rc;
	char p[PATH_MAX];
	struct stat st;

	rc = local_open_job_step(l, job, step, &jobfd, &stepfd, err);
	if (rc < 0)
		return rc;
	if (fstatat(stepfd, MANIFEST_NAME, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode)) {
		rc = ipc_errf(err, -ENOENT,
		              "job '%s' step %" PRId64 " is not committed: only a checkpoint can "
		              "be pinned",
		              job, step);
		goto out;
	}
	local_path_of(l, p, sizeof(p), job, step, PIN_NAME);
	if (pinned) {
		rc = fd = local_open_regular(l, stepfd, PIN_NAME, O_WRONLY | O_CREAT, 0644, &st);
		if (rc < 0) {
			ipc_errf(err, rc, "cannot create %s: %s%s", p, strerror(-rc),
			         rc == -ELOOP || rc == -EINVAL
			             ? " (a link or not a regular file is "
			               "in the way: remove it)"
			             : "");
			goto out;
		}
		rc = l->ops->fsync(fd);
		close(fd);
		if (rc < 0) {
			ipc_errf(err, rc, "fsync of %s failed: %s: check the disk", p,
			         strerror(-rc));
			goto undo;
		}
	} else {
		rc = l->ops->unlinkat(stepfd, PIN_NAME, 0);
		if (rc == -ENOENT) {
			rc = 0; /* not pinned: nothing to make durable */
			goto out;
		}
		if (rc < 0) {
			ipc_errf(err, rc, "cannot remove %s: %s", p, strerror(-rc));
			goto out;
		}
	}
	rc = l->ops->fsync(stepfd);
	if (rc < 0) {
		ipc_errf(err, rc, "fsync of %s failed: %s: check the disk",
		         local_path_of(l, p, sizeof(p), job, step, NULL), strerror(-rc));
		if (pinned)
			goto undo;
	}
	goto out;
undo:
	l->ops->unlinkat(stepfd, PIN_NAME, 0);
out:
	local_close_fd(&stepfd);
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
	rc = local_latest_read(l, jobfd, &cur);
	if (rc == 0 && cur == step) {
		rc = local_newest_committed(l, jobfd, step, &newest);
		if (rc == 0)
			rc = local_latest_write(l, jobfd, job, newest, &renamed, err);
		else if (rc == -ENOENT)
			rc = local_latest_remove(l, jobfd, job, err);
		else
			ipc_errf(err, rc, "cannot list the steps of job '%s': %s", job,
			         strerror(-rc));
	} else {
		rc = 0; /* not LATEST, or LATEST unreadable: recovery fixes that */
	}
	pthread_mutex_unlock(&l->lock);
	return rc;
}

int local_remove(struct storage *s, const char *job, int64_t step, char *err)
{
	struct local *l = to_local(s);
	char sn[32], trash[96], p[PATH_MAX];
	int jobfd, stepfd, rc;
	uint64_t seq;

	rc = local_open_job_step(l, job, step, &jobfd, &stepfd, err);
	if (rc < 0)
		return rc;
	close(stepfd);
	rc = repoint_latest(l, jobfd, job, step, err);
	if (rc < 0)
		goto out;
	pthread_mutex_lock(&l->lock);
	seq = ++l->trash_seq;
	pthread_mutex_unlock(&l->lock);
	local_step_name(step, sn, sizeof(sn));
	snprintf(trash, sizeof(trash), "%s%s.%d.%" PRIu64, TRASH_PREFIX, sn, (int)getpid(), seq);
	local_path_of(l, p, sizeof(p), job, step, NULL);
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
	rc = local_rm_tree(l, jobfd, trash, 0);
	if (rc < 0)
		ipc_errf(err, rc,
		         "%s is out of sight, but deleting its files failed: %s; the agent deletes "
		         "them at its next start",
		         p, strerror(-rc));
out:
	close(jobfd);
	return rc;
}
