/*
 * Unit tests of storage/format/manifest.c: a 2-rank, 2-node manifest (sharded and
 * unsharded tensors, user meta per rank) written and read back, every
 * refusal of a hostile manifest.json, format 1 still read, shard names,
 * and the lookups restore uses.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>
#include <jansson.h>

#include "storage/format/format.h"
#include "support/check_main.h"

#define META "{\"lr\":0.5,\"tags\":[\"a\",\"b\"],\"nested\":{\"z\":null,\"a\":true}}"
#define T_NS 1795288380123456789LL /* 2026-11-21T19:13:00.123Z */

static char *xstrdup(const char *s)
{
	char *d = s ? strdup(s) : NULL;

	ck_assert(!s || d);
	return d;
}

static void set_rank(struct manifest *m, int r, uint64_t size)
{
	char name[SHARD_FILE_MAX], node[8], meta[32];

	snprintf(node, sizeof(node), "n%d", r);
	snprintf(meta, sizeof(meta), "{\"r\":%d}", r);
	ck_assert_int_eq(shard_file_name(r, node, 0, name, sizeof(name)), 0);
	m->ranks[r] = (struct manifest_rank){.rank = r,
	                                     .file = xstrdup(name),
	                                     .size = size,
	                                     .header_bytes = 256,
	                                     .meta_json = xstrdup(meta)};
}

/* Part i: node "n<i>" with rank i. */
static void set_part(struct manifest *m, int i)
{
	char node[8];

	snprintf(node, sizeof(node), "n%d", i);
	m->parts[i] = (struct manifest_part){
	    .node = xstrdup(node), .nranks = 1, .ranks = calloc(1, sizeof(int))};
	m->parts[i].ranks[0] = i;
}

static struct manifest_chunk chunk(int rank, int64_t o0, int64_t o1, int64_t s0, int64_t s1,
                                   uint64_t begin, uint64_t end, uint64_t xxh3)
{
	return (struct manifest_chunk){
	    .rank = rank,
	    .global_offset = {o0, o1},
	    .shape = {s0, s1},
	    .begin = begin,
	    .end = end,
	    .xxh3 = xxh3,
	};
}

/*
 * world 2: "embed" F32 [4,6] sharded by rows (rank 0 rows 0-1, rank 1 rows
 * 2-3, 48 bytes each at 256); "layer.0.bias" BF16 [6] on rank 0 at 304;
 * "step" I64 scalar on rank 1 at 304. Files: 316 and 312 bytes.
 */
static struct manifest *sample(void)
{
	struct manifest *m = calloc(1, sizeof(*m));
	struct manifest_tensor *t;

	ck_assert_ptr_nonnull(m);
	*m = (struct manifest){.version = MANIFEST_VERSION_HOLDS,
	                       .job = xstrdup("llama-7b"),
	                       .run = xstrdup("r1"),
	                       .nparts = 2,
	                       .step = 100,
	                       .world = 2,
	                       .time_unix_ns = T_NS,
	                       .meta_json = xstrdup(META),
	                       .nranks = 2,
	                       .ntensors = 3,
	                       .bytes = 628,
	                       .capture_seconds = 0.25,
	                       .durable_seconds = 1.5,
	                       .commit_seconds = 1.75};
	m->ranks = calloc(2, sizeof(*m->ranks));
	m->parts = calloc(2, sizeof(*m->parts));
	m->tensors = t = calloc(3, sizeof(*m->tensors));
	ck_assert(m->ranks && m->parts && m->tensors);
	set_rank(m, 0, 316);
	set_rank(m, 1, 312);
	set_part(m, 0);
	set_part(m, 1);

	t[0] = (struct manifest_tensor){xstrdup("embed"),
	                                ipc_dtype_from_name("F32"),
	                                2,
	                                {4, 6},
	                                true,
	                                2,
	                                calloc(2, sizeof(struct manifest_chunk))};
	t[0].chunks[0] = chunk(0, 0, 0, 2, 6, 256, 304, 0x0123456789abcdefull);
	t[0].chunks[1] = chunk(1, 2, 0, 2, 6, 256, 304, 0xfedcba9876543210ull);
	t[1] = (struct manifest_tensor){xstrdup("layer.0.bias"),
	                                ipc_dtype_from_name("BF16"),
	                                1,
	                                {6},
	                                false,
	                                1,
	                                calloc(1, sizeof(struct manifest_chunk))};
	t[1].chunks[0] = chunk(0, 0, 0, 6, 0, 304, 316, 0);
	t[2] = (struct manifest_tensor){xstrdup("step"),
	                                ipc_dtype_from_name("I64"),
	                                0,
	                                {0},
	                                false,
	                                1,
	                                calloc(1, sizeof(struct manifest_chunk))};
	t[2].chunks[0] = chunk(1, 0, 0, 0, 0, 304, 312, 1);
	return m;
}

