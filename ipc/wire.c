/*
 * The wire: protobuf-c messages in gRPC byte buffers, the method table, the
 * one mapping between gRPC status codes and errno, and the agent's decode
 * edge (ipc_decode, called by its completion-queue thread for every request:
 * strings with NUL or control characters are refused before unpacking),
 * and the versions both sides name at attach. Any thread; no state.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <grpc/status.h>

#include "ipc/ipc.h"

/* The agent's own enums are the protocol's numbers: the edge passes them as they are. */
#define SAME(a, b) _Static_assert((int)(a) == (int)(b), #a " is not " #b)
SAME(SAVE_QUEUED, CKPT__V1__STATE__STATE_QUEUED);
SAME(SAVE_CAPTURED, CKPT__V1__STATE__STATE_CAPTURED);
SAME(SAVE_DURABLE, CKPT__V1__STATE__STATE_DURABLE);
SAME(SAVE_COMMITTED, CKPT__V1__STATE__STATE_COMMITTED);
SAME(SAVE_UPLOADED, CKPT__V1__STATE__STATE_UPLOADED);
SAME(SAVE_FAILED, CKPT__V1__STATE__STATE_FAILED);
SAME(SAVE_SKIPPED, CKPT__V1__STATE__STATE_SKIPPED);
SAME(BACKPRESSURE_DEFAULT, CKPT__V1__BACKPRESSURE__BACKPRESSURE_DEFAULT);
SAME(BACKPRESSURE_BLOCK, CKPT__V1__BACKPRESSURE__BACKPRESSURE_BLOCK);
SAME(BACKPRESSURE_SKIP, CKPT__V1__BACKPRESSURE__BACKPRESSURE_SKIP);
#undef SAME

#define M(name, req, rep, stream)                                                                  \
	{                                                                                          \
		"/ckpt.v1.Ckpt/" name, &ckpt__v1__##req##__descriptor,                             \
		    &ckpt__v1__##rep##__descriptor, stream                                         \
	}

const struct ipc_method_desc ipc_methods[IPC_NMETHODS] = {
    [IPC_ATTACH] = M("Attach", attach_request, session_event, true),
    [IPC_REGISTER_REGION] =
        M("RegisterRegion", register_region_request, register_region_reply, false),
    [IPC_DROP_REGION] = M("DropRegion", drop_region_request, empty, false),
    [IPC_CREATE_PLAN] = M("CreatePlan", create_plan_request, create_plan_reply, false),
    [IPC_DROP_PLAN] = M("DropPlan", drop_plan_request, empty, false),
    [IPC_SAVE] = M("Save", save_request, save_reply, false),
    [IPC_GET_SAVE] = M("GetSave", get_save_request, save_info, false),
    [IPC_WATCH] = M("Watch", watch_request, save_info, true),
    [IPC_RESTORE] = M("Restore", restore_request, restore_reply, false),
    [IPC_STATUS] = M("Status", status_request, status_reply, false),
    [IPC_LIST] = M("List", list_request, list_reply, false),
    [IPC_SHOW] = M("Show", show_request, show_reply, false),
    [IPC_VERIFY] = M("Verify", verify_request, verify_reply, false),
    [IPC_DELETE] = M("Delete", delete_request, empty, false),
    [IPC_PIN] = M("Pin", pin_request, empty, false),
    [IPC_GC] = M("Gc", gc_request, gc_reply, false),
    [IPC_COMMIT] = M("Commit", commit_request, commit_reply, false),
    [IPC_SHOW_DETAIL] = M("ShowDetail", show_request, show_piece, true),
};

struct grpc_byte_buffer *ipc_pack(const ProtobufCMessage *m)
{
	size_t n = protobuf_c_message_get_packed_size(m);
	grpc_slice s = grpc_slice_malloc(n);
	grpc_byte_buffer *bb;

	protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
	bb = grpc_raw_byte_buffer_create(&s, 1);
	grpc_slice_unref(s);
	return bb;
}

/* ---- strings on the wire --------------------------------------------- */

