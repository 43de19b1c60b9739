/*
 * Unit tests of storage/format/part.c and storage/format/plans.c: a part written and read
 * back; every refusal of a hostile part another node wrote; the merge of
 * parts, the same bytes whatever their order, refusing another run, a rank
 * twice, a rank missing, a name on two ranks that is not one sharded
 * tensor; a plans file both ways, its digest, and its refusals; a node's
 * share of the dedup assignment and a run's set mark, both ways.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>
#include <jansson.h>

#include "storage/format/format.h"
#include "support/check_main.h"

static char err[IPC_ERRLEN];

static char *xstrdup(const char *s)
{
	char *d = s ? strdup(s) : NULL;

	ck_assert(!s || d);
	return d;
}

/*
 * Rank r of node nd: "w" F32 sharded [8] (4 per rank, at 64..80),
 * and, on rank 0 only, "bias" BF16 [2] unsharded at 80..84.
 */
static void fill_rank(struct part_rank *k, const char *nd, int r, int world)
{
	char file[SHARD_FILE_MAX], meta[32];
	size_t n = r == 0 ? 2 : 1;
	struct manifest_tensor *t = calloc(n, sizeof(*t));

	ck_assert_int_eq(shard_file_name(r, nd, 0, file, sizeof(file)), 0);
	snprintf(meta, sizeof(meta), "{\"rank\":%d}", r);
	if (r == 0) {
		t[0] = (struct manifest_tensor){xstrdup("bias"),
		                                ipc_dtype_from_name("BF16"),
		                                1,
		                                {2},
		                                false,
		                                1,
		                                calloc(1, sizeof(struct manifest_chunk))};
		t[0].chunks[0] = (struct manifest_chunk){
		    .rank = 0, .shape = {2}, .begin = 80, .end = 84, .xxh3 = 3};
	}
	t[n - 1] = (struct manifest_tensor){xstrdup("w"),
	                                    ipc_dtype_from_name("F32"),
	                                    1,
	                                    {4 * world},
	                                    true,
	                                    1,
	                                    calloc(1, sizeof(struct manifest_chunk))};
	t[n - 1].chunks[0] = (struct manifest_chunk){.rank = r,
	                                             .global_offset = {4 * r},
	                                             .shape = {4},
	                                             .begin = 64,
	                                             .end = 80,
	                                             .xxh3 = 100 + (uint64_t)r};
	*k = (struct part_rank){.rank = r,
	                        .file = xstrdup(file),
	                        .size = r == 0 ? 84 : 80,
	                        .header_bytes = 64,
	                        .meta_json = xstrdup(meta),
	                        .queued_unix_ns = 1000 + r,
	                        .captured_unix_ns = 2000 + r,
	                        .durable_unix_ns = 3000 + r,
	                        .ntensors = n,
	                        .tensors = t};
}

static struct part *mk(const char *run, const char *nd, int world, const int *ranks, size_t n)
{
	struct part *p = calloc(1, sizeof(*p));

	*p = (struct part){PART_VERSION,
	                   xstrdup("job"),
	                   xstrdup(run),
	                   xstrdup(nd),
	                   7,
	                   world,
	                   4000,
	                   n,
	                   calloc(n, sizeof(struct part_rank)),
	                   0,
	                   0,
	                   false};
	for (size_t i = 0; i < n; i++)
		fill_rank(&p->ranks[i], nd, ranks[i], world);
	return p;
}

static char *text_of(const struct part *p)
{
	char *text;
	size_t len;

	ck_assert_msg(part_to_json(p, &text, &len, err) == 0, "%s", err);
	return text;
}

START_TEST(test_part_roundtrip)
{
	static const int ranks[] = {0, 1};
	struct part *p = mk("r1", "n0", 4, ranks, 2), *back;
	char *text = text_of(p), *again;

	ck_assert_msg(part_from_json(text, strlen(text), &back, err) == 0, "%s", err);
	ck_assert_str_eq(back->run, "r1");
	ck_assert_str_eq(back->node, "n0");
	ck_assert_uint_eq(back->nranks, 2);
	ck_assert_str_eq(back->ranks[1].file, "rank-00001.n0.0.safetensors");
	ck_assert_str_eq(back->ranks[1].meta_json, "{\"rank\":1}");
	ck_assert_int_eq(back->ranks[1].durable_unix_ns, 3001);
	ck_assert_uint_eq(back->ranks[0].ntensors, 2);
	ck_assert_uint_eq(back->ranks[1].tensors[0].chunks[0].xxh3, 101);
	/* the same bytes again: text compares */
	again = text_of(back);
	ck_assert_str_eq(again, text);
	free(again);
	free(text);
	part_free(back);
	part_free(p);
}
END_TEST

