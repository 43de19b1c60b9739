/*
 * manifest.c: manifest.json, the checkpoint's table of contents
 * (docs/DESIGN.md §6.3). Its durable presence is the commit, so it must say
 * enough to verify every byte and to reshard on restore without opening a
 * shard: the run, the parts it merged (which node brought which ranks), per
 * rank the file, its size and the rank's meta, per tensor its dtype, global
 * shape and chunks (rank, global offset, local shape, byte range, XXH3-64).
 *
 * A merge of parts builds one (part.c, manifest_merge); verify, restore,
 * list and ckptctl read them back (manifest_from_json), as hostile input:
 * every field is type-checked, every number bounded, and the same
 * structural checks run on both paths (manifest_check), so we never write a
 * manifest we would refuse to read. Format 1 (one node, before runs and
 * parts) is still read. Pure functions; any thread.
 *
 * Divisions: shard names; structural checks; writing; reading; lookups.
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

#include "storage/format/fmt.h"

#define MF_PREFIX "manifest: "
#define MF "manifest"
/* Above this many chunks the manifest is written compact, to stay small. */
#define MF_INDENT_MAX_CHUNKS 10000u

void manifest_rank_file(int rank, char *buf, size_t len)
{
	snprintf(buf, len, "rank-%05d.safetensors", rank);
}

/* ---- shard names -------------------------------------------------------- */

#define SHARD_SUFFIX ".safetensors"

int shard_file_name(int rank, const char *node, unsigned attempt, char *buf, size_t len)
{
	int n = snprintf(buf, len, "rank-%05d.%s.%u" SHARD_SUFFIX, rank, node, attempt);

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* "rank-" and 5 digits and a '.', then the rest: where the rest starts, or NULL. */
static const char *after_rank(const char *name, int *rank)
{
	int r = 0;

	if (strncmp(name, "rank-", 5) != 0)
		return NULL;
	for (int i = 5; i < 10; i++) {
		if (name[i] < '0' || name[i] > '9')
			return NULL;
		r = r * 10 + (name[i] - '0');
	}
	if (name[10] != '.')
		return NULL;
	*rank = r;
	return name + 11;
}

/* "<node>.<digits>.safetensors": the node's length, or 0 if rest is not that. */
static size_t node_part(const char *rest)
{
	size_t n = strlen(rest), sl = strlen(SHARD_SUFFIX), d = 0;

	if (n <= sl || strcmp(rest + n - sl, SHARD_SUFFIX) != 0)
		return 0;
	n -= sl;
	while (d < n && rest[n - 1 - d] >= '0' && rest[n - 1 - d] <= '9')
		d++;
	if (d == 0 || d > 10 || d + 2 > n || rest[n - 1 - d] != '.')
		return 0;
	return n - 1 - d;
}

bool shard_file_of_node(const char *name, const char *node)
{
	size_t len = strlen(node);
	const char *rest;
	int rank;

	rest = after_rank(name, &rank);
	return rest && node_part(rest) == len && strncmp(rest, node, len) == 0;
}

int shard_file_check(int rank, const char *name, char *err)
{
	char node[IPC_MAX_JOB + 1], why[IPC_ERRLEN];
	const char *rest;
	size_t n;
	int r = -1;

	if (!name || strnlen(name, SHARD_FILE_MAX) >= SHARD_FILE_MAX)
		return ipc_errf(err, -EINVAL,
		                "rank %d: no file name, or a name of %d characters or "
		                "more",
		                rank, SHARD_FILE_MAX);
	rest = after_rank(name, &r);
	n = rest ? node_part(rest) : 0;
	if (!rest || r != rank || n == 0 || n > IPC_MAX_JOB)
		return ipc_errf(err, -EINVAL,
		                "rank %d: file '%.64s' is not named "
		                "rank-%05d.<node>.<attempt>.safetensors",
		                rank, name, rank);
	memcpy(node, rest, n);
	node[n] = '\0';
	if (ipc_check_node(node, why))
		return ipc_errf(err, -EINVAL, "rank %d: file '%.64s': %s", rank, name, why);
	return 0;
}

/* ---- structural checks ------------------------------------------------- */

static int check_ranks(const struct manifest *m, char *err)
{
	char name[32], msg[IPC_ERRLEN];
	uint64_t sum = 0;
	int rc;

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
		if (m->version == 1 && (!k->file || strcmp(k->file, name) != 0))
			return ipc_errf(err, -EINVAL,
			                MF_PREFIX "rank %d: file is '%.64s', expected '%s'", r,
			                k->file ? k->file : "(none)", name);
		if (m->version > 1 && (rc = shard_file_check(r, k->file, msg)))
			return ipc_errf(err, rc, MF_PREFIX "%s", msg);
		if (k->meta_json && (rc = ipc_check_meta(k->meta_json, msg)))
			return ipc_errf(err, rc, MF_PREFIX "rank %d: %s", r, msg);
		if (k->header_bytes < 8 || k->header_bytes > k->size)
			return ipc_errf(err, -EINVAL,
			                MF_PREFIX "rank %d: header_bytes %" PRIu64
			                          " is outside its file of %" PRIu64 " bytes",
			                r, k->header_bytes, k->size);
		if (k->holds && m->version < 3)
			return ipc_errf(err, -EINVAL,
			                MF_PREFIX
			                "rank %d says what it holds in a version-%d manifest",
			                r, m->version);
		if (k->holds && (rc = fmt_check_holds(k->holds, k->nholds, r, MF, err)))
			return rc;
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
 * One rank saves one box of a tensor at most once, which is what makes
 * (rank, global_offset) a key; boxes may repeat on different ranks
 * (data-parallel replicas save the same one). That the boxes cover the
 * whole global tensor is not checked (it needs a union of boxes).
 */
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
		const struct manifest_chunk *c = &t->chunks[j];

		const struct manifest_rank *k;

		rc = fmt_check_chunk(t, j,
		                     c->rank >= 0 && c->rank < m->world ? &m->ranks[c->rank] : NULL,
		                     m->world, MF, err);
		if (rc)
			return rc;
		k = &m->ranks[c->rank];
		if (k->holds && !fmt_holds_chunk(k->holds, k->nholds, t, c))
			return ipc_errf(err, -EINVAL,
			                MF_PREFIX
			                "tensor '%s': rank %d wrote a box it does not hold",
			                t->name, c->rank);
	}
	return check_chunk_keys(t, tmp, err);
}

