/*
 * The CUDA IPC transport on a real GPU: tensors in cudaMalloc'd memory (several
 * in one allocation, and a second allocation), filled by a kernel, saved,
 * overwritten on the stream right after ckpt_save_fence, restored into
 * device memory and compared; two allocations filled on two streams; saves
 * back to back, more than a plan's ring of events, each fenced; a
 * trainer killed after CAPTURED (the checkpoint commits) and before it (the
 * save is aborted and the agent lets go of the trainer's GPU memory); the
 * agent killed and restarted under fenced saves.
 *
 * Where no GPU is usable (CI, the build machine) it exits 77: skipped, with
 * CUDA's reason.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <cuda_runtime_api.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

int gpu_test_fill(uint32_t *d, uint64_t n, uint32_t seed, cudaStream_t s);
int gpu_test_spin(uint64_t ns, cudaStream_t s);
uint32_t gpu_test_value(uint32_t seed, uint64_t i);

#define CU(x)                                                                                      \
	ck_assert_msg((x) == cudaSuccess, "%s: %s", #x, cudaGetErrorString(cudaGetLastError()))

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Whether the n words at d (device) hold the values of seed, from first. */
static bool holds(const uint32_t *d, uint64_t n, uint32_t seed, uint64_t first)
{
	uint32_t *h = malloc(n * 4);
	bool ok = true;

	CU(cudaMemcpy(h, d, n * 4, cudaMemcpyDeviceToHost));
	for (uint64_t i = 0; i < n && ok; i++)
		ok = h[i] == gpu_test_value(seed, first + i);
	free(h);
	return ok;
}

static struct ckpt_client *connect_to(const struct agent_proc *a)
{
	struct ckpt_client *c;

	ck_assert_int_eq(ckpt_connect(a->endpoint, &c), 0);
	return c;
}

/* Several tensors in one allocation, one in another; overwritten right after the fence. */
START_TEST(fence_keeps_the_snapshot)
{
	enum { N = 3000001, M = 777777 };
	int64_t s3[1] = {N}, s1[1] = {M};
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *sv;
	struct ckpt_tensor t[4];
	uint32_t *A, *B;
	cudaStream_t s;
	double t0, host;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 8");
	c = connect_to(&a);
	CU(cudaStreamCreate(&s));
	CU(cudaMalloc((void **)&A, 3ull * N * 4));
	CU(cudaMalloc((void **)&B, (uint64_t)M * 4));
	for (int i = 0; i < 3; i++)
		t[i] = (struct ckpt_tensor){NULL, CKPT_U32, 1, s3, A + (uint64_t)i * N, NULL, NULL};
	t[0].name = "a.0", t[1].name = "a.1", t[2].name = "a.2";
	t[3] = (struct ckpt_tensor){"b", CKPT_U32, 1, s1, B, NULL, NULL};
	ck_assert_msg(ckpt_plan_create(c, "gpu", 0, 1, t, 4, &p) == 0, "%s", ckpt_last_error(c));
	for (int step = 1; step <= 3; step++) {
		/* late values: a capture that did not wait for them would see the old */
		ck_assert_int_eq(gpu_test_spin(200000000ull, s), 0);
		ck_assert_int_eq(gpu_test_fill(A, 3ull * N, (uint32_t)step, s), 0);
		ck_assert_int_eq(gpu_test_fill(B, M, 100u + (uint32_t)step, s), 0);
		t0 = now();
		ck_assert_msg(ckpt_save_on(p, step, NULL, s, &sv) == 0, "%s", ckpt_last_error(c));
		ck_assert_int_eq(ckpt_save_fence(sv, s), 0);
		host = now() - t0;
		/* the next step's values, queued at once: they must not reach the checkpoint */
		ck_assert_int_eq(gpu_test_fill(A, 3ull * N, 50u + (uint32_t)step, s), 0);
		ck_assert_int_eq(gpu_test_fill(B, M, 150u + (uint32_t)step, s), 0);
		printf("step %d: host thread in save + fence %.3f ms\n", step, host * 1e3);
		ck_assert_msg(ckpt_save_wait(sv, CKPT_COMMITTED, 120000) == 0, "%s",
		              ckpt_save_reason(sv));
		ckpt_save_release(sv);
	}
	CU(cudaStreamSynchronize(s));
	for (int step = 1; step <= 3; step++) {
		CU(cudaMemset(A, 0, 3ull * N * 4));
		CU(cudaMemset(B, 0, (uint64_t)M * 4));
		CU(cudaDeviceSynchronize()); /* the zeroes land before the agent's copies */
		ck_assert_msg(ckpt_restore(p, step, NULL, NULL) == 0, "%s", ckpt_last_error(c));
		ck_assert_msg(holds(A, 3ull * N, (uint32_t)step, 0), "step %d: allocation A", step);
		ck_assert_msg(holds(B, M, 100u + (uint32_t)step, 0), "step %d: allocation B", step);
	}
	ckpt_plan_destroy(p);
	ckpt_disconnect(c);
	cudaFree(A);
	cudaFree(B);
	cudaStreamDestroy(s);
	h_agent_cleanup(&a);
}
END_TEST

