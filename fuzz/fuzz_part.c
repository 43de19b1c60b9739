/*
 * fuzz_part: storage/format/part.c's parser, part_from_json, on what other nodes
 * write to <root>/<job>/step-<step>/parts/<node>.json, and the merge of
 * parts into a manifest (manifest_merge) that any agent of the job may run.
 *
 * One input holds up to four parts, separated by NUL bytes (JSON has none).
 * Each part accepted must write back and read back the same, give each
 * rank's tensors a signature; the parts that parse are merged, and a merged
 * manifest must pass manifest_check, write, and read back; whether its
 * chunks cover every box its ranks hold (cover_check) must come back.
 * Each input is read as a part's summary too (parts/<node>.sum, what a
 * committer reads): one accepted must write back and read back the same
 * bytes, and the summaries that parse make a head (manifest_merge_head)
 * that passes manifest_check, writes and reads back.
 */
#include <string.h>

#include "layout/cover.h"
#include "storage/format/format.h"
#include "fuzz/fuzz.h"

#define MAX_PARTS 4

static void roundtrip(const struct part *p)
{
	char err[IPC_ERRLEN], *text = NULL, *again = NULL;
	struct part *p2 = NULL;
	size_t len = 0, len2 = 0;
	uint64_t sig;
	int rc;

	for (size_t i = 0; i < p->nranks; i++)
		(void)part_rank_signature(&p->ranks[i], &sig);
	rc = part_to_json(p, &text, &len, err);
	FUZZ_CHECK(rc == 0, "accepted, yet it cannot be written back: %s", err);
	rc = part_from_json(text, len, &p2, err);
	FUZZ_CHECK(rc == 0, "written back, it is refused: %s\n%.*s", err, (int)len, text);
	rc = part_to_json(p2, &again, &len2, err);
	FUZZ_CHECK(rc == 0, "read back, it cannot be written: %s", err);
	FUZZ_CHECK(len == len2 && memcmp(text, again, len) == 0,
	           "written twice, not the same bytes");
	free(again);
	free(text);
	part_free(p2);
}

static void merged(struct part *const *v, size_t n)
{
	char err[IPC_ERRLEN], *text = NULL;
	struct manifest *m = NULL, *m2 = NULL;
	size_t len = 0;
	int rc;

	if (manifest_merge(v, n, &m, err))
		return;
	rc = manifest_check(m, err);
	FUZZ_CHECK(rc == 0, "merged, yet manifest_check refuses it: %s", err);
	(void)cover_check(m, err); /* what the commit does next: a hole or not, no crash */
	rc = manifest_to_json(m, &text, &len, err);
	FUZZ_CHECK(rc == 0, "merged, yet it cannot be written: %s", err);
	rc = manifest_from_json(text, len, &m2, err);
	FUZZ_CHECK(rc == 0, "merged and written, it is refused: %s\n%.*s", err, (int)len, text);
	free(text);
	manifest_free(m2);
	manifest_free(m);
}

static void summary_roundtrip(const struct part *p)
{
	char err[IPC_ERRLEN], *text = NULL, *again = NULL;
	struct part *p2 = NULL;
	size_t len = 0, len2 = 0;
	int rc;

	rc = part_summary_to_json(p, &text, &len, err);
	FUZZ_CHECK(rc == 0, "a summary accepted, yet it cannot be written back: %s", err);
	rc = part_summary_from_json(text, len, &p2, err);
	FUZZ_CHECK(rc == 0, "a summary written back is refused: %s\n%.*s", err, (int)len, text);
	rc = part_summary_to_json(p2, &again, &len2, err);
	FUZZ_CHECK(rc == 0, "a summary read back cannot be written: %s", err);
	FUZZ_CHECK(len == len2 && memcmp(text, again, len) == 0,
	           "a summary written twice, not the same bytes");
	free(again);
	free(text);
	part_free(p2);
}

/* What a committer makes of summaries: a head, which must be one. */
static void headed(struct part *const *v, size_t n)
{
	char err[IPC_ERRLEN], *text = NULL;
	struct manifest *m = NULL, *m2 = NULL;
	size_t len = 0;
	int rc;

	if (manifest_merge_head(v, n, 1, &m, err))
		return;
	rc = manifest_check(m, err);
	FUZZ_CHECK(rc == 0, "a head merged, yet manifest_check refuses it: %s", err);
	rc = manifest_to_json(m, &text, &len, err);
	FUZZ_CHECK(rc == 0, "a head merged, yet it cannot be written: %s", err);
	rc = manifest_from_json(text, len, &m2, err);
	FUZZ_CHECK(rc == 0, "a head written is refused: %s\n%.*s", err, (int)len, text);
	FUZZ_CHECK(m2->head_only && m2->nparts == m->nparts, "a head read back is not the head");
	free(text);
	manifest_free(m2);
	manifest_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct part *v[MAX_PARTS], *sums[MAX_PARTS];
	const char *p = (const char *)data, *end = p + size;
	char err[IPC_ERRLEN];
	size_t n = 0, ns = 0;

	while (n < MAX_PARTS && ns < MAX_PARTS && p <= end) {
		const char *nul = memchr(p, '\0', (size_t)(end - p));
		size_t len = (size_t)((nul ? nul : end) - p);

		if (part_from_json(p, len, &v[n], err) == 0)
			roundtrip(v[n++]);
		if (part_summary_from_json(p, len, &sums[ns], err) == 0)
			summary_roundtrip(sums[ns++]);
		if (!nul)
			break;
		p = nul + 1;
	}
	if (n)
		merged(v, n);
	if (ns)
		headed(sums, ns);
	while (n)
		part_free(v[--n]);
	while (ns)
		part_free(sums[--ns]);
	return 0;
}
