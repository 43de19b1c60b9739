/*
 * scale_bench: the many-nodes commit at cluster scale, on a synthetic root
 * of the local backend (bench/scale_run.sh drives it; bench/README.md).
 *
 *   gen     a root of N nodes x R ranks x T tensors: OWNER, each node's
 *           plans, and for each of S steps each rank's shard (a small
 *           safetensors file, stamped) and each node's part naming it
 *   commit  step S committed as the node hosting rank 0 would, in this
 *           process alone: the roster read first (its cost apart), then
 *           commit_poll until COMMITTED, FAILED, or stuck (every part in,
 *           no manifest: the baseline's manifest over its limit)
 *   watch   node k, not committing, polls until it sees the manifest
 *
 * It uses only the public interfaces of commit.h, store.h, storage.h and
 * format.h, so it measures any commit behind them. Every call to the
 * storage goes through a counting wrapper (scale_store.h), which may wait
 * a fixed time per call. One JSON line per measurement on stdout.
 *
 * Threads: gen writes nodes from --threads threads (the backend's calls
 * are thread-safe); commit and watch poll from the main thread.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "commit.h"
#include "scale_store.h"

#define DTYPE_F32 12
#define COLS 4 /* each tensor: [world, COLS] F32, one row per rank */
#define ROW_BYTES (COLS * 4)
#define DEADLINE_NS (7LL * 24 * 3600 * 1000000000) /* the parts may be days old */

struct opts {
	const char *cmd, *root, *job, *run;
	int nodes, ranks, tensors, steps, threads;
	int64_t step; /* commit, watch: which step (0: the last generated) */
	int leave_out; /* gen: this node's part of the last step is not written (-1: none) */
	int node; /* watch: which node */
	int64_t latency_us;
	double cap_s;
	int stuck_polls; /* commit: polls with every part in and no manifest: stuck */
	bool explain; /* commit: once stuck or capped, one poll at the deadline for the reason */
};

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double ms_since(int64_t t)
{
	return (double)(mono_ns() - t) / 1e6;
}

/* This process's resident set now, in KiB (/proc/self/statm). */
static long rss_now_kb(void)
{
	long pages = 0, res = 0;
	FILE *f = fopen("/proc/self/statm", "r");

	if (f) {
		if (fscanf(f, "%ld %ld", &pages, &res) != 2)
			res = 0;
		fclose(f);
	}
	return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static long rss_peak_kb(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss;
}

static void node_name(int n, char *buf, size_t len)
{
	snprintf(buf, len, "n%05d", n);
}

/* A JSON string: quotes and backslashes escaped, control characters dropped. */
static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		if (*s == '"' || *s == '\\')
			fputc('\\', f);
		if ((unsigned char)*s >= 0x20)
			fputc(*s, f);
	}
	fputc('"', f);
}

/* What every line starts with: the phase and the root's shape. */
static void line_head(const struct opts *o, const char *phase)
{
	printf("{\"bench\": \"scale\", \"phase\": \"%s\", \"nodes\": %d, \"ranks_per_node\": %d, "
	       "\"tensors\": %d, \"world\": %d, \"chunks\": %lld, \"latency_us\": %" PRId64,
	       phase, o->nodes, o->ranks, o->tensors, o->nodes * o->ranks,
	       (long long)o->nodes * o->ranks * o->tensors, o->latency_us);
}

/* The local backend at o->root as `node`, wrapped in the counting storage. */
static int open_store(const struct opts *o, const char *node, struct ioeng **io,
                      struct storage **out, char *err)
{
	const struct ioeng_opts eo = {IOENG_AUTO, 64, NULL};
	struct storage *in = NULL;
	int rc;

	*out = NULL;
	rc = ioeng_create(&eo, io, err);
	if (rc)
		return rc;
	const struct local_opts lo = {o->root, node, *io, NULL, false};

	rc = local_create(&lo, &in, err);
	if (rc == 0)
		rc = cs_create(in, o->latency_us, out, err);
	if (rc && in)
		storage_destroy(in);
	if (rc) {
		ioeng_destroy(*io);
		*io = NULL;
	}
	return rc;
}

/* ---- gen ---------------------------------------------------------------- */

