/*
 * The many-nodes commit (commit/commit.c) against a fake backend shared by
 * several committers, one per node, with a fake clock: one node alone; the
 * rank-0 node committing two nodes' parts; the others taking over after half
 * the deadline (the same bytes as a commit by hand); the deadline naming who
 * is missing and writing nothing; parts of another run, planted garbage, two
 * nodes claiming one rank, a missing shard, a failed part write; the
 * back-off; LATEST never moving back; parts that are not their plans,
 * stamped from the future, or do not parse (read once); a manifest naming
 * a file of this node's that is not there; a part copied from another step
 * (its files' stamps say otherwise) never joins; a store whose create-once
 * is not atomic: nobody but rank 0's node writes the manifest; the parts'
 * summaries: read in place of the parts, never trusted over them, removed
 * before a part is put, and plans that change within a run read again.
 */
#define _GNU_SOURCE /* memmem */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "commit/commit.h"
#include "support/fake_store.h"
#include "support/check_main.h"

#define S 1000000000LL
#define DEADLINE (10 * S)
#define JOB "j"

static struct fake_store *fs;
static struct storage *st;
static char err[IPC_ERRLEN];
static int64_t T0; /* the real clock at the start: the parts' times, near now */

static void setup(void)
{
	fs = fake_create();
	st = fake_storage(fs);
	T0 = ipc_now_ns() / S * S;
}

static void teardown(void)
{
	fake_destroy(fs);
}

static struct committer *node_of(const char *name, bool single_writer)
{
	struct commit_opts o = {st, name, DEADLINE, single_writer};
	struct committer *cm;

	ck_assert_msg(committer_create(&o, &cm, err) == 0, "%s", err);
	return cm;
}

static struct committer *node(const char *name)
{
	return node_of(name, false);
}

/* Rank r's tensor "w": a 4-float box of a sharded [4*world]. */
static struct manifest_tensor *tensor_w(int r, int world)
{
	struct manifest_tensor *t = calloc(1, sizeof(*t));

	t->name = strdup("w");
	t->dtype = 12; /* F32 */
	t->ndim = 1;
	t->global_shape[0] = 4 * world;
	t->sharded = true;
	t->nchunks = 1;
	t->chunks = calloc(1, sizeof(*t->chunks));
	t->chunks[0] = (struct manifest_chunk){.rank = r, .begin = 64, .end = 80, .xxh3 = 7 + r};
	t->chunks[0].global_offset[0] = 4 * r;
	t->chunks[0].shape[0] = 4;
	return t;
}

/*
 * The header of rank r's shard, as the agent writes it: "w" (16 bytes),
 * stamped with (step, save). Into *hdr (malloc'd); its length is returned.
 */
static size_t shard_header(const char *run, int r, int world, int64_t step, uint64_t save,
                           void **hdr)
{
	char rank[16], wd[16];
	const int64_t shape[1] = {4};
	const struct st_tensor t = {"w", 12, 1, shape, 0, 16};
	const struct st_meta meta[] = {{"producer", "ckptd"},  {"job", JOB},
	                               {"run", run},           {"rank", rank},
	                               {"world", wd},          {"step", ST_STAMP_STEP},
	                               {"save", ST_STAMP_SAVE}};
	const struct st_stamp stamp = {step, save};
	struct st_stamp_at at;
	size_t len;

	snprintf(rank, sizeof(rank), "%d", r);
	snprintf(wd, sizeof(wd), "%d", world);
	ck_assert_msg(
	    st_header_build(&t, 1, meta, sizeof(meta) / sizeof(meta[0]), hdr, &len, err) == 0, "%s",
	    err);
	ck_assert_msg(st_stamp_find(*hdr, len, &at, err) == 0, "%s", err);
	st_stamp_apply(&at, &stamp, 0, *hdr, len);
	return len;
}

/* Rank r's part of a step: its tensor "w", its shard put in the root. */
static void fill_rank(struct part_rank *k, const char *run, const char *node, int r, int world,
                      int64_t step)
{
	char file[SHARD_FILE_MAX], meta[32];
	struct manifest_tensor *t = tensor_w(r, world);
	const uint64_t save = 0x5a5e0000u + (uint64_t)step * 1000 + (uint64_t)r;
	void *hdr;
	size_t hl = shard_header(run, r, world, step, save, &hdr);

	ck_assert_int_eq(shard_file_name(r, node, 0, file, sizeof(file)), 0);
	snprintf(meta, sizeof(meta), "{\"rank\": %d}", r);
	t->chunks[0].begin = hl;
	t->chunks[0].end = hl + 16;
	*k = (struct part_rank){.rank = r,
	                        .file = strdup(file),
	                        .size = hl + 16,
	                        .header_bytes = hl,
	                        .meta_json = strdup(meta),
	                        .save = save,
	                        .queued_unix_ns = T0,
	                        .captured_unix_ns = T0 + 1 * S + r,
	                        .durable_unix_ns = T0 + 2 * S + r,
	                        .ntensors = 1,
	                        .tensors = t};
	fake_add_shard_bytes(fs, JOB, step, file, hdr, hl, hl + 16);
	free(hdr);
}

static struct part *mk_part(const char *run, const char *nd, int world, int64_t step,
                            const int *ranks, size_t n)
{
	struct part *p = calloc(1, sizeof(*p));

	*p = (struct part){PART_VERSION,
	                   strdup(JOB),
	                   strdup(run),
	                   strdup(nd),
	                   step,
	                   world,
	                   T0 + 3 * S,
	                   n,
	                   calloc(n, sizeof(struct part_rank)),
	                   0,
	                   0,
	                   false};
	for (size_t i = 0; i < n; i++)
		fill_rank(&p->ranks[i], run, nd, ranks[i], world, step);
	return p;
}

static void hold_x(struct part_rank *k, int world);

/* Node nd's plans file: each rank holds "w" (and "x" too where x). */
static void plans_of(const char *nd, const char *run, int world, const int *ranks, size_t n, bool x)
{
	struct plans_file f = {.version = PLANS_VERSION,
	                       .job = JOB,
	                       .node = (char *)nd,
	                       .run = (char *)run,
	                       .world = world,
	                       .nranks = n,
	                       .ranks = calloc(n, sizeof(struct plans_rank))};
	struct part *p = mk_part(run, nd, world, 99, ranks, n); /* its tensors, as a part's */
	bool wrote;

	for (size_t i = 0; i < n; i++) {
		if (x)
			hold_x(&p->ranks[i], world);
		f.ranks[i].rank = ranks[i];
		f.ranks[i].ntensors = p->ranks[i].ntensors;
		f.ranks[i].tensors = p->ranks[i].tensors;
	}
	ck_assert_msg(store_put_plans(st, &f, &wrote, err) == 0, "%s", err);
	free(f.ranks);
	part_free(p);
}

static void plans(const char *nd, const char *run, int world, const int *ranks, size_t n)
{
	plans_of(nd, run, world, ranks, n, false);
}

/* Puts a part in the root as its node would. */
static void put_part(struct part *p)
{
	ck_assert_msg(store_put_part(st, p, err) == 0, "%s", err);
	part_free(p);
}

static struct commit *start(struct committer *cm, struct part *p, bool first, int64_t t0)
{
	struct commit *c;

	ck_assert_msg(commit_create(cm, p, first, t0, &c, err) == 0, "%s", err);
	return c;
}

static enum commit_state poll_at(struct commit *c, int64_t now, struct commit_result *r)
{
	int64_t next;

	commit_poll(c, now, &next, r);
	ck_assert_int_ge(next, now);
	return r->state;
}

static int64_t latest(void)
{
	int64_t v = -1;

	return store_latest_get(st, JOB, &v, err) == 0 ? v : -1;
}

static bool has(char **v, size_t n, const char *s)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(v[i], s) == 0)
			return true;
	return false;
}

/* ---- one node ---------------------------------------------------------- */

START_TEST(test_single_node)
{
	static const int ranks[] = {0, 1};
	struct committer *cm = node("n0");
	struct commit *c = start(cm, mk_part("r1", "n0", 2, 5, ranks, 2), true, 0);
	struct commit_result r;
	struct fake_counts n;

	ck_assert_int_eq(poll_at(c, 0, &r), COMMIT_COMMITTED);
	ck_assert(r.wrote);
	ck_assert_int_eq(r.manifest->world, 2);
	ck_assert_str_eq(r.manifest->run, "r1");
	ck_assert_uint_eq(r.manifest->nparts, 1);
	ck_assert_str_eq(r.manifest->parts[0].node, "n0");
	ck_assert_str_eq(manifest_rank_meta(r.manifest, 1), "{\"rank\": 1}");
	ck_assert(fake_get(fs, JOB "/step-000000000005/parts/n0.json", NULL));
	ck_assert(fake_get(fs, JOB "/step-000000000005/manifest.json", NULL));
	ck_assert_int_eq(latest(), 5);
	/* a node that holds every rank reads nobody's plans */
	fake_counts(fs, &n);
	ck_assert_uint_eq(n.lists, 0);
	commit_result_free(&r);
	commit_destroy(c);
	committer_destroy(cm);
}
END_TEST

/*
 * A rank holds a replicated box that no rank's file has (two nodes assigned
 * the writers from different plans): the step fails, and no manifest names it.
 */
START_TEST(test_hole_fails)
{
	static const int ranks[] = {0, 1};
	struct committer *cm = node("n0");
	struct part *p = mk_part("r1", "n0", 2, 5, ranks, 2);
	struct part_rank *k = &p->ranks[1];
	struct commit *c;
	struct commit_result r;
	struct manifest_tensor *v = tensor_w(1, 2), *w = tensor_w(1, 2);

	k->holds = calloc(2, sizeof(*k->holds));
	k->holds[0] = *v; /* held, written by nobody (sorted by name: first) */
	free(k->holds[0].name);
	k->holds[0].name = strdup("v");
	k->holds[0].chunks[0].begin = k->holds[0].chunks[0].end = 0;
	k->holds[1] = *w; /* its own box: written */
	k->nholds = 2;
	free(v);
	free(w);
	c = start(cm, p, true, 0);
	ck_assert_int_eq(poll_at(c, 0, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "the parts leave a hole: tensor 'v' box at [4] shape [4], "
	                               "held by rank 1, was written by no rank"),
	              "%s", r.reason);
	ck_assert(!fake_get(fs, JOB "/step-000000000005/manifest.json", NULL));
	ck_assert_int_eq(latest(), -1);
	commit_result_free(&r);
	commit_destroy(c);
	committer_destroy(cm);
}
END_TEST

