/*
 * A second user on the node, against a real agent run by root: refused on
 * every operation on another user's job (plans, list, show, verify, delete,
 * pin, unpin, gc, commit), the job not even listed to it; a member of the
 * admin group lists and deletes it; ownership survives a restart; another
 * user's watch shows its own saves, never the owner's; the admin group
 * reads, verifies, pins and deletes another user's job but never plans or
 * commits it, and the socket's group is not the admin group; a user
 * outside the socket's group is told which group to join; a root the
 * agent's user cannot write is refused at --check-config and at start. Needs
 * root and useradd (test users ckpttest-*): skipped (77) otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

/* ---- a second user ------------------------------------------------------ */

#define U_OWNER "ckpttest-own"
#define U_OTHER "ckpttest-oth"
#define U_OPS "ckpttest-ops"
#define G_ADMIN "ckpttest-adm"
#define G_SOCK "ckpttest-sck" /* every test user is in it; the agent's socket group */

/* Whether `user` is a listed member of `group`. */
static bool member_of(const char *user, const char *group)
{
	struct group *g = getgrnam(group);

	for (char **m = g ? g->gr_mem : NULL; m && *m; m++)
		if (strcmp(*m, user) == 0)
			return true;
	return false;
}

static bool ensure_users(void)
{
	static const char *const users[] = {U_OWNER, U_OTHER, U_OPS};

	if (geteuid() != 0 || system("command -v useradd >/dev/null 2>&1") != 0)
		return false;
	if (!getgrnam(G_ADMIN) && system("groupadd -f " G_ADMIN) != 0)
		return false;
	if (!getgrnam(G_SOCK) && system("groupadd -f " G_SOCK) != 0)
		return false;
	for (size_t i = 0; i < 3; i++) {
		char cmd[256];

		if (getpwnam(users[i]))
			continue;
		snprintf(cmd, sizeof(cmd), "useradd -M -N -s /usr/sbin/nologin %s%s", users[i],
		         strcmp(users[i], U_OPS) == 0 ? " -G " G_ADMIN : "");
		if (system(cmd) != 0)
			return false;
	}
	for (size_t i = 0; i < 3; i++) { /* users made before the socket's group was */
		char cmd[256];

		if (member_of(users[i], G_SOCK))
			continue;
		snprintf(cmd, sizeof(cmd), "usermod -aG " G_SOCK " %s", users[i]);
		if (system(cmd) != 0)
			return false;
	}
	return getpwnam(U_OWNER) && getpwnam(U_OTHER) && getpwnam(U_OPS);
}

/* In a child: becomes `user` (with its groups). */
static void become(const char *user)
{
	struct passwd *pw = getpwnam(user);

	ck_assert_ptr_nonnull(pw);
	ck_assert_int_eq(initgroups(user, pw->pw_gid), 0);
	ck_assert_int_eq(setgid(pw->pw_gid), 0);
	ck_assert_int_eq(setuid(pw->pw_uid), 0);
}

/* ckptctl as `user`; its exit code, its output into out. */
static int ctl_as(const struct agent_proc *a, const char *user, char *out, size_t len,
                  const char *args)
{
	char cmd[1024];
	FILE *f;
	size_t n;
	int st;

	snprintf(cmd, sizeof(cmd), "runuser -u %s -- %s --endpoint %s %s 2>&1", user, CKPTCTL_BIN,
	         a->endpoint, args);
	f = popen(cmd, "r");
	ck_assert_ptr_nonnull(f);
	n = fread(out, 1, len - 1, f);
	out[n] = '\0';
	st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* A trainer as `user`: plans job and saves step; exits 0, or 10 + what failed. */
static int trainer_job_as(const struct agent_proc *a, const char *user, const char *job,
                          int64_t step, bool expect_ok)
{
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct ckpt_client *c;
		struct ckpt_plan *p;
		static int64_t shape[1] = {4096};
		struct ckpt_tensor t = {.name = "w", .dtype = CKPT_U8, .ndim = 1, .shape = shape};
		void *mem;
		int rc;

		become(user);
		if (ckpt_connect(a->endpoint, &c))
			_exit(11);
		if (ckpt_host_alloc(c, 4096, &mem))
			_exit(12);
		t.data = mem;
		rc = ckpt_plan_create(c, job, 0, 1, &t, 1, &p);
		if (!expect_ok) {
			fprintf(stderr, "plan as %s: %s\n", user, ckpt_last_error(c));
			_exit(rc == -EACCES ? 0 : 13);
		}
		if (rc)
			_exit(14);
		{
			struct ckpt_save *s;

			if (ckpt_save(p, step, NULL, &s) ||
			    ckpt_save_wait(s, CKPT_COMMITTED, 60000))
				_exit(15);
			ckpt_save_release(s);
		}
		ckpt_disconnect(c);
		_exit(0);
	}
	return h_reap(pid);
}

