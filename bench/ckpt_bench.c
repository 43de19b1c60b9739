/*
 * ckpt_bench: what a checkpoint costs a trainer, measured from the trainer's
 * side against a running ckptd, with the references a user compares it to.
 *
 *   ckpt_bench --endpoint E --dir D --sizes 256,1024,4096 --ranks 1,4 --reps 5 --out F
 *   ckpt_bench --endpoint E --dir D --control-plane N --out F
 *   ckpt_bench --endpoint E --dir D --sizes 4096 --ranks 8 --node --out F
 *   ckpt_bench --endpoint E --dir D --sizes 1024 --ranks 1 --node --uploaded --out F
 *
 * For each size (MiB, the whole checkpoint) and rank count (the size split
 * across that many ranks, each a thread with its own client, as separate
 * trainer processes would be):
 *   memcpy      the same bytes copied into warm memory (1 rank)
 *   intrainer   the trainer writing them itself: write() + fsync(), buffered,
 *               as torch.save does (1 rank)
 *   stall       ckpt_save until CAPTURED
 *   durable     ckpt_save until DURABLE (the slowest rank)
 *   commit      ckpt_save until COMMITTED (the slowest rank)
 *   restore     ckpt_restore of that checkpoint (all ranks)
 * and for a cached plan of 1,000 small tensors: ckpt_plan_create and the
 * client time of ckpt_save. Raw samples go to F as JSON; bench/report.py
 * turns them, with fio's, into the table and the ratios.
 *
 * --node (bench/node_run.sh): one node's ranks through one agent. Each
 * repetition also records every rank's own times (save -> CAPTURED, DURABLE,
 * COMMITTED; restore) and every rank's final state with its reason; a save
 * that is SKIPPED or FAILED is recorded, not fatal, and the restore runs only
 * when every rank COMMITTED. No references (memcpy, in-trainer) are taken.
 *
 * --uploaded (with --node; bench/s3_run.sh), for an agent with an upload
 * tier: each rank also waits, after COMMITTED, for UPLOADED, and records
 * save -> UPLOADED ("rank_uploaded_seconds"); the restore and the step's
 * delete come only after it, so neither runs beside the upload.
 *
 * --weights: the tensors hold float32 values ~ N(0, 0.02), as model weights
 * do (compressible as they are: bench/s3_run.sh's zstd runs), instead of
 * the default hashed words (incompressible). Each save's values are a 4 MiB
 * table of them read from another offset (further than zstd's window).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "client/rpc_call.h"

#define NTENSORS 16

struct opts {
	const char *endpoint, *dir, *out;
	long sizes[8], ranks[8];
	int nsizes, nranks, reps;
	int control; /* > 0: only the control plane, with this many saves */
	int node; /* per-rank records; a save that does not commit is recorded */
	int uploaded; /* --node: wait for UPLOADED after COMMITTED, and record it */
	int weights; /* float32 ~ N(0, 0.02) instead of hashed words */
};

#define WTABLE (1u << 20) /* floats in the --weights table: 4 MiB */
static float *wtable; /* --weights: NULL otherwise */

/* The --weights table: N(0, 0.02) by Box-Muller from a fixed xorshift. */
static void weights_init(void)
{
	uint64_t x = 0x2545f4914f6cdd1dull;

	wtable = malloc(WTABLE * sizeof(float));
	if (!wtable)
		abort();
	for (unsigned i = 0; i < WTABLE; i += 2) {
		double u[2];

		for (int k = 0; k < 2; k++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			u[k] = ((double)(x >> 11) + 0.5) / 9007199254740992.0;
		}
		wtable[i] = (float)(0.02 * sqrt(-2 * log(u[0])) * cos(2 * M_PI * u[1]));
		wtable[i + 1] = (float)(0.02 * sqrt(-2 * log(u[0])) * sin(2 * M_PI * u[1]));
	}
}

struct rank {
	int id, world;
	uint64_t bytes;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	void *mem;
	int64_t shape[NTENSORS][1];
	char names[NTENSORS][16];
	struct ckpt_tensor t[NTENSORS];
	/* one repetition */
	int64_t step;
	pthread_barrier_t *bar;
	double t0, stall, durable, commit, upload, rs0, rs1;
	int state, keep_going, wait_uploaded, *ncommitted;
	uint64_t digest; /* of the bytes saved: the restore must give them back */
	char reason[256];
};

static FILE *out;
static int nrecords;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, struct ckpt_client *c, int rc)
{
	fprintf(stderr, "ckpt_bench: %s: %s (%s)\n", what, ckpt_strerror(rc),
	        c ? ckpt_last_error(c) : "");
	exit(1);
}

