/*
 * share.c: a node's share of a run's dedup assignment (docs/DESIGN.md
 * §6.5), <root>/<job>/plans/<node>.share, written by the node of rank 0
 * for every node of the run: each rank's signature and the tensors it does
 * not write whole (format.h, struct plans_share); and the run's set mark,
 * <root>/<job>/plans/<run>.set, which says for which plans generation the
 * shares are of the set as it is (struct set_mark).
 *
 * The file is another node's: every field is checked and bounded here, and
 * the cuts against the rank's live plan where it is used (layout/assign.c).
 * Pure functions; any thread.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/format/fmt.h"

#define SH "share"
#define SH_PREFIX "share: "

/* ---- writing ----------------------------------------------------------- */

static json_t *cuts_json(const struct share_rank *k)
{
	json_t *v = json_array();

	for (size_t i = 0; v && i < k->ncuts; i++) {
		const struct share_cut *c = &k->cuts[i];

		if (json_array_append_new(v, json_pack("[I, I, I]", (json_int_t)c->tensor,
		                                       (json_int_t)c->row0, (json_int_t)c->rows))) {
			json_decref(v);
			return NULL;
		}
	}
	return v;
}

static json_t *rank_json(const struct share_rank *k)
{
	json_t *o = json_pack("{s:i, s:I}", "rank", k->rank, "tensors", (json_int_t)k->ntensors);

	if (o && (fmt_hex_put(o, "sig", k->sig) ||
	          (k->ncuts && json_object_set_new(o, "cuts", cuts_json(k))))) {
		json_decref(o);
		return NULL;
	}
	return o;
}

int share_to_json(const struct plans_share *s, char **out, size_t *len, char *err)
{
	json_t *ranks = json_array(), *root;
	int rc;

	*out = NULL;
	*len = 0;
	for (size_t i = 0; ranks && i < s->nranks; i++)
		if (json_array_append_new(ranks, rank_json(&s->ranks[i]))) {
			json_decref(ranks);
			ranks = NULL;
		}
	root = json_pack("{s:s, s:i, s:s, s:s, s:s, s:i, s:o}", "format", SHARE_FORMAT, "version",
	                 SHARE_VERSION, "job", s->job, "node", s->node, "run", s->run, "world",
	                 s->world, "ranks", ranks);
	if (!root || fmt_hex_put(root, "set", s->set)) {
		json_decref(root);
		return ipc_errf(err, -ENOMEM, SH_PREFIX "out of memory building a share");
	}
	rc = fmt_dump(root, false, MANIFEST_MAX_BYTES, out, len, SH, err);
	json_decref(root);
	return rc;
}

/* ---- reading ----------------------------------------------------------- */

static int parse_cut(const json_t *o, const struct share_rank *k, struct share_cut *c, char *err)
{
	const size_t i = k->ncuts;
	json_int_t v[3];

	if (!json_is_array(o) || json_array_size(o) != 3)
		return ipc_errf(err, -EINVAL,
		                SH_PREFIX "rank %d: cut %zu is not [tensor, row0, rows]", k->rank,
		                i);
	for (size_t j = 0; j < 3; j++) {
		if (!json_is_integer(json_array_get(o, j)) ||
		    (v[j] = json_integer_value(json_array_get(o, j))) < 0)
			return ipc_errf(err, -EINVAL,
			                SH_PREFIX "rank %d: cut %zu holds what is not a count",
			                k->rank, i);
	}
	if ((uint64_t)v[0] >= k->ntensors || (i && (size_t)v[0] <= k->cuts[i - 1].tensor))
		return ipc_errf(err, -EINVAL,
		                SH_PREFIX "rank %d: cut %zu names tensor %lld, out of order or not "
		                          "of its %zu",
		                k->rank, i, (long long)v[0], k->ntensors);
	if (v[1] > INT64_MAX - v[2])
		return ipc_errf(err, -EINVAL, SH_PREFIX "rank %d: cut %zu ends past any row",
		                k->rank, i);
	*c = (struct share_cut){(size_t)v[0], v[1], v[2]};
	return 0;
}

static int parse_rank(const json_t *o, size_t i, const struct plans_share *s, struct share_rank *k,
                      char *err)
{
	const json_t *cuts = json_object_get(o, "cuts");
	char where[32];
	int64_t v = 0;
	int rc;

	snprintf(where, sizeof(where), "ranks[%zu]", i);
	if (!json_is_object(o))
		return ipc_errf(err, -EINVAL, SH_PREFIX "%s is not an object", where);
	rc = fmt_int(o, "rank", 0, s->world - 1, &v, SH, where, err);
	if (rc)
		return rc;
	k->rank = (int)v;
	if (i && k->rank <= s->ranks[i - 1].rank)
		return ipc_errf(err, -EINVAL, SH_PREFIX "rank %d is listed twice or out of order",
		                k->rank);
	if ((rc = fmt_int(o, "tensors", 0, IPC_MAX_TENSORS, &v, SH, where, err)) ||
	    (rc = fmt_hex_read(o, "sig", &k->sig, SH, where, err)))
		return rc;
	k->ntensors = (size_t)v;
	if (!cuts)
		return 0;
	if (!json_is_array(cuts) || json_array_size(cuts) > k->ntensors)
		return ipc_errf(err, -EINVAL,
		                SH_PREFIX "%s: \"cuts\" is not an array of at most its %zu tensors",
		                where, k->ntensors);
	k->cuts = calloc(json_array_size(cuts) + 1, sizeof(*k->cuts));
	if (!k->cuts)
		return ipc_errf(err, -ENOMEM, SH_PREFIX "out of memory");
	for (size_t j = 0; j < json_array_size(cuts); j++) {
		rc = parse_cut(json_array_get(cuts, j), k, &k->cuts[j], err);
		if (rc)
			return rc;
		k->ncuts++;
	}
	return 0;
}

