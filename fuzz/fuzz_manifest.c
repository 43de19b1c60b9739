/*
 * fuzz_manifest: storage/format/manifest.c's parser, manifest_from_json, on bytes
 * as another node (or a damaged disk) may leave them in
 * <root>/<job>/step-<step>/manifest.json. What it accepts must also serve
 * the lookups restore and verify make, write back (manifest_to_json), and
 * read back the same: the same bytes from the second writing on.
 */
#include <string.h>

#include "storage/format/format.h"
#include "fuzz/fuzz.h"

static void lookups(const struct manifest *m)
{
	for (size_t i = 0; i < m->ntensors; i++) {
		const struct manifest_tensor *t = &m->tensors[i];

		FUZZ_CHECK(manifest_find(m, t->name) == t, "tensor '%s' not found by name",
		           t->name);
		for (size_t j = 0; j < t->nchunks; j++) {
			const struct manifest_chunk *c = &t->chunks[j];

			FUZZ_CHECK(
			    manifest_find_chunk(t, c->rank, t->sharded ? c->global_offset : NULL),
			    "tensor '%s': rank %d's chunk not found", t->name, c->rank);
		}
	}
	for (int r = 0; r < m->world; r++) {
		(void)manifest_rank_meta(m, r);
		(void)manifest_node_of(m, r);
	}
	FUZZ_CHECK(manifest_find(m, "") == NULL, "a tensor with no name");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[IPC_ERRLEN], *text = NULL, *again = NULL;
	struct manifest *m = NULL, *m2 = NULL;
	size_t len = 0, len2 = 0;
	int rc;

	if (manifest_from_json((const char *)data, size, &m, err))
		return 0;
	lookups(m);
	rc = manifest_check(m, err);
	FUZZ_CHECK(rc == 0, "accepted, yet manifest_check refuses it: %s", err);
	rc = manifest_to_json(m, &text, &len, err);
	FUZZ_CHECK(rc == 0, "accepted, yet it cannot be written back: %s", err);
	rc = manifest_from_json(text, len, &m2, err);
	FUZZ_CHECK(rc == 0, "written back, it is refused: %s\n%.*s", err, (int)len, text);
	rc = manifest_to_json(m2, &again, &len2, err);
	FUZZ_CHECK(rc == 0, "read back, it cannot be written: %s", err);
	FUZZ_CHECK(len == len2 && memcmp(text, again, len) == 0,
	           "written twice, not the same bytes:\n%.*s\n---\n%.*s", (int)len, text, (int)len2,
	           again);
	free(again);
	free(text);
	manifest_free(m2);
	manifest_free(m);
	return 0;
}