struct gen {
	const struct opts *o;
	struct storage *s;
	int world;
	struct st_tensor *st; /* the tensors of every rank's file: names, shape [1, COLS] */
	char (*names)[16];
	atomic_int next; /* the next node to write */
	atomic_int rc;
	atomic_ullong shard_bytes;
	pthread_mutex_t mu;
	char err[IPC_ERRLEN]; /* the first failure */
};

static int gen_fail(struct gen *g, int rc, const char *what)
{
	int zero = 0;

	pthread_mutex_lock(&g->mu);
	if (atomic_compare_exchange_strong(&g->rc, &zero, rc))
		snprintf(g->err, sizeof(g->err), "%s", what);
	pthread_mutex_unlock(&g->mu);
	return rc;
}

/* Rank r's tensors, one chunk each (its row); hl: its file's header (0: a plan, no bytes). */
static struct manifest_tensor *rank_tensors(struct gen *g, int r, uint64_t hl, const float *data)
{
	struct manifest_tensor *v = calloc((size_t)g->o->tensors, sizeof(*v));

	for (int i = 0; v && i < g->o->tensors; i++) {
		struct manifest_tensor *t = &v[i];
		struct manifest_chunk *c = calloc(1, sizeof(*c));

		*t = (struct manifest_tensor){.name = strdup(g->names[i]),
		                              .dtype = DTYPE_F32,
		                              .ndim = 2,
		                              .global_shape = {g->world, COLS},
		                              .sharded = true,
		                              .nchunks = 1,
		                              .chunks = c};
		if (!c || !t->name)
			return NULL; /* out of memory: the generator stops */
		*c =
		    (struct manifest_chunk){.rank = r, .global_offset = {r, 0}, .shape = {1, COLS}};
		if (data) {
			c->begin = hl + (uint64_t)i * ROW_BYTES;
			c->end = c->begin + ROW_BYTES;
			c->xxh3 = XXH3_64bits(data + i * COLS, ROW_BYTES);
		}
	}
	return v;
}

/* Node n's plans file: its ranks and their tensors. */
static int gen_plans(struct gen *g, int n, const char *node, char *err)
{
	struct plans_file *f = calloc(1, sizeof(*f));
	bool written;
	int rc = -ENOMEM;

	if (!f)
		return ipc_errf(err, rc, "out of memory");
	*f = (struct plans_file){PLANS_VERSION,
	                         strdup(g->o->job),
	                         strdup(node),
	                         strdup(g->o->run),
	                         g->world,
	                         .nranks = (size_t)g->o->ranks,
	                         .ranks = calloc((size_t)g->o->ranks, sizeof(struct plans_rank))};
	for (int j = 0; f->ranks && j < g->o->ranks; j++) {
		int r = n * g->o->ranks + j;

		f->ranks[j] = (struct plans_rank){r, 1, (size_t)g->o->tensors, NULL};
		if (!(f->ranks[j].tensors = rank_tensors(g, r, 0, NULL)))
			goto free_plans;
	}
	if (f->job && f->node && f->run && f->ranks)
		rc = store_put_plans(g->s, f, &written, err);
free_plans:
	if (rc == -ENOMEM)
		ipc_errf(err, rc, "out of memory building plans/%s.json", node);
	plans_free(f);
	return rc;
}

/* The header of rank r's file, with the stamp's placeholders: *at where they are. */
static int rank_header(struct gen *g, int r, void **hdr, size_t *hl, struct st_stamp_at *at,
                       char *err)
{
	char rank[16], world[16];
	const struct st_meta meta[] = {
	    {"format", "pt"},        {"producer", "ckptd"},   {"job", g->o->job},
	    {"run", g->o->run},      {"rank", rank},          {"world", world},
	    {"step", ST_STAMP_STEP}, {"save", ST_STAMP_SAVE},
	};
	int rc;

	snprintf(rank, sizeof(rank), "%d", r);
	snprintf(world, sizeof(world), "%d", g->world);
	rc = st_header_build(g->st, (size_t)g->o->tensors, meta, sizeof(meta) / sizeof(meta[0]),
	                     hdr, hl, err);
	if (rc == 0)
		rc = st_stamp_find(*hdr, *hl, at, err);
	return rc;
}

