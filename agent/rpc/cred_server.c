/*
 * The credentials socket: a SOCK_SEQPACKET Unix socket beside the gRPC one.
 *
 * gRPC's Unix transport tells a server nothing about its caller, and cannot
 * carry a file descriptor. So a client first connects here; the kernel says
 * who it is (SO_PEERCRED: pid, uid, gid; SO_PEERGROUPS: its groups), and we
 * answer with a hello holding a random token. Every gRPC call then carries
 * the token as metadata, and the agent acts for that uid as long as this
 * connection stays open: the token dies with it. A trainer's host regions
 * come the same way, a sealed memfd per message (SCM_RIGHTS); each is kept
 * under a random ticket until RegisterRegion, on the control thread, claims
 * it with the same connection's token.
 *
 * Thread: "ckpt-cred" alone accepts, reads and answers (poll over the
 * listener, its connections and an eventfd for stop). The control thread
 * calls cred_identify and cred_take_fd under c->mu. Bounded: connections
 * per uid, descriptors held per connection.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <pthread.h>
#include <stdarg.h>

#include "agent/rpc/cred_server.h"
#include "ipc/ipc.h"
#include "ipc/base/log.h"

#define CRED_MAX_CONNS 4096
#define CRED_MAX_GROUPS 1024

struct held_fd {
	uint64_t ticket;
	uint64_t size;
	int fd;
};

struct conn {
	bool grpc; /* a gRPC connection: sock is our duplicate, watched for its end */
	int sock;
	struct peer who;
	uint8_t token[IPC_TOKEN_BYTES];
	struct held_fd *fds; /* fds_per_conn slots; fd < 0: free */
};

struct cred {
	struct cred_opts o;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int lsock, stopfd;
	pthread_t thread;
	bool started;
	pthread_mutex_t mu; /* conns, nconns */
	struct conn *conns[CRED_MAX_CONNS];
	unsigned nconns;
	uint64_t next_conn;
	int64_t pause_until; /* the thread's: no accept before (monotonic ns) */
};

static bool in_groups(const gid_t *g, int n, long gid)
{
	for (int i = 0; i < n; i++)
		if ((long)g[i] == gid)
			return true;
	return false;
}

/* What the kernel says of the process at the other end. */
static int peer_of(struct cred *c, int sock, struct peer *p)
{
	struct ucred uc;
	socklen_t len = sizeof(uc);
	gid_t groups[CRED_MAX_GROUPS];
	socklen_t glen = sizeof(groups);
	int n = 0;

	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &uc, &len))
		return -errno;
	if (getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0)
		n = (int)(glen / sizeof(gid_t));
	memset(p, 0, sizeof(*p));
	p->known = true;
	p->uid = uc.uid;
	p->gid = uc.gid;
	p->pid = uc.pid;
	p->super = uc.uid == 0 || uc.uid == geteuid();
	p->admin = c->o.admin_gid >= 0 &&
	           ((long)uc.gid == c->o.admin_gid || in_groups(groups, n, c->o.admin_gid));
	return 0;
}

static void conn_free(struct conn *k)
{
	if (!k)
		return;
	for (unsigned i = 0; k->fds && k->fds[i].fd != -2; i++)
		if (k->fds[i].fd >= 0)
			close(k->fds[i].fd);
	free(k->fds);
	close(k->sock);
	free(k);
}

