/*
 * cluster_bench: the trainers' side of the many-nodes benchmark
 * (bench/cluster_run.sh starts the agents and drives it). One rank per
 * agent, world N, each a client of its own agent: every step all ranks
 * save (MiB bytes each: half in T sharded tensors, --tensors, default 1,
 * and a private one), then each
 * waits for COMMITTED. Prints one line per step:
 *
 *   step S whole_ms W
 *
 * W: the first save call of the step to the last rank seeing COMMITTED,
 * the whole save as the job sees it. The commit latency of each step (the
 * last part durable to the manifest durable) is what the committing agent
 * logs; cluster_run.sh reads it there.
 *
 *   cluster_bench --job J --steps S --mib M --tensors T --warmup K ENDPOINT...
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/ckpt.h"

#define MAXR 64

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int die(struct ckpt_client *c, const char *what, int rc)
{
	fprintf(stderr, "cluster_bench: %s: %s\n", what,
	        c && *ckpt_last_error(c) ? ckpt_last_error(c) : ckpt_strerror(rc));
	return 1;
}

int main(int argc, char **argv)
{
	const char *job = "cbench";
	long steps = 20, warmup = 2, mib = 4, ntensors = 1;
	struct ckpt_client *c[MAXR];
	struct ckpt_plan *p[MAXR];
	struct ckpt_save *s[MAXR];
	int n = 0, i, rc;

	for (i = 1; i < argc && argv[i][0] == '-'; i += 2) {
		if (i + 1 >= argc)
			return fprintf(stderr, "cluster_bench: %s needs a value\n", argv[i]), 2;
		if (strcmp(argv[i], "--job") == 0)
			job = argv[i + 1];
		else if (strcmp(argv[i], "--steps") == 0)
			steps = atol(argv[i + 1]);
		else if (strcmp(argv[i], "--mib") == 0)
			mib = atol(argv[i + 1]);
		else if (strcmp(argv[i], "--warmup") == 0)
			warmup = atol(argv[i + 1]);
		else if (strcmp(argv[i], "--tensors") == 0)
			ntensors = atol(argv[i + 1]);
		else
			return fprintf(stderr, "cluster_bench: unknown option %s\n", argv[i]), 2;
	}
	n = argc - i;
	if (n < 1 || n > MAXR || mib < 1 || ntensors < 1 || ntensors > 100000)
		return fprintf(stderr, "usage: cluster_bench [--job J] [--steps S] [--mib M] "
		                       "[--tensors T] [--warmup K] ENDPOINT...\n"),
		       2;
	for (int r = 0; r < n; r++) {
		/* half the bytes in ntensors sharded tensors of `per` F32 each, half private */
		int64_t half = (int64_t)mib << 19, per = half / 4 / ntensors;
		int64_t gshape[1] = {per * n}, lshape[1] = {per}, goff[1] = {per * r};
		int64_t oshape[1] = {half};
		struct ckpt_tensor *t = calloc((size_t)ntensors + 1, sizeof(*t));
		char(*names)[32] = calloc((size_t)ntensors + 1, sizeof(*names));
		void *mem;

		if (!t || !names)
			return die(NULL, "tensors", -ENOMEM);
		rc = ckpt_connect(argv[i + r], &c[r]);
		if (rc)
			return die(NULL, argv[i + r], rc);
		rc = ckpt_host_alloc(c[r], (size_t)half * 2, &mem);
		if (rc)
			return die(c[r], "host memory", rc);
		memset(mem, r + 1, (size_t)half * 2);
		for (long k = 0; k < ntensors; k++) {
			snprintf(names[k], sizeof(names[k]), ntensors == 1 ? "w" : "w%05ld", k);
			t[k] = (struct ckpt_tensor){
			    names[k], CKPT_F32, 1, lshape, (char *)mem + k * per * 4, gshape, goff};
		}
		snprintf(names[ntensors], sizeof(names[ntensors]), "opt.rank%d", r);
		t[ntensors] = (struct ckpt_tensor){names[ntensors],    CKPT_U8, 1,   oshape,
		                                   (char *)mem + half, NULL,    NULL};
		rc = ckpt_plan_create(c[r], job, r, n, t, (size_t)ntensors + 1, &p[r]);
		if (rc)
			return die(c[r], "plan", rc);
		free(t);
		free(names);
	}
	for (long k = 1; k <= warmup + steps; k++) {
		double t0 = now_ms();

		for (int r = 0; r < n; r++) {
			rc = ckpt_save(p[r], k, NULL, &s[r]);
			if (rc)
				return die(c[r], "save", rc);
		}
		for (int r = 0; r < n; r++) {
			rc = ckpt_save_wait(s[r], CKPT_COMMITTED, 600000);
			if (rc) {
				fprintf(stderr, "cluster_bench: step %ld rank %d: %s\n", k, r,
				        ckpt_save_reason(s[r]));
				return 1;
			}
			ckpt_save_release(s[r]);
		}
		if (k > warmup)
			printf("step %ld whole_ms %.3f\n", k, now_ms() - t0);
		fflush(stdout);
	}
	for (int r = 0; r < n; r++) {
		ckpt_plan_destroy(p[r]);
		ckpt_disconnect(c[r]);
	}
	return 0;
}