typedef void (*edit_fn)(json_t *root);

static json_t *rank0(json_t *root)
{
	return json_array_get(json_object_get(root, "ranks"), 0);
}

static json_t *w_chunk(json_t *root, size_t r)
{
	return json_array_get(
	    json_object_get(
	        json_object_get(
	            json_object_get(json_array_get(json_object_get(root, "ranks"), r), "tensors"),
	            "w"),
	        "chunks"),
	    0);
}

#define EDIT(name, body)                                                                           \
	static void name(json_t *root)                                                             \
	{                                                                                          \
		body;                                                                              \
	}

EDIT(no_edit, (void)root)
EDIT(format_manifest, json_object_set_new(root, "format", json_string("ckptd-manifest")))
EDIT(version_9, json_object_set_new(root, "version", json_integer(9)))
EDIT(node_slash, json_object_set_new(root, "node", json_string("a/b")))
EDIT(node_long,
     json_object_set_new(root, "node",
                         json_string("nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
                                     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn")))
EDIT(run_missing, json_object_del(root, "run"))
EDIT(rank_twice, json_object_set_new(json_array_get(json_object_get(root, "ranks"), 1), "rank",
                                     json_integer(0)))
EDIT(rank_outside, json_object_set_new(json_array_get(json_object_get(root, "ranks"), 1), "rank",
                                       json_integer(4)))
EDIT(world_small, json_object_set_new(root, "world", json_integer(1)))
EDIT(file_other_node,
     json_object_set_new(rank0(root), "file", json_string("rank-00000.n9.0.safetensors")))
EDIT(file_path, json_object_set_new(rank0(root), "file", json_string("../../etc/passwd")))
EDIT(size_small, json_object_set_new(rank0(root), "size", json_integer(70)))
EDIT(header_past, json_object_set_new(rank0(root), "header_bytes", json_integer(900)))
EDIT(time_negative, json_object_set_new(rank0(root), "queued_unix_ns", json_integer(-1)))
EDIT(chunk_rank, json_object_set_new(w_chunk(root, 1), "rank", json_integer(0)))
EDIT(chunk_in_header,
     json_object_set_new(w_chunk(root, 1), "byte_range", json_pack("[i,i]", 0, 16)))
EDIT(chunk_overlap, json_object_set_new(w_chunk(root, 0), "byte_range", json_pack("[i,i]", 68, 84)))
EDIT(chunk_box_out, json_object_set_new(w_chunk(root, 1), "global_offset", json_pack("[i]", 14)))
EDIT(two_chunks,
     json_array_append(
         json_object_get(json_object_get(json_object_get(rank0(root), "tensors"), "w"), "chunks"),
         w_chunk(root, 0)))
EDIT(tensors_array, json_object_set_new(rank0(root), "tensors", json_array()))
EDIT(ranks_many,
     for (int i = 0; i < 4; i++) json_array_append(json_object_get(root, "ranks"), rank0(root)))

static const struct {
	const char *what;
	edit_fn edit;
	const char *needle;
} refusals[] = {
    {"format", format_manifest, "format is 'ckptd-manifest', not 'ckptd-part'"},
    {"version", version_9, "version 9"},
    {"node /", node_slash, "node name 'a/b'"},
    {"node long", node_long, "longer than 64"},
    {"run", run_missing, "\"run\" is missing"},
    {"rank twice", rank_twice, "rank 0 is outside world 4, or twice"},
    {"rank outside", rank_outside, "rank 4 is outside world 4"},
    {"world", world_small, "longer than world"},
    {"file of another node", file_other_node, "is not one node 'n0' made"},
    {"file path", file_path, "is not named rank-00000"},
    {"size", size_small, "outside the data"},
    {"header", header_past, "header_bytes 900"},
    {"time", time_negative, "queued_unix_ns"},
    {"chunk of another rank", chunk_rank, "one chunk of this rank"},
    {"chunk in header", chunk_in_header, "outside the data"},
    {"overlap", chunk_overlap, "overlap in rank-00000.n0.0.safetensors"},
    {"box", chunk_box_out, "outside global dimension 0"},
    {"two chunks", two_chunks, "one chunk of this rank"},
    {"tensors", tensors_array, "\"tensors\" is missing, not an object"},
    {"ranks > world", ranks_many, "longer than world"},
};

START_TEST(test_part_refusals)
{
	static const int ranks[] = {0, 1};
	struct part *p = mk("r1", "n0", 4, ranks, 2), *back;
	char *text = text_of(p), *edited;
	json_t *root = json_loads(text, 0, NULL);
	int rc;

	ck_assert_ptr_nonnull(root);
	for (size_t i = 0; i <= sizeof(refusals) / sizeof(refusals[0]); i++) {
		json_t *copy = json_deep_copy(root);

		(i ? refusals[i - 1].edit : no_edit)(copy);
		edited = json_dumps(copy, JSON_COMPACT);
		back = (struct part *)1;
		err[0] = '\0';
		rc = part_from_json(edited, strlen(edited), &back, err);
		if (i == 0) {
			ck_assert_msg(rc == 0, "unedited: %s", err);
			part_free(back);
		} else {
			ck_assert_msg(rc < 0, "%s accepted", refusals[i - 1].what);
			ck_assert_ptr_null(back);
			ck_assert_msg(strstr(err, refusals[i - 1].needle), "%s: '%s' lacks '%s'",
			              refusals[i - 1].what, err, refusals[i - 1].needle);
		}
		free(edited);
		json_decref(copy);
	}
	/* every prefix of the text (a torn write), refused, never a crash */
	for (size_t cut = 0; cut < strlen(text); cut += 13)
		ck_assert_int_lt(part_from_json(text, cut, &back, err), 0);
	json_decref(root);
	free(text);
	part_free(p);
}
END_TEST

/* ---- summaries --------------------------------------------------------- */

static void set_key(json_t *root, const char *key, json_t *v)
{
	json_object_set_new(root, key, v);
}

static void rank0_set(json_t *root, const char *key, json_t *v)
{
	json_t *k = json_array_get(json_object_get(root, "ranks"), 0);

	if (v)
		json_object_set_new(k, key, v);
	else
		json_object_del(k, key);
}

/*
 * A part's summary: written from the part (its bytes' length and sum, each
 * rank's signature and whether it wrote less), read back the same; every
 * edit a hostile writer could make refused with a reason; a part is no
 * summary, nor a summary a part; torn, refused.
 */
START_TEST(test_summary)
{
	static const int ranks[] = {0, 1};
	struct part *p = mk("r1", "n0", 4, ranks, 2), *back = NULL;
	char *text, *edited;
	size_t len;
	uint64_t sig;
	json_t *root;

	ck_assert_int_lt(part_summary_to_json(p, &text, &len, err), 0); /* not read back */
	ck_assert_msg(part_bytes_id(p, err) == 0, "%s", err);
	ck_assert_msg(part_summary_to_json(p, &text, &len, err) == 0, "%s", err);
	ck_assert_msg(part_summary_from_json(text, len, &back, err) == 0, "%s", err);
	ck_assert(back->summary);
	ck_assert_uint_eq(back->file_size, p->file_size);
	ck_assert_uint_eq(back->file_xxh3, p->file_xxh3);
	ck_assert_str_eq(back->run, "r1");
	ck_assert_uint_eq(back->nranks, 2);
	for (size_t j = 0; j < 2; j++) {
		ck_assert_int_eq(back->ranks[j].rank, ranks[j]);
		ck_assert_uint_eq(back->ranks[j].ntensors, 0);
		ck_assert(back->ranks[j].has_sig && !back->ranks[j].wrote_less);
		ck_assert_int_eq(part_rank_signature(&p->ranks[j], &sig), 0);
		ck_assert_uint_eq(back->ranks[j].sig, sig);
		ck_assert_uint_eq(back->ranks[j].size, p->ranks[j].size);
		ck_assert_str_eq(back->ranks[j].file, p->ranks[j].file);
	}
	part_free(back);
	/* where a rank wrote less: what it wrote, as one number too; never of one that wrote all */
	{
		char *t2, *forged;
		size_t l2;

		p->ranks[0].wrote_less = true;
		ck_assert_msg(part_summary_to_json(p, &t2, &l2, err) == 0, "%s", err);
		ck_assert_msg(part_summary_from_json(t2, l2, &back, err) == 0, "%s", err);
		ck_assert_int_eq(tensors_signature(p->ranks[0].tensors, p->ranks[0].ntensors, &sig),
		                 0);
		ck_assert(back->ranks[0].has_wsig && back->ranks[0].wsig == sig);
		ck_assert(!back->ranks[1].has_wsig);
		part_free(back);
		forged = malloc(l2 + 8); /* rank 0 says it wrote all, and what it wrote */
		{
			const char *at = strstr(t2, "\"wrote_less\":true");

			sprintf(forged, "%.*s\"wrote_less\":false%s", (int)(at - t2), t2,
			        at + strlen("\"wrote_less\":true"));
		}
		back = (struct part *)1;
		ck_assert_int_eq(part_summary_from_json(forged, strlen(forged), &back, err),
		                 -EINVAL);
		ck_assert_msg(strstr(err, "wrote all it holds"), "%s", err);
		free(forged);
		free(t2);
		p->ranks[0].wrote_less = false;
	}
	/* a part is no summary, a summary no part */
	{
		char *ptext = text_of(p);

		ck_assert_int_lt(part_summary_from_json(ptext, strlen(ptext), &back, err), 0);
		ck_assert_int_lt(part_from_json(text, len, &back, err), 0);
		free(ptext);
	}
	root = json_loads(text, 0, NULL);
	ck_assert_ptr_nonnull(root);
	{
		static const struct {
			const char *what, *needle;
			int kind; /* 0: top level, 1: rank 0 */
			const char *key;
			int value; /* 0: deleted, 1: "xyz", 2: 0, 3: 300 MiB, 4: "0123456789ABCDEF"
			            */
		} edits[] = {
		    {"no sig", "\"sig\"", 1, "sig", 0},
		    {"a sig of other digits", "\"sig\"", 1, "sig", 4},
		    {"no wrote_less", "wrote_less", 1, "wrote_less", 0},
		    {"wrote_less a string", "wrote_less", 1, "wrote_less", 1},
		    {"part_bytes 0", "part_bytes", 0, "part_bytes", 2},
		    {"part_bytes past the limit", "part_bytes", 0, "part_bytes", 3},
		    {"no part_xxh3", "part_xxh3", 0, "part_xxh3", 0},
		    {"another format", "format", 0, "format", 1},
		};

		for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
			json_t *copy = json_deep_copy(root), *v = NULL;

			switch (edits[i].value) {
			case 1:
				v = json_string("xyz");
				break;
			case 2:
				v = json_integer(0);
				break;
			case 3:
				v = json_integer(300LL << 20);
				break;
			case 4:
				v = json_string("0123456789ABCDEF");
				break;
			}
			if (edits[i].kind)
				rank0_set(copy, edits[i].key, v);
			else if (v)
				set_key(copy, edits[i].key, v);
			else
				json_object_del(copy, edits[i].key);
			edited = json_dumps(copy, JSON_COMPACT);
			back = (struct part *)1;
			ck_assert_msg(part_summary_from_json(edited, strlen(edited), &back, err) <
			                  0,
			              "%s accepted", edits[i].what);
			ck_assert_ptr_null(back);
			ck_assert_msg(strstr(err, edits[i].needle), "%s: '%s' lacks '%s'",
			              edits[i].what, err, edits[i].needle);
			free(edited);
			json_decref(copy);
		}
	}
	for (size_t cut = 0; cut < len; cut += 7)
		ck_assert_int_lt(part_summary_from_json(text, cut, &back, err), 0);
	json_decref(root);
	free(text);
	part_free(p);
}
END_TEST

/* ---- merging ----------------------------------------------------------- */

static char *merged(struct part **v, size_t n)
{
	struct manifest *m;
	char *text;
	size_t len;

	ck_assert_msg(manifest_merge(v, n, &m, err) == 0, "%s", err);
	ck_assert_int_eq(manifest_to_json(m, &text, &len, err), 0);
	manifest_free(m);
	return text;
}

START_TEST(test_merge)
{
	static const int a[] = {0, 1}, b[] = {2}, c[] = {3};
	struct part *v[3] = {mk("r", "n0", 4, a, 2), mk("r", "n1", 4, b, 1),
	                     mk("r", "n2", 4, c, 1)};
	struct part *w[3] = {v[2], v[0], v[1]};
	struct manifest *m;
	char *one = merged(v, 3), *two = merged(w, 3);

	ck_assert_str_eq(one, two); /* whoever merges, in whatever order */
	ck_assert_int_eq(manifest_merge(v, 3, &m, err), 0);
	ck_assert_uint_eq(m->nparts, 3);
	ck_assert_str_eq(m->parts[1].node, "n1");
	ck_assert_uint_eq(manifest_find(m, "w")->nchunks, 4);
	ck_assert_uint_eq(manifest_find(m, "bias")->nchunks, 1);
	ck_assert_str_eq(m->meta_json, "{\"rank\":0}");
	ck_assert_str_eq(manifest_rank_meta(m, 3), "{\"rank\":3}");
	ck_assert_int_eq(m->time_unix_ns, 4000);
	ck_assert_double_eq_tol(m->capture_seconds, (2003 - 1000) / 1e9, 1e-15);
	manifest_free(m);
	free(one);
	free(two);
	for (int i = 0; i < 3; i++)
		part_free(v[i]);
}
END_TEST

START_TEST(test_merge_refusals)
{
	static const int a[] = {0, 1}, b[] = {2, 3}, b1[] = {1, 2, 3}, b2[] = {2};
	struct part *p0 = mk("r", "n0", 4, a, 2), *other = mk("old", "n1", 4, b, 2);
	struct part *twice = mk("r", "n1", 4, b1, 3), *short_ = mk("r", "n1", 4, b2, 1);
	struct part *dup = mk("r", "n0", 4, b, 2);
	struct part *v[2] = {p0, NULL};
	struct manifest *m = (struct manifest *)1;

	v[1] = other;
	ck_assert_int_eq(manifest_merge(v, 2, &m, err), -ESTALE);
	ck_assert_msg(strstr(err, "is of run old, not run r") ||
	                  strstr(err, "is of run r, not run old"),
	              "%s", err);
	ck_assert_ptr_null(m);
	v[1] = twice;
	ck_assert_int_eq(manifest_merge(v, 2, &m, err), -EINVAL);
	ck_assert_msg(strstr(err, "rank 1 is in two parts"), "%s", err);
	v[1] = short_;
	ck_assert_int_eq(manifest_merge(v, 2, &m, err), -ENOENT);
	ck_assert_msg(strstr(err, "rank 3 is in no part"), "%s", err);
	v[1] = dup; /* a node's name twice */
	ck_assert_int_eq(manifest_merge(v, 2, &m, err), -EINVAL);
	ck_assert_msg(strstr(err, "two parts of node n0"), "%s", err);
	/* "bias" on two ranks as an unsharded tensor: not chunks of one tensor */
	v[1] = mk("r", "n1", 4, (const int[]){2, 3}, 2);
	free(v[1]->ranks[0].tensors[0].name);
	v[1]->ranks[0].tensors[0].name = xstrdup("bias");
	v[1]->ranks[0].tensors[0].sharded = false;
	v[1]->ranks[0].tensors[0].global_shape[0] = 4;
	v[1]->ranks[0].tensors[0].chunks[0].global_offset[0] = 0;
	ck_assert_int_eq(manifest_merge(v, 2, &m, err), -EINVAL);
	ck_assert_msg(strstr(err, "tensor 'bias' is saved by ranks 0 and 2"), "%s", err);
	part_free(v[1]);
	part_free(p0);
	part_free(other);
	part_free(twice);
	part_free(short_);
	part_free(dup);
}
END_TEST

/* ---- plans files -------------------------------------------------------- */

static struct plans_file *mk_plans(void)
{
	struct plans_file *f = calloc(1, sizeof(*f));
	struct part *p = mk("r", "n0", 4, (const int[]){0, 1}, 2);

	*f = (struct plans_file){.version = PLANS_VERSION,
	                         .job = xstrdup("job"),
	                         .node = xstrdup("n0"),
	                         .run = xstrdup("r"),
	                         .world = 4,
	                         .writes_once = true,
	                         .nranks = 2,
	                         .ranks = calloc(2, sizeof(struct plans_rank))};
	for (int i = 0; i < 2; i++) { /* the part's tensors, without their bytes */
		f->ranks[i] = (struct plans_rank){.rank = i,
		                                  .copies = 1,
		                                  .ntensors = p->ranks[i].ntensors,
		                                  .tensors = p->ranks[i].tensors};
		p->ranks[i].tensors = NULL;
		p->ranks[i].ntensors = 0;
	}
	part_free(p);
	return f;
}

START_TEST(test_plans)
{
	struct plans_file *f = mk_plans(), *back;
	char *text, *again, digest[17];
	size_t len;
	json_t *root;

	ck_assert_msg(plans_to_json(f, &text, &len, err) == 0, "%s", err);
	memcpy(digest, f->digest, sizeof(digest));
	ck_assert_uint_eq(strlen(digest), 16);
	ck_assert_msg(plans_from_json(text, len, &back, err) == 0, "%s", err);
	ck_assert_str_eq(back->digest, digest);
	ck_assert_uint_eq(back->nranks, 2);
	ck_assert_str_eq(back->ranks[0].tensors[1].name, "w");
	ck_assert(back->ranks[1].tensors[0].sharded);
	ck_assert_int_eq(back->ranks[1].tensors[0].chunks[0].global_offset[0], 4);
	ck_assert(back->writes_once);
	ck_assert_uint_eq(back->ranks[0].copies, 1);
	ck_assert_ptr_null(
	    strstr(text, "\"copies\"")); /* 1 is not written: files stay as they were */
	ck_assert_int_eq(plans_to_json(back, &again, &len, err), 0);
	ck_assert_str_eq(again, text); /* the same plan set, the same bytes and digest */
	free(again);
	/* copies asked for: written, read back, another digest */
	back->ranks[1].copies = 3;
	ck_assert_int_eq(plans_to_json(back, &again, &len, err), 0);
	ck_assert_str_ne(back->digest, digest);
	plans_free(back);
	ck_assert_msg(plans_from_json(again, len, &back, err) == 0, "%s", err);
	ck_assert_uint_eq(back->ranks[1].copies, 3);
	free(again);
	/* another plan set, another digest */
	back->ranks[1].copies = 1;
	back->ranks[1].tensors[0].chunks[0].shape[0] = 3;
	ck_assert_int_eq(plans_to_json(back, &again, &len, err), 0);
	ck_assert_str_ne(back->digest, digest);
	free(again);
	plans_free(back);

	/* refusals */
	root = json_loads(text, 0, NULL);
	{
		static const char *const edits[][2] = {
		    {"[0].rank", "rank 0 is listed twice"},
		    {"[1].tensors.dup", "lists tensor 'w' twice"},
		    {"[1].tensors[0].global_offset", "does not fit its global shape"},
		    {"world", "longer than world 1"},
		    {"digest", "digest"},
		};

		for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
			json_t *c = json_deep_copy(root),
			       *r1 = json_array_get(json_object_get(c, "ranks"), 1);
			char *t;

			if (i == 0)
				json_object_set_new(r1, "rank", json_integer(0));
			else if (i == 1)
				json_array_append(
				    json_object_get(r1, "tensors"),
				    json_array_get(json_object_get(r1, "tensors"), 0));
			else if (i == 2)
				json_object_set_new(
				    json_array_get(json_object_get(r1, "tensors"), 0),
				    "global_offset", json_pack("[i]", 14));
			else if (i == 3)
				json_object_set_new(c, "world", json_integer(1));
			else
				json_object_set_new(c, "digest", json_string("xyz"));
			t = json_dumps(c, JSON_COMPACT);
			ck_assert_msg(plans_from_json(t, strlen(t), &back, err) < 0, "%s accepted",
			              edits[i][0]);
			ck_assert_msg(strstr(err, edits[i][1]), "%s: %s", edits[i][0], err);
			free(t);
			json_decref(c);
		}
	}
	json_decref(root);
	free(text);
	plans_free(f);
}
END_TEST

/* A plans file's summary: its ranks, options and signatures, its file's digest; both ways. */
START_TEST(test_plans_summary)
{
	struct plans_file *f = mk_plans(), *back;
	char *text, *sum, *again;
	size_t len, slen;
	uint64_t sig;

	f->ranks[1].copies = 2;
	ck_assert_int_eq(plans_summary_to_json(f, &sum, &slen, err), -EINVAL); /* no digest yet */
	ck_assert_msg(strstr(err, "digest"), "%s", err);
	ck_assert_msg(plans_to_json(f, &text, &len, err) == 0, "%s", err);
	ck_assert_msg(plans_summary_to_json(f, &sum, &slen, err) == 0, "%s", err);
	ck_assert_ptr_null(strstr(sum, "\"tensors\""));
	ck_assert_int_eq(plans_from_json(sum, slen, &back, err), -EINVAL); /* not a plans file */
	ck_assert_int_eq(plans_summary_from_json(text, len, &back, err), -EINVAL);
	ck_assert_msg(plans_summary_from_json(sum, slen, &back, err) == 0, "%s", err);
	ck_assert(back->summary && back->writes_once);
	ck_assert_str_eq(back->digest, f->digest);
	ck_assert_str_eq(back->run, "r");
	ck_assert_uint_eq(back->nranks, 2);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(tensors_signature(f->ranks[i].tensors, f->ranks[i].ntensors, &sig),
		                 0);
		ck_assert(back->ranks[i].has_sig && back->ranks[i].sig == sig);
		ck_assert_uint_eq(back->ranks[i].ntensors, 0);
		ck_assert_uint_eq(back->ranks[i].copies, (unsigned)i + 1);
	}
	ck_assert(back->ranks[0].sig != back->ranks[1].sig);
	ck_assert_msg(plans_summary_to_json(back, &again, &len, err) == 0, "%s", err);
	ck_assert_str_eq(again, sum); /* read back, written again: the same bytes */
	free(again);
	plans_free(back);
	/* a signature that is not 16 hex digits */
	again = strdup(sum);
	memcpy(strstr(again, "\"sig\"") + 7, "zz", 2);
	ck_assert_int_eq(plans_summary_from_json(again, strlen(again), &back, err), -EINVAL);
	ck_assert_msg(strstr(err, "sig"), "%s", err);
	free(again);
	free(sum);
	free(text);
	plans_free(f);
}
END_TEST

