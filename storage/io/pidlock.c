/*
 * pidlock: a lock file that says who holds it. The holder takes an
 * exclusive flock and then writes its pid into the file, so that whoever is
 * refused next can say which process is in the way. The file itself is
 * never removed: unlinking a lock file lets a third process lock a new file
 * under the name while a second still holds the old one.
 *
 * Callers: local_root.c (the node's lock in the root, at start and when a
 * root made anew is opened again) and the agent (its socket's lock, at
 * start). Any thread; no state.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

#include "storage/storage.h"

/* The pid written in a lock file; 0 if there is none to read (being written, or garbage). */
static long read_holder(int fd)
{
	char buf[32];
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
	char *end;
	long pid;

	if (n <= 0)
		return 0;
	buf[n] = '\0';
	pid = strtol(buf, &end, 10);
	return pid > 0 && (*end == '\n' || *end == '\0') ? pid : 0;
}

int pidlock_take(int fd, long *holder)
{
	char buf[32];
	int n;

	*holder = 0;
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		int rc = -errno;

		if (rc == -EWOULDBLOCK) {
			*holder = read_holder(fd);
			return -EBUSY;
		}
		return rc;
	}
	/*
	 * Only once the lock is ours is the file written: a refused process
	 * never changes what the holder wrote. The pid is for messages: a
	 * failure to write it leaves the lock held and the holder unnamed.
	 */
	n = snprintf(buf, sizeof(buf), "%ld\n", (long)getpid());
	if (ftruncate(fd, 0) == 0 && pwrite(fd, buf, (size_t)n, 0) != n)
		(void)ftruncate(fd, 0);
	return 0;
}
