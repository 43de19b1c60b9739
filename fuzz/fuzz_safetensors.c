/*
 * fuzz_safetensors: storage/format/safetensors.c's parser, st_header_parse, on the
 * first bytes of a shard, as restore and verify read them from any file a
 * manifest names.
 *
 * Input: 8 bytes (little-endian) saying how many bytes of the file follow
 * what is given, then the file's first bytes (the 8-byte header length, the
 * JSON header, perhaps some data). What the parser accepts must be found by
 * name, tile the data exactly, and build again (st_header_build, as a plan
 * lays out its shard) into a header that parses to the same tensors. The
 * save's stamp it carries (st_header_stamp) must be one a save could write;
 * its tensors built again with the stamp's placeholders (as a plan builds
 * its header) must take that stamp (or one drawn from the input), written
 * in two pieces as a save copies the header in chunks (st_stamp_apply),
 * and give it back once parsed.
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "storage/format/format.h"
#include "fuzz/fuzz.h"

static void same_entries(const struct st_header *a, const struct st_header *b)
{
	FUZZ_CHECK(a->n == b->n, "%zu tensors, built again %zu", a->n, b->n);
	for (size_t i = 0; i < a->n; i++) {
		const struct st_entry *x = &a->v[i], *y = &b->v[i];

		FUZZ_CHECK(strcmp(x->name, y->name) == 0 && x->dtype == y->dtype &&
		               x->ndim == y->ndim && x->begin == y->begin && x->end == y->end &&
		               memcmp(x->shape, y->shape, x->ndim * sizeof(int64_t)) == 0,
		           "tensor %zu ('%s') differs once built again", i, x->name);
	}
	FUZZ_CHECK(a->nmeta == b->nmeta, "%zu metadata keys, built again %zu", a->nmeta, b->nmeta);
}

/* The header as a plan would build it, parsed again. */
static void rebuild(const struct st_header *h, uint64_t data_len)
{
	struct st_tensor *t = calloc(h->n + 1, sizeof(*t));
	struct st_meta *meta = calloc(h->nmeta + 1, sizeof(*meta));
	struct st_header *h2 = NULL;
	char err[IPC_ERRLEN];
	void *buf = NULL;
	size_t len = 0;
	int rc;

	FUZZ_CHECK(t && meta, "out of memory");
	for (size_t i = 0; i < h->n; i++)
		t[i] = (struct st_tensor){h->v[i].name,  h->v[i].dtype, h->v[i].ndim,
		                          h->v[i].shape, h->v[i].begin, h->v[i].end};
	for (size_t i = 0; i < h->nmeta; i++)
		meta[i] = (struct st_meta){h->meta_keys[i], h->meta_values[i]};
	rc = st_header_build(t, h->n, meta, h->nmeta, &buf, &len, err);
	FUZZ_CHECK(rc == 0, "parsed, yet it does not build: %s", err);
	rc = st_header_parse(buf, len, len + data_len, &h2, err);
	FUZZ_CHECK(rc == 0, "built, it does not parse: %s", err);
	same_entries(h, h2);
	st_header_free(h2);
	free(buf);
	free(meta);
	free(t);
}

/*
 * h's tensors built with the placeholders, stamped with st in two pieces
 * split at `cut`, parsed again: the same stamp, and the same tensors.
 */
static void stamp_again(const struct st_header *h, uint64_t data_len, struct st_stamp st,
                        uint64_t cut)
{
	struct st_tensor *t = calloc(h->n + 1, sizeof(*t));
	const struct st_meta meta[] = {
	    {"format", "pt"}, {"step", ST_STAMP_STEP}, {"save", ST_STAMP_SAVE}};
	struct st_header *h2 = NULL;
	struct st_stamp_at at = {0};
	struct st_stamp back = {0};
	char err[IPC_ERRLEN];
	void *buf = NULL;
	size_t len = 0;
	int rc;

	FUZZ_CHECK(t, "out of memory");
	for (size_t i = 0; i < h->n; i++)
		t[i] = (struct st_tensor){h->v[i].name,  h->v[i].dtype, h->v[i].ndim,
		                          h->v[i].shape, h->v[i].begin, h->v[i].end};
	rc = st_header_build(t, h->n, meta, 3, &buf, &len, err);
	FUZZ_CHECK(rc == 0, "parsed, yet it does not build with the stamp's placeholders: %s", err);
	rc = st_stamp_find(buf, len, &at, err);
	FUZZ_CHECK(rc == 0 && at.step && at.save, "built, its placeholders are not found: %s", err);
	cut %= len + 1;
	st_stamp_apply(&at, &st, 0, buf, cut);
	st_stamp_apply(&at, &st, cut, (char *)buf + cut, len - cut);
	rc = st_header_parse(buf, len, len + data_len, &h2, err);
	FUZZ_CHECK(rc == 0, "stamped, it does not parse: %s", err);
	rc = st_header_stamp(h2, &back);
	FUZZ_CHECK(rc == 0 && back.step == st.step && back.save == st.save,
	           "stamped with save %016" PRIx64 " of step %" PRId64 ", it says %d: %016" PRIx64
	           " of step %" PRId64,
	           st.save, st.step, rc, back.save, back.step);
	FUZZ_CHECK(h2->n == h->n, "%zu tensors, stamped %zu", h->n, h2->n);
	st_header_free(h2);
	free(buf);
	free(t);
}

/* The stamp a header carries: none, malformed, or one a save could have written. */
static void check_stamp(const struct st_header *h, uint64_t data_len, uint64_t seed)
{
	struct st_stamp st = {0};
	int rc = st_header_stamp(h, &st);

	FUZZ_CHECK(rc == 0 || rc == -ENODATA || rc == -EINVAL, "st_header_stamp: %d", rc);
	if (rc == 0)
		FUZZ_CHECK(st.save != 0 && st.step >= 0 && st.step <= 999999999999LL,
		           "a stamp no save writes: save %016" PRIx64 " of step %" PRId64, st.save,
		           st.step);
	if (rc == -ENODATA)
		FUZZ_CHECK(!st_header_meta(h, "step") && !st_header_meta(h, "save"),
		           "no stamp, yet a step or a save");
	if (rc != 0) /* one drawn from the input */
		st = (struct st_stamp){(int64_t)(seed % 1000000000000ULL), seed | 1};
	stamp_again(h, data_len, st, seed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct st_header *h = NULL;
	char err[IPC_ERRLEN];
	uint64_t more = 0, file_size, pos = 0;

	if (size < 8)
		return 0;
	for (int i = 7; i >= 0; i--)
		more = more << 8 | data[i];
	data += 8;
	size -= 8;
	file_size = more > UINT64_MAX - size ? UINT64_MAX : size + more;
	if (st_header_parse(data, size, file_size, &h, err))
		return 0;
	for (size_t i = 0; i < h->n; i++) {
		FUZZ_CHECK(st_header_find(h, h->v[i].name) == &h->v[i], "'%s' not found by name",
		           h->v[i].name);
		FUZZ_CHECK(h->v[i].begin == pos && h->v[i].end >= pos, "'%s' does not follow on",
		           h->v[i].name);
		pos = h->v[i].end;
	}
	FUZZ_CHECK(pos == file_size - h->data_start, "the tensors do not end with the file");
	FUZZ_CHECK(st_header_find(h, "__metadata__") == NULL, "__metadata__ is a tensor");
	rebuild(h, pos);
	check_stamp(h, pos, more ^ size);
	st_header_free(h);
	return 0;
}
