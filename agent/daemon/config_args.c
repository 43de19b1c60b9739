/*
 * ckptd's command line (config.h): the flags through getopt_long, each
 * value checked by the table's rules (config_table.c) and applied on top
 * of the file (config_apply_args, called by config.c); --help's usage,
 * and --check-config's printout of the effective configuration. Main
 * thread, at start-up.
 *
 * Divisions: the command line - --check-config's printout.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/daemon/config.h"
#include "agent/daemon/config_int.h"

#ifndef CKPTD_VERSION
#define CKPTD_VERSION "0.0.0"
#endif

/* ---- the command line ------------------------------------------------- */

enum { OPT_SETTING = 256, OPT_CONFIG = 512, OPT_CHECK, OPT_VERSION, OPT_HELP, OPT_COMMIT_TIMEOUT };

void config_usage(FILE *f)
{
	char flag[48];

	fprintf(f, "usage: ckptd [options]\n"
	           "  --config FILE          the configuration file (default " CONFIG_DEFAULT_PATH
	           " if it exists);\n"
	           "                         flags override it\n"
	           "  --check-config         check the configuration, print it and exit\n");
	for (int s = 0; s < CONFIG_NSETTINGS; s++) {
		snprintf(flag, sizeof(flag), "--%s%s%s", config_settings[s].flag,
		         config_settings[s].arg ? " " : "",
		         config_settings[s].arg ? config_settings[s].arg : "");
		fprintf(f, "  %-22s %s\n", flag, config_settings[s].help);
	}
	fprintf(f, "  --version, --help\n");
}

/* getopt_long's table, from ours. */
static void long_options(struct option *o)
{
	static const struct option extra[] = {
	    {"config", required_argument, NULL, OPT_CONFIG},
	    {"check-config", no_argument, NULL, OPT_CHECK},
	    {"version", no_argument, NULL, OPT_VERSION},
	    {"help", no_argument, NULL, OPT_HELP},
	    /* the single-node name of --commit-deadline, kept for old command lines */
	    {"commit-timeout", required_argument, NULL, OPT_COMMIT_TIMEOUT},
	    {NULL, 0, NULL, 0},
	};
	int s;

	for (s = 0; s < CONFIG_NSETTINGS; s++)
		o[s] = (struct option){config_settings[s].flag,
		                       config_settings[s].kind == K_SWITCH ? no_argument
		                                                           : required_argument,
		                       NULL, OPT_SETTING + s};
	memcpy(o + s, extra, sizeof(extra));
}

/* One option getopt_long returned; 0 or -EINVAL with the message. */
static int take_option(struct config_args *a, int opt, const char *v, struct config *scratch,
                       char **argv, char *err)
{
	char why[CONFIG_WHY_LEN];
	int s = opt - OPT_SETTING;

	if (opt == OPT_COMMIT_TIMEOUT)
		opt = OPT_SETTING + (s = CS_COMMIT_DEADLINE);
	if (opt >= OPT_SETTING && opt < OPT_SETTING + CONFIG_NSETTINGS) {
		if (config_set_value(scratch, s, v ? v : "", why))
			return ipc_errf(err, -EINVAL, "--%s '%.200s': %s", config_settings[s].flag,
			                v, why);
		a->value[s] = v ? v : "";
		return 0;
	}
	switch (opt) {
	case OPT_CONFIG:
		a->config_path = v;
		return 0;
	case OPT_CHECK:
		a->action = a->action == CONFIG_RUN ? CONFIG_CHECK : a->action;
		return 0;
	case OPT_HELP:
		a->action = CONFIG_HELP; /* help wins over anything */
		return 0;
	case OPT_VERSION:
		if (a->action != CONFIG_HELP)
			a->action = CONFIG_VERSION;
		return 0;
	case ':':
		return ipc_errf(err, -EINVAL, "%s needs a value", argv[optind - 1]);
	default:
		if (optopt)
			return ipc_errf(err, -EINVAL, "unknown option '-%c'", optopt);
		return ipc_errf(err, -EINVAL, "unknown option '%s'", argv[optind - 1]);
	}
}

