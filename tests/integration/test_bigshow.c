/*
 * Answers at the size of a huge checkpoint: no message past the limit.
 *
 * huge_show: a step of 200,000 tensors, whose manifest (some 40 MB of
 * JSON) passes the 32 MiB a message may carry. A Show asking it whole (as
 * older clients do) is refused with gRPC's words for it, and ckptctl maps
 * that to EMSGSIZE, never EAGAIN; `ckptctl show` prints a few lines;
 * `show --full` (ShowDetail, streamed) prints every tensor; `--json show`
 * gives every tensor; verify reads it all.
 *
 * small_answers: a small step still answers the old way (Show whole);
 * List pages (limit, next_page_token) and refuses a token it never gave;
 * verify lists at most 100 problems and says how many more.
 *
 * plan_too_large: a CreatePlan request past the limit is EMSGSIZE with a
 * sentence that says a retry cannot help (what the Python client raises).
 *
 * huge_show and plan_too_large run in the plain build only: under TSan a
 * CreatePlan of 70,000 tensors (the least that makes a manifest past the
 * limit) took longer than its 60 s, and checking 70,000 names of 500
 * bytes longer than the case's 240 s. small_answers (ShowDetail, List's
 * pages, verify's count) and test_validate (the mapping) run there.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "client/rpc_call.h"
#include "tests/integration/harness.h"
#include "support/check_main.h"

/*
 * The manifest must pass 32 MiB: 200,000 tensors of names of 56 bytes make
 * some 40 MB of JSON. Under a sanitizer each tensor costs several times
 * more: there 70,000 with names of 456 bytes (a padding), some 42 MB.
 */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HUGE_N 70000
#define NAME_PAD 400
#else
#define HUGE_N 200000
#define NAME_PAD 0
#endif
#define NAME_LEN (64 + NAME_PAD)
#define NAME_FMT "model.layers.%06zu.self_attention%.*s.query_key_value.weight"

/* n tensors of 3 bytes each (byte value `fill`), names by NAME_FMT, in one region. */
struct tiny {
	struct ckpt_tensor *t;
	char (*name)[NAME_LEN];
	int64_t shape[1];
	void *base;
};

static void tiny_make(struct tiny *m, struct ckpt_client *c, size_t n, uint8_t fill)
{
	char pad[401]; /* NAME_PAD bytes of it */

	m->t = calloc(n, sizeof(*m->t));
	m->name = calloc(n, sizeof(*m->name));
	ck_assert(m->t && m->name);
	m->shape[0] = 3;
	memset(pad, 'x', sizeof(pad) - 1);
	pad[sizeof(pad) - 1] = '\0';
	ck_assert_int_eq(ckpt_host_alloc(c, n * 64, &m->base), 0);
	memset(m->base, fill, n * 64);
	for (size_t i = 0; i < n; i++) {
		snprintf(m->name[i], sizeof(m->name[i]), NAME_FMT, i, NAME_PAD, pad);
		m->t[i] = (struct ckpt_tensor){.name = m->name[i],
		                               .dtype = CKPT_U8,
		                               .ndim = 1,
		                               .shape = m->shape,
		                               .data = (char *)m->base + i * 64};
	}
}

/* Saves steps first..last of job from n tiny tensors, each COMMITTED. */
static void save_tiny(const struct agent_proc *a, const char *job, size_t n, int64_t first,
                      int64_t last)
{
	struct ckpt_client *c = h_connect(a);
	struct ckpt_plan *p;
	struct tiny m;
	int rc;

	tiny_make(&m, c, n, 0x5a);
	rc = ckpt_plan_create(c, job, 0, 1, m.t, n, &p);
	ck_assert_msg(rc == 0, "plan of %zu tensors: %s", n, ckpt_last_error(c));
	for (int64_t s = first; s <= last; s++) {
		struct ckpt_save *sv;

		ck_assert_int_eq(ckpt_save(p, s, NULL, &sv), 0);
		rc = ckpt_save_wait(sv, CKPT_COMMITTED, 600000);
		ck_assert_msg(rc == 0, "step %lld: %s", (long long)s, ckpt_last_error(c));
		ckpt_save_release(sv);
	}
	ckpt_plan_destroy(p);
	ckpt_host_free(c, m.base);
	free(m.t);
	free(m.name);
	ckpt_disconnect(c);
}

