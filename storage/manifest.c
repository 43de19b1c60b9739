/*
 * manifest.c: manifest.json, the checkpoint's table of contents
 * (DESIGN.md §4.3). Its durable presence is the commit, so it must say
 * enough to verify every byte and to reshard on restore without opening a
 * shard: per rank the file and its size, per tensor its dtype, global shape
 * and chunks (rank, global offset, local shape, byte range, XXH3-64).
 *
 * The agent's commit builds one (manifest_to_json); verify, restore, list
 * and ckptctl read them back (manifest_from_json), as hostile input: every
 * field is type-checked, every number bounded, and the same structural
 * checks run on both paths (manifest_check), so we never write a manifest
 * we would refuse to read. Pure functions; any thread.
 *
 * Divisions: structural checks; writing; reading; lookups.
 */
#define _GNU_SOURCE /* qsort_r */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "format.h"

#define MF_PREFIX "manifest: "
/* Above this many chunks the manifest is written compact, to stay small. */
#define MF_INDENT_MAX_CHUNKS 10000u

void manifest_rank_file(int rank, char *buf, size_t len)
{
	snprintf(buf, len, "rank-%05d.safetensors", rank);
}

/* ---- structural checks ------------------------------------------------- */

static int check_ranks(const struct manifest *m, char *err)
{
	uint64_t sum = 0;
	char name[32];

	if (m->world < 1 || m->world > IPC_MAX_WORLD)
		return ipc_errf(err, -EINVAL, MF_PREFIX "world %d is out of range 1..%d", m->world,
		                IPC_MAX_WORLD);
	if (m->nranks != (size_t)m->world || !m->ranks)
		return ipc_errf(err, -EINVAL, MF_PREFIX "%zu ranks listed for world %d", m->nranks,
		                m->world);
	for (int r = 0; r < m->world; r++) {
		const struct manifest_rank *k = &m->ranks[r];

		if (k->rank != r) /* parsing leaves -1 where no entry named r */
			return ipc_errf(err, -EINVAL, MF_PREFIX "rank %d is missing%s", r,
			                k->rank < 0 ? "" : " (ranks must be in rank order)");
		manifest_rank_file(r, name, sizeof(name));
		if (!k->file || strcmp(k->file, name) != 0)
			return ipc_errf(err, -EINVAL,
			                MF_PREFIX "rank %d: file is '%.64s', expected '%s'", r,
			                k->file ? k->file : "(none)", name);
		if (k->header_bytes < 8 || k->header_bytes > k->size)
			return ipc_errf(err, -EINVAL,
			                MF_PREFIX "rank %d: header_bytes %" PRIu64
			                          " is outside its file of %" PRIu64 " bytes",
			                r, k->header_bytes, k->size);
		if (k->size > UINT64_MAX - sum)
			return ipc_errf(err, -EINVAL, MF_PREFIX "the shards' sizes overflow");
		sum += k->size;
	}
	if (sum != m->bytes)
		return ipc_errf(err, -EINVAL,
		                MF_PREFIX "bytes is %" PRIu64 ", but the shards hold %" PRIu64,
		                m->bytes, sum);
	return 0;
}

/*
 * Chunks. A tensor is a global array of global_shape. Each chunk is the box
 * [global_offset, global_offset + shape) of it, stored row-major in bytes
 * [begin, end) of its rank's file, so (end - begin) == dtype x shape, and
 * the range lies in the file's data: header_bytes <= begin <= end <= size.
 * The box must lie inside the global shape. Boxes may repeat on different
 * ranks (data-parallel replicas save the same one), but one rank saves one
 * box at most once, which is what makes (rank, global_offset) a key. An
 * unsharded tensor is saved whole by one rank: one chunk, offset zero,
 * shape == global_shape. That the boxes cover the whole global tensor is
 * not checked (it needs a union of boxes).
 */
