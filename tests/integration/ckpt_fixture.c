/*
 * ckpt_fixture: one trainer rank that saves one step of known tensors through
 * libckpt, for tests written outside C (test_safetensors.py). It covers every
 * dtype of enum ckpt_dtype with a 0-d scalar, empty tensors, 1-d, 2-d and 3-d
 * shapes, sizes that are not multiples of 4096 and two tensors of a few MiB
 * (so a shard spans several staging chunks); with --world > 1 also one tensor
 * sharded by rows across the ranks.
 *
 *   ckpt_fixture --endpoint E --job J --step S --seed N [--rank R --world W]
 *
 * Byte j of tensor i (its index in the plan) is byte(N, i, j) below; BOOL
 * tensors hold its low bit. In the sharded tensor j counts from the start of
 * the global tensor, so the ranks' chunks join into one pattern. Once the step
 * is COMMITTED, stdout gets one JSON object that says what was saved; any
 * failure is a message on stderr and a non-zero exit. Single-threaded.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h" /* the installed header, as a user includes it */

#define FX_MAX_TENSORS 24
#define FX_SLOT_ALIGN 64u
#define FX_WAIT_MS 300000

/* What one tensor of the plan is; shapes live here so ckpt_tensor can point at them. */
struct fx_tensor {
	char name[64];
	enum ckpt_dtype dtype;
	int ndim;
	int64_t shape[3];
	int64_t global_shape[3];
	int64_t global_offset[3];
	int sharded;
	uint64_t pattern_offset; /* byte j of this tensor is byte(seed, i, pattern_offset + j) */
	size_t nbytes;
};

struct fx_args {
	const char *endpoint;
	const char *job;
	int64_t step;
	uint64_t seed;
	int rank;
	int world;
};

/* What each rank saves besides the sharded tensor; names get a "rank<R>." prefix. */
static const struct {
	const char *name;
	enum ckpt_dtype dtype;
	int ndim;
	int64_t shape[3];
} fx_table[] = {
    {"scalar", CKPT_F32, 0, {0}},
    {"empty", CKPT_U8, 2, {0, 5}},
    {"mask", CKPT_BOOL, 3, {3, 7, 11}},
    {"bytes", CKPT_U8, 1, {4099}}, /* + 8 x rank: the ranks' layouts differ */
    {"small", CKPT_I8, 2, {13, 17}},
    {"f8_e5m2", CKPT_F8_E5M2, 2, {33, 31}},
    {"f8_e4m3", CKPT_F8_E4M3, 3, {5, 7, 9}},
    {"i16", CKPT_I16, 1, {1001}},
    {"u16", CKPT_U16, 2, {3, 333}},
    {"f16", CKPT_F16, 3, {17, 19, 3}},
    {"bf16_big", CKPT_BF16, 2, {1537, 1031}}, /* ~3.0 MiB */
    {"i32", CKPT_I32, 2, {2049, 3}},
    {"u32", CKPT_U32, 1, {7}},
    {"f32_big", CKPT_F32, 2, {777, 1283}}, /* ~3.8 MiB */
    {"f64", CKPT_F64, 3, {3, 5, 7}},
    {"i64", CKPT_I64, 3, {1, 1, 1}},
    {"u64", CKPT_U64, 2, {2, 1000}},
    {"empty3d", CKPT_F64, 3, {4, 0, 2}},
};

/* The sharded tensor: SHARD_ROWS rows of each rank, stacked in rank order. */
#define SHARD_ROWS 301
#define SHARD_COLS 37

static const char *dtype_name(enum ckpt_dtype d)
{
	static const char *const names[] = {
	    [CKPT_BOOL] = "BOOL",       [CKPT_U8] = "U8",           [CKPT_I8] = "I8",
	    [CKPT_F8_E5M2] = "F8_E5M2", [CKPT_F8_E4M3] = "F8_E4M3", [CKPT_I16] = "I16",
	    [CKPT_U16] = "U16",         [CKPT_F16] = "F16",         [CKPT_BF16] = "BF16",
	    [CKPT_I32] = "I32",         [CKPT_U32] = "U32",         [CKPT_F32] = "F32",
	    [CKPT_F64] = "F64",         [CKPT_I64] = "I64",         [CKPT_U64] = "U64",
	};

	return (unsigned)d < sizeof(names) / sizeof(names[0]) && names[d] ? names[d] : "?";
}

static size_t dtype_size(enum ckpt_dtype d)
{
	switch (d) {
	case CKPT_BOOL:
	case CKPT_U8:
	case CKPT_I8:
	case CKPT_F8_E5M2:
	case CKPT_F8_E4M3:
		return 1;
	case CKPT_I16:
	case CKPT_U16:
	case CKPT_F16:
	case CKPT_BF16:
		return 2;
	case CKPT_I32:
	case CKPT_U32:
	case CKPT_F32:
		return 4;
	case CKPT_F64:
	case CKPT_I64:
	case CKPT_U64:
		return 8;
	}
	return 0;
}

/* splitmix64's finalizer; test_safetensors.py computes the same. */
static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

