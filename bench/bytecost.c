/*
 * bytecost: what one core pays per byte for the agent's two passes over
 * every byte of a checkpoint: the copy into staging (memcpy into warm
 * memory) and the checksum (XXH3, as the hasher computes it), over 1 GiB in
 * 8 MiB pieces (a staging chunk), best of 5. The figures behind the
 * estimate for large nodes in bench/RESULTS.md.
 *
 *   bytecost [MiB]
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PIECE (8u << 20)

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	size_t n = (size_t)(argc > 1 ? atol(argv[1]) : 1024) << 20;
	char *a, *b;
	double copy = 1e9, hash = 1e9;
	unsigned long long h = 0;

	n = n / PIECE * PIECE;
	a = malloc(n);
	b = malloc(n);
	if (!n || !a || !b) {
		fprintf(stderr, "bytecost: cannot allocate 2 x %zu MiB\n", n >> 20);
		return 1;
	}
	memset(a, 1, n);
	memset(b, 2, n); /* warm: the pool is pre-faulted */
	for (int r = 0; r < 5; r++) {
		double t = now();

		for (size_t o = 0; o < n; o += PIECE)
			memcpy(b + o, a + o, PIECE);
		t = now() - t;
		copy = t < copy ? t : copy;
		t = now();
		for (size_t o = 0; o < n; o += PIECE)
			h ^= XXH3_64bits(b + o, PIECE);
		t = now() - t;
		hash = t < hash ? t : hash;
	}
	printf(
	    "{\"bytes\": %zu, \"memcpy_gbps\": %.2f, \"xxh3_gbps\": %.2f, \"check\": \"%llx\"}\n",
	    n, (double)n / copy / 1e9, (double)n / hash / 1e9, h);
	free(a);
	free(b);
	return 0;
}
