/*
 * Unit tests of storage/format/safetensors.c: the shard header built, parsed back,
 * refused when crafted wrong (each check the safetensors library makes),
 * and read from a real file.
 */
#define _GNU_SOURCE /* O_DIRECT, memmem, memrchr */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <check.h>

#include "storage/format/format.h"
#include "support/check_main.h"

/* dtype numbers, from ipc_dtype_from_name so the test follows the table */
#define DT(name) ipc_dtype_from_name(name)

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* A header as a file would hold it: 8-byte length, then the JSON text. */
static uint8_t *craft(const char *json, size_t *len)
{
	size_t n = strlen(json);
	uint8_t *b = malloc(8 + n);

	ck_assert_ptr_nonnull(b);
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)((uint64_t)n >> (8 * i));
	memcpy(b + 8, json, n);
	*len = 8 + n;
	return b;
}

/* Parses `json` as the header of a file with data_len bytes of data. */
static int parse_json(const char *json, uint64_t data_len, char *err)
{
	struct st_header *h = NULL;
	size_t len;
	uint8_t *b = craft(json, &len);
	int rc = st_header_parse(b, len, len + data_len, &h, err);

	if (rc == 0)
		ck_assert_ptr_nonnull(h);
	else
		ck_assert_ptr_null(h);
	st_header_free(h);
	free(b);
	return rc;
}

#define ck_refused(json, data_len, want_rc, needle)                                                \
	do {                                                                                       \
		char err_[IPC_ERRLEN] = "";                                                        \
		int rc_ = parse_json(json, data_len, err_);                                        \
		ck_assert_msg(rc_ == (want_rc), "%s: rc %d, expected %d (%s)", json, rc_, want_rc, \
		              err_);                                                               \
		ck_assert_msg(strstr(err_, needle), "message '%s' lacks '%s'", err_, needle);      \
	} while (0)

static const int64_t shape_a[] = {2, 3};
static const int64_t shape_b[] = {4};

/* F32 [2,3] at 0..24, BF16 [4] at 24..32, I64 scalar at 32..40 */
static void three(struct st_tensor t[3])
{
	t[0] = (struct st_tensor){"model.a", DT("F32"), 2, shape_a, 0, 24};
	t[1] = (struct st_tensor){"model.b", DT("BF16"), 1, shape_b, 24, 32};
	t[2] = (struct st_tensor){"step", DT("I64"), 0, NULL, 32, 40};
}

START_TEST(test_roundtrip)
{
	struct st_meta meta[] = {{"format", "pt"}, {"ckptd.step", "100"}};
	struct st_tensor t[3];
	struct st_header *h;
	char err[IPC_ERRLEN] = "";
	void *buf;
	size_t len;
	const uint8_t *b;

	three(t);
	ck_assert_int_eq(st_header_build(t, 3, meta, 2, &buf, &len, err), 0);
	b = buf;
	ck_assert_uint_eq(len % 8, 0);
	ck_assert_uint_eq(le64(b), len - 8);
	ck_assert_int_eq(b[8], '{');
	ck_assert_ptr_nonnull(memmem(b, len, "\"__metadata__\"", 14));

	ck_assert_int_eq(st_header_parse(buf, len, len + 40, &h, err), 0);
	ck_assert_uint_eq(h->data_start, len);
	ck_assert_uint_eq(h->data_start % 8, 0);
	ck_assert_uint_eq(h->n, 3);
	for (size_t i = 0; i < 3; i++) {
		const struct st_entry *e = &h->v[i];

		ck_assert_str_eq(e->name, t[i].name);
		ck_assert_int_eq(e->dtype, t[i].dtype);
		ck_assert_uint_eq(e->ndim, t[i].ndim);
		for (size_t d = 0; d < e->ndim; d++)
			ck_assert_int_eq(e->shape[d], t[i].shape[d]);
		ck_assert_uint_eq(e->begin, t[i].begin);
		ck_assert_uint_eq(e->end, t[i].end);
		ck_assert_ptr_eq(st_header_find(h, t[i].name), e);
	}
	ck_assert_ptr_null(st_header_find(h, "model"));
	ck_assert_ptr_null(st_header_find(h, "zzz"));
	ck_assert_uint_eq(h->nmeta, 2);
	ck_assert_str_eq(h->meta_keys[0], "format");
	ck_assert_str_eq(h->meta_values[0], "pt");
	ck_assert_str_eq(h->meta_keys[1], "ckptd.step");
	ck_assert_str_eq(h->meta_values[1], "100");
	st_header_free(h);
	free(buf);
}
END_TEST

