/*
 * Retention against a real agent: which checkpoints survive keep-last K and
 * keep-every M, pins (and that they survive a restart), LATEST, a
 * checkpoint being restored while GC runs, a long verify that GC does not
 * wait for (fault-injection builds), `ckptctl gc|pin|unpin`, and the
 * agent killed while GC deletes: after a restart every checkpoint listed
 * verifies and no half-deleted step is visible.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "client/rpc_call.h"
#include "tests/integration/harness.h"
#include "support/check_main.h"

static char out[1 << 20];

static void commit(struct ckpt_plan *p, int64_t step)
{
	struct ckpt_save *s;
	int rc;

	ck_assert_int_eq(ckpt_save(p, step, NULL, &s), 0);
	rc = ckpt_save_wait(s, CKPT_COMMITTED, 120000);
	ck_assert_msg(rc == 0, "step %lld: %s (%s)", (long long)step, ckpt_strerror(rc),
	              ckpt_save_reason(s));
	ckpt_save_release(s);
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

/* The committed steps `ckptctl list` shows, as "1,2,3"; pinned ones as "2p". */
static const char *listed(const struct agent_proc *a, const char *job)
{
	static char buf[4096];
	size_t o = 0, i;
	json_t *j, *c;

	buf[0] = '\0';
	ck_assert_int_eq(h_ctl(a, out, sizeof(out), "--json list %s", job), 0);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j, "list --json: %s", out);
	json_array_foreach(json_object_get(j, "checkpoints"), i, c)
	{
		if (strcmp(json_string_value(json_object_get(c, "state")), "COMMITTED") != 0)
			continue;
		o += (size_t)snprintf(buf + o, sizeof(buf) - o, "%s%lld%s", o ? "," : "",
		                      (long long)json_integer_value(json_object_get(c, "step")),
		                      json_is_true(json_object_get(c, "pinned")) ? "p" : "");
	}
	json_decref(j);
	return buf;
}

/* What is under <root>/<job>: step directories "1,2,3" and how many .trash leftovers. */
static const char *on_disk(const struct agent_proc *a, const char *job, int *trash)
{
	static char buf[4096];
	long long v[1024];
	size_t n = 0, o = 0;
	char dir[512];
	struct dirent *de;
	DIR *d;

	*trash = 0;
	buf[0] = '\0';
	h_path(a, dir, sizeof(dir), "%s", job);
	d = opendir(dir);
	ck_assert_msg(d, "opendir %s: %s", dir, strerror(errno));
	while ((de = readdir(d))) {
		if (strncmp(de->d_name, ".trash.", 7) == 0)
			(*trash)++;
		else if (strncmp(de->d_name, "step-", 5) == 0 && n < 1024)
			v[n++] = atoll(de->d_name + 5);
	}
	closedir(d);
	for (size_t i = 1; i < n; i++) /* sort */
		for (size_t k = i; k > 0 && v[k - 1] > v[k]; k--) {
			long long t = v[k];

			v[k] = v[k - 1];
			v[k - 1] = t;
		}
	for (size_t i = 0; i < n; i++)
		o += (size_t)snprintf(buf + o, sizeof(buf) - o, "%s%lld", i ? "," : "", v[i]);
	return buf;
}

/* GC after a commit runs on the agent's maint thread: waits until list and disk agree. */
static void wait_survivors(const struct agent_proc *a, const char *job, const char *want)
{
	char seen[4096] = "", disk[4096] = "";
	int trash = 0;

	for (int i = 0; i < 300; i++) {
		snprintf(seen, sizeof(seen), "%s", listed(a, job));
		snprintf(disk, sizeof(disk), "%s", on_disk(a, job, &trash));
		if (strcmp(seen, want) == 0 && trash == 0) {
			/* the pin marker is not part of the name on disk */
			char plain[4096];
			size_t o = 0;

			for (const char *p = want; *p; p++)
				if (*p != 'p')
					plain[o++] = *p;
			plain[o] = '\0';
			if (strcmp(disk, plain) == 0)
				return;
		}
		sleep_ms(50);
	}
	ck_abort_msg("job %s: expected %s; list shows %s, disk has %s (%d trash)", job, want, seen,
	             disk, trash);
}

