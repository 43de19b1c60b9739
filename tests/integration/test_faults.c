/*
 * Faults put into a real ckptd's storage calls through CKPT_FAULTS
 * (storage/testing/faults.c): ENOSPC, EIO, short transfers and failed fsyncs at
 * each step of a save (shard create, write, size, fsync of the file and of
 * its directory), of the commit (this node's part, the manifest: temporary
 * write, fsync, link, directory fsync; LATEST), of a removal (rename out of
 * sight, fsync, unlink; delete and the GC) and of a restore or verify (read
 * errors, short reads, open, the manifest).
 *
 * Each case has a job of its own: step 1 commits, the fault is aimed at
 * step 2 alone (its path), step 3 comes after. It checks that step 2 ends
 * as it must (FAILED, with a reason naming the failure, or COMMITTED where
 * the code retries or the commit stands), that the fault was put in (the
 * agent logs each), that step 1 still verifies, that nothing partial is
 * listed, and that step 3 commits. At the end the agent is restarted
 * without faults: exactly the committed steps are listed, and each verifies.
 *
 * Needs a ckptd built with -DCKPT_FAULT_INJECTION=ON: skipped (77) otherwise.
 */
#include <errno.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

#define DEADLINE_S 3 /* --commit-deadline: a commit that keeps failing ends after it */

enum outcome {
	FAILS, /* step 2 FAILED, its reason naming the failure */
	COMMITS, /* step 2 COMMITTED all the same (retried, or the commit stands) */
	FAILS_KEPT, /* FAILED, but its manifest is there, whole: committed after a restart */
};

struct fcase {
	const char *rules; /* {J}: the job's directory, as a glob ("*\/<job>") */
	enum outcome want;
	const char *needle[2]; /* in step 2's reason (FAILS) */
	const char *op; /* in the log: "fault injected: <op>(" */
	bool latest_stays; /* COMMITS, but LATEST still names step 1 */
};

/* ---- helpers ----------------------------------------------------------- */

/* Saves step; the state it ends in, and why (reason, len bytes). */
static enum ckpt_state save_step(struct ckpt_plan *p, int64_t step, char *reason, size_t len)
{
	struct ckpt_save *s;
	enum ckpt_state st;

	ck_assert_int_eq(ckpt_save(p, step, NULL, &s), 0);
	ckpt_save_wait(s, CKPT_COMMITTED, 120000);
	st = ckpt_save_state(s);
	snprintf(reason, len, "%s", ckpt_save_reason(s));
	ckpt_save_release(s);
	return st;
}

static void commit_step(struct ckpt_plan *p, const char *job, int64_t step)
{
	char why[1024];
	enum ckpt_state st = save_step(p, step, why, sizeof(why));

	ck_assert_msg(st == CKPT_COMMITTED, "job %s step %lld: %s: %s", job, (long long)step,
	              ckpt_state_name(st), why);
}

/* The state `ckptctl --json list job` gives step, or "" when it is not listed. */
static void listed(const struct agent_proc *a, const char *job, long long step, char *state,
                   size_t len)
{
	static char out[1 << 20];
	json_t *j, *c;
	size_t i;

	state[0] = '\0';
	ck_assert_int_eq(h_ctl(a, out, sizeof(out), "--json list %s", job), 0);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j, "ckptctl list: %s", out);
	json_array_foreach(json_object_get(j, "checkpoints"), i, c)
	{
		if (json_integer_value(json_object_get(c, "step")) == step)
			snprintf(state, len, "%s", json_string_value(json_object_get(c, "state")));
	}
	json_decref(j);
}

static void verifies(const struct agent_proc *a, const char *job, long long step)
{
	char out[16384];
	int rc = h_ctl(a, out, sizeof(out), "verify %s %lld", job, step);

	ck_assert_msg(rc == 0 && strstr(out, "OK"), "verify %s %lld: %s", job, step, out);
}

/* Whether the log says a fault was put into `op` on a path in (or of) job's directory. */
static bool fault_logged(const struct agent_proc *a, const char *op, const char *job)
{
	FILE *f = fopen(a->log, "r");
	char line[8192], head[64], in[80], of[80];
	bool found = false;

	snprintf(head, sizeof(head), "fault injected: %s(", op);
	snprintf(in, sizeof(in), "/%s/", job);
	snprintf(of, sizeof(of), "/%s)", job);
	while (f && !found && fgets(line, sizeof(line), f))
		found = strstr(line, head) && (strstr(line, in) || strstr(line, of));
	if (f)
		fclose(f);
	return found;
}

/* CKPT_FAULTS=<every case's rules, {J} made "*\/<prefix><k>">. */
static void plan_env(const char *prefix, const struct fcase *v, size_t n, char *env, size_t len)
{
	size_t o = (size_t)snprintf(env, len, "CKPT_FAULTS=");

	for (size_t k = 0; k < n; k++) {
		const char *r = v[k].rules, *j;

		o += (size_t)snprintf(env + o, len - o, k ? ";" : "");
		while ((j = strstr(r, "{J}"))) {
			o += (size_t)snprintf(env + o, len - o, "%.*s*/%s%zu", (int)(j - r), r,
			                      prefix, k);
			r = j + 3;
		}
		o += (size_t)snprintf(env + o, len - o, "%s", r);
		ck_assert_msg(o < len, "the plan is longer than %zu bytes", len);
	}
}

/* What LATEST of job says ("" if none). */
static void latest_of(const struct agent_proc *a, const char *job, char *buf, size_t len)
{
	char path[512];
	FILE *f;

	h_path(a, path, sizeof(path), "%s/LATEST", job);
	buf[0] = '\0';
	f = fopen(path, "r");
	if (f) {
		if (!fgets(buf, (int)len, f))
			buf[0] = '\0';
		fclose(f);
	}
	buf[strcspn(buf, "\n")] = '\0';
}