/* The same with job "priv". */
static int trainer_as(const struct agent_proc *a, const char *user, int64_t step, bool expect_ok)
{
	return trainer_job_as(a, user, "priv", step, expect_ok);
}

/* `ckptctl watch` (every job it may read) as `user`, its output into path. */
static pid_t watch_as(const struct agent_proc *a, const char *user, const char *path)
{
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0)
			_exit(126);
		become(user);
		execl(CKPTCTL_BIN, "ckptctl", "--endpoint", a->endpoint, "watch", (char *)NULL);
		_exit(127);
	}
	return pid;
}

static bool file_has(const char *path, const char *needle)
{
	char buf[1 << 16];
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		return false;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return strstr(buf, needle) != NULL;
}

/*
 * Another user's watch of every job: its own saves, never the owner's.
 * Its saves of job "mine" go on until one is seen (the watch is attached);
 * the owner's step 5 then commits before its next one, whose line comes
 * after any line of the owner's the watch was sent.
 */
static void watch_shows_only_own(const struct agent_proc *a)
{
	char path[600], line[64];
	int64_t k = 1;
	pid_t w;

	snprintf(path, sizeof(path), "%s/watch.out", a->dir);
	w = watch_as(a, U_OTHER, path);
	for (; k <= 20 && !file_has(path, "job=mine"); k++)
		ck_assert_int_eq(trainer_job_as(a, U_OTHER, "mine", k, true), 0);
	ck_assert_msg(file_has(path, "job=mine"), "the watch saw nothing in %lld saves",
	              (long long)k);
	ck_assert_int_eq(trainer_as(a, U_OWNER, 5, true), 0);
	ck_assert_int_eq(trainer_job_as(a, U_OTHER, "mine", k, true), 0);
	snprintf(line, sizeof(line), "job=mine step=%lld rank=0/1 state=COMMITTED", (long long)k);
	for (int i = 0; i < 600 && !file_has(path, line); i++)
		usleep(50000);
	ck_assert_msg(file_has(path, line), "the watch did not see step %lld", (long long)k);
	ck_assert_int_eq(kill(w, SIGINT), 0);
	ck_assert_int_eq(h_reap(w), 0);
	ck_assert_msg(!file_has(path, "job=priv"), "another user's watch shows job priv (%s)",
	              path);
}

