/*
 * The local backend's files, as every part of it opens and names them
 * (local_int.h): a regular file opened without following a link or
 * blocking on a FIFO, and the temporary names of files on their way into a
 * shared directory. Any thread; no state.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/local/local_int.h"

/*
 * ".<node>~<16 hex>~<leaf>.tmp": '~' is in no node's name nor in any key,
 * so whose a temporary file is reads back without doubt.
 */
void local_tmp_name(const struct local *l, const char *leaf, char *buf, size_t len)
{
	snprintf(buf, len, ".%s~%016" PRIx64 "~%s" TMP_SUFFIX, l->node, ipc_random_id(), leaf);
}

bool local_is_tmp(const struct local *l, const char *name, bool *own)
{
	size_t n = strlen(name), k = strlen(l->node), t = strlen(TMP_SUFFIX);
	const char *tilde = strchr(name, '~');

	*own = false;
	if (name[0] != '.' || !tilde || n < t + 3 || strcmp(name + n - t, TMP_SUFFIX) != 0)
		return false;
	*own = (size_t)(tilde - name) == k + 1 && strncmp(name + 1, l->node, k) == 0;
	return true;
}

/*
 * Opens a regular file: O_NONBLOCK so that a FIFO planted under the name
 * cannot hang us, cleared again once fstat shows a regular file (io_uring
 * would answer -EAGAIN on a non-blocking file instead of waiting).
 */
int local_open_regular(struct local *l, int dirfd, const char *name, int flags, mode_t mode,
                       struct stat *st)
{
	int fd = l->ops->openat(dirfd, name, flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, mode);

	if (fd < 0)
		return fd;
	if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode) ||
	    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0) {
		close(fd);
		return -EINVAL;
	}
	return fd;
}
