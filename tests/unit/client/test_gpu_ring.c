/*
 * libckpt's ring of CUDA events (client/cuda_ipc.c) without a GPU: which event a
 * save may record, given the fence word the agent publishes. No CUDA call
 * is made on this path; a fake fence page stands in for the registered one.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <check.h>

#include "ipc/ipc.h"
#include "client/cuda_ipc.h"
#include "support/check_main.h"

static uint32_t page[1024]; /* the fence page: word 0 is the fence */

static void ring(struct cl_gpu_plan *g, uint32_t word)
{
	memset(g, 0, sizeof(*g));
	page[0] = word;
	g->fence = page;
}

/* Each event is reused only once the fence has passed its last save. */
START_TEST(reused_after_the_fence)
{
	struct cl_gpu_plan g;
	char err[IPC_ERRLEN];
	int slot;

	ring(&g, 0);
	for (int i = 0; i < CL_GPU_EVENTS; i++) {
		slot = cl_gpu_event_take(&g, err);
		ck_assert_int_eq(slot, i);
		cl_gpu_event_done(&g, slot, true, (uint32_t)i + 1);
	}
	ck_assert_int_eq(cl_gpu_event_take(&g, err), -EBUSY); /* 64 not yet captured */
	ck_assert_ptr_nonnull(strstr(err, "not yet captured"));
	page[0] = 1; /* save 1 captured: its event, and only it */
	slot = cl_gpu_event_take(&g, err);
	ck_assert_int_eq(slot, 0);
	cl_gpu_event_done(&g, slot, true, 65);
	ck_assert_int_eq(cl_gpu_event_take(&g, err), -EBUSY);
	page[0] = 3;
	ck_assert_int_eq(cl_gpu_event_take(&g, err), 1);
	ck_assert_int_eq(cl_gpu_event_take(&g, err), 2);
	ck_assert_int_eq(cl_gpu_event_take(&g, err), -EBUSY); /* 1 and 2 taken, not done */
}
END_TEST

/* A refused save frees its event at once; a timed-out one never comes back. */
START_TEST(refused_free_timed_out_retired)
{
	struct cl_gpu_plan g;
	char err[IPC_ERRLEN];
	int a, b;

	ring(&g, 0);
	a = cl_gpu_event_take(&g, err);
	cl_gpu_event_done(&g, a, false, 0); /* the agent refused it */
	b = cl_gpu_event_take(&g, err); /* timed out: never given back */
	ck_assert_int_eq(b, 1);
	for (int i = 0; i < 3 * CL_GPU_EVENTS; i++) {
		int s = cl_gpu_event_take(&g, err);

		ck_assert_int_ge(s, 0);
		ck_assert_int_ne(s, b);
		cl_gpu_event_done(&g, s, false, 0);
	}
}
END_TEST

/* Fence numbers wrap at 2^32, 0 included. */
START_TEST(numbers_wrap)
{
	struct cl_gpu_plan g;
	char err[IPC_ERRLEN];
	int slot;

	ck_assert(cl_gpu_passed(5, UINT32_MAX - 1));
	ck_assert(!cl_gpu_passed(UINT32_MAX - 1, 5));
	ck_assert(cl_gpu_passed(0, 0));
	ring(&g, UINT32_MAX);
	slot = cl_gpu_event_take(&g, err);
	cl_gpu_event_done(&g, slot, true, 0); /* the number after UINT32_MAX */
	for (int i = 1; i < CL_GPU_EVENTS; i++)
		cl_gpu_event_done(&g, cl_gpu_event_take(&g, err), true, (uint32_t)i);
	ck_assert_int_eq(cl_gpu_event_take(&g, err), -EBUSY);
	page[0] = 0;
	ck_assert_int_eq(cl_gpu_event_take(&g, err), slot);
}
END_TEST

int test_before(int argc, char **argv)
{
	(void)argc;
	(void)argv;
#ifndef CKPT_HAVE_CUDA
	printf("skipped: libckpt built without CUDA has no ring of events\n");
	return TEST_SKIP;
#endif
	return TEST_RUN;
}

Suite *test_suite(void)
{
	Suite *s = suite_create("gpu_ring");
	TCase *tc = tcase_create("ring");

	tcase_add_test(tc, reused_after_the_fence);
	tcase_add_test(tc, refused_free_timed_out_retired);
	tcase_add_test(tc, numbers_wrap);
	suite_add_tcase(s, tc);
	return s;
}