static int check_chunk(const struct manifest *m, const struct manifest_tensor *t, size_t j,
                       char *err)
{
	const struct manifest_chunk *c = &t->chunks[j];
	const struct manifest_rank *k;
	uint64_t nbytes;
	char msg[IPC_ERRLEN];
	int rc;

	if (c->rank < 0 || c->rank >= m->world)
		return ipc_errf(err, -EINVAL,
		                MF_PREFIX "tensor '%s' chunk %zu: rank %d is outside world %d",
		                t->name, j, c->rank, m->world);
	k = &m->ranks[c->rank];
	rc = ipc_tensor_nbytes(t->name, t->dtype, t->ndim, c->shape, &nbytes, msg);
	if (rc)
		return ipc_errf(err, rc, MF_PREFIX "chunk %zu (rank %d): %s", j, c->rank, msg);
	if (c->end < c->begin || c->end - c->begin != nbytes)
		return ipc_errf(
		    err, -EINVAL,
		    MF_PREFIX "tensor '%s' chunk %zu (rank %d): byte_range [%" PRIu64 ", %" PRIu64
		              "] does not hold %s x shape = %" PRIu64 " bytes",
		    t->name, j, c->rank, c->begin, c->end, ipc_dtype_name(t->dtype), nbytes);
	if (c->begin < k->header_bytes || c->end > k->size)
		return ipc_errf(err, -EINVAL,
		                MF_PREFIX "tensor '%s' chunk %zu: byte_range [%" PRIu64 ", %" PRIu64
		                          "] is outside the data of %s (bytes %" PRIu64 "..%" PRIu64
		                          ")",
		                t->name, j, c->begin, c->end, k->file, k->header_bytes, k->size);
	for (size_t d = 0; d < t->ndim; d++) {
		int64_t g = t->global_shape[d], o = c->global_offset[d], l = c->shape[d];

		if (!t->sharded && (o != 0 || l != g))
			return ipc_errf(err, -EINVAL,
			                MF_PREFIX "tensor '%s' is unsharded, but its chunk is not "
			                          "all of it (dimension %zu)",
			                t->name, d);
		if (o < 0 || o > g || l > g - o)
			return ipc_errf(err, -EINVAL,
			                MF_PREFIX
			                "tensor '%s' chunk %zu: offset %lld + size %lld is "
			                "outside global dimension %zu of size %lld",
			                t->name, j, (long long)o, (long long)l, d, (long long)g);
	}
	return 0;
}

static int cmp_chunk_key(const void *a, const void *b, void *arg)
{
	const struct manifest_chunk *const *x = a, *const *y = b;
	size_t ndim = *(const size_t *)arg;

	if ((*x)->rank != (*y)->rank)
		return (*x)->rank < (*y)->rank ? -1 : 1;
	for (size_t d = 0; d < ndim; d++)
		if ((*x)->global_offset[d] != (*y)->global_offset[d])
			return (*x)->global_offset[d] < (*y)->global_offset[d] ? -1 : 1;
	return 0;
}

/* No rank saves the same box of a tensor twice. `tmp` holds nchunks. */
static int check_chunk_keys(const struct manifest_tensor *t, const struct manifest_chunk **tmp,
                            char *err)
{
	size_t ndim = t->ndim;

	for (size_t j = 0; j < t->nchunks; j++)
		tmp[j] = &t->chunks[j];
	qsort_r(tmp, t->nchunks, sizeof(*tmp), cmp_chunk_key, &ndim);
	for (size_t j = 1; j < t->nchunks; j++)
		if (cmp_chunk_key(&tmp[j - 1], &tmp[j], &ndim) == 0)
			return ipc_errf(err, -EINVAL,
			                MF_PREFIX "tensor '%s': rank %d has two chunks at the same "
			                          "global offset",
			                t->name, tmp[j]->rank);
	return 0;
}

