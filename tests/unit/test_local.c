/*
 * Unit tests of storage/local.c, the local-filesystem backend, in a
 * temporary root. The syscalls go through a recording fsops table that can
 * also fail the nth call of a kind on a given name, so the tests assert the
 * order of the durability steps of a commit and what a failure at each of
 * them leaves behind (nothing visible). Also: LATEST only moves forward,
 * recovery at start-up, remove() of LATEST, junk in listings, hostile
 * LATEST / manifest.json / links, the O_DIRECT fallback, and a shard written,
 * finished, committed and read back through a real I/O engine.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <check.h>

#include "storage.h"

/* ---- a recording, failing fsops table ---------------------------------- */

#define MAXLOG 1024
#define MAXFD 4096

static struct {
	pthread_mutex_t m;
	char log[MAXLOG][160];
	unsigned n;
	char fdname[MAXFD][64];
	/* the nth call of fail_op on fail_name (NULL: any) returns fail_err */
	const char *fail_op;
	const char *fail_name;
	unsigned fail_nth, seen;
	int fail_err;
	bool refuse_direct; /* openat with O_DIRECT: -EINVAL, as tmpfs did */
} rec = {.m = PTHREAD_MUTEX_INITIALIZER};

static const char *base(const char *p)
{
	const char *s = strrchr(p, '/');

	return s && s[1] ? s + 1 : p;
}

static const char *fdn(int fd)
{
	return fd >= 0 && fd < MAXFD && rec.fdname[fd][0] ? rec.fdname[fd] : "?";
}

/* Logs "op:name" and says whether this call is the one to fail. */
static int note(const char *op, const char *name, const char *extra)
{
	int rc = 0;

	pthread_mutex_lock(&rec.m);
	if (rec.n < MAXLOG)
		snprintf(rec.log[rec.n++], sizeof(rec.log[0]), "%s:%s%s", op, name, extra);
	if (rec.fail_op && strcmp(rec.fail_op, op) == 0 &&
	    (!rec.fail_name || strcmp(rec.fail_name, name) == 0) && ++rec.seen == rec.fail_nth)
		rc = rec.fail_err;
	pthread_mutex_unlock(&rec.m);
	return rc;
}

static int r_openat(int dirfd, const char *path, int flags, mode_t mode)
{
	int rc = note("openat", base(path), "");

	if (rc)
		return rc;
	if (rec.refuse_direct && (flags & O_DIRECT))
		return -EINVAL;
	rc = fsops_posix.openat(dirfd, path, flags, mode);
	if (rc >= 0 && rc < MAXFD) {
		pthread_mutex_lock(&rec.m);
		snprintf(rec.fdname[rc], sizeof(rec.fdname[0]), "%s", base(path));
		pthread_mutex_unlock(&rec.m);
	}
	return rc;
}

static ssize_t r_pwrite(int fd, const void *buf, size_t n, off_t off)
{
	int rc = note("pwrite", fdn(fd), "");

	return rc ? rc : fsops_posix.pwrite(fd, buf, n, off);
}

static ssize_t r_pread(int fd, void *buf, size_t n, off_t off)
{
	int rc = note("pread", fdn(fd), "");

	return rc ? rc : fsops_posix.pread(fd, buf, n, off);
}

static int r_fsync(int fd)
{
	int rc = note("fsync", fdn(fd), "");

	return rc ? rc : fsops_posix.fsync(fd);
}

static int r_ftruncate(int fd, off_t len)
{
	int rc = note("ftruncate", fdn(fd), "");

	return rc ? rc : fsops_posix.ftruncate(fd, len);
}

static int r_renameat(int od, const char *op, int nd, const char *np)
{
	char extra[96];
	int rc;

	snprintf(extra, sizeof(extra), "->%s", base(np));
	rc = note("renameat", base(op), extra);
	return rc ? rc : fsops_posix.renameat(od, op, nd, np);
}

static int r_mkdirat(int dirfd, const char *path, mode_t mode)
{
	int rc = note("mkdirat", base(path), "");

	return rc ? rc : fsops_posix.mkdirat(dirfd, path, mode);
}

static int r_unlinkat(int dirfd, const char *path, int flags)
{
	int rc = note("unlinkat", base(path), "");

	return rc ? rc : fsops_posix.unlinkat(dirfd, path, flags);
}

static const struct fsops rec_ops = {
    .openat = r_openat,
    .pwrite = r_pwrite,
    .pread = r_pread,
    .fsync = r_fsync,
    .ftruncate = r_ftruncate,
    .renameat = r_renameat,
    .mkdirat = r_mkdirat,
    .unlinkat = r_unlinkat,
};

static void rec_reset(void)
{
	pthread_mutex_lock(&rec.m);
	rec.n = 0;
	rec.fail_op = NULL;
	rec.fail_name = NULL;
	rec.fail_nth = rec.seen = 0;
	rec.fail_err = 0;
	pthread_mutex_unlock(&rec.m);
}

static void rec_fail(const char *op, const char *name, unsigned nth, int err)
{
	rec_reset();
	rec.fail_op = op;
	rec.fail_name = name;
	rec.fail_nth = nth;
	rec.fail_err = err;
}

