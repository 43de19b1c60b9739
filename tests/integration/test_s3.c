/*
 * Object storage: real agents with an s3:// root on a real Ceph RADOS
 * Gateway that the test command starts (scripts/rgw.sh; its env file names
 * the endpoint, the credentials and the helper's directory). Skipped (77)
 * where no gateway runs (CKPT_TEST_S3_ENDPOINT unset). Trainer ranks are
 * test_cluster's rank processes (`test_cluster --rank ...`).
 *
 *   - shards below, at and above the part size (5 MiB chunks), not multiples
 *     of 4096: saved, committed, restored byte-exact, verified; each shard
 *     object downloaded with curl loads in the safetensors library; no
 *     multipart upload left behind
 *   - world 8 over 4 agents on one bucket: every step commits on the store,
 *     the manifest lists 8 ranks and 4 parts, every rank restores LATEST
 *   - the store stopped in the middle of an upload: the save FAILS naming
 *     the HTTP failure, the agent keeps serving, the checkpoint before is
 *     intact, its upload is aborted once the store is back, and the next
 *     save commits
 *   - compressed (--s3-compress, --upload-compress): shards of one part and
 *     of three on an s3 root, and on an upload tier, restored and verified
 *     (on the root also by the agent restarted with compression off);
 *     each object, downloaded and put through `zstd -d`, loads in the
 *     safetensors library as what was saved
 *   - bad credentials, a missing bucket, an unreachable endpoint, a
 *     credentials file others can read: the agent does not start, and says
 *     why
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "harness.h"

static const char *endpoint, *creds, *region, *rgwdir;
static unsigned bucket_seq;

/* ---- the gateway, through scripts/rgw.sh ------------------------------- */