/*
 * protobuf-c unpacks a string field into a C string, so "a\0b" would arrive
 * as "a". The raw bytes are read first, field by field with the message's
 * descriptor, into sub-messages: no string field may hold NUL or another
 * control character (0x00-0x1f, 0x7f); a JSON text field (its name ends in
 * "_json") may also hold JSON's whitespace (tab, LF, CR). Bytes fields are
 * not text and are not read. Linear in the message, depth bounded.
 */
#define SCAN_MAX_DEPTH 16

/* One field as the wire has it: tag at `at`, length-delimited value at [start, +len). */
struct wire_field {
	uint32_t num;
	unsigned type;
	size_t at, start, len;
};

/* The path to the first bad byte, filled on the way out of the recursion. */
struct scan {
	const ProtobufCFieldDescriptor *field[SCAN_MAX_DEPTH];
	size_t index[SCAN_MAX_DEPTH];
	size_t depth, offset;
	uint8_t byte;
};

static int get_varint(const uint8_t *b, size_t len, size_t *pos, uint64_t *v)
{
	uint64_t x = 0;

	for (unsigned i = 0; i < 10 && *pos < len; i++) {
		uint8_t c = b[(*pos)++];

		x |= (uint64_t)(c & 0x7f) << (7 * i);
		if (!(c & 0x80)) {
			*v = x;
			return 0;
		}
	}
	return -EBADMSG;
}

/* The field at b[*pos], *pos moved past it; -EBADMSG if it is not one. */
static int next_field(const uint8_t *b, size_t len, size_t *pos, struct wire_field *f)
{
	uint64_t tag, n;

	f->at = *pos;
	if (get_varint(b, len, pos, &tag) || tag >> 3 == 0 || tag >> 3 > 0x1fffffff)
		return -EBADMSG;
	f->num = (uint32_t)(tag >> 3);
	f->type = tag & 7;
	if (f->type == PROTOBUF_C_WIRE_TYPE_VARINT)
		return get_varint(b, len, pos, &n);
	if (f->type == PROTOBUF_C_WIRE_TYPE_64BIT)
		n = 8;
	else if (f->type == PROTOBUF_C_WIRE_TYPE_32BIT)
		n = 4;
	else if (f->type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED || get_varint(b, len, pos, &n))
		return -EBADMSG; /* groups (3, 4), 6, 7: protobuf-c refuses them too */
	if (n > len - *pos)
		return -EBADMSG;
	f->start = *pos;
	f->len = (size_t)n;
	*pos += (size_t)n;
	return 0;
}

/* The offset of the first byte s[0..n) may not hold; n if none. */
static size_t bad_byte(const uint8_t *s, size_t n, bool json)
{
	for (size_t i = 0; i < n; i++)
		if ((s[i] < 0x20 || s[i] == 0x7f) &&
		    !(json && (s[i] == '\t' || s[i] == '\n' || s[i] == '\r')))
			return i;
	return n;
}

static bool is_json(const ProtobufCFieldDescriptor *f)
{
	size_t n = strlen(f->name);

	return n >= 5 && strcmp(f->name + n - 5, "_json") == 0;
}

/* How often field `num` occurs in b[0..end): the index of a repeated field's element at end. */
static size_t occurrences(const uint8_t *b, size_t end, uint32_t num)
{
	struct wire_field f;
	size_t pos = 0, k = 0;

	while (pos < end && next_field(b, end, &pos, &f) == 0)
		k += f.num == num;
	return k;
}

/* 0; -EINVAL with s filled from `level` down; -EBADMSG if the bytes are no message. */
static int scan_message(const ProtobufCMessageDescriptor *d, const uint8_t *b, size_t len,
                        size_t level, struct scan *s)
{
	struct wire_field w;
	size_t pos = 0;
	int rc;

	if (level >= SCAN_MAX_DEPTH)
		return -EBADMSG;
	while (pos < len) {
		const ProtobufCFieldDescriptor *f;

		if (next_field(b, len, &pos, &w))
			return -EBADMSG;
		f = protobuf_c_message_descriptor_get_field(d, w.num);
		/* unknown fields, and wire types a string cannot have: protobuf-c judges them */
		if (!f || w.type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED)
			continue;
		if (f->type == PROTOBUF_C_TYPE_STRING) {
			s->offset = bad_byte(b + w.start, w.len, is_json(f));
			if (s->offset == w.len)
				continue;
			s->byte = b[w.start + s->offset];
			s->depth = level + 1;
			rc = -EINVAL;
		} else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
			rc = scan_message(f->descriptor, b + w.start, w.len, level + 1, s);
			if (rc == 0)
				continue;
			if (rc != -EINVAL)
				return rc;
		} else {
			continue;
		}
		s->field[level] = f;
		s->index[level] = occurrences(b, w.at, w.num);
		return rc;
	}
	return 0;
}

