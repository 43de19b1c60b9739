/*
 * Bad requests get a clear error and the agent keeps serving. Each case is
 * tried twice: through libckpt (which refuses before sending) and raw, past
 * libckpt, so the agent's own checks are what answer.
 */
#define _GNU_SOURCE /* memmem */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <check.h>
#include <grpc/status.h>

#include "client/client.h"
#include "tests/integration/harness.h"
#include "support/check_main.h"

static struct agent_proc a;
static struct ckpt_client *c;
static struct h_model m;

static void setup(void)
{
	int rc;

	h_agent_start(&a, NULL);
	rc = ckpt_connect(a.endpoint, &c);
	ck_assert_msg(rc == 0, "connect: %s", ckpt_strerror(rc));
	h_model_make(&m, c, 3, 5000);
}

static void teardown(void)
{
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}

/* The agent still answers, and a good save still works. */
static void still_serving(void)
{
	struct ckpt_plan *p;
	struct ckpt_save *s;
	static int64_t step = 1000;
	char out[4096];

	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "status"), 0);
	ck_assert_int_eq(ckpt_plan_create(c, "good", 0, 1, m.t, m.n, &p), 0);
	ck_assert_int_eq(ckpt_save(p, step++, NULL, &s), 0);
	ck_assert_int_eq(ckpt_save_wait(s, CKPT_COMMITTED, 30000), 0);
	ckpt_save_release(s);
	ckpt_plan_destroy(p);
}

static void expect_plan(const char *job, int rank, int world, const struct ckpt_tensor *t, size_t n,
                        int want, const char *words)
{
	struct ckpt_plan *p = NULL;
	int rc = ckpt_plan_create(c, job, rank, world, t, n, &p);

	ck_assert_msg(rc == want, "plan (%s, %d/%d): got %d (%s), want %d", job, rank, world, rc,
	              ckpt_last_error(c), want);
	ck_assert_ptr_null(p);
	ck_assert_msg(strstr(ckpt_last_error(c), words), "'%s' in: %s", words, ckpt_last_error(c));
}

START_TEST(client_refuses)
{
	char *longname = malloc(10001);
	struct ckpt_tensor t[2];
	int64_t shape[1] = {16}, big[1] = {1 << 20};
	float stack_mem[16];

	memset(longname, 'x', 10000);
	longname[10000] = '\0';
	expect_plan("a/b", 0, 1, m.t, m.n, -EINVAL, "'/'");
	expect_plan("..", 0, 1, m.t, m.n, -EINVAL, "begins with '.'");
	expect_plan(".x", 0, 1, m.t, m.n, -EINVAL, "begins with '.'");
	expect_plan(longname, 0, 1, m.t, m.n, -EINVAL, "longer than 64");
	expect_plan("j", 0, 0, m.t, m.n, -EINVAL, "world 0");
	expect_plan("j", 4, 4, m.t, m.n, -EINVAL, "rank 4");
	/* memory that is neither ours nor a GPU's */
	t[0] = (struct ckpt_tensor){"w", CKPT_F32, 1, shape, stack_mem, NULL, NULL};
	expect_plan("j", 0, 1, t, 1, -EINVAL, "neither from ckpt_host_alloc");
	/* running past the end of its allocation */
	t[0] = (struct ckpt_tensor){"w", CKPT_F32, 1, big, m.base, NULL, NULL};
	expect_plan("j", 0, 1, t, 1, -EINVAL, "'w'");
	/* overlapping, duplicate, and a 10,000-character name */
	t[0] = (struct ckpt_tensor){"w", CKPT_F32, 1, shape, m.base, NULL, NULL};
	t[1] = (struct ckpt_tensor){"v", CKPT_F32, 1, shape, (char *)m.base + 8, NULL, NULL};
	expect_plan("j", 0, 1, t, 2, -EINVAL, "overlap");
	t[1] = (struct ckpt_tensor){"w", CKPT_F32, 1, shape, (char *)m.base + 64, NULL, NULL};
	expect_plan("j", 0, 1, t, 2, -EINVAL, "twice");
	t[1].name = longname;
	expect_plan("j", 0, 1, t, 2, -EINVAL, "longer than 512");
	t[1] = (struct ckpt_tensor){"u", 99, 1, shape, (char *)m.base + 64, NULL, NULL};
	expect_plan("j", 0, 1, t, 2, -EINVAL, "dtype");
	free(longname);
	still_serving();
}
END_TEST

