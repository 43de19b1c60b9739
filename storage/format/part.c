/*
 * part.c: parts (docs/DESIGN.md §6.4), one node's account of a step; the
 * merge of the parts of one run into the step's manifest is part_merge.c.
 *
 * A node writes its part once all its ranks of the step are durable: per
 * rank the shard's name, size and header length, the rank's meta, its
 * times, and each tensor as one chunk with its checksum. The agent that
 * commits reads the other nodes' parts back (hostile input: part_from_json
 * checks every field, and that every chunk lies inside its file's data and
 * no two overlap) and merges them (part_merge.c).
 *
 * Pure functions; any thread. Divisions: signatures; checks; writing;
 * reading.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "storage/format/fmt.h"

#define PT "part"
#define PT_PREFIX "part: "

/* ---- signatures --------------------------------------------------------- */

static int cmp_tensor_ptr(const void *a, const void *b)
{
	const struct manifest_tensor *x = *(const struct manifest_tensor *const *)a;
	const struct manifest_tensor *y = *(const struct manifest_tensor *const *)b;

	return strcmp(x->name, y->name);
}

static void sig_ints(XXH3_state_t *st, const int64_t *v, size_t n)
{
	XXH3_64bits_update(st, v, n * sizeof(*v));
}

int tensors_signature(const struct manifest_tensor *v, size_t n, uint64_t *sig)
{
	const struct manifest_tensor **by = malloc((n ? n : 1) * sizeof(*by));
	XXH3_state_t *st = XXH3_createState();

	if (!by || !st) {
		free(by);
		XXH3_freeState(st);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		by[i] = &v[i];
	qsort(by, n, sizeof(*by), cmp_tensor_ptr);
	XXH3_64bits_reset(st);
	for (size_t i = 0; i < n; i++) {
		const struct manifest_tensor *t = by[i];
		int64_t head[3] = {t->dtype, (int64_t)t->ndim, t->sharded};
		static const int64_t none[IPC_MAX_NDIM];
		const struct manifest_chunk *c = t->nchunks ? &t->chunks[0] : NULL;

		XXH3_64bits_update(st, t->name, strlen(t->name) + 1);
		sig_ints(st, head, 3);
		sig_ints(st, t->global_shape, t->ndim);
		sig_ints(st, c ? c->shape : none, t->ndim);
		sig_ints(st, c ? c->global_offset : none, t->ndim);
	}
	*sig = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	free(by);
	return 0;
}

int part_rank_written_signature(const struct part_rank *k, uint64_t *sig)
{
	if (k->has_wsig) {
		*sig = k->wsig;
		return 0;
	}
	if (k->has_sig) /* a summary that does not say */
		return -ENOENT;
	return tensors_signature(k->tensors, k->ntensors, sig);
}

int part_rank_signature(const struct part_rank *k, uint64_t *sig)
{
	if (k->has_sig) {
		*sig = k->sig;
		return 0;
	}
	return k->holds ? tensors_signature(k->holds, k->nholds, sig)
	                : tensors_signature(k->tensors, k->ntensors, sig);
}

void part_ranks_text(const int *ranks, size_t n, char *buf, size_t len)
{
	size_t o = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < n && o < len; i++) {
		size_t j = i;

		while (j + 1 < n && ranks[j + 1] == ranks[j] + 1)
			j++;
		if (j >= i + 2)
			o += (size_t)snprintf(buf + o, len - o, "%s%d-%d", i ? "," : "", ranks[i],
			                      ranks[j]);
		else
			o += (size_t)snprintf(buf + o, len - o, "%s%d", i ? "," : "", ranks[i]);
		if (j >= i + 2)
			i = j;
	}
}

void part_node_text(const char *node, const int *ranks, size_t n, char *buf, size_t len)
{
	char r[128];

	part_ranks_text(ranks, n, r, sizeof(r));
	snprintf(buf, len, "%s (rank%s %s)", node, n == 1 ? "" : "s", r);
}

/* ---- checks ------------------------------------------------------------ */

