/*
 * What operators watch: `ckptctl watch` with stdout to a pipe (one line per
 * event, QUEUED to COMMITTED, progress while a save is in flight, the job
 * filter, SIGINT ends it with 0), `watch --json` (every line parses, with
 * the right types, each save's rate), the live view on a pseudo-terminal
 * (drawn, Ctrl-C puts the terminal back; a row fits 80 columns whole), the
 * watch of an agent that goes away, and
 * `ckptctl status --json` after saves (fields, types and values).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

#ifndef CKPTCTL_BIN
#error "CKPTCTL_BIN must name ckptctl"
#endif

static char out[1 << 20];

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- a ckptctl watch in the background --------------------------------- */

struct watch {
	pid_t pid;
	int fd; /* its stdout and stderr (a pipe), or the pty's master */
	char *buf;
	size_t len, cap;
};

/* A watch; on a pseudo-terminal of `cols` columns (0: on a pipe). */
static void watch_start_cols(struct watch *w, const struct agent_proc *a, const char *args,
                             unsigned cols)
{
	bool tty = cols > 0;

	char cmd[1024];

	memset(w, 0, sizeof(*w));
	w->cap = 4 << 20;
	w->buf = calloc(1, w->cap);
	ck_assert(w->buf);
	snprintf(cmd, sizeof(cmd), "exec %s --endpoint %s watch %s", CKPTCTL_BIN, a->endpoint,
	         args);
	if (tty) {
		struct winsize ws = {.ws_row = 40, .ws_col = (unsigned short)cols};

		w->pid = forkpty(&w->fd, NULL, NULL, &ws);
		ck_assert_msg(w->pid >= 0, "forkpty: %s", strerror(errno));
		if (w->pid == 0) {
			execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
			_exit(127);
		}
	} else {
		int p[2];

		ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
		w->pid = fork();
		ck_assert_int_ge(w->pid, 0);
		if (w->pid == 0) {
			dup2(p[1], STDOUT_FILENO);
			dup2(p[1], STDERR_FILENO);
			execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
			_exit(127);
		}
		close(p[1]);
		w->fd = p[0];
	}
}

static void watch_start(struct watch *w, const struct agent_proc *a, const char *args, bool tty)
{
	watch_start_cols(w, a, args, tty ? 200 : 0);
}

/* Reads what there is (waiting up to ms); false at the end of its output. */
static bool watch_read(struct watch *w, int ms)
{
	struct pollfd pfd = {w->fd, POLLIN, 0};
	ssize_t n;

	if (poll(&pfd, 1, ms) <= 0)
		return true;
	n = read(w->fd, w->buf + w->len, w->cap - w->len - 1);
	if (n <= 0)
		return false; /* EOF, or EIO from a pty whose child is gone */
	w->len += (size_t)n;
	w->buf[w->len] = '\0';
	return true;
}

/* The first complete line, from offset `from`, holding every one of the needles. */
static const char *find_line(const struct watch *w, size_t from, const char *const *needles,
                             size_t *at)
{
	const char *p = w->buf + from, *end;

	while ((end = strchr(p, '\n'))) {
		bool all = true;

		for (size_t i = 0; needles[i] && all; i++) {
			const char *h = strstr(p, needles[i]);

			all = h && h < end;
		}
		if (all) {
			if (at)
				*at = (size_t)(p - w->buf);
			return p;
		}
		p = end + 1;
	}
	return NULL;
}

/* Waits (up to ms) for a line holding every needle (NULL-terminated); its offset. */
static size_t wait_line(struct watch *w, int ms, const char *const *needles)
{
	int64_t until = mono_ms() + ms;
	size_t at = 0;

	for (;;) {
		if (find_line(w, 0, needles, &at))
			return at;
		if (mono_ms() > until || !watch_read(w, 50))
			break;
	}
	ck_abort_msg("no line with '%s' '%s' '%s' in the watch output:\n%s", needles[0],
	             needles[1] ? needles[1] : "", needles[1] && needles[2] ? needles[2] : "",
	             w->buf);
	return 0;
}