static int check_tensor(const struct manifest *m, size_t i, const struct manifest_chunk **tmp,
                        char *err)
{
	const struct manifest_tensor *t = &m->tensors[i];
	char msg[IPC_ERRLEN];
	int rc;

	rc = ipc_check_tensor_name(t->name, msg);
	if (rc)
		return ipc_errf(err, rc, MF_PREFIX "tensor %zu: %s", i, msg);
	/* sorted and unique, or manifest_find's binary search goes wrong */
	if (i > 0 && strcmp(m->tensors[i - 1].name, t->name) >= 0)
		return ipc_errf(
		    err, -EINVAL,
		    MF_PREFIX "tensor '%s' %s: tensors must be sorted by name, once each", t->name,
		    strcmp(m->tensors[i - 1].name, t->name) ? "is out of order" : "appears twice");
	if (!ipc_dtype_name(t->dtype) || t->ndim > IPC_MAX_NDIM)
		return ipc_errf(err, -EINVAL, MF_PREFIX "tensor '%s': dtype %d or %zu dimensions",
		                t->name, t->dtype, t->ndim);
	for (size_t d = 0; d < t->ndim; d++)
		if (t->global_shape[d] < 0)
			return ipc_errf(err, -EINVAL,
			                MF_PREFIX "tensor '%s': global dimension %zu is negative",
			                t->name, d);
	if (t->nchunks < 1 || !t->chunks || (!t->sharded && t->nchunks != 1))
		return ipc_errf(err, -EINVAL, MF_PREFIX "tensor '%s' has %zu chunks: %s", t->name,
		                t->nchunks,
		                t->sharded ? "a sharded tensor needs at least one"
		                           : "an unsharded tensor has exactly one");
	for (size_t j = 0; j < t->nchunks; j++) {
		rc = check_chunk(m, t, j, err);
		if (rc)
			return rc;
	}
	return check_chunk_keys(t, tmp, err);
}

struct span {
	int rank;
	uint64_t begin, end;
	const char *tensor;
};

