/*
 * Unit tests of the local-filesystem backend (storage/local*.c) and of the
 * layout over it (storage/store.c), in a temporary root. The syscalls go
 * through a recording fsops table that can also fail the nth call of a kind
 * on a given name, so the tests assert the order of the durability steps of
 * an object put (temporary, fsync, link or rename, directory fsync) and what
 * a failure at each leaves behind (nothing visible); and count the fsyncs a
 * shard's finish sends through the I/O engine (the file and the two
 * directories that name it). Also: shards created exclusively and named by
 * node and attempt; LATEST only forward; the clean-up of a root shared by
 * several nodes (their work in progress untouched, this node's dead files
 * and abandoned steps removed); remove() out of sight first; pins; junk in
 * listings; hostile keys, LATEST, manifests and links; the O_DIRECT
 * fallback.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "storage/store.h"
#include "support/check_main.h"

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
	bool refuse_direct; /* O_DIRECT: -EINVAL, as tmpfs did */
	bool no_rename_flags; /* renameat2's flags: -EINVAL, as NFS says */
	/* races, played: before the first fsync (rename) of `on` (a pattern), run `race` */
	const char *race_on;
	void (*race)(void);
} rec = {.m = PTHREAD_MUTEX_INITIALIZER};

/* pattern, or a prefix of it when it ends in '*' (temporary names are random). */
static bool matches(const char *pattern, const char *name)
{
	size_t n = strlen(pattern);

	if (n && pattern[n - 1] == '*')
		return strncmp(name, pattern, n - 1) == 0;
	return strcmp(name, pattern) == 0;
}

static void race_at(const char *name)
{
	void (*fn)(void) = NULL;

	pthread_mutex_lock(&rec.m);
	if (rec.race_on && matches(rec.race_on, name)) {
		fn = rec.race;
		rec.race_on = NULL;
	}
	pthread_mutex_unlock(&rec.m);
	if (fn)
		fn();
}

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
	    (!rec.fail_name || matches(rec.fail_name, name)) && ++rec.seen == rec.fail_nth)
		rc = rec.fail_err;
	pthread_mutex_unlock(&rec.m);
	return rc;
}

static int r_openat(int dirfd, const char *path, int flags, mode_t mode)
{
	int rc = note("openat", base(path), "");

	if (rc)
		return rc;
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

	race_at(fdn(fd));
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
	race_at(base(op));
	return rc ? rc : fsops_posix.renameat(od, op, nd, np);
}

static int r_rename_noreplace(int dirfd, const char *from, const char *to)
{
	char extra[96];
	int rc;

	snprintf(extra, sizeof(extra), "->%s", base(to));
	rc = note("rename_noreplace", base(from), extra);
	if (rec.no_rename_flags)
		return -EINVAL;
	return rc ? rc : fsops_posix.rename_noreplace(dirfd, from, to);
}

static int r_linkat(int od, const char *op, int nd, const char *np)
{
	char extra[96];
	int rc;

	snprintf(extra, sizeof(extra), "->%s", base(np));
	rc = note("linkat", base(op), extra);
	return rc ? rc : fsops_posix.linkat(od, op, nd, np);
}

static int r_direct(int fd)
{
	int rc = note("direct", fdn(fd), "");

	if (rec.refuse_direct)
		return -EINVAL; /* as tmpfs did */
	return rc ? rc : fsops_posix.direct(fd);
}

/* Every request the I/O engine completes: "io-fsync:<name>" and so on. */
static int64_t r_io_result(const struct io_req *r, int64_t res)
{
	static const char *const ops[] = {
	    [IO_WRITE] = "io-write", [IO_READ] = "io-read", [IO_FSYNC] = "io-fsync"};
	int rc = note(ops[r->op], fdn(r->fd), "");

	return rc ? rc : res;
}

static int r_mkdirat(int dirfd, const char *path, mode_t mode)
{
	int rc = note("mkdirat", base(path), "");

	return rc ? rc : fsops_posix.mkdirat(dirfd, path, mode);
}

static int r_fallocate(int fd, off_t len)
{
	return fsops_posix.fallocate(fd, len); /* not recorded: no test here counts it */
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
    .fallocate = r_fallocate,
    .renameat = r_renameat,
    .rename_noreplace = r_rename_noreplace,
    .linkat = r_linkat,
    .mkdirat = r_mkdirat,
    .unlinkat = r_unlinkat,
    .direct = r_direct,
    .io_result = r_io_result,
};

