/*
 * ckptctl watch [JOB]: the saves in flight, through the server-streaming
 * Watch call. The agent sends the saves in flight, then every change of
 * state, and once a second the bytes each save in flight has moved
 * (SaveInfo.progress).
 *
 *   stdout a terminal: a live view redrawn in place four times a second
 *     with ANSI cursor moves (no curses): per rank of each save in flight
 *     its state, a bar, bytes written of total, the rate and the age; its
 *     columns as wide as what they hold, the bar taking what the terminal
 *     has left (80 columns fit a row); below it the last checkpoints that
 *     finished, with their durations. Ctrl-C or SIGTERM puts the terminal
 *     back as it was and exits 0; Ctrl-Z does too until the view is
 *     continued.
 *   otherwise: one line per event, written at once (pipes, logs, grep);
 *     with --json one JSON object per line.
 *
 * The rate of a save, everywhere: its bytes written over the time from
 * QUEUED to DURABLE (the agent's durable_seconds) or, not yet durable, to
 * now (the agent's clock against this one's, as the age is); a wait for
 * the staging pool counts, as it did for the trainer.
 *
 * One thread: it waits on the stream at most REDRAW_MS at a time, so a
 * signal (which only sets a flag) is acted on within that.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "client/ckptctl/ckptctl.h"

#define REDRAW_MS 250
#define RECENT 6 /* finished checkpoints shown */
#define BAR 24 /* progress bar width, at most */
#define BAR_MIN 6 /* and at least */
#define VIEW_LINE_MAX 512

/* A rank's save in flight. */
struct track {
	uint64_t id;
	char job[IPC_MAX_JOB + 1];
	int64_t step;
	int rank, world, state;
	uint64_t total, captured, written;
	int64_t queued_unix_ns;
	double durable_seconds; /* 0 until DURABLE */
	bool pool_limited;
	char parts[160]; /* the commit's progress: parts in and missing */
};

/* A checkpoint that finished (its ranks merged as they arrive). */
struct recent {
	char job[IPC_MAX_JOB + 1];
	int64_t step;
	int world, state;
	unsigned ranks;
	uint64_t bytes;
	double capture, durable, commit;
	int64_t done_unix_ns;
	char reason[160];
};

struct view {
	const char *job; /* NULL: every job */
	const char *endpoint;
	struct track *t;
	size_t n, cap;
	struct recent r[RECENT]; /* oldest first */
	size_t nr;
	unsigned drawn; /* lines of the last frame */
	uint64_t events;
};

static volatile sig_atomic_t g_stop, g_redraw_all;
static struct termios g_saved;
static bool g_tty_set;

static const char SHOW_CURSOR[] = "\033[?25h", HIDE_CURSOR[] = "\033[?25l";

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t unix_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A save's rate (see the top): bytes per second; 0 while not known. */
static double save_rate(uint64_t written, int64_t queued_unix_ns, double durable_seconds,
                        int64_t now_unix_ns)
{
	double secs = durable_seconds > 0  ? durable_seconds
	              : queued_unix_ns > 0 ? (double)(now_unix_ns - queued_unix_ns) / 1e9
	                                   : 0;

	return secs > 0 ? (double)written / secs : 0;
}

/* "1.5G": binary units, one letter, for columns that must stay narrow. */
static void short_bytes(double v, char *buf, size_t len)
{
	static const char unit[] = "BKMGTP";
	int u = 0;

	while (v >= 1024 && u < 5) {
		v /= 1024;
		u++;
	}
	snprintf(buf, len, u ? "%.1f%c" : "%.0f%c", v, unit[u]);
}

/* "512.0M/s" ("-" while not known). */
static void rate_text(double bps, char *buf, size_t len)
{
	char n[24];

	short_bytes(bps, n, sizeof(n));
	snprintf(buf, len, "%s%s", bps > 0 ? n : "-", bps > 0 ? "/s" : "");
}

/* ---- the terminal ----------------------------------------------------- */

