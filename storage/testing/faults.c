/*
 * faults: the fsops table with faults put in, for tests that drive a real
 * ckptd (tests/integration/test_faults.c). A library of its own
 * (ckpt_faults), built and linked only with -DCKPT_FAULT_INJECTION=ON
 * (scripts/test.sh turns it on); the default and an install build take
 * storage/io/nofaults.c in its place, whose ckptd refuses to start with
 * CKPT_FAULTS set rather than run without the faults a test asked for.
 *
 * The plan is read once, at start-up, from the environment:
 *
 *   CKPT_FAULTS = rule [";" rule]...
 *   rule        = op ":" result [":" key "=" value]...
 *
 *   op      the backend's synchronous calls: openat pwrite pread fsync
 *           ftruncate fallocate renameat rename_noreplace linkat mkdirat
 *           unlinkat direct;
 *           the I/O engine's requests, as they complete (shard writes and
 *           reads, the fsyncs of a shard and of its directories): io_write
 *           io_read io_fsync
 *   result  an errno name (EIO, ENOSPC, EDQUOT, EROFS, ...): the call fails
 *           with it; for pwrite, pread, io_write and io_read also "short"
 *           (about half the bytes asked, in whole 4096-byte blocks beyond
 *           one, as O_DIRECT's; an O_DIRECT transfer of one block or less
 *           goes through whole, as the kernel's would) or "short=N" (at
 *           most N bytes; 0: a write
 *           that moves nothing, a read at the end of the file); for io_write,
 *           io_read and io_fsync also "slow=MS" (the result comes MS
 *           milliseconds late, as it was: a slow disk, for tests that must
 *           catch a save while it writes; the engine's thread waits, so
 *           every request behind it waits too); for openat also "slow=MS"
 *           (the calling thread waits MS milliseconds, then opens: a slow
 *           metadata server, holding up that thread alone); for capture
 *           only "slow=MS"; for every op also "seen": the call is made as
 *           it is and only said (tests count what the agent did, e.g. the
 *           fsyncs of each file: "fault injected: fsync(<path>) = seen")
 *   capture the copy of each chunk of a save from the trainer's host memory
 *           into the staging pool, before it is made (path:
 *           "JOB/step-NNNNNNNNNNNN/rank-R/chunk-K"): "slow=MS" holds the
 *           capture worker MS milliseconds first, for tests that must act
 *           between the chunks of one save
 *   path=G  only calls whose path matches the glob G (fnmatch(3), no flags:
 *           '*' crosses '/'): for a call on a descriptor, the path it was
 *           opened under (root-relative names joined to the root); for
 *           renameat, rename_noreplace and linkat, either of the two
 *   after=N let the first N matching calls through (default 0)
 *   count=N fail N matching calls, then let them through again (default 1;
 *           "count=inf": every one from then on)
 *
 *   e.g. CKPT_FAULTS='io_write:ENOSPC:path=*step-000000000002/rank-*;\
 *                     fsync:EIO:path=*~manifest.json.tmp:count=inf'
 *
 * A glob cannot hold ':' or ';'. Each rule counts the calls it matches; a
 * call gets the fault of the first rule that fires for it. Every fault put
 * in is said through the note function (the agent's log): "fault injected:
 * fsync(<path>) = EIO (rule 2, 1 of 1)". A plan that does not parse stops
 * the start with a message saying what is wrong in which rule.
 *
 * An injected error replaces the synchronous call (it is not made); a short
 * transfer makes the call with fewer bytes. The engine's requests are
 * changed after they completed (fsops.io_result): the bytes are on disk,
 * the agent is told otherwise, as after a failed writeback.
 *
 * Threads: fsops_from_env runs once, before any other thread; the wrappers
 * run on any thread (workers, the I/O engine), under one mutex that guards
 * the counters and the descriptor-to-path map. Test builds only: nothing
 * here is on a hot path that matters.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "storage/io/fsops.h"
#include "storage/io/ioeng.h"
#include "ipc/base/base.h"

#define FAULTS_ENV "CKPT_FAULTS"

#define MAX_RULES 32
#define MAX_GLOB 256
#define COUNT_INF UINT64_MAX
#define SHORT_ALIGN 4096u

enum fop {
	F_OPENAT,
	F_PWRITE,
	F_PREAD,
	F_FSYNC,
	F_FTRUNCATE,
	F_FALLOCATE,
	F_RENAMEAT,
	F_RENAME_NOREPLACE,
	F_LINKAT,
	F_MKDIRAT,
	F_UNLINKAT,
	F_DIRECT,
	F_IO_WRITE,
	F_IO_READ,
	F_IO_FSYNC,
	F_CAPTURE,
	F_NOPS,
};

static const char *const op_names[F_NOPS] = {
    "openat",   "pwrite",           "pread",    "fsync",   "ftruncate", "fallocate",
    "renameat", "rename_noreplace", "linkat",   "mkdirat", "unlinkat",  "direct",
    "io_write", "io_read",          "io_fsync", "capture",
};

static const struct {
	const char *name;
	int err;
} errnos[] = {
    {"EIO", EIO},
    {"ENOSPC", ENOSPC},
    {"EDQUOT", EDQUOT},
    {"EROFS", EROFS},
    {"EACCES", EACCES},
    {"EPERM", EPERM},
    {"ENOENT", ENOENT},
    {"EEXIST", EEXIST},
    {"EBUSY", EBUSY},
    {"EINTR", EINTR},
    {"EAGAIN", EAGAIN},
    {"ENOMEM", ENOMEM},
    {"EXDEV", EXDEV},
    {"EINVAL", EINVAL},
    {"ENOTDIR", ENOTDIR},
    {"EISDIR", EISDIR},
    {"EMLINK", EMLINK},
    {"ENOSYS", ENOSYS},
    {"ESTALE", ESTALE},
    {"EFBIG", EFBIG},
    {"EMFILE", EMFILE},
    {"ENFILE", ENFILE},
    {"ETIMEDOUT", ETIMEDOUT},
    {"EOPNOTSUPP", EOPNOTSUPP},
    {"ENAMETOOLONG", ENAMETOOLONG},
};

struct rule {
	enum fop op;
	int err; /* > 0: fail with -err */
	const char *errname;
	bool isshort; /* else: a short transfer */
	uint64_t limit; /* short=N: at most N bytes; UINT64_MAX: half */
	unsigned slow_ms; /* slow=MS: the request's result comes MS later, as it was */
	bool seen_only; /* seen: the call as it is, only said */
	char glob[MAX_GLOB]; /* "" matches every path */
	uint64_t after, count;
	uint64_t seen, fired; /* under mu */
};

