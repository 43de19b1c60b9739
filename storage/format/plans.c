/*
 * plans.c: a node's plans file (docs/DESIGN.md §6.5), <root>/<job>/plans/<node>.json:
 * which ranks of which run of the job the node serves, and each rank's
 * tensors (dtype, shape, global shape and offset). Every agent of the job
 * learns from these files which node holds which rank, and so which parts to
 * wait for; replicas and resharding read the boxes.
 *
 * The digest (XXH3-64 of the rest, compact) names the plan set: a node
 * rewrites its file only when it changes. Its summary (<node>.sum) says the
 * same of the ranks with each rank's tensors as one number (their
 * tensors_signature), and the digest of the file it summarises. A run's
 * roster (<run>.roster) says the same of every node of the run at once.
 * Files of other nodes are hostile input: every field is checked and
 * bounded. Pure functions; any thread.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "storage/format/fmt.h"

#define PL "plans"
#define PL_PREFIX "plans: "

/* ---- writing ----------------------------------------------------------- */

static json_t *tensor_json(const struct manifest_tensor *t)
{
	const struct manifest_chunk *c = &t->chunks[0];
	json_t *o = json_pack("{s:s, s:s, s:o, s:o}", "name", t->name, "dtype",
	                      ipc_dtype_name(t->dtype), "shape", fmt_ints(c->shape, t->ndim),
	                      "global_shape", fmt_ints(t->global_shape, t->ndim));

	if (o && t->sharded &&
	    json_object_set_new(o, "global_offset", fmt_ints(c->global_offset, t->ndim))) {
		json_decref(o);
		return NULL;
	}
	return o;
}