/* ---- raw requests, past libckpt ---------------------------------------- */

static int raw(enum ipc_method meth, const ProtobufCMessage *req, char *msg, size_t len)
{
	size_t n = protobuf_c_message_get_packed_size(req);
	uint8_t *buf = malloc(n + 1);
	int st;

	protobuf_c_message_pack(req, buf);
	st = h_raw_call(&a, ipc_methods[meth].path, buf, n, msg, len);
	free(buf);
	return st;
}

/*
 * req packed, with the '~' of the string `near` made a NUL: what protobuf-c
 * on the agent would unpack as a shorter string ("a~b" -> "a").
 */
static int raw_nul(enum ipc_method meth, const ProtobufCMessage *req, const char *near, char *msg,
                   size_t len)
{
	size_t n = protobuf_c_message_get_packed_size(req);
	uint8_t *buf = malloc(n + 1);
	char *at;
	int st;

	protobuf_c_message_pack(req, buf);
	at = memmem(buf, n, near, strlen(near));
	ck_assert_msg(at && strchr(near, '~'), "'%s' is in the request", near);
	at[strchr(near, '~') - near] = '\0';
	st = h_raw_call(&a, ipc_methods[meth].path, buf, n, msg, len);
	free(buf);
	return st;
}

#define EXPECT_NUL(meth, req, near, words)                                                         \
	do {                                                                                       \
		char msg_[1024];                                                                   \
		int st_ = raw_nul(meth, &(req).base, near, msg_, sizeof(msg_));                    \
		ck_assert_msg(st_ == GRPC_STATUS_INVALID_ARGUMENT, "status %d (%s), want %d", st_, \
		              msg_, GRPC_STATUS_INVALID_ARGUMENT);                                 \
		ck_assert_msg(strstr(msg_, words), "'%s' in: %s", words, msg_);                    \
	} while (0)

/* A plan request for the model, to spoil one field at a time. */
static void plan_req(Ckpt__V1__CreatePlanRequest *r, Ckpt__V1__TensorSpec *specs,
                     Ckpt__V1__TensorSpec **pv, uint64_t region)
{
	static int64_t shape[1] = {100};
	uint64_t off = 0;

	ckpt__v1__create_plan_request__init(r);
	r->session_id = c->session_id;
	r->job = "raw";
	r->rank = 0;
	r->world = 1;
	for (size_t i = 0; i < 2; i++) {
		ckpt__v1__tensor_spec__init(&specs[i]);
		specs[i].name = i ? "b" : "a";
		specs[i].dtype = CKPT__V1__DTYPE__DTYPE_U8;
		specs[i].n_shape = 1;
		specs[i].shape = shape;
		specs[i].kind = CKPT__V1__REGION_KIND__REGION_HOST;
		specs[i].region = region;
		specs[i].offset = off;
		specs[i].nbytes = 100;
		off += 100;
		pv[i] = &specs[i];
	}
	r->n_tensors = 2;
	r->tensors = pv;
}

#define EXPECT_RAW(meth, req, status, words)                                                       \
	do {                                                                                       \
		char msg_[1024];                                                                   \
		int st_ = raw(meth, &(req).base, msg_, sizeof(msg_));                              \
		ck_assert_msg(st_ == (status), "status %d (%s), want %d", st_, msg_, status);      \
		ck_assert_msg(strstr(msg_, words), "'%s' in: %s", words, msg_);                    \
	} while (0)