static struct {
	pthread_mutex_t mu;
	struct rule rules[MAX_RULES];
	unsigned n;
	void (*note)(const char *line);
	char **paths; /* fd -> the path it was opened under (malloc'd), or NULL */
	size_t npaths;
} plan = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ---- descriptors and their paths -------------------------------------- */

/* Under mu: what fd was opened under, or "?" (not through the table). */
static const char *fd_path(int fd)
{
	return fd >= 0 && (size_t)fd < plan.npaths && plan.paths[fd] ? plan.paths[fd] : "?";
}

/* Under mu: "<path of dirfd>/name" ("name" alone when absolute, dirfd's for "."). */
static void join(int dirfd, const char *name, char *buf, size_t len)
{
	if (name[0] == '/' || dirfd == AT_FDCWD)
		snprintf(buf, len, "%s", name);
	else if (strcmp(name, ".") == 0)
		snprintf(buf, len, "%s", fd_path(dirfd));
	else
		snprintf(buf, len, "%s/%s", fd_path(dirfd), name);
}

/* Remembers fd's path (no memory: it stays unknown, "?"). */
static void remember(int fd, const char *path)
{
	pthread_mutex_lock(&plan.mu);
	if ((size_t)fd >= plan.npaths) {
		size_t n = (size_t)fd * 2 + 16;
		char **v = realloc(plan.paths, n * sizeof(*v));

		if (v) {
			memset(v + plan.npaths, 0, (n - plan.npaths) * sizeof(*v));
			plan.paths = v;
			plan.npaths = n;
		}
	}
	if ((size_t)fd < plan.npaths) {
		free(plan.paths[fd]); /* a descriptor closed since, its number used again */
		plan.paths[fd] = strdup(path);
	}
	pthread_mutex_unlock(&plan.mu);
}

/* ---- deciding --------------------------------------------------------- */

