/*
 * head.c: the manifest of a checkpoint of several nodes, format 4
 * (docs/DESIGN.md §6.3): its head names each node's part by its length and
 * XXH3-64 and says what a list needs; the ranks' files and the tensors stay
 * in the parts, which every node has written and the committer checked.
 * Its size grows with the nodes alone, so the commit and every watching
 * node read and write little however many ranks and tensors a job has.
 *
 * Here: the tensors of a commit's parts counted and checked as the parts
 * come in (names), the head merged from the parts (manifest_merge_head),
 * the whole manifest assembled from a head and the parts it names
 * (manifest_assemble, manifest_assemble_some); the head's JSON is
 * head_json.c's. Pure functions; any thread; one names table belongs to
 * one caller at a time.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "storage/format/fmt.h"

#define MF "manifest"
#define MF_PREFIX "manifest: "

/* ---- the tensors of many parts, one part at a time --------------------- */

struct name_slot {
	char *name; /* NULL: free */
	uint64_t hash;
	int dtype, rank;
	size_t ndim;
	bool sharded;
	int64_t global_shape[IPC_MAX_NDIM];
};

struct names {
	struct name_slot *v;
	size_t cap, n; /* cap: a power of two */
};

int names_create(struct names **out)
{
	struct names *t = calloc(1, sizeof(*t));

	*out = NULL;
	if (!t || !(t->v = calloc(1024, sizeof(*t->v)))) {
		free(t);
		return -ENOMEM;
	}
	t->cap = 1024;
	*out = t;
	return 0;
}

void names_free(struct names *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->cap; i++)
		free(t->v[i].name);
	free(t->v);
	free(t);
}

size_t names_count(const struct names *t)
{
	return t ? t->n : 0;
}

static struct name_slot *slot_of(struct name_slot *v, size_t cap, const char *name, uint64_t h)
{
	size_t i = (size_t)h & (cap - 1);

	while (v[i].name && (v[i].hash != h || strcmp(v[i].name, name) != 0))
		i = (i + 1) & (cap - 1);
	return &v[i];
}

static int grow(struct names *t)
{
	size_t cap = t->cap * 2;
	struct name_slot *v = calloc(cap, sizeof(*v));

	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < t->cap; i++)
		if (t->v[i].name)
			*slot_of(v, cap, t->v[i].name, t->v[i].hash) = t->v[i];
	free(t->v);
	t->v = v;
	t->cap = cap;
	return 0;
}

/* What manifest_merge says of one name on two ranks, as each tensor comes. */
static int name_add(struct names *t, const struct manifest_tensor *x, int rank, char *err)
{
	uint64_t h = XXH3_64bits(x->name, strlen(x->name));
	struct name_slot *s;
	bool same;

	if (t->n * 2 >= t->cap && grow(t))
		return ipc_errf(err, -ENOMEM, "merge: out of memory for %zu tensors", t->n);
	s = slot_of(t->v, t->cap, x->name, h);
	if (!s->name) {
		if (!(s->name = strdup(x->name)))
			return ipc_errf(err, -ENOMEM, "merge: out of memory");
		s->hash = h;
		s->dtype = x->dtype;
		s->rank = rank;
		s->ndim = x->ndim;
		s->sharded = x->sharded;
		memcpy(s->global_shape, x->global_shape, sizeof(s->global_shape));
		t->n++;
		return 0;
	}
	same = s->dtype == x->dtype && s->ndim == x->ndim &&
	       memcmp(s->global_shape, x->global_shape, x->ndim * sizeof(int64_t)) == 0;
	if (same && s->rank == rank && s->sharded == x->sharded)
		return 0; /* this rank's, seen before (its plans, then its part) */
	if (!s->sharded || !x->sharded || !same)
		return ipc_errf(err, -EINVAL,
		                "tensor '%s' is saved by ranks %d and %d, not as chunks of one "
		                "sharded tensor",
		                x->name, s->rank < rank ? s->rank : rank,
		                s->rank < rank ? rank : s->rank);
	return 0;
}