static char *to_json(const struct manifest *m)
{
	char err[IPC_ERRLEN] = "", *text;
	size_t len;

	ck_assert_msg(manifest_to_json(m, &text, &len, err) == 0, "%s", err);
	ck_assert_uint_eq(strlen(text), len);
	return text;
}

static void assert_same(const struct manifest *a, const struct manifest *b)
{
	ck_assert_int_eq(a->version, b->version);
	ck_assert_str_eq(a->job, b->job);
	ck_assert_int_eq(a->step, b->step);
	ck_assert_int_eq(a->world, b->world);
	ck_assert_str_eq(a->run, b->run);
	ck_assert_uint_eq(a->nparts, b->nparts);
	for (size_t i = 0; i < a->nparts; i++) {
		ck_assert_str_eq(a->parts[i].node, b->parts[i].node);
		ck_assert_uint_eq(a->parts[i].nranks, b->parts[i].nranks);
		ck_assert_mem_eq(a->parts[i].ranks, b->parts[i].ranks,
		                 a->parts[i].nranks * sizeof(int));
	}
	ck_assert_int_eq(a->time_unix_ns, b->time_unix_ns);
	ck_assert_uint_eq(a->bytes, b->bytes);
	ck_assert_double_eq(a->capture_seconds, b->capture_seconds);
	ck_assert_double_eq(a->durable_seconds, b->durable_seconds);
	ck_assert_double_eq(a->commit_seconds, b->commit_seconds);
	ck_assert_uint_eq(a->nranks, b->nranks);
	for (size_t r = 0; r < a->nranks; r++) {
		ck_assert_int_eq(a->ranks[r].rank, b->ranks[r].rank);
		ck_assert_str_eq(a->ranks[r].file, b->ranks[r].file);
		ck_assert_uint_eq(a->ranks[r].size, b->ranks[r].size);
		ck_assert_uint_eq(a->ranks[r].header_bytes, b->ranks[r].header_bytes);
		ck_assert_str_eq(a->ranks[r].meta_json, b->ranks[r].meta_json);
	}
	ck_assert_uint_eq(a->ntensors, b->ntensors);
	for (size_t i = 0; i < a->ntensors; i++) {
		const struct manifest_tensor *x = &a->tensors[i], *y = &b->tensors[i];

		ck_assert_str_eq(x->name, y->name);
		ck_assert_int_eq(x->dtype, y->dtype);
		ck_assert_uint_eq(x->ndim, y->ndim);
		ck_assert(x->sharded == y->sharded);
		ck_assert_mem_eq(x->global_shape, y->global_shape, x->ndim * sizeof(int64_t));
		ck_assert_uint_eq(x->nchunks, y->nchunks);
		for (size_t j = 0; j < x->nchunks; j++) {
			const struct manifest_chunk *c = &x->chunks[j], *d = &y->chunks[j];

			ck_assert_int_eq(c->rank, d->rank);
			ck_assert_mem_eq(c->shape, d->shape, x->ndim * sizeof(int64_t));
			ck_assert_mem_eq(c->global_offset, d->global_offset,
			                 x->ndim * sizeof(int64_t));
			ck_assert_uint_eq(c->begin, d->begin);
			ck_assert_uint_eq(c->end, d->end);
			ck_assert_uint_eq(c->xxh3, d->xxh3);
		}
	}
}

START_TEST(test_roundtrip)
{
	struct manifest *m = sample(), *back = NULL;
	char err[IPC_ERRLEN] = "", *text = to_json(m);
	json_t *root, *meta;
	json_error_t je;

	ck_assert_msg(manifest_from_json(text, strlen(text), &back, err) == 0, "%s", err);
	assert_same(m, back);
	/* the meta value, as a value: same JSON, same key order */
	ck_assert_str_eq(back->meta_json, META);

	/* what other tools read: the documented field names and forms */
	root = json_loads(text, 0, &je);
	ck_assert_ptr_nonnull(root);
	ck_assert_str_eq(json_string_value(json_object_get(root, "format")), "ckptd-manifest");
	ck_assert_str_eq(json_string_value(json_object_get(root, "time")),
	                 "2026-11-21T19:13:00.123Z");
	meta = json_object_get(root, "meta");
	ck_assert(json_is_object(meta));
	ck_assert(json_real_value(json_object_get(meta, "lr")) == 0.5);
	ck_assert_str_eq(
	    json_string_value(json_object_get(
	        json_array_get(
	            json_object_get(json_object_get(json_object_get(root, "tensors"), "embed"),
	                            "chunks"),
	            1),
	        "xxh3")),
	    "fedcba9876543210");
	ck_assert_ptr_nonnull(strstr(text, "\"file\": \"rank-00001.n1.0.safetensors\""));
	ck_assert_str_eq(json_string_value(json_object_get(root, "run")), "r1");
	ck_assert_str_eq(json_string_value(json_object_get(
	                     json_array_get(json_object_get(root, "parts"), 1), "node")),
	                 "n1");
	/* each rank's meta is its own */
	ck_assert_str_eq(manifest_rank_meta(back, 1), "{\"r\":1}");
	ck_assert_str_eq(manifest_rank_meta(back, 0), "{\"r\":0}");
	ck_assert_str_eq(manifest_rank_meta(back, 7), "{\"r\":0}"); /* a larger world: rank 0's */
	ck_assert_str_eq(manifest_node_of(back, 1), "n1");
	ck_assert_ptr_null(manifest_node_of(back, 2));
	/* unsharded chunks carry no global_offset; sharded ones do */
	ck_assert_ptr_null(json_object_get(
	    json_array_get(json_object_get(
	                       json_object_get(json_object_get(root, "tensors"), "step"), "chunks"),
	                   0),
	    "global_offset"));
	json_decref(root);
	free(text);
	manifest_free(back);
	manifest_free(m);
}
END_TEST