/* "CreatePlanRequest.tensors[3].name has a NUL at byte 1: ..." */
static int scan_error(const ProtobufCMessageDescriptor *d, const struct scan *s, char *err)
{
	char path[256], what[40];
	size_t o = 0;

	o += (size_t)snprintf(path, sizeof(path), "%s", d->short_name);
	for (size_t i = 0; i < s->depth && o < sizeof(path); i++) {
		o += (size_t)snprintf(path + o, sizeof(path) - o, ".%s", s->field[i]->name);
		if (o < sizeof(path) && s->field[i]->label == PROTOBUF_C_LABEL_REPEATED)
			o += (size_t)snprintf(path + o, sizeof(path) - o, "[%zu]", s->index[i]);
	}
	if (s->byte == 0)
		snprintf(what, sizeof(what), "a NUL");
	else
		snprintf(what, sizeof(what), "control character 0x%02x", s->byte);
	return ipc_errf(err, -EINVAL,
	                "%s has %s at byte %zu: strings may not hold NUL or control characters "
	                "(0x00-0x1f, 0x7f; JSON text may hold tab, LF and CR): remove it",
	                path, what, s->offset);
}

int ipc_check_strings(const ProtobufCMessageDescriptor *d, const void *buf, size_t len, char *err)
{
	struct scan s = {.depth = 0};
	int rc = scan_message(d, buf, len, 0, &s);

	if (rc == -EINVAL)
		return scan_error(d, &s, err);
	if (rc)
		return ipc_errf(err, -EINVAL, "the request is not a well-formed %s message",
		                d->name);
	return 0;
}

int ipc_decode_buf(const ProtobufCMessageDescriptor *d, const void *buf, size_t len,
                   ProtobufCMessage **out, char *err)
{
	int rc = ipc_check_strings(d, buf, len, err);

	*out = NULL;
	if (rc)
		return rc;
	*out = protobuf_c_message_unpack(d, NULL, len, buf);
	if (!*out)
		return ipc_errf(err, -EINVAL, "the request is not a well-formed %s message",
		                d->name);
	return 0;
}

int ipc_decode(const ProtobufCMessageDescriptor *d, struct grpc_byte_buffer *bb,
               ProtobufCMessage **out, char *err)
{
	grpc_byte_buffer_reader r;
	grpc_slice s;
	int rc;

	*out = NULL;
	if (!bb || !grpc_byte_buffer_reader_init(&r, bb))
		return ipc_errf(err, -EINVAL, "the call carries no %s message", d->name);
	s = grpc_byte_buffer_reader_readall(&r);
	grpc_byte_buffer_reader_destroy(&r);
	rc = ipc_decode_buf(d, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), out, err);
	grpc_slice_unref(s);
	return rc;
}

ProtobufCMessage *ipc_unpack(const ProtobufCMessageDescriptor *d, struct grpc_byte_buffer *bb)
{
	grpc_byte_buffer_reader r;
	ProtobufCMessage *m;
	grpc_slice s;

	if (!bb || !grpc_byte_buffer_reader_init(&r, bb))
		return NULL;
	s = grpc_byte_buffer_reader_readall(&r);
	grpc_byte_buffer_reader_destroy(&r);
	m = protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
	grpc_slice_unref(s);
	return m;
}