int names_add_tensors(struct names *t, const struct manifest_tensor *v, size_t n, int rank,
                      char *err)
{
	for (size_t k = 0; k < n; k++) {
		int rc = name_add(t, &v[k], rank, err);

		if (rc)
			return rc;
	}
	return 0;
}

int names_add(struct names *t, const struct part *p, char *err)
{
	for (size_t j = 0; j < p->nranks; j++) {
		int rc = names_add_tensors(t, p->ranks[j].tensors, p->ranks[j].ntensors,
		                           p->ranks[j].rank, err);

		if (rc)
			return rc;
	}
	return 0;
}

int names_copy(const struct names *t, struct names **out)
{
	struct names *c = calloc(1, sizeof(*c));

	*out = NULL;
	if (!c || !(c->v = calloc(t->cap, sizeof(*c->v)))) {
		free(c);
		return -ENOMEM;
	}
	c->cap = t->cap;
	c->n = t->n;
	for (size_t i = 0; i < t->cap; i++) {
		c->v[i] = t->v[i];
		if (t->v[i].name && !(c->v[i].name = strdup(t->v[i].name))) {
			names_free(c);
			return -ENOMEM;
		}
	}
	*out = c;
	return 0;
}

/* ---- the head of parts -------------------------------------------------- */

static int cmp_part(const void *x, const void *y)
{
	return strcmp((*(struct part *const *)x)->node, (*(struct part *const *)y)->node);
}

static int head_part(struct manifest_part *mp, const struct part *p, char *err)
{
	if (!p->file_size)
		return ipc_errf(err, -EINVAL, "merge: the part of node %s was not read back",
		                p->node);
	mp->node = strdup(p->node);
	mp->ranks = calloc(p->nranks + 1, sizeof(int));
	if (!mp->node || !mp->ranks)
		return ipc_errf(err, -ENOMEM, "merge: out of memory");
	for (size_t j = 0; j < p->nranks; j++)
		mp->ranks[mp->nranks++] = p->ranks[j].rank;
	mp->size = p->file_size;
	mp->xxh3 = p->file_xxh3;
	return 0;
}

int manifest_merge_head(struct part *const *parts, size_t n, size_t tensors, struct manifest **out,
                        char *err)
{
	struct part **v = NULL;
	struct manifest *m = NULL;
	int rc;

	*out = NULL;
	if (n < 1 || !parts)
		return ipc_errf(err, -EINVAL, "merge: no parts");
	v = malloc(n * sizeof(*v));
	m = calloc(1, sizeof(*m));
	if (!v || !m || !(m->parts = calloc(n, sizeof(*m->parts)))) {
		rc = ipc_errf(err, -ENOMEM, "merge: out of memory");
		goto out;
	}
	memcpy(v, parts, n * sizeof(*v));
	qsort(v, n, sizeof(*v), cmp_part);
	rc = merge_check_set(v, n, err);
	if (rc)
		goto out;
	m->version = MANIFEST_VERSION_HEAD;
	m->head_only = true;
	m->head_tensors = tensors;
	m->step = v[0]->step;
	m->world = v[0]->world;
	if (!(m->job = strdup(v[0]->job)) || !(m->run = strdup(v[0]->run))) {
		rc = ipc_errf(err, -ENOMEM, "merge: out of memory");
		goto out;
	}
	for (size_t i = 0; i < n && !rc; i++)
		if (!(rc = head_part(&m->parts[m->nparts], v[i], err)))
			m->nparts++;
	if (!rc)
		rc = merge_summary(m, v, n, err);
	if (!rc)
		rc = manifest_check(m, err);
out:
	free(v);
	if (rc)
		manifest_free(m);
	else
		*out = m;
	return rc;
}

/* ---- a head and its parts, whole --------------------------------------- */