/* Meta in any JSON form comes back as the same value; none is NULL. */
START_TEST(test_meta_forms)
{
	static const char *const forms[] = {"42", "\"text\"", "[1,\"two\",null]",
	                                    "{\"z\":1,\"a\":{\"b\":[1,2]}}", "true"};
	struct manifest *m = sample(), *back;
	char err[IPC_ERRLEN] = "", *text;

	for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
		free(m->meta_json);
		m->meta_json = xstrdup(forms[i]);
		text = to_json(m);
		ck_assert_int_eq(manifest_from_json(text, strlen(text), &back, err), 0);
		ck_assert_str_eq(back->meta_json, forms[i]);
		manifest_free(back);
		free(text);
	}
	free(m->meta_json);
	m->meta_json = NULL;
	text = to_json(m);
	ck_assert_ptr_nonnull(strstr(text, "\"meta\": null"));
	ck_assert_int_eq(manifest_from_json(text, strlen(text), &back, err), 0);
	ck_assert_ptr_null(back->meta_json);
	manifest_free(back);
	free(text);
	m->meta_json = xstrdup("");
	text = to_json(m);
	ck_assert_ptr_nonnull(strstr(text, "\"meta\": null"));
	free(text);
	free(m->meta_json);
	m->meta_json = xstrdup("{\"a\":");
	ck_assert_int_eq(manifest_to_json(m, &text, &(size_t){0}, err), -EINVAL);
	ck_assert_ptr_null(text);
	ck_assert_ptr_nonnull(strstr(err, "meta is not JSON"));
	manifest_free(m);
}
END_TEST

/* manifest_check on the struct, and manifest_to_json refusing to write it. */
START_TEST(test_check_struct)
{
	struct manifest *m = sample();
	struct manifest_tensor tmp;
	char err[IPC_ERRLEN] = "", *text = (char *)1;
	size_t len = 1;

	ck_assert_int_eq(manifest_check(m, err), 0);
	tmp = m->tensors[0], m->tensors[0] = m->tensors[1], m->tensors[1] = tmp;
	ck_assert_int_eq(manifest_check(m, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "sorted"));
	ck_assert_int_eq(manifest_to_json(m, &text, &len, err), -EINVAL);
	ck_assert_ptr_null(text);
	ck_assert_uint_eq(len, 0);
	tmp = m->tensors[0], m->tensors[0] = m->tensors[1], m->tensors[1] = tmp;
	m->bytes = 627;
	ck_assert_int_eq(manifest_check(m, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "bytes"));
	m->bytes = 628;
	m->capture_seconds = -1;
	ck_assert_int_eq(manifest_check(m, err), -EINVAL);
	m->capture_seconds = 0;
	m->tensors[1].chunks[0].end = 320; /* past rank 0's file, and not 12 bytes */
	ck_assert_int_eq(manifest_check(m, err), -EINVAL);
	m->tensors[1].chunks[0].begin = 308;
	ck_assert_int_eq(manifest_check(m, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "outside the data of rank-00000.n0.0.safetensors"));
	m->tensors[1].chunks[0].begin = 304, m->tensors[1].chunks[0].end = 316;
	ck_assert_int_eq(manifest_check(m, err), 0);
	manifest_free(m);
}
END_TEST

/* ---- refusals of what is read back ------------------------------------- */

static json_t *root_of(void)
{
	struct manifest *m = sample();
	char *text = to_json(m);
	json_error_t je;
	json_t *root = json_loads(text, 0, &je);

	ck_assert_ptr_nonnull(root);
	free(text);
	manifest_free(m);
	return root;
}

static json_t *tensor_of(json_t *root, const char *name)
{
	return json_object_get(json_object_get(root, "tensors"), name);
}

static json_t *chunk_of(json_t *root, const char *name, size_t j)
{
	return json_array_get(json_object_get(tensor_of(root, name), "chunks"), j);
}