/* errno -> status; the first row for a status is also its way back. */
static const struct {
	int err;
	grpc_status_code status;
} table[] = {
    {0, GRPC_STATUS_OK},
    {EINVAL, GRPC_STATUS_INVALID_ARGUMENT},
    {ENOENT, GRPC_STATUS_NOT_FOUND},
    {EEXIST, GRPC_STATUS_ALREADY_EXISTS},
    {EACCES, GRPC_STATUS_PERMISSION_DENIED},
    {EAGAIN, GRPC_STATUS_RESOURCE_EXHAUSTED},
    {EBUSY, GRPC_STATUS_FAILED_PRECONDITION},
    {ECANCELED, GRPC_STATUS_CANCELLED},
    {ETIMEDOUT, GRPC_STATUS_DEADLINE_EXCEEDED},
    {ERANGE, GRPC_STATUS_OUT_OF_RANGE},
    {EBADMSG, GRPC_STATUS_DATA_LOSS},
    {ENOTSUP, GRPC_STATUS_UNIMPLEMENTED},
    {ECONNREFUSED, GRPC_STATUS_UNAVAILABLE},
    {EIO, GRPC_STATUS_INTERNAL},
    {EPERM, GRPC_STATUS_PERMISSION_DENIED},
    {ENOSPC, GRPC_STATUS_RESOURCE_EXHAUSTED},
    {ENOMEM, GRPC_STATUS_RESOURCE_EXHAUSTED},
    {EMSGSIZE, GRPC_STATUS_RESOURCE_EXHAUSTED}, /* back: ipc_status_errno */
    {EOVERFLOW, GRPC_STATUS_INVALID_ARGUMENT},
    {E2BIG, GRPC_STATUS_INVALID_ARGUMENT},
    {ENAMETOOLONG, GRPC_STATUS_INVALID_ARGUMENT},
    {ENOTCONN, GRPC_STATUS_UNAVAILABLE},
    {EPIPE, GRPC_STATUS_UNAVAILABLE},
    {EINTR, GRPC_STATUS_ABORTED},
    {EIO, GRPC_STATUS_UNKNOWN},
    {EACCES, GRPC_STATUS_UNAUTHENTICATED},
};

int ipc_errno_to_status(int err)
{
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (table[i].err == -err)
			return table[i].status;
	return GRPC_STATUS_INTERNAL;
}

int ipc_status_errno(int status, const char *msg)
{
	if (status == GRPC_STATUS_RESOURCE_EXHAUSTED && msg && strstr(msg, IPC_TOO_LARGE))
		return -EMSGSIZE;
	return ipc_status_to_errno(status);
}

int ipc_status_to_errno(int status)
{
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if ((int)table[i].status == status)
			return -table[i].err;
	return -EIO;
}

/* ---- versions ---------------------------------------------------------- */

#ifndef CKPT_RELEASE
#define CKPT_RELEASE "0.0.0"
#endif

const char *ipc_release(void)
{
#ifdef CKPT_TEST_HOOKS
	const char *v = getenv("CKPT_TEST_VERSION");

	if (v && *v)
		return v;
#endif
	return CKPT_RELEASE;
}

uint32_t ipc_protocol(void)
{
#ifdef CKPT_TEST_HOOKS
	const char *v = getenv("CKPT_TEST_PROTOCOL");

	if (v && *v)
		return (uint32_t)strtoul(v, NULL, 10);
#endif
	return IPC_PROTOCOL;
}

int ipc_compatible(bool agent, const char *peer_version, uint32_t protocol, char *err)
{
	uint32_t ours = ipc_protocol(), theirs = protocol ? protocol : 1;
	const char *pv = peer_version && *peer_version ? peer_version : "(older than 0.1)";

	if (theirs == ours)
		return 0;
	if (agent)
		return ipc_errf(
		    err, -ENOTSUP,
		    "libckpt %.32s speaks protocol %u; this ckptd %s speaks %u: "
		    "use the libckpt of ckptd's release (or upgrade ckptd to libckpt's)",
		    pv, theirs, ipc_release(), ours);
	return ipc_errf(err, -ENOTSUP,
	                "ckptd %.32s speaks protocol %u; this libckpt %s speaks %u: use the "
	                "libckpt of ckptd's release (or upgrade ckptd to libckpt's)",
	                pv, theirs, ipc_release(), ours);
}
