/*
 * fmt.c: what the format files share (fmt.h): JSON fields read as hostile
 * input, tensors and chunks both ways, the user meta, and the checks of one
 * chunk and of one file's byte ranges. Pure functions; any thread.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "storage/format/fmt.h"

/* ---- fields ------------------------------------------------------------ */

int fmt_int(const json_t *obj, const char *key, int64_t min, int64_t max, int64_t *out,
            const char *what, const char *where, char *err)
{
	const json_t *v = json_object_get(obj, key);

	if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
		return ipc_errf(
		    err, -EINVAL, "%s: %s: \"%s\" is %s, expected an integer in %lld..%lld", what,
		    where, key,
		    v ? (json_is_integer(v) ? "out of range" : "not an integer") : "missing",
		    (long long)min, (long long)max);
	*out = json_integer_value(v);
	return 0;
}

int fmt_str(const json_t *obj, const char *key, const char **out, const char *what,
            const char *where, char *err)
{
	*out = json_string_value(json_object_get(obj, key));
	if (!*out)
		return ipc_errf(err, -EINVAL, "%s: %s: \"%s\" is missing or not a string", what,
		                where, key);
	return 0;
}

int fmt_hex_put(json_t *o, const char *key, uint64_t v)
{
	char hex[24];

	snprintf(hex, sizeof(hex), "%016" PRIx64, v);
	return json_object_set_new(o, key, json_string(hex)) ? -ENOMEM : 0;
}

int fmt_hex_read(const json_t *o, const char *key, uint64_t *v, const char *what, const char *where,
                 char *err)
{
	const char *s = json_string_value(json_object_get(o, key));

	*v = 0;
	if (!s || strlen(s) != 16 || strspn(s, "0123456789abcdef") != 16)
		return ipc_errf(err, -EINVAL, "%s: %s: \"%s\" is not 16 lowercase hex digits", what,
		                where, key);
	*v = strtoull(s, NULL, 16);
	return 0;
}

int fmt_save_put(json_t *o, uint64_t save)
{
	return save ? fmt_hex_put(o, "save", save) : 0;
}

int fmt_save_read(const json_t *o, uint64_t *save, const char *what, const char *where, char *err)
{
	*save = 0;
	if (!json_object_get(o, "save"))
		return 0;
	if (fmt_hex_read(o, "save", save, what, where, err) || !*save)
		return ipc_errf(err, -EINVAL, "%s: %s: \"save\" is not 16 hex digits (not 0)", what,
		                where);
	return 0;
}

int fmt_name(const json_t *obj, const char *key, int (*check)(const char *, char *), char **out,
             const char *what, const char *where, char *err)
{
	const json_t *v = json_object_get(obj, key);
	char why[IPC_ERRLEN];
	const char *s;
	int rc = fmt_str(obj, key, &s, what, where, err);

	if (rc)
		return rc;
	/* a NUL inside the string would cut the name short: not a name */
	if (strlen(s) != json_string_length(v))
		return ipc_errf(err, -EINVAL, "%s: %s: \"%s\" holds a NUL byte", what, where, key);
	rc = check(s, why);
	if (rc)
		return ipc_errf(err, rc, "%s: %s: \"%s\": %s", what, where, key, why);
	*out = strdup(s);
	return *out ? 0 : ipc_errf(err, -ENOMEM, "%s: out of memory", what);
}

int fmt_dims(const json_t *obj, const char *key, long n, int64_t *out, size_t *got,
             const char *what, const char *where, char *err)
{
	const json_t *a = json_object_get(obj, key);
	size_t len = json_array_size(a);

	if (!json_is_array(a) || (n >= 0 && len != (size_t)n) || len > IPC_MAX_NDIM)
		return ipc_errf(err, -EINVAL, "%s: %s: \"%s\" is not an array of %s%ld integers",
		                what, where, key, n >= 0 ? "" : "at most ",
		                n >= 0 ? n : (long)IPC_MAX_NDIM);
	for (size_t i = 0; i < len; i++) {
		const json_t *v = json_array_get(a, i);

		if (!json_is_integer(v) || json_integer_value(v) < 0)
			return ipc_errf(err, -EINVAL,
			                "%s: %s: \"%s\"[%zu] is not a non-negative integer", what,
			                where, key, i);
		out[i] = json_integer_value(v);
	}
	if (got)
		*got = len;
	return 0;
}

