/*
 * ioeng: asynchronous shard I/O. One thread per engine owns everything in
 * it (the io_uring ring, the wait list, the slots); the agent's workers
 * hand requests over with ioeng_submit and the completions (r->done) run on
 * that thread. Two engines behind one interface:
 *
 *   io_uring  the ring, with the staging pool's chunks registered when the
 *             memlock limit allows (WRITE_FIXED/READ_FIXED), else plain
 *             WRITE/READ; at most queue_depth requests in flight;
 *   pwrite    where io_uring is unavailable (seccomp in containers,
 *             kernel.io_uring_disabled): the same thread doing
 *             ops->pwrite/pread/fsync itself, one request at a time.
 *
 * Map of the file:
 *   hand-over     ioeng_submit: a mutex-protected FIFO (r->next) and an
 *                 eventfd; the eventfd is written only when the FIFO was
 *                 empty, since the thread always takes the whole FIFO
 *   results       settle(): one place decides what a result means
 *                 (fault injection, short transfers, -EAGAIN, EOF)
 *   io_uring      the ring's loop: take, prep SQEs, submit the batch and
 *                 wait for one completion, peek the rest
 *   pwrite        the fallback's loop
 *   control       create, buffer registration (run on the thread: it owns
 *                 the ring), stats, destroy
 *
 * Invariants: nothing is allocated per request; prep() runs in submission
 * order; after r->done(r) the engine never touches r again (done may submit
 * r anew, or free it).
 */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include "storage/io/ioeng.h"

#define IOENG_MAX_DEPTH 256u
/* -EAGAIN/-EINTR resubmissions before a request fails with that error. */
#define IOENG_MAX_TRIES 1000u
/*
 * A write that moves 0 bytes makes no progress and says nothing: it costs
 * a quarter of the budget, so the fourth one in a row fails with -EIO.
 */
#define IOENG_ZERO_WRITE_COST (IOENG_MAX_TRIES / 4)
/* One SQE / syscall moves at most this much (io_uring lengths are 32 bits). */
#define IOENG_MAX_CHUNK (1u << 30)

struct ioeng_counters {
	_Atomic uint64_t bytes_written, bytes_read;
	_Atomic uint64_t writes, reads, fsyncs, fsyncs_issued;
	_Atomic uint64_t retries, errors;
	_Atomic unsigned inflight;
};

struct ioeng {
	enum ioeng_kind kind; /* IOENG_URING or IOENG_PWRITE, once created */
	const struct fsops *ops;
	unsigned depth;
	int efd; /* wakes the thread: written when the FIFO goes non-empty */
	pthread_t thread;
	bool started;

	pthread_mutex_t lock; /* the fields down to reg_rc */
	pthread_cond_t reg_cond;
	struct io_req *in_head, *in_tail; /* submitted, not yet taken */
	struct io_req *cancel_head, *cancel_tail; /* submitted after destroy began */
	bool stopping, exited;
	bool reg_pending; /* a registration handed to the thread */
	const struct iovec *reg_iov;
	unsigned reg_n;
	int reg_rc;

	/* The thread's own. */
	struct io_req *wait_head, *wait_tail; /* taken, waiting for a slot */
	unsigned inflight;
	bool poll_armed;
	bool ring_ok;
	unsigned nfixed; /* registered buffers, 0 if none */
	struct io_uring ring;

	atomic_bool registered;
	struct ioeng_counters c;
	char detail[IPC_ERRLEN]; /* written by create and register, not the thread */
};

/* The engine whose thread this is: submissions from done() need no wake-up. */
static __thread struct ioeng *tls_engine;

