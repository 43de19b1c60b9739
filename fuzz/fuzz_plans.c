/*
 * fuzz_plans: storage/plans.c's parser, plans_from_json, on the plans files
 * other nodes write to <root>/<job>/plans/<node>.json. What it accepts must
 * give each rank's tensors a signature (the agent compares it with the
 * parts'), write back (plans_to_json) and read back the same.
 */
#include <string.h>

#include "format.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[IPC_ERRLEN], *text = NULL, *again = NULL;
	struct plans_file *f = NULL, *f2 = NULL;
	size_t len = 0, len2 = 0;
	uint64_t sig;
	int rc;

	if (plans_from_json((const char *)data, size, &f, err))
		return 0;
	for (size_t i = 0; i < f->nranks; i++)
		(void)tensors_signature(f->ranks[i].tensors, f->ranks[i].ntensors, &sig);
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
