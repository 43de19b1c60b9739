/*
 * The integration tests' harness (see harness.h). Failures stop the test
 * with a libcheck assertion that says what did not happen.
 */
#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <jansson.h>

#include "client/rpc_call.h"
#include "tests/integration/harness.h"

#ifndef CKPTD_BIN
#error "CKPTD_BIN must name the agent binary"
#endif
#ifndef CKPTCTL_BIN
#error "CKPTCTL_BIN must name ckptctl"
#endif

/*
 * The programs under test: the build's, or $CKPTD_BIN / $CKPTCTL_BIN where
 * set (the test binaries carried to another machine, such as a GPU one).
 */
static const char *prog(const char *var, const char *built)
{
	const char *v = getenv(var);

	return v && *v ? v : built;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

static void spawn(struct agent_proc *a)
{
	char cmd[2048];
	pid_t pid;

	/* --config /dev/null: a host's /etc/ckptd/ckptd.conf must not change the test */
	snprintf(cmd, sizeof(cmd),
	         "exec %s --config /dev/null --root %s --listen %s --log-level debug %s >>%s 2>&1",
	         prog("CKPTD_BIN", CKPTD_BIN), a->root, a->endpoint, a->args, a->log);
	pid = fork();
	ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		char *eq = strchr(a->env, '=');

		if (eq) { /* a copy of the parent's: ours to cut */
			*eq = '\0';
			setenv(a->env, eq + 1, 1);
		}
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	a->pid = pid;
}

/* Until the agent answers a status call (sanitizer builds start slowly). */
static void wait_ready(struct agent_proc *a)
{
	for (int i = 0; i < 600; i++) {
		struct ckpt_client *c;
		Ckpt__V1__StatusRequest req = CKPT__V1__STATUS_REQUEST__INIT;
		ProtobufCMessage *rep;
		int status;

		if (waitpid(a->pid, &status, WNOHANG) == a->pid) {
			char buf[4096] = "";
			FILE *f = fopen(a->log, "r");

			if (f) {
				buf[fread(buf, 1, sizeof(buf) - 1, f)] = '\0';
				fclose(f);
			}
			a->pid = 0;
			ck_abort_msg("ckptd exited at start (status %d): %s", status, buf);
		}
		if (cl_open(a->endpoint, false, &c) == 0) {
			int rc = cl_call(c, IPC_STATUS, &req.base, &rep, 2000);

			if (rc == 0)
				protobuf_c_message_free_unpacked(rep, NULL);
			ckpt_disconnect(c);
			if (rc == 0)
				return;
		}
		sleep_ms(50);
	}
	ck_abort_msg("ckptd did not serve %s within 30 s", a->endpoint);
}

static void make_dir(struct agent_proc *a)
{
	const char *tmp = getenv("CK_TMPDIR") ? getenv("CK_TMPDIR") : "/tmp";

	memset(a, 0, sizeof(*a));
	snprintf(a->dir, sizeof(a->dir), "%s/ckit.XXXXXX", tmp);
	ck_assert_msg(mkdtemp(a->dir), "mkdtemp %s: %s", a->dir, strerror(errno));
}

/* What the agent gets in its environment beside the test's: "NAME=value", or NULL. */
static void set_env(struct agent_proc *a, const char *env)
{
	if (env)
		ck_assert_msg(strlen(env) < sizeof(a->env) && strchr(env, '='),
		              "'%s' is no NAME=value of at most %zu bytes", env,
		              sizeof(a->env) - 1);
	snprintf(a->env, sizeof(a->env), "%s", env ? env : "");
}

void h_agent_start_node(struct agent_proc *a, const char *root, const char *node, const char *args)
{
	h_agent_start_node_env(a, root, node, args, NULL);
}

void h_agent_start_node_env(struct agent_proc *a, const char *root, const char *node,
                            const char *args, const char *env)
{
	make_dir(a);
	set_env(a, env);
	snprintf(a->root, sizeof(a->root), "%s", root);
	snprintf(a->node, sizeof(a->node), "%s", node);
	snprintf(a->endpoint, sizeof(a->endpoint), "unix:%s/ckptd.sock", a->dir);
	snprintf(a->log, sizeof(a->log), "%s/agent.log", a->dir);
	snprintf(a->args, sizeof(a->args), "--node %s %s", node,
	         args ? args : "--staging-mb 32 --chunk-mb 1");
	spawn(a);
	wait_ready(a);
}

void h_agent_start(struct agent_proc *a, const char *args)
{
	h_agent_start_env(a, args, NULL);
}

void h_agent_start_env(struct agent_proc *a, const char *args, const char *env)
{
	make_dir(a);
	set_env(a, env);
	snprintf(a->root, sizeof(a->root), "%s/root", a->dir);
	snprintf(a->endpoint, sizeof(a->endpoint), "unix:%s/ckptd.sock", a->dir);
	snprintf(a->log, sizeof(a->log), "%s/agent.log", a->dir);
	snprintf(a->args, sizeof(a->args), "%s", args ? args : "--staging-mb 64 --chunk-mb 1");
	spawn(a);
	wait_ready(a);
}

void h_agent_restart(struct agent_proc *a)
{
	ck_assert_msg(a->pid == 0, "restart of a running agent");
	spawn(a);
	wait_ready(a);
}

int h_agent_stop(struct agent_proc *a)
{
	int status = 0;

	if (a->pid <= 0)
		return -1;
	kill(a->pid, SIGTERM);
	for (int i = 0; i < 600; i++) {
		if (waitpid(a->pid, &status, WNOHANG) == a->pid) {
			a->pid = 0;
			return h_exit_code(status);
		}
		sleep_ms(50);
	}
	kill(a->pid, SIGKILL);
	waitpid(a->pid, &status, 0);
	a->pid = 0;
	ck_abort_msg("ckptd did not stop within 30 s of SIGTERM");
	return -1;
}

void h_agent_kill(struct agent_proc *a)
{
	int status;

	if (a->pid <= 0)
		return;
	kill(a->pid, SIGKILL);
	waitpid(a->pid, &status, 0);
	a->pid = 0;
}

void h_agent_cleanup(struct agent_proc *a)
{
	char cmd[400];

	if (a->pid > 0) {
		int rc = h_agent_stop(a);

		ck_assert_msg(rc == 0, "ckptd exited with %d at stop (see %s)", rc, a->log);
	}
	if (getenv("CKPT_TEST_KEEP"))
		return;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", a->dir);
	if (system(cmd) != 0)
		fprintf(stderr, "harness: could not remove %s\n", a->dir);
}

bool h_log_has(const struct agent_proc *a, const char *needle)
{
	FILE *f = fopen(a->log, "r");
	char line[4096];
	bool found = false;

	while (f && !found && fgets(line, sizeof(line), f))
		found = strstr(line, needle) != NULL;
	if (f)
		fclose(f);
	return found;
}

int h_ctl(const struct agent_proc *a, char *out, size_t len, const char *fmt, ...)
{
	char args[1024], cmd[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof(cmd), "%s --endpoint %s %s 2>&1", prog("CKPTCTL_BIN", CKPTCTL_BIN),
	         a->endpoint, args);
	return h_run(out, len, cmd);
}

int h_run(char *out, size_t len, const char *cmd)
{
	size_t n = 0;
	FILE *p;
	int status;

	p = popen(cmd, "r");
	ck_assert_msg(p, "popen %s", cmd);
	if (out && len) {
		n = fread(out, 1, len - 1, p);
		out[n] = '\0';
	}
	while (fgetc(p) != EOF)
		;
	status = pclose(p);
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

pid_t h_spawn(const char *bin, enum h_out out, int *out_fd, const char *const *argv)
{
	int fds[2] = {-1, -1};
	pid_t pid;

	if (out != H_OUT_KEEP)
		ck_assert_int_eq(pipe(fds), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (out != H_OUT_KEEP) {
			dup2(fds[1], STDOUT_FILENO);
			if (out == H_OUT_PIPE_ALL)
				dup2(fds[1], STDERR_FILENO);
			close(fds[0]);
		}
		execv(bin ? bin : "/proc/self/exe", (char *const *)argv);
		_exit(127);
	}
	if (out == H_OUT_KEEP)
		return pid;
	close(fds[1]);
	if (out_fd)
		*out_fd = fds[0];
	else
		close(fds[0]);
	return pid;
}

pid_t h_spawn_trainer(const char *prog, const struct agent_proc *a, const char *job, long step,
                      long mb, const char *mode)
{
	char s[32], m[32];

	snprintf(s, sizeof(s), "%ld", step);
	snprintf(m, sizeof(m), "%ld", mb);
	return h_spawn(NULL, H_OUT_KEEP, NULL,
	               (const char *[]){prog, "--trainer", a->endpoint, job, s, m, mode, NULL});
}

pid_t h_spawn_rank(const char *bin, const struct agent_proc *a, const char *job, const char *run,
                   int rank, int world, long first, long last, long mb, const char *mode,
                   int *out_fd, bool with_stderr)
{
	char r[8], w[8], f[24], l[24], m[24];

	snprintf(r, sizeof(r), "%d", rank);
	snprintf(w, sizeof(w), "%d", world);
	snprintf(f, sizeof(f), "%ld", first);
	snprintf(l, sizeof(l), "%ld", last);
	snprintf(m, sizeof(m), "%ld", mb);
	return h_spawn(bin, with_stderr ? H_OUT_PIPE_ALL : H_OUT_PIPE, out_fd,
	               (const char *[]){"test_cluster", "--rank", a->endpoint, job, run, r, w, f, l,
	                                m, mode, NULL});
}

void h_read_all(int fd, char *buf, size_t len)
{
	size_t n = 0;
	ssize_t got;

	while (n + 1 < len && (got = read(fd, buf + n, len - 1 - n)) > 0)
		n += (size_t)got;
	buf[n] = '\0';
	close(fd);
}

void h_path(const struct agent_proc *a, char *buf, size_t len, const char *fmt, ...)
{
	size_t n = (size_t)snprintf(buf, len, "%s/", a->root);
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf + n, len - n, fmt, ap);
	va_end(ap);
}

/* A head's ranks, from the parts it names: into m as "ranks". */
static void head_ranks(json_t *m, const char *path)
{
	json_t *ranks = json_array(), *parts = json_object_get(m, "parts"), *p;
	size_t world = (size_t)json_integer_value(json_object_get(m, "world")), i, j;
	char dir[512], ppath[700];
	json_error_t je;

	snprintf(dir, sizeof(dir), "%s", path);
	*strrchr(dir, '/') = '\0';
	for (i = 0; i < world; i++)
		json_array_append_new(ranks, json_null());
	json_array_foreach(parts, i, p)
	{
		json_t *part, *k;

		snprintf(ppath, sizeof(ppath), "%s/parts/%s.json", dir,
		         json_string_value(json_object_get(p, "node")));
		part = json_load_file(ppath, 0, &je);
		ck_assert_msg(part, "%s: %s", ppath, je.text);
		json_array_foreach(json_object_get(part, "ranks"), j, k) json_array_set(
		    ranks, (size_t)json_integer_value(json_object_get(k, "rank")), k);
		json_decref(part);
	}
	json_object_set_new(m, "ranks", ranks);
}

json_t *h_manifest_load(const char *path)
{
	json_error_t je;
	json_t *m = json_load_file(path, 0, &je);

	ck_assert_msg(m, "%s: %s", path, je.text);
	if (json_integer_value(json_object_get(m, "version")) == 4)
		head_ranks(m, path);
	return m;
}

size_t h_manifest_ranks(json_t *m)
{
	size_t i, n = 0;
	json_t *p;

	if (json_integer_value(json_object_get(m, "version")) != 4)
		return json_array_size(json_object_get(m, "ranks"));
	json_array_foreach(json_object_get(m, "parts"), i, p)
	{
		ck_assert(json_is_string(json_object_get(p, "xxh3")));
		n += json_array_size(json_object_get(p, "ranks"));
	}
	return n;
}

void h_shard(const struct agent_proc *a, char *buf, size_t len, const char *job, long long step,
             int rank)
{
	char mpath[512];
	json_t *m, *r;

	h_path(a, mpath, sizeof(mpath), "%s/step-%012lld/manifest.json", job, step);
	m = h_manifest_load(mpath);
	r = json_array_get(json_object_get(m, "ranks"), (size_t)rank);
	ck_assert_msg(json_is_string(json_object_get(r, "file")), "%s: no rank %d", mpath, rank);
	h_path(a, buf, len, "%s/step-%012lld/%s", job, step,
	       json_string_value(json_object_get(r, "file")));
	json_decref(m);
}

bool h_exists(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0;
}

void h_flip_byte(const char *path, uint64_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t b;

	ck_assert_msg(fd >= 0, "open %s: %s", path, strerror(errno));
	ck_assert_int_eq(pread(fd, &b, 1, (off_t)off), 1);
	b ^= 0x10;
	ck_assert_int_eq(pwrite(fd, &b, 1, (off_t)off), 1);
	fsync(fd);
	close(fd);
}

/* ---- test tensors ----------------------------------------------------- */

static const enum ckpt_dtype dtypes[] = {CKPT_F32, CKPT_BF16, CKPT_U8,  CKPT_I64,
                                         CKPT_F16, CKPT_BOOL, CKPT_F64, CKPT_I32};
static const unsigned dsize[] = {4, 2, 1, 8, 2, 1, 8, 4};

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

uint8_t h_value(uint64_t seed, size_t i, size_t j)
{
	return (uint8_t)(mix(seed * 0x9e3779b97f4a7c15ull + i * 0x100000001b3ull + j / 8) >>
	                 (j % 8 * 8));
}

size_t h_tensor_bytes(const struct h_model *m, size_t i)
{
	return (size_t)(m->shape[i][0] * m->shape[i][1]) * dsize[i % 8];
}

void h_model_make(struct h_model *m, struct ckpt_client *c, size_t n, size_t scale)
{
	size_t off = 0;
	int rc;

	memset(m, 0, sizeof(*m));
	m->c = c;
	m->n = n;
	m->t = calloc(n, sizeof(*m->t));
	m->shape = calloc(n, sizeof(*m->shape));
	m->name = calloc(n, sizeof(*m->name));
	ck_assert(m->t && m->shape && m->name);
	for (size_t i = 0; i < n; i++) {
		int64_t cols = 7 + 2 * (int64_t)i;

		m->shape[i][1] = cols;
		/* every 5th tensor is empty: no bytes, still saved and restored */
		m->shape[i][0] = i % 5 == 4 ? 0 : (int64_t)(scale / (cols * dsize[i % 8]) + 1 + i);
		m->bytes += (h_tensor_bytes(m, i) + 63) / 64 * 64;
	}
	rc = ckpt_host_alloc(c, m->bytes ? m->bytes : 1, &m->base);
	ck_assert_msg(rc == 0, "ckpt_host_alloc(%zu): %s", m->bytes, ckpt_last_error(c));
	for (size_t i = 0; i < n; i++) {
		snprintf(m->name[i], sizeof(m->name[i]), "model.layer%02zu.%s", i,
		         i % 2 ? "bias" : "weight");
		m->t[i] = (struct ckpt_tensor){.name = m->name[i],
		                               .dtype = dtypes[i % 8],
		                               .ndim = 2,
		                               .shape = m->shape[i],
		                               .data = (char *)m->base + off};
		off += (h_tensor_bytes(m, i) + 63) / 64 * 64;
	}
}

void h_model_fill(struct h_model *m, uint64_t seed)
{
	for (size_t i = 0; i < m->n; i++) {
		uint8_t *d = m->t[i].data;

		for (size_t j = 0, e = h_tensor_bytes(m, i); j < e; j++)
			d[j] = h_value(seed, i, j);
	}
}

bool h_model_check(const struct h_model *m, uint64_t seed, size_t *bad)
{
	for (size_t i = 0; i < m->n; i++) {
		const uint8_t *d = m->t[i].data;

		for (size_t j = 0, e = h_tensor_bytes(m, i); j < e; j++)
			if (d[j] != h_value(seed, i, j)) {
				if (bad)
					*bad = i;
				return false;
			}
	}
	return true;
}

void h_model_free(struct h_model *m)
{
	if (m->c && m->base)
		ckpt_host_free(m->c, m->base);
	free(m->t);
	free(m->shape);
	free(m->name);
	memset(m, 0, sizeof(*m));
}

/* ---- below libckpt ---------------------------------------------------- */

unsigned h_free_port(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
	ck_assert_msg(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "bind: %s",
	              strerror(errno));
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	close(fd);
	return ntohs(sa.sin_port);
}

double h_metric(unsigned port, const char *sample)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
	                         .sin_port = htons((uint16_t)port),
	                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct timeval tv = {10, 0};
	static char buf[1 << 18];
	char req[96], want[256], *at;
	size_t len = 0;
	ssize_t n;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0,
	              "connect to the metrics port %u: %s", port, strerror(errno));
	snprintf(req, sizeof(req), "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
	ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
	while (len < sizeof(buf) - 1 && (n = read(fd, buf + len, sizeof(buf) - 1 - len)) > 0)
		len += (size_t)n;
	close(fd);
	buf[len] = '\0';
	snprintf(want, sizeof(want), "\n%s ", sample);
	at = strstr(buf, want);
	ck_assert_msg(at, "no sample %s in the scrape of port %u", sample, port);
	return strtod(at + strlen(want), NULL);
}