static void count(_Atomic uint64_t *c, uint64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

static void set_inflight(struct ioeng *e, unsigned n)
{
	e->inflight = n;
	atomic_store_explicit(&e->c.inflight, n, memory_order_relaxed);
}

/* ---- hand-over -------------------------------------------------------- */

static void wake(struct ioeng *e)
{
	uint64_t one = 1;

	/* Cannot block (the counter would have to reach 2^64 - 1) nor fail. */
	if (write(e->efd, &one, sizeof(one)) < 0)
		assert(errno == EAGAIN);
}

static void drain_wake(struct ioeng *e)
{
	uint64_t v;

	if (read(e->efd, &v, sizeof(v)) < 0)
		assert(errno == EAGAIN);
}

static void append(struct io_req **head, struct io_req **tail, struct io_req *r)
{
	r->next = NULL;
	if (*tail)
		(*tail)->next = r;
	else
		*head = r;
	*tail = r;
}

void ioeng_submit(struct ioeng *e, struct io_req *r)
{
	bool was_empty;

	r->xfer = 0;
	r->tries = 0;
	r->res = 0;
	pthread_mutex_lock(&e->lock);
	if (e->exited) {
		/* Submitted after ioeng_destroy ended: a caller's bug; say so. */
		pthread_mutex_unlock(&e->lock);
		r->res = -ECANCELED;
		if (r->done)
			r->done(r);
		return;
	}
	/*
	 * The thread takes both lists whole, so whoever finds them empty is
	 * the first since the last take and the one who must wake it.
	 */
	was_empty = !e->in_head && !e->cancel_head;
	if (e->stopping && tls_engine != e)
		append(&e->cancel_head, &e->cancel_tail, r);
	else /* done() callbacks still chain their next request while draining */
		append(&e->in_head, &e->in_tail, r);
	/* Under the lock: once it is dropped the thread may finish and free e. */
	if (was_empty)
		wake(e);
	pthread_mutex_unlock(&e->lock);
}

static void pop_wait(struct ioeng *e, struct io_req **out)
{
	struct io_req *r = e->wait_head;

	e->wait_head = r->next;
	if (!e->wait_head)
		e->wait_tail = NULL;
	r->next = NULL;
	*out = r;
}

static int do_register(struct ioeng *e, const struct iovec *iov, unsigned n);

/*
 * Moves the submitted requests to the wait list (order kept), completes the
 * cancelled ones, and runs a buffer registration handed over.
 */
static void take(struct ioeng *e)
{
	struct io_req *cancel, *r;
	const struct iovec *iov = NULL;
	unsigned n = 0;

	pthread_mutex_lock(&e->lock);
	if (e->in_head) {
		if (e->wait_tail)
			e->wait_tail->next = e->in_head;
		else
			e->wait_head = e->in_head;
		e->wait_tail = e->in_tail;
		e->in_head = e->in_tail = NULL;
	}
	cancel = e->cancel_head;
	e->cancel_head = e->cancel_tail = NULL;
	if (e->reg_pending) {
		iov = e->reg_iov;
		n = e->reg_n;
	}
	pthread_mutex_unlock(&e->lock);

	while (cancel) {
		r = cancel;
		cancel = r->next;
		r->res = -ECANCELED;
		count(&e->c.errors, 1);
		if (r->done)
			r->done(r);
	}
	if (iov) {
		/* Outside the lock: pinning a large pool takes a while. */
		int rc = do_register(e, iov, n);

		pthread_mutex_lock(&e->lock);
		e->reg_rc = rc;
		e->reg_pending = false;
		pthread_cond_broadcast(&e->reg_cond);
		pthread_mutex_unlock(&e->lock);
	}
}

/* True (and the thread may end) once destroy began and nothing is left. */
static bool finished(struct ioeng *e)
{
	bool done;

	pthread_mutex_lock(&e->lock);
	done = e->stopping && !e->in_head && !e->cancel_head && !e->reg_pending && !e->wait_head &&
	       e->inflight == 0;
	if (done)
		e->exited = true;
	pthread_mutex_unlock(&e->lock);
	return done;
}

/* ---- results ---------------------------------------------------------- */

static uint64_t chunk_len(const struct io_req *r)
{
	uint64_t left = r->len - r->xfer;

	return left < IOENG_MAX_CHUNK ? left : IOENG_MAX_CHUNK;
}

static void finish(struct ioeng *e, struct io_req *r, int64_t res)
{
	r->res = res;
	if (res < 0)
		count(&e->c.errors, 1);
	else if (r->op == IO_WRITE)
		count(&e->c.writes, 1);
	else if (r->op == IO_READ)
		count(&e->c.reads, 1);
	else
		count(&e->c.fsyncs, 1);
	if (r->done)
		r->done(r); /* r is the caller's again from here */
}

/*
 * What one result means for r. Returns true when r is finished, with its
 * result in *final (the caller frees the slot, then calls finish()), false
 * when r must go out again for what is left.
 */
static bool settle(struct ioeng *e, struct io_req *r, int64_t res, int64_t *final)
{
	uint64_t want = r->op == IO_FSYNC ? 0 : chunk_len(r);

	if (e->ops->io_result)
		res = e->ops->io_result(r, res);
	if (res == -EAGAIN || res == -EINTR) {
		count(&e->c.retries, 1);
		if (++r->tries < IOENG_MAX_TRIES)
			return false;
		*final = res; /* bounded: a device that never takes it fails */
		return true;
	}
	if (res < 0 || r->op == IO_FSYNC) {
		*final = res < 0 ? res : 0;
		return true;
	}
	if ((uint64_t)res > want) {
		*final = -EIO; /* more than asked: nothing to trust */
		return true;
	}
	if (res == 0) {
		if (r->op == IO_READ) {
			*final = (int64_t)r->xfer; /* end of file: the bytes we got */
			return true;
		}
		count(&e->c.retries, 1);
		r->tries += IOENG_ZERO_WRITE_COST;
		if (r->tries < IOENG_MAX_TRIES)
			return false;
		*final = -EIO;
		return true;
	}
	r->xfer += (uint64_t)res;
	count(r->op == IO_WRITE ? &e->c.bytes_written : &e->c.bytes_read, (uint64_t)res);
	if (r->xfer < r->len) {
		if ((uint64_t)res < want)
			count(&e->c.retries, 1); /* short: the rest goes out again */
		return false;
	}
	*final = (int64_t)r->len;
	return true;
}

/*
 * Runs prep (in submission order) and checks what it left. Returns false
 * when r finished without I/O (bad request, nothing to move).
 */
static bool begin(struct ioeng *e, struct io_req *r)
{
	if (r->prep)
		r->prep(r);
	if (r->op != IO_WRITE && r->op != IO_READ && r->op != IO_FSYNC) {
		finish(e, r, -EINVAL);
		return false;
	}
	if (r->op != IO_FSYNC && r->len == 0) {
		finish(e, r, 0);
		return false;
	}
	return true;
}

/* ---- io_uring --------------------------------------------------------- */

static struct io_uring_sqe *get_sqe(struct ioeng *e)
{
	struct io_uring_sqe *sqe;

	/*
	 * The SQ has room for every slot plus the eventfd poll, and is empty
	 * when each loop starts; a full SQ would be our bug, but submitting
	 * what is there makes room rather than losing a request.
	 */
	while (!(sqe = io_uring_get_sqe(&e->ring)))
		io_uring_submit(&e->ring);
	return sqe;
}

static void uring_issue(struct ioeng *e, struct io_req *r)
{
	struct io_uring_sqe *sqe = get_sqe(e);
	char *p = (char *)r->buf + r->xfer;
	unsigned n = (unsigned)chunk_len(r);
	uint64_t off = r->off + r->xfer;
	bool fixed = r->buf_index >= 0 && (unsigned)r->buf_index < e->nfixed;

	if (r->op == IO_WRITE && fixed)
		io_uring_prep_write_fixed(sqe, r->fd, p, n, off, r->buf_index);
	else if (r->op == IO_WRITE)
		io_uring_prep_write(sqe, r->fd, p, n, off);
	else if (r->op == IO_READ && fixed)
		io_uring_prep_read_fixed(sqe, r->fd, p, n, off, r->buf_index);
	else if (r->op == IO_READ)
		io_uring_prep_read(sqe, r->fd, p, n, off);
	else
		io_uring_prep_fsync(sqe, r->fd, 0);
	if (sqe->opcode == IORING_OP_FSYNC)
		count(&e->c.fsyncs_issued, 1);
	io_uring_sqe_set_data(sqe, r);
}

/* Handles every completion there is (the caller waited for one). */
static void uring_reap(struct ioeng *e)
{
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0;

	io_uring_for_each_cqe(&e->ring, head, cqe)
	{
		void *data = io_uring_cqe_get_data(cqe);
		struct io_req *r = data;
		int64_t final;

		seen++;
		if (data == e) { /* the eventfd poll: something was submitted */
			drain_wake(e);
			e->poll_armed = false;
			continue;
		}
		if (!settle(e, r, cqe->res, &final)) {
			uring_issue(e, r); /* keeps its slot */
			continue;
		}
		set_inflight(e, e->inflight - 1);
		finish(e, r, final);
	}
	io_uring_cq_advance(&e->ring, seen);
}

static void uring_loop(struct ioeng *e)
{
	for (;;) {
		struct io_req *r;
		int ret;

		take(e);
		/* Slots are given in FIFO order, so prep runs in submission order. */
		while (e->inflight < e->depth && e->wait_head) {
			pop_wait(e, &r);
			if (!begin(e, r))
				continue;
			uring_issue(e, r);
			set_inflight(e, e->inflight + 1);
		}
		if (finished(e))
			break;
		if (!e->poll_armed) {
			/* One wait covers both completions and new submissions. */
			struct io_uring_sqe *sqe = get_sqe(e);

			io_uring_prep_poll_add(sqe, e->efd, POLLIN);
			io_uring_sqe_set_data(sqe, e);
			e->poll_armed = true;
		}
		ret = io_uring_submit_and_wait(&e->ring, 1);
		if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY && ret != -ETIME) {
			/* The ring itself failed: nothing sane to do but wait and retry. */
			count(&e->c.errors, 1);
			usleep(1000);
		}
		uring_reap(e);
	}
}

