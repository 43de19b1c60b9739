/*
 * rpc_seeds: writes fuzz_rpc's seed inputs into a directory: for each RPC,
 * one byte naming the method, then a well-formed request as libckpt or
 * ckptctl would send it. Run at build time (fuzz/CMakeLists.txt), so the
 * seeds follow ckpt.proto.
 *
 *   rpc_seeds DIR
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/ipc.h"

static int put(const char *dir, const char *name, enum ipc_method meth, const ProtobufCMessage *m)
{
	size_t n = protobuf_c_message_get_packed_size(m);
	uint8_t *buf = malloc(n + 1);
	char path[4096];
	FILE *f;
	int ok;

	if (!buf)
		return -ENOMEM;
	buf[0] = (uint8_t)meth;
	protobuf_c_message_pack(m, buf + 1);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	ok = f && fwrite(buf, 1, n + 1, f) == n + 1;
	if (f && fclose(f))
		ok = 0;
	free(buf);
	if (!ok)
		fprintf(stderr, "rpc_seeds: cannot write %s: %s\n", path, strerror(errno));
	return ok ? 0 : -EIO;
}

/* A sharded two-tensor plan in host region 1, and a CUDA one. */
static int plans(const char *dir)
{
	static int64_t shape[2] = {4, 8}, gshape[2] = {8, 8}, goff[2] = {4, 0}, one[1] = {5};
	static uint8_t handle[64] = {1}, uuid[16] = {2};
	Ckpt__V1__CreatePlanRequest r = CKPT__V1__CREATE_PLAN_REQUEST__INIT;
	Ckpt__V1__TensorSpec t[2] = {CKPT__V1__TENSOR_SPEC__INIT, CKPT__V1__TENSOR_SPEC__INIT};
	Ckpt__V1__TensorSpec *tv[2] = {&t[0], &t[1]};
	Ckpt__V1__CudaRegion cr = CKPT__V1__CUDA_REGION__INIT, *crv[1] = {&cr};
	int rc;

	r.session_id = 42;
	r.job = "llama-7b";
	r.rank = 1;
	r.world = 2;
	r.run = "r1";
	t[0].name = "model.layers.0.weight";
	t[0].dtype = CKPT__V1__DTYPE__DTYPE_F32;
	t[0].n_shape = 2;
	t[0].shape = shape;
	t[0].kind = CKPT__V1__REGION_KIND__REGION_HOST;
	t[0].region = 1;
	t[0].nbytes = 4 * 8 * 4;
	t[0].n_global_shape = t[0].n_global_offset = 2;
	t[0].global_shape = gshape;
	t[0].global_offset = goff;
	t[1].name = "step";
	t[1].dtype = CKPT__V1__DTYPE__DTYPE_I64;
	t[1].n_shape = 1;
	t[1].shape = one;
	t[1].kind = CKPT__V1__REGION_KIND__REGION_HOST;
	t[1].region = 1;
	t[1].offset = 4096;
	t[1].nbytes = 5 * 8;
	r.n_tensors = 2;
	r.tensors = tv;
	rc = put(dir, "create_plan_host", IPC_CREATE_PLAN, &r.base);
	if (rc)
		return rc;
	t[1].kind = CKPT__V1__REGION_KIND__REGION_CUDA;
	t[1].region = 0;
	t[1].offset = 0;
	cr.ipc_handle.data = handle;
	cr.ipc_handle.len = sizeof(handle);
	cr.device_uuid.data = uuid;
	cr.device_uuid.len = sizeof(uuid);
	cr.size = 1 << 20;
	r.n_cuda_regions = 1;
	r.cuda_regions = crv;
	r.fence_region = 2;
	r.backpressure = CKPT__V1__BACKPRESSURE__BACKPRESSURE_SKIP;
	return put(dir, "create_plan_cuda", IPC_CREATE_PLAN, &r.base);
}