static int64_t latest_file(const struct agent_proc *a, const char *job)
{
	char path[512];
	long long v = -1;
	FILE *f;

	h_path(a, path, sizeof(path), "%s/LATEST", job);
	f = fopen(path, "r");
	ck_assert_msg(f, "%s: %s", path, strerror(errno));
	ck_assert_int_eq(fscanf(f, "%lld", &v), 1);
	fclose(f);
	return v;
}

/* ---- which steps survive ------------------------------------------------ */

static void save_steps(const struct agent_proc *a, const char *job, int from, int to, size_t scale)
{
	struct ckpt_client *c = h_connect(a);
	struct ckpt_plan *p;
	struct h_model m;

	h_model_make(&m, c, 3, scale);
	ck_assert_int_eq(ckpt_plan_create(c, job, 0, 1, m.t, m.n, &p), 0);
	for (int s = from; s <= to; s++) {
		h_model_fill(&m, (uint64_t)s);
		commit(p, s);
	}
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
}

/* LATEST loads, and holds the values saved at `step` (by save_steps with `scale`). */
static void restore_latest(const struct agent_proc *a, const char *job, int64_t want, size_t scale)
{
	struct ckpt_client *c = h_connect(a);
	struct ckpt_plan *p;
	struct h_model m;
	int64_t step = -1;

	h_model_make(&m, c, 3, scale);
	ck_assert_int_eq(ckpt_plan_create(c, job, 0, 1, m.t, m.n, &p), 0);
	ck_assert_msg(ckpt_restore(p, CKPT_LATEST, &step, NULL) == 0, "restore LATEST: %s",
	              ckpt_last_error(c));
	ck_assert_int_eq(step, want);
	ck_assert(h_model_check(&m, (uint64_t)want, NULL));
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
}

START_TEST(keep_last)
{
	struct agent_proc a;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --keep-last 3");
	save_steps(&a, "k", 1, 8, 20011);
	wait_survivors(&a, "k", "6,7,8");
	ck_assert_int_eq(latest_file(&a, "k"), 8);
	restore_latest(&a, "k", 8, 20011);
	ck_assert_msg(h_log_has(&a, "gc of job k (keep_last 3, keep_every 0): removed 1 checkpoint "
	                            "(steps 1)"),
	              "each GC is logged with what it removed");
	/* the count shows in status */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "--json status"), 0);
	{
		json_t *j = json_loads(out, 0, NULL), *r = json_object_get(j, "retention");

		ck_assert_int_eq(json_integer_value(json_object_get(r, "keep_last")), 3);
		ck_assert_int_eq(json_integer_value(json_object_get(r, "removed")), 5);
		json_decref(j);
	}
	h_agent_cleanup(&a);
}
END_TEST

START_TEST(keep_every)
{
	struct agent_proc a;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --keep-last 2 --keep-every 5");
	save_steps(&a, "m", 1, 12, 20011);
	wait_survivors(&a, "m", "5,10,11,12");
	ck_assert_int_eq(latest_file(&a, "m"), 12);
	restore_latest(&a, "m", 12, 20011);
	/* another job is its own: its steps are counted apart */
	save_steps(&a, "other", 1, 2, 20011);
	wait_survivors(&a, "other", "1,2");
	wait_survivors(&a, "m", "5,10,11,12");
	h_agent_cleanup(&a);
}
END_TEST

START_TEST(keep_last_one_keeps_latest)
{
	struct agent_proc a;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --keep-last 1");
	for (int s = 1; s <= 4; s++) {
		save_steps(&a, "one", s, s, 20011);
		wait_survivors(&a, "one", (char[8]){(char)('0' + s), 0});
		/* LATEST always names a step that is there, and loads */
		ck_assert_int_eq(latest_file(&a, "one"), s);
		restore_latest(&a, "one", s, 20011);
	}
	h_agent_cleanup(&a);
}
END_TEST

/* ---- pins and ckptctl --------------------------------------------------- */

