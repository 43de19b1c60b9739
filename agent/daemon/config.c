/*
 * ckptd's settings (config.h): one table of every setting (its key in the
 * file, its flag, its kind, range and default), one parser of values that
 * the file and the flags share, the INI file through inih, the command line
 * through getopt_long, and the --check-config printout. main() calls it once,
 * at start-up, on the main thread.
 *
 * Divisions: the table - values - the file - the command line - loading and
 * printing.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ini.h>

#include "agent/daemon/config.h"
#include "ipc.h"
#include "ipc/base/log.h"

#ifndef CKPTD_VERSION
#define CKPTD_VERSION "0.0.0"
#endif

#define FILE_MAX_BYTES (1u << 20)
#define WHY_LEN 160

/* ---- the table -------------------------------------------------------- */

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

static const char *const sections[] = {"agent",   "storage", "staging", "jobs",   "metrics",
                                       "cluster", "limits",  "s3",      "upload", NULL};

static const struct setting settings[CONFIG_NSETTINGS] = {
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
		return snprintf(why, WHY_LEN, "expected an octal mode in 0..0777"), -EINVAL;
	if (st->kind == K_NUMBER && (*out < st->min || *out > st->max))
		return snprintf(why, WHY_LEN, "expected a whole number in %lld..%lld", st->min,
		                st->max),
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
			return snprintf(why, WHY_LEN, "expected unix:PATH"), -EINVAL;
		return 0;
	case K_HOSTPORT:
		return config_split_hostport(v, host, sizeof(host), &port, why, WHY_LEN);
	case K_NODE: {
		char msg[IPC_ERRLEN];

		if (ipc_check_node(v, msg))
			return snprintf(why, WHY_LEN, "%s", msg), -EINVAL;
		return 0;
	}
	default:
		if (!*v)
			return snprintf(why, WHY_LEN, "expected %s",
			                st->kind == K_GROUP ? "a group name" : "a value"),
			       -EINVAL;
		return 0;
	}
}

