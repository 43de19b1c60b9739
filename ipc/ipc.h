/*
 * ipc: what the agent and its clients share, over the base (base/base.h:
 * errors, limits, names, dtypes, clocks).
 *
 *   - a save's states, and the validation of a plan's shapes and extents
 *     (validate.c): the same checks run in libckpt before a request leaves
 *     and in the agent when it arrives, so a bad plan is refused with the
 *     same words on both sides;
 *   - host shared-memory regions (shm.c): created by the client, opened and
 *     checked by the agent;
 *   - the wire (wire.c): protobuf-c messages in gRPC byte buffers, the
 *     method table, gRPC status <-> errno.
 *
 * No threads of its own; every function is safe to call from any thread.
 * Errors: negative errno, and a sentence in `err` (IPC_ERRLEN bytes) that
 * names what was wrong.
 */
#ifndef CKPT_IPC_H
#define CKPT_IPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ipc/base/base.h"
#include "ckpt.pb-c.h"

#define IPC_MAX_MESSAGE (32u << 20)
#define IPC_DEFAULT_ENDPOINT "unix:/run/ckptd/ckptd.sock"
/*
 * The protocol this build speaks (AttachRequest.protocol, SessionEvent.protocol):
 * a change that an older peer would misread takes the next number. A side
 * that sends none (older than the field) speaks 1.
 */
#define IPC_PROTOCOL 1

/* ---- a save's states (the numbers of enum ckpt_state) ------------------ */
/* "QUEUED", ...; "UNKNOWN" for anything else. */
const char *ipc_state_name(int state);
/* FAILED, SKIPPED and COMMITTED/UPLOADED end a save. */
bool ipc_state_final(int state);

/* ---- a plan's tensors ------------------------------------------------- */

/* A tensor as both sides describe it before the shard is laid out. */
struct ipc_tensor {
	const char *name;
	int dtype;
	size_t ndim;
	const int64_t *shape;
	int kind; /* CKPT__V1__REGION_KIND__REGION_HOST / _CUDA */
	uint64_t region; /* host: region id; cuda: index */
	uint64_t offset;
	uint64_t nbytes;
	size_t global_ndim; /* 0 unless sharded */
	const int64_t *global_shape;
	const int64_t *global_offset;
};

/* Size of (kind, region) into *size; negative errno if it does not exist. */
typedef int (*ipc_region_size_fn)(void *ctx, int kind, uint64_t region, uint64_t *size);

/*
 * Checks a whole plan: every name, dtype x shape = nbytes, global shape and
 * offset consistent, the extent inside its region, no two tensors
 * overlapping in one region, names unique. -EINVAL (or the region lookup's
 * error) with a message naming the tensor(s).
 */
int ipc_check_tensors(const struct ipc_tensor *t, size_t n, ipc_region_size_fn region_size,
                      void *ctx, char *err);

/* A plan request as it arrives, into an array of ipc_tensor (malloc'd). */
int ipc_tensors_from_request(const Ckpt__V1__CreatePlanRequest *req, struct ipc_tensor **out,
                             char *err);

/* ---- host regions ------------------------------------------------------ */

/*
 * A host region is a sealed memfd: sized once, its pages allocated up front,
 * sealed against shrinking and growing, and handed to the agent as a file
 * descriptor over the credentials socket (never as a name anyone could open).
 */
struct ipc_shm {
	int fd; /* client: open until the agent has it; agent: -1 */
	void *data; /* the mapping */
	uint64_t size; /* bytes, a page multiple */
};

/*
 * Client: a region of `size` bytes (rounded up to pages), every page
 * allocated now (-ENOMEM/-ENOSPC here, not a fault later) and sealed.
 */
int ipc_shm_create(uint64_t size, struct ipc_shm *out, char *err);
/*
 * Agent: maps a region a client handed over, after checking it is one: a
 * regular memory file of exactly `size` bytes, sealed against shrinking and
 * growing, every page allocated. Takes the descriptor (closes it).
 */
int ipc_shm_map(int fd, uint64_t size, struct ipc_shm *out, char *err);
/* Unmaps and closes; twice is harmless. */
void ipc_shm_unmap(struct ipc_shm *shm);

/* ---- the credentials socket --------------------------------------------- */

/*
 * Beside the gRPC socket PATH, a SOCK_SEQPACKET socket PATH.cred (gRPC can
 * carry neither a caller's identity nor file descriptors). On connect the
 * agent learns the caller's uid, gid and groups from the kernel
 * (SO_PEERCRED, SO_PEERGROUPS) and answers with a hello holding a random
 * token; the client sends the token, hex, as the metadata IPC_CRED_META of
 * every gRPC call, and the agent acts for that uid while the connection
 * stays open. Host regions travel on it as SCM_RIGHTS, each answered with a
 * ticket that RegisterRegion then names.
 */
#define IPC_CRED_SUFFIX ".cred"
#define IPC_CRED_META "ckpt-cred"
#define IPC_TOKEN_BYTES 16
#define IPC_TOKEN_HEX (2 * IPC_TOKEN_BYTES)
#define IPC_CRED_MAGIC "CKPTCRD1"
#define IPC_CRED_MSG 200

enum { IPC_CRED_HELLO = 1, IPC_CRED_FD = 2, IPC_CRED_ACK = 3 };