/*
 * The rule that fires for this call (its counters moved on), or NULL.
 * path2: the second path of a rename or link, or NULL. Says what fired.
 */
static const struct rule *decide(enum fop op, const char *path, const char *path2)
{
	struct rule *hit = NULL;
	char line[PATH_MAX * 2 + 200], what[32];
	unsigned k = 0;

	pthread_mutex_lock(&plan.mu);
	for (unsigned i = 0; i < plan.n; i++) {
		struct rule *r = &plan.rules[i];

		if (r->op != op)
			continue;
		if (r->glob[0] && fnmatch(r->glob, path, 0) != 0 &&
		    !(path2 && fnmatch(r->glob, path2, 0) == 0))
			continue;
		if (++r->seen <= r->after || r->fired >= r->count || hit)
			continue;
		r->fired++;
		hit = r;
		k = i;
	}
	if (hit) {
		if (hit->seen_only)
			snprintf(what, sizeof(what), "seen");
		else if (hit->slow_ms)
			snprintf(what, sizeof(what), "as it was, %u ms late", hit->slow_ms);
		else if (hit->isshort && hit->limit == UINT64_MAX)
			snprintf(what, sizeof(what), "short (half)");
		else if (hit->isshort)
			snprintf(what, sizeof(what), "short (at most %llu bytes)",
			         (unsigned long long)hit->limit);
		else
			snprintf(what, sizeof(what), "%s", hit->errname);
		if (hit->count == COUNT_INF)
			snprintf(line, sizeof(line),
			         "fault injected: %s(%s%s%s) = %s (rule %u, %llu of "
			         "every one)",
			         op_names[op], path, path2 ? ", " : "", path2 ? path2 : "", what,
			         k + 1, (unsigned long long)hit->fired);
		else
			snprintf(line, sizeof(line),
			         "fault injected: %s(%s%s%s) = %s (rule %u, %llu of "
			         "%llu)",
			         op_names[op], path, path2 ? ", " : "", path2 ? path2 : "", what,
			         k + 1, (unsigned long long)hit->fired,
			         (unsigned long long)hit->count);
	}
	pthread_mutex_unlock(&plan.mu);
	if (hit && plan.note)
		plan.note(line);
	return hit && hit->seen_only ? NULL : hit; /* seen: no fault for the caller */
}

static const struct rule *decide_at(enum fop op, int dirfd, const char *name, int dirfd2,
                                    const char *name2)
{
	char p[PATH_MAX], p2[PATH_MAX];

	pthread_mutex_lock(&plan.mu);
	join(dirfd, name, p, sizeof(p));
	if (name2)
		join(dirfd2, name2, p2, sizeof(p2));
	pthread_mutex_unlock(&plan.mu);
	return decide(op, p, name2 ? p2 : NULL);
}

static const struct rule *decide_fd(enum fop op, int fd)
{
	char p[PATH_MAX];

	pthread_mutex_lock(&plan.mu);
	snprintf(p, sizeof(p), "%s", fd_path(fd));
	pthread_mutex_unlock(&plan.mu);
	return decide(op, p, NULL);
}

/*
 * How many bytes of n a short rule lets through. Half: in whole 4096-byte
 * blocks where n is larger than one, as O_DIRECT transfers come back short
 * (the engine asks again for the rest, at an offset O_DIRECT takes).
 */
static uint64_t short_len(const struct rule *r, uint64_t n)
{
	uint64_t half = n / 2 / SHORT_ALIGN * SHORT_ALIGN;

	if (r->limit != UINT64_MAX)
		return r->limit < n ? r->limit : n;
	if (n <= SHORT_ALIGN)
		return n / 2;
	return half ? half : SHORT_ALIGN;
}

/* ---- the wrappers ----------------------------------------------------- */

static int f_openat(int dirfd, const char *path, int flags, mode_t mode)
{
	char p[PATH_MAX];
	const struct rule *r;
	int fd;

	pthread_mutex_lock(&plan.mu);
	join(dirfd, path, p, sizeof(p));
	pthread_mutex_unlock(&plan.mu);
	r = decide(F_OPENAT, p, NULL);
	if (r && r->slow_ms)
		usleep(r->slow_ms * 1000u); /* this thread only; then the open, as it is */
	else if (r)
		return -r->err;
	fd = fsops_posix.openat(dirfd, path, flags, mode);
	if (fd >= 0)
		remember(fd, p);
	return fd;
}