static const char *one_file(const void *ctx, int rank)
{
	return ((const struct manifest_rank *)ctx)->file;
}

/* What a rank holds, if the part says (version 2): each chunk it wrote lies in it. */
static int check_holds(const struct part *p, const struct part_rank *k, char *err)
{
	int rc;

	if (!k->holds)
		return 0;
	if (p->version < 2)
		return ipc_errf(err, -EINVAL, PT_PREFIX "rank %d: \"holds\" in a version-%d part",
		                k->rank, p->version);
	rc = fmt_check_holds(k->holds, k->nholds, k->rank, PT, err);
	for (size_t j = 0; j < k->ntensors && !rc; j++)
		if (!fmt_holds_chunk(k->holds, k->nholds, &k->tensors[j], &k->tensors[j].chunks[0]))
			rc = ipc_errf(err, -EINVAL,
			              PT_PREFIX
			              "rank %d wrote a box of tensor '%s' that it does not "
			              "hold",
			              k->rank, k->tensors[j].name);
	return rc;
}

/* One rank of the part: its file, its tensors (one chunk each, its own), no overlap. */
static int check_rank(const struct part *p, size_t i, char *err)
{
	const struct part_rank *k = &p->ranks[i];
	const struct manifest_rank view = {
	    .rank = k->rank, .file = k->file, .size = k->size, .header_bytes = k->header_bytes};
	struct fmt_span *spans;
	char msg[IPC_ERRLEN];
	size_t n = 0;
	int rc;

	if (k->rank < 0 || k->rank >= p->world || (i > 0 && k->rank <= p->ranks[i - 1].rank))
		return ipc_errf(err, -EINVAL,
		                PT_PREFIX "rank %d is outside world %d, or twice, or "
		                          "out of order",
		                k->rank, p->world);
	rc = shard_file_check(k->rank, k->file, msg);
	if (rc)
		return ipc_errf(err, rc, PT_PREFIX "%s", msg);
	if (!shard_file_of_node(k->file, p->node))
		return ipc_errf(err, -EINVAL,
		                PT_PREFIX "rank %d: file '%s' is not one node '%s' made", k->rank,
		                k->file, p->node);
	if (k->header_bytes < 8 || k->header_bytes > k->size || k->size > INT64_MAX)
		return ipc_errf(err, -EINVAL,
		                PT_PREFIX "rank %d: header_bytes %" PRIu64
		                          " is outside its file of %" PRIu64 " bytes",
		                k->rank, k->header_bytes, k->size);
	if (k->meta_json && (rc = ipc_check_meta(k->meta_json, msg)))
		return ipc_errf(err, rc, PT_PREFIX "rank %d: %s", k->rank, msg);
	if (k->queued_unix_ns < 0 || k->captured_unix_ns < 0 || k->durable_unix_ns < 0)
		return ipc_errf(err, -EINVAL, PT_PREFIX "rank %d: a time is negative", k->rank);
	if (k->ntensors > IPC_MAX_TENSORS || (k->ntensors && !k->tensors))
		return ipc_errf(err, -EINVAL, PT_PREFIX "rank %d: %zu tensors", k->rank,
		                k->ntensors);
	spans = calloc(k->ntensors + 1, sizeof(*spans));
	if (!spans)
		return ipc_errf(err, -ENOMEM, PT_PREFIX "out of memory");
	for (size_t j = 0; j < k->ntensors && !rc; j++) {
		const struct manifest_tensor *t = &k->tensors[j];

		if ((rc = ipc_check_tensor_name(t->name, msg)))
			rc = ipc_errf(err, rc, PT_PREFIX "rank %d: %s", k->rank, msg);
		else if (j > 0 && strcmp(k->tensors[j - 1].name, t->name) >= 0)
			rc = ipc_errf(err, -EINVAL,
			              PT_PREFIX "rank %d: tensor '%s' is out of order or twice",
			              k->rank, t->name);
		else if (!ipc_dtype_name(t->dtype) || t->ndim > IPC_MAX_NDIM || t->nchunks != 1 ||
		         !t->chunks || t->chunks[0].rank != k->rank)
			rc = ipc_errf(err, -EINVAL,
			              PT_PREFIX "rank %d: tensor '%s' needs a known dtype, at most "
			                        "%d dimensions and one chunk of this rank",
			              k->rank, t->name, IPC_MAX_NDIM);
		else
			rc = fmt_check_chunk(t, 0, &view, p->world, PT, err);
		if (!rc && t->chunks[0].end > t->chunks[0].begin)
			spans[n++] = (struct fmt_span){k->rank, t->chunks[0].begin,
			                               t->chunks[0].end, t->name};
	}
	if (!rc)
		rc = fmt_check_spans(spans, n, one_file, &view, PT, err);
	free(spans);
	return rc ? rc : check_holds(p, k, err);
}