struct ckpt_client *h_connect(const struct agent_proc *a)
{
	struct ckpt_client *c;
	int rc = ckpt_connect(a->endpoint, &c);

	ck_assert_msg(rc == 0, "ckpt_connect %s: %s", a->endpoint, ckpt_strerror(rc));
	return c;
}

int h_cred_token(const struct agent_proc *a, char *hex)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct ipc_cred_msg m;
	int sock, fd;

	ck_assert_int_eq(ipc_cred_path(a->endpoint, sa.sun_path, sizeof(sa.sun_path)), 0);
	sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(sock, 0);
	ck_assert_msg(connect(sock, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect %s: %s",
	              sa.sun_path, strerror(errno));
	ck_assert_int_eq(ipc_cred_recv(sock, &m, &fd, 10000), 0);
	ck_assert_int_eq(fd, -1);
	ck_assert_int_eq((int)m.op, IPC_CRED_HELLO);
	ck_assert_msg(m.status == 0, "refused: %s", m.message);
	ipc_token_hex(m.token, hex);
	return sock;
}

int h_raw_call(const struct agent_proc *a, const char *method, const void *buf, size_t len,
               char *msg, size_t msglen)
{
	return h_raw_call_as(a, method, buf, len, msg, msglen, true);
}

int h_raw_call_as(const struct agent_proc *a, const char *method, const void *buf, size_t len,
                  char *msg, size_t msglen, bool with_token)
{
	char token[IPC_TOKEN_HEX + 1] = "";
	int sock = with_token ? h_cred_token(a, token) : -1;
	int st = h_raw_call_token(a, with_token ? token : NULL, method, buf, len, msg, msglen);

	if (sock >= 0)
		close(sock);
	return st;
}