static void rec_reset(void)
{
	pthread_mutex_lock(&rec.m);
	rec.n = 0;
	rec.fail_op = NULL;
	rec.fail_name = NULL;
	rec.fail_nth = rec.seen = 0;
	rec.fail_err = 0;
	rec.race_on = NULL;
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
static struct ioeng *reads; /* the fixture's engine: reads of shards' headers, unrecorded */

static void open_backend(bool direct, struct ioeng *io)
{
	struct local_opts o = {
	    .root = root, .node = "n0", .io = io, .ops = &rec_ops, .direct = direct};
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
	rec.no_rename_flags = false;
	rec_reset();
	err[0] = '\0';
	{
		struct ioeng_opts eo = {
		    .kind = IOENG_PWRITE, .queue_depth = 4, .ops = &fsops_posix};

		ck_assert_msg(ioeng_create(&eo, &reads, err) == 0, "%s", err);
	}
	open_backend(false, reads);
}

static void teardown(void)
{
	char cmd[600];

	storage_destroy(st);
	st = NULL;
	ioeng_destroy(reads);
	reads = NULL;
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

/* ---- helpers ------------------------------------------------------------ */

#define SHARD0 "rank-00000.n0.0.safetensors"

/* A one-rank manifest (run "r", node n0): one U8 tensor filling the file after 8 bytes. */
/*
 * The header of a shard of `size` bytes holding one U8 tensor "w" (all but
 * the header): into *hdr (malloc'd) where asked; its length is returned.
 */
static uint64_t shard_header(uint64_t size, void **hdr)
{
	uint64_t hl = 64;
	void *buf = NULL;
	size_t len = 0;

	for (int i = 0; i < 3; i++) { /* the header's length has the data's in it */
		int64_t n = (int64_t)(size - hl);
		const struct st_tensor t = {"w", ipc_dtype_from_name("U8"), 1, &n, 0, (uint64_t)n};

		free(buf);
		ck_assert_msg(st_header_build(&t, 1, NULL, 0, &buf, &len, err) == 0, "%s", err);
		if (len == hl)
			break;
		hl = len;
	}
	ck_assert_uint_eq(len, hl);
	if (hdr)
		*hdr = buf;
	else
		free(buf);
	return hl;
}

static struct manifest *mk_manifest(const char *job, int64_t step, uint64_t size)
{
	struct manifest *m = calloc(1, sizeof(*m));
	const uint64_t hl = shard_header(size, NULL);

	ck_assert_ptr_nonnull(m);
	m->version = MANIFEST_VERSION_HOLDS;
	m->job = strdup(job);
	m->run = strdup("r");
	m->step = step;
	m->world = 1;
	m->time_unix_ns = 1;
	m->nranks = 1;
	m->ranks = calloc(1, sizeof(*m->ranks));
	m->ranks[0] = (struct manifest_rank){
	    .rank = 0, .file = strdup(SHARD0), .size = size, .header_bytes = hl};
	m->nparts = 1;
	m->parts = calloc(1, sizeof(*m->parts));
	m->parts[0] = (struct manifest_part){
	    .node = strdup("n0"), .nranks = 1, .ranks = calloc(1, sizeof(int))};
	m->bytes = size;
	m->ntensors = 1;
	m->tensors = calloc(1, sizeof(*m->tensors));
	m->tensors[0].name = strdup("w");
	m->tensors[0].dtype = ipc_dtype_from_name("U8");
	m->tensors[0].ndim = 1;
	m->tensors[0].global_shape[0] = (int64_t)(size - hl);
	m->tensors[0].nchunks = 1;
	m->tensors[0].chunks = calloc(1, sizeof(*m->tensors[0].chunks));
	m->tensors[0].chunks[0].shape[0] = (int64_t)(size - hl);
	m->tensors[0].chunks[0].begin = hl;
	m->tensors[0].chunks[0].end = size;
	return m;
}

/* A step's directory and one shard of `node`, as its write side leaves them. */
/* A shard of node's, of `size` bytes: a safetensors file where it can hold one (mk_manifest's). */
static void mk_shard_of(const char *job, int64_t step, uint64_t size, const char *node)
{
	char *data = calloc(1, size);
	void *hdr;

	if (size >= 96) {
		uint64_t hl = shard_header(size, &hdr);

		memcpy(data, hdr, hl);
		free(hdr);
	}

	mkdirs(at("%s/step-%012lld", job, (long long)step));
	put(at("%s/step-%012lld/rank-00000.%s.0.safetensors", job, (long long)step, node), data,
	    size);
	free(data);
}

static void mk_shard(const char *job, int64_t step, uint64_t size)
{
	mk_shard_of(job, step, size, "n0");
}

/* A directory opened through a link: O_NOFOLLOW | O_DIRECTORY says ENOTDIR. */
static bool is_link_error(int rc)
{
	return (rc == -ELOOP || rc == -ENOTDIR) && strstr(err, "link") != NULL;
}

static void committed(const char *job, int64_t step)
{
	struct manifest *m = mk_manifest(job, step, 100);

	mk_shard(job, step, 100);
	ck_assert_msg(store_put_manifest(st, m, err) == 0, "manifest: %s", err);
	ck_assert_msg(store_latest_advance(st, job, step, err) == 0, "LATEST: %s", err);
	manifest_free(m);
}

static int64_t latest(const char *job)
{
	int64_t step = -1;
	int rc = store_latest_get(st, job, &step, err);

	return rc < 0 ? rc : step;
}

static int put_obj(const char *key, const char *text, enum obj_put_mode mode)
{
	return st->ops->obj_put(st, key, text, strlen(text), mode, err);
}

/* The index in the log of the first entry starting with `prefix` at or after `from`; -1. */
static int find_log(const char *prefix, int from)
{
	for (unsigned i = (unsigned)from; i < rec.n; i++)
		if (strncmp(rec.log[i], prefix, strlen(prefix)) == 0)
			return (int)i;
	return -1;
}

static unsigned count_dot(const char *dir, const char *prefix)
{
	char cmd[1200], *out;
	FILE *f;
	unsigned n = 0;

	snprintf(cmd, sizeof(cmd), "ls -a '%s' | grep -c '^%s' || true", dir, prefix);
	f = popen(cmd, "r");
	ck_assert_ptr_nonnull(f);
	out = fgets(cmd, sizeof(cmd), f);
	if (out)
		n = (unsigned)atoi(out);
	pclose(f);
	return n;
}

/* ---- objects ------------------------------------------------------------ */

/*
 * A put, create-once: each new directory made durable in its parent; the
 * bytes under a temporary name and fsync'd before a link makes them
 * visible; then the directory fsync'd; no temporary left.
 */
START_TEST(test_put_sequence)
{
	const char *key = "job/step-000000000005/parts/n0.json";
	int w, s, l, d, mk, mks;
	char *buf;
	size_t len;

	ck_assert_msg(put_obj(key, "{\"a\":1}", OBJ_CREATE) == 0, "%s", err);
	mk = find_log("mkdirat:parts", 0);
	mks = find_log("fsync:step-000000000005", 0);
	w = find_log("pwrite:.n0~", 0);
	s = find_log("fsync:.n0~", 0);
	l = find_log("linkat:.n0~", 0);
	d = find_log("fsync:parts", 0);
	ck_assert_msg(mk >= 0 && mks > mk, "parts/ made, then its parent fsync'd");
	ck_assert_msg(w > mks && s > w && l > s && d > l,
	              "write %d, fsync %d, link %d, directory fsync %d", w, s, l, d);
	ck_assert_msg(strstr(rec.log[l], "->n0.json"), "%s", rec.log[l]);
	ck_assert(find_log("unlinkat:.n0~", l) > l); /* the temporary name goes */
	ck_assert_uint_eq(count_dot(at("job/step-000000000005/parts"), "\\."), 2); /* . and .. */
	ck_assert_int_eq(st->ops->obj_get(st, key, 100, &buf, &len, err), 0);
	ck_assert_str_eq(buf, "{\"a\":1}");
	free(buf);
}
END_TEST

static const struct {
	const char *op, *name;
	int err;
	bool visible; /* the failure comes after the object is in place */
} put_faults[] = {
    {"openat", ".n0~*", -EACCES, false}, {"pwrite", ".n0~*", -ENOSPC, false},
    {"fsync", ".n0~*", -EIO, false},     {"linkat", ".n0~*", -EIO, false},
    {"fsync", "parts", -EIO, true},      {"mkdirat", "parts", -EDQUOT, false},
};

/* A failure at each step: the error comes back; before the link nothing is visible. */
START_TEST(test_put_faults)
{
	const char *key = "job/step-000000000002/parts/n0.json";
	char *buf = NULL;
	size_t len;
	int rc;

	mkdirs(at("job/step-000000000002"));
	rec_fail(put_faults[_i].op, put_faults[_i].name, 1, put_faults[_i].err);
	rc = put_obj(key, "part", OBJ_CREATE);
	ck_assert_msg(rec.seen >= 1, "fault %d not reached", _i);
	rec_reset();
	ck_assert_msg(rc == put_faults[_i].err, "fault %d: rc %d (%s)", _i, rc, err);
	ck_assert_msg(strstr(err, "step-000000000002/parts"), "the message names the path: %s",
	              err);
	ck_assert_int_eq(exists(at("%s", key)), put_faults[_i].visible);
	if (exists(at("job/step-000000000002/parts")))
		ck_assert_uint_eq(count_dot(at("job/step-000000000002/parts"), "\\.n0~"), 0);
	/* once the disk behaves: create-once says whether it is there */
	rc = put_obj(key, "part", OBJ_CREATE);
	ck_assert_int_eq(rc, put_faults[_i].visible ? -EEXIST : 0);
	ck_assert_int_eq(st->ops->obj_get(st, key, 100, &buf, &len, err), 0);
	ck_assert_str_eq(buf, "part");
	free(buf);
}
END_TEST

START_TEST(test_create_once_replace)
{
	const char *key = "job/plans/n0.json";
	char *buf = NULL, **names;
	uint64_t size = 0;
	size_t len, n;

	ck_assert_int_eq(put_obj(key, "one", OBJ_CREATE), 0);
	ck_assert_int_eq(put_obj(key, "two", OBJ_CREATE), -EEXIST);
	ck_assert_msg(strstr(err, "exists already"), "%s", err);
	ck_assert_str_eq(slurp(at("%s", key)), "one");
	ck_assert_int_eq(put_obj(key, "three", OBJ_REPLACE), 0);
	ck_assert_str_eq(slurp(at("%s", key)), "three");
	ck_assert_int_eq(st->ops->obj_stat(st, key, &size, err), 0);
	ck_assert_uint_eq(size, 5);
	ck_assert_int_eq(st->ops->obj_get(st, key, 4, &buf, &len, err), -EFBIG);
	/* listing: objects only, sorted; no temporary, directory or link */
	ck_assert_int_eq(put_obj("job/plans/a.json", "x", OBJ_CREATE), 0);
	puts_at(at("job/plans/.n9~0123456789abcdef~n9.json.tmp"), "half");
	mkdirs(at("job/plans/sub"));
	ck_assert_int_eq(symlink(at("job/plans/a.json"), at("job/plans/l.json")), 0);
	ck_assert_int_eq(st->ops->obj_list(st, "job/plans", &names, &n, err), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_str_eq(names[0], "a.json");
	ck_assert_str_eq(names[1], "n0.json");
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	ck_assert_int_eq(st->ops->obj_list(st, "job", &names, &n, err), -EINVAL);
	ck_assert_int_eq(st->ops->obj_list(st, "job/none", &names, &n, err), -ENOENT);
	/* deleted durably; twice: ENOENT */
	rec_reset();
	ck_assert_int_eq(st->ops->obj_delete(st, key, err), 0);
	ck_assert_str_eq(rec.log[rec.n - 1], "fsync:plans");
	ck_assert_int_eq(st->ops->obj_delete(st, key, err), -ENOENT);
	ck_assert_int_eq(st->ops->obj_get(st, key, 100, &buf, &len, err), -ENOENT);
	ck_assert_int_eq(st->ops->obj_stat(st, key, &size, err), -ENOENT);
}
END_TEST

START_TEST(test_bad_keys)
{
	static const char *const bad[] = {
	    "../x/y", "job/../x",    ".job/x",      "job//x", "job",      "/job/x",
	    "job/x/", "job/a/b/c/d", "job/.hidden", "a b/x",  "job/\x01", NULL,
	};
	char long_key[300], *buf;
	size_t len;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ck_assert_msg(put_obj(bad[i] ? bad[i] : "", "x", OBJ_CREATE) == -EINVAL, "%s",
		              bad[i] ? bad[i] : "NULL");
		ck_assert_int_eq(st->ops->obj_get(st, bad[i], 10, &buf, &len, err), -EINVAL);
	}
	snprintf(long_key, sizeof(long_key), "job/%0200d", 1);
	ck_assert_int_eq(put_obj(long_key, "x", OBJ_CREATE), -EINVAL);
	ck_assert(!exists(at("job")));
	ck_assert(!exists(at("x")));
}
END_TEST

START_TEST(test_hostile_objects)
{
	char *buf = NULL;
	size_t len;
	int fd;

	mkdirs(at("job/step-000000000001"));
	puts_at(at("elsewhere"), "secret");
	ck_assert_int_eq(symlink(at("elsewhere"), at("job/step-000000000001/manifest.json")), 0);
	ck_assert_int_lt(
	    st->ops->obj_get(st, "job/step-000000000001/manifest.json", 100, &buf, &len, err), 0);
	/* a put replaces the link itself, never what it points at */
	ck_assert_int_eq(put_obj("job/step-000000000001/manifest.json", "mine", OBJ_REPLACE), 0);
	ck_assert_str_eq(slurp(at("elsewhere")), "secret");
	ck_assert_int_eq(mkfifo(at("job/step-000000000001/pinned"), 0644), 0); /* must not hang */
	ck_assert_int_lt(st->ops->obj_get(st, "job/step-000000000001/pinned", 100, &buf, &len, err),
	                 0);
	ck_assert_int_eq(symlink(at("job"), at("alias")), 0); /* a link on the way */
	ck_assert_int_lt(put_obj("alias/step-000000000001/x.json", "x", OBJ_CREATE), 0);
	ck_assert(!exists(at("job/step-000000000001/x.json")));
	fd = open(at("job/step-000000000001/big.json"), O_WRONLY | O_CREAT, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)MANIFEST_MAX_BYTES + 1), 0); /* sparse */
	close(fd);
	ck_assert_int_eq(st->ops->obj_get(st, "job/step-000000000001/big.json", MANIFEST_MAX_BYTES,
	                                  &buf, &len, err),
	                 -EFBIG);
}
END_TEST

