/*
 * agent/pipe/ipccache.c without a GPU: a fake open/close records what the CUDA
 * calls would have been.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <check.h>

#include "ipc/ipc.h"
#include "agent/pipe/fence.h"
#include "agent/pipe/ipccache.h"
#include "support/check_main.h"

struct fake {
	int opens, closes, fail_next;
	char mem[8];
	int last_dev;
};

#define FAKE_SIZE 4096 /* every fake allocation's size */

static int fake_open(void *ctx, int dev, const uint8_t *handle, void **ptr, uint64_t *size,
                     char *err)
{
	struct fake *f = ctx;

	if (f->fail_next) {
		f->fail_next = 0;
		return ipc_errf(err, -EINVAL, "cudaIpcOpenMemHandle: invalid argument");
	}
	*ptr = &f->mem[f->opens % 8];
	*size = FAKE_SIZE;
	f->opens++;
	f->last_dev = dev;
	return 0;
}

static void fake_close(void *ctx, int dev, void *ptr)
{
	struct fake *f = ctx;

	f->closes++;
	f->last_dev = dev;
}

static void handle(uint8_t *h, int seed)
{
	memset(h, 0, IPC_HANDLE_BYTES);
	h[0] = (uint8_t)seed;
	h[63] = (uint8_t)(seed * 7);
}

START_TEST(opened_once_closed_with_the_last)
{
	struct fake f = {0};
	struct ipc_cache_ops ops = {fake_open, fake_close, &f};
	struct ipc_cache *c;
	uint8_t h[IPC_HANDLE_BYTES];
	void *p1, *p2;
	char err[IPC_ERRLEN];

	ck_assert_int_eq(ipc_cache_create(&ops, &c), 0);
	handle(h, 1);
	ck_assert_int_eq(ipc_cache_get(c, 0, h, FAKE_SIZE, &p1, err), 0);
	ck_assert_int_eq(ipc_cache_get(c, 0, h, FAKE_SIZE, &p2, err), 0); /* a second plan */
	ck_assert_ptr_eq(p1, p2);
	ck_assert_int_eq(f.opens, 1);
	ck_assert_uint_eq(ipc_cache_open_count(c), 1);
	ipc_cache_put(c, 0, p1);
	ck_assert_int_eq(f.closes, 0); /* the other plan still uses it */
	ipc_cache_put(c, 0, p2);
	ck_assert_int_eq(f.closes, 1);
	ck_assert_uint_eq(ipc_cache_open_count(c), 0);
	/* opened again after it was closed: a new mapping */
	ck_assert_int_eq(ipc_cache_get(c, 0, h, FAKE_SIZE, &p1, err), 0);
	ck_assert_int_eq(f.opens, 2);
	ipc_cache_destroy(c); /* closes what is left */
	ck_assert_int_eq(f.closes, 2);
}
END_TEST

START_TEST(keys_are_device_and_handle)
{
	struct fake f = {0};
	struct ipc_cache_ops ops = {fake_open, fake_close, &f};
	struct ipc_cache *c;
	uint8_t a[IPC_HANDLE_BYTES], b[IPC_HANDLE_BYTES];
	void *pa, *pb, *pc;
	char err[IPC_ERRLEN];

	ck_assert_int_eq(ipc_cache_create(&ops, &c), 0);
	handle(a, 1);
	handle(b, 2);
	ck_assert_int_eq(ipc_cache_get(c, 0, a, FAKE_SIZE, &pa, err), 0);
	ck_assert_int_eq(ipc_cache_get(c, 0, b, FAKE_SIZE, &pb, err), 0);
	ck_assert_int_eq(ipc_cache_get(c, 1, a, FAKE_SIZE, &pc, err),
	                 0); /* same bytes, other GPU */
	ck_assert_int_eq(f.opens, 3);
	ck_assert_ptr_ne(pa, pb);
	ck_assert_int_eq(f.last_dev, 1);
	ipc_cache_put(c, 1, pc);
	ck_assert_int_eq(f.closes, 1);
	ck_assert_int_eq(f.last_dev, 1);
	ipc_cache_put(c, 0, (void *)&f); /* not ours: ignored */
	ck_assert_int_eq(f.closes, 1);
	ipc_cache_destroy(c);
	ck_assert_int_eq(f.closes, 3);
}
END_TEST