START_TEST(other_users_refused)
{
	struct agent_proc a;
	char out[8192];
	const char *denied[] = {
	    "list priv",  "show priv 1",  "verify priv 1", "delete priv 1",
	    "pin priv 1", "unpin priv 1", "gc priv",       "commit --finish priv 1"};

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --socket-mode 0666 --admin-group " G_ADMIN);
	ck_assert_int_eq(chmod(a.dir, 0755), 0); /* under /tmp: everyone reaches the socket */
	ck_assert_msg(ctl_as(&a, U_OTHER, out, sizeof(out), "status") == 0,
	              "another user cannot reach the socket: %s", out);
	ck_assert_int_eq(trainer_as(&a, U_OWNER, 1, true), 0);
	/* another user: refused on each operation, and the job not listed to it */
	ck_assert_int_eq(trainer_as(&a, U_OTHER, 2, false), 0);
	for (size_t i = 0; i < sizeof(denied) / sizeof(*denied); i++) {
		ck_assert_int_eq(ctl_as(&a, U_OTHER, out, sizeof(out), denied[i]), 1);
		ck_assert_msg(strstr(out, "another user") || strstr(out, "ermission"), "%s: %s",
		              denied[i], out);
	}
	ck_assert_int_eq(ctl_as(&a, U_OTHER, out, sizeof(out), "--json list"), 0);
	ck_assert_msg(!strstr(out, "priv"), "another user's list: %s", out);
	watch_shows_only_own(&a);
	/* the owner sees it; the admin group lists and deletes it */
	ck_assert_int_eq(ctl_as(&a, U_OWNER, out, sizeof(out), "--json list priv"), 0);
	ck_assert_msg(strstr(out, "\"step\": 1"), "%s", out);
	ck_assert_int_eq(ctl_as(&a, U_OPS, out, sizeof(out), "--json list"), 0);
	ck_assert_msg(strstr(out, "priv"), "admin's list: %s", out);
	ck_assert_int_eq(ctl_as(&a, U_OPS, out, sizeof(out), "delete --force priv 1"), 0);
	ck_assert_int_eq(ctl_as(&a, U_OWNER, out, sizeof(out), "--json list priv"), 0);
	ck_assert_msg(!strstr(out, "\"step\": 1"), "deleted, still listed: %s", out);
	/* ownership survives a restart: still refused */
	ck_assert_int_eq(h_agent_stop(&a), 0);
	h_agent_restart(&a);
	ck_assert_int_eq(trainer_as(&a, U_OTHER, 3, false), 0);
	ck_assert_int_eq(trainer_as(&a, U_OWNER, 3, true), 0);
	/*
	 * A job with checkpoints and no owner (saved before owners were
	 * recorded) is not for the first user who names it.
	 */
	ck_assert_int_eq(h_agent_stop(&a), 0);
	{
		char path[600];

		h_path(&a, path, sizeof(path), "priv/OWNER");
		ck_assert_int_eq(unlink(path), 0);
		h_agent_restart(&a);
		ck_assert_int_eq(trainer_as(&a, U_OTHER, 4, false), 0);
		ck_assert(h_log_has(&a, "no owner is recorded") || !h_exists(path));
		ck_assert_msg(!h_exists(path), "the first user to name it became its owner");
	}
	h_agent_cleanup(&a);
}
END_TEST

/*
 * What the admin group may do, with the socket's group set too (every test
 * user is in it; only U_OPS is in the admin group): the admin reads,
 * verifies, pins and unpins another user's job, and deletes it, but never
 * plans (so never saves or restores) nor commits it; a member of the
 * socket's group alone is no admin: the job is not listed to it, and
 * reading, verifying, pinning or deleting it is refused.
 */
START_TEST(admin_group_rights)
{
	struct agent_proc a;
	char out[8192];
	const char *admin_may[] = {"show priv 1", "verify priv 1", "pin priv 1", "unpin priv 1"};
	const char *user_may_not[] = {"list priv", "show priv 1", "verify priv 1", "pin priv 1",
	                              "delete --force priv 1"};

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --socket-mode 0660 --socket-group " G_SOCK
	                  " --admin-group " G_ADMIN);
	ck_assert_int_eq(chmod(a.dir, 0755), 0);
	ck_assert_int_eq(trainer_as(&a, U_OWNER, 1, true), 0);
	/* the admin: no plan (no save, no restore), no commit of another user's job */
	ck_assert_msg(trainer_as(&a, U_OPS, 2, false) == 0,
	              "a member of the admin group planned another user's job");
	ck_assert_int_eq(ctl_as(&a, U_OPS, out, sizeof(out), "commit --finish priv 1"), 1);
	ck_assert_msg(strstr(out, "another user") && strstr(out, "commit"), "admin's commit: %s",
	              out);
	/* and everything an operator does */
	ck_assert_int_eq(ctl_as(&a, U_OPS, out, sizeof(out), "--json list"), 0);
	ck_assert_msg(strstr(out, "priv"), "admin's list: %s", out);
	for (size_t i = 0; i < sizeof(admin_may) / sizeof(*admin_may); i++)
		ck_assert_msg(ctl_as(&a, U_OPS, out, sizeof(out), admin_may[i]) == 0,
		              "admin's %s: %s", admin_may[i], out);
	/* the socket's group is not the admin group */
	ck_assert_int_eq(ctl_as(&a, U_OTHER, out, sizeof(out), "--json list"), 0);
	ck_assert_msg(!strstr(out, "priv"), "a member of the socket's group lists it: %s", out);
	for (size_t i = 0; i < sizeof(user_may_not) / sizeof(*user_may_not); i++) {
		ck_assert_int_eq(ctl_as(&a, U_OTHER, out, sizeof(out), user_may_not[i]), 1);
		ck_assert_msg(strstr(out, "another user"),
		              "%s by a member of the socket's group: %s", user_may_not[i], out);
	}
	ck_assert_int_eq(ctl_as(&a, U_OPS, out, sizeof(out), "delete --force priv 1"), 0);
	ck_assert_int_eq(ctl_as(&a, U_OWNER, out, sizeof(out), "--json list priv"), 0);
	ck_assert_msg(!strstr(out, "\"step\": 1"), "deleted by the admin, still listed: %s", out);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * A user outside the socket's group is told so, with the group to join
 * and how, not "is it running?"; a member of the group gets in.
 */
