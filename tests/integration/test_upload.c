/*
 * The upload tier: agents on a directory root copying each committed
 * checkpoint to a bucket of the real Ceph RADOS Gateway that the test
 * command starts (s3_harness.h); skipped (77) without one. Trainer ranks
 * are test_cluster's rank processes.
 *
 *   - two nodes, the tier keeping 2: UPLOADED, the tier's manifest names
 *     both parts; a file lost from the root restored from the tier's copy
 *     (a step the tier dropped: damaged, not absent); restores from the
 *     tier once the root's copies are gone
 *   - compressed (--upload-compress): each object through `zstd -d` loads as
 *     what was saved; verified and restored from the tier
 *   - the store away while a step commits, the agent killed, the store
 *     back, the agent started again: the step reaches the tier
 *   - every step pending when the agent is killed reaches the tier after
 *     its restart, those older than the tier's LATEST too; list, status and
 *     the metrics say they are pending, with the error, until then
 *   - steps the tier's retention would not keep are not uploaded at start,
 *     and list says so
 *   - a step the store refuses (HTTP 403) is given up after 3 tries and said
 *     in list, status and the metrics; a restart tries it again
 *   - a step whose other node never uploads its part: given up at the
 *     commit deadline, said in list
 *   - a step deleted from the root while it uploads: dropped, what it put on
 *     the tier goes, the trainer is told, status counts it
 *   - the store away in the middle of an upload: tried again, then whole
 *   - the root's checkpoints gone and the tier's LATEST lost: a restore of
 *     LATEST takes the tier's newest manifest, never "no checkpoint"
 *
 * The store is stopped (scripts/rgw.sh stop-gw) by some of these tests:
 * test_s3 does the same, and the two hold one lock (RESOURCE_LOCK rgw).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "tests/integration/harness.h"
#include "tests/integration/s3_harness.h"
#include "support/check_main.h"

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

/* ---- what the tests read -------------------------------------------------- */

/*
 * The list row of (job, step) on agent a: its upload state and reason
 * (each "" if none); false if it has no row.
 */
static bool row_of(const struct agent_proc *a, const char *job, long step, char *upload,
                   size_t ulen, char *reason, size_t rlen)
{
	static char out[1 << 20];
	bool found = false;
	json_t *j, *c;
	size_t i;

	ck_assert_msg(h_ctl(a, out, sizeof(out), "--json list %s", job) == 0, "%s", out);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j, "not JSON: %s", out);
	json_array_foreach(json_object_get(j, "checkpoints"), i, c)
	{
		const char *u = json_string_value(json_object_get(c, "upload"));
		const char *r = json_string_value(json_object_get(c, "reason"));

		if (json_integer_value(json_object_get(c, "step")) != step)
			continue;
		snprintf(upload, ulen, "%s", u ? u : "");
		snprintf(reason, rlen, "%s", r ? r : "");
		found = true;
	}
	json_decref(j);
	return found;
}

/* The value of the /metrics line of `series` (name and labels as written); -1 if none. */
static double metric(unsigned port, const char *series)
{
	static char out[1 << 20];
	size_t n = strlen(series);
	const char *p = out;
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "curl -s http://127.0.0.1:%u/metrics", port);
	ck_assert_int_eq(h_run(out, sizeof(out), cmd), 0);
	while ((p = strstr(p, series))) {
		if ((p == out || p[-1] == '\n') && p[n] == ' ')
			return atof(p + n + 1);
		p += n;
	}
	return -1;
}

/* Waits up to ms for the agent's log to say `needle`; whether it did. */
static bool log_says(const struct agent_proc *a, const char *needle, int ms)
{
	for (int waited = 0; !h_log_has(a, needle); waited += 100) {
		if (waited >= ms)
			return false;
		usleep(100000);
	}
	return true;
}

