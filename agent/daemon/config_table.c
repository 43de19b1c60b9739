/*
 * ckptd's settings, one by one (config_int.h): the table of every setting
 * (its key in the file, its flag, its kind, range and default), the one
 * parser of values that the file (config_file.c) and the flags
 * (config_args.c) share, and a configuration made, freed and asked where
 * a value came from. Under the three that read and load: it calls none of
 * them. The main thread, at start-up.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "agent/daemon/config.h"
#include "agent/daemon/config_int.h"
#include "ipc/ipc.h"
#include "ipc/base/log.h"

/* ---- the table -------------------------------------------------------- */

static const struct choice levels[] = {
    {"error", LOG_ERR}, {"warning", LOG_WARNING}, {"notice", LOG_NOTICE},
    {"info", LOG_INFO}, {"debug", LOG_DEBUG},     {NULL, 0},
};
static const struct choice engines[] = {
    {"auto", IOENG_AUTO}, {"io_uring", IOENG_URING}, {"pwrite", IOENG_PWRITE}, {NULL, 0}};
static const struct choice policies[] = {
    {"block", BACKPRESSURE_BLOCK},
    {"skip", BACKPRESSURE_SKIP},
    {NULL, 0},
};

static const struct choice addressing[] = {{"path", 0}, {"virtual", 1}, {NULL, 0}};

const char *const config_sections[] = {"agent",   "storage", "staging", "jobs",   "metrics",
                                       "cluster", "limits",  "s3",      "upload", NULL};