/* A run's roster: every node's summary in one file, both ways, and what it refuses. */
START_TEST(test_roster_file)
{
	struct plans_file *f = mk_plans(), *g = mk_plans(), *v[2];
	struct roster_file r = {.job = "job",
	                        .run = "r",
	                        .world = 4,
	                        .generation = 0x1234,
	                        .nnodes = 2,
	                        .nodes = v},
	                   *back;
	char *text, *again, *t;
	size_t len;

	free(g->node);
	g->node = xstrdup("n1");
	g->ranks[0].rank = 2;
	g->ranks[1].rank = 3;
	ck_assert_int_eq(plans_to_json(f, &text, &len, err), 0);
	free(text);
	ck_assert_int_eq(plans_to_json(g, &text, &len, err), 0);
	free(text);
	v[0] = f;
	v[1] = g;
	ck_assert_msg(roster_file_to_json(&r, &text, &len, err) == 0, "%s", err);
	ck_assert_ptr_null(strstr(text, "\"tensors\""));
	ck_assert_msg(roster_file_from_json(text, len, &back, err) == 0, "%s", err);
	ck_assert_uint_eq(back->nnodes, 2);
	ck_assert(back->generation == 0x1234 && back->world == 4);
	ck_assert_str_eq(back->nodes[1]->node, "n1");
	ck_assert_str_eq(back->nodes[1]->run, "r");
	ck_assert_str_eq(back->nodes[1]->digest, g->digest);
	ck_assert(back->nodes[1]->summary && back->nodes[1]->ranks[1].rank == 3);
	ck_assert(back->nodes[1]->ranks[1].has_sig);
	ck_assert_int_eq(roster_file_to_json(back, &again, &len, err), 0);
	ck_assert_str_eq(again, text);
	free(again);
	roster_file_free(back);
	/* refused: a rank of two nodes; nodes out of order; a world too small */
	g->ranks[0].rank = 1;
	ck_assert_int_eq(roster_file_to_json(&r, &t, &len, err), 0);
	ck_assert_int_eq(roster_file_from_json(t, len, &back, err), -EINVAL);
	ck_assert_msg(strstr(err, "rank 1 is claimed by two nodes"), "%s", err);
	free(t);
	g->ranks[0].rank = 2;
	v[0] = g;
	v[1] = f;
	ck_assert_int_eq(roster_file_to_json(&r, &t, &len, err), -EINVAL); /* not written so */
	t = strdup(text);
	memcpy(strstr(t, "\"world\":4"), "\"world\":1", 9);
	ck_assert_int_eq(roster_file_from_json(t, strlen(t), &back, err), -EINVAL);
	free(t);
	free(text);
	plans_free(f);
	plans_free(g);
}
END_TEST

