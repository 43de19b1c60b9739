/*
 * The upload tier: agents on a directory root copying each committed
 * checkpoint to a bucket of the real Ceph RADOS Gateway that the test
 * command starts (s3_harness.h); skipped (77) without one. Trainer ranks
 * are test_cluster's rank processes.
 *
 *   - two nodes, the tier keeping 2: UPLOADED, the tier's manifest names
 *     both parts, restores from the tier once the root's copies are gone
 *   - compressed (--upload-compress): each object through `zstd -d` loads as
 *     what was saved; verified and restored from the tier
 *   - the store away while a step commits, the agent killed, the store
 *     back, the agent started again: the step reaches the tier
 *   - a step deleted from the root while it uploads: dropped, what it put on
 *     the tier goes, the trainer is told
 *   - the store away in the middle of an upload: tried again, then whole
 *
 * The store is stopped (scripts/rgw.sh stop-gw) by some of these tests:
 * test_s3 does the same, and the two hold one lock (RESOURCE_LOCK rgw).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "harness.h"
#include "s3_harness.h"

/* ---- agents with an upload tier -------------------------------------------- */

struct tiered {
	char dir[256], root[300], bucket[64];
	struct agent_proc a[2];
	int n;
};

/*
 * n agents on one directory root, with an upload tier in a fresh bucket;
 * env (may be NULL): "NAME=value" in their environment (a CKPT_FAULTS plan).
 */
static void tiered_start_env(struct tiered *t, int n, const char *extra, const char *env)
{
	const char *tmp = getenv("CK_TMPDIR") ? getenv("CK_TMPDIR") : "/tmp";
	char args[1024], more[512], node[8];

	memset(t, 0, sizeof(*t));
	snprintf(t->dir, sizeof(t->dir), "%s/cks3.XXXXXX", tmp);
	ck_assert(mkdtemp(t->dir));
	snprintf(t->root, sizeof(t->root), "%s/shared", t->dir);
	s3h_new_bucket(t->bucket, sizeof(t->bucket));
	snprintf(more, sizeof(more), "--upload-root s3://%s/tier %s", t->bucket, extra);
	s3h_args(args, sizeof(args), more);
	t->n = n;
	for (int i = 0; i < n; i++) {
		snprintf(node, sizeof(node), "n%d", i);
		h_agent_start_node_env(&t->a[i], t->root, node, args, env);
	}
}