/* ---- pwrite ----------------------------------------------------------- */

static void pwrite_run(struct ioeng *e, struct io_req *r)
{
	int64_t res, final;

	for (;;) {
		char *p = (char *)r->buf + r->xfer;
		size_t n = (size_t)chunk_len(r);
		off_t off = (off_t)(r->off + r->xfer);

		if (r->op == IO_WRITE)
			res = e->ops->pwrite(r->fd, p, n, off);
		else if (r->op == IO_READ)
			res = e->ops->pread(r->fd, p, n, off);
		else {
			count(&e->c.fsyncs_issued, 1);
			res = e->ops->fsync(r->fd);
		}
		if (settle(e, r, res, &final))
			break;
	}
	set_inflight(e, 0);
	finish(e, r, final);
}

static void pwrite_loop(struct ioeng *e)
{
	for (;;) {
		struct pollfd pfd = {.fd = e->efd, .events = POLLIN};
		struct io_req *r;

		take(e);
		if (e->wait_head) {
			pop_wait(e, &r);
			if (begin(e, r)) {
				set_inflight(e, 1);
				pwrite_run(e, r);
			}
			continue;
		}
		if (finished(e))
			break;
		/* Drained before the next take: a wake-up after it is not lost. */
		if (poll(&pfd, 1, -1) > 0)
			drain_wake(e);
	}
}

