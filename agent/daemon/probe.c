/*
 * probe: whether the paths a configuration names can be used by the user
 * running this process, before anything is served. ckptd --check-config
 * prints each finding; a start refuses (before READY) when the root cannot
 * be written, rather than failing the first save.
 *
 *   root (a directory)  there, or its nearest existing parent writable (the
 *                       agent makes it); a file can be made and removed in
 *                       it; O_DIRECT (else writes go through the page cache
 *                       and the log says so); free space; job directories
 *                       in it this user cannot write (a root first used by
 *                       another user)
 *   socket directory    there, or its nearest existing parent writable (the
 *                       agent makes it, parents too)
 *
 * An s3:// root is the backend's to check at start (it asks the store).
 * Main thread only, before any other thread exists.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ipc/base/log.h"
#include "agent/daemon/probe.h"

#define MAX_NAMED 5 /* unwritable job directories named, at most */

struct probe {
	bool start; /* at start-up: job directories only warned of */
	FILE *out; /* findings, or NULL */
	char *err; /* the first problem, IPC_ERRLEN bytes */
	int rc;
	char user[96];
};

__attribute__((format(printf, 2, 3))) static void said(struct probe *p, const char *fmt, ...)
{
	va_list ap;

	if (!p->out)
		return;
	fprintf(p->out, "; check: ");
	va_start(ap, fmt);
	vfprintf(p->out, fmt, ap);
	va_end(ap);
	fputc('\n', p->out);
}

__attribute__((format(printf, 3, 4))) static void problem(struct probe *p, int rc, const char *fmt,
                                                          ...)
{
	char msg[IPC_ERRLEN];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (!p->rc) {
		p->rc = rc;
		snprintf(p->err, IPC_ERRLEN, "%s", msg);
	}
	said(p, "PROBLEM: %s", msg);
}

/* The nearest existing directory at or above path, into buf. */
static void existing_parent(const char *path, char *buf, size_t len)
{
	struct stat st;
	char *slash;

	snprintf(buf, len, "%s", path);
	while (stat(buf, &st) != 0) {
		if ((slash = strrchr(buf, '/')) == NULL) { /* a relative path: its first part */
			snprintf(buf, len, ".");
			return;
		}
		if (slash == buf) {
			buf[1] = '\0';
			return;
		}
		*slash = '\0';
	}
}

/* May this process's user (its effective ids) write and search dir? */
static bool writable(const char *dir)
{
	return faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) == 0;
}

/* A directory that is not there: can this user make it (its nearest existing parent)? */
static bool can_make(struct probe *p, const char *what, const char *path)
{
	char parent[PATH_MAX];

	existing_parent(path, parent, sizeof(parent));
	if (writable(parent)) {
		said(p, "%s %s: not there; the agent makes it (in %s)", what, path, parent);
		return true;
	}
	problem(p, -EACCES,
	        "%s %s is not there, and %s may not make it: %s is not writable by it "
	        "(make it and chown it to %s first)",
	        what, path, p->user, parent, p->user);
	return false;
}

/* Job directories of the root this user cannot write. */
static void job_dirs(struct probe *p, const char *root)
{
	char names[MAX_NAMED * 66 + 8] = "", path[PATH_MAX];
	DIR *d = opendir(root);
	struct dirent *e;
	size_t o = 0;
	int n = 0;

	if (!d)
		return;
	while ((e = readdir(d)) != NULL) {
		struct stat st;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", root, e->d_name);
		if (lstat(path, &st) || !S_ISDIR(st.st_mode) || writable(path))
			continue;
		if (n < MAX_NAMED)
			o += (size_t)snprintf(names + o, sizeof(names) - o, "%s%.64s",
			                      n ? ", " : "", e->d_name);
		else if (n == MAX_NAMED)
			o += (size_t)snprintf(names + o, sizeof(names) - o, ", ...");
		n++;
	}
	closedir(d);
	if (n && p->start)
		log_msg(LOG_WARNING,
		        "root %s: %d job director%s %s may not write (%s): their saves will fail; "
		        "chown -R %s %s",
		        root, n, n == 1 ? "y" : "ies", p->user, names, p->user, root);
	else if (n)
		problem(p, -EACCES,
		        "root %s: %d job director%s %s may not write (%s): their saves would fail; "
		        "chown -R %s %s",
		        root, n, n == 1 ? "y" : "ies", p->user, names, p->user, root);
}