static int the_rest(const char *dir)
{
	Ckpt__V1__AttachRequest at = CKPT__V1__ATTACH_REQUEST__INIT;
	Ckpt__V1__RegisterRegionRequest reg = CKPT__V1__REGISTER_REGION_REQUEST__INIT;
	Ckpt__V1__DropRegionRequest dr = CKPT__V1__DROP_REGION_REQUEST__INIT;
	Ckpt__V1__DropPlanRequest dp = CKPT__V1__DROP_PLAN_REQUEST__INIT;
	Ckpt__V1__SaveRequest sv = CKPT__V1__SAVE_REQUEST__INIT;
	Ckpt__V1__GetSaveRequest gs = CKPT__V1__GET_SAVE_REQUEST__INIT;
	Ckpt__V1__WatchRequest w = CKPT__V1__WATCH_REQUEST__INIT;
	Ckpt__V1__RestoreRequest rs = CKPT__V1__RESTORE_REQUEST__INIT;
	Ckpt__V1__StatusRequest st = CKPT__V1__STATUS_REQUEST__INIT;
	Ckpt__V1__ListRequest ls = CKPT__V1__LIST_REQUEST__INIT;
	Ckpt__V1__ShowRequest sh = CKPT__V1__SHOW_REQUEST__INIT;
	Ckpt__V1__VerifyRequest vr = CKPT__V1__VERIFY_REQUEST__INIT;
	Ckpt__V1__DeleteRequest de = CKPT__V1__DELETE_REQUEST__INIT;
	Ckpt__V1__PinRequest pi = CKPT__V1__PIN_REQUEST__INIT;
	Ckpt__V1__GcRequest gc = CKPT__V1__GC_REQUEST__INIT;
	Ckpt__V1__CommitRequest co = CKPT__V1__COMMIT_REQUEST__INIT;
	int rc = 0;

	at.client = "demo_trainer";
	at.pid = 4242;
	reg.session_id = 42;
	reg.ticket = 0x0123456789abcdefull;
	reg.size = 1 << 20;
	dr.session_id = 42;
	dr.region_id = 1;
	dp.plan_id = 99;
	sv.plan_id = 99;
	sv.step = 1000;
	sv.meta_json = "{\"lr\": 0.1,\n \"tokens\": [1, 2]}";
	gs.save_id = 5;
	w.job = "llama-7b";
	rs.plan_id = 99;
	rs.step = -1;
	rs.fallback = 1;
	ls.job = "llama-7b";
	sh.job = vr.job = de.job = pi.job = gc.job = co.job = "llama-7b";
	sh.step = vr.step = de.step = pi.step = co.step = 1000;
	pi.pinned = 1;
	rc = rc ? rc : put(dir, "attach", IPC_ATTACH, &at.base);
	rc = rc ? rc : put(dir, "register_region", IPC_REGISTER_REGION, &reg.base);
	rc = rc ? rc : put(dir, "drop_region", IPC_DROP_REGION, &dr.base);
	rc = rc ? rc : put(dir, "drop_plan", IPC_DROP_PLAN, &dp.base);
	rc = rc ? rc : put(dir, "save", IPC_SAVE, &sv.base);
	rc = rc ? rc : put(dir, "get_save", IPC_GET_SAVE, &gs.base);
	rc = rc ? rc : put(dir, "watch", IPC_WATCH, &w.base);
	rc = rc ? rc : put(dir, "restore", IPC_RESTORE, &rs.base);
	rc = rc ? rc : put(dir, "status", IPC_STATUS, &st.base);
	rc = rc ? rc : put(dir, "list", IPC_LIST, &ls.base);
	rc = rc ? rc : put(dir, "show", IPC_SHOW, &sh.base);
	rc = rc ? rc : put(dir, "verify", IPC_VERIFY, &vr.base);
	rc = rc ? rc : put(dir, "delete", IPC_DELETE, &de.base);
	rc = rc ? rc : put(dir, "pin", IPC_PIN, &pi.base);
	rc = rc ? rc : put(dir, "gc", IPC_GC, &gc.base);
	rc = rc ? rc : put(dir, "commit", IPC_COMMIT, &co.base);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: rpc_seeds DIR\n");
		return 2;
	}
	return plans(argv[1]) || the_rest(argv[1]) ? 1 : 0;
}