/* Two allocations written on two streams; the save orders after both. */
START_TEST(two_streams)
{
	enum { N = 1 << 22 };
	int64_t shape[1] = {N};
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *sv;
	struct ckpt_tensor t[2];
	uint32_t *A, *B;
	cudaStream_t s1, s2;
	cudaEvent_t e;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 8");
	c = connect_to(&a);
	CU(cudaStreamCreate(&s1));
	CU(cudaStreamCreate(&s2));
	CU(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
	CU(cudaMalloc((void **)&A, (uint64_t)N * 4));
	CU(cudaMalloc((void **)&B, (uint64_t)N * 4));
	t[0] = (struct ckpt_tensor){"s1", CKPT_U32, 1, shape, A, NULL, NULL};
	t[1] = (struct ckpt_tensor){"s2", CKPT_U32, 1, shape, B, NULL, NULL};
	ck_assert_int_eq(ckpt_plan_create(c, "streams", 0, 1, t, 2, &p), 0);
	ck_assert_int_eq(gpu_test_spin(100000000ull, s2), 0);
	ck_assert_int_eq(gpu_test_fill(A, N, 7, s1), 0);
	ck_assert_int_eq(gpu_test_fill(B, N, 8, s2), 0);
	CU(cudaEventRecord(e, s2));
	CU(cudaStreamWaitEvent(s1, e, 0)); /* the save, on s1, follows s2's work too */
	ck_assert_int_eq(ckpt_save_on(p, 1, NULL, s1, &sv), 0);
	ck_assert_int_eq(ckpt_save_fence(sv, s1), 0);
	ck_assert_int_eq(ckpt_save_fence(sv, s2), 0);
	ck_assert_int_eq(gpu_test_fill(A, N, 9, s1), 0);
	ck_assert_int_eq(gpu_test_fill(B, N, 10, s2), 0);
	ck_assert_int_eq(ckpt_save_wait(sv, CKPT_COMMITTED, 120000), 0);
	ckpt_save_release(sv);
	CU(cudaDeviceSynchronize());
	ck_assert_int_eq(ckpt_restore(p, 1, NULL, NULL), 0);
	ck_assert(holds(A, N, 7, 0));
	ck_assert(holds(B, N, 8, 0));
	ckpt_plan_destroy(p);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * Saves one after another, each fenced, the next step's values queued right
 * behind the fence, never waiting on the host: more saves than the plan has
 * events, so each event is recorded again while older saves are in flight.
 * -EBUSY (64 not yet captured) is the one refusal allowed: wait and retry.
 */
START_TEST(back_to_back_fenced_saves)
{
	enum { N = 1 << 18, SAVES = 150 };
	int64_t shape[1] = {N};
	struct ckpt_save *sv[SAVES + 1] = {NULL};
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_tensor t;
	uint32_t *A;
	cudaStream_t s;
	int rc, oldest = 1;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1");
	c = connect_to(&a);
	CU(cudaStreamCreate(&s));
	CU(cudaMalloc((void **)&A, (uint64_t)N * 4));
	t = (struct ckpt_tensor){"w", CKPT_U32, 1, shape, A, NULL, NULL};
	/* a full pool waits: every save must commit */
	ck_assert_int_eq(ckpt_plan_create2(c, "b2b", 0, 1, &t, 1, CKPT_BP_BLOCK, &p), 0);
	for (int step = 1; step <= SAVES; step++) {
		ck_assert_int_eq(gpu_test_fill(A, N, (uint32_t)step, s), 0);
		while ((rc = ckpt_save_on(p, step, NULL, s, &sv[step])) == -EBUSY) {
			ck_assert_int_lt(oldest, step);
			ck_assert_int_eq(ckpt_save_wait(sv[oldest++], CKPT_CAPTURED, 60000), 0);
		}
		ck_assert_msg(rc == 0, "step %d: %s", step, ckpt_last_error(c));
		ck_assert_int_eq(ckpt_save_fence(sv[step], s), 0);
	}
	for (int step = 1; step <= SAVES; step++) {
		ck_assert_msg(ckpt_save_wait(sv[step], CKPT_COMMITTED, 120000) == 0, "step %d: %s",
		              step, ckpt_save_reason(sv[step]));
		ckpt_save_release(sv[step]);
	}
	CU(cudaStreamSynchronize(s));
	for (int step = 1; step <= SAVES; step += 37) {
		CU(cudaMemset(A, 0, (uint64_t)N * 4));
		CU(cudaDeviceSynchronize());
		ck_assert_int_eq(ckpt_restore(p, step, NULL, NULL), 0);
		ck_assert_msg(holds(A, N, (uint32_t)step, 0), "step %d", step);
	}
	ckpt_plan_destroy(p);
	ckpt_disconnect(c);
	cudaFree(A);
	cudaStreamDestroy(s);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * The agent SIGKILLed and restarted under a trainer that saves on its
 * stream and fences each save, its next step's values queued right behind
 * the fence: libckpt attaches again and re-creates the CUDA plan (same IPC
 * handle, same fence page), the fence numbers go on from the page's word,
 * and the first save that commits holds its own step's values, not those
 * queued after its fence.
 */
START_TEST(agent_restart_under_fenced_saves)
{
	enum { N = 1 << 22 };
	int64_t shape[1] = {N};
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *sv;
	struct ckpt_tensor t;
	uint32_t *A;
	cudaStream_t s;
	int step, rc = -1;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 8");
	c = connect_to(&a);
	CU(cudaStreamCreate(&s));
	CU(cudaMalloc((void **)&A, (uint64_t)N * 4));
	t = (struct ckpt_tensor){"w", CKPT_U32, 1, shape, A, NULL, NULL};
	ck_assert_int_eq(ckpt_plan_create(c, "rgpu", 0, 1, &t, 1, &p), 0);
	for (step = 1; step <= 3 + 600 && rc; step++) {
		if (step == 4) { /* three commits in: the agent dies and comes back */
			h_agent_kill(&a);
			h_agent_restart(&a);
		}
		ck_assert_int_eq(gpu_test_spin(100000000ull, s), 0);
		ck_assert_int_eq(gpu_test_fill(A, N, (uint32_t)step, s), 0);
		ck_assert_msg(ckpt_save_on(p, step, NULL, s, &sv) == 0, "%s", ckpt_last_error(c));
		ck_assert_int_eq(ckpt_save_fence(sv, s), 0);
		ck_assert_int_eq(gpu_test_fill(A, N, 1000u + (uint32_t)step, s), 0);
		rc = ckpt_save_wait(sv, CKPT_COMMITTED, 120000);
		ck_assert_msg(rc == 0 || (step > 3 && rc == -EIO), "step %d: %s", step,
		              ckpt_save_reason(sv));
		if (step <= 3)
			rc = -1; /* on to the restart */
		ckpt_save_release(sv);
		if (rc)
			usleep(100000);
	}
	ck_assert_msg(rc == 0, "no save committed after the restart");
	step--; /* the one that committed */
	CU(cudaStreamSynchronize(s));
	CU(cudaMemset(A, 0, (uint64_t)N * 4));
	CU(cudaDeviceSynchronize());
	ck_assert_msg(ckpt_restore(p, CKPT_LATEST, NULL, NULL) == 0, "%s", ckpt_last_error(c));
	ck_assert_msg(holds(A, N, (uint32_t)step, 0), "step %d after the restart", step);
	CU(cudaMemset(A, 0, (uint64_t)N * 4));
	CU(cudaDeviceSynchronize());
	ck_assert_int_eq(ckpt_restore(p, 2, NULL, NULL), 0);
	ck_assert_msg(holds(A, N, 2, 0), "step 2, from before the restart");
	ckpt_plan_destroy(p);
	ckpt_disconnect(c);
	cudaFree(A);
	cudaStreamDestroy(s);
	h_agent_cleanup(&a);
}
END_TEST

/* A trainer process: one device tensor of `mib`; saves step 1, then `mode`. */
static int trainer_main(const char *endpoint, long mib, const char *mode)
{
	int64_t shape[1] = {mib << 18};
	struct ckpt_tensor t = {"w", CKPT_U32, 1, shape, NULL, NULL, NULL};
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;

	if (cudaMalloc(&t.data, (size_t)shape[0] * 4) != cudaSuccess ||
	    gpu_test_fill(t.data, (uint64_t)shape[0], 5, 0) || cudaDeviceSynchronize())
		return 10;
	if (ckpt_connect(endpoint, &c) || ckpt_plan_create(c, "orphan", 0, 1, &t, 1, &p) ||
	    ckpt_save(p, 1, NULL, &s))
		return 11;
	if (strcmp(mode, "captured") == 0 && ckpt_save_wait(s, CKPT_CAPTURED, 60000))
		return 12;
	raise(SIGKILL);
	return 13;
}

static int run_trainer(const struct agent_proc *a, long mib, const char *mode)
{
	char m[16];
	pid_t pid;

	snprintf(m, sizeof(m), "%ld", mib);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		execl("/proc/self/exe", "test_gpu", "--trainer", a->endpoint, m, mode,
		      (char *)NULL);
		_exit(127);
	}
	return h_reap(pid);
}

START_TEST(killed_after_captured_commits)
{
	struct agent_proc a;
	char out[4096];

	h_agent_start(&a, "--staging-mb 256 --chunk-mb 8");
	ck_assert_int_eq(run_trainer(&a, 64, "captured"), 128 + SIGKILL);
	ck_assert(h_wait_state(&a, "orphan", 1, "COMMITTED", 60000));
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify orphan 1"), 0);
	h_agent_cleanup(&a);
}
END_TEST

/* Killed while its save streams through a small pool: aborted, and its GPU memory freed. */
START_TEST(killed_before_captured_releases)
{
	struct agent_proc a;
	size_t free0, free1, total;
	char out[4096];

	h_agent_start(&a, "--staging-mb 16 --chunk-mb 1 --queue-depth 1");
	/* A first trainer's plan gives the agent its CUDA context: counted in free0. */
	ck_assert_int_eq(run_trainer(&a, 4, "captured"), 128 + SIGKILL);
	ck_assert(h_wait_state(&a, "orphan", 1, "COMMITTED", 60000));
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "delete orphan 1"), 0);
	CU(cudaMemGetInfo(&free0, &total));
	ck_assert_int_eq(run_trainer(&a, 2048, "queued"), 128 + SIGKILL);
	/* The agent drops the plan and closes the IPC mapping: the 2 GiB comes back. */
	for (int i = 0; i < 200; i++) {
		CU(cudaMemGetInfo(&free1, &total));
		if (free1 + (64u << 20) >= free0)
			break;
		usleep(50000);
	}
	ck_assert_msg(free1 + (64u << 20) >= free0,
	              "GPU memory still held after the trainer died: %zu MiB free, %zu before",
	              free1 >> 20, free0 >> 20);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "show orphan 1"), 1);
	h_agent_cleanup(&a);
}
END_TEST