static json_t *rank_of(json_t *root, size_t r)
{
	return json_array_get(json_object_get(root, "ranks"), r);
}

/* A path-like edit of the sample's JSON, then the result of reading it. */
typedef void (*edit_fn)(json_t *root);

static int read_edited(edit_fn edit, char *err)
{
	json_t *root = root_of();
	struct manifest *m = (struct manifest *)1;
	char *text;
	int rc;

	edit(root);
	text = json_dumps(root, JSON_COMPACT);
	rc = manifest_from_json(text, strlen(text), &m, err);
	if (rc)
		ck_assert_ptr_null(m);
	manifest_free(m);
	free(text);
	json_decref(root);
	return rc;
}

#define EDIT(name, body)                                                                           \
	static void name(json_t *root)                                                             \
	{                                                                                          \
		body;                                                                              \
	}

EDIT(no_edit, (void)root)
EDIT(format_other, json_object_set_new(root, "format", json_string("other")))
EDIT(format_missing, json_object_del(root, "format"))
EDIT(version_5, json_object_set_new(root, "version", json_integer(5)))
EDIT(run_missing, json_object_del(root, "run"))
EDIT(run_slash, json_object_set_new(root, "run", json_string("a/b")))
EDIT(run_nul, json_object_set_new(root, "run", json_stringn("a\0b", 3)))
EDIT(parts_missing, json_object_del(root, "parts"))
EDIT(parts_empty, json_object_set_new(root, "parts", json_array()))
EDIT(part_rank_twice, json_object_set_new(json_array_get(json_object_get(root, "parts"), 1),
                                          "ranks", json_pack("[i]", 0)))
EDIT(part_rank_outside, json_object_set_new(json_array_get(json_object_get(root, "parts"), 1),
                                            "ranks", json_pack("[i]", 2)))
EDIT(part_node_slash, json_object_set_new(json_array_get(json_object_get(root, "parts"), 1), "node",
                                          json_string("../n1")))
EDIT(parts_unsorted, json_object_set_new(json_array_get(json_object_get(root, "parts"), 0), "node",
                                         json_string("zz")))
EDIT(rank_file_other_rank,
     json_object_set_new(rank_of(root, 1), "file", json_string("rank-00000.n1.0.safetensors")))
EDIT(rank_file_old_form,
     json_object_set_new(rank_of(root, 1), "file", json_string("rank-00001.safetensors")))
EDIT(job_dotdot, json_object_set_new(root, "job", json_string("..")))
EDIT(job_slash, json_object_set_new(root, "job", json_string("a/b")))
EDIT(step_negative, json_object_set_new(root, "step", json_integer(-1)))
EDIT(step_huge, json_object_set_new(root, "step", json_integer(IPC_MAX_STEP + 1)))
EDIT(step_string, json_object_set_new(root, "step", json_string("100")))
EDIT(world_zero, json_object_set_new(root, "world", json_integer(0)))
EDIT(world_huge, json_object_set_new(root, "world", json_integer(IPC_MAX_WORLD + 1)))
EDIT(bytes_wrong, json_object_set_new(root, "bytes", json_integer(629)))
EDIT(time_number, json_object_set_new(root, "time", json_integer(1)))
EDIT(durations_missing, json_object_del(root, "durations"))
EDIT(duration_string,
     json_object_set_new(json_object_get(root, "durations"), "commit_seconds", json_string("1")))
EDIT(rank_missing, json_array_remove(json_object_get(root, "ranks"), 1))
EDIT(rank_duplicated, json_object_set_new(rank_of(root, 1), "rank", json_integer(0)))
EDIT(rank_outside, json_object_set_new(rank_of(root, 1), "rank", json_integer(2)))
EDIT(rank_extra, json_array_append(json_object_get(root, "ranks"), rank_of(root, 0)))
EDIT(rank_file_wrong,
     json_object_set_new(rank_of(root, 1), "file", json_string("../../etc/passwd")))
EDIT(rank_header_past_size,
     json_object_set_new(rank_of(root, 0), "header_bytes", json_integer(400)))
EDIT(ranks_object, json_object_set_new(root, "ranks", json_object()))
EDIT(tensors_array, json_object_set_new(root, "tensors", json_array()))
EDIT(chunk_outside_file,
     json_object_set_new(chunk_of(root, "embed", 1), "byte_range", json_pack("[i,i]", 300, 348)))
EDIT(chunk_in_header,
     json_object_set_new(chunk_of(root, "embed", 1), "byte_range", json_pack("[i,i]", 0, 48)))
EDIT(chunk_rank_outside, json_object_set_new(chunk_of(root, "embed", 1), "rank", json_integer(2)))
EDIT(xxh3_upper,
     json_object_set_new(chunk_of(root, "embed", 0), "xxh3", json_string("0123456789ABCDEF")))
