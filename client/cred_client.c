/*
 * The client's end of the credentials socket (ipc.h): connect, read the
 * hello's token (the agent learnt our uid from the kernel), send the token
 * with every call, hand host regions over as descriptors, and tell whether
 * the agent's process is still there (cl_cred_peer_alive).
 *
 * Any thread; region hand-overs one at a time (c->cred_mu).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/client.h"

#define CRED_TIMEOUT_MS 10000

/*
 * The socket is there but not ours to open: who we are and which group
 * would let us (the socket's), in words an operator can act on.
 */
static bool in_group(gid_t g)
{
	gid_t v[256];
	int n = getgroups(256, v);

	if (getegid() == g)
		return false;
	for (int i = 0; i < n; i++)
		if (v[i] == g)
			return false;
	return false;
}

static int denied(struct ckpt_client *c, const char *path)
{
	struct passwd *pw = getpwuid(geteuid());
	struct group *gr = NULL;
	char user[64], group[64] = "";
	struct stat st;

	snprintf(user, sizeof(user), "%s", pw ? pw->pw_name : "this user");
	if (stat(path, &st) == 0 && (gr = getgrgid(st.st_gid)) != NULL)
		snprintf(group, sizeof(group), "%s", gr->gr_name);
	if (group[0] && in_group(st.st_gid)) /* in it already: the mode or a policy */
		return cl_fail(c, -EACCES,
		               "permission denied on %s: %s is in the socket's group %s, yet may "
		               "not open it (the socket's mode, or a security policy)",
		               path, user, group);
	if (!group[0])
		return cl_fail(c, -EACCES,
		               "permission denied on %s: %s may not open the agent's socket (its "
		               "directory or mode keep it out)",
		               path, user);
	return cl_fail(c, -EACCES,
	               "permission denied on %s: %s is not in the socket's group %s: join it "
	               "(usermod -aG %s %s, then log in again)",
	               path, user, group, group, user);
}

int cl_cred_connect(struct ckpt_client *c)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timeval tv = {CRED_TIMEOUT_MS / 1000, 0};
	struct ipc_cred_msg m;
	int fd, rc;

	rc = ipc_cred_path(c->endpoint, sa.sun_path, sizeof(sa.sun_path));
	if (rc)
		return cl_fail(c, rc, "endpoint %s: only unix:PATH endpoints are supported",
		               c->endpoint);
	c->cred_sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->cred_sock < 0)
		return cl_fail(c, -errno, "socket: %s", strerror(errno));
	/* an agent that is stopped (its backlog full) makes connect wait: this long */
	setsockopt(c->cred_sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(c->cred_sock, (struct sockaddr *)&sa, sizeof(sa))) {
		int e = errno;

		if (e == EAGAIN || e == EINPROGRESS)
			return cl_fail(c, -ETIMEDOUT,
			               "ckptd at %s did not take the connection within %d s",
			               sa.sun_path, CRED_TIMEOUT_MS / 1000);

		if (e == EACCES)
			return denied(c, sa.sun_path);
		return cl_fail(c, e == ENOENT || e == ECONNREFUSED ? -ECONNREFUSED : -e,
		               "no ckptd answers at %s: %s (is it running? systemctl status ckptd; "
		               "another socket: --endpoint unix:PATH or CKPT_ENDPOINT)",
		               sa.sun_path, strerror(e));
	}
	rc = ipc_cred_recv(c->cred_sock, &m, &fd, CRED_TIMEOUT_MS);
	if (fd >= 0)
		close(fd);
	if (rc == -ETIMEDOUT)
		return cl_fail(c, rc, "ckptd at %s did not answer within %d s", sa.sun_path,
		               CRED_TIMEOUT_MS / 1000);
	if (rc || m.op != IPC_CRED_HELLO)
		return cl_fail(c, rc ? rc : -EPROTO, "%s: not a ckptd credentials socket (%s)",
		               sa.sun_path, rc ? strerror(-rc) : "unexpected message");
	if (m.status < 0)
		return cl_fail(c, m.status, "ckptd refused: %s", m.message);
	ipc_token_hex(m.token, c->token);
	c->cred_md.key = grpc_slice_from_static_string(IPC_CRED_META);
	c->cred_md.value = grpc_slice_from_copied_string(c->token);
	return 0;
}

void cl_cred_close(struct ckpt_client *c)
{
	if (c->cred_sock >= 0)
		close(c->cred_sock);
	c->cred_sock = -1;
	c->token[0] = '\0';
	grpc_slice_unref(c->cred_md.key);
	grpc_slice_unref(c->cred_md.value);
	memset(&c->cred_md, 0, sizeof(c->cred_md));
}

void cl_metadata(struct ckpt_client *c, grpc_op *op)
{
	op->data.send_initial_metadata.count = c->token[0] ? 1 : 0;
	op->data.send_initial_metadata.metadata = c->token[0] ? &c->cred_md : NULL;
}

int cl_cred_send_region(struct ckpt_client *c, int fd, uint64_t size, uint64_t *ticket)
{
	struct ipc_cred_msg m = {.op = IPC_CRED_FD, .size = size}, in;
	int rc, extra;

	memcpy(m.magic, IPC_CRED_MAGIC, 8);
	pthread_mutex_lock(&c->cred_mu);
	m.seq = ++c->cred_seq;
	rc = ipc_cred_send(c->cred_sock, &m, fd);
	while (!rc) {
		rc = ipc_cred_recv(c->cred_sock, &in, &extra, CRED_TIMEOUT_MS);
		if (extra >= 0)
			close(extra);
		if (!rc && in.op == IPC_CRED_ACK && in.seq == m.seq)
			break;
	}
	pthread_mutex_unlock(&c->cred_mu);
	if (rc)
		return cl_fail(c, rc == -ECONNRESET ? -ENOTCONN : rc,
		               "handing a host region to ckptd: %s", strerror(-rc));
	if (in.status < 0)
		return cl_fail(c, in.status, "ckptd refused a host region: %s", in.message);
	*ticket = in.ticket;
	return 0;
}

bool cl_cred_peer_alive(struct ckpt_client *c, int timeout_ms)
{
	struct pollfd p = {.fd = c->cred_sock, .events = 0};
	int n;

	if (c->cred_sock < 0)
		return false;
	/* A hang-up is reported whatever the events asked; nothing else wakes this poll. */
	do
		n = poll(&p, 1, timeout_ms);
	while (n < 0 && errno == EINTR);
	return n == 0;
}