/* Waits (up to ms) until the output holds `needle` anywhere. */
static void wait_text(struct watch *w, int ms, const char *needle)
{
	int64_t until = mono_ms() + ms;

	while (!strstr(w->buf, needle))
		if (mono_ms() > until || !watch_read(w, 50))
			ck_abort_msg("no '%s' in the watch output:\n%s", needle, w->buf);
}

/* SIGINT (or nothing when sig is 0), then its exit status; reads what is left. */
static int watch_end(struct watch *w, int sig)
{
	int64_t until = mono_ms() + 20000;
	int st;

	if (sig)
		kill(w->pid, sig);
	while (waitpid(w->pid, &st, WNOHANG) != w->pid) {
		if (mono_ms() > until) {
			kill(w->pid, SIGKILL);
			waitpid(w->pid, &st, 0);
			ck_abort_msg("ckptctl watch did not end within 20 s:\n%s", w->buf);
		}
		watch_read(w, 20);
	}
	while (watch_read(w, 100) && w->len < w->cap - 1)
		;
	return h_exit_code(st);
}

static void watch_free(struct watch *w)
{
	close(w->fd);
	free(w->buf);
}

/* ---- a two-rank job: rank 0 saves first, the step stays in flight ------- */

struct pair {
	struct ckpt_client *c;
	struct h_model m[2];
	struct ckpt_plan *p[2];
};

static void pair_make(struct pair *x, const struct agent_proc *a, const char *job)
{
	x->c = h_connect(a);
	for (int r = 0; r < 2; r++) {
		int rc;

		h_model_make(&x->m[r], x->c, 3, 300007);
		for (size_t i = 0; i < x->m[r].n; i++) /* each rank its own tensors */
			snprintf(x->m[r].name[i], sizeof(x->m[r].name[i]), "rank%d.t%zu", r, i);
		h_model_fill(&x->m[r], (uint64_t)r + 7);
		rc = ckpt_plan_create(x->c, job, r, 2, x->m[r].t, x->m[r].n, &x->p[r]);
		ck_assert_msg(rc == 0, "plan of rank %d: %s", r, ckpt_last_error(x->c));
	}
}

static void pair_save(struct pair *x, int rank, int64_t step, enum ckpt_state until)
{
	struct ckpt_save *s;

	ck_assert_int_eq(ckpt_save(x->p[rank], step, NULL, &s), 0);
	ck_assert_msg(ckpt_save_wait(s, until, 60000) == 0, "rank %d step %lld: %s", rank,
	              (long long)step, ckpt_save_reason(s));
	ckpt_save_release(s);
}

static void pair_free(struct pair *x)
{
	for (int r = 0; r < 2; r++) {
		if (x->p[r])
			ckpt_plan_destroy(x->p[r]);
		h_model_free(&x->m[r]);
	}
	ckpt_disconnect(x->c);
}

/* ---- tests -------------------------------------------------------------- */