/* Runs `scripts/rgw.sh CMD DIR ARGS`; its stdout into out (if given); its exit code. */
static int rgw(char *out, size_t len, const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int rgw(char *out, size_t len, const char *cmd, const char *fmt, ...)
{
	char args[1024], line[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	snprintf(line, sizeof(line), "%s/scripts/rgw.sh %s '%s' %s", CKPT_SOURCE_DIR, cmd, rgwdir,
	         args);
	return h_run(out, len, line);
}

/* A fresh bucket for one test: "ckt-<pid>-<n>". */
static void new_bucket(char *name, size_t len)
{
	snprintf(name, len, "ckt-%d-%u", (int)getpid(), bucket_seq++);
	ck_assert_msg(rgw(NULL, 0, "mkbucket", "%s", name) == 0, "cannot make bucket %s", name);
}

/* The multipart uploads open in a bucket ("<Upload>" elements of ListMultipartUploads). */
static int open_uploads(const char *bucket)
{
	char out[65536];
	int n = 0;

	ck_assert_int_eq(rgw(out, sizeof(out), "curl", "-s '%s/%s?uploads='", endpoint, bucket), 0);
	ck_assert_msg(strstr(out, "ListMultipartUploadsResult"), "not a listing: %s", out);
	for (const char *p = out; (p = strstr(p, "<Upload>")); p++)
		n++;
	return n;
}

/* Downloads bucket/key into path with curl: its HTTP status. */
static int download(const char *bucket, const char *key, const char *path)
{
	char out[64];

	rgw(out, sizeof(out), "curl", "-s -o '%s' -w '%%{http_code}' '%s/%s/%s'", path, endpoint,
	    bucket, key);
	return atoi(out);
}

static void s3_args(char *buf, size_t len, const char *extra)
{
	snprintf(buf, len,
	         "--s3-endpoint %s --s3-credentials %s --s3-region %s --chunk-mb 5 --staging-mb 64 "
	         "--s3-max-tries 3 %s",
	         endpoint, creds, region, extra ? extra : "");
}

/* ---- trainer ranks: test_cluster's ----------------------------------------- */

static pid_t spawn_rank(const struct agent_proc *a, const char *job, int rank, int world,
                        long first, long last, long mb, const char *mode, int *out_fd)
{
	return h_spawn_rank(CKPT_CLUSTER_BIN, a, job, "0", rank, world, first, last, mb, mode,
	                    out_fd, false);
}

#define read_all h_read_all

/* Ranks spread over agents a[0..n): saves first..last, each COMMITTED (or as mode says). */
static void save_mode(struct agent_proc *a, int n, const char *job, int world, long first,
                      long last, long mb, const char *mode)
{
	pid_t pid[16];

	for (int r = 0; r < world; r++)
		pid[r] = spawn_rank(&a[r * n / world], job, r, world, first, last, mb, mode, NULL);
	for (int r = 0; r < world; r++)
		ck_assert_msg(h_reap(pid[r]) == 0, "rank %d of %s (steps %ld..%ld) did not %s", r,
		              job, first, last, mode);
}

static void save_all(struct agent_proc *a, int n, const char *job, int world, long first, long last,
                     long mb)
{
	save_mode(a, n, job, world, first, last, mb, "commit");
}

/* Every rank restores LATEST, byte-exact with its meta: the step. */
static long restore_all(struct agent_proc *a, int n, const char *job, int world, long mb)
{
	pid_t pid[16];
	int fd[16];
	char out[64];
	long step = -2;

	for (int r = 0; r < world; r++)
		pid[r] = spawn_rank(&a[r * n / world], job, r, world, 0, 0, mb, "restore", &fd[r]);
	for (int r = 0; r < world; r++) {
		read_all(fd[r], out, sizeof(out));
		ck_assert_msg(h_reap(pid[r]) == 0, "rank %d of %s could not restore LATEST", r,
		              job);
		ck_assert_msg(step == -2 || step == atol(out), "ranks restored different steps");
		step = atol(out);
	}
	return step;
}

static void start_on(struct agent_proc *a, const char *bucket, const char *node, const char *extra)
{
	char root[128], args[1024];

	snprintf(root, sizeof(root), "s3://%s/ckpt", bucket);
	s3_args(args, sizeof(args), extra);
	h_agent_start_node(a, root, node, args);
}

static json_t *manifest_of(const struct agent_proc *a, const char *bucket, const char *job,
                           long step)
{
	char key[256], path[400];
	json_error_t je;
	json_t *m;

	snprintf(key, sizeof(key), "ckpt/%s/step-%012ld/manifest.json", job, step);
	snprintf(path, sizeof(path), "%s/manifest.%ld.json", a->dir, step);
	ck_assert_int_eq(download(bucket, key, path), 200);
	m = json_load_file(path, 0, &je);
	ck_assert_msg(m, "%s: %s", path, je.text);
	return m;
}

/* ---- the tests ----------------------------------------------------------- */

/*
 * MiB of the rank's second tensor: with the 64 KiB first one and the
 * header, 1 is one part (a single PUT), 4 is just under a part, 12 is three
 * parts; no size is a multiple of 4096 (the header's length is not).
 */
static const long sizes[] = {1, 4, 12};

START_TEST(roundtrip_part_sizes)
{
	struct agent_proc a = {0};
	char bucket[64], job[32], key[256], file[400], cmd[1200], out[4096];
	long mb = sizes[_i];
	json_t *m;

	new_bucket(bucket, sizeof(bucket));
	start_on(&a, bucket, "n0", NULL);
	snprintf(job, sizeof(job), "rt%ld", mb);
	save_all(&a, 1, job, 2, 1, 2, mb);
	ck_assert_int_eq(restore_all(&a, 1, job, 2, mb), 2);
	ck_assert_msg(h_ctl(&a, out, sizeof(out), "verify %s 2", job) == 0, "verify: %s", out);
	ck_assert_msg(strstr(out, "OK"), "%s", out);

	/* each shard object, fetched with curl, is a safetensors file of what was saved */
	m = manifest_of(&a, bucket, job, 2);
	for (int r = 0; r < 2; r++) {
		json_t *rank = json_array_get(json_object_get(m, "ranks"), (size_t)r);
		const char *name = json_string_value(json_object_get(rank, "file"));
		json_int_t size = json_integer_value(json_object_get(rank, "size"));

		ck_assert_msg(name && size > 0, "manifest rank %d: no file or size", r);
		ck_assert_msg(size % 4096 != 0, "rank %d's shard is a multiple of 4096", r);
		snprintf(key, sizeof(key), "ckpt/%s/step-%012d/%s", job, 2, name);
		snprintf(file, sizeof(file), "%s/rank%d.safetensors", a.dir, r);
		ck_assert_int_eq(download(bucket, key, file), 200);
		snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s' 2 %d %ld", CKPT_PYTHON, CKPT_S3_LOAD,
		         file, r, mb);
		ck_assert_msg(system(cmd) == 0, "%s: does not load as what was saved", cmd);
	}
	json_decref(m);
	ck_assert_int_eq(open_uploads(bucket), 0);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	h_agent_cleanup(&a);
}
END_TEST

START_TEST(world8_over_four_agents)
{
	struct agent_proc a[4] = {{0}};
	char bucket[64], node[8];
	json_t *m;

	new_bucket(bucket, sizeof(bucket));
	for (int i = 0; i < 4; i++) {
		snprintf(node, sizeof(node), "n%d", i);
		start_on(&a[i], bucket, node, NULL);
	}
	save_all(a, 4, "wide", 8, 1, 2, 6);
	ck_assert_int_eq(restore_all(a, 4, "wide", 8, 6), 2);
	m = manifest_of(&a[0], bucket, "wide", 2);
	ck_assert_int_eq(json_array_size(json_object_get(m, "ranks")), 8);
	ck_assert_int_eq(json_array_size(json_object_get(m, "parts")), 4);
	json_decref(m);
	ck_assert_int_eq(open_uploads(bucket), 0);
	for (int i = 0; i < 4; i++) {
		ck_assert_int_eq(h_agent_stop(&a[i]), 0);
		h_agent_cleanup(&a[i]);
	}
}
END_TEST

/* The agent's bytes sent to the store so far (ckptctl status --json). */
static long long bytes_sent(const struct agent_proc *a)
{
	char out[16384];
	const char *p;

	if (h_ctl(a, out, sizeof(out), "status --json") != 0)
		return -1;
	p = strstr(out, "\"bytes_written\"");
	return p ? atoll(strchr(p, ':') + 1) : -1;
}

START_TEST(store_stops_mid_upload)
{
	struct agent_proc a = {0};
	char bucket[64], reason[1024], out[4096];
	long long base;
	int fd, tries = 0;
	pid_t pid;

	new_bucket(bucket, sizeof(bucket));
	start_on(&a, bucket, "n0", "--s3-timeout 5");
	save_all(&a, 1, "cut", 1, 1, 1, 1);
	base = bytes_sent(&a);
	ck_assert_int_gt(base, 0);

	/* 200 MiB through a 64 MiB pool: the upload goes on well after the save starts */
	pid = spawn_rank(&a, "cut", 0, 1, 2, 2, 200, "expect-fail", &fd);
	while (bytes_sent(&a) < base + (16 << 20) && tries++ < 2000)
		usleep(5000);
	ck_assert_msg(bytes_sent(&a) >= base + (16 << 20), "the upload never started");
	ck_assert_int_eq(rgw(NULL, 0, "stop-gw", "%s", ""), 0);
	read_all(fd, reason, sizeof(reason));
	ck_assert_int_eq(h_reap(pid), 0);
	ck_assert_msg(strstr(reason, "s3://") && (strstr(reason, "curl") || strstr(reason, "HTTP")),
	              "the reason does not name the failure: %s", reason);
	fprintf(stderr, "store stopped mid-upload: FAILED: %s", reason);
	/* the agent still serves while the store is away */
	ck_assert_msg(h_ctl(&a, out, sizeof(out), "status") == 0, "%s", out);
	ck_assert_int_eq(rgw(NULL, 0, "start-gw", "%s", ""), 0);

	/* what was committed before is whole; the failed upload is aborted once the store is back
	 */
	ck_assert_int_eq(restore_all(&a, 1, "cut", 1, 1), 1);
	for (tries = 0; open_uploads(bucket) > 0 && tries < 100; tries++)
		usleep(200000);
	ck_assert_msg(open_uploads(bucket) == 0, "a multipart upload is left behind");
	save_all(&a, 1, "cut", 1, 3, 3, 1);
	ck_assert_int_eq(restore_all(&a, 1, "cut", 1, 1), 3);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * A compressed shard object key of bucket: downloaded, `zstd -d` of it
 * loads as what rank saved at step (mb). The object's size.
 */
static long long zstd_loads(const char *dir, const char *bucket, const char *key, long step,
                            int rank, long mb)
{
	char zfile[400], file[400], cmd[1400];
	struct stat st;

	snprintf(zfile, sizeof(zfile), "%s/rank%d.safetensors.zst", dir, rank);
	snprintf(file, sizeof(file), "%s/rank%d.safetensors", dir, rank);
	ck_assert_int_eq(download(bucket, key, zfile), 200);
	ck_assert_int_eq(stat(zfile, &st), 0);
	snprintf(cmd, sizeof(cmd), "zstd -q -d -f '%s' -o '%s' && '%s' '%s' '%s' %ld %d %ld", zfile,
	         file, CKPT_PYTHON, CKPT_S3_LOAD, file, step, rank, mb);
	ck_assert_msg(system(cmd) == 0, "%s: does not decompress into what was saved", cmd);
	return (long long)st.st_size;
}

/*
 * --s3-compress: a shard of one part (a single PUT with its seek table) and
 * one of three parts (frames padded to S3's smallest part, the seek table
 * a part of its own): saved, restored from the frames, verified; each
 * object goes through `zstd -d` into the safetensors file; the agent,
 * restarted with compression off, restores and verifies them still.
 */
static const long zsizes[] = {1, 12};

START_TEST(roundtrip_compressed)
{
	struct agent_proc a = {0}, b = {0};
	char bucket[64], job[32], key[256], out[4096];
	long mb = zsizes[_i];
	json_t *m;

	new_bucket(bucket, sizeof(bucket));
	start_on(&a, bucket, "n0", "--s3-compress zstd");
	ck_assert_msg(h_ctl(&a, out, sizeof(out), "status") == 0, "%s", out);
	ck_assert_msg(strstr(out, "zstd level 1"), "status does not say it compresses: %s", out);
	snprintf(job, sizeof(job), "z%ld", mb);
	save_all(&a, 1, job, 2, 1, 2, mb);
	ck_assert_int_eq(restore_all(&a, 1, job, 2, mb), 2);
	ck_assert_msg(h_ctl(&a, out, sizeof(out), "verify %s 2", job) == 0, "verify: %s", out);
	m = manifest_of(&a, bucket, job, 2);
	for (int r = 0; r < 2; r++) {
		json_t *rank = json_array_get(json_object_get(m, "ranks"), (size_t)r);
		const char *name = json_string_value(json_object_get(rank, "file"));
		json_int_t size = json_integer_value(json_object_get(rank, "size"));
		long long stored;

		ck_assert_msg(name && size > 0, "manifest rank %d: no file or size", r);
		snprintf(key, sizeof(key), "ckpt/%s/step-%012d/%s", job, 2, name);
		stored = zstd_loads(a.dir, bucket, key, 2, r, mb);
		/* one frame, no padding: the periodic test bytes shrink */
		if (mb == 1)
			ck_assert_msg(stored < size / 4, "rank %d: %lld bytes stored for %lld", r,
			              stored, (long long)size);
	}
	json_decref(m);
	ck_assert_int_eq(open_uploads(bucket), 0);
	ck_assert_int_eq(h_agent_stop(&a), 0);

	/* restarted with compression off, it still reads what it compressed */
	start_on(&b, bucket, "n0", NULL);
	ck_assert_int_eq(restore_all(&b, 1, job, 2, mb), 2);
	ck_assert_msg(h_ctl(&b, out, sizeof(out), "verify %s 2", job) == 0, "verify: %s", out);
	ck_assert_int_eq(h_agent_stop(&b), 0);
	h_agent_cleanup(&b);
	h_agent_cleanup(&a);
}
END_TEST

/* ---- the upload tier --------------------------------------------------- */

struct tiered {
	char dir[256], root[300], bucket[64];
	struct agent_proc a[2];
	int n;
};

/* n agents on one directory root, with an upload tier in a fresh bucket. */
static void tiered_start(struct tiered *t, int n, const char *extra)
{
	const char *tmp = getenv("CK_TMPDIR") ? getenv("CK_TMPDIR") : "/tmp";
	char args[1024], more[512], node[8];

	memset(t, 0, sizeof(*t));
	snprintf(t->dir, sizeof(t->dir), "%s/cks3.XXXXXX", tmp);
	ck_assert(mkdtemp(t->dir));
	snprintf(t->root, sizeof(t->root), "%s/shared", t->dir);
	new_bucket(t->bucket, sizeof(t->bucket));
	snprintf(more, sizeof(more), "--upload-root s3://%s/tier %s", t->bucket, extra);
	s3_args(args, sizeof(args), more);
	t->n = n;
	for (int i = 0; i < n; i++) {
		snprintf(node, sizeof(node), "n%d", i);
		h_agent_start_node(&t->a[i], t->root, node, args);
	}
}

static void tiered_stop(struct tiered *t)
{
	char cmd[400];

	for (int i = 0; i < t->n; i++) {
		ck_assert_int_eq(h_agent_stop(&t->a[i]), 0);
		h_agent_cleanup(&t->a[i]);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", t->dir);
	ck_assert_int_eq(system(cmd), 0);
}

/* The HTTP status of GET <bucket>/tier/<job>/step-<step>/manifest.json (into <dir>/m.json). */
static int tier_manifest(const struct tiered *t, const char *job, long step)
{
	char key[256], path[400];

	snprintf(key, sizeof(key), "tier/%s/step-%012ld/manifest.json", job, step);
	snprintf(path, sizeof(path), "%s/m.json", t->dir);
	return download(t->bucket, key, path);
}

/*
 * Two nodes on a shared directory, an upload tier keeping 2: every save goes
 * COMMITTED then UPLOADED; the tier holds the last two (with both nodes'
 * parts), the root all three; with the root's copies deleted, every rank
 * restores LATEST from the tier, and the agent says so; verify --tier upload
 * reads it back whole.
 */
START_TEST(upload_tier_two_nodes)
{
	struct tiered t;
	char out[4096];
	json_error_t je;
	json_t *m;

	tiered_start(&t, 2, "--upload-keep-last 2");
	save_mode(t.a, 2, "up", 4, 1, 3, 1, "upload");
	ck_assert_int_eq(tier_manifest(&t, "up", 1), 404);
	ck_assert_int_eq(tier_manifest(&t, "up", 2), 200);
	ck_assert_int_eq(tier_manifest(&t, "up", 3), 200);
	snprintf(out, sizeof(out), "%s/m.json", t.dir);
	m = json_load_file(out, 0, &je);
	ck_assert_msg(m, "%s", je.text);
	ck_assert_int_eq(json_array_size(json_object_get(m, "parts")), 2);
	ck_assert_int_eq(json_array_size(json_object_get(m, "ranks")), 4);
	json_decref(m);
	/* the root keeps what its own retention (off) keeps */
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "show up 1") == 0, "root lost step 1: %s",
	              out);
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "verify --tier upload up 3") == 0, "%s",
	              out);
	for (long s = 1; s <= 3; s++)
		ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "delete --force up %ld", s) == 0,
		              "%s", out);
	ck_assert_int_eq(restore_all(t.a, 2, "up", 4, 1), 3);
	ck_assert(h_log_has(&t.a[0], "restored from the upload tier") ||
	          h_log_has(&t.a[1], "restored from the upload tier"));
	ck_assert_int_eq(open_uploads(t.bucket), 0);
	tiered_stop(&t);
}
END_TEST