/* Writes the shard `file` of (job, step): its stamped header, then its rows. */
static int write_shard(struct gen *g, int64_t step, const char *file, const void *hdr, size_t hl,
                       const float *data, char *err)
{
	const size_t dl = (size_t)g->o->tensors * ROW_BYTES;
	char path[1024];
	int fd, rc = 0;

	g->s->ops->shard_path(g->s, g->o->job, step, file, path, sizeof(path));
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return ipc_errf(err, -errno, "creating %s: %s", path, strerror(errno));
	if (pwrite(fd, hdr, hl, 0) != (ssize_t)hl || pwrite(fd, data, dl, (off_t)hl) != (ssize_t)dl)
		rc = ipc_errf(err, -EIO, "writing %s: %s (is the disk full?)", path,
		              strerror(errno));
	close(fd);
	atomic_fetch_add(&g->shard_bytes, hl + dl);
	return rc;
}

/* The save's random number of (step, rank): deterministic, never 0. */
static uint64_t save_of(int64_t step, int r)
{
	uint64_t x = ((uint64_t)step << 32 | (uint32_t)r) + 0x9e3779b97f4a7c15ull;

	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return (x ^ (x >> 31)) | 1;
}

/* Rank r's file of one step and its entry in the part. */
static int gen_rank(struct gen *g, const char *node, int64_t step, int r, void *hdr, size_t hl,
                    const struct st_stamp_at *at, struct part_rank *k, char *err)
{
	const struct st_stamp stamp = {step, save_of(step, r)};
	const int64_t now = ipc_now_ns();
	float *data = malloc((size_t)g->o->tensors * ROW_BYTES);
	char file[SHARD_FILE_MAX];
	int rc;

	if (!data)
		return ipc_errf(err, -ENOMEM, "out of memory");
	for (int i = 0; i < g->o->tensors * COLS; i++)
		data[i] = (float)r + (float)(i % COLS) / 8 + (float)step * 1000 + (float)(i / COLS);
	st_stamp_apply(at, &stamp, 0, hdr, hl);
	rc = shard_file_name(r, node, 0, file, sizeof(file));
	if (rc == 0)
		rc = write_shard(g, step, file, hdr, hl, data, err);
	*k = (struct part_rank){.rank = r,
	                        .file = strdup(file),
	                        .size = hl + (uint64_t)g->o->tensors * ROW_BYTES,
	                        .header_bytes = hl,
	                        .save = stamp.save,
	                        .queued_unix_ns = now,
	                        .captured_unix_ns = now,
	                        .durable_unix_ns = now,
	                        .ntensors = (size_t)g->o->tensors,
	                        .tensors = rc ? NULL : rank_tensors(g, r, hl, data)};
	free(data);
	if (rc == 0 && (!k->file || !k->tensors))
		rc = ipc_errf(err, -ENOMEM, "out of memory");
	return rc;
}

/* Node n's files and part of one step (its part left out where asked). */
static int gen_step(struct gen *g, int n, const char *node, int64_t step, void **hdrs,
                    const size_t *hls, const struct st_stamp_at *ats, char *err)
{
	struct part *p = calloc(1, sizeof(*p));
	int rc = p ? 0 : -ENOMEM;

	if (p)
		*p = (struct part){.version = PART_VERSION,
		                   .job = strdup(g->o->job),
		                   .run = strdup(g->o->run),
		                   .node = strdup(node),
		                   .step = step,
		                   .world = g->world,
		                   .time_unix_ns = ipc_now_ns(),
		                   .nranks = (size_t)g->o->ranks,
		                   .ranks = calloc((size_t)g->o->ranks, sizeof(struct part_rank))};
	if (rc || !p->job || !p->run || !p->node || !p->ranks)
		rc = ipc_errf(err, -ENOMEM, "out of memory");
	for (int j = 0; rc == 0 && j < g->o->ranks; j++)
		rc = gen_rank(g, node, step, n * g->o->ranks + j, hdrs[j], hls[j], &ats[j],
		              &p->ranks[j], err);
	if (rc == 0 && !(n == g->o->leave_out && step == g->o->steps))
		rc = store_put_part(g->s, p, err);
	part_free(p);
	return rc;
}