static uint8_t pattern_byte(uint64_t seed, uint64_t i, uint64_t j)
{
	return (uint8_t)(mix(seed * 0x9e3779b97f4a7c15ull + i * 0x100000001b3ull + j / 8) >>
	                 (j % 8 * 8));
}

static size_t tensor_bytes(const struct fx_tensor *t)
{
	size_t n = dtype_size(t->dtype);

	for (int d = 0; d < t->ndim; d++)
		n *= (size_t)t->shape[d];
	return n;
}

/* The plan of this rank: the table, then (world > 1) the sharded tensor. */
static size_t make_tensors(const struct fx_args *a, struct fx_tensor *t)
{
	size_t n = 0;

	for (size_t k = 0; k < sizeof(fx_table) / sizeof(fx_table[0]); k++, n++) {
		memset(&t[n], 0, sizeof(t[n]));
		snprintf(t[n].name, sizeof(t[n].name), "rank%d.%s", a->rank, fx_table[k].name);
		t[n].dtype = fx_table[k].dtype;
		t[n].ndim = fx_table[k].ndim;
		memcpy(t[n].shape, fx_table[k].shape, sizeof(t[n].shape));
		if (strcmp(fx_table[k].name, "bytes") == 0)
			t[n].shape[0] += 8 * a->rank;
		t[n].nbytes = tensor_bytes(&t[n]);
	}
	if (a->world > 1) {
		memset(&t[n], 0, sizeof(t[n]));
		snprintf(t[n].name, sizeof(t[n].name), "embed.sharded");
		t[n].dtype = CKPT_F32;
		t[n].ndim = 2;
		t[n].shape[0] = SHARD_ROWS;
		t[n].shape[1] = SHARD_COLS;
		t[n].global_shape[0] = (int64_t)SHARD_ROWS * a->world;
		t[n].global_shape[1] = SHARD_COLS;
		t[n].global_offset[0] = (int64_t)SHARD_ROWS * a->rank;
		t[n].sharded = 1;
		t[n].nbytes = tensor_bytes(&t[n]);
		/* rows split the global tensor into contiguous byte ranges */
		t[n].pattern_offset = (uint64_t)t[n].global_offset[0] * SHARD_COLS * 4;
		n++;
	}
	return n;
}

static void fill(const struct fx_args *a, const struct fx_tensor *t, size_t i, uint8_t *d)
{
	for (size_t j = 0; j < t->nbytes; j++) {
		uint8_t b = pattern_byte(a->seed, i, t->pattern_offset + j);

		d[j] = t->dtype == CKPT_BOOL ? (uint8_t)(b & 1) : b;
	}
}

static void print_ints(const int64_t *v, int n)
{
	putchar('[');
	for (int d = 0; d < n; d++)
		printf("%s%" PRId64, d ? ", " : "", v[d]);
	putchar(']');
}

/* A JSON string; the job name is the only text that comes from outside. */
static void print_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

static void print_report(const struct fx_args *a, const struct fx_tensor *t, size_t n,
                         uint64_t plan_bytes)
{
	printf("{\"job\": ");
	print_str(a->job);
	printf(", \"step\": %" PRId64 ", \"rank\": %d, \"world\": %d, \"seed\": %" PRIu64
	       ", \"plan_bytes\": %" PRIu64 ", \"tensors\": [",
	       a->step, a->rank, a->world, a->seed, plan_bytes);
	for (size_t i = 0; i < n; i++) {
		printf("%s\n  {\"name\": ", i ? "," : "");
		print_str(t[i].name);
		printf(", \"index\": %zu, \"dtype\": \"%s\", \"shape\": ", i,
		       dtype_name(t[i].dtype));
		print_ints(t[i].shape, t[i].ndim);
		printf(", \"kind\": \"%s\", \"pattern_offset\": %" PRIu64,
		       t[i].dtype == CKPT_BOOL ? "bool" : "pattern", t[i].pattern_offset);
		if (t[i].sharded) {
			printf(", \"global_shape\": ");
			print_ints(t[i].global_shape, t[i].ndim);
			printf(", \"global_offset\": ");
			print_ints(t[i].global_offset, t[i].ndim);
		}
		putchar('}');
	}
	printf("\n]}\n");
}