/* Checks v against the setting's rules and stores it; -EINVAL with a phrase in why. */
static int set_value(struct config *c, int s, const char *v, char *why)
{
	const struct setting *st = &settings[s];
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
			snprintf(why, WHY_LEN, "expected %s", st->expect);
		break;
	case K_SWITCH: /* "": the --no-... flag; from the file, yes or no */
		rc = 0;
		if (!*v || strcmp(v, "no") == 0 || strcmp(v, "false") == 0 || strcmp(v, "off") == 0)
			n = 0;
		else if (strcmp(v, "yes") == 0 || strcmp(v, "true") == 0 || strcmp(v, "on") == 0)
			n = 1;
		else
			rc = -EINVAL, snprintf(why, WHY_LEN, "expected yes or no");
		break;
	default:
		rc = check_text(st, v, why);
		if (rc)
			break;
		copy = strdup(v);
		if (!copy)
			return snprintf(why, WHY_LEN, "out of memory"), -ENOMEM;
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

/* ---- the file --------------------------------------------------------- */

struct ini_ctx {
	struct config *c;
	const char *path;
	const char *buf; /* the whole file */
	size_t len, pos;
	unsigned line; /* lines handed to inih so far: the one it is on */
	bool after_key; /* a key since the last section header: inih's continuation rule */
	bool indented; /* the line starts with white space */
	unsigned seen[CONFIG_NSETTINGS];
	unsigned err_line; /* the first error's, 0: none */
	char *err;
};

static void ini_error(struct ini_ctx *x, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void ini_error(struct ini_ctx *x, const char *fmt, ...)
{
	char msg[IPC_ERRLEN];
	va_list ap;

	if (x->err_line)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	x->err_line = x->line;
	ipc_errf(x->err, -EINVAL, "%s:%u: %s", x->path, x->line, msg);
}

static bool section_known(const char *name)
{
	for (size_t i = 0; sections[i]; i++)
		if (strcmp(name, sections[i]) == 0)
			return true;
	return false;
}

/* A "[name]" line inih will see as a section header: is it one we know? */
static void check_header(struct ini_ctx *x, const char *line, size_t n)
{
	const char *p = line, *close;
	char name[64];
	size_t len;

	while (p < line + n && isspace((unsigned char)*p))
		p++;
	if (p == line + n || *p != '[' || (p > line && x->after_key))
		return; /* not a header, or an indented line inih takes as a continuation */
	x->after_key = false;
	close = memchr(p, ']', (size_t)(line + n - p));
	if (!close)
		return; /* inih says it is malformed */
	len = (size_t)(close - p - 1);
	snprintf(name, sizeof(name), "%.*s", (int)(len < sizeof(name) ? len : sizeof(name) - 1),
	         p + 1);
	if (!section_known(name))
		ini_error(x,
		          "[%s]: unknown section (known: [agent] [storage] [staging] [jobs] "
		          "[metrics] [cluster] [limits] [s3] [upload])",
		          name);
}

/* inih's line reader, over the file in memory: one whole line per call, counted. */
static char *ini_next_line(char *str, int num, void *stream)
{
	struct ini_ctx *x = stream;
	const char *p = x->buf + x->pos, *nl;
	size_t n, left = x->len - x->pos;

	if (!left || num < 3)
		return NULL;
	nl = memchr(p, '\n', left);
	n = nl ? (size_t)(nl - p) : left;
	x->pos += nl ? n + 1 : n;
	x->line++;
	x->indented = n && isspace((unsigned char)*p);
	if (memchr(p, '\0', n))
		ini_error(x, "a NUL byte: this is not a text file");
	if (n > (size_t)num - 3) {
		ini_error(x, "line longer than %d characters", num - 3);
		n = (size_t)num - 3;
	}
	check_header(x, p, n);
	memcpy(str, p, n);
	str[n] = '\n';
	str[n + 1] = '\0';
	return str;
}

static int setting_by_key(const char *section, const char *key)
{
	for (int s = 0; s < CONFIG_NSETTINGS; s++)
		if (settings[s].key && strcmp(settings[s].section, section) == 0 &&
		    strcmp(settings[s].key, key) == 0)
			return s;
	return -1;
}

static void keys_of(const char *section, char *buf, size_t len)
{
	size_t o = 0;

	buf[0] = '\0';
	for (int s = 0; s < CONFIG_NSETTINGS && o < len; s++)
		if (settings[s].key && strcmp(settings[s].section, section) == 0)
			o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? ", " : "",
			                      settings[s].key);
}

/*
 * A comment after a value: '#' after white space, as inih takes ';' there
 * ("listen = unix:/a.sock  # note" is unix:/a.sock). A '#' inside a word
 * stays. The value without it, in buf (len bytes), or value as it is.
 */
static const char *uncomment(const char *value, char *buf, size_t len)
{
	const char *h;
	size_t n;

	for (h = strchr(value, '#'); h; h = strchr(h + 1, '#'))
		if (h > value && isspace((unsigned char)h[-1]))
			break;
	if (!h)
		return value;
	for (n = (size_t)(h - value); n && isspace((unsigned char)value[n - 1]); n--)
		;
	snprintf(buf, len, "%.*s", (int)n, value);
	return buf;
}

/* inih's handler: one key = value of the line x->line. */
static int ini_on_key(void *user, const char *section, const char *name, const char *value)
{
	struct ini_ctx *x = user;
	char why[WHY_LEN], keys[256], bare[4096];
	int s;

	x->after_key = true;
	if (x->err_line)
		return 1; /* the first error is the one reported */
	if (!*section)
		return ini_error(x, "%s: a key before any [section]", name), 0;
	if (!section_known(section))
		return 1; /* said at its header */
	s = setting_by_key(section, name);
	if (s < 0) {
		keys_of(section, keys, sizeof(keys));
		return ini_error(x, "[%s] %s: unknown key (keys of [%s]: %s)", section, name,
		                 section, keys),
		       0;
	}
	if (x->seen[s] && !x->indented)
		return ini_error(x, "[%s] %s: set twice (first on line %u)", section, name,
		                 x->seen[s]),
		       0;
	if (x->seen[s])
		return ini_error(
		           x, "[%s] %s: an indented line continues its value; a value is one line",
		           section, name),
		       0;
	x->seen[s] = x->line;
	value = uncomment(value, bare, sizeof(bare));
	if (settings[s].kind == K_SWITCH && !*value) /* "" is the flag's: a file says yes or no */
		return ini_error(x, "[%s] %s = '': expected yes or no", section, name), 0;
	if (set_value(x->c, s, value, why))
		return ini_error(x, "[%s] %s = '%.200s': %s", section, name, value, why), 0;
	x->c->from[s] = CONFIG_FILE;
	x->c->line[s] = x->line;
	return 1;
}

/* inih's own complaint about line `line`: which shape it has not. */
static void malformed(struct ini_ctx *x, unsigned line)
{
	const char *p = x->buf, *end = x->buf + x->len, *nl;
	int n;

	for (unsigned i = 1; i < line && p < end; i++) {
		nl = memchr(p, '\n', (size_t)(end - p));
		p = nl ? nl + 1 : end;
	}
	nl = memchr(p, '\n', (size_t)(end - p));
	n = (int)((nl ? nl : end) - p);
	if (n > 0 && p[n - 1] == '\r')
		n--;
	while (n > 0 && isspace((unsigned char)*p))
		p++, n--;
	ipc_errf(x->err, -EINVAL, "%s:%u: '%.*s': %s", x->path, line, n > 200 ? 200 : n, p,
	         *p == '[' ? "a section header without its ']'" : "expected key = value");
}

/*
 * The whole file, up to 1 MiB. Anything readable but a directory will do:
 * `--config /dev/null` runs on defaults and flags alone.
 */
static int read_all(const char *path, char **out, size_t *len, char *err)
{
	const char *why = "larger than 1 MiB";
	struct stat st;
	ssize_t n = 1;
	int fd, rc = -EFBIG;

	*out = NULL;
	*len = 0;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		rc = -errno, why = strerror(errno);
		goto fail;
	}
	if (S_ISDIR(st.st_mode)) {
		rc = -EISDIR, why = "a directory, not a file";
		goto fail;
	}
	*out = malloc(FILE_MAX_BYTES + 1);
	if (!*out) {
		rc = -ENOMEM, why = "out of memory";
		goto fail;
	}
	while (*len <= FILE_MAX_BYTES && n > 0) {
		n = read(fd, *out + *len, FILE_MAX_BYTES + 1 - *len);
		if (n < 0 && errno == EINTR)
			n = 1;
		else if (n < 0) {
			rc = -errno, why = strerror(errno);
			goto fail;
		} else
			*len += (size_t)n;
	}
	if (*len <= FILE_MAX_BYTES) {
		close(fd);
		return 0;
	}
fail:
	free(*out);
	*out = NULL;
	if (fd >= 0)
		close(fd);
	return ipc_errf(err, rc, "%s: cannot read the configuration: %s", path, why);
}