static int parse_root(struct plans_share *s, const json_t *root, char *err)
{
	const json_t *ranks = json_object_get(root, "ranks");
	int64_t v = 0;
	int version, rc;

	rc = fmt_header(root, SHARE_FORMAT, SHARE_VERSION, &version, SH, err);
	if (!rc)
		rc = fmt_name(root, "job", ipc_check_job, &s->job, SH, "top level", err);
	if (!rc)
		rc = fmt_name(root, "node", ipc_check_node, &s->node, SH, "top level", err);
	if (!rc)
		rc = fmt_name(root, "run", ipc_check_run, &s->run, SH, "top level", err);
	if (!rc && !(rc = fmt_int(root, "world", 1, IPC_MAX_WORLD, &v, SH, "top level", err)))
		s->world = (int)v;
	if (!rc)
		rc = fmt_hex_read(root, "set", &s->set, SH, "top level", err);
	if (!rc && s->set == 0)
		rc = ipc_errf(err, -EINVAL, SH_PREFIX "its plan set is 0, which names none");
	if (rc)
		return rc;
	if (!json_is_array(ranks) || json_array_size(ranks) > (size_t)s->world)
		return ipc_errf(err, -EINVAL,
		                SH_PREFIX "\"ranks\" is missing or longer than world %d", s->world);
	s->ranks = calloc(json_array_size(ranks) + 1, sizeof(*s->ranks));
	if (!s->ranks)
		return ipc_errf(err, -ENOMEM, SH_PREFIX "out of memory");
	for (size_t i = 0; i < json_array_size(ranks); i++) {
		rc = parse_rank(json_array_get(ranks, i), i, s, &s->ranks[i], err);
		s->nranks = i + 1; /* freed with s, half made */
		if (rc)
			return rc;
	}
	return 0;
}

int share_from_json(const char *buf, size_t len, struct plans_share **out, char *err)
{
	struct plans_share *s;
	json_t *root;
	int rc;

	*out = NULL;
	rc = fmt_load(buf, len, MANIFEST_MAX_BYTES, &root, SH, err);
	if (rc)
		return rc;
	s = calloc(1, sizeof(*s));
	rc = s ? parse_root(s, root, err) : ipc_errf(err, -ENOMEM, SH_PREFIX "out of memory");
	json_decref(root);
	if (rc) {
		share_free(s);
		return rc;
	}
	*out = s;
	return 0;
}

void share_free(struct plans_share *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->nranks; i++)
		free(s->ranks[i].cuts);
	free(s->ranks);
	free(s->job);
	free(s->node);
	free(s->run);
	free(s);
}

/* ---- a run's set mark -------------------------------------------------- */

int set_mark_to_json(const struct set_mark *m, char **out, size_t *len, char *err)
{
	json_t *root;
	int rc;

	*out = NULL;
	*len = 0;
	root = json_pack("{s:s, s:i, s:s, s:s, s:i, s:b}", "format", SET_MARK_FORMAT, "version",
	                 SET_MARK_VERSION, "job", m->job, "run", m->run, "world", m->world,
	                 "writes_all", m->writes_all);
	if (!root || fmt_hex_put(root, "set", m->set) ||
	    fmt_hex_put(root, "generation", m->generation)) {
		json_decref(root);
		return ipc_errf(err, -ENOMEM, SH_PREFIX "out of memory building a set mark");
	}
	rc = fmt_dump(root, false, MANIFEST_MAX_BYTES, out, len, SH, err);
	json_decref(root);
	return rc;
}

static int mark_parse(struct set_mark *m, const json_t *root, char *err)
{
	const json_t *all = json_object_get(root, "writes_all");
	int64_t v = 0;
	int version, rc;

	rc = fmt_header(root, SET_MARK_FORMAT, SET_MARK_VERSION, &version, SH, err);
	if (!rc)
		rc = fmt_name(root, "job", ipc_check_job, &m->job, SH, "top level", err);
	if (!rc)
		rc = fmt_name(root, "run", ipc_check_run, &m->run, SH, "top level", err);
	if (!rc && !(rc = fmt_int(root, "world", 1, IPC_MAX_WORLD, &v, SH, "top level", err)))
		m->world = (int)v;
	if (!rc)
		rc = fmt_hex_read(root, "set", &m->set, SH, "top level", err);
	if (!rc)
		rc = fmt_hex_read(root, "generation", &m->generation, SH, "top level", err);
	if (!rc && !m->generation)
		rc = ipc_errf(err, -EINVAL, SH_PREFIX "a set mark's generation is not 0");
	if (!rc && !json_is_boolean(all))
		rc = ipc_errf(err, -EINVAL, SH_PREFIX "\"writes_all\" is not true or false");
	m->writes_all = json_is_true(all);
	return rc;
}

int set_mark_from_json(const char *buf, size_t len, struct set_mark **out, char *err)
{
	struct set_mark *m;
	json_t *root;
	int rc;

	*out = NULL;
	rc = fmt_load(buf, len, 4096, &root, SH, err);
	if (rc)
		return rc;
	m = calloc(1, sizeof(*m));
	rc = m ? mark_parse(m, root, err) : ipc_errf(err, -ENOMEM, SH_PREFIX "out of memory");
	json_decref(root);
	if (rc) {
		set_mark_free(m);
		return rc;
	}
	*out = m;
	return 0;
}

void set_mark_free(struct set_mark *m)
{
	if (!m)
		return;
	free(m->job);
	free(m->run);
	free(m);
}