START_TEST(pins)
{
	struct agent_proc a;
	char marker[512];
	json_t *j, *kept;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --keep-last 2");
	save_steps(&a, "pj", 1, 3, 20011);
	wait_survivors(&a, "pj", "2,3");
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "pin pj 2"), 0);
	ck_assert_msg(strstr(out, "pinned pj step 2"), "%s", out);
	h_path(&a, marker, sizeof(marker), "pj/step-000000000002/pinned");
	ck_assert_msg(h_exists(marker), "the pin is a file in the step directory");
	ck_assert_msg(h_ctl(&a, out, sizeof(out), "verify pj 2") == 0, "a pinned step verifies: %s",
	              out);
	/* usage and refusals */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "pin pj"), 2);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "pin pj two"), 2);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "pin pj 1"), 1);
	ck_assert_msg(strstr(out, "no committed step 1"), "%s", out);
	/* a job name the agent would refuse is bad usage, refused before anything is sent */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "pin ../x 1"), 2);
	ck_assert_msg(strstr(out, "byte"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "delete pj 2"), 1);
	ck_assert_msg(strstr(out, "pinned"), "delete refuses a pinned step: %s", out);

	save_steps(&a, "pj", 4, 6, 20011);
	wait_survivors(&a, "pj", "2p,5,6");
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "list pj"), 0);
	ck_assert_msg(strstr(out, "pinned"), "list shows the pin: %s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "--json show pj 2"), 0);

	/* pins are on disk: a crash and a restart keep them */
	h_agent_kill(&a);
	h_agent_restart(&a);
	ck_assert_str_eq(listed(&a, "pj"), "2p,5,6");
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "--json gc pj"), 0);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j, "gc --json: %s", out);
	ck_assert_int_eq(json_array_size(json_object_get(j, "removed")), 0);
	kept = json_object_get(j, "kept");
	ck_assert_int_eq(json_array_size(kept), 3);
	ck_assert_str_eq(json_string_value(json_object_get(json_array_get(kept, 0), "reason")),
	                 "pinned");
	ck_assert_str_eq(json_string_value(json_object_get(json_array_get(kept, 1), "reason")),
	                 "last 2");
	ck_assert_str_eq(json_string_value(json_object_get(json_array_get(kept, 2), "reason")),
	                 "LATEST");
	json_decref(j);

	/* unpinned, the next GC removes it */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "--json unpin pj 2"), 0);
	j = json_loads(out, 0, NULL);
	ck_assert(j && json_is_false(json_object_get(j, "pinned")));
	json_decref(j);
	ck_assert_msg(!h_exists(marker), "unpin removes the marker");
	ck_assert_str_eq(listed(&a, "pj"), "2,5,6");
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "--json gc pj"), 0);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j, "gc --json: %s", out);
	ck_assert_int_eq(json_array_size(json_object_get(j, "removed")), 1);
	ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(j, "removed"), 0)), 2);
	ck_assert_int_gt(json_integer_value(json_object_get(j, "bytes_removed")), 20011);
	ck_assert_int_eq(json_integer_value(json_object_get(j, "keep_last")), 2);
	ck_assert_int_eq(json_array_size(json_object_get(j, "problems")), 0);
	json_decref(j);
	wait_survivors(&a, "pj", "5,6");
	/* the human form, and a GC with nothing to do */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "gc pj"), 0);
	ck_assert_msg(strstr(out, "removed 0 checkpoints") && strstr(out, "LATEST"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "gc"), 2);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "gc a b"), 2);
	ck_assert_msg(h_log_has(&a, "unpinned job pj step 2"), "pins are logged");
	h_agent_cleanup(&a);
}
END_TEST

START_TEST(gc_off_keeps_all)
{
	struct agent_proc a;

	h_agent_start(&a, NULL);
	save_steps(&a, "off", 1, 4, 20011);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "gc off"), 0);
	ck_assert_msg(strstr(out, "retention is off"), "%s", out);
	ck_assert_str_eq(listed(&a, "off"), "1,2,3,4");
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "gc nosuchjob"), 1);
	ck_assert_msg(strstr(out, "no committed checkpoint"), "%s", out);
	h_agent_cleanup(&a);
}
END_TEST

/* ---- a checkpoint being restored ---------------------------------------- */

struct restorer {
	struct ckpt_plan *p;
	int64_t step;
	int rc;
	atomic_bool done;
};