/* ---- control ---------------------------------------------------------- */

static void *engine_main(void *arg)
{
	struct ioeng *e = arg;

	tls_engine = e;
	pthread_setname_np(pthread_self(), "ckpt-io");
	if (e->kind == IOENG_URING)
		uring_loop(e);
	else
		pwrite_loop(e);
	return NULL;
}

int ioeng_create(const struct ioeng_opts *o, struct ioeng **out, char *err)
{
	struct ioeng *e;
	sigset_t all, old;
	int rc;

	*out = NULL;
	if (!o || o->queue_depth < 1 || o->queue_depth > IOENG_MAX_DEPTH)
		return ipc_errf(err, -EINVAL, "I/O queue depth %u is out of range: use 1..%u",
		                o ? o->queue_depth : 0, IOENG_MAX_DEPTH);
	if (o->kind != IOENG_AUTO && o->kind != IOENG_URING && o->kind != IOENG_PWRITE)
		return ipc_errf(err, -EINVAL, "unknown I/O engine kind %d", (int)o->kind);
	e = calloc(1, sizeof(*e));
	if (!e)
		return ipc_errf(err, -ENOMEM, "out of memory creating the I/O engine");
	e->ops = o->ops ? o->ops : &fsops_posix;
	e->depth = o->queue_depth;
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->reg_cond, NULL);
	e->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (e->efd < 0) {
		rc =
		    ipc_errf(err, -errno, "eventfd for the I/O engine failed: %s", strerror(errno));
		goto fail;
	}

	e->kind = IOENG_PWRITE;
	if (o->kind == IOENG_PWRITE) {
		snprintf(e->detail, sizeof(e->detail), "pwrite (configured)");
	} else {
		/* depth slots plus the eventfd poll; the kernel rounds up. */
		rc = io_uring_queue_init(e->depth + 1, &e->ring, 0);
		if (rc < 0 && o->kind == IOENG_URING) {
			ipc_errf(err, rc,
			         "io_uring_queue_init(%u) failed: %s: io_uring is unavailable here "
			         "(kernel.io_uring_disabled, or a container's seccomp profile); "
			         "use the pwrite engine",
			         e->depth + 1, strerror(-rc));
			goto fail;
		}
		if (rc < 0) {
			snprintf(e->detail, sizeof(e->detail), "pwrite (io_uring_queue_init: %s)",
			         strerror(-rc));
		} else {
			e->ring_ok = true;
			e->kind = IOENG_URING;
			snprintf(e->detail, sizeof(e->detail), "io_uring, unregistered buffers");
		}
	}

	/* Signals are the agent's main thread's business, never this thread's. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = -pthread_create(&e->thread, NULL, engine_main, e);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc < 0) {
		ipc_errf(err, rc, "starting the I/O thread failed: %s", strerror(-rc));
		goto fail;
	}
	e->started = true;
	*out = e;
	return 0;

fail:
	ioeng_destroy(e);
	return rc;
}

/* On the engine thread: it owns the ring. */
static int do_register(struct ioeng *e, const struct iovec *iov, unsigned n)
{
	int rc;

	if (e->nfixed)
		return -EBUSY;
	rc = io_uring_register_buffers(&e->ring, iov, n);
	if (rc == 0)
		e->nfixed = n;
	return rc;
}