static void refuse(int sock, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void refuse(int sock, int err, const char *fmt, ...)
{
	struct ipc_cred_msg m = {.op = IPC_CRED_HELLO, .status = err};
	va_list ap;

	memcpy(m.magic, IPC_CRED_MAGIC, 8);
	va_start(ap, fmt);
	vsnprintf(m.message, sizeof(m.message), fmt, ap);
	va_end(ap);
	ipc_cred_send(sock, &m, -1);
	close(sock);
}

static void drop_conn(struct cred *c, unsigned i)
{
	struct conn *k;

	pthread_mutex_lock(&c->mu);
	k = c->conns[i];
	c->conns[i] = NULL;
	c->nconns--;
	pthread_mutex_unlock(&c->mu);
	conn_free(k);
}

/*
 * A slot for a connection of p's, within the agent's and the user's
 * limits: true with *slot; false once sock is refused (closed), said in
 * the log and, on the credentials socket, to the client.
 */
static bool room_for(struct cred *c, int sock, const struct peer *p, bool grpc, unsigned *slot)
{
	unsigned same = 0;

	*slot = CRED_MAX_CONNS;
	pthread_mutex_lock(&c->mu);
	for (unsigned i = 0; i < CRED_MAX_CONNS; i++) {
		if (!c->conns[i]) {
			if (*slot == CRED_MAX_CONNS)
				*slot = i;
		} else if (c->conns[i]->who.uid == p->uid) {
			same++;
		}
	}
	pthread_mutex_unlock(&c->mu);
	if (same >= c->o.conns_per_user || *slot == CRED_MAX_CONNS) {
		if (!grpc && *slot == CRED_MAX_CONNS)
			refuse(sock, -EAGAIN, "the agent has %d connections, its limit",
			       CRED_MAX_CONNS);
		else if (!grpc)
			refuse(sock, -EAGAIN,
			       "uid %u has %u connections to this agent, its limit ([limits] "
			       "connections_per_user)",
			       (unsigned)p->uid, same);
		else
			close(sock); /* gRPC has no way to say why: the log does */
		log_msg(LOG_NOTICE,
		        "a %s connection of uid %u (pid %d) refused: %u held, limit %u "
		        "([limits] connections_per_user)",
		        grpc ? "gRPC" : "credentials", (unsigned)p->uid, (int)p->pid, same,
		        c->o.conns_per_user);
		return false;
	}
	return true;
}

/*
 * A new connection on the credentials socket (grpc false) or the gRPC one:
 * who it is, within the limits; then its hello, or gRPC has it.
 */
static void on_accept(struct cred *c, int lsock, bool grpc)
{
	struct ipc_cred_msg m = {.op = IPC_CRED_HELLO};
	struct conn *k;
	struct peer p;
	unsigned slot;
	int sock = accept4(lsock, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK), watch = -1;

	if (sock < 0) {
		/* Out of descriptors: the listener stays readable; look again later, not at once.
		 */
		if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
			c->pause_until = ipc_mono_ns() + 100 * 1000000ll;
		return;
	}
	if (peer_of(c, sock, &p)) {
		close(sock);
		return;
	}
	if (!room_for(c, sock, &p, grpc, &slot))
		return;
	if (grpc && (watch = fcntl(sock, F_DUPFD_CLOEXEC, 0)) < 0) {
		close(sock);
		return;
	}
	k = calloc(1, sizeof(*k));
	if (k)
		k->fds = malloc((c->o.fds_per_conn + 1) * sizeof(*k->fds));
	if (!k || !k->fds || ipc_random(k->token, sizeof(k->token))) {
		if (k)
			free(k->fds);
		free(k);
		if (watch >= 0)
			close(watch);
		if (grpc)
			close(sock);
		else
			refuse(sock, -ENOMEM, "the agent is out of memory");
		return;
	}
	for (unsigned i = 0; i < c->o.fds_per_conn; i++)
		k->fds[i].fd = -1;
	k->fds[c->o.fds_per_conn].fd = -2; /* the end */
	k->grpc = grpc;
	k->sock = grpc ? watch : sock;
	k->who = p;
	/* Listed before the hello: the client's first call may come at once. */
	pthread_mutex_lock(&c->mu);
	k->who.conn = ++c->next_conn;
	c->conns[slot] = k;
	c->nconns++;
	pthread_mutex_unlock(&c->mu);
	if (grpc) {
		c->o.adopt(c->o.adopt_ctx, sock); /* gRPC's now; ours watches for its end */
		return;
	}
	memcpy(m.magic, IPC_CRED_MAGIC, 8);
	memcpy(m.token, k->token, sizeof(m.token));
	if (ipc_cred_send(sock, &m, -1))
		drop_conn(c, slot);
}

/* A region's descriptor: kept under a new ticket, answered either way. */
static void on_fd(struct cred *c, struct conn *k, const struct ipc_cred_msg *in, int fd)
{
	struct ipc_cred_msg m = {.op = IPC_CRED_ACK, .seq = in->seq};
	unsigned i;

	memcpy(m.magic, IPC_CRED_MAGIC, 8);
	pthread_mutex_lock(&c->mu);
	for (i = 0; i < c->o.fds_per_conn && k->fds[i].fd >= 0; i++)
		;
	if (fd < 0) {
		m.status = -EINVAL;
		snprintf(m.message, sizeof(m.message),
		         "a region message came without a descriptor");
	} else if (i == c->o.fds_per_conn) {
		m.status = -EAGAIN;
		snprintf(m.message, sizeof(m.message),
		         "%u regions sent and not yet registered on this connection, the limit",
		         c->o.fds_per_conn);
	} else {
		m.ticket = ipc_random_id();
		k->fds[i] = (struct held_fd){m.ticket, in->size, fd};
		fd = -1;
	}
	pthread_mutex_unlock(&c->mu);
	if (fd >= 0)
		close(fd);
	ipc_cred_send(k->sock, &m, -1);
}

/* What a connection sent; false when it is gone (or spoke nonsense). */
static bool on_readable(struct cred *c, struct conn *k)
{
	struct ipc_cred_msg in;
	int fd, rc;

	if (k->grpc) /* its end: the peer or gRPC closed it */
		return false;
	rc = ipc_cred_recv(k->sock, &in, &fd, 0);

	if (rc == -ETIMEDOUT || rc == -EAGAIN)
		return true;
	if (rc)
		return false;
	if (in.op != IPC_CRED_FD) {
		if (fd >= 0)
			close(fd);
		return false;
	}
	on_fd(c, k, &in, fd);
	return true;
}

static void *cred_thread(void *arg)
{
	struct cred *c = arg;
	struct pollfd *p = calloc(CRED_MAX_CONNS + 3, sizeof(*p));
	unsigned *idx = calloc(CRED_MAX_CONNS + 3, sizeof(*idx));

	if (!p || !idx) {
		log_msg(LOG_ERR, "credentials socket: out of memory: nobody can connect");
		goto out;
	}
	for (;;) {
		int64_t wait = c->pause_until - ipc_mono_ns();
		nfds_t n = 3;

		p[0] = (struct pollfd){c->stopfd, POLLIN, 0};
		p[1] = (struct pollfd){wait > 0 ? -1 : c->lsock, POLLIN, 0};
		p[2] = (struct pollfd){wait > 0 ? -1 : c->o.grpc_lfd, POLLIN, 0};
		/* Only this thread changes the table's entries: reading them unlocked is safe. */
		for (unsigned i = 0; i < CRED_MAX_CONNS; i++)
			if (c->conns[i]) {
				/* a gRPC connection's bytes are gRPC's: only its end is ours */
				short ev = c->conns[i]->grpc ? POLLRDHUP : POLLIN;

				idx[n] = i;
				p[n++] = (struct pollfd){c->conns[i]->sock, ev, 0};
			}
		if (poll(p, n, wait > 0 ? (int)(wait / 1000000) + 1 : -1) < 0) {
			if (errno == EINTR)
				continue;
			log_msg(LOG_ERR, "credentials socket: poll: %s", strerror(errno));
			break;
		}
		if (p[0].revents)
			break;
		for (nfds_t j = 3; j < n; j++)
			if (p[j].revents && !on_readable(c, c->conns[idx[j]]))
				drop_conn(c, idx[j]);
		if (p[1].revents & POLLIN)
			on_accept(c, c->lsock, false);
		if (p[2].revents & POLLIN)
			on_accept(c, c->o.grpc_lfd, true);
	}
out:
	free(p);
	free(idx);
	return NULL;
}

static int bind_cred(struct cred *c, char *err)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int rc = ipc_cred_path(c->o.endpoint, c->path, sizeof(c->path));

	if (rc)
		return ipc_errf(err, rc, "listen address %s: no credentials socket beside it",
		                c->o.endpoint);
	c->lsock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (c->lsock < 0)
		return ipc_errf(err, -errno, "socket: %s", strerror(errno));
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", c->path);
	/* The gRPC socket beside it is ours (its lock is held): so is this one. */
	if (unlink(c->path) && errno != ENOENT)
		return ipc_errf(err, -errno, "removing the stale %s: %s", c->path, strerror(errno));
	if (bind(c->lsock, (struct sockaddr *)&sa, sizeof(sa)) || listen(c->lsock, 128))
		return ipc_errf(err, -errno, "cannot listen on %s: %s", c->path, strerror(errno));
	if (c->o.socket_gid >= 0 && chown(c->path, (uid_t)-1, (gid_t)c->o.socket_gid))
		return ipc_errf(err, -errno, "chown group %ld of %s: %s", c->o.socket_gid, c->path,
		                strerror(errno));
	if (c->o.socket_mode && chmod(c->path, c->o.socket_mode))
		return ipc_errf(err, -errno, "chmod %o %s: %s", c->o.socket_mode, c->path,
		                strerror(errno));
	return 0;
}