/* ---- manifests and LATEST ------------------------------------------------ */

START_TEST(test_manifest_once)
{
	struct manifest *m = mk_manifest("job", 2, 100), *back = NULL;
	char *text;

	mk_shard("job", 2, 100);
	ck_assert_int_eq(store_put_manifest(st, m, err), 0);
	ck_assert_int_eq(store_put_manifest(st, m, err), -EEXIST);
	ck_assert_int_eq(store_read_manifest(st, "job", 2, &back, err), 0);
	ck_assert_str_eq(back->run, "r");
	ck_assert_str_eq(back->ranks[0].file, SHARD0);
	manifest_free(back);
	text = strdup(slurp(at("job/step-000000000002/manifest.json")));
	/* copied to another step, or another job: refused */
	mkdirs(at("job/step-000000000003"));
	puts_at(at("job/step-000000000003/manifest.json"), text);
	ck_assert_int_eq(store_read_manifest(st, "job", 3, &back, err), -EINVAL);
	ck_assert_msg(strstr(err, "step 2") != NULL, "err: %s", err);
	mkdirs(at("job/step-000000000005"));
	puts_at(at("job/step-000000000005/manifest.json"), "{\"format\": 12");
	ck_assert_int_lt(store_read_manifest(st, "job", 5, &back, err), 0);
	ck_assert_msg(strstr(err, "step-000000000005/manifest.json") != NULL, "err: %s", err);
	ck_assert_int_eq(store_read_manifest(st, "job", 9, &back, err), -ENOENT);
	ck_assert_int_eq(store_read_manifest(st, "../job", 2, &back, err), -EINVAL);
	ck_assert_ptr_null(back);
	free(text);
	manifest_free(m);
}
END_TEST