/* Node n: its plans, its ranks' headers (built once), then every step. */
static int gen_node(struct gen *g, int n, char *err)
{
	const int R = g->o->ranks;
	void **hdrs = calloc((size_t)R, sizeof(*hdrs));
	size_t *hls = calloc((size_t)R, sizeof(*hls));
	struct st_stamp_at *ats = calloc((size_t)R, sizeof(*ats));
	char node[32];
	int rc = hdrs && hls && ats ? 0 : ipc_errf(err, -ENOMEM, "out of memory");

	node_name(n, node, sizeof(node));
	if (rc == 0)
		rc = gen_plans(g, n, node, err);
	for (int j = 0; rc == 0 && j < R; j++)
		rc = rank_header(g, n * R + j, &hdrs[j], &hls[j], &ats[j], err);
	for (int64_t step = 1; rc == 0 && step <= g->o->steps; step++)
		rc = gen_step(g, n, node, step, hdrs, hls, ats, err);
	for (int j = 0; hdrs && j < R; j++)
		free(hdrs[j]);
	free(hdrs);
	free(hls);
	free(ats);
	return rc;
}

static void *gen_worker(void *arg)
{
	struct gen *g = arg;
	char err[IPC_ERRLEN];
	int n;

	while (atomic_load(&g->rc) == 0 && (n = atomic_fetch_add(&g->next, 1)) < g->o->nodes)
		if (gen_node(g, n, err))
			gen_fail(g, -1, err);
	return NULL;
}

/* The step directories and their parts/, made before the writers start. */
static int gen_dirs(struct gen *g, char *err)
{
	char path[1024];

	for (int64_t step = 1; step <= g->o->steps; step++) {
		g->s->ops->shard_path(g->s, g->o->job, step, "parts", path, sizeof(path));
		*strrchr(path, '/') = '\0';
		if (mkdir(path, 0755) && errno != EEXIST)
			return ipc_errf(err, -errno, "making %s: %s", path, strerror(errno));
		strcat(path, "/parts");
		if (mkdir(path, 0755) && errno != EEXIST)
			return ipc_errf(err, -errno, "making %s: %s", path, strerror(errno));
	}
	return 0;
}

/* The tensors' names and their place in every rank's file. */
static int gen_tensors(struct gen *g)
{
	static const int64_t shape[2] = {1, COLS};

	g->names = calloc((size_t)g->o->tensors, sizeof(*g->names));
	g->st = calloc((size_t)g->o->tensors, sizeof(*g->st));
	if (!g->names || !g->st)
		return -ENOMEM;
	for (int i = 0; i < g->o->tensors; i++) {
		snprintf(g->names[i], sizeof(g->names[i]), "t%05d", i);
		g->st[i] = (struct st_tensor){g->names[i],
		                              DTYPE_F32,
		                              2,
		                              shape,
		                              (uint64_t)i * ROW_BYTES,
		                              (uint64_t)(i + 1) * ROW_BYTES};
	}
	return 0;
}

/* The bytes of the parts of the last step, as written (a stat of each, not counted). */
static uint64_t parts_bytes(struct gen *g)
{
	struct storage *in = cs_inner(g->s);
	char key[STORE_KEY_MAX], node[32], err[IPC_ERRLEN];
	uint64_t sum = 0, size;

	for (int n = 0; n < g->o->nodes; n++) {
		node_name(n, node, sizeof(node));
		store_part_key(key, sizeof(key), g->o->job, g->o->steps, node);
		if (in->ops->obj_stat(in, key, &size, err) == 0)
			sum += size;
	}
	return sum;
}