START_TEST(outside_the_socket_group)
{
	struct agent_proc a;
	char out[8192];

	h_agent_start(&a, "--staging-mb 16 --socket-mode 0660 --socket-group " G_ADMIN);
	ck_assert_int_eq(chmod(a.dir, 0755), 0);
	ck_assert_int_eq(ctl_as(&a, U_OTHER, out, sizeof(out), "status"), 1);
	ck_assert_msg(strstr(out, "permission denied") &&
	                  strstr(out, U_OTHER " is not in the socket's group " G_ADMIN) &&
	                  strstr(out, "usermod -aG " G_ADMIN " " U_OTHER),
	              "%s", out);
	ck_assert_msg(!strstr(out, "is it running"), "%s", out);
	ck_assert_msg(ctl_as(&a, U_OPS, out, sizeof(out), "status") == 0,
	              "a member of the socket's group: %s", out);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * A root the agent's user cannot write (made by root, as a ReadWritePaths=
 * without a chown leaves it): --check-config says so and what to do, and a
 * start refuses before it serves, saying the same, rather than failing the
 * first save.
 */
START_TEST(unwritable_root_refused)
{
	struct agent_proc a;
	char out[16384], cmd[4096], root[400], sock[400];

	h_agent_start(&a, "--staging-mb 16");
	ck_assert_int_eq(chmod(a.dir, 0755), 0);
	snprintf(root, sizeof(root), "%s/theirs", a.dir);
	ck_assert_int_eq(mkdir(root, 0755), 0); /* root's, 0755 */
	snprintf(sock, sizeof(sock), "%s/sock", a.dir);
	ck_assert_int_eq(mkdir(sock, 0777), 0);
	ck_assert_int_eq(chmod(sock, 0777), 0);
	snprintf(cmd, sizeof(cmd),
	         "runuser -u %s -- %s --config /dev/null --root %s --listen unix:%s/s.sock "
	         "--check-config 2>&1",
	         U_OTHER, CKPTD_BIN, root, sock);
	ck_assert_int_eq(h_run(out, sizeof(out), cmd), 1);
	ck_assert_msg(strstr(out, "; check: PROBLEM: root ") &&
	                  strstr(out, U_OTHER " cannot make a file in it") &&
	                  strstr(out, "chown " U_OTHER " "),
	              "%s", out);
	snprintf(cmd, sizeof(cmd),
	         "runuser -u %s -- timeout 30 %s --config /dev/null --root %s --listen "
	         "unix:%s/s.sock --staging-mb 16 --no-lock 2>&1",
	         U_OTHER, CKPTD_BIN, root, sock);
	ck_assert_int_eq(h_run(out, sizeof(out), cmd), 1);
	ck_assert_msg(strstr(out, "cannot start: root ") && strstr(out, "cannot make a file in it"),
	              "%s", out);
	snprintf(cmd, sizeof(cmd), "%s/s.sock", sock);
	ck_assert_msg(!h_exists(cmd), "the refused agent made its socket");
	h_agent_cleanup(&a);
}
END_TEST

int test_before(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	if (!ensure_users()) {
		fprintf(stderr, "skipped: cannot create test users (not root, or no useradd)\n");
		return TEST_SKIP;
	}
	/* Where every user can reach the agent's socket (the build tree may be private). */
	setenv("CK_TMPDIR", "/tmp", 1);
	return TEST_RUN;
}

Suite *test_suite(void)
{
	Suite *s = suite_create("users");
	TCase *tc = tcase_create("agent");

	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, other_users_refused);
	tcase_add_test(tc, admin_group_rights);
	tcase_add_test(tc, outside_the_socket_group);
	tcase_add_test(tc, unwritable_root_refused);
	suite_add_tcase(s, tc);
	return s;
}