static int cmp_span(const void *a, const void *b)
{
	const struct span *x = a, *y = b;

	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

/* No two chunks share bytes of one file: each byte has one owner. */
static int check_spans(const struct manifest *m, size_t nchunks, char *err)
{
	struct span *s = calloc(nchunks ? nchunks : 1, sizeof(*s));
	size_t n = 0;
	int rc = 0;

	if (!s)
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory for %zu chunks", nchunks);
	for (size_t i = 0; i < m->ntensors; i++)
		for (size_t j = 0; j < m->tensors[i].nchunks; j++) {
			const struct manifest_chunk *c = &m->tensors[i].chunks[j];

			if (c->end > c->begin)
				s[n++] =
				    (struct span){c->rank, c->begin, c->end, m->tensors[i].name};
		}
	qsort(s, n, sizeof(*s), cmp_span);
	for (size_t i = 1; i < n && rc == 0; i++)
		if (s[i].rank == s[i - 1].rank && s[i].begin < s[i - 1].end)
			rc =
			    ipc_errf(err, -EINVAL,
			             MF_PREFIX "tensors '%s' and '%s' overlap in %s (bytes %" PRIu64
			                       "..%" PRIu64 " and %" PRIu64 "..%" PRIu64 ")",
			             s[i - 1].tensor, s[i].tensor, m->ranks[s[i].rank].file,
			             s[i - 1].begin, s[i - 1].end, s[i].begin, s[i].end);
	free(s);
	return rc;
}

static int check_top(const struct manifest *m, char *err)
{
	double d[3] = {m->capture_seconds, m->durable_seconds, m->commit_seconds};
	int rc;

	if (m->version != MANIFEST_VERSION)
		return ipc_errf(err, -EINVAL, MF_PREFIX "version %d, this reader knows %d",
		                m->version, MANIFEST_VERSION);
	rc = ipc_check_job(m->job, err);
	if (rc == 0)
		rc = ipc_check_step(m->step, err);
	if (rc)
		return rc;
	if (m->time_unix_ns < 0)
		return ipc_errf(err, -EINVAL, MF_PREFIX "time_unix_ns %lld is negative",
		                (long long)m->time_unix_ns);
	for (int i = 0; i < 3; i++)
		if (!isfinite(d[i]) || d[i] < 0)
			return ipc_errf(err, -EINVAL, MF_PREFIX "duration %d is %g", i, d[i]);
	return check_ranks(m, err);
}

int manifest_check(const struct manifest *m, char *err)
{
	const struct manifest_chunk **tmp = NULL;
	size_t maxc = 1, total = 0;
	int rc;

	rc = check_top(m, err);
	if (rc)
		return rc;
	if (m->ntensors && !m->tensors)
		return ipc_errf(err, -EINVAL, MF_PREFIX "%zu tensors but no array", m->ntensors);
	for (size_t i = 0; i < m->ntensors; i++) {
		maxc = m->tensors[i].nchunks > maxc ? m->tensors[i].nchunks : maxc;
		total += m->tensors[i].nchunks;
	}
	tmp = calloc(maxc, sizeof(*tmp));
	if (!tmp)
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory for %zu chunks", maxc);
	for (size_t i = 0; i < m->ntensors && rc == 0; i++)
		rc = check_tensor(m, i, tmp, err);
	free(tmp);
	return rc ? rc : check_spans(m, total, err);
}

/* ---- writing ----------------------------------------------------------- */

static json_t *ints_json(const int64_t *v, size_t n)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < n; i++)
		if (json_array_append_new(a, json_integer(v[i]))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

static json_t *chunk_json(const struct manifest_tensor *t, const struct manifest_chunk *c)
{
	int64_t range[2] = {(int64_t)c->begin, (int64_t)c->end};
	char hex[17];

	snprintf(hex, sizeof(hex), "%016" PRIx64, c->xxh3);
	if (t->sharded)
		return json_pack("{s:i, s:o, s:o, s:o, s:s}", "rank", c->rank, "global_offset",
		                 ints_json(c->global_offset, t->ndim), "shape",
		                 ints_json(c->shape, t->ndim), "byte_range", ints_json(range, 2),
		                 "xxh3", hex);
	return json_pack("{s:i, s:o, s:o, s:s}", "rank", c->rank, "shape",
	                 ints_json(c->shape, t->ndim), "byte_range", ints_json(range, 2), "xxh3",
	                 hex);
}

static json_t *tensor_json(const struct manifest_tensor *t)
{
	json_t *chunks = json_array();

	for (size_t j = 0; chunks && j < t->nchunks; j++)
		if (json_array_append_new(chunks, chunk_json(t, &t->chunks[j]))) {
			json_decref(chunks);
			return NULL;
		}
	/* "o" steals the reference, and a NULL makes json_pack fail cleanly */
	return json_pack("{s:s, s:o, s:b, s:o}", "dtype", ipc_dtype_name(t->dtype), "global_shape",
	                 ints_json(t->global_shape, t->ndim), "sharded", t->sharded, "chunks",
	                 chunks);
}

static json_t *ranks_json(const struct manifest *m)
{
	json_t *a = json_array();

	for (size_t r = 0; a && r < m->nranks; r++) {
		const struct manifest_rank *k = &m->ranks[r];

		if (json_array_append_new(a,
		                          json_pack("{s:i, s:s, s:I, s:I}", "rank", k->rank, "file",
		                                    k->file, "size", (json_int_t)k->size,
		                                    "header_bytes", (json_int_t)k->header_bytes))) {
			json_decref(a);
			return NULL;
		}
	}
	return a;
}

static json_t *tensors_json(const struct manifest *m)
{
	json_t *o = json_object();

	for (size_t i = 0; o && i < m->ntensors; i++)
		if (json_object_set_new(o, m->tensors[i].name, tensor_json(&m->tensors[i]))) {
			json_decref(o);
			return NULL;
		}
	return o;
}

/* "2026-11-21T19:13:00.123Z", for people; time_unix_ns is the exact value. */
static void fmt_time(int64_t ns, char *buf, size_t len)
{
	time_t s = (time_t)(ns / 1000000000);
	struct tm tm;
	char day[32];

	gmtime_r(&s, &tm);
	strftime(day, sizeof(day), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf, len, "%s.%03dZ", day, (int)(ns % 1000000000 / 1000000));
}

static int meta_value(const char *text, json_t **out, char *err)
{
	json_error_t je;

	*out = text && *text ? json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je)
	                     : json_null();
	if (!*out)
		return ipc_errf(err, -EINVAL, MF_PREFIX "meta is not JSON: %s (column %d)", je.text,
		                je.column);
	return 0;
}