json_t *fmt_ints(const int64_t *v, size_t n)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < n; i++)
		if (json_array_append_new(a, json_integer(v[i]))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

/* ---- tensors ----------------------------------------------------------- */

static json_t *chunk_json(const struct manifest_tensor *t, const struct manifest_chunk *c,
                          bool sums)
{
	int64_t range[2] = {(int64_t)c->begin, (int64_t)c->end};
	json_t *o;
	char hex[17];

	o = json_pack("{s:i}", "rank", c->rank);
	if (o && t->sharded &&
	    json_object_set_new(o, "global_offset", fmt_ints(c->global_offset, t->ndim)))
		goto fail;
	if (o && json_object_set_new(o, "shape", fmt_ints(c->shape, t->ndim)))
		goto fail;
	if (!sums)
		return o;
	snprintf(hex, sizeof(hex), "%016" PRIx64, c->xxh3);
	if (o && (json_object_set_new(o, "byte_range", fmt_ints(range, 2)) ||
	          json_object_set_new(o, "xxh3", json_string(hex))))
		goto fail;
	return o;
fail:
	json_decref(o);
	return NULL;
}

json_t *fmt_tensor_json(const struct manifest_tensor *t, bool sums)
{
	json_t *chunks = json_array();

	for (size_t j = 0; chunks && j < t->nchunks; j++)
		if (json_array_append_new(chunks, chunk_json(t, &t->chunks[j], sums))) {
			json_decref(chunks);
			return NULL;
		}
	/* "o" steals the reference, and a NULL makes json_pack fail cleanly */
	return json_pack("{s:s, s:o, s:b, s:o}", "dtype", ipc_dtype_name(t->dtype), "global_shape",
	                 fmt_ints(t->global_shape, t->ndim), "sharded", t->sharded, "chunks",
	                 chunks);
}

/* Exactly 16 lowercase hex digits: one spelling per value, so text compares. */
static int parse_hex64(const char *s, uint64_t *out)
{
	if (strlen(s) != 16 || strspn(s, "0123456789abcdef") != 16)
		return -EINVAL;
	*out = strtoull(s, NULL, 16);
	return 0;
}

static int parse_chunk(const struct manifest_tensor *t, size_t j, const json_t *o, bool sums,
                       struct manifest_chunk *c, const char *what, char *err)
{
	char where[IPC_MAX_TENSOR_NAME + 64];
	int64_t v = 0, range[2]; /* = 0: -O3 cannot see that fmt_int sets it on success */
	const char *hex;
	int rc;

	snprintf(where, sizeof(where), "tensor '%s' chunk %zu", t->name, j);
	if (!json_is_object(o))
		return ipc_errf(err, -EINVAL, "%s: %s is not an object", what, where);
	rc = fmt_int(o, "rank", 0, IPC_MAX_WORLD - 1, &v, what, where, err);
	if (rc)
		return rc;
	c->rank = (int)v;
	rc = fmt_dims(o, "shape", (long)t->ndim, c->shape, NULL, what, where, err);
	if (rc == 0 && (t->sharded || json_object_get(o, "global_offset")))
		rc = fmt_dims(o, "global_offset", (long)t->ndim, c->global_offset, NULL, what,
		              where, err);
	if (rc || !sums)
		return rc;
	rc = fmt_dims(o, "byte_range", 2, range, NULL, what, where, err);
	if (rc == 0)
		rc = fmt_str(o, "xxh3", &hex, what, where, err);
	if (rc)
		return rc;
	if (parse_hex64(hex, &c->xxh3))
		return ipc_errf(err, -EINVAL, "%s: %s: xxh3 '%.32s' is not 16 lowercase hex digits",
		                what, where, hex);
	c->begin = (uint64_t)range[0];
	c->end = (uint64_t)range[1];
	return 0;
}

int fmt_tensor_parse(const char *name, const json_t *o, bool sums, struct manifest_tensor *t,
                     const char *what, char *err)
{
	char where[IPC_MAX_TENSOR_NAME + 32];
	const json_t *chunks, *sh;
	const char *dt;
	int rc;

	/* first, so that the messages below quote a printable name */
	rc = ipc_check_tensor_name(name, where);
	if (rc)
		return ipc_errf(err, rc, "%s: %s", what, where);
	t->name = strdup(name);
	if (!t->name)
		return ipc_errf(err, -ENOMEM, "%s: out of memory", what);
	snprintf(where, sizeof(where), "tensor '%s'", name);
	if (!json_is_object(o))
		return ipc_errf(err, -EINVAL, "%s: %s is not an object", what, where);
	rc = fmt_str(o, "dtype", &dt, what, where, err);
	if (rc == 0 && !(t->dtype = ipc_dtype_from_name(dt)))
		rc = ipc_errf(err, -EINVAL, "%s: %s: unknown dtype '%.32s'", what, where, dt);
	if (rc == 0)
		rc = fmt_dims(o, "global_shape", -1, t->global_shape, &t->ndim, what, where, err);
	if (rc)
		return rc;
	sh = json_object_get(o, "sharded");
	chunks = json_object_get(o, "chunks");
	if (!json_is_boolean(sh) || !json_is_array(chunks))
		return ipc_errf(err, -EINVAL,
		                "%s: %s: \"sharded\" (boolean) or \"chunks\" (array) is missing",
		                what, where);
	t->sharded = json_is_true(sh);
	t->chunks = calloc(json_array_size(chunks) + 1, sizeof(*t->chunks));
	if (!t->chunks)
		return ipc_errf(err, -ENOMEM, "%s: out of memory for %s", what, where);
	t->nchunks = json_array_size(chunks);
	for (size_t j = 0; j < t->nchunks && rc == 0; j++)
		rc = parse_chunk(t, j, json_array_get(chunks, j), sums, &t->chunks[j], what, err);
	return rc;
}

void fmt_tensors_free(struct manifest_tensor *t, size_t n)
{
	for (size_t i = 0; t && i < n; i++) {
		free(t[i].name);
		free(t[i].chunks);
	}
	free(t);
}

int fmt_cmp_tensor(const void *a, const void *b)
{
	return strcmp(((const struct manifest_tensor *)a)->name,
	              ((const struct manifest_tensor *)b)->name);
}

int fmt_tensors_dup(const struct manifest_tensor *v, size_t n, struct manifest_tensor **out)
{
	struct manifest_tensor *d = n ? calloc(n, sizeof(*d)) : NULL;

	*out = NULL;
	if (n && !d)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		d[i] = v[i];
		d[i].name = strdup(v[i].name);
		d[i].chunks = malloc((v[i].nchunks ? v[i].nchunks : 1) * sizeof(*d[i].chunks));
		if (!d[i].name || !d[i].chunks) {
			fmt_tensors_free(d, i + 1);
			return -ENOMEM;
		}
		memcpy(d[i].chunks, v[i].chunks, v[i].nchunks * sizeof(*d[i].chunks));
	}
	*out = d;
	return 0;
}