/* Waits up to ms for the tier's manifest of (job, step); whether it came. */
static bool on_tier(const struct tiered *t, const char *job, long step, int ms)
{
	for (int waited = 0; tier_manifest(t, job, step) != 200; waited += 200) {
		if (waited >= ms)
			return false;
		usleep(200000);
	}
	return true;
}

/*
 * Rank 0's files of steps 1 and 3 of job "up" lost from the root (the tier
 * holds 2 and 3): LATEST (3) is restored whole by every rank, rank 0's from
 * the tier's copy, not passed over for 2; step 1, on the tier no more, is
 * damaged (-EBADMSG naming the file), never absent because the tier lacks it.
 */
static void tier_stands_in(struct tiered *t)
{
	char path[600], one[600], out[2048], want[32];
	int fd;

	h_shard(&t->a[0], one, sizeof(one), "up", 1, 0);
	ck_assert_int_eq(unlink(one), 0);
	h_shard(&t->a[0], path, sizeof(path), "up", 3, 0);
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(s3h_restore_all(t->a, 2, "up", 4, 1), 3);
	ck_assert(h_log_has(&t->a[0], "step 3 restored from the upload tier (the root: "));
	ck_assert_int_eq(h_reap(s3h_spawn_rank(&t->a[0], "up", 0, 4, 1, 0, 1, "restore", &fd)), 12);
	h_read_all(fd, out, sizeof(out));
	snprintf(want, sizeof(want), "error %d: ", -EBADMSG);
	ck_assert_msg(strstr(out, want) && strstr(out, strrchr(one, '/') + 1) &&
	                  strstr(out, "the upload tier could not either"),
	              "%s", out);
}

/*
 * Two nodes on a shared directory, an upload tier keeping 2: every save goes
 * COMMITTED then UPLOADED; the tier holds the last two (with both nodes'
 * parts), the root all three; a file lost from the root is restored from
 * the tier (not passed over), and one the tier no longer holds is damaged,
 * not absent; with the root's copies deleted, every rank restores LATEST
 * from the tier, and the agent says so; verify --tier upload reads it back
 * whole.
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
	ck_assert_int_eq(json_integer_value(json_object_get(m, "version")), 4); /* a head */
	ck_assert_int_eq(h_manifest_ranks(m), 4);
	json_decref(m);
	/* the root keeps what its own retention (off) keeps */
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "show up 1") == 0, "root lost step 1: %s",
	              out);
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "verify --tier upload up 3") == 0, "%s",
	              out);
	tier_stands_in(&t);
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
 * the upload is dropped, what it put on the tier goes, the trainer
 * waiting for UPLOADED is told it will not come (instead of waiting for
 * ever), and status counts it as given up.
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
	/* counted as given up; not on the root, so no step is missing from the tier */
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "status") == 0, "%s", out);
	ck_assert_msg(strstr(out, "1 given up, 0 of them on the root and not on the tier (last: "
	                          "job gone step 1: the step left the root"),
	              "%s", out);
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

/* ---- nothing missing from the tier without a word ---------------------------- */

#ifdef CKPT_FAULT_INJECTION

/* The faults that keep steps 1 and 2 of job from being read back from the root. */
static void unreadable(char *env, size_t len, const char *job)
{
	snprintf(env, len, "CKPT_FAULTS=io_read:EIO:path=*/%s/step-00000000000[12]/*:count=inf",
	         job);
}

/*
 * The tier keeps every checkpoint (keep_last 0). The store is away while
 * steps 1 and 2 commit: their uploads fail and wait for a retry, and their
 * retries keep failing once it is back (their shards cannot be read from
 * the root: CKPT_FAULTS), as retries waiting out a long back-off would;
 * meanwhile step 3 is uploaded: the tier's LATEST is past them. list,
 * status and the metrics say the two are pending, with the error. The
 * agent is SIGKILLed and started again without the fault: steps 1 and 2
 * reach the tier, whole (an agent resuming only the steps newer than the
 * tier's LATEST leaves them out for good, without a word).
 */