/* Async-signal-safe: write(2) and tcsetattr(3) only. */
static void term_restore(void)
{
	ssize_t ignored = write(STDOUT_FILENO, SHOW_CURSOR, sizeof(SHOW_CURSOR) - 1);

	(void)ignored;
	if (g_tty_set)
		tcsetattr(STDIN_FILENO, TCSANOW, &g_saved);
}

/* Cursor hidden; keys typed are not echoed into the view. */
static void term_setup(void)
{
	struct termios t;
	ssize_t ignored = write(STDOUT_FILENO, HIDE_CURSOR, sizeof(HIDE_CURSOR) - 1);

	(void)ignored;
	if (g_tty_set) {
		t = g_saved;
		t.c_lflag &= ~(tcflag_t)(ECHO | ICANON);
		tcsetattr(STDIN_FILENO, TCSANOW, &t);
	}
}

static void on_stop_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

static void on_tstp(int sig)
{
	int e = errno;

	term_restore();
	signal(sig, SIG_DFL);
	raise(sig); /* stops here until SIGCONT */
	errno = e;
}

static void on_cont(int sig)
{
	struct sigaction sa;
	int e = errno;

	(void)sig;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_tstp;
	sigaction(SIGTSTP, &sa, NULL);
	term_setup();
	g_redraw_all = 1; /* the screen moved on meanwhile: draw afresh below it */
	errno = e;
}

static void signals_setup(bool tty)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop_signal; /* no SA_RESTART: nothing here blocks long anyway */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	if (!tty)
		return;
	sa.sa_handler = on_tstp;
	sigaction(SIGTSTP, &sa, NULL);
	sa.sa_handler = on_cont;
	sigaction(SIGCONT, &sa, NULL);
}

static void term_size(unsigned *cols, unsigned *rows)
{
	struct winsize ws;

	*cols = 80;
	*rows = 24;
	if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col && ws.ws_row) {
		*cols = ws.ws_col;
		*rows = ws.ws_row;
	}
}

/* ---- what the view knows ---------------------------------------------- */

static struct track *track_find(struct view *v, uint64_t id)
{
	for (size_t i = 0; i < v->n; i++)
		if (v->t[i].id == id)
			return &v->t[i];
	return NULL;
}

static struct track *track_add(struct view *v, const Ckpt__V1__SaveInfo *s)
{
	struct track *t;

	if (v->n == v->cap) {
		size_t cap = v->cap ? v->cap * 2 : 16;
		struct track *nt = realloc(v->t, cap * sizeof(*nt));

		if (!nt)
			return NULL;
		v->t = nt;
		v->cap = cap;
	}
	t = &v->t[v->n++];
	memset(t, 0, sizeof(*t));
	t->id = s->save_id;
	snprintf(t->job, sizeof(t->job), "%s", s->job);
	t->step = s->step;
	t->rank = s->rank;
	t->world = s->world;
	t->queued_unix_ns = s->queued_unix_ns;
	return t;
}

static void recent_add(struct view *v, const Ckpt__V1__SaveInfo *s, int64_t done_ns)
{
	struct recent *r = NULL;

	for (size_t i = 0; i < v->nr; i++)
		if (v->r[i].step == s->step && strcmp(v->r[i].job, s->job) == 0)
			r = &v->r[i];
	if (!r) {
		if (v->nr == RECENT)
			memmove(&v->r[0], &v->r[1], (RECENT - 1) * sizeof(v->r[0]));
		else
			v->nr++;
		r = &v->r[v->nr - 1];
		memset(r, 0, sizeof(*r));
		snprintf(r->job, sizeof(r->job), "%s", s->job);
		r->step = s->step;
		r->world = s->world;
		r->state = s->state;
	}
	r->ranks++;
	r->bytes += s->bytes_total;
	r->done_unix_ns = done_ns;
	if (s->state == CKPT__V1__STATE__STATE_FAILED || s->state == CKPT__V1__STATE__STATE_SKIPPED)
		r->state = s->state; /* one rank failing fails the checkpoint */
	if (s->reason && *s->reason && !r->reason[0])
		snprintf(r->reason, sizeof(r->reason), "%s", s->reason);
	r->capture = s->capture_seconds > r->capture ? s->capture_seconds : r->capture;
	r->durable = s->durable_seconds > r->durable ? s->durable_seconds : r->durable;
	r->commit = s->commit_seconds > r->commit ? s->commit_seconds : r->commit;
}