static const char *rank_file(const void *ctx, int rank)
{
	return ((const struct manifest *)ctx)->ranks[rank].file;
}

/* No two chunks share bytes of one file: each byte has one owner. */
static int check_spans(const struct manifest *m, size_t nchunks, char *err)
{
	struct fmt_span *s = calloc(nchunks ? nchunks : 1, sizeof(*s));
	size_t n = 0;
	int rc;

	if (!s)
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory for %zu chunks", nchunks);
	for (size_t i = 0; i < m->ntensors; i++)
		for (size_t j = 0; j < m->tensors[i].nchunks; j++) {
			const struct manifest_chunk *c = &m->tensors[i].chunks[j];

			if (c->end > c->begin)
				s[n++] = (struct fmt_span){c->rank, c->begin, c->end,
				                           m->tensors[i].name};
		}
	rc = fmt_check_spans(s, n, rank_file, m, MF, err);
	free(s);
	return rc;
}

/*
 * Format 2: each rank in exactly one part, nodes named once and sorted, so
 * that two merges of the same parts say the same.
 */
static int check_parts(const struct manifest *m, char *err)
{
	unsigned char *seen;
	char msg[IPC_ERRLEN];
	int rc = 0;

	if (m->version == 1)
		return m->nparts ? ipc_errf(err, -EINVAL, MF_PREFIX "format 1 has no parts") : 0;
	if (m->nparts < 1 || !m->parts)
		return ipc_errf(err, -EINVAL, MF_PREFIX "no parts listed");
	seen = calloc((size_t)m->world, 1);
	if (!seen)
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory");
	for (size_t i = 0; i < m->nparts && !rc; i++) {
		const struct manifest_part *p = &m->parts[i];

		if ((rc = ipc_check_node(p->node, msg)))
			rc = ipc_errf(err, rc, MF_PREFIX "part %zu: %s", i, msg);
		else if (i > 0 && strcmp(m->parts[i - 1].node, p->node) >= 0)
			rc = ipc_errf(err, -EINVAL,
			              MF_PREFIX "part of node '%s' %s: parts are sorted by node, "
			                        "one each",
			              p->node,
			              strcmp(m->parts[i - 1].node, p->node) ? "is out of order"
			                                                    : "appears twice");
		else if (p->nranks < 1 || !p->ranks)
			rc = ipc_errf(err, -EINVAL, MF_PREFIX "part of node '%s' has no ranks",
			              p->node);
		for (size_t j = 0; j < p->nranks && !rc; j++) {
			int r = p->ranks[j];

			if (r < 0 || r >= m->world || (j > 0 && r <= p->ranks[j - 1]))
				rc = ipc_errf(err, -EINVAL,
				              MF_PREFIX
				              "part of node '%s': rank %d is outside world "
				              "%d or out of order",
				              p->node, r, m->world);
			else if (seen[r]++)
				rc = ipc_errf(err, -EINVAL,
				              MF_PREFIX
				              "rank %d is in two parts (the second: node '%s')",
				              r, p->node);
		}
		if (!rc && m->version == MANIFEST_VERSION_HEAD && (!p->size || !p->xxh3))
			rc = ipc_errf(err, -EINVAL,
			              MF_PREFIX "part of node '%s': no length or XXH3 named",
			              p->node);
	}
	for (int r = 0; r < m->world && !rc; r++)
		if (!seen[r])
			rc = ipc_errf(err, -EINVAL, MF_PREFIX "rank %d is in no part", r);
	free(seen);
	return rc;
}