const struct setting config_settings[CONFIG_NSETTINGS] = {
    [CS_LISTEN] = {"agent", "listen", "listen", "unix:PATH",
                   "the socket (default " IPC_DEFAULT_ENDPOINT ")", K_LISTEN,
                   .def_str = IPC_DEFAULT_ENDPOINT},
    [CS_SOCKET_MODE] = {"agent", "socket_mode", "socket-mode", "MODE",
                        "octal mode of the socket (default 0660)", K_MODE, .def = 0660},
    [CS_SOCKET_GROUP] = {"agent", "socket_group", "socket-group", "GROUP",
                         "group of the socket: the trainers' (default: the agent's)", K_GROUP},
    [CS_LOG_LEVEL] = {"agent", "log_level", "log-level", "L",
                      "error, warning, notice, info or debug (default info)", K_CHOICE,
                      .choices = levels, "error, warning, notice, info or debug", .def = LOG_INFO},
    [CS_STOP_TIMEOUT] = {"agent", "stop_timeout", "stop-timeout", "S",
                         "at stop, saves in flight get S seconds to finish, then FAIL (default "
                         "0: as long as they take)",
                         K_NUMBER, 0, 86400 * 7, .def = 0},
    [CS_ROOT] = {"storage", "root", "root", "DIR",
                 "where checkpoints live: a directory or s3://BUCKET[/PREFIX] (default "
                 "/var/lib/ckptd)",
                 K_TEXT, .def_str = "/var/lib/ckptd"},
    [CS_IO_ENGINE] = {"storage", "io_engine", "io-engine", "E",
                      "auto, io_uring or pwrite (default auto)", K_CHOICE, .choices = engines,
                      "auto, io_uring or pwrite", .def = IOENG_AUTO},
    [CS_QUEUE_DEPTH] = {"storage", "queue_depth", "queue-depth", "N",
                        "writes in flight (default 8)", K_NUMBER, 1, 256, .def = 8},
    [CS_STAGING_MB] = {"staging", "size_mb", "staging-mb", "N",
                       "staging pool size in MiB (default 1024)", K_NUMBER, 16, 1 << 22,
                       .def = 1024},
    [CS_BACKPRESSURE] = {"jobs", "backpressure", "backpressure", "P",
                         "block or skip when the pool is full (default block)", K_CHOICE,
                         .choices = policies, "block or skip", .def = BACKPRESSURE_BLOCK},
    [CS_KEEP_LAST] = {"jobs", "keep_last", "keep-last", "K",
                      "keep the last K committed checkpoints of a job (0: all)", K_NUMBER, 0,
                      1000000},
    [CS_KEEP_EVERY] = {"jobs", "keep_every", "keep-every", "M",
                       "and every one whose step is a multiple of M (0: none)", K_NUMBER, 0,
                       IPC_MAX_STEP},
    [CS_METRICS_LISTEN] = {"metrics", "listen", "metrics-listen", "HOST:PORT",
                           "Prometheus /metrics there (default: none)", K_HOSTPORT},
    [CS_NODE] = {"cluster", "node", "node", "NAME",
                 "this node's name, the same on no two nodes of a job (default: the host "
                 "name)",
                 K_NODE},
    [CS_COMMIT_DEADLINE] = {"cluster", "commit_deadline", "commit-deadline", "S",
                            "a step whose ranks or nodes are not all in after S seconds fails "
                            "(default 600)",
                            K_NUMBER, 1, 86400 * 7, .def = 600},
    [CS_PLANS_WAIT] = {"cluster", "plans_wait", "plans-wait", "S",
                       "a run's first save waits up to S seconds for every rank's plan, so "
                       "that replicas are written once (default 5, at most 30 and half of "
                       "commit_deadline; 0: no wait)",
                       K_NUMBER, 0, 30, .def = 5},
    [CS_ABANDON_AFTER] = {"cluster", "abandon_after", "abandon-after", "S",
                          "uncommitted steps older than LATEST and S seconds are removed "
                          "(default 3600)",
                          K_NUMBER, 0, 86400 * 365, .def = 3600},
    [CS_ADMIN_GROUP] = {"agent", "admin_group", "admin-group", "GROUP",
                        "operators' group: they see, verify, delete and pin every job "
                        "(default: none; root always may)",
                        K_GROUP},
    [CS_UMASK] = {"agent", "umask", "umask", "MASK",
                  "masks the modes of checkpoint files and directories (default 027: "
                  "0640/0750)",
                  K_MODE, .def = 027},
    [CS_LIM_CONNECTIONS] = {"limits", "connections_per_user", "max-connections", "N",
                            "clients connected at once, per user (default 128)", K_NUMBER, 1, 4096,
                            .def = 128},
    [CS_LIM_SESSIONS] = {"limits", "sessions_per_user", "max-sessions", "N",
                         "trainer sessions per user (default 64)", K_NUMBER, 1, 4096, .def = 64},
    [CS_LIM_PLANS] = {"limits", "plans_per_user", "max-plans", "N", "plans per user (default 256)",
                      K_NUMBER, 1, 65536, .def = 256},
    [CS_LIM_TENSORS] = {"limits", "tensors_per_user", "max-tensors", "N",
                        "tensors in all of a user's plans (default 262144)", K_NUMBER, 1, 1 << 24,
                        .def = 262144},
    [CS_LIM_REGIONS] = {"limits", "regions_per_user", "max-regions", "N",
                        "host regions per user (default 1024)", K_NUMBER, 1, 1 << 20, .def = 1024},
    [CS_LIM_REGION_MB] = {"limits", "region_mb_per_user", "max-region-mb", "N",
                          "MiB of host regions per user (default 0: the node's memory)", K_NUMBER,
                          0, 1ll << 32},
    [CS_LIM_WATCHERS] = {"limits", "watchers_per_user", "max-watchers", "N",
                         "Watch streams per user (default 16)", K_NUMBER, 1, 4096, .def = 16},
    [CS_LIM_WATCH_KB] = {"limits", "watch_buffer_kb", "watch-buffer-kb", "N",
                         "KiB queued for a Watch stream before it is cut (default 256)", K_NUMBER,
                         4, 1 << 20, .def = 256},
    [CS_S3_ENDPOINT] = {"s3", "endpoint", "s3-endpoint", "URL",
                        "the object store: http://HOST:PORT or https://HOST (an s3:// root)",
                        K_TEXT},
    [CS_S3_REGION] = {"s3", "region", "s3-region", "R",
                      "the region requests are signed for (default us-east-1)", K_TEXT,
                      .def_str = "us-east-1"},
    [CS_S3_CREDENTIALS] = {"s3", "credentials", "s3-credentials", "FILE",
                           "access_key = ... and secret_key = ... lines, mode 0600", K_TEXT},
    [CS_S3_ADDRESSING] = {"s3", "addressing", "s3-addressing", "A",
                          "path (HOST/BUCKET/KEY) or virtual (BUCKET.HOST/KEY) (default path)",
                          K_CHOICE, .choices = addressing, "path or virtual", .def = 0},
    [CS_S3_CONNECTIONS] = {"s3", "connections", "s3-connections", "N",
                           "requests in flight to the store (default 16)", K_NUMBER, 1, 256,
                           .def = 16},
    [CS_S3_MAX_TRIES] = {"s3", "max_tries", "s3-max-tries", "N",
                         "tries of a request the store answers 5xx/429 or that times out "
                         "(default 8)",
                         K_NUMBER, 1, 100, .def = 8},
    [CS_S3_TIMEOUT] = {"s3", "timeout", "s3-timeout", "S",
                       "a request moving no byte for S seconds is tried again (default 60)",
                       K_NUMBER, 1, 3600, .def = 60},
    [CS_S3_COMPRESS] = {"s3", "compress", "s3-compress", "C",
                        "shards on the store: off, or zstd[:LEVEL], one frame per chunk "
                        "(default off)",
                        K_TEXT, .def_str = "off"},
    [CS_UPLOAD_ROOT] = {"upload", "root", "upload-root", "s3://BUCKET[/PREFIX]",
                        "copy each committed checkpoint there (the upload tier; default: none)",
                        K_TEXT},
    [CS_UPLOAD_KEEP_LAST] = {"upload", "keep_last", "upload-keep-last", "K",
                             "the upload tier keeps the last K checkpoints of a job (0: all)",
                             K_NUMBER, 0, 1000000},
    [CS_UPLOAD_KEEP_EVERY] = {"upload", "keep_every", "upload-keep-every", "M",
                              "and every one whose step is a multiple of M (0: none)", K_NUMBER, 0,
                              IPC_MAX_STEP},
    [CS_UPLOAD_MAX_MBPS] = {"upload", "max_mbps", "upload-max-mbps", "N",
                            "uploads send at most N megabits per second (default 0: no limit)",
                            K_NUMBER, 0, 1000000000},
    [CS_UPLOAD_COMPRESS] = {"upload", "compress", "upload-compress", "C",
                            "the upload tier's shards, if not as [s3] compress: off, or "
                            "zstd[:LEVEL] (default: [s3] compress)",
                            K_TEXT, .def_str = "off"},
    [CS_CHUNK_MB] = {"staging", "chunk_mb", "chunk-mb", "N",
                     "staging chunk (and write) size in MiB (default 8)", K_NUMBER, 1, 1024,
                     .def = 8},
    [CS_CAPTURE_THREADS] = {"agent", "capture_threads", "capture-threads", "N",
                            "copy workers: saves and restores copied at once (default 2)", K_NUMBER,
                            1, 64, .def = 2},
    [CS_COPY_THREADS] = {"agent", "copy_threads", "copy-threads", "N",
                         "helpers joining each copy, or auto (default auto: CPUs - 1; on a "
                         "training node leave the trainers their cores)",
                         K_NUMBER, 0, 64, .def = -1},
    [CS_DIRECT] = {"storage", "direct", "no-direct", NULL,
                   "buffered writes instead of O_DIRECT (key: direct = yes or no, default yes)",
                   K_SWITCH, .def = 1},
    [CS_LOCK] = {"staging", "lock", "no-lock", NULL,
                 "do not mlock the staging pool (key: lock = yes or no, default yes)", K_SWITCH,
                 .def = 1},
    [CS_READ_ONCE] = {"storage", "read_once", "no-read-once", NULL,
                      "ranks of this node restoring one step together each read alone (key: "
                      "read_once = yes or no, default yes)",
                      K_SWITCH, .def = 1},
};