EDIT(xxh3_short, json_object_set_new(chunk_of(root, "embed", 0), "xxh3", json_string("abc")))
EDIT(xxh3_long,
     json_object_set_new(chunk_of(root, "embed", 0), "xxh3", json_string("0123456789abcdef0")))
EDIT(xxh3_nonhex,
     json_object_set_new(chunk_of(root, "embed", 0), "xxh3", json_string("0123456789abcdeg")))
EDIT(xxh3_number, json_object_set_new(chunk_of(root, "embed", 0), "xxh3", json_integer(5)))
EDIT(shape_bytes_mismatch,
     json_object_set_new(chunk_of(root, "embed", 0), "shape", json_pack("[i,i]", 3, 6)))
EDIT(chunk_ndim, json_object_set_new(chunk_of(root, "embed", 0), "shape", json_pack("[i]", 12)))
EDIT(offset_outside,
     json_object_set_new(chunk_of(root, "embed", 1), "global_offset", json_pack("[i,i]", 3, 0)))
EDIT(offset_negative,
     json_object_set_new(chunk_of(root, "embed", 1), "global_offset", json_pack("[i,i]", -2, 0)))
EDIT(offset_missing, json_object_del(chunk_of(root, "embed", 1), "global_offset"))
EDIT(same_box_twice, json_object_set_new(chunk_of(root, "embed", 1), "rank", json_integer(0));
     json_object_set_new(chunk_of(root, "embed", 1), "global_offset", json_pack("[i,i]", 0, 0)))
EDIT(unsharded_two_chunks, json_array_append(json_object_get(tensor_of(root, "step"), "chunks"),
                                             chunk_of(root, "step", 0)))
EDIT(unsharded_partial,
     json_object_set_new(tensor_of(root, "layer.0.bias"), "global_shape", json_pack("[i]", 12)))
EDIT(unsharded_offset,
     json_object_set_new(chunk_of(root, "layer.0.bias", 0), "global_offset", json_pack("[i]", 1)))
EDIT(no_chunks, json_object_set_new(tensor_of(root, "embed"), "chunks", json_array()))
EDIT(dtype_unknown, json_object_set_new(tensor_of(root, "embed"), "dtype", json_string("F4")))
EDIT(sharded_string, json_object_set_new(tensor_of(root, "embed"), "sharded", json_string("yes")))
EDIT(bad_tensor_name,
     json_object_set(json_object_get(root, "tensors"), "a\x01b", tensor_of(root, "step")))
EDIT(overlap_in_file, json_object_set_new(chunk_of(root, "layer.0.bias", 0), "byte_range",
                                          json_pack("[i,i]", 292, 304)))
EDIT(top_array, json_object_clear(root); json_object_set_new(root, "x", json_array()))
EDIT(range_order,
     json_object_set_new(chunk_of(root, "step", 0), "byte_range", json_pack("[i,i]", 312, 304)))