static void record(const char *metric, long mib, long ranks, const double *v, int n)
{
	fprintf(out, "%s{\"metric\": \"%s\", \"size_mib\": %ld, \"ranks\": %ld, \"samples\": [",
	        nrecords++ ? ",\n  " : "\n  ", metric, mib, ranks);
	for (int i = 0; i < n; i++)
		fprintf(out, "%s%.9f", i ? ", " : "", v[i]);
	fprintf(out, "]}");
	fflush(out);
}

/* A JSON string, escaped. */
static void json_str(const char *v)
{
	fputc('"', out);
	for (; *v; v++) {
		if (*v == '"' || *v == '\\')
			fprintf(out, "\\%c", *v);
		else if ((unsigned char)*v < 0x20)
			fprintf(out, "\\u%04x", *v);
		else
			fputc(*v, out);
	}
	fputc('"', out);
}

/* --node: one value per rank (rank order) of repetition `rep`. */
static void record_ranks(const char *metric, long mib, int rep, const double *v, int world)
{
	fprintf(out,
	        "%s{\"metric\": \"%s\", \"size_mib\": %ld, \"ranks\": %d, \"rep\": %d, "
	        "\"per_rank\": [",
	        nrecords++ ? ",\n  " : "\n  ", metric, mib, world, rep);
	for (int k = 0; k < world; k++)
		fprintf(out, "%s%.9f", k ? ", " : "", v[k]);
	fprintf(out, "]}");
	fflush(out);
}

/* --node: every rank's final state and reason in repetition `rep`. */
static void record_states(long mib, int rep, const struct rank *r, int world)
{
	fprintf(out,
	        "%s{\"metric\": \"rank_state\", \"size_mib\": %ld, \"ranks\": %d, "
	        "\"rep\": %d, \"per_rank\": [",
	        nrecords++ ? ",\n  " : "\n  ", mib, world, rep);
	for (int k = 0; k < world; k++) {
		fprintf(out, "%s", k ? ", " : "");
		json_str(r[k].state ? ckpt_state_name((enum ckpt_state)r[k].state) : "NONE");
	}
	fprintf(out, "], \"reasons\": [");
	for (int k = 0; k < world; k++) {
		fprintf(out, "%s", k ? ", " : "");
		json_str(r[k].reason);
	}
	fprintf(out, "]}");
	fflush(out);
}

/* Training: every byte of the rank's tensors changes between saves. */
/* A digest of a rank's memory, taken outside the timed parts. */
static uint64_t digest(const struct rank *r)
{
	const uint64_t *w = r->mem;
	uint64_t h = 0x243f6a8885a308d3ull;

	for (uint64_t i = 0; i < r->bytes / 8; i++)
		h = (h ^ w[i]) * 0x100000001b3ull + i;
	return h;
}

static void train(struct rank *r, uint64_t seed)
{
	uint64_t *w = r->mem, n = r->bytes / 8;

	if (wtable) {
		float *f = r->mem;
		uint64_t nf = r->bytes / 4, at = seed * 40961 % WTABLE;

		for (uint64_t i = 0; i < nf;) {
			uint64_t k = WTABLE - at < nf - i ? WTABLE - at : nf - i;

			memcpy(f + i, wtable + at, k * sizeof(float));
			i += k;
			at = 0;
		}
		return;
	}
	for (uint64_t i = 0; i < n; i++)
		w[i] = (i + seed) * 0x9e3779b97f4a7c15ull;
}

/* A rank's tensors: NTENSORS of uneven sizes, together `bytes`, in one region. */
static void rank_setup(struct rank *r, const struct opts *o, long mib)
{
	uint64_t left, off = 0;
	char job[64];
	int rc;

	rc = ckpt_connect(o->endpoint, &r->c);
	if (rc)
		die("connect", NULL, rc);
	rc = ckpt_host_alloc(r->c, r->bytes, &r->mem);
	if (rc)
		die("host alloc", r->c, rc);
	left = r->bytes;
	for (int i = 0; i < NTENSORS; i++) {
		uint64_t n =
		    i == NTENSORS - 1 ? left : r->bytes / NTENSORS - 4096 + 97 * (uint64_t)i;

		n &= ~(uint64_t)7;
		left -= n;
		r->shape[i][0] = (int64_t)(n / 4);
		snprintf(r->names[i], sizeof(r->names[i]), "w%d.%d", r->id, i);
		r->t[i] = (struct ckpt_tensor){r->names[i],          CKPT_F32, 1,   r->shape[i],
		                               (char *)r->mem + off, NULL,     NULL};
		off += n;
	}
	snprintf(job, sizeof(job), "bench-%ldm-%dr", mib, r->world);
	rc = ckpt_plan_create(r->c, job, r->id, r->world, r->t, NTENSORS, &r->p);
	if (rc)
		die("plan", r->c, rc);
	train(r, 1);
}