START_TEST(upload_resumes_every_pending_step)
{
	struct tiered t;
	char extra[256], env[128], upload[64], reason[1024], out[16384];
	unsigned port = h_free_port();

	snprintf(extra, sizeof(extra), "--s3-max-tries 2 --metrics-listen 127.0.0.1:%u", port);
	unreadable(env, sizeof(env), "hole");
	tiered_start_env(&t, 1, extra, env);
	ck_assert_int_eq(s3h_rgw(NULL, 0, "stop-gw", "%s", ""), 0);
	s3h_save_all(t.a, 1, "hole", 1, 1, 2, 1);
	ck_assert_msg(log_says(&t.a[0], "upload of job hole step 2 failed", 60000),
	              "no failed upload of step 2 was logged");
	ck_assert_int_eq(s3h_rgw(NULL, 0, "start-gw", "%s", ""), 0);
	s3h_save_all(t.a, 1, "hole", 1, 3, 3, 1);
	ck_assert_msg(log_says(&t.a[0], "uploaded job hole step 3:", 60000), "step 3: %s",
	              t.a[0].log);
	for (long s = 1; s <= 2; s++) {
		ck_assert(
		    row_of(&t.a[0], "hole", s, upload, sizeof(upload), reason, sizeof(reason)));
		ck_assert_msg(strcmp(upload, "pending") == 0 &&
		                  strstr(reason, "upload pending (try "),
		              "step %ld: '%s' '%s'", s, upload, reason);
	}
	ck_assert_msg(metric(port, "ckptd_job_uploads_missing{job=\"hole\",state=\"pending\"}") ==
	                  2,
	              "the metrics do not count the two pending");
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "status") == 0, "%s", out);
	ck_assert_msg(strstr(out, "(2 pending after a failed try)"), "%s", out);

	h_agent_kill(&t.a[0]);
	t.a[0].env[0] = '\0';
	h_agent_restart(&t.a[0]);
	for (long s = 1; s <= 2; s++) {
		ck_assert_msg(on_tier(&t, "hole", s, 60000), "step %ld never reached the tier (%s)",
		              s, t.a[0].log);
		ck_assert_msg(
		    h_ctl(&t.a[0], out, sizeof(out), "verify --tier upload hole %ld", s) == 0, "%s",
		    out);
		ck_assert(
		    row_of(&t.a[0], "hole", s, upload, sizeof(upload), reason, sizeof(reason)));
		ck_assert_msg(!*upload, "step %ld: '%s' '%s'", s, upload, reason);
	}
	ck_assert_int_eq(s3h_open_uploads(t.bucket), 0);
	tiered_stop(&t);
}
END_TEST

/*
 * The tier keeping 2: steps 1 and 2 pending (their shards unreadable),
 * 3 and 4 uploaded, the agent killed and started again: the tier would
 * drop 1 and 2 at once, so they are not uploaded, and list says so (no
 * failure: the metrics count none).
 */
START_TEST(upload_resume_keeps_what_the_tier_keeps)
{
	struct tiered t;
	char extra[128], env[128], upload[64], reason[1024];
	unsigned port = h_free_port();

	snprintf(extra, sizeof(extra), "--upload-keep-last 2 --metrics-listen 127.0.0.1:%u", port);
	unreadable(env, sizeof(env), "kept");
	tiered_start_env(&t, 1, extra, env);
	s3h_save_all(t.a, 1, "kept", 1, 1, 4, 1);
	ck_assert_msg(log_says(&t.a[0], "uploaded job kept step 4:", 60000), "step 4: %s",
	              t.a[0].log);
	ck_assert_msg(log_says(&t.a[0], "upload of job kept step 2 failed", 60000),
	              "no failed upload of step 2 was logged");
	h_agent_kill(&t.a[0]);
	t.a[0].env[0] = '\0';
	h_agent_restart(&t.a[0]);
	ck_assert_msg(log_says(&t.a[0],
	                       "job kept: 0 committed steps of the root to upload, 2 the "
	                       "tier would not keep",
	                       60000),
	              "the resume did not say what it left (%s)", t.a[0].log);
	for (long s = 1; s <= 2; s++) {
		ck_assert(
		    row_of(&t.a[0], "kept", s, upload, sizeof(upload), reason, sizeof(reason)));
		ck_assert_msg(strcmp(upload, "not uploaded") == 0 &&
		                  strstr(reason, "the tier's retention (keep_last 2) keeps newer"),
		              "step %ld: '%s' '%s'", s, upload, reason);
	}
	ck_assert_int_eq(metric(port, "ckptd_uploads_failed_total"), 0);
	ck_assert_int_eq(tier_manifest(&t, "kept", 3), 200);
	tiered_stop(&t);
}
END_TEST

