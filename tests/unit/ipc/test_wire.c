/*
 * ipc/wire.c's decode edge: the scan of a request's raw bytes that refuses
 * NUL and control characters in string fields before protobuf-c turns them
 * into C strings (which would cut "a\0b" to "a"), naming the field and the
 * byte; and the unpack behind it. The versions named at attach.
 */
#define _GNU_SOURCE /* memmem */
#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <check.h>

#include "ipc/ipc.h"
#include "support/check_main.h"

static char err[IPC_ERRLEN];

/* m packed into a new buffer, the first `mark` byte after `near` replaced by `with`. */
static uint8_t *pack_patched(const ProtobufCMessage *m, const char *near, char mark, uint8_t with,
                             size_t *len)
{
	uint8_t *b;
	char *at;

	*len = protobuf_c_message_get_packed_size(m);
	b = malloc(*len + 1);
	ck_assert_ptr_nonnull(b);
	protobuf_c_message_pack(m, b);
	b[*len] = '\0';
	if (!near)
		return b;
	at = memmem(b, *len, near, strlen(near));
	ck_assert_msg(at, "'%s' is in the packed message", near);
	at = memchr(at, mark, strlen(near));
	ck_assert_ptr_nonnull(at);
	*at = (char)with;
	return b;
}

/* Refused with `words` in the message; the unpack behind it refuses too. */
static void expect_refused(const ProtobufCMessage *m, const char *near, char mark, uint8_t with,
                           const char *words)
{
	static ProtobufCMessage untouched;
	ProtobufCMessage *out = &untouched;
	size_t len;
	uint8_t *b = pack_patched(m, near, mark, with, &len);

	err[0] = '\0';
	ck_assert_int_eq(ipc_check_strings(m->descriptor, b, len, err), -EINVAL);
	ck_assert_msg(strstr(err, words), "'%s' in: %s", words, err);
	ck_assert_int_eq(ipc_decode_buf(m->descriptor, b, len, &out, err), -EINVAL);
	ck_assert_ptr_null(out);
	free(b);
}

static void expect_accepted(const ProtobufCMessage *m, const char *near, char mark, uint8_t with)
{
	ProtobufCMessage *out;
	size_t len;
	uint8_t *b = pack_patched(m, near, mark, with, &len);

	ck_assert_msg(ipc_check_strings(m->descriptor, b, len, err) == 0, "refused: %s", err);
	ck_assert_msg(ipc_decode_buf(m->descriptor, b, len, &out, err) == 0, "refused: %s", err);
	protobuf_c_message_free_unpacked(out, NULL);
	free(b);
}

/* A plan request of four tensors, "t0~" .. "t3~", job "jo~b". */
static void plan(Ckpt__V1__CreatePlanRequest *r, Ckpt__V1__TensorSpec *t, Ckpt__V1__TensorSpec **tv)
{
	static const char *const names[] = {"t0~", "t1~", "t2~", "t3~"};
	static int64_t shape[2] = {3, 4};

	ckpt__v1__create_plan_request__init(r);
	r->session_id = 7;
	r->job = "jo~b";
	r->run = "r~1";
	r->world = 1;
	for (size_t i = 0; i < 4; i++) {
		ckpt__v1__tensor_spec__init(&t[i]);
		t[i].name = (char *)names[i];
		t[i].dtype = CKPT__V1__DTYPE__DTYPE_F32;
		t[i].n_shape = 2;
		t[i].shape = shape;
		t[i].nbytes = 48;
		t[i].offset = 48 * i;
		tv[i] = &t[i];
	}
	r->n_tensors = 4;
	r->tensors = tv;
}