/*
 * --upload-compress zstd:3: the tier's objects go through `zstd -d` into
 * the root's safetensors files; verify --tier upload reads the frames; with
 * the root's copy deleted, LATEST is restored from them.
 */
START_TEST(upload_tier_compressed)
{
	struct tiered t;
	char out[4096], key[256];
	json_error_t je;
	json_t *m;

	tiered_start(&t, 1, "--upload-compress zstd:3");
	save_mode(t.a, 1, "uz", 2, 1, 1, 12, "upload");
	ck_assert_int_eq(tier_manifest(&t, "uz", 1), 200);
	snprintf(out, sizeof(out), "%s/m.json", t.dir);
	m = json_load_file(out, 0, &je);
	ck_assert_msg(m, "%s", je.text);
	for (int r = 0; r < 2; r++) {
		json_t *rank = json_array_get(json_object_get(m, "ranks"), (size_t)r);
		const char *name = json_string_value(json_object_get(rank, "file"));

		ck_assert_msg(name, "tier manifest rank %d: no file", r);
		snprintf(key, sizeof(key), "tier/uz/step-%012d/%s", 1, name);
		zstd_loads(t.dir, t.bucket, key, 1, r, 12);
	}
	json_decref(m);
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "verify --tier upload uz 1") == 0, "%s",
	              out);
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "delete --force uz 1") == 0, "%s", out);
	ck_assert_int_eq(restore_all(t.a, 1, "uz", 2, 12), 1);
	ck_assert(h_log_has(&t.a[0], "restored from the upload tier"));
	ck_assert_int_eq(open_uploads(t.bucket), 0);
	tiered_stop(&t);
}
END_TEST

