/*
 * safetensors.c: the header that opens every shard (docs/DESIGN.md §6.2).
 *
 * A shard is a plain safetensors file: an 8-byte little-endian length N, N
 * bytes of JSON naming each tensor's dtype, shape and byte range, then the
 * data, contiguous. st_header_build runs once per plan (the agent's worker
 * thread, at plan creation); st_header_parse and st_header_read run on the
 * caller's thread for verify and restore and treat the bytes as hostile:
 * they refuse what the safetensors library (Rust) refuses, so a shard we
 * accept loads there too, and nothing in a header can make us overflow,
 * read outside the buffer or allocate beyond what the header's size allows.
 *
 * Each save writes its step and a number of its own over two placeholders
 * of the header as it copies it (the stamp: st_stamp_apply), so that what
 * names a shard (a part, a manifest) can be checked against its bytes.
 *
 * Divisions: small helpers; build; parse (entries, metadata, layout); read;
 * the save's stamp.
 */
#define _GNU_SOURCE /* memmem */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "storage/format/format.h"

/* The data starts at a multiple of 8, so a reader can map typed arrays. */
#define ST_DATA_ALIGN 8u
/* What O_DIRECT asks of buffers, lengths and offsets on the disks we meet. */
#define ST_IO_ALIGN 4096u
/* First read: enough for a few hundred tensors; larger headers take two. */
#define ST_FIRST_READ (64u << 10)
#define ST_PREFIX "safetensors header: "

/* The public header plus an index by name, so lookups are O(log n). */
struct st_priv {
	struct st_header h;
	const struct st_entry **byname;
};

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* "[2,3]" for messages; "[...]" when it does not fit. */
static const char *fmt_shape(const int64_t *shape, size_t ndim, char *buf, size_t len)
{
	size_t j = 0;
	int w;

	buf[j++] = '[';
	for (size_t i = 0; i < ndim; i++) {
		w = snprintf(buf + j, len - j, "%s%lld", i ? "," : "", (long long)shape[i]);
		if (w < 0 || (size_t)w + 2 > len - j) {
			snprintf(buf, len, "[...]");
			return buf;
		}
		j += (size_t)w;
	}
	snprintf(buf + j, len - j, "]");
	return buf;
}

/* ---- build ------------------------------------------------------------- */

/* One tensor of a plan: a valid name, dtype x shape = its range, at `pos`. */
static int check_build_tensor(const struct st_tensor *t, size_t i, uint64_t pos, char *err)
{
	char msg[IPC_ERRLEN], sb[128];
	uint64_t nbytes;
	int rc;

	rc = ipc_check_tensor_name(t->name, msg);
	if (rc)
		return ipc_errf(err, rc, ST_PREFIX "tensor %zu: %s", i, msg);
	rc = ipc_tensor_nbytes(t->name, t->dtype, t->ndim, t->shape, &nbytes, msg);
	if (rc)
		return ipc_errf(err, rc, ST_PREFIX "%s", msg);
	if (t->begin != pos)
		return ipc_errf(err, -EINVAL,
		                ST_PREFIX "tensor '%s' begins at byte %" PRIu64 " of the data, but "
		                          "the tensors before it end at %" PRIu64
		                          ": tensors must be contiguous from 0 in order",
		                t->name, t->begin, pos);
	if (t->end < t->begin || t->end - t->begin != nbytes)
		return ipc_errf(err, -EINVAL,
		                ST_PREFIX "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
		                          "] do not match %s x %s = %" PRIu64 " bytes",
		                t->name, t->begin, t->end, ipc_dtype_name(t->dtype),
		                fmt_shape(t->shape, t->ndim, sb, sizeof(sb)), nbytes);
	/* jansson holds integers as long long */
	if (t->end > INT64_MAX)
		return ipc_errf(err, -EOVERFLOW,
		                ST_PREFIX "tensor '%s': end offset %" PRIu64 " is too large",
		                t->name, t->end);
	return 0;
}