/* One case: steps 1, 2 (the fault's) and 3 of job; see the top of the file. */
static void run_case(struct agent_proc *a, struct ckpt_client *c, const char *job,
                     const struct fcase *fc)
{
	struct ckpt_plan *p;
	struct h_model m;
	char why[2048], st[32];
	enum ckpt_state s2;

	h_model_make(&m, c, 4, 600001); /* ~2.4 MB: three 1 MiB writes */
	ck_assert_int_eq(ckpt_plan_create(c, job, 0, 1, m.t, m.n, &p), 0);
	h_model_fill(&m, 1);
	commit_step(p, job, 1);
	h_model_fill(&m, 2);
	s2 = save_step(p, 2, why, sizeof(why));
	ck_assert_msg(fault_logged(a, fc->op, job), "job %s (%s): no fault was put in", job,
	              fc->rules);
	if (fc->want != COMMITS) {
		ck_assert_msg(s2 == CKPT_FAILED, "job %s (%s): step 2 is %s, not FAILED", job,
		              fc->rules, ckpt_state_name(s2));
		for (int i = 0; i < 2; i++)
			ck_assert_msg(!fc->needle[i] || strstr(why, fc->needle[i]),
			              "job %s (%s): the reason does not say '%s': %s", job,
			              fc->rules, fc->needle[i], why);
		listed(a, job, 2, st, sizeof(st));
		ck_assert_msg(strcmp(st, "COMMITTED") != 0,
		              "job %s: a failed step is listed "
		              "COMMITTED",
		              job);
		{
			/*
			 * A manifest whose directory fsync failed stays (another node may
			 * have read it: commit/README.md); whole, it verifies, as it would
			 * after a restart. Any other failed step has nothing to verify.
			 */
			char mpath[600];

			h_path(a, mpath, sizeof(mpath), "%s/step-%012d/manifest.json", job, 2);
			if (!h_exists(mpath))
				ck_assert_int_ne(h_ctl(a, why, sizeof(why), "verify %s 2", job), 0);
		}
	} else {
		ck_assert_msg(s2 == CKPT_COMMITTED, "job %s (%s): step 2 is %s: %s", job, fc->rules,
		              ckpt_state_name(s2), why);
		verifies(a, job, 2);
		latest_of(a, job, st, sizeof(st));
		ck_assert_msg(strcmp(st, fc->latest_stays ? "1" : "2") == 0,
		              "job %s (%s): LATEST says '%s'", job, fc->rules, st);
	}
	verifies(a, job, 1);
	/* the fault's window is over: the agent serves, the next step commits */
	h_model_fill(&m, 3);
	commit_step(p, job, 3);
	verifies(a, job, 3);
	latest_of(a, job, st, sizeof(st));
	ck_assert_msg(strcmp(st, "3") == 0, "job %s: LATEST says '%s' after step 3", job, st);
	/* byte-exact, restored */
	h_model_fill(&m, 9);
	ck_assert_int_eq(ckpt_restore(p, 1, NULL, NULL), 0);
	ck_assert(h_model_check(&m, 1, NULL));
	ckpt_plan_destroy(p);
	h_model_free(&m);
}

/* After a restart without faults: exactly steps 1, 3 (and 2 if it committed), all whole. */
static void after_restart(struct agent_proc *a, const char *prefix, const struct fcase *v, size_t n)
{
	for (size_t k = 0; k < n; k++) {
		char job[32], st[32];

		snprintf(job, sizeof(job), "%s%zu", prefix, k);
		for (long long step = 1; step <= 3; step++) {
			bool want = step != 2 || v[k].want != FAILS;

			listed(a, job, step, st, sizeof(st));
			ck_assert_msg(want ? strcmp(st, "COMMITTED") == 0 : st[0] == '\0',
			              "job %s (%s) step %lld after a restart: '%s'", job,
			              v[k].rules, step, st);
			if (want)
				verifies(a, job, step);
		}
	}
}

static void run_cases(const char *prefix, const struct fcase *v, size_t n)
{
	static char env[8192];
	char args[128];
	struct agent_proc a;
	struct ckpt_client *c;

	snprintf(args, sizeof(args), "--staging-mb 32 --chunk-mb 1 --commit-deadline %d",
	         DEADLINE_S);
	plan_env(prefix, v, n, env, sizeof(env));
	h_agent_start_env(&a, args, env);
	ck_assert_msg(h_log_has(&a, "fault injection: "), "the agent took the plan");
	c = h_connect(&a);
	for (size_t k = 0; k < n; k++) {
		char job[32];

		snprintf(job, sizeof(job), "%s%zu", prefix, k);
		run_case(&a, c, job, &v[k]);
	}
	ckpt_disconnect(c);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	a.env[0] = '\0';
	h_agent_restart(&a);
	after_restart(&a, prefix, v, n);
	h_agent_cleanup(&a);
}

/* ---- a save ------------------------------------------------------------ */

#define STEP2 "{J}/step-000000000002"

/* A rule that fails step 2, its reason saying n1 and n2; one that lets it commit. */
#define FAIL(rules, op, n1, n2)                                                                    \
	{                                                                                          \
		rules, FAILS, {n1, n2}, op, false                                                  \
	}
#define PASS(rules, op)                                                                            \
	{                                                                                          \
		rules, COMMITS, {NULL, NULL}, op, false                                            \
	}
#define PASS_LATEST_STAYS(rules, op)                                                               \
	{                                                                                          \
		rules, COMMITS, {NULL, NULL}, op, true                                             \
	}
#define FAIL_KEPT(rules, op, n1, n2)                                                               \
	{                                                                                          \
		rules, FAILS_KEPT, {n1, n2}, op, false                                             \
	}