int config_parse_args(int argc, char **argv, struct config_args *out, char *err)
{
	struct option opts[CONFIG_NSETTINGS + 6];
	struct config scratch;
	int opt, rc = 0;

	memset(out, 0, sizeof(*out));
	long_options(opts);
	if (config_init(&scratch)) {
		config_free(&scratch);
		return ipc_errf(err, -ENOMEM, "out of memory");
	}
	optind = 0; /* glibc: start afresh (tests parse several command lines) */
	opterr = 0; /* our messages, not getopt's */
	while (!rc && (opt = getopt_long(argc, argv, ":", opts, NULL)) != -1)
		rc = take_option(out, opt, optarg, &scratch, argv, err);
	if (!rc && optind < argc)
		rc = ipc_errf(err, -EINVAL, "unexpected argument '%s'", argv[optind]);
	config_free(&scratch);
	return rc;
}

int config_apply_args(struct config *c, const struct config_args *a, char *err)
{
	char why[CONFIG_WHY_LEN];

	for (int s = 0; s < CONFIG_NSETTINGS; s++) {
		if (!a->value[s])
			continue;
		if (config_set_value(c, s, a->value[s], why))
			return ipc_errf(err, -EINVAL, "--%s '%.200s': %s", config_settings[s].flag,
			                a->value[s], why);
		c->from[s] = CONFIG_FLAG;
	}
	return 0;
}

/* ---- --check-config's printout ---------------------------------------- */

/* The value of s as the file would say it; false if unset. */
static bool value_text(const struct config *c, int s, char *buf, size_t len)
{
	const struct setting *st = &config_settings[s];

	switch (st->kind) {
	case K_NUMBER:
		if (c->num[s] < st->min)
			return snprintf(buf, len, "auto"), true;
		return snprintf(buf, len, "%lld", c->num[s]), true;
	case K_MODE:
		return snprintf(buf, len, "%04llo", c->num[s]), true;
	case K_SWITCH:
		return snprintf(buf, len, "%s", c->num[s] ? "yes" : "no"), true;
	case K_CHOICE:
		for (size_t i = 0; st->choices[i].name; i++)
			if (st->choices[i].value == c->num[s])
				return snprintf(buf, len, "%s", st->choices[i].name), true;
		return snprintf(buf, len, "?"), true;
	default:
		snprintf(buf, len, "%s", c->str[s] ? c->str[s] : "");
		return c->str[s] != NULL;
	}
}

static void print_setting(const struct config *c, int s, FILE *f)
{
	char val[PATH_MAX], from[PATH_MAX + 32], line[2 * PATH_MAX];
	bool set = value_text(c, s, val, sizeof(val));

	config_origin(c, s, from, sizeof(from));
	if (set)
		snprintf(line, sizeof(line), "%s = %s", config_settings[s].key, val);
	else
		snprintf(line, sizeof(line), "; %s = (not set%s)", config_settings[s].key,
		         s == CS_METRICS_LISTEN ? ": no metrics endpoint"
		         : s == CS_ADMIN_GROUP  ? ": only root manages other users' jobs"
		         : s == CS_SOCKET_GROUP ? ": the socket keeps the agent's group"
		         : s == CS_UPLOAD_ROOT  ? ": no upload tier"
		                                : ": only an s3:// root or upload tier needs it");
	if (s == CS_NODE && c->from[s] == CONFIG_DEFAULT)
		snprintf(from, sizeof(from), "default: the host name");
	if (s == CS_SOCKET_GROUP && set)
		fprintf(f, "%-40s ; %s (gid %ld)\n", line, from, c->cfg.socket_gid);
	else
		fprintf(f, "%-40s ; %s\n", line, from);
}

void config_print(const struct config *c, FILE *f)
{
	const char *section = NULL;

	fprintf(f, "# ckptd: the effective configuration (defaults, then %s, then flags)\n",
	        c->path ? c->path : "no file");
	/* each section once, in the order it first comes, with all its keys */
	for (int s = 0; s < CONFIG_NSETTINGS; s++) {
		bool done = false;

		for (int k = 0; k < s && !done; k++)
			done = strcmp(config_settings[k].section, config_settings[s].section) == 0;
		if (done)
			continue;
		section = config_settings[s].section;
		fprintf(f, "\n[%s]\n", section);
		for (int k = s; k < CONFIG_NSETTINGS; k++)
			if (strcmp(config_settings[k].section, section) == 0)
				print_setting(c, k, f);
	}
}