START_TEST(failed_open_is_not_cached)
{
	struct fake f = {.fail_next = 1};
	struct ipc_cache_ops ops = {fake_open, fake_close, &f};
	struct ipc_cache *c;
	uint8_t h[IPC_HANDLE_BYTES];
	void *p;
	char err[IPC_ERRLEN];

	ck_assert_int_eq(ipc_cache_create(&ops, &c), 0);
	handle(h, 3);
	ck_assert_int_eq(ipc_cache_get(c, 0, h, FAKE_SIZE, &p, err), -EINVAL);
	ck_assert_msg(strstr(err, "cudaIpcOpenMemHandle"), "%s", err);
	ck_assert_uint_eq(ipc_cache_open_count(c), 0);
	ck_assert_int_eq(ipc_cache_get(c, 0, h, FAKE_SIZE, &p, err), 0); /* tried again, works */
	ck_assert_int_eq(f.opens, 1);
	ipc_cache_destroy(c);
	ck_assert_int_eq(f.closes, 1);
}
END_TEST

/* A client claiming more than the allocation has is refused, and holds nothing. */
START_TEST(claim_past_the_allocation_refused)
{
	struct fake f = {0};
	struct ipc_cache_ops ops = {fake_open, fake_close, &f};
	struct ipc_cache *c;
	uint8_t h[IPC_HANDLE_BYTES];
	void *p = NULL, *q = NULL;
	char err[IPC_ERRLEN];

	ck_assert_int_eq(ipc_cache_create(&ops, &c), 0);
	handle(h, 4);
	ck_assert_int_eq(ipc_cache_get(c, 0, h, FAKE_SIZE + 1, &p, err), -ERANGE);
	ck_assert_msg(strstr(err, "4096 bytes") && strstr(err, "4097"), "%s", err);
	ck_assert_ptr_null(p);
	ck_assert_uint_eq(ipc_cache_open_count(c), 0); /* opened, checked, closed */
	ck_assert_int_eq(f.closes, 1);
	/* Held by a plan already: a second plan's larger claim is refused too ... */
	ck_assert_int_eq(ipc_cache_get(c, 0, h, FAKE_SIZE, &p, err), 0);
	ck_assert_int_eq(ipc_cache_get(c, 0, h, 2 * FAKE_SIZE, &q, err), -ERANGE);
	/* ... without taking the first plan's mapping away. */
	ck_assert_uint_eq(ipc_cache_open_count(c), 1);
	ck_assert_int_eq(f.closes, 1);
	ipc_cache_put(c, 0, p);
	ck_assert_int_eq(f.closes, 2);
	ipc_cache_destroy(c);
}
END_TEST

/* The fence moves only past saves that have all finished, in any order. */
START_TEST(fence_in_order)
{
	struct fence f = {0};
	uint32_t a, b, c, seq;

	ck_assert_int_eq(fence_issue(&f, &a), 0);
	ck_assert_int_eq(fence_issue(&f, &b), 0);
	ck_assert_int_eq(fence_issue(&f, &c), 0);
	ck_assert_uint_eq(a, 1);
	ck_assert_uint_eq(c, 3);
	ck_assert_uint_eq(fence_finish(&f, b), 0); /* 1 still running: nobody released */
	ck_assert_uint_eq(fence_finish(&f, c), 0);
	ck_assert_uint_eq(fence_finish(&f, a), 3); /* all three at once */
	ck_assert_uint_eq(fence_finish(&f, a), 3); /* twice: nothing moves */
	ck_assert_uint_eq(fence_finish(&f, 99), 3); /* never issued: ignored */
	for (int i = 0; i < FENCE_WINDOW; i++)
		ck_assert_int_eq(fence_issue(&f, &seq), 0);
	ck_assert_int_eq(fence_issue(&f, &seq), -EBUSY); /* 64 unfinished */
	ck_assert_uint_eq(fence_finish(&f, 4), 4);
	ck_assert_int_eq(fence_issue(&f, &seq), 0);
	ck_assert_uint_eq(seq, 3 + FENCE_WINDOW + 1);
}
END_TEST

/* Numbers wrap around 2^32 like the GPU's comparison does. */
START_TEST(fence_wraps)
{
	struct fence f = {.issued = UINT32_MAX - 1, .released = UINT32_MAX - 1};
	uint32_t a, b;

	ck_assert_int_eq(fence_issue(&f, &a), 0);
	ck_assert_int_eq(fence_issue(&f, &b), 0);
	ck_assert_uint_eq(a, UINT32_MAX);
	ck_assert_uint_eq(b, 0);
	ck_assert_uint_eq(fence_finish(&f, b), UINT32_MAX - 1);
	ck_assert_uint_eq(fence_finish(&f, a), 0);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("ipccache");
	TCase *tc = tcase_create("cache");

	tcase_add_test(tc, opened_once_closed_with_the_last);
	tcase_add_test(tc, keys_are_device_and_handle);
	tcase_add_test(tc, failed_open_is_not_cached);
	tcase_add_test(tc, claim_past_the_allocation_refused);
	tcase_add_test(tc, fence_in_order);
	tcase_add_test(tc, fence_wraps);
	suite_add_tcase(s, tc);
	return s;
}