/* ---- fixtures --------------------------------------------------------- */

static char root[512];
static struct storage *st;
static char err[IPC_ERRLEN];

static void open_backend(bool direct, struct ioeng *io)
{
	struct local_opts o = {.root = root, .io = io, .ops = &rec_ops, .direct = direct};
	int rc = local_create(&o, &st, err);

	ck_assert_msg(rc == 0, "local_create: %s", err);
}

static void setup(void)
{
	const char *b = getenv("CK_TMPDIR");

	snprintf(root, sizeof(root), "%s/local-XXXXXX", b && *b ? b : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(root));
	strcat(root, "/root"); /* made by local_create */
	memset(&rec.fdname, 0, sizeof(rec.fdname));
	rec.refuse_direct = false;
	rec_reset();
	err[0] = '\0';
	open_backend(false, NULL);
}

static void teardown(void)
{
	char cmd[600];

	storage_destroy(st);
	st = NULL;
	*strrchr(root, '/') = '\0';
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", root);
}

static const char *at(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* root + "/" + the rest, in one of a few rotating buffers. */
static const char *at(const char *fmt, ...)
{
	static char bufs[4][1024];
	static int k;
	char *b = bufs[k++ % 4];
	int n = snprintf(b, 1024, "%s/", root);
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b + n, 1024 - (size_t)n, fmt, ap);
	va_end(ap);
	return b;
}

static void mkdirs(const char *p)
{
	char cmd[1100];

	snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", p);
	ck_assert_int_eq(system(cmd), 0);
}

static void put(const char *p, const void *data, size_t n)
{
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	ck_assert_msg(fd >= 0, "open %s: %s", p, strerror(errno));
	ck_assert_int_eq(write(fd, data, n), (ssize_t)n);
	close(fd);
}

static void puts_at(const char *p, const char *s)
{
	put(p, s, strlen(s));
}

static bool exists(const char *p)
{
	struct stat sb;

	return lstat(p, &sb) == 0;
}

static char *slurp(const char *p)
{
	static char buf[4096];
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return NULL;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	buf[n < 0 ? 0 : n] = '\0';
	return buf;
}

/* A one-rank manifest: one U8 tensor filling the file after an 8-byte header. */
static struct manifest *mk_manifest(const char *job, int64_t step, uint64_t size)
{
	struct manifest *m = calloc(1, sizeof(*m));

	ck_assert_ptr_nonnull(m);
	m->version = MANIFEST_VERSION;
	m->job = strdup(job);
	m->step = step;
	m->world = 1;
	m->time_unix_ns = 1;
	m->nranks = 1;
	m->ranks = calloc(1, sizeof(*m->ranks));
	m->ranks[0] = (struct manifest_rank){0, strdup("rank-00000.safetensors"), size, 8};
	m->bytes = size;
	m->ntensors = 1;
	m->tensors = calloc(1, sizeof(*m->tensors));
	m->tensors[0].name = strdup("w");
	m->tensors[0].dtype = ipc_dtype_from_name("U8");
	m->tensors[0].ndim = 1;
	m->tensors[0].global_shape[0] = (int64_t)size - 8;
	m->tensors[0].nchunks = 1;
	m->tensors[0].chunks = calloc(1, sizeof(*m->tensors[0].chunks));
	m->tensors[0].chunks[0].shape[0] = (int64_t)size - 8;
	m->tensors[0].chunks[0].begin = 8;
	m->tensors[0].chunks[0].end = size;
	return m;
}

/* The step's directory and its one shard, as the write side leaves them. */
static void mk_shard(const char *job, int64_t step, uint64_t size)
{
	char *data = calloc(1, size);

	mkdirs(at("%s/step-%012lld", job, (long long)step));
	put(at("%s/step-%012lld/rank-00000.safetensors", job, (long long)step), data, size);
	free(data);
}

/* A directory opened through a link: O_NOFOLLOW | O_DIRECTORY says ENOTDIR. */
static bool is_link_error(int rc)
{
	return (rc == -ELOOP || rc == -ENOTDIR) && strstr(err, "link") != NULL;
}

static int commit(const char *job, int64_t step)
{
	struct manifest *m = mk_manifest(job, step, 100);
	int rc = st->ops->commit(st, m, err);

	manifest_free(m);
	return rc;
}

static void committed(const char *job, int64_t step)
{
	mk_shard(job, step, 100);
	ck_assert_msg(commit(job, step) == 0, "commit: %s", err);
}

static int64_t latest(const char *job)
{
	int64_t step = -1;
	int rc = st->ops->get_latest(st, job, &step, err);

	return rc < 0 ? rc : step;
}

/* ---- commit ----------------------------------------------------------- */

