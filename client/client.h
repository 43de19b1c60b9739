/*
 * libckpt's insides, shared with ckptctl: a connection to the agent (with or
 * without the Attach session a trainer needs), unary calls, and reading a
 * server stream. Not installed; the public API is ckpt.h.
 */
#ifndef CKPT_CLIENT_PRIV_H
#define CKPT_CLIENT_PRIV_H

#include <stdbool.h>
#include <pthread.h>

#include <grpc/grpc.h>

#include "client/ckpt.h"
#include "client/cuda_ipc.h"
#include "ipc/ipc.h"

/*
 * A host region from ckpt_host_alloc. Its descriptor stays open: an agent
 * that comes back after a restart is handed it again.
 */
struct cl_alloc {
	struct cl_alloc *next;
	struct ipc_shm shm;
	uint64_t region_id; /* the agent's; 0 while it has none */
	uint64_t key; /* ours, for good: plans name their regions by it (cl_register_again) */
};

/* The Attach call's batches; each flag is set when its batch completes. */
struct attach_tags {
	bool start, status, recv;
};

/* A host region or a CUDA allocation: the protocol's RegionKind (rpc_plan.c checks). */
enum cl_region_kind {
	CL_REGION_HOST = 1,
	CL_REGION_CUDA = 2,
};

/* A state change the session stream brought before ckpt_save knew the save. */
struct cl_early {
	uint64_t save_id;
	int state;
	char reason[IPC_ERRLEN];
};

#define CL_EARLY 64

struct ckpt_client {
	char endpoint[256];
	grpc_channel *ch;
	pthread_mutex_t mu; /* everything below */
	pthread_cond_t cv; /* a save's state changed, or the session ended */
	pthread_cond_t idle; /* the last waiter has left (for disconnect) */
	unsigned waiters; /* threads inside ckpt_save_wait */
	char last_error[1024];
	/* the Attach session, for trainers */
	bool attached;
	uint64_t session_id;
	grpc_completion_queue *scq;
	grpc_call *scall;
	grpc_byte_buffer *sreq; /* sends live until the call ends */
	grpc_metadata_array smd; /* written by gRPC when the stream opens */
	grpc_metadata_array strail; /* the stream's status, when it ends */
	grpc_status_code sstatus;
	grpc_slice sdetails;
	struct attach_tags atags; /* live as long as the call: late completions name them */
	pthread_t thread;
	/*
	 * The session's end. When the agent goes away (a restart, an upgrade, a
	 * crash), the session thread attaches again within reconnect_ms: while
	 * `away`, calls wait for it (saves end FAILED at once); `gone` once it
	 * gave up, or the client is closing.
	 */
	bool gone;
	bool away;
	bool closing; /* ckpt_disconnect has begun */
	unsigned calls; /* API calls talking to the agent now (cl_enter) */
	/*
	 * Held by the session thread while it hands the regions and plans to a
	 * new agent, and by a tidy-up call that drops one of them while the
	 * agent is away (before c->mu, when both are taken).
	 */
	pthread_mutex_t reg_mu;
	/*
	 * Under mu (set once the trainer registers a region or a plan:
	 * trainer_register.c's cl_register_again): the session thread, attached to a new
	 * agent, hands it all again through this. NULL: nothing to hand.
	 */
	int (*register_again)(struct ckpt_client *c);
	int reconnect_ms; /* $CKPT_RECONNECT_SECONDS; 0: never attach again */
	unsigned reattached; /* how many times */
	char agent_version[32]; /* the attached agent's release */
	char away_why[IPC_ERRLEN]; /* while away or gone: what saves and calls are told */
	char session_error[1024]; /* the last failure of the session thread (cl_fail) */
	struct ckpt_save *saves;
	struct cl_early early[CL_EARLY];
	unsigned nearly;
	struct cl_alloc *allocs;
	uint64_t next_key;
	struct ckpt_plan *plans;
	/* the credentials socket (cred_client.c) */
	int cred_sock;
	char token[IPC_TOKEN_HEX + 1]; /* "" until the hello */
	grpc_metadata cred_md; /* the token, sent with every call */
	pthread_mutex_t cred_mu; /* one region hand-over at a time */
	uint32_t cred_seq;
	/*
	 * The last call got no answer within its deadline (the agent is stopped
	 * or hung): calls that only tidy up are not made until one is answered.
	 */
	bool unanswered;
};

struct ckpt_save {
	struct ckpt_save *next;
	struct ckpt_client *c;
	uint64_t id;
	int state;
	char reason[IPC_ERRLEN];
	uint64_t plan_id;
	bool uploads; /* its plan's */
	bool upload_failed; /* COMMITTED, but it will not be UPLOADED (reason says why) */
	bool cuda; /* a save of a CUDA plan: */
	uint32_t fence_seq; /* its number on the plan's fence */
	uintptr_t fence_dev; /* the fence word as the GPU sees it; 0 once the plan is gone */
	int dev; /* the plan's GPU */
};

struct ckpt_plan {
	struct ckpt_plan *next;
	struct ckpt_client *c; /* NULL once the client is disconnected */
	uint64_t id;
	char job[IPC_MAX_JOB + 1];
	int rank, world;
	uint64_t shard_bytes;
	bool uploads; /* the agent has an upload tier: its saves reach UPLOADED */
	/* CUDA plans */
	bool cuda;
	struct cl_gpu_plan gpu;
	void *fence_mem; /* its host page (from ckpt_host_alloc) */
	uint32_t last_seq; /* the newest fence number the agent gave, */
	uint64_t nsaved; /* if it gave any */
	/*
	 * The CreatePlan request as the agent last took it (packed): an agent
	 * that comes back gets it again, its region ids mapped to the new ones.
	 */
	uint8_t *req;
	size_t req_len;
	uint64_t *keys; /* each tensor's region (cl_alloc.key), 0 for CUDA memory */
	uint64_t fence_key;
	char lost[IPC_ERRLEN]; /* why the agent that came back has no such plan, or "" */
};

