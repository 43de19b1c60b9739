/*
 * Unit tests of storage/s3/s3zstd.c, compressed shards on an object store:
 * frames and seek tables written as an object is, then read back the way a
 * restore reads them (ranges within a frame, across frames, to the end);
 * small frames padded to S3's smallest part still decompress; `zstd`'s own
 * decoder takes the object whole (frames, padding and table); and seek
 * tables that lie (wrong magic, counts, sizes that do not add up to the
 * object or the shard, empty frames, checksums asked for, a corrupt frame,
 * a frame shorter than its entry) are refused with EBADMSG.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>
#include <zstd.h>

#include "storage/s3/s3.h"
#include "support/check_main.h"

#define FRAME (5u << 20) /* the writer's chunk */

struct obj {
	unsigned char *buf;
	uint64_t len, size; /* on the store; the shard's */
	unsigned n;
	unsigned char *src; /* the shard */
};

/* A shard of size bytes (some compressible, some not) as a compressed object. */
static void make(struct obj *o, uint64_t size, bool pad)
{
	struct s3z_frame f[64];
	uint64_t at = 0;

	o->size = size;
	o->src = malloc(size);
	ck_assert(o->src);
	for (uint64_t i = 0; i < size; i++) /* a ramp, then noise in the second half */
		o->src[i] = i < size / 2 ? (unsigned char)(i / 97) : (unsigned char)(rand() >> 7);
	o->n = (unsigned)((size + FRAME - 1) / FRAME);
	ck_assert(o->n <= 64);
	o->buf = malloc((size_t)o->n * s3z_bound(FRAME) + s3z_table_bytes(o->n));
	ck_assert(o->buf);
	for (unsigned i = 0; i < o->n; i++) {
		uint64_t n = size - (uint64_t)i * FRAME < FRAME ? size - (uint64_t)i * FRAME
		                                                : FRAME,
		         c;
		char err[IPC_ERRLEN];

		ck_assert_int_eq(s3z_frame(1, o->src + (uint64_t)i * FRAME, n, o->buf + at,
		                           s3z_bound(FRAME), pad, &c, err),
		                 0);
		if (pad)
			ck_assert_uint_ge(c, S3_MIN_PART);
		f[i] = (struct s3z_frame){(uint32_t)c, (uint32_t)n};
		at += c;
	}
	s3z_table_write(f, o->n, o->buf + at);
	o->len = at + s3z_table_bytes(o->n);
}

static void drop(struct obj *o)
{
	free(o->buf);
	free(o->src);
}

static int parse(const struct obj *o, struct s3z_table *t)
{
	uint64_t tb = s3z_table_bytes(o->n);
	char err[IPC_ERRLEN];

	return s3z_table_parse(o->buf + o->len - tb, tb, o->len, o->size, t, err);
}

/* Shard bytes [off, off + len) read as a restore does: the frames holding them, whole. */
static void read_range(const struct obj *o, const struct s3z_table *t, uint64_t off, uint64_t len)
{
	unsigned a = s3z_find(t, off), b = s3z_find(t, off + len - 1);
	uint64_t c0 = a ? t->cend[a - 1] : 0;
	unsigned char *dst = malloc(len + 1);
	char err[IPC_ERRLEN];

	ck_assert(dst);
	ck_assert_uint_lt(b, t->n);
	dst[len] = 0xa5;
	ck_assert_msg(s3z_inflate(t, a, o->buf + c0, off, dst, len, err) == 0, "%s", err);
	ck_assert_msg(memcmp(dst, o->src + off, len) == 0, "bytes [%llu, +%llu) differ",
	              (unsigned long long)off, (unsigned long long)len);
	ck_assert_int_eq(dst[len], 0xa5); /* nothing written past the range */
	free(dst);
}