static ssize_t f_pwrite(int fd, const void *buf, size_t n, off_t off)
{
	const struct rule *r = decide_fd(F_PWRITE, fd);

	if (r && !r->isshort)
		return -r->err;
	if (r && short_len(r, n) == 0)
		return 0;
	return fsops_posix.pwrite(fd, buf, r ? (size_t)short_len(r, n) : n, off);
}

static ssize_t f_pread(int fd, void *buf, size_t n, off_t off)
{
	const struct rule *r = decide_fd(F_PREAD, fd);

	if (r && !r->isshort)
		return -r->err;
	if (r && short_len(r, n) == 0)
		return 0;
	return fsops_posix.pread(fd, buf, r ? (size_t)short_len(r, n) : n, off);
}

static int f_fsync(int fd)
{
	const struct rule *r = decide_fd(F_FSYNC, fd);

	return r ? -r->err : fsops_posix.fsync(fd);
}

static int f_ftruncate(int fd, off_t len)
{
	const struct rule *r = decide_fd(F_FTRUNCATE, fd);

	return r ? -r->err : fsops_posix.ftruncate(fd, len);
}

static int f_fallocate(int fd, off_t len)
{
	const struct rule *r = decide_fd(F_FALLOCATE, fd);

	return r ? -r->err : fsops_posix.fallocate(fd, len);
}

static int f_direct(int fd)
{
	const struct rule *r = decide_fd(F_DIRECT, fd);

	return r ? -r->err : fsops_posix.direct(fd);
}

static int f_renameat(int od, const char *op, int nd, const char *np)
{
	const struct rule *r = decide_at(F_RENAMEAT, od, op, nd, np);

	return r ? -r->err : fsops_posix.renameat(od, op, nd, np);
}

static int f_rename_noreplace(int dirfd, const char *from, const char *to)
{
	const struct rule *r = decide_at(F_RENAME_NOREPLACE, dirfd, from, dirfd, to);

	return r ? -r->err : fsops_posix.rename_noreplace(dirfd, from, to);
}

static int f_linkat(int od, const char *op, int nd, const char *np)
{
	const struct rule *r = decide_at(F_LINKAT, od, op, nd, np);

	return r ? -r->err : fsops_posix.linkat(od, op, nd, np);
}

static int f_mkdirat(int dirfd, const char *path, mode_t mode)
{
	const struct rule *r = decide_at(F_MKDIRAT, dirfd, path, -1, NULL);

	return r ? -r->err : fsops_posix.mkdirat(dirfd, path, mode);
}

static int f_unlinkat(int dirfd, const char *path, int flags)
{
	const struct rule *r = decide_at(F_UNLINKAT, dirfd, path, -1, NULL);

	return r ? -r->err : fsops_posix.unlinkat(dirfd, path, flags);
}

/* The engine's thread: a request's result before the engine acts on it. */
static int64_t f_io_result(const struct io_req *q, int64_t res)
{
	enum fop op = q->op == IO_WRITE ? F_IO_WRITE : q->op == IO_READ ? F_IO_READ : F_IO_FSYNC;
	const struct rule *r;

	if (res < 0)
		return res; /* failed already: as it came */
	r = decide_fd(op, q->fd);
	if (!r)
		return res;
	if (r->slow_ms) {
		usleep(r->slow_ms * 1000u);
		return res;
	}
	/*
	 * O_DIRECT comes back short only in whole blocks (or at the end of the
	 * file): a transfer of one block or less goes through as it is.
	 */
	if (r->isshort && r->limit == UINT64_MAX && (uint64_t)res <= SHORT_ALIGN &&
	    (fcntl(q->fd, F_GETFL) & O_DIRECT))
		return res;
	return r->isshort ? (int64_t)short_len(r, (uint64_t)res) : -r->err;
}

/* The backend's synchronous calls. */
static const struct fsops faults_sync = {
    .openat = f_openat,
    .pwrite = f_pwrite,
    .pread = f_pread,
    .fsync = f_fsync,
    .ftruncate = f_ftruncate,
    .fallocate = f_fallocate,
    .renameat = f_renameat,
    .rename_noreplace = f_rename_noreplace,
    .linkat = f_linkat,
    .mkdirat = f_mkdirat,
    .direct = f_direct,
    .unlinkat = f_unlinkat,
    .io_result = NULL,
};