int part_check(const struct part *p, char *err)
{
	char msg[IPC_ERRLEN];
	int rc;

	if (p->version < 1 || p->version > PART_VERSION)
		return ipc_errf(err, -EINVAL, PT_PREFIX "version %d, this reader knows 1 to %d",
		                p->version, PART_VERSION);
	if ((rc = ipc_check_job(p->job, msg)) || (rc = ipc_check_run(p->run, msg)) ||
	    (rc = ipc_check_node(p->node, msg)) || (rc = ipc_check_step(p->step, msg)))
		return ipc_errf(err, rc, PT_PREFIX "%s", msg);
	if (p->world < 1 || p->world > IPC_MAX_WORLD)
		return ipc_errf(err, -EINVAL, PT_PREFIX "world %d is out of range 1..%d", p->world,
		                IPC_MAX_WORLD);
	if (p->time_unix_ns < 0)
		return ipc_errf(err, -EINVAL, PT_PREFIX "time_unix_ns is negative");
	if (p->nranks < 1 || p->nranks > (size_t)p->world || !p->ranks)
		return ipc_errf(err, -EINVAL, PT_PREFIX "%zu ranks for world %d", p->nranks,
		                p->world);
	for (size_t i = 0; i < p->nranks; i++)
		if ((rc = check_rank(p, i, err)))
			return rc;
	return 0;
}

/* ---- writing ----------------------------------------------------------- */

static json_t *rank_json(const struct part_rank *k)
{
	json_t *o, *tensors = fmt_tensors_json(k->tensors, k->ntensors, true);
	char ignored[IPC_ERRLEN];

	o = json_pack("{s:i, s:s, s:I, s:I, s:I, s:I, s:I, s:o}", "rank", k->rank, "file", k->file,
	              "size", (json_int_t)k->size, "header_bytes", (json_int_t)k->header_bytes,
	              "queued_unix_ns", (json_int_t)k->queued_unix_ns, "captured_unix_ns",
	              (json_int_t)k->captured_unix_ns, "durable_unix_ns",
	              (json_int_t)k->durable_unix_ns, "tensors", tensors);
	if (o && (fmt_meta_put(o, k->meta_json, PT, ignored) || fmt_save_put(o, k->save))) {
		json_decref(o);
		return NULL;
	}
	if (o && k->holds && json_object_set_new(o, "holds", fmt_holds_json(k->holds, k->nholds))) {
		json_decref(o);
		return NULL;
	}
	return o;
}

int part_to_json(const struct part *p, char **out, size_t *len, char *err)
{
	json_t *root, *ranks = json_array();
	char when[64];
	int rc;

	*out = NULL;
	*len = 0;
	rc = part_check(p, err);
	if (rc) {
		json_decref(ranks);
		return rc;
	}
	for (size_t i = 0; ranks && i < p->nranks; i++)
		if (json_array_append_new(ranks, rank_json(&p->ranks[i]))) {
			json_decref(ranks);
			ranks = NULL;
		}
	fmt_time(p->time_unix_ns, when, sizeof(when));
	root = json_pack("{s:s, s:i, s:s, s:s, s:s, s:I, s:i, s:s, s:I, s:o}", "format",
	                 PART_FORMAT, "version", p->version, "job", p->job, "run", p->run, "node",
	                 p->node, "step", (json_int_t)p->step, "world", p->world, "time", when,
	                 "time_unix_ns", (json_int_t)p->time_unix_ns, "ranks", ranks);
	if (!root)
		return ipc_errf(err, -ENOMEM, PT_PREFIX "out of memory building the JSON");
	rc = fmt_dump(root, false, PART_MAX_BYTES, out, len, PT, err);
	json_decref(root);
	return rc;
}

