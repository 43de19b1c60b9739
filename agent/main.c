/*
 * ckptd: the checkpoint I/O agent, one per node.
 *
 *   ckptd [--root DIR] [--listen unix:PATH] [--staging-mb N] ...
 *
 * Parses the flags, starts the agent, serves until SIGTERM or SIGINT, then
 * lets the saves in flight commit and exits. Exit status: 0 after a clean
 * stop, 1 if start-up failed, 2 for bad usage.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"

static atomic_bool stop;

static void on_signal(int sig)
{
	atomic_store(&stop, true);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ckptd [options]\n"
		"  --root DIR             where checkpoints live (default /var/lib/ckptd)\n"
		"  --listen unix:PATH     the socket (default " IPC_DEFAULT_ENDPOINT ")\n"
		"  --staging-mb N         staging pool size in MiB (default 1024)\n"
		"  --chunk-mb N           staging chunk (and write) size in MiB (default 8)\n"
		"  --queue-depth N        writes in flight (default 8)\n"
		"  --io-engine E          auto, io_uring or pwrite (default auto)\n"
		"  --backpressure P       block or skip when the pool is full (default block)\n"
		"  --capture-threads N    copy workers (default 2)\n"
		"  --copy-threads N       helpers joining each copy (default: CPUs - 1)\n"
		"  --commit-timeout S     a step still missing ranks after S seconds fails (600)\n"
		"  --keep-last K          keep the last K committed checkpoints of a job (0: all)\n"
		"  --keep-every M         and every one whose step is a multiple of M (0: none)\n"
		"  --metrics-listen A     Prometheus /metrics on HOST:PORT (default: none)\n"
		"  --socket-group G       group of the socket (trainers' group)\n"
		"  --socket-mode MODE     octal mode of the socket (default 0660)\n"
		"  --no-direct            buffered writes instead of O_DIRECT\n"
		"  --no-lock              do not mlock the staging pool\n"
		"  --log-level L          error, warning, notice, info or debug (default info)\n"
		"  --version, --help\n");
}

/* A whole number in [min, max], or -1 with a message. */
static long long number(const char *flag, const char *v, long long min, long long max)
{
	char *end;
	long long n;

	errno = 0;
	n = strtoll(v, &end, 10);
	if (errno || end == v || *end || n < min || n > max) {
		fprintf(stderr, "ckptd: %s '%s': expected a whole number in %lld..%lld\n", flag, v,
			min, max);
		return -1;
	}
	return n;
}

enum { O_ROOT = 256, O_LISTEN, O_STAGING, O_CHUNK, O_QD, O_ENGINE, O_BP, O_THREADS, O_MODE,
       O_NODIRECT, O_NOLOCK, O_LOG, O_VERSION, O_HELP, O_COMMIT_TIMEOUT, O_COPY, O_KEEP_LAST,
       O_KEEP_EVERY, O_METRICS, O_SOCKET_GROUP };

static const struct option options[] = {
	{"root", required_argument, NULL, O_ROOT},
	{"listen", required_argument, NULL, O_LISTEN},
	{"staging-mb", required_argument, NULL, O_STAGING},
	{"chunk-mb", required_argument, NULL, O_CHUNK},
	{"queue-depth", required_argument, NULL, O_QD},
	{"io-engine", required_argument, NULL, O_ENGINE},
	{"backpressure", required_argument, NULL, O_BP},
	{"capture-threads", required_argument, NULL, O_THREADS},
	{"commit-timeout", required_argument, NULL, O_COMMIT_TIMEOUT},
	{"copy-threads", required_argument, NULL, O_COPY},
	{"keep-last", required_argument, NULL, O_KEEP_LAST},
	{"keep-every", required_argument, NULL, O_KEEP_EVERY},
	{"metrics-listen", required_argument, NULL, O_METRICS},
	{"socket-group", required_argument, NULL, O_SOCKET_GROUP},
	{"socket-mode", required_argument, NULL, O_MODE},
	{"no-direct", no_argument, NULL, O_NODIRECT},
	{"no-lock", no_argument, NULL, O_NOLOCK},
	{"log-level", required_argument, NULL, O_LOG},
	{"version", no_argument, NULL, O_VERSION},
	{"help", no_argument, NULL, O_HELP},
	{NULL, 0, NULL, 0},
};