int config_read_file(struct config *c, const char *path, char *err)
{
	struct ini_ctx x = {.c = c, .path = path, .err = err};
	char *buf = NULL, *copy;
	int rc;

	rc = read_all(path, &buf, &x.len, err);
	if (rc)
		return rc;
	x.buf = buf;
	rc = ini_parse_stream(ini_next_line, &x, ini_on_key, &x);
	if (rc > 0 && (!x.err_line || (unsigned)rc < x.err_line)) {
		malformed(&x, (unsigned)rc);
		x.err_line = (unsigned)rc;
	} else if (rc < 0 && !x.err_line) {
		x.err_line = 1;
		ipc_errf(err, -ENOMEM, "%s: parsing failed (inih error %d)", path, rc);
	}
	free(buf);
	if (x.err_line)
		return -EINVAL;
	copy = strdup(path);
	if (!copy)
		return ipc_errf(err, -ENOMEM, "out of memory");
	free(c->path);
	c->path = copy;
	return 0;
}

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
		snprintf(flag, sizeof(flag), "--%s%s%s", settings[s].flag,
		         settings[s].arg ? " " : "", settings[s].arg ? settings[s].arg : "");
		fprintf(f, "  %-22s %s\n", flag, settings[s].help);
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
		o[s] =
		    (struct option){settings[s].flag,
		                    settings[s].kind == K_SWITCH ? no_argument : required_argument,
		                    NULL, OPT_SETTING + s};
	memcpy(o + s, extra, sizeof(extra));
}