/* A rank in its part's summary: its file and stamp, what it holds as one number. */
static json_t *summary_rank_json(const struct part_rank *k)
{
	char ignored[IPC_ERRLEN];
	uint64_t sig;
	json_t *o;

	if (part_rank_signature(k, &sig))
		return NULL;
	o = json_pack("{s:i, s:s, s:I, s:I, s:I, s:I, s:I, s:b}", "rank", k->rank, "file", k->file,
	              "size", (json_int_t)k->size, "header_bytes", (json_int_t)k->header_bytes,
	              "queued_unix_ns", (json_int_t)k->queued_unix_ns, "captured_unix_ns",
	              (json_int_t)k->captured_unix_ns, "durable_unix_ns",
	              (json_int_t)k->durable_unix_ns, "wrote_less", k->holds || k->wrote_less);
	if (o && (fmt_meta_put(o, k->meta_json, PT, ignored) || fmt_save_put(o, k->save) ||
	          fmt_hex_put(o, "sig", sig))) {
		json_decref(o);
		return NULL;
	}
	/* what it wrote, where less than it holds: a committer may check it without the part */
	if (o && (k->holds || k->wrote_less) && part_rank_written_signature(k, &sig) == 0 &&
	    fmt_hex_put(o, "wsig", sig)) {
		json_decref(o);
		return NULL;
	}
	return o;
}

int part_summary_to_json(const struct part *p, char **out, size_t *len, char *err)
{
	json_t *root, *ranks;
	char when[64];
	int rc;

	*out = NULL;
	*len = 0;
	if (!p->file_size)
		return ipc_errf(err, -EINVAL,
		                PT_PREFIX "a summary needs its part's bytes (part_bytes_id)");
	ranks = json_array();
	for (size_t i = 0; ranks && i < p->nranks; i++)
		if (json_array_append_new(ranks, summary_rank_json(&p->ranks[i]))) {
			json_decref(ranks);
			ranks = NULL;
		}
	fmt_time(p->time_unix_ns, when, sizeof(when));
	root = json_pack("{s:s, s:i, s:s, s:s, s:s, s:I, s:i, s:s, s:I, s:I, s:o}", "format",
	                 PART_SUMMARY_FORMAT, "version", PART_SUMMARY_VERSION, "job", p->job, "run",
	                 p->run, "node", p->node, "step", (json_int_t)p->step, "world", p->world,
	                 "time", when, "time_unix_ns", (json_int_t)p->time_unix_ns, "part_bytes",
	                 (json_int_t)p->file_size, "ranks", ranks);
	if (!root || fmt_hex_put(root, "part_xxh3", p->file_xxh3)) {
		json_decref(root);
		return ipc_errf(err, -ENOMEM, PT_PREFIX "out of memory building the summary");
	}
	rc = fmt_dump(root, false, PART_MAX_BYTES, out, len, PT, err);
	json_decref(root);
	return rc;
}

/* ---- reading ----------------------------------------------------------- */

/* What a summary says of a rank in place of its tensors. */
static int parse_summary_rank(const json_t *o, const char *where, struct part_rank *k, char *err)
{
	const json_t *less = json_object_get(o, "wrote_less");
	int rc = fmt_hex_read(o, "sig", &k->sig, PT, where, err);

	if (rc)
		return rc;
	if (!json_is_boolean(less))
		return ipc_errf(err, -EINVAL, PT_PREFIX "%s: \"wrote_less\" is not true or false",
		                where);
	k->has_sig = true;
	k->wrote_less = json_is_true(less);
	if (!json_object_get(o, "wsig"))
		return 0;
	if (!k->wrote_less)
		return ipc_errf(err, -EINVAL,
		                PT_PREFIX "%s: \"wsig\" of a rank that wrote all it holds", where);
	k->has_wsig = true;
	return fmt_hex_read(o, "wsig", &k->wsig, PT, where, err);
}