static void *restore_thread(void *arg)
{
	struct restorer *r = arg;

	r->rc = ckpt_restore(r->p, r->step, NULL, NULL);
	atomic_store(&r->done, true);
	return NULL;
}

static uint64_t bytes_read(struct ckpt_client *c)
{
	Ckpt__V1__StatusRequest req = CKPT__V1__STATUS_REQUEST__INIT;
	Ckpt__V1__StatusReply *r;
	uint64_t n;

	ck_assert_int_eq(cl_call(c, IPC_STATUS, &req.base, (ProtobufCMessage **)&r, 10000), 0);
	n = r->bytes_read;
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return n;
}

/* The Gc RPC; the reason step was kept, or "" if it was removed. */
static const char *gc_call(struct ckpt_client *c, const char *job, int64_t step)
{
	static char why[128];
	Ckpt__V1__GcRequest req = CKPT__V1__GC_REQUEST__INIT;
	Ckpt__V1__GcReply *r;

	req.job = (char *)job;
	ck_assert_int_eq(cl_call(c, IPC_GC, &req.base, (ProtobufCMessage **)&r, 60000), 0);
	why[0] = '\0';
	for (size_t i = 0; i < r->n_kept; i++)
		if (r->kept[i]->step == step)
			snprintf(why, sizeof(why), "%s", r->kept[i]->reason);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return why;
}