static void root_dir(struct probe *p, const char *root)
{
	char file[PATH_MAX];
	struct statvfs vs;
	struct stat st;
	int fd;

	if (stat(root, &st) != 0) {
		if (errno == ENOENT)
			can_make(p, "root", root);
		else
			problem(p, -errno, "root %s: %s (as %s)", root, strerror(errno), p->user);
		return;
	}
	if (!S_ISDIR(st.st_mode)) {
		problem(p, -ENOTDIR, "root %s is not a directory", root);
		return;
	}
	/* a name no other node's probe takes (nodes sharing a root may share pids) */
	snprintf(file, sizeof(file), "%s/.ckptd-probe.XXXXXX", root);
	fd = mkostemp(file, O_CLOEXEC);
	if (fd < 0 && (errno == EACCES || errno == EPERM || errno == EROFS)) {
		problem(p, -errno,
		        "root %s: %s cannot make a file in it (%s): chown %s %s (under systemd "
		        "also ReadWritePaths=)",
		        root, p->user, strerror(errno), p->user, root);
		return;
	}
	if (fd < 0) {
		problem(p, -errno, "root %s: making a file in it: %s", root, strerror(errno));
		return;
	}
	close(fd);
	fd = open(file, O_WRONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0)
		said(p, "root %s: no O_DIRECT here (%s): shards go through the page cache", root,
		     strerror(errno));
	else
		close(fd);
	unlink(file);
	if (statvfs(root, &vs) == 0)
		said(p, "root %s: writable by %s%s; %.1f GiB free of %.1f GiB", root, p->user,
		     fd >= 0 ? ", O_DIRECT" : "",
		     (double)vs.f_bavail * (double)vs.f_frsize / (1 << 30),
		     (double)vs.f_blocks * (double)vs.f_frsize / (1 << 30));
	job_dirs(p, root);
}

bool probe_socket_dir(const char *listen, char *dir, size_t len)
{
	char *slash;

	if (strncmp(listen, "unix:", 5) != 0)
		return false;
	snprintf(dir, len, "%s", listen + 5);
	slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return false;
	*slash = '\0';
	return true;
}

static void socket_dir(struct probe *p, const char *listen)
{
	char dir[PATH_MAX];
	struct stat st;

	if (!probe_socket_dir(listen, dir, sizeof(dir)))
		return;
	if (stat(dir, &st) != 0) {
		if (errno == ENOENT)
			can_make(p, "socket directory", dir);
		else
			problem(p, -errno, "socket directory %s: %s (as %s)", dir, strerror(errno),
			        p->user);
	} else if (!S_ISDIR(st.st_mode))
		problem(p, -ENOTDIR, "socket directory %s is not a directory", dir);
	else if (!writable(dir))
		problem(p, -EACCES, "socket directory %s is not writable by %s", dir, p->user);
	else
		said(p, "socket directory %s: writable by %s", dir, p->user);
}

int probe_paths(const char *root, const char *listen, FILE *out, char *err)
{
	struct passwd *pw = getpwuid(geteuid());
	struct probe p = {.start = !out, .out = out, .err = err};

	err[0] = '\0';
	if (pw)
		snprintf(p.user, sizeof(p.user), "%s", pw->pw_name);
	else
		snprintf(p.user, sizeof(p.user), "%ld", (long)geteuid()); /* chown takes it so */
	if (strncmp(root, "s3://", 5) != 0)
		root_dir(&p, root);
	else
		said(&p, "root %s: an object store, checked by the agent at start", root);
	socket_dir(&p, listen);
	return p.rc;
}