/*
 * The store away while a step commits on the root: the save is COMMITTED
 * all the same and the upload is tried again; the agent is killed and
 * started again once the store is back: it resumes the upload, and the tier
 * has the step whole.
 */
START_TEST(upload_resumes_when_the_store_is_back)
{
	struct tiered t;
	char out[4096];
	int tries;

	tiered_start(&t, 1, "--s3-max-tries 2");
	ck_assert_int_eq(rgw(NULL, 0, "stop-gw", "%s", ""), 0);
	save_all(t.a, 1, "later", 1, 1, 1, 1);
	for (tries = 0; !h_log_has(&t.a[0], "upload of job later step 1 failed") && tries < 200;
	     tries++)
		usleep(50000);
	ck_assert_msg(tries < 200, "no failed upload was logged");
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "status") == 0, "%s", out);
	h_agent_kill(&t.a[0]);
	ck_assert_int_eq(rgw(NULL, 0, "start-gw", "%s", ""), 0);
	h_agent_restart(&t.a[0]);
	for (tries = 0; tier_manifest(&t, "later", 1) != 200 && tries < 150; tries++)
		usleep(200000);
	ck_assert_int_eq(tier_manifest(&t, "later", 1), 200);
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "verify --tier upload later 1") == 0, "%s",
	              out);
	ck_assert_int_eq(open_uploads(t.bucket), 0);
	tiered_stop(&t);
}
END_TEST