static json_t *root_json(const struct manifest *m, json_t *meta)
{
	char when[64];
	json_int_t bytes = (json_int_t)m->bytes;

	fmt_time(m->time_unix_ns, when, sizeof(when));
	return json_pack("{s:s, s:i, s:s, s:I, s:i, s:s, s:I, s:o, s:I, "
	                 "s:{s:f, s:f, s:f}, s:o, s:o}",
	                 "format", MANIFEST_FORMAT, "version", m->version, "job", m->job, "step",
	                 (json_int_t)m->step, "world", m->world, "time", when, "time_unix_ns",
	                 (json_int_t)m->time_unix_ns, "meta", meta, "bytes", bytes, "durations",
	                 "capture_seconds", m->capture_seconds, "durable_seconds",
	                 m->durable_seconds, "commit_seconds", m->commit_seconds, "ranks",
	                 ranks_json(m), "tensors", tensors_json(m));
}

int manifest_to_json(const struct manifest *m, char **out, size_t *len, char *err)
{
	size_t flags = JSON_PRESERVE_ORDER, nchunks = 0;
	json_t *meta, *root;
	int rc;

	*out = NULL;
	*len = 0;
	rc = manifest_check(m, err);
	if (rc == 0)
		rc = meta_value(m->meta_json, &meta, err);
	if (rc)
		return rc;
	/* jansson holds integers as long long; sizes past that are not files */
	if (m->bytes > INT64_MAX)
		return ipc_errf(err, -EOVERFLOW, MF_PREFIX "%" PRIu64 " bytes", m->bytes);
	root = root_json(m, meta); /* takes meta, even when it fails */
	if (!root)
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory building the JSON");
	for (size_t i = 0; i < m->ntensors; i++)
		nchunks += m->tensors[i].nchunks;
	/* indented for people, unless that makes a huge manifest larger still */
	flags |= nchunks <= MF_INDENT_MAX_CHUNKS ? JSON_INDENT(1) : JSON_COMPACT;
	*out = json_dumps(root, flags);
	json_decref(root);
	if (!*out)
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory writing the JSON");
	*len = strlen(*out);
	if (*len > MANIFEST_MAX_BYTES) {
		free(*out);
		*out = NULL;
		return ipc_errf(err, -EFBIG,
		                MF_PREFIX "%zu bytes, more than the %u a reader accepts", *len,
		                MANIFEST_MAX_BYTES);
	}
	return 0;
}

/* ---- reading ----------------------------------------------------------- */

/* obj[key] as an integer in min..max; `where` names obj in the message. */
static int get_int(const json_t *obj, const char *key, int64_t min, int64_t max, int64_t *out,
                   const char *where, char *err)
{
	const json_t *v = json_object_get(obj, key);

	if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
		return ipc_errf(
		    err, -EINVAL, MF_PREFIX "%s: \"%s\" is %s, expected an integer in %lld..%lld",
		    where, key,
		    v ? (json_is_integer(v) ? "out of range" : "not an integer") : "missing",
		    (long long)min, (long long)max);
	*out = json_integer_value(v);
	return 0;
}

static int get_str(const json_t *obj, const char *key, const char **out, const char *where,
                   char *err)
{
	*out = json_string_value(json_object_get(obj, key));
	if (!*out)
		return ipc_errf(err, -EINVAL, MF_PREFIX "%s: \"%s\" is missing or not a string",
		                where, key);
	return 0;
}

/* obj[key] as an array of exactly n (n < 0: up to IPC_MAX_NDIM) integers >= 0. */
static int get_dims(const json_t *obj, const char *key, long n, int64_t *out, size_t *got,
                    const char *where, char *err)
{
	const json_t *a = json_object_get(obj, key);
	size_t len = json_array_size(a);

	if (!json_is_array(a) || (n >= 0 && len != (size_t)n) || len > IPC_MAX_NDIM)
		return ipc_errf(err, -EINVAL,
		                MF_PREFIX "%s: \"%s\" is not an array of %s%ld integers", where,
		                key, n >= 0 ? "" : "at most ", n >= 0 ? n : (long)IPC_MAX_NDIM);
	for (size_t i = 0; i < len; i++) {
		const json_t *v = json_array_get(a, i);

		if (!json_is_integer(v) || json_integer_value(v) < 0)
			return ipc_errf(err, -EINVAL,
			                MF_PREFIX "%s: \"%s\"[%zu] is not a non-negative integer",
			                where, key, i);
		out[i] = json_integer_value(v);
	}
	if (got)
		*got = len;
	return 0;
}