static void tiered_start(struct tiered *t, int n, const char *extra)
{
	tiered_start_env(t, n, extra, NULL);
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
	return s3h_download(t->bucket, key, path);
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
	s3h_save_mode(t.a, 2, "up", 4, 1, 3, 1, "upload");
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
	ck_assert_int_eq(s3h_restore_all(t.a, 2, "up", 4, 1), 3);
	ck_assert(h_log_has(&t.a[0], "restored from the upload tier") ||
	          h_log_has(&t.a[1], "restored from the upload tier"));
	ck_assert_int_eq(s3h_open_uploads(t.bucket), 0);
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
	s3h_save_mode(t.a, 1, "uz", 2, 1, 1, 12, "upload");
	ck_assert_int_eq(tier_manifest(&t, "uz", 1), 200);
	snprintf(out, sizeof(out), "%s/m.json", t.dir);
	m = json_load_file(out, 0, &je);
	ck_assert_msg(m, "%s", je.text);
	for (int r = 0; r < 2; r++) {
		json_t *rank = json_array_get(json_object_get(m, "ranks"), (size_t)r);
		const char *name = json_string_value(json_object_get(rank, "file"));

		ck_assert_msg(name, "tier manifest rank %d: no file", r);
		snprintf(key, sizeof(key), "tier/uz/step-%012d/%s", 1, name);
		s3h_zstd_loads(t.dir, t.bucket, key, 1, r, 12);
	}
	json_decref(m);
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "verify --tier upload uz 1") == 0, "%s",
	              out);
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "delete --force uz 1") == 0, "%s", out);
	ck_assert_int_eq(s3h_restore_all(t.a, 1, "uz", 2, 12), 1);
	ck_assert(h_log_has(&t.a[0], "restored from the upload tier"));
	ck_assert_int_eq(s3h_open_uploads(t.bucket), 0);
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
	ck_assert_int_eq(s3h_rgw(NULL, 0, "stop-gw", "%s", ""), 0);
	s3h_save_all(t.a, 1, "later", 1, 1, 1, 1);
	for (tries = 0; !h_log_has(&t.a[0], "upload of job later step 1 failed") && tries < 200;
	     tries++)
		usleep(50000);
	ck_assert_msg(tries < 200, "no failed upload was logged");
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "status") == 0, "%s", out);
	h_agent_kill(&t.a[0]);
	ck_assert_int_eq(s3h_rgw(NULL, 0, "start-gw", "%s", ""), 0);
	h_agent_restart(&t.a[0]);
	for (tries = 0; tier_manifest(&t, "later", 1) != 200 && tries < 150; tries++)
		usleep(200000);
	ck_assert_int_eq(tier_manifest(&t, "later", 1), 200);
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "verify --tier upload later 1") == 0, "%s",
	              out);
	ck_assert_int_eq(s3h_open_uploads(t.bucket), 0);
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
	h_read_all(fd, out, sizeof(out));
	ck_assert_int_eq(h_reap(pid), 20); /* its wait for UPLOADED failed: told, not timed out */
	ck_assert_msg(strstr(out, "not uploaded: the step left the root"), "%s", out);
	for (tries = 0; !h_log_has(&t.a[0], "upload of job gone step 1 dropped") && tries < 300;
	     tries++)
		usleep(100000);
	ck_assert_msg(tries < 300, "the upload of the deleted step was not dropped");
	snprintf(key, sizeof(key), "tier%%2Fgone%%2Fstep-000000000001");
	ck_assert_int_eq(s3h_rgw(out, sizeof(out), "curl", "-s '%s/%s?list-type=2&prefix=%s'",
	                         s3h_endpoint, t.bucket, key),
	                 0);
	ck_assert_msg(!strstr(out, "<Key>"), "the tier keeps what was uploaded of it: %s", out);
	ck_assert_int_eq(s3h_open_uploads(t.bucket), 0);
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
	s3h_save_all(t.a, 1, "mid", 1, 1, 1, 40);
	usleep(1500000); /* 40 MiB at 80 Mbit/s: about 4 s; a third of it sent */
	ck_assert_int_eq(s3h_rgw(NULL, 0, "stop-gw", "%s", ""), 0);
	for (tries = 0; !h_log_has(&t.a[0], "upload of job mid step 1 failed") && tries < 300;
	     tries++)
		usleep(100000);
	ck_assert_int_eq(s3h_rgw(NULL, 0, "start-gw", "%s", ""), 0);
	ck_assert_msg(tries < 300, "no failed upload was logged");
	for (tries = 0; tier_manifest(&t, "mid", 1) != 200 && tries < 300; tries++)
		usleep(200000);
	ck_assert_msg(tier_manifest(&t, "mid", 1) == 200,
	              "the upload never succeeded after the "
	              "store came back (see %s)",
	              t.a[0].log);
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "verify --tier upload mid 1") == 0, "%s",
	              out);
	ck_assert_int_eq(s3h_open_uploads(t.bucket), 0);
	tiered_stop(&t);
}
END_TEST

/* ---- main ------------------------------------------------------------------ */

static Suite *suite(void)
{
	Suite *s = suite_create("upload");
	TCase *t = tcase_create("rgw");

	tcase_set_timeout(t, 300);
	tcase_add_test(t, upload_tier_two_nodes);
	tcase_add_test(t, upload_resumes_when_the_store_is_back);
	tcase_add_test(t, upload_tier_compressed);
	tcase_add_test(t, upload_of_a_deleted_step);
	tcase_add_test(t, upload_retried_after_a_failed_part);
	suite_add_tcase(s, t);
	return s;
}

int main(void)
{
	SRunner *sr;
	int failed;

	if (!s3h_init())
		return 77;
	sr = srunner_create(suite());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