static const struct {
	const char *what;
	edit_fn edit;
	int rc;
	const char *needle;
} refusals[] = {
    {"format", format_other, -EINVAL, "format is 'other'"},
    {"format missing", format_missing, -EINVAL, "\"format\" is missing"},
    {"version", version_5, -EINVAL, "version 5, this reader knows 1..4"},
    {"run missing", run_missing, -EINVAL, "\"run\" is missing"},
    {"run /", run_slash, -EINVAL, "run name 'a/b'"},
    {"run NUL", run_nul, -EINVAL, "is not allowed"},
    {"parts missing", parts_missing, -EINVAL, "\"parts\" is missing"},
    {"parts empty", parts_empty, -EINVAL, "no parts listed"},
    {"part rank twice", part_rank_twice, -EINVAL, "rank 0 is in two parts"},
    {"part rank outside", part_rank_outside, -EINVAL, "is not a rank of world 2"},
    {"part node /", part_node_slash, -EINVAL, "node name '../n1'"},
    {"parts unsorted", parts_unsorted, -EINVAL, "parts are sorted by node"},
    {"file of another rank", rank_file_other_rank, -EINVAL, "is not named rank-00001."},
    {"file of format 1", rank_file_old_form, -EINVAL, "is not named rank-00001."},
    {"job ..", job_dotdot, -EINVAL, "job name '..'"},
    {"job /", job_slash, -EINVAL, "job name 'a/b'"},
    {"step < 0", step_negative, -EINVAL, "\"step\""},
    {"step too large", step_huge, -EINVAL, "\"step\" is out of range"},
    {"step string", step_string, -EINVAL, "\"step\" is not an integer"},
    {"world 0", world_zero, -EINVAL, "\"world\""},
    {"world too large", world_huge, -EINVAL, "\"world\""},
    {"bytes", bytes_wrong, -EINVAL, "bytes is 629, but the shards hold 628"},
    {"time", time_number, -EINVAL, "\"time\""},
    {"durations", durations_missing, -EINVAL, "durations"},
    {"duration string", duration_string, -EINVAL, "commit_seconds"},
    {"rank missing", rank_missing, -EINVAL, "rank 1 is missing"},
    {"rank twice", rank_duplicated, -EINVAL, "rank 0 is listed twice"},
    {"rank >= world", rank_outside, -EINVAL, "ranks[1]: \"rank\" is out of range"},
    {"rank extra", rank_extra, -EINVAL, "listed twice"},
    {"rank file", rank_file_wrong, -EINVAL, "is not named rank-00001.<node>.<attempt>"},
    {"header > size", rank_header_past_size, -EINVAL, "header_bytes 400"},
    {"ranks not array", ranks_object, -EINVAL, "\"ranks\""},
    {"tensors not object", tensors_array, -EINVAL, "\"tensors\""},
    {"chunk past file", chunk_outside_file, -EINVAL,
     "tensor 'embed' chunk 1: byte_range [300, 348] is outside the data of "
     "rank-00001.n1.0.safetensors"},
    {"chunk in header", chunk_in_header, -EINVAL, "outside the data"},
    {"chunk rank", chunk_rank_outside, -EINVAL, "rank 2 is outside world 2"},
    {"xxh3 upper", xxh3_upper, -EINVAL, "not 16 lowercase hex"},
    {"xxh3 short", xxh3_short, -EINVAL, "not 16 lowercase hex"},
    {"xxh3 long", xxh3_long, -EINVAL, "not 16 lowercase hex"},
    {"xxh3 non-hex", xxh3_nonhex, -EINVAL, "not 16 lowercase hex"},
    {"xxh3 number", xxh3_number, -EINVAL, "\"xxh3\" is missing or not a string"},
    {"shape x dtype", shape_bytes_mismatch, -EINVAL, "does not hold F32 x shape = 72 bytes"},
    {"chunk ndim", chunk_ndim, -EINVAL, "\"shape\" is not an array of 2"},
    {"offset outside", offset_outside, -EINVAL, "outside global dimension 0 of size 4"},
    {"offset negative", offset_negative, -EINVAL, "global_offset"},
    {"offset missing", offset_missing, -EINVAL, "global_offset"},
    {"same box twice", same_box_twice, -EINVAL, "rank 0 has two chunks"},
    {"unsharded 2 chunks", unsharded_two_chunks, -EINVAL, "exactly one"},
    {"unsharded partial", unsharded_partial, -EINVAL,
     "is unsharded, but its chunk is not all of it"},
    {"unsharded offset", unsharded_offset, -EINVAL, "is unsharded, but its chunk is not all of it"},
    {"no chunks", no_chunks, -EINVAL, "at least one"},
    {"dtype", dtype_unknown, -EINVAL, "unknown dtype 'F4'"},
    {"sharded string", sharded_string, -EINVAL, "\"sharded\""},
    {"tensor name", bad_tensor_name, -EINVAL, "control character"},
    {"overlap", overlap_in_file, -EINVAL, "overlap in rank-00000.n0.0.safetensors"},
    {"no fields", top_array, -EINVAL, "\"format\" is missing"},
    {"range order", range_order, -EINVAL, "byte_range [312, 304]"},
};

START_TEST(test_refusals)
{
	char err[IPC_ERRLEN];

	ck_assert_int_eq(read_edited(no_edit, err), 0);
	for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
		int rc;

		err[0] = '\0';
		rc = read_edited(refusals[i].edit, err);
		ck_assert_msg(rc == refusals[i].rc, "%s: rc %d, expected %d (%s)", refusals[i].what,
		              rc, refusals[i].rc, err);
		ck_assert_msg(strstr(err, refusals[i].needle), "%s: message '%s' lacks '%s'",
		              refusals[i].what, err, refusals[i].needle);
	}
}
END_TEST

static int read_text(const char *text, size_t len, char *err)
{
	struct manifest *m = (struct manifest *)1;
	int rc = manifest_from_json(text, len, &m, err);

	if (rc)
		ck_assert_ptr_null(m);
	manifest_free(m);
	return rc;
}