/* A node's share of the assignment, and the run's set mark: both ways, and what they refuse. */
START_TEST(test_share_file)
{
	struct share_cut cuts[2] = {{1, 0, 2}, {3, 0, 0}};
	struct share_rank ranks[2] = {
	    {.rank = 1, .sig = 0xabc, .ntensors = 4},
	    {.rank = 3, .sig = 0xdef, .ntensors = 4, .ncuts = 2, .cuts = cuts}};
	struct plans_share sh = {.job = "job",
	                         .node = "n1",
	                         .run = "r",
	                         .world = 4,
	                         .set = 0x77,
	                         .nranks = 2,
	                         .ranks = ranks},
	                   *back;
	struct set_mark m = {.job = "job", .run = "r", .world = 4, .set = 0x77, .generation = 9},
	                *mb;
	static const char *const bad[][2] = {
	    {"[3,0,0]]", "[5,0,0]]"}, /* a tensor beyond the rank's 4 */
	    {"[[1,0,2],[3,0,0]]", "[[3,0,2],[1,0,0]]"}, /* out of order */
	    {"[3,0,0]]", "[3,-1,0]]"}, /* not a count */
	    {"[3,0,0]]", "[3,9223372036854775807,1]]"}, /* past any row */
	    {"\"rank\":3", "\"rank\":4"}, /* beyond the world */
	    {"\"rank\":3", "\"rank\":1"}, /* twice */
	    {"\"set\":\"0000000000000077\"", "\"set\":\"0000000000000000\""},
	    {"\"tensors\":4,\"sig\":\"0000000000000def",
	     "\"tensors\":1,\"sig\":\"0000000000000def"},
	};
	char *text, *again;
	size_t len;

	ck_assert_msg(share_to_json(&sh, &text, &len, err) == 0, "%s", err);
	ck_assert_msg(share_from_json(text, len, &back, err) == 0, "%s\n%s", err, text);
	ck_assert(back->set == 0x77 && back->world == 4 && back->nranks == 2);
	ck_assert_str_eq(back->node, "n1");
	ck_assert(back->ranks[0].ncuts == 0 && back->ranks[0].sig == 0xabc);
	ck_assert(back->ranks[1].ncuts == 2 && back->ranks[1].cuts[0].rows == 2 &&
	          back->ranks[1].cuts[1].tensor == 3 && back->ranks[1].cuts[1].rows == 0);
	ck_assert_int_eq(share_to_json(back, &again, &len, err), 0);
	ck_assert_str_eq(again, text);
	free(again);
	share_free(back);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *t = malloc(strlen(text) + 64), *at = strstr(text, bad[i][0]);

		ck_assert_msg(at, "%s not in %s", bad[i][0], text);
		sprintf(t, "%.*s%s%s", (int)(at - text), text, bad[i][1], at + strlen(bad[i][0]));
		ck_assert_msg(share_from_json(t, strlen(t), &back, err) == -EINVAL, "%s accepted",
		              t);
		free(t);
	}
	free(text);
	/* the set mark */
	ck_assert_msg(set_mark_to_json(&m, &text, &len, err) == 0, "%s", err);
	ck_assert_msg(set_mark_from_json(text, len, &mb, err) == 0, "%s", err);
	ck_assert(mb->set == 0x77 && mb->generation == 9 && !mb->writes_all && mb->world == 4);
	set_mark_free(mb);
	free(text);
	m.generation = 0;
	ck_assert_int_eq(set_mark_to_json(&m, &text, &len, err), 0);
	ck_assert_int_eq(set_mark_from_json(text, len, &mb, err), -EINVAL);
	free(text);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("part");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_part_roundtrip);
	tcase_add_test(tc, test_part_refusals);
	tcase_add_test(tc, test_summary);
	tcase_add_test(tc, test_plans_summary);
	tcase_add_test(tc, test_roster_file);
	tcase_add_test(tc, test_share_file);
	tcase_add_test(tc, test_merge);
	tcase_add_test(tc, test_merge_refusals);
	tcase_add_test(tc, test_plans);
	suite_add_tcase(s, tc);
	return s;
}