/* Show of (job, step), brief or whole, through libckpt's call: its errno; *r the reply. */
static int show_call(struct ckpt_client *c, const char *job, int64_t step, bool brief,
                     Ckpt__V1__ShowReply **r)
{
	Ckpt__V1__ShowRequest req = CKPT__V1__SHOW_REQUEST__INIT;

	req.job = (char *)job;
	req.step = step;
	req.brief = brief;
	return cl_call(c, IPC_SHOW, &req.base, (ProtobufCMessage **)r, 120000);
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
/* The output of `ckptctl ARGS` in a file under the agent's directory; its exit status. */
static int ctl_to_file(const struct agent_proc *a, const char *args, char *path, size_t len)
{
	char cmd[2048];

	h_path(a, path, len, "../ctl-out");
	snprintf(cmd, sizeof(cmd), "%s --endpoint %s %s > %s 2>&1", CKPTCTL_BIN, a->endpoint, args,
	         path);
	return h_run(NULL, 0, cmd);
}
#endif

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
START_TEST(huge_show)
{
	struct agent_proc a;
	Ckpt__V1__ShowReply *r = NULL;
	struct ckpt_client *c;
	char out[65536], path[4096], cmd[8192], want[128];
	json_t *j;
	int rc;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 4");
	save_tiny(&a, "big", HUGE_N, 1, 1);
	/* asked whole, as an older client does: refused, saying what was too large */
	ck_assert_int_eq(cl_open(a.endpoint, false, &c), 0);
	rc = show_call(c, "big", 1, false, &r);
	ck_assert_msg(rc == -EMSGSIZE, "Show whole: %d (%s)", rc, ckpt_last_error(c));
	ck_assert_msg(strstr(ckpt_last_error(c), "message larger than max") &&
	                  strstr(ckpt_last_error(c), "show --full"),
	              "%s", ckpt_last_error(c));
	/* brief: the counts, in a small reply */
	ck_assert_int_eq(show_call(c, "big", 1, true, &r), 0);
	ck_assert_int_eq(r->summary->tensors, HUGE_N);
	ck_assert_int_eq(r->chunks, HUGE_N);
	ck_assert_int_eq(r->ranks, 1);
	ck_assert_msg(!r->manifest_json || !*r->manifest_json, "brief carried the manifest");
	protobuf_c_message_free_unpacked(&r->base, NULL);
	ckpt_disconnect(c);
	/* ckptctl show: a few lines */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "show big 1"), 0);
	snprintf(want, sizeof(want), "%d tensors in %d chunks; 1 rank file", HUGE_N, HUGE_N);
	ck_assert_msg(strstr(out, want) && strlen(out) < 2048, "%.1500s", out);
	/* --full: every tensor, streamed */
	rc = ctl_to_file(&a, "show --full big 1", path, sizeof(path));
	snprintf(cmd, sizeof(cmd), "head -c 2000 %s", path);
	h_run(out, sizeof(out), cmd);
	ck_assert_msg(rc == 0, "show --full: %d: %.1500s", rc, out);
	snprintf(cmd, sizeof(cmd), "grep -c '^model\\.layers\\.[0-9]*\\.self_attention' %s", path);
	ck_assert_int_eq(h_run(out, sizeof(out), cmd), 0);
	ck_assert_msg(atol(out) == HUGE_N, "show --full printed %s tensors", out);
	snprintf(cmd, sizeof(cmd), "grep -c '^model\\.layers\\.%06d\\.' %s", HUGE_N - 1, path);
	ck_assert_int_eq(h_run(out, sizeof(out), cmd), 0);
	/* --json: the manifest whole, every tensor */
	ck_assert_int_eq(ctl_to_file(&a, "--json show big 1", path, sizeof(path)), 0);
	j = json_load_file(path, 0, NULL);
	ck_assert_msg(j, "--json show: not JSON");
	ck_assert_int_eq(json_object_size(json_object_get(j, "tensors")), HUGE_N);
	json_decref(j);
	/* verify reads it all */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify big 1"), 0);
	snprintf(want, sizeof(want), "OK (%d tensors", HUGE_N);
	ck_assert_msg(strstr(out, want), "%.1500s", out);
	h_agent_cleanup(&a);
}
END_TEST
#endif

