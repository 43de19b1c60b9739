/*
 * Host shared-memory regions: the memory ckpt_host_alloc hands a trainer and
 * the agent maps to copy from (save) and into (restore).
 *
 * A region is a POSIX shared-memory object "/ckpt.<pid>.<n>.<random>": one
 * header page, then the user's bytes. The header carries a magic, the size
 * and a 32-byte random secret. The client creates the object, registers it
 * with the agent (name + secret), and unlinks the name once the agent has
 * mapped it: from then on the memory lives exactly as long as the two
 * mappings, so a trainer that dies leaks nothing, and nobody else can open
 * it by name.
 *
 * Why the secret: the agent may run with more rights than a client. A client
 * that names some other user's object must not get the agent to read or
 * write it. Naming is not enough: the caller must also know the secret, which
 * only someone who could read the object's first page knows.
 *
 * Called by libckpt (create) and the agent's gRPC thread (open); no state.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ipc.h"

#define SHM_MAGIC "CKPTSHM1"
#define SHM_VERSION 1u
#define SHM_MAX_BYTES (1ull << 42) /* 4 TiB: beyond any one trainer's host memory */

struct shm_header {
	char magic[8];
	uint32_t version;
	uint32_t pid;
	uint64_t size;
	uint8_t secret[IPC_SHM_SECRET];
};

_Static_assert(sizeof(struct shm_header) <= IPC_SHM_HEADER, "header fits its page");

static uint64_t page_round(uint64_t n)
{
	return (n + 4095) & ~(uint64_t)4095;
}

/* Our names only: "/ckpt." then [0-9a-f.] — nothing that could be a path. */
static bool name_ok(const char *name)
{
	size_t n = strnlen(name, IPC_SHM_NAME_MAX);

	if (n == IPC_SHM_NAME_MAX || n <= 6 || strncmp(name, "/ckpt.", 6) != 0)
		return false;
	for (size_t i = 6; i < n; i++)
		if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f') ||
		      name[i] == '.'))
			return false;
	return strstr(name, "..") == NULL;
}

int ipc_shm_create(uint64_t size, long gid, struct ipc_shm *out, char *err)
{
	static unsigned seq;
	struct shm_header *h;
	uint8_t rnd[8];
	uint64_t total;
	void *base;
	int fd, rc;

	memset(out, 0, sizeof(*out));
	if (size == 0 || size > SHM_MAX_BYTES)
		return ipc_errf(err, -EINVAL, "host region of %llu bytes: it must be 1..%llu",
				(unsigned long long)size, SHM_MAX_BYTES);
	size = page_round(size);
	total = IPC_SHM_HEADER + size;
	if (ipc_random(rnd, sizeof(rnd)) || ipc_random(out->secret, sizeof(out->secret)))
		return ipc_errf(err, -EIO, "getrandom failed: %s", strerror(errno));
	snprintf(out->name, sizeof(out->name), "/ckpt.%u.%u.%02x%02x%02x%02x%02x%02x%02x%02x",
		 (unsigned)getpid(), __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED), rnd[0], rnd[1],
		 rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
	fd = shm_open(out->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return ipc_errf(err, -errno, "shm_open %s: %s", out->name, strerror(errno));
	/* An agent running as another user reaches the region through the group
	   of its socket; the secret still keeps other members of that group out. */
	if (gid >= 0 && (fchown(fd, (uid_t)-1, (gid_t)gid) || fchmod(fd, 0660))) {
		rc = ipc_errf(err, -errno, "shm %s: giving group %ld access: %s", out->name, gid,
			      strerror(errno));
		goto unlink;
	}
	if (ftruncate(fd, (off_t)total)) {
		rc = ipc_errf(err, -errno, "shm %s: sizing to %llu bytes: %s", out->name,
			      (unsigned long long)total, strerror(errno));
		goto unlink;
	}
	base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		rc = ipc_errf(err, -errno, "shm %s: mmap %llu bytes: %s", out->name,
			      (unsigned long long)total, strerror(errno));
		goto unlink;
	}
	close(fd);
	/* Huge pages where shmem allows them: fewer TLB misses in the copies. */
	madvise((char *)base + IPC_SHM_HEADER, size, MADV_HUGEPAGE);
	h = base;
	memcpy(h->magic, SHM_MAGIC, 8);
	h->version = SHM_VERSION;
	h->pid = (uint32_t)getpid();
	h->size = size;
	memcpy(h->secret, out->secret, IPC_SHM_SECRET);
	out->base = base;
	out->data = (char *)base + IPC_SHM_HEADER;
	out->size = size;
	return 0;
unlink:
	shm_unlink(out->name);
	close(fd);
	return rc;
}

/* Compares without stopping at the first difference. */
static bool secret_eq(const uint8_t *a, const uint8_t *b, size_t n)
{
	uint8_t d = 0;

	for (size_t i = 0; i < n; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

int ipc_shm_open(const char *name, const uint8_t *secret, size_t secret_len, uint64_t size,
		 struct ipc_shm *out, char *err)
{
	const struct shm_header *h;
	struct stat st;
	void *base;
	int fd, rc;

	memset(out, 0, sizeof(*out));
	if (!name || !name_ok(name))
		return ipc_errf(err, -EINVAL, "region name is not one ckpt_host_alloc makes");
	if (secret_len != IPC_SHM_SECRET)
		return ipc_errf(err, -EINVAL, "region %s: secret of %zu bytes, expected %u", name,
				secret_len, IPC_SHM_SECRET);
	if (size == 0 || size > SHM_MAX_BYTES || size % 4096)
		return ipc_errf(err, -EINVAL, "region %s: size %llu is not a page multiple in 1..%llu",
				name, (unsigned long long)size, SHM_MAX_BYTES);
	fd = shm_open(name, O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
	if (fd < 0)
		return ipc_errf(err, -errno, "cannot open region %s: %s", name, strerror(errno));
	if (fstat(fd, &st)) {
		rc = ipc_errf(err, -errno, "region %s: fstat: %s", name, strerror(errno));
		goto close;
	}
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != IPC_SHM_HEADER + size) {
		rc = ipc_errf(err, -EINVAL, "region %s: %llu bytes, the client said %llu", name,
			      (unsigned long long)st.st_size,
			      (unsigned long long)(IPC_SHM_HEADER + size));
		goto close;
	}
	base = mmap(NULL, IPC_SHM_HEADER + size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		rc = ipc_errf(err, -errno, "region %s: mmap: %s", name, strerror(errno));
		goto close;
	}
	h = base;
	if (memcmp(h->magic, SHM_MAGIC, 8) || h->version != SHM_VERSION || h->size != size ||
	    !secret_eq(h->secret, secret, IPC_SHM_SECRET)) {
		munmap(base, IPC_SHM_HEADER + size);
		rc = ipc_errf(err, -EACCES,
			      "region %s: header or secret does not match: only the client that "
			      "created a region can register it",
			      name);
		goto close;
	}
	close(fd);
	snprintf(out->name, sizeof(out->name), "%s", name);
	memcpy(out->secret, secret, IPC_SHM_SECRET);
	out->base = base;
	out->data = (char *)base + IPC_SHM_HEADER;
	out->size = size;
	return 0;
close:
	close(fd);
	return rc;
}

void ipc_shm_unmap(struct ipc_shm *shm)
{
	if (shm && shm->base) {
		munmap(shm->base, IPC_SHM_HEADER + shm->size);
		shm->base = shm->data = NULL;
	}
}

int ipc_shm_unlink(const char *name)
{
	if (!name_ok(name))
		return -EINVAL;
	return shm_unlink(name) ? -errno : 0;
}