START_TEST(restore_in_flight_is_kept)
{
	struct agent_proc a;
	struct ckpt_client *c, *ctl;
	struct ckpt_plan *p;
	struct h_model m;
	int seen = 0;

	/* two big checkpoints, then the policy that wants the older one gone */
	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --queue-depth 1");
	c = h_connect(&a);
	h_model_make(&m, c, 8, 24 << 20); /* ~200 MiB: its restore takes a while */
	ck_assert_int_eq(ckpt_plan_create(c, "rs", 0, 1, m.t, m.n, &p), 0);
	h_model_fill(&m, 1);
	commit(p, 1);
	h_model_fill(&m, 2);
	commit(p, 2);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	snprintf(a.args, sizeof(a.args),
	         "--staging-mb 64 --chunk-mb 1 --queue-depth 1 "
	         "--keep-last 1");
	h_agent_restart(&a);
	ck_assert_str_eq(listed(&a, "rs"), "1,2");

	c = h_connect(&a);
	ck_assert_int_eq(cl_open(a.endpoint, false, &ctl), 0);
	h_model_make(&m, c, 8, 24 << 20);
	ck_assert_int_eq(ckpt_plan_create(c, "rs", 0, 1, m.t, m.n, &p), 0);
	/* A restore of step 1 from another thread; GC while its bytes are moving. */
	for (int round = 0; round < 5 && !seen; round++) {
		struct restorer r = {p, 1, 0, false};
		uint64_t base = bytes_read(ctl);
		const char *why;
		pthread_t t;

		h_model_fill(&m, 99);
		ck_assert_int_eq(pthread_create(&t, NULL, restore_thread, &r), 0);
		while (!atomic_load(&r.done) && bytes_read(ctl) == base)
			;
		why = gc_call(ctl, "rs", 1);
		if (!atomic_load(&r.done)) {
			/* The GC answered while the restore was still reading step 1. */
			ck_assert_msg(strcmp(why, "being restored or verified") == 0,
			              "step 1 is being restored: GC kept it for '%s'", why);
			seen++;
		} else {
			/* Finished first: nobody read it when GC decided, and it may be gone. */
			ck_assert_msg(why[0], "the restore of step 1 finished before a GC could "
			                      "run beside it: make it larger for this machine");
		}
		pthread_join(t, NULL);
		ck_assert_msg(r.rc == 0, "restore of step 1: %s", ckpt_last_error(c));
		ck_assert(h_model_check(&m, 1, NULL));
	}
	ck_assert_msg(seen, "no GC ran while a restore was in flight in 5 tries (too fast here?)");
	/* nobody reads it now: it goes */
	ck_assert_str_eq(gc_call(ctl, "rs", 1), "");
	ck_assert_str_eq(listed(&a, "rs"), "2");
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(ctl);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/* ---- a long verify -------------------------------------------------------- */

#ifdef CKPT_FAULT_INJECTION
/* The open of step 1's shard (verify's first touch of its bytes) is this late. */
#define VERIFY_SLOW_MS 15000

struct verifier {
	const char *endpoint, *job;
	int64_t step;
	int rc;
	bool ok;
	uint64_t bytes;
	atomic_bool done;
};

/* The Verify RPC, as `ckptctl verify` makes it: it returns once the verify ended. */
static void *verify_thread(void *arg)
{
	struct verifier *v = arg;
	Ckpt__V1__VerifyRequest req = CKPT__V1__VERIFY_REQUEST__INIT;
	Ckpt__V1__VerifyReply *r = NULL;
	struct ckpt_client *c;

	v->rc = cl_open(v->endpoint, false, &c);
	if (v->rc == 0) {
		req.job = (char *)v->job;
		req.step = v->step;
		v->rc = cl_call(c, IPC_VERIFY, &req.base, (ProtobufCMessage **)&r,
		                VERIFY_SLOW_MS + 120000);
		if (v->rc == 0) {
			v->ok = r->ok;
			v->bytes = r->bytes_checked;
			protobuf_c_message_free_unpacked(&r->base, NULL);
		}
		ckpt_disconnect(c);
	}
	atomic_store(&v->done, true);
	return NULL;
}

/*
 * A verify that takes long (its shard's open held VERIFY_SLOW_MS on its
 * thread: a slow metadata server) holds up neither retention nor other
 * reads: while it runs, steps commit and each commit's GC removes what
 * keep-last 2 lets go, all but the step being verified (marked as read);
 * another verify and a show answer. Once it ends, a GC removes that step too.
 */
START_TEST(long_verify_does_not_hold_up_gc)
{
	struct verifier v = {0};
	struct agent_proc a;
	char seen[4096] = "";
	bool kept_while_read = false;
	int64_t t0;
	pthread_t t;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1");
	save_steps(&a, "lv", 1, 1, 20011);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	snprintf(a.args, sizeof(a.args), "--staging-mb 64 --chunk-mb 1 --keep-last 2");
	snprintf(a.env, sizeof(a.env),
	         "CKPT_FAULTS=openat:slow=%d:path=*/lv/step-000000000001/rank-*", VERIFY_SLOW_MS);
	h_agent_restart(&a);

	v.endpoint = a.endpoint;
	v.job = "lv";
	v.step = 1;
	t0 = (int64_t)time(NULL);
	ck_assert_int_eq(pthread_create(&t, NULL, verify_thread, &v), 0);
	for (int i = 0; i < 200 && !h_log_has(&a, "fault injected: openat("); i++)
		sleep_ms(50);
	ck_assert_msg(h_log_has(&a, "fault injected: openat("), "the verify opens step 1's shard");

	save_steps(&a, "lv", 2, 5, 20011);
	/* what list shows while the verify still runs (looked at again once the list came) */
	while (!atomic_load(&v.done)) {
		const char *now = listed(&a, "lv");

		if (atomic_load(&v.done))
			break;
		snprintf(seen, sizeof(seen), "%s", now);
		if (strcmp(seen, "1,4,5") == 0) {
			kept_while_read = true;
			break;
		}
		sleep_ms(50);
	}
	ck_assert_msg(kept_while_read,
	              "while step 1 was verified (%d s), retention should have left 1 (being "
	              "read) and the last 2: list showed %s (did GC wait for the verify?)",
	              VERIFY_SLOW_MS / 1000, seen);
	/* the reader threads: another verify and a show answer meanwhile */
	ck_assert_msg(h_ctl(&a, out, sizeof(out), "verify lv 5") == 0, "verify lv 5: %s", out);
	ck_assert_msg(!atomic_load(&v.done), "verify lv 5 answered after the long one ended");
	ck_assert_msg(h_ctl(&a, out, sizeof(out), "show lv 4") == 0, "show lv 4: %s", out);
	ck_assert_msg(!atomic_load(&v.done), "show lv 4 answered after the long verify ended");
	/* a step not listed is looked for on the maint thread, which is not held up either */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify lv 99"), 1);
	ck_assert_msg(strstr(out, "no committed step 99"), "%s", out);
	ck_assert_msg(!atomic_load(&v.done), "verify lv 99 answered after the long verify ended");

	pthread_join(t, NULL);
	ck_assert_msg(v.rc == 0 && v.ok && v.bytes > 0, "the long verify: rc %d, ok %d, %llu bytes",
	              v.rc, v.ok, (unsigned long long)v.bytes);
	ck_assert_msg((int64_t)time(NULL) - t0 >= VERIFY_SLOW_MS / 1000 - 1,
	              "the verify took as long as its open was held");
	/* nobody reads step 1 now: the next GC removes it */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "gc lv"), 0);
	wait_survivors(&a, "lv", "4,5");
	h_agent_cleanup(&a);
}
END_TEST
#endif

