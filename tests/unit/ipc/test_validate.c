/*
 * ipc/validate.c and wire.c: the rules both sides apply to names, steps,
 * ranks, shapes and extents, and the errno <-> gRPC status table.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>
#include <grpc/status.h>

#include "ipc/ipc.h"
#include "support/check_main.h"

static char err[IPC_ERRLEN];

START_TEST(job_names)
{
	char long_name[IPC_MAX_JOB + 2];

	ck_assert_int_eq(ipc_check_job("llama-70b_run.3", err), 0);
	ck_assert_int_eq(ipc_check_job("a", err), 0);
	ck_assert_int_eq(ipc_check_job("", err), -EINVAL);
	ck_assert_int_eq(ipc_check_job(NULL, err), -EINVAL);
	ck_assert_int_eq(ipc_check_job(".", err), -EINVAL);
	ck_assert_int_eq(ipc_check_job("..", err), -EINVAL);
	ck_assert_int_eq(ipc_check_job("a/b", err), -EINVAL);
	ck_assert_msg(strstr(err, "'/'"), "names the bad character: %s", err);
	ck_assert_int_eq(ipc_check_job("../etc", err), -EINVAL);
	ck_assert_int_eq(ipc_check_job("a b", err), -EINVAL);
	ck_assert_int_eq(ipc_check_job("job\n", err), -EINVAL);
	ck_assert_msg(strstr(err, "control character 0x0a at byte 3"), "says where: %s", err);
	ck_assert_int_eq(ipc_check_job("ab/c", err), -EINVAL);
	ck_assert_msg(strstr(err, "'/' at byte 2"), "says where: %s", err);
	ck_assert_int_eq(ipc_check_run("r\xc3\xa9", err), -EINVAL);
	ck_assert_msg(strstr(err, "non-ASCII byte 0xc3 at byte 1"), "says where: %s", err);
	memset(long_name, 'x', sizeof(long_name) - 1);
	long_name[IPC_MAX_JOB] = '\0';
	ck_assert_int_eq(ipc_check_job(long_name, err), 0);
	long_name[IPC_MAX_JOB] = 'x';
	long_name[IPC_MAX_JOB + 1] = '\0';
	ck_assert_int_eq(ipc_check_job(long_name, err), -EINVAL);
	ck_assert_msg(strstr(err, "longer than 64"), "%s", err);
}
END_TEST

START_TEST(tensor_names)
{
	char *huge = malloc(10001);

	ck_assert_int_eq(ipc_check_tensor_name("model.layers.0.self_attn.q_proj.weight", err), 0);
	ck_assert_int_eq(ipc_check_tensor_name("gewicht.\xc3\xbc\xe2\x82\xac", err), 0);
	ck_assert_int_eq(ipc_check_tensor_name("", err), -EINVAL);
	ck_assert_int_eq(ipc_check_tensor_name("__metadata__", err), -EINVAL);
	ck_assert_int_eq(ipc_check_tensor_name("a\tb", err), -EINVAL);
	ck_assert_msg(strstr(err, "control character 0x09 at byte 1"), "says where: %s", err);
	ck_assert_int_eq(ipc_check_tensor_name("a\x7f", err), -EINVAL);
	ck_assert_msg(strstr(err, "control character 0x7f at byte 1"), "says where: %s", err);
	ck_assert_int_eq(ipc_check_tensor_name("ab\xc3", err), -EINVAL);
	ck_assert_msg(strstr(err, "not valid UTF-8 at byte 2"), "says where: %s", err);
	ck_assert_int_eq(ipc_check_tensor_name("\xc3", err), -EINVAL); /* truncated */
	ck_assert_int_eq(ipc_check_tensor_name("\xc0\xaf", err), -EINVAL); /* overlong */
	ck_assert_int_eq(ipc_check_tensor_name("\xed\xa0\x80", err), -EINVAL); /* surrogate */
	ck_assert_int_eq(ipc_check_tensor_name("\xf4\x90\x80\x80", err), -EINVAL);
	memset(huge, 'n', 10000);
	huge[10000] = '\0';
	ck_assert_int_eq(ipc_check_tensor_name(huge, err), -EINVAL);
	ck_assert_msg(strstr(err, "longer than 512") && strlen(err) < 200,
	              "says why, without echoing 10,000 bytes: %s", err);
	free(huge);
}
END_TEST