static const struct fcase save_cases[] = {
    FAIL("mkdirat:EDQUOT:path=" STEP2, "mkdirat", "cannot create directory", "quota"),
    FAIL("openat:ENOSPC:path=" STEP2 "/rank-*", "openat", "cannot create shard", "No space left"),
    FAIL("fallocate:ENOSPC:path=" STEP2 "/rank-*", "fallocate", "cannot reserve",
         "the disk is full"),
    FAIL("io_write:EIO:path=" STEP2 "/rank-*:after=2", "io_write", "writing", "Input/output error"),
    FAIL("io_write:ENOSPC:path=" STEP2 "/rank-*", "io_write", "writing", "No space left"),
    /* short writes are requeued by the engine: the save is whole */
    PASS("io_write:short:path=" STEP2 "/rank-*:count=6", "io_write"),
    /* writes that never move a byte fail */
    FAIL("io_write:short=0:path=" STEP2 "/rank-*:count=inf", "io_write", "writing",
         "Input/output error"),
    FAIL("ftruncate:EIO:path=" STEP2 "/rank-*", "ftruncate", "making durable",
         "Input/output error"),
    FAIL("io_fsync:EIO:path=" STEP2 "/rank-*", "io_fsync", "making durable", "Input/output error"),
    /* the directories' fsyncs, which make the shard's name and its step's durable */
    FAIL("io_fsync:EIO:path=" STEP2, "io_fsync", "making durable", "Input/output error"),
    FAIL("io_fsync:ENOSPC:path={J}:after=1", "io_fsync", "making durable", "No space left"),
};

START_TEST(save_faults)
{
	run_cases("sv", save_cases, sizeof(save_cases) / sizeof(save_cases[0]));
}
END_TEST

/* ---- the commit -------------------------------------------------------- */

/*
 * The commit retries what fails (it may pass: an NFS hiccup) until the
 * deadline: a fault that lasts (count=inf) fails the step there, naming it.
 */
static const struct fcase commit_cases[] = {
    /* this node's part */
    FAIL("mkdirat:ENOSPC:path=" STEP2 "/parts:count=inf", "mkdirat", "cannot create directory",
         "No space left"),
    FAIL("pwrite:ENOSPC:path=" STEP2 "/parts/*.tmp:count=inf", "pwrite", "this node's part",
         "No space left"),
    FAIL("fsync:EIO:path=" STEP2 "/parts/*.tmp:count=inf", "fsync", "this node's part", "fsync of"),
    FAIL("linkat:EIO:path=" STEP2 "/parts/*:count=inf", "linkat", "this node's part", "visible"),
    /* once: the next poll finds the part there, whole */
    PASS("fsync:EIO:path=" STEP2 "/parts", "fsync"),
    /* the manifest */
    FAIL("pwrite:ENOSPC:path=" STEP2 "/*manifest.json*:count=inf", "pwrite", "manifest.json",
         "No space left"),
    PASS("pwrite:short:path=" STEP2 "/*manifest.json*:count=3", "pwrite"),
    FAIL("fsync:EIO:path=" STEP2 "/*manifest.json.tmp:count=inf", "fsync", "manifest.json",
         "fsync of"),
    FAIL("linkat:EIO:path=" STEP2 "/manifest.json:count=inf", "linkat", "manifest.json",
         "Input/output error"),
    /* no links here: a rename that never replaces, which fails too */
    FAIL("linkat:EPERM:path=" STEP2 "/manifest.json:count=inf;rename_noreplace:ENOSPC:path=" STEP2
         "/manifest.json:count=inf",
         "rename_noreplace", "manifest.json", "No space left"),
    /*
     * The step directory's fsync after the link (the first fsync of it made
     * the parts directory durable): once, it is done again and the step
     * commits; for good, no trainer is told COMMITTED, as a crash could
     * lose the name. The manifest stays (another node may have seen it).
     */
    PASS("fsync:EIO:path=" STEP2 ":after=1", "fsync"),
    FAIL_KEPT("fsync:EIO:path=" STEP2 ":after=1:count=inf", "fsync", "manifest.json",
              "fsync of the directory"),
    /* LATEST is a hint: the commit stands, LATEST stays behind until the next */
    PASS_LATEST_STAYS("renameat:EIO:path={J}/LATEST:after=1", "renameat"),
    PASS_LATEST_STAYS("pwrite:ENOSPC:path={J}/*LATEST.tmp:after=1", "pwrite"),
};

START_TEST(commit_faults)
{
	run_cases("cm", commit_cases, sizeof(commit_cases) / sizeof(commit_cases[0]));
}
END_TEST

/* ---- removal: delete and the GC ---------------------------------------- */

/* A job's plan over its own tensors, for the cases below. */
struct job {
	char name[32];
	struct h_model m;
	struct ckpt_plan *p;
};

/* Four tensors of about `scale` bytes each, read and written 1 MiB at a time. */
static void job_open(struct job *j, struct ckpt_client *c, const char *name, size_t scale)
{
	snprintf(j->name, sizeof(j->name), "%s", name);
	h_model_make(&j->m, c, 4, scale);
	ck_assert_int_eq(ckpt_plan_create(c, name, 0, 1, j->m.t, j->m.n, &j->p), 0);
}

/* Commits steps from..to, step k holding the values of seed k. */
static void job_commit(struct job *j, int64_t from, int64_t to)
{
	for (int64_t k = from; k <= to; k++) {
		h_model_fill(&j->m, (uint64_t)k);
		commit_step(j->p, j->name, k);
	}
}

/* Restores step into the tensors and checks they hold its values. */
static void job_restores(struct job *j, int64_t step)
{
	int rc;

	h_model_fill(&j->m, 999);
	rc = ckpt_restore(j->p, step, NULL, NULL);
	ck_assert_msg(rc == 0, "restore %s %lld: %s", j->name, (long long)step,
	              ckpt_last_error(j->m.c));
	ck_assert(h_model_check(&j->m, (uint64_t)step, NULL));
}

static void job_close(struct job *j)
{
	ckpt_plan_destroy(j->p);
	h_model_free(&j->m);
}