/* No __metadata__ without metadata; padding is spaces; order as given. */
START_TEST(test_build_layout)
{
	static const int64_t s1[] = {1};
	struct st_tensor t[] = {
	    {"zeta", DT("U8"), 1, s1, 0, 1},
	    {"alpha", DT("U8"), 1, s1, 1, 2},
	    {"mu", DT("U8"), 1, s1, 2, 3},
	};
	char err[IPC_ERRLEN] = "";
	void *buf;
	size_t len;
	const char *j, *z, *a, *m, *close;
	struct st_header *h;

	ck_assert_int_eq(st_header_build(t, 3, NULL, 0, &buf, &len, err), 0);
	j = (const char *)buf + 8;
	ck_assert_ptr_null(memmem(j, len - 8, "__metadata__", 12));
	z = memmem(j, len - 8, "\"zeta\"", 6);
	a = memmem(j, len - 8, "\"alpha\"", 7);
	m = memmem(j, len - 8, "\"mu\"", 4);
	ck_assert(z && a && m && z < a && a < m);
	close = memrchr(j, '}', len - 8);
	ck_assert_ptr_nonnull(close);
	for (const char *p = close + 1; p < (const char *)buf + len; p++)
		ck_assert_int_eq(*p, ' ');
	ck_assert_int_eq(st_header_parse(buf, len, len + 3, &h, err), 0);
	ck_assert_uint_eq(h->nmeta, 0);
	/* v is sorted by offset, which here is the order given */
	ck_assert_str_eq(h->v[0].name, "zeta");
	ck_assert_str_eq(h->v[2].name, "mu");
	st_header_free(h);
	free(buf);
}
END_TEST

static int build_rc(const struct st_tensor *t, size_t n, const struct st_meta *meta, size_t nmeta,
                    char *err)
{
	void *buf = (void *)1;
	size_t len = 1;
	int rc = st_header_build(t, n, meta, nmeta, &buf, &len, err);

	if (rc) {
		ck_assert_ptr_null(buf);
		ck_assert_uint_eq(len, 0);
	}
	free(buf);
	return rc;
}

START_TEST(test_build_refuses)
{
	struct st_tensor t[3];
	struct st_meta dup[] = {{"k", "1"}, {"k", "2"}};
	char err[IPC_ERRLEN];

	three(t);
	t[1].begin = 28, t[1].end = 36; /* a gap */
	ck_assert_int_eq(build_rc(t, 3, NULL, 0, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "model.b"));
	three(t);
	t[0].end = 20; /* not dtype x shape */
	ck_assert_int_eq(build_rc(t, 3, NULL, 0, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "do not match F32 x [2,3] = 24 bytes"));
	three(t);
	t[1].begin = 4, t[1].end = 12; /* overlaps model.a */
	ck_assert_int_eq(build_rc(t, 3, NULL, 0, err), -EINVAL);
	three(t);
	t[2].name = "bad/\x01name";
	ck_assert_int_eq(build_rc(t, 3, NULL, 0, err), -EINVAL);
	three(t);
	t[2].name = "__metadata__";
	ck_assert_int_eq(build_rc(t, 3, NULL, 0, err), -EINVAL);
	three(t);
	t[1].name = "model.a";
	ck_assert_int_eq(build_rc(t, 3, NULL, 0, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "twice"));
	three(t);
	t[1].dtype = 99;
	ck_assert_int_eq(build_rc(t, 3, NULL, 0, err), -EINVAL);
	three(t);
	ck_assert_int_eq(build_rc(t, 3, dup, 2, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "'k'"));
	/* and the same tensors are fine */
	ck_assert_int_eq(build_rc(t, 3, dup, 1, err), 0);
}
END_TEST

START_TEST(test_refuse_length)
{
	uint8_t b[16] = {0};
	struct st_header *h = NULL;
	char err[IPC_ERRLEN] = "";

	/* more than the library accepts */
	b[0] = (ST_MAX_HEADER + 1) & 0xff, b[1] = ((ST_MAX_HEADER + 1) >> 8) & 0xff;
	b[2] = ((ST_MAX_HEADER + 1) >> 16) & 0xff, b[3] = ((ST_MAX_HEADER + 1) >> 24) & 0xff;
	ck_assert_int_eq(st_header_parse(b, 16, 1ull << 40, &h, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "larger than"));
	/* a length whose top byte is set: no overflow in 8 + N */
	memset(b, 0xff, 8);
	ck_assert_int_eq(st_header_parse(b, 16, UINT64_MAX, &h, err), -EINVAL);
	/* past the end of the file */
	memset(b, 0, 8);
	b[0] = 100;
	ck_assert_int_eq(st_header_parse(b, 16, 50, &h, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "past the end"));
	/* a file too short for the length itself */
	ck_assert_int_eq(st_header_parse(b, 4, 4, &h, err), -EINVAL);
	/* zero length: not even '{' */
	memset(b, 0, 8);
	ck_assert_int_eq(st_header_parse(b, 16, 16, &h, err), -EINVAL);
	ck_assert_ptr_null(h);
}
END_TEST

