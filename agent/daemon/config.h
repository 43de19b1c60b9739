/*
 * ckptd's settings: built-in defaults, then the INI file
 * (/etc/ckptd/ckptd.conf, or --config FILE), then the command-line flags on
 * top, whatever their order on the command line. Every value is checked by
 * the same rules (ranges, names) wherever it comes from, and remembered with
 * where it came from, for `ckptd --check-config`.
 *
 *   [agent]    listen, socket_mode (octal), socket_group, log_level, stop_timeout,
 *              admin_group, umask (octal)
 *   [storage]  root (a directory, or s3://BUCKET[/PREFIX]), io_engine
 *              (auto|io_uring|pwrite), queue_depth
 *   [staging]  size_mb
 *   [jobs]     backpressure (block|skip), keep_last, keep_every
 *   [metrics]  listen (HOST:PORT; absent: no metrics endpoint)
 *   [cluster]  node (default: the host name), commit_deadline, abandon_after
 *   [limits]   per user: connections, sessions, plans, tensors, regions,
 *              region_mb, watchers; watch_buffer_kb per Watch stream
 *   [s3]       endpoint, region, credentials (a file), addressing
 *              (path|virtual), connections, max_tries, timeout: an s3://
 *              root or upload tier
 *   [upload]   root (s3://BUCKET[/PREFIX]), keep_last, keep_every, max_mbps:
 *              the upload tier behind a filesystem root
 *
 * Unknown sections and keys, bad values, keys set twice, malformed lines and
 * an unreadable file are errors naming the file, the line and the key.
 *
 * Pure: no globals of its own (getopt's are reset on each parse), nothing
 * printed except by config_usage and config_print; errors come back as one
 * sentence in `err` (IPC_ERRLEN bytes). Main thread, at start-up.
 */
#ifndef CKPT_AGENT_CONFIG_H
#define CKPT_AGENT_CONFIG_H

#include <stdio.h>

#include "agent/node/node.h"

#define CONFIG_DEFAULT_PATH "/etc/ckptd/ckptd.conf"

/* Every setting: each a key in the file and a flag. */
enum config_setting {
	CS_LISTEN,
	CS_SOCKET_MODE,
	CS_SOCKET_GROUP,
	CS_LOG_LEVEL,
	CS_STOP_TIMEOUT,
	CS_ROOT,
	CS_IO_ENGINE,
	CS_QUEUE_DEPTH,
	CS_STAGING_MB,
	CS_BACKPRESSURE,
	CS_KEEP_LAST,
	CS_KEEP_EVERY,
	CS_METRICS_LISTEN,
	CS_NODE,
	CS_COMMIT_DEADLINE,
	CS_ABANDON_AFTER,
	CS_ADMIN_GROUP,
	CS_UMASK,
	CS_LIM_CONNECTIONS,
	CS_LIM_SESSIONS,
	CS_LIM_PLANS,
	CS_LIM_TENSORS,
	CS_LIM_REGIONS,
	CS_LIM_REGION_MB,
	CS_LIM_WATCHERS,
	CS_LIM_WATCH_KB,
	CS_S3_ENDPOINT,
	CS_S3_REGION,
	CS_S3_CREDENTIALS,
	CS_S3_ADDRESSING,
	CS_S3_CONNECTIONS,
	CS_S3_MAX_TRIES,
	CS_S3_TIMEOUT,
	CS_S3_COMPRESS,
	CS_UPLOAD_ROOT,
	CS_UPLOAD_KEEP_LAST,
	CS_UPLOAD_KEEP_EVERY,
	CS_UPLOAD_MAX_MBPS,
	CS_UPLOAD_COMPRESS,
	/* tuning */
	CS_CHUNK_MB,
	CS_CAPTURE_THREADS,
	CS_COPY_THREADS,
	CS_DIRECT, /* --no-direct */
	CS_LOCK, /* --no-lock */
	CS_READ_ONCE, /* --no-read-once */
	CS_PLANS_WAIT,
	CONFIG_NSETTINGS
};

enum config_from { CONFIG_DEFAULT, CONFIG_FILE, CONFIG_FLAG };

struct config {
	struct agent_config cfg; /* the effective settings, after config_load */
	long long num[CONFIG_NSETTINGS];
	char *str[CONFIG_NSETTINGS]; /* owned; NULL: unset */
	enum config_from from[CONFIG_NSETTINGS];
	unsigned line[CONFIG_NSETTINGS]; /* CONFIG_FILE: its line */
	char *path; /* the file read, or NULL */
	int action; /* enum config_action: what the command line asked */
};

enum config_action { CONFIG_RUN, CONFIG_CHECK, CONFIG_HELP, CONFIG_VERSION };

/* The command line: what to do, and each flag given (the last one of each wins). */
struct config_args {
	enum config_action action;
	const char *config_path; /* --config FILE, or NULL */
	const char *value[CONFIG_NSETTINGS]; /* into argv; "" for a switch; NULL: not given */
};

/* Prints the flags and what they do. */
void config_usage(FILE *f);
/* Parses argv, checking each value; 0, or -EINVAL (bad usage) with the message. */
int config_parse_args(int argc, char **argv, struct config_args *out, char *err);

/* The built-in defaults; 0 or -ENOMEM. Free with config_free (also after a failure). */
int config_init(struct config *c);
void config_free(struct config *c);
/* Reads an INI file on top of c. -ENOENT if it does not exist; any error with the message. */
int config_read_file(struct config *c, const char *path, char *err);
/* The flags given, on top of c. */
int config_apply_args(struct config *c, const struct config_args *a, char *err);
/* Resolves what needs the system (socket_group -> gid) and fills c->cfg. */
int config_finish(struct config *c, char *err);
/*
 * All of it, on a config_init'ed c: the file named by --config, else
 * default_path if it exists (NULL: none), then the flags, then config_finish.
 */
int config_load(struct config *c, const struct config_args *a, const char *default_path, char *err);
/* The effective configuration as an INI file, each value commented with where it came from. */
void config_print(const struct config *c, FILE *f);

/*
 * What main() does first: parses argv, reads the file (--config FILE, else
 * default_path if it exists), applies the flags. Returns -1 when the agent
 * is to run, with c loaded; otherwise the exit status (0, 1 for a bad
 * configuration, 2 for bad usage) after printing what was asked (--help,
 * --version, --check-config) to out, or the error to errs. Either way
 * config_free(c) afterwards.
 */
int config_command_line(int argc, char **argv, const char *default_path, struct config *c,
                        FILE *out, FILE *errs);

/*
 * "HOST:PORT", "[V6ADDR]:PORT": host (without brackets) and port 1..65535;
 * -EINVAL with what is wrong in why (a phrase) otherwise.
 */
int config_split_hostport(const char *s, char *host, size_t hostlen, unsigned *port, char *why,
                          size_t whylen);

#endif /* CKPT_AGENT_CONFIG_H */
