/*
 * libckpt's RPC layer (rpc_*.c), in the library's own types: each function
 * builds one request from C values, makes the call (rpc.c's cl_call), and
 * reads the reply back into C values. The rest of the library (libckpt.c,
 * session_thread.c, trainer_*.c) names no protocol type. Errors
 * as cl_call's: a negative errno, its message in ckpt_last_error(c).
 */
#ifndef CKPT_CLIENT_RPC_H
#define CKPT_CLIENT_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/client.h"

/* ---- the Attach stream (rpc_attach.c) ----------------------------------- */

/* One message of the session stream, as the session thread handles it. */
struct cl_event {
	bool save; /* it tells of a save: the fields below */
	uint64_t save_id;
	int state; /* enum ckpt_state */
	bool upload_failed;
	char reason[IPC_ERRLEN];
};

/*
 * The session thread's next event from the stream (messages that do not
 * decode passed over): 1 and *ev; 0 once the stream ended (cancelled by us,
 * or the agent went).
 */
int cl_rpc_next_event(struct ckpt_client *c, struct cl_event *ev);

/* ---- regions (rpc_region.c) --------------------------------------------- */

/* RegisterRegion of the descriptor handed with `ticket`: the agent's id into *region_id. */
int cl_rpc_register_region(struct ckpt_client *c, uint64_t ticket, uint64_t size,
                           uint64_t *region_id, int timeout_ms);
/* DropRegion, a call that only tidies up (cl_tidy_call): nothing said back. */
void cl_rpc_drop_region(struct ckpt_client *c, uint64_t region_id);

/* ---- plans (rpc_plan.c) ------------------------------------------------- */

/* A CreatePlan request in the library's types. */
struct plan_spec {
	const char *job;
	int rank, world;
	int backpressure; /* enum ckpt_backpressure */
	const char *run; /* "" for none */
	uint32_t copies;
	const struct ipc_tensor *tensors; /* kind: enum cl_region_kind */
	size_t n;
	const struct cl_gpu_alloc
	    *gpu; /* a CUDA plan's allocations (tensors' CUDA regions index it) */
	size_t ngpu;
	uint64_t fence_region; /* a CUDA plan's fence page */
};

/* What the agent made of a plan. */
struct plan_made {
	uint64_t plan_id;
	uint64_t shard_bytes;
	bool uploads;
};

/*
 * CreatePlan for the session: the request packed into p->req (p->req_len)
 * first, kept for an agent that comes back, then sent.
 */
int cl_rpc_create_plan(struct ckpt_client *c, const struct plan_spec *spec, struct ckpt_plan *p,
                       struct plan_made *out, int timeout_ms);

/* cl_rpc_create_plan_again's answer when p's kept request cannot be read (out of memory). */
#define CL_RPC_NO_REQUEST 1

/*
 * p's kept request again for the new session, its host regions (and fence
 * page) the new agent's ids, found through each region's key in c->allocs:
 * 0 and *out; a negative errno (said: a region freed, or the call's); or
 * CL_RPC_NO_REQUEST (nothing sent).
 */
int cl_rpc_create_plan_again(struct ckpt_client *c, const struct ckpt_plan *p,
                             struct plan_made *out, int timeout_ms);

/* DropPlan, a call that only tidies up (cl_tidy_call): nothing said back. */
void cl_rpc_drop_plan(struct ckpt_client *c, uint64_t plan_id);

/* ---- saves and restores (rpc_save.c, rpc_restore.c) ------------------- */

struct save_spec {
	uint64_t plan_id;
	int64_t step;
	const char *meta_json; /* NULL: none */
	const uint8_t *cuda_event; /* a CUDA plan's event (CL_GPU_HANDLE bytes), or NULL */
};

struct save_taken {
	uint64_t save_id;
	int state; /* enum ckpt_state */
	uint32_t fence_seq;
	char reason[IPC_ERRLEN];
};

int cl_rpc_save(struct ckpt_client *c, const struct save_spec *spec, struct save_taken *out,
                int timeout_ms);

struct restore_spec {
	uint64_t plan_id;
	int64_t step; /* CKPT_LATEST: the newest */
	bool fallback, strict;
};

/* A restore's answer: the strings are the reply's, until cl_rpc_restore_free. */
struct restore_done {
	int64_t step;
	char **skipped;
	size_t n_skipped;
	const char *meta_json; /* NULL or "" when none */
	void *reply;
};

int cl_rpc_restore(struct ckpt_client *c, const struct restore_spec *spec, struct restore_done *out,
                   int timeout_ms);
void cl_rpc_restore_free(struct restore_done *r);

#endif /* CKPT_CLIENT_RPC_H */