/* Saves a CUDA plan with the trainer's event recorded on `stream`. */
int cl_save(struct ckpt_plan *p, int64_t step, const char *meta_json, void *stream,
            struct ckpt_save **out);

#define CL_DEFAULT_TIMEOUT_MS 60000
#define CL_NO_TIMEOUT (-1)
/*
 * Calls that only tidy up (DropPlan, DropRegion: the agent frees all of a
 * session's plans and regions when it ends) wait this long, and not at all
 * while the agent is not answering: a trainer whose wait timed out is not
 * held another minute per call on its way out.
 */
#define CL_TIDY_TIMEOUT_MS 5000

/* Connects; with session, also attaches (what ckpt_connect does). */
int cl_open(const char *endpoint, bool session, struct ckpt_client **out);
/* The endpoint actually used ($CKPT_ENDPOINT or the default when NULL). */
const char *cl_endpoint(const struct ckpt_client *c);

/* A deadline timeout_ms from now (negative: none). */
gpr_timespec cl_deadline(int timeout_ms);
/* A call's failed status as negative errno, its message kept for ckpt_last_error. */
int cl_status(struct ckpt_client *c, const char *method, grpc_status_code st, grpc_slice details,
              const char *errstr);

/* The credentials socket: connect and read the token; 0 or negative errno. */
int cl_cred_connect(struct ckpt_client *c);
void cl_cred_close(struct ckpt_client *c);
/* A call's SEND_INITIAL_METADATA op: the token. */
void cl_metadata(struct ckpt_client *c, grpc_op *op);
/* Hands a region's descriptor to the agent; its ticket for RegisterRegion. */
int cl_cred_send_region(struct ckpt_client *c, int fd, uint64_t size, uint64_t *ticket);
/*
 * Whether the agent's process still holds our credentials connection after
 * timeout_ms: its end (a crash, a kill, an exit) closes it, an agent that
 * only ended the session keeps it. The session thread's, at a stream's end.
 */
bool cl_cred_peer_alive(struct ckpt_client *c, int timeout_ms);

/*
 * Around each API call that talks to the agent on a trainer's client: waits
 * while the session thread attaches again to an agent that went away; 0, or
 * -ENOTCONN (with the reason) once it is gone. cl_leave after the call.
 */
int cl_enter(struct ckpt_client *c);
/* cl_enter without the wait: -EAGAIN while the agent is away. */
int cl_try_enter(struct ckpt_client *c);
void cl_leave(struct ckpt_client *c);
/*
 * Around a call that only tidies up (ckpt_plan_destroy, ckpt_host_free),
 * which never waits for an agent to come back: true when the agent is to be
 * told (cl_leave after); false while it is away or gone: drop the thing here
 * only, then cl_leave_local.
 */
bool cl_enter_tidy(struct ckpt_client *c);
void cl_leave_local(struct ckpt_client *c);
/*
 * Host memory inside a call that has entered (cl_enter) already
 * (trainer_host.c): a region of `bytes`, registered; and its free (agent:
 * whether the agent is to be told).
 */
int cl_host_alloc(struct ckpt_client *c, size_t bytes, void **ptr);
void cl_host_free(struct ckpt_client *c, void *ptr, bool agent);
/*
 * Hands a region to the agent (trainer_register.c): its descriptor on the
 * credentials socket, then RegisterRegion with the ticket; the agent's id
 * into a->region_id. Ours stays open, for an agent that comes back.
 */
int cl_register_region(struct ckpt_client *c, struct cl_alloc *a, int timeout_ms);
/*
 * The session thread, attached to a new agent: hands it every region again
 * and re-creates every plan. 0; or a negative errno when the agent stopped
 * answering on the way (attach again). A plan the agent refuses keeps the
 * reason in its `lost`.
 */
int cl_register_again(struct ckpt_client *c);
/* The reason saves and calls get while the agent is away or gone. */
void cl_away_reason(struct ckpt_client *c, char *buf, size_t len);

/*
 * The Attach call (rpc_attach.c). cl_attach opens the stream on c->ch and reads
 * the session id and the agent's version: 0, or a negative errno (said).
 * cl_close_call ends the call and its queue, every batch completed first.
 * cl_wait_flag waits on the session queue until *flag is set (or the
 * deadline), noting every completion on the way (cl_note_tag).
 */
grpc_channel *cl_channel_new(const char *endpoint);
int cl_attach(struct ckpt_client *c);
void cl_close_call(struct ckpt_client *c);
bool cl_wait_flag(struct ckpt_client *c, struct attach_tags *t, bool *flag, gpr_timespec deadline);
void cl_note_tag(struct attach_tags *t, void *tag);
/*
 * The session thread (session_thread.c), started by cl_open once attached:
 * reads the stream, attaches again while the agent is away; arg is the client.
 */
void *cl_session_main(void *arg);

/* On a client's session thread, that client (cl_fail keeps its messages apart). */
extern __thread struct ckpt_client *cl_session_thread;

/*
 * An options struct that carries its size first (ckpt_plan_opts,
 * ckpt_restore_opts) into out (`known` bytes, zeroed first): fields past
 * what the caller knows stay zero, their defaults; fields we do not know
 * must be zero (-E2BIG); at least `least` bytes (-EINVAL). `name` for
 * messages.
 */
int cl_opts_take(const void *in, void *out, size_t known, size_t least, const char *name,
                 char *err);
/* Records a failure's message for ckpt_last_error; returns err. */
int cl_fail(struct ckpt_client *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* CKPT_CLIENT_PRIV_H */