static int run_gen(const struct opts *o, char *err)
{
	struct gen g = {.o = o, .world = o->nodes * o->ranks, .mu = PTHREAD_MUTEX_INITIALIZER};
	struct ioeng *io = NULL;
	pthread_t *th = calloc((size_t)o->threads, sizeof(*th));
	uint32_t owner;
	int rc, started = 0;
	int64_t t0 = mono_ns();

	if (!th || gen_tensors(&g))
		return ipc_errf(err, -ENOMEM, "out of memory");
	rc = open_store(o, "gen", &io, &g.s, err);
	if (rc == 0 && store_owner_get(g.s, o->job, &owner, err) != -ENOENT)
		rc = ipc_errf(err, -EEXIST,
		              "job %s is in %s already: generate into an empty root (--root)",
		              o->job, o->root);
	if (rc == 0)
		rc = store_owner_claim(g.s, o->job, (uint32_t)getuid(), &owner, err);
	if (rc == 0)
		rc = gen_dirs(&g, err);
	for (; rc == 0 && started < o->threads; started++)
		if (pthread_create(&th[started], NULL, gen_worker, &g))
			rc = ipc_errf(err, -EAGAIN, "starting a generator thread");
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	if (rc == 0 && (rc = atomic_load(&g.rc)))
		snprintf(err, IPC_ERRLEN, "%s", g.err);
	if (rc == 0) {
		line_head(o, "gen");
		printf(
		    ", \"steps\": %d, \"threads\": %d, \"wall_ms\": %.1f, \"shard_bytes\": %llu, "
		    "\"parts_bytes_per_step\": %" PRIu64 ", \"left_out\": %d}\n",
		    o->steps, o->threads, ms_since(t0),
		    (unsigned long long)atomic_load(&g.shard_bytes), parts_bytes(&g), o->leave_out);
	}
	storage_destroy(g.s);
	ioeng_destroy(io);
	free(th);
	free(g.names);
	free(g.st);
	return rc;
}

/* ---- commit and watch --------------------------------------------------- */

/* How a poll loop ended. */
struct outcome {
	struct commit_result r;
	unsigned polls;
	bool stuck, capped;
	double wall_ms; /* the first poll -> the last poll's return */
};

/* Polls c (at *next, as an agent) until it ends, is stuck (stuck_polls > 0), or the cap. */
static void poll_until(struct commit *c, const struct opts *o, int stuck_polls, struct outcome *u)
{
	const int64_t start = mono_ns(), cap = (int64_t)(o->cap_s * 1e9);
	int allin = 0;
	int64_t next;

	for (;;) {
		commit_poll(c, mono_ns(), &next, &u->r);
		u->polls++;
		u->wall_ms = ms_since(start);
		if (u->r.state != COMMIT_WAITING)
			return;
		/* every part seen, the roster whole, and still no manifest */
		allin = u->r.nmissing == 0 && u->r.ndone > 0 ? allin + 1 : 0;
		if (stuck_polls > 0 && allin >= stuck_polls) {
			u->stuck = true;
			return;
		}
		if (mono_ns() - start >= cap) {
			u->capped = true;
			return;
		}
		commit_result_free(&u->r);
		for (int64_t now = mono_ns(); now < next && now - start < cap; now = mono_ns()) {
			int64_t d = next - now < 1000000000 ? next - now : 1000000000;
			struct timespec ts = {d / 1000000000, d % 1000000000};

			nanosleep(&ts, NULL);
		}
	}
}

static const char *state_text(const struct outcome *u)
{
	if (u->stuck)
		return "STUCK";
	if (u->capped)
		return "CAPPED";
	return u->r.state == COMMIT_COMMITTED ? "COMMITTED"
	       : u->r.state == COMMIT_FAILED  ? "FAILED"
	                                      : "WAITING";
}

/* The manifest's size in the root (not counted), 0 if there is none. */
static uint64_t manifest_bytes(struct storage *s, const struct opts *o)
{
	struct storage *in = cs_inner(s);
	char key[STORE_KEY_MAX], err[IPC_ERRLEN];
	uint64_t size = 0;

	store_key(key, sizeof(key), o->job, o->step, "manifest.json");
	return in->ops->obj_stat(in, key, &size, err) == 0 ? size : 0;
}

/* The roster of node 0's run, read once and cached (commit_unclaimed): its cost. */
static int warm_roster(struct committer *cm, struct storage *s, const struct part *own,
                       const struct opts *o)
{
	int *local = malloc((own->nranks + 1) * sizeof(int)), free_ranks[64];
	struct cs_counts a, b, d;
	char why[IPC_ERRLEN] = "";
	size_t n = 0;
	int64_t t;
	int rc;

	if (!local)
		return -ENOMEM;
	for (size_t i = 0; i < own->nranks; i++)
		local[i] = own->ranks[i].rank;
	cs_counts(s, &a);
	t = mono_ns();
	rc = commit_unclaimed(cm, own->job, own->run, own->world, local, own->nranks, free_ranks,
	                      64, &n, why);
	line_head(o, "roster");
	printf(", \"step\": %" PRId64 ", \"wall_ms\": %.1f, \"rc\": %d, \"unclaimed\": %zu, "
	       "\"ops\": ",
	       o->step, ms_since(t), rc, n);
	cs_counts(s, &b);
	cs_diff(&b, &a, &d);
	cs_json(&d, stdout);
	printf(", \"problem\": ");
	json_str(stdout, why);
	printf("}\n");
	fflush(stdout);
	free(local);
	return rc;
}