START_TEST(nul_in_names)
{
	Ckpt__V1__CreatePlanRequest r;
	Ckpt__V1__TensorSpec t[4], *tv[4];
	Ckpt__V1__CreatePlanRequest *got;
	size_t len;
	uint8_t *b;

	plan(&r, t, tv);
	expect_accepted(&r.base, NULL, 0, 0);
	expect_refused(&r.base, "jo~b", '~', 0, "CreatePlanRequest.job has a NUL at byte 2");
	expect_refused(&r.base, "r~1", '~', 0, "CreatePlanRequest.run has a NUL at byte 1");
	expect_refused(&r.base, "t3~", '~', 0,
	               "CreatePlanRequest.tensors[3].name has a NUL at byte 2");
	expect_refused(&r.base, "t0~", '~', 0,
	               "CreatePlanRequest.tensors[0].name has a NUL at byte 2");
	expect_refused(&r.base, "t1~", 't', 0,
	               "CreatePlanRequest.tensors[1].name has a NUL at byte 0");
	/* what the refusal says to do, and what protobuf-c alone would have made of it */
	expect_refused(&r.base, "t2~", '~', 0, "remove it");
	b = pack_patched(&r.base, "jo~b", '~', 0, &len);
	got = ckpt__v1__create_plan_request__unpack(NULL, len, b);
	ck_assert_ptr_nonnull(got);
	ck_assert_str_eq(got->job, "jo"); /* cut short: why the scan exists */
	ckpt__v1__create_plan_request__free_unpacked(got, NULL);
	free(b);
}
END_TEST

START_TEST(control_characters)
{
	Ckpt__V1__CreatePlanRequest r;
	Ckpt__V1__TensorSpec t[4], *tv[4];
	Ckpt__V1__AttachRequest at = CKPT__V1__ATTACH_REQUEST__INIT;
	Ckpt__V1__WatchRequest w = CKPT__V1__WATCH_REQUEST__INIT;

	plan(&r, t, tv);
	expect_refused(&r.base, "t2~", '~', 0x01,
	               "CreatePlanRequest.tensors[2].name has control character 0x01 at byte 2");
	expect_refused(&r.base, "jo~b", '~', 0x7f, "control character 0x7f at byte 2");
	expect_refused(&r.base, "jo~b", '~', '\n', "control character 0x0a at byte 2");
	expect_refused(&r.base, "jo~b", '~', 0x1f, "0x1f");
	/* UTF-8 and the rest of ASCII are left to the name rules */
	expect_accepted(&r.base, "t2~", '~', 0xc3);
	expect_accepted(&r.base, "t2~", '~', ' ');
	/* free text: no tab either (one rule for every string but JSON text) */
	at.client = "my~prog";
	expect_refused(&at.base, "my~prog", '~', '\t',
	               "AttachRequest.client has control character 0x09 at byte 2");
	expect_accepted(&at.base, "my~prog", '~', ' ');
	w.job = "~";
	expect_refused(&w.base, "~", '~', 0, "WatchRequest.job has a NUL at byte 0");
}
END_TEST

/* JSON text may hold JSON's whitespace; bytes fields are not text. */
START_TEST(json_and_bytes)
{
	Ckpt__V1__SaveRequest s = CKPT__V1__SAVE_REQUEST__INIT;
	uint8_t secret[32] = {0, 1, 2, 0x7f, 0};

	s.plan_id = 1;
	s.meta_json = "{\"a\":~1}";
	expect_accepted(&s.base, ":~1", '~', '\n');
	expect_accepted(&s.base, ":~1", '~', '\t');
	expect_accepted(&s.base, ":~1", '~', '\r');
	expect_refused(&s.base, ":~1", '~', 0, "SaveRequest.meta_json has a NUL at byte 5");
	expect_refused(&s.base, ":~1", '~', 0x0b, "control character 0x0b at byte 5");
	s.meta_json = "";
	s.cuda_event.data = secret;
	s.cuda_event.len = sizeof(secret);
	expect_accepted(&s.base, NULL, 0, 0);
}
END_TEST

/* Repeated strings count their elements: the path names the right one. */
START_TEST(repeated_strings)
{
	Ckpt__V1__SaveInfo si = CKPT__V1__SAVE_INFO__INIT;
	Ckpt__V1__CheckpointSummary cs = CKPT__V1__CHECKPOINT_SUMMARY__INIT, *csv[2] = {&cs, &cs};
	Ckpt__V1__ListReply lr = CKPT__V1__LIST_REPLY__INIT;
	char *done[3] = {"n0", "n1", "n~2"}, *missing[1] = {"m~0"};

	si.job = "j";
	si.n_parts_done = 3;
	si.parts_done = done;
	si.n_parts_missing = 1;
	si.parts_missing = missing;
	expect_refused(&si.base, "n~2", '~', 0, "SaveInfo.parts_done[2] has a NUL at byte 1");
	expect_refused(&si.base, "m~0", '~', 0, "SaveInfo.parts_missing[0] has a NUL at byte 1");
	/* the same summary twice: the first one's string is the one found */
	cs.job = "x~y";
	lr.n_checkpoints = 2;
	lr.checkpoints = csv;
	expect_refused(&lr.base, "x~y", '~', 0, "ListReply.checkpoints[0].job has a NUL at byte 1");
}
END_TEST

