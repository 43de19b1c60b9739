/*
 * Unit tests of storage/s3/s3xml.c, the reader of S3's XML replies: the shapes
 * real stores send (InitiateMultipartUploadResult, ListBucketResult with
 * Contents and CommonPrefixes, ListMultipartUploadsResult, Error), read the
 * way s3http.c and s3_scan.c read them; entities; a name that begins
 * another (<Key>, <KeyMarker>); self-closing, unclosed and nested
 * elements; texts too long for their buffer; markup inside a text; and
 * replies that end before they should (each reply is copied into a buffer
 * of its exact size, so a sanitizer build sees any read past its end).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <check.h>

#include "storage/s3/s3http.h"
#include "support/check_main.h"

/* The reply in a buffer of its exact size: no NUL after it to hide an over-read. */
static char *reply(const char *s, size_t *len)
{
	char *b;

	*len = strlen(s);
	b = malloc(*len ? *len : 1);
	ck_assert(b);
	memcpy(b, s, *len);
	return b;
}

/* s3xml_text of name in s: its code, the text into out. */
static int text_of(const char *s, const char *name, char *out, size_t outlen)
{
	size_t len;
	char *x = reply(s, &len);
	int rc = s3xml_text(x, len, name, out, outlen);

	free(x);
	return rc;
}

#define TEXT_IS(s, name, want)                                                                     \
	do {                                                                                       \
		char out_[S3_KEY_MAX];                                                             \
		int rc_ = text_of(s, name, out_, sizeof(out_));                                    \
		ck_assert_msg(rc_ == 0, "<%s>: %d", name, rc_);                                    \
		ck_assert_str_eq(out_, want);                                                      \
	} while (0)

#define TEXT_FAILS(s, name, code)                                                                  \
	do {                                                                                       \
		char out_[S3_KEY_MAX] = "junk";                                                    \
		int rc_ = text_of(s, name, out_, sizeof(out_));                                    \
		ck_assert_msg(rc_ == (code), "<%s> of '%s': %d, want %d", name, s, rc_, code);     \
		ck_assert_msg(out_[0] == '\0', "<%s> refused, yet it left '%s'", name, out_);      \
	} while (0)

/* What s3xml_each gave: each element's inside, as text, and how many. */
struct seen {
	char in[16][256];
	unsigned n, stop_at;
	int ret;
};

static int collect(void *ctx, const char *in, size_t inlen)
{
	struct seen *s = ctx;

	ck_assert_uint_lt(s->n, 16);
	ck_assert_uint_lt(inlen, sizeof(s->in[0]));
	memcpy(s->in[s->n], in, inlen);
	s->in[s->n][inlen] = '\0';
	return ++s->n == s->stop_at ? s->ret : 0;
}

static int each_of(const char *s, const char *name, struct seen *out)
{
	size_t len;
	char *x = reply(s, &len);
	int rc = s3xml_each(x, len, name, collect, out);

	free(x);
	return rc;
}

/* ---- the replies of real stores ------------------------------------------ */