START_TEST(test_commit_sequence)
{
	static const char *const want[] = {
	    "pwrite:.manifest.json.tmp",    "fsync:.manifest.json.tmp",
	    "fsync:step-000000000005",      "renameat:.manifest.json.tmp->manifest.json",
	    "fsync:step-000000000005",      "fsync:job",
	    "pwrite:.LATEST.tmp",           "fsync:.LATEST.tmp",
	    "renameat:.LATEST.tmp->LATEST", "fsync:job",
	};
	const char *got[64];
	unsigned n = 0;
	struct manifest *m;

	mk_shard("job", 5, 100);
	rec_reset();
	ck_assert_msg(commit("job", 5) == 0, "commit: %s", err);
	for (unsigned i = 0; i < rec.n && n < 64; i++) {
		const char *e = rec.log[i];

		if (strncmp(e, "pwrite:", 7) && strncmp(e, "fsync:", 6) &&
		    strncmp(e, "renameat:", 9))
			continue;
		if (n && strncmp(e, "pwrite:", 7) == 0 && strcmp(got[n - 1], e) == 0)
			continue; /* one write in several calls */
		got[n++] = e;
	}
	if (n != sizeof(want) / sizeof(want[0]))
		for (unsigned i = 0; i < n; i++)
			fprintf(stderr, "  %s\n", got[i]);
	ck_assert_uint_eq(n, sizeof(want) / sizeof(want[0]));
	for (unsigned i = 0; i < n; i++)
		ck_assert_str_eq(got[i], want[i]);
	ck_assert_int_eq(latest("job"), 5);
	ck_assert_str_eq(slurp(at("job/LATEST")), "5\n");
	ck_assert_int_eq(st->ops->read_manifest(st, "job", 5, &m, err), 0);
	ck_assert_str_eq(m->job, "job");
	ck_assert_int_eq(m->step, 5);
	ck_assert_uint_eq(m->ranks[0].size, 100);
	manifest_free(m);
	ck_assert(!exists(at("job/step-000000000005/.manifest.json.tmp")));
	ck_assert(!exists(at("job/.LATEST.tmp")));
}
END_TEST

static const struct {
	const char *op, *name;
	unsigned nth;
	int err;
} faults[] = {
    {"openat", ".manifest.json.tmp", 1, -EACCES},
    {"pwrite", ".manifest.json.tmp", 1, -ENOSPC},
    {"fsync", ".manifest.json.tmp", 1, -EIO},
    {"fsync", "step-000000000002", 1, -EIO}, /* before the rename */
    {"renameat", ".manifest.json.tmp", 1, -EIO},
    {"fsync", "step-000000000002", 2, -EIO}, /* after the rename */
    {"fsync", "job", 1, -EIO},
    {"openat", ".LATEST.tmp", 1, -EDQUOT},
    {"pwrite", ".LATEST.tmp", 1, -ENOSPC},
    {"fsync", ".LATEST.tmp", 1, -EIO},
    {"renameat", ".LATEST.tmp", 1, -EIO},
    {"fsync", "job", 2, -EIO}, /* after LATEST's rename */
};