/* ---- many nodes: the head ---------------------------------------------- */

/* The head names node's part by the length and XXH3-64 of its bytes in the root. */
static void names_part(const struct manifest *m, size_t i, const char *node, int64_t step)
{
	char key[STORE_KEY_MAX];
	const char *bytes;
	size_t len = 0;

	store_part_key(key, sizeof(key), JOB, step, node);
	bytes = fake_get(fs, key, &len);
	ck_assert_ptr_nonnull(bytes);
	ck_assert_str_eq(m->parts[i].node, node);
	ck_assert_uint_eq(m->parts[i].size, len);
	ck_assert_uint_eq(m->parts[i].xxh3, XXH3_64bits(bytes, len));
}

/*
 * Three nodes: the manifest is a head naming each part by its bytes; a
 * watching node reads the head alone (no part, no shard); read whole, it
 * is the merge of the parts; a part replaced or lost since the commit is
 * damage (-EBADMSG), never absence; with the head gone, absence.
 */
START_TEST(test_head_of_three_nodes)
{
	static const int r0[] = {0, 1}, r1[] = {2, 3}, r2[] = {4, 5};
	struct committer *a = node("a"), *b = node("b"), *c = node("c");
	struct commit *ca, *cb, *cc;
	struct commit_result r;
	struct fake_counts before, after;
	struct manifest *m;
	struct part *p;
	char *json;
	size_t len;

	plans("a", "r", 6, r0, 2);
	plans("b", "r", 6, r1, 2);
	plans("c", "r", 6, r2, 2);
	ca = start(a, mk_part("r", "a", 6, 9, r0, 2), true, 0);
	cb = start(b, mk_part("r", "b", 6, 9, r1, 2), false, 0);
	cc = start(c, mk_part("r", "c", 6, 9, r2, 2), false, 0);
	ck_assert_int_eq(poll_at(cb, 1, &r), COMMIT_WAITING);
	commit_result_free(&r);
	/* waiting, a watching node looks for the manifest alone */
	fake_counts(fs, &before);
	ck_assert_int_eq(poll_at(cb, 2, &r), COMMIT_WAITING);
	fake_counts(fs, &after);
	ck_assert_uint_eq(after.gets - before.gets, 1);
	ck_assert_uint_eq(after.stats - before.stats, 0);
	ck_assert_uint_eq(after.shard_reads + after.shard_stats,
	                  before.shard_reads + before.shard_stats);
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(cc, 2, &r), COMMIT_WAITING);
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(ca, 3, &r), COMMIT_COMMITTED);
	ck_assert(r.wrote && r.manifest->head_only);
	commit_result_free(&r);
	ck_assert_ptr_nonnull(
	    json = (char *)fake_get(fs, JOB "/step-000000000009/manifest.json", &len));
	ck_assert_msg(manifest_from_json(json, len, &m, err) == 0, "%s", err);
	ck_assert_int_eq(m->version, MANIFEST_VERSION_HEAD);
	ck_assert(m->head_only);
	ck_assert_uint_eq(m->nparts, 3);
	ck_assert_uint_eq(m->head_tensors, 1);
	names_part(m, 0, "a", 9);
	names_part(m, 1, "b", 9);
	names_part(m, 2, "c", 9);
	manifest_free(m);
	/* COMMITTED at a watching node: the head and LATEST, two reads, nothing else */
	fake_counts(fs, &before);
	ck_assert_int_eq(poll_at(cb, 4, &r), COMMIT_COMMITTED);
	fake_counts(fs, &after);
	ck_assert_uint_eq(after.gets - before.gets, 2);
	ck_assert_uint_eq(after.shard_reads + after.shard_stats,
	                  before.shard_reads + before.shard_stats);
	ck_assert(!r.wrote && r.manifest->head_only);
	commit_result_free(&r);
	/* whole: the ranks and the tensors from the parts */
	ck_assert_msg(store_read_manifest(st, JOB, 9, &m, err) == 0, "%s", err);
	ck_assert(!m->head_only);
	ck_assert_uint_eq(m->nranks, 6);
	ck_assert_str_eq(m->ranks[5].file, "rank-00005.c.0.safetensors");
	ck_assert_uint_eq(manifest_find(m, "w")->nchunks, 6);
	manifest_free(m);
	/* what rank 5's own layout needs: the head and c's part, two reads */
	fake_counts(fs, &before);
	ck_assert_msg(store_read_manifest_rank(st, JOB, 9, 5, &m, err) == 0, "%s", err);
	fake_counts(fs, &after);
	ck_assert_uint_eq(after.gets - before.gets, 2);
	ck_assert(m->partial && !m->head_only);
	ck_assert_str_eq(m->ranks[5].file, "rank-00005.c.0.safetensors");
	ck_assert_int_eq(m->ranks[0].rank, -1); /* a's: not read */
	ck_assert_uint_eq(manifest_find(m, "w")->nchunks, 2);
	ck_assert_str_eq(manifest_rank_meta(m, 5), "{\"rank\": 5}");
	manifest_free(m);
	/* c's part replaced since: damage, naming it */
	ck_assert_msg(store_read_part(st, JOB, 9, "c", &p, err) == 0, "%s", err);
	p->time_unix_ns += 1;
	ck_assert_int_eq(part_to_json(p, &json, &len, err), 0);
	fake_put(fs, JOB "/step-000000000009/parts/c.json", json, len);
	free(json);
	part_free(p);
	ck_assert_int_eq(store_read_manifest(st, JOB, 9, &m, err), -EBADMSG);
	ck_assert_msg(strstr(err, "parts/c.json is not the part the manifest names"), "%s", err);
	/* lost: damage too */
	fake_delete(fs, JOB "/step-000000000009/parts/c.json");
	ck_assert_int_eq(store_read_manifest(st, JOB, 9, &m, err), -EBADMSG);
	ck_assert_msg(strstr(err, "node c: not there"), "%s", err);
	/* the step removed (its head first): absent */
	fake_delete(fs, JOB "/step-000000000009/manifest.json");
	ck_assert_int_eq(store_read_manifest(st, JOB, 9, &m, err), -ENOENT);
	commit_destroy(ca);
	commit_destroy(cb);
	commit_destroy(cc);
	committer_destroy(a);
	committer_destroy(b);
	committer_destroy(c);
}
END_TEST

/*
 * A head names another part of this node than the one it wrote (b's part in
 * the root, read by the committer, was not b's save): b's part is not put
 * over it (the step is committed), and b is not told COMMITTED.
 */
START_TEST(test_head_names_other_part)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a"), *b = node("b");
	struct part *other = mk_part("r", "b", 2, 8, r1, 1);
	struct commit *ca, *cb;
	struct commit_result r;
	const char *before;
	char *copy;
	size_t len;

	plans("a", "r", 2, r0, 1);
	plans("b", "r", 2, r1, 1);
	other->time_unix_ns += 1; /* the same files, another part */
	put_part(other);
	ca = start(a, mk_part("r", "a", 2, 8, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(ca, 1, &r), COMMIT_COMMITTED);
	commit_result_free(&r);
	before = fake_get(fs, JOB "/step-000000000008/parts/b.json", &len);
	copy = strndup(before, len);
	cb = start(b, mk_part("r", "b", 2, 8, r1, 1), false, 0);
	ck_assert_int_eq(poll_at(cb, 2, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "naming another part of node b"), "%s", r.reason);
	commit_result_free(&r);
	ck_assert_str_eq(fake_get(fs, JOB "/step-000000000008/parts/b.json", NULL), copy);
	free(copy);
	commit_destroy(ca);
	commit_destroy(cb);
	committer_destroy(a);
	committer_destroy(b);
}
END_TEST

/*
 * Parts that cannot make one checkpoint (a tensor of one name and two
 * dtypes on two nodes, each as its plans say): the step FAILS as soon as
 * every part is in, once, with the reason; not at every poll until the
 * deadline.
 */
START_TEST(test_parts_disagree_fail_at_once)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a"), *b = node("b");
	struct commit *ca, *cb;
	struct commit_result r;
	struct part *pb = mk_part("r", "b", 2, 4, r1, 1);
	struct plans_file f = {.version = PLANS_VERSION,
	                       .job = JOB,
	                       .node = "b",
	                       .run = "r",
	                       .world = 2,
	                       .nranks = 1,
	                       .ranks = calloc(1, sizeof(struct plans_rank))};
	bool wrote;

	plans("a", "r", 2, r0, 1);
	pb->ranks[0].tensors[0].dtype = 11; /* I32: the same bytes, another tensor */
	f.ranks[0].rank = 1;
	f.ranks[0].ntensors = 1;
	f.ranks[0].tensors = tensor_w(1, 2);
	f.ranks[0].tensors->dtype = 11;
	ck_assert_msg(store_put_plans(st, &f, &wrote, err) == 0, "%s", err);
	free(f.ranks[0].tensors->name);
	free(f.ranks[0].tensors->chunks);
	free(f.ranks[0].tensors);
	free(f.ranks);
	ca = start(a, mk_part("r", "a", 2, 4, r0, 1), true, 0);
	cb = start(b, pb, false, 0);
	ck_assert_int_eq(poll_at(cb, 1, &r), COMMIT_WAITING);
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(ca, 2, &r), COMMIT_FAILED);
	ck_assert_msg(
	    strstr(r.reason, "the parts do not merge: tensor 'w' is saved by ranks 0 and 1"), "%s",
	    r.reason);
	commit_result_free(&r);
	ck_assert(!fake_get(fs, JOB "/step-000000000004/manifest.json", NULL));
	commit_destroy(ca);
	commit_destroy(cb);
	committer_destroy(a);
	committer_destroy(b);
}
END_TEST

/* ---- two nodes --------------------------------------------------------- */