/* One poll at the deadline: the reason the step could not commit (the poll's own cost). */
static void explain(struct commit *c, int64_t t0, struct outcome *u)
{
	struct commit_result r;
	int64_t next, t = mono_ns();

	commit_poll(c, t0 + DEADLINE_NS, &next, &r);
	printf(", \"explain_ms\": %.1f, \"explain_state\": \"%s\", \"reason\": ", ms_since(t),
	       r.state == COMMIT_FAILED ? "FAILED" : "other");
	json_str(stdout, r.reason[0] ? r.reason : u->r.reason);
	commit_result_free(&r);
}

/* The measurement's line: state, times, memory, the manifest, the storage's calls. */
static void print_poll_line(const struct opts *o, const char *phase, struct storage *s,
                            const struct outcome *u, long rss_before, long peak,
                            const struct cs_counts *d)
{
	line_head(o, phase);
	printf(", \"step\": %" PRId64 ", \"state\": \"%s\", \"polls\": %u, \"wall_ms\": %.1f, "
	       "\"rss_before_kb\": %ld, \"peak_rss_kb\": %ld, \"manifest_bytes\": %" PRIu64
	       ", \"wrote\": %s, \"missing\": %zu, \"ops\": ",
	       o->step, state_text(u), u->polls, u->wall_ms, rss_before, peak, manifest_bytes(s, o),
	       u->r.wrote ? "true" : "false", u->r.nmissing);
	printf(", \"calls\": %" PRIu64, cs_json(d, stdout));
}

/* Node `n`'s part of the step read back, its committer made (the own part's cost said). */
static int start_node(const struct opts *o, struct storage *s, int n, struct committer **cm,
                      struct part **own, char *err)
{
	char node[32];
	const struct commit_opts co = {s, node, DEADLINE_NS, false};
	int rc;

	node_name(n, node, sizeof(node));
	rc = committer_create(&co, cm, err);
	if (rc == 0)
		rc = store_read_part(s, o->job, o->step, node, own, err);
	return rc;
}

static int run_poll(const struct opts *o, bool committing, char *err)
{
	const int n = committing ? 0 : o->node;
	struct storage *s = NULL;
	struct ioeng *io = NULL;
	struct committer *cm = NULL;
	struct commit *c = NULL;
	struct part *own = NULL;
	struct outcome u = {0};
	struct cs_counts a, b, d;
	char node[32];
	long rss_before, peak;
	int64_t t0;
	int rc;

	node_name(n, node, sizeof(node));
	rc = open_store(o, node, &io, &s, err);
	if (rc == 0)
		rc = start_node(o, s, n, &cm, &own, err);
	if (rc == 0 && committing && (rc = warm_roster(cm, s, own, o)))
		ipc_errf(err, rc, "reading the roster of job %s: %s", o->job, strerror(-rc));
	if (rc)
		goto close_store;
	rss_before = rss_now_kb();
	cs_counts(s, &a);
	t0 = mono_ns();
	rc = commit_create(cm, own, committing, t0, &c, err);
	if (rc)
		goto close_store;
	own = NULL; /* the commit's now */
	poll_until(c, o, committing ? o->stuck_polls : 0, &u);
	peak = rss_peak_kb();
	cs_counts(s, &b);
	cs_diff(&b, &a, &d);
	print_poll_line(o, committing ? "commit" : "watch", s, &u, rss_before, peak, &d);
	if (u.r.state == COMMIT_WAITING && o->explain)
		explain(c, t0, &u);
	else {
		printf(", \"reason\": ");
		json_str(stdout, u.r.reason);
	}
	printf(", \"node\": \"%s\"}\n", node);
	commit_result_free(&u.r);
close_store:
	commit_destroy(c);
	part_free(own);
	committer_destroy(cm);
	storage_destroy(s);
	ioeng_destroy(io);
	return rc;
}

/* ---- main --------------------------------------------------------------- */