static void fmt_bytes(char *buf, size_t len, uint64_t v)
{
	if (v >= (1ull << 20) && v % (1ull << 20) == 0)
		snprintf(buf, len, "%llu MiB", (unsigned long long)(v >> 20));
	else if (v >= 1024 && v % 1024 == 0)
		snprintf(buf, len, "%llu KiB", (unsigned long long)(v >> 10));
	else
		snprintf(buf, len, "%llu bytes", (unsigned long long)v);
}

/* "; RLIMIT_MEMLOCK is 8 MiB" where the limit is the likely reason. */
static void memlock_note(int rc, char *buf, size_t len)
{
	struct rlimit rl;
	char v[32];

	buf[0] = '\0';
	if ((rc != -ENOMEM && rc != -EPERM) || getrlimit(RLIMIT_MEMLOCK, &rl) < 0)
		return;
	if (rl.rlim_cur == RLIM_INFINITY)
		snprintf(v, sizeof(v), "unlimited");
	else
		fmt_bytes(v, sizeof(v), (uint64_t)rl.rlim_cur);
	snprintf(buf, len, "; RLIMIT_MEMLOCK is %s", v);
}

int ioeng_register_buffers(struct ioeng *e, const struct iovec *iov, unsigned n, char *err)
{
	char note[64], total[32];
	uint64_t bytes = 0;
	int rc;

	if (e->kind != IOENG_URING)
		return ipc_errf(err, -EOPNOTSUPP,
		                "buffers are not registered: the I/O engine is %s", e->detail);
	if (!iov || n == 0)
		return ipc_errf(err, -EINVAL, "no buffers to register");
	if (tls_engine == e) {
		rc = do_register(e, iov, n);
	} else {
		pthread_mutex_lock(&e->lock);
		while (e->reg_pending) /* one registration at a time */
			pthread_cond_wait(&e->reg_cond, &e->lock);
		e->reg_iov = iov;
		e->reg_n = n;
		e->reg_pending = true;
		wake(e);
		while (e->reg_pending)
			pthread_cond_wait(&e->reg_cond, &e->lock);
		rc = e->reg_rc;
		pthread_mutex_unlock(&e->lock);
	}
	if (rc == 0) {
		snprintf(e->detail, sizeof(e->detail), "io_uring, %u registered buffers", n);
		atomic_store(&e->registered, true);
		return 0;
	}
	if (rc == -EBUSY)
		return ipc_errf(err, rc, "io_uring buffers are already registered");
	for (unsigned i = 0; i < n; i++)
		bytes += iov[i].iov_len;
	fmt_bytes(total, sizeof(total), bytes);
	memlock_note(rc, note, sizeof(note));
	snprintf(e->detail, sizeof(e->detail),
	         "io_uring, unregistered buffers (io_uring_register_buffers: %s%s)", strerror(-rc),
	         note);
	return ipc_errf(err, rc,
	                "registering %u staging buffers (%s) with io_uring failed: %s%s; writes "
	                "go out unregistered (slower)%s",
	                n, total, strerror(-rc), note,
	                note[0] ? ": raise the limit (LimitMEMLOCK=infinity in the systemd unit) "
	                          "or give the agent CAP_IPC_LOCK"
	                        : "");
}