/*
 * A step deleted from the root while its upload runs (slowed to 80 Mbit/s):
 * the upload is dropped, what it put on the tier goes, and the trainer
 * waiting for UPLOADED is told it will not come (instead of waiting for
 * ever).
 */
START_TEST(upload_of_a_deleted_step)
{
	struct tiered t;
	char out[65536], key[128];
	int tries, fd;
	pid_t pid;

	tiered_start(&t, 1, "--upload-max-mbps 80");
	/* its stderr too: what its wait for UPLOADED was told */
	pid = h_spawn_rank(CKPT_CLUSTER_BIN, &t.a[0], "gone", "0", 0, 1, 1, 1, 40, "upload", &fd,
	                   true);
	ck_assert_msg(h_wait_state(&t.a[0], "gone", 1, "COMMITTED", 60000),
	              "step 1 never committed");
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "delete --force gone 1") == 0, "%s", out);
	read_all(fd, out, sizeof(out));
	ck_assert_int_eq(h_reap(pid), 20); /* its wait for UPLOADED failed: told, not timed out */
	ck_assert_msg(strstr(out, "not uploaded: the step left the root"), "%s", out);
	for (tries = 0; !h_log_has(&t.a[0], "upload of job gone step 1 dropped") && tries < 300;
	     tries++)
		usleep(100000);
	ck_assert_msg(tries < 300, "the upload of the deleted step was not dropped");
	snprintf(key, sizeof(key), "tier%%2Fgone%%2Fstep-000000000001");
	ck_assert_int_eq(rgw(out, sizeof(out), "curl", "-s '%s/%s?list-type=2&prefix=%s'", endpoint,
	                     t.bucket, key),
	                 0);
	ck_assert_msg(!strstr(out, "<Key>"), "the tier keeps what was uploaded of it: %s", out);
	ck_assert_int_eq(open_uploads(t.bucket), 0);
	tiered_stop(&t);
}
END_TEST