static int check_top(const struct manifest *m, char *err)
{
	double d[3] = {m->capture_seconds, m->durable_seconds, m->commit_seconds};
	int rc;

	if (m->version < 1 || m->version > MANIFEST_VERSION)
		return ipc_errf(err, -EINVAL, MF_PREFIX "version %d, this reader knows 1..%d",
		                m->version, MANIFEST_VERSION);
	rc = ipc_check_job(m->job, err);
	if (rc == 0)
		rc = ipc_check_step(m->step, err);
	if (rc == 0)
		rc = ipc_check_run(m->run, err);
	if (rc == 0 && m->meta_json)
		rc = ipc_check_meta(m->meta_json, err);
	if (rc)
		return rc;
	if (m->time_unix_ns < 0)
		return ipc_errf(err, -EINVAL, MF_PREFIX "time_unix_ns %lld is negative",
		                (long long)m->time_unix_ns);
	for (int i = 0; i < 3; i++)
		if (!isfinite(d[i]) || d[i] < 0)
			return ipc_errf(err, -EINVAL, MF_PREFIX "duration %d is %g", i, d[i]);
	if (m->head_only && (m->version != MANIFEST_VERSION_HEAD || m->nranks || m->ntensors))
		return ipc_errf(err, -EINVAL, MF_PREFIX "a head of version %d with %zu ranks",
		                m->version, m->nranks);
	rc = m->head_only ? 0 : check_ranks(m, err);
	return rc ? rc : check_parts(m, err);
}

size_t manifest_tensor_count(const struct manifest *m)
{
	return m->head_only ? m->head_tensors : m->ntensors;
}