START_TEST(test_two_nodes)
{
	static const int r0[] = {0, 1}, r1[] = {2, 3};
	struct committer *a = node("a"), *b = node("b");
	struct commit *ca, *cb;
	struct commit_result r;
	struct manifest *m;
	size_t len;

	plans("a", "r", 4, r0, 2);
	plans("b", "r", 4, r1, 2);
	ca = start(a, mk_part("r", "a", 4, 9, r0, 2), true, 0);
	cb = start(b, mk_part("r", "b", 4, 9, r1, 2), false, 0);
	ck_assert_int_eq(poll_at(ca, 1, &r), COMMIT_WAITING);
	ck_assert(has(r.done, r.ndone, "a"));
	ck_assert_msg(has(r.missing, r.nmissing, "b (ranks 2,3)"), "%s",
	              r.nmissing ? r.missing[0] : "(none)");
	commit_result_free(&r);
	/* b writes its part but does not commit: a does */
	ck_assert_int_eq(poll_at(cb, 2, &r), COMMIT_WAITING);
	ck_assert(!fake_get(fs, JOB "/step-000000000009/manifest.json", NULL));
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(ca, 3, &r), COMMIT_COMMITTED);
	ck_assert(r.wrote);
	ck_assert_uint_eq(r.manifest->nparts, 2);
	ck_assert_str_eq(r.manifest->parts[1].node, "b");
	ck_assert_int_eq(r.manifest->parts[1].ranks[1], 3);
	ck_assert_str_eq(manifest_node_of(r.manifest, 2), "b");
	/* of two nodes, the head: each part named by its bytes, the ranks in the parts */
	ck_assert_int_eq(r.manifest->version, MANIFEST_VERSION_HEAD);
	ck_assert(r.manifest->head_only);
	ck_assert_uint_eq(r.manifest->nranks, 0);
	ck_assert_uint_ne(r.manifest->parts[1].xxh3, 0);
	/* times come from the parts: no clock in the bytes */
	ck_assert_int_eq(r.manifest->time_unix_ns, T0 + 3 * S);
	commit_result_free(&r);
	/* read back whole: the head and its parts */
	ck_assert_msg(store_read_manifest(st, JOB, 9, &m, err) == 0, "%s", err);
	ck_assert(!m->head_only);
	ck_assert_uint_eq(m->nranks, 4);
	/* read back from another node's part: the text as that trainer gave it */
	ck_assert_str_eq(manifest_rank_meta(m, 3), "{\"rank\": 3}");
	ck_assert_str_eq(m->ranks[3].file, "rank-00003.b.0.safetensors");
	manifest_free(m);
	ck_assert_int_eq(poll_at(cb, 4, &r), COMMIT_COMMITTED);
	ck_assert(!r.wrote);
	ck_assert_ptr_nonnull(fake_get(fs, JOB "/step-000000000009/manifest.json", &len));
	commit_result_free(&r);
	commit_destroy(ca);
	commit_destroy(cb);
	committer_destroy(a);
	committer_destroy(b);
}
END_TEST

/*
 * The rank-0 node dies after its part is durable: the other commits after
 * half the deadline, not before, and writes what a commit by hand writes.
 */
START_TEST(test_takeover_same_bytes)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a"), *b = node("b");
	struct commit *ca, *cb;
	struct commit_result r;
	char *first;
	size_t len, len2;
	bool already;

	plans("a", "r", 2, r0, 1);
	plans("b", "r", 2, r1, 1);
	ca = start(a, mk_part("r", "a", 2, 3, r0, 1), true, 0);
	cb = start(b, mk_part("r", "b", 2, 3, r1, 1), false, 0);
	ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_WAITING); /* a's part; then a is gone */
	commit_result_free(&r);
	commit_destroy(ca);
	ck_assert_int_eq(poll_at(cb, DEADLINE / 2 - 1, &r), COMMIT_WAITING);
	ck_assert(!fake_get(fs, JOB "/step-000000000003/manifest.json", NULL));
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(cb, DEADLINE / 2, &r), COMMIT_COMMITTED);
	ck_assert(r.wrote);
	commit_result_free(&r);
	first = strdup(fake_get(fs, JOB "/step-000000000003/manifest.json", &len));
	/* by hand, from what is in the root: the same bytes */
	fake_delete(fs, JOB "/step-000000000003/manifest.json");
	ck_assert_msg(commit_finish(a, JOB, 3, &r, &already, err) == 0, "%s", err);
	ck_assert(!already && r.wrote);
	ck_assert_str_eq(fake_get(fs, JOB "/step-000000000003/manifest.json", &len2), first);
	ck_assert_uint_eq(len, len2);
	commit_result_free(&r);
	/* again: already committed, nothing written */
	ck_assert_int_eq(commit_finish(a, JOB, 3, &r, &already, err), 0);
	ck_assert(already && !r.wrote);
	commit_result_free(&r);
	free(first);
	commit_destroy(cb);
	committer_destroy(a);
	committer_destroy(b);
}
END_TEST

/* Both commit at once (b past half the deadline): one writes, the other's EEXIST is success. */
START_TEST(test_racing_writers)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a"), *b = node("b");
	struct commit *ca, *cb;
	struct commit_result r;
	struct fake_counts before, after;

	plans("a", "r", 2, r0, 1);
	plans("b", "r", 2, r1, 1);
	ca = start(a, mk_part("r", "a", 2, 4, r0, 1), true, 0);
	cb = start(b, mk_part("r", "b", 2, 4, r1, 1), false, -DEADLINE);
	ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_WAITING);
	commit_result_free(&r);
	/* b: its part, and past its takeover time: it commits */
	ck_assert_int_eq(poll_at(cb, 1, &r), COMMIT_COMMITTED);
	ck_assert(r.wrote);
	commit_result_free(&r);
	fake_counts(fs, &before);
	ck_assert_int_eq(poll_at(ca, 2, &r), COMMIT_COMMITTED);
	ck_assert(!r.wrote);
	fake_counts(fs, &after);
	ck_assert_uint_eq(after.puts, before.puts); /* a wrote nothing */
	commit_result_free(&r);
	commit_destroy(ca);
	commit_destroy(cb);
	committer_destroy(a);
	committer_destroy(b);
}
END_TEST

/* ---- failures ---------------------------------------------------------- */

START_TEST(test_deadline_names_missing)
{
	static const int r0[] = {0, 1}, r1[] = {2, 3}, r2[] = {4, 5};
	struct committer *a = node("a");
	struct commit *ca;
	struct commit_result r;

	plans("a", "r", 6, r0, 2);
	plans("n2", "r", 6, r1, 2);
	plans("n3", "r", 6, r2, 2);
	fake_put(fs, JOB "/LATEST", "2\n", 2);
	ca = start(a, mk_part("r", "a", 6, 300, r0, 2), true, 0);
	ck_assert_int_eq(poll_at(ca, 1, &r), COMMIT_WAITING);
	commit_result_free(&r);
	/* one of the two shows up */
	put_part(mk_part("r", "n3", 6, 300, r2, 2));
	ck_assert_int_eq(poll_at(ca, DEADLINE, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "step 300: no part from node n2 (ranks 2,3) after 10 s"),
	              "%s", r.reason);
	ck_assert_msg(!strstr(r.reason, "n3"), "%s", r.reason);
	ck_assert_uint_eq(r.missing_at_deadline, 1);
	ck_assert(!fake_get(fs, JOB "/step-000000000300/manifest.json", NULL));
	ck_assert_int_eq(latest(), 2);
	commit_result_free(&r);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/* Ranks no node has published plans for are named too. */
START_TEST(test_deadline_unknown_ranks)
{
	static const int r0[] = {0};
	struct committer *a = node("a");
	struct commit *ca = start(a, mk_part("r", "a", 3, 1, r0, 1), true, 0);
	struct commit_result r;

	ck_assert_int_eq(poll_at(ca, DEADLINE, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "no node's plans (ranks 1,2)"), "%s", r.reason);
	commit_result_free(&r);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/* A part of another run is refused; the node's part of this run replaces it. */
START_TEST(test_other_run_refused)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a"), *b = node("b");
	struct commit *ca, *cb;
	struct commit_result r;

	plans("a", "new", 2, r0, 1);
	plans("b", "new", 2, r1, 1);
	put_part(mk_part("old", "b", 2, 6, r1, 1));
	ca = start(a, mk_part("new", "a", 2, 6, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(ca, 1, &r), COMMIT_WAITING);
	ck_assert(!fake_get(fs, JOB "/step-000000000006/manifest.json", NULL));
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(ca, DEADLINE - 1, &r), COMMIT_WAITING);
	commit_result_free(&r);
	cb = start(b, mk_part("new", "b", 2, 6, r1, 1), false, 0);
	ck_assert_int_eq(poll_at(cb, 2, &r), COMMIT_WAITING); /* replaces the old part */
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(ca, DEADLINE - 1, &r), COMMIT_COMMITTED);
	ck_assert_str_eq(r.manifest->run, "new");
	commit_result_free(&r);
	commit_destroy(ca);
	commit_destroy(cb);
	committer_destroy(a);
	committer_destroy(b);
}
END_TEST