/*
 * The store away in the middle of an upload (slowed to 80 Mbit/s): a part
 * fails, the upload is tried again, and once the store is back the same
 * agent (not restarted) uploads it whole.
 */
START_TEST(upload_retried_after_a_failed_part)
{
	struct tiered t;
	char out[4096];
	int tries;

	tiered_start(&t, 1, "--s3-max-tries 2 --upload-max-mbps 80");
	save_all(t.a, 1, "mid", 1, 1, 1, 40);
	usleep(1500000); /* 40 MiB at 80 Mbit/s: about 4 s; a third of it sent */
	ck_assert_int_eq(rgw(NULL, 0, "stop-gw", "%s", ""), 0);
	for (tries = 0; !h_log_has(&t.a[0], "upload of job mid step 1 failed") && tries < 300;
	     tries++)
		usleep(100000);
	ck_assert_int_eq(rgw(NULL, 0, "start-gw", "%s", ""), 0);
	ck_assert_msg(tries < 300, "no failed upload was logged");
	for (tries = 0; tier_manifest(&t, "mid", 1) != 200 && tries < 300; tries++)
		usleep(200000);
	ck_assert_msg(tier_manifest(&t, "mid", 1) == 200,
	              "the upload never succeeded after the "
	              "store came back (see %s)",
	              t.a[0].log);
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "verify --tier upload mid 1") == 0, "%s",
	              out);
	ck_assert_int_eq(open_uploads(t.bucket), 0);
	tiered_stop(&t);
}
END_TEST