/* ---- values ----------------------------------------------------------- */

static int parse_number(const struct setting *st, const char *v, long long *out, char *why)
{
	char *end;

	errno = 0;
	*out = strtoll(v, &end, st->kind == K_MODE ? 8 : 10);
	if (errno || end == v || *end || isspace((unsigned char)*v))
		*out = LLONG_MIN; /* out of any range */
	if (st->kind == K_MODE && (*out < 0 || *out > 0777))
		return snprintf(why, CONFIG_WHY_LEN, "expected an octal mode in 0..0777"), -EINVAL;
	if (st->kind == K_NUMBER && (*out < st->min || *out > st->max))
		return snprintf(why, CONFIG_WHY_LEN, "expected a whole number in %lld..%lld",
		                st->min, st->max),
		       -EINVAL;
	return 0;
}

static int check_text(const struct setting *st, const char *v, char *why)
{
	char host[256];
	unsigned port;

	switch (st->kind) {
	case K_LISTEN:
		if (strncmp(v, "unix:", 5) != 0 || !v[5])
			return snprintf(why, CONFIG_WHY_LEN, "expected unix:PATH"), -EINVAL;
		return 0;
	case K_HOSTPORT:
		return config_split_hostport(v, host, sizeof(host), &port, why, CONFIG_WHY_LEN);
	case K_NODE: {
		char msg[IPC_ERRLEN];

		if (ipc_check_node(v, msg))
			return snprintf(why, CONFIG_WHY_LEN, "%s", msg), -EINVAL;
		return 0;
	}
	default:
		if (!*v)
			return snprintf(why, CONFIG_WHY_LEN, "expected %s",
			                st->kind == K_GROUP ? "a group name" : "a value"),
			       -EINVAL;
		return 0;
	}
}

