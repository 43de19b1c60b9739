/*
 * Trust boundaries, against a real agent: a trainer cannot pull its memory
 * away under the agent, regions have no name another process could open,
 * calls without credentials reach only Status, files are not for every
 * account, and per-user limits hold. (A second user: test_users.c.)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>
#include <grpc/grpc.h>

#include "client/rpc_call.h"
#include "tests/integration/harness.h"
#include "support/check_main.h"

static void save_wait(struct ckpt_plan *p, int64_t step, enum ckpt_state until)
{
	struct ckpt_save *s;
	int rc = ckpt_save(p, step, NULL, &s);

	ck_assert_msg(rc == 0, "save %lld: %s", (long long)step, ckpt_strerror(rc));
	rc = ckpt_save_wait(s, until, 60000);
	ck_assert_msg(rc == 0, "save %lld: %s (%s)", (long long)step, ckpt_strerror(rc),
	              ckpt_save_reason(s));
	ckpt_save_release(s);
}

/* A plan of one 8 MiB tensor in a fresh host region. */
static struct ckpt_plan *one_tensor(struct ckpt_client *c, const char *job, void **mem)
{
	static int64_t shape[1] = {8 << 20};
	struct ckpt_tensor t = {.name = "w", .dtype = CKPT_U8, .ndim = 1, .shape = shape};
	struct ckpt_plan *p;
	int rc = ckpt_host_alloc(c, 8 << 20, mem);

	ck_assert_msg(rc == 0, "host_alloc: %s", ckpt_last_error(c));
	memset(*mem, 0x3c, 8 << 20);
	t.data = *mem;
	rc = ckpt_plan_create(c, job, 0, 1, &t, 1, &p);
	ck_assert_msg(rc == 0, "plan: %s", ckpt_last_error(c));
	return p;
}

/*
 * The region's mapping in this process, opened as a file through
 * /proc/self/map_files (what a trainer, or anyone who could ptrace it, can
 * do): -1 where that needs rights we lack.
 */
static int open_mapping(const void *ptr)
{
	FILE *f = fopen("/proc/self/maps", "r");
	unsigned long lo, hi, p = (unsigned long)ptr;
	char line[512], path[128];
	int fd = -1;

	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && p >= lo && p < hi) {
			snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx", lo, hi);
			fd = open(path, O_RDWR);
			break;
		}
	fclose(f);
	return fd;
}

/*
 * A trainer shrinking its region used to kill the agent with SIGBUS at the
 * next save. The region cannot shrink now; the agent saves on.
 */
START_TEST(region_cannot_shrink)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	void *mem;
	int fd;

	h_agent_start(&a, NULL);
	c = h_connect(&a);
	p = one_tensor(c, "shrink", &mem);
	fd = open_mapping(mem);
	if (fd >= 0) { /* needs CAP_SYS_ADMIN: as root (CI) */
		ck_assert_msg(ftruncate(fd, 4096) != 0, "the trainer shrank its region");
		ck_assert_int_eq(errno, EPERM);
		close(fd);
	} else {
		fprintf(stderr,
		        "note: /proc/self/map_files needs CAP_SYS_ADMIN: shrink not tried\n");
	}
	save_wait(p, 1, CKPT_COMMITTED);
	ck_assert_int_eq(kill(a.pid, 0), 0);
	ck_assert_int_eq(ckpt_restore(p, 1, NULL, NULL), 0);
	ckpt_plan_destroy(p);
	ckpt_disconnect(c);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	h_agent_cleanup(&a);
}
END_TEST