struct ipc_cred_msg {
	char magic[8];
	uint32_t op;
	uint32_t seq; /* FD: the client's number, echoed in its ACK */
	int32_t status; /* HELLO, ACK: 0, or a negative errno with message */
	uint32_t pad;
	uint64_t size; /* FD: the region's bytes */
	uint64_t ticket; /* ACK: what RegisterRegion names */
	uint8_t token[IPC_TOKEN_BYTES]; /* HELLO */
	char message[IPC_CRED_MSG];
};

/* "unix:PATH" -> "PATH.cred"; -ENAMETOOLONG / -EINVAL. */
int ipc_cred_path(const char *endpoint, char *buf, size_t len);
/* One message, with a descriptor when fd >= 0. 0 or negative errno. */
int ipc_cred_send(int sock, const struct ipc_cred_msg *m, int fd);
/*
 * One message within timeout_ms (< 0: no limit); a descriptor that came with
 * it into *fd (else -1). 0, -ETIMEDOUT, -ECONNRESET at the end, -EPROTO.
 */
int ipc_cred_recv(int sock, struct ipc_cred_msg *m, int *fd, int timeout_ms);
/* A token as 32 lowercase hex digits and back (-EINVAL). */
void ipc_token_hex(const uint8_t *token, char *hex);
int ipc_token_parse(const char *hex, size_t len, uint8_t *token);

/* ---- wire ------------------------------------------------------------- */

struct grpc_byte_buffer;

enum ipc_method {
	IPC_ATTACH,
	IPC_REGISTER_REGION,
	IPC_DROP_REGION,
	IPC_CREATE_PLAN,
	IPC_DROP_PLAN,
	IPC_SAVE,
	IPC_GET_SAVE,
	IPC_WATCH,
	IPC_RESTORE,
	IPC_STATUS,
	IPC_LIST,
	IPC_SHOW,
	IPC_VERIFY,
	IPC_DELETE,
	IPC_PIN,
	IPC_GC,
	IPC_COMMIT,
	IPC_SHOW_DETAIL,
	IPC_NMETHODS,
};

struct ipc_method_desc {
	const char *path; /* "/ckpt.v1.Ckpt/Save" */
	const ProtobufCMessageDescriptor *request;
	const ProtobufCMessageDescriptor *reply;
	bool server_streaming;
};

extern const struct ipc_method_desc ipc_methods[IPC_NMETHODS];

/* Packs a message into a new byte buffer (caller destroys); NULL on ENOMEM. */
struct grpc_byte_buffer *ipc_pack(const ProtobufCMessage *m);
/* Unpacks a byte buffer; NULL if it is not a well-formed message of `d`. */
ProtobufCMessage *ipc_unpack(const ProtobufCMessageDescriptor *d, struct grpc_byte_buffer *bb);

/*
 * The agent's decode edge. protobuf-c would cut a string at its first NUL
 * ("a\0b" arrives as "a"), so the wire bytes are read first: no string
 * field of the message or of its sub-messages may hold NUL or a control
 * character (0x00-0x1f, 0x7f), except that a JSON text field (name ending
 * in "_json") may hold tab, LF and CR. -EINVAL naming the field and the
 * byte, e.g. "CreatePlanRequest.tensors[3].name has a NUL at byte 1: ...",
 * or saying the bytes are not a well-formed message. Bytes fields are not
 * read.
 */
int ipc_check_strings(const ProtobufCMessageDescriptor *d, const void *buf, size_t len, char *err);
/* ipc_check_strings, then unpacks into *out (free with protobuf_c_message_free_unpacked). */
int ipc_decode_buf(const ProtobufCMessageDescriptor *d, const void *buf, size_t len,
                   ProtobufCMessage **out, char *err);
/* The same on the whole of a byte buffer (a missing one is -EINVAL). */
int ipc_decode(const ProtobufCMessageDescriptor *d, struct grpc_byte_buffer *bb,
               ProtobufCMessage **out, char *err);

/* grpc_status_code <-> negative errno, both ways, one table. */
int ipc_status_to_errno(int status);
int ipc_errno_to_status(int err);
/*
 * gRPC's words for a message past the size limit ("Sent message larger than
 * max (69356331 vs. 33554432)", "Received ..."), in either direction; the
 * agent's own refusal of a reply too large says them too.
 */
#define IPC_TOO_LARGE "message larger than max"
/*
 * A failed status and its message as negative errno: RESOURCE_EXHAUSTED
 * for a message too large (IPC_TOO_LARGE) is -EMSGSIZE, which no retry
 * mends, not the -EAGAIN of a limit that frees up; else ipc_status_to_errno.
 */
int ipc_status_errno(int status, const char *msg);

/*
 * What this side says it is at attach: its release ("0.1.0") and the
 * protocol it speaks (IPC_PROTOCOL). A test build takes them from
 * $CKPT_TEST_VERSION and $CKPT_TEST_PROTOCOL where set (a "newer build").
 */
const char *ipc_release(void);
uint32_t ipc_protocol(void);
/*
 * Whether this side can talk to a peer that speaks `protocol` (0: a peer
 * older than the field, which speaks 1); if not, why, naming both sides
 * ("libckpt 0.2.0 speaks protocol 2; ckptd 0.1.0 speaks 1") and what to do.
 * `agent`: whether this side is the agent.
 */
int ipc_compatible(bool agent, const char *peer_version, uint32_t protocol, char *err);

#endif /* CKPT_IPC_H */
