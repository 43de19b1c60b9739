/*
 * fsops: the syscalls that can fail, in a table (struct fsops) so that tests
 * can replace any of them and inject EIO, ENOSPC or short transfers.
 *
 * Convention of the table (every implementation, the tests' included): each
 * call returns what the syscall returns on success (a file descriptor, a
 * byte count, 0) and a NEGATIVE ERRNO on failure, never -1 with errno: the
 * callers (local.c, the pwrite engine in ioeng.c) then pass the value on
 * as it is, as the rest of ckptd does, and nothing depends on a global.
 *
 * Stateless; any thread.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/io/fsops.h"

static int posix_openat(int dirfd, const char *path, int flags, mode_t mode)
{
	int fd = openat(dirfd, path, flags, mode);

	return fd < 0 ? -errno : fd;
}

static ssize_t posix_pwrite(int fd, const void *buf, size_t n, off_t off)
{
	ssize_t r = pwrite(fd, buf, n, off);

	return r < 0 ? -errno : r;
}

static ssize_t posix_pread(int fd, void *buf, size_t n, off_t off)
{
	ssize_t r = pread(fd, buf, n, off);

	return r < 0 ? -errno : r;
}

static int posix_fsync(int fd)
{
	return fsync(fd) < 0 ? -errno : 0;
}

static int posix_ftruncate(int fd, off_t len)
{
	return ftruncate(fd, len) < 0 ? -errno : 0;
}

static int posix_reserve(int fd, off_t len)
{
	return fallocate(fd, 0, 0, len) < 0 ? -errno : 0;
}

static int posix_renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath)
{
	return renameat(olddirfd, oldpath, newdirfd, newpath) < 0 ? -errno : 0;
}

static int posix_linkat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath)
{
	return linkat(olddirfd, oldpath, newdirfd, newpath, 0) < 0 ? -errno : 0;
}

static int posix_rename_noreplace(int dirfd, const char *from, const char *to)
{
	return renameat2(dirfd, from, dirfd, to, RENAME_NOREPLACE) < 0 ? -errno : 0;
}

static int posix_direct(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	return fl < 0 || fcntl(fd, F_SETFL, fl | O_DIRECT) < 0 ? -errno : 0;
}

static int posix_mkdirat(int dirfd, const char *path, mode_t mode)
{
	return mkdirat(dirfd, path, mode) < 0 ? -errno : 0;
}

static int posix_unlinkat(int dirfd, const char *path, int flags)
{
	return unlinkat(dirfd, path, flags) < 0 ? -errno : 0;
}

const struct fsops fsops_posix = {
    .openat = posix_openat,
    .pwrite = posix_pwrite,
    .pread = posix_pread,
    .fsync = posix_fsync,
    .ftruncate = posix_ftruncate,
    .fallocate = posix_reserve,
    .renameat = posix_renameat,
    .rename_noreplace = posix_rename_noreplace,
    .linkat = posix_linkat,
    .mkdirat = posix_mkdirat,
    .direct = posix_direct,
    .unlinkat = posix_unlinkat,
    .io_result = NULL,
};