const char *ioeng_name(const struct ioeng *e)
{
	return e->kind == IOENG_URING ? "io_uring" : "pwrite";
}

const char *ioeng_detail(const struct ioeng *e)
{
	return e->detail;
}

bool ioeng_registered(const struct ioeng *e)
{
	return atomic_load(&e->registered);
}

void ioeng_get_stats(struct ioeng *e, struct ioeng_stats *out)
{
	out->bytes_written = atomic_load_explicit(&e->c.bytes_written, memory_order_relaxed);
	out->bytes_read = atomic_load_explicit(&e->c.bytes_read, memory_order_relaxed);
	out->writes = atomic_load_explicit(&e->c.writes, memory_order_relaxed);
	out->reads = atomic_load_explicit(&e->c.reads, memory_order_relaxed);
	out->fsyncs = atomic_load_explicit(&e->c.fsyncs, memory_order_relaxed);
	out->fsyncs_issued = atomic_load_explicit(&e->c.fsyncs_issued, memory_order_relaxed);
	out->retries = atomic_load_explicit(&e->c.retries, memory_order_relaxed);
	out->errors = atomic_load_explicit(&e->c.errors, memory_order_relaxed);
	out->inflight = atomic_load_explicit(&e->c.inflight, memory_order_relaxed);
}

void ioeng_destroy(struct ioeng *e)
{
	if (!e)
		return;
	/* From a done() callback this would wait for itself. */
	assert(tls_engine != e);
	if (e->started) {
		pthread_mutex_lock(&e->lock);
		e->stopping = true;
		wake(e);
		pthread_mutex_unlock(&e->lock);
		/* The thread finishes everything queued and in flight first. */
		pthread_join(e->thread, NULL);
	}
	if (e->ring_ok)
		io_uring_queue_exit(&e->ring);
	if (e->efd >= 0)
		close(e->efd);
	pthread_cond_destroy(&e->reg_cond);
	pthread_mutex_destroy(&e->lock);
	free(e);
}