/* ---- what a rank holds --------------------------------------------------- */

json_t *fmt_tensors_json(const struct manifest_tensor *v, size_t n, bool sums)
{
	json_t *o = json_object();

	for (size_t i = 0; o && i < n; i++)
		if (json_object_set_new(o, v[i].name, fmt_tensor_json(&v[i], sums))) {
			json_decref(o);
			return NULL;
		}
	return o;
}

int fmt_tensors_parse(const json_t *o, bool sums, struct manifest_tensor **v, size_t *n,
                      const char *what, char *err)
{
	const char *name;
	json_t *t;
	int rc;

	*n = 0;
	*v = calloc(json_object_size(o) + 1, sizeof(**v));
	if (!*v)
		return ipc_errf(err, -ENOMEM, "%s: out of memory for %zu tensors", what,
		                json_object_size(o));
	json_object_foreach((json_t *)o, name, t)
	{
		rc = fmt_tensor_parse(name, t, sums, &(*v)[(*n)++], what, err);
		if (rc)
			return rc; /* the caller frees *v, half made */
	}
	qsort(*v, *n, sizeof(**v), fmt_cmp_tensor);
	return 0;
}

json_t *fmt_holds_json(const struct manifest_tensor *v, size_t n)
{
	return fmt_tensors_json(v, n, false);
}