/* One flag into the config; 0, or 2 for bad usage, or -1 to exit 0 (help/version). */
static int flag(struct agent_config *c, int opt, const char *v)
{
	long long n;
	char *end;

	switch (opt) {
	case O_ROOT:
		c->root = v;
		return 0;
	case O_LISTEN:
		c->listen = v;
		return 0;
	case O_STAGING:
		return (n = number("--staging-mb", v, 16, 1 << 22)) < 0 ? 2 : (c->staging_mb = n, 0);
	case O_CHUNK:
		return (n = number("--chunk-mb", v, 1, 1024)) < 0 ? 2 : (c->chunk_mb = n, 0);
	case O_QD:
		return (n = number("--queue-depth", v, 1, 256)) < 0 ? 2 : (c->queue_depth = n, 0);
	case O_THREADS:
		return (n = number("--capture-threads", v, 1, 64)) < 0 ? 2
								      : (c->capture_threads = n, 0);
	case O_KEEP_LAST:
		return (n = number("--keep-last", v, 0, 1000000)) < 0 ? 2 : (c->keep_last = (unsigned)n, 0);
	case O_KEEP_EVERY:
		return (n = number("--keep-every", v, 0, IPC_MAX_STEP)) < 0 ? 2 : (c->keep_every = n, 0);
	case O_METRICS:
		c->metrics_listen = v;
		return 0;
	case O_SOCKET_GROUP:
		c->socket_group = v;
		return 0;
	case O_COPY:
		return (n = number("--copy-threads", v, 0, 64)) < 0 ? 2 : (c->copy_threads = (int)n, 0);
	case O_COMMIT_TIMEOUT:
		return (n = number("--commit-timeout", v, 1, 86400 * 7)) < 0
			       ? 2
			       : (c->commit_timeout_s = (unsigned)n, 0);
	case O_ENGINE:
		if (strcmp(v, "auto") == 0)
			c->io_engine = IOENG_AUTO;
		else if (strcmp(v, "io_uring") == 0)
			c->io_engine = IOENG_URING;
		else if (strcmp(v, "pwrite") == 0)
			c->io_engine = IOENG_PWRITE;
		else
			return fprintf(stderr, "ckptd: --io-engine '%s': auto, io_uring or pwrite\n",
				       v),
			       2;
		return 0;
	case O_BP:
		if (strcmp(v, "block") == 0)
			c->backpressure = CKPT__V1__BACKPRESSURE__BACKPRESSURE_BLOCK;
		else if (strcmp(v, "skip") == 0)
			c->backpressure = CKPT__V1__BACKPRESSURE__BACKPRESSURE_SKIP;
		else
			return fprintf(stderr, "ckptd: --backpressure '%s': block or skip\n", v), 2;
		return 0;
	case O_MODE:
		errno = 0;
		n = strtoll(v, &end, 8);
		if (errno || end == v || *end || n < 0 || n > 0777)
			return fprintf(stderr, "ckptd: --socket-mode '%s': an octal mode\n", v), 2;
		c->socket_mode = (unsigned)n;
		return 0;
	case O_NODIRECT:
		c->direct = false;
		return 0;
	case O_NOLOCK:
		c->lock_pool = false;
		return 0;
	case O_LOG:
		c->log_level = log_level_from_name(v);
		if (c->log_level < 0)
			return fprintf(stderr, "ckptd: --log-level '%s': error, warning, notice, info "
					       "or debug\n",
				       v),
			       2;
		return 0;
	case O_VERSION:
		printf("ckptd %s\n", CKPTD_VERSION);
		return -1;
	case O_HELP:
		usage(stdout);
		return -1;
	default:
		usage(stderr);
		return 2;
	}
}

/* The socket's directory (e.g. /run/ckptd), made if missing. */
static int socket_dir(const char *listen, char *err)
{
	char dir[PATH_MAX];
	char *slash;

	if (strncmp(listen, "unix:", 5) != 0)
		return 0;
	snprintf(dir, sizeof(dir), "%s", listen + 5);
	slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return 0;
	*slash = '\0';
	if (mkdir(dir, 0755) && errno != EEXIST)
		return ipc_errf(err, -errno, "creating the socket directory %s: %s", dir,
				strerror(errno));
	return 0;
}

int main(int argc, char **argv)
{
	struct agent_config cfg = {
		.root = "/var/lib/ckptd",
		.listen = IPC_DEFAULT_ENDPOINT,
		.socket_mode = 0660,
		.socket_gid = -1,
		.staging_mb = 1024,
		.chunk_mb = 8,
		.queue_depth = 8,
		.io_engine = IOENG_AUTO,
		.backpressure = CKPT__V1__BACKPRESSURE__BACKPRESSURE_BLOCK,
		.capture_threads = 2,
		.commit_timeout_s = 600,
		.copy_threads = -1,
		.direct = true,
		.lock_pool = true,
		.log_level = LOG_INFO,
	};
	struct sigaction sa = {.sa_handler = on_signal};
	char err[IPC_ERRLEN];
	struct agent *a;
	int opt, rc;

	while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
		rc = flag(&cfg, opt, optarg);
		if (rc)
			return rc < 0 ? 0 : rc;
	}
	if (optind < argc) {
		fprintf(stderr, "ckptd: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	log_init(cfg.log_level);
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	rc = socket_dir(cfg.listen, err);
	if (!rc)
		rc = agent_start(&cfg, &a, err);
	if (rc) {
		log_msg(LOG_ERR, "cannot start: %s", err);
		return 1;
	}
	agent_run(a, &stop);
	agent_destroy(a);
	return 0;
}