int manifest_check(const struct manifest *m, char *err)
{
	const struct manifest_chunk **tmp = NULL;
	size_t maxc = 1, total = 0;
	int rc;

	rc = check_top(m, err);
	if (rc || m->head_only)
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

static json_t *ranks_json(const struct manifest *m)
{
	json_t *a = json_array(), *o;
	char ignored[IPC_ERRLEN];

	for (size_t r = 0; a && r < m->nranks; r++) {
		const struct manifest_rank *k = &m->ranks[r];

		o = json_pack("{s:i, s:s, s:I, s:I}", "rank", k->rank, "file", k->file, "size",
		              (json_int_t)k->size, "header_bytes", (json_int_t)k->header_bytes);
		if (o && m->version > 1 &&
		    (fmt_meta_put(o, k->meta_json, MF, ignored) || fmt_save_put(o, k->save))) {
			json_decref(o);
			o = NULL;
		}
		if (o && k->holds &&
		    json_object_set_new(o, "holds", fmt_holds_json(k->holds, k->nholds))) {
			json_decref(o);
			o = NULL;
		}
		if (json_array_append_new(a, o)) {
			json_decref(a);
			return NULL;
		}
	}
	return a;
}

static json_t *root_json(const struct manifest *m, json_t *meta)
{
	char when[64];
	json_int_t bytes = (json_int_t)m->bytes;
	json_t *root;

	fmt_time(m->time_unix_ns, when, sizeof(when));
	root = json_pack("{s:s, s:i, s:s, s:s, s:I, s:i, s:s, s:I, s:o, s:I, "
	                 "s:{s:f, s:f, s:f}, s:o, s:o, s:o}",
	                 "format", MANIFEST_FORMAT, "version", m->version, "job", m->job, "run",
	                 m->run, "step", (json_int_t)m->step, "world", m->world, "time", when,
	                 "time_unix_ns", (json_int_t)m->time_unix_ns, "meta", meta, "bytes", bytes,
	                 "durations", "capture_seconds", m->capture_seconds, "durable_seconds",
	                 m->durable_seconds, "commit_seconds", m->commit_seconds, "parts",
	                 fmt_parts_json(m), "ranks", ranks_json(m), "tensors",
	                 fmt_tensors_json(m->tensors, m->ntensors, true));
	/* format 1 had neither: written back as it was read */
	if (root && m->version == 1) {
		json_object_del(root, "run");
		json_object_del(root, "parts");
	}
	return root;
}

int manifest_to_json(const struct manifest *m, char **out, size_t *len, char *err)
{
	size_t nchunks = 0;
	json_t *meta, *root;
	int rc;

	*out = NULL;
	*len = 0;
	rc = manifest_check(m, err);
	if (rc == 0)
		rc = fmt_meta_value(m->meta_json, &meta, MF, err);
	if (rc)
		return rc;
	/* jansson holds integers as long long; sizes past that are not files */
	if (m->bytes > INT64_MAX) {
		json_decref(meta);
		return ipc_errf(err, -EOVERFLOW, MF_PREFIX "%" PRIu64 " bytes", m->bytes);
	}
	/* a head as it is on disk; a head read whole, for people (show): with its parts' */
	if (m->head_only)
		return head_json(m, meta, out, len, err); /* takes meta */
	root = root_json(m, meta); /* takes meta, even when it fails */
	if (!root)
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory building the JSON");
	/* the text as given, beside the value, where they differ (fmt_meta_read returns it) */
	if ((rc = fmt_meta_put(root, m->meta_json, MF, err)) != 0) {
		json_decref(root);
		return rc;
	}
	for (size_t i = 0; i < m->ntensors; i++)
		nchunks += m->tensors[i].nchunks;
	/* indented for people, unless that makes a huge manifest larger still */
	rc = fmt_dump(root, nchunks <= MF_INDENT_MAX_CHUNKS, MANIFEST_MAX_BYTES, out, len, MF, err);
	json_decref(root);
	return rc;
}

/* ---- reading ----------------------------------------------------------- */

static int parse_ranks(struct manifest *m, const json_t *a, char *err)
{
	char where[32];
	int64_t r = 0, size = 0, hb = 0; /* set by fmt_int; = 0 quiets -O3's guess */
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
		rc = fmt_int(o, "rank", 0, m->world - 1, &r, MF, where, err);
		if (rc == 0)
			rc = fmt_str(o, "file", &file, MF, where, err);
		if (rc == 0)
			rc = fmt_int(o, "size", 0, INT64_MAX, &size, MF, where, err);
		if (rc == 0)
			rc = fmt_int(o, "header_bytes", 0, INT64_MAX, &hb, MF, where, err);
		if (rc)
			return rc;
		if (m->ranks[r].file)
			return ipc_errf(err, -EINVAL, MF_PREFIX "rank %lld is listed twice",
			                (long long)r);
		m->ranks[r] = (struct manifest_rank){.rank = (int)r,
		                                     .file = strdup(file),
		                                     .size = (uint64_t)size,
		                                     .header_bytes = (uint64_t)hb};
		if (!m->ranks[r].file)
			return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory");
		if (m->version > 1 && (rc = fmt_meta_read(o, &m->ranks[r].meta_json, MF, err)))
			return rc;
		if (m->version > 1 && (rc = fmt_save_read(o, &m->ranks[r].save, MF, where, err)))
			return rc;
		if (m->version > 2 && json_object_get(o, "holds") &&
		    (rc = fmt_holds_parse(json_object_get(o, "holds"), &m->ranks[r].holds,
		                          &m->ranks[r].nholds, MF, err)))
			return rc;
	}
	return 0; /* missing ranks: manifest_check */
}

static int parse_parts(struct manifest *m, const json_t *a, char *err)
{
	char where[32];
	int rc;

	if (!json_is_array(a) || json_array_size(a) > (size_t)m->world)
		return ipc_errf(err, -EINVAL,
		                MF_PREFIX
		                "\"parts\" is missing, not an array or longer than world");
	m->parts = calloc(json_array_size(a) + 1, sizeof(*m->parts));
	if (!m->parts)
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory");
	for (size_t i = 0; i < json_array_size(a); i++) {
		const json_t *o = json_array_get(a, i), *ranks = json_object_get(o, "ranks");
		struct manifest_part *p = &m->parts[m->nparts++];

		snprintf(where, sizeof(where), "parts[%zu]", i);
		rc = fmt_name(o, "node", ipc_check_node, &p->node, MF, where, err);
		if (rc)
			return rc;
		if (!json_is_array(ranks) || json_array_size(ranks) > (size_t)m->world)
			return ipc_errf(err, -EINVAL,
			                MF_PREFIX "%s: \"ranks\" is not an array of "
			                          "at most world ranks",
			                where);
		p->ranks = calloc(json_array_size(ranks) + 1, sizeof(*p->ranks));
		if (!p->ranks)
			return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory");
		for (size_t j = 0; j < json_array_size(ranks); j++) {
			const json_t *v = json_array_get(ranks, j);

			if (!json_is_integer(v) || json_integer_value(v) < 0 ||
			    json_integer_value(v) >= m->world)
				return ipc_errf(err, -EINVAL,
				                MF_PREFIX
				                "%s: ranks[%zu] is not a rank of world %d",
				                where, j, m->world);
			p->ranks[p->nranks++] = (int)json_integer_value(v);
		}
	}
	return 0; /* order, duplicates, coverage: manifest_check */
}