static void is_listed(const struct agent_proc *a, const char *job, long long step, bool want)
{
	char st[32];

	listed(a, job, step, st, sizeof(st));
	ck_assert_msg(want ? strcmp(st, "COMMITTED") == 0 : st[0] == '\0',
	              "job %s step %lld is listed '%s'", job, step, st);
}

/* Whether job's directory holds anything out of sight (".trash."). */
static bool has_trash(const struct agent_proc *a, const char *job)
{
	char cmd[640], out[64];
	FILE *f;

	snprintf(cmd, sizeof(cmd), "ls -a '%s/%s' | grep -c '^\\.trash\\.'", a->root, job);
	f = popen(cmd, "r");
	ck_assert_ptr_nonnull(f);
	out[0] = '\0';
	if (!fgets(out, sizeof(out), f))
		out[0] = '\0';
	pclose(f);
	return atoi(out) > 0;
}

/*
 * Each job's faults: rm0 the rename out of sight, rm1 moving LATEST off the
 * step, rm2 the fsync after the rename (the fifth fsync of the job's
 * directory: OWNER and plans/ made, LATEST of steps 1 and 2, then the removal's),
 * rm3 deleting the files once out of sight, gc0 the GC's rename of step 1
 * (twice: after the fourth commit, and at ckptctl gc).
 */
static const char removal_plan[] = "CKPT_FAULTS=renameat:EIO:path=*/rm0/step-000000000001"
                                   ";renameat:ENOSPC:path=*/rm1/LATEST:after=2"
                                   ";fsync:EIO:path=*/rm2:after=4"
                                   ";unlinkat:EIO:path=*/rm3/.trash.step-000000000001.*/rank-*"
                                   ";renameat:EIO:path=*/gc0/step-000000000001:count=2";

START_TEST(removal_faults)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct job j[5];
	char out[16384], latest[32];
	int rc;

	/* keep-last 3: no GC before a job's fourth commit */
	h_agent_start_env(&a, "--staging-mb 32 --chunk-mb 1 --keep-last 3", removal_plan);
	c = h_connect(&a);
	job_open(&j[0], c, "rm0", 300001);
	job_open(&j[1], c, "rm1", 300001);
	job_open(&j[2], c, "rm2", 300001);
	job_open(&j[3], c, "rm3", 300001);
	job_open(&j[4], c, "gc0", 300001);
	for (int k = 0; k < 4; k++)
		job_commit(&j[k], 1, 2);

	/* the rename out of sight fails: the step stays, whole */
	rc = h_ctl(&a, out, sizeof(out), "delete --force rm0 1");
	ck_assert_msg(rc != 0 && strstr(out, "rename failed") && strstr(out, "Input/output error"),
	              "delete rm0 1 (%d): %s", rc, out);
	ck_assert(fault_logged(&a, "renameat", "rm0"));
	is_listed(&a, "rm0", 1, true);
	verifies(&a, "rm0", 1);
	job_restores(&j[0], 1);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "delete --force rm0 1"), 0);
	is_listed(&a, "rm0", 1, false);
	verifies(&a, "rm0", 2);

	/* LATEST cannot move off the step: nothing is removed */
	rc = h_ctl(&a, out, sizeof(out), "delete --force rm1 2");
	ck_assert_msg(rc != 0 && strstr(out, "LATEST") && strstr(out, "No space left"),
	              "delete rm1 2 (%d): %s", rc, out);
	ck_assert(fault_logged(&a, "renameat", "rm1"));
	is_listed(&a, "rm1", 2, true);
	verifies(&a, "rm1", 2);
	latest_of(&a, "rm1", latest, sizeof(latest));
	ck_assert_str_eq(latest, "2");
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "delete --force rm1 2"), 0);
	latest_of(&a, "rm1", latest, sizeof(latest));
	ck_assert_str_eq(latest, "1");
	job_restores(&j[1], 1);

	/* out of sight, but not durably: said; the other step is untouched */
	ck_assert_msg(!fault_logged(&a, "fsync", "rm2"), "the rm2 rule fired before the delete");
	rc = h_ctl(&a, out, sizeof(out), "delete --force rm2 1");
	ck_assert_msg(rc != 0 && strstr(out, "fsync of the directory") &&
	                  strstr(out, "Input/output error"),
	              "delete rm2 1 (%d): %s", rc, out);
	ck_assert(fault_logged(&a, "fsync", "rm2"));
	is_listed(&a, "rm2", 1, false);
	verifies(&a, "rm2", 2);

	/* out of sight, its files not all deleted: said; a clean-up takes them later */
	rc = h_ctl(&a, out, sizeof(out), "delete --force rm3 1");
	ck_assert_msg(rc != 0 && strstr(out, "out of sight") && strstr(out, "Input/output error"),
	              "delete rm3 1 (%d): %s", rc, out);
	ck_assert(fault_logged(&a, "unlinkat", "rm3"));
	is_listed(&a, "rm3", 1, false);
	ck_assert(has_trash(&a, "rm3"));
	verifies(&a, "rm3", 2);
	job_restores(&j[3], 2);

	/* the GC after step 4 cannot remove step 1: it stays, whole; the next GC takes it */
	job_commit(&j[4], 1, 4);
	for (int i = 0; i < 100 && !fault_logged(&a, "renameat", "gc0"); i++)
		usleep(50000);
	ck_assert(fault_logged(&a, "renameat", "gc0"));
	/*
	 * Wait for the warning itself: the log is at debug level, so the summary
	 * of an earlier GC that removed nothing is there before this one's.
	 */
	for (int i = 0; i < 200 && !h_log_has(&a, "gc of job gc0: step 1: cannot remove"); i++)
		usleep(50000);
	ck_assert_msg(h_log_has(&a, "gc of job gc0: step 1: cannot remove"), "the GC says why");
	is_listed(&a, "gc0", 1, true);
	/* ckptctl gc meets it too: it says which removal failed, and exits 1 */
	rc = h_ctl(&a, out, sizeof(out), "gc gc0");
	ck_assert_msg(rc == 1 && strstr(out, "FAILED") && strstr(out, "Input/output error"),
	              "gc gc0 (%d): %s", rc, out);
	is_listed(&a, "gc0", 1, true);
	verifies(&a, "gc0", 1);
	job_commit(&j[4], 5, 5);
	for (int i = 0; i < 100; i++) {
		listed(&a, "gc0", 1, latest, sizeof(latest));
		if (!latest[0])
			break;
		usleep(50000);
	}
	is_listed(&a, "gc0", 1, false);
	is_listed(&a, "gc0", 2, false);
	for (int k = 3; k <= 5; k++)
		verifies(&a, "gc0", k);
	job_restores(&j[4], 5);

	for (int k = 0; k < 5; k++)
		job_close(&j[k]);
	ckpt_disconnect(c);
	/* restarted without faults: what is left is whole, and nothing out of sight stays */
	ck_assert_int_eq(h_agent_stop(&a), 0);
	a.env[0] = '\0';
	h_agent_restart(&a);
	is_listed(&a, "rm0", 1, false);
	is_listed(&a, "rm1", 2, false);
	is_listed(&a, "rm2", 1, false);
	is_listed(&a, "rm3", 1, false);
	verifies(&a, "rm0", 2);
	verifies(&a, "rm1", 1);
	verifies(&a, "rm2", 2);
	verifies(&a, "rm3", 2);
	ck_assert_msg(!has_trash(&a, "rm2") && !has_trash(&a, "rm3"), "the start cleaned up");
	h_agent_cleanup(&a);
}
END_TEST

