/*
 * ckptctl as an operator meets it: help for every command and --version;
 * a usage error names what is missing or extra and the command's usage;
 * --json errors are JSON (error, errno, code) on stdout; "latest" as a step;
 * delete refuses the step LATEST names without --force; an agent that is
 * not running is said so, with what to do. And ckptd --check-config on a
 * socket whose directories are not there (the agent makes them all).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>
#include <jansson.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

static struct agent_proc a;

static void setup(void)
{
	h_agent_start(&a, "--staging-mb 32 --chunk-mb 1");
}

static void teardown(void)
{
	h_agent_cleanup(&a);
}

/* ckptctl with no endpoint of ours (help and version need no agent). */
static int ctl_bare(char *out, size_t len, const char *args)
{
	char cmd[1024];

	snprintf(cmd, sizeof(cmd), "%s %s 2>&1", CKPTCTL_BIN, args);
	return h_run(out, len, cmd);
}

/* Steps from..to of job (one rank), committed. */
static void commit_steps(const char *job, int64_t from, int64_t to)
{
	struct ckpt_client *c = h_connect(&a);
	struct ckpt_plan *p;
	struct h_model m;

	h_model_make(&m, c, 2, 1 << 12);
	ck_assert_int_eq(ckpt_plan_create(c, job, 0, 1, m.t, m.n, &p), 0);
	for (int64_t s = from; s <= to; s++) {
		struct ckpt_save *sv;

		h_model_fill(&m, (uint64_t)s);
		ck_assert_int_eq(ckpt_save(p, s, NULL, &sv), 0);
		ck_assert_int_eq(ckpt_save_wait(sv, CKPT_COMMITTED, 60000), 0);
		ckpt_save_release(sv);
	}
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
}

START_TEST(help_and_version)
{
	static const char *const cmds[] = {"status", "list", "show",  "verify", "delete",
	                                   "watch",  "pin",  "unpin", "gc",     "commit"};
	char all[8192], out[8192], args[64];

	ck_assert_int_eq(ctl_bare(all, sizeof(all), "--help"), 0);
	for (size_t i = 0; i < sizeof(cmds) / sizeof(*cmds); i++) {
		snprintf(args, sizeof(args), "\n  %s", cmds[i]);
		ck_assert_msg(strstr(all, args), "--help lacks %s:\n%s", cmds[i], all);
		/* each command's own help, three ways, with no agent */
		snprintf(args, sizeof(args), "%s --help", cmds[i]);
		ck_assert_int_eq(ctl_bare(out, sizeof(out), args), 0);
		snprintf(args, sizeof(args), "usage: ckptctl [--endpoint E] [--json] %s", cmds[i]);
		ck_assert_msg(strstr(out, args), "%s --help:\n%s", cmds[i], out);
		snprintf(args, sizeof(args), "help %s", cmds[i]);
		ck_assert_int_eq(ctl_bare(out, sizeof(out), args), 0);
		snprintf(args, sizeof(args), "%s -h", cmds[i]);
		ck_assert_int_eq(ctl_bare(out, sizeof(out), args), 0);
	}
	ck_assert_int_eq(ctl_bare(out, sizeof(out), "-h"), 0);
	ck_assert_int_eq(ctl_bare(out, sizeof(out), "--version"), 0);
	ck_assert_msg(strncmp(out, "ckptctl 0.", 10) == 0, "--version: %s", out);
	ck_assert_int_eq(ctl_bare(out, sizeof(out), "help frobnicate"), 2);
	ck_assert_msg(strstr(out, "no command 'frobnicate'"), "%s", out);
	ck_assert_int_eq(ctl_bare(out, sizeof(out), "--frobnicate status"), 2);
	ck_assert_msg(strstr(out, "unknown option '--frobnicate'"), "%s", out);
}
END_TEST