START_TEST(test_nodata)
{
	struct st_tensor t[3];
	struct st_header *h = NULL;
	char err[IPC_ERRLEN] = "";
	void *buf;
	size_t len;

	three(t);
	ck_assert_int_eq(st_header_build(t, 3, NULL, 0, &buf, &len, err), 0);
	ck_assert_int_eq(st_header_parse(buf, 0, len + 40, &h, err), -ENODATA);
	ck_assert_int_eq(st_header_parse(buf, 7, len + 40, &h, err), -ENODATA);
	ck_assert_int_eq(st_header_parse(buf, 8, len + 40, &h, err), -ENODATA);
	ck_assert_int_eq(st_header_parse(buf, len - 1, len + 40, &h, err), -ENODATA);
	ck_assert_ptr_null(h);
	/* -ENODATA comes after the length is checked against the file */
	ck_assert_int_eq(st_header_parse(buf, 8, 20, &h, err), -EINVAL);
	ck_assert_int_eq(st_header_parse(buf, len, len + 40, &h, err), 0);
	st_header_free(h);
	free(buf);
}
END_TEST

START_TEST(test_refuse_json)
{
	ck_refused("{not json}", 0, -EINVAL, "not valid JSON");
	ck_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}", 1, -EINVAL,
	           "not valid JSON");
	ck_refused("{} x", 0, -EINVAL, "not valid JSON");
	ck_refused(" {}", 0, -EINVAL, "'{'");
	ck_refused("[]", 0, -EINVAL, "'{'");
	ck_refused("{\"a\":\"\xff\"}", 0, -EINVAL, "not valid JSON");
	ck_refused("{\"a\":7}", 0, -EINVAL, "not a JSON object");
	/* and the smallest valid header, for contrast */
	ck_assert_int_eq(parse_json("{}", 0, NULL), 0);
	ck_assert_int_eq(parse_json("{}      ", 0, NULL), 0);
}
END_TEST

START_TEST(test_refuse_entries)
{
	ck_refused("{\"a\":{\"dtype\":\"F4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -EINVAL,
	           "unknown dtype 'F4'");
	ck_refused("{\"a\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -EINVAL,
	           "dtype");
	ck_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, -EINVAL,
	           "dimension 0");
	ck_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 1, -EINVAL,
	           "dimension 0");
	ck_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1, -EINVAL,
	           "not an array");
	ck_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"
	           "\"data_offsets\":[0,1]}}",
	           1, -EINVAL, "17 dimensions");
	ck_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, -EINVAL,
	           "data_offsets");
	ck_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, -EINVAL,
	           "data_offsets");
	ck_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,0]}}", 1, -EINVAL,
	           "end before");
	ck_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20,
	           -EINVAL, "tensor 'a': data_offsets [0, 20] do not match F32 x [2,3] = 24 bytes");
	ck_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,8],"
	           "\"data_offsets\":[0,0]}}",
	           0, -EOVERFLOW, "overflows");
	ck_refused("{\"a\":[1]}", 0, -EINVAL, "not a JSON object");
	ck_refused("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -EINVAL, "dtype");
}
END_TEST

START_TEST(test_refuse_names)
{
	char json[1024];

	ck_refused("{\"a\\u0001b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
	           -EINVAL, "control character");
	ck_refused("{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -EINVAL,
	           "empty");
	snprintf(json, sizeof(json),
	         "{\"%0600d\":{\"dtype\":\"U8\",\"shape\":[1],"
	         "\"data_offsets\":[0,1]}}",
	         0);
	ck_refused(json, 1, -EINVAL, "longer than");
	ck_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
	           "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
	           2, -EINVAL, "duplicate");
	ck_refused("{\"__metadata__\":{\"k\":1}}", 0, -EINVAL, "'k' is not a string");
	ck_refused("{\"__metadata__\":[]}", 0, -EINVAL, "__metadata__ is not");
	ck_refused("{\"__metadata__\":{},\"__metadata__\":{}}", 0, -EINVAL, "duplicate");
	/* a null __metadata__ is what the library reads as none */
	ck_assert_int_eq(parse_json("{\"__metadata__\":null}", 0, NULL), 0);
}
END_TEST