static json_t *tensor_json(const struct st_tensor *t)
{
	json_t *o = json_object(), *shape = json_array(), *offs = json_array();
	bool ok = o && shape && offs;

	for (size_t i = 0; ok && i < t->ndim; i++)
		ok = json_array_append_new(shape, json_integer(t->shape[i])) == 0;
	ok = ok && json_array_append_new(offs, json_integer((json_int_t)t->begin)) == 0 &&
	     json_array_append_new(offs, json_integer((json_int_t)t->end)) == 0;
	ok = ok && json_object_set_new(o, "dtype", json_string(ipc_dtype_name(t->dtype))) == 0;
	ok = ok && json_object_set(o, "shape", shape) == 0 &&
	     json_object_set(o, "data_offsets", offs) == 0;
	json_decref(shape);
	json_decref(offs);
	if (!ok) {
		json_decref(o);
		return NULL;
	}
	return o;
}

static int build_meta(json_t *root, const struct st_meta *meta, size_t nmeta, char *err)
{
	json_t *m;

	if (nmeta == 0)
		return 0;
	m = json_object();
	if (!m || json_object_set_new(root, "__metadata__", m))
		return ipc_errf(err, -ENOMEM, ST_PREFIX "out of memory for __metadata__");
	for (size_t i = 0; i < nmeta; i++) {
		json_t *v;

		if (!meta[i].key || !meta[i].value)
			return ipc_errf(err, -EINVAL, ST_PREFIX "__metadata__ entry %zu is NULL",
			                i);
		if (json_object_get(m, meta[i].key))
			return ipc_errf(err, -EINVAL, ST_PREFIX "__metadata__ key '%s' given twice",
			                meta[i].key);
		/* json_string refuses what is not UTF-8 */
		v = json_string(meta[i].value);
		if (!v || json_object_set_new(m, meta[i].key, v))
			return ipc_errf(err, -EINVAL,
			                ST_PREFIX "__metadata__ entry %zu is not UTF-8 text", i);
	}
	return 0;
}

/* The JSON text: metadata first, then the tensors in the order given. */
static int build_json(const struct st_tensor *t, size_t n, const struct st_meta *meta, size_t nmeta,
                      char **text, char *err)
{
	json_t *root = json_object();
	uint64_t pos = 0;
	int rc;

	if (!root)
		return ipc_errf(err, -ENOMEM, ST_PREFIX "out of memory");
	rc = build_meta(root, meta, nmeta, err);
	for (size_t i = 0; rc == 0 && i < n; i++) {
		json_t *o;

		rc = check_build_tensor(&t[i], i, pos, err);
		if (rc)
			break;
		if (json_object_get(root, t[i].name)) {
			rc = ipc_errf(err, -EINVAL, ST_PREFIX "tensor name '%s' appears twice",
			              t[i].name);
			break;
		}
		o = tensor_json(&t[i]);
		if (!o || json_object_set_new(root, t[i].name, o))
			rc = ipc_errf(err, -ENOMEM, ST_PREFIX "out of memory for tensor '%s'",
			              t[i].name);
		pos = t[i].end;
	}
	if (rc == 0) {
		*text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
		if (!*text)
			rc = ipc_errf(err, -ENOMEM, ST_PREFIX "out of memory writing the JSON");
	}
	json_decref(root);
	return rc;
}

int st_header_build(const struct st_tensor *t, size_t n, const struct st_meta *meta, size_t nmeta,
                    void **out, size_t *len, char *err)
{
	char *text = NULL;
	uint8_t *buf;
	size_t tlen, hlen;
	int rc;

	*out = NULL;
	*len = 0;
	rc = build_json(t, n, meta, nmeta, &text, err);
	if (rc)
		return rc;
	tlen = strlen(text);
	/* 8 is a multiple of ST_DATA_ALIGN, so padding the JSON aligns the data */
	hlen = (tlen + ST_DATA_ALIGN - 1) / ST_DATA_ALIGN * ST_DATA_ALIGN;
	if (hlen > ST_MAX_HEADER) {
		rc = ipc_errf(err, -E2BIG,
		              ST_PREFIX "%zu bytes of JSON for %zu tensors, more than the %u that "
		                        "safetensors reads",
		              tlen, n, ST_MAX_HEADER);
		goto out_text;
	}
	buf = malloc(8 + hlen);
	if (!buf) {
		rc = ipc_errf(err, -ENOMEM, ST_PREFIX "out of memory for %zu bytes", 8 + hlen);
		goto out_text;
	}
	put_le64(buf, hlen);
	memcpy(buf + 8, text, tlen);
	/* trailing spaces are JSON whitespace: the library skips them */
	memset(buf + 8 + tlen, ' ', hlen - tlen);
	*out = buf;
	*len = 8 + hlen;
out_text:
	free(text);
	return rc;
}

