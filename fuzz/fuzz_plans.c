/*
 * fuzz_plans: storage/format/plans.c's parser, plans_from_json, on the plans files
 * other nodes write to <root>/<job>/plans/<node>.json. What it accepts must
 * give each rank's tensors a signature (the agent compares it with the
 * parts'), write back (plans_to_json) and read back the same; and its
 * ranks go through the dedup assignment (layout/assign.c), which must
 * write every byte of every box (once with one copy) and nothing beyond a
 * tensor's rows. Each input is read as a plans summary too
 * (plans/<node>.sum, what every node reads of every other) and as a run's
 * roster (plans/<run>.roster, what rank 0's node writes for the others),
 * a node's share of the assignment (plans/<node>.share) and a run's set
 * mark (plans/<run>.set): one accepted must write back and read back the
 * same bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "layout/assign.h"
#include "storage/format/format.h"
#include "fuzz/fuzz.h"

static void assigned(const struct plans_file *f, unsigned copies)
{
	struct assign_input *in = calloc(f->nranks ? f->nranks : 1, sizeof(*in));
	struct assignment *a = NULL;
	char err[IPC_ERRLEN];

	FUZZ_CHECK(in != NULL, "out of memory");
	for (size_t i = 0; i < f->nranks; i++)
		in[i] = (struct assign_input){f->node, &f->ranks[i]};
	if (assign_compute(in, f->nranks, copies, &a, err) == 0) {
		FUZZ_CHECK(copies != 1 || a->written_bytes == a->unique_bytes,
		           "one copy: %llu bytes written for %llu unique",
		           (unsigned long long)a->written_bytes,
		           (unsigned long long)a->unique_bytes);
		FUZZ_CHECK(a->written_bytes >= a->unique_bytes, "a box not written");
		for (size_t i = 0; i < a->nranks; i++)
			for (size_t t = 0; t < a->r[i].ntensors; t++) {
				const struct assign_piece *p = &a->r[i].piece[t];
				const struct manifest_tensor *mt = &f->ranks[i].tensors[t];
				int64_t rows = mt->ndim ? mt->chunks[0].shape[0] : 1;

				FUZZ_CHECK(!p->writes || (p->row0 >= 0 && p->rows >= 0 &&
				                          p->row0 + p->rows <= rows),
				           "rank %d tensor '%s': rows %lld+%lld of %lld",
				           a->r[i].rank, mt->name, (long long)p->row0,
				           (long long)p->rows, (long long)rows);
			}
		assign_free(a);
	}
	free(in);
}

static void summary_roundtrip(const uint8_t *data, size_t size)
{
	char err[IPC_ERRLEN], *text = NULL, *again = NULL;
	struct plans_file *f = NULL, *f2 = NULL;
	size_t len = 0, len2 = 0;
	int rc;

	if (plans_summary_from_json((const char *)data, size, &f, err))
		return;
	FUZZ_CHECK(f->summary, "a summary read is not marked one");
	rc = plans_summary_to_json(f, &text, &len, err);
	FUZZ_CHECK(rc == 0, "a summary accepted, yet it cannot be written back: %s", err);
	rc = plans_summary_from_json(text, len, &f2, err);
	FUZZ_CHECK(rc == 0, "a summary written back is refused: %s\n%.*s", err, (int)len, text);
	rc = plans_summary_to_json(f2, &again, &len2, err);
	FUZZ_CHECK(rc == 0, "a summary read back cannot be written: %s", err);
	FUZZ_CHECK(len == len2 && memcmp(text, again, len) == 0,
	           "a summary written twice, not the same bytes");
	free(again);
	free(text);
	plans_free(f2);
	plans_free(f);
}

static void roster_roundtrip(const uint8_t *data, size_t size)
{
	char err[IPC_ERRLEN], *text = NULL, *again = NULL;
	struct roster_file *r = NULL, *r2 = NULL;
	size_t len = 0, len2 = 0;
	int rc;

	if (roster_file_from_json((const char *)data, size, &r, err))
		return;
	rc = roster_file_to_json(r, &text, &len, err);
	FUZZ_CHECK(rc == 0, "a roster accepted, yet it cannot be written back: %s", err);
	rc = roster_file_from_json(text, len, &r2, err);
	FUZZ_CHECK(rc == 0, "a roster written back is refused: %s\n%.*s", err, (int)len, text);
	rc = roster_file_to_json(r2, &again, &len2, err);
	FUZZ_CHECK(rc == 0, "a roster read back cannot be written: %s", err);
	FUZZ_CHECK(len == len2 && memcmp(text, again, len) == 0,
	           "a roster written twice, not the same bytes");
	free(again);
	free(text);
	roster_file_free(r2);
	roster_file_free(r);
}

static void share_roundtrip(const uint8_t *data, size_t size)
{
	char err[IPC_ERRLEN], *text = NULL, *again = NULL;
	struct plans_share *s = NULL, *s2 = NULL;
	struct set_mark *m = NULL, *m2 = NULL;
	size_t len = 0, len2 = 0;
	int rc;

	if (share_from_json((const char *)data, size, &s, err) == 0) {
		rc = share_to_json(s, &text, &len, err);
		FUZZ_CHECK(rc == 0, "a share accepted, yet it cannot be written back: %s", err);
		rc = share_from_json(text, len, &s2, err);
		FUZZ_CHECK(rc == 0, "a share written back is refused: %s", err);
		rc = share_to_json(s2, &again, &len2, err);
		FUZZ_CHECK(rc == 0 && len == len2 && memcmp(text, again, len) == 0,
		           "a share written twice, not the same bytes");
		free(again);
		free(text);
		share_free(s2);
		share_free(s);
	}
	if (set_mark_from_json((const char *)data, size, &m, err))
		return;
	rc = set_mark_to_json(m, &text, &len, err);
	FUZZ_CHECK(rc == 0, "a set mark accepted, yet it cannot be written back: %s", err);
	rc = set_mark_from_json(text, len, &m2, err);
	FUZZ_CHECK(rc == 0 && m2->set == m->set && m2->generation == m->generation &&
	               m2->writes_all == m->writes_all,
	           "a set mark written back is not the same");
	free(text);
	set_mark_free(m2);
	set_mark_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[IPC_ERRLEN], *text = NULL, *again = NULL;
	struct plans_file *f = NULL, *f2 = NULL;
	size_t len = 0, len2 = 0;
	uint64_t sig;
	int rc;

	summary_roundtrip(data, size);
	roster_roundtrip(data, size);
	share_roundtrip(data, size);
	if (plans_from_json((const char *)data, size, &f, err))
		return 0;
	for (size_t i = 0; i < f->nranks; i++)
		(void)tensors_signature(f->ranks[i].tensors, f->ranks[i].ntensors, &sig);
	assigned(f, 1);
	assigned(f, 2);
	rc = plans_to_json(f, &text, &len, err);
	FUZZ_CHECK(rc == 0, "accepted, yet it cannot be written back: %s", err);
	rc = plans_from_json(text, len, &f2, err);
	FUZZ_CHECK(rc == 0, "written back, it is refused: %s\n%.*s", err, (int)len, text);
	rc = plans_to_json(f2, &again, &len2, err);
	FUZZ_CHECK(rc == 0, "read back, it cannot be written: %s", err);
	FUZZ_CHECK(len == len2 && memcmp(text, again, len) == 0,
	           "written twice, not the same bytes");
	FUZZ_CHECK(strcmp(f->digest, f2->digest) == 0, "the same plans, two digests");
	free(again);
	free(text);
	plans_free(f2);
	plans_free(f);
	return 0;
}