/* The part named parts[i] of the head is the one read: its node, length and sum. */
static int part_is_named(const struct manifest_part *mp, const struct part *p, char *err)
{
	if (strcmp(mp->node, p->node) != 0)
		return ipc_errf(err, -EINVAL, MF_PREFIX "the part of node %s came for node %s",
		                p->node, mp->node);
	if (p->file_size != mp->size || p->file_xxh3 != mp->xxh3)
		return ipc_errf(err, -EBADMSG,
		                MF_PREFIX
		                "parts/%s.json is not the part the manifest names (%" PRIu64
		                " bytes, XXH3 %016" PRIx64 "; it names %" PRIu64
		                " bytes, %016" PRIx64 "): replaced or damaged since the commit",
		                p->node, p->file_size, p->file_xxh3, mp->size, mp->xxh3);
	return 0;
}

/* The whole says what the head says. */
static int same_as_head(const struct manifest *h, const struct manifest *m, char *err)
{
	const char *meta_h = h->meta_json ? h->meta_json : "";
	const char *meta_m = m->meta_json ? m->meta_json : "";

	if (strcmp(h->run, m->run) || h->world != m->world || h->bytes != m->bytes ||
	    h->time_unix_ns != m->time_unix_ns || strcmp(meta_h, meta_m) ||
	    h->head_tensors != m->ntensors)
		return ipc_errf(err, -EBADMSG,
		                MF_PREFIX "its parts do not say what it says (run %s, world %d, "
		                          "%" PRIu64
		                          " bytes, %zu tensors; the parts: run %s, world "
		                          "%d, %" PRIu64 " bytes, %zu tensors)",
		                h->run, h->world, h->bytes, h->head_tensors, m->run, m->world,
		                m->bytes, m->ntensors);
	return 0;
}

int manifest_assemble(const struct manifest *head, struct part *const *parts, size_t n,
                      struct manifest **out, char *err)
{
	struct manifest *m = NULL;
	int rc;

	*out = NULL;
	if (n != head->nparts)
		return ipc_errf(err, -EINVAL, MF_PREFIX "%zu parts for a head of %zu", n,
		                head->nparts);
	for (size_t i = 0; i < n; i++)
		if ((rc = part_is_named(&head->parts[i], parts[i], err)))
			return rc;
	rc = manifest_merge(parts, n, &m, err);
	if (rc)
		return rc == -ENOMEM ? rc : -EBADMSG; /* err says why */
	rc = same_as_head(head, m, err);
	if (rc) {
		manifest_free(m);
		return rc;
	}
	for (size_t i = 0; i < n; i++) { /* sorted by node, as the head's */
		m->parts[i].size = head->parts[i].size;
		m->parts[i].xxh3 = head->parts[i].xxh3;
	}
	m->version = MANIFEST_VERSION_HEAD;
	*out = m;
	return 0;
}

int manifest_assemble_some(const struct manifest *head, const size_t *parts_of,
                           struct part *const *parts, size_t n, struct manifest **out, char *err)
{
	struct manifest *m = NULL;
	int rc;

	*out = NULL;
	for (size_t i = 0; i < n; i++)
		if (parts_of[i] >= head->nparts ||
		    (rc = part_is_named(&head->parts[parts_of[i]], parts[i], err)))
			return parts_of[i] >= head->nparts ? -EINVAL : rc;
	rc = manifest_merge_some(parts, n, &m, err);
	if (rc)
		return rc == -ENOMEM ? rc : -EBADMSG; /* err says why */
	if (strcmp(m->run, head->run) || m->world != head->world) {
		manifest_free(m);
		return ipc_errf(err, -EBADMSG,
		                MF_PREFIX "a part of another run or world than the head's (%s, %d)",
		                head->run, head->world);
	}
	/* what the head says of the whole */
	free(m->meta_json);
	m->meta_json = head->meta_json ? strdup(head->meta_json) : NULL;
	if (head->meta_json && !m->meta_json) {
		manifest_free(m);
		return ipc_errf(err, -ENOMEM, "out of memory");
	}
	m->bytes = head->bytes;
	m->time_unix_ns = head->time_unix_ns;
	m->capture_seconds = head->capture_seconds;
	m->durable_seconds = head->durable_seconds;
	m->commit_seconds = head->commit_seconds;
	m->head_tensors = head->head_tensors;
	m->version = MANIFEST_VERSION_HEAD;
	*out = m;
	return 0;
}