int cred_create(const struct cred_opts *o, struct cred **out, char *err)
{
	struct cred *c = calloc(1, sizeof(*c));
	int rc;

	*out = NULL;
	if (!c)
		return ipc_errf(err, -ENOMEM, "out of memory");
	c->o = *o;
	if (!c->o.conns_per_user)
		c->o.conns_per_user = 1;
	if (!c->o.fds_per_conn)
		c->o.fds_per_conn = 1;
	c->lsock = c->stopfd = -1;
	pthread_mutex_init(&c->mu, NULL);
	rc = bind_cred(c, err);
	if (rc)
		goto fail;
	c->stopfd = eventfd(0, EFD_CLOEXEC);
	if (c->stopfd < 0) {
		rc = ipc_errf(err, -errno, "eventfd: %s", strerror(errno));
		goto fail;
	}
	rc = -pthread_create(&c->thread, NULL, cred_thread, c);
	if (rc) {
		ipc_errf(err, rc, "starting the credentials thread: %s", strerror(-rc));
		goto fail;
	}
	pthread_setname_np(c->thread, "ckpt-cred");
	c->started = true;
	*out = c;
	return 0;
fail:
	cred_destroy(c);
	return rc;
}

void cred_stop(struct cred *c)
{
	uint64_t one = 1;

	if (!c || !c->started)
		return;
	if (write(c->stopfd, &one, sizeof(one)) < 0)
		log_msg(LOG_WARNING, "credentials thread: %s", strerror(errno));
	pthread_join(c->thread, NULL);
	c->started = false;
}