int fmt_holds_parse(const json_t *o, struct manifest_tensor **v, size_t *n, const char *what,
                    char *err)
{
	*v = NULL;
	*n = 0;
	if (!json_is_object(o) || json_object_size(o) > IPC_MAX_TENSORS)
		return ipc_errf(err, -EINVAL,
		                "%s: \"holds\" is not an object of at most %d tensors", what,
		                IPC_MAX_TENSORS);
	return fmt_tensors_parse(o, false, v, n, what, err);
}

int fmt_check_holds(const struct manifest_tensor *v, size_t n, int rank, const char *what,
                    char *err)
{
	char msg[IPC_ERRLEN];
	uint64_t nbytes;
	int rc;

	if (n > IPC_MAX_TENSORS || (n && !v))
		return ipc_errf(err, -EINVAL, "%s: rank %d holds %zu tensors", what, rank, n);
	for (size_t i = 0; i < n; i++) {
		const struct manifest_tensor *t = &v[i];
		const struct manifest_chunk *c = t->chunks;

		if ((rc = ipc_check_tensor_name(t->name, msg)))
			return ipc_errf(err, rc, "%s: rank %d holds %s", what, rank, msg);
		if (i > 0 && strcmp(v[i - 1].name, t->name) >= 0)
			return ipc_errf(err, -EINVAL,
			                "%s: rank %d holds tensor '%s' out of order or twice", what,
			                rank, t->name);
		if (!ipc_dtype_name(t->dtype) || t->ndim > IPC_MAX_NDIM || t->nchunks != 1 || !c ||
		    c->rank != rank)
			return ipc_errf(
			    err, -EINVAL,
			    "%s: rank %d holds tensor '%s' without a known dtype, at most "
			    "%d dimensions and one box of its own",
			    what, rank, t->name, IPC_MAX_NDIM);
		if ((rc = ipc_tensor_nbytes(t->name, t->dtype, t->ndim, c->shape, &nbytes, msg)))
			return ipc_errf(err, rc, "%s: rank %d holds %s", what, rank, msg);
		for (size_t d = 0; d < t->ndim; d++) {
			int64_t g = t->global_shape[d], o = c->global_offset[d], l = c->shape[d];

			if (g < 0 || o < 0 || o > g || l > g - o || (!t->sharded && (o || l != g)))
				return ipc_errf(err, -EINVAL,
				                "%s: rank %d holds tensor '%s' outside its global "
				                "shape (dimension %zu)",
				                what, rank, t->name, d);
		}
	}
	return 0;
}

bool fmt_holds_chunk(const struct manifest_tensor *v, size_t n, const struct manifest_tensor *t,
                     const struct manifest_chunk *c)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int cmp = strcmp(v[mid].name, t->name);

		if (cmp == 0) {
			const struct manifest_tensor *h = &v[mid];
			const struct manifest_chunk *b = h->chunks;

			if (h->dtype != t->dtype || h->ndim != t->ndim ||
			    h->sharded != t->sharded ||
			    memcmp(h->global_shape, t->global_shape, t->ndim * sizeof(int64_t)))
				return false;
			for (size_t d = 0; d < t->ndim; d++)
				if (c->global_offset[d] < b->global_offset[d] ||
				    c->global_offset[d] - b->global_offset[d] >
				        b->shape[d] - c->shape[d])
					return false;
			return true;
		}
		if (cmp < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

/* ---- meta -------------------------------------------------------------- */

int fmt_meta_value(const char *text, json_t **out, const char *what, char *err)
{
	json_error_t je;

	*out = text && *text ? json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je)
	                     : json_null();
	if (!*out)
		return ipc_errf(err, -EINVAL, "%s: meta is not JSON: %s (column %d)", what, je.text,
		                je.column);
	return 0;
}

