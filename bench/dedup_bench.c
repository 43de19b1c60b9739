/*
 * Replicas written once: R data-parallel replicas (one process each, a
 * client of its own) hold the same model: four float32 tensors of 1, 2, 3
 * and 4 tenths of M MiB (sizes that do not divide evenly among the ranks). Each rank saves step 1
 * (the plan set is then complete on every agent), then step 2, timed from its ckpt_save to
 * COMMITTED. With copies CKPT_COPIES_ALL every replica writes its own copy (dedup off); with the
 * default, each box is written once, the writers balanced (dedup on).
 * Prints one JSON line per run: replicas, dedup, the slowest rank's seconds
 * and the job (bench/dedup_run.sh reads its bytes from `ckptctl show`).
 * With --restore (dedup on alone), the ranks then meet (every plan made)
 * and restore LATEST together, timed: the slowest rank's restore seconds
 * too (bench/dedup_run.sh compares agents with and without read-once).
 * With --nodes N --node I, only the ranks r with r % N == I run here (dedup
 * on alone): a node's trainers, the other nodes' ranks run by other
 * invocations through their own agents (bench/dedup_run.sh --first). With
 * --meet DIR too, the ranks of every invocation meet there once their plans
 * are made, before step 1 (as a data-parallel job's ranks meet before its
 * first step); without, each saves at once. Step 1's seconds are printed
 * too ("first_seconds"), from its ckpt_save.
 *
 *   dedup_bench --endpoint E [--job J] [--replicas 4,8] [--mib M] [--reps N] [--restore]
 *               [--nodes N --node I [--meet DIR]]
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/ckpt.h"
#include "bench/bench_ranks.h"

#define NT 4
#define COLS 1024

static const char *endpoint, *job = "dedup";
static int64_t rows[NT];
static char meet[256]; /* --restore: where the ranks meet before restoring */
static bool meet_first; /* --meet: and before step 1 */
static bool restore;
static int nodes = 1, node; /* --nodes, --node: this invocation's ranks */

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The ranks meet: each leaves a file in `meet`, then waits for all world of them. */
static void barrier(const char *name, int rank, int world)
{
	char path[512];
	int n = 0;

	snprintf(path, sizeof(path), "%s/%s.%d", meet, name, rank);
	fclose(fopen(path, "w"));
	while (n < world) {
		n = 0;
		for (int r = 0; r < world; r++) {
			snprintf(path, sizeof(path), "%s/%s.%d", meet, name, r);
			n += access(path, F_OK) == 0;
		}
		usleep(1000);
	}
}

/* One replica: steps 1 and 2; step 2's seconds to fd (and a restore's, with --restore). */
static int rank_main(const char *name, int rank, int world, bool dedup, int fd)
{
	double rt = 0;
	struct ckpt_plan_opts po = CKPT_PLAN_OPTS_INIT;
	int64_t shape[NT][2], off[2] = {0, 0};
	struct ckpt_tensor t[NT];
	char names[NT][8];
	struct ckpt_client *cl;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	size_t total = 0;
	double t0 = 0, dt = 0, dt1 = 0;
	float *a;

	for (int k = 0; k < NT; k++)
		total += (size_t)rows[k] * COLS;
	if (ckpt_connect(endpoint, &cl) || ckpt_host_alloc(cl, total * 4, (void **)&a))
		return 10;
	for (size_t i = 0; i < total; i++)
		a[i] = (float)(i % 65521);
	for (int64_t k = 0, at = 0; k < NT; at += rows[k] * COLS, k++) {
		snprintf(names[k], sizeof(names[k]), "t%d", (int)k);
		shape[k][0] = rows[k];
		shape[k][1] = COLS;
		t[k] = (struct ckpt_tensor){names[k], CKPT_F32, 2, shape[k], a + at, shape[k], off};
	}
	po.copies = dedup ? 0 : CKPT_COPIES_ALL;
	if (ckpt_plan_create_opts(cl, name, rank, world, t, NT, &po, &p))
		return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(cl)), 11;
	if (meet_first)
		barrier(name, rank, world);
	for (int step = 1; step <= 2; step++) {
		t0 = now();
		if (ckpt_save(p, step, NULL, &s) || ckpt_save_wait(s, CKPT_COMMITTED, 600000))
			return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(cl)), 12;
		dt = now() - t0;
		dt1 = step == 1 ? dt : dt1;
		ckpt_save_release(s);
	}
	if (restore) {
		barrier(name, rank, world);
		t0 = now();
		if (ckpt_restore(p, CKPT_LATEST, NULL, NULL))
			return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(cl)), 13;
		rt = now() - t0;
	}
	dprintf(fd, "%.6f %.6f %.6f\n", dt, rt, dt1);
	ckpt_plan_destroy(p);
	ckpt_disconnect(cl);
	return 0;
}

