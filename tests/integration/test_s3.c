/*
 * Object storage: real agents with an s3:// root on a real Ceph RADOS
 * Gateway that the test command starts (s3_harness.h). Skipped (77) where
 * no gateway runs (CKPT_TEST_S3_ENDPOINT unset). The upload tier (an s3://
 * store behind a directory root) is test_upload.c's.
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
 *   - compressed (--s3-compress): shards of one part and of three, restored
 *     and verified, also by the agent restarted with compression off;
 *     each object, downloaded and put through `zstd -d`, loads in the
 *     safetensors library as what was saved
 *   - a pin put into the store by another node's agent, unknown to this
 *     one: a delete of the step is refused, the step stays whole
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

#include "tests/integration/harness.h"
#include "tests/integration/s3_harness.h"
#include "support/check_main.h"

static void start_on(struct agent_proc *a, const char *bucket, const char *node, const char *extra)
{
	char root[128], args[1024];

	snprintf(root, sizeof(root), "s3://%s/ckpt", bucket);
	s3h_args(args, sizeof(args), extra);
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
	ck_assert_int_eq(s3h_download(bucket, key, path), 200);
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

	s3h_new_bucket(bucket, sizeof(bucket));
	start_on(&a, bucket, "n0", NULL);
	snprintf(job, sizeof(job), "rt%ld", mb);
	s3h_save_all(&a, 1, job, 2, 1, 2, mb);
	ck_assert_int_eq(s3h_restore_all(&a, 1, job, 2, mb), 2);
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
		ck_assert_int_eq(s3h_download(bucket, key, file), 200);
		snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s' 2 %d %ld", CKPT_PYTHON, CKPT_S3_LOAD,
		         file, r, mb);
		ck_assert_msg(system(cmd) == 0, "%s: does not load as what was saved", cmd);
	}
	json_decref(m);
	ck_assert_int_eq(s3h_open_uploads(bucket), 0);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	h_agent_cleanup(&a);
}
END_TEST

START_TEST(world8_over_four_agents)
{
	struct agent_proc a[4] = {{0}};
	char bucket[64], node[8];
	json_t *m;

	s3h_new_bucket(bucket, sizeof(bucket));
	for (int i = 0; i < 4; i++) {
		snprintf(node, sizeof(node), "n%d", i);
		start_on(&a[i], bucket, node, NULL);
	}
	s3h_save_all(a, 4, "wide", 8, 1, 2, 6);
	ck_assert_int_eq(s3h_restore_all(a, 4, "wide", 8, 6), 2);
	m = manifest_of(&a[0], bucket, "wide", 2);
	ck_assert_int_eq(json_integer_value(json_object_get(m, "version")), 4); /* a head */
	ck_assert_int_eq(h_manifest_ranks(m), 8);
	ck_assert_int_eq(json_array_size(json_object_get(m, "parts")), 4);
	json_decref(m);
	ck_assert_int_eq(s3h_open_uploads(bucket), 0);
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

	s3h_new_bucket(bucket, sizeof(bucket));
	start_on(&a, bucket, "n0", "--s3-timeout 5");
	s3h_save_all(&a, 1, "cut", 1, 1, 1, 1);
	base = bytes_sent(&a);
	ck_assert_int_gt(base, 0);

	/* 200 MiB through a 64 MiB pool: the upload goes on well after the save starts */
	pid = s3h_spawn_rank(&a, "cut", 0, 1, 2, 2, 200, "expect-fail", &fd);
	while (bytes_sent(&a) < base + (16 << 20) && tries++ < 2000)
		usleep(5000);
	ck_assert_msg(bytes_sent(&a) >= base + (16 << 20), "the upload never started");
	ck_assert_int_eq(s3h_rgw(NULL, 0, "stop-gw", "%s", ""), 0);
	h_read_all(fd, reason, sizeof(reason));
	ck_assert_int_eq(h_reap(pid), 0);
	ck_assert_msg(strstr(reason, "s3://") && (strstr(reason, "curl") || strstr(reason, "HTTP")),
	              "the reason does not name the failure: %s", reason);
	fprintf(stderr, "store stopped mid-upload: FAILED: %s", reason);
	/* the agent still serves while the store is away */
	ck_assert_msg(h_ctl(&a, out, sizeof(out), "status") == 0, "%s", out);
	ck_assert_int_eq(s3h_rgw(NULL, 0, "start-gw", "%s", ""), 0);

	/* what was committed before is whole; the failed upload is aborted once the store is back
	 */
	ck_assert_int_eq(s3h_restore_all(&a, 1, "cut", 1, 1), 1);
	for (tries = 0; s3h_open_uploads(bucket) > 0 && tries < 100; tries++)
		usleep(200000);
	ck_assert_msg(s3h_open_uploads(bucket) == 0, "a multipart upload is left behind");
	s3h_save_all(&a, 1, "cut", 1, 3, 3, 1);
	ck_assert_int_eq(s3h_restore_all(&a, 1, "cut", 1, 1), 3);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	h_agent_cleanup(&a);
}
END_TEST

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

	s3h_new_bucket(bucket, sizeof(bucket));
	start_on(&a, bucket, "n0", "--s3-compress zstd");
	ck_assert_msg(h_ctl(&a, out, sizeof(out), "status") == 0, "%s", out);
	ck_assert_msg(strstr(out, "zstd level 1"), "status does not say it compresses: %s", out);
	snprintf(job, sizeof(job), "z%ld", mb);
	s3h_save_all(&a, 1, job, 2, 1, 2, mb);
	ck_assert_int_eq(s3h_restore_all(&a, 1, job, 2, mb), 2);
	ck_assert_msg(h_ctl(&a, out, sizeof(out), "verify %s 2", job) == 0, "verify: %s", out);
	m = manifest_of(&a, bucket, job, 2);
	for (int r = 0; r < 2; r++) {
		json_t *rank = json_array_get(json_object_get(m, "ranks"), (size_t)r);
		const char *name = json_string_value(json_object_get(rank, "file"));
		json_int_t size = json_integer_value(json_object_get(rank, "size"));
		long long stored;

		ck_assert_msg(name && size > 0, "manifest rank %d: no file or size", r);
		snprintf(key, sizeof(key), "ckpt/%s/step-%012d/%s", job, 2, name);
		stored = s3h_zstd_loads(a.dir, bucket, key, 2, r, mb);
		/* one frame, no padding: the periodic test bytes shrink */
		if (mb == 1)
			ck_assert_msg(stored < size / 4, "rank %d: %lld bytes stored for %lld", r,
			              stored, (long long)size);
	}
	json_decref(m);
	ck_assert_int_eq(s3h_open_uploads(bucket), 0);
	ck_assert_int_eq(h_agent_stop(&a), 0);

	/* restarted with compression off, it still reads what it compressed */
	start_on(&b, bucket, "n0", NULL);
	ck_assert_int_eq(s3h_restore_all(&b, 1, job, 2, mb), 2);
	ck_assert_msg(h_ctl(&b, out, sizeof(out), "verify %s 2", job) == 0, "verify: %s", out);
	ck_assert_int_eq(h_agent_stop(&b), 0);
	h_agent_cleanup(&b);
	h_agent_cleanup(&a);
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