START_TEST(agent_refuses_plans)
{
	Ckpt__V1__CreatePlanRequest r;
	Ckpt__V1__TensorSpec specs[2], *pv[2];
	uint64_t region = c->allocs->region_id;
	char *longname = malloc(10001);

	memset(longname, 'y', 10000);
	longname[10000] = '\0';
	plan_req(&r, specs, pv, region);
	r.job = "../etc";
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_INVALID_ARGUMENT, "job name");
	r.job = "a/b";
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_INVALID_ARGUMENT, "'/'");
	r.job = longname;
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_INVALID_ARGUMENT, "longer than 64");
	plan_req(&r, specs, pv, region);
	r.world = 0;
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_INVALID_ARGUMENT, "world 0");
	plan_req(&r, specs, pv, region);
	r.rank = 5;
	r.world = 4;
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_INVALID_ARGUMENT, "rank 5");
	plan_req(&r, specs, pv, region);
	specs[1].offset = m.bytes + 4096 * 10; /* outside its region */
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_OUT_OF_RANGE, "outside its region");
	plan_req(&r, specs, pv, region);
	specs[1].offset = UINT64_MAX - 50; /* offset + length wraps */
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_OUT_OF_RANGE, "outside its region");
	plan_req(&r, specs, pv, region);
	specs[1].offset = 50; /* overlaps a */
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_INVALID_ARGUMENT, "overlap");
	plan_req(&r, specs, pv, region);
	specs[1].name = longname;
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_INVALID_ARGUMENT, "longer than 512");
	plan_req(&r, specs, pv, region);
	specs[1].name = "a";
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_INVALID_ARGUMENT, "twice");
	plan_req(&r, specs, pv, region);
	specs[0].nbytes = 99;
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_INVALID_ARGUMENT, "99 bytes given");
	plan_req(&r, specs, pv, region);
	specs[0].dtype = 77;
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_INVALID_ARGUMENT, "dtype");
	plan_req(&r, specs, pv, region);
	specs[0].n_shape = 40;
	specs[0].shape = calloc(40, sizeof(int64_t));
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_INVALID_ARGUMENT, "dimensions");
	free(specs[0].shape);
	plan_req(&r, specs, pv, region ^ 1); /* a region id nobody registered */
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_NOT_FOUND, "no such host region");
	plan_req(&r, specs, pv, region);
	r.session_id ^= 1;
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_NOT_FOUND, "no session");
	plan_req(&r, specs, pv, region);
	r.backpressure = 9;
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_INVALID_ARGUMENT, "backpressure");
	free(longname);
	still_serving();
}
END_TEST

/*
 * A NUL inside a name would cut it short once unpacked ("a\0b" saving as job
 * "a"): the agent refuses the request, naming the field and the byte.
 */
START_TEST(agent_refuses_nul_in_names)
{
	Ckpt__V1__CreatePlanRequest r;
	Ckpt__V1__TensorSpec specs[2], *pv[2];
	Ckpt__V1__SaveRequest save = CKPT__V1__SAVE_REQUEST__INIT;
	Ckpt__V1__VerifyRequest ver = CKPT__V1__VERIFY_REQUEST__INIT;
	Ckpt__V1__ListRequest list = CKPT__V1__LIST_REQUEST__INIT;
	uint64_t region = c->allocs->region_id;
	struct ckpt_plan *p;

	plan_req(&r, specs, pv, region);
	r.job = "a~b";
	EXPECT_NUL(IPC_CREATE_PLAN, r, "a~b", "CreatePlanRequest.job has a NUL at byte 1");
	plan_req(&r, specs, pv, region);
	specs[1].name = "b~c";
	EXPECT_NUL(IPC_CREATE_PLAN, r, "b~c",
	           "CreatePlanRequest.tensors[1].name has a NUL at byte 1");
	plan_req(&r, specs, pv, region);
	r.run = "r1~";
	EXPECT_NUL(IPC_CREATE_PLAN, r, "r1~", "CreatePlanRequest.run has a NUL at byte 2");
	/* meta that is JSON up to the NUL, garbage after */
	ck_assert_int_eq(ckpt_plan_create(c, "nul", 0, 1, m.t, m.n, &p), 0);
	save.plan_id = p->id;
	save.step = 1;
	save.meta_json = "{}~junk";
	EXPECT_NUL(IPC_SAVE, save, "{}~junk", "SaveRequest.meta_json has a NUL at byte 2");
	ckpt_plan_destroy(p);
	ver.job = "~nul";
	ver.step = 1;
	EXPECT_NUL(IPC_VERIFY, ver, "~nul", "VerifyRequest.job has a NUL at byte 0");
	list.job = "nul~";
	EXPECT_NUL(IPC_LIST, list, "nul~", "ListRequest.job has a NUL at byte 3");
	still_serving();
}
END_TEST