START_TEST(test_other_run_reason)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a");
	struct commit *ca;
	struct commit_result r;

	plans("a", "new", 2, r0, 1);
	plans("b", "new", 2, r1, 1);
	put_part(mk_part("old", "b", 2, 6, r1, 1));
	ca = start(a, mk_part("new", "a", 2, 6, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(ca, DEADLINE, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "parts/b.json is of run old, not run new"), "%s", r.reason);
	commit_result_free(&r);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/* A step committed by another run: this run's save is not in it. */
START_TEST(test_committed_by_other_run)
{
	static const int r0[] = {0};
	struct committer *x = node("x"), *y = node("y");
	struct commit *cx, *cy;
	struct commit_result r;

	cx = start(x, mk_part("old", "x", 1, 8, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(cx, 0, &r), COMMIT_COMMITTED);
	commit_result_free(&r);
	cy = start(y, mk_part("new", "y", 1, 8, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(cy, 0, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "committed by run old of the job, without this save (run "
	                               "new)"),
	              "%s", r.reason);
	commit_result_free(&r);
	commit_destroy(cx);
	commit_destroy(cy);
	committer_destroy(x);
	committer_destroy(y);
}
END_TEST

START_TEST(test_rank_claimed_twice)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a");
	struct commit *ca;
	struct commit_result r;

	plans("b", "r", 2, r1, 1);
	plans("c", "r", 2, r1, 1);
	ca = start(a, mk_part("r", "a", 2, 1, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "rank 1 of run r is claimed by nodes b and c"), "%s",
	              r.reason);
	ck_assert(!fake_get(fs, JOB "/step-000000000001/manifest.json", NULL));
	commit_result_free(&r);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/* Garbage where a part should be: named at the deadline, nothing merged, nothing crashed. */
START_TEST(test_bad_part_named)
{
	static const char *const bad[] = {
	    "{not json",
	    "{\"format\": \"ckptd-part\", \"version\": 1}",
	    "[1, 2, 3]",
	};
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a");
	struct commit *ca;
	struct commit_result r;

	plans("a", "r", 2, r0, 1);
	plans("b", "r", 2, r1, 1);
	fake_put(fs, JOB "/step-000000000002/parts/b.json", bad[_i], strlen(bad[_i]));
	ca = start(a, mk_part("r", "a", 2, 2, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(ca, 1, &r), COMMIT_WAITING);
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(ca, DEADLINE, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "parts/b.json: part: "), "%s", r.reason);
	commit_result_free(&r);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/* A part that names a shard that is not there (or not of that size). */
START_TEST(test_missing_shard)
{
	static const int r0[] = {0};
	struct committer *a = node("a");
	struct part *p = mk_part("r", "a", 1, 2, r0, 1);
	struct commit *ca;
	struct commit_result r;
	char key[128];

	snprintf(key, sizeof(key), JOB "/step-000000000002/%s", p->ranks[0].file);
	if (_i == 0)
		fake_delete(fs, key);
	else
		fake_add_shard(fs, JOB, 2, p->ranks[0].file, p->ranks[0].size - 1);
	ca = start(a, p, true, 0);
	ck_assert_int_eq(poll_at(ca, 0, &r),
	                 COMMIT_WAITING); /* maybe a cache: until the deadline */
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(ca, DEADLINE, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "rank 0's shard") && strstr(r.reason, "(node a)") &&
	                  strstr(r.reason, "rank-00000.a.0.safetensors") &&
	                  strstr(r.reason, _i == 0 ? "does not exist" : "not the size"),
	              "%s", r.reason);
	ck_assert(!fake_get(fs, JOB "/step-000000000002/manifest.json", NULL));
	commit_result_free(&r);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

START_TEST(test_part_write_fails)
{
	static const int r0[] = {0};
	struct committer *a = node("a");
	struct commit *ca = start(a, mk_part("r", "a", 1, 2, r0, 1), true, 0);
	struct commit_result r;

	fake_fail_put(fs, "parts/a.json", -EIO);
	ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_WAITING); /* tried again next time */
	/* tried: a commit elsewhere may name its files, whatever the error said */
	ck_assert(commit_part_written(ca));
	commit_result_free(&r);
	fake_fail_put(fs, "parts/a.json", -EIO);
	ck_assert_int_eq(poll_at(ca, DEADLINE, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "writing this node's part: ") &&
	                  strstr(r.reason, "injected"),
	              "%s", r.reason);
	commit_result_free(&r);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/* An abort (the step destroyed before its first poll) writes nothing at all. */
START_TEST(test_abort_writes_nothing)
{
	static const int r0[] = {0};
	struct committer *a = node("a");
	struct commit *ca = start(a, mk_part("r", "a", 1, 2, r0, 1), true, 0);
	struct fake_counts n;

	commit_destroy(ca);
	fake_counts(fs, &n);
	ck_assert_uint_eq(n.puts, 0);
	committer_destroy(a);
}
END_TEST

/* Polls back off 20, 40, ... 500 ms; a part coming in starts again at 20. */
START_TEST(test_backoff)
{
	static const int r0[] = {0}, r1[] = {1};
	static const int64_t want[] = {20, 40, 80, 160, 320, 500, 500};
	struct committer *a = node("a");
	struct commit *ca;
	struct commit_result r;
	int64_t now = 0, next;

	plans("a", "r", 2, r0, 1);
	plans("b", "r", 2, r1, 1);
	ca = start(a, mk_part("r", "a", 2, 2, r0, 1), true, 0);
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		commit_poll(ca, now, &next, &r);
		commit_result_free(&r);
		ck_assert_int_eq(next - now, want[i] * 1000000);
		now = next;
	}
	put_part(mk_part("old", "b", 2, 2, r1, 1));
	commit_poll(ca, now, &next, &r); /* another run's: no progress */
	commit_result_free(&r);
	ck_assert_int_eq(next - now, 500 * 1000000);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/* A late commit of an older step never moves LATEST back. */
START_TEST(test_latest_forward_only)
{
	static const int r0[] = {0};
	struct committer *a = node("a");
	struct commit *c10 = start(a, mk_part("r", "a", 1, 10, r0, 1), true, 0);
	struct commit *c9 = start(a, mk_part("r", "a", 1, 9, r0, 1), true, 0);
	struct commit_result r;

	ck_assert_int_eq(poll_at(c10, 0, &r), COMMIT_COMMITTED);
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(c9, 0, &r), COMMIT_COMMITTED);
	commit_result_free(&r);
	ck_assert_int_eq(latest(), 10);
	commit_destroy(c10);
	commit_destroy(c9);
	committer_destroy(a);
}
END_TEST

/* By hand: parts that do not cover the world are refused, naming how many there are. */
START_TEST(test_finish_incomplete)
{
	static const int r0[] = {0};
	struct committer *a = node("a");
	struct commit_result r;
	bool already;

	plans("a", "r", 2, r0, 1);
	put_part(mk_part("r", "a", 2, 5, r0, 1));
	ck_assert_int_eq(commit_finish(a, JOB, 5, &r, &already, err), -ENOENT);
	ck_assert_msg(strstr(err, "the parts of run r hold 1 of 2 ranks"), "%s", err);
	ck_assert(!fake_get(fs, JOB "/step-000000000005/manifest.json", NULL));
	commit_result_free(&r);
	committer_destroy(a);
}
END_TEST

/*
 * Two steps share the cached roster; one finds a part that contradicts it
 * (ranks other than the plans say) and drops it: the other goes on with its
 * own reference, and both go away cleanly (ASan and valgrind watch).
 */
START_TEST(test_roster_dropped_under_another_step)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a");
	struct commit *c1, *c2;
	struct commit_result r;
	struct part *liar;

	plans("a", "r", 2, r0, 1);
	plans("b", "r", 2, r1, 1);
	c1 = start(a, mk_part("r", "a", 2, 1, r0, 1), true, 0);
	c2 = start(a, mk_part("r", "a", 2, 2, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(c1, 1, &r), COMMIT_WAITING);
	commit_result_free(&r);
	/* b's part of step 2 says it holds rank 0 (a's): not what its plans say */
	liar = mk_part("r", "b", 2, 2, r0, 1);
	put_part(liar);
	ck_assert_int_eq(poll_at(c2, 1, &r), COMMIT_WAITING);
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(c1, 2, &r), COMMIT_WAITING);
	commit_result_free(&r);
	put_part(mk_part("r", "b", 2, 1, r1, 1));
	ck_assert_int_eq(poll_at(c1, 3, &r), COMMIT_COMMITTED);
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(c2, DEADLINE, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "does not hold the ranks its plans name"), "%s", r.reason);
	commit_result_free(&r);
	commit_destroy(c1);
	commit_destroy(c2);
	committer_destroy(a);
}
END_TEST

/*
 * No manifest later than a deadline after the first part: every node counts
 * its own deadline from its own part, so none has told its trainers FAILED
 * for a step that then commits.
 */
START_TEST(test_no_commit_after_shared_deadline)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a");
	struct part *old = mk_part("r", "b", 2, 4, r1, 1);
	struct commit *ca;
	struct commit_result r;

	plans("a", "r", 2, r0, 1);
	plans("b", "r", 2, r1, 1);
	old->time_unix_ns = ipc_now_ns() - DEADLINE - S; /* b wrote it a deadline ago */
	put_part(old);
	ca = start(a, mk_part("r", "a", 2, 4, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(ca, 1, &r), COMMIT_WAITING);
	ck_assert(!fake_get(fs, JOB "/step-000000000004/manifest.json", NULL));
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(ca, DEADLINE, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "node b's part was written 11 s ago") &&
	                  strstr(r.reason, "past the commit deadline (10 s)"),
	              "%s", r.reason);
	commit_result_free(&r);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/*
 * A part whose rank lost, renamed or reshaped a tensor of its plans: never
 * merged (the checkpoint would not load), named at the deadline; nor by hand.
 */
START_TEST(test_part_not_its_plans)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a");
	struct part *pb = mk_part("r", "b", 2, 2, r1, 1);
	struct commit *ca;
	struct commit_result r;
	bool already;

	plans("a", "r", 2, r0, 1);
	plans("b", "r", 2, r1, 1);
	if (_i == 0) { /* renamed */
		free(pb->ranks[0].tensors[0].name);
		pb->ranks[0].tensors[0].name = strdup("w2");
	} else if (_i == 1) { /* reshaped (and its place) */
		pb->ranks[0].tensors[0].chunks[0].shape[0] = 2;
		pb->ranks[0].tensors[0].chunks[0].end = pb->ranks[0].tensors[0].chunks[0].begin + 8;
	} else { /* lost */
		free(pb->ranks[0].tensors[0].name);
		free(pb->ranks[0].tensors[0].chunks);
		free(pb->ranks[0].tensors);
		pb->ranks[0].tensors = NULL;
		pb->ranks[0].ntensors = 0;
	}
	put_part(pb);
	ca = start(a, mk_part("r", "a", 2, 2, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(ca, 1, &r), COMMIT_WAITING);
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(ca, DEADLINE, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "parts/b.json: rank 1's tensors are not those its plans"),
	              "%s", r.reason);
	ck_assert(!fake_get(fs, JOB "/step-000000000002/manifest.json", NULL));
	commit_result_free(&r);
	commit_destroy(ca);
	ck_assert_int_ne(commit_finish(a, JOB, 2, &r, &already, err), 0);
	ck_assert_msg(strstr(err, "rank 1's tensors are not those its plans"), "%s", err);
	ck_assert(!fake_get(fs, JOB "/step-000000000002/manifest.json", NULL));
	commit_result_free(&r);
	committer_destroy(a);
}
END_TEST

