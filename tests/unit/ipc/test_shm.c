/*
 * ipc/shm.c: a region is a sealed memfd with every page allocated; the agent
 * maps only such a descriptor, and sees the client's bytes. A region cannot
 * shrink under the agent's mapping (the SIGBUS a shrunk shm object caused).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <check.h>

#include "ipc/ipc.h"
#include "support/check_main.h"

static char err[IPC_ERRLEN];

START_TEST(create_map_share)
{
	struct ipc_shm c, a;

	ck_assert_int_eq(ipc_shm_create(10000, &c, err), 0);
	ck_assert_uint_eq(c.size, 12288);
	ck_assert_int_ge(c.fd, 0);
	memset(c.data, 0x5a, c.size);
	ck_assert_int_eq(ipc_shm_map(dup(c.fd), c.size, &a, err), 0);
	ck_assert_int_eq(((unsigned char *)a.data)[c.size - 1], 0x5a);
	((unsigned char *)a.data)[0] = 7;
	ck_assert_int_eq(((unsigned char *)c.data)[0], 7);
	/* What a hostile trainer would do to pull the pages away: refused. */
	ck_assert_int_ne(ftruncate(c.fd, 4096), 0);
	ck_assert_int_eq(errno, EPERM);
	ck_assert_int_ne(ftruncate(c.fd, 1 << 20), 0);
	ipc_shm_unmap(&a);
	ipc_shm_unmap(&c);
	ipc_shm_unmap(&c); /* twice is harmless */
	ck_assert_int_eq(ipc_shm_create(0, &c, err), -EINVAL);
}
END_TEST

static int memfd(uint64_t size, bool alloc, int seals)
{
	int fd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)size), 0);
	if (alloc)
		ck_assert_int_eq(fallocate(fd, 0, 0, (off_t)size), 0);
	if (seals)
		ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, seals), 0);
	return fd;
}

START_TEST(map_refuses)
{
	struct ipc_shm a;
	char path[] = "/tmp/ckpt-shm-XXXXXX";
	int fd;

	/* not sealed: it could shrink under the agent */
	ck_assert_int_eq(ipc_shm_map(memfd(8192, true, 0), 8192, &a, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "sealed"));
	ck_assert_int_eq(ipc_shm_map(memfd(8192, true, F_SEAL_GROW), 8192, &a, err), -EINVAL);
	/* sealed but not allocated: the first touch could fault */
	ck_assert_int_eq(
	    ipc_shm_map(memfd(8192, false, F_SEAL_SHRINK | F_SEAL_GROW), 8192, &a, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "allocated"));
	/* another size than said, or not a page multiple */
	ck_assert_int_eq(ipc_shm_map(memfd(8192, true, F_SEAL_SHRINK | F_SEAL_GROW), 4096, &a, err),
	                 -EINVAL);
	ck_assert_int_eq(ipc_shm_map(memfd(8192, true, F_SEAL_SHRINK | F_SEAL_GROW), 4095, &a, err),
	                 -EINVAL);
	/* a file, a pipe: not memory from memfd_create */
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	unlink(path);
	ck_assert_int_eq(ftruncate(fd, 8192), 0);
	ck_assert_int_eq(ipc_shm_map(fd, 8192, &a, err), -EINVAL);
	{
		int p[2];

		ck_assert_int_eq(pipe(p), 0);
		close(p[1]);
		ck_assert_int_eq(ipc_shm_map(p[0], 4096, &a, err), -EINVAL);
	}
	ck_assert_ptr_null(a.data);
}
END_TEST

START_TEST(tokens)
{
	uint8_t t[IPC_TOKEN_BYTES], u[IPC_TOKEN_BYTES];
	char hex[IPC_TOKEN_HEX + 1];

	ck_assert_int_eq(ipc_random(t, sizeof(t)), 0);
	ipc_token_hex(t, hex);
	ck_assert_uint_eq(strlen(hex), IPC_TOKEN_HEX);
	ck_assert_int_eq(ipc_token_parse(hex, strlen(hex), u), 0);
	ck_assert_mem_eq(t, u, sizeof(t));
	ck_assert_int_eq(ipc_token_parse(hex, strlen(hex) - 1, u), -EINVAL);
	hex[3] = 'G';
	ck_assert_int_eq(ipc_token_parse(hex, strlen(hex), u), -EINVAL);
	hex[3] = 'A'; /* lowercase only: one spelling per token */
	ck_assert_int_eq(ipc_token_parse(hex, strlen(hex), u), -EINVAL);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("shm");
	TCase *tc = tcase_create("regions");

	tcase_add_test(tc, create_map_share);
	tcase_add_test(tc, map_refuses);
	tcase_add_test(tc, tokens);
	suite_add_tcase(s, tc);
	return s;
}
