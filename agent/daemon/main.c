/*
 * ckptd: the checkpoint I/O agent, one per node.
 *
 *   ckptd [--config FILE] [--check-config] [--root DIR] [--listen unix:PATH] ...
 *
 * Reads the configuration (config.c: defaults, the file, the flags on top),
 * starts the agent, serves until SIGTERM or SIGINT, then lets the saves in
 * flight commit and exits. Exit status: 0 after a clean stop (or a good
 * --check-config), 1 if the configuration is bad or start-up failed, 2 for
 * bad usage.
 */
#include <errno.h>
#include <stdbool.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/node/node.h"
#include "agent/daemon/agent.h"
#include "agent/daemon/config.h"
#include "agent/daemon/probe.h"
#include "ipc/base/log.h"

static atomic_bool stop;

static void on_signal(int sig)
{
	atomic_store(&stop, true);
}

/* The socket's directory (e.g. /run/ckptd), made with its parents if missing. */
static int socket_dir(const char *listen, char *err)
{
	char dir[PATH_MAX];

	if (!probe_socket_dir(listen, dir, sizeof(dir)))
		return 0;
	for (char *p = dir + 1;; p++) {
		bool last = *p == '\0';

		if (*p != '/' && !last)
			continue;
		*p = '\0';
		if (mkdir(dir, 0755) && errno != EEXIST)
			return ipc_errf(err, -errno, "creating the socket directory %s: %s", dir,
			                strerror(errno));
		if (last)
			return 0;
		*p = '/';
	}
}

int main(int argc, char **argv)
{
	struct sigaction sa = {.sa_handler = on_signal};
	char err[IPC_ERRLEN];
	struct config c;
	struct agent *a;
	int rc;

	rc = config_command_line(argc, argv, CONFIG_DEFAULT_PATH, &c, stdout, stderr);
	/* --check-config: the paths too, as this user (run it as the agent's) */
	if (rc == 0 && c.action == CONFIG_CHECK &&
	    probe_paths(c.cfg.root, c.cfg.listen, stdout, err)) {
		fprintf(stderr, "ckptd: %s\n", err);
		rc = 1;
	}
	if (rc >= 0) { /* --help, --version, --check-config, or a bad configuration */
		config_free(&c);
		return rc;
	}
	log_init(c.cfg.log_level);
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	/* a root this user cannot write: said now, not at the first save (nor READY) */
	rc = probe_paths(c.cfg.root, c.cfg.listen, NULL, err);
	if (!rc)
		rc = socket_dir(c.cfg.listen, err);
	if (!rc)
		rc = agent_start(&c.cfg, &a, err);
	if (rc) {
		log_msg(LOG_ERR, "cannot start: %s", err);
		config_free(&c);
		return 1;
	}
	agent_run(a, &stop);
	agent_destroy(a);
	config_free(&c);
	return 0;
}