/*
 * A manifest of this run that names, for this node's rank, a file other
 * than this save's: an earlier attempt's, there, is a checkpoint; one that
 * is not there is no checkpoint, and this node is not told COMMITTED.
 */
START_TEST(test_manifest_names_other_file)
{
	static const int r0[] = {0};
	struct committer *a = node("a");
	struct part *other = mk_part("r", "a", 1, 3, r0, 1);
	struct manifest *m;
	struct commit *ca;
	struct commit_result r;

	free(other->ranks[0].file);
	other->ranks[0].file = strdup("rank-00000.a.5.safetensors");
	if (_i > 0) /* there; in 2, a byte longer than the manifest says */
		fake_add_shard(fs, JOB, 3, "rank-00000.a.5.safetensors",
		               other->ranks[0].size + (_i == 2));
	ck_assert_msg(manifest_merge(&other, 1, &m, err) == 0, "%s", err);
	ck_assert_msg(store_put_manifest(st, m, err) == 0, "%s", err);
	manifest_free(m);
	part_free(other);
	ca = start(a, mk_part("r", "a", 1, 3, r0, 1), false, 0);
	if (_i != 1) {
		ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_FAILED);
		ck_assert_msg(strstr(r.reason, "naming rank-00000.a.5.safetensors for rank 0") &&
		                  strstr(r.reason, _i == 0 ? "is not there" : "is not its size"),
		              "%s", r.reason);
	} else {
		ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_COMMITTED);
	}
	commit_result_free(&r);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/* A part stamped far ahead of this node's clock does not join (nor set the deadline). */
START_TEST(test_part_from_the_future)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a");
	struct part *pb = mk_part("r", "b", 2, 6, r1, 1);
	struct commit *ca;
	struct commit_result r;

	plans("a", "r", 2, r0, 1);
	plans("b", "r", 2, r1, 1);
	pb->time_unix_ns = ipc_now_ns() + 2 * DEADLINE;
	put_part(pb);
	ca = start(a, mk_part("r", "a", 2, 6, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(ca, 1, &r), COMMIT_WAITING);
	ck_assert(!fake_get(fs, JOB "/step-000000000006/manifest.json", NULL));
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(ca, DEADLINE, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "ahead of this node's clock"), "%s", r.reason);
	commit_result_free(&r);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/* A part that does not parse is not parsed again at each poll; once it changes, it is. */
