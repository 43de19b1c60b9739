/*
 * The agent's life on a node, with real agents: one agent per socket and
 * one per (root, node name), a second refused with the first's pid and
 * without touching the first's socket, lock or files.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <check.h>

#include "harness.h"

#ifndef CKPTD_BIN
#error "CKPTD_BIN must name the agent binary"
#endif

static struct ckpt_client *connect_to(const struct agent_proc *a)
{
	struct ckpt_client *c;
	int rc = ckpt_connect(a->endpoint, &c);

	ck_assert_msg(rc == 0, "ckpt_connect %s: %s", a->endpoint, ckpt_strerror(rc));
	return c;
}

/* A new client (a new connection to the socket) saves step of job: it commits. */
static void save_commits(const struct agent_proc *a, const char *job, int64_t step)
{
	struct ckpt_client *c = connect_to(a);
	struct ckpt_plan *p;
	struct ckpt_save *s;
	struct h_model m;

	h_model_make(&m, c, 3, 30011);
	h_model_fill(&m, (uint64_t)step);
	ck_assert_int_eq(ckpt_plan_create(c, job, 0, 1, m.t, m.n, &p), 0);
	ck_assert_int_eq(ckpt_save(p, step, NULL, &s), 0);
	ck_assert_msg(ckpt_save_wait(s, CKPT_COMMITTED, 60000) == 0, "step %lld: %s",
	              (long long)step, ckpt_save_reason(s));
	ckpt_save_release(s);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
}

/*
 * Runs a second ckptd (at most 60 s: it must stop by itself); its exit
 * status, its output into out.
 */
static int run_second(const char *root, const char *listen, const char *node, char *out,
                      size_t len)
{
	char cmd[2048];
	size_t n = 0;
	FILE *f;
	int status;

	snprintf(cmd, sizeof(cmd),
	         "timeout 60 %s --config /dev/null --root %s --listen %s --node %s "
	         "--staging-mb 16 --chunk-mb 1 2>&1",
	         CKPTD_BIN, root, listen, node);
	f = popen(cmd, "r");
	ck_assert_msg(f != NULL, "popen: %s", strerror(errno));
	while (n + 1 < len && !feof(f)) {
		size_t k = fread(out + n, 1, len - 1 - n, f);

		if (k == 0)
			break;
		n += k;
	}
	out[n] = '\0';
	status = pclose(f);
	return h_exit_code(status);
}

static void read_file(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	size_t n;

	ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
	n = fread(buf, 1, len - 1, f);
	buf[n] = '\0';
	fclose(f);
}

/* A second agent on a served socket (another root): refused, and the first serves on. */
START_TEST(second_agent_same_socket)
{
	struct agent_proc a;
	char out[8192], want[512], sock[300], lock[320], root2[320], pid[32];
	struct stat before, after;
	int rc;

	h_agent_start(&a, "--staging-mb 16 --chunk-mb 1 --node n0");
	save_commits(&a, "sock", 1);
	snprintf(sock, sizeof(sock), "%s", a.endpoint + 5);
	snprintf(lock, sizeof(lock), "%s.lock", sock);
	snprintf(root2, sizeof(root2), "%s/root2", a.dir);
	ck_assert_int_eq(lstat(sock, &before), 0);

	rc = run_second(root2, a.endpoint, "n1", out, sizeof(out));
	ck_assert_msg(rc != 0 && rc != 124, "the second agent exited with %d: %s", rc, out);
	snprintf(want, sizeof(want), "socket %s is served by ckptd pid %d (lock %s)", sock,
	         (int)a.pid, lock);
	ck_assert_msg(strstr(out, want), "expected '%s' in: %s", want, out);
	/* The first's socket is where it was, the same file; its lock still names it. */
	ck_assert_msg(lstat(sock, &after) == 0, "the live agent's socket %s is gone: %s", sock,
	              strerror(errno));
	ck_assert(S_ISSOCK(after.st_mode) && after.st_ino == before.st_ino);
	read_file(lock, out, sizeof(out));
	snprintf(pid, sizeof(pid), "%d\n", (int)a.pid);
	ck_assert_str_eq(out, pid);
	/* Refused before it did anything: no root of its own was made. */
	ck_assert_msg(!h_exists(root2), "the refused agent made its root %s", root2);
	/* The first still serves new clients: a save commits. */
	save_commits(&a, "sock", 2);
	h_agent_cleanup(&a);
}
END_TEST

/* A second agent as the same node on the same root (another socket): refused the same way. */
START_TEST(second_agent_same_node)
{
	struct agent_proc a;
	char out[8192], want[512], listen[320], lock[400], pid[32];
	int rc;

	h_agent_start(&a, "--staging-mb 16 --chunk-mb 1 --node n0");
	save_commits(&a, "node", 1);
	snprintf(listen, sizeof(listen), "unix:%s/other.sock", a.dir);
	snprintf(lock, sizeof(lock), "%s/.node.n0.lock", a.root);

	rc = run_second(a.root, listen, "n0", out, sizeof(out));
	ck_assert_msg(rc != 0 && rc != 124, "the second agent exited with %d: %s", rc, out);
	snprintf(want, sizeof(want), "node n0 on %s is served by ckptd pid %d (lock %s)", a.root,
	         (int)a.pid, lock);
	ck_assert_msg(strstr(out, want), "expected '%s' in: %s", want, out);
	read_file(lock, out, sizeof(out));
	snprintf(pid, sizeof(pid), "%d\n", (int)a.pid);
	ck_assert_str_eq(out, pid);
	ck_assert_msg(!h_exists(listen + 5), "the refused agent left a socket %s", listen + 5);
	save_commits(&a, "node", 2);
	h_agent_cleanup(&a);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("lifecycle");
	TCase *tc = tcase_create("agent");

	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, second_agent_same_socket);
	tcase_add_test(tc, second_agent_same_node);
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
