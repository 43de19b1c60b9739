/*
 * libckpt's Restore call (rpc.h): the request from C values, the reply kept
 * (its strings read in place) until cl_rpc_restore_free. Any thread.
 */
#include <stddef.h>

#include "client/rpc.h"
#include "client/rpc_call.h"

int cl_rpc_restore(struct ckpt_client *c, const struct restore_spec *spec, struct restore_done *out,
                   int timeout_ms)
{
	Ckpt__V1__RestoreRequest req = CKPT__V1__RESTORE_REQUEST__INIT;
	Ckpt__V1__RestoreReply *rep;
	int rc;

	*out = (struct restore_done){0};
	req.fallback = spec->fallback;
	req.strict = spec->strict;
	req.step = spec->step;
	req.plan_id = spec->plan_id;
	rc = cl_call(c, IPC_RESTORE, &req.base, (ProtobufCMessage **)&rep, timeout_ms);
	if (rc)
		return rc;
	out->step = rep->step;
	out->skipped = rep->skipped;
	out->n_skipped = rep->n_skipped;
	out->meta_json = rep->meta_json;
	out->reply = rep;
	return 0;
}

void cl_rpc_restore_free(struct restore_done *r)
{
	Ckpt__V1__RestoreReply *rep = r->reply;

	if (rep)
		protobuf_c_message_free_unpacked(&rep->base, NULL);
	r->reply = NULL;
}
