/*
 * scale_gen.c: scale_bench gen (scale_bench.h). A root of the local backend
 * as N nodes' agents would have written it: OWNER, each node's plans, and
 * per step each rank's shard (a small safetensors file whose header is
 * built and stamped as the agent's, st_header_build and st_stamp_apply)
 * and each node's part naming it (store_put_part). Nodes are written by
 * --threads workers, each a node at a time (the backend's calls are
 * thread-safe).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "bench/scale_bench.h"
#include "storage/store.h"

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
		                              .global_shape = {g->world / g->o->replicas, COLS},
		                              .sharded = true,
		                              .nchunks = 1,
		                              .chunks = c};
		if (!c || !t->name)
			return NULL; /* out of memory: the generator stops */
		/* replicas of a box: ranks world / replicas apart (on other nodes) */
		*c = (struct manifest_chunk){.rank = r,
		                             .global_offset = {r % (g->world / g->o->replicas), 0},
		                             .shape = {1, COLS}};
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

		f->ranks[j] =
		    (struct plans_rank){.rank = r, .copies = 1, .ntensors = (size_t)g->o->tensors};
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

int run_gen(const struct opts *o, char *err)
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