int fmt_meta_text(const json_t *v, char **out, const char *what, char *err)
{
	*out = NULL;
	if (!v || json_is_null(v))
		return 0;
	*out = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
	if (!*out)
		return ipc_errf(err, -ENOMEM, "%s: out of memory for meta", what);
	if (strlen(*out) > IPC_MAX_META) {
		free(*out);
		*out = NULL;
		return ipc_errf(err, -EINVAL, "%s: meta is longer than %d bytes", what,
		                IPC_MAX_META);
	}
	return 0;
}

int fmt_meta_put(json_t *o, const char *text, const char *what, char *err)
{
	json_t *v;
	int rc = fmt_meta_value(text, &v, what, err);

	if (rc)
		return rc;
	if (json_object_set_new(o, "meta", v))
		return ipc_errf(err, -ENOMEM, "%s: out of memory for meta", what);
	if (text && *text) { /* the text only where writing the value again would change it */
		char *again = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
		bool same = again && strcmp(again, text) == 0;

		free(again);
		if (!same && json_object_set_new(o, "meta_raw", json_string(text)))
			return ipc_errf(err, -ENOMEM, "%s: out of memory for meta", what);
	}
	return 0;
}

int fmt_meta_read(const json_t *o, char **out, const char *what, char *err)
{
	const json_t *v = json_object_get(o, "meta"), *raw = json_object_get(o, "meta_raw");
	char ignored[IPC_ERRLEN];
	json_t *back = NULL;

	if (json_is_string(raw) && json_string_length(raw) <= IPC_MAX_META &&
	    strlen(json_string_value(raw)) == json_string_length(raw) && /* no NUL inside */
	    fmt_meta_value(json_string_value(raw), &back, what, ignored) == 0) {
		bool same = json_equal(back, v ? v : json_null());

		json_decref(back);
		if (same) {
			*out = strdup(json_string_value(raw));
			return *out ? 0
			            : ipc_errf(err, -ENOMEM, "%s: out of memory for meta", what);
		}
	}
	return fmt_meta_text(v, out, what, err);
}

/* ---- checks ------------------------------------------------------------ */

/*
 * Chunks. A tensor is a global array of global_shape. Each chunk is the box
 * [global_offset, global_offset + shape) of it, stored row-major in bytes
 * [begin, end) of its rank's file, so (end - begin) == dtype x shape, and
 * the range lies in the file's data: header_bytes <= begin <= end <= size.
 * The box must lie inside the global shape. An unsharded tensor is saved
 * whole by one rank: one chunk, offset zero, shape == global_shape.
 */
int fmt_check_chunk(const struct manifest_tensor *t, size_t j, const struct manifest_rank *k,
                    int world, const char *what, char *err)
{
	const struct manifest_chunk *c = &t->chunks[j];
	uint64_t nbytes;
	char msg[IPC_ERRLEN];
	int rc;

	if (c->rank < 0 || c->rank >= world)
		return ipc_errf(err, -EINVAL,
		                "%s: tensor '%s' chunk %zu: rank %d is outside world %d", what,
		                t->name, j, c->rank, world);
	rc = ipc_tensor_nbytes(t->name, t->dtype, t->ndim, c->shape, &nbytes, msg);
	if (rc)
		return ipc_errf(err, rc, "%s: chunk %zu (rank %d): %s", what, j, c->rank, msg);
	if (c->end < c->begin || c->end - c->begin != nbytes)
		return ipc_errf(err, -EINVAL,
		                "%s: tensor '%s' chunk %zu (rank %d): byte_range [%" PRIu64
		                ", %" PRIu64 "] does not hold %s x shape = %" PRIu64 " bytes",
		                what, t->name, j, c->rank, c->begin, c->end,
		                ipc_dtype_name(t->dtype), nbytes);
	if (c->begin < k->header_bytes || c->end > k->size)
		return ipc_errf(err, -EINVAL,
		                "%s: tensor '%s' chunk %zu: byte_range [%" PRIu64 ", %" PRIu64
		                "] is outside the data of %s (bytes %" PRIu64 "..%" PRIu64 ")",
		                what, t->name, j, c->begin, c->end, k->file, k->header_bytes,
		                k->size);
	for (size_t d = 0; d < t->ndim; d++) {
		int64_t g = t->global_shape[d], o = c->global_offset[d], l = c->shape[d];

		if (!t->sharded && (o != 0 || l != g))
			return ipc_errf(err, -EINVAL,
			                "%s: tensor '%s' is unsharded, but its chunk is not all of "
			                "it (dimension %zu)",
			                what, t->name, d);
		if (o < 0 || o > g || l > g - o)
			return ipc_errf(err, -EINVAL,
			                "%s: tensor '%s' chunk %zu: offset %lld + size %lld is "
			                "outside global dimension %zu of size %lld",
			                what, t->name, j, (long long)o, (long long)l, d,
			                (long long)g);
	}
	return 0;
}