/* ---- restore and verify ------------------------------------------------- */

static const char read_plan[] = "CKPT_FAULTS=io_read:EIO:path=*/rs/step-000000000001/rank-*"
                                ";io_read:EIO:path=*/rs/step-000000000002/rank-*:after=1"
                                ";io_read:short=0:path=*/rs/step-000000000003/rank-*"
                                ";io_read:short:path=*/rs/step-000000000004/rank-*:count=4"
                                ";openat:EIO:path=*/rs/step-000000000005/rank-*:after=1"
                                ";pread:EIO:path=*/rs/step-000000000006/manifest.json"
                                ";io_read:short=0:path=*/rs/step-000000000007/rank-*";

/* A restore refused with err, its message saying n1 and n2; then it succeeds. */
static void refused_once(struct job *j, int64_t step, int err, const char *n1, const char *n2)
{
	int rc;

	h_model_fill(&j->m, 999);
	rc = ckpt_restore(j->p, step, NULL, NULL);
	ck_assert_msg(rc == err && strstr(ckpt_last_error(j->m.c), n1) &&
	                  strstr(ckpt_last_error(j->m.c), n2),
	              "restore rs %lld: %d (%s), not %d with '%s' and '%s'", (long long)step, rc,
	              ckpt_last_error(j->m.c), err, n1, n2);
	job_restores(j, step);
}

START_TEST(read_faults)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct job j;
	char out[16384];
	int rc;

	h_agent_start_env(&a, "--staging-mb 32 --chunk-mb 1", read_plan);
	c = h_connect(&a);
	job_open(&j, c, "rs", 700001); /* three windows of 1 MiB */
	job_commit(&j, 1, 7);

	/* a read error: refused, naming the file; nothing changed on disk */
	refused_once(&j, 1, -EIO, "Input/output error", "rank-");
	/* verify: refused too (CORRUPT is for bytes, this says the error) */
	rc = h_ctl(&a, out, sizeof(out), "verify rs 2");
	ck_assert_msg(rc != 0 && strstr(out, "Input/output error") && strstr(out, "rank-"),
	              "verify rs 2 (%d): %s", rc, out);
	verifies(&a, "rs", 2);
	/* a read that meets the end of the file early: the bytes are not all there */
	refused_once(&j, 3, -EBADMSG, "ends before", "rank-");
	/* short reads are requeued: the restore is whole */
	job_restores(&j, 4);
	ck_assert(fault_logged(&a, "io_read", "step-000000000004"));
	/* the shard cannot be opened */
	refused_once(&j, 5, -EIO, "cannot open shard", "Input/output error");
	/* the manifest cannot be read */
	refused_once(&j, 6, -EIO, "manifest.json", "Input/output error");
	/* verify of a file that reads short */
	rc = h_ctl(&a, out, sizeof(out), "verify rs 7");
	ck_assert_msg(rc != 0 && strstr(out, "ends before"), "verify rs 7 (%d): %s", rc, out);
	verifies(&a, "rs", 7);
	for (int k = 1; k <= 7; k++) {
		char dir[32];

		snprintf(dir, sizeof(dir), "rs/step-%012d", k);
		ck_assert_msg(fault_logged(&a,
		                           k == 5   ? "openat"
		                           : k == 6 ? "pread"
		                                    : "io_read",
		                           dir),
		              "step %d: no fault was put in", k);
	}
	/* and it goes on: a save commits, every step verifies after a restart */
	job_commit(&j, 8, 8);
	job_close(&j);
	ckpt_disconnect(c);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	a.env[0] = '\0';
	h_agent_restart(&a);
	for (int k = 1; k <= 8; k++)
		verifies(&a, "rs", k);
	h_agent_cleanup(&a);
}
END_TEST

/* ---- the capture --------------------------------------------------------- */

/*
 * CAPTURED comes only once the last chunk is copied: each chunk's copy is
 * held 150 ms (capture:slow), and the trainer writes new values the moment
 * CAPTURED comes; every chunk of the checkpoint, the last one included,
 * must hold the values of before.
 */
static const char capture_plan[] = "CKPT_FAULTS=capture:slow=150:path=hold/*:count=inf";