/* ---- parse ------------------------------------------------------------- */

/* A non-negative JSON integer, the only kind safetensors' usize accepts. */
static bool get_uint(const json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return false;
	*out = (uint64_t)json_integer_value(v);
	return true;
}

static int parse_shape(const char *name, const json_t *v, struct st_entry *e, char *err)
{
	size_t i;
	json_t *d;

	if (!json_is_array(v))
		return ipc_errf(err, -EINVAL, ST_PREFIX "tensor '%s': shape is not an array", name);
	if (json_array_size(v) > IPC_MAX_NDIM)
		return ipc_errf(err, -EINVAL,
		                ST_PREFIX "tensor '%s': shape has %zu dimensions, at most %d", name,
		                json_array_size(v), IPC_MAX_NDIM);
	json_array_foreach(v, i, d)
	{
		uint64_t x;

		if (!get_uint(d, &x))
			return ipc_errf(err, -EINVAL,
			                ST_PREFIX "tensor '%s': dimension %zu of shape is not a "
			                          "non-negative integer",
			                name, i);
		e->shape[i] = (int64_t)x;
	}
	e->ndim = json_array_size(v);
	return 0;
}

static int parse_offsets(const char *name, const json_t *v, struct st_entry *e, char *err)
{
	char sb[128];
	uint64_t nbytes;
	int rc;

	if (!json_is_array(v) || json_array_size(v) != 2 ||
	    !get_uint(json_array_get(v, 0), &e->begin) || !get_uint(json_array_get(v, 1), &e->end))
		return ipc_errf(err, -EINVAL,
		                ST_PREFIX "tensor '%s': data_offsets is not [begin, end] of two "
		                          "non-negative integers",
		                name);
	if (e->end < e->begin)
		return ipc_errf(err, -EINVAL,
		                ST_PREFIX "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
		                          "] end before they begin",
		                name, e->begin, e->end);
	rc = ipc_tensor_nbytes(name, e->dtype, e->ndim, e->shape, &nbytes, err);
	if (rc)
		return ipc_errf(err, rc, ST_PREFIX "tensor '%s': %s x %s overflows", name,
		                ipc_dtype_name(e->dtype),
		                fmt_shape(e->shape, e->ndim, sb, sizeof(sb)));
	if (e->end - e->begin != nbytes)
		return ipc_errf(err, -EINVAL,
		                ST_PREFIX "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
		                          "] do not match %s x %s = %" PRIu64 " bytes",
		                name, e->begin, e->end, ipc_dtype_name(e->dtype),
		                fmt_shape(e->shape, e->ndim, sb, sizeof(sb)), nbytes);
	return 0;
}

/* One tensor: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}. */
static int parse_entry(const char *name, const json_t *v, struct st_entry *e, char *err)
{
	char msg[IPC_ERRLEN];
	const char *dt;
	int rc;

	rc = ipc_check_tensor_name(name, msg);
	if (rc)
		return ipc_errf(err, rc, ST_PREFIX "%s", msg);
	if (!json_is_object(v))
		return ipc_errf(err, -EINVAL, ST_PREFIX "tensor '%s' is not a JSON object", name);
	dt = json_string_value(json_object_get(v, "dtype"));
	if (!dt)
		return ipc_errf(err, -EINVAL,
		                ST_PREFIX "tensor '%s': dtype is missing or not a string", name);
	e->dtype = ipc_dtype_from_name(dt);
	if (!e->dtype)
		return ipc_errf(err, -EINVAL, ST_PREFIX "tensor '%s': unknown dtype '%.32s'", name,
		                dt);
	rc = parse_shape(name, json_object_get(v, "shape"), e, err);
	if (rc)
		return rc;
	rc = parse_offsets(name, json_object_get(v, "data_offsets"), e, err);
	if (rc)
		return rc;
	e->name = strdup(name);
	if (!e->name)
		return ipc_errf(err, -ENOMEM, ST_PREFIX "out of memory for tensor '%s'", name);
	return 0;
}

