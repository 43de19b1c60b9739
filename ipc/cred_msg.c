/*
 * The credentials socket's messages (ipc.h): fixed-size records on a
 * SOCK_SEQPACKET Unix socket, a file descriptor riding along as SCM_RIGHTS.
 * Used by libckpt and ckptctl (connect, hello, send a region) and by the
 * agent's credentials thread; no state.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ipc/ipc.h"

int ipc_cred_path(const char *endpoint, char *buf, size_t len)
{
	if (!endpoint || strncmp(endpoint, "unix:", 5) != 0 || !endpoint[5])
		return -EINVAL;
	if ((size_t)snprintf(buf, len, "%s%s", endpoint + 5, IPC_CRED_SUFFIX) >= len)
		return -ENAMETOOLONG;
	return 0;
}

int ipc_cred_send(int sock, const struct ipc_cred_msg *m, int fd)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {(void *)m, sizeof(*m)};
	struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t n;

	if (fd >= 0) {
		struct cmsghdr *c;

		memset(&u, 0, sizeof(u));
		h.msg_control = u.buf;
		h.msg_controllen = sizeof(u.buf);
		c = CMSG_FIRSTHDR(&h);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	do
		n = sendmsg(sock, &h, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return n == (ssize_t)sizeof(*m) ? 0 : -EPROTO;
}

int ipc_cred_recv(int sock, struct ipc_cred_msg *m, int *fd, int timeout_ms)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {m, sizeof(*m)};
	struct msghdr h = {.msg_iov = &iov,
	                   .msg_iovlen = 1,
	                   .msg_control = u.buf,
	                   .msg_controllen = sizeof(u.buf)};
	struct pollfd p = {sock, POLLIN, 0};
	struct cmsghdr *c;
	ssize_t n;
	int rc;

	*fd = -1;
	do
		rc = poll(&p, 1, timeout_ms);
	while (rc < 0 && errno == EINTR);
	if (rc < 0)
		return -errno;
	if (rc == 0)
		return -ETIMEDOUT;
	do
		n = recvmsg(sock, &h, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	if (n == 0)
		return -ECONNRESET;
	/* Whatever came along is ours to close, however wrong the rest is. */
	for (c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
			int got;

			memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (*fd < 0)
				*fd = got;
			else
				close(got);
		}
	}
	if (n != (ssize_t)sizeof(*m) || (h.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
	    memcmp(m->magic, IPC_CRED_MAGIC, 8) != 0) {
		if (*fd >= 0)
			close(*fd);
		*fd = -1;
		return -EPROTO;
	}
	m->message[IPC_CRED_MSG - 1] = '\0';
	return 0;
}

void ipc_token_hex(const uint8_t *token, char *hex)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < IPC_TOKEN_BYTES; i++) {
		hex[2 * i] = digits[token[i] >> 4];
		hex[2 * i + 1] = digits[token[i] & 15];
	}
	hex[IPC_TOKEN_HEX] = '\0';
}

static int nibble(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

int ipc_token_parse(const char *hex, size_t len, uint8_t *token)
{
	if (len != IPC_TOKEN_HEX)
		return -EINVAL;
	for (size_t i = 0; i < IPC_TOKEN_BYTES; i++) {
		int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return -EINVAL;
		token[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}