START_TEST(captured_after_last_chunk)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	struct h_model m;
	size_t bad = 0;

	h_agent_start_env(&a, "--staging-mb 32 --chunk-mb 1", capture_plan);
	c = h_connect(&a);
	h_model_make(&m, c, 4, 1 << 20); /* ~4 MiB: 5 chunks of 1 MiB */
	ck_assert_int_eq(ckpt_plan_create(c, "hold", 0, 1, m.t, m.n, &p), 0);
	h_model_fill(&m, 7);
	ck_assert_int_eq(ckpt_save(p, 1, NULL, &s), 0);
	ck_assert_int_eq(ckpt_save_wait(s, CKPT_CAPTURED, 60000), 0);
	h_model_fill(&m, 8); /* the next step's values, at once */
	ck_assert_int_eq(ckpt_save_wait(s, CKPT_COMMITTED, 60000), 0);
	ckpt_save_release(s);
	ck_assert_msg(
	    h_log_has(&a, "fault injected: capture(hold/step-000000000001/rank-0/chunk-4)"),
	    "the last chunk's copy was not held");
	ck_assert_int_eq(ckpt_restore(p, 1, NULL, NULL), 0);
	ck_assert_msg(h_model_check(&m, 7, &bad), "tensor %s holds values written after CAPTURED",
	              m.name[bad]);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * No commit while a rank is still on its way: each chunk of rank 1's save
 * is held 400 ms before its copy (rank 0's are not); once rank 0 is DURABLE
 * (and 300 ms more, time for a commit to happen), the step has no
 * manifest, is not listed as committed, and rank 1 is not yet DURABLE;
 * then it commits.
 */
static const char slow_rank_plan[] =
    "CKPT_FAULTS=capture:slow=400:path=nc/step-000000000001/rank-1/*:count=inf";

START_TEST(no_commit_while_a_rank_writes)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p[2];
	struct ckpt_save *s[2];
	int64_t shape[1] = {4 << 20};
	char path[512], out[8192];
	void *mem;

	h_agent_start_env(&a, "--staging-mb 32 --chunk-mb 1", slow_rank_plan);
	c = h_connect(&a);
	ck_assert_int_eq(ckpt_host_alloc(c, 2 * ((size_t)4 << 20), &mem), 0);
	for (int r = 0; r < 2; r++) {
		struct ckpt_tensor t = {r ? "r1.w" : "r0.w",
		                        CKPT_U8,
		                        1,
		                        shape,
		                        (char *)mem + ((size_t)r << 22),
		                        NULL,
		                        NULL};

		memset(t.data, 'a' + r, (size_t)4 << 20);
		ck_assert_int_eq(ckpt_plan_create(c, "nc", r, 2, &t, 1, &p[r]), 0);
	}
	for (int r = 0; r < 2; r++)
		ck_assert_int_eq(ckpt_save(p[r], 1, NULL, &s[r]), 0);
	ck_assert_int_eq(ckpt_save_wait(s[0], CKPT_DURABLE, 60000), 0);
	usleep(300 * 1000);
	h_path(&a, path, sizeof(path), "nc/step-%012d/manifest.json", 1);
	ck_assert_msg(ckpt_save_state(s[1]) < CKPT_DURABLE, "rank 1 was not slowed: %s",
	              ckpt_state_name(ckpt_save_state(s[1])));
	ck_assert_msg(!h_exists(path), "a manifest while rank 1 still writes");
	ck_assert_int_eq(ckpt_save_state(s[0]), CKPT_DURABLE);
	h_ctl(&a, out, sizeof(out), "list nc");
	for (char *l = out; l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		char state[32] = "";

		if (strncmp(l, "nc ", 3) == 0 && sscanf(l, "%*s %*s %31s", state) == 1)
			ck_assert_msg(strcmp(state, "COMMITTED") != 0, "listed as committed: %s",
			              out);
	}
	for (int r = 0; r < 2; r++) {
		ck_assert_int_eq(ckpt_save_wait(s[r], CKPT_COMMITTED, 60000), 0);
		ckpt_save_release(s[r]);
		ckpt_plan_destroy(p[r]);
	}
	ck_assert(h_exists(path) &&
	          h_log_has(&a, "fault injected: capture(nc/step-000000000001/rank-1/chunk-3)"));
	ckpt_host_free(c, mem);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * A step every rank saved commits even when a newer one commits first:
 * rank 1's copy of step 1 is held 300 ms a chunk, so step 2 (saved by both
 * right after, rank 1's with the same values) commits while step 1 is still
 * on its way. Step 1 must not
 * fail for it ("ranks had not all saved" was said of a step both had
 * saved); it commits after, LATEST stays on 2, and each restores its own.
 */
static const char behind_plan[] =
    "CKPT_FAULTS=capture:slow=300:path=sb/step-000000000001/rank-1/*:count=inf";

/* the byte rank r's tensor holds in step */
static int want(int step, int r)
{
	return r ? 'z' : '0' + step;
}

START_TEST(older_step_commits_behind_newer)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p[2];
	struct ckpt_save *s[2][2];
	struct ckpt_tensor t[2];
	int64_t shape[1] = {4 << 20};
	char latest[64], reason[256];
	void *mem;

	h_agent_start_env(&a, "--staging-mb 64 --chunk-mb 1 --capture-threads 4", behind_plan);
	c = h_connect(&a);
	ck_assert_int_eq(ckpt_host_alloc(c, 2 * ((size_t)4 << 20), &mem), 0);
	for (int r = 0; r < 2; r++) {
		t[r] = (struct ckpt_tensor){r ? "r1.w" : "r0.w",
		                            CKPT_U8,
		                            1,
		                            shape,
		                            (char *)mem + ((size_t)r << 22),
		                            NULL,
		                            NULL};
		ck_assert_int_eq(ckpt_plan_create(c, "sb", r, 2, &t[r], 1, &p[r]), 0);
	}
	/* rank 0 writes new values once its step 1 is CAPTURED; rank 1 keeps its own */
	for (int r = 0; r < 2; r++) {
		memset(t[r].data, want(1, r), (size_t)4 << 20);
		ck_assert_int_eq(ckpt_save(p[r], 1, NULL, &s[0][r]), 0);
	}
	ck_assert_int_eq(ckpt_save_wait(s[0][0], CKPT_CAPTURED, 60000), 0);
	memset(t[0].data, want(2, 0), (size_t)4 << 20);
	for (int r = 0; r < 2; r++)
		ck_assert_int_eq(ckpt_save(p[r], 2, NULL, &s[1][r]), 0);
	for (int r = 0; r < 2; r++)
		ck_assert_int_eq(ckpt_save_wait(s[1][r], CKPT_COMMITTED, 60000), 0);
	ck_assert_msg(ckpt_save_state(s[0][1]) < CKPT_DURABLE,
	              "step 1 was durable before step 2 committed: nothing tested");
	for (int r = 0; r < 2; r++) {
		int rc = ckpt_save_wait(s[0][r], CKPT_COMMITTED, 60000);

		snprintf(reason, sizeof(reason), "%s", ckpt_save_reason(s[0][r]));
		ck_assert_msg(rc == 0, "rank %d's step 1, saved by both ranks, ended %s: %s", r,
		              ckpt_state_name(ckpt_save_state(s[0][r])), reason);
	}
	latest_of(&a, "sb", latest, sizeof(latest));
	ck_assert_msg(strcmp(latest, "2") == 0, "LATEST says '%s', not 2", latest);
	for (int step = 1; step <= 2; step++)
		for (int r = 0; r < 2; r++) {
			memset(t[r].data, 0, (size_t)4 << 20);
			ck_assert_int_eq(ckpt_restore(p[r], step, NULL, NULL), 0);
			ck_assert_int_eq(((unsigned char *)t[r].data)[(4 << 20) - 1],
			                 want(step, r));
		}
	for (int step = 0; step < 2; step++)
		for (int r = 0; r < 2; r++)
			ckpt_save_release(s[step][r]);
	for (int r = 0; r < 2; r++)
		ckpt_plan_destroy(p[r]);
	ckpt_host_free(c, mem);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/* ---- the durability sequence, observed ---------------------------------- */

/* The agent's log: what each "seen" rule saw, in order ("fsync(<path>) = seen ..."). */
struct seen {
	char **line;
	int n;
};

static void seen_read(const struct agent_proc *a, struct seen *v)
{
	static const char tag[] = "fault injected: ";
	FILE *f = fopen(a->log, "r");
	char buf[8192];

	ck_assert_ptr_nonnull(f);
	*v = (struct seen){NULL, 0};
	while (fgets(buf, sizeof(buf), f)) {
		char *t = strstr(buf, tag);

		if (!t || !strstr(t, ") = seen"))
			continue;
		v->line = realloc(v->line, (size_t)(v->n + 1) * sizeof(char *));
		ck_assert_ptr_nonnull(v->line);
		t[strcspn(t, "\n")] = '\0';
		v->line[v->n++] = strdup(t + sizeof(tag) - 1);
	}
	fclose(f);
}

/* The first call at or after `from` that matches the glob (ROOT stands for the root), or -1. */
static int seen_at(const struct seen *v, const struct agent_proc *a, int from, const char *fmt, ...)
{
	char glob[2048], g[1024];
	va_list ap;

	if (from < 0)
		return -1;
	va_start(ap, fmt);
	vsnprintf(g, sizeof(g), fmt, ap);
	va_end(ap);
	snprintf(glob, sizeof(glob), "%s = seen*", g);
	for (char *r; (r = strstr(glob, "ROOT"));) {
		char rest[2048];

		snprintf(rest, sizeof(rest), "%s", r + 4);
		snprintf(r, sizeof(glob) - (size_t)(r - glob), "%s%s", a->root, rest);
	}
	for (int i = from; i < v->n; i++)
		if (fnmatch(glob, v->line[i], 0) == 0)
			return i;
	return -1;
}

/*
 * What makes a checkpoint durable, seen call by call (rules "seen": each
 * fsync, rename and link made as it is, and said in the log): for each
 * rank, the shard's fsync, then its step directory's and job directory's;
 * this node's part written, fsync'd, linked, its directory fsync'd; only
 * then the manifest (fsync'd before it is linked, its directory after);
 * only then LATEST (fsync'd, renamed, the job directory fsync'd). A missing
 * fsync or one out of order fails here, named.
 */
static const char seen_plan[] = "CKPT_FAULTS=fsync:seen:count=inf;io_fsync:seen:count=inf;"
                                "renameat:seen:count=inf;linkat:seen:count=inf;"
                                "rename_noreplace:seen:count=inf";

START_TEST(durability_sequence_observed)
{
	const char *step = "ROOT/ds/step-000000000001";
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p[2];
	struct ckpt_save *s[2];
	struct h_model m[2];
	struct seen v;
	int shards = -1, part, part_dir, man, man_dir, latest, latest_dir, k;

	h_agent_start_env(&a, "--staging-mb 32 --chunk-mb 1", seen_plan);
	c = h_connect(&a);
	for (int r = 0; r < 2; r++) {
		h_model_make(&m[r], c, 3, 1 << 18);
		for (size_t i = 0; i < m[r].n; i++)
			m[r].name[i][0] = r ? 'b' : 'a'; /* two ranks, names of their own */
		h_model_fill(&m[r], 5 + r);
		ck_assert_int_eq(ckpt_plan_create(c, "ds", r, 2, m[r].t, m[r].n, &p[r]), 0);
		ck_assert_int_eq(ckpt_save(p[r], 1, NULL, &s[r]), 0);
	}
	for (int r = 0; r < 2; r++) {
		ck_assert_int_eq(ckpt_save_wait(s[r], CKPT_COMMITTED, 60000), 0);
		ckpt_save_release(s[r]);
	}
	usleep(200 * 1000); /* LATEST's directory fsync comes just after COMMITTED is told */
	seen_read(&a, &v);
	for (int r = 0; r < 2; r++) {
		int f = seen_at(&v, &a, 0, "io_fsync(%s/rank-%05d.*.safetensors)", step, r);
		int d = seen_at(&v, &a, f + 1, "io_fsync(%s)", step);
		int j = seen_at(&v, &a, d + 1, "io_fsync(ROOT/ds)");

		ck_assert_msg(f >= 0, "rank %d: no fsync of its shard (%s)", r, a.log);
		ck_assert_msg(d >= 0 && j >= 0,
		              "rank %d: no fsync of the step or job directory after its shard's "
		              "(%s)",
		              r, a.log);
		shards = j > shards ? j : shards;
	}
	k = 0;
	for (int i = seen_at(&v, &a, 0, "io_fsync(%s)", step); i >= 0;
	     i = seen_at(&v, &a, i + 1, "io_fsync(%s)", step))
		k++;
	ck_assert_msg(k >= 2, "the step directory fsync'd %d times for 2 shards", k);
	part = seen_at(&v, &a, seen_at(&v, &a, 0, "fsync(%s/parts/*.tmp)", step) + 1,
	               "linkat(*, %s/parts/*.json)", step);
	part_dir = seen_at(&v, &a, part + 1, "fsync(%s/parts)", step);
	ck_assert_msg(part >= 0 && part_dir >= 0,
	              "the part: not fsync'd, linked, its directory fsync'd (%s)", a.log);
	man = seen_at(&v, &a, seen_at(&v, &a, 0, "fsync(%s/*manifest.json.tmp)", step) + 1,
	              "linkat(*, %s/manifest.json)", step);
	man_dir = seen_at(&v, &a, man + 1, "fsync(%s)", step);
	ck_assert_msg(man >= 0 && man_dir >= 0,
	              "the manifest: not fsync'd, linked, its directory fsync'd (%s)", a.log);
	ck_assert_msg(man > shards && man > part_dir,
	              "the manifest was linked (call %d) before every shard (%d) and the part "
	              "(%d) were durable",
	              man, shards, part_dir);
	latest = seen_at(&v, &a, seen_at(&v, &a, man_dir + 1, "fsync(ROOT/ds/*LATEST.tmp)") + 1,
	                 "renameat(*, ROOT/ds/LATEST)");
	latest_dir = seen_at(&v, &a, latest + 1, "fsync(ROOT/ds)");
	ck_assert_msg(latest >= 0 && latest_dir >= 0,
	              "LATEST: not fsync'd, renamed after the manifest was durable, its directory "
	              "fsync'd (%s)",
	              a.log);
	ck_assert_msg(seen_at(&v, &a, 0, "renameat(*, ROOT/ds/LATEST)") == latest,
	              "LATEST was renamed before the manifest was durable");
	for (int i = 0; i < v.n; i++)
		free(v.line[i]);
	free(v.line);
	for (int r = 0; r < 2; r++) {
		ckpt_plan_destroy(p[r]);
		h_model_free(&m[r]);
	}
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/* ---- the plan itself ---------------------------------------------------- */

/* ckptd with CKPT_FAULTS=plan: its exit code and what it said (out, len bytes). */
static int start_with(const char *plan, char *out, size_t len)
{
	char dir[] = "/tmp/ckfault.XXXXXX", cmd[1024];
	size_t n;
	FILE *f;
	int st;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	setenv("CKPT_FAULTS", plan, 1);
	snprintf(cmd, sizeof(cmd),
	         "timeout 30 %s --config /dev/null --root %s/root "
	         "--listen unix:%s/s.sock --staging-mb 16 2>&1; rc=$?; rm -rf %s; exit $rc",
	         CKPTD_BIN, dir, dir, dir);
	f = popen(cmd, "r");
	unsetenv("CKPT_FAULTS");
	ck_assert_ptr_nonnull(f);
	n = fread(out, 1, len - 1, f);
	out[n] = '\0';
	st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(bad_plans_refused)
{
	static const struct {
		const char *plan, *says;
	} bad[] = {
	    {"fsync:EIOX", "unknown result 'EIOX'"},
	    {"fsync", "needs a result"},
	    {"fsync:short", "can be short"},
	    {"frobnicate:EIO", "unknown call 'frobnicate'"},
	    {"fsync:EIO;;pwrite:EIO", "rule 2 is empty"},
	    {"fsync:EIO:after=x", "after=x"},
	    {"fsync:EIO:count=0", "count=0"},
	    {"fsync:EIO:path", "is not key=value"},
	    {"fsync:EIO:color=red", "unknown key"},
	    {"pwrite:short=lots", "short=BYTES"},
	    {"capture:EIO", "can only be slow"},
	    {"fsync:slow=5", "can be slow"},
	};
	char out[8192];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = start_with(bad[i].plan, out, sizeof(out));

		ck_assert_msg(rc != 0 && strstr(out, "CKPT_FAULTS") && strstr(out, bad[i].says),
		              "CKPT_FAULTS=%s: exit %d: %s", bad[i].plan, rc, out);
	}
}
END_TEST

int test_before(int argc, char **argv)
{
	(void)argc;
	(void)argv;
#ifndef CKPT_FAULT_INJECTION
	printf("skipped: ckptd is built without fault injection (-DCKPT_FAULT_INJECTION=ON)\n");
	return TEST_SKIP;
#endif
	return TEST_RUN;
}

Suite *test_suite(void)
{
	Suite *s;
	TCase *tc;

	s = suite_create("faults");
	tc = tcase_create("agent");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, save_faults);
	tcase_add_test(tc, commit_faults);
	tcase_add_test(tc, removal_faults);
	tcase_add_test(tc, read_faults);
	tcase_add_test(tc, captured_after_last_chunk);
	tcase_add_test(tc, no_commit_while_a_rank_writes);
	tcase_add_test(tc, older_step_commits_behind_newer);
	tcase_add_test(tc, durability_sequence_observed);
	tcase_add_test(tc, bad_plans_refused);
	suite_add_tcase(s, tc);
	return s;
}
