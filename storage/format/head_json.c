/*
 * head_json.c: the JSON of format 4, the head of a checkpoint of several
 * nodes (head.c merges and assembles it; docs/DESIGN.md §6.3), both ways,
 * and the "parts" array every manifest of format 2 and later has.
 * manifest.c calls it for version 4; it calls only fmt.c. Pure functions;
 * any thread; what is parsed is hostile input.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/format/fmt.h"

#define MF "manifest"
#define MF_PREFIX "manifest: "
/* Above this many parts the head is written compact. */
#define HEAD_INDENT_MAX_PARTS 64u

json_t *fmt_parts_json(const struct manifest *m)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < m->nparts; i++) {
		const struct manifest_part *p = &m->parts[i];
		json_t *ranks = json_array();

		for (size_t j = 0; ranks && j < p->nranks; j++)
			if (json_array_append_new(ranks, json_integer(p->ranks[j]))) {
				json_decref(ranks);
				ranks = NULL;
			}
		json_t *o = json_pack("{s:s, s:o}", "node", p->node, "ranks", ranks);
		char sum[17];

		snprintf(sum, sizeof(sum), "%016" PRIx64, p->xxh3);
		if (o && m->version == MANIFEST_VERSION_HEAD &&
		    (json_object_set_new(o, "bytes", json_integer((json_int_t)p->size)) ||
		     json_object_set_new(o, "xxh3", json_string(sum)))) {
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

int head_json(const struct manifest *m, json_t *meta, char **out, size_t *len, char *err)
{
	size_t tensors = m->head_only ? m->head_tensors : m->ntensors;
	char when[64];
	json_t *root;
	int rc;

	fmt_time(m->time_unix_ns, when, sizeof(when));
	root = json_pack("{s:s, s:i, s:s, s:s, s:I, s:i, s:s, s:I, s:o, s:I, "
	                 "s:{s:f, s:f, s:f}, s:I, s:o}",
	                 "format", MANIFEST_FORMAT, "version", MANIFEST_VERSION_HEAD, "job", m->job,
	                 "run", m->run, "step", (json_int_t)m->step, "world", m->world, "time",
	                 when, "time_unix_ns", (json_int_t)m->time_unix_ns, "meta", meta, "bytes",
	                 (json_int_t)m->bytes, "durations", "capture_seconds", m->capture_seconds,
	                 "durable_seconds", m->durable_seconds, "commit_seconds", m->commit_seconds,
	                 "tensors", (json_int_t)tensors, "parts", fmt_parts_json(m));
	if (!root)
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory building the JSON");
	rc = fmt_meta_put(root, m->meta_json, MF, err);
	if (!rc)
		rc = fmt_dump(root, m->nparts <= HEAD_INDENT_MAX_PARTS, MANIFEST_MAX_BYTES, out,
		              len, MF, err);
	json_decref(root);
	return rc;
}

static int parse_sum(const json_t *o, const char *where, uint64_t *out, char *err)
{
	const char *s;
	char *end;
	int rc = fmt_str(o, "xxh3", &s, MF, where, err);

	if (rc)
		return rc;
	if (strlen(s) != 16 || s[strspn(s, "0123456789abcdef")])
		return ipc_errf(err, -EINVAL,
		                MF_PREFIX "%s: \"xxh3\" is not 16 lowercase hex digits", where);
	*out = strtoull(s, &end, 16);
	return 0;
}

static int parse_head_part(struct manifest *m, const json_t *o, size_t i, char *err)
{
	const json_t *ranks = json_object_get(o, "ranks");
	struct manifest_part *p = &m->parts[m->nparts++];
	int64_t size = 0;
	char where[32];
	int rc;

	snprintf(where, sizeof(where), "parts[%zu]", i);
	rc = fmt_name(o, "node", ipc_check_node, &p->node, MF, where, err);
	if (!rc)
		rc = fmt_int(o, "bytes", 1, PART_MAX_BYTES, &size, MF, where, err);
	if (!rc)
		rc = parse_sum(o, where, &p->xxh3, err);
	if (rc)
		return rc;
	p->size = (uint64_t)size;
	if (!json_is_array(ranks) || json_array_size(ranks) > (size_t)m->world)
		return ipc_errf(err, -EINVAL,
		                MF_PREFIX "%s: \"ranks\" is not an array of at most world ranks",
		                where);
	if (!(p->ranks = calloc(json_array_size(ranks) + 1, sizeof(*p->ranks))))
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory");
	for (size_t j = 0; j < json_array_size(ranks); j++) {
		const json_t *v = json_array_get(ranks, j);

		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= m->world)
			return ipc_errf(err, -EINVAL,
			                MF_PREFIX "%s: ranks[%zu] is not a rank of world %d", where,
			                j, m->world);
		p->ranks[p->nranks++] = (int)json_integer_value(v);
	}
	return 0; /* order, duplicates, coverage: manifest_check */
}

int head_parse(struct manifest *m, const json_t *root, char *err)
{
	const json_t *a = json_object_get(root, "parts");
	int64_t v = 0;
	int rc;

	m->head_only = true;
	rc = fmt_int(root, "tensors", 0, INT64_MAX, &v, MF, "top level", err);
	if (rc)
		return rc;
	m->head_tensors = (size_t)v;
	if (!json_is_array(a) || json_array_size(a) < 1 || json_array_size(a) > (size_t)m->world)
		return ipc_errf(err, -EINVAL,
		                MF_PREFIX "\"parts\" is missing, empty, not an array or longer "
		                          "than world");
	if (!(m->parts = calloc(json_array_size(a), sizeof(*m->parts))))
		return ipc_errf(err, -ENOMEM, MF_PREFIX "out of memory");
	for (size_t i = 0; i < json_array_size(a); i++)
		if ((rc = parse_head_part(m, json_array_get(a, i), i, err)))
			return rc;
	return 0;
}