int h_raw_call_token(const struct agent_proc *a, const char *token, const char *method,
                     const void *buf, size_t len, char *msg, size_t msglen)
{
	bool with_token = token != NULL;
	grpc_metadata md = {.key = grpc_slice_from_static_string(IPC_CRED_META),
	                    .value = grpc_slice_from_static_string(token ? token : "")};
	grpc_channel_credentials *creds = grpc_insecure_credentials_create();
	grpc_slice payload = grpc_slice_from_copied_buffer(buf, len);
	grpc_byte_buffer *out = grpc_raw_byte_buffer_create(&payload, 1), *in = NULL;
	grpc_metadata_array imd, tmd;
	grpc_status_code st = GRPC_STATUS_UNKNOWN;
	grpc_slice details = grpc_empty_slice();
	grpc_completion_queue *cq;
	grpc_channel *ch;
	grpc_call *call;
	grpc_op ops[6];
	char *d;

	grpc_init();
	ch = grpc_channel_create(a->endpoint, creds, NULL);
	cq = grpc_completion_queue_create_for_pluck(NULL);
	call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
	                                grpc_slice_from_static_string(method), NULL,
	                                gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
	grpc_metadata_array_init(&imd);
	grpc_metadata_array_init(&tmd);
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	ops[0].data.send_initial_metadata.count = with_token ? 1 : 0;
	ops[0].data.send_initial_metadata.metadata = with_token ? &md : NULL;
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = out;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &imd;
	ops[4].op = GRPC_OP_RECV_MESSAGE;
	ops[4].data.recv_message.recv_message = &in;
	ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	ops[5].data.recv_status_on_client.trailing_metadata = &tmd;
	ops[5].data.recv_status_on_client.status = &st;
	ops[5].data.recv_status_on_client.status_details = &details;
	ck_assert_int_eq(grpc_call_start_batch(call, ops, 6, ops, NULL), GRPC_CALL_OK);
	grpc_completion_queue_pluck(cq, ops, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
	d = grpc_slice_to_c_string(details);
	snprintf(msg, msglen, "%s", d);
	gpr_free(d);
	if (in)
		grpc_byte_buffer_destroy(in);
	grpc_byte_buffer_destroy(out);
	grpc_slice_unref(payload);
	grpc_slice_unref(details);
	grpc_metadata_array_destroy(&imd);
	grpc_metadata_array_destroy(&tmd);
	grpc_call_unref(call);
	grpc_completion_queue_shutdown(cq);
	grpc_completion_queue_destroy(cq);
	grpc_channel_destroy(ch);
	grpc_channel_credentials_release(creds);
	grpc_shutdown();
	return st;
}

bool h_wait_state(const struct agent_proc *a, const char *job, long long step, const char *state,
                  int timeout_ms)
{
	static char out[1 << 20];

	for (int waited = 0; waited <= timeout_ms; waited += 100) {
		json_t *j, *c;
		size_t i;

		if (h_ctl(a, out, sizeof(out), "--json list %s", job) == 0 &&
		    (j = json_loads(out, 0, NULL))) {
			bool found = false;

			json_array_foreach(json_object_get(j, "checkpoints"), i, c)
			{
				const char *st = json_string_value(json_object_get(c, "state"));

				if (json_integer_value(json_object_get(c, "step")) != step || !st)
					continue;
				found |= strcmp(st, state) == 0 ||
				         (strcmp(state, "IN_FLIGHT") == 0 &&
				          strcmp(st, "COMMITTED") && strcmp(st, "FAILED"));
			}
			json_decref(j);
			if (found)
				return true;
		}
		sleep_ms(100);
	}
	return false;
}

int h_exit_code(int status)
{
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int h_reap(pid_t pid)
{
	int st;

	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return h_exit_code(st);
}
