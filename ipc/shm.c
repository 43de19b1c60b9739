/*
 * Host regions: the memory ckpt_host_alloc hands a trainer and the agent
 * maps to copy from (save) and into (restore).
 *
 * A region is a memfd: anonymous memory with no name in any filesystem, so
 * nobody but its creator and whoever it hands the descriptor to can open it.
 * The client sizes it, allocates every page at once (fallocate: a machine
 * without the memory says so here, as -ENOMEM/-ENOSPC, instead of the
 * agent taking a SIGBUS at its first touch), seals it against shrinking and
 * growing (so the agent's mapping can never lose pages under it), maps it,
 * and passes the descriptor over the credentials socket (cred.c). The agent
 * checks each of those properties before it maps the region.
 *
 * Called by libckpt (create) and the agent's gRPC thread (map); no state.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ipc/ipc.h"

#define SHM_MAX_BYTES (1ull << 42) /* 4 TiB: beyond any one trainer's host memory */
#define SHM_SEALS (F_SEAL_SHRINK | F_SEAL_GROW)

static uint64_t page_round(uint64_t n)
{
	return (n + 4095) & ~(uint64_t)4095;
}

int ipc_shm_create(uint64_t size, struct ipc_shm *out, char *err)
{
	void *base;
	int fd, rc;

	memset(out, 0, sizeof(*out));
	out->fd = -1;
	if (size == 0 || size > SHM_MAX_BYTES)
		return ipc_errf(err, -EINVAL, "host region of %llu bytes: it must be 1..%llu",
		                (unsigned long long)size, SHM_MAX_BYTES);
	size = page_round(size);
	fd = memfd_create("ckpt", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return ipc_errf(err, -errno, "memfd_create: %s", strerror(errno));
	if (ftruncate(fd, (off_t)size)) {
		rc = ipc_errf(err, -errno, "sizing a host region to %llu bytes: %s",
		              (unsigned long long)size, strerror(errno));
		goto close;
	}
	/* Every page now: a fault at the agent's first touch would be a SIGBUS. */
	if (fallocate(fd, 0, 0, (off_t)size)) {
		rc = ipc_errf(err, -errno,
		              "allocating %llu bytes of host memory: %s (free memory, or lower "
		              "the memory limit's pressure)",
		              (unsigned long long)size, strerror(errno));
		goto close;
	}
	if (fcntl(fd, F_ADD_SEALS, SHM_SEALS | F_SEAL_SEAL)) {
		rc = ipc_errf(err, -errno, "sealing a host region: %s", strerror(errno));
		goto close;
	}
	base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		rc = ipc_errf(err, -errno, "mmap of %llu bytes: %s", (unsigned long long)size,
		              strerror(errno));
		goto close;
	}
	/* Huge pages where shmem allows them: fewer TLB misses in the copies. */
	madvise(base, size, MADV_HUGEPAGE);
	out->fd = fd;
	out->data = base;
	out->size = size;
	return 0;
close:
	close(fd);
	return rc;
}

int ipc_shm_map(int fd, uint64_t size, struct ipc_shm *out, char *err)
{
	struct stat st;
	void *base;
	int seals, rc;

	memset(out, 0, sizeof(*out));
	out->fd = -1;
	if (size == 0 || size > SHM_MAX_BYTES || size % 4096) {
		rc = ipc_errf(err, -EINVAL, "region of %llu bytes: a page multiple in 1..%llu",
		              (unsigned long long)size, SHM_MAX_BYTES);
		goto close;
	}
	if (fstat(fd, &st)) {
		rc = ipc_errf(err, -errno, "region: fstat: %s", strerror(errno));
		goto close;
	}
	seals = fcntl(fd, F_GET_SEALS);
	if (!S_ISREG(st.st_mode) || seals < 0) {
		rc = ipc_errf(err, -EINVAL,
		              "the descriptor is not a memory file from memfd_create "
		              "(use ckpt_host_alloc)");
		goto close;
	}
	if ((seals & SHM_SEALS) != SHM_SEALS) {
		rc = ipc_errf(err, -EINVAL,
		              "region not sealed against shrinking and growing "
		              "(F_SEAL_SHRINK|F_SEAL_GROW): the agent would fault if it "
		              "shrank");
		goto close;
	}
	if ((uint64_t)st.st_size != size) {
		rc = ipc_errf(err, -EINVAL, "region of %llu bytes, the client said %llu",
		              (unsigned long long)st.st_size, (unsigned long long)size);
		goto close;
	}
	if ((uint64_t)st.st_blocks * 512 < size) {
		rc = ipc_errf(err, -EINVAL,
		              "region of %llu bytes has only %llu allocated: allocate every page "
		              "first (fallocate)",
		              (unsigned long long)size, (unsigned long long)st.st_blocks * 512);
		goto close;
	}
	base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		rc = ipc_errf(err, -errno, "region: mmap: %s", strerror(errno));
		goto close;
	}
	close(fd);
	out->data = base;
	out->size = size;
	return 0;
close:
	close(fd);
	return rc;
}

void ipc_shm_unmap(struct ipc_shm *shm)
{
	if (!shm)
		return;
	if (shm->data) {
		munmap(shm->data, shm->size);
		shm->data = NULL;
	}
	if (shm->fd >= 0) {
		close(shm->fd);
		shm->fd = -1;
	}
}
