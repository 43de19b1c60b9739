/*
 * zstdcost: what zstd gains and costs on the bytes a checkpoint holds, for
 * the question of compressing the upload tier's chunks. Five synthetic
 * tensors of the same size (64 MiB by default), each from its own fixed
 * seed, so every run compresses the same bytes:
 *
 *   weights_f32   float32 ~ N(0, 0.02)
 *   weights_bf16  bfloat16: the top 16 bits of such a float32, rounded to
 *                 nearest even (twice the elements of the float32 tensor)
 *   exp_avg       float32 ~ N(0, 1e-3) (Adam's first moment)
 *   exp_avg_sq    float32 0.999^k * g^2, g ~ N(0, 1e-3), k uniform in
 *                 [0, 1000) for each element: Adam's second moment, a
 *                 squared gradient decayed for the steps since it was seen
 *                 (positive, small, spread over decades)
 *   zeros90_f32   float32: each element 0 with probability 0.9, otherwise
 *                 ~ N(0, 0.02) (zeros scattered, not in runs: the harder case)
 *
 * Each is cut into 8 MiB chunks, each chunk one zstd frame
 * (ZSTD_compressCCtx, one context reused, one thread), at levels 1, 3 and
 * -1, each with and without byte shuffling: within each chunk the bytes of
 * every element are transposed (all byte 0s, then all byte 1s, ...; the
 * element is the dtype's size), which zstd -d does not undo. Compression is
 * timed over the whole tensor including the shuffle; decompression over the
 * whole tensor including the unshuffle; best of 3 each, output buffers
 * faulted in before the clock starts. Every case is checked to come back
 * byte-exact.
 *
 *   zstdcost [--mib N] [--json FILE]
 *
 * A table on stdout; --json writes one JSON object per case, one a line.
 * MB/s are 10^6 bytes of the tensor (uncompressed) per second on one core.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zstd.h>

#define CHUNK (8u << 20)
#define REPS 3
#define SEED 0x7a737464636f7374ull /* "zstdcost" */

enum dtype { F32, BF16 };

struct tensor {
	const char *name;
	enum dtype dtype;
};

static const struct tensor tensors[] = {
    {"weights_f32", F32}, {"weights_bf16", BF16}, {"exp_avg", F32},
    {"exp_avg_sq", F32},  {"zeros90_f32", F32},
};

static const int levels[] = {-1, 1, 3};

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* xoshiro256**, seeded by splitmix64: the same bytes on every machine. */
struct rng {
	uint64_t s[4];
};

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static void rng_seed(struct rng *r, uint64_t seed)
{
	for (int i = 0; i < 4; i++) {
		uint64_t z = (seed += 0x9e3779b97f4a7c15ull);

		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		r->s[i] = z ^ (z >> 31);
	}
}

static uint64_t rng_next(struct rng *r)
{
	uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return out;
}

/* Uniform in (0, 1): 53 random bits, never 0. */
static double rng_unit(struct rng *r)
{
	return ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
}

/* N(0, sigma) by Box-Muller; the second value of each pair is kept. */
struct normal {
	struct rng r;
	double spare;
	bool have;
};

static double normal(struct normal *n, double sigma)
{
	double u, v, m;

	if (n->have) {
		n->have = false;
		return n->spare * sigma;
	}
	u = rng_unit(&n->r);
	v = rng_unit(&n->r);
	m = sqrt(-2.0 * log(u));
	n->spare = m * sin(2.0 * M_PI * v);
	n->have = true;
	return m * cos(2.0 * M_PI * v) * sigma;
}

static uint16_t bf16_of(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
	return (uint16_t)(u >> 16);
}

static void generate(int which, void *buf, size_t bytes)
{
	struct normal n = {.have = false};
	float *f = buf;
	size_t count = bytes / 4;
	float decay[1000];

	rng_seed(&n.r, SEED + (uint64_t)which);
	switch (which) {
	case 0:
		for (size_t i = 0; i < count; i++)
			f[i] = (float)normal(&n, 0.02);
		break;
	case 1: {
		uint16_t *h = buf;

		for (size_t i = 0; i < bytes / 2; i++)
			h[i] = bf16_of((float)normal(&n, 0.02));
		break;
	}
	case 2:
		for (size_t i = 0; i < count; i++)
			f[i] = (float)normal(&n, 1e-3);
		break;
	case 3:
		for (int k = 0; k < 1000; k++)
			decay[k] = (float)pow(0.999, k);
		for (size_t i = 0; i < count; i++) {
			double g = normal(&n, 1e-3);

			f[i] = decay[rng_next(&n.r) % 1000] * (float)(g * g);
		}
		break;
	case 4:
		for (size_t i = 0; i < count; i++)
			f[i] = rng_unit(&n.r) < 0.9 ? 0.0f : (float)normal(&n, 0.02);
		break;
	}
}