/*
 * The engine's: its own calls (the pwrite engine's) as they are, its
 * results through the plan, so that io_* rules mean the same on either
 * engine and a shard write is never counted as a pwrite too.
 */
static struct fsops faults_async;

/* ---- the plan --------------------------------------------------------- */

static int parse_u64(const char *s, uint64_t *v)
{
	char *end;

	if (!s[0] || s[0] == '-')
		return -EINVAL;
	errno = 0;
	*v = strtoull(s, &end, 10);
	return errno || *end ? -EINVAL : 0;
}

static bool transfers(enum fop op)
{
	return op == F_PWRITE || op == F_PREAD || op == F_IO_WRITE || op == F_IO_READ;
}

static int parse_result(struct rule *r, const char *s, unsigned k, char *err)
{
	if (strcmp(s, "seen") == 0) {
		r->seen_only = true;
		return 0;
	}
	if (strncmp(s, "slow=", 5) == 0) {
		uint64_t ms;

		if (r->op != F_IO_WRITE && r->op != F_IO_READ && r->op != F_IO_FSYNC &&
		    r->op != F_OPENAT && r->op != F_CAPTURE)
			return ipc_errf(err, -EINVAL,
			                FAULTS_ENV
			                " rule %u: '%s' of %s: only io_write, "
			                "io_read, io_fsync, openat and capture can be slow",
			                k, s, op_names[r->op]);
		if (parse_u64(s + 5, &ms) || ms == 0 || ms > 60000)
			return ipc_errf(err, -EINVAL,
			                FAULTS_ENV " rule %u: '%s' is not slow=MS "
			                           "(1..60000)",
			                k, s);
		r->slow_ms = (unsigned)ms;
		return 0;
	}
	if (r->op == F_CAPTURE)
		return ipc_errf(err, -EINVAL,
		                FAULTS_ENV " rule %u: '%s' of capture: a capture can only be "
		                           "slow=MS or seen",
		                k, s);
	if (strcmp(s, "short") == 0 || strncmp(s, "short=", 6) == 0) {
		if (!transfers(r->op))
			return ipc_errf(err, -EINVAL,
			                FAULTS_ENV " rule %u: '%s' of %s: only pwrite, "
			                           "pread, io_write and io_read can be short",
			                k, s, op_names[r->op]);
		r->isshort = true;
		r->limit = UINT64_MAX;
		if (s[5] == '=' && parse_u64(s + 6, &r->limit))
			return ipc_errf(err, -EINVAL,
			                FAULTS_ENV " rule %u: '%s' is not short=BYTES", k, s);
		return 0;
	}
	for (size_t i = 0; i < sizeof(errnos) / sizeof(errnos[0]); i++)
		if (strcmp(s, errnos[i].name) == 0) {
			r->err = errnos[i].err;
			r->errname = errnos[i].name;
			return 0;
		}
	return ipc_errf(err, -EINVAL,
	                FAULTS_ENV " rule %u: unknown result '%s': an errno name "
	                           "(EIO, ENOSPC, EDQUOT, EROFS, ...), short, short=BYTES, "
	                           "slow=MS or seen",
	                k, s);
}

static int parse_option(struct rule *r, const char *s, unsigned k, char *err)
{
	const char *v = strchr(s, '=');
	size_t klen = v ? (size_t)(v - s) : 0;

	if (!v)
		return ipc_errf(err, -EINVAL,
		                FAULTS_ENV " rule %u: '%s' is not key=value "
		                           "(path=GLOB, after=N, count=N|inf)",
		                k, s);
	v++;
	if (klen == 4 && strncmp(s, "path", 4) == 0) {
		if (!v[0] || strlen(v) >= MAX_GLOB)
			return ipc_errf(err, -EINVAL,
			                FAULTS_ENV " rule %u: path= needs a glob of "
			                           "1 to %d characters",
			                k, MAX_GLOB - 1);
		snprintf(r->glob, sizeof(r->glob), "%s", v);
		return 0;
	}
	if (klen == 5 && strncmp(s, "after", 5) == 0) {
		if (parse_u64(v, &r->after))
			return ipc_errf(err, -EINVAL,
			                FAULTS_ENV " rule %u: after=%s is not a count "
			                           "of calls",
			                k, v);
		return 0;
	}
	if (klen == 5 && strncmp(s, "count", 5) == 0) {
		if (strcmp(v, "inf") == 0)
			r->count = COUNT_INF;
		else if (parse_u64(v, &r->count) || r->count == 0)
			return ipc_errf(err, -EINVAL,
			                FAULTS_ENV " rule %u: count=%s is neither a "
			                           "number of faults (1 or more) nor inf",
			                k, v);
		return 0;
	}
	return ipc_errf(err, -EINVAL,
	                FAULTS_ENV " rule %u: unknown key in '%s' (path=GLOB, "
	                           "after=N, count=N|inf)",
	                k, s);
}