/* Bytes that are no message are refused, whatever they hold; unknown fields are skipped. */
START_TEST(malformed)
{
	static const uint8_t truncated[] = {0x12, 0x05, 'a', 'b'}; /* job, 5 bytes, 2 there */
	static const uint8_t group[] = {0x13, 0x14}; /* wire type 3 */
	static const uint8_t long_varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff,
	                                      0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
	static const uint8_t unknown[] = {0xfa, 0x07, 0x03, 0x00,
	                                  0x01, 0x02, /* field 127: "\0\1\2" */
	                                  0x12, 0x02, 'o',  'k'};
	static const uint8_t zero_field[] = {0x02, 0x00};
	ProtobufCMessage *out;
	const ProtobufCMessageDescriptor *d = &ckpt__v1__create_plan_request__descriptor;

	ck_assert_int_eq(ipc_check_strings(d, truncated, sizeof(truncated), err), -EINVAL);
	ck_assert_msg(strstr(err, "not a well-formed ckpt.v1.CreatePlanRequest"), "%s", err);
	ck_assert_int_eq(ipc_check_strings(d, group, sizeof(group), err), -EINVAL);
	ck_assert_int_eq(ipc_check_strings(d, long_varint, sizeof(long_varint), err), -EINVAL);
	ck_assert_int_eq(ipc_check_strings(d, zero_field, sizeof(zero_field), err), -EINVAL);
	ck_assert_int_eq(ipc_decode_buf(d, unknown, sizeof(unknown), &out, err), 0);
	ck_assert_str_eq(((Ckpt__V1__CreatePlanRequest *)out)->job, "ok");
	protobuf_c_message_free_unpacked(out, NULL);
	ck_assert_int_eq(ipc_decode_buf(d, "", 0, &out, err), 0); /* every field at its default */
	protobuf_c_message_free_unpacked(out, NULL);
	ck_assert_int_eq(ipc_decode(d, NULL, &out, err), -EINVAL);
	ck_assert_ptr_null(out);
}
END_TEST

/* The versions each side names at attach: one protocol talks, another is refused by name. */
START_TEST(versions)
{
	char want[160], longv[200];

	ck_assert_uint_eq(ipc_protocol(), IPC_PROTOCOL);
	ck_assert_int_eq(ipc_compatible(true, "0.9.9", IPC_PROTOCOL, err), 0);
	ck_assert_int_eq(ipc_compatible(false, NULL, 0, err), 0); /* older than the field: 1 */
	ck_assert_int_eq(ipc_compatible(true, "0.2.0", 2, err), -ENOTSUP);
	snprintf(want, sizeof(want), "libckpt 0.2.0 speaks protocol 2; this ckptd %s speaks 1",
	         ipc_release());
	ck_assert_msg(strstr(err, want), "%s", err);
	ck_assert_int_eq(ipc_compatible(false, "", 5, err), -ENOTSUP);
	snprintf(want, sizeof(want),
	         "ckptd (older than 0.1) speaks protocol 5; this libckpt %s speaks 1",
	         ipc_release());
	ck_assert_msg(strstr(err, want), "%s", err);
	/* a peer's version is its text, cut short: never the whole message */
	memset(longv, 'v', sizeof(longv) - 1);
	longv[sizeof(longv) - 1] = '\0';
	ck_assert_int_eq(ipc_compatible(true, longv, 9, err), -ENOTSUP);
	ck_assert_ptr_null(strstr(err, longv + sizeof(longv) - 40));
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("wire");
	TCase *tc = tcase_create("strings");

	tcase_add_test(tc, nul_in_names);
	tcase_add_test(tc, control_characters);
	tcase_add_test(tc, json_and_bytes);
	tcase_add_test(tc, repeated_strings);
	tcase_add_test(tc, malformed);
	tcase_add_test(tc, versions);
	suite_add_tcase(s, tc);
	return s;
}