/* cudaGetDeviceCount, in a child process: this one stays without CUDA. */
static cudaError_t probe(int *n)
{
	int fd[2], st;
	int v[2] = {cudaErrorUnknown, 0};
	pid_t pid;

	if (pipe(fd))
		return cudaErrorUnknown;
	pid = fork();
	if (pid == 0) {
		v[0] = (int)cudaGetDeviceCount(&v[1]);
		_exit(write(fd[1], v, sizeof(v)) == sizeof(v) ? 0 : 1);
	}
	close(fd[1]);
	if (pid < 0 || read(fd[0], v, sizeof(v)) != sizeof(v))
		v[0] = cudaErrorUnknown;
	close(fd[0]);
	if (pid > 0)
		waitpid(pid, &st, 0);
	*n = v[1];
	return (cudaError_t)v[0];
}

int test_before(int argc, char **argv)
{
	cudaError_t e;
	int n = 0;

	if (argc == 5 && strcmp(argv[1], "--trainer") == 0)
		return trainer_main(argv[2], atol(argv[3]), argv[4]);
	/* Asked in a child: CUDA set up before check forks each test breaks it there. */
	e = probe(&n);
	if (e != cudaSuccess || n < 1) {
		printf("skipped: no usable GPU: %s (CUDA error %d)\n",
		       e != cudaSuccess ? cudaGetErrorString(e) : "no devices", (int)e);
		return TEST_SKIP;
	}
	return TEST_RUN;
}

Suite *test_suite(void)
{
	Suite *s = suite_create("gpu");
	TCase *tc = tcase_create("cuda");

	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, fence_keeps_the_snapshot);
	tcase_add_test(tc, two_streams);
	tcase_add_test(tc, back_to_back_fenced_saves);
	tcase_add_test(tc, killed_after_captured_commits);
	tcase_add_test(tc, killed_before_captured_releases);
	tcase_add_test(tc, agent_restart_under_fenced_saves);
	suite_add_tcase(s, tc);
	return s;
}
