/*
 * fuzz_s3zstd: storage/s3/s3zstd.c, the reader of a compressed shard's seek
 * table and frames, on any bytes, as s3.c reads an object: the input is
 * the shard's size (8 bytes, little endian, as its metadata says it) and
 * then the object. The footer names the frames; the table is parsed
 * against the object's and the shard's sizes; where it is accepted, every
 * frame's ends must rise and sum to both sizes, and a read of the first
 * and last bytes of each frame, and of a range across two, must either
 * give exactly those bytes or be refused, never write past the buffer.
 */
#include <errno.h>
#include <string.h>

#include "fuzz/fuzz.h"
#include "storage/s3/s3.h"

/* Shard bytes [off, off + len) from the object, as s3.c's zread and unzip do. */
static void read_range(const struct s3z_table *t, const uint8_t *obj, uint64_t off, uint64_t len)
{
	unsigned a = s3z_find(t, off), b = s3z_find(t, off + len - 1);
	uint64_t c0 = a ? t->cend[a - 1] : 0;
	char err[IPC_ERRLEN];
	uint8_t *dst;
	int rc;

	FUZZ_CHECK(a <= b && b < t->n, "bytes [%llu, +%llu): frames %u..%u of %u",
	           (unsigned long long)off, (unsigned long long)len, a, b, t->n);
	dst = malloc(len);
	FUZZ_CHECK(dst, "out of memory");
	rc = s3z_inflate(t, a, obj + c0, off, dst, len, err);
	FUZZ_CHECK(rc == 0 || rc == -EBADMSG || rc == -ENOMEM, "inflate: %d", rc);
	free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct s3z_table t;
	char err[IPC_ERRLEN];
	uint64_t shard = 0, tb, len;
	const uint8_t *obj;
	uint8_t *copy;
	unsigned n;

	if (size < 8 + 9)
		return 0;
	for (int i = 0; i < 8; i++)
		shard |= (uint64_t)data[i] << (8 * i);
	shard &= (1ull << 26) - 1; /* reads below allocate up to a frame's size */
	len = size - 8;
	copy = malloc(len);
	FUZZ_CHECK(copy, "out of memory");
	memcpy(copy, data + 8, len);
	obj = copy;
	if (s3z_footer(obj + len - 9, &n, err) || (tb = s3z_table_bytes(n)) > len ||
	    s3z_table_parse(obj + len - tb, tb, len, shard, &t, err)) {
		free(copy);
		return 0;
	}
	FUZZ_CHECK(t.n == n && t.cend[n - 1] + tb == len && t.dend[n - 1] == shard,
	           "a table of %u frames accepted whose ends are not the object's", n);
	for (unsigned i = 0; i < n; i++) {
		uint64_t d0 = i ? t.dend[i - 1] : 0, c0 = i ? t.cend[i - 1] : 0;

		FUZZ_CHECK(t.dend[i] > d0 && t.cend[i] > c0, "frame %u is empty", i);
		FUZZ_CHECK(s3z_find(&t, d0) == i && s3z_find(&t, t.dend[i] - 1) == i,
		           "frame %u is not found by its own bytes", i);
		read_range(&t, obj, d0, 1);
		read_range(&t, obj, t.dend[i] - 1, 1);
		if (i + 1 < n)
			read_range(&t, obj, t.dend[i] - 1, 2);
	}
	s3z_table_free(&t);
	free(copy);
	return 0;
}