/* Exactly 16 lowercase hex digits: one spelling per value, so text compares. */
static int parse_hex64(const char *s, uint64_t *out)
{
	if (strlen(s) != 16 || strspn(s, "0123456789abcdef") != 16)
		return -EINVAL;
	*out = strtoull(s, NULL, 16);
	return 0;
}

static int parse_chunk(const struct manifest_tensor *t, size_t j, const json_t *o,
                       struct manifest_chunk *c, char *err)
{
	char where[IPC_MAX_TENSOR_NAME + 64];
	int64_t v = 0, range[2]; /* = 0: -O3 cannot see that get_int sets it on success */
	const char *hex;
	int rc;

	snprintf(where, sizeof(where), "tensor '%s' chunk %zu", t->name, j);
	if (!json_is_object(o))
		return ipc_errf(err, -EINVAL, MF_PREFIX "%s is not an object", where);
	rc = get_int(o, "rank", 0, IPC_MAX_WORLD - 1, &v, where, err);
	if (rc)
		return rc;
	c->rank = (int)v;
	rc = get_dims(o, "shape", (long)t->ndim, c->shape, NULL, where, err);
	if (rc == 0 && (t->sharded || json_object_get(o, "global_offset")))
		rc =
		    get_dims(o, "global_offset", (long)t->ndim, c->global_offset, NULL, where, err);
	if (rc == 0)
		rc = get_dims(o, "byte_range", 2, range, NULL, where, err);
	if (rc == 0)
		rc = get_str(o, "xxh3", &hex, where, err);
	if (rc)
		return rc;
	if (parse_hex64(hex, &c->xxh3))
		return ipc_errf(err, -EINVAL,
		                MF_PREFIX "%s: xxh3 '%.32s' is not 16 lowercase hex digits", where,
		                hex);
	c->begin = (uint64_t)range[0];
	c->end = (uint64_t)range[1];
	return 0;
}

static int parse_tensor(const char *name, const json_t *o, struct manifest_tensor *t, char *err)
{
	char where[IPC_MAX_TENSOR_NAME + 32];
	const json_t *chunks, *sh;
	const char *dt;
	int rc;

	/* first, so that the messages below quote a printable name */
	rc = ipc_check_tensor_name(name, where);
	if (rc)
		return ipc_errf(err, rc, MF_PREFIX "%s", where);
	t->name = strdup(name);
	if (!t->name)
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory");
	snprintf(where, sizeof(where), "tensor '%s'", name);
	if (!json_is_object(o))
		return ipc_errf(err, -EINVAL, MF_PREFIX "%s is not an object", where);
	rc = get_str(o, "dtype", &dt, where, err);
	if (rc == 0 && !(t->dtype = ipc_dtype_from_name(dt)))
		rc = ipc_errf(err, -EINVAL, MF_PREFIX "%s: unknown dtype '%.32s'", where, dt);
	if (rc == 0)
		rc = get_dims(o, "global_shape", -1, t->global_shape, &t->ndim, where, err);
	if (rc)
		return rc;
	sh = json_object_get(o, "sharded");
	chunks = json_object_get(o, "chunks");
	if (!json_is_boolean(sh) || !json_is_array(chunks))
		return ipc_errf(err, -EINVAL,
		                MF_PREFIX "%s: \"sharded\" (boolean) or \"chunks\" (array) is "
		                          "missing",
		                where);
	t->sharded = json_is_true(sh);
	t->chunks = calloc(json_array_size(chunks) + 1, sizeof(*t->chunks));
	if (!t->chunks)
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory for %s", where);
	t->nchunks = json_array_size(chunks);
	for (size_t j = 0; j < t->nchunks && rc == 0; j++)
		rc = parse_chunk(t, j, json_array_get(chunks, j), &t->chunks[j], err);
	return rc;
}