struct job {
	const char *name;
	bool dedup;
	int world; /* the job's; this invocation runs world / nodes of its ranks */
};

static int rank_of(int rank, int world, void *arg, int fd)
{
	const struct job *j = arg;

	(void)world;
	return rank_main(j->name, rank * nodes + node, j->world, j->dedup, fd);
}

/* The slowest rank's save, restore and first save seconds. */
static void line_of(const char *line, void *acc)
{
	double *slowest = acc, v[3] = {0, 0, 0};

	sscanf(line, "%lf %lf %lf", &v[0], &v[1], &v[2]);
	for (int i = 0; i < 3; i++)
		slowest[i] = v[i] > slowest[i] ? v[i] : slowest[i];
}

static int run(const char *name, int world, bool dedup, double *slowest)
{
	struct job j = {name, dedup, world};

	slowest[0] = slowest[1] = slowest[2] = 0;
	return fanout(world / nodes, rank_of, &j, line_of, slowest);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"endpoint", 1, 0, 'e'}, {"job", 1, 0, 'j'},
	                                     {"replicas", 1, 0, 'r'}, {"mib", 1, 0, 'm'},
	                                     {"reps", 1, 0, 'n'},     {"restore", 0, 0, 'R'},
	                                     {"nodes", 1, 0, 'N'},    {"node", 1, 0, 'I'},
	                                     {"meet", 1, 0, 'M'},     {0, 0, 0, 0}};
	const char *replicas = "4,8";
	int reps = 3, o;
	long mib = 256;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (o == 'e')
			endpoint = optarg;
		else if (o == 'j')
			job = optarg;
		else if (o == 'r')
			replicas = optarg;
		else if (o == 'm')
			mib = atol(optarg);
		else if (o == 'n')
			reps = atoi(optarg);
		else if (o == 'R')
			restore = true;
		else if (o == 'N')
			nodes = atoi(optarg);
		else if (o == 'I')
			node = atoi(optarg);
		else if (o == 'M')
			meet_first = snprintf(meet, sizeof(meet), "%s", optarg) > 0;
		else
			return 2;
	}
	if (!meet_first)
		snprintf(meet, sizeof(meet), "/tmp/dedup_bench.XXXXXX");
	if (restore && !meet_first && !mkdtemp(meet))
		return perror("mkdtemp"), 1;
	if (!endpoint || mib < 4 || nodes < 1 || node < 0 || node >= nodes ||
	    (nodes > 1 && restore)) {
		fprintf(stderr, "usage: dedup_bench --endpoint E [--job J] [--replicas 4,8] "
		                "[--mib M] [--reps N]\n");
		return 2;
	}
	for (int k = 0; k < NT; k++) /* 1, 2, 3 and 4 tenths of M */
		rows[k] = (int64_t)mib * (1 << 20) / 4 / COLS * (k + 1) / 10;
	for (int rep = 0; rep < reps; rep++)
		for (const char *w = replicas; *w; w += strcspn(w, ",") + (w[strcspn(w, ",")] != 0))
			for (int dedup = restore || nodes > 1; dedup < 2; dedup++) {
				int world = atoi(w);
				char name[128];
				double secs[3];

				snprintf(name, sizeof(name), "%s-r%d-%s-%d", job, world,
				         dedup ? "on" : "off", rep);
				if (world < 2 || world > 64 || world % nodes ||
				    run(name, world, dedup, secs))
					return fprintf(stderr, "dedup_bench: %s failed\n", name), 1;
				printf(
				    "{\"replicas\": %d, \"dedup\": %s, \"rep\": %d, \"seconds\": "
				    "%.6f, \"restore_seconds\": %.6f, \"first_seconds\": %.6f, "
				    "\"job\": \"%s\"}\n",
				    world, dedup ? "true" : "false", rep, secs[0], secs[1], secs[2],
				    name);
				fflush(stdout);
			}
	return 0;
}
