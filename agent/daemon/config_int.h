/*
 * agent/daemon/config_int.h: the settings' insides, shared by the three
 * files of config.h and by nothing else:
 *   config.c       the table, the values, the defaults and the loading;
 *   config_file.c  the INI file (inih);
 *   config_args.c  the flags (getopt_long), --help and --check-config.
 *
 * Main thread, at start-up; the table is constant.
 */
#ifndef CKPT_AGENT_CONFIG_INT_H
#define CKPT_AGENT_CONFIG_INT_H

#include <stddef.h>

#include "agent/daemon/config.h"

#define CONFIG_WHY_LEN 160 /* a value's complaint, a phrase */

enum kind {
	K_TEXT, /* any non-empty string */
	K_LISTEN, /* unix:PATH */
	K_HOSTPORT, /* HOST:PORT */
	K_GROUP, /* a group name (resolved by config_finish) */
	K_NODE, /* a node name, [A-Za-z0-9._-]{1,64} (unset: the host name) */
	K_NUMBER, /* a whole number in min..max */
	K_MODE, /* an octal mode, 0..0777 */
	K_CHOICE, /* one of choices[] */
	K_SWITCH, /* a flag without a value: turns the setting off */
};

struct choice {
	const char *name;
	int value;
};

struct setting {
	const char *section, *key; /* its [section] and key in the file */
	const char *flag; /* without the leading "--" */
	const char *arg; /* the flag's value, for the usage */
	const char *help;
	enum kind kind;
	long long min, max; /* K_NUMBER */
	const struct choice *choices; /* K_CHOICE, and what they are in words: */
	const char *expect;
	long long def;
	const char *def_str;
};

/* Every setting, by enum config_setting. */
extern const struct setting config_settings[CONFIG_NSETTINGS];
/* The file's sections, NULL-terminated. */
extern const char *const config_sections[];

/* Checks v against setting s's rules and stores it; -EINVAL with a phrase in why. */
int config_set_value(struct config *c, int s, const char *v, char *why);
/* Where setting s came from: "default", "FILE:LINE" or "flag --x". */
void config_origin(const struct config *c, int s, char *buf, size_t len);

#endif /* CKPT_AGENT_CONFIG_INT_H */