static void view_event(struct view *v, const Ckpt__V1__SaveInfo *s)
{
	struct track *t = track_find(v, s->save_id);

	v->events++;
	if (ipc_state_final(s->state)) {
		if (t)
			*t = v->t[--v->n];
		recent_add(v, s, unix_ns());
		return;
	}
	if (!t && !(t = track_add(v, s)))
		return;
	t->state = s->state;
	t->total = s->bytes_total;
	t->captured = s->bytes_captured;
	t->written = s->bytes_written;
	t->durable_seconds = s->durable_seconds;
	t->pool_limited = s->pool_limited;
	ctl_parts_line(s->parts_done, s->n_parts_done, s->parts_missing, s->n_parts_missing,
	               t->parts, sizeof(t->parts));
}

/* The last committed checkpoints, from a List call, to start the view with. */
static void view_seed(struct ctl *x, struct view *v)
{
	Ckpt__V1__ListRequest req = CKPT__V1__LIST_REQUEST__INIT;
	Ckpt__V1__ListReply *r;
	Ckpt__V1__CheckpointSummary **c;
	size_t n, from;

	req.job = v->job ? (char *)v->job : "";
	if (cl_call(x->c, IPC_LIST, &req.base, (ProtobufCMessage **)&r, CL_DEFAULT_TIMEOUT_MS))
		return; /* the stream will say what is wrong */
	c = calloc(r->n_checkpoints + 1, sizeof(*c));
	n = 0;
	for (size_t i = 0; c && i < r->n_checkpoints; i++)
		if (r->checkpoints[i]->state == CKPT__V1__STATE__STATE_COMMITTED)
			c[n++] = r->checkpoints[i];
	/* by commit time: insertion sort, lists are short */
	for (size_t i = 1; i < n; i++)
		for (size_t k = i; k > 0 && c[k - 1]->time_unix_ns > c[k]->time_unix_ns; k--) {
			Ckpt__V1__CheckpointSummary *tmp = c[k];

			c[k] = c[k - 1];
			c[k - 1] = tmp;
		}
	from = n > RECENT ? n - RECENT : 0;
	for (size_t i = from; i < n; i++) {
		struct recent *e = &v->r[v->nr++];

		memset(e, 0, sizeof(*e));
		snprintf(e->job, sizeof(e->job), "%s", c[i]->job);
		e->step = c[i]->step;
		e->world = c[i]->world;
		e->ranks = (unsigned)c[i]->world;
		e->state = c[i]->state;
		e->bytes = c[i]->bytes;
		e->capture = c[i]->capture_seconds;
		e->durable = c[i]->durable_seconds;
		e->commit = c[i]->commit_seconds;
		e->done_unix_ns = c[i]->time_unix_ns;
	}
	free(c);
	protobuf_c_message_free_unpacked(&r->base, NULL);
}

/* ---- the live view ---------------------------------------------------- */

struct frame {
	char *buf;
	size_t len, cap;
	unsigned lines, max_lines, cols;
};

/* Appends n bytes; false (and the frame left as it was) when out of memory. */
static bool frame_put(struct frame *f, const char *p, size_t n)
{
	if (f->len + n > f->cap) {
		size_t cap = (f->len + n) * 2 + 256;
		char *b = realloc(f->buf, cap);

		if (!b)
			return false;
		f->buf = b;
		f->cap = cap;
	}
	memcpy(f->buf + f->len, p, n);
	f->len += n;
	return true;
}

