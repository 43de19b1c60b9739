/*
 * storage/io/fsops.h: the system calls that can fail, in a table (fsops.c)
 * that tests replace to inject EIO, ENOSPC and short transfers. Functions
 * return negative errno instead of setting errno.
 */
#ifndef CKPT_STORAGE_FSOPS_H
#define CKPT_STORAGE_FSOPS_H

#include <stdint.h>
#include <sys/types.h>

/* ---- syscalls, replaceable by tests ----------------------------------- */

struct io_req;

struct fsops {
	int (*openat)(int dirfd, const char *path, int flags, mode_t mode);
	ssize_t (*pwrite)(int fd, const void *buf, size_t n, off_t off);
	ssize_t (*pread)(int fd, void *buf, size_t n, off_t off);
	int (*fsync)(int fd);
	int (*ftruncate)(int fd, off_t len);
	/* blocks reserved for [0, len): -EOPNOTSUPP where the filesystem cannot */
	int (*fallocate)(int fd, off_t len);
	int (*renameat)(int olddirfd, const char *oldpath, int newdirfd, const char *newpath);
	/* rename that never replaces: -EEXIST; -EINVAL where unknown (NFS) */
	int (*rename_noreplace)(int dirfd, const char *from, const char *to);
	/* a second name for a file, never replacing one: -EEXIST (create-once) */
	int (*linkat)(int olddirfd, const char *oldpath, int newdirfd, const char *newpath);
	int (*mkdirat)(int dirfd, const char *path, mode_t mode);
	/* O_DIRECT on an open file: -EINVAL where the filesystem has no direct I/O */
	int (*direct)(int fd);
	int (*unlinkat)(int dirfd, const char *path, int flags);
	/*
	 * The result of an asynchronous request before the engine acts on it;
	 * tests return an error or a short count here. NULL: as it came.
	 */
	int64_t (*io_result)(const struct io_req *r, int64_t res);
};

extern const struct fsops fsops_posix;

/* ---- fault injection (faults.c; tests only) ---------------------------- */

/*
 * The tables a ckptd uses: *sync for the backend's calls, *async for the I/O
 * engine's. Without CKPT_FAULTS in the environment, both are &fsops_posix.
 * In a build made with -DCKPT_FAULT_INJECTION=ON, CKPT_FAULTS is a plan of
 * faults (its grammar is at the top of faults.c) put in around fsops_posix,
 * and note(line) is told each fault as it is put in. A plan that does not
 * parse, or CKPT_FAULTS set in a build without fault injection: -EINVAL,
 * and err (IPC_ERRLEN bytes) says why. Once, at start-up, before any other
 * thread uses the tables.
 */
int fsops_from_env(const struct fsops **sync, const struct fsops **async,
                   void (*note)(const char *line), char *err);

/*
 * The capture worker, before it copies chunk `chunk` of a save from host
 * memory: waits if a CKPT_FAULTS rule "capture:slow=MS" fires for it
 * ("JOB/step-NNNNNNNNNNNN/rank-R/chunk-K"). Nothing without fault injection
 * or without such a rule.
 */
void fsops_capture_wait(const char *job, int64_t step, int rank, unsigned chunk);

#endif /* CKPT_STORAGE_FSOPS_H */
