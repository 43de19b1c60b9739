/*
 * The agent's life on a node, with real agents: one agent per socket and
 * one per (root, node name), a second refused with the first's pid and
 * without touching the first's socket, lock or files; and a storage root
 * removed while the agent runs, then made again: status and /metrics say
 * so, the list follows the root, saves fail naming the root and then
 * resume without a restart.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

#ifndef CKPTD_BIN
#error "CKPTD_BIN must name the agent binary"
#endif

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

/* A new client (a new connection to the socket) saves step of job: it commits. */
static void save_commits(const struct agent_proc *a, const char *job, int64_t step)
{
	struct ckpt_client *c = h_connect(a);
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
static int run_second(const char *root, const char *listen, const char *node, char *out, size_t len)
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

/* ---- a root that disappears and comes back ---------------------------- */

/* `ckptctl --json status`'s root_state.state ("" if it has none). */
static void root_state(const struct agent_proc *a, char *state, size_t len, char *error,
                       size_t elen)
{
	static char out[1 << 16];
	json_t *j, *r;

	ck_assert_int_eq(h_ctl(a, out, sizeof(out), "--json status"), 0);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j != NULL, "not JSON: %s", out);
	r = json_object_get(j, "root_state");
	snprintf(state, len, "%s", r ? json_string_value(json_object_get(r, "state")) : "");
	snprintf(error, elen, "%s", r ? json_string_value(json_object_get(r, "error")) : "");
	json_decref(j);
}

/* Polls status until the root's state is `want` (the agent checks every few seconds). */
static void wait_root_state(const struct agent_proc *a, const char *want, char *error, size_t elen)
{
	char state[32] = "";

	for (int i = 0; i < 300; i++) {
		root_state(a, state, sizeof(state), error, elen);
		if (strcmp(state, want) == 0)
			return;
		sleep_ms(100);
	}
	ck_abort_msg("ckptctl status: root state '%s' after 30 s, not '%s'", state, want);
}

/* The steps `ckptctl --json list job` shows, committed or not. */
static size_t listed(const struct agent_proc *a, const char *job, long long *steps, size_t max)
{
	static char out[1 << 16];
	size_t n = 0, i;
	json_t *j, *v;

	ck_assert_int_eq(h_ctl(a, out, sizeof(out), "--json list %s", job), 0);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j != NULL, "not JSON: %s", out);
	json_array_foreach(json_object_get(j, "checkpoints"), i, v)
	{
		if (n < max)
			steps[n++] = (long long)json_integer_value(json_object_get(v, "step"));
	}
	json_decref(j);
	return n;
}

/* Whether GET /metrics has the line `line`. */
static bool metrics_has(unsigned port, const char *line)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
	                         .sin_port = htons((uint16_t)port),
	                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	static char buf[1 << 18];
	char req[128];
	size_t len = 0;
	ssize_t n;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	ck_assert_msg(fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0,
	              "connect to 127.0.0.1:%u: %s", port, strerror(errno));
	snprintf(req, sizeof(req), "GET /metrics HTTP/1.0\r\n\r\n");
	ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
	while ((n = read(fd, buf + len, sizeof(buf) - 1 - len)) > 0)
		len += (size_t)n;
	close(fd);
	buf[len] = '\0';
	return strstr(buf, line) != NULL;
}

/* A save of step that fails; its reason into why. */
static void save_fails(struct ckpt_plan *p, int64_t step, char *why, size_t len)
{
	struct ckpt_save *s;

	ck_assert_int_eq(ckpt_save(p, step, NULL, &s), 0);
	ck_assert_msg(ckpt_save_wait(s, CKPT_COMMITTED, 60000) != 0, "step %lld committed",
	              (long long)step);
	ck_assert_int_eq(ckpt_save_state(s), CKPT_FAILED);
	snprintf(why, len, "%s", ckpt_save_reason(s));
	ckpt_save_release(s);
}