/* One line of the frame, cut to the terminal's width (it must not wrap). */
static void frame_line(struct frame *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void frame_line(struct frame *f, const char *fmt, ...)
{
	static const char eol[] = "\033[K\n"; /* clears what an older, longer line left */
	char line[VIEW_LINE_MAX];
	va_list ap;
	size_t n;

	if (f->lines >= f->max_lines)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	n = strlen(line);
	if (n >= f->cols)
		n = f->cols ? f->cols - 1 : 0;
	if (frame_put(f, line, n) && frame_put(f, eol, sizeof(eol) - 1))
		f->lines++;
}

/*
 * What a save in flight is doing, more than its state says: QUEUED with
 * bytes copied is CAPTURING, CAPTURED is WRITING (its shard to the root),
 * DURABLE is COMMITTING (waiting for the other ranks and the manifest).
 */
static const char *phase(const struct track *t)
{
	switch (t->state) {
	case CKPT__V1__STATE__STATE_QUEUED:
		return t->captured ? "CAPTURING" : "QUEUED";
	case CKPT__V1__STATE__STATE_CAPTURED:
		return "WRITING";
	case CKPT__V1__STATE__STATE_DURABLE:
		return "COMMITTING";
	default:
		return ipc_state_name(t->state);
	}
}

/* A failed or skipped save's reason says why; another's is a note at most. */
static bool is_failure(int state)
{
	return state == CKPT__V1__STATE__STATE_FAILED || state == CKPT__V1__STATE__STATE_SKIPPED;
}

static void bar(const struct track *t, unsigned width, char *buf)
{
	unsigned w = 0, c = 0;

	if (t->total) {
		w = (unsigned)((double)t->written / (double)t->total * width);
		c = (unsigned)((double)t->captured / (double)t->total * width);
	} else if (t->state >= CKPT__V1__STATE__STATE_DURABLE) {
		w = c = width;
	}
	buf[0] = '[';
	for (unsigned i = 0; i < width; i++)
		buf[1 + i] = i < w ? '#' : i < c ? '=' : '.';
	buf[width + 1] = ']';
	buf[width + 2] = '\0';
}

/* A row of the saves in flight, as text; and how wide each column is. */
struct row {
	char step[24], rank[24], bytes[40], rate[24], age[24];
};

struct widths {
	int job, step, rank, bytes, rate, age;
	unsigned bar;
};

static void row_of(const struct track *t, int64_t now_unix, struct row *r)
{
	char done[16], total[16];

	snprintf(r->step, sizeof(r->step), "%" PRId64, t->step);
	snprintf(r->rank, sizeof(r->rank), "%d/%d", t->rank, t->world);
	short_bytes((double)t->written, done, sizeof(done));
	short_bytes((double)t->total, total, sizeof(total));
	snprintf(r->bytes, sizeof(r->bytes), "%s/%s", done, total);
	rate_text(save_rate(t->written, t->queued_unix_ns, t->durable_seconds, now_unix), r->rate,
	          sizeof(r->rate));
	ctl_human_secs(t->queued_unix_ns ? (double)(now_unix - t->queued_unix_ns) / 1e9 : 0, r->age,
	               sizeof(r->age));
}

static int widest(int w, const char *s)
{
	return (int)strlen(s) > w ? (int)strlen(s) : w;
}

/*
 * Each column as wide as its header or its widest cell (a job's name counts
 * up to 20 characters: a longer one pushes its row on); the bar gets what
 * the terminal's width leaves, BAR_MIN..BAR.
 */
static void widths_of(const struct view *v, size_t n, const struct row *rows, unsigned cols,
                      struct widths *w)
{
	int used;

	*w = (struct widths){3, 4, 4, 7, 4, 3, BAR};
	for (size_t i = 0; i < n; i++) {
		w->job = widest(w->job, v->t[i].job);
		w->step = widest(w->step, rows[i].step);
		w->rank = widest(w->rank, rows[i].rank);
		w->bytes = widest(w->bytes, rows[i].bytes);
		w->rate = widest(w->rate, rows[i].rate);
		w->age = widest(w->age, rows[i].age);
	}
	w->job = w->job > 20 ? 20 : w->job;
	/* the columns, the phase's 10, the bar's brackets, the percentage, 8 spaces between */
	used = w->job + w->step + w->rank + 10 + 2 + 4 + w->bytes + w->rate + w->age + 8;
	if (cols > 1 && (int)cols - 1 - used < BAR)
		w->bar =
		    (int)cols - 1 - used > BAR_MIN ? (unsigned)((int)cols - 1 - used) : BAR_MIN;
}

static void draw_inflight(struct frame *f, const struct view *v, int64_t now_unix, unsigned room)
{
	size_t n = v->n > room ? (room ? room - 1 : 0) : v->n; /* rows drawn */
	struct row *rows = calloc(n ? n : 1, sizeof(*rows));
	char b[BAR + 4];
	struct widths w;

	frame_line(f, "SAVES IN FLIGHT (%zu)  bar: # written, = captured", v->n);
	if (!v->n || !rows) {
		frame_line(f, "  %s", rows ? "(none)" : "(out of memory)");
		free(rows);
		return;
	}
	for (size_t i = 0; i < n; i++)
		row_of(&v->t[i], now_unix, &rows[i]);
	widths_of(v, n, rows, f->cols, &w);
	frame_line(f, "%-*s %*s %*s %-10s %-*s %4s %*s %*s %*s", w.job, "JOB", w.step, "STEP",
	           w.rank, "RANK", "STATE", (int)w.bar + 2, "PROGRESS", "", w.bytes, "WRITTEN",
	           w.rate, "RATE", w.age, "AGE");
	for (size_t i = 0; i < n; i++) {
		const struct track *t = &v->t[i];
		double pct = t->total ? 100.0 * (double)t->written / (double)t->total : 0;

		bar(t, w.bar, b);
		frame_line(f, "%-*s %*s %*s %-10s %s %3.0f%% %*s %*s %*s%s%s%s", w.job, t->job,
		           w.step, rows[i].step, w.rank, rows[i].rank, phase(t), b, pct, w.bytes,
		           rows[i].bytes, w.rate, rows[i].rate, w.age, rows[i].age,
		           t->pool_limited ? "  (streams through the pool)" : "",
		           t->parts[0] ? "  " : "", t->parts);
	}
	if (n < v->n)
		frame_line(f, "  ... and %zu more", v->n - n);
	free(rows);
}

static void draw_recent(struct frame *f, const struct view *v)
{
	char size[32], cap[16], dur[16], com[16], when[32];

	frame_line(f, "LAST CHECKPOINTS");
	if (!v->nr) {
		frame_line(f, "  (none yet)");
		return;
	}
	frame_line(f, "%-20s %10s %5s %-9s %11s %9s %9s %9s  %-19s", "JOB", "STEP", "WORLD",
	           "STATE", "SIZE", "CAPTURE", "DURABLE", "COMMIT", "FINISHED (UTC)");
	for (size_t i = v->nr; i-- > 0;) { /* newest first */
		const struct recent *r = &v->r[i];

		ctl_human_bytes(r->bytes, size, sizeof(size));
		ctl_human_secs(r->capture, cap, sizeof(cap));
		ctl_human_secs(r->durable, dur, sizeof(dur));
		ctl_human_secs(r->commit, com, sizeof(com));
		ctl_human_time(r->done_unix_ns, when, sizeof(when));
		/* only a failure's reason: a committed checkpoint's is a note for the log */
		frame_line(f, "%-20s %10" PRId64 " %5d %-9s %11s %9s %9s %9s  %-19s %s", r->job,
		           r->step, r->world, ipc_state_name(r->state), size, cap, dur, com, when,
		           is_failure(r->state) ? r->reason : "");
	}
}

static void draw(struct view *v)
{
	struct frame f = {0};
	unsigned rows, room, fixed = 7 + (unsigned)v->nr;
	int64_t now = unix_ns();
	char when[32], head[64];
	ssize_t ignored;

	term_size(&f.cols, &rows);
	f.max_lines = rows > 1 ? rows - 1 : 1; /* taller than the screen cannot be redrawn */
	/* saves in flight get the rows the header and the recent list leave */
	room = f.max_lines > fixed + 1 ? f.max_lines - fixed : 1;
	if (g_redraw_all) {
		g_redraw_all = 0;
		v->drawn = 0;
	}
	if (v->drawn) { /* back to the top of the last frame */
		snprintf(head, sizeof(head), "\r\033[%uA", v->drawn);
		frame_put(&f, head, strlen(head));
	}
	ctl_human_time(now, when, sizeof(when));
	frame_line(&f, "ckptctl watch: %s%s at %s  %s UTC  %" PRIu64 " events  (Ctrl-C quits)",
	           v->job ? "job " : "every job", v->job ? v->job : "", v->endpoint, when + 11,
	           v->events);
	frame_line(&f, "%s", "");
	draw_inflight(&f, v, now, room);
	frame_line(&f, "%s", "");
	draw_recent(&f, v);
	/* the frame may be shorter than the last one: clear below it */
	frame_put(&f, "\033[J", 3);
	if (f.buf) { /* one write: no flicker */
		ignored = write(STDOUT_FILENO, f.buf, f.len);
		(void)ignored;
	}
	v->drawn = f.lines;
	free(f.buf);
}

/* ---- line and JSON output --------------------------------------------- */

static void iso_time(int64_t ns, char *buf, size_t len)
{
	time_t t = (time_t)(ns / 1000000000);
	struct tm tm;
	char s[32];

	gmtime_r(&t, &tm);
	strftime(s, sizeof(s), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf, len, "%s.%03dZ", s, (int)(ns / 1000000 % 1000));
}

/* Text the agent sent, on one line: control characters become '?'. */
static void one_line(const char *in, char *out, size_t len)
{
	size_t i = 0;

	for (; in && in[i] && i + 1 < len; i++)
		out[i] = (unsigned char)in[i] < 0x20 || in[i] == 0x7f ? '?' : in[i];
	out[i] = '\0';
}

/* An event as one JSON object on its line. 0 or -ENOMEM. */
static int event_json(const Ckpt__V1__SaveInfo *s, const char *when, int64_t now, const char *event,
                      double bps)
{
	json_t *j;
	char *text;

	j = json_pack("{s:s, s:I, s:s, s:I, s:s, s:I, s:i, s:i, s:s, s:I, s:I, s:I, s:f, s:s, s:I, "
	              "s:f, s:f, s:f, s:b}",
	              "time", when, "time_unix_ns", (json_int_t)now, "event", event, "save_id",
	              (json_int_t)s->save_id, "job", s->job, "step", (json_int_t)s->step, "rank",
	              s->rank, "world", s->world, "state", ipc_state_name(s->state), "bytes_total",
	              (json_int_t)s->bytes_total, "bytes_captured", (json_int_t)s->bytes_captured,
	              "bytes_written", (json_int_t)s->bytes_written, "bytes_per_second", bps,
	              "reason", s->reason ? s->reason : "", "queued_unix_ns",
	              (json_int_t)s->queued_unix_ns, "capture_seconds", s->capture_seconds,
	              "durable_seconds", s->durable_seconds, "commit_seconds", s->commit_seconds,
	              "pool_limited", s->pool_limited);
	if (j && (s->n_parts_done || s->n_parts_missing)) {
		json_object_set_new(j, "parts_done", ctl_strings(s->parts_done, s->n_parts_done));
		json_object_set_new(j, "parts_missing",
		                    ctl_strings(s->parts_missing, s->n_parts_missing));
	}
	text = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;

	json_decref(j);
	if (!text)
		return -ENOMEM;
	printf("%s\n", text);
	free(text);
	return 0;
}

/* An event as one line for people: the state, bytes, rate, parts and reason. */
static void event_line(const Ckpt__V1__SaveInfo *s, const char *when, const char *event, double bps)
{
	char reason[IPC_ERRLEN], rate[32];

	one_line(s->reason, reason, sizeof(reason));
	rate_text(bps, rate, sizeof(rate));
	printf("%s %-8s job=%s step=%" PRId64 " rank=%d/%d state=%s bytes=%" PRIu64 "/%" PRIu64
	       " captured=%" PRIu64 " rate=%s",
	       when, event, s->job, s->step, s->rank, s->world, ipc_state_name(s->state),
	       s->bytes_written, s->bytes_total, s->bytes_captured, rate);
	if (s->state == CKPT__V1__STATE__STATE_COMMITTED)
		printf(" capture=%.3fs durable=%.3fs commit=%.3fs", s->capture_seconds,
		       s->durable_seconds, s->commit_seconds);
	if (s->n_parts_done || s->n_parts_missing) {
		char parts[1024], safe[1024];

		ctl_parts_line(s->parts_done, s->n_parts_done, s->parts_missing, s->n_parts_missing,
		               parts, sizeof(parts));
		one_line(parts, safe, sizeof(safe));
		printf(" %s", safe);
	}
	if (reason[0]) /* why, for a failure; else a note (e.g. LATEST not moved) */
		printf(" %s: %s", is_failure((int)s->state) ? "reason" : "note", reason);
	putchar('\n');
}

static int print_event(const struct ctl *x, const Ckpt__V1__SaveInfo *s)
{
	int64_t now = unix_ns();
	char when[40];
	const char *event = s->progress ? "progress" : "state";
	double bps = save_rate(s->bytes_written, s->queued_unix_ns, s->durable_seconds, now);
	int rc;

	iso_time(now, when, sizeof(when));
	if (x->json) {
		if ((rc = event_json(s, when, now, event, bps)))
			return rc;
	} else {
		event_line(s, when, event, bps);
	}
	/* At once: whoever reads a pipe wants the event now, not a buffer later. */
	return fflush(stdout) == 0 ? 0 : -errno;
}

/* ---- the command ------------------------------------------------------ */

/*
 * The events until a signal stops us, the stream ends or stdout fails: each
 * drawn in the live view (redrawn every REDRAW_MS), or printed. The exit
 * status; the stream's last answer in *rcp, the last print's in *outp.
 */
static int watch_events(const struct ctl *x, struct view *v, struct cl_stream *s, bool live,
                        int *rcp, int *outp)
{
	ProtobufCMessage *m;
	int64_t next_draw = 0;
	int rc = 0, out = 0, status = 0;

	while (!g_stop) {
		if (live && mono_ns() >= next_draw) {
			draw(v);
			next_draw = mono_ns() + (int64_t)REDRAW_MS * 1000000;
		}
		rc = cl_stream_next(s, &m, REDRAW_MS);
		if (rc == -ETIMEDOUT)
			continue;
		if (rc <= 0) {
			if (g_stop)
				break; /* the call was cut by our own signal: not an error */
			status = 1;
			break;
		}
		if (live)
			view_event(v, (Ckpt__V1__SaveInfo *)m);
		else
			out = print_event(x, (Ckpt__V1__SaveInfo *)m);
		protobuf_c_message_free_unpacked(m, NULL);
		if (out < 0) {
			status = 1; /* stdout is gone */
			break;
		}
	}
	*rcp = rc;
	*outp = out;
	return status;
}

int ctl_watch(struct ctl *x, int argc, char **argv)
{
	Ckpt__V1__WatchRequest req = CKPT__V1__WATCH_REQUEST__INIT;
	struct view v = {0};
	struct cl_stream *s = NULL;
	char err[IPC_ERRLEN];
	bool live = !x->json && isatty(STDOUT_FILENO);
	int rc, out = 0, status;

	if (argc > 1)
		return ctl_usage_error(x, "watch", "takes 1 argument: '%s' is one too many",
		                       argv[1]);
	if (argc && ipc_check_job(argv[0], err))
		return ctl_usage_error(x, "watch", "%s", err);
	v.job = argc ? argv[0] : NULL;
	v.endpoint = cl_endpoint(x->c);
	req.job = argc ? argv[0] : "";
	signals_setup(live);
	rc = cl_stream_open(x->c, IPC_WATCH, &req.base, &s);
	if (rc)
		return ctl_fail(x, rc);
	if (live) {
		g_tty_set = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &g_saved) == 0;
		view_seed(x, &v);
		term_setup();
	}
	status = watch_events(x, &v, s, live, &rc, &out);
	if (live)
		term_restore();
	if (out < 0)
		fprintf(stderr, "ckptctl: watch: writing to stdout: %s\n", strerror(-out));
	else if (status && rc == 0)
		fprintf(stderr, "ckptctl: watch: the agent ended the stream\n");
	else if (status)
		ctl_fail(x, rc);
	cl_stream_close(s);
	free(v.t);
	return status;
}