static int parse_rank(const json_t *o, size_t i, int version, bool summary, struct part_rank *k,
                      char *err)
{
	const json_t *holds = json_object_get(o, "holds");
	int64_t v[6] = {0};
	const json_t *tensors = json_object_get(o, "tensors");
	const char *file;
	char where[32];
	int rc;

	snprintf(where, sizeof(where), "ranks[%zu]", i);
	if (!json_is_object(o))
		return ipc_errf(err, -EINVAL, PT_PREFIX "%s is not an object", where);
	rc = fmt_int(o, "rank", 0, IPC_MAX_WORLD - 1, &v[0], PT, where, err);
	if (!rc)
		rc = fmt_str(o, "file", &file, PT, where, err);
	if (!rc)
		rc = fmt_int(o, "size", 0, INT64_MAX, &v[1], PT, where, err);
	if (!rc)
		rc = fmt_int(o, "header_bytes", 0, INT64_MAX, &v[2], PT, where, err);
	if (!rc)
		rc = fmt_int(o, "queued_unix_ns", 0, INT64_MAX, &v[3], PT, where, err);
	if (!rc)
		rc = fmt_int(o, "captured_unix_ns", 0, INT64_MAX, &v[4], PT, where, err);
	if (!rc)
		rc = fmt_int(o, "durable_unix_ns", 0, INT64_MAX, &v[5], PT, where, err);
	if (!rc)
		rc = fmt_meta_read(o, &k->meta_json, PT, err);
	if (!rc)
		rc = fmt_save_read(o, &k->save, PT, where, err);
	if (rc)
		return rc;
	k->rank = (int)v[0];
	k->size = (uint64_t)v[1];
	k->header_bytes = (uint64_t)v[2];
	k->queued_unix_ns = v[3];
	k->captured_unix_ns = v[4];
	k->durable_unix_ns = v[5];
	if (!(k->file = strndup(file, SHARD_FILE_MAX)))
		return ipc_errf(err, -ENOMEM, PT_PREFIX "out of memory");
	if (summary)
		return parse_summary_rank(o, where, k, err);
	if (!json_is_object(tensors) || json_object_size(tensors) > IPC_MAX_TENSORS)
		return ipc_errf(err, -EINVAL,
		                PT_PREFIX
		                "%s: \"tensors\" is missing, not an object or larger than "
		                "%d",
		                where, IPC_MAX_TENSORS);
	rc = fmt_tensors_parse(tensors, true, &k->tensors, &k->ntensors, PT, err);
	if (rc)
		return rc;
	if (holds && version < 2)
		return ipc_errf(err, -EINVAL, PT_PREFIX "%s: \"holds\" in a version-%d part", where,
		                version);
	return holds ? fmt_holds_parse(holds, &k->holds, &k->nholds, PT, err) : 0;
}