START_TEST(test_latest)
{
	char big[200];

	committed("job", 10);
	committed("job", 5); /* late: an older step */
	ck_assert_int_eq(latest("job"), 10);
	ck_assert_str_eq(slurp(at("job/LATEST")), "10\n");
	committed("job", 11);
	ck_assert_int_eq(latest("job"), 11);
	/* hostile contents: refused, never a hang */
	puts_at(at("job/LATEST"), "12abc\n");
	ck_assert_int_eq(latest("job"), -EINVAL);
	ck_assert_msg(strstr(err, "LATEST") != NULL, "err: %s", err);
	memset(big, '1', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	puts_at(at("job/LATEST"), big);
	ck_assert_int_eq(latest("job"), -EINVAL);
	puts_at(at("job/LATEST"), "1234567890123\n");
	ck_assert_int_eq(latest("job"), -EINVAL);
	puts_at(at("job/LATEST"), "");
	ck_assert_int_eq(latest("job"), -EINVAL);
	unlink(at("job/LATEST"));
	ck_assert_int_eq(mkfifo(at("job/LATEST"), 0644), 0);
	ck_assert_int_lt(latest("job"), 0);
	unlink(at("job/LATEST"));
	puts_at(at("elsewhere"), "2\n");
	ck_assert_int_eq(symlink(at("elsewhere"), at("job/LATEST")), 0);
	ck_assert_int_lt(latest("job"), 0);
	/* an advance replaces the link itself, never what it points at */
	ck_assert_int_eq(store_latest_advance(st, "job", 12, err), 0);
	ck_assert_int_eq(latest("job"), 12);
	ck_assert_str_eq(slurp(at("elsewhere")), "2\n");
	ck_assert_int_eq(latest("../job"), -EINVAL);
}
END_TEST

/* ---- shards ------------------------------------------------------------- */

/* Never opened over a file that is there: a manifest may name it. */
START_TEST(test_shard_exclusive)
{
	struct storage_shard *sh = NULL;
	char file[SHARD_FILE_MAX];

	mkdirs(at("job/step-000000000001"));
	puts_at(at("job/step-000000000001/" SHARD0), "committed bytes");
	mkdirs(at("job/step-000000000001/rank-00000.n0.1.safetensors")); /* a directory */
	ck_assert_int_eq(mkfifo(at("job/step-000000000001/rank-00000.n0.2.safetensors"), 0644), 0);
	ck_assert_msg(st->ops->shard_create(st, "job", 1, 0, 10, file, &sh, err) == 0, "%s", err);
	ck_assert_str_eq(file, "rank-00000.n0.3.safetensors");
	st->ops->shard_close(sh);
	ck_assert_str_eq(slurp(at("job/step-000000000001/" SHARD0)), "committed bytes");
	/* another node's attempt 0 of the same rank is another name */
	storage_destroy(st);
	{
		struct local_opts o = {.root = root, .node = "n1", .ops = &rec_ops};

		ck_assert_int_eq(local_create(&o, &st, err), 0);
	}
	ck_assert_int_eq(st->ops->shard_create(st, "job", 1, 0, 10, file, &sh, err), 0);
	ck_assert_str_eq(file, "rank-00000.n1.0.safetensors");
	st->ops->shard_close(sh);
}
END_TEST

START_TEST(test_bad_names)
{
	struct storage_shard *sh = NULL;
	char file[SHARD_FILE_MAX];
	uint64_t size;

	ck_assert_int_eq(st->ops->shard_create(st, "../x", 1, 0, 10, file, &sh, err), -EINVAL);
	ck_assert_int_eq(st->ops->shard_create(st, "a/b", 1, 0, 10, file, &sh, err), -EINVAL);
	ck_assert_int_eq(st->ops->shard_create(st, "job", -1, 0, 10, file, &sh, err), -EINVAL);
	ck_assert_int_eq(st->ops->shard_create(st, "job", 1000000000000LL, 0, 10, file, &sh, err),
	                 -EINVAL);
	ck_assert_int_eq(st->ops->shard_create(st, "job", 1, -1, 10, file, &sh, err), -EINVAL);
	ck_assert_int_eq(st->ops->shard_open(st, "..", 1, SHARD0, &sh, &size, err), -EINVAL);
	ck_assert_int_eq(st->ops->shard_open(st, "job", 1, "../../etc/passwd", &sh, &size, err),
	                 -EINVAL);
	ck_assert_int_eq(st->ops->shard_open(st, "job", 1, ".hidden", &sh, &size, err), -EINVAL);
	ck_assert_int_eq(st->ops->shard_stat(st, "job", 1, "a/b", &size, err), -EINVAL);
	ck_assert_int_eq(st->ops->shard_unlink(st, "job", 1, "..", err), -EINVAL);
	ck_assert_ptr_null(sh);
	ck_assert(!exists(at("job")));
	/* a node name that is no name: no backend */
	storage_destroy(st);
	{
		struct local_opts o = {.root = root, .node = "a/b", .ops = &rec_ops};

		ck_assert_int_eq(local_create(&o, &st, err), -EINVAL);
		ck_assert_ptr_null(st);
	}
	open_backend(false, NULL);
}
END_TEST

/* One backend per node name on a root at a time: a second is refused, naming the node. */
START_TEST(test_one_agent_per_node)
{
	struct local_opts same = {.root = root, .node = "n0", .ops = &rec_ops};
	struct local_opts other = {.root = root, .node = "n1", .ops = &rec_ops};
	struct storage *b = NULL;

	char pid[32];

	ck_assert_int_eq(local_create(&same, &b, err), -EBUSY);
	ck_assert_msg(strstr(err, "another agent runs as node n0"), "%s", err);
	/* The holder wrote its pid into the lock, and the refusal names it. */
	snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
	ck_assert_str_eq(slurp(at(".node.n0.lock")), pid);
	snprintf(pid, sizeof(pid), "ckptd pid %d (lock ", (int)getpid());
	ck_assert_msg(strstr(err, pid), "%s", err);
	ck_assert_ptr_null(b);
	ck_assert_msg(local_create(&other, &b, err) == 0, "%s", err);
	storage_destroy(b);
	storage_destroy(st); /* the first goes: the name is free */
	st = NULL;
	ck_assert_msg(local_create(&same, &st, err) == 0, "%s", err);
}
END_TEST

/*
 * The root removed under a live backend: missing. Made again: opened again,
 * the node's lock taken in it, and objects go there. Not writable, and the
 * lock file removed from under it: said, and the lock taken again.
 */
START_TEST(test_root_check)
{
	struct local_opts same = {.root = root, .node = "n0", .ops = &rec_ops};
	struct storage *b = NULL;
	char cmd[1200];
	bool reopened = true;

	ck_assert_msg(st->ops->root_check(st, &reopened, err) == 0, "%s", err);
	ck_assert(!reopened);
	ck_assert_uint_eq(count_dot(root, "\\.n0~"), 0); /* the probe is gone */
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	ck_assert_int_eq(system(cmd), 0);
	ck_assert_int_eq(st->ops->root_check(st, &reopened, err), -ENOENT);
	ck_assert_msg(strstr(err, root) && strstr(err, "is missing"), "%s", err);
	ck_assert_int_lt(st->ops->obj_put(st, "job/x", "1", 1, OBJ_CREATE, err), 0);

	ck_assert_int_eq(mkdir(root, 0755), 0);
	ck_assert_msg(st->ops->root_check(st, &reopened, err) == 0, "%s", err);
	ck_assert(reopened);
	ck_assert_msg(st->ops->obj_put(st, "job/x", "1", 1, OBJ_CREATE, err) == 0, "%s", err);
	ck_assert_str_eq(slurp(at("job/x")), "1");
	ck_assert_int_eq(local_create(&same, &b, err), -EBUSY); /* the lock is in the new root */
	ck_assert_msg(st->ops->root_check(st, &reopened, err) == 0 && !reopened, "%s", err);

	rec_fail("openat", ".n0~*", 1, -EROFS);
	ck_assert_int_eq(st->ops->root_check(st, &reopened, err), -EROFS);
	ck_assert_msg(strstr(err, "is not writable"), "%s", err);
	rec_reset();

	ck_assert_int_eq(unlink(at(".node.n0.lock")), 0);
	ck_assert_msg(st->ops->root_check(st, &reopened, err) == 0, "%s", err);
	ck_assert(exists(at(".node.n0.lock")));
	ck_assert_int_eq(local_create(&same, &b, err), -EBUSY);
	ck_assert_ptr_null(b);
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

/* Writes a 10000-byte shard of (rt, 7) through a real engine and finishes it. */
static void write_shard(struct save *s, unsigned char *buf, char *file, enum ioeng_kind kind,
                        struct ioeng **io)
{
	struct ioeng_opts eo = {.kind = kind, .queue_depth = 4, .ops = &rec_ops};

	ck_assert_int_eq(ioeng_create(&eo, io, err), 0);
	storage_destroy(st);
	open_backend(true, *io);
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->m, NULL);
	pthread_cond_init(&s->c, NULL);
	ck_assert_msg(st->ops->shard_create(st, "rt", 7, 0, 10000, file, &s->sh, err) == 0,
	              "create: %s", err);
	for (unsigned i = 0; i < 3; i++) {
		s->w[i] = (struct io_req){.buf = buf + i * 4096,
		                          .len = 4096,
		                          .off = i * 4096,
		                          .buf_index = -1,
		                          .done = write_done,
		                          .ctx = s};
		st->ops->shard_write(s->sh, &s->w[i]); /* the last one padded past 10000 */
	}
	wait_finished(s);
}

static void roundtrip(bool refuse_direct, enum ioeng_kind kind)
{
	static struct save s;
	char file[SHARD_FILE_MAX];
	struct io_req rd = {0};
	struct ioeng *io;
	unsigned char *buf, *back;
	const char *why = NULL;
	const char *want[] = {"io-fsync:" SHARD0, "io-fsync:step-000000000007", "io-fsync:rt"};
	struct ioeng_stats ist;
	unsigned k = 0;
	struct stat sb;
	uint64_t size = 0;

	rec.refuse_direct = refuse_direct;
	ck_assert_int_eq(posix_memalign((void **)&buf, 4096, 3 * 4096), 0);
	ck_assert_int_eq(posix_memalign((void **)&back, 4096, 3 * 4096), 0);
	for (unsigned i = 0; i < 3 * 4096; i++)
		buf[i] = (unsigned char)(i * 13 + 7);
	memset(back, 0, 3 * 4096);
	rec_reset();
	write_shard(&s, buf, file, kind, &io);
	ck_assert_int_eq(s.res, 0);
	ck_assert_str_eq(file, SHARD0);
	/* DURABLE: the file's fsync, then the directories that name it, in that order */
	for (unsigned i = 0; i < rec.n; i++)
		if (strncmp(rec.log[i], "io-fsync:", 9) == 0) {
			ck_assert_msg(k < 3 && strcmp(rec.log[i], want[k]) == 0, "fsync %u: %s", k,
			              rec.log[i]);
			k++;
		}
	ck_assert_uint_eq(k, 3);
	/*
	 * ... and each went out: to the kernel as an fsync (io_uring: the SQE's
	 * opcode; the pwrite engine: the fsync call itself, recorded), not only
	 * finished as one.
	 */
	ioeng_get_stats(io, &ist);
	ck_assert_uint_eq(ist.fsyncs, 3);
	ck_assert_uint_eq(ist.fsyncs_issued, 3);
	if (strcmp(ioeng_name(io), "pwrite") == 0)
		ck_assert_msg(find_log("fsync:" SHARD0, 0) >= 0, "fsync(2) of the shard file");
	if (refuse_direct)
		ck_assert(!local_direct(st, &why) && strstr(why, "O_DIRECT refused"));
	st->ops->shard_close(s.sh);
	ck_assert_int_eq(stat(at("rt/step-000000000007/" SHARD0), &sb), 0);
	ck_assert_int_eq(sb.st_size, 10000);
	ck_assert_int_eq(st->ops->shard_stat(st, "rt", 7, SHARD0, &size, err), 0);
	ck_assert_uint_eq(size, 10000);

	ck_assert_int_eq(st->ops->shard_open(st, "rt", 7, SHARD0, &s.sh, &size, err), 0);
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
	/* a failed attempt's file goes */
	ck_assert_int_eq(st->ops->shard_unlink(st, "rt", 7, SHARD0, err), 0);
	ck_assert_int_eq(st->ops->shard_open(st, "rt", 7, SHARD0, &s.sh, &size, err), -ENOENT);
	ck_assert_int_eq(st->ops->shard_stat(st, "rt", 7, SHARD0, &size, err), -ENOENT);
	ioeng_destroy(io);
	free(buf);
	free(back);
}

START_TEST(test_shard_roundtrip)
{
	roundtrip(false, IOENG_AUTO);
}
END_TEST

START_TEST(test_shard_roundtrip_no_direct)
{
	roundtrip(true, IOENG_PWRITE);
}
END_TEST

/* A failed truncate, or fsync of the file or of either directory: the finish fails. */
START_TEST(test_shard_finish_fault)
{
	static const char *const faults[][2] = {
	    {"ftruncate", SHARD0},
	    {"io-fsync", SHARD0},
	    {"io-fsync", "step-000000000007"},
	    {"io-fsync", "rt"},
	};
	static struct save s;
	unsigned char *buf;
	char file[SHARD_FILE_MAX];
	struct ioeng *io;

	ck_assert_int_eq(posix_memalign((void **)&buf, 4096, 3 * 4096), 0);
	memset(buf, 1, 3 * 4096);
	rec_fail(faults[_i][0], faults[_i][1], 1, -EIO);
	write_shard(&s, buf, file, IOENG_PWRITE, &io);
	ck_assert_msg(s.res == -EIO, "fault %d: %lld", _i, (long long)s.res);
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
	ck_assert_uint_eq(count_dot(root, "\\.direct-probe"), 0);
}
END_TEST

/* ---- removal and pins --------------------------------------------------- */

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
	ck_assert_msg(store_remove(st, "job", 3, err) == 0, "remove: %s", err);
	/* out of sight by one rename, made durable before the files go */
	for (unsigned i = 0; i < rec.n; i++) {
		if (strncmp(rec.log[i], "renameat:step-000000000003->.trash.step-000000000003.n0.",
		            56) == 0)
			renamed = true;
		else if (renamed && !synced && strncmp(rec.log[i], "fsync:", 6) == 0)
			synced = strcmp(rec.log[i], "fsync:job") == 0;
		else if (renamed && strncmp(rec.log[i], "unlinkat:", 9) == 0)
			ck_assert_msg(synced, "files deleted before the rename was durable");
	}
	ck_assert(renamed && synced);
	ck_assert(!exists(at("job/step-000000000003")));
	ck_assert_uint_eq(count_dot(at("job"), "\\.trash"), 0);
	ck_assert_int_eq(latest("job"), 2); /* the newest committed left, not 4 */
	ck_assert_int_eq(store_remove(st, "job", 1, err), 0);
	ck_assert_int_eq(latest("job"), 2);
	ck_assert_int_eq(store_remove(st, "job", 2, err), 0);
	ck_assert_int_eq(latest("job"), -ENOENT);
	ck_assert_int_eq(store_remove(st, "job", 2, err), -ENOENT);
	ck_assert_int_eq(store_remove(st, "job", 4, err), 0); /* uncommitted too */
	ck_assert_int_eq(st->ops->list_steps(st, "job", &steps, &n, err), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_ptr_null(steps);
	ck_assert_int_eq(store_remove(st, "nojob", 1, err), -ENOENT);
	ck_assert_int_eq(store_remove(st, "../job", 1, err), -EINVAL);
}
END_TEST

/* A pin: an object put durably (file, then directory), listed, gone with the step. */
START_TEST(test_pin)
{
	struct storage_step *steps;
	int w, l, d;
	size_t n;

	committed("job", 1);
	committed("job", 2);
	mk_shard("job", 3, 100); /* never committed */
	rec_reset();
	ck_assert_msg(store_set_pinned(st, "job", 1, true, err) == 0, "pin: %s", err);
	w = find_log("fsync:.n0~", 0);
	l = find_log("renameat:.n0~", 0);
	d = find_log("fsync:step-000000000001", 0);
	ck_assert_msg(w >= 0 && l > w && d > l, "marker, its fsync, rename, the directory's");
	ck_assert(exists(at("job/step-000000000001/pinned")));
	ck_assert_int_eq(store_set_pinned(st, "job", 1, true, err), 0); /* again: fine */
	ck_assert_int_eq(st->ops->list_steps(st, "job", &steps, &n, err), 0);
	ck_assert_uint_eq(n, 3);
	ck_assert(steps[0].committed && steps[0].pinned);
	ck_assert(steps[1].committed && !steps[1].pinned);
	ck_assert(!steps[2].committed && !steps[2].pinned);
	free(steps);
	ck_assert_int_eq(store_set_pinned(st, "job", 3, true, err), -ENOENT);
	ck_assert_msg(strstr(err, "not committed"), "%s", err);
	ck_assert_int_eq(store_set_pinned(st, "job", 9, true, err), -ENOENT);
	ck_assert_int_eq(store_set_pinned(st, "../job", 1, true, err), -EINVAL);
	rec_reset();
	ck_assert_int_eq(store_set_pinned(st, "job", 1, false, err), 0);
	ck_assert(!exists(at("job/step-000000000001/pinned")));
	ck_assert_str_eq(rec.log[rec.n - 1], "fsync:step-000000000001");
	ck_assert_int_eq(store_set_pinned(st, "job", 1, false, err), 0);
	/* a pin on disk keeps it, whoever's catalog knows of it */
	ck_assert_int_eq(store_set_pinned(st, "job", 2, true, err), 0);
	ck_assert_int_eq(store_remove(st, "job", 2, err), -EBUSY);
	ck_assert_msg(strstr(err, "pinned"), "%s", err);
	ck_assert(exists(at("job/step-000000000002/manifest.json")));
	ck_assert_int_eq(store_set_pinned(st, "job", 2, false, err), 0);
	ck_assert_int_eq(store_remove(st, "job", 2, err), 0);
	ck_assert(!exists(at("job/step-000000000002")));
}
END_TEST

/* ---- the clean-up of a shared root -------------------------------------- */

/* Sets a path's mtime `age` seconds back. */
static void age(const char *p, int64_t secs)
{
	struct timespec ts[2];

	clock_gettime(CLOCK_REALTIME, &ts[0]);
	ts[0].tv_sec -= secs;
	ts[1] = ts[0];
	ck_assert_int_eq(utimensat(AT_FDCWD, p, ts, AT_SYMLINK_NOFOLLOW), 0);
}

static int cleanup(bool at_start, struct storage_recovery *r)
{
	struct storage_cleanup pol = {3600, (int64_t)time(NULL), at_start};

	memset(r, 0, sizeof(*r));
	return store_cleanup(st, NULL, &pol, r, err);
}

START_TEST(test_cleanup)
{
	struct storage_recovery r;

	committed("job", 1);
	committed("job", 3);
	puts_at(at("job/step-000000000003/.n0~0123456789abcdef~manifest.json.tmp"), "{");
	/* 2: uncommitted, older than LATEST, untouched for two hours: abandoned */
	mk_shard_of("job", 2, 100, "n5");
	age(at("job/step-000000000002/rank-00000.n5.0.safetensors"), 7200);
	age(at("job/step-000000000002"), 7200);
	/* 4: another node saving right now: untouched */
	mk_shard_of("job", 4, 100, "n5");
	/* 5: ours alone, no part of ours: the save died with us */
	mk_shard("job", 5, 100);
	/* 6: ours and another node's, no part of ours: ours goes, theirs stays */
	mk_shard("job", 6, 100);
	put(at("job/step-000000000006/rank-00001.n5.0.safetensors"), "x", 1);
	/* 7: ours with our part written: a commit may be using it */
	mk_shard("job", 7, 100);
	mkdirs(at("job/step-000000000007/parts"));
	puts_at(at("job/step-000000000007/parts/n0.json"), "{}");
	/* 0: older than LATEST but fresh: another node may still commit it */
	mk_shard_of("job", 0, 100, "n5");
	/* leftovers: a removal cut short; temporaries, ours and others', fresh and old */
	mkdirs(at("job/.trash.step-000000000008.n0.1.1/sub")); /* ours */
	mkdirs(at("job/.trash.step-000000000008.n5.1.1/sub")); /* another node's, fresh */
	mkdirs(at("job/.trash.step-000000000009.n5.1.1/sub")); /* another node's, old */
	age(at("job/.trash.step-000000000009.n5.1.1"), 7200);
	puts_at(at("job/.n0~0123456789abcdef~LATEST.tmp"), "7\n");
	puts_at(at("job/.n5~0123456789abcdef~LATEST.tmp"), "7\n");
	/* a node named "x.n0" is not node n0 */
	puts_at(at("job/.x.n0~0123456789abcdef~LATEST.tmp"), "7\n");
	mkdirs(at("job/plans"));
	puts_at(at("job/plans/.n6~0123456789abcdef~n6.json.tmp"), "old");
	age(at("job/plans/.n6~0123456789abcdef~n6.json.tmp"), 7200);
	puts_at(at("job/notes.txt"), "mine");

	/* while running: nothing of ours is dead yet */
	ck_assert_msg(cleanup(false, &r) == 0, "%s", err);
	ck_assert(exists(at("job/step-000000000005/" SHARD0)));
	ck_assert(exists(at("job/.n0~0123456789abcdef~LATEST.tmp")));
	ck_assert(!exists(at("job/step-000000000002"))); /* abandoned goes either way */
	ck_assert_uint_eq(r.partial_removed, 1);
	ck_assert_int_eq(latest("job"), 3);

	ck_assert_msg(cleanup(true, &r) == 0, "%s", err);
	ck_assert(exists(at("job/step-000000000004/rank-00000.n5.0.safetensors")));
	ck_assert(!exists(at("job/step-000000000005")));
	ck_assert(!exists(at("job/step-000000000006/" SHARD0)));
	ck_assert(exists(at("job/step-000000000006/rank-00001.n5.0.safetensors")));
	ck_assert(exists(at("job/step-000000000007/" SHARD0)));
	ck_assert(exists(at("job/step-000000000000/rank-00000.n5.0.safetensors")));
	ck_assert(!exists(at("job/.trash.step-000000000008.n0.1.1")));
	ck_assert(exists(at("job/.trash.step-000000000008.n5.1.1"))); /* may yet go back */
	ck_assert(!exists(at("job/.trash.step-000000000009.n5.1.1")));
	ck_assert(!exists(at("job/.n0~0123456789abcdef~LATEST.tmp")));
	ck_assert(exists(at("job/.n5~0123456789abcdef~LATEST.tmp"))); /* another node's, fresh */
	ck_assert(exists(at("job/.x.n0~0123456789abcdef~LATEST.tmp")));
	ck_assert(!exists(at("job/plans/.n6~0123456789abcdef~n6.json.tmp")));
	ck_assert(!exists(at("job/step-000000000003/.n0~0123456789abcdef~manifest.json.tmp")));
	ck_assert(exists(at("job/step-000000000003/manifest.json")));
	ck_assert(exists(at("job/notes.txt")));
	ck_assert_uint_eq(r.partial_removed, 1); /* 5 */
	ck_assert_uint_eq(r.own_removed, 2); /* 5's and 6's */
	ck_assert_uint_eq(r.partial_kept, 4); /* 0, 4, 6, 7 */
	ck_assert_int_eq(latest("job"), 3);
	/* again: nothing more to do */
	ck_assert_int_eq(cleanup(true, &r), 0);
	ck_assert_uint_eq(r.partial_removed + r.own_removed + r.temp_removed + r.latest_fixed, 0);
}
END_TEST

/* LATEST after a clean-up: the newest committed step; off a step that is gone. */
START_TEST(test_cleanup_latest)
{
	struct storage_recovery r;

	committed("j3", 4);
	puts_at(at("j3/LATEST"), "9\n"); /* names a step that is gone */
	mk_shard("j2", 5, 10);
	puts_at(at("j2/LATEST"), "5\n"); /* names a step never committed */
	committed("j4", 2);
	committed("j4", 6);
	puts_at(at("j4/LATEST"), "2\n"); /* behind */
	ck_assert_int_eq(cleanup(true, &r), 0);
	ck_assert_uint_eq(r.latest_fixed, 3);
	ck_assert_int_eq(latest("j3"), 4);
	ck_assert_int_eq(latest("j2"), -ENOENT);
	ck_assert_int_eq(latest("j4"), 6);
}
END_TEST

/* The step a manifest goes into is taken out of sight as it is written: no commit. */
static void move_step_away(void)
{
	ck_assert_int_eq(rename(at("job/step-000000000002"), at("job/.trash.step-000000000002.x")),
	                 0);
}

START_TEST(test_manifest_into_moved_step)
{
	struct manifest *m = mk_manifest("job", 2, 100);

	mk_shard("job", 2, 100);
	/* after the link, at the directory's fsync: a clean-up renames the step away */
	rec.race_on = "step-000000000002";
	rec.race = move_step_away;
	ck_assert_int_eq(store_put_manifest(st, m, err), -ESTALE);
	ck_assert_msg(strstr(err, "taken out of sight"), "%s", err);
	/* and never into a step directory made anew */
	ck_assert_int_eq(store_put_manifest(st, m, err), -ENOENT);
	ck_assert(!exists(at("job/step-000000000002")));
	manifest_free(m);
}
END_TEST

/* A commit lands just as the clean-up takes an "abandoned" step: it goes back, whole. */
static void commit_step_2(void)
{
	struct manifest *m = mk_manifest("job", 2, 100);
	char *json;
	size_t len;

	ck_assert_int_eq(manifest_to_json(m, &json, &len, err), 0);
	put(at("job/step-000000000002/manifest.json"), json, len);
	free(json);
	manifest_free(m);
}

START_TEST(test_cleanup_spares_late_commit)
{
	struct storage_recovery r;

	committed("job", 3);
	mk_shard_of("job", 2, 100, "n0");
	age(at("job/step-000000000002/" SHARD0), 7200);
	age(at("job/step-000000000002"), 7200);
	rec.race_on = "step-000000000002"; /* as it is renamed out of sight */
	rec.race = commit_step_2;
	ck_assert_msg(cleanup(false, &r) == 0, "%s", err);
	ck_assert(exists(at("job/step-000000000002/manifest.json")));
	ck_assert(exists(at("job/step-000000000002/" SHARD0)));
	ck_assert_uint_eq(r.partial_removed, 0);
	ck_assert_uint_eq(count_dot(at("job"), "\\.trash"), 0);
}
END_TEST

/* ... and another node's late writer made the step's name anew meanwhile: the committed one wins.
 */
static void commit_step_2_and_recreate(void)
{
	struct manifest *m = mk_manifest("job", 2, 100);
	char trash[512], *json;
	struct dirent *d;
	size_t len;
	DIR *dir = opendir(at("job"));

	ck_assert_ptr_nonnull(dir);
	trash[0] = '\0';
	while ((d = readdir(dir)))
		if (strncmp(d->d_name, ".trash.step-000000000002.", 25) == 0)
			snprintf(trash, sizeof(trash), "job/%s/manifest.json", d->d_name);
	closedir(dir);
	ck_assert_msg(trash[0], "the step is out of sight when the race runs");
	ck_assert_int_eq(manifest_to_json(m, &json, &len, err), 0);
	put(at("%s", trash), json, len);
	free(json);
	manifest_free(m);
	mkdirs(at("job/step-000000000002/parts"));
	puts_at(at("job/step-000000000002/parts/n3.json"), "{}");
}

START_TEST(test_cleanup_late_commit_name_taken)
{
	struct storage_recovery r;

	rec.no_rename_flags = _i == 1; /* as over NFS */
	committed("job", 3);
	mk_shard_of("job", 2, 100, "n0");
	age(at("job/step-000000000002/" SHARD0), 7200);
	age(at("job/step-000000000002"), 7200);
	rec.race_on = "job"; /* at the fsync after the rename out of sight */
	rec.race = commit_step_2_and_recreate;
	ck_assert_msg(cleanup(false, &r) == 0, "%s", err);
	ck_assert(exists(at("job/step-000000000002/manifest.json")));
	ck_assert(exists(at("job/step-000000000002/" SHARD0)));
	ck_assert(!exists(at("job/step-000000000002/parts/n3.json")));
	ck_assert_uint_eq(r.partial_removed, 0);
	ck_assert_uint_eq(count_dot(at("job"), "\\.trash"), 0);
	/* and the next start-up keeps it: a checkpoint */
	ck_assert_msg(cleanup(true, &r) == 0, "%s", err);
	ck_assert(exists(at("job/step-000000000002/" SHARD0)));
}
END_TEST

/* Pinned through another node just before the removal takes the step: it goes back. */
static void pin_step_2(void)
{
	puts_at(at("job/step-000000000002/pinned"), "");
}

static void pin_step_3(void)
{
	puts_at(at("job/step-000000000003/pinned"), "");
}

START_TEST(test_remove_pinned_meanwhile)
{
	rec.no_rename_flags = _i == 1; /* as over NFS */
	committed("job", 2);
	committed("job", 3);
	rec.race_on = "step-000000000002"; /* as it is renamed out of sight */
	rec.race = pin_step_2;
	ck_assert_int_eq(store_remove(st, "job", 2, err), -EBUSY);
	ck_assert_msg(strstr(err, "pinned"), "%s", err);
	ck_assert(exists(at("job/step-000000000002/manifest.json")));
	ck_assert(exists(at("job/step-000000000002/" SHARD0)));
	ck_assert(exists(at("job/step-000000000002/pinned")));
	ck_assert_uint_eq(count_dot(at("job"), "\\.trash"), 0);
	/* LATEST itself: it moves off as the removal starts, and back when the step stays */
	rec.race_on = "step-000000000003";
	rec.race = pin_step_3;
	ck_assert_int_eq(store_remove(st, "job", 3, err), -EBUSY);
	ck_assert(exists(at("job/step-000000000003/manifest.json")));
	ck_assert_int_eq(latest("job"), 3);
}
END_TEST

/* A pin as another node removes the step: an error, and no step directory made anew. */
START_TEST(test_pin_into_moved_step)
{
	committed("job", 2);
	committed("job", 3);
	rec.race_on = "step-000000000002"; /* at the pin's directory fsync */
	rec.race = move_step_away;
	ck_assert_int_eq(store_set_pinned(st, "job", 2, true, err), -ENOENT);
	ck_assert_msg(strstr(err, "removed as it was being pinned"), "%s", err);
	ck_assert(!exists(at("job/step-000000000002")));
}
END_TEST

/*
 * This machine's clock two hours ahead of the shared filesystem's: another
 * node's fresh files are fresh, and what is old by the storage's clock goes.
 */
START_TEST(test_cleanup_clock_ahead)
{
	struct storage_cleanup pol = {3600, (int64_t)time(NULL) + 7200, false};
	struct storage_recovery r = {0};

	committed("job", 1);
	committed("job", 3);
	mk_shard_of("job", 2, 100, "n5"); /* written just now, not yet committed */
	puts_at(at("job/.n5~0123456789abcdef~LATEST.tmp"), "3\n");
	puts_at(at("job/.n6~0123456789abcdef~LATEST.tmp"), "3\n");
	age(at("job/.n6~0123456789abcdef~LATEST.tmp"), 7200);
	ck_assert_msg(store_cleanup(st, "job", &pol, &r, err) == 0, "%s", err);
	ck_assert(exists(at("job/step-000000000002/rank-00000.n5.0.safetensors")));
	ck_assert(exists(at("job/.n5~0123456789abcdef~LATEST.tmp")));
	ck_assert(!exists(at("job/.n6~0123456789abcdef~LATEST.tmp")));
	ck_assert_uint_eq(r.partial_removed, 0);
	ck_assert_uint_eq(count_dot(at("job"), "\\.n0~"), 0); /* the clock probe is gone */
}
END_TEST

/* Another node commits 12 and moves LATEST while a clean-up repairs it to 11: 12 stays. */
static void commit_12(void)
{
	struct manifest *m = mk_manifest("j5", 12, 100);
	char *json;
	size_t len;

	mk_shard("j5", 12, 100);
	ck_assert_int_eq(manifest_to_json(m, &json, &len, err), 0);
	put(at("j5/step-000000000012/manifest.json"), json, len);
	free(json);
	manifest_free(m);
	puts_at(at("j5/LATEST"), "12\n");
}

START_TEST(test_latest_fix_race)
{
	struct storage_recovery r;

	committed("j5", 10);
	committed("j5", 11);
	puts_at(at("j5/LATEST"), "10\n"); /* behind: the writer of 11 died before moving it */
	rec.race_on = ".n0~*"; /* as the repair's temporary LATEST is written */
	rec.race = commit_12;
	ck_assert_msg(cleanup(false, &r) == 0, "%s", err);
	ck_assert_int_eq(latest("j5"), 12);
}
END_TEST

/* A LATEST that names no checkpoint says nothing about what is abandoned. */
START_TEST(test_cleanup_planted_latest)
{
	struct storage_recovery r;

	committed("job", 1);
	mk_shard_of("job", 5, 100, "n5"); /* another node's, to commit by hand, say */
	age(at("job/step-000000000005/rank-00000.n5.0.safetensors"), 7200);
	age(at("job/step-000000000005"), 7200);
	puts_at(at("job/LATEST"), "999999999999\n");
	ck_assert_msg(cleanup(true, &r) == 0, "%s", err);
	ck_assert(exists(at("job/step-000000000005/rank-00000.n5.0.safetensors")));
	ck_assert_uint_eq(r.partial_removed, 0);
	ck_assert_int_eq(latest("job"), 1);
}
END_TEST

/*
 * Step `step` committed as an agent writes it: its shard's header stamped
 * with (step, save), the manifest naming that save.
 */
static void stamped(const char *job, int64_t step, uint64_t save)
{
	const int64_t n = 32;
	const struct st_tensor t = {"w", ipc_dtype_from_name("U8"), 1, &n, 0, (uint64_t)n};
	const struct st_meta meta[] = {
	    {"run", "r"}, {"rank", "0"}, {"step", ST_STAMP_STEP}, {"save", ST_STAMP_SAVE}};
	const struct st_stamp stamp = {step, save};
	struct st_stamp_at sat;
	struct manifest *m;
	void *hdr;
	size_t hl;
	char *data;

	ck_assert_msg(st_header_build(&t, 1, meta, 4, &hdr, &hl, err) == 0, "%s", err);
	ck_assert_msg(st_stamp_find(hdr, hl, &sat, err) == 0, "%s", err);
	st_stamp_apply(&sat, &stamp, 0, hdr, hl);
	data = calloc(1, hl + 32);
	memcpy(data, hdr, hl);
	mkdirs(at("%s/step-%012lld", job, (long long)step));
	put(at("%s/step-%012lld/" SHARD0, job, (long long)step), data, hl + 32);
	m = mk_manifest(job, step, hl + 32); /* with this header: */
	m->ranks[0].header_bytes = hl;
	m->tensors[0].global_shape[0] = m->tensors[0].chunks[0].shape[0] = n;
	m->tensors[0].chunks[0].begin = hl;
	m->ranks[0].save = save;
	ck_assert_msg(store_put_manifest(st, m, err) == 0, "manifest: %s", err);
	ck_assert_msg(store_latest_advance(st, job, step, err) == 0, "LATEST: %s", err);
	manifest_free(m);
	free(data);
	free(hdr);
}

/* A copy of step 3's manifest.json as step `to`'s, its step rewritten. */
static void forge_manifest(const char *job, int64_t to)
{
	json_t *m = json_load_file(at("%s/step-000000000003/manifest.json", job), 0, NULL);

	ck_assert_ptr_nonnull(m);
	json_object_set_new(m, "step", json_integer(to));
	mkdirs(at("%s/step-%012lld", job, (long long)to));
	ck_assert_int_eq(
	    json_dump_file(m, at("%s/step-%012lld/manifest.json", job, (long long)to), 0), 0);
	json_decref(m);
}

/*
 * A forged manifest (a real one copied under a newer step, its step
 * rewritten) is not taken as LATEST at start: the files it names are not
 * there (0), or are step 3's, whose headers say step 3 (1: the whole step
 * directory copied). A real newer step, whole, is (2).
 */
START_TEST(test_forged_manifest_not_latest)
{
	struct storage_recovery r;

	stamped("job", 1, 0x1111);
	stamped("job", 3, 0x3333);
	ck_assert_int_eq(latest("job"), 3);
	if (_i == 1) {
		mkdirs(at("job/step-000000000099"));
		ck_assert_int_eq(
		    link(at("job/step-000000000003/" SHARD0), at("job/step-000000000099/" SHARD0)),
		    0);
	}
	if (_i < 2)
		forge_manifest("job", 99);
	else
		stamped("job", 99, 0x9999);
	puts_at(at("job/LATEST"), "3\n"); /* as the last real commit left it */
	ck_assert_msg(cleanup(true, &r) == 0, "%s", err);
	ck_assert_int_eq(latest("job"), _i < 2 ? 3 : 99);
	ck_assert_int_eq(store_step_intact(st, "job", 99, err), _i < 2 ? -EBADMSG : 0);
	if (_i < 2)
		ck_assert_msg(
		    strstr(err, _i == 0 ? "No such file" : "not save 0000000000003333 of step 99"),
		    "%s", err);
	/* and a LATEST that names nothing falls on the newest whole step, not on 99 */
	puts_at(at("job/LATEST"), "1000\n");
	ck_assert_msg(cleanup(true, &r) == 0, "%s", err);
	ck_assert_int_eq(latest("job"), _i < 2 ? 3 : 99);
	/* removing LATEST (3) moves it to the newest whole step other than it */
	if (_i < 2) {
		ck_assert_int_eq(store_remove(st, "job", 3, err), 0);
		ck_assert_int_eq(latest("job"), 1);
	}
}
END_TEST

/* ---- listings ----------------------------------------------------------- */

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

Suite *test_suite(void)
{
	Suite *s = suite_create("local");
	TCase *tc = tcase_create("local");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_put_sequence);
	tcase_add_loop_test(tc, test_put_faults, 0,
	                    (int)(sizeof(put_faults) / sizeof(put_faults[0])));
	tcase_add_test(tc, test_create_once_replace);
	tcase_add_test(tc, test_bad_keys);
	tcase_add_test(tc, test_hostile_objects);
	tcase_add_test(tc, test_manifest_once);
	tcase_add_test(tc, test_latest);
	tcase_add_test(tc, test_shard_exclusive);
	tcase_add_test(tc, test_bad_names);
	tcase_add_test(tc, test_shard_roundtrip);
	tcase_add_test(tc, test_shard_roundtrip_no_direct);
	tcase_add_loop_test(tc, test_shard_finish_fault, 0, 4);
	tcase_add_test(tc, test_direct_probe);
	tcase_add_test(tc, test_remove);
	tcase_add_test(tc, test_pin);
	tcase_add_test(tc, test_one_agent_per_node);
	tcase_add_test(tc, test_root_check);
	tcase_add_test(tc, test_cleanup);
	tcase_add_test(tc, test_cleanup_latest);
	tcase_add_test(tc, test_list_ignores_junk);
	tcase_add_test(tc, test_manifest_into_moved_step);
	tcase_add_test(tc, test_cleanup_spares_late_commit);
	tcase_add_loop_test(tc, test_cleanup_late_commit_name_taken, 0, 2);
	tcase_add_loop_test(tc, test_remove_pinned_meanwhile, 0, 2);
	tcase_add_test(tc, test_pin_into_moved_step);
	tcase_add_test(tc, test_cleanup_clock_ahead);
	tcase_add_test(tc, test_latest_fix_race);
	tcase_add_test(tc, test_cleanup_planted_latest);
	tcase_add_loop_test(tc, test_forged_manifest_not_latest, 0, 3);
	suite_add_tcase(s, tc);
	return s;
}