/* __metadata__: a map of strings to strings (null: none, as in the library). */
static int parse_meta(struct st_header *h, const json_t *m, char *err)
{
	const char *k;
	json_t *v;

	if (json_is_null(m))
		return 0;
	if (!json_is_object(m))
		return ipc_errf(err, -EINVAL, ST_PREFIX "__metadata__ is not a JSON object");
	h->meta_keys = calloc(json_object_size(m) + 1, sizeof(char *));
	h->meta_values = calloc(json_object_size(m) + 1, sizeof(char *));
	if (!h->meta_keys || !h->meta_values)
		return ipc_errf(err, -ENOMEM, ST_PREFIX "out of memory for __metadata__");
	json_object_foreach((json_t *)m, k, v)
	{
		if (!json_is_string(v))
			return ipc_errf(err, -EINVAL,
			                ST_PREFIX "__metadata__ value of '%.64s' is not a string",
			                k);
		h->meta_keys[h->nmeta] = strdup(k);
		h->meta_values[h->nmeta] = strdup(json_string_value(v));
		h->nmeta++;
		if (!h->meta_keys[h->nmeta - 1] || !h->meta_values[h->nmeta - 1])
			return ipc_errf(err, -ENOMEM, ST_PREFIX "out of memory for __metadata__");
	}
	return 0;
}

static int cmp_offsets(const void *a, const void *b)
{
	const struct st_entry *x = a, *y = b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return strcmp(x->name, y->name);
}

/*
 * Sorted by offsets, the ranges must tile [0, data_len) exactly: a gap is
 * bytes nobody owns, an overlap is two tensors sharing bytes, and either
 * means the header does not describe this file.
 */
static int check_layout(struct st_header *h, uint64_t data_len, char *err)
{
	uint64_t pos = 0;

	qsort(h->v, h->n, sizeof(*h->v), cmp_offsets);
	for (size_t i = 0; i < h->n; i++) {
		const struct st_entry *e = &h->v[i];

		if (e->begin != pos)
			return ipc_errf(err, -EINVAL,
			                ST_PREFIX "tensor '%s' begins at byte %" PRIu64
			                          " of the data, but %s ends at %" PRIu64 " (%s)",
			                e->name, e->begin, i ? "the tensor before it" : "nothing",
			                pos, e->begin > pos ? "a gap" : "an overlap");
		pos = e->end;
	}
	if (pos != data_len)
		return ipc_errf(err, -EINVAL,
		                ST_PREFIX "the tensors end at byte %" PRIu64
		                          " of the data, but the file holds %" PRIu64
		                          " bytes of data",
		                pos, data_len);
	return 0;
}

static int cmp_byname(const void *a, const void *b)
{
	const struct st_entry *const *x = a, *const *y = b;

	return strcmp((*x)->name, (*y)->name);
}

static int parse_root(struct st_priv *p, const json_t *root, uint64_t data_len, char *err)
{
	struct st_header *h = &p->h;
	const char *k;
	json_t *v;
	int rc;

	h->v = calloc(json_object_size(root) + 1, sizeof(*h->v));
	p->byname = calloc(json_object_size(root) + 1, sizeof(*p->byname));
	if (!h->v || !p->byname)
		return ipc_errf(err, -ENOMEM, ST_PREFIX "out of memory for %zu tensors",
		                json_object_size(root));
	json_object_foreach((json_t *)root, k, v)
	{
		if (strcmp(k, "__metadata__") == 0)
			rc = parse_meta(h, v, err);
		else
			rc = parse_entry(k, v, &h->v[h->n++], err);
		if (rc)
			return rc;
	}
	rc = check_layout(h, data_len, err);
	if (rc)
		return rc;
	for (size_t i = 0; i < h->n; i++)
		p->byname[i] = &h->v[i];
	qsort(p->byname, h->n, sizeof(*p->byname), cmp_byname);
	return 0;
}

/* The 8-byte length: within the library's bound and within the file. */
static int check_length(const uint8_t *b, size_t len, uint64_t file_size, uint64_t *hlen, char *err)
{
	if (file_size < 8)
		return ipc_errf(err, -EINVAL,
		                ST_PREFIX "the file has %" PRIu64 " bytes, fewer than the 8 of the "
		                          "header length",
		                file_size);
	if (len < 8)
		return -ENODATA;
	*hlen = get_le64(b);
	if (*hlen > ST_MAX_HEADER)
		return ipc_errf(err, -EINVAL,
		                ST_PREFIX "length %" PRIu64 " is larger than the %u safetensors "
		                          "accepts",
		                *hlen, ST_MAX_HEADER);
	if (*hlen > file_size - 8)
		return ipc_errf(err, -EINVAL,
		                ST_PREFIX "length %" PRIu64
		                          " runs past the end of the file (%" PRIu64 " bytes)",
		                *hlen, file_size);
	if (*hlen > len - 8)
		return -ENODATA;
	return 0;
}