static void usage(void)
{
	fprintf(
	    stderr,
	    "usage: scale_bench gen|commit|watch --root DIR [--job J] [--run R]\n"
	    "         [--nodes N] [--ranks R] [--tensors T] [--steps S] [--threads K]\n"
	    "         [--leave-out NODE] [--step S] [--node K] [--op-latency-us US]\n"
	    "         [--cap-s SECONDS] [--stuck-polls P] [--no-explain]\n"
	    "  gen: a root of N nodes x R ranks x T tensors, S steps (defaults 4 x 8 x 300, 2)\n"
	    "  commit: step S (default: --steps) committed as node n00000 would\n"
	    "  watch: node K (default 1) polls until it sees step S committed\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
	    {"root", 1, 0, 'r'},  {"job", 1, 0, 'j'},         {"run", 1, 0, 'u'},
	    {"nodes", 1, 0, 'n'}, {"ranks", 1, 0, 'k'},       {"tensors", 1, 0, 't'},
	    {"steps", 1, 0, 's'}, {"threads", 1, 0, 'T'},     {"leave-out", 1, 0, 'L'},
	    {"step", 1, 0, 'S'},  {"node", 1, 0, 'N'},        {"op-latency-us", 1, 0, 'l'},
	    {"cap-s", 1, 0, 'c'}, {"stuck-polls", 1, 0, 'p'}, {"no-explain", 0, 0, 'x'},
	    {0, 0, 0, 0}};
	long nproc = sysconf(_SC_NPROCESSORS_ONLN);
	int ch;

	*o = (struct opts){.job = "scale",
	                   .run = "r1",
	                   .nodes = 4,
	                   .ranks = 8,
	                   .tensors = 300,
	                   .steps = 2,
	                   .threads = nproc > 0 ? (int)nproc : 1,
	                   .leave_out = -1,
	                   .node = 1,
	                   .cap_s = 600,
	                   .stuck_polls = 1,
	                   .explain = true};
	if (argc < 2)
		return -EINVAL;
	o->cmd = argv[1];
	while ((ch = getopt_long(argc - 1, argv + 1, "", lo, NULL)) != -1) {
		switch (ch) {
		case 'r':
			o->root = optarg;
			break;
		case 'j':
			o->job = optarg;
			break;
		case 'u':
			o->run = optarg;
			break;
		case 'n':
			o->nodes = atoi(optarg);
			break;
		case 'k':
			o->ranks = atoi(optarg);
			break;
		case 't':
			o->tensors = atoi(optarg);
			break;
		case 's':
			o->steps = atoi(optarg);
			break;
		case 'T':
			o->threads = atoi(optarg);
			break;
		case 'L':
			o->leave_out = atoi(optarg);
			break;
		case 'S':
			o->step = atoll(optarg);
			break;
		case 'N':
			o->node = atoi(optarg);
			break;
		case 'l':
			o->latency_us = atoll(optarg);
			break;
		case 'c':
			o->cap_s = atof(optarg);
			break;
		case 'p':
			o->stuck_polls = atoi(optarg);
			break;
		case 'x':
			o->explain = false;
			break;
		default:
			return -EINVAL;
		}
	}
	if (!o->step)
		o->step = o->steps;
	if (!o->root || o->nodes < 1 || o->ranks < 1 || o->tensors < 1 || o->steps < 1 ||
	    o->threads < 1 || (long)o->nodes * o->ranks > IPC_MAX_WORLD || o->latency_us < 0 ||
	    o->step < 1 || o->step > o->steps ||
	    (strcmp(o->cmd, "watch") == 0 && (o->node < 0 || o->node >= o->nodes)))
		return -EINVAL;
	return 0;
}

int main(int argc, char **argv)
{
	char err[IPC_ERRLEN] = "";
	struct opts o;
	int rc;

	if (parse(argc, argv, &o)) {
		usage();
		return 2;
	}
	if (strcmp(o.cmd, "gen") == 0)
		rc = run_gen(&o, err);
	else if (strcmp(o.cmd, "commit") == 0 || strcmp(o.cmd, "watch") == 0)
		rc = run_poll(&o, strcmp(o.cmd, "commit") == 0, err);
	else {
		usage();
		return 2;
	}
	fflush(stdout);
	if (rc)
		fprintf(stderr, "scale_bench %s: %s\n", o.cmd, err);
	return rc ? 1 : 0;
}