START_TEST(agent_refuses_calls)
{
	Ckpt__V1__SaveRequest save = CKPT__V1__SAVE_REQUEST__INIT;
	Ckpt__V1__RestoreRequest rest = CKPT__V1__RESTORE_REQUEST__INIT;
	Ckpt__V1__RegisterRegionRequest reg = CKPT__V1__REGISTER_REGION_REQUEST__INIT;
	Ckpt__V1__VerifyRequest ver = CKPT__V1__VERIFY_REQUEST__INIT;
	Ckpt__V1__DeleteRequest del = CKPT__V1__DELETE_REQUEST__INIT;
	Ckpt__V1__PinRequest pin = CKPT__V1__PIN_REQUEST__INIT;
	Ckpt__V1__CommitRequest com = CKPT__V1__COMMIT_REQUEST__INIT;
	Ckpt__V1__GcRequest gc = CKPT__V1__GC_REQUEST__INIT;
	char msg[1024];
	static uint8_t junk[64];

	save.plan_id = 12345; /* unknown plan */
	save.step = 1;
	EXPECT_RAW(IPC_SAVE, save, GRPC_STATUS_NOT_FOUND, "no plan 12345");
	save.step = -5;
	EXPECT_RAW(IPC_SAVE, save, GRPC_STATUS_INVALID_ARGUMENT, "step -5");
	save.step = 1;
	save.meta_json = "{not json";
	EXPECT_RAW(IPC_SAVE, save, GRPC_STATUS_INVALID_ARGUMENT, "meta is not JSON");
	rest.plan_id = 777;
	rest.step = -1;
	EXPECT_RAW(IPC_RESTORE, rest, GRPC_STATUS_NOT_FOUND, "no plan 777");
	reg.session_id = c->session_id;
	reg.ticket = 0x0011223344556677ull; /* never handed over on this connection */
	reg.size = 4096;
	EXPECT_RAW(IPC_REGISTER_REGION, reg, GRPC_STATUS_NOT_FOUND, "no region under ticket");
	ver.job = "../../x";
	ver.step = 1;
	EXPECT_RAW(IPC_VERIFY, ver, GRPC_STATUS_INVALID_ARGUMENT, "job name");
	/* a step that cannot be, refused as such before anything is looked up */
	ver.job = "nojob";
	ver.step = -1;
	EXPECT_RAW(IPC_VERIFY, ver, GRPC_STATUS_INVALID_ARGUMENT, "step -1");
	pin.job = "nojob";
	pin.step = -2;
	pin.pinned = true;
	EXPECT_RAW(IPC_PIN, pin, GRPC_STATUS_INVALID_ARGUMENT, "step -2");
	com.job = "nojob";
	com.step = -3;
	EXPECT_RAW(IPC_COMMIT, com, GRPC_STATUS_INVALID_ARGUMENT, "step -3");
	gc.job = "../x";
	EXPECT_RAW(IPC_GC, gc, GRPC_STATUS_INVALID_ARGUMENT, "job name");
	del.job = "nojob";
	del.step = 3;
	EXPECT_RAW(IPC_DELETE, del, GRPC_STATUS_NOT_FOUND, "no committed step 3");
	/* bytes that are no protobuf message at all */
	memset(junk, 0xff, sizeof(junk));
	ck_assert_int_eq(
	    h_raw_call(&a, ipc_methods[IPC_CREATE_PLAN].path, junk, sizeof(junk), msg, sizeof(msg)),
	    GRPC_STATUS_INVALID_ARGUMENT);
	ck_assert_msg(strstr(msg, "not a well-formed"), "%s", msg);
	/* a method that does not exist */
	ck_assert_int_eq(h_raw_call(&a, "/ckpt.v1.Ckpt/Format", junk, 4, msg, sizeof(msg)),
	                 GRPC_STATUS_UNIMPLEMENTED);
	still_serving();
}
END_TEST

/*
 * Device memory where the agent has no usable GPU (this machine, CI): the
 * plan is refused with the reason, CUDA's own words included when CUDA is
 * built; an event for a host plan is refused; the agent serves on.
 */
