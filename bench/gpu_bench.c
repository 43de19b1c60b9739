/*
 * gpu_bench: the CUDA transport against the GPU's own limit (bench/gpu_run.sh
 * drives it, with fio and DCP async_save beside it).
 *
 *   gpu_bench --endpoint E [--sizes MiB,...] [--reps N]
 *
 * For each size, rep after rep, interleaved:
 *   reference  cudaMemcpy device-to-host into pinned memory (cudaHostAlloc)
 *   ckptd      one cudaMalloc'd tensor: the trainer's host thread in
 *              ckpt_save_on + ckpt_save_fence; save to CAPTURED (the capture:
 *              the GPU is idle before it, so this is the copy out); save to
 *              COMMITTED.
 * One JSON object per figure and repetition on stdout; the table is the
 * script's. The agent should keep few checkpoints (--keep-last 1).
 */
#ifndef CKPT_HAVE_CUDA_API
#define CKPT_HAVE_CUDA_API 1
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "client/ckpt.h"

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die_cuda(const char *what, cudaError_t e)
{
	fprintf(stderr, "gpu_bench: %s: %s (CUDA error %d)\n", what, cudaGetErrorString(e), (int)e);
	exit(1);
}

static void die_ckpt(const char *what, struct ckpt_client *c, int rc)
{
	fprintf(stderr, "gpu_bench: %s: %s (%s)\n", what, c ? ckpt_last_error(c) : "",
	        ckpt_strerror(rc));
	exit(1);
}

static void record(const char *metric, long mib, int rep, double seconds)
{
	printf("{\"metric\": \"%s\", \"mib\": %ld, \"rep\": %d, \"seconds\": %.9f}\n", metric, mib,
	       rep, seconds);
	fflush(stdout);
}

#define CUDA(x)                                                                                    \
	do {                                                                                       \
		cudaError_t e_ = (x);                                                              \
		if (e_ != cudaSuccess)                                                             \
			die_cuda(#x, e_);                                                          \
	} while (0)

static void run_size(struct ckpt_client *c, long mib, int reps, int64_t *step)
{
	uint64_t bytes = (uint64_t)mib << 20;
	int64_t shape[1] = {(int64_t)bytes};
	struct ckpt_tensor t = {"w", CKPT_U8, 1, shape, NULL, NULL, NULL};
	struct ckpt_plan *p;
	struct ckpt_save *s;
	cudaStream_t st;
	void *host;
	int rc;

	CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	CUDA(cudaMalloc(&t.data, bytes));
	CUDA(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
	CUDA(cudaMemset(t.data, 1, bytes));
	CUDA(cudaMemcpy(host, t.data, bytes, cudaMemcpyDeviceToHost)); /* warm */
	rc = ckpt_plan_create2(c, "gpu-bench", 0, 1, &t, 1, CKPT_BP_BLOCK, &p);
	if (rc)
		die_ckpt("ckpt_plan_create", c, rc);
	for (int rep = 1; rep <= reps; rep++) {
		double t0, t1, t2, t3;

		/* the physical reference: the copy engine into pinned memory */
		t0 = now();
		CUDA(cudaMemcpy(host, t.data, bytes, cudaMemcpyDeviceToHost));
		record("d2h_pinned", mib, rep, now() - t0);

		/* a step's writes, done: the capture is the copy out, not the wait */
		CUDA(cudaMemsetAsync(t.data, rep & 0xff, bytes, st));
		CUDA(cudaStreamSynchronize(st));
		t0 = now();
		rc = ckpt_save_on(p, ++*step, NULL, st, &s);
		if (rc)
			die_ckpt("ckpt_save_on", c, rc);
		rc = ckpt_save_fence(s, st);
		if (rc)
			die_ckpt("ckpt_save_fence", c, rc);
		t1 = now();
		rc = ckpt_save_wait(s, CKPT_CAPTURED, -1);
		t2 = now();
		if (!rc)
			rc = ckpt_save_wait(s, CKPT_COMMITTED, -1);
		t3 = now();
		if (rc)
			die_ckpt("ckpt_save_wait", c, rc);
		ckpt_save_release(s);
		record("host_thread", mib, rep, t1 - t0);
		record("capture", mib, rep, t2 - t0);
		record("committed", mib, rep, t3 - t0);
	}
	CUDA(cudaStreamSynchronize(st));
	ckpt_plan_destroy(p);
	cudaFreeHost(host);
	cudaFree(t.data);
	cudaStreamDestroy(st);
}

int main(int argc, char **argv)
{
	const char *endpoint = NULL;
	char sizes[256] = "1024,4096,16384";
	int reps = 5, rc;
	int64_t step = 0;
	struct ckpt_client *c;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--endpoint") == 0)
			endpoint = argv[i + 1];
		else if (strcmp(argv[i], "--sizes") == 0)
			snprintf(sizes, sizeof(sizes), "%s", argv[i + 1]);
		else if (strcmp(argv[i], "--reps") == 0)
			reps = atoi(argv[i + 1]);
		else
			break;
	}
	if (!endpoint || reps < 1 || argc % 2 == 0) {
		fprintf(stderr, "usage: gpu_bench --endpoint E [--sizes MiB,...] [--reps N]\n");
		return 2;
	}
	{
		int n = 0;
		cudaError_t e = cudaGetDeviceCount(&n);

		if (e != cudaSuccess || n < 1) {
			fprintf(stderr, "gpu_bench: no usable GPU: %s\n",
			        e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
			return 77;
		}
	}
	rc = ckpt_connect(endpoint, &c);
	if (rc)
		die_ckpt("ckpt_connect", NULL, rc);
	for (char *tok = strtok(sizes, ","); tok; tok = strtok(NULL, ",")) {
		long mib = atol(tok);

		if (mib <= 0) {
			fprintf(stderr, "gpu_bench: bad size '%s'\n", tok);
			return 2;
		}
		run_size(c, mib, reps, &step);
	}
	ckpt_disconnect(c);
	return 0;
}