static int parse_ranks(struct manifest *m, const json_t *a, char *err)
{
	char where[32];
	int64_t r = 0, size = 0, hb = 0; /* set by get_int; = 0 quiets -O3's guess */
	const char *file;
	int rc;

	if (!json_is_array(a))
		return ipc_errf(err, -EINVAL, MF_PREFIX "\"ranks\" is missing or not an array");
	m->ranks = calloc((size_t)m->world, sizeof(*m->ranks));
	if (!m->ranks)
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory for %d ranks", m->world);
	m->nranks = (size_t)m->world;
	for (size_t i = 0; i < m->nranks; i++)
		m->ranks[i].rank = -1; /* missing until an entry names it */
	for (size_t i = 0; i < json_array_size(a); i++) {
		const json_t *o = json_array_get(a, i);

		snprintf(where, sizeof(where), "ranks[%zu]", i);
		rc = get_int(o, "rank", 0, m->world - 1, &r, where, err);
		if (rc == 0)
			rc = get_str(o, "file", &file, where, err);
		if (rc == 0)
			rc = get_int(o, "size", 0, INT64_MAX, &size, where, err);
		if (rc == 0)
			rc = get_int(o, "header_bytes", 0, INT64_MAX, &hb, where, err);
		if (rc)
			return rc;
		if (m->ranks[r].file)
			return ipc_errf(err, -EINVAL, MF_PREFIX "rank %lld is listed twice",
			                (long long)r);
		m->ranks[r] =
		    (struct manifest_rank){(int)r, strdup(file), (uint64_t)size, (uint64_t)hb};
		if (!m->ranks[r].file)
			return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory");
	}
	return 0; /* missing ranks: manifest_check */
}

static int cmp_tensor(const void *a, const void *b)
{
	return strcmp(((const struct manifest_tensor *)a)->name,
	              ((const struct manifest_tensor *)b)->name);
}

static int parse_tensors(struct manifest *m, const json_t *o, char *err)
{
	const char *name;
	json_t *v;
	int rc;

	if (!json_is_object(o))
		return ipc_errf(err, -EINVAL, MF_PREFIX "\"tensors\" is missing or not an object");
	m->tensors = calloc(json_object_size(o) + 1, sizeof(*m->tensors));
	if (!m->tensors)
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory for %zu tensors",
		                json_object_size(o));
	json_object_foreach((json_t *)o, name, v)
	{
		rc = parse_tensor(name, v, &m->tensors[m->ntensors++], err);
		if (rc)
			return rc;
	}
	qsort(m->tensors, m->ntensors, sizeof(*m->tensors), cmp_tensor);
	return 0;
}

static int parse_durations(struct manifest *m, const json_t *o, char *err)
{
	static const char *const keys[3] = {"capture_seconds", "durable_seconds", "commit_seconds"};
	double *d[3] = {&m->capture_seconds, &m->durable_seconds, &m->commit_seconds};

	if (!json_is_object(o))
		return ipc_errf(err, -EINVAL,
		                MF_PREFIX "\"durations\" is missing or not an object");
	for (int i = 0; i < 3; i++) {
		const json_t *v = json_object_get(o, keys[i]);

		if (!json_is_number(v))
			return ipc_errf(err, -EINVAL,
			                MF_PREFIX "durations: \"%s\" is missing or not a number",
			                keys[i]);
		*d[i] = json_number_value(v);
	}
	return 0;
}

static int parse_meta(struct manifest *m, const json_t *v, char *err)
{
	if (!v || json_is_null(v))
		return 0;
	m->meta_json = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
	if (!m->meta_json)
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory for meta");
	return 0;
}

