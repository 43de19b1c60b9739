/*
 * The wire: protobuf-c messages in gRPC byte buffers, the method table, and
 * the one mapping between gRPC status codes and errno. Any thread.
 */
#include <errno.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <grpc/status.h>

#include "ipc.h"

#define M(name, req, rep, stream)                                                                \
	{                                                                                        \
		"/ckpt.v1.Ckpt/" name, &ckpt__v1__##req##__descriptor,                           \
			&ckpt__v1__##rep##__descriptor, stream                                   \
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

int ipc_status_to_errno(int status)
{
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if ((int)table[i].status == status)
			return -table[i].err;
	return -EIO;
}

int ipc_random(void *buf, size_t len)
{
	for (size_t got = 0; got < len;) {
		ssize_t n = getrandom((char *)buf + got, len - got, 0);

		if (n < 0 && errno != EINTR)
			return -errno;
		if (n > 0)
			got += (size_t)n;
	}
	return 0;
}

uint64_t ipc_random_id(void)
{
	uint64_t id = 0;

	while (id == 0)
		if (ipc_random(&id, sizeof(id)))
			return 0;
	return id;
}

static int64_t clock_ns(clockid_t c)
{
	struct timespec ts;

	clock_gettime(c, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t ipc_now_ns(void)
{
	return clock_ns(CLOCK_REALTIME);
}

int64_t ipc_mono_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}
