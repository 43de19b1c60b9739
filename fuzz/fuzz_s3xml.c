/*
 * fuzz_s3xml: storage/s3/s3xml.c, the reader of the XML an S3 store answers,
 * on any bytes, as s3http.c and s3_scan.c call it: an error's Code and
 * Message, an upload's UploadId, a listing's IsTruncated and tokens, each
 * Contents, CommonPrefixes and Upload of a listing with the texts read
 * inside it (the nested calls), and CompleteMultipartUpload's result.
 *
 * The input is copied into a buffer of its exact size (no NUL after it), so
 * that a read past the reply's end is caught. What the reader gives must
 * hold: each element's inside lies within the reply and in order; a text
 * is NUL-terminated, shorter than its buffer, the same read into a buffer
 * just large enough, and refused by one a byte shorter; the codes are those
 * s3http.h promises.
 */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "fuzz/fuzz.h"
#include "storage/s3/s3http.h"

#define TEXT_MAX 1024

static void check_code(int rc, const char *what)
{
	FUZZ_CHECK(rc == 0 || rc == -ENOENT || rc == -ENAMETOOLONG || rc == -EINVAL,
	           "%s: %d is not a code s3xml_text returns", what, rc);
}

/* s3xml_text of `name` in [xml, xml + len), with what must hold of the text. */
static int text(const char *xml, size_t len, const char *name, char *out, size_t outlen)
{
	int rc = s3xml_text(xml, len, name, out, outlen);
	char *again;
	size_t n;

	check_code(rc, name);
	if (rc) {
		FUZZ_CHECK(out[0] == '\0', "%s: refused (%d), yet the text is '%.32s'", name, rc,
		           out);
		return rc;
	}
	n = strnlen(out, outlen);
	FUZZ_CHECK(n < outlen, "%s: the text is not NUL-terminated", name);
	/* just large enough: the same; a byte short: too long */
	again = malloc(n + 1);
	FUZZ_CHECK(again, "out of memory");
	rc = s3xml_text(xml, len, name, again, n + 1);
	FUZZ_CHECK(rc == 0 && strcmp(again, out) == 0,
	           "%s: %zu bytes fit, yet a buffer of %zu gives %d '%.64s'", name, n, n + 1, rc,
	           again);
	if (n) {
		rc = s3xml_text(xml, len, name, again, n);
		FUZZ_CHECK(rc == -ENAMETOOLONG, "%s: %zu bytes into a buffer of %zu: %d", name, n,
		           n, rc);
	}
	free(again);
	return 0;
}

struct walk {
	const char *xml;
	size_t len;
	const char *last; /* where the inside of the element before ended */
	unsigned seen, stop_at;
	const char *const *names; /* read inside each element, NULL-ended */
};

static int inside(void *ctx, const char *in, size_t inlen)
{
	struct walk *w = ctx;
	char out[TEXT_MAX];

	FUZZ_CHECK(in >= w->xml && inlen <= w->len && in + inlen <= w->xml + w->len,
	           "an element's inside [%td, +%zu) is not in the reply of %zu bytes", in - w->xml,
	           inlen, w->len);
	FUZZ_CHECK(in >= w->last, "an element's inside starts before the last one ended");
	w->last = in + inlen;
	for (const char *const *n = w->names; *n; n++)
		text(in, inlen, *n, out, sizeof(out));
	/* a callback that says stop: its value comes back */
	return ++w->seen == w->stop_at ? 7 : 0;
}

static void each(const char *xml, size_t len, const char *name, const char *const *names,
                 unsigned stop_at)
{
	struct walk w = {xml, len, xml, 0, stop_at, names};
	int rc = s3xml_each(xml, len, name, inside, &w);

	FUZZ_CHECK(rc == 0 || rc == -EINVAL || (rc == 7 && w.seen == stop_at),
	           "s3xml_each %s: %d after %u elements", name, rc, w.seen);
	FUZZ_CHECK(rc != 7 || stop_at, "s3xml_each %s: stopped, yet no callback said so", name);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const none[] = {NULL};
	static const char *const contents[] = {"Key", "Size", "LastModified", "ETag", NULL};
	static const char *const prefixes[] = {"Prefix", NULL};
	static const char *const upload[] = {"Key", "UploadId", "Initiated", NULL};
	static const char *const top[] = {"Code",
	                                  "Message",
	                                  "UploadId",
	                                  "IsTruncated",
	                                  "NextContinuationToken",
	                                  "NextKeyMarker",
	                                  "NextUploadIdMarker",
	                                  "Key",
	                                  "ETag",
	                                  NULL};
	char *xml = malloc(size ? size : 1), out[TEXT_MAX];
	unsigned stop_at;

	FUZZ_CHECK(xml, "out of memory");
	memcpy(xml, data, size);
	for (const char *const *n = top; *n; n++)
		text(xml, size, *n, out, sizeof(out));
	/* a tiny buffer: every length check on its edge */
	text(xml, size, "Key", out, 2);
	text(xml, size, "Code", out, 1);
	stop_at = size ? (unsigned)data[0] % 4 : 0;
	each(xml, size, "Contents", contents, stop_at);
	each(xml, size, "CommonPrefixes", prefixes, stop_at);
	each(xml, size, "Upload", upload, stop_at);
	each(xml, size, "Part", none, 0);
	free(xml);
	return 0;
}