/* Connects, saves, waits for COMMITTED, reports; 0 or a negative errno. */
static int run(const struct fx_args *a)
{
	struct fx_tensor ft[FX_MAX_TENSORS];
	struct ckpt_tensor ct[FX_MAX_TENSORS];
	struct ckpt_client *c = NULL;
	struct ckpt_plan *p = NULL;
	struct ckpt_save *s = NULL;
	size_t n = make_tensors(a, ft), total = 0, off = 0;
	char meta[64];
	uint8_t *base = NULL;
	int rc;

	rc = ckpt_connect(a->endpoint, &c);
	if (rc) {
		fprintf(stderr, "ckpt_fixture: cannot connect to %s: %s\n", a->endpoint,
		        ckpt_strerror(rc));
		return rc;
	}
	/* every tensor in its own 64-byte aligned slot; an empty one still gets a slot */
	for (size_t i = 0; i < n; i++)
		total += (ft[i].nbytes + FX_SLOT_ALIGN) / FX_SLOT_ALIGN * FX_SLOT_ALIGN;
	rc = ckpt_host_alloc(c, total, (void **)&base);
	if (rc) {
		fprintf(stderr, "ckpt_fixture: ckpt_host_alloc(%zu): %s\n", total,
		        ckpt_last_error(c));
		goto out_disconnect;
	}
	for (size_t i = 0; i < n; i++) {
		ct[i] = (struct ckpt_tensor){
		    .name = ft[i].name,
		    .dtype = ft[i].dtype,
		    .ndim = ft[i].ndim,
		    .shape = ft[i].shape,
		    .data = base + off,
		    .global_shape = ft[i].sharded ? ft[i].global_shape : NULL,
		    .global_offset = ft[i].sharded ? ft[i].global_offset : NULL};
		fill(a, &ft[i], i, base + off);
		off += (ft[i].nbytes + FX_SLOT_ALIGN) / FX_SLOT_ALIGN * FX_SLOT_ALIGN;
	}
	rc = ckpt_plan_create(c, a->job, a->rank, a->world, ct, n, &p);
	if (rc) {
		fprintf(stderr, "ckpt_fixture: plan of job %s rank %d/%d: %s\n", a->job, a->rank,
		        a->world, ckpt_last_error(c));
		goto out_free;
	}
	snprintf(meta, sizeof(meta), "{\"seed\": %" PRIu64 "}", a->seed);
	rc = ckpt_save(p, a->step, meta, &s);
	if (rc) {
		fprintf(stderr, "ckpt_fixture: save of job %s step %" PRId64 ": %s\n", a->job,
		        a->step, ckpt_last_error(c));
		goto out_plan;
	}
	rc = ckpt_save_wait(s, CKPT_COMMITTED, FX_WAIT_MS);
	if (rc) {
		fprintf(stderr,
		        "ckpt_fixture: job %s step %" PRId64 " rank %d did not commit: %s (%s)\n",
		        a->job, a->step, a->rank, ckpt_strerror(rc), ckpt_save_reason(s));
		goto out_save;
	}
	print_report(a, ft, n, ckpt_plan_bytes(p));
	if (fflush(stdout) != 0 || ferror(stdout)) {
		rc = -EIO;
		fprintf(stderr, "ckpt_fixture: writing the report to stdout failed\n");
	}
out_save:
	ckpt_save_release(s);
out_plan:
	ckpt_plan_destroy(p);
out_free:
	ckpt_host_free(c, base);
out_disconnect:
	ckpt_disconnect(c);
	return rc;
}

static int parse_int(const char *opt, const char *s, int64_t min, int64_t max, int64_t *out)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max) {
		fprintf(stderr,
		        "ckpt_fixture: %s '%s' is not an integer in %" PRId64 "..%" PRId64 "\n",
		        opt, s, min, max);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: ckpt_fixture --endpoint E --job J --step S --seed N "
	                "[--rank R --world W]\n");
}

static int parse_args(int argc, char **argv, struct fx_args *a)
{
	static const struct option opts[] = {
	    {"endpoint", required_argument, NULL, 'e'},
	    {"job", required_argument, NULL, 'j'},
	    {"step", required_argument, NULL, 's'},
	    {"seed", required_argument, NULL, 'n'},
	    {"rank", required_argument, NULL, 'r'},
	    {"world", required_argument, NULL, 'w'},
	    {NULL, 0, NULL, 0},
	};
	int64_t v, step = -1, seed = -1, rank = 0, world = 1;
	int c, rc = 0;

	memset(a, 0, sizeof(*a));
	while (rc == 0 && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'e':
			a->endpoint = optarg;
			break;
		case 'j':
			a->job = optarg;
			break;
		case 's':
			rc = parse_int("--step", optarg, 0, INT64_MAX, &step);
			break;
		case 'n':
			rc = parse_int("--seed", optarg, 0, INT64_MAX, &seed);
			break;
		case 'r':
			rc = parse_int("--rank", optarg, 0, 1 << 20, &rank);
			break;
		case 'w':
			rc = parse_int("--world", optarg, 1, 1 << 20, &v);
			world = v;
			break;
		default:
			rc = -EINVAL;
		}
	}
	if (rc == 0 && (optind != argc || !a->endpoint || !a->job || step < 0 || seed < 0)) {
		fprintf(stderr,
		        "ckpt_fixture: --endpoint, --job, --step and --seed are required\n");
		rc = -EINVAL;
	}
	if (rc == 0 && rank >= world) {
		fprintf(stderr, "ckpt_fixture: rank %" PRId64 " is not below world %" PRId64 "\n",
		        rank, world);
		rc = -EINVAL;
	}
	if (rc)
		return rc;
	a->step = step;
	a->seed = (uint64_t)seed;
	a->rank = (int)rank;
	a->world = (int)world;
	return 0;
}

int main(int argc, char **argv)
{
	struct fx_args a;

	if (parse_args(argc, argv, &a)) {
		usage();
		return 2;
	}
	return run(&a) ? 1 : 0;
}