START_TEST(ranks_steps_meta)
{
	char *big = malloc(IPC_MAX_META + 10);

	ck_assert_int_eq(ipc_check_rank(0, 1, err), 0);
	ck_assert_int_eq(ipc_check_rank(3, 4, err), 0);
	ck_assert_int_eq(ipc_check_rank(0, 0, err), -EINVAL);
	ck_assert_int_eq(ipc_check_rank(4, 4, err), -EINVAL);
	ck_assert_int_eq(ipc_check_rank(-1, 4, err), -EINVAL);
	ck_assert_int_eq(ipc_check_rank(0, IPC_MAX_WORLD + 1, err), -EINVAL);
	ck_assert_int_eq(ipc_check_step(0, err), 0);
	ck_assert_int_eq(ipc_check_step(IPC_MAX_STEP, err), 0);
	ck_assert_int_eq(ipc_check_step(IPC_MAX_STEP + 1, err), -EINVAL);
	ck_assert_int_eq(ipc_check_step(-1, err), -EINVAL);
	ck_assert_int_eq(ipc_check_meta(NULL, err), 0);
	ck_assert_int_eq(ipc_check_meta("", err), 0);
	ck_assert_int_eq(ipc_check_meta("{\"a\": [1, 2.5, null]}", err), 0);
	ck_assert_int_eq(ipc_check_meta("17", err), 0);
	ck_assert_int_eq(ipc_check_meta("{\"a\":", err), -EINVAL);
	ck_assert_int_eq(ipc_check_meta("{\"a\":1,\"a\":2}", err), -EINVAL);
	memset(big, ' ', IPC_MAX_META + 9);
	big[0] = '1';
	big[IPC_MAX_META + 9] = '\0';
	ck_assert_int_eq(ipc_check_meta(big, err), -EINVAL);
	free(big);
}
END_TEST