static int parse_tensors(struct manifest *m, const json_t *o, char *err)
{
	if (!json_is_object(o))
		return ipc_errf(err, -EINVAL, MF_PREFIX "\"tensors\" is missing or not an object");
	return fmt_tensors_parse(o, true, &m->tensors, &m->ntensors, MF, err);
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

static int parse_root(struct manifest *m, const json_t *root, char *err)
{
	const char *s;
	int64_t v = 0; /* set by fmt_int; = 0 quiets -O3's guess */
	int rc;

	rc = fmt_header(root, MANIFEST_FORMAT, MANIFEST_VERSION, &m->version, MF, err);
	if (rc == 0)
		rc = fmt_name(root, "job", ipc_check_job, &m->job, MF, "top level", err);
	if (rc == 0 && m->version > 1)
		rc = fmt_name(root, "run", ipc_check_run, &m->run, MF, "top level", err);
	else if (rc == 0 && !(m->run = strdup(IPC_DEFAULT_RUN)))
		rc = ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory");
	if (rc == 0)
		rc = fmt_int(root, "step", 0, IPC_MAX_STEP, &m->step, MF, "top level", err);
	if (rc == 0 &&
	    (rc = fmt_int(root, "world", 1, IPC_MAX_WORLD, &v, MF, "top level", err)) == 0)
		m->world = (int)v;
	if (rc == 0)
		rc = fmt_str(root, "time", &s, MF, "top level", err);
	if (rc == 0)
		rc = fmt_int(root, "time_unix_ns", 0, INT64_MAX, &m->time_unix_ns, MF, "top level",
		             err);
	if (rc == 0 && (rc = fmt_int(root, "bytes", 0, INT64_MAX, &v, MF, "top level", err)) == 0)
		m->bytes = (uint64_t)v;
	if (rc == 0)
		rc = fmt_meta_read(root, &m->meta_json, MF, err);
	if (rc == 0)
		rc = parse_durations(m, json_object_get(root, "durations"), err);
	if (rc == 0 && m->version == MANIFEST_VERSION_HEAD)
		return head_parse(m, root, err);
	if (rc == 0 && m->version > 1)
		rc = parse_parts(m, json_object_get(root, "parts"), err);
	if (rc == 0)
		rc = parse_ranks(m, json_object_get(root, "ranks"), err);
	if (rc == 0)
		rc = parse_tensors(m, json_object_get(root, "tensors"), err);
	return rc;
}

int manifest_from_json(const char *buf, size_t len, struct manifest **out, char *err)
{
	struct manifest *m;
	json_t *root;
	int rc;

	*out = NULL;
	rc = fmt_load(buf, len, MANIFEST_MAX_BYTES, &root, MF, err);
	if (rc)
		return rc;
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
	for (size_t i = 0; m->ranks && i < m->nranks; i++) {
		free(m->ranks[i].file);
		free(m->ranks[i].meta_json);
		fmt_tensors_free(m->ranks[i].holds, m->ranks[i].nholds);
	}
	for (size_t i = 0; m->parts && i < m->nparts; i++) {
		free(m->parts[i].node);
		free(m->parts[i].ranks);
	}
	fmt_tensors_free(m->tensors, m->ntensors);
	free(m->ranks);
	free(m->parts);
	free(m->job);
	free(m->run);
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

const char *manifest_rank_meta(const struct manifest *m, int rank)
{
	if (m->version == 1)
		return m->meta_json;
	if (rank >= 0 && (size_t)rank < m->nranks)
		return m->ranks[rank].meta_json;
	return m->nranks ? m->ranks[0].meta_json : NULL;
}

const char *manifest_node_of(const struct manifest *m, int rank)
{
	for (size_t i = 0; i < m->nparts; i++)
		for (size_t j = 0; j < m->parts[i].nranks; j++)
			if (m->parts[i].ranks[j] == rank)
				return m->parts[i].node;
	return NULL;
}
