/*
 * libckpt's region calls (rpc.h): RegisterRegion of a descriptor handed on
 * the credentials socket, and DropRegion. Any thread.
 */
#include <stdint.h>

#include "client/rpc.h"
#include "client/rpc_call.h"

int cl_rpc_register_region(struct ckpt_client *c, uint64_t ticket, uint64_t size,
                           uint64_t *region_id, int timeout_ms)
{
	Ckpt__V1__RegisterRegionRequest req = CKPT__V1__REGISTER_REGION_REQUEST__INIT;
	Ckpt__V1__RegisterRegionReply *rep;
	int rc;

	req.ticket = ticket;
	req.session_id = c->session_id;
	req.size = size;
	rc = cl_call(c, IPC_REGISTER_REGION, &req.base, (ProtobufCMessage **)&rep, timeout_ms);
	if (rc)
		return rc;
	*region_id = rep->region_id;
	protobuf_c_message_free_unpacked(&rep->base, NULL);
	return 0;
}

void cl_rpc_drop_region(struct ckpt_client *c, uint64_t region_id)
{
	Ckpt__V1__DropRegionRequest req = CKPT__V1__DROP_REGION_REQUEST__INIT;
	ProtobufCMessage *rep;

	req.session_id = c->session_id;
	req.region_id = region_id;
	if (cl_tidy_call(c, IPC_DROP_REGION, &req.base, &rep) == 0)
		protobuf_c_message_free_unpacked(rep, NULL);
}