static int parse_root(struct part *p, const json_t *root, bool summary, char *err)
{
	const json_t *ranks = json_object_get(root, "ranks");
	int64_t v = 0;
	int rc;

	rc = summary
	         ? fmt_header(root, PART_SUMMARY_FORMAT, PART_SUMMARY_VERSION, &p->version, PT, err)
	         : fmt_header(root, PART_FORMAT, PART_VERSION, &p->version, PT, err);
	if (!rc)
		rc = fmt_name(root, "job", ipc_check_job, &p->job, PT, "top level", err);
	if (!rc)
		rc = fmt_name(root, "run", ipc_check_run, &p->run, PT, "top level", err);
	if (!rc)
		rc = fmt_name(root, "node", ipc_check_node, &p->node, PT, "top level", err);
	if (!rc)
		rc = fmt_int(root, "step", 0, IPC_MAX_STEP, &p->step, PT, "top level", err);
	if (!rc && !(rc = fmt_int(root, "world", 1, IPC_MAX_WORLD, &v, PT, "top level", err)))
		p->world = (int)v;
	if (!rc)
		rc = fmt_int(root, "time_unix_ns", 0, INT64_MAX, &p->time_unix_ns, PT, "top level",
		             err);
	if (rc)
		return rc;
	if (!json_is_array(ranks) || json_array_size(ranks) > (size_t)p->world)
		return ipc_errf(err, -EINVAL,
		                PT_PREFIX
		                "\"ranks\" is missing, not an array or longer than world");
	p->ranks = calloc(json_array_size(ranks) + 1, sizeof(*p->ranks));
	if (!p->ranks)
		return ipc_errf(err, -ENOMEM, PT_PREFIX "out of memory");
	for (size_t i = 0; i < json_array_size(ranks); i++) {
		rc = parse_rank(json_array_get(ranks, i), i, p->version, summary,
		                &p->ranks[p->nranks++], err);
		if (rc)
			return rc;
	}
	if (!summary)
		return 0;
	p->summary = true;
	rc = fmt_int(root, "part_bytes", 1, PART_MAX_BYTES, &v, PT, "top level", err);
	p->file_size = (uint64_t)v;
	return rc ? rc : fmt_hex_read(root, "part_xxh3", &p->file_xxh3, PT, "top level", err);
}

static int from_json(const char *buf, size_t len, bool summary, struct part **out, char *err)
{
	struct part *p;
	json_t *root;
	int rc;

	*out = NULL;
	rc = fmt_load(buf, len, PART_MAX_BYTES, &root, PT, err);
	if (rc)
		return rc;
	p = calloc(1, sizeof(*p));
	rc = p ? parse_root(p, root, summary, err)
	       : ipc_errf(err, -ENOMEM, PT_PREFIX "out of memory");
	if (!rc)
		rc = part_check(p, err);
	json_decref(root);
	if (rc) {
		part_free(p);
		return rc;
	}
	*out = p;
	return 0;
}

int part_from_json(const char *buf, size_t len, struct part **out, char *err)
{
	return from_json(buf, len, false, out, err);
}

int part_summary_from_json(const char *buf, size_t len, struct part **out, char *err)
{
	return from_json(buf, len, true, out, err);
}

void part_free(struct part *p)
{
	if (!p)
		return;
	for (size_t i = 0; p->ranks && i < p->nranks; i++) {
		free(p->ranks[i].file);
		free(p->ranks[i].meta_json);
		fmt_tensors_free(p->ranks[i].tensors, p->ranks[i].ntensors);
		fmt_tensors_free(p->ranks[i].holds, p->ranks[i].nholds);
	}
	free(p->ranks);
	free(p->job);
	free(p->run);
	free(p->node);
	free(p);
}

int part_bytes_id(struct part *p, char *err)
{
	char *json = NULL;
	size_t len = 0;
	int rc = part_to_json(p, &json, &len, err);

	if (rc)
		return rc;
	p->file_size = len;
	p->file_xxh3 = XXH3_64bits(json, len);
	free(json);
	return 0;
}

void part_strip(struct part *p)
{
	for (size_t i = 0; p && i < p->nranks; i++) {
		struct part_rank *k = &p->ranks[i];

		/* what they were stays as their signatures, as a summary's (no memory: not told) */
		if (!k->has_sig && part_rank_signature(k, &k->sig) == 0) {
			k->has_sig = true;
			k->wrote_less = k->wrote_less || k->holds;
			k->has_wsig =
			    k->holds && tensors_signature(k->tensors, k->ntensors, &k->wsig) == 0;
		}
		fmt_tensors_free(k->tensors, k->ntensors);
		fmt_tensors_free(k->holds, k->nholds);
		k->tensors = k->holds = NULL;
		k->ntensors = k->nholds = 0;
	}
}
