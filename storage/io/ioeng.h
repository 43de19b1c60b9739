/*
 * storage/io/ioeng.h: asynchronous I/O (ioeng.c). One thread owns an io_uring
 * ring (or, where io_uring is unavailable, does pwrite/pread itself);
 * requests come from any thread through a queue and an eventfd, and their
 * completions run on that thread.
 *
 * Errors: negative errno, and a sentence in `err` (IPC_ERRLEN bytes).
 */
#ifndef CKPT_STORAGE_IOENG_H
#define CKPT_STORAGE_IOENG_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "storage/io/fsops.h"
#include "ipc/base/base.h"

enum io_op {
	IO_WRITE,
	IO_READ,
	IO_FSYNC,
};

/*
 * One request. The submitter owns the memory (embed it in a longer-lived
 * object: the engine allocates nothing per request). Short transfers and
 * -EAGAIN are retried by the engine; a read that meets the end of the file
 * finishes with the bytes it got.
 */
struct io_req {
	enum io_op op;
	int fd;
	void *buf;
	uint64_t len;
	uint64_t off;
	int buf_index; /* registered buffer, or -1 */
	void (*prep)(struct io_req *); /* optional: I/O thread, before the first submission */
	void (*done)(struct io_req *); /* I/O thread, once finished */
	void *ctx;
	int64_t res; /* bytes (writes: == len) or negative errno */
	/* engine-private */
	uint64_t xfer;
	unsigned tries;
	struct io_req *next;
};

enum ioeng_kind {
	IOENG_AUTO,
	IOENG_URING,
	IOENG_PWRITE,
};

struct ioeng_opts {
	enum ioeng_kind kind;
	unsigned queue_depth; /* requests in flight, 1..256 */
	const struct fsops *ops;
};

struct ioeng_stats {
	uint64_t bytes_written, bytes_read;
	uint64_t writes, reads, fsyncs;
	/*
	 * fsyncs that went out to the kernel: an IORING_OP_FSYNC prepared, or
	 * ops->fsync called. Tests compare it with fsyncs: a request finished
	 * as an fsync that never reached the disk shows as one fewer here.
	 */
	uint64_t fsyncs_issued;
	uint64_t retries, errors;
	unsigned inflight;
};

struct ioeng;

/*
 * Starts the engine and its thread. AUTO tries io_uring and falls back to
 * pwrite, saying why in ioeng_detail(); URING fails if io_uring does.
 */
int ioeng_create(const struct ioeng_opts *o, struct ioeng **out, char *err);
/*
 * Registers buffers (the staging pool's chunks, buf_index = position). On
 * failure (RLIMIT_MEMLOCK, no io_uring) requests go out unregistered and the
 * detail says why; the call then returns the error for the caller's log.
 */
int ioeng_register_buffers(struct ioeng *e, const struct iovec *iov, unsigned n, char *err);
/* Queues a request; any thread; never blocks. */
void ioeng_submit(struct ioeng *e, struct io_req *r);
const char *ioeng_name(const struct ioeng *e); /* "io_uring" or "pwrite" */
const char *ioeng_detail(const struct ioeng *e); /* what is in use and why */
bool ioeng_registered(const struct ioeng *e);
void ioeng_get_stats(struct ioeng *e, struct ioeng_stats *out);
/* Waits for requests in flight, stops the thread. NULL is fine. */
void ioeng_destroy(struct ioeng *e);

#endif /* CKPT_STORAGE_IOENG_H */