/* One option getopt_long returned; 0 or -EINVAL with the message. */
static int take_option(struct config_args *a, int opt, const char *v, struct config *scratch,
                       char **argv, char *err)
{
	char why[WHY_LEN];
	int s = opt - OPT_SETTING;

	if (opt == OPT_COMMIT_TIMEOUT)
		opt = OPT_SETTING + (s = CS_COMMIT_DEADLINE);
	if (opt >= OPT_SETTING && opt < OPT_SETTING + CONFIG_NSETTINGS) {
		if (set_value(scratch, s, v ? v : "", why))
			return ipc_errf(err, -EINVAL, "--%s '%.200s': %s", settings[s].flag, v,
			                why);
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
	char why[WHY_LEN];

	for (int s = 0; s < CONFIG_NSETTINGS; s++) {
		if (!a->value[s])
			continue;
		if (set_value(c, s, a->value[s], why))
			return ipc_errf(err, -EINVAL, "--%s '%.200s': %s", settings[s].flag,
			                a->value[s], why);
		c->from[s] = CONFIG_FLAG;
	}
	return 0;
}

/* ---- loading and printing --------------------------------------------- */

int config_init(struct config *c)
{
	memset(c, 0, sizeof(*c));
	for (int s = 0; s < CONFIG_NSETTINGS; s++) {
		c->num[s] = settings[s].def;
		if (settings[s].def_str && !(c->str[s] = strdup(settings[s].def_str)))
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
static void origin(const struct config *c, int s, char *buf, size_t len)
{
	if (c->from[s] == CONFIG_FILE)
		snprintf(buf, len, "%s:%u", c->path ? c->path : "?", c->line[s]);
	else if (c->from[s] == CONFIG_FLAG)
		snprintf(buf, len, "flag --%s", settings[s].flag);
	else
		snprintf(buf, len, "default");
}

static int resolve_group(struct config *c, enum config_setting cs, long *gid, char *err)
{
	const char *name = c->str[cs];
	struct group gr, *res = NULL;
	char where[PATH_MAX + 32], *buf = NULL, *more;
	size_t len = 4096;
	int rc;

	*gid = -1;
	if (!name)
		return 0;
	do { /* a group with many members needs a bigger buffer: ERANGE */
		more = realloc(buf, len *= 2);
		if (!more) {
			free(buf);
			return ipc_errf(err, -ENOMEM, "out of memory");
		}
		buf = more;
		rc = getgrnam_r(name, &gr, buf, len, &res);
	} while (rc == ERANGE && len < (16u << 20));
	if (rc == 0 && res)
		*gid = (long)res->gr_gid;
	free(buf);
	if (*gid >= 0)
		return 0;
	origin(c, cs, where, sizeof(where));
	if (c->from[cs] == CONFIG_FILE)
		return ipc_errf(err, -ENOENT, "%s: [agent] %s = '%s': %s", where, settings[cs].key,
		                name, rc ? strerror(rc) : "no such group");
	return ipc_errf(err, -ENOENT, "--%s '%s': %s", settings[cs].flag, name,
	                rc ? strerror(rc) : "no such group");
}

/*
 * No node given: the host name, which must then be a valid node name (a
 * host name is, unless it has characters a node name may not).
 */
static int default_node(struct config *c, char *err)
{
	char host[256] = "", msg[IPC_ERRLEN];

	if (c->str[CS_NODE])
		return 0;
	if (gethostname(host, sizeof(host) - 1) < 0)
		return ipc_errf(err, -errno,
		                "no --node given and the host name is unreadable "
		                "(%s): set [cluster] node",
		                strerror(errno));
	if (ipc_check_node(host, msg))
		return ipc_errf(err, -EINVAL,
		                "no --node given and the host name cannot be one (%s): set "
		                "[cluster] node or --node",
		                msg);
	c->str[CS_NODE] = strdup(host);
	return c->str[CS_NODE] ? 0 : ipc_errf(err, -ENOMEM, "out of memory");
}

/* "off", "zstd" (level 1) or "zstd:LEVEL" (1 to 19): *level, 0 for off. */
static int compress_level(const struct config *c, int cs, int *level, char *err)
{
	const char *v = c->str[cs];
	char *end;
	long l;

	*level = 0;
	if (!v || strcmp(v, "off") == 0)
		return 0;
	if (strcmp(v, "zstd") == 0)
		return *level = 1, 0;
	if (strncmp(v, "zstd:", 5) == 0) {
		errno = 0;
		l = strtol(v + 5, &end, 10);
		if (!errno && end != v + 5 && !*end && l >= 1 && l <= 19)
			return *level = (int)l, 0;
	}
	return ipc_errf(err, -EINVAL, "[%s] %s = %s: expected off, zstd or zstd:LEVEL (1 to 19)",
	                settings[cs].section, settings[cs].key, v);
}

/* An s3:// root: where the store is and how to reach it, checked before anything starts. */
static int s3_settings(struct config *c, char *err)
{
	struct agent_config *a = &c->cfg;
	char bucket[64], prefix[256];
	const char *s3root;
	int rc;

	a->s3.endpoint = c->str[CS_S3_ENDPOINT];
	a->s3.region = c->str[CS_S3_REGION];
	a->s3.credentials = c->str[CS_S3_CREDENTIALS];
	a->s3.virtual_host = c->num[CS_S3_ADDRESSING] == 1;
	a->s3.connections = (unsigned)c->num[CS_S3_CONNECTIONS];
	a->s3.max_tries = (unsigned)c->num[CS_S3_MAX_TRIES];
	a->s3.timeout_s = (unsigned)c->num[CS_S3_TIMEOUT];
	a->upload.root = c->str[CS_UPLOAD_ROOT];
	a->upload.keep_last = (unsigned)c->num[CS_UPLOAD_KEEP_LAST];
	a->upload.keep_every = c->num[CS_UPLOAD_KEEP_EVERY];
	a->upload.max_mbps = (uint64_t)c->num[CS_UPLOAD_MAX_MBPS];
	/* [s3] compress: the store's; the tier takes it unless [upload] compress is given */
	if ((rc = compress_level(c, CS_S3_COMPRESS, &a->s3.zstd_level, err)) ||
	    (rc = compress_level(c, CS_UPLOAD_COMPRESS, &a->upload.zstd_level, err)))
		return rc;
	if (c->from[CS_UPLOAD_COMPRESS] == CONFIG_DEFAULT)
		a->upload.zstd_level = a->s3.zstd_level;
	else if (!a->upload.root)
		return ipc_errf(err, -EINVAL,
		                "[upload] compress: there is no upload tier ([upload] "
		                "root)");
	if (a->upload.root && storage_is_s3(a->root))
		return ipc_errf(err, -EINVAL,
		                "[upload] root %s: the root %s is an object store already (the "
		                "upload tier is for a filesystem root)",
		                a->upload.root, a->root);
	if (a->upload.root && !storage_is_s3(a->upload.root))
		return ipc_errf(err, -EINVAL, "[upload] root %s: expected s3://BUCKET[/PREFIX]",
		                a->upload.root);
	s3root = a->upload.root ? a->upload.root : a->root;
	if (!storage_is_s3(s3root))
		return 0;
	rc = s3_root_parse(s3root, bucket, sizeof(bucket), prefix, sizeof(prefix), err);
	if (rc)
		return rc;
	if (!a->s3.endpoint)
		return ipc_errf(err, -EINVAL,
		                "%s: set [s3] endpoint (or --s3-endpoint), e.g. "
		                "https://s3.us-east-1.amazonaws.com",
		                s3root);
	if (!a->s3.credentials)
		return ipc_errf(err, -EINVAL,
		                "%s: set [s3] credentials = FILE (access_key = ... and "
		                "secret_key = ... lines, mode 0600)",
		                s3root);
	if (a->chunk_mb < 5)
		return ipc_errf(err, -EINVAL,
		                "%s: --chunk-mb %llu: each staging chunk is a part of an "
		                "upload, and S3 parts are at least 5 MiB",
		                s3root, (unsigned long long)a->chunk_mb);
	return 0;
}

int config_finish(struct config *c, char *err)
{
	struct agent_config *a = &c->cfg;
	const long long *n = c->num;
	int rc;

	memset(a, 0, sizeof(*a));
	rc = resolve_group(c, CS_SOCKET_GROUP, &a->socket_gid, err);
	if (!rc)
		rc = resolve_group(c, CS_ADMIN_GROUP, &a->admin_gid, err);
	if (!rc)
		rc = default_node(c, err);
	if (rc)
		return rc;
	a->node = c->str[CS_NODE];
	a->listen = c->str[CS_LISTEN];
	a->socket_mode = (unsigned)n[CS_SOCKET_MODE];
	a->socket_group = c->str[CS_SOCKET_GROUP];
	a->log_level = (int)n[CS_LOG_LEVEL];
	a->root = c->str[CS_ROOT];
	a->io_engine = (enum ioeng_kind)n[CS_IO_ENGINE];
	a->queue_depth = (unsigned)n[CS_QUEUE_DEPTH];
	a->staging_mb = (uint64_t)n[CS_STAGING_MB];
	a->backpressure = (int)n[CS_BACKPRESSURE];
	a->keep_last = (unsigned)n[CS_KEEP_LAST];
	a->keep_every = n[CS_KEEP_EVERY];
	a->metrics_listen = c->str[CS_METRICS_LISTEN];
	a->chunk_mb = (uint64_t)n[CS_CHUNK_MB];
	a->capture_threads = (unsigned)n[CS_CAPTURE_THREADS];
	a->copy_threads = (int)n[CS_COPY_THREADS];
	a->commit_deadline_s = (unsigned)n[CS_COMMIT_DEADLINE];
	a->abandon_after_s = (unsigned)n[CS_ABANDON_AFTER];
	a->plans_wait_s = (unsigned)n[CS_PLANS_WAIT];
	a->stop_timeout_s = (unsigned)n[CS_STOP_TIMEOUT];
	/*
	 * A step is abandoned only once no agent can still commit it: every
	 * commit ends by its deadline, counted from files in that step.
	 */
	if (n[CS_ABANDON_AFTER] < 2 * n[CS_COMMIT_DEADLINE])
		return ipc_errf(
		    err, -EINVAL,
		    "abandon_after (%lld s) must be at least twice commit_deadline (%lld "
		    "s): a step may be removed only when no agent can still commit it",
		    n[CS_ABANDON_AFTER], n[CS_COMMIT_DEADLINE]);
	a->direct = n[CS_DIRECT] != 0;
	a->lock_pool = n[CS_LOCK] != 0;
	a->read_once = n[CS_READ_ONCE] != 0;
	a->admin_group = c->str[CS_ADMIN_GROUP];
	a->umask = (unsigned)n[CS_UMASK];
	a->lim.connections = (unsigned)n[CS_LIM_CONNECTIONS];
	a->lim.sessions = (unsigned)n[CS_LIM_SESSIONS];
	a->lim.plans = (unsigned)n[CS_LIM_PLANS];
	a->lim.tensors = (uint64_t)n[CS_LIM_TENSORS];
	a->lim.regions = (unsigned)n[CS_LIM_REGIONS];
	a->lim.region_bytes = (uint64_t)n[CS_LIM_REGION_MB] << 20;
	if (!a->lim.region_bytes) /* the node's memory: more cannot be registered anyway */
		a->lim.region_bytes =
		    (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
	a->lim.watchers = (unsigned)n[CS_LIM_WATCHERS];
	a->lim.watch_bytes = (uint64_t)n[CS_LIM_WATCH_KB] << 10;
	a->config_path = c->path;
	return s3_settings(c, err);
}

int config_load(struct config *c, const struct config_args *a, const char *default_path, char *err)
{
	int rc = 0;

	if (a->config_path)
		rc = config_read_file(c, a->config_path, err);
	else if (default_path) {
		rc = config_read_file(c, default_path, err);
		if (rc == -ENOENT)
			rc = 0; /* no file: the defaults */
	}
	if (!rc)
		rc = config_apply_args(c, a, err);
	if (!rc)
		rc = config_finish(c, err);
	return rc;
}

/* The value of s as the file would say it; false if unset. */
static bool value_text(const struct config *c, int s, char *buf, size_t len)
{
	const struct setting *st = &settings[s];

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

	origin(c, s, from, sizeof(from));
	if (set)
		snprintf(line, sizeof(line), "%s = %s", settings[s].key, val);
	else
		snprintf(line, sizeof(line), "; %s = (not set%s)", settings[s].key,
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
			done = strcmp(settings[k].section, settings[s].section) == 0;
		if (done)
			continue;
		section = settings[s].section;
		fprintf(f, "\n[%s]\n", section);
		for (int k = s; k < CONFIG_NSETTINGS; k++)
			if (strcmp(settings[k].section, section) == 0)
				print_setting(c, k, f);
	}
}

int config_command_line(int argc, char **argv, const char *default_path, struct config *c,
                        FILE *out, FILE *errs)
{
	struct config_args args;
	char err[IPC_ERRLEN];

	memset(c, 0, sizeof(*c));
	if (config_parse_args(argc, argv, &args, err)) {
		fprintf(errs, "ckptd: %s (ckptd --help lists the options)\n", err);
		return 2;
	}
	if (args.action == CONFIG_HELP)
		return config_usage(out), 0;
	if (args.action == CONFIG_VERSION)
		return fprintf(out, "ckptd %s\n", CKPTD_VERSION), 0;
	if (config_init(c))
		return fprintf(errs, "ckptd: out of memory\n"), 1;
	if (config_load(c, &args, default_path, err))
		return fprintf(errs, "ckptd: %s\n", err), 1;
	c->action = args.action;
	if (args.action == CONFIG_CHECK)
		return config_print(c, out), 0;
	return -1;
}