/* Checks v against the setting's rules and stores it; -EINVAL with a phrase in why. */
int config_set_value(struct config *c, int s, const char *v, char *why)
{
	const struct setting *st = &config_settings[s];
	long long n = 0;
	char *copy;
	int rc;

	switch (st->kind) {
	case K_NUMBER:
		if (strcmp(v, "auto") == 0 && st->def < st->min) { /* its default: worked out */
			n = st->def, rc = 0;
			break;
		}
		rc = parse_number(st, v, &n, why);
		break;
	case K_MODE:
		rc = parse_number(st, v, &n, why);
		break;
	case K_CHOICE:
		rc = -EINVAL;
		for (size_t i = 0; st->choices[i].name; i++)
			if (strcmp(v, st->choices[i].name) == 0)
				n = st->choices[i].value, rc = 0;
		if (rc)
			snprintf(why, CONFIG_WHY_LEN, "expected %s", st->expect);
		break;
	case K_SWITCH: /* "": the --no-... flag; from the file, yes or no */
		rc = 0;
		if (!*v || strcmp(v, "no") == 0 || strcmp(v, "false") == 0 || strcmp(v, "off") == 0)
			n = 0;
		else if (strcmp(v, "yes") == 0 || strcmp(v, "true") == 0 || strcmp(v, "on") == 0)
			n = 1;
		else
			rc = -EINVAL, snprintf(why, CONFIG_WHY_LEN, "expected yes or no");
		break;
	default:
		rc = check_text(st, v, why);
		if (rc)
			break;
		copy = strdup(v);
		if (!copy)
			return snprintf(why, CONFIG_WHY_LEN, "out of memory"), -ENOMEM;
		free(c->str[s]);
		c->str[s] = copy;
		return 0;
	}
	if (!rc)
		c->num[s] = n;
	return rc;
}

int config_split_hostport(const char *s, char *host, size_t hostlen, unsigned *port, char *why,
                          size_t whylen)
{
	const char *colon, *h = s;
	size_t hl;
	char *end;
	long p;

	if (*s == '[') {
		colon = strchr(s, ']');
		if (!colon || colon[1] != ':')
			return snprintf(why, whylen, "expected [IPV6]:PORT"), -EINVAL;
		h = s + 1;
		hl = (size_t)(colon - h);
		colon++;
	} else {
		colon = strrchr(s, ':');
		if (colon && memchr(s, ':', (size_t)(colon - s)))
			return snprintf(why, whylen,
			                "an IPv6 address goes in brackets: [ADDR]:PORT"),
			       -EINVAL;
		hl = colon ? (size_t)(colon - s) : 0;
	}
	if (!colon || hl == 0 || hl >= hostlen)
		return snprintf(why, whylen, "expected HOST:PORT, e.g. 127.0.0.1:9464"), -EINVAL;
	errno = 0;
	p = strtol(colon + 1, &end, 10);
	if (errno || end == colon + 1 || *end || !isdigit((unsigned char)colon[1]) || p < 1 ||
	    p > 65535)
		return snprintf(why, whylen, "expected a port in 1..65535 after the last ':'"),
		       -EINVAL;
	memcpy(host, h, hl);
	host[hl] = '\0';
	*port = (unsigned)p;
	return 0;
}

/* ---- defaults, and loading ------------------------------------------- */

int config_init(struct config *c)
{
	memset(c, 0, sizeof(*c));
	for (int s = 0; s < CONFIG_NSETTINGS; s++) {
		c->num[s] = config_settings[s].def;
		if (config_settings[s].def_str && !(c->str[s] = strdup(config_settings[s].def_str)))
			return -ENOMEM;
	}
	return 0;
}

void config_free(struct config *c)
{
	for (int s = 0; s < CONFIG_NSETTINGS; s++)
		free(c->str[s]);
	free(c->path);
	memset(c, 0, sizeof(*c));
}

/* Where setting s came from: "default", "FILE:LINE" or "flag --x". */
void config_origin(const struct config *c, int s, char *buf, size_t len)
{
	if (c->from[s] == CONFIG_FILE)
		snprintf(buf, len, "%s:%u", c->path ? c->path : "?", c->line[s]);
	else if (c->from[s] == CONFIG_FLAG)
		snprintf(buf, len, "flag --%s", config_settings[s].flag);
	else
		snprintf(buf, len, "default");
}