/*
 * A pin another node's agent put into the store (its object, put here by
 * hand), which this agent has not read: a delete of the step is refused,
 * saying it is pinned, and the step stays whole. On a store the pin is
 * looked for by the removal alone (a directory root looks again once the
 * step is out of sight).
 */
START_TEST(pinned_in_the_store_kept)
{
	struct agent_proc a = {0};
	char bucket[64], out[4096], path[400];

	s3h_new_bucket(bucket, sizeof(bucket));
	start_on(&a, bucket, "n0", NULL);
	s3h_save_all(&a, 1, "pn", 1, 1, 2, 1);
	ck_assert_int_eq(s3h_rgw(out, sizeof(out), "curl",
	                         "-s -o /dev/null -w '%%{http_code}' -X PUT --data-binary '' "
	                         "'%s/%s/ckpt/pn/step-000000000001/pinned'",
	                         s3h_endpoint, bucket),
	                 0);
	ck_assert_msg(atoi(out) == 200, "PUT of the pin: %s", out);
	/* --force: no list first (it would read the pin into the catalog) */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "delete --force pn 1"), 1);
	ck_assert_msg(strstr(out, "is pinned"), "%s", out);
	snprintf(path, sizeof(path), "%s/m1.json", a.dir);
	ck_assert_int_eq(s3h_download(bucket, "ckpt/pn/step-000000000001/manifest.json", path),
	                 200);
	ck_assert_msg(h_ctl(&a, out, sizeof(out), "verify pn 1") == 0, "%s", out);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	h_agent_cleanup(&a);
}
END_TEST

START_TEST(start_errors)
{
	char bucket[64], root[128], flags[1024], bad[300];
	int fd;

	s3h_new_bucket(bucket, sizeof(bucket));
	snprintf(root, sizeof(root), "s3://%s/p", bucket);
	/* a wrong secret */
	snprintf(bad, sizeof(bad), "%s/badcreds.%d",
	         getenv("CK_TMPDIR") ? getenv("CK_TMPDIR") : "/tmp", (int)getpid());
	fd = open(bad, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert(dprintf(fd, "access_key = %s\nsecret_key = not-the-secret\n", "nobody") > 0);
	close(fd);
	snprintf(flags, sizeof(flags), "--s3-endpoint %s --s3-credentials %s", s3h_endpoint, bad);
	refuses(root, flags, "HTTP 403");
	/* readable by others */
	ck_assert_int_eq(chmod(bad, 0644), 0);
	refuses(root, flags, "chmod 600");
	unlink(bad);
	/* a bucket that is not there */
	snprintf(flags, sizeof(flags), "--s3-endpoint %s --s3-credentials %s --s3-region %s",
	         s3h_endpoint, s3h_creds, s3h_region);
	refuses("s3://no-such-bucket-ckpt/p", flags, "no such bucket");
	/* nobody listening */
	snprintf(flags, sizeof(flags), "--s3-endpoint http://127.0.0.1:1 --s3-credentials %s",
	         s3h_creds);
	refuses(root, flags, "Couldn't connect");
}
END_TEST

/* ---- main ------------------------------------------------------------------ */

Suite *test_suite(void)
{
	Suite *s = suite_create("s3");
	TCase *t = tcase_create("rgw");

	tcase_set_timeout(t, 300);
	tcase_add_loop_test(t, roundtrip_part_sizes, 0, sizeof(sizes) / sizeof(sizes[0]));
	tcase_add_loop_test(t, roundtrip_compressed, 0, sizeof(zsizes) / sizeof(zsizes[0]));
	tcase_add_test(t, world8_over_four_agents);
	tcase_add_test(t, store_stops_mid_upload);
	tcase_add_test(t, pinned_in_the_store_kept);
	tcase_add_test(t, start_errors);
	suite_add_tcase(s, t);
	return s;
}

int test_before(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	if (!s3h_init())
		return TEST_SKIP;
	return TEST_RUN;
}
