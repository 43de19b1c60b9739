/*
 * The XML of S3's replies (s3http.h): InitiateMultipartUploadResult,
 * ListBucketResult, ListMultipartUploadsResult, CompleteMultipartUpload's
 * result and Error. Only what the backend needs: the text of an element by
 * name, and each element of a name in turn. No tree is built and nothing is
 * allocated; every length is bounded by the reply's. A reply is hostile
 * input: markup where text is expected, unclosed elements and unknown
 * entities are errors, never guesses.
 *
 * Any thread; no state.
 */
#include <errno.h>
#include <string.h>

#include "storage/s3/s3http.h"

/*
 * Whether xml[i] opens element `name` ("<name>", "<name ...>", "<name/>"):
 * 1, *body just after its '>' and *empty for "<name/>"; 0 if not. -1 if it
 * would but no '>' follows: no tag ends after i, so nothing more can be
 * found, and the scan stops there (a reply of "<Key <Key ..." is read once,
 * not once per '<').
 */
static int opens(const char *xml, size_t len, size_t i, const char *name, size_t nl, size_t *body,
                 bool *empty)
{
	const char *gt;
	char c;

	if (xml[i] != '<' || len - i < nl + 2 || memcmp(xml + i + 1, name, nl) != 0)
		return 0;
	c = xml[i + 1 + nl];
	if (c != '>' && c != ' ' && c != '/' && c != '\t' && c != '\n' && c != '\r')
		return 0;
	gt = memchr(xml + i + 1 + nl, '>', len - i - 1 - nl);
	if (!gt)
		return -1;
	*empty = gt[-1] == '/';
	*body = (size_t)(gt - xml) + 1;
	return 1;
}

/*
 * The end of the element whose inside starts at `from`: the offset of its
 * "</name>" (elements of the same name nested in it are counted), or -1.
 * A tag of the name is passed over whole, so that each byte is looked at
 * a bounded number of times.
 */
static long closing(const char *xml, size_t len, size_t from, const char *name, size_t nl)
{
	unsigned depth = 0;
	size_t body;
	bool empty;
	int o;

	for (size_t i = from; i < len; i++) {
		if (xml[i] != '<')
			continue;
		if (i + 1 < len && xml[i + 1] == '/' && len - i >= nl + 3 &&
		    memcmp(xml + i + 2, name, nl) == 0 && xml[i + 2 + nl] == '>') {
			if (depth == 0)
				return (long)i;
			depth--;
			continue;
		}
		o = opens(xml, len, i, name, nl, &body, &empty);
		if (o < 0)
			return -1;
		if (o > 0) {
			depth += !empty;
			i = body - 1;
		}
	}
	return -1;
}

int s3xml_each(const char *xml, size_t len, const char *name,
               int (*fn)(void *ctx, const char *in, size_t inlen), void *ctx)
{
	size_t nl = strlen(name), body;
	bool empty;
	int rc;

	for (size_t i = 0; i < len; i++) {
		int o = opens(xml, len, i, name, nl, &body, &empty);

		if (o < 0)
			break;
		if (!o)
			continue;
		if (empty) {
			rc = fn(ctx, xml + body, 0);
		} else {
			long end = closing(xml, len, body, name, nl);

			if (end < 0)
				return -EINVAL;
			rc = fn(ctx, xml + body, (size_t)end - body);
			body = (size_t)end + nl + 3;
		}
		if (rc)
			return rc;
		i = body - 1;
	}
	return 0;
}

/* The five entities XML predefines, and numeric ones of ASCII. */
static int entity(const char *p, size_t n, char *c, size_t *used)
{
	static const struct {
		const char *name;
		char c;
	} named[] = {{"amp;", '&'}, {"lt;", '<'}, {"gt;", '>'}, {"quot;", '"'}, {"apos;", '\''}};
	unsigned v = 0;
	size_t i = 1;

	for (size_t k = 0; k < sizeof(named) / sizeof(named[0]); k++) {
		size_t l = strlen(named[k].name);

		if (n >= l && memcmp(p, named[k].name, l) == 0) {
			*c = named[k].c;
			*used = l;
			return 0;
		}
	}
	if (n < 3 || p[0] != '#')
		return -EINVAL;
	for (; i < n && i < 5 && p[i] >= '0' && p[i] <= '9'; i++)
		v = v * 10 + (unsigned)(p[i] - '0');
	if (i == 1 || i >= n || p[i] != ';' || v == 0 || v > 127)
		return -EINVAL;
	*c = (char)v;
	*used = i + 1;
	return 0;
}

struct text_ctx {
	char *out;
	size_t outlen;
	int rc;
};

static int take_text(void *ctx, const char *in, size_t n)
{
	struct text_ctx *t = ctx;
	size_t o = 0, used;
	char c;

	for (size_t i = 0; i < n; i++) {
		if (in[i] == '<' || in[i] == '\0')
			return t->rc = -EINVAL, 1;
		if (in[i] == '&') {
			if (entity(in + i + 1, n - i - 1, &c, &used))
				return t->rc = -EINVAL, 1;
			i += used;
		} else {
			c = in[i];
		}
		if (o + 1 >= t->outlen)
			return t->rc = -ENAMETOOLONG, 1;
		t->out[o++] = c;
	}
	t->out[o] = '\0';
	return t->rc = 0, 1;
}

int s3xml_text(const char *xml, size_t len, const char *name, char *out, size_t outlen)
{
	struct text_ctx t = {out, outlen, -ENOENT};
	int rc;

	if (!outlen)
		return -ENAMETOOLONG;
	out[0] = '\0';
	rc = s3xml_each(xml, len, name, take_text, &t);
	if (rc < 0)
		return rc;
	if (t.rc)
		out[0] = '\0';
	return t.rc;
}