/* A failure at any step: the error comes back, nothing of step 2 is visible. */
START_TEST(test_commit_fault)
{
	struct storage_step *steps;
	struct manifest *m = NULL;
	size_t n;
	int rc;

	committed("job", 1);
	mk_shard("job", 2, 100);
	rec_fail(faults[_i].op, faults[_i].name, faults[_i].nth, faults[_i].err);
	rc = commit("job", 2);
	ck_assert_uint_eq(rec.seen >= faults[_i].nth, 1); /* the fault was reached */
	rec_reset();
	ck_assert_msg(rc == faults[_i].err, "fault %d: rc %d (%s)", _i, rc, err);
	ck_assert_msg(strstr(err, "was not committed") != NULL, "err: %s", err);
	ck_assert(!exists(at("job/step-000000000002/manifest.json")));
	ck_assert(!exists(at("job/step-000000000002/.manifest.json.tmp")));
	ck_assert(!exists(at("job/.LATEST.tmp")));
	ck_assert_str_eq(slurp(at("job/LATEST")), "1\n");
	ck_assert_int_eq(st->ops->read_manifest(st, "job", 2, &m, err), -ENOENT);
	ck_assert_int_eq(st->ops->list_steps(st, "job", &steps, &n, err), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert(steps[0].committed && !steps[1].committed);
	free(steps);
	/* and the same commit goes through once the disk behaves */
	ck_assert_msg(commit("job", 2) == 0, "commit: %s", err);
	ck_assert_int_eq(latest("job"), 2);
}
END_TEST

START_TEST(test_commit_latest_forward_only)
{
	struct storage_step *steps;
	size_t n;

	committed("job", 10);
	committed("job", 5); /* late: an older step */
	ck_assert_int_eq(latest("job"), 10);
	ck_assert_int_eq(st->ops->list_steps(st, "job", &steps, &n, err), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_int_eq(steps[0].step, 5);
	ck_assert_int_eq(steps[1].step, 10);
	ck_assert(steps[0].committed && steps[1].committed);
	free(steps);
	committed("job", 11);
	ck_assert_int_eq(latest("job"), 11);
	/* once committed, never again over it */
	ck_assert_int_eq(commit("job", 11), -EEXIST);
}
END_TEST

START_TEST(test_commit_refuses_incomplete)
{
	struct manifest *m;

	mk_shard("job", 3, 100);
	m = mk_manifest("job", 3, 200); /* the file holds 100 */
	ck_assert_int_eq(st->ops->commit(st, m, err), -EIO);
	ck_assert_msg(strstr(err, "rank-00000.safetensors") != NULL, "err: %s", err);
	manifest_free(m);
	ck_assert_int_eq(commit("job", 4), -ENOENT); /* no step directory */
	mkdirs(at("job/step-000000000004"));
	ck_assert_int_eq(commit("job", 4), -ENOENT); /* no shard */
	ck_assert_msg(strstr(err, "missing") != NULL, "err: %s", err);
	ck_assert(!exists(at("job/step-000000000003/manifest.json")));
	ck_assert(!exists(at("job/LATEST")));
}
END_TEST

/* ---- recovery and removal --------------------------------------------- */

START_TEST(test_recover)
{
	struct storage_recovery r;

	/* job: committed 1 and 3, partial 7, a half-deleted 2, temporaries, bad LATEST */
	committed("job", 1);
	committed("job", 3);
	puts_at(at("job/step-000000000003/.manifest.json.tmp"), "{");
	mk_shard("job", 7, 100);
	mkdirs(at("job/.trash.step-000000000002.1.1/sub"));
	puts_at(at("job/.trash.step-000000000002.1.1/rank-00000.safetensors"), "x");
	puts_at(at("job/.LATEST.tmp"), "7\n");
	puts_at(at("job/LATEST"), "garbage\n");
	puts_at(at("job/notes.txt"), "mine");
	mkdirs(at("job/step-9"));
	/* j2: nothing committed, a LATEST naming a partial step */
	mk_shard("j2", 5, 10);
	puts_at(at("j2/LATEST"), "5\n");
	/* j3: LATEST names a step that is gone */
	committed("j3", 4);
	puts_at(at("j3/LATEST"), "9\n");

	ck_assert_msg(st->ops->recover(st, &r, err) == 0, "recover: %s", err);
	ck_assert_uint_eq(r.partial_removed, 2);
	ck_assert_uint_eq(r.temp_removed, 3);
	ck_assert_uint_eq(r.latest_fixed, 3);
	ck_assert(!exists(at("job/step-000000000007")));
	ck_assert(!exists(at("job/.trash.step-000000000002.1.1")));
	ck_assert(!exists(at("job/.LATEST.tmp")));
	ck_assert(!exists(at("job/step-000000000003/.manifest.json.tmp")));
	ck_assert(exists(at("job/step-000000000003/manifest.json")));
	ck_assert(exists(at("job/step-000000000001/rank-00000.safetensors")));
	ck_assert(exists(at("job/notes.txt"))); /* not ours: left alone */
	ck_assert(exists(at("job/step-9")));
	ck_assert_int_eq(latest("job"), 3);
	ck_assert_str_eq(slurp(at("job/LATEST")), "3\n");
	ck_assert_int_eq(latest("j2"), -ENOENT);
	ck_assert(!exists(at("j2/step-000000000005")));
	ck_assert_int_eq(latest("j3"), 4);

	ck_assert_int_eq(st->ops->recover(st, &r, err), 0);
	ck_assert_uint_eq(r.partial_removed + r.temp_removed + r.latest_fixed, 0);
}
END_TEST

static unsigned count_trash(const char *job)
{
	char cmd[1200], *out;
	FILE *f;
	unsigned n = 0;

	snprintf(cmd, sizeof(cmd), "ls -a '%s' | grep -c '^\\.trash' || true", at("%s", job));
	f = popen(cmd, "r");
	ck_assert_ptr_nonnull(f);
	out = fgets(cmd, sizeof(cmd), f);
	if (out)
		n = (unsigned)atoi(out);
	pclose(f);
	return n;
}

START_TEST(test_remove)
{
	struct storage_step *steps;
	bool renamed = false, synced = false;
	size_t n;

	committed("job", 1);
	committed("job", 2);
	committed("job", 3);
	mk_shard("job", 4, 100); /* newer, never committed */
	rec_reset();
	ck_assert_msg(st->ops->remove(st, "job", 3, err) == 0, "remove: %s", err);
	/* out of sight by one rename, made durable before the files go */
	for (unsigned i = 0; i < rec.n; i++) {
		if (strncmp(rec.log[i], "renameat:step-000000000003->.trash.step-000000000003.",
		            53) == 0)
			renamed = true;
		else if (renamed && !synced && strncmp(rec.log[i], "fsync:", 6) == 0)
			synced = strcmp(rec.log[i], "fsync:job") == 0;
		else if (renamed && strncmp(rec.log[i], "unlinkat:", 9) == 0)
			ck_assert_msg(synced, "files deleted before the rename was durable");
	}
	ck_assert(renamed && synced);
	ck_assert(!exists(at("job/step-000000000003")));
	ck_assert_uint_eq(count_trash("job"), 0);
	ck_assert_int_eq(latest("job"), 2); /* the newest committed left, not 4 */
	ck_assert_int_eq(st->ops->remove(st, "job", 1, err), 0);
	ck_assert_int_eq(latest("job"), 2);
	ck_assert_int_eq(st->ops->remove(st, "job", 2, err), 0);
	ck_assert_int_eq(latest("job"), -ENOENT);
	ck_assert_int_eq(st->ops->remove(st, "job", 2, err), -ENOENT);
	ck_assert_int_eq(st->ops->remove(st, "job", 4, err), 0); /* uncommitted too */
	ck_assert_int_eq(st->ops->list_steps(st, "job", &steps, &n, err), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_ptr_null(steps);
	ck_assert_int_eq(st->ops->remove(st, "nojob", 1, err), -ENOENT);
	ck_assert_int_eq(st->ops->remove(st, "../job", 1, err), -EINVAL);
}
END_TEST

/* A pin: a marker file made durable (file, then directory), listed, undone on failure. */
START_TEST(test_pin)
{
	struct storage_step *steps;
	bool made = false, file_synced = false, dir_synced = false;
	size_t n;

	committed("job", 1);
	committed("job", 2);
	mk_shard("job", 3, 100); /* never committed */
	rec_reset();
	ck_assert_msg(st->ops->set_pinned(st, "job", 1, true, err) == 0, "pin: %s", err);
	for (unsigned i = 0; i < rec.n; i++) {
		if (strcmp(rec.log[i], "openat:pinned") == 0)
			made = true;
		else if (made && strcmp(rec.log[i], "fsync:pinned") == 0)
			file_synced = true;
		else if (file_synced && strcmp(rec.log[i], "fsync:step-000000000001") == 0)
			dir_synced = true;
	}
	ck_assert_msg(made && file_synced && dir_synced, "marker, its fsync, the directory's");
	ck_assert(exists(at("job/step-000000000001/pinned")));
	ck_assert_int_eq(st->ops->set_pinned(st, "job", 1, true, err), 0); /* again: fine */
	ck_assert_int_eq(st->ops->list_steps(st, "job", &steps, &n, err), 0);
	ck_assert_uint_eq(n, 3);
	ck_assert(steps[0].committed && steps[0].pinned);
	ck_assert(steps[1].committed && !steps[1].pinned);
	ck_assert(!steps[2].committed && !steps[2].pinned);
	free(steps);
	/* only a checkpoint can be pinned */
	ck_assert_int_eq(st->ops->set_pinned(st, "job", 3, true, err), -ENOENT);
	ck_assert_msg(strstr(err, "not committed"), "%s", err);
	ck_assert_int_eq(st->ops->set_pinned(st, "job", 9, true, err), -ENOENT);
	ck_assert_int_eq(st->ops->set_pinned(st, "../job", 1, true, err), -EINVAL);
	/* unpinned: gone, durably; twice is fine */
	rec_reset();
	ck_assert_int_eq(st->ops->set_pinned(st, "job", 1, false, err), 0);
	ck_assert(!exists(at("job/step-000000000001/pinned")));
	ck_assert_str_eq(rec.log[rec.n - 1], "fsync:step-000000000001");
	ck_assert_int_eq(st->ops->set_pinned(st, "job", 1, false, err), 0);
	/* the directory's fsync fails: the pin is not reported, nor left behind */
	rec_fail("fsync", "step-000000000002", 1, -EIO);
	ck_assert_int_eq(st->ops->set_pinned(st, "job", 2, true, err), -EIO);
	ck_assert(!exists(at("job/step-000000000002/pinned")));
	/* a removal takes the pin along with the step */
	rec_reset();
	ck_assert_int_eq(st->ops->set_pinned(st, "job", 2, true, err), 0);
	ck_assert_int_eq(st->ops->remove(st, "job", 2, err), 0);
	ck_assert(!exists(at("job/step-000000000002")));
	ck_assert_uint_eq(count_trash("job"), 0);
}
END_TEST

START_TEST(test_set_latest)
{
	committed("job", 1);
	ck_assert_int_eq(st->ops->set_latest(st, "job", 7, err), 0);
	ck_assert_int_eq(latest("job"), 7);
	ck_assert_int_eq(st->ops->set_latest(st, "job", -1, err), 0);
	ck_assert_int_eq(latest("job"), -ENOENT);
	ck_assert_int_eq(st->ops->set_latest(st, "job", -1, err), 0); /* already none */
	ck_assert_int_eq(st->ops->set_latest(st, "job", 1000000000000LL, err), -EINVAL);
	ck_assert_int_eq(st->ops->set_latest(st, "nojob", 1, err), -ENOENT);
}
END_TEST

/* ---- listings and hostile contents ------------------------------------ */

START_TEST(test_list_ignores_junk)
{
	struct storage_step *steps;
	char **jobs;
	size_t n;

	committed("job", 2);
	mk_shard("job", 4, 100);
	mkdirs(at("ok-job"));
	mkdirs(at("bad name"));
	mkdirs(at("elsewhere"));
	puts_at(at("notadir"), "x");
	ck_assert_int_eq(symlink(at("elsewhere"), at("link")), 0);
	mkdirs(at("job/step-1"));
	mkdirs(at("job/step-0000000000001")); /* 13 digits */
	mkdirs(at("job/step-00000000000x"));
	mkdirs(at("job/step-000000000003x"));
	puts_at(at("job/step-000000000009"), "a file");
	ck_assert_int_eq(symlink(at("job/step-000000000002"), at("job/step-000000000008")), 0);
	puts_at(at("job/notes.txt"), "x");

	ck_assert_int_eq(st->ops->list_jobs(st, &jobs, &n, err), 0);
	ck_assert_uint_eq(n, 3);
	ck_assert_str_eq(jobs[0], "elsewhere");
	ck_assert_str_eq(jobs[1], "job");
	ck_assert_str_eq(jobs[2], "ok-job");
	for (size_t i = 0; i < n; i++)
		free(jobs[i]);
	free(jobs);

	ck_assert_int_eq(st->ops->list_steps(st, "job", &steps, &n, err), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_int_eq(steps[0].step, 2);
	ck_assert(steps[0].committed);
	ck_assert_int_eq(steps[1].step, 4);
	ck_assert(!steps[1].committed);
	free(steps);
	ck_assert(is_link_error(st->ops->list_steps(st, "link", &steps, &n, err)));
	ck_assert_int_eq(st->ops->list_steps(st, "nojob", &steps, &n, err), -ENOENT);
	ck_assert_int_eq(st->ops->list_steps(st, "bad name", &steps, &n, err), -EINVAL);
}
END_TEST

START_TEST(test_read_manifest_checks)
{
	struct manifest *m = NULL;
	char *text;
	int fd;

	committed("job", 2);
	text = strdup(slurp(at("job/step-000000000002/manifest.json")));
	/* a manifest copied to another step, and to another job */
	mkdirs(at("job/step-000000000003"));
	puts_at(at("job/step-000000000003/manifest.json"), text);
	ck_assert_int_eq(st->ops->read_manifest(st, "job", 3, &m, err), -EINVAL);
	ck_assert_msg(strstr(err, "step 2") != NULL, "err: %s", err);
	ck_assert_ptr_null(m);
	mkdirs(at("other/step-000000000002"));
	puts_at(at("other/step-000000000002/manifest.json"), text);
	ck_assert_int_eq(st->ops->read_manifest(st, "other", 2, &m, err), -EINVAL);
	/* a link, garbage, a huge file */
	mkdirs(at("job/step-000000000004"));
	ck_assert_int_eq(symlink(at("job/step-000000000002/manifest.json"),
	                         at("job/step-000000000004/manifest.json")),
	                 0);
	ck_assert_int_eq(st->ops->read_manifest(st, "job", 4, &m, err), -ELOOP);
	mkdirs(at("job/step-000000000005"));
	puts_at(at("job/step-000000000005/manifest.json"), "{\"format\": 12");
	ck_assert_int_lt(st->ops->read_manifest(st, "job", 5, &m, err), 0);
	ck_assert_msg(strstr(err, "step-000000000005/manifest.json") != NULL, "err: %s", err);
	mkdirs(at("job/step-000000000006"));
	fd = open(at("job/step-000000000006/manifest.json"), O_WRONLY | O_CREAT, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)MANIFEST_MAX_BYTES + 1), 0); /* sparse */
	close(fd);
	ck_assert_int_eq(st->ops->read_manifest(st, "job", 6, &m, err), -EFBIG);
	/* a step directory that is a link */
	ck_assert_int_eq(symlink(at("job/step-000000000002"), at("job/step-000000000008")), 0);
	ck_assert(is_link_error(st->ops->read_manifest(st, "job", 8, &m, err)));
	ck_assert_int_eq(st->ops->read_manifest(st, "job", 9, &m, err), -ENOENT);
	ck_assert_int_eq(st->ops->read_manifest(st, "job", 2, &m, err), 0);
	manifest_free(m);
	free(text);
}
END_TEST

START_TEST(test_hostile_latest)
{
	char big[200];

	committed("job", 2);
	puts_at(at("job/LATEST"), "12abc\n");
	ck_assert_int_eq(latest("job"), -EINVAL);
	ck_assert_msg(strstr(err, "LATEST") != NULL, "err: %s", err);
	memset(big, '1', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	puts_at(at("job/LATEST"), big);
	ck_assert_int_eq(latest("job"), -EINVAL);
	puts_at(at("job/LATEST"), "1234567890123\n"); /* 13 digits */
	ck_assert_int_eq(latest("job"), -EINVAL);
	puts_at(at("job/LATEST"), "");
	ck_assert_int_eq(latest("job"), -EINVAL);
	unlink(at("job/LATEST"));
	ck_assert_int_eq(mkfifo(at("job/LATEST"), 0644), 0); /* must not hang */
	ck_assert_int_eq(latest("job"), -EINVAL);
	unlink(at("job/LATEST"));
	puts_at(at("elsewhere"), "2\n");
	ck_assert_int_eq(symlink(at("elsewhere"), at("job/LATEST")), 0);
	ck_assert_int_eq(latest("job"), -ELOOP);
	/* a commit replaces the link itself, never what it points at */
	committed("job", 3);
	ck_assert_int_eq(latest("job"), 3);
	ck_assert_str_eq(slurp(at("elsewhere")), "2\n");
	/* a job directory that is a link */
	ck_assert_int_eq(symlink(at("job"), at("alias")), 0);
	ck_assert(is_link_error((int)latest("alias")));
	ck_assert_int_eq(latest("../job"), -EINVAL);
}
END_TEST

START_TEST(test_bad_names)
{
	struct storage_shard *sh = NULL;
	uint64_t size;

	ck_assert_int_eq(st->ops->shard_create(st, "../x", 1, 0, 10, &sh, err), -EINVAL);
	ck_assert_int_eq(st->ops->shard_create(st, "a/b", 1, 0, 10, &sh, err), -EINVAL);
	ck_assert_int_eq(st->ops->shard_create(st, "job", -1, 0, 10, &sh, err), -EINVAL);
	ck_assert_int_eq(st->ops->shard_create(st, "job", 1000000000000LL, 0, 10, &sh, err),
	                 -EINVAL);
	ck_assert_int_eq(st->ops->shard_create(st, "job", 1, -1, 10, &sh, err), -EINVAL);
	ck_assert_int_eq(st->ops->shard_open(st, "..", 1, 0, &sh, &size, err), -EINVAL);
	ck_assert_ptr_null(sh);
	ck_assert(!exists(at("job")));
}
END_TEST

/* ---- the write and read path through a real engine -------------------- */

struct save {
	struct io_req w[3];
	struct io_req fin;
	struct storage_shard *sh;
	pthread_mutex_t m;
	pthread_cond_t c;
	unsigned writes_done;
	bool finished;
	int64_t res;
};

static void fin_done(struct io_req *r)
{
	struct save *s = r->ctx;

	pthread_mutex_lock(&s->m);
	s->finished = true;
	s->res = r->res;
	pthread_cond_broadcast(&s->c);
	pthread_mutex_unlock(&s->m);
}

/* On the I/O thread: the last write to complete finishes the shard. */
static void write_done(struct io_req *r)
{
	struct save *s = r->ctx;
	bool last;

	pthread_mutex_lock(&s->m);
	if (r->res != (int64_t)r->len && s->res == 0)
		s->res = r->res < 0 ? r->res : -EIO;
	last = ++s->writes_done == 3;
	pthread_mutex_unlock(&s->m);
	if (last && s->res == 0) {
		s->fin.done = fin_done;
		s->fin.ctx = s;
		st->ops->shard_finish(s->sh, &s->fin);
	} else if (last) {
		fin_done(&(struct io_req){.ctx = s, .res = s->res});
	}
}

static void wait_finished(struct save *s)
{
	pthread_mutex_lock(&s->m);
	while (!s->finished)
		pthread_cond_wait(&s->c, &s->m);
	pthread_mutex_unlock(&s->m);
}

static void roundtrip(bool refuse_direct)
{
	struct ioeng_opts eo = {.kind = IOENG_AUTO, .queue_depth = 4};
	static struct save s;
	struct io_req rd = {0};
	struct manifest *m;
	struct ioeng *io;
	unsigned char *buf, *back;
	const char *why = NULL;
	struct stat sb;
	uint64_t size = 0;
	bool direct;

	ck_assert_int_eq(ioeng_create(&eo, &io, err), 0);
	storage_destroy(st);
	rec.refuse_direct = refuse_direct;
	open_backend(true, io);
	direct = local_direct(st, &why);
	ck_assert_ptr_nonnull(why);
	if (refuse_direct) {
		ck_assert(!direct);
		ck_assert_msg(strstr(why, "O_DIRECT refused") != NULL, "why: %s", why);
	}
	ck_assert_int_eq(posix_memalign((void **)&buf, 4096, 3 * 4096), 0);
	ck_assert_int_eq(posix_memalign((void **)&back, 4096, 3 * 4096), 0);
	for (unsigned i = 0; i < 3 * 4096; i++)
		buf[i] = (unsigned char)(i * 13 + 7);
	memset(back, 0, 3 * 4096);

	memset(&s, 0, sizeof(s));
	pthread_mutex_init(&s.m, NULL);
	pthread_cond_init(&s.c, NULL);
	ck_assert_msg(st->ops->shard_create(st, "rt", 7, 0, 10000, &s.sh, err) == 0, "create: %s",
	              err);
	for (unsigned i = 0; i < 3; i++) {
		s.w[i] = (struct io_req){.buf = buf + i * 4096,
		                         .len = 4096,
		                         .off = i * 4096,
		                         .buf_index = -1,
		                         .done = write_done,
		                         .ctx = &s};
		st->ops->shard_write(s.sh, &s.w[i]); /* the last one padded past 10000 */
	}
	wait_finished(&s);
	ck_assert_int_eq(s.res, 0);
	ck_assert_int_eq(s.fin.op, IO_FSYNC);
	st->ops->shard_close(s.sh);
	ck_assert_int_eq(stat(at("rt/step-000000000007/rank-00000.safetensors"), &sb), 0);
	ck_assert_int_eq(sb.st_size, 10000);

	m = mk_manifest("rt", 7, 10000);
	ck_assert_msg(st->ops->commit(st, m, err) == 0, "commit: %s", err);
	manifest_free(m);

	ck_assert_int_eq(st->ops->shard_open(st, "rt", 7, 0, &s.sh, &size, err), 0);
	ck_assert_uint_eq(size, 10000);
	pthread_mutex_lock(&s.m);
	s.finished = false;
	pthread_mutex_unlock(&s.m);
	rd = (struct io_req){
	    .buf = back, .len = 3 * 4096, .buf_index = -1, .done = fin_done, .ctx = &s};
	st->ops->shard_read(s.sh, &rd);
	wait_finished(&s);
	ck_assert_int_eq(s.res, 10000); /* the end of the file */
	ck_assert(memcmp(buf, back, 10000) == 0);
	st->ops->shard_close(s.sh);
	st->ops->shard_close(NULL);
	ck_assert_int_eq(st->ops->shard_open(st, "rt", 7, 1, &s.sh, &size, err), -ENOENT);
	ioeng_destroy(io);
	free(buf);
	free(back);
}

START_TEST(test_shard_roundtrip)
{
	roundtrip(false);
}
END_TEST

START_TEST(test_shard_roundtrip_no_direct)
{
	roundtrip(true);
}
END_TEST

START_TEST(test_shard_finish_fault)
{
	static struct save s;
	struct ioeng_opts eo = {.kind = IOENG_PWRITE, .queue_depth = 2};
	unsigned char *buf;
	struct ioeng *io;
	char p[256];

	ck_assert_int_eq(ioeng_create(&eo, &io, err), 0);
	storage_destroy(st);
	open_backend(false, io);
	ck_assert_int_eq(posix_memalign((void **)&buf, 4096, 3 * 4096), 0);
	memset(buf, 1, 3 * 4096);
	memset(&s, 0, sizeof(s));
	pthread_mutex_init(&s.m, NULL);
	pthread_cond_init(&s.c, NULL);
	ck_assert_int_eq(st->ops->shard_create(st, "ff", 1, 0, 9000, &s.sh, err), 0);
	st->ops->shard_path(st, "ff", 1, 0, p, sizeof(p));
	ck_assert_str_eq(p, at("ff/step-000000000001/rank-00000.safetensors"));
	rec_fail("ftruncate", "rank-00000.safetensors", 1, -EIO);
	for (unsigned i = 0; i < 3; i++) {
		s.w[i] = (struct io_req){.buf = buf + i * 4096,
		                         .len = 4096,
		                         .off = i * 4096,
		                         .buf_index = -1,
		                         .done = write_done,
		                         .ctx = &s};
		st->ops->shard_write(s.sh, &s.w[i]);
	}
	wait_finished(&s);
	ck_assert_int_eq(s.res, -EIO);
	rec_reset();
	st->ops->shard_close(s.sh);
	ioeng_destroy(io);
	free(buf);
}
END_TEST

START_TEST(test_direct_probe)
{
	const char *why = NULL;

	ck_assert(!local_direct(st, &why)); /* opened with direct = false */
	ck_assert_msg(strstr(why, "off") != NULL, "why: %s", why);
	storage_destroy(st);
	rec.refuse_direct = true;
	open_backend(true, NULL);
	ck_assert(!local_direct(st, &why));
	ck_assert_msg(strstr(why, "O_DIRECT refused") != NULL, "why: %s", why);
	ck_assert(!exists(at(".ckptd-direct-probe.%d", (int)getpid())));
}
END_TEST

/* Non-files planted where shards go: refused at once, and not taken for "no O_DIRECT". */
START_TEST(test_planted_shards)
{
	struct storage_shard *sh = NULL;
	const char *why;
	uint64_t size;

	storage_destroy(st);
	open_backend(true, NULL);
	if (!local_direct(st, &why))
		return; /* this directory refuses O_DIRECT: nothing to tell apart */
	mkdirs(at("job/step-000000000001/rank-00001.safetensors"));
	ck_assert_int_eq(mkfifo(at("job/step-000000000001/rank-00000.safetensors"), 0644), 0);
	ck_assert_int_lt(st->ops->shard_create(st, "job", 1, 0, 10, &sh, err), 0);
	ck_assert_int_lt(st->ops->shard_create(st, "job", 1, 1, 10, &sh, err), 0);
	ck_assert_int_lt(st->ops->shard_open(st, "job", 1, 0, &sh, &size, err), 0);
	ck_assert_int_lt(st->ops->shard_open(st, "job", 1, 1, &sh, &size, err), 0);
	ck_assert_ptr_null(sh);
	ck_assert_msg(local_direct(st, &why), "why: %s", why);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("local");
	TCase *tc = tcase_create("local");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_commit_sequence);
	tcase_add_loop_test(tc, test_commit_fault, 0, (int)(sizeof(faults) / sizeof(faults[0])));
	tcase_add_test(tc, test_commit_latest_forward_only);
	tcase_add_test(tc, test_commit_refuses_incomplete);
	tcase_add_test(tc, test_recover);
	tcase_add_test(tc, test_remove);
	tcase_add_test(tc, test_set_latest);
	tcase_add_test(tc, test_pin);
	tcase_add_test(tc, test_list_ignores_junk);
	tcase_add_test(tc, test_read_manifest_checks);
	tcase_add_test(tc, test_hostile_latest);
	tcase_add_test(tc, test_bad_names);
	tcase_add_test(tc, test_shard_roundtrip);
	tcase_add_test(tc, test_shard_roundtrip_no_direct);
	tcase_add_test(tc, test_shard_finish_fault);
	tcase_add_test(tc, test_direct_probe);
	tcase_add_test(tc, test_planted_shards);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