#endif /* CKPT_FAULT_INJECTION */

/*
 * A step the store refuses (a bucket policy denies its job's keys: HTTP 403
 * AccessDenied) is given up after 3 tries, and said: list's row ("not
 * uploaded", why), status (given up, the last reason), the metrics
 * (ckptd_uploads_failed_total, ckptd_job_uploads_missing{state="failed"}).
 * Once the policy is gone, the agent started again uploads it.
 */
START_TEST(upload_refused_is_said)
{
	struct tiered t;
	char extra[128], pol[400], upload[64], reason[1024], out[16384];
	unsigned port = h_free_port();
	FILE *f;

	snprintf(extra, sizeof(extra), "--metrics-listen 127.0.0.1:%u", port);
	tiered_start(&t, 1, extra);
	snprintf(pol, sizeof(pol), "%s/policy.json", t.dir);
	f = fopen(pol, "w");
	ck_assert(f);
	fprintf(f,
	        "{\"Version\":\"2012-10-17\",\"Statement\":[{\"Effect\":\"Deny\",\"Principal\":"
	        "\"*\",\"Action\":\"s3:PutObject\",\"Resource\":\"arn:aws:s3:::%s/tier/no/*\"}]}",
	        t.bucket);
	fclose(f);
	ck_assert_int_eq(
	    s3h_rgw(NULL, 0, "curl", "-X PUT -T '%s' 's3://%s?policy='", pol, t.bucket), 0);
	s3h_save_all(t.a, 1, "no", 1, 1, 1, 1);
	ck_assert_msg(log_says(&t.a[0], "upload of job no step 1 given up", 60000), "%s",
	              t.a[0].log);
	ck_assert(row_of(&t.a[0], "no", 1, upload, sizeof(upload), reason, sizeof(reason)));
	ck_assert_msg(strcmp(upload, "not uploaded") == 0 &&
	                  strstr(reason, "refused it 3 times in a row") && strstr(reason, "403"),
	              "'%s' '%s'", upload, reason);
	ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "status") == 0, "%s", out);
	ck_assert_msg(strstr(out, "1 given up, 1 of them on the root and not on the tier (last: "
	                          "job no step 1: the store refused it"),
	              "%s", out);
	ck_assert_int_eq(metric(port, "ckptd_uploads_failed_total"), 1);
	ck_assert_int_eq(metric(port, "ckptd_job_uploads_missing{job=\"no\",state=\"failed\"}"), 1);

	ck_assert_int_eq(s3h_rgw(NULL, 0, "curl", "-X DELETE 's3://%s?policy='", t.bucket), 0);
	ck_assert_int_eq(h_agent_stop(&t.a[0]), 0);
	h_agent_restart(&t.a[0]);
	ck_assert_msg(on_tier(&t, "no", 1, 60000), "not uploaded after a restart (%s)", t.a[0].log);
	tiered_stop(&t);
}
END_TEST

/*
 * Two nodes, only n0 with the tier: n1 never uploads its part, so n0 (rank
 * 0's node) gives the step up at the commit deadline, and its list row
 * says so, naming the missing part.
 */