/* Regions used to be names in /dev/shm that other members of the group opened. */
START_TEST(regions_have_no_name)
{
	struct agent_proc a;
	struct ckpt_client *c;
	char buf[8192], mine[32];
	void *mem[20];
	int in, named = 0;
	ssize_t n;

	/* ours only: other processes on the machine may make names of their own */
	snprintf(mine, sizeof(mine), "ckpt.%d.", (int)getpid());
	in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	ck_assert_int_ge(in, 0);
	ck_assert_int_ge(inotify_add_watch(in, "/dev/shm", IN_CREATE), 0);
	h_agent_start(&a, NULL);
	c = h_connect(&a);
	for (int i = 0; i < 20; i++)
		ck_assert_int_eq(ckpt_host_alloc(c, 1 << 16, &mem[i]), 0);
	while ((n = read(in, buf, sizeof(buf))) > 0)
		for (char *q = buf; q < buf + n;) {
			struct inotify_event *e = (struct inotify_event *)q;

			if (e->len && strncmp(e->name, mine, strlen(mine)) == 0)
				named++;
			q += sizeof(*e) + e->len;
		}
	ck_assert_msg(named == 0, "%d regions were names in /dev/shm", named);
	for (int i = 0; i < 20; i++)
		ckpt_host_free(c, mem[i]);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/* Hands fd over a credentials connection of our own; its ticket. */
static uint64_t hand_over(int sock, int fd, uint64_t size)
{
	struct ipc_cred_msg m = {.op = IPC_CRED_FD, .seq = 9, .size = size}, in;
	int extra;

	memcpy(m.magic, IPC_CRED_MAGIC, 8);
	ck_assert_int_eq(ipc_cred_send(sock, &m, fd), 0);
	ck_assert_int_eq(ipc_cred_recv(sock, &in, &extra, 10000), 0);
	ck_assert_int_eq((int)in.op, IPC_CRED_ACK);
	ck_assert_msg(in.status == 0, "%s", in.message);
	return in.ticket;
}

/* A descriptor that is not a sealed, allocated memfd is refused at registration. */
START_TEST(bad_regions_refused)
{
	Ckpt__V1__AttachRequest at = CKPT__V1__ATTACH_REQUEST__INIT;
	Ckpt__V1__RegisterRegionRequest reg = CKPT__V1__REGISTER_REGION_REQUEST__INIT;
	struct agent_proc a;
	struct ckpt_client *c;
	char token[IPC_TOKEN_HEX + 1], msg[1024];
	uint8_t buf[256];
	int sock, fd;

	(void)at;
	h_agent_start(&a, NULL);
	c = h_connect(&a);
	sock = h_cred_token(&a, token);
	reg.session_id = c->session_id;
	reg.size = 1 << 20;
	/* not sealed */
	fd = memfd_create("x", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ck_assert_int_eq(ftruncate(fd, 1 << 20), 0);
	ck_assert_int_eq(fallocate(fd, 0, 0, 1 << 20), 0);
	reg.ticket = hand_over(sock, fd, 1 << 20);
	close(fd);
	ck_assert_int_eq(h_raw_call_token(&a, token, ipc_methods[IPC_REGISTER_REGION].path, buf,
	                                  ckpt__v1__register_region_request__pack(&reg, buf), msg,
	                                  sizeof(msg)),
	                 GRPC_STATUS_INVALID_ARGUMENT);
	ck_assert_msg(strstr(msg, "sealed"), "%s", msg);
	/* sealed but never allocated: the agent's first touch could fault */
	fd = memfd_create("x", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ck_assert_int_eq(ftruncate(fd, 1 << 20), 0);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
	reg.ticket = hand_over(sock, fd, 1 << 20);
	close(fd);
	ck_assert_int_eq(h_raw_call_token(&a, token, ipc_methods[IPC_REGISTER_REGION].path, buf,
	                                  ckpt__v1__register_region_request__pack(&reg, buf), msg,
	                                  sizeof(msg)),
	                 GRPC_STATUS_INVALID_ARGUMENT);
	ck_assert_msg(strstr(msg, "allocated"), "%s", msg);
	/* a ticket is claimed once, by its own connection */
	fd = memfd_create("x", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ck_assert_int_eq(ftruncate(fd, 1 << 20), 0);
	ck_assert_int_eq(fallocate(fd, 0, 0, 1 << 20), 0);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
	reg.ticket = hand_over(sock, fd, 1 << 20);
	close(fd);
	ck_assert_int_eq(h_raw_call(&a, ipc_methods[IPC_REGISTER_REGION].path, buf,
	                            ckpt__v1__register_region_request__pack(&reg, buf), msg,
	                            sizeof(msg)),
	                 GRPC_STATUS_NOT_FOUND);
	ck_assert_int_eq(h_raw_call_token(&a, token, ipc_methods[IPC_REGISTER_REGION].path, buf,
	                                  ckpt__v1__register_region_request__pack(&reg, buf), msg,
	                                  sizeof(msg)),
	                 GRPC_STATUS_OK);
	close(sock);
	ck_assert_int_eq(kill(a.pid, 0), 0);
	ckpt_disconnect(c);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	h_agent_cleanup(&a);
}
END_TEST

/* No token: Status answers, everything else is PERMISSION_DENIED with the way in. */
START_TEST(anonymous_reaches_status_only)
{
	Ckpt__V1__ListRequest lr = CKPT__V1__LIST_REQUEST__INIT;
	Ckpt__V1__StatusRequest sr = CKPT__V1__STATUS_REQUEST__INIT;
	struct agent_proc a;
	uint8_t buf[256];
	char msg[1024];

	h_agent_start(&a, NULL);
	lr.job = "j";
	ck_assert_int_eq(h_raw_call_as(&a, ipc_methods[IPC_LIST].path, buf,
	                               ckpt__v1__list_request__pack(&lr, buf), msg, sizeof(msg),
	                               false),
	                 GRPC_STATUS_PERMISSION_DENIED);
	ck_assert_msg(strstr(msg, ".cred") && strstr(msg, "ckpt-cred"), "%s", msg);
	ck_assert_int_eq(h_raw_call_token(&a, "0123456789abcdef0123456789abcdef",
	                                  ipc_methods[IPC_LIST].path, buf,
	                                  ckpt__v1__list_request__pack(&lr, buf), msg, sizeof(msg)),
	                 GRPC_STATUS_PERMISSION_DENIED);
	ck_assert_int_eq(h_raw_call_as(&a, ipc_methods[IPC_STATUS].path, buf,
	                               ckpt__v1__status_request__pack(&sr, buf), msg, sizeof(msg),
	                               false),
	                 GRPC_STATUS_OK);
	h_agent_cleanup(&a);
}
END_TEST

/* A request that cannot make a plan claims no job for its sender. */
START_TEST(failed_plan_claims_nothing)
{
	Ckpt__V1__CreatePlanRequest req = CKPT__V1__CREATE_PLAN_REQUEST__INIT;
	struct agent_proc a;
	uint8_t buf[256];
	char msg[1024], path[600];

	h_agent_start(&a, NULL);
	req.session_id = 12345; /* no such session */
	req.job = "squat";
	req.world = 1;
	ck_assert_int_eq(h_raw_call(&a, ipc_methods[IPC_CREATE_PLAN].path, buf,
	                            ckpt__v1__create_plan_request__pack(&req, buf), msg,
	                            sizeof(msg)),
	                 GRPC_STATUS_NOT_FOUND);
	h_path(&a, path, sizeof(path), "squat/OWNER");
	ck_assert_msg(!h_exists(path), "a refused plan recorded an owner");
	h_agent_cleanup(&a);
}
END_TEST

/* Idle connections to the gRPC socket, n of them (as fds into v). */
static int flood(const struct agent_proc *a, int *v, int n)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int k = 0;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", a->endpoint + 5);
	for (; k < n; k++) {
		v[k] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		ck_assert_int_ge(v[k], 0);
		if (connect(v[k], (struct sockaddr *)&sa, sizeof(sa))) {
			close(v[k]);
			break; /* the backlog is full: enough */
		}
	}
	return k;
}

static int fd_count(pid_t pid)
{
	char path[64], cmd[128];
	FILE *f;
	int n = -1;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	snprintf(cmd, sizeof(cmd), "ls %s | wc -l", path);
	f = popen(cmd, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fscanf(f, "%d", &n), 1);
	pclose(f);
	return n;
}

/*
 * Idle connections used to take the agent's descriptors until gRPC stopped
 * accepting for good. A user holds at most connections_per_user; an agent
 * out of descriptors accepts again once they are back.
 */
START_TEST(connection_flood)
{
	struct agent_proc a;
	struct rlimit old, low;
	char out[4096];
	static int v[600];
	int n, before;

	/* a user: at most 8 connections, whatever it opens */
	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --max-connections 8");
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "status"), 0);
	before = fd_count(a.pid);
	n = flood(&a, v, 200);
	ck_assert_int_ge(n, 50);
	for (int i = 0; i < 50 && !h_log_has(&a, "connections_per_user"); i++)
		usleep(100000);
	ck_assert_msg(h_log_has(&a, "connections_per_user"), "no connection was refused");
	ck_assert_msg(fd_count(a.pid) <= before + 2 * 8 + 4, "the agent holds %d descriptors",
	              fd_count(a.pid));
	while (n--)
		close(v[n]);
	for (int i = 0; i < 50 && h_ctl(&a, out, sizeof(out), "status"); i++)
		usleep(100000);
	ck_assert_msg(h_ctl(&a, out, sizeof(out), "status") == 0, "%s", out);
	h_agent_cleanup(&a);

	/* an agent out of descriptors (a low limit, many connections) serves again after */
	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
	low = old;
	low.rlim_cur = 256;
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --max-connections 4096");
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
	n = flood(&a, v, 600);
	ck_assert_int_ge(n, 300);
	usleep(500000);
	ck_assert_int_eq(kill(a.pid, 0), 0);
	while (n--)
		close(v[n]);
	for (int i = 0; i < 100 && h_ctl(&a, out, sizeof(out), "status"); i++)
		usleep(100000);
	ck_assert_msg(h_ctl(&a, out, sizeof(out), "status") == 0,
	              "the agent does not answer after running out of descriptors: %s", out);
	h_agent_cleanup(&a);
}
END_TEST

/* Shards were 0644 in 0755 directories: readable by every account. */
START_TEST(files_not_for_everyone)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	char path[600];
	struct stat st;
	void *mem;

	h_agent_start(&a, NULL);
	c = h_connect(&a);
	p = one_tensor(c, "modes", &mem);
	save_wait(p, 1, CKPT_COMMITTED);
	h_shard(&a, path, sizeof(path), "modes", 1, 0);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_msg((st.st_mode & 0777) == 0640, "shard mode %o", st.st_mode & 0777);
	h_path(&a, path, sizeof(path), "modes/step-%012d", 1);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_msg((st.st_mode & 0777) == 0750, "step directory mode %o", st.st_mode & 0777);
	h_path(&a, path, sizeof(path), "modes/OWNER");
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_msg((st.st_mode & 0007) == 0, "OWNER mode %o", st.st_mode & 0777);
	ckpt_plan_destroy(p);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/* Sessions, Watch streams, connections and tensors per user are capped, the key named. */
START_TEST(limits_per_user)
{
	static int64_t shape[1] = {16};
	struct ckpt_tensor t[4];
	struct agent_proc a;
	struct ckpt_client *c1, *c2, *c3 = NULL, *w1, *w2;
	struct ckpt_plan *p = NULL;
	struct cl_stream *s1, *s2;
	Ckpt__V1__WatchRequest wr = CKPT__V1__WATCH_REQUEST__INIT;
	ProtobufCMessage *ev = NULL;
	void *mem;
	int rc;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --max-sessions 2 --max-watchers 1 "
	                  "--max-tensors 3 --max-connections 6");
	c1 = h_connect(&a);
	c2 = h_connect(&a);
	rc = ckpt_connect(a.endpoint, &c3);
	ck_assert_int_eq(rc, -EAGAIN);
	ck_assert(h_log_has(&a, "attached") && !c3);
	/* tensors: 4 of 3 */
	ck_assert_int_eq(ckpt_host_alloc(c1, 4096, &mem), 0);
	for (int i = 0; i < 4; i++) {
		char *name = malloc(8);

		snprintf(name, 8, "t%d", i);
		t[i] = (struct ckpt_tensor){.name = name,
		                            .dtype = CKPT_U8,
		                            .ndim = 1,
		                            .shape = shape,
		                            .data = (char *)mem + 16 * i};
	}
	ck_assert_int_eq(ckpt_plan_create(c1, "lim", 0, 1, t, 4, &p), -EAGAIN);
	ck_assert_msg(strstr(ckpt_last_error(c1), "tensors_per_user"), "%s", ckpt_last_error(c1));
	ck_assert_int_eq(ckpt_plan_create(c1, "lim", 0, 1, t, 3, &p), 0);
	/* Watch streams: 2 of 1 */
	ck_assert_int_eq(cl_open(a.endpoint, false, &w1), 0);
	ck_assert_int_eq(cl_open(a.endpoint, false, &w2), 0);
	ck_assert_int_eq(cl_stream_open(w1, IPC_WATCH, &wr.base, &s1), 0);
	ck_assert_int_eq(cl_stream_next(s1, &ev, 300), -ETIMEDOUT); /* open, nothing yet */
	ck_assert_int_eq(cl_stream_open(w2, IPC_WATCH, &wr.base, &s2), 0);
	rc = cl_stream_next(s2, &ev, 10000);
	ck_assert_int_eq(rc, -EAGAIN);
	ck_assert_msg(strstr(ckpt_last_error(w2), "watchers_per_user"), "%s", ckpt_last_error(w2));
	cl_stream_close(s2);
	/* connections: up to 6 at once (c1, c2, w1, w2 hold 4), then refused */
	{
		struct ckpt_client *x[8];
		int n = 0;

		while (n < 8 && (rc = cl_open(a.endpoint, false, &x[n])) == 0)
			n++;
		ck_assert_int_eq(rc, -EAGAIN);
		ck_assert_int_le(n, 2);
		while (n--)
			ckpt_disconnect(x[n]);
	}
	ck_assert_int_eq(kill(a.pid, 0), 0);
	cl_stream_close(s1);
	ckpt_disconnect(w1);
	ckpt_disconnect(w2);
	ckpt_plan_destroy(p);
	ckpt_disconnect(c2);
	ckpt_disconnect(c1);
	for (int i = 0; i < 4; i++)
		free((void *)t[i].name);
	h_agent_cleanup(&a);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("security");
	TCase *tc = tcase_create("agent");

	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, region_cannot_shrink);
	tcase_add_test(tc, regions_have_no_name);
	tcase_add_test(tc, bad_regions_refused);
	tcase_add_test(tc, anonymous_reaches_status_only);
	tcase_add_test(tc, files_not_for_everyone);
	tcase_add_test(tc, failed_plan_claims_nothing);
	tcase_add_test(tc, connection_flood);
	tcase_add_test(tc, limits_per_user);
	suite_add_tcase(s, tc);
	return s;
}