/* List of job with limit and token through libckpt's call; *r the reply. */
static void list_call(struct ckpt_client *c, const char *job, uint32_t limit, const char *token,
                      Ckpt__V1__ListReply **r)
{
	Ckpt__V1__ListRequest req = CKPT__V1__LIST_REQUEST__INIT;
	int rc;

	req.job = (char *)job;
	req.limit = limit;
	req.page_token = (char *)token;
	rc = cl_call(c, IPC_LIST, &req.base, (ProtobufCMessage **)r, 60000);
	ck_assert_msg(rc == 0, "list %s: %s", job, ckpt_last_error(c));
}

/* Overwrites the tensor bytes of job's rank-0 shard of step with 0xa5 (after its header). */
static void spoil_data(const struct agent_proc *a, const char *job, long long step)
{
	char path[4096], *buf;
	uint64_t hlen;
	struct stat st;
	int fd;

	h_shard(a, path, sizeof(path), job, step, 0);
	fd = open(path, O_RDWR);
	ck_assert_msg(fd >= 0, "%s", path);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_eq(pread(fd, &hlen, 8, 0), 8);
	ck_assert((uint64_t)st.st_size > 8 + hlen);
	buf = malloc((size_t)st.st_size - 8 - hlen);
	memset(buf, 0xa5, (size_t)st.st_size - 8 - hlen);
	ck_assert_int_eq(pwrite(fd, buf, (size_t)st.st_size - 8 - hlen, (off_t)(8 + hlen)),
	                 (ssize_t)(st.st_size - 8 - hlen));
	free(buf);
	close(fd);
}