START_TEST(test_refuse_text)
{
	struct manifest *m = sample();
	char err[IPC_ERRLEN] = "", *text = to_json(m), *dupl;
	size_t len = strlen(text);
	const char *at;
	char *big;

	/* every prefix is refused, never a crash: a torn write */
	for (size_t cut = 0; cut < len; cut += 7)
		ck_assert_int_eq(read_text(text, cut, err), -EINVAL);
	ck_assert_int_eq(read_text(text, len / 2, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "not valid JSON"));
	ck_assert_int_eq(read_text(text, len, err), 0);

	/* the same tensor name twice: only text can say it */
	at = strstr(text, "\"step\": {");
	ck_assert_ptr_nonnull(at);
	dupl = malloc(len + 64);
	snprintf(dupl, len + 64, "%.*s\"step\": {}, %s", (int)(at - text), text, at);
	ck_assert_int_eq(read_text(dupl, strlen(dupl), err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "duplicate"));
	free(dupl);

	/* bounded before anything is read */
	big = malloc(MANIFEST_MAX_BYTES + 1ul);
	ck_assert_ptr_nonnull(big);
	ck_assert_int_eq(read_text(big, MANIFEST_MAX_BYTES + 1ul, err), -EFBIG);
	free(big);
	ck_assert_int_eq(read_text("[]", 2, err), -EINVAL);
	ck_assert_int_eq(read_text("null", 4, err), -EINVAL);
	free(text);
	manifest_free(m);
}
END_TEST

/* ---- lookups ----------------------------------------------------------- */

START_TEST(test_find)
{
	struct manifest *m = sample();
	char names[64][16];

	ck_assert_ptr_eq(manifest_find(m, "embed"), &m->tensors[0]);
	ck_assert_ptr_eq(manifest_find(m, "layer.0.bias"), &m->tensors[1]);
	ck_assert_ptr_eq(manifest_find(m, "step"), &m->tensors[2]);
	ck_assert_ptr_null(manifest_find(m, "emb"));
	ck_assert_ptr_null(manifest_find(m, "zzz"));
	ck_assert_ptr_null(manifest_find(m, ""));
	ck_assert_ptr_null(manifest_find(m, "a"));
	manifest_free(m);

	/* many names, every one found by the binary search */
	m = calloc(1, sizeof(*m));
	m->tensors = calloc(64, sizeof(*m->tensors));
	m->ntensors = 64;
	for (int i = 0; i < 64; i++) {
		snprintf(names[i], sizeof(names[i]), "t%03d", i * 2);
		m->tensors[i].name = xstrdup(names[i]);
	}
	for (int i = 0; i < 64; i++) {
		char odd[16];

		ck_assert_ptr_eq(manifest_find(m, names[i]), &m->tensors[i]);
		snprintf(odd, sizeof(odd), "t%03d", i * 2 + 1);
		ck_assert_ptr_null(manifest_find(m, odd));
	}
	manifest_free(m);
}
END_TEST

START_TEST(test_find_chunk)
{
	struct manifest *m = sample();
	const struct manifest_tensor *embed = manifest_find(m, "embed");
	const struct manifest_tensor *bias = manifest_find(m, "layer.0.bias");
	const int64_t at0[] = {0, 0}, at2[] = {2, 0}, at1[] = {1, 0};

	ck_assert_ptr_eq(manifest_find_chunk(embed, 0, NULL), &embed->chunks[0]);
	ck_assert_ptr_eq(manifest_find_chunk(embed, 1, NULL), &embed->chunks[1]);
	ck_assert_ptr_eq(manifest_find_chunk(embed, 0, at0), &embed->chunks[0]);
	ck_assert_ptr_eq(manifest_find_chunk(embed, 1, at2), &embed->chunks[1]);
	ck_assert_ptr_null(manifest_find_chunk(embed, 1, at0));
	ck_assert_ptr_null(manifest_find_chunk(embed, 0, at1));
	ck_assert_ptr_null(manifest_find_chunk(embed, 2, NULL));
	ck_assert_ptr_eq(manifest_find_chunk(bias, 0, NULL), &bias->chunks[0]);
	ck_assert_ptr_eq(manifest_find_chunk(bias, 0, at0), &bias->chunks[0]);
	ck_assert_ptr_null(manifest_find_chunk(bias, 1, NULL));
	ck_assert_ptr_null(manifest_find_chunk(NULL, 0, NULL));
	manifest_free(m);
}
END_TEST