START_TEST(watch_lines_on_a_pipe)
{
	static const char *const states[] = {"state=QUEUED", "state=CAPTURED", "state=DURABLE",
	                                     "state=COMMITTED"};
	struct agent_proc a;
	struct watch w;
	struct pair x;
	size_t prev = 0, at;

	h_agent_start(&a, NULL);
	pair_make(&x, &a, "wj");
	/* Rank 0 of step 1 in flight: the watch starts with it, then hears of each change. */
	pair_save(&x, 0, 1, CKPT_DURABLE);
	watch_start(&w, &a, "wj", false);
	wait_line(&w, 20000, (const char *const[]){"job=wj step=1 rank=0/2 state=DURABLE", NULL});
	/* In flight, it is reported once a second though its state does not change. */
	wait_line(&w, 5000,
	          (const char *const[]){"progress", "job=wj step=1 rank=0/2 state=DURABLE", NULL});
	/* another job's saves are not shown to a watch of wj */
	{
		struct ckpt_client *c = h_connect(&a);
		struct ckpt_plan *p;
		struct ckpt_save *s;
		struct h_model m;

		h_model_make(&m, c, 2, 10007);
		ck_assert_int_eq(ckpt_plan_create(c, "other", 0, 1, m.t, m.n, &p), 0);
		ck_assert_int_eq(ckpt_save(p, 3, NULL, &s), 0);
		ck_assert_int_eq(ckpt_save_wait(s, CKPT_COMMITTED, 60000), 0);
		ckpt_save_release(s);
		ckpt_plan_destroy(p);
		h_model_free(&m);
		ckpt_disconnect(c);
	}
	/* rank 1 arrives: QUEUED .. COMMITTED for it, in order, then rank 0's COMMITTED */
	pair_save(&x, 1, 1, CKPT_COMMITTED);
	for (size_t i = 0; i < 4; i++) {
		at = wait_line(
		    &w, 20000,
		    (const char *const[]){"state ", "job=wj step=1 rank=1/2 ", states[i], NULL});
		ck_assert_msg(i == 0 || at > prev, "%s comes after %s:\n%s", states[i],
		              states[i - 1], w.buf);
		prev = at;
	}
	wait_line(&w, 20000, (const char *const[]){"job=wj step=1 rank=0/2 state=COMMITTED", NULL});
	/* the fields of a line: time, bytes written of total, durations */
	{
		const char *l =
		    find_line(&w, 0, (const char *const[]){"rank=1/2 state=COMMITTED", NULL}, NULL);
		unsigned long long done, total;
		int y, mo, d, h, mi, s, ms;

		ck_assert_ptr_nonnull(l);
		ck_assert_int_eq(
		    sscanf(l, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ", &y, &mo, &d, &h, &mi, &s, &ms), 7);
		ck_assert_int_eq(sscanf(strstr(l, "bytes="), "bytes=%llu/%llu", &done, &total), 2);
		ck_assert_msg(done == total && total > 300007, "%.200s", l);
		ck_assert_msg(strstr(l, "commit="), "%.200s", l);
		/* its rate: the bytes over the time to DURABLE, e.g. rate=12.5M/s */
		ck_assert_msg(strstr(l, " rate=") && !strstr(l, " rate=-") && strstr(l, "/s"),
		              "%.200s", l);
	}
	ck_assert_msg(!strstr(w.buf, "job=other"), "a watch of wj shows only wj:\n%s", w.buf);
	ck_assert_int_eq(watch_end(&w, SIGINT), 0);
	watch_free(&w);
	pair_free(&x);
	/* usage */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "watch a b"), 2);
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "watch ../x"), 2);
	h_agent_cleanup(&a);
}
END_TEST

static void check_json_event(const char *line, json_t *j)
{
	static const char *const ints[] = {"time_unix_ns",   "save_id",       "step",
	                                   "rank",           "world",         "bytes_total",
	                                   "bytes_captured", "bytes_written", "queued_unix_ns"};
	static const char *const reals[] = {"capture_seconds", "durable_seconds", "commit_seconds",
	                                    "bytes_per_second"};
	static const char *const strs[] = {"time", "event", "job", "state", "reason"};

	for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
		ck_assert_msg(json_is_integer(json_object_get(j, ints[i])), "%s: %s", ints[i],
		              line);
	for (size_t i = 0; i < sizeof(reals) / sizeof(reals[0]); i++)
		ck_assert_msg(json_is_real(json_object_get(j, reals[i])), "%s: %s", reals[i], line);
	for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++)
		ck_assert_msg(json_is_string(json_object_get(j, strs[i])), "%s: %s", strs[i], line);
	ck_assert_msg(json_is_boolean(json_object_get(j, "pool_limited")), "%s", line);
	ck_assert_msg(!strcmp(json_string_value(json_object_get(j, "event")), "state") ||
	                  !strcmp(json_string_value(json_object_get(j, "event")), "progress"),
	              "%s", line);
}