static int parse_root(struct manifest *m, const json_t *root, char *err)
{
	const char *s;
	int64_t v = 0; /* set by get_int; = 0 quiets -O3's guess */
	int rc;

	if (!json_is_object(root))
		return ipc_errf(err, -EINVAL, MF_PREFIX "is not a JSON object");
	rc = get_str(root, "format", &s, "top level", err);
	if (rc == 0 && strcmp(s, MANIFEST_FORMAT) != 0)
		rc = ipc_errf(err, -EINVAL, MF_PREFIX "format is '%.32s', not '%s'", s,
		              MANIFEST_FORMAT);
	if (rc == 0 && (rc = get_int(root, "version", 0, INT_MAX, &v, "top level", err)) == 0)
		m->version = (int)v;
	if (rc == 0 && m->version != MANIFEST_VERSION)
		rc = ipc_errf(err, -EINVAL, MF_PREFIX "version %d, this reader knows %d",
		              m->version, MANIFEST_VERSION);
	if (rc == 0 && (rc = get_str(root, "job", &s, "top level", err)) == 0 &&
	    !(m->job = strdup(s)))
		rc = ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory");
	if (rc == 0)
		rc = get_int(root, "step", 0, IPC_MAX_STEP, &m->step, "top level", err);
	if (rc == 0 && (rc = get_int(root, "world", 1, IPC_MAX_WORLD, &v, "top level", err)) == 0)
		m->world = (int)v;
	if (rc == 0)
		rc = get_str(root, "time", &s, "top level", err);
	if (rc == 0)
		rc =
		    get_int(root, "time_unix_ns", 0, INT64_MAX, &m->time_unix_ns, "top level", err);
	if (rc == 0 && (rc = get_int(root, "bytes", 0, INT64_MAX, &v, "top level", err)) == 0)
		m->bytes = (uint64_t)v;
	if (rc == 0)
		rc = parse_meta(m, json_object_get(root, "meta"), err);
	if (rc == 0)
		rc = parse_durations(m, json_object_get(root, "durations"), err);
	if (rc == 0)
		rc = parse_ranks(m, json_object_get(root, "ranks"), err);
	if (rc == 0)
		rc = parse_tensors(m, json_object_get(root, "tensors"), err);
	return rc;
}

int manifest_from_json(const char *buf, size_t len, struct manifest **out, char *err)
{
	struct manifest *m;
	json_error_t je;
	json_t *root;
	int rc;

	*out = NULL;
	if (len > MANIFEST_MAX_BYTES)
		return ipc_errf(err, -EFBIG, MF_PREFIX "%zu bytes, more than the %u accepted", len,
		                MANIFEST_MAX_BYTES);
	root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return ipc_errf(err, -EINVAL, MF_PREFIX "not valid JSON: %s (line %d, column %d)",
		                je.text, je.line, je.column);
	m = calloc(1, sizeof(*m));
	if (!m) {
		rc = ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory");
		goto out_root;
	}
	rc = parse_root(m, root, err);
	if (rc == 0)
		rc = manifest_check(m, err);
	if (rc) {
		manifest_free(m);
		goto out_root;
	}
	*out = m;
out_root:
	json_decref(root);
	return rc;
}

void manifest_free(struct manifest *m)
{
	if (!m)
		return;
	for (size_t i = 0; m->ranks && i < m->nranks; i++)
		free(m->ranks[i].file);
	for (size_t i = 0; m->tensors && i < m->ntensors; i++) {
		free(m->tensors[i].name);
		free(m->tensors[i].chunks);
	}
	free(m->ranks);
	free(m->tensors);
	free(m->job);
	free(m->meta_json);
	free(m);
}

/* ---- lookups ----------------------------------------------------------- */

const struct manifest_tensor *manifest_find(const struct manifest *m, const char *name)
{
	size_t lo = 0, hi = m && name ? m->ntensors : 0;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(name, m->tensors[mid].name);

		if (c == 0)
			return &m->tensors[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

const struct manifest_chunk *manifest_find_chunk(const struct manifest_tensor *t, int rank,
                                                 const int64_t *global_offset)
{
	for (size_t j = 0; t && j < t->nchunks; j++) {
		const struct manifest_chunk *c = &t->chunks[j];

		if (c->rank != rank)
			continue;
		/* unsharded: one chunk, its offset is zero whatever is asked */
		if (!t->sharded || !global_offset ||
		    memcmp(c->global_offset, global_offset, t->ndim * sizeof(int64_t)) == 0)
			return c;
	}
	return NULL;
}