/* Byte k of element i goes to k * count + i. */
static void shuffle(uint8_t *dst, const uint8_t *src, size_t len, size_t es)
{
	size_t count = len / es;

	for (size_t i = 0; i < count; i++)
		for (size_t k = 0; k < es; k++)
			dst[k * count + i] = src[i * es + k];
	memcpy(dst + count * es, src + count * es, len - count * es);
}

static void unshuffle(uint8_t *dst, const uint8_t *src, size_t len, size_t es)
{
	size_t count = len / es;

	for (size_t i = 0; i < count; i++)
		for (size_t k = 0; k < es; k++)
			dst[i * es + k] = src[k * count + i];
	memcpy(dst + count * es, src + count * es, len - count * es);
}

/* The shuffles for the two sizes, each with a constant element size so the
 * compiler unrolls the inner loop: the figures are the shuffle's cost when
 * written plainly, not a generic loop's. */
static void shuffle_es(uint8_t *dst, const uint8_t *src, size_t len, size_t es)
{
	if (es == 4)
		shuffle(dst, src, len, 4);
	else
		shuffle(dst, src, len, 2);
}

static void unshuffle_es(uint8_t *dst, const uint8_t *src, size_t len, size_t es)
{
	if (es == 4)
		unshuffle(dst, src, len, 4);
	else
		unshuffle(dst, src, len, 2);
}

struct result {
	size_t out;
	double comp_s, decomp_s;
};

