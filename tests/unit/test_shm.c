/*
 * ipc/shm.c: a region made by a client is opened by the agent only with its
 * name, size and secret; the same bytes are seen from both mappings.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <check.h>

#include "ipc.h"

static char err[IPC_ERRLEN];

START_TEST(create_open_share)
{
	struct ipc_shm c, a;

	ck_assert_int_eq(ipc_shm_create(10000, -1, &c, err), 0);
	ck_assert_uint_eq(c.size, 12288); /* rounded up to pages */
	ck_assert_uint_eq((uintptr_t)c.data % 4096, 0);
	ck_assert_int_eq(strncmp(c.name, "/ckpt.", 6), 0);
	ck_assert_int_eq(ipc_shm_open(c.name, c.secret, sizeof(c.secret), c.size, &a, err), 0);
	memset(c.data, 0x5a, c.size);
	ck_assert_int_eq(((unsigned char *)a.data)[c.size - 1], 0x5a);
	((unsigned char *)a.data)[7] = 1; /* restore writes: the client sees it */
	ck_assert_int_eq(((unsigned char *)c.data)[7], 1);
	/* unlinked, both mappings still work: the memory lives as long as they do */
	ck_assert_int_eq(ipc_shm_unlink(c.name), 0);
	((unsigned char *)c.data)[8] = 2;
	ck_assert_int_eq(((unsigned char *)a.data)[8], 2);
	ipc_shm_unmap(&a);
	ipc_shm_unmap(&c);
	ck_assert_ptr_null(c.base);
	ipc_shm_unmap(&c); /* twice is harmless */
}
END_TEST

START_TEST(open_refuses)
{
	struct ipc_shm c, a;
	uint8_t wrong[IPC_SHM_SECRET];

	ck_assert_int_eq(ipc_shm_create(4096, -1, &c, err), 0);
	memcpy(wrong, c.secret, sizeof(wrong));
	wrong[31] ^= 1;
	ck_assert_int_eq(ipc_shm_open(c.name, wrong, sizeof(wrong), c.size, &a, err), -EACCES);
	ck_assert_msg(strstr(err, "secret"), "%s", err);
	ck_assert_int_eq(ipc_shm_open(c.name, c.secret, 16, c.size, &a, err), -EINVAL);
	ck_assert_int_eq(ipc_shm_open(c.name, c.secret, 32, 8192, &a, err), -EINVAL);
	ck_assert_int_eq(ipc_shm_open(c.name, c.secret, 32, 4095, &a, err), -EINVAL);
	ck_assert_int_eq(ipc_shm_open("/etc/passwd", c.secret, 32, 4096, &a, err), -EINVAL);
	ck_assert_int_eq(ipc_shm_open("/ckpt.../x", c.secret, 32, 4096, &a, err), -EINVAL);
	ck_assert_int_eq(ipc_shm_open("/ckpt.1.2.zz", c.secret, 32, 4096, &a, err), -EINVAL);
	ck_assert_int_eq(ipc_shm_open(NULL, c.secret, 32, 4096, &a, err), -EINVAL);
	ipc_shm_unlink(c.name);
	ck_assert_int_eq(ipc_shm_open(c.name, c.secret, 32, c.size, &a, err), -ENOENT);
	ipc_shm_unmap(&c);
	ck_assert_int_eq(ipc_shm_create(0, -1, &c, err), -EINVAL);
}
END_TEST

/* An object someone else made under a name of ours, without our header. */
START_TEST(open_foreign_object)
{
	const char *name = "/ckpt.1.1.00112233aabbccdd";
	uint8_t secret[IPC_SHM_SECRET] = {0};
	struct ipc_shm a;
	int fd;

	shm_unlink(name);
	fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, IPC_SHM_HEADER + 4096), 0);
	close(fd);
	ck_assert_int_eq(ipc_shm_open(name, secret, sizeof(secret), 4096, &a, err), -EACCES);
	shm_unlink(name);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("shm");
	TCase *tc = tcase_create("regions");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, create_open_share);
	tcase_add_test(tc, open_refuses);
	tcase_add_test(tc, open_foreign_object);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