START_TEST(test_refuse_layout)
{
	/* gap: b starts at 28, a ends at 24 */
	ck_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]},"
	           "\"b\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[28,52]}}",
	           52, -EINVAL,
	           "'b' begins at byte 28 of the data, but the tensor before it ends at "
	           "24 (a gap)");
	/* overlap: b starts inside a */
	ck_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]},"
	           "\"b\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[20,44]}}",
	           44, -EINVAL, "an overlap");
	/* two tensors on the same bytes */
	ck_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]},"
	           "\"b\":{\"dtype\":\"I32\",\"shape\":[6],\"data_offsets\":[0,24]}}",
	           24, -EINVAL, "an overlap");
	/* not from 0 */
	ck_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[8,32]}}", 32, -EINVAL,
	           "nothing ends at 0");
	/* the last tensor ends before the end of the file, or after it */
	ck_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]}}", 25, -EINVAL,
	           "end at byte 24 of the data, but the file holds 25");
	ck_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]}}", 23, -EINVAL,
	           "file holds 23");
	ck_refused("{}", 1, -EINVAL, "file holds 1");
	/* in any order in the JSON, sorted by offset they tile the data */
	ck_assert_int_eq(
	    parse_json("{\"b\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[24,48]},"
	               "\"a\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]}}",
	               48, NULL),
	    0);
}
END_TEST

START_TEST(test_zero_size)
{
	static const int64_t s0[] = {0}, s2[] = {2}, s30[] = {3, 0};
	struct st_tensor t[] = {
	    {"empty", DT("F32"), 1, s0, 0, 0},
	    {"two", DT("F32"), 1, s2, 0, 8},
	    {"flat", DT("F16"), 2, s30, 8, 8},
	    {"scalar", DT("U8"), 0, NULL, 8, 9},
	};
	struct st_header *h;
	char err[IPC_ERRLEN] = "";
	void *buf;
	size_t len;

	ck_assert_int_eq(st_header_build(t, 4, NULL, 0, &buf, &len, err), 0);
	ck_assert_int_eq(st_header_parse(buf, len, len + 9, &h, err), 0);
	ck_assert_uint_eq(h->n, 4);
	ck_assert_str_eq(h->v[0].name, "empty");
	ck_assert_str_eq(h->v[1].name, "two");
	ck_assert_str_eq(h->v[2].name, "flat");
	ck_assert_uint_eq(h->v[2].ndim, 2);
	ck_assert_int_eq(h->v[2].shape[1], 0);
	ck_assert_str_eq(h->v[3].name, "scalar");
	ck_assert_uint_eq(h->v[3].ndim, 0);
	ck_assert_ptr_eq(st_header_find(h, "flat"), &h->v[2]);
	st_header_free(h);
	free(buf);

	/* only empty tensors: no data at all */
	ck_assert_int_eq(st_header_build(t, 1, NULL, 0, &buf, &len, err), 0);
	ck_assert_int_eq(st_header_parse(buf, len, len, &h, err), 0);
	ck_assert_uint_eq(h->n, 1);
	st_header_free(h);
	ck_assert_int_eq(st_header_parse(buf, len, len + 1, &h, err), -EINVAL);
	free(buf);

	/* and no tensors */
	ck_assert_int_eq(st_header_build(NULL, 0, NULL, 0, &buf, &len, err), 0);
	ck_assert_int_eq(st_header_parse(buf, len, len, &h, err), 0);
	ck_assert_uint_eq(h->n, 0);
	ck_assert_ptr_null(st_header_find(h, "x"));
	st_header_free(h);
	free(buf);
}
END_TEST

/* ---- st_header_read on real files -------------------------------------- */

static char tmpdir[512];

static void make_tmpdir(void)
{
	const char *base = getenv("CK_TMPDIR");

	snprintf(tmpdir, sizeof(tmpdir), "%s/st-XXXXXX", base && *base ? base : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tmpdir(void)
{
	char path[600];

	snprintf(path, sizeof(path), "%s/shard", tmpdir);
	unlink(path);
	rmdir(tmpdir);
}

/* Writes n bytes of `hdr` then `data` bytes of pattern; returns the path. */
static const char *write_shard(const void *hdr, size_t n, size_t data)
{
	static char path[600];
	uint8_t *d = malloc(data + 1);
	int fd;

	snprintf(path, sizeof(path), "%s/shard", tmpdir);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_ge(fd, 0);
	for (size_t i = 0; i < data; i++)
		d[i] = (uint8_t)i;
	ck_assert_int_eq(write(fd, hdr, n), (ssize_t)n);
	ck_assert_int_eq(write(fd, d, data), (ssize_t)data);
	close(fd);
	free(d);
	return path;
}

/* O_DIRECT where the filesystem takes it (tmpfs does not), else plain. */
static int open_shard(const char *path, uint64_t *size)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_DIRECT);

	if (fd < 0)
		fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	*size = (uint64_t)st.st_size;
	return fd;
}

