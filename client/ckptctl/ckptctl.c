/*
 * ckptctl: the operator's view of ckptd.
 *
 *   ckptctl [--endpoint E] [--json] COMMAND [ARGS]   (the commands: `commands` below)
 *   ckptctl help [COMMAND] | COMMAND --help | --version
 *
 * Tables for people, JSON (--json) for programs, errors included (an object
 * {"error", "errno", "code"} on stdout). Exit status: 0 ok, 1 the operation
 * failed (or verify found damage), 2 bad usage (a JOB or STEP the agent
 * would refuse included: checked here by its rules, nothing sent). A STEP
 * may be "latest": the step LATEST names, asked of the agent first.
 *
 * This file: the commands table, usage and help, and main (which picks the
 * command and runs it on the main thread). The commands live in
 * ckptctl_cmds.c, ckptctl_show.c and ckptctl_watch.c; what they share in
 * ckptctl_util.c.
 */
#define _GNU_SOURCE /* strerrorname_np */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "client/ckptctl/ckptctl.h"

/* The commands: what `help` prints, and what a usage error names. */
static const struct ctl_cmd {
	const char *name, *args, *what;
	int (*fn)(struct ctl *x, int argc, char **argv);
} commands[] = {
    {"status", "", "the agent: I/O path, staging pool, saves, last error", cmd_status},
    {"list", "[JOB]", "committed checkpoints (and those in flight)", cmd_list},
    {"show", "[--full] [--tier T] JOB STEP",
     "one checkpoint: its summary; with --full (or --json) every rank, tensor and chunk, "
     "streamed (T: root, the default, or upload: the upload tier)",
     ctl_show},
    {"verify", "[--tier T] JOB STEP",
     "read every byte back and check every checksum (T: root, the default, or upload)", cmd_verify},
    {"delete", "[--force] JOB STEP",
     "remove a checkpoint (the one LATEST names only with --force: LATEST then moves back to "
     "the newest before it)",
     cmd_delete},
    {"watch", "[JOB]",
     "saves in flight, live (Ctrl-C quits); one line per event when stdout is not a terminal",
     ctl_watch},
    {"pin", "JOB STEP", "keep a checkpoint whatever the retention policy says", cmd_pin},
    {"unpin", "JOB STEP", "let retention remove it again", cmd_unpin},
    {"gc", "JOB", "apply the retention policy to JOB now", cmd_gc},
    {"commit", "--finish JOB STEP",
     "commit a step whose parts are all in the root (the agent that was to commit it is gone)",
     cmd_commit},
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static const struct ctl_cmd *cmd_named(const char *name)
{
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

/* "what" folded to lines of at most 56 columns, each indented by `indent`. */
static void print_folded(FILE *f, const char *what, int indent)
{
	const char *p = what;

	while (*p) {
		int n = (int)strlen(p);

		if (n > 56) {
			n = 56;
			while (n > 0 && p[n] != ' ')
				n--;
			if (n == 0)
				n = 56;
		}
		fprintf(f, "%*s%.*s\n", indent, "", n, p);
		p += n;
		while (*p == ' ')
			p++;
	}
}

void ctl_usage(FILE *f)
{
	fprintf(f, "usage: ckptctl [--endpoint E] [--json] COMMAND [ARGS]\n"
	           "       ckptctl help [COMMAND] | COMMAND --help | --version\n\n");
	for (size_t i = 0; i < NCOMMANDS; i++) {
		fprintf(f, "  %s%s%s\n", commands[i].name, *commands[i].args ? " " : "",
		        commands[i].args);
		print_folded(f, commands[i].what, 6);
	}
	fprintf(f, "\nSTEP: a step number, or latest (the step LATEST names).\n"
	           "endpoint: --endpoint, else $CKPT_ENDPOINT, else " IPC_DEFAULT_ENDPOINT "\n"
	           "--json: JSON on stdout, errors included. Exit status: 0 done, 1 failed,\n"
	           "2 bad usage (nothing sent). man ckptctl says more.\n");
}

/* A command's argument line, for ctl_usage_error (struct ctl's args_of); NULL if none such. */
static const char *cmd_args(const char *name)
{
	const struct ctl_cmd *c = cmd_named(name);

	return c ? c->args : NULL;
}

static void cmd_help(const struct ctl_cmd *c, FILE *f)
{
	fprintf(f, "usage: ckptctl [--endpoint E] [--json] %s%s%s\n\n", c->name,
	        *c->args ? " " : "", c->args);
	print_folded(f, c->what, 0);
	if (strstr(c->args, "STEP"))
		fprintf(f, "\nSTEP: a step number, or latest (the step LATEST names).\n");
}

/*
 * "--json", "--help" or "-h" anywhere after the command: taken out, noted;
 * up to a "--" (taken out too), after which every word is an argument (a
 * job named "-h").
 */
static void take_flags(int *argc, char **argv, int from, struct ctl *x, bool *help)
{
	for (int k = from; k < *argc; k++) {
		bool json = strcmp(argv[k], "--json") == 0;
		bool h = strcmp(argv[k], "--help") == 0 || strcmp(argv[k], "-h") == 0;

		if (strcmp(argv[k], "--") == 0) {
			memmove(&argv[k], &argv[k + 1], (size_t)(*argc - k) * sizeof(*argv));
			(*argc)--;
			return;
		}
		if (!json && !h)
			continue;
		x->json |= json;
		*help |= h;
		memmove(&argv[k], &argv[k + 1], (size_t)(*argc - k) * sizeof(*argv));
		(*argc)--;
		k--;
	}
}

/*
 * The options before the command (getopt stops at the first word): -1 to go
 * on, or the exit status of one that ends here (--help, --version, a bad
 * option, said).
 */
static int main_options(int argc, char **argv, struct ctl *x, const char **endpoint)
{
	static const struct option lo[] = {
	    {"endpoint", required_argument, NULL, 'e'},
	    {"json", no_argument, NULL, 'j'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, 'V'},
	    {NULL, 0, NULL, 0},
	};
	int opt;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, "+hV", lo, NULL)) != -1) {
		if (opt == 'e')
			*endpoint = optarg;
		else if (opt == 'j')
			x->json = true;
		else if (opt == 'h')
			return ctl_usage(stdout), 0;
		else if (opt == 'V')
			return printf("ckptctl %s (protocol ckpt.v1)\n", CKPT_VERSION), 0;
		else if (optopt == 'e' ||
		         (optind > 0 && strcmp(argv[optind - 1], "--endpoint") == 0))
			return ctl_error(x, EXIT_USAGE, EINVAL,
			                 "--endpoint needs an endpoint (unix:PATH)");
		else
			return ctl_error(x, EXIT_USAGE, EINVAL,
			                 "unknown option '%s' (ckptctl --help lists them)",
			                 argv[optind - 1]);
	}
	return -1;
}

