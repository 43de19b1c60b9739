/*
 * The base of the project, with no protocol in it (ipc/base/base.c): every
 * part includes it, storage/, layout/ and commit/ nothing else of ipc/.
 *
 *   - errors: a negative errno, and a sentence in `err` (IPC_ERRLEN bytes)
 *     that names what was wrong;
 *   - the limits every request and every file read back is held to, and
 *     the checks of names, steps, ranks and meta: the same words in
 *     libckpt and the agent;
 *   - dtypes, and a tensor's bytes from its dtype and shape;
 *   - random ids, and the clocks.
 *
 * No threads of its own; every function is safe to call from any thread.
 */
#ifndef CKPT_BASE_H
#define CKPT_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define IPC_ERRLEN 512

/* Limits: every request is bounded. */
#define IPC_MAX_NDIM 16
#define IPC_MAX_JOB 64 /* also a node's and a run's name */
#define IPC_DEFAULT_RUN "0"
#define IPC_MAX_TENSOR_NAME 512
#define IPC_MAX_TENSORS 262144
#define IPC_MAX_WORLD 65536
#define IPC_MAX_META 65536
#define IPC_MAX_STEP 999999999999LL /* 12 digits in step-<step> */

/* Formats into err (may be NULL) and returns rc: `return ipc_errf(...)`. */
int ipc_errf(char *err, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- dtypes (the numbers of enum ckpt_dtype) ----------------------------- */
#define IPC_DTYPE_MAX 15
/* Bytes per element, 0 for an unknown dtype. */
unsigned ipc_dtype_size(int dtype);
/* "F32", ...; NULL for an unknown dtype. */
const char *ipc_dtype_name(int dtype);
/* The dtype for a safetensors name, 0 if unknown. */
int ipc_dtype_from_name(const char *name);

/* ---- names ---------------------------------------------------------------- */

/* [A-Za-z0-9._-]{1,64}, not beginning with '.': a job, a node, a run (docs/DESIGN.md §2.2). */
int ipc_check_job(const char *job, char *err);
int ipc_check_node(const char *node, char *err);
int ipc_check_run(const char *run, char *err);
/* 1..512 bytes of UTF-8, no control characters, not "__metadata__". */
int ipc_check_tensor_name(const char *name, char *err);
int ipc_check_rank(int rank, int world, char *err);
/* 0..IPC_MAX_STEP. */
int ipc_check_step(int64_t step, char *err);
/* A user meta string: empty, or one JSON value of at most IPC_MAX_META bytes. */
int ipc_check_meta(const char *meta, char *err);

/*
 * dtype size x product(shape) into *nbytes, refusing unknown dtypes, ndim
 * outside 0..16, negative dimensions and overflow. `what` names the tensor.
 */
int ipc_tensor_nbytes(const char *what, int dtype, size_t ndim, const int64_t *shape,
                      uint64_t *nbytes, char *err);

/* ---- a save's states, what a save does when the pool is taken ---------- */

/*
 * A save's states, only ever moving forward but to FAILED (the agent's own
 * enum; numbered as ckpt.proto's State and client/ckpt.h's enum ckpt_state,
 * which ipc/wire.c checks at build time: the edge passes them as they are).
 */
enum save_state {
	SAVE_QUEUED = 1,
	SAVE_CAPTURED = 2, /* out of trainer memory */
	SAVE_DURABLE = 3, /* this rank's shard written and fsync'd */
	SAVE_COMMITTED = 4, /* every rank durable, the manifest durable */
	SAVE_UPLOADED = 5, /* also complete in the upload tier */
	SAVE_FAILED = 6,
	SAVE_SKIPPED = 7, /* the staging pool full, and the policy skip */
};

/* When the staging pool is taken: wait for room, or skip the save (as ckpt.proto's). */
enum backpressure {
	BACKPRESSURE_DEFAULT = 0, /* a plan's: the agent's configured policy */
	BACKPRESSURE_BLOCK = 1,
	BACKPRESSURE_SKIP = 2,
};

/* ---- back-offs ---------------------------------------------------------- */

/*
 * The wait after a failure that follows one of `prev` (0: none before):
 * `first`, then doubled each time, never past `max`. Any unit.
 */
int64_t ipc_backoff_next(int64_t prev, int64_t first, int64_t max);

/* ---- random ids and clocks ------------------------------------------------ */

/* Random bytes from getrandom(2); a random non-zero id. */
int ipc_random(void *buf, size_t len);
uint64_t ipc_random_id(void);

/* CLOCK_REALTIME / CLOCK_MONOTONIC in ns. */
int64_t ipc_now_ns(void);
int64_t ipc_mono_ns(void);

#endif /* CKPT_BASE_H */