START_TEST(watch_json_lines_parse)
{
	struct agent_proc a;
	struct watch w;
	struct pair x;
	char *save = NULL, *line;
	int n = 0, committed = 0, queued = 0, durable = 0;

	h_agent_start(&a, NULL);
	pair_make(&x, &a, "js");
	pair_save(&x, 0, 4, CKPT_DURABLE);
	watch_start(&w, &a, "--json", false); /* every job */
	wait_text(&w, 20000, "\"state\":\"DURABLE\"");
	pair_save(&x, 1, 4, CKPT_COMMITTED);
	wait_text(&w, 20000, "\"rank\":1,\"world\":2,\"state\":\"COMMITTED\"");
	wait_text(&w, 20000, "\"rank\":0,\"world\":2,\"state\":\"COMMITTED\"");
	ck_assert_int_eq(watch_end(&w, SIGINT), 0);
	for (line = strtok_r(w.buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		json_error_t e;
		json_t *j = json_loads(line, 0, &e);

		ck_assert_msg(j, "not JSON (%s): %s", e.text, line);
		check_json_event(line, j);
		ck_assert_str_eq(json_string_value(json_object_get(j, "job")), "js");
		ck_assert_int_eq(json_integer_value(json_object_get(j, "step")), 4);
		if (!strcmp(json_string_value(json_object_get(j, "state")), "QUEUED"))
			queued++;
		if (!strcmp(json_string_value(json_object_get(j, "state")), "COMMITTED")) {
			committed++;
			ck_assert_int_eq(json_integer_value(json_object_get(j, "bytes_written")),
			                 json_integer_value(json_object_get(j, "bytes_total")));
			ck_assert(json_real_value(json_object_get(j, "commit_seconds")) > 0);
		}
		/* in flight (rank 0 waits for rank 1) or finished: its bytes over its time */
		if (!strcmp(json_string_value(json_object_get(j, "state")), "DURABLE") ||
		    !strcmp(json_string_value(json_object_get(j, "state")), "COMMITTED")) {
			double bps = json_real_value(json_object_get(j, "bytes_per_second"));
			double secs = json_real_value(json_object_get(j, "durable_seconds"));
			double bytes =
			    (double)json_integer_value(json_object_get(j, "bytes_written"));

			durable +=
			    strcmp(json_string_value(json_object_get(j, "state")), "DURABLE") == 0;
			ck_assert_msg(bps > 0 && secs > 0 && bps > bytes / secs * 0.999 &&
			                  bps < bytes / secs * 1.001,
			              "bytes_per_second is bytes_written / durable_seconds: %s",
			              line);
		}
		json_decref(j);
		n++;
	}
	ck_assert_int_eq(committed, 2);
	ck_assert_int_ge(durable, 2); /* rank 0's while in flight (and progress), rank 1's */
	ck_assert_int_eq(queued, 1); /* rank 1's; rank 0 was past it when the watch began */
	ck_assert_int_ge(n, 5);
	watch_free(&w);
	pair_free(&x);
	h_agent_cleanup(&a);
}
END_TEST

START_TEST(watch_live_view_on_a_terminal)
{
	struct agent_proc a;
	struct watch w;
	struct pair x;
	struct termios t;
	size_t mark;

	h_agent_start(&a, NULL);
	pair_make(&x, &a, "tv");
	pair_save(&x, 0, 9, CKPT_DURABLE);
	watch_start(&w, &a, "", true);
	wait_text(&w, 20000, "SAVES IN FLIGHT (1)");
	wait_text(&w, 5000, "tv ");
	ck_assert_msg(strstr(w.buf, "\033[?25l"), "the cursor is hidden while it draws");
	/* rank 0 durable, the step waiting for rank 1: COMMITTING */
	ck_assert_msg(strstr(w.buf, "COMMITTING") && strstr(w.buf, "[#"), "a bar:\n%s", w.buf);
	/* redrawn in place: the cursor goes back up over the last frame */
	wait_text(&w, 5000, "\033[");
	mark = w.len;
	pair_save(&x, 1, 9, CKPT_COMMITTED);
	for (int64_t until = mono_ms() + 20000;
	     !strstr(w.buf + mark, "SAVES IN FLIGHT (0)") || !strstr(w.buf + mark, "COMMITTED");)
		ck_assert_msg(mono_ms() < until && watch_read(&w, 50),
		              "the view shows the commit:\n%s", w.buf + mark);
	ck_assert_msg(strstr(w.buf, "LAST CHECKPOINTS"), "%s", w.buf);
	/* Ctrl-C: exit 0, cursor back, echo back on */
	ck_assert_int_eq(watch_end(&w, SIGINT), 0);
	ck_assert_msg(strstr(w.buf + mark, "\033[?25h"), "the cursor is shown again");
	ck_assert_int_eq(tcgetattr(w.fd, &t), 0);
	ck_assert_msg(t.c_lflag & ECHO, "the terminal echoes again");
	watch_free(&w);
	pair_free(&x);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * On 80 columns a save's row fits whole: state, bar, bytes written of
 * total, rate and age, nothing cut (the bar gives way to the columns).
 */
START_TEST(watch_live_view_fits_80_columns)
{
	struct agent_proc a;
	struct watch w;
	struct pair x;
	const char *row, *end;
	size_t at, len;

	h_agent_start(&a, NULL);
	pair_make(&x, &a, "narrow");
	pair_save(&x, 0, 120000, CKPT_DURABLE); /* rank 1 never comes: it stays in flight */
	watch_start_cols(&w, &a, "", 80);
	at = wait_line(&w, 20000, (const char *const[]){"narrow ", "COMMITTING", "/s ", NULL});
	row = w.buf + at;
	end = strstr(row, "\033[K");
	ck_assert_ptr_nonnull(end);
	len = (size_t)(end - row);
	ck_assert_msg(len <= 79, "a row of %zu columns on 80: %.*s", len, (int)len, row);
	/* job, step, rank, state, bar, percentage, written/total, rate, age (" s" or " ms") */
	ck_assert_msg(strstr(row, " 120000 ") && strstr(row, " 0/2 ") && strstr(row, "[#") &&
	                  strstr(row, "100% ") && strstr(row, "K/") && len > 2 &&
	                  row[len - 1] == 's' && (row[len - 2] == ' ' || row[len - 2] == 'm'),
	              "every column whole: %.*s", (int)len, row);
	ck_assert_msg(strstr(w.buf, "WRITTEN") && strstr(w.buf, "RATE") && strstr(w.buf, "AGE"),
	              "the header names them:\n%s", w.buf);
	ck_assert_int_eq(watch_end(&w, SIGINT), 0);
	watch_free(&w);
	pair_free(&x);
	h_agent_cleanup(&a);
}
END_TEST

#ifdef CKPT_FAULT_INJECTION
/*
 * A save whose writes are slow (700 ms each, 1 MiB chunks: the writing
 * lasts through several of the agent's once-a-second progress ticks) is WRITING on
 * an 80-column terminal, with bytes written of total and a rate; once it
 * commits, the list of last checkpoints and the event lines on a pipe give
 * no reason for it (reasons are for failures).
 */
START_TEST(watch_phases_and_reasons)
{
	struct agent_proc a;
	struct watch w, p;
	struct ckpt_client *c;
	struct ckpt_plan *pl;
	struct ckpt_save *s;
	struct h_model m;
	const char *row;
	size_t at;

	h_agent_start_env(&a, "--staging-mb 32 --chunk-mb 1 --queue-depth 1",
	                  "CKPT_FAULTS=io_write:slow=700:path=*/ph/*:count=inf");
	watch_start_cols(&w, &a, "ph", 80);
	watch_start(&p, &a, "ph", false);
	c = h_connect(&a);
	h_model_make(&m, c, 4, 1 << 20); /* about 4 MiB: 5 writes, 3.5 s: ticks fall in it */
	ck_assert_int_eq(ckpt_plan_create(c, "ph", 0, 1, m.t, m.n, &pl), 0);
	h_model_fill(&m, 3);
	ck_assert_int_eq(ckpt_save(pl, 1, NULL, &s), 0);
	at = wait_line(&w, 20000, (const char *const[]){"ph ", "WRITING", "/s ", NULL});
	row = w.buf + at;
	ck_assert_msg(strstr(row, "M/") || strstr(row, "K/"), "bytes written of total: %.100s",
	              row);
	ck_assert_int_eq(ckpt_save_wait(s, CKPT_COMMITTED, 60000), 0);
	ckpt_save_release(s);
	wait_text(&w, 20000, "LAST CHECKPOINTS");
	wait_line(&w, 20000, (const char *const[]){"ph ", " COMMITTED ", NULL});
	wait_line(&p, 20000, (const char *const[]){"job=ph", "state=COMMITTED", NULL});
	ck_assert_msg(!strstr(p.buf, "reason:"), "a reason for a save that succeeded:\n%s", p.buf);
	ck_assert_int_eq(watch_end(&w, SIGINT), 0);
	ck_assert_int_eq(watch_end(&p, SIGINT), 0);
	watch_free(&w);
	watch_free(&p);
	ckpt_plan_destroy(pl);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST
#endif

START_TEST(watch_ends_when_the_agent_goes)
{
	struct agent_proc a;
	struct watch w;
	struct pair x;

	h_agent_start(&a, NULL);
	pair_make(&x, &a, "gone");
	pair_save(&x, 0, 1, CKPT_DURABLE);
	watch_start(&w, &a, "", false);
	wait_line(&w, 20000, (const char *const[]){"job=gone", NULL});
	pair_save(&x, 1, 1, CKPT_COMMITTED);
	pair_free(&x);
	ck_assert_int_eq(h_agent_stop(&a), 0);
	ck_assert_int_eq(watch_end(&w, 0), 1);
	ck_assert_msg(strstr(w.buf, "ckptctl:"), "it says why:\n%s", w.buf);
	watch_free(&w);
	h_agent_cleanup(&a);
}
END_TEST

/* ---- status ------------------------------------------------------------- */

static json_t *status(const struct agent_proc *a)
{
	json_t *j;

	ck_assert_int_eq(h_ctl(a, out, sizeof(out), "--json status"), 0);
	j = json_loads(out, 0, NULL);
	ck_assert_msg(j, "status --json: %s", out);
	return j;
}

static json_t *at(json_t *j, const char *a, const char *b)
{
	json_t *v = json_object_get(j, a);

	if (b)
		v = json_object_get(v, b);
	ck_assert_msg(v, "status --json has no %s%s%s", a, b ? "." : "", b ? b : "");
	return v;
}

START_TEST(status_fields)
{
	struct agent_proc a;
	struct pair x;
	json_t *j;
	unsigned maj, min, pat;

	h_agent_start(&a, "--staging-mb 64 --chunk-mb 1 --keep-last 5");
	pair_make(&x, &a, "st");
	pair_save(&x, 0, 1, CKPT_DURABLE);
	pair_save(&x, 1, 1, CKPT_COMMITTED);
	/* a failed step: rank 1's plan goes before it saves step 2 */
	pair_save(&x, 0, 2, CKPT_DURABLE);
	ckpt_plan_destroy(x.p[1]);
	x.p[1] = NULL;
	for (int i = 0;; i++) {
		j = status(&a);
		if (json_integer_value(at(j, "saves", "FAILED")) == 1)
			break;
		json_decref(j);
		ck_assert_msg(i < 200, "the save of step 2 fails once rank 1's plan is gone");
		usleep(50000);
	}
	ck_assert(json_is_string(at(j, "version", NULL)));
	ck_assert_msg(
	    sscanf(json_string_value(at(j, "version", NULL)), "%u.%u.%u", &maj, &min, &pat) == 3,
	    "version %s", json_string_value(at(j, "version", NULL)));
	ck_assert_int_eq(json_integer_value(at(j, "pid", NULL)), a.pid);
	ck_assert(json_is_real(at(j, "uptime_seconds", NULL)));
	ck_assert(json_real_value(at(j, "uptime_seconds", NULL)) > 0 &&
	          json_real_value(at(j, "uptime_seconds", NULL)) < 3600);
	ck_assert_str_eq(json_string_value(at(j, "root", NULL)), a.root);
	ck_assert_str_eq(json_string_value(at(j, "listen", NULL)), a.endpoint);
	/* the I/O path in use and why */
	ck_assert_msg(!strcmp(json_string_value(at(j, "io", "engine")), "io_uring") ||
	                  !strcmp(json_string_value(at(j, "io", "engine")), "pwrite"),
	              "%s", json_string_value(at(j, "io", "engine")));
	ck_assert(strlen(json_string_value(at(j, "io", "detail"))) > 10);
	ck_assert(json_is_integer(at(j, "io", "bytes_written")));
	/* three shards of three tensors of about 300007 bytes each */
	ck_assert_int_ge(json_integer_value(at(j, "io", "bytes_written")), 3 * 3 * 300000);
	ck_assert_int_eq(json_integer_value(at(j, "io", "errors")), 0);
	/* the pool: size and use */
	ck_assert_int_eq(json_integer_value(at(j, "pool", "bytes")), 64 << 20);
	ck_assert_int_eq(json_integer_value(at(j, "pool", "chunk_bytes")), 1 << 20);
	ck_assert(json_is_integer(at(j, "pool", "used_bytes")));
	ck_assert_int_ge(json_integer_value(at(j, "pool", "used_bytes")), 0);
	ck_assert_int_le(json_integer_value(at(j, "pool", "used_bytes")), 64 << 20);
	ck_assert(json_is_boolean(at(j, "pool", "locked")));
	ck_assert(json_is_string(at(j, "pool", "detail")));
	/* saves by final state */
	ck_assert_int_eq(json_integer_value(at(j, "saves", "COMMITTED")), 2);
	ck_assert_int_eq(json_integer_value(at(j, "saves", "FAILED")), 1);
	ck_assert_int_eq(json_integer_value(at(j, "saves", "SKIPPED")), 0);
	ck_assert_int_eq(json_integer_value(at(j, "clients", "saves_in_flight")), 0);
	ck_assert_int_eq(json_integer_value(at(j, "clients", "sessions")), 1);
	/* the last error names what failed */
	ck_assert_msg(strstr(json_string_value(at(j, "last_error", NULL)), "step 2"),
	              "last_error: %s", json_string_value(at(j, "last_error", NULL)));
	ck_assert(json_is_string(at(j, "gpu", NULL)));
	ck_assert_int_eq(json_integer_value(at(j, "retention", "keep_last")), 5);
	ck_assert_int_eq(json_integer_value(at(j, "retention", "keep_every")), 0);
	ck_assert_int_eq(json_integer_value(at(j, "removed_at_start", NULL)), 0);
	json_decref(j);
	/* the table says the same */
	ck_assert_int_eq(h_ctl(&a, out, sizeof(out), "status"), 0);
	ck_assert_msg(strstr(out, "ckptd ") && strstr(out, "I/O") && strstr(out, "staging") &&
	                  strstr(out, "COMMITTED 2") && strstr(out, "FAILED 1") &&
	                  strstr(out, "last error") && strstr(out, "retention"),
	              "%s", out);
	pair_free(&x);
	h_agent_cleanup(&a);
}
END_TEST

int test_before(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	signal(SIGPIPE, SIG_IGN);
	return TEST_RUN;
}

Suite *test_suite(void)
{
	Suite *s = suite_create("watch");
	TCase *tc = tcase_create("agent");

	tcase_set_timeout(tc, 180);
	tcase_add_test(tc, watch_lines_on_a_pipe);
	tcase_add_test(tc, watch_json_lines_parse);
	tcase_add_test(tc, watch_live_view_on_a_terminal);
	tcase_add_test(tc, watch_live_view_fits_80_columns);
#ifdef CKPT_FAULT_INJECTION /* slow writes: the save is caught WRITING */
	tcase_add_test(tc, watch_phases_and_reasons);
#endif
	tcase_add_test(tc, watch_ends_when_the_agent_goes);
	tcase_add_test(tc, status_fields);
	suite_add_tcase(s, tc);
	return s;
}