START_TEST(test_bad_part_read_once)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a");
	struct fake_counts c1, c2, c3;
	struct commit *ca;
	struct commit_result r;

	plans("a", "r", 2, r0, 1);
	plans("b", "r", 2, r1, 1);
	fake_put(fs, JOB "/step-000000000007/parts/b.json", "{not json", 9);
	ca = start(a, mk_part("r", "a", 2, 7, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(ca, 1, &r), COMMIT_WAITING);
	commit_result_free(&r);
	fake_counts(fs, &c1);
	ck_assert_int_eq(poll_at(ca, 2, &r), COMMIT_WAITING);
	commit_result_free(&r);
	fake_counts(fs, &c2);
	/* the manifest and the part's summary looked for; not the part */
	ck_assert_uint_eq(c2.gets, c1.gets + 2);
	/* the node writes its real part: read, and committed */
	fake_delete(fs, JOB "/step-000000000007/parts/b.json");
	put_part(mk_part("r", "b", 2, 7, r1, 1));
	ck_assert_int_eq(poll_at(ca, 3, &r), COMMIT_COMMITTED);
	fake_counts(fs, &c3);
	ck_assert_uint_gt(c3.gets, c2.gets);
	commit_result_free(&r);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/* Before a part: the ranks nobody claims (yet). */
START_TEST(test_unclaimed)
{
	static const int mine[] = {0, 1}, theirs[] = {2}, clash[] = {1};
	struct committer *a = node("a");
	int v[8];
	size_t n;

	ck_assert_int_eq(commit_unclaimed(a, JOB, "r", 4, mine, 2, false, v, 8, &n, err), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert(v[0] == 2 && v[1] == 3);
	plans("b", "r", 4, theirs, 1);
	plans("c", "old", 4, (const int[]){3}, 1); /* another run's: no claim on this one */
	ck_assert_int_eq(commit_unclaimed(a, JOB, "r", 4, mine, 2, false, v, 8, &n, err), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(v[0], 3);
	/* every rank here: nothing to read */
	ck_assert_int_eq(commit_unclaimed(a, JOB, "r", 2, mine, 2, false, v, 8, &n, err), 0);
	ck_assert_uint_eq(n, 0);
	plans("d", "r", 4, clash, 1);
	ck_assert_int_eq(commit_unclaimed(a, JOB, "r", 4, mine, 2, false, v, 8, &n, err), -EEXIST);
	ck_assert_msg(strstr(err, "rank 1 of run r is claimed by nodes a and d"), "%s", err);
	ck_assert_int_eq(
	    commit_unclaimed(a, JOB, "r", 4, (const int[]){1, 0}, 2, false, v, 8, &n, err),
	    -EINVAL);
	committer_destroy(a);
}
END_TEST

/*
 * Node b's committed part of step 2, copied into step 3 with its step
 * rewritten before b writes its own (a replay, or a stale process): its
 * sizes fit b's step-3 files, but their headers are stamped with step 3's
 * saves, not step 2's. It never joins; b's own part replaces it, and the
 * step commits with b's saves.
 */
START_TEST(test_replayed_part_refused)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a");
	struct part *old = mk_part("r", "b", 2, 2, r1, 1), *mine;
	struct manifest *m;
	struct commit *ca;
	struct commit_result r;
	bool already;
	char *json;
	size_t len;

	plans("a", "r", 2, r0, 1);
	plans("b", "r", 2, r1, 1);
	mine = mk_part("r", "b", 2, 3, r1, 1); /* b's step-3 files are there */
	old->step = 3; /* the replay: step 2's part, under step 3's name */
	ck_assert_int_eq(part_to_json(old, &json, &len, err), 0);
	fake_put(fs, JOB "/step-000000000003/parts/b.json", json, len);
	free(json);
	ca = start(a, mk_part("r", "a", 2, 3, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_WAITING);
	commit_result_free(&r);
	ck_assert(!fake_get(fs, JOB "/step-000000000003/manifest.json", NULL));
	/* by hand neither */
	ck_assert_int_ne(commit_finish(a, JOB, 3, &r, &already, err), 0);
	ck_assert_msg(strstr(err, "parts/b.json, rank 1") && strstr(err, "not save"), "%s", err);
	commit_result_free(&r);
	ck_assert(!fake_get(fs, JOB "/step-000000000003/manifest.json", NULL));
	/* the deadline names it */
	ck_assert_int_eq(poll_at(ca, DEADLINE / 4, &r), COMMIT_WAITING);
	commit_result_free(&r);
	/* b's own part: in its place, and the step commits with it */
	ck_assert_msg(store_put_part(st, mine, err) == 0, "%s", err);
	ck_assert_int_eq(poll_at(ca, DEADLINE / 2, &r), COMMIT_COMMITTED);
	commit_result_free(&r);
	ck_assert_int_eq(store_read_manifest(st, JOB, 3, &m, err), 0);
	ck_assert_uint_eq(m->ranks[1].save, mine->ranks[0].save);
	ck_assert_uint_ne(m->ranks[1].save, old->ranks[0].save);
	manifest_free(m);
	part_free(old);
	part_free(mine);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/* The same replay, seen at the deadline: the step FAILS naming the part and why. */
START_TEST(test_replayed_part_named)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a");
	struct part *old = mk_part("r", "b", 2, 2, r1, 1), *mine;
	struct commit *ca;
	struct commit_result r;
	char *json;
	size_t len;

	plans("a", "r", 2, r0, 1);
	plans("b", "r", 2, r1, 1);
	mine = mk_part("r", "b", 2, 3, r1, 1);
	old->step = 3;
	ck_assert_int_eq(part_to_json(old, &json, &len, err), 0);
	fake_put(fs, JOB "/step-000000000003/parts/b.json", json, len);
	free(json);
	ca = start(a, mk_part("r", "a", 2, 3, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_WAITING);
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(ca, DEADLINE, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "parts/b.json, rank 1") &&
	                  strstr(r.reason, "rank-00001.b.0.safetensors") &&
	                  strstr(r.reason, "copied from another step or attempt"),
	              "%s", r.reason);
	ck_assert(!fake_get(fs, JOB "/step-000000000003/manifest.json", NULL));
	commit_result_free(&r);
	part_free(old);
	part_free(mine);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/*
 * A part whose file is not what it says: another size, a header of another
 * run or rank, or no stamp where the part claims one. None joins.
 */
START_TEST(test_part_not_its_files)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a");
	struct part *pb = mk_part("r", "b", 2, 4, r1, 1);
	struct commit *ca;
	struct commit_result r;
	static const char *want[] = {"bytes, not", "not run r rank 1", "carries no stamp"};
	void *hdr;
	size_t hl;

	plans("a", "r", 2, r0, 1);
	plans("b", "r", 2, r1, 1);
	if (_i == 0) { /* the file is a byte longer than the part says */
		hl = shard_header("r", 1, 2, 4, pb->ranks[0].save, &hdr);
		fake_add_shard_bytes(fs, JOB, 4, pb->ranks[0].file, hdr, hl, hl + 17);
		free(hdr);
	} else if (_i == 1) { /* another run's header, same step and save */
		hl = shard_header("q", 1, 2, 4, pb->ranks[0].save, &hdr);
		fake_add_shard_bytes(fs, JOB, 4, pb->ranks[0].file, hdr, hl, hl + 16);
		free(hdr);
	} else { /* a header with no stamp */
		char *h = NULL;

		hl = shard_header("r", 1, 2, 4, pb->ranks[0].save, &hdr);
		h = hdr;
		memcpy(memmem(h, hl, "\"save\"", 6), "\"xave\"", 6);
		memcpy(memmem(h, hl, "\"step\"", 6), "\"xtep\"", 6);
		fake_add_shard_bytes(fs, JOB, 4, pb->ranks[0].file, hdr, hl, hl + 16);
		free(hdr);
	}
	put_part(pb);
	ca = start(a, mk_part("r", "a", 2, 4, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_WAITING);
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(ca, DEADLINE, &r), COMMIT_FAILED);
	ck_assert_msg(strstr(r.reason, "parts/b.json, rank 1") && strstr(r.reason, want[_i]), "%s",
	              r.reason);
	ck_assert(!fake_get(fs, JOB "/step-000000000004/manifest.json", NULL));
	commit_result_free(&r);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/*
 * A store whose create-once is not atomic (an object store that ignores
 * If-None-Match): only rank 0's node writes the manifest. The other node
 * never takes over, however long rank 0's node is gone: its deadline fails
 * the step, writing nothing (two writers could replace a committed
 * manifest there). A commit by hand still may.
 */
START_TEST(test_single_writer_never_takes_over)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node_of("a", true), *b = node_of("b", true);
	struct commit *ca, *cb;
	struct commit_result r;
	bool already;

	plans("a", "r", 2, r0, 1);
	plans("b", "r", 2, r1, 1);
	ca = start(a, mk_part("r", "a", 2, 3, r0, 1), true, 0);
	cb = start(b, mk_part("r", "b", 2, 3, r1, 1), false, 0);
	ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_WAITING); /* a's part; then a is gone */
	commit_result_free(&r);
	commit_destroy(ca);
	for (int64_t t = 0; t < DEADLINE; t += DEADLINE / 8) {
		ck_assert_int_eq(poll_at(cb, t, &r), COMMIT_WAITING);
		commit_result_free(&r);
		ck_assert(!fake_get(fs, JOB "/step-000000000003/manifest.json", NULL));
	}
	ck_assert_int_eq(poll_at(cb, DEADLINE, &r), COMMIT_FAILED);
	ck_assert(!fake_get(fs, JOB "/step-000000000003/manifest.json", NULL));
	commit_result_free(&r);
	commit_destroy(cb);
	ck_assert_msg(commit_finish(b, JOB, 3, &r, &already, err) == 0, "%s", err);
	ck_assert(!already && r.wrote);
	commit_result_free(&r);
	/* rank 0's node commits the next step, at once, as on any store */
	ca = start(a, mk_part("r", "a", 2, 4, r0, 1), true, 0);
	cb = start(b, mk_part("r", "b", 2, 4, r1, 1), false, 0);
	ck_assert_int_eq(poll_at(cb, 0, &r), COMMIT_WAITING);
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_COMMITTED);
	ck_assert(r.wrote);
	commit_result_free(&r);
	ck_assert_int_eq(poll_at(cb, 1, &r), COMMIT_COMMITTED);
	ck_assert(!r.wrote);
	commit_result_free(&r);
	commit_destroy(ca);
	commit_destroy(cb);
	committer_destroy(a);
	committer_destroy(b);
}
END_TEST

/* ---- summaries: what a committer reads of each part -------------------- */

/*
 * The committer of a step of three nodes reads each other node's summary,
 * never its part, and each file's first 4 KiB; the head it writes says
 * what the parts say read whole (same tensors, same bytes).
 */
START_TEST(test_committer_reads_summaries)
{
	static const int r0[] = {0, 1}, r1[] = {2, 3}, r2[] = {4, 5};
	struct committer *a = node("a");
	struct fake_counts before, after;
	struct commit *ca;
	struct commit_result r;
	struct manifest *m;

	plans("a", "r", 6, r0, 2);
	plans("b", "r", 6, r1, 2);
	plans("c", "r", 6, r2, 2);
	put_part(mk_part("r", "b", 6, 9, r1, 2));
	put_part(mk_part("r", "c", 6, 9, r2, 2));
	ck_assert_ptr_nonnull(fake_get(fs, JOB "/step-000000000009/parts/b.sum", NULL));
	ca = start(a, mk_part("r", "a", 6, 9, r0, 2), true, 0);
	fake_counts(fs, &before);
	ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_COMMITTED);
	fake_counts(fs, &after);
	ck_assert(r.wrote && r.manifest->head_only);
	commit_result_free(&r);
	ck_assert_uint_eq(after.part_gets - before.part_gets, 0);
	ck_assert_uint_eq(after.summary_gets - before.summary_gets, 2);
	ck_assert_uint_eq(after.shard_reads - before.shard_reads, 4); /* b's and c's files */
	ck_assert_uint_le(after.shard_read_bytes - before.shard_read_bytes, 4 * 4096);
	/* read whole, the parts say what the head says */
	ck_assert_msg(store_read_manifest(st, JOB, 9, &m, err) == 0, "%s", err);
	ck_assert_uint_eq(m->ntensors, 1);
	ck_assert_uint_eq(m->nranks, 6);
	manifest_free(m);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/* A fresh committer of node nd: its roster of run r (world 6) read now, the reads counted. */
static int unclaimed_now(const char *nd, const int *ranks, bool patient, struct fake_counts *d,
                         size_t *n)
{
	struct committer *cm = node(nd);
	struct fake_counts before, after;
	int v[8], rc;

	fake_counts(fs, &before);
	rc = commit_unclaimed(cm, JOB, "r", 6, ranks, 2, patient, v, 8, n, err);
	fake_counts(fs, &after);
	committer_destroy(cm);
	d->gets = after.gets - before.gets;
	d->plans_gets = after.plans_gets - before.plans_gets;
	d->plans_summary_gets = after.plans_summary_gets - before.plans_summary_gets;
	return rc;
}

/*
 * Who holds which rank, once a run: rank 0's node reads every node's plans
 * summary (its own too), writes them as the run's roster file, and reads
 * the files whole to count the tensors; every other node reads that one
 * file (and the plans generation it was made at), or while it is not
 * there waits (patient) or reads the summaries, never a plans file whole;
 * a node without a summary is read whole; a roster of plans since changed
 * is not taken.
 */
START_TEST(test_roster_from_summaries)
{
	static const int r0[] = {0, 1}, r1[] = {2, 3}, r2[] = {4, 5};
	struct committer *a = node("a");
	struct fake_counts d;
	struct commit *ca;
	struct commit_result r;
	struct roster_file *rf;
	struct manifest *m;
	size_t n = 9, len;

	plans("a", "r", 6, r0, 2);
	plans("b", "r", 6, r1, 2);
	plans("c", "r", 6, r2, 2);
	ck_assert_ptr_nonnull(fake_get(fs, JOB "/plans/c.sum", NULL));
	/* no roster file yet: a patient node waits, another reads the summaries */
	ck_assert_int_eq(unclaimed_now("b", r1, true, &d, &n), -EAGAIN);
	ck_assert_msg(strstr(err, "waiting for the roster of run r"), "%s", err);
	ck_assert_uint_eq(d.plans_summary_gets + d.plans_gets, 0);
	ck_assert_int_eq(unclaimed_now("b", r1, false, &d, &n), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_uint_eq(d.plans_gets, 0);
	ck_assert_uint_eq(d.plans_summary_gets, 2);
	/* rank 0's node */
	ck_assert_int_eq(unclaimed_now("a", r0, true, &d, &n), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_uint_eq(d.plans_gets, 2);
	ck_assert_uint_eq(d.plans_summary_gets, 3);
	ck_assert_msg(store_read_roster(st, JOB, "r", &rf, err) == 0, "%s", err);
	ck_assert_uint_eq(rf->nnodes, 3);
	ck_assert_str_eq(rf->nodes[1]->node, "b");
	ck_assert(rf->nodes[1]->ranks[1].rank == 3 && rf->nodes[1]->ranks[1].has_sig);
	roster_file_free(rf);
	/* the others: one file and the generation */
	ck_assert_int_eq(unclaimed_now("b", r1, true, &d, &n), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_uint_eq(d.gets, 2);
	/* no generation known (a roster of none, none now): nothing says it is of the plans now */
	{
		char *g = strdup(fake_get(fs, JOB "/plans/generation", &len)), *keep;
		const char *bytes = fake_get(fs, JOB "/plans/r.roster", &len);

		keep = strndup(bytes, len);
		ck_assert_msg(store_read_roster(st, JOB, "r", &rf, err) == 0, "%s", err);
		rf->generation = 0;
		fake_delete(fs, JOB "/plans/r.roster");
		ck_assert_msg(store_put_roster(st, rf, err) == 0, "%s", err);
		roster_file_free(rf);
		fake_delete(fs, JOB "/plans/generation");
		ck_assert_int_eq(unclaimed_now("b", r1, true, &d, &n), -EAGAIN);
		fake_put(fs, JOB "/plans/generation", g, strlen(g));
		fake_put(fs, JOB "/plans/r.roster", keep, len);
		free(keep);
		free(g);
	}
	/* the commit reads no plans: the roster and its count are the run's */
	ck_assert_int_eq(commit_unclaimed(a, JOB, "r", 6, r0, 2, false, (int[8]){0}, 8, &n, err),
	                 0);
	put_part(mk_part("r", "b", 6, 9, r1, 2));
	put_part(mk_part("r", "c", 6, 9, r2, 2));
	ca = start(a, mk_part("r", "a", 6, 9, r0, 2), true, 0);
	{
		struct fake_counts before, after;

		fake_counts(fs, &before);
		ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_COMMITTED);
		fake_counts(fs, &after);
		ck_assert_uint_eq(after.plans_gets - before.plans_gets, 0);
		ck_assert_uint_eq(after.part_gets - before.part_gets, 0);
	}
	commit_result_free(&r);
	ck_assert_msg(store_read_manifest(st, JOB, 9, &m, err) == 0, "%s", err);
	ck_assert_uint_eq(m->ntensors, 1);
	ck_assert_uint_eq(m->nranks, 6);
	manifest_free(m);
	commit_destroy(ca);
	/* c's plans change: the roster file is of an older generation, and not taken */
	plans_of("c", "r", 6, r2, 2, true);
	ck_assert_int_eq(unclaimed_now("b", r1, true, &d, &n), -EAGAIN);
	ck_assert_msg(strstr(err, "plans generation"), "%s", err);
	/* c's summary gone: its file says */
	fake_delete(fs, JOB "/plans/c.sum");
	ck_assert_int_eq(unclaimed_now("b", r1, false, &d, &n), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_uint_eq(d.plans_gets, 1);
	ck_assert_uint_eq(d.plans_summary_gets, 2);
	committer_destroy(a);
}
END_TEST

/* Node nd's part of step, each rank holding "x" too (its shards so long). */
static struct part *part_with_x(const char *nd, int world, int64_t step, const int *ranks, size_t n)
{
	struct part *p = mk_part("r", nd, world, step, ranks, n);

	for (size_t i = 0; i < n; i++) {
		char file[SHARD_FILE_MAX];
		void *hdr;
		size_t hl;

		hold_x(&p->ranks[i], world);
		hl = shard_header("r", ranks[i], world, step, p->ranks[i].save, &hdr);
		ck_assert_int_eq(shard_file_name(ranks[i], nd, 0, file, sizeof(file)), 0);
		fake_add_shard_bytes(fs, JOB, step, file, hdr, hl, hl + 32);
		free(hdr);
	}
	return p;
}

/* b's plans summary rewritten: rank j's signature `sig`, ranks from `ranks` (NULL: as they are). */
static void forge_plans_summary(const char *nd, uint64_t sig, const int *ranks)
{
	char key[STORE_KEY_MAX], *json;
	struct plans_file *f;
	const char *bytes;
	size_t len;

	store_plans_summary_key(key, sizeof(key), JOB, nd);
	ck_assert_ptr_nonnull(bytes = fake_get(fs, key, &len));
	ck_assert_msg(plans_summary_from_json(bytes, len, &f, err) == 0, "%s", err);
	ck_assert(f->summary && f->nranks == 2 && f->ranks[1].has_sig);
	if (sig)
		f->ranks[1].sig = sig;
	for (size_t j = 0; ranks && j < f->nranks; j++)
		f->ranks[j].rank = ranks[j];
	ck_assert_msg(plans_summary_to_json(f, &json, &len, err) == 0, "%s", err);
	fake_put(fs, key, json, len);
	free(json);
	plans_free(f);
}

/*
 * A plans summary is never trusted over its file (a file that changed as
 * it was read, or a summary that lies): one whose rank says other tensors
 * than its file, the part as the file says (0): the roster is read again
 * from the files, and the step commits what they say; a summary and a part
 * that both say "x", the file not (1): the part never joins, the reason
 * names the tensors; summaries that make two nodes claim one rank, the
 * files not (2): the files say who holds which.
 */
START_TEST(test_plans_summary_not_trusted)
{
	static const int r0[] = {0, 1}, r1[] = {2, 3}, r2[] = {4, 5};
	struct committer *a = node("a");
	struct commit *ca;
	struct commit_result r;
	struct manifest *m;
	char *sumx = NULL;
	size_t len = 0;
	int v[8];

	plans("a", "r", 6, r0, 2);
	plans("c", "r", 6, r2, 2);
	if (_i == 1) { /* the summary of plans that hold x, over the file of plans that do not */
		plans_of("b", "r", 6, r1, 2, true);
		sumx = strdup(fake_get(fs, JOB "/plans/b.sum", &len));
	}
	plans("b", "r", 6, r1, 2);
	if (_i == 0)
		forge_plans_summary("b", 0x1234, NULL);
	else if (_i == 1)
		fake_put(fs, JOB "/plans/b.sum", sumx, len);
	else
		forge_plans_summary("c", 0, r1);
	free(sumx);
	if (_i == 2) {
		ck_assert_msg(commit_unclaimed(a, JOB, "r", 6, r0, 2, false, v, 8, &len, err) == 0,
		              "%s", err);
		ck_assert_uint_eq(len, 0);
		committer_destroy(a);
		return;
	}
	put_part(_i == 1 ? part_with_x("b", 6, 9, r1, 2) : mk_part("r", "b", 6, 9, r1, 2));
	put_part(mk_part("r", "c", 6, 9, r2, 2));
	ca = start(a, mk_part("r", "a", 6, 9, r0, 2), true, 0);
	if (_i == 0) {
		struct roster_file *rf;
		struct plans_file *f;
		uint64_t sig;

		ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_COMMITTED);
		commit_result_free(&r);
		ck_assert_msg(store_read_manifest(st, JOB, 9, &m, err) == 0, "%s", err);
		ck_assert_uint_eq(m->ntensors, 1);
		manifest_free(m);
		/* the roster written for the others says what the files say, not the summary */
		ck_assert_msg(store_read_roster(st, JOB, "r", &rf, err) == 0, "%s", err);
		ck_assert_msg(store_read_plans(st, JOB, "b", &f, err) == 0, "%s", err);
		ck_assert_int_eq(tensors_signature(f->ranks[1].tensors, f->ranks[1].ntensors, &sig),
		                 0);
		ck_assert_str_eq(rf->nodes[1]->node, "b");
		ck_assert(rf->nodes[1]->ranks[1].sig == sig && sig != 0x1234);
		plans_free(f);
		roster_file_free(rf);
	} else {
		ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_WAITING);
		commit_result_free(&r);
		ck_assert_int_eq(poll_at(ca, DEADLINE, &r), COMMIT_FAILED);
		ck_assert_msg(strstr(r.reason, "rank 2's tensors are not those its plans"), "%s",
		              r.reason);
		ck_assert(!fake_get(fs, JOB "/step-000000000009/manifest.json", NULL));
		commit_result_free(&r);
	}
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/*
 * A node's plans summary follows its file: written with it, left as it is
 * when the plans are the same (no write, no new generation), put back when
 * it is missing, and replaced with the file when the plans change.
 */
START_TEST(test_plans_summary_follows_its_file)
{
	static const int r1[] = {2, 3};
	struct fake_counts before, after;
	struct plans_file *f, *sf;
	uint64_t g1, g2;

	plans("b", "r", 4, r1, 2);
	ck_assert_ptr_nonnull(fake_get(fs, JOB "/plans/b.sum", NULL));
	ck_assert_int_eq(store_plans_generation(st, JOB, &g1, err), 0);
	fake_counts(fs, &before);
	plans("b", "r", 4, r1, 2);
	fake_counts(fs, &after);
	ck_assert_uint_eq(after.deletes - before.deletes, 0); /* create-once, refused: the same */
	ck_assert_int_eq(store_plans_generation(st, JOB, &g2, err), 0);
	ck_assert(g1 == g2);
	fake_delete(fs, JOB "/plans/b.sum");
	plans("b", "r", 4, r1, 2);
	ck_assert_ptr_nonnull(fake_get(fs, JOB "/plans/b.sum", NULL));
	ck_assert_int_eq(store_plans_generation(st, JOB, &g1, err), 0);
	ck_assert(g1 != g2);
	/* the file's put fails: the old summary went first, so none says the old plans */
	fake_fail_put(fs, "/plans/b.json", -EIO);
	{
		struct plans_file g = {.version = PLANS_VERSION,
		                       .job = JOB,
		                       .node = "b",
		                       .run = "r",
		                       .world = 4,
		                       .nranks = 1,
		                       .ranks = &(struct plans_rank){.rank = 2, .copies = 1}};
		bool wrote;

		ck_assert_int_eq(store_put_plans(st, &g, &wrote, err), -EIO);
	}
	ck_assert_ptr_null(fake_get(fs, JOB "/plans/b.sum", NULL));
	plans_of("b", "r", 4, r1, 2, true); /* rank 2 and 3 hold x too now */
	ck_assert_msg(store_read_plans(st, JOB, "b", &f, err) == 0, "%s", err);
	ck_assert_msg(store_read_plans_summary(st, JOB, "b", &sf, err) == 0, "%s", err);
	ck_assert_str_eq(sf->digest, f->digest);
	for (size_t i = 0; i < 2; i++) {
		uint64_t sig;

		ck_assert_int_eq(tensors_signature(f->ranks[i].tensors, f->ranks[i].ntensors, &sig),
		                 0);
		ck_assert(sf->ranks[i].sig == sig);
	}
	plans_free(f);
	plans_free(sf);
	/* one of another node's name is not taken */
	fake_put(fs, JOB "/plans/c.sum", fake_get(fs, JOB "/plans/b.sum", NULL),
	         strlen(fake_get(fs, JOB "/plans/b.sum", NULL)));
	ck_assert_int_eq(store_read_plans_summary(st, JOB, "c", &sf, err), -EINVAL);
	ck_assert_msg(strstr(err, "node b"), "%s", err);
}
END_TEST

/*
 * The roster file's nodes are in their names' order, whatever the order of
 * the listing's keys ("n-2.json" before "n.json"): it is written, and the
 * other node takes it.
 */
START_TEST(test_roster_file_name_order)
{
	static const int r0[] = {0, 1}, r1[] = {2, 3};
	struct committer *a = node("n"), *b = node("n-2");
	struct roster_file *rf;
	size_t n = 9;
	int v[8];

	plans("n", "r", 4, r0, 2);
	plans("n-2", "r", 4, r1, 2);
	ck_assert_int_eq(commit_unclaimed(a, JOB, "r", 4, r0, 2, false, v, 8, &n, err), 0);
	ck_assert_msg(store_read_roster(st, JOB, "r", &rf, err) == 0, "%s", err);
	ck_assert_uint_eq(rf->nnodes, 2);
	ck_assert_str_eq(rf->nodes[0]->node, "n");
	roster_file_free(rf);
	ck_assert_msg(commit_unclaimed(b, JOB, "r", 4, r1, 2, true, v, 8, &n, err) == 0, "%s", err);
	ck_assert_uint_eq(n, 0);
	committer_destroy(b);
	committer_destroy(a);
}
END_TEST

/*
 * A plans file that cannot be read (its summary can): rank 0's node counts
 * no tensors from it (the parts will say) and writes no roster file of what
 * no file confirmed; the other nodes read the summaries.
 */
START_TEST(test_roster_file_only_of_checked_plans)
{
	static const int r0[] = {0, 1}, r1[] = {2, 3};
	struct committer *a = node("a");
	struct roster_file *rf = NULL;
	size_t n = 9;
	int v[8];

	plans("a", "r", 4, r0, 2);
	plans("b", "r", 4, r1, 2);
	fake_put(fs, JOB "/plans/b.json", "{not json", 9);
	ck_assert_msg(commit_unclaimed(a, JOB, "r", 4, r0, 2, false, v, 8, &n, err) == 0, "%s",
	              err);
	ck_assert_uint_eq(n, 0);
	ck_assert_int_eq(store_read_roster(st, JOB, "r", &rf, err), -ENOENT);
	committer_destroy(a);
}
END_TEST

/* Node b's summary as it is, with rank 2's signature `sig` in place of its own. */
static void forge_summary(int64_t step, uint64_t sig)
{
	char key[STORE_KEY_MAX], *json;
	const char *bytes;
	struct part *p;
	size_t len;

	store_part_summary_key(key, sizeof(key), JOB, step, "b");
	ck_assert_ptr_nonnull(bytes = fake_get(fs, key, &len));
	ck_assert_msg(part_summary_from_json(bytes, len, &p, err) == 0, "%s", err);
	p->ranks[0].sig = sig;
	ck_assert_msg(part_summary_to_json(p, &json, &len, err) == 0, "%s", err);
	fake_put(fs, key, json, len);
	free(json);
	part_free(p);
}

/*
 * A summary is never trusted over its part: one whose rank says it holds
 * other tensors than its plans (0), one left behind by a part replaced
 * without it (1: an older agent's, another length), or one that is no
 * summary (2) sends the committer to the part, which joins; the head names
 * the part as it is.
 */
START_TEST(test_summary_not_trusted)
{
	static const int r0[] = {0, 1}, r1[] = {2, 3};
	struct committer *a = node("a");
	struct fake_counts before, after;
	struct commit *ca;
	struct commit_result r;
	struct manifest *m;

	plans("a", "r", 4, r0, 2);
	plans("b", "r", 4, r1, 2);
	put_part(mk_part("r", "b", 4, 9, r1, 2));
	if (_i == 0) {
		forge_summary(9, 0x1234);
	} else if (_i == 2) {
		fake_put(fs, JOB "/step-000000000009/parts/b.sum", "{\"format\": 1", 12);
	} else {
		struct part *p = mk_part("r", "b", 4, 9, r1, 2);
		char *json;
		size_t len;

		free(p->ranks[0].meta_json);
		p->ranks[0].meta_json = strdup("{\"rank\": 2, \"again\": true}");
		ck_assert_msg(part_to_json(p, &json, &len, err) == 0, "%s", err);
		fake_put(fs, JOB "/step-000000000009/parts/b.json", json, len);
		free(json);
		part_free(p);
	}
	ca = start(a, mk_part("r", "a", 4, 9, r0, 2), true, 0);
	fake_counts(fs, &before);
	ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_COMMITTED);
	fake_counts(fs, &after);
	commit_result_free(&r);
	ck_assert_uint_eq(after.part_gets - before.part_gets, 1);
	ck_assert_msg(store_read_manifest(st, JOB, 9, &m, err) == 0, "%s", err);
	manifest_free(m);
	ck_assert_msg(store_read_manifest_head(st, JOB, 9, &m, err) == 0, "%s", err);
	names_part(m, 1, "b", 9); /* the part as it is */
	manifest_free(m);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

/*
 * A node's part replaced (another attempt): its old summary goes before the
 * part does, so no summary ever describes a part that is not there; where
 * the replacing put fails, none is left; the next put leaves the summary of
 * the part there.
 */
START_TEST(test_summary_follows_its_part)
{
	static const int r1[] = {1};
	const char *skey = JOB "/step-000000000009/parts/b.sum";
	const char *pkey = JOB "/step-000000000009/parts/b.json";
	struct part *p2 = mk_part("r", "b", 2, 9, r1, 1), *sum;
	const char *bytes;
	size_t len;

	put_part(mk_part("r", "b", 2, 9, r1, 1));
	ck_assert_ptr_nonnull(fake_get(fs, skey, NULL));
	p2->time_unix_ns += 1000; /* another attempt: other bytes */
	fake_fail_put(fs, "parts/b.json", -EIO);
	ck_assert_int_ne(store_put_part(st, p2, err), 0);
	ck_assert_ptr_null(fake_get(fs, skey, NULL));
	ck_assert_ptr_nonnull(fake_get(fs, pkey, NULL)); /* the old part, no summary */
	put_part(p2);
	ck_assert_ptr_nonnull(bytes = fake_get(fs, skey, &len));
	ck_assert_msg(part_summary_from_json(bytes, len, &sum, err) == 0, "%s", err);
	ck_assert_ptr_nonnull(bytes = fake_get(fs, pkey, &len));
	ck_assert_uint_eq(sum->file_size, len);
	ck_assert_uint_eq(sum->file_xxh3, XXH3_64bits(bytes, len));
	part_free(sum);
}
END_TEST

/* Rank r's plans and part hold "x" too: a plan that changed within the run. */
static void hold_x(struct part_rank *k, int world)
{
	struct manifest_tensor *x = tensor_w(k->rank, world);

	free(x->name);
	x->name = strdup("x");
	if (k->tensors) {
		x->chunks[0].begin = k->header_bytes + 16;
		x->chunks[0].end = k->header_bytes + 32;
		k->size += 16;
		k->tensors = realloc(k->tensors, 2 * sizeof(*k->tensors));
		k->tensors[k->ntensors++] = *x;
	}
	free(x);
}

/*
 * A node's plans change within a run (a tensor fewer): the committer's
 * roster, read before, no longer says what the node's summary (1: its part,
 * where it wrote no summary) says; it is read again, with the tensors its
 * plans now name, and the head counts what the parts hold (a whole read
 * agrees with it; counted from the old plans, it would not).
 */
START_TEST(test_plans_change_roster_read_again)
{
	static const int r0[] = {0}, r1[] = {1};
	struct committer *a = node("a");
	struct commit *ca;
	struct commit_result r;
	struct manifest *m;
	int i;

	/* step 8: b holds "w" and "x" */
	plans("a", "r", 2, r0, 1);
	plans_of("b", "r", 2, r1, 1, true);
	put_part(part_with_x("b", 2, 8, r1, 1));
	ca = start(a, mk_part("r", "a", 2, 8, r0, 1), true, 0);
	ck_assert_int_eq(poll_at(ca, 0, &r), COMMIT_COMMITTED);
	ck_assert_uint_eq(r.manifest->head_tensors, 2);
	commit_result_free(&r);
	commit_destroy(ca);
	/* from step 9 on, "w" alone */
	plans("b", "r", 2, r1, 1);
	put_part(mk_part("r", "b", 2, 9, r1, 1));
	if (_i == 1)
		fake_delete(fs, JOB "/step-000000000009/parts/b.sum");
	ca = start(a, mk_part("r", "a", 2, 9, r0, 1), true, 0);
	for (i = 0; i < 4 && poll_at(ca, i, &r) == COMMIT_WAITING; i++)
		commit_result_free(&r);
	ck_assert_msg(r.state == COMMIT_COMMITTED, "%s", r.reason);
	ck_assert_uint_eq(r.manifest->head_tensors, 1);
	commit_result_free(&r);
	ck_assert_msg(store_read_manifest(st, JOB, 9, &m, err) == 0, "%s", err);
	ck_assert_uint_eq(m->ntensors, 1);
	manifest_free(m);
	commit_destroy(ca);
	committer_destroy(a);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("commit");
	TCase *tc = tcase_create("commit");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_single_node);
	tcase_add_test(tc, test_hole_fails);
	tcase_add_test(tc, test_two_nodes);
	tcase_add_test(tc, test_head_of_three_nodes);
	tcase_add_test(tc, test_head_names_other_part);
	tcase_add_test(tc, test_parts_disagree_fail_at_once);
	tcase_add_test(tc, test_takeover_same_bytes);
	tcase_add_test(tc, test_racing_writers);
	tcase_add_test(tc, test_deadline_names_missing);
	tcase_add_test(tc, test_deadline_unknown_ranks);
	tcase_add_test(tc, test_other_run_refused);
	tcase_add_test(tc, test_other_run_reason);
	tcase_add_test(tc, test_committed_by_other_run);
	tcase_add_test(tc, test_rank_claimed_twice);
	tcase_add_loop_test(tc, test_bad_part_named, 0, 3);
	tcase_add_loop_test(tc, test_missing_shard, 0, 2);
	tcase_add_test(tc, test_part_write_fails);
	tcase_add_test(tc, test_abort_writes_nothing);
	tcase_add_test(tc, test_backoff);
	tcase_add_test(tc, test_latest_forward_only);
	tcase_add_test(tc, test_finish_incomplete);
	tcase_add_test(tc, test_unclaimed);
	tcase_add_test(tc, test_roster_dropped_under_another_step);
	tcase_add_test(tc, test_no_commit_after_shared_deadline);
	tcase_add_loop_test(tc, test_part_not_its_plans, 0, 3);
	tcase_add_loop_test(tc, test_manifest_names_other_file, 0, 3);
	tcase_add_test(tc, test_part_from_the_future);
	tcase_add_test(tc, test_bad_part_read_once);
	tcase_add_test(tc, test_replayed_part_refused);
	tcase_add_test(tc, test_replayed_part_named);
	tcase_add_loop_test(tc, test_part_not_its_files, 0, 3);
	tcase_add_test(tc, test_single_writer_never_takes_over);
	tcase_add_test(tc, test_committer_reads_summaries);
	tcase_add_test(tc, test_roster_from_summaries);
	tcase_add_test(tc, test_roster_file_name_order);
	tcase_add_test(tc, test_roster_file_only_of_checked_plans);
	tcase_add_loop_test(tc, test_plans_summary_not_trusted, 0, 3);
	tcase_add_test(tc, test_plans_summary_follows_its_file);
	tcase_add_loop_test(tc, test_summary_not_trusted, 0, 3);
	tcase_add_test(tc, test_summary_follows_its_part);
	tcase_add_loop_test(tc, test_plans_change_roster_read_again, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}