START_TEST(cuda_plan_without_gpu)
{
	Ckpt__V1__CreatePlanRequest r;
	Ckpt__V1__TensorSpec specs[2], *pv[2];
	Ckpt__V1__CudaRegion reg = CKPT__V1__CUDA_REGION__INIT, *preg = &reg;
	Ckpt__V1__SaveRequest save = CKPT__V1__SAVE_REQUEST__INIT;
	uint8_t handle[64] = {1}, uuid[16] = {2};
	struct ckpt_plan *p;
	char out[4096];

	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "status"), 0);
	if (!strstr(out, "no usable GPU") && !strstr(out, "without the CUDA toolkit")) {
		printf("skipped: this agent has a GPU\n");
		return;
	}
	plan_req(&r, specs, pv, c->allocs->region_id);
	specs[1].kind = CKPT__V1__REGION_KIND__REGION_CUDA;
	specs[1].region = 0;
	specs[1].offset = 0;
	reg.ipc_handle.data = handle;
	reg.ipc_handle.len = sizeof(handle);
	reg.device_uuid.data = uuid;
	reg.device_uuid.len = sizeof(uuid);
	reg.size = 1 << 20;
	r.n_cuda_regions = 1;
	r.cuda_regions = &preg;
	r.fence_region = c->allocs->region_id;
	EXPECT_RAW(IPC_CREATE_PLAN, r, GRPC_STATUS_UNIMPLEMENTED,
	           strstr(out, "no usable GPU") ? "cudaGetDeviceCount"
	                                        : "without the CUDA toolkit");
	/* a host plan's save with a CUDA event */
	ck_assert_int_eq(ckpt_plan_create(c, "hostonly", 0, 1, m.t, m.n, &p), 0);
	save.plan_id = p->id;
	save.step = 1;
	save.cuda_event.data = handle;
	save.cuda_event.len = sizeof(handle);
	EXPECT_RAW(IPC_SAVE, save, GRPC_STATUS_INVALID_ARGUMENT, "CUDA event for a host");
	ckpt_plan_destroy(p);
	still_serving();
}
END_TEST

/* A message beyond the agent's bound is refused by gRPC before it is parsed. */
START_TEST(oversized_message)
{
	size_t n = 40u << 20;
	char *buf = calloc(1, n), msg[1024];
	int st = h_raw_call(&a, ipc_methods[IPC_CREATE_PLAN].path, buf, n, msg, sizeof(msg));

	ck_assert_msg(st == GRPC_STATUS_RESOURCE_EXHAUSTED, "status %d: %s", st, msg);
	free(buf);
	still_serving();
}
END_TEST

/* Nobody listening: a prompt, clear refusal, many times over, never a hang. */
START_TEST(connect_to_nothing)
{
	char ep[400];

	snprintf(ep, sizeof(ep), "unix:%s/nobody.sock", a.dir);
	for (int i = 0; i < 20; i++) {
		struct ckpt_client *x = (struct ckpt_client *)&a;
		struct timespec t0, t1;
		int rc;

		clock_gettime(CLOCK_MONOTONIC, &t0);
		rc = ckpt_connect(ep, &x);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		ck_assert_int_eq(rc, -ECONNREFUSED);
		ck_assert_ptr_null(x);
		ck_assert_msg(t1.tv_sec - t0.tv_sec < 10, "refused only after %ld s",
		              (long)(t1.tv_sec - t0.tv_sec));
	}
	still_serving();
}
END_TEST

START_TEST(ctl_usage_and_errors)
{
	char out[4096];

	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "frobnicate"), 2);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "show onlyjob"), 2);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "show job notastep"), 2);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify job -3"), 2);
	/* a job name the agent would refuse: bad usage, said with the byte, nothing sent */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "show 'a/b' 1"), 2);
	ck_assert_msg(strstr(out, "'/' at byte 1"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify \"$(printf 'ab\\tc')\" 1"), 2);
	ck_assert_msg(strstr(out, "control character 0x09 at byte 2"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "gc \"$(printf 'j\\033')\""), 2);
	ck_assert_msg(strstr(out, "control character 0x1b at byte 1"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "list 'x y'"), 2);
	ck_assert_msg(strstr(out, "' ' at byte 1"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "show nojob 1"), 1);
	ck_assert_msg(strstr(out, "nojob"), "%s", out);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "delete nojob 1"), 1);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "list"), 0);
	still_serving();
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("badreq");
	TCase *tc = tcase_create("agent");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, client_refuses);
	tcase_add_test(tc, agent_refuses_plans);
	tcase_add_test(tc, agent_refuses_nul_in_names);
	tcase_add_test(tc, agent_refuses_calls);
	tcase_add_test(tc, oversized_message);
	tcase_add_test(tc, ctl_usage_and_errors);
	tcase_add_test(tc, connect_to_nothing);
	tcase_add_test(tc, cuda_plan_without_gpu);
	suite_add_tcase(s, tc);
	return s;
}