void cred_destroy(struct cred *c)
{
	if (!c)
		return;
	cred_stop(c);
	for (unsigned i = 0; i < CRED_MAX_CONNS; i++)
		conn_free(c->conns[i]);
	if (c->lsock >= 0) {
		close(c->lsock);
		unlink(c->path);
	}
	if (c->stopfd >= 0)
		close(c->stopfd);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

/* Compares without stopping at the first difference. */
static bool token_eq(const uint8_t *a, const uint8_t *b)
{
	uint8_t d = 0;

	for (size_t i = 0; i < IPC_TOKEN_BYTES; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

int cred_identify(struct cred *c, const char *hex, size_t len, struct peer *p)
{
	uint8_t token[IPC_TOKEN_BYTES];
	int rc = -EACCES;

	memset(p, 0, sizeof(*p));
	if (!c || ipc_token_parse(hex, len, token))
		return -EACCES;
	pthread_mutex_lock(&c->mu);
	for (unsigned i = 0; i < CRED_MAX_CONNS; i++)
		if (c->conns[i] && !c->conns[i]->grpc && token_eq(c->conns[i]->token, token)) {
			*p = c->conns[i]->who;
			rc = 0;
			break;
		}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

int cred_take_fd(struct cred *c, const struct peer *p, uint64_t ticket, uint64_t *size)
{
	int fd = -ENOENT;

	pthread_mutex_lock(&c->mu);
	for (unsigned i = 0; i < CRED_MAX_CONNS && fd == -ENOENT; i++) {
		struct conn *k = c->conns[i];

		if (!k || k->grpc || k->who.conn != p->conn)
			continue;
		for (unsigned j = 0; j < c->o.fds_per_conn; j++)
			if (k->fds[j].fd >= 0 && k->fds[j].ticket == ticket) {
				fd = k->fds[j].fd;
				*size = k->fds[j].size;
				k->fds[j].fd = -1;
				break;
			}
		break;
	}
	pthread_mutex_unlock(&c->mu);
	return fd;
}

unsigned cred_count(struct cred *c)
{
	unsigned n;

	if (!c)
		return 0;
	pthread_mutex_lock(&c->mu);
	n = c->nconns;
	pthread_mutex_unlock(&c->mu);
	return n;
}