/* ---- crashes ------------------------------------------------------------ */

/* After a restart: nothing half-deleted, every step listed is on disk whole. */
static void check_consistent(const struct agent_proc *a, const char *job)
{
	char seen[4096], disk[4096], *save = NULL;
	int trash;

	snprintf(seen, sizeof(seen), "%s", listed(a, job));
	snprintf(disk, sizeof(disk), "%s", on_disk(a, job, &trash));
	ck_assert_msg(trash == 0, "recovery removed the renamed leftovers (%d left)", trash);
	ck_assert_msg(strcmp(seen, disk) == 0,
	              "every step directory on disk is a listed checkpoint: list %s, disk %s", seen,
	              disk);
	for (char *s = strtok_r(seen, ",", &save); s; s = strtok_r(NULL, ",", &save))
		ck_assert_msg(h_ctl(a, out, sizeof(out), "verify %s %s", job, s) == 0,
		              "job %s step %s verifies: %s", job, s, out);
}

/* A GC that a crash interrupted: step directories renamed, some of their files deleted. */
START_TEST(planted_trash_is_removed_at_start)
{
	struct agent_proc a;
	char from[512], to[512], shard[512];

	h_agent_start(&a, "--node n0 --staging-mb 64 --chunk-mb 1");
	save_steps(&a, "pl", 1, 3, 100003);
	h_agent_kill(&a);
	/* this node's removals, cut short: */
	/* step 1: out of sight and half deleted (its shard gone, its manifest still there) */
	h_shard(&a, shard, sizeof(shard), "pl", 1, 0);
	h_path(&a, from, sizeof(from), "pl/step-000000000001");
	h_path(&a, to, sizeof(to), "pl/.trash.step-000000000001.n0.4242.1");
	ck_assert_int_eq(rename(from, to), 0);
	ck_assert_int_eq(unlink(strcat(to, strrchr(shard, '/'))), 0);
	/* step 2: out of sight, nothing deleted yet */
	h_path(&a, from, sizeof(from), "pl/step-000000000002");
	h_path(&a, to, sizeof(to), "pl/.trash.step-000000000002.n0.4242.2");
	ck_assert_int_eq(rename(from, to), 0);
	h_agent_restart(&a);
	check_consistent(&a, "pl");
	ck_assert_str_eq(listed(&a, "pl"), "3");
	ck_assert_msg(h_log_has(&a, "2 leftovers"), "the restart logs the leftovers it removed");
	restore_latest(&a, "pl", 3, 100003);
	h_agent_cleanup(&a);
}
END_TEST

/* W ranks of one job in one process, each its own tensors. */
#define KG_WORLD 8

struct ranks {
	struct ckpt_client *c;
	struct h_model m[KG_WORLD];
	struct ckpt_plan *p[KG_WORLD];
};

static void ranks_make(struct ranks *x, const struct agent_proc *a, const char *job)
{
	x->c = h_connect(a);
	for (int r = 0; r < KG_WORLD; r++) {
		h_model_make(&x->m[r], x->c, 2, 64 << 10);
		for (size_t i = 0; i < x->m[r].n; i++)
			snprintf(x->m[r].name[i], sizeof(x->m[r].name[i]), "r%d.t%zu", r, i);
		ck_assert_msg(
		    ckpt_plan_create(x->c, job, r, KG_WORLD, x->m[r].t, x->m[r].n, &x->p[r]) == 0,
		    "plan: %s", ckpt_last_error(x->c));
	}
}