static void rank_teardown(struct rank *r)
{
	ckpt_plan_destroy(r->p);
	ckpt_host_free(r->c, r->mem);
	ckpt_disconnect(r->c);
}

/*
 * One rank's save and restore of one repetition. With keep_going, a save that
 * does not reach COMMITTED leaves its state and reason in r; the restore runs
 * only if every rank's did.
 */
static void *rank_rep(void *arg)
{
	struct rank *r = arg;
	struct ckpt_save *s = NULL;
	int rc;

	train(r, (uint64_t)r->step + 2);
	r->digest = digest(r);
	pthread_barrier_wait(r->bar);
	r->t0 = now();
	rc = ckpt_save(r->p, r->step, NULL, &s);
	if (!rc)
		rc = ckpt_save_wait(s, CKPT_CAPTURED, -1);
	r->stall = now() - r->t0;
	if (!rc)
		rc = ckpt_save_wait(s, CKPT_DURABLE, -1);
	r->durable = now() - r->t0;
	if (!rc)
		rc = ckpt_save_wait(s, CKPT_COMMITTED, -1);
	r->commit = now() - r->t0;
	if (!rc && r->wait_uploaded) {
		rc = ckpt_save_wait(s, CKPT_UPLOADED, -1);
		r->upload = now() - r->t0;
	}
	r->state = s ? (int)ckpt_save_state(s) : 0;
	snprintf(r->reason, sizeof(r->reason), "%s", s ? ckpt_save_reason(s) : ckpt_strerror(rc));
	if (rc && !r->keep_going)
		die("save", r->c, rc);
	if (!rc)
		__atomic_add_fetch(r->ncommitted, 1, __ATOMIC_RELAXED);
	if (s)
		ckpt_save_release(s);
	pthread_barrier_wait(r->bar);
	if (__atomic_load_n(r->ncommitted, __ATOMIC_RELAXED) < r->world)
		return NULL;
	memset(r->mem, 0xa5, r->bytes); /* what the restore must overwrite */
	r->rs0 = now();
	rc = ckpt_restore(r->p, r->step, NULL, NULL);
	r->rs1 = now();
	if (rc)
		die("restore", r->c, rc);
	if (digest(r) != r->digest) {
		fprintf(
		    stderr,
		    "ckpt_bench: rank %d step %lld: the restore gave other bytes than were saved\n",
		    r->id, (long long)r->step);
		exit(1);
	}
	return NULL;
}

static void delete_step(struct ckpt_client *c, const char *job, int64_t step)
{
	Ckpt__V1__DeleteRequest req = CKPT__V1__DELETE_REQUEST__INIT;
	ProtobufCMessage *rep;
	int rc;

	req.job = (char *)job;
	req.step = step;
	rc = cl_call(c, IPC_DELETE, &req.base, &rep, CL_DEFAULT_TIMEOUT_MS);
	if (rc)
		die("delete", c, rc);
	protobuf_c_message_free_unpacked(rep, NULL);
}