static const char initiate[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    "<InitiateMultipartUploadResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
    "<Bucket>ckpt</Bucket><Key>run/job/step-000000000003/rank-00000.n0.0.safetensors</Key>"
    "<UploadId>2~Yb0sXbOtRk3lJ1gLyVt8IQ9OvJ0-QhT</UploadId>"
    "</InitiateMultipartUploadResult>";

START_TEST(test_initiate)
{
	TEXT_IS(initiate, "UploadId", "2~Yb0sXbOtRk3lJ1gLyVt8IQ9OvJ0-QhT");
	TEXT_IS(initiate, "Bucket", "ckpt");
	TEXT_IS(initiate, "Key", "run/job/step-000000000003/rank-00000.n0.0.safetensors");
	/* the start of a name is not the name: <Upload> is not in it, <UploadId> is */
	TEXT_FAILS(initiate, "Upload", -ENOENT);
	TEXT_FAILS(initiate, "Code", -ENOENT);
}
END_TEST

static const char listing[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
    "<Name>ckpt</Name><Prefix>run/</Prefix><Delimiter>/</Delimiter><KeyCount>4</KeyCount>"
    "<MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated>"
    "<NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</"
    "NextContinuationToken>"
    "<Contents><Key>run/LATEST</Key><LastModified>2026-11-23T21:40:00.000Z</LastModified>"
    "<ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag><Size>13</Size>"
    "<StorageClass>STANDARD</StorageClass></Contents>"
    "<Contents>\n  <Key>run/a&amp;b&#38;c</Key>\n  <Size>2211</Size>\n"
    "  <Owner><ID>ckpt</ID><DisplayName>ckpt</DisplayName></Owner>\n</Contents>"
    "<CommonPrefixes><Prefix>run/job/</Prefix></CommonPrefixes>"
    "<CommonPrefixes><Prefix>run/other-job/</Prefix></CommonPrefixes>"
    "</ListBucketResult>";

START_TEST(test_list_objects)
{
	struct seen c = {0}, p = {0};
	char key[64], size[32];

	TEXT_IS(listing, "IsTruncated", "true");
	TEXT_IS(listing, "NextContinuationToken", "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
	/* the first <Prefix> in the document: the listing's, not a CommonPrefixes' */
	TEXT_IS(listing, "Prefix", "run/");
	ck_assert_int_eq(each_of(listing, "Contents", &c), 0);
	ck_assert_uint_eq(c.n, 2);
	/* read inside each, as s3_scan.c's on_contents does */
	ck_assert_int_eq(s3xml_text(c.in[0], strlen(c.in[0]), "Key", key, sizeof(key)), 0);
	ck_assert_str_eq(key, "run/LATEST");
	ck_assert_int_eq(s3xml_text(c.in[0], strlen(c.in[0]), "Size", size, sizeof(size)), 0);
	ck_assert_str_eq(size, "13");
	ck_assert_int_eq(s3xml_text(c.in[0], strlen(c.in[0]), "ETag", key, sizeof(key)), 0);
	ck_assert_str_eq(key, "\"9b2cf535f27731c974343645a3985328\"");
	ck_assert_int_eq(s3xml_text(c.in[1], strlen(c.in[1]), "Key", key, sizeof(key)), 0);
	ck_assert_str_eq(key, "run/a&b&c");
	ck_assert_int_eq(s3xml_text(c.in[1], strlen(c.in[1]), "Size", size, sizeof(size)), 0);
	ck_assert_str_eq(size, "2211");
	ck_assert_int_eq(s3xml_text(c.in[1], strlen(c.in[1]), "LastModified", size, sizeof(size)),
	                 -ENOENT);
	ck_assert_int_eq(each_of(listing, "CommonPrefixes", &p), 0);
	ck_assert_uint_eq(p.n, 2);
	ck_assert_int_eq(s3xml_text(p.in[1], strlen(p.in[1]), "Prefix", key, sizeof(key)), 0);
	ck_assert_str_eq(key, "run/other-job/");
}
END_TEST

static const char uploads[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    "<ListMultipartUploadsResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
    "<Bucket>ckpt</Bucket><KeyMarker>run/a-marker</KeyMarker>"
    "<UploadIdMarker>2~marker</UploadIdMarker>"
    "<NextKeyMarker>run/job/step-000000000003/rank-00001.n0.0.safetensors</NextKeyMarker>"
    "<NextUploadIdMarker>2~abc</NextUploadIdMarker><Prefix>run/job/</Prefix>"
    "<MaxUploads>1000</MaxUploads><IsTruncated>true</IsTruncated>"
    "<Upload><Key>run/job/step-000000000003/rank-00000.n0.0.safetensors</Key>"
    "<UploadId>2~Yb0sXbOtRk3lJ1gLyVt8IQ9OvJ0-QhT</UploadId><Initiator><ID>ckpt</ID></Initiator>"
    "<Initiated>2026-11-23T21:39:00.000Z</Initiated></Upload>"
    "<Upload><Key>run/job/step-000000000003/rank-00001.n0.0.safetensors</Key>"
    "<UploadId>2~abc</UploadId><Initiated>2026-11-23T21:39:01.000Z</Initiated></Upload>"
    "</ListMultipartUploadsResult>";

START_TEST(test_list_uploads)
{
	struct seen u = {0};
	char v[128];

	/* <KeyMarker> and <UploadIdMarker> come first: neither is <Key> or <UploadId> */
	TEXT_IS(uploads, "Key", "run/job/step-000000000003/rank-00000.n0.0.safetensors");
	TEXT_IS(uploads, "UploadId", "2~Yb0sXbOtRk3lJ1gLyVt8IQ9OvJ0-QhT");
	TEXT_IS(uploads, "KeyMarker", "run/a-marker");
	TEXT_IS(uploads, "NextKeyMarker", "run/job/step-000000000003/rank-00001.n0.0.safetensors");
	TEXT_IS(uploads, "NextUploadIdMarker", "2~abc");
	ck_assert_int_eq(each_of(uploads, "Upload", &u), 0);
	ck_assert_uint_eq(u.n, 2); /* <UploadId> and <UploadIdMarker> are not <Upload>s */
	ck_assert_int_eq(s3xml_text(u.in[1], strlen(u.in[1]), "UploadId", v, sizeof(v)), 0);
	ck_assert_str_eq(v, "2~abc");
	ck_assert_int_eq(s3xml_text(u.in[0], strlen(u.in[0]), "Initiated", v, sizeof(v)), 0);
	ck_assert_str_eq(v, "2026-11-23T21:39:00.000Z");
}
END_TEST

START_TEST(test_error)
{
	static const char e[] = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	                        "<Error><Code>SlowDown</Code><Message>Please reduce your "
	                        "request rate &amp; try again.</Message><Key>run/LATEST</Key>"
	                        "<RequestId>tx1</RequestId></Error>";

	TEXT_IS(e, "Code", "SlowDown");
	TEXT_IS(e, "Message", "Please reduce your request rate & try again.");
	TEXT_FAILS(e, "UploadId", -ENOENT);
	/* not an XML reply at all (a proxy's HTML page) */
	TEXT_FAILS("<html><body>502 Bad Gateway</body></html>", "Code", -ENOENT);
	TEXT_FAILS("", "Code", -ENOENT);
}
END_TEST

/* ---- entities ---------------------------------------------------------------- */

START_TEST(test_entities)
{
	TEXT_IS("<Key>a&amp;b</Key>", "Key", "a&b");
	TEXT_IS("<Key>a&#38;b</Key>", "Key", "a&b");
	TEXT_IS("<Key>&lt;&gt;&quot;&apos;&#65;&#0065;</Key>", "Key", "<>\"'AA");
	TEXT_IS("<Key>&amp;amp;</Key>", "Key", "&amp;"); /* decoded once */
	TEXT_FAILS("<Key>a&nbsp;b</Key>", "Key", -EINVAL); /* not one XML predefines */
	TEXT_FAILS("<Key>a&amp b</Key>", "Key", -EINVAL);
	TEXT_FAILS("<Key>a&b</Key>", "Key", -EINVAL);
	TEXT_FAILS("<Key>a&</Key>", "Key", -EINVAL);
	TEXT_FAILS("<Key>&#38</Key>", "Key", -EINVAL);
	TEXT_FAILS("<Key>&#;</Key>", "Key", -EINVAL);
	TEXT_FAILS("<Key>&#0;</Key>", "Key", -EINVAL); /* a NUL inside a key */
	TEXT_FAILS("<Key>&#128;</Key>", "Key", -EINVAL); /* ASCII only */
	TEXT_FAILS("<Key>&#x26;</Key>", "Key", -EINVAL);
	TEXT_FAILS("<Key>&#000038;</Key>", "Key", -EINVAL); /* at most four digits */
}
END_TEST

/* ---- elements ---------------------------------------------------------------- */

START_TEST(test_prefix_names)
{
	static const char x[] = "<KeyMarker>m</KeyMarker><KeyCount>3</KeyCount><Key>k</Key>";
	struct seen s = {0};

	TEXT_IS(x, "Key", "k");
	TEXT_IS(x, "KeyMarker", "m");
	TEXT_FAILS("<KeyMarker>m</KeyMarker>", "Key", -ENOENT);
	/* </KeyMarker> does not close <Key>: it is not closed */
	TEXT_FAILS("<Key>m</KeyMarker>", "Key", -EINVAL);
	ck_assert_int_eq(each_of(x, "Key", &s), 0);
	ck_assert_uint_eq(s.n, 1);
	ck_assert_str_eq(s.in[0], "k");
}
END_TEST

START_TEST(test_self_closing)
{
	struct seen s = {0};

	TEXT_IS("<Key/>", "Key", "");
	TEXT_IS("<Key />", "Key", "");
	TEXT_IS("<Prefix/><Key>x</Key>", "Key", "x");
	TEXT_IS("<Key></Key>", "Key", "");
	ck_assert_int_eq(each_of("<Upload/><Upload><Key>a</Key></Upload><Upload />", "Upload", &s),
	                 0);
	ck_assert_uint_eq(s.n, 3);
	ck_assert_str_eq(s.in[0], "");
	ck_assert_str_eq(s.in[1], "<Key>a</Key>");
	ck_assert_str_eq(s.in[2], "");
}
END_TEST

START_TEST(test_attributes_and_space)
{
	TEXT_IS("<Key\txmlns=\"x\">a</Key>", "Key", "a");
	TEXT_IS("<Key\n>a</Key>", "Key", "a");
	TEXT_IS("<Key>  a b  </Key>", "Key", "  a b  "); /* text as it is */
	TEXT_FAILS("<Key", "Key", -ENOENT);
	TEXT_FAILS("<Key ", "Key", -ENOENT);
}
END_TEST

START_TEST(test_unclosed)
{
	struct seen s = {0};

	TEXT_FAILS("<Key>abc", "Key", -EINVAL);
	TEXT_FAILS("<Key>abc</Key", "Key", -EINVAL);
	TEXT_FAILS("<Key>abc</key>", "Key", -EINVAL); /* names are case-sensitive */
	TEXT_FAILS("<Key>abc</ Key>", "Key", -EINVAL);
	/* a second element that is not closed: the first was seen, then the error */
	ck_assert_int_eq(
	    each_of("<Contents><Key>a</Key></Contents><Contents><Key>b</Key>", "Contents", &s),
	    -EINVAL);
	ck_assert_uint_eq(s.n, 1);
	ck_assert_str_eq(s.in[0], "<Key>a</Key>");
}
END_TEST

START_TEST(test_nested_same_name)
{
	struct seen s = {0};

	/* the outer one's inside holds the inner one whole */
	ck_assert_int_eq(each_of("<A>1<A>2</A>3</A><A>4</A>", "A", &s), 0);
	ck_assert_uint_eq(s.n, 2);
	ck_assert_str_eq(s.in[0], "1<A>2</A>3");
	ck_assert_str_eq(s.in[1], "4");
	TEXT_FAILS("<A>1<A>2</A>", "A", -EINVAL);
	TEXT_FAILS("<A>1<A>2</A>3</A>", "A", -EINVAL); /* markup in the text */
}
END_TEST

START_TEST(test_each_stops)
{
	struct seen s = {.stop_at = 2, .ret = -EINTR};

	ck_assert_int_eq(each_of("<P>1</P><P>2</P><P>3</P>", "P", &s), -EINTR);
	ck_assert_uint_eq(s.n, 2);
	memset(&s, 0, sizeof(s));
	ck_assert_int_eq(each_of("<Q>1</Q>", "P", &s), 0);
	ck_assert_uint_eq(s.n, 0);
}
END_TEST

START_TEST(test_too_long)
{
	char out[8];

	ck_assert_int_eq(text_of("<Key>1234567</Key>", "Key", out, sizeof(out)), 0);
	ck_assert_str_eq(out, "1234567");
	strcpy(out, "junk");
	ck_assert_int_eq(text_of("<Key>12345678</Key>", "Key", out, sizeof(out)), -ENAMETOOLONG);
	ck_assert_str_eq(out, "");
	/* an entity counts as the one byte it gives */
	ck_assert_int_eq(
	    text_of("<Key>&amp;&amp;&amp;&amp;&amp;&amp;&amp;</Key>", "Key", out, sizeof(out)), 0);
	ck_assert_str_eq(out, "&&&&&&&");
	ck_assert_int_eq(text_of("<Key></Key>", "Key", out, 1), 0);
	ck_assert_int_eq(text_of("<Key>1</Key>", "Key", out, 1), -ENAMETOOLONG);
	ck_assert_int_eq(text_of("<Key></Key>", "Key", out, 0), -ENAMETOOLONG);
}
END_TEST

START_TEST(test_markup_in_text)
{
	TEXT_FAILS("<Key>a<b>c</b></Key>", "Key", -EINVAL);
	TEXT_FAILS("<Key>a<!-- c --></Key>", "Key", -EINVAL);
	TEXT_FAILS("<Key><![CDATA[x]]></Key>", "Key", -EINVAL);
	TEXT_FAILS("<Key>a<</Key>", "Key", -EINVAL);
	/* a NUL inside the reply is not text */
	{
		static const char x[] = "<Key>a\0b</Key>";
		char out[16] = "junk";

		ck_assert_int_eq(s3xml_text(x, sizeof(x) - 1, "Key", out, sizeof(out)), -EINVAL);
		ck_assert_str_eq(out, "");
	}
}
END_TEST

/* Only [xml, xml + len) is read, whatever follows it in memory. */
START_TEST(test_len_bounds)
{
	static const char x[] = "<Key>abc</Key><Code>C</Code>";
	char out[16];

	ck_assert_int_eq(s3xml_text(x, strlen("<Key>abc</Key>"), "Key", out, sizeof(out)), 0);
	ck_assert_str_eq(out, "abc");
	ck_assert_int_eq(s3xml_text(x, strlen("<Key>abc</Key>"), "Code", out, sizeof(out)),
	                 -ENOENT);
	ck_assert_int_eq(s3xml_text(x, strlen("<Key>abc</Key"), "Key", out, sizeof(out)), -EINVAL);
	ck_assert_int_eq(s3xml_text(x, strlen("<Key>"), "Key", out, sizeof(out)), -EINVAL);
	ck_assert_int_eq(s3xml_text(x, strlen("<Key"), "Key", out, sizeof(out)), -ENOENT);
	ck_assert_int_eq(s3xml_text(x, 0, "Key", out, sizeof(out)), -ENOENT);
	ck_assert_int_eq(s3xml_text(NULL, 0, "Key", out, sizeof(out)), -ENOENT);
}
END_TEST

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* head, then pat again and again, then tail: a reply of 2 MiB in all. */
static char *repeated(const char *head, const char *pat, const char *tail, size_t *len)
{
	size_t cap = 2u << 20, hl = strlen(head), pl = strlen(pat), tl = strlen(tail), o = 0;
	char *x = malloc(cap);

	ck_assert(x);
	memcpy(x, head, hl);
	for (o = hl; o + pl + tl <= cap; o += pl)
		memcpy(x + o, pat, pl);
	memcpy(x + o, tail, tl);
	*len = o + tl;
	return x;
}

static int no_element(void *ctx, const char *in, size_t inlen)
{
	(void)ctx, (void)in, (void)inlen;
	return 1;
}

/*
 * Tags that never end, or end only at the end of the reply: read in time
 * linear in the reply, not once per '<' (a store's 1 MiB reply of them
 * took seconds of the caller's thread per call).
 */
START_TEST(test_linear_time)
{
	static const struct {
		const char *head, *pat, *tail, *name;
		int text, each;
	} cases[] = {
	    {"", "<Key ", "", "Key", -ENOENT, 0},
	    {"<Contents>", "<Contents ", ">", "Contents", -EINVAL, -EINVAL},
	    {"<Key>", "<Key\t", ">", "Key", -EINVAL, -EINVAL},
	    {"<Contents>", "<Contents><Key ", "", "Contents", -EINVAL, -EINVAL},
	};
	char out[64];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		size_t len;
		char *x = repeated(cases[i].head, cases[i].pat, cases[i].tail, &len);
		double t0 = now_s(), took;

		ck_assert_int_eq(s3xml_text(x, len, cases[i].name, out, sizeof(out)),
		                 cases[i].text);
		ck_assert_int_eq(s3xml_each(x, len, cases[i].name, no_element, NULL),
		                 cases[i].each);
		took = now_s() - t0;
		ck_assert_msg(took < 1.0, "case %zu: %.2f s for two calls on %zu bytes", i, took,
		              len);
		free(x);
	}
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("s3xml");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_initiate);
	tcase_add_test(tc, test_list_objects);
	tcase_add_test(tc, test_list_uploads);
	tcase_add_test(tc, test_error);
	tcase_add_test(tc, test_entities);
	tcase_add_test(tc, test_prefix_names);
	tcase_add_test(tc, test_self_closing);
	tcase_add_test(tc, test_attributes_and_space);
	tcase_add_test(tc, test_unclosed);
	tcase_add_test(tc, test_nested_same_name);
	tcase_add_test(tc, test_each_stops);
	tcase_add_test(tc, test_too_long);
	tcase_add_test(tc, test_markup_in_text);
	tcase_add_test(tc, test_len_bounds);
	tcase_add_test(tc, test_linear_time);
	suite_add_tcase(s, tc);
	return s;
}