static int cmp_span(const void *a, const void *b)
{
	const struct fmt_span *x = a, *y = b;

	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

int fmt_check_spans(struct fmt_span *v, size_t n, const char *(*file_of)(const void *, int),
                    const void *ctx, const char *what, char *err)
{
	qsort(v, n, sizeof(*v), cmp_span);
	for (size_t i = 1; i < n; i++)
		if (v[i].rank == v[i - 1].rank && v[i].begin < v[i - 1].end)
			return ipc_errf(err, -EINVAL,
			                "%s: tensors '%s' and '%s' overlap in %s (bytes %" PRIu64
			                "..%" PRIu64 " and %" PRIu64 "..%" PRIu64 ")",
			                what, v[i - 1].tensor, v[i].tensor, file_of(ctx, v[i].rank),
			                v[i - 1].begin, v[i - 1].end, v[i].begin, v[i].end);
	return 0;
}

/* ---- whole files ------------------------------------------------------- */

void fmt_time(int64_t ns, char *buf, size_t len)
{
	time_t s = (time_t)(ns / 1000000000);
	struct tm tm;
	char day[32];

	gmtime_r(&s, &tm);
	strftime(day, sizeof(day), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf, len, "%s.%03dZ", day, (int)(ns % 1000000000 / 1000000));
}

int fmt_load(const char *buf, size_t len, size_t max, json_t **out, const char *what, char *err)
{
	json_error_t je;

	*out = NULL;
	if (len > max)
		return ipc_errf(err, -EFBIG, "%s: %zu bytes, more than the %zu accepted", what, len,
		                max);
	*out = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
	if (!*out)
		return ipc_errf(err, -EINVAL, "%s: not valid JSON: %s (line %d, column %d)", what,
		                je.text, je.line, je.column);
	if (!json_is_object(*out)) {
		json_decref(*out);
		*out = NULL;
		return ipc_errf(err, -EINVAL, "%s: is not a JSON object", what);
	}
	return 0;
}

int fmt_header(const json_t *root, const char *format, int max, int *version, const char *what,
               char *err)
{
	const char *s;
	int64_t v = 0;
	int rc = fmt_str(root, "format", &s, what, "top level", err);

	if (rc == 0 && strcmp(s, format) != 0)
		rc = ipc_errf(err, -EINVAL, "%s: format is '%.32s', not '%s'", what, s, format);
	if (rc == 0)
		rc = fmt_int(root, "version", 0, INT32_MAX, &v, what, "top level", err);
	if (rc == 0 && (v < 1 || v > max))
		rc = ipc_errf(err, -EINVAL, "%s: version %lld, this reader knows 1..%d", what,
		              (long long)v, max);
	if (rc == 0)
		*version = (int)v;
	return rc;
}

int fmt_dump(json_t *root, bool indent, size_t max, char **out, size_t *len, const char *what,
             char *err)
{
	*out = json_dumps(root, JSON_PRESERVE_ORDER | (indent ? JSON_INDENT(1) : JSON_COMPACT));
	if (!*out)
		return ipc_errf(err, -ENOMEM, "%s: out of memory writing the JSON", what);
	*len = strlen(*out);
	if (*len > max) {
		free(*out);
		*out = NULL;
		return ipc_errf(err, -EFBIG, "%s: %zu bytes, more than the %zu a reader accepts",
		                what, *len, max);
	}
	return 0;
}