/* The references, from the first rank's memory: memcpy and the in-trainer write. */
static void references(struct rank *r, const struct opts *o, long mib)
{
	double mc[16], it[16];
	char path[512];
	void *dst;

	dst = mmap(NULL, r->bytes, PROT_READ | PROT_WRITE,
	           MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (dst == MAP_FAILED)
		die("mmap", NULL, -errno);
	memcpy(dst, r->mem, r->bytes); /* warm */
	for (int i = 0; i < o->reps; i++) {
		double t0 = now();

		memcpy(dst, r->mem, r->bytes);
		mc[i] = now() - t0;
	}
	munmap(dst, r->bytes);
	snprintf(path, sizeof(path), "%s/intrainer.bin", o->dir);
	for (int i = 0; i < o->reps; i++) {
		double t0 = now();
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

		if (fd < 0)
			die(path, NULL, -errno);
		for (int k = 0; k < NTENSORS; k++) {
			const char *p = r->t[k].data;
			uint64_t n = (uint64_t)r->shape[k][0] * 4;

			while (n) {
				ssize_t w = write(fd, p, n > (1u << 30) ? 1u << 30 : n);

				if (w <= 0)
					die("write", NULL, -errno);
				p += w;
				n -= (uint64_t)w;
			}
		}
		if (fsync(fd))
			die("fsync", NULL, -errno);
		close(fd);
		it[i] = now() - t0;
		unlink(path);
	}
	record("memcpy_seconds", mib, 1, mc, o->reps);
	record("intrainer_seconds", mib, 1, it, o->reps);
}

/*
 * --node: every rank's state and own times (save -> each state) of repetition
 * `rep`, and its restore when every rank committed (there was one).
 */
static void record_node_rep(long mib, int rep, const struct rank *r, int world, bool restored)
{
	double cap[16], dur[16], com[16], upl[16], rst[16];

	for (int k = 0; k < world; k++) {
		cap[k] = r[k].stall;
		dur[k] = r[k].durable;
		com[k] = r[k].commit;
		upl[k] = r[k].upload;
		rst[k] = r[k].rs1 - r[k].rs0;
	}
	record_states(mib, rep, r, world);
	record_ranks("rank_captured_seconds", mib, rep, cap, world);
	record_ranks("rank_durable_seconds", mib, rep, dur, world);
	record_ranks("rank_committed_seconds", mib, rep, com, world);
	if (restored && r[0].wait_uploaded)
		record_ranks("rank_uploaded_seconds", mib, rep, upl, world);
	if (restored)
		record_ranks("rank_restore_seconds", mib, rep, rst, world);
}

static void run_size(const struct opts *o, long mib, long world)
{
	struct rank *r = calloc((size_t)world, sizeof(*r));
	double stall[16], dur[16], com[16], rst[16];
	int ncommitted, n = 0;
	pthread_barrier_t bar;
	pthread_t th[16];
	char job[64];

	if (!r)
		die("out of memory", NULL, -ENOMEM);
	pthread_barrier_init(&bar, NULL, (unsigned)world);
	for (int k = 0; k < world; k++) {
		r[k] = (struct rank){.id = k,
		                     .world = (int)world,
		                     .bar = &bar,
		                     .keep_going = o->node,
		                     .wait_uploaded = o->uploaded,
		                     .ncommitted = &ncommitted};
		r[k].bytes = ((uint64_t)mib << 20) / (uint64_t)world;
		rank_setup(&r[k], o, mib);
	}
	snprintf(job, sizeof(job), "bench-%ldm-%ldr", mib, world);
	for (int i = 0; i < o->reps; i++) {
		double t0 = 1e300, c1 = 0, d1 = 0, s = 0, r0 = 1e300, r1 = 0;

		ncommitted = 0;
		for (int k = 0; k < world; k++) {
			r[k].step = i + 1;
			pthread_create(&th[k], NULL, rank_rep, &r[k]);
		}
		for (int k = 0; k < world; k++) {
			pthread_join(th[k], NULL);
			t0 = r[k].t0 < t0 ? r[k].t0 : t0;
			c1 = r[k].t0 + r[k].commit > c1 ? r[k].t0 + r[k].commit : c1;
			d1 = r[k].t0 + r[k].durable > d1 ? r[k].t0 + r[k].durable : d1;
			s += r[k].stall / (double)world;
			r0 = r[k].rs0 < r0 ? r[k].rs0 : r0;
			r1 = r[k].rs1 > r1 ? r[k].rs1 : r1;
		}
		if (o->node)
			record_node_rep(mib, i + 1, r, (int)world, ncommitted == world);
		if (ncommitted < world) /* --node: recorded above, and not a figure */
			continue;
		stall[n] = s; /* the mean rank's stall */
		dur[n] = d1 - t0; /* the first save call -> the last rank's state */
		com[n] = c1 - t0;
		rst[n++] = r1 - r0;
		delete_step(r[0].c, job, i + 1);
	}
	if (n) {
		record("stall_seconds", mib, world, stall, n);
		record("durable_seconds", mib, world, dur, n);
		record("commit_seconds", mib, world, com, n);
		record("restore_seconds", mib, world, rst, n);
	}
	if (world == 1 && !o->node)
		references(&r[0], o, mib);
	for (int k = 0; k < world; k++)
		rank_teardown(&r[k]);
	pthread_barrier_destroy(&bar);
	free(r);
}

/* A cached plan of 1,000 small tensors: plan creation and the save call itself. */
static void control_plane(const struct opts *o)
{
	enum { N = 1000, SAVES = 1000 };
	static int64_t shape[N][1];
	static char names[N][16];
	static struct ckpt_tensor t[N];
	static double pc[16], sc[SAVES];
	const int saves = o->control < SAVES ? o->control : SAVES;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	void *mem;
	int rc;

	if ((rc = ckpt_connect(o->endpoint, &c)) || (rc = ckpt_host_alloc(c, N * 1024, &mem)))
		die("control plane setup", NULL, rc);
	for (int i = 0; i < N; i++) {
		shape[i][0] = 256;
		snprintf(names[i], sizeof(names[i]), "p%d", i);
		t[i] = (struct ckpt_tensor){names[i], CKPT_F32, 1, shape[i], (char *)mem + i * 1024,
		                            NULL,     NULL};
	}
	for (int i = 0; i < o->reps; i++) {
		double t0 = now();

		rc = ckpt_plan_create(c, "bench-ctl", 0, 1, t, N, &p);
		pc[i] = now() - t0;
		if (rc)
			die("plan of 1000", c, rc);
		if (i + 1 < o->reps)
			ckpt_plan_destroy(p);
	}
	for (int i = 0; i < saves; i++) {
		struct ckpt_save *s;
		double t0 = now();

		rc = ckpt_save(p, i + 1, NULL, &s);
		sc[i] = now() - t0;
		if (rc || (rc = ckpt_save_wait(s, CKPT_COMMITTED, -1)))
			die("save of 1000", c, rc);
		ckpt_save_release(s);
	}
	for (int i = 0; i < saves; i++)
		delete_step(c, "bench-ctl", i + 1);
	record("plan_create_seconds", 0, 1, pc, o->reps);
	record("save_call_seconds", 0, 1, sc, saves);
	ckpt_plan_destroy(p);
	ckpt_host_free(c, mem);
	ckpt_disconnect(c);
}

static int list(const char *s, long *v, int max)
{
	int n = 0;

	for (char *end; *s && n < max; s = *end ? end + 1 : end) {
		v[n++] = strtol(s, &end, 10);
		if (end == s || v[n - 1] <= 0)
			return -1;
	}
	return n;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
	    {"endpoint", required_argument, NULL, 'e'},
	    {"dir", required_argument, NULL, 'd'},
	    {"sizes", required_argument, NULL, 's'},
	    {"ranks", required_argument, NULL, 'r'},
	    {"reps", required_argument, NULL, 'n'},
	    {"out", required_argument, NULL, 'o'},
	    {"control-plane", required_argument, NULL, 'c'},
	    {"node", no_argument, NULL, 'N'},
	    {"uploaded", no_argument, NULL, 'U'},
	    {"weights", no_argument, NULL, 'W'},
	    {NULL, 0, NULL, 0},
	};
	struct opts o = {.reps = 5};
	int opt;

	o.nsizes = list("256,1024,4096", o.sizes, 8);
	o.nranks = list("1,4", o.ranks, 8);
	while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		if (opt == 'e')
			o.endpoint = optarg;
		else if (opt == 'd')
			o.dir = optarg;
		else if (opt == 's')
			o.nsizes = list(optarg, o.sizes, 8);
		else if (opt == 'r')
			o.nranks = list(optarg, o.ranks, 8);
		else if (opt == 'n')
			o.reps = atoi(optarg);
		else if (opt == 'o')
			o.out = optarg;
		else if (opt == 'c')
			o.control = atoi(optarg);
		else if (opt == 'N')
			o.node = 1;
		else if (opt == 'U')
			o.uploaded = 1;
		else if (opt == 'W')
			o.weights = 1;
		else
			return 2;
	}
	for (int k = 0; k < o.nranks; k++)
		if (o.ranks[k] > 16)
			o.nranks = -1;
	if (!o.endpoint || !o.dir || !o.out || o.nsizes < 1 || o.nranks < 1 || o.reps < 1 ||
	    o.reps > 16 || (o.uploaded && !o.node)) {
		fprintf(stderr,
		        "usage: ckpt_bench --endpoint E --dir D --out FILE [--sizes MiB,...] "
		        "[--ranks N,...(at most 16)] [--reps 1..16] [--node [--uploaded]] "
		        "[--weights]\n");
		return 2;
	}
	if (o.weights)
		weights_init();
	out = fopen(o.out, "w");
	if (!out)
		die(o.out, NULL, -errno);
	fprintf(out, "[");
	if (o.control > 0) {
		control_plane(&o);
	} else {
		for (int i = 0; i < o.nsizes; i++)
			for (int k = 0; k < o.nranks; k++)
				run_size(&o, o.sizes[i], o.ranks[k]);
	}
	fprintf(out, "\n]\n");
	fclose(out);
	return 0;
}