START_TEST(root_removed_and_made_again)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	struct h_model m;
	char args[128], err[1024], why[1024], path[512], cmd[700];
	long long steps[8];
	unsigned port = h_free_port();
	size_t n;

	snprintf(args, sizeof(args),
	         "--staging-mb 16 --chunk-mb 1 --node n0 --metrics-listen 127.0.0.1:%u", port);
	h_agent_start(&a, args);
	c = h_connect(&a);
	h_model_make(&m, c, 3, 30011);
	ck_assert_int_eq(ckpt_plan_create(c, "gone", 0, 1, m.t, m.n, &p), 0);
	for (int64_t step = 1; step <= 2; step++) {
		ck_assert_int_eq(ckpt_save(p, step, NULL, &s), 0);
		ck_assert_msg(ckpt_save_wait(s, CKPT_COMMITTED, 60000) == 0, "%s",
		              ckpt_save_reason(s));
		ckpt_save_release(s);
	}
	ck_assert_uint_eq(listed(&a, "gone", steps, 8), 2);
	ck_assert(metrics_has(port, "\nckptd_root_available 1\n"));

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", a.root);
	ck_assert_int_eq(system(cmd), 0);
	wait_root_state(&a, "missing", err, sizeof(err));
	ck_assert_msg(strstr(err, a.root), "status does not name the root: %s", err);
	n = listed(&a, "gone", steps, 8);
	ck_assert_msg(n == 0, "list shows %zu steps of a root that is gone (first: %lld)", n,
	              steps[0]);
	ck_assert(metrics_has(port, "\nckptd_root_available 0\n"));
	save_fails(p, 3, why, sizeof(why));
	ck_assert_msg(strstr(why, a.root) && strstr(why, "missing"),
	              "the failed save's reason does not say the root is missing: %s", why);

	/* Back: the agent finds it by itself, and saves commit again; no restart. */
	ck_assert_int_eq(mkdir(a.root, 0755), 0);
	wait_root_state(&a, "ok", err, sizeof(err));
	ck_assert_int_eq(ckpt_save(p, 4, NULL, &s), 0);
	ck_assert_msg(ckpt_save_wait(s, CKPT_COMMITTED, 60000) == 0,
	              "step 4 after the root came "
	              "back: %s",
	              ckpt_save_reason(s));
	ckpt_save_release(s);
	n = listed(&a, "gone", steps, 8);
	ck_assert_msg(n == 1 && steps[0] == 4, "list after the root came back: %zu steps", n);
	ck_assert(metrics_has(port, "\nckptd_root_available 1\n"));
	/* This node's plans file, lost with the root, is published again. */
	h_path(&a, path, sizeof(path), "gone/plans/n0.json");
	for (int i = 0; i < 300 && !h_exists(path); i++)
		sleep_ms(100);
	ck_assert_msg(h_exists(path), "%s was not published again", path);
	/* and the job's owner, lost with it, is recorded again */
	h_path(&a, path, sizeof(path), "gone/OWNER");
	for (int i = 0; i < 300 && !h_exists(path); i++)
		sleep_ms(100);
	ck_assert_msg(h_exists(path), "%s was not recorded again", path);

	/* Removed and made again between two checks: the next save finds the new one. */
	snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mkdir '%s'", a.root, a.root);
	ck_assert_int_eq(system(cmd), 0);
	ck_assert_int_eq(ckpt_save(p, 5, NULL, &s), 0);
	ck_assert_msg(ckpt_save_wait(s, CKPT_COMMITTED, 60000) == 0,
	              "step 5 in a root made "
	              "anew: %s",
	              ckpt_save_reason(s));
	ckpt_save_release(s);
	n = listed(&a, "gone", steps, 8);
	ck_assert_msg(n == 1 && steps[0] == 5, "list after the root was replaced: %zu steps", n);
	ck_assert_int_eq(h_ctl(&a, why, sizeof(why), "verify gone 5"), 0);

	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("lifecycle");
	TCase *tc = tcase_create("agent");

	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, second_agent_same_socket);
	tcase_add_test(tc, second_agent_same_node);
	tcase_add_test(tc, root_removed_and_made_again);
	suite_add_tcase(s, tc);
	return s;
}
