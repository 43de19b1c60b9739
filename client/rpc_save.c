/*
 * libckpt's Save call (rpc.h): the request from C values (a CUDA plan's
 * event with it), the reply read back into struct save_taken. Any thread.
 */
#include <stdio.h>

#include "client/rpc.h"
#include "client/rpc_call.h"

int cl_rpc_save(struct ckpt_client *c, const struct save_spec *spec, struct save_taken *out,
                int timeout_ms)
{
	Ckpt__V1__SaveRequest req = CKPT__V1__SAVE_REQUEST__INIT;
	Ckpt__V1__SaveReply *rep;
	int rc;

	req.plan_id = spec->plan_id;
	req.step = spec->step;
	req.meta_json = (char *)(spec->meta_json ? spec->meta_json : "");
	if (spec->cuda_event) {
		req.cuda_event.data = (uint8_t *)spec->cuda_event;
		req.cuda_event.len = CL_GPU_HANDLE;
	}
	rc = cl_call(c, IPC_SAVE, &req.base, (ProtobufCMessage **)&rep, timeout_ms);
	if (rc)
		return rc;
	out->save_id = rep->save_id;
	out->state = (int)rep->state;
	out->fence_seq = rep->fence_seq;
	snprintf(out->reason, sizeof(out->reason), "%s", rep->reason ? rep->reason : "");
	protobuf_c_message_free_unpacked(&rep->base, NULL);
	return 0;
}