/* One rule, "op:result[:key=value]..." (s is cut up). k: its number, for messages. */
static int parse_rule(struct rule *r, char *s, unsigned k, char *err)
{
	char *save = NULL, *f = strtok_r(s, ":", &save);
	int rc;

	memset(r, 0, sizeof(*r));
	r->count = 1;
	if (!f)
		return ipc_errf(err, -EINVAL, FAULTS_ENV " rule %u is empty", k);
	for (r->op = 0; r->op < F_NOPS && strcmp(f, op_names[r->op]) != 0; r->op++)
		;
	if (r->op == F_NOPS)
		return ipc_errf(err, -EINVAL,
		                FAULTS_ENV
		                " rule %u: unknown call '%s': openat, "
		                "pwrite, pread, fsync, ftruncate, fallocate, renameat, "
		                "rename_noreplace, linkat, mkdirat, unlinkat, direct, io_write, "
		                "io_read or io_fsync",
		                k, f);
	f = strtok_r(NULL, ":", &save);
	if (!f)
		return ipc_errf(err, -EINVAL,
		                FAULTS_ENV " rule %u: %s needs a result (EIO, "
		                           "ENOSPC, ..., short)",
		                k, op_names[r->op]);
	if ((rc = parse_result(r, f, k, err)))
		return rc;
	while ((f = strtok_r(NULL, ":", &save)))
		if ((rc = parse_option(r, f, k, err)))
			return rc;
	return 0;
}

static int parse_plan(const char *text, char *err)
{
	char *copy = strdup(text), *save = NULL, *s;
	unsigned k = 0;
	int rc = 0;

	if (!copy)
		return ipc_errf(err, -ENOMEM, "out of memory reading " FAULTS_ENV);
	/* strsep, not strtok: an empty rule between two ';' is an error, not skipped */
	for (s = copy; (save = strsep(&s, ";")) && !rc;) {
		if (!save[0] && !s)
			break; /* a ';' at the end */
		if (++k > MAX_RULES)
			rc = ipc_errf(err, -EINVAL, FAULTS_ENV ": more than %d rules", MAX_RULES);
		else
			rc = parse_rule(&plan.rules[k - 1], save, k, err);
	}
	free(copy);
	plan.n = rc ? 0 : k;
	return rc;
}

int fsops_from_env(const struct fsops **sync, const struct fsops **async,
                   void (*note)(const char *line), char *err)
{
	const char *text = getenv(FAULTS_ENV);
	int rc;

	*sync = *async = &fsops_posix;
	if (!text || !text[0])
		return 0;
	rc = parse_plan(text, err);
	if (rc)
		return rc;
	plan.note = note;
	faults_async = fsops_posix;
	faults_async.io_result = f_io_result;
	*sync = &faults_sync;
	*async = &faults_async;
	if (note) {
		char line[IPC_ERRLEN + 64];

		snprintf(line, sizeof(line),
		         "fault injection: %u rule%s from " FAULTS_ENV "=%.400s", plan.n,
		         plan.n == 1 ? "" : "s", text);
		note(line);
	}
	return 0;
}

void fsops_capture_wait(const char *job, int64_t step, int rank, unsigned chunk)
{
	char path[IPC_MAX_JOB + 64];
	const struct rule *r;

	if (!plan.n)
		return;
	snprintf(path, sizeof(path), "%s/step-%012lld/rank-%d/chunk-%u", job, (long long)step, rank,
	         chunk);
	r = decide(F_CAPTURE, path, NULL);
	if (r && r->slow_ms)
		usleep(r->slow_ms * 1000u); /* the capture worker only */
}