int st_header_parse(const void *buf, size_t len, uint64_t file_size, struct st_header **out,
                    char *err)
{
	const uint8_t *b = buf;
	struct st_priv *p;
	json_error_t je;
	json_t *root;
	uint64_t hlen = 0;
	int rc;

	*out = NULL;
	rc = check_length(b, len, file_size, &hlen, err);
	if (rc)
		return rc;
	/* the library insists on '{' first: no leading whitespace, no arrays */
	if (hlen == 0 || b[8] != '{')
		return ipc_errf(err, -EINVAL, ST_PREFIX "does not start with '{'");
	root = json_loadb((const char *)b + 8, hlen, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return ipc_errf(err, -EINVAL,
		                ST_PREFIX "not valid JSON: %s (byte %d of the header, line %d)",
		                je.text, je.position, je.line);
	if (!json_is_object(root)) {
		rc = ipc_errf(err, -EINVAL, ST_PREFIX "is not a JSON object");
		goto out_root;
	}
	p = calloc(1, sizeof(*p));
	if (!p) {
		rc = ipc_errf(err, -ENOMEM, ST_PREFIX "out of memory");
		goto out_root;
	}
	p->h.data_start = 8 + hlen;
	rc = parse_root(p, root, file_size - p->h.data_start, err);
	if (rc) {
		st_header_free(&p->h);
		goto out_root;
	}
	*out = &p->h;
out_root:
	json_decref(root);
	return rc;
}

/* ---- read -------------------------------------------------------------- */

/*
 * Reads the first `want` bytes (fewer at the end of the file) into an
 * aligned buffer of aligned length, so an O_DIRECT descriptor works too.
 */
static int read_prefix(int fd, uint64_t want, uint8_t **out, size_t *got, char *err)
{
	size_t alen = (want + ST_IO_ALIGN - 1) / ST_IO_ALIGN * ST_IO_ALIGN;
	void *buf;
	size_t n = 0;

	if (posix_memalign(&buf, ST_IO_ALIGN, alen ? alen : ST_IO_ALIGN))
		return ipc_errf(err, -ENOMEM, ST_PREFIX "out of memory for %zu bytes", alen);
	while (n < want) {
		ssize_t r = pread(fd, (uint8_t *)buf + n, alen - n, (off_t)n);

		if (r < 0 && errno == EINTR)
			continue;
		/* O_DIRECT refuses the unaligned offset after a short read: the end */
		if (r < 0 && errno == EINVAL && n % ST_IO_ALIGN)
			break;
		if (r < 0) {
			int e = errno;

			free(buf);
			return ipc_errf(err, -e, ST_PREFIX "reading bytes %zu..%zu: %s", n, alen,
			                strerror(e));
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	*out = buf;
	*got = n < want ? n : (size_t)want;
	return 0;
}

int st_header_read(int fd, uint64_t file_size, struct st_header **out, char *err)
{
	uint64_t want = file_size < ST_FIRST_READ ? file_size : ST_FIRST_READ;
	uint8_t *buf = NULL;
	size_t got = 0;
	int rc;

	*out = NULL;
	for (int pass = 0; pass < 2; pass++) {
		rc = read_prefix(fd, want, &buf, &got, err);
		if (rc)
			return rc;
		rc = st_header_parse(buf, got, file_size, out, err);
		if (rc != -ENODATA)
			break;
		/* the length is checked against the file: this read is bounded */
		want = got >= 8 ? 8 + get_le64(buf) : 8;
		free(buf);
		buf = NULL;
	}
	if (rc == -ENODATA)
		rc = ipc_errf(err, -EINVAL,
		              ST_PREFIX "the file ends at byte %zu, before the header does (byte "
		                        "%" PRIu64 "), though its size is %" PRIu64,
		              got, want, file_size);
	free(buf);
	return rc;
}

void st_header_free(struct st_header *h)
{
	struct st_priv *p = (struct st_priv *)h;

	if (!h)
		return;
	for (size_t i = 0; i < h->n; i++)
		free(h->v[i].name);
	for (size_t i = 0; i < h->nmeta; i++) {
		free(h->meta_keys[i]);
		free(h->meta_values[i]);
	}
	free(h->v);
	free(h->meta_keys);
	free(h->meta_values);
	free(p->byname);
	free(p);
}

const struct st_entry *st_header_find(const struct st_header *h, const char *name)
{
	const struct st_priv *p = (const struct st_priv *)h;
	size_t lo = 0, hi = h ? h->n : 0;

	while (name && lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(name, p->byname[mid]->name);

		if (c == 0)
			return p->byname[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

/* ---- the save's stamp --------------------------------------------------- */

int st_said_once(const void *buf, size_t len, const char *key, const char *value, size_t *at)
{
	char pat[IPC_MAX_JOB + 32];
	const char *b = buf, *p;
	int n = snprintf(pat, sizeof(pat), "\"%s\":\"%s\"", key, value);

	if (n <= 0 || (size_t)n >= sizeof(pat))
		return -EINVAL;
	p = memmem(b, len, pat, (size_t)n);
	if (!p)
		return -ENOENT;
	if (memmem(p + 1, len - (size_t)(p + 1 - b), pat, (size_t)n))
		return -EEXIST;
	*at = (size_t)(p - b) + strlen(key) + 4; /* past "key":" */
	return 0;
}

/* The offset of `"key":"value"`'s value in buf, if it is there exactly once. */
static int find_once(const char *buf, size_t len, const char *key, const char *value, size_t *at,
                     char *err)
{
	int rc = st_said_once(buf, len, key, value, at);

	if (rc)
		return ipc_errf(err, -EINVAL,
		                ST_PREFIX "the placeholder of \"%s\" is %s in the header built",
		                key, rc == -EEXIST ? "there twice" : "not");
	return 0;
}

int st_stamp_find(const void *header, size_t len, struct st_stamp_at *at, char *err)
{
	int rc = find_once(header, len, "step", ST_STAMP_STEP, &at->step, err);

	return rc ? rc : find_once(header, len, "save", ST_STAMP_SAVE, &at->save, err);
}

/* The bytes of text that fall in [off, off + len), written at `pos` of the shard. */
static void put_part(const char *text, size_t n, uint64_t pos, uint64_t off, char *dst,
                     uint64_t len)
{
	for (size_t i = 0; i < n; i++)
		if (pos + i >= off && pos + i < off + len)
			dst[pos + i - off] = text[i];
}

void st_stamp_apply(const struct st_stamp_at *at, const struct st_stamp *st, uint64_t off,
                    void *dst, uint64_t len)
{
	char step[16], save[24];

	if (!at->step || !at->save)
		return;
	snprintf(step, sizeof(step), "%012" PRId64, st->step);
	snprintf(save, sizeof(save), "%016" PRIx64, st->save);
	put_part(step, 12, at->step, off, dst, len);
	put_part(save, 16, at->save, off, dst, len);
}

const char *st_header_meta(const struct st_header *h, const char *key)
{
	for (size_t i = 0; h && i < h->nmeta; i++)
		if (strcmp(h->meta_keys[i], key) == 0)
			return h->meta_values[i];
	return NULL;
}

/* n digits of base 10 or 16 into *v; false if it is anything else. */
static bool all_digits(const char *s, size_t n, int base, uint64_t *v)
{
	char *end;

	if (!s || strlen(s) != n || strspn(s, base == 10 ? "0123456789" : "0123456789abcdef") != n)
		return false;
	*v = strtoull(s, &end, base);
	return *end == '\0';
}

int st_header_stamp(const struct st_header *h, struct st_stamp *out)
{
	const char *step = st_header_meta(h, "step"), *save = st_header_meta(h, "save");
	uint64_t v1, v2;

	if (!step && !save)
		return -ENODATA;
	if (!all_digits(step, 12, 10, &v1) || !all_digits(save, 16, 16, &v2) || v2 == 0)
		return -EINVAL;
	out->step = (int64_t)v1;
	out->save = v2;
	return 0;
}