START_TEST(nbytes)
{
	int64_t s2[2] = {3, 5}, neg[2] = {3, -1}, huge[3] = {1LL << 40, 1LL << 40, 1LL << 40};
	int64_t zero[2] = {0, 7};
	uint64_t n;

	ck_assert_int_eq(ipc_tensor_nbytes("t", 12, 2, s2, &n, err), 0);
	ck_assert_uint_eq(n, 60);
	ck_assert_int_eq(ipc_tensor_nbytes("t", 9, 2, s2, &n, err), 0);
	ck_assert_uint_eq(n, 30);
	ck_assert_int_eq(ipc_tensor_nbytes("t", 12, 0, NULL, &n, err), 0);
	ck_assert_uint_eq(n, 4); /* a scalar */
	ck_assert_int_eq(ipc_tensor_nbytes("t", 12, 2, zero, &n, err), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_int_eq(ipc_tensor_nbytes("t", 0, 2, s2, &n, err), -EINVAL);
	ck_assert_int_eq(ipc_tensor_nbytes("t", 16, 2, s2, &n, err), -EINVAL);
	ck_assert_int_eq(ipc_tensor_nbytes("t", 12, 2, neg, &n, err), -EINVAL);
	ck_assert_int_eq(ipc_tensor_nbytes("t", 12, 17, s2, &n, err), -EINVAL);
	ck_assert_int_eq(ipc_tensor_nbytes("t", 12, 3, huge, &n, err), -EOVERFLOW);
}
END_TEST

/* Two regions: 1 of 4096 bytes, 2 of 100 bytes. */
static int sizes(void *ctx, int kind, uint64_t region, uint64_t *size)
{
	if (kind != CKPT__V1__REGION_KIND__REGION_HOST)
		return -ENOTSUP;
	if (region == 1)
		return *size = 4096, 0;
	if (region == 2)
		return *size = 100, 0;
	return -ENOENT;
}

#define T(name, region, off, rows, cols)                                                           \
	{                                                                                          \
		name, 12, 2, (const int64_t[]){rows, cols}, CKPT__V1__REGION_KIND__REGION_HOST,    \
		    region, off, (uint64_t)(rows) * (cols)*4, 0, NULL, NULL                        \
	}

START_TEST(plan_extents)
{
	struct ipc_tensor ok[] = {T("a", 1, 0, 10, 10), T("b", 1, 400, 2, 3), T("c", 2, 0, 5, 5),
	                          T("empty", 1, 400, 0, 3)};
	struct ipc_tensor outside[] = {T("a", 2, 64, 5, 2)}; /* 40 bytes at 64 of 100 */
	struct ipc_tensor wrap[] = {T("a", 1, UINT64_MAX - 3, 1, 2)};
	struct ipc_tensor overlap[] = {T("a", 1, 0, 10, 10), T("b", 1, 396, 1, 2)};
	/* the bounds to the byte: the last byte of a region, one past it, one shared */
	struct ipc_tensor last[] = {T("a", 2, 60, 5, 2)}; /* 40 bytes at 60 of 100 */
	struct ipc_tensor past1[] = {T("a", 2, 61, 5, 2)};
	struct ipc_tensor overlap1[] = {T("a", 1, 0, 10, 10), T("b", 1, 399, 1, 2)};
	struct ipc_tensor dup[] = {T("a", 1, 0, 1, 1), T("a", 2, 0, 1, 1)};
	struct ipc_tensor noregion[] = {T("a", 3, 0, 1, 1)};
	struct ipc_tensor wrongbytes[] = {T("a", 1, 0, 2, 2)};
	int64_t gs[2] = {4, 10}, go[2] = {3, 0}, bad_go[2] = {4, 0};
	struct ipc_tensor sharded = T("s", 1, 0, 1, 10);

	ck_assert_int_eq(ipc_check_tensors(ok, 4, sizes, NULL, err), 0);
	ck_assert_int_eq(ipc_check_tensors(outside, 1, sizes, NULL, err), -ERANGE);
	ck_assert_msg(strstr(err, "'a'") && strstr(err, "outside"), "%s", err);
	ck_assert_int_eq(ipc_check_tensors(wrap, 1, sizes, NULL, err), -ERANGE);
	ck_assert_int_eq(ipc_check_tensors(overlap, 2, sizes, NULL, err), -EINVAL);
	ck_assert_msg(strstr(err, "'a'") && strstr(err, "'b'") && strstr(err, "overlap"), "%s",
	              err);
	ck_assert_int_eq(ipc_check_tensors(last, 1, sizes, NULL, err), 0);
	ck_assert_int_eq(ipc_check_tensors(past1, 1, sizes, NULL, err), -ERANGE);
	ck_assert_msg(strstr(err, "[61, +40)") && strstr(err, "100 bytes"), "%s", err);
	ck_assert_int_eq(ipc_check_tensors(overlap1, 2, sizes, NULL, err), -EINVAL);
	ck_assert_msg(strstr(err, "overlap") && strstr(err, "399"), "%s", err);
	ck_assert_int_eq(ipc_check_tensors(dup, 2, sizes, NULL, err), -EINVAL);
	ck_assert_msg(strstr(err, "twice"), "%s", err);
	ck_assert_int_eq(ipc_check_tensors(noregion, 1, sizes, NULL, err), -ENOENT);
	wrongbytes[0].nbytes = 15;
	ck_assert_int_eq(ipc_check_tensors(wrongbytes, 1, sizes, NULL, err), -EINVAL);
	ck_assert_msg(strstr(err, "15 bytes given"), "%s", err);
	sharded.global_ndim = 2;
	sharded.global_shape = gs;
	sharded.global_offset = go;
	ck_assert_int_eq(ipc_check_tensors(&sharded, 1, sizes, NULL, err), 0);
	sharded.global_offset = bad_go;
	ck_assert_int_eq(ipc_check_tensors(&sharded, 1, sizes, NULL, err), -EINVAL);
	sharded.global_offset = NULL;
	ck_assert_int_eq(ipc_check_tensors(&sharded, 1, sizes, NULL, err), -EINVAL);
	sharded.global_ndim = 1;
	sharded.global_offset = go;
	ck_assert_int_eq(ipc_check_tensors(&sharded, 1, sizes, NULL, err), -EINVAL);
}
END_TEST

START_TEST(status_mapping)
{
	const int errs[] = {EINVAL,    ENOENT, EEXIST,  EACCES,  EAGAIN,       EBUSY, ECANCELED,
	                    ETIMEDOUT, ERANGE, EBADMSG, ENOTSUP, ECONNREFUSED, EIO};

	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++)
		ck_assert_int_eq(ipc_status_to_errno(ipc_errno_to_status(-errs[i])), -errs[i]);
	ck_assert_int_eq(ipc_errno_to_status(0), GRPC_STATUS_OK);
	ck_assert_int_eq(ipc_errno_to_status(-ENOSPC), GRPC_STATUS_RESOURCE_EXHAUSTED);
	ck_assert_int_eq(ipc_errno_to_status(-EXDEV), GRPC_STATUS_INTERNAL);
	ck_assert_int_eq(ipc_status_to_errno(999), -EIO);
	/* a message too large is no limit that frees up: EMSGSIZE, never EAGAIN */
	ck_assert_int_eq(ipc_errno_to_status(-EMSGSIZE), GRPC_STATUS_RESOURCE_EXHAUSTED);
	ck_assert_int_eq(ipc_status_errno(GRPC_STATUS_RESOURCE_EXHAUSTED,
	                                  "Sent message larger than max (69356331 vs. 33554432)"),
	                 -EMSGSIZE);
	ck_assert_int_eq(ipc_status_errno(GRPC_STATUS_RESOURCE_EXHAUSTED, "watch: 4 watchers"),
	                 -EAGAIN);
	ck_assert_int_eq(ipc_status_errno(GRPC_STATUS_NOT_FOUND, NULL), -ENOENT);
	ck_assert_str_eq(ipc_dtype_name(9), "BF16");
	ck_assert_int_eq(ipc_dtype_from_name("F8_E4M3"), 5);
	ck_assert_int_eq(ipc_dtype_from_name("F4"), 0);
	ck_assert_str_eq(ipc_state_name(2), "CAPTURED");
	ck_assert_str_eq(ipc_state_name(99), "UNKNOWN");
	ck_assert(ipc_state_final(6) && !ipc_state_final(3));
}
END_TEST

/* A back-off: the first wait, then doubled, never past its bound (ipc/base). */
START_TEST(backoff_doubles_to_its_bound)
{
	ck_assert_int_eq(ipc_backoff_next(0, 2, 60), 2);
	ck_assert_int_eq(ipc_backoff_next(2, 2, 60), 4);
	ck_assert_int_eq(ipc_backoff_next(16, 2, 60), 32);
	ck_assert_int_eq(ipc_backoff_next(32, 2, 60), 60);
	ck_assert_int_eq(ipc_backoff_next(60, 2, 60), 60);
	ck_assert_int_eq(ipc_backoff_next(0, 90, 60), 60);
	ck_assert_int_eq(ipc_backoff_next(INT64_MAX / 2 + 1, 1, INT64_MAX), INT64_MAX);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("validate");
	TCase *tc = tcase_create("rules");

	tcase_add_test(tc, job_names);
	tcase_add_test(tc, tensor_names);
	tcase_add_test(tc, ranks_steps_meta);
	tcase_add_test(tc, nbytes);
	tcase_add_test(tc, plan_extents);
	tcase_add_test(tc, status_mapping);
	tcase_add_test(tc, backoff_doubles_to_its_bound);
	suite_add_tcase(s, tc);
	return s;
}