int main(int argc, char **argv)
{
	const struct ctl_cmd *cmd;
	const char *endpoint = NULL;
	struct ctl x = {.args_of = cmd_args};
	bool help = false;
	int rc;

	if ((rc = main_options(argc, argv, &x, &endpoint)) >= 0)
		return rc;
	if (optind >= argc) {
		ctl_usage(stderr);
		return ctl_error(&x, EXIT_USAGE, EINVAL, "no command given");
	}
	if (strcmp(argv[optind], "help") == 0) {
		if (optind + 1 >= argc)
			return ctl_usage(stdout), 0;
		if (!(cmd = cmd_named(argv[optind + 1])))
			return ctl_error(&x, EXIT_USAGE, EINVAL,
			                 "no command '%s' (ckptctl help lists them)",
			                 argv[optind + 1]);
		return cmd_help(cmd, stdout), 0;
	}
	if (!(cmd = cmd_named(argv[optind])))
		return ctl_error(&x, EXIT_USAGE, EINVAL,
		                 "unknown command '%s' (ckptctl help lists them)", argv[optind]);
	take_flags(&argc, argv, optind + 1, &x, &help);
	if (help)
		return cmd_help(cmd, stdout), 0;
	rc = cl_open(endpoint, false, &x.c);
	if (rc)
		return ctl_error(&x, 1, rc, "%s",
		                 *ckpt_last_error(NULL) ? ckpt_last_error(NULL)
		                                        : ckpt_strerror(rc));
	rc = cmd->fn(&x, argc - optind - 1, argv + optind + 1);
	ckpt_disconnect(x.c);
	return rc;
}