START_TEST(ranges_read_back)
{
	const uint64_t size = 3 * FRAME + 12345;
	struct s3z_table t;
	struct obj o;

	make(&o, size, true);
	ck_assert_int_eq(parse(&o, &t), 0);
	ck_assert_uint_eq(t.n, 4);
	ck_assert_uint_eq(t.dend[3], size);
	read_range(&o, &t, 0, FRAME); /* a frame whole */
	read_range(&o, &t, FRAME, 2 * FRAME); /* two whole */
	read_range(&o, &t, 100, 4096); /* inside one */
	read_range(&o, &t, FRAME - 10, 20); /* across a boundary */
	read_range(&o, &t, 3 * FRAME, 12345); /* the last, short one */
	read_range(&o, &t, 1, size - 1); /* nearly all */
	ck_assert_uint_eq(s3z_find(&t, size), t.n);
	s3z_table_free(&t);
	drop(&o);
}
END_TEST

START_TEST(zstd_decodes_the_object_whole)
{
	struct obj o;
	unsigned long long n;
	unsigned char *out;

	make(&o, 2 * FRAME + 77, true);
	/* a compressible first frame is padded with a skippable frame; the decoder skips it */
	out = malloc(o.size + 1);
	ck_assert(out);
	n = ZSTD_decompress(out, o.size + 1, o.buf, o.len);
	ck_assert_msg(!ZSTD_isError(n), "%s", ZSTD_getErrorName(n));
	ck_assert_uint_eq(n, o.size);
	ck_assert(memcmp(out, o.src, o.size) == 0);
	free(out);
	drop(&o);
}
END_TEST

START_TEST(single_frame_unpadded)
{
	struct s3z_table t;
	struct obj o;

	make(&o, 1 << 20, false);
	ck_assert_uint_lt(o.len, o.size); /* half of it is a ramp */
	ck_assert_int_eq(parse(&o, &t), 0);
	read_range(&o, &t, 0, o.size);
	s3z_table_free(&t);
	drop(&o);
}
END_TEST

/* Writes v little-endian at p. */
static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

/* A table of o, changed by fn, must be refused. */
static void refused(const char *what, void (*fn)(unsigned char *tab, struct obj *o))
{
	struct s3z_table t;
	struct obj o;
	char err[IPC_ERRLEN] = "";
	uint64_t tb;
	int rc;

	make(&o, 2 * FRAME + 5, true);
	tb = s3z_table_bytes(o.n);
	fn(o.buf + o.len - tb, &o);
	rc = s3z_table_parse(o.buf + o.len - tb, tb, o.len, o.size, &t, err);
	ck_assert_msg(rc == -EBADMSG, "%s: accepted (%d)", what, rc);
	ck_assert_msg(err[0], "%s: refused without a word", what);
	ck_assert_ptr_null(t.cend);
	drop(&o);
}

static void bad_magic(unsigned char *tab, struct obj *o)
{
	(void)o;
	tab[0] ^= 1;
}
static void bad_seek_magic(unsigned char *tab, struct obj *o)
{
	tab[s3z_table_bytes(o->n) - 1] ^= 0x80;
}
static void count_more(unsigned char *tab, struct obj *o)
{
	put32(tab + s3z_table_bytes(o->n) - 9, o->n + 1);
}
static void count_zero(unsigned char *tab, struct obj *o)
{
	put32(tab + s3z_table_bytes(o->n) - 9, 0);
}
static void checksums(unsigned char *tab, struct obj *o)
{
	tab[s3z_table_bytes(o->n) - 5] = 0x80;
}
static void csize_off(unsigned char *tab, struct obj *o)
{
	(void)o;
	tab[8] += 1; /* frame 0's compressed size: the frames no longer end at the table */
}
static void dsize_off(unsigned char *tab, struct obj *o)
{
	(void)o;
	tab[12] += 1; /* frame 0's size: the shard's no longer adds up */
}
static void empty_frame(unsigned char *tab, struct obj *o)
{
	(void)o;
	put32(tab + 12, 0);
}
static void huge_frame(unsigned char *tab, struct obj *o)
{
	(void)o;
	put32(tab + 8, 0xffffffffu);
}

START_TEST(lying_tables_refused)
{
	refused("the skippable frame's magic", bad_magic);
	refused("the seekable magic", bad_seek_magic);
	refused("one frame more than there are", count_more);
	refused("no frames", count_zero);
	refused("checksums asked for", checksums);
	refused("a compressed size off by one", csize_off);
	refused("a size off by one", dsize_off);
	refused("an empty frame", empty_frame);
	refused("a frame past any bound", huge_frame);
}
END_TEST