static json_t *ranks_json(const struct plans_file *f)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < f->nranks; i++) {
		const struct plans_rank *k = &f->ranks[i];
		json_t *t = json_array();

		for (size_t j = 0; t && j < k->ntensors; j++)
			if (json_array_append_new(t, tensor_json(&k->tensors[j]))) {
				json_decref(t);
				t = NULL;
			}
		json_t *o = json_pack("{s:i, s:o}", "rank", k->rank, "tensors", t);

		/* said only when not 1: files of plans without the option stay as they were */
		if (o && k->copies > 1 &&
		    json_object_set_new(o, "copies", json_integer((json_int_t)k->copies))) {
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

int plans_to_json(struct plans_file *f, char **out, size_t *len, char *err)
{
	char msg[IPC_ERRLEN], *body;
	size_t blen;
	json_t *root;
	int rc;

	*out = NULL;
	*len = 0;
	if ((rc = ipc_check_job(f->job, msg)) || (rc = ipc_check_node(f->node, msg)) ||
	    (rc = ipc_check_run(f->run, msg)))
		return ipc_errf(err, rc, PL_PREFIX "%s", msg);
	root = json_pack("{s:s, s:i, s:s, s:s, s:s, s:i, s:o}", "format", PLANS_FORMAT, "version",
	                 PLANS_VERSION, "job", f->job, "node", f->node, "run", f->run, "world",
	                 f->world, "ranks", ranks_json(f));
	if (root && f->writes_once && json_object_set_new(root, "writes_once", json_true())) {
		json_decref(root);
		root = NULL;
	}
	if (!root)
		return ipc_errf(err, -ENOMEM, PL_PREFIX "out of memory building the JSON");
	/* The digest: of everything else, so equal plan sets have equal files. */
	rc = fmt_dump(root, false, MANIFEST_MAX_BYTES, &body, &blen, PL, err);
	if (!rc) {
		snprintf(f->digest, sizeof(f->digest), "%016" PRIx64,
		         (uint64_t)XXH3_64bits(body, blen));
		free(body);
		if (json_object_set_new(root, "digest", json_string(f->digest)))
			rc = ipc_errf(err, -ENOMEM, PL_PREFIX "out of memory");
	}
	if (!rc)
		rc = fmt_dump(root, false, MANIFEST_MAX_BYTES, out, len, PL, err);
	json_decref(root);
	return rc;
}

int plans_rank_signature(const struct plans_rank *k, uint64_t *sig)
{
	if (k->has_sig) {
		*sig = k->sig;
		return 0;
	}
	return tensors_signature(k->tensors, k->ntensors, sig);
}

/* A rank in the summary: its number, its option, what it holds as one number. */
static json_t *summary_rank_json(const struct plans_rank *k)
{
	uint64_t sig;
	json_t *o;

	if (plans_rank_signature(k, &sig))
		return NULL;
	o = json_pack("{s:i}", "rank", k->rank);
	if (o && ((k->copies > 1 &&
	           json_object_set_new(o, "copies", json_integer((json_int_t)k->copies))) ||
	          fmt_hex_put(o, "sig", sig))) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* f's ranks as a summary says them (their signatures), NULL where out of memory. */
static json_t *summary_ranks_json(const struct plans_file *f)
{
	json_t *ranks = json_array();

	for (size_t i = 0; ranks && i < f->nranks; i++)
		if (json_array_append_new(ranks, summary_rank_json(&f->ranks[i]))) {
			json_decref(ranks);
			return NULL;
		}
	return ranks;
}

int plans_summary_to_json(const struct plans_file *f, char **out, size_t *len, char *err)
{
	json_t *root;
	int rc;

	*out = NULL;
	*len = 0;
	if (strlen(f->digest) != 16)
		return ipc_errf(err, -EINVAL, PL_PREFIX "a summary needs the file's digest");
	root = json_pack("{s:s, s:i, s:s, s:s, s:s, s:i, s:s, s:b, s:o}", "format",
	                 PLANS_SUMMARY_FORMAT, "version", PLANS_SUMMARY_VERSION, "job", f->job,
	                 "node", f->node, "run", f->run, "world", f->world, "digest", f->digest,
	                 "writes_once", f->writes_once, "ranks", summary_ranks_json(f));
	if (!root)
		return ipc_errf(err, -ENOMEM, PL_PREFIX "out of memory building the summary");
	rc = fmt_dump(root, false, MANIFEST_MAX_BYTES, out, len, PL, err);
	json_decref(root);
	return rc;
}

/* ---- reading ----------------------------------------------------------- */

static int parse_tensor(const json_t *o, struct manifest_tensor *t, const char *where, char *err)
{
	struct manifest_chunk *c;
	char msg[IPC_ERRLEN];
	const char *name, *dt;
	uint64_t nbytes;
	int rc;

	if (!json_is_object(o))
		return ipc_errf(err, -EINVAL, PL_PREFIX "%s is not an object", where);
	rc = fmt_str(o, "name", &name, PL, where, err);
	if (!rc && (rc = ipc_check_tensor_name(name, msg)))
		return ipc_errf(err, rc, PL_PREFIX "%s: %s", where, msg);
	if (!rc)
		rc = fmt_str(o, "dtype", &dt, PL, where, err);
	if (rc)
		return rc;
	if (!(t->name = strdup(name)) || !(t->chunks = c = calloc(1, sizeof(*c))))
		return ipc_errf(err, -ENOMEM, PL_PREFIX "out of memory");
	t->nchunks = 1;
	if (!(t->dtype = ipc_dtype_from_name(dt)))
		return ipc_errf(err, -EINVAL, PL_PREFIX "%s: unknown dtype '%.32s'", where, dt);
	rc = fmt_dims(o, "shape", -1, c->shape, &t->ndim, PL, where, err);
	if (!rc)
		rc = fmt_dims(o, "global_shape", (long)t->ndim, t->global_shape, NULL, PL, where,
		              err);
	t->sharded = json_object_get(o, "global_offset") != NULL;
	if (!rc && t->sharded)
		rc = fmt_dims(o, "global_offset", (long)t->ndim, c->global_offset, NULL, PL, where,
		              err);
	if (rc)
		return rc;
	rc = ipc_tensor_nbytes(t->name, t->dtype, t->ndim, c->shape, &nbytes, msg);
	if (rc)
		return ipc_errf(err, rc, PL_PREFIX "%s: %s", where, msg);
	for (size_t d = 0; d < t->ndim; d++) {
		int64_t g = t->global_shape[d], off = c->global_offset[d], l = c->shape[d];

		if (off > g || l > g - off || (!t->sharded && l != g))
			return ipc_errf(err, -EINVAL,
			                PL_PREFIX "%s: tensor '%s' does not fit its global shape "
			                          "(dimension %zu)",
			                where, t->name, d);
	}
	return 0;
}

static int cmp_name_ptr(const void *a, const void *b)
{
	return strcmp((*(const struct manifest_tensor *const *)a)->name,
	              (*(const struct manifest_tensor *const *)b)->name);
}

/* A rank's tensor names are unique (the agent refuses such a plan; a file may not). */
static int unique_names(const struct plans_rank *k, char *err)
{
	const struct manifest_tensor **v = calloc(k->ntensors + 1, sizeof(*v));
	int rc = 0;

	if (!v)
		return ipc_errf(err, -ENOMEM, PL_PREFIX "out of memory");
	for (size_t i = 0; i < k->ntensors; i++)
		v[i] = &k->tensors[i];
	qsort(v, k->ntensors, sizeof(*v), cmp_name_ptr);
	for (size_t i = 1; i < k->ntensors && !rc; i++)
		if (strcmp(v[i - 1]->name, v[i]->name) == 0)
			rc = ipc_errf(err, -EINVAL, PL_PREFIX "rank %d lists tensor '%s' twice",
			              k->rank, v[i]->name);
	free(v);
	return rc;
}

static int parse_rank(const json_t *o, size_t i, int world, int prev, bool summary,
                      struct plans_rank *k, char *err)
{
	const json_t *t = json_object_get(o, "tensors");
	char where[IPC_MAX_TENSOR_NAME + 48];
	int64_t r = 0;
	int rc;

	snprintf(where, sizeof(where), "ranks[%zu]", i);
	if (!json_is_object(o))
		return ipc_errf(err, -EINVAL, PL_PREFIX "%s is not an object", where);
	rc = fmt_int(o, "rank", 0, world - 1, &r, PL, where, err);
	if (rc)
		return rc;
	k->rank = (int)r;
	k->copies = 1;
	if (json_object_get(o, "copies")) {
		rc = fmt_int(o, "copies", 1, UINT32_MAX, &r, PL, where, err);
		if (rc)
			return rc;
		k->copies = (unsigned)r;
	}
	if (k->rank <= prev)
		return ipc_errf(err, -EINVAL, PL_PREFIX "rank %d is listed twice or out of order",
		                k->rank);
	if (summary) { /* its tensors as one number */
		k->has_sig = true;
		return fmt_hex_read(o, "sig", &k->sig, PL, where, err);
	}
	if (!json_is_array(t) || json_array_size(t) > IPC_MAX_TENSORS)
		return ipc_errf(err, -EINVAL,
		                PL_PREFIX "%s: \"tensors\" is not an array of at most %d", where,
		                IPC_MAX_TENSORS);
	k->tensors = calloc(json_array_size(t) + 1, sizeof(*k->tensors));
	if (!k->tensors)
		return ipc_errf(err, -ENOMEM, PL_PREFIX "out of memory");
	for (size_t j = 0; j < json_array_size(t); j++) {
		snprintf(where, sizeof(where), "rank %d tensor %zu", k->rank, j);
		rc = parse_tensor(json_array_get(t, j), &k->tensors[k->ntensors++], where, err);
		if (rc)
			return rc;
	}
	return unique_names(k, err);
}

/* A node's digest, options and ranks (f's world known): a file's, a summary's or a roster's entry.
 */
static int parse_node(struct plans_file *f, const json_t *o, bool summary, const char *where,
                      char *err)
{
	const json_t *ranks = json_object_get(o, "ranks");
	const char *digest;
	int rc = fmt_str(o, "digest", &digest, PL, where, err);

	if (rc)
		return rc;
	if (strlen(digest) != 16 || strspn(digest, "0123456789abcdef") != 16)
		return ipc_errf(err, -EINVAL, PL_PREFIX "%s: digest '%.32s' is not 16 hex digits",
		                where, digest);
	memcpy(f->digest, digest, 17);
	f->writes_once = json_is_true(json_object_get(o, "writes_once"));
	f->summary = summary;
	if (!json_is_array(ranks) || json_array_size(ranks) < 1 ||
	    json_array_size(ranks) > (size_t)f->world)
		return ipc_errf(err, -EINVAL,
		                PL_PREFIX "%s: \"ranks\" is missing, empty or longer than world %d",
		                where, f->world);
	f->ranks = calloc(json_array_size(ranks), sizeof(*f->ranks));
	if (!f->ranks)
		return ipc_errf(err, -ENOMEM, PL_PREFIX "out of memory");
	for (size_t i = 0; i < json_array_size(ranks); i++) {
		int prev = i ? f->ranks[i - 1].rank : -1;

		rc = parse_rank(json_array_get(ranks, i), i, f->world, prev, summary,
		                &f->ranks[f->nranks++], err);
		if (rc)
			return rc;
	}
	return 0;
}

static int parse_root(struct plans_file *f, const json_t *root, bool summary, char *err)
{
	int64_t v = 0;
	int rc;

	rc = summary ? fmt_header(root, PLANS_SUMMARY_FORMAT, PLANS_SUMMARY_VERSION, &f->version,
	                          PL, err)
	             : fmt_header(root, PLANS_FORMAT, PLANS_VERSION, &f->version, PL, err);
	if (!rc)
		rc = fmt_name(root, "job", ipc_check_job, &f->job, PL, "top level", err);
	if (!rc)
		rc = fmt_name(root, "node", ipc_check_node, &f->node, PL, "top level", err);
	if (!rc)
		rc = fmt_name(root, "run", ipc_check_run, &f->run, PL, "top level", err);
	if (!rc && !(rc = fmt_int(root, "world", 1, IPC_MAX_WORLD, &v, PL, "top level", err)))
		f->world = (int)v;
	return rc ? rc : parse_node(f, root, summary, "top level", err);
}

static int from_json(const char *buf, size_t len, bool summary, struct plans_file **out, char *err)
{
	struct plans_file *f;
	json_t *root;
	int rc;

	*out = NULL;
	rc = fmt_load(buf, len, MANIFEST_MAX_BYTES, &root, PL, err);
	if (rc)
		return rc;
	f = calloc(1, sizeof(*f));
	rc = f ? parse_root(f, root, summary, err)
	       : ipc_errf(err, -ENOMEM, PL_PREFIX "out of memory");
	json_decref(root);
	if (rc) {
		plans_free(f);
		return rc;
	}
	*out = f;
	return 0;
}

int plans_from_json(const char *buf, size_t len, struct plans_file **out, char *err)
{
	return from_json(buf, len, false, out, err);
}

int plans_summary_from_json(const char *buf, size_t len, struct plans_file **out, char *err)
{
	return from_json(buf, len, true, out, err);
}

int plans_summarize(struct plans_file *f)
{
	for (size_t j = 0; j < f->nranks; j++) {
		struct plans_rank *k = &f->ranks[j];

		if (plans_rank_signature(k, &k->sig))
			return -ENOMEM;
		k->has_sig = true;
		fmt_tensors_free(k->tensors, k->ntensors);
		k->tensors = NULL;
		k->ntensors = 0;
	}
	f->summary = true;
	return 0;
}

void plans_rank_clear(struct plans_rank *k)
{
	fmt_tensors_free(k->tensors, k->ntensors);
	*k = (struct plans_rank){0};
}

void plans_free(struct plans_file *f)
{
	if (!f)
		return;
	for (size_t i = 0; f->ranks && i < f->nranks; i++)
		plans_rank_clear(&f->ranks[i]);
	free(f->ranks);
	free(f->job);
	free(f->node);
	free(f->run);
	free(f);
}

/* ---- a run's roster ---------------------------------------------------- */

int roster_file_to_json(const struct roster_file *r, char **out, size_t *len, char *err)
{
	json_t *nodes = json_array(), *root;
	int rc;

	*out = NULL;
	*len = 0;
	for (size_t i = 0; nodes && i < r->nnodes; i++) {
		const struct plans_file *f = r->nodes[i];
		json_t *o;

		if (strlen(f->digest) != 16 || (i && strcmp(r->nodes[i - 1]->node, f->node) >= 0)) {
			json_decref(nodes);
			return ipc_errf(err, -EINVAL,
			                PL_PREFIX "a roster's nodes have digests, in name order");
		}
		o = json_pack("{s:s, s:s, s:b, s:o}", "node", f->node, "digest", f->digest,
		              "writes_once", f->writes_once, "ranks", summary_ranks_json(f));
		if (json_array_append_new(nodes, o)) {
			json_decref(nodes);
			nodes = NULL;
		}
	}
	root = json_pack("{s:s, s:i, s:s, s:s, s:i, s:o}", "format", ROSTER_FORMAT, "version",
	                 ROSTER_VERSION, "job", r->job, "run", r->run, "world", r->world, "nodes",
	                 nodes);
	if (!root || fmt_hex_put(root, "generation", r->generation)) {
		json_decref(root);
		return ipc_errf(err, -ENOMEM, PL_PREFIX "out of memory building the roster");
	}
	rc = fmt_dump(root, false, MANIFEST_MAX_BYTES, out, len, PL, err);
	json_decref(root);
	return rc;
}

/* Entry i of a roster: a node's summary, its ranks none that an entry before claims. */
static int parse_entry(struct roster_file *r, const json_t *o, size_t i, unsigned char *seen,
                       char *err)
{
	struct plans_file *f = calloc(1, sizeof(*f));
	char where[48];
	int rc;

	snprintf(where, sizeof(where), "nodes[%zu]", i);
	if (!f)
		return ipc_errf(err, -ENOMEM, PL_PREFIX "out of memory");
	r->nodes[r->nnodes++] = f;
	f->version = PLANS_SUMMARY_VERSION;
	f->world = r->world;
	if (!json_is_object(o))
		return ipc_errf(err, -EINVAL, PL_PREFIX "%s is not an object", where);
	if (!(f->job = strdup(r->job)) || !(f->run = strdup(r->run)))
		return ipc_errf(err, -ENOMEM, PL_PREFIX "out of memory");
	rc = fmt_name(o, "node", ipc_check_node, &f->node, PL, where, err);
	if (!rc)
		rc = parse_node(f, o, true, where, err);
	if (!rc && i && strcmp(r->nodes[i - 1]->node, f->node) >= 0)
		rc = ipc_errf(err, -EINVAL, PL_PREFIX "%s: node %s is out of order, or twice",
		              where, f->node);
	for (size_t j = 0; !rc && j < f->nranks; j++)
		if (seen[f->ranks[j].rank]++)
			rc = ipc_errf(err, -EINVAL, PL_PREFIX "%s: rank %d is claimed by two nodes",
			              where, f->ranks[j].rank);
	return rc;
}

static int roster_parse(struct roster_file *r, const json_t *root, char *err)
{
	const json_t *nodes = json_object_get(root, "nodes");
	unsigned char *seen;
	int64_t v = 0;
	int version, rc;

	rc = fmt_header(root, ROSTER_FORMAT, ROSTER_VERSION, &version, PL, err);
	if (!rc)
		rc = fmt_name(root, "job", ipc_check_job, &r->job, PL, "top level", err);
	if (!rc)
		rc = fmt_name(root, "run", ipc_check_run, &r->run, PL, "top level", err);
	if (!rc && !(rc = fmt_int(root, "world", 1, IPC_MAX_WORLD, &v, PL, "top level", err)))
		r->world = (int)v;
	if (!rc)
		rc = fmt_hex_read(root, "generation", &r->generation, PL, "top level", err);
	if (rc)
		return rc;
	if (!json_is_array(nodes) || json_array_size(nodes) > (size_t)r->world)
		return ipc_errf(err, -EINVAL,
		                PL_PREFIX "\"nodes\" is missing or longer than world %d", r->world);
	r->nodes = calloc(json_array_size(nodes) + 1, sizeof(*r->nodes));
	seen = calloc((size_t)r->world, 1);
	rc = r->nodes && seen ? 0 : ipc_errf(err, -ENOMEM, PL_PREFIX "out of memory");
	for (size_t i = 0; !rc && i < json_array_size(nodes); i++)
		rc = parse_entry(r, json_array_get(nodes, i), i, seen, err);
	free(seen);
	return rc;
}

int roster_file_from_json(const char *buf, size_t len, struct roster_file **out, char *err)
{
	struct roster_file *r;
	json_t *root;
	int rc;

	*out = NULL;
	rc = fmt_load(buf, len, MANIFEST_MAX_BYTES, &root, PL, err);
	if (rc)
		return rc;
	r = calloc(1, sizeof(*r));
	rc = r ? roster_parse(r, root, err) : ipc_errf(err, -ENOMEM, PL_PREFIX "out of memory");
	json_decref(root);
	if (rc) {
		roster_file_free(r);
		return rc;
	}
	*out = r;
	return 0;
}

void roster_file_clear(struct roster_file *r)
{
	for (size_t i = 0; i < r->nnodes; i++)
		plans_free(r->nodes[i]);
	free(r->nodes);
	free(r->job);
	free(r->run);
	*r = (struct roster_file){0};
}

void roster_file_free(struct roster_file *r)
{
	if (!r)
		return;
	roster_file_clear(r);
	free(r);
}