START_TEST(upload_given_up_at_the_deadline)
{
	struct tiered t;
	char args[1024], upload[64], reason[1024];

	tiered_start(&t, 1, "--commit-deadline 5");
	s3h_args(args, sizeof(args), "--commit-deadline 5");
	h_agent_start_node(&t.a[1], t.root, "n1", args);
	t.n = 2;
	s3h_save_all(t.a, 2, "half", 2, 1, 1, 1);
	ck_assert_msg(log_says(&t.a[0],
	                       "upload of job half step 1 given up after the commit deadline",
	                       60000),
	              "%s", t.a[0].log);
	ck_assert(row_of(&t.a[0], "half", 1, upload, sizeof(upload), reason, sizeof(reason)));
	ck_assert_msg(strcmp(upload, "not uploaded") == 0 &&
	                  strstr(reason, "waiting for node n1's part on the tier"),
	              "'%s' '%s'", upload, reason);
	tiered_stop(&t);
}
END_TEST

/*
 * The root's checkpoints of a job deleted (its LATEST with them) and the
 * tier's LATEST lost (or unreadable, _i 1): LATEST is a hint; a restore of
 * LATEST takes the tier's newest manifest, as on the root, and never says
 * "no checkpoint" (the trainer would start over) while the tier has one.
 */
START_TEST(tier_latest_lost)
{
	struct tiered t;
	char out[4096], path[400];
	FILE *f;

	tiered_start(&t, 1, "");
	s3h_save_mode(t.a, 1, "tl", 1, 1, 3, 1, "upload");
	for (long s = 1; s <= 3; s++)
		ck_assert_msg(h_ctl(&t.a[0], out, sizeof(out), "delete --force tl %ld", s) == 0,
		              "%s", out);
	if (_i == 0) {
		s3h_rgw(out, sizeof(out), "curl",
		        "-s -X DELETE -w '%%{http_code}' s3://%s/tier/tl/LATEST", t.bucket);
		ck_assert_msg(atoi(out) == 204, "DELETE of the tier's LATEST: %s", out);
	} else {
		snprintf(path, sizeof(path), "%s/latest", t.dir);
		f = fopen(path, "w");
		ck_assert_ptr_nonnull(f);
		fputs("not a step\n", f);
		fclose(f);
		s3h_rgw(out, sizeof(out), "curl",
		        "-s -T '%s' -w '%%{http_code}' s3://%s/tier/tl/LATEST", path, t.bucket);
		ck_assert_msg(atoi(out) == 200, "PUT of the tier's LATEST: %s", out);
	}
	ck_assert_int_eq(s3h_restore_all(t.a, 1, "tl", 1, 1), 3);
	ck_assert(h_log_has(&t.a[0], "step 3 restored from the upload tier"));
	tiered_stop(&t);
}
END_TEST

/* ---- main ------------------------------------------------------------------ */

Suite *test_suite(void)
{
	Suite *s = suite_create("upload");
	TCase *t = tcase_create("rgw");

	tcase_set_timeout(t, 300);
	tcase_add_test(t, upload_tier_two_nodes);
	tcase_add_test(t, upload_resumes_when_the_store_is_back);
#ifdef CKPT_FAULT_INJECTION /* CKPT_FAULTS: a build without refuses to start with it */
	tcase_add_test(t, upload_resumes_every_pending_step);
	tcase_add_test(t, upload_resume_keeps_what_the_tier_keeps);
#endif
	tcase_add_test(t, upload_refused_is_said);
	tcase_add_test(t, upload_given_up_at_the_deadline);
	tcase_add_test(t, upload_tier_compressed);
	tcase_add_test(t, upload_of_a_deleted_step);
	tcase_add_test(t, upload_retried_after_a_failed_part);
	tcase_add_loop_test(t, tier_latest_lost, 0, 2);
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
