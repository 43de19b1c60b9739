/*
 * The S3 backend's start-up inputs: the root's URL (s3://BUCKET[/PREFIX])
 * parsed, and the credentials file (access_key, secret_key; mode 0600)
 * read. Called by s3_create (s3.c) and the agent's configuration.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/s3/s3.h"

int s3_root_parse(const char *root, char *bucket, size_t blen, char *prefix, size_t plen, char *err)
{
	const char *b = root + 5, *slash;
	size_t n, p = 0;

	if (strncmp(root, "s3://", 5) != 0)
		return ipc_errf(err, -EINVAL, "%s: expected s3://BUCKET[/PREFIX]", root);
	slash = strchr(b, '/');
	n = slash ? (size_t)(slash - b) : strlen(b);
	if (n < 3 || n > 63 || n >= blen)
		return ipc_errf(err, -EINVAL, "%s: a bucket name has 3 to 63 characters", root);
	for (size_t i = 0; i < n; i++)
		if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '.' ||
		      b[i] == '-'))
			return ipc_errf(err, -EINVAL,
			                "%s: a bucket name is lower-case letters, digits, '.' and "
			                "'-' (byte %zu is 0x%02x)",
			                root, 5 + i, (unsigned char)b[i]);
	memcpy(bucket, b, n);
	bucket[n] = '\0';
	prefix[0] = '\0';
	/* PREFIX: components of [A-Za-z0-9._-], none empty, "." or ".."; a final '/' dropped */
	for (const char *c = slash ? slash + 1 : b + n; *c;) {
		const char *e = strchr(c, '/');
		size_t k = e ? (size_t)(e - c) : strlen(c);

		if (k == 0 || (k == 1 && c[0] == '.') || (k == 2 && c[0] == '.' && c[1] == '.'))
			return ipc_errf(err, -EINVAL,
			                "%s: an empty, '.' or '..' component in the prefix", root);
		for (size_t i = 0; i < k; i++)
			if (!((c[i] >= 'a' && c[i] <= 'z') || (c[i] >= 'A' && c[i] <= 'Z') ||
			      (c[i] >= '0' && c[i] <= '9') || c[i] == '.' || c[i] == '_' ||
			      c[i] == '-'))
				return ipc_errf(err, -EINVAL,
				                "%s: the prefix is made of [A-Za-z0-9._-] and '/' "
				                "(byte %zu is 0x%02x)",
				                root, (size_t)(c - root) + i, (unsigned char)c[i]);
		if (p + k + 2 >= plen)
			return ipc_errf(err, -ENAMETOOLONG, "%s: the prefix is too long", root);
		if (p)
			prefix[p++] = '/';
		memcpy(prefix + p, c, k);
		p += k;
		prefix[p] = '\0';
		c += k + (e ? 1 : 0);
	}
	return 0;
}

/* The lines of a credentials file, read into buf (its keys into access and secret). */
static int parse_credentials(char *buf, const char *path, char *access, char *secret, size_t len,
                             char *err)
{
	char *line, *save = NULL;
	unsigned lineno = 0;

	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *k = line, *eq, *v, *end;

		lineno++;
		while (*k == ' ' || *k == '\t')
			k++;
		if (!*k || *k == '#' || *k == ';' || *k == '[' || *k == '\r')
			continue;
		eq = strchr(k, '=');
		if (!eq)
			return ipc_errf(err, -EINVAL, "credentials %s:%u: expected key = value",
			                path, lineno);
		for (end = eq; end > k && (end[-1] == ' ' || end[-1] == '\t'); end--)
			;
		*end = '\0';
		for (v = eq + 1; *v == ' ' || *v == '\t'; v++)
			;
		for (end = v + strlen(v);
		     end > v && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'); end--)
			;
		*end = '\0';
		if (strlen(v) >= len)
			return ipc_errf(err, -EINVAL, "credentials %s:%u: the value is too long",
			                path, lineno);
		if (!strcmp(k, "access_key") || !strcmp(k, "aws_access_key_id"))
			snprintf(access, len, "%s", v);
		else if (!strcmp(k, "secret_key") || !strcmp(k, "aws_secret_access_key"))
			snprintf(secret, len, "%s", v);
		else
			return ipc_errf(err, -EINVAL,
			                "credentials %s:%u: unknown key '%.32s' (access_key, "
			                "secret_key)",
			                path, lineno, k);
	}
	if (!access[0] || !secret[0])
		return ipc_errf(err, -EINVAL, "credentials %s: needs access_key and secret_key",
		                path);
	return 0;
}

/*
 * The credentials file: "access_key = ..." and "secret_key = ..." lines
 * (aws_access_key_id and aws_secret_access_key too), '#' comments. Refused
 * unless only its owner (this user, or root) may read it. Its values are
 * never put in a message.
 */
int s3_read_credentials(const char *path, char *access, char *secret, size_t len, char *err)
{
	char buf[8192];
	struct stat st;
	ssize_t n;
	int rc, fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);

	access[0] = secret[0] = '\0';
	if (fd < 0)
		return ipc_errf(err, -errno, "credentials %s: %s", path, strerror(errno));
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		close(fd);
		return ipc_errf(err, -EINVAL, "credentials %s: not a regular file", path);
	}
	if (st.st_mode & 0077) {
		close(fd);
		return ipc_errf(err, -EPERM,
		                "credentials %s: mode %04o lets others read it; chmod 600 %s (and "
		                "change the keys if others did)",
		                path, (unsigned)(st.st_mode & 07777), path);
	}
	if (st.st_uid != geteuid() && st.st_uid != 0) {
		close(fd);
		return ipc_errf(err, -EPERM,
		                "credentials %s: owned by uid %u, not by this user (%u)", path,
		                (unsigned)st.st_uid, (unsigned)geteuid());
	}
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0)
		return ipc_errf(err, -EIO, "credentials %s: cannot read it", path);
	if ((size_t)n == sizeof(buf) - 1)
		return ipc_errf(err, -EFBIG, "credentials %s: larger than %zu bytes", path,
		                sizeof(buf) - 2);
	buf[n] = '\0';
	rc = parse_credentials(buf, path, access, secret, len, err);
	/* the keys live in access and secret alone, and only if they are whole */
	explicit_bzero(buf, sizeof(buf));
	if (rc) {
		explicit_bzero(access, len);
		explicit_bzero(secret, len);
	}
	return rc;
}