static void ranks_commit(struct ranks *x, int64_t step)
{
	struct ckpt_save *s[KG_WORLD];

	for (int r = 0; r < KG_WORLD; r++) {
		h_model_fill(&x->m[r], (uint64_t)(step * KG_WORLD + r));
		ck_assert_int_eq(ckpt_save(x->p[r], step, NULL, &s[r]), 0);
	}
	for (int r = 0; r < KG_WORLD; r++) {
		ck_assert_msg(ckpt_save_wait(s[r], CKPT_COMMITTED, 120000) == 0, "step %lld: %s",
		              (long long)step, ckpt_save_reason(s[r]));
		ckpt_save_release(s[r]);
	}
}

static void ranks_check_latest(struct ranks *x, int64_t want)
{
	for (int r = 0; r < KG_WORLD; r++) {
		int64_t step = -1;

		ck_assert_msg(ckpt_restore(x->p[r], CKPT_LATEST, &step, NULL) == 0,
		              "restore LATEST: %s", ckpt_last_error(x->c));
		ck_assert_int_eq(step, want);
		ck_assert(h_model_check(&x->m[r], (uint64_t)(want * KG_WORLD + r), NULL));
	}
}

static void ranks_free(struct ranks *x)
{
	for (int r = 0; r < KG_WORLD; r++) {
		ckpt_plan_destroy(x->p[r]);
		h_model_free(&x->m[r]);
	}
	ckpt_disconnect(x->c);
}

/*
 * SIGKILL right after a commit that starts a GC of many checkpoints (eight
 * shards each), at a few delays: each time, after a restart, everything
 * listed verifies, nothing half deleted is visible, and LATEST loads.
 */
START_TEST(killed_during_gc)
{
	static const int delay_ms[] = {0, 1, 2, 4, 8, 0};
	const int rounds = (int)(sizeof(delay_ms) / sizeof(delay_ms[0]));
	struct agent_proc a;
	int step = 0, interrupted = 0;

	h_agent_start(&a, NULL);
	for (int round = 0; round < rounds; round++) {
		struct ranks x;
		int trash;
		char before[4096];

		/* many checkpoints, without retention */
		snprintf(a.args, sizeof(a.args), "--staging-mb 64 --chunk-mb 1");
		if (round) {
			ck_assert_int_eq(h_agent_stop(&a), 0);
			h_agent_restart(&a);
		}
		ranks_make(&x, &a, "kg");
		for (int k = 0; k < 10; k++)
			ranks_commit(&x, ++step);
		ranks_free(&x);
		/* then a commit that makes them all go, and the kill */
		ck_assert_int_eq(h_agent_stop(&a), 0);
		snprintf(a.args, sizeof(a.args), "--staging-mb 64 --chunk-mb 1 --keep-last 1");
		h_agent_restart(&a);
		ranks_make(&x, &a, "kg");
		ranks_commit(&x, ++step);
		sleep_ms(delay_ms[round]);
		h_agent_kill(&a);
		snprintf(before, sizeof(before), "%s", on_disk(&a, "kg", &trash));
		if (trash || strchr(before, ','))
			interrupted++;
		ranks_free(&x);

		h_agent_restart(&a);
		check_consistent(&a, "kg");
		ck_assert_int_eq(latest_file(&a, "kg"), step);
		ranks_make(&x, &a, "kg");
		ranks_check_latest(&x, step);
		ranks_free(&x);
	}
	fprintf(stderr, "killed_during_gc: %d of %d kills landed before the GC had finished\n",
	        interrupted, rounds);
	h_agent_cleanup(&a);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("retention");
	TCase *tc = tcase_create("agent");

	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, keep_last);
	tcase_add_test(tc, keep_every);
	tcase_add_test(tc, keep_last_one_keeps_latest);
	tcase_add_test(tc, pins);
	tcase_add_test(tc, gc_off_keeps_all);
	tcase_add_test(tc, restore_in_flight_is_kept);
	tcase_add_test(tc, planted_trash_is_removed_at_start);
	tcase_add_test(tc, killed_during_gc);
	suite_add_tcase(s, tc);
#ifdef CKPT_FAULT_INJECTION /* the slow open it needs: CKPT_FAULTS */
	tc = tcase_create("verify");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, long_verify_does_not_hold_up_gc);
	suite_add_tcase(s, tc);
#endif
	return s;
}