START_TEST(usage_errors_say_what)
{
	char out[8192];

	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "show"), 2);
	ck_assert_msg(strstr(out, "show needs JOB and STEP") &&
	                  strstr(out, "usage: ckptctl show [--full] [--tier T] JOB STEP"),
	              "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "delete j"), 2);
	ck_assert_msg(strstr(out, "delete needs STEP"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "gc"), 2);
	ck_assert_msg(strstr(out, "gc needs JOB"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "pin j 1 2"), 2);
	ck_assert_msg(strstr(out, "'2' is one too many"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "status now"), 2);
	ck_assert_msg(strstr(out, "'now' is one too many"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "commit j 1"), 2);
	ck_assert_msg(strstr(out, "needs --finish"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify j soon"), 2);
	ck_assert_msg(strstr(out, "'soon' is not a step") && strstr(out, "or latest"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "show --tier"), 2);
	ck_assert_msg(strstr(out, "--tier needs a tier"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "frobnicate"), 2);
	ck_assert_msg(strstr(out, "unknown command 'frobnicate'"), "%s", out);
}
END_TEST

/* What --json says of an error: an object on stdout naming it. */
static void json_error(const char *args, int status, const char *code, const char *words)
{
	char out[8192], cmd[1024];
	json_t *j;

	/* stdout only: the error is not on stderr for a program to miss */
	snprintf(cmd, sizeof(cmd), "%s --endpoint %s %s 2>/dev/null", CKPTCTL_BIN, a.endpoint,
	         args);
	ck_assert_int_eq(h_run(out, sizeof(out), cmd), status);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j, "%s: not JSON: %s", args, out);
	ck_assert_msg(json_is_string(json_object_get(j, "error")) &&
	                  strstr(json_string_value(json_object_get(j, "error")), words),
	              "%s: %s", args, out);
	ck_assert_str_eq(json_string_value(json_object_get(j, "code")), code);
	ck_assert_int_eq(json_integer_value(json_object_get(j, "status")), status);
	json_decref(j);
}

START_TEST(json_errors)
{
	json_error("--json show nojob 1", 1, "ENOENT", "nojob");
	json_error("show nojob 1 --json", 1, "ENOENT", "nojob");
	json_error("--json show nojob", 2, "EINVAL", "needs STEP");
	json_error("--json list 'a/b'", 2, "EINVAL", "'/' at byte 1");
	json_error("--json verify nojob latest", 1, "ENOENT", "has no LATEST");
	json_error("--json frobnicate", 2, "EINVAL", "unknown command");
}
END_TEST

START_TEST(latest_and_force)
{
	char out[8192], path[600];
	FILE *f;
	long latest = 0;

	commit_steps("lf", 1, 3);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "--json show lf latest"), 0);
	ck_assert_msg(strstr(out, "\"step\": 3"), "show latest: %s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify lf latest"), 0);
	ck_assert_msg(strstr(out, "lf step 3: OK"), "verify latest: %s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "pin lf latest"), 0);
	ck_assert_msg(strstr(out, "pinned lf step 3"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "unpin lf latest"), 0);
	/* the step LATEST names: not deleted by a slip */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "delete lf 3"), 2);
	ck_assert_msg(strstr(out, "LATEST") && strstr(out, "--force"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "delete lf latest"), 2);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "--json list lf"), 0);
	ck_assert_msg(strstr(out, "\"step\": 3"), "refused, yet deleted: %s", out);
	/* another step goes without --force; LATEST's with it, and LATEST moves back */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "delete lf 1"), 0);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "delete --force lf 3"), 0);
	h_path(&a, path, sizeof(path), "lf/LATEST");
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fscanf(f, "%ld", &latest), 1);
	fclose(f);
	ck_assert_int_eq(latest, 2);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "--json show lf latest"), 0);
	ck_assert_msg(strstr(out, "\"step\": 2"), "show latest after: %s", out);
}
END_TEST

START_TEST(agent_not_running)
{
	char out[8192], cmd[1024];

	snprintf(cmd, sizeof(cmd), "%s --endpoint unix:%s/nobody.sock status 2>&1", CKPTCTL_BIN,
	         a.dir);
	ck_assert_int_eq(h_run(out, sizeof(out), cmd), 1);
	ck_assert_msg(strstr(out, "no ckptd answers at") && strstr(out, "is it running?") &&
	                  strstr(out, "systemctl status ckptd"),
	              "%s", out);
}
END_TEST

/*
 * A socket three directories down that are not there: --check-config says
 * the agent makes them, and a start does, then serves there.
 */
START_TEST(socket_directory_tree_made)
{
	char out[16384], cmd[4096], sock[512];

	snprintf(sock, sizeof(sock), "%s/run/a/b/ckptd.sock", a.dir);
	snprintf(cmd, sizeof(cmd),
	         "%s --config /dev/null --root %s/r2 --listen unix:%s --check-config 2>&1",
	         CKPTD_BIN, a.dir, sock);
	ck_assert_int_eq(h_run(out, sizeof(out), cmd), 0);
	ck_assert_msg(strstr(out, "; check: socket directory ") &&
	                  strstr(out, "/run/a/b: not there; the agent makes it"),
	              "%s", out);
	ck_assert_msg(strstr(out, "/r2: not there; the agent makes it"), "%s", out);
	snprintf(
	    cmd, sizeof(cmd),
	    "%s --config /dev/null --root %s/r2 --listen unix:%s --staging-mb 16 --no-lock "
	    ">%s/tree.log 2>&1 & pid=$!; ok=1; for i in $(seq 100); do "
	    "if %s --endpoint unix:%s status >/dev/null 2>&1; then ok=0; break; fi; sleep 0.1; "
	    "done; kill $pid; wait $pid; exit $ok",
	    CKPTD_BIN, a.dir, sock, a.dir, CKPTCTL_BIN, sock);
	ck_assert_msg(h_run(out, sizeof(out), cmd) == 0, "no agent served at %s (see %s/tree.log)",
	              sock, a.dir);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("ctl");
	TCase *tc = tcase_create("agent");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, help_and_version);
	tcase_add_test(tc, usage_errors_say_what);
	tcase_add_test(tc, json_errors);
	tcase_add_test(tc, latest_and_force);
	tcase_add_test(tc, agent_not_running);
	tcase_add_test(tc, socket_directory_tree_made);
	suite_add_tcase(s, tc);
	return s;
}