/* A format-1 manifest (one node, before runs and parts) is still read. */
START_TEST(test_format_1)
{
	static const char v1[] =
	    "{\"format\": \"ckptd-manifest\", \"version\": 1, \"job\": \"j\", \"step\": 3, "
	    "\"world\": 1, \"time\": \"x\", \"time_unix_ns\": 5, \"meta\": {\"seed\": 9}, "
	    "\"bytes\": 20, \"durations\": {\"capture_seconds\": 0, \"durable_seconds\": 0, "
	    "\"commit_seconds\": 0}, \"ranks\": [{\"rank\": 0, \"file\": "
	    "\"rank-00000.safetensors\", \"size\": 20, \"header_bytes\": 16}], \"tensors\": "
	    "{\"a\": {\"dtype\": \"F32\", \"global_shape\": [1], \"sharded\": false, \"chunks\": "
	    "[{\"rank\": 0, \"shape\": [1], \"byte_range\": [16, 20], \"xxh3\": "
	    "\"0000000000000001\"}]}}}";
	char err[IPC_ERRLEN] = "", *text, *bad;
	struct manifest *m;
	size_t len;

	ck_assert_msg(manifest_from_json(v1, strlen(v1), &m, err) == 0, "%s", err);
	ck_assert_int_eq(m->version, 1);
	ck_assert_str_eq(m->run, "0");
	ck_assert_uint_eq(m->nparts, 0);
	ck_assert_str_eq(manifest_rank_meta(m, 0), "{\"seed\":9}"); /* one meta for all */
	ck_assert_ptr_null(manifest_node_of(m, 0));
	/* written back as it was: no run, no parts */
	ck_assert_int_eq(manifest_to_json(m, &text, &len, err), 0);
	ck_assert_ptr_null(strstr(text, "\"run\""));
	ck_assert_ptr_null(strstr(text, "\"parts\""));
	free(text);
	manifest_free(m);
	/* format 1 names its files one way only */
	bad = strdup(v1);
	memcpy(strstr(bad, "rank-00000.safetensors"), "rank-00000.safetensorz", 22);
	ck_assert_int_eq(manifest_from_json(bad, strlen(bad), &m, err), -EINVAL);
	ck_assert_msg(strstr(err, "expected 'rank-00000.safetensors'"), "%s", err);
	free(bad);
}
END_TEST

/* Shard names: the node is the part between the rank and the attempt, whatever it holds. */
START_TEST(test_shard_names)
{
	char buf[SHARD_FILE_MAX], err[IPC_ERRLEN];
	char long_node[IPC_MAX_JOB + 1];

	ck_assert_int_eq(shard_file_name(3, "gpu-7.rack2", 12, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "rank-00003.gpu-7.rack2.12.safetensors");
	ck_assert(shard_file_of_node(buf, "gpu-7.rack2"));
	ck_assert(!shard_file_of_node(buf, "gpu-7"));
	ck_assert(!shard_file_of_node(buf, "rack2"));
	ck_assert_int_eq(shard_file_check(3, buf, err), 0);
	ck_assert_int_eq(shard_file_check(4, buf, err), -EINVAL);
	/* node "n0" attempt 1 and node "n0.1" attempt 0 are two names, each one node's */
	ck_assert_int_eq(shard_file_name(0, "n0", 1, buf, sizeof(buf)), 0);
	ck_assert(shard_file_of_node(buf, "n0") && !shard_file_of_node(buf, "n0.1"));
	ck_assert_int_eq(shard_file_name(0, "n0.1", 0, buf, sizeof(buf)), 0);
	ck_assert(shard_file_of_node(buf, "n0.1") && !shard_file_of_node(buf, "n0"));
	ck_assert(!shard_file_of_node("rank-00000.safetensors", "n0"));
	ck_assert(!shard_file_of_node("rank-00000.n0.safetensors", "n0"));
	ck_assert(!shard_file_of_node("rank-0000x.n0.0.safetensors", "n0"));
	/* hostile names */
	ck_assert_int_eq(shard_file_check(0, "rank-00000.../.0.safetensors", err), -EINVAL);
	ck_assert_int_eq(shard_file_check(0, "rank-00000.a/b.0.safetensors", err), -EINVAL);
	ck_assert_int_eq(shard_file_check(0, "rank-00000.n0.0.safetensors/x", err), -EINVAL);
	ck_assert_int_eq(shard_file_check(0, "rank-00000..0.safetensors", err), -EINVAL);
	ck_assert_int_eq(shard_file_check(0, NULL, err), -EINVAL);
	memset(long_node, 'n', IPC_MAX_JOB);
	long_node[IPC_MAX_JOB] = '\0';
	ck_assert_int_eq(shard_file_name(0, long_node, 4000000000u, buf, sizeof(buf)), 0);
	ck_assert_int_eq(shard_file_check(0, buf, err), 0);
	ck_assert_int_eq(shard_file_name(0, long_node, 1, buf, 40), -ENAMETOOLONG);
}
END_TEST

START_TEST(test_rank_file)
{
	char buf[32];

	manifest_rank_file(3, buf, sizeof(buf));
	ck_assert_str_eq(buf, "rank-00003.safetensors");
	manifest_rank_file(65535, buf, sizeof(buf));
	ck_assert_str_eq(buf, "rank-65535.safetensors");
	manifest_rank_file(0, buf, 8);
	ck_assert_str_eq(buf, "rank-00");
	manifest_free(NULL);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("manifest");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_roundtrip);
	tcase_add_test(tc, test_meta_forms);
	tcase_add_test(tc, test_check_struct);
	tcase_add_test(tc, test_refusals);
	tcase_add_test(tc, test_refuse_text);
	tcase_add_test(tc, test_find);
	tcase_add_test(tc, test_find_chunk);
	tcase_add_test(tc, test_rank_file);
	tcase_add_test(tc, test_format_1);
	tcase_add_test(tc, test_shard_names);
	suite_add_tcase(s, tc);
	return s;
}
