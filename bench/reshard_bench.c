/*
 * Restore into another layout: a job of world S saves two float32 tensors
 * of M MiB each in all, "rows" split on dimension 0 and "cols" split on
 * dimension 1; then worlds R... restore them (the same layout where R = S,
 * else each rank assembles its boxes from the saved ones), each beside the
 * baseline: the same bytes saved by world R and restored in the layout they
 * were saved in (job J-wR). Each rank is a process with a client of its
 * own; its ckpt_restore call is timed. Prints one JSON line per restore:
 * the world, whether it was the baseline, the slowest rank's seconds, the
 * bytes restored in all, and whether every byte came back right.
 *
 *   reshard_bench --endpoint E [--job J] [--save-world S] [--restore-worlds 8,4,2,1]
 *                 [--mib M] [--reps N]
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/ckpt.h"
#include "bench/bench_ranks.h"

static const char *endpoint, *job = "reshard", *job_of_run;
static int64_t rows_g, cols_g; /* each tensor [rows_g, cols_g] */

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static float value(int which, int64_t i, int64_t j)
{
	return (float)((which * 7919 + i * 131 + j) % 65521);
}

/* One rank: saves step 1, or restores LATEST and checks; writes its seconds to fd. */
static int rank_main(int rank, int world, bool save, int fd)
{
	const int64_t r = rows_g / world, c = cols_g / world;
	int64_t g[2] = {rows_g, cols_g}, sr[2] = {r, cols_g}, orr[2] = {r * rank, 0};
	int64_t sc[2] = {rows_g, c}, oc[2] = {0, c * rank};
	struct ckpt_tensor t[2];
	struct ckpt_client *cl;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	float *a, *b;
	double t0, dt = 0;
	int bad = 0;

	if (ckpt_connect(endpoint, &cl) ||
	    ckpt_host_alloc(cl, (size_t)(r * cols_g + rows_g * c) * 4, (void **)&a))
		return 10;
	b = a + r * cols_g;
	t[0] = (struct ckpt_tensor){"rows", CKPT_F32, 2, sr, a, g, orr};
	t[1] = (struct ckpt_tensor){"cols", CKPT_F32, 2, sc, b, g, oc};
	for (int64_t i = 0; i < r; i++)
		for (int64_t j = 0; j < cols_g; j++)
			a[i * cols_g + j] = save ? value(0, orr[0] + i, j) : -1;
	for (int64_t i = 0; i < rows_g; i++)
		for (int64_t j = 0; j < c; j++)
			b[i * c + j] = save ? value(1, i, oc[1] + j) : -1;
	if (ckpt_plan_create(cl, job_of_run, rank, world, t, 2, &p))
		return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(cl)), 11;
	if (save) {
		if (ckpt_save(p, 1, NULL, &s) || ckpt_save_wait(s, CKPT_COMMITTED, 600000))
			return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(cl)), 12;
		ckpt_save_release(s);
	} else {
		t0 = now();
		if (ckpt_restore(p, CKPT_LATEST, NULL, NULL))
			return fprintf(stderr, "rank %d: %s\n", rank, ckpt_last_error(cl)), 13;
		dt = now() - t0;
		for (int64_t i = 0; i < r && !bad; i++)
			for (int64_t j = 0; j < cols_g && !bad; j++)
				bad = a[i * cols_g + j] != value(0, orr[0] + i, j);
		for (int64_t i = 0; i < rows_g && !bad; i++)
			for (int64_t j = 0; j < c && !bad; j++)
				bad = b[i * c + j] != value(1, i, oc[1] + j);
	}
	dprintf(fd, "%.6f %d\n", dt, bad);
	ckpt_plan_destroy(p);
	ckpt_disconnect(cl);
	return 0;
}

struct outcome {
	double slowest;
	bool exact;
};

static int rank_of(int rank, int world, void *save, int fd)
{
	return rank_main(rank, world, *(bool *)save, fd);
}

static void line_of(const char *line, void *acc)
{
	struct outcome *o = acc;
	const char *sp = strchr(line, ' ');

	o->slowest = atof(line) > o->slowest ? atof(line) : o->slowest;
	o->exact = o->exact && sp && atoi(sp + 1) == 0;
}

/* world ranks at once; the slowest one's seconds, and whether all came back right. */
static int run(int world, bool save, double *slowest, bool *exact)
{
	struct outcome o = {0, true};
	int rc = fanout(world, rank_of, &save, line_of, &o);

	*slowest = o.slowest;
	*exact = o.exact;
	return rc;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {{"endpoint", 1, 0, 'e'},
	                                     {"job", 1, 0, 'j'},
	                                     {"save-world", 1, 0, 's'},
	                                     {"mib", 1, 0, 'm'},
	                                     {"restore-worlds", 1, 0, 'r'},
	                                     {"reps", 1, 0, 'n'},
	                                     {0, 0, 0, 0}};
	const char *worlds = "8,4,2,1";
	char base[128];
	int save_world = 8, reps = 3, o;
	long mib = 64;
	double secs;
	bool exact;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (o == 'e')
			endpoint = optarg;
		else if (o == 'j')
			job = optarg;
		else if (o == 's')
			save_world = atoi(optarg);
		else if (o == 'r')
			worlds = optarg;
		else if (o == 'm')
			mib = atol(optarg);
		else if (o == 'n')
			reps = atoi(optarg);
		else
			return 2;
	}
	if (!endpoint || save_world < 1 || save_world > 64 || mib < 1) {
		fprintf(stderr, "usage: reshard_bench --endpoint E [--job J] [--save-world S] "
		                "[--restore-worlds 8,4,2,1] [--mib M] [--reps N]\n");
		return 2;
	}
	/* each tensor M/2 MiB, both dimensions divisible by 8 * 3 * ... : 1680 columns */
	cols_g = 1680;
	rows_g = (int64_t)mib * (1 << 20) / 2 / 4 / cols_g / 1680 * 1680;
	if (rows_g < 1680)
		rows_g = 1680;
	job_of_run = job;
	if (run(save_world, true, &secs, &exact))
		return fprintf(stderr, "reshard_bench: the save failed\n"), 1;
	/* the baselines: each world's own save */
	for (const char *w = worlds; *w; w += strcspn(w, ",") + (w[strcspn(w, ",")] != 0)) {
		int world = atoi(w);

		snprintf(base, sizeof(base), "%s-w%d", job, world);
		job_of_run = base;
		if (world < 1 || world > 64 || run(world, true, &secs, &exact))
			return fprintf(stderr, "reshard_bench: the save of world %d failed\n",
			               world),
			       1;
	}
	for (int rep = 0; rep < reps; rep++)
		for (const char *w = worlds; *w; w += strcspn(w, ",") + (w[strcspn(w, ",")] != 0))
			for (int baseline = 0; baseline < 2; baseline++) {
				int world = atoi(w);

				snprintf(base, sizeof(base), "%s-w%d", job, world);
				job_of_run = baseline ? base : job;
				if (run(world, false, &secs, &exact))
					return fprintf(stderr, "reshard_bench: world %d failed\n",
					               world),
					       1;
				printf("{\"save_world\": %d, \"world\": %d, \"baseline\": %s, "
				       "\"rep\": %d, "
				       "\"seconds\": %.6f, \"bytes\": %" PRId64
				       ", \"exact\": %s}\n",
				       baseline ? world : save_world, world,
				       baseline ? "true" : "false", rep, secs,
				       2 * rows_g * cols_g * 4, exact ? "true" : "false");
				fflush(stdout);
			}
	return 0;
}