/* n tensors of F32 [16] with long names: a header well past one read. */
static struct st_tensor *many(size_t n, char (*names)[80])
{
	static const int64_t s16[] = {16};
	struct st_tensor *t = calloc(n, sizeof(*t));

	for (size_t i = 0; i < n; i++) {
		snprintf(names[i], 80, "model.layers.%05zu.self_attn.q_proj.weight.padding", i);
		t[i] = (struct st_tensor){names[i], DT("F32"), 1, s16, i * 64, (i + 1) * 64};
	}
	return t;
}

START_TEST(test_read_file)
{
	struct st_tensor t[3];
	struct st_header *h;
	char err[IPC_ERRLEN] = "";
	uint64_t size;
	void *buf;
	size_t len;
	int fd;

	make_tmpdir();
	three(t);
	ck_assert_int_eq(st_header_build(t, 3, NULL, 0, &buf, &len, err), 0);
	fd = open_shard(write_shard(buf, len, 40), &size);
	ck_assert_uint_eq(size, len + 40);
	ck_assert_int_eq(st_header_read(fd, size, &h, err), 0);
	ck_assert_uint_eq(h->data_start, len);
	ck_assert_uint_eq(h->n, 3);
	ck_assert_str_eq(h->v[1].name, "model.b");
	ck_assert_uint_eq(h->v[2].end, 40);
	st_header_free(h);
	/* a size that disagrees with the file is refused */
	ck_assert_int_eq(st_header_read(fd, size + 1, &h, err), -EINVAL);
	ck_assert_ptr_null(h);
	close(fd);
	free(buf);
	remove_tmpdir();
}
END_TEST

START_TEST(test_read_large_header)
{
	const size_t n = 2000;
	char(*names)[80] = calloc(n, 80);
	struct st_tensor *t = many(n, names);
	struct st_header *h;
	char err[IPC_ERRLEN] = "";
	uint64_t size;
	void *buf;
	size_t len;
	int fd;

	make_tmpdir();
	ck_assert_int_eq(st_header_build(t, n, NULL, 0, &buf, &len, err), 0);
	ck_assert_uint_gt(len, 64 << 10); /* more than the first read */
	fd = open_shard(write_shard(buf, len, n * 64), &size);
	ck_assert_int_eq(st_header_read(fd, size, &h, err), 0);
	ck_assert_uint_eq(h->n, n);
	ck_assert_ptr_eq(st_header_find(h, names[1234]), &h->v[1234]);
	ck_assert_uint_eq(h->v[n - 1].end, n * 64);
	st_header_free(h);
	close(fd);

	/* cut inside the header, while the caller believes the full size */
	fd = open_shard(write_shard(buf, 70000, 0), &size);
	ck_assert_int_eq(st_header_read(fd, len + n * 64, &h, err), -EINVAL);
	ck_assert_msg(strstr(err, "ends at byte 70000"), "%s", err);
	close(fd);
	/* cut inside the length */
	fd = open_shard(write_shard(buf, 5, 0), &size);
	ck_assert_int_eq(st_header_read(fd, size, &h, err), -EINVAL);
	close(fd);
	free(buf);
	free(t);
	free(names);
	remove_tmpdir();
}
END_TEST

START_TEST(test_read_bad_fd)
{
	struct st_header *h;
	char err[IPC_ERRLEN] = "";

	ck_assert_int_eq(st_header_read(-1, 100, &h, err), -EBADF);
	ck_assert_ptr_nonnull(strstr(err, "reading"));
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("safetensors");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_roundtrip);
	tcase_add_test(tc, test_build_layout);
	tcase_add_test(tc, test_build_refuses);
	tcase_add_test(tc, test_refuse_length);
	tcase_add_test(tc, test_nodata);
	tcase_add_test(tc, test_refuse_json);
	tcase_add_test(tc, test_refuse_entries);
	tcase_add_test(tc, test_refuse_names);
	tcase_add_test(tc, test_refuse_layout);
	tcase_add_test(tc, test_zero_size);
	tcase_add_test(tc, test_read_file);
	tcase_add_test(tc, test_read_large_header);
	tcase_add_test(tc, test_read_bad_fd);
	suite_add_tcase(s, tc);
	return s;
}
