/*
 * ckptd's configuration file (config.h): an INI file read through inih on
 * top of the defaults, every value checked by the table's rules
 * (config.c); unknown sections and keys, keys set twice, malformed lines
 * and an unreadable file are errors naming the file and the line. Main
 * thread, at start-up.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ini.h>

#include "agent/daemon/config.h"
#include "agent/daemon/config_int.h"

#define FILE_MAX_BYTES (1u << 20)

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
	for (size_t i = 0; config_sections[i]; i++)
		if (strcmp(name, config_sections[i]) == 0)
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
		if (config_settings[s].key && strcmp(config_settings[s].section, section) == 0 &&
		    strcmp(config_settings[s].key, key) == 0)
			return s;
	return -1;
}

static void keys_of(const char *section, char *buf, size_t len)
{
	size_t o = 0;

	buf[0] = '\0';
	for (int s = 0; s < CONFIG_NSETTINGS && o < len; s++)
		if (config_settings[s].key && strcmp(config_settings[s].section, section) == 0)
			o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? ", " : "",
			                      config_settings[s].key);
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
	char why[CONFIG_WHY_LEN], keys[256], bare[4096];
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
	if (config_settings[s].kind == K_SWITCH &&
	    !*value) /* "" is the flag's: a file says yes or no */
		return ini_error(x, "[%s] %s = '': expected yes or no", section, name), 0;
	if (config_set_value(x->c, s, value, why))
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