static int run_case(ZSTD_CCtx *cc, ZSTD_DCtx *dc, const uint8_t *in, size_t bytes, size_t es,
                    int level, bool shuf, uint8_t *frames, size_t bound, uint8_t *scratch,
                    uint8_t *back, struct result *res)
{
	size_t nchunks = (bytes + CHUNK - 1) / CHUNK;
	size_t *sizes = malloc(nchunks * sizeof(*sizes));
	int rc = -1;

	if (!sizes) {
		fprintf(stderr, "zstdcost: out of memory\n");
		return -1;
	}
	res->comp_s = res->decomp_s = 1e9;
	for (int r = 0; r < REPS; r++) {
		double t = now();

		res->out = 0;
		for (size_t c = 0; c < nchunks; c++) {
			size_t len = bytes - c * CHUNK < CHUNK ? bytes - c * CHUNK : CHUNK;
			const uint8_t *src = in + c * CHUNK;

			if (shuf) {
				shuffle_es(scratch, src, len, es);
				src = scratch;
			}
			sizes[c] =
			    ZSTD_compressCCtx(cc, frames + c * bound, bound, src, len, level);
			if (ZSTD_isError(sizes[c])) {
				fprintf(stderr, "zstdcost: compress: %s\n",
				        ZSTD_getErrorName(sizes[c]));
				goto out;
			}
			res->out += sizes[c];
		}
		t = now() - t;
		res->comp_s = t < res->comp_s ? t : res->comp_s;
	}
	for (int r = 0; r < REPS; r++) {
		double t;

		memset(back, 0xa5, bytes); /* a fresh pattern: each rep must write every byte */
		t = now();
		for (size_t c = 0; c < nchunks; c++) {
			size_t len = bytes - c * CHUNK < CHUNK ? bytes - c * CHUNK : CHUNK;
			uint8_t *dst = shuf ? scratch : back + c * CHUNK;
			size_t got =
			    ZSTD_decompressDCtx(dc, dst, len, frames + c * bound, sizes[c]);

			if (ZSTD_isError(got) || got != len) {
				fprintf(stderr, "zstdcost: decompress: %s\n",
				        ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short frame");
				goto out;
			}
			if (shuf)
				unshuffle_es(back + c * CHUNK, scratch, len, es);
		}
		t = now() - t;
		res->decomp_s = t < res->decomp_s ? t : res->decomp_s;
		if (memcmp(back, in, bytes)) {
			fprintf(stderr, "zstdcost: level %d%s: the bytes did not come back\n",
			        level, shuf ? " shuffled" : "");
			goto out;
		}
	}
	rc = 0;
out:
	free(sizes);
	return rc;
}

int main(int argc, char **argv)
{
	size_t bytes = 64u << 20, bound;
	const char *json = NULL;
	FILE *jf = NULL;
	uint8_t *in, *frames, *scratch, *back;
	ZSTD_CCtx *cc;
	ZSTD_DCtx *dc;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--mib") && i + 1 < argc) {
			bytes = (size_t)atol(argv[++i]) << 20;
		} else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
			json = argv[++i];
		} else {
			fprintf(stderr, "usage: zstdcost [--mib N] [--json FILE]\n");
			return 2;
		}
	}
	if (!bytes) {
		fprintf(stderr, "zstdcost: --mib must be at least 1\n");
		return 2;
	}
	bound = ZSTD_compressBound(CHUNK);
	in = malloc(bytes);
	back = malloc(bytes);
	scratch = malloc(CHUNK);
	frames = malloc((bytes + CHUNK - 1) / CHUNK * bound);
	cc = ZSTD_createCCtx();
	dc = ZSTD_createDCtx();
	if (!in || !back || !scratch || !frames || !cc || !dc) {
		fprintf(stderr, "zstdcost: out of memory\n");
		return 1;
	}
	if (json && !(jf = fopen(json, "w"))) {
		perror(json);
		return 1;
	}
	/* Fault everything in before any clock starts. */
	memset(back, 0, bytes);
	memset(scratch, 0, CHUNK);
	memset(frames, 0, (bytes + CHUNK - 1) / CHUNK * bound);

	printf("zstd %s, %zu MiB per tensor, %u MiB chunks (one frame each), one thread, best of "
	       "%d\n\n",
	       ZSTD_versionString(), bytes >> 20, CHUNK >> 20, REPS);
	printf("%-13s %5s %7s %7s %13s %15s\n", "tensor", "level", "shuffle", "ratio",
	       "compress MB/s", "decompress MB/s");
	for (size_t t = 0; t < sizeof(tensors) / sizeof(tensors[0]); t++) {
		size_t es = tensors[t].dtype == F32 ? 4 : 2;

		generate((int)t, in, bytes);
		for (int s = 0; s < 2; s++) {
			for (size_t l = 0; l < sizeof(levels) / sizeof(levels[0]); l++) {
				struct result r;
				double ratio, cm, dm;

				if (run_case(cc, dc, in, bytes, es, levels[l], s, frames, bound,
				             scratch, back, &r))
					return 1;
				ratio = (double)bytes / (double)r.out;
				cm = (double)bytes / r.comp_s / 1e6;
				dm = (double)bytes / r.decomp_s / 1e6;
				printf("%-13s %5d %7s %7.3f %13.0f %15.0f\n", tensors[t].name,
				       levels[l], s ? "yes" : "no", ratio, cm, dm);
				fflush(stdout);
				if (jf)
					fprintf(
					    jf,
					    "{\"tensor\": \"%s\", \"dtype\": \"%s\", \"bytes\": "
					    "%zu, "
					    "\"chunk_bytes\": %u, \"level\": %d, \"shuffle\": %s, "
					    "\"compressed_bytes\": %zu, \"ratio\": %.4f, "
					    "\"compress_mbps\": %.1f, \"decompress_mbps\": %.1f, "
					    "\"reps\": %d, \"zstd\": \"%s\"}\n",
					    tensors[t].name, es == 4 ? "float32" : "bfloat16",
					    bytes, CHUNK, levels[l], s ? "true" : "false", r.out,
					    ratio, cm, dm, REPS, ZSTD_versionString());
			}
		}
	}
	if (jf && fclose(jf)) {
		perror(json);
		return 1;
	}
	ZSTD_freeCCtx(cc);
	ZSTD_freeDCtx(dc);
	free(in);
	free(back);
	free(scratch);
	free(frames);
	return 0;
}