/* ckptd with these flags must refuse to start, saying `want`. */
static void refuses(const char *root, const char *flags, const char *want)
{
	char dir[] = "/tmp/ckt3.XXXXXX", cmd[2048], log[600], buf[8192] = "";
	int status;
	FILE *f;
	size_t n;

	ck_assert(mkdtemp(dir));
	snprintf(log, sizeof(log), "%s/log", dir);
	snprintf(cmd, sizeof(cmd),
	         "timeout 120 %s --config /dev/null --root %s --listen unix:%s/s.sock --node n0 "
	         "--staging-mb 16 --chunk-mb 5 --s3-max-tries 2 %s >%s 2>&1",
	         CKPTD_BIN, root, dir, flags, log);
	status = system(cmd);
	f = fopen(log, "r");
	ck_assert(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 124,
	              "ckptd %s did not refuse to start (status %d): %s", flags, status, buf);
	ck_assert_msg(strstr(buf, want), "no '%s' in: %s", want, buf);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}

START_TEST(start_errors)
{
	char bucket[64], root[128], flags[1024], bad[300];
	int fd;

	new_bucket(bucket, sizeof(bucket));
	snprintf(root, sizeof(root), "s3://%s/p", bucket);
	/* a wrong secret */
	snprintf(bad, sizeof(bad), "%s/badcreds.%d",
	         getenv("CK_TMPDIR") ? getenv("CK_TMPDIR") : "/tmp", (int)getpid());
	fd = open(bad, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert(dprintf(fd, "access_key = %s\nsecret_key = not-the-secret\n", "nobody") > 0);
	close(fd);
	snprintf(flags, sizeof(flags), "--s3-endpoint %s --s3-credentials %s", endpoint, bad);
	refuses(root, flags, "HTTP 403");
	/* readable by others */
	ck_assert_int_eq(chmod(bad, 0644), 0);
	refuses(root, flags, "chmod 600");
	unlink(bad);
	/* a bucket that is not there */
	snprintf(flags, sizeof(flags), "--s3-endpoint %s --s3-credentials %s --s3-region %s",
	         endpoint, creds, region);
	refuses("s3://no-such-bucket-ckpt/p", flags, "no such bucket");
	/* nobody listening */
	snprintf(flags, sizeof(flags), "--s3-endpoint http://127.0.0.1:1 --s3-credentials %s",
	         creds);
	refuses(root, flags, "Couldn't connect");
}
END_TEST

/* ---- main ------------------------------------------------------------------ */

static Suite *suite(void)
{
	Suite *s = suite_create("s3");
	TCase *t = tcase_create("rgw");

	tcase_set_timeout(t, 300);
	tcase_add_loop_test(t, roundtrip_part_sizes, 0, sizeof(sizes) / sizeof(sizes[0]));
	tcase_add_loop_test(t, roundtrip_compressed, 0, sizeof(zsizes) / sizeof(zsizes[0]));
	tcase_add_test(t, world8_over_four_agents);
	tcase_add_test(t, store_stops_mid_upload);
	tcase_add_test(t, upload_tier_two_nodes);
	tcase_add_test(t, upload_resumes_when_the_store_is_back);
	tcase_add_test(t, upload_tier_compressed);
	tcase_add_test(t, upload_of_a_deleted_step);
	tcase_add_test(t, upload_retried_after_a_failed_part);
	tcase_add_test(t, start_errors);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	SRunner *sr;
	int failed;

	endpoint = getenv("CKPT_TEST_S3_ENDPOINT");
	creds = getenv("CKPT_TEST_S3_CREDENTIALS");
	region = getenv("CKPT_TEST_S3_REGION");
	rgwdir = getenv("CKPT_TEST_S3_DIR");
	if (!endpoint || !creds || !region || !rgwdir) {
		fprintf(stderr,
		        "no S3 gateway (CKPT_TEST_S3_* unset: scripts/rgw.sh up starts one)\n");
		return 77;
	}
	sr = srunner_create(suite());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