START_TEST(small_answers)
{
	struct agent_proc a;
	Ckpt__V1__ShowReply *r;
	Ckpt__V1__ListReply *l;
	struct ckpt_client *c;
	static char out[1 << 20]; /* 150 names of up to 464 bytes, and the rest */
	char token[128];
	int64_t seen = 0;
	int rc;

	h_agent_start(&a, "--staging-mb 32 --chunk-mb 1");
	save_tiny(&a, "small", 150, 1, 5);
	ck_assert_int_eq(cl_open(a.endpoint, false, &c), 0);
	/* the old way: the manifest whole, in one reply */
	ck_assert_int_eq(show_call(c, "small", 5, false, &r), 0);
	ck_assert_msg(r->manifest_json && strstr(r->manifest_json, "model.layers.000149."),
	              "%.1500s", r->manifest_json ? r->manifest_json : "(none)");
	protobuf_c_message_free_unpacked(&r->base, NULL);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "show --full small 5"), 0);
	ck_assert_msg(strstr(out, "model.layers.000149.") && strstr(out, "RANK"), "%.1500s", out);
	/* all at once without a limit, as older clients ask */
	list_call(c, "small", 0, "", &l);
	ck_assert_int_eq(l->n_checkpoints, 5);
	ck_assert_str_eq(l->next_page_token, "");
	protobuf_c_message_free_unpacked(&l->base, NULL);
	/* two at a time: 1 2, 3 4, 5, each once, in order */
	token[0] = '\0';
	do {
		list_call(c, "small", 2, token, &l);
		ck_assert_msg(l->n_checkpoints >= 1 && l->n_checkpoints <= 2, "page of %zu",
		              l->n_checkpoints);
		for (size_t i = 0; i < l->n_checkpoints; i++)
			ck_assert_int_eq(l->checkpoints[i]->step, ++seen);
		snprintf(token, sizeof(token), "%s", l->next_page_token);
		protobuf_c_message_free_unpacked(&l->base, NULL);
	} while (token[0]);
	ck_assert_int_eq(seen, 5);
	{ /* a token no list gave */
		Ckpt__V1__ListRequest req = CKPT__V1__LIST_REQUEST__INIT;

		req.job = "small";
		req.limit = 2;
		req.page_token = "small";
		rc = cl_call(c, IPC_LIST, &req.base, (ProtobufCMessage **)&l, 60000);
		ck_assert_int_eq(rc, -EINVAL);
		ck_assert_msg(strstr(ckpt_last_error(c), "page_token"), "%s", ckpt_last_error(c));
	}
	ckpt_disconnect(c);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "list small"), 0);
	ck_assert_msg(strstr(out, "LATEST"), "%.1500s", out);
	/* 150 chunks bad: 100 said, and how many more */
	spoil_data(&a, "small", 3);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "verify small 3"), 1);
	ck_assert_msg(strstr(out, "CORRUPT") && strstr(out, "... and 50 more problems"), "%.1500s",
	              out);
	h_agent_cleanup(&a);
}
END_TEST

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
START_TEST(plan_too_large)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p = NULL;
	struct ckpt_tensor *t;
	int64_t shape[1] = {1};
	char(*name)[501];
	size_t n = 70000; /* 70,000 names of 500 bytes: 35 MB, past the 32 MiB */
	void *base;
	int rc;

	h_agent_start(&a, "--staging-mb 32 --chunk-mb 1");
	c = h_connect(&a);
	t = calloc(n, sizeof(*t));
	name = calloc(n, sizeof(*name));
	ck_assert(t && name);
	ck_assert_int_eq(ckpt_host_alloc(c, n * 64, &base), 0);
	for (size_t i = 0; i < n; i++) {
		memset(name[i], 'x', 500);
		snprintf(name[i], 16, "t%08zu", i);
		name[i][strlen(name[i])] = 'x';
		t[i] = (struct ckpt_tensor){.name = name[i],
		                            .dtype = CKPT_U8,
		                            .ndim = 1,
		                            .shape = shape,
		                            .data = (char *)base + i * 64};
	}
	rc = ckpt_plan_create(c, "wide", 0, 1, t, n, &p);
	ck_assert_msg(rc == -EMSGSIZE, "plan: %d (%s)", rc, ckpt_last_error(c));
	ck_assert_msg(strstr(ckpt_last_error(c), "larger than max") &&
	                  strstr(ckpt_last_error(c), "a retry fails the same way"),
	              "%s", ckpt_last_error(c));
	ckpt_host_free(c, base);
	ckpt_disconnect(c);
	free(t);
	free(name);
	h_agent_cleanup(&a);
}
END_TEST
#endif

Suite *test_suite(void)
{
	Suite *s = suite_create("bigshow");

	/* a case each, so that CK_RUN_CASE picks one */
	{
		TCase *tc = tcase_create("small_answers");

		tcase_add_test(tc, small_answers);
		suite_add_tcase(s, tc);
	}
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
	{
		TCase *tc = tcase_create("plan_too_large");

		tcase_add_test(tc, plan_too_large);
		suite_add_tcase(s, tc);
	}
#endif
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
	{
		TCase *tc = tcase_create("huge_show");

		tcase_set_timeout(tc, 900);
		tcase_add_test(tc, huge_show);
		suite_add_tcase(s, tc);
	}
#endif
	return s;
}