START_TEST(short_tables_refused)
{
	struct s3z_table t;
	char err[IPC_ERRLEN];
	unsigned char b[9] = {0}; /* a footer's size, no table before it */

	ck_assert_int_eq(s3z_table_parse(b, sizeof(b), 100, 100, &t, err), -EBADMSG);
	ck_assert_int_eq(s3z_footer(b, &(unsigned){0}, err), -EBADMSG);
}
END_TEST

/*
 * A frame saying it holds more than any staging chunk, the sizes otherwise
 * adding up: a reader would need room for all of it, so it is refused.
 */
START_TEST(frame_past_a_chunk_refused)
{
	struct s3z_table t;
	struct obj o;
	char err[IPC_ERRLEN] = "";
	unsigned char *tab;
	uint64_t tb;

	make(&o, 2 * FRAME + 5, true);
	tb = s3z_table_bytes(o.n);
	tab = o.buf + o.len - tb;
	put32(tab + 12, FRAME + (1u << 30)); /* frame 0 */
	ck_assert_int_eq(s3z_table_parse(tab, tb, o.len, o.size + (1u << 30), &t, err), -EBADMSG);
	ck_assert_msg(strstr(err, "frame 0"), "%s", err);
	ck_assert_ptr_null(t.cend);
	drop(&o);
}
END_TEST

/*
 * A frame that decompresses to fewer bytes than its entry says, the entries
 * still adding up (the next frame says as many fewer): refused, naming the
 * frame, rather than leaving the end of its stretch as it was.
 */
START_TEST(short_frame_refused)
{
	struct s3z_table t;
	struct obj o;
	char err[IPC_ERRLEN] = "";
	unsigned char *tab, *dst;

	make(&o, 2 * FRAME + 5, true);
	tab = o.buf + o.len - s3z_table_bytes(o.n);
	put32(tab + 12, FRAME + 1); /* frame 0: a byte more than it holds */
	put32(tab + 20, FRAME - 1); /* frame 1: a byte fewer */
	ck_assert_int_eq(parse(&o, &t), 0);
	dst = malloc(FRAME + 1);
	ck_assert(dst);
	ck_assert_int_eq(s3z_inflate(&t, 0, o.buf, 0, dst, FRAME + 1, err), -EBADMSG);
	ck_assert_msg(strstr(err, "frame 0") && strstr(err, "fewer bytes"), "%s", err);
	free(dst);
	s3z_table_free(&t);
	drop(&o);
}
END_TEST

START_TEST(corrupt_frame_refused)
{
	struct s3z_table t;
	struct obj o;
	char err[IPC_ERRLEN];
	unsigned char *dst;

	make(&o, FRAME + 100, true);
	ck_assert_int_eq(parse(&o, &t), 0);
	o.buf[t.cend[0] + 2] ^= 0xff; /* frame 1's header */
	dst = malloc(o.size);
	ck_assert(dst);
	ck_assert_int_eq(s3z_inflate(&t, 1, o.buf + t.cend[0], FRAME, dst + FRAME, 100, err),
	                 -EBADMSG);
	ck_assert_msg(strstr(err, "frame 1"), "%s", err);
	/* frame 0 is untouched and still reads */
	ck_assert_int_eq(s3z_inflate(&t, 0, o.buf, 0, dst, FRAME, err), 0);
	ck_assert(memcmp(dst, o.src, FRAME) == 0);
	free(dst);
	s3z_table_free(&t);
	drop(&o);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("s3zstd");
	TCase *t = tcase_create("core");

	tcase_set_timeout(t, 60);
	tcase_add_test(t, ranges_read_back);
	tcase_add_test(t, frame_past_a_chunk_refused);
	tcase_add_test(t, zstd_decodes_the_object_whole);
	tcase_add_test(t, single_frame_unpadded);
	tcase_add_test(t, lying_tables_refused);
	tcase_add_test(t, short_tables_refused);
	tcase_add_test(t, corrupt_frame_refused);
	tcase_add_test(t, short_frame_refused);
	suite_add_tcase(s, t);
	return s;
}
