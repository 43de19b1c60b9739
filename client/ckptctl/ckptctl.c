/*
 * ckptctl: the operator's view of ckptd.
 *
 *   ckptctl [--endpoint E] [--json] COMMAND [ARGS]   (the commands: `commands` below)
 *   ckptctl help [COMMAND] | COMMAND --help | --version
 *
 * Tables for people, JSON (--json) for programs, errors included (an object
 * {"error", "errno", "code"} on stdout). Exit status: 0 ok, 1 the operation
 * failed (or verify found damage), 2 bad usage (a JOB or STEP the agent
 * would refuse included: checked here by its rules, nothing sent). A STEP
 * may be "latest": the step LATEST names, asked of the agent first.
 */
#define _GNU_SOURCE /* strerrorname_np */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "ckptctl.h"

static int cmd_status(struct ctl *x, int argc, char **argv);
static int cmd_list(struct ctl *x, int argc, char **argv);
static int cmd_verify(struct ctl *x, int argc, char **argv);
static int cmd_delete(struct ctl *x, int argc, char **argv);
static int cmd_pin(struct ctl *x, int argc, char **argv);
static int cmd_unpin(struct ctl *x, int argc, char **argv);
static int cmd_gc(struct ctl *x, int argc, char **argv);
static int cmd_commit(struct ctl *x, int argc, char **argv);

/* The commands: what `help` prints, and what a usage error names. */
static const struct ctl_cmd {
	const char *name, *args, *what;
	int (*fn)(struct ctl *x, int argc, char **argv);
} commands[] = {
    {"status", "", "the agent: I/O path, staging pool, saves, last error", cmd_status},
    {"list", "[JOB]", "committed checkpoints (and those in flight)", cmd_list},
    {"show", "[--full] [--tier T] JOB STEP",
     "one checkpoint: its summary; with --full (or --json) every rank, tensor and chunk, "
     "streamed (T: root, the default, or upload: the upload tier)",
     ctl_show},
    {"verify", "[--tier T] JOB STEP",
     "read every byte back and check every checksum (T: root, the default, or upload)", cmd_verify},
    {"delete", "[--force] JOB STEP",
     "remove a checkpoint (the one LATEST names only with --force: LATEST then moves back to "
     "the newest before it)",
     cmd_delete},
    {"watch", "[JOB]",
     "saves in flight, live (Ctrl-C quits); one line per event when stdout is not a terminal",
     ctl_watch},
    {"pin", "JOB STEP", "keep a checkpoint whatever the retention policy says", cmd_pin},
    {"unpin", "JOB STEP", "let retention remove it again", cmd_unpin},
    {"gc", "JOB", "apply the retention policy to JOB now", cmd_gc},
    {"commit", "--finish JOB STEP",
     "commit a step whose parts are all in the root (the agent that was to commit it is gone)",
     cmd_commit},
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static const struct ctl_cmd *cmd_named(const char *name)
{
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

/* "what" folded to lines of at most 56 columns, each indented by `indent`. */
static void print_folded(FILE *f, const char *what, int indent)
{
	const char *p = what;

	while (*p) {
		int n = (int)strlen(p);

		if (n > 56) {
			n = 56;
			while (n > 0 && p[n] != ' ')
				n--;
			if (n == 0)
				n = 56;
		}
		fprintf(f, "%*s%.*s\n", indent, "", n, p);
		p += n;
		while (*p == ' ')
			p++;
	}
}

void ctl_usage(FILE *f)
{
	fprintf(f, "usage: ckptctl [--endpoint E] [--json] COMMAND [ARGS]\n"
	           "       ckptctl help [COMMAND] | COMMAND --help | --version\n\n");
	for (size_t i = 0; i < NCOMMANDS; i++) {
		fprintf(f, "  %s%s%s\n", commands[i].name, *commands[i].args ? " " : "",
		        commands[i].args);
		print_folded(f, commands[i].what, 6);
	}
	fprintf(f, "\nSTEP: a step number, or latest (the step LATEST names).\n"
	           "endpoint: --endpoint, else $CKPT_ENDPOINT, else " IPC_DEFAULT_ENDPOINT "\n"
	           "--json: JSON on stdout, errors included. Exit status: 0 done, 1 failed,\n"
	           "2 bad usage (nothing sent). man ckptctl says more.\n");
}

static void cmd_help(const struct ctl_cmd *c, FILE *f)
{
	fprintf(f, "usage: ckptctl [--endpoint E] [--json] %s%s%s\n\n", c->name,
	        *c->args ? " " : "", c->args);
	print_folded(f, c->what, 0);
	if (strstr(c->args, "STEP"))
		fprintf(f, "\nSTEP: a step number, or latest (the step LATEST names).\n");
}

/*
 * An error of ckptctl's own: on stderr, or as {"error", "errno", "code"} on
 * stdout with --json. Returns status.
 */
int ctl_error(const struct ctl *x, int status, int err, const char *fmt, ...)
{
	char msg[2048]; /* libckpt's last error is 1024 bytes at most */
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (x && x->json) {
		/* JSON strings are UTF-8: a byte an argument brought that is not ASCII, as '?' */
		for (char *c = msg; *c; c++)
			if ((unsigned char)*c >= 0x80 || (unsigned char)*c < 0x20)
				*c = '?';
		const char *code = err ? strerrorname_np(err < 0 ? -err : err) : NULL;

		ctl_print_json(json_pack("{s:s, s:i, s:s?, s:i}", "error", msg, "errno",
		                         err < 0 ? -err : err, "code", code, "status", status));
	} else {
		fprintf(stderr, "ckptctl: %s\n", msg);
	}
	return status;
}

/* A usage error of command `name`: what is wrong, and its usage line. */
int ctl_usage_error(const struct ctl *x, const char *name, const char *fmt, ...)
{
	const struct ctl_cmd *c = cmd_named(name);
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return ctl_error(x, EXIT_USAGE, EINVAL, "%s %s (usage: ckptctl %s%s%s; ckptctl %s --help)",
	                 name, msg, name, c && *c->args ? " " : "", c ? c->args : "", name);
}

/*
 * argc positional arguments of command `name` against its words (`names`,
 * min of them required): false, and what is missing or extra said.
 */
bool ctl_args_ok(const struct ctl *x, const char *name, int argc, char **argv, int min, int max,
                 const char *const names[])
{
	if (argc < min) {
		char missing[128] = "";
		size_t o = 0;

		for (int i = argc; i < min && o < sizeof(missing); i++)
			o += (size_t)snprintf(missing + o, sizeof(missing) - o, "%s%s",
			                      i > argc ? " and " : "", names[i]);
		ctl_usage_error(x, name, "needs %s", missing);
		return false;
	}
	if (argc > max) {
		ctl_usage_error(x, name, "takes %d argument%s: '%s' is one too many", max,
		                max == 1 ? "" : "s", argv[max]);
		return false;
	}
	return true;
}

void ctl_human_bytes(uint64_t n, char *buf, size_t len)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double v = (double)n;
	int u = 0;

	while (v >= 1024 && u < 5) {
		v /= 1024;
		u++;
	}
	snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

void ctl_human_time(int64_t unix_ns, char *buf, size_t len)
{
	time_t t = (time_t)(unix_ns / 1000000000);
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
}

void ctl_human_secs(double s, char *buf, size_t len)
{
	if (s <= 0)
		snprintf(buf, len, "-");
	else if (s < 1)
		snprintf(buf, len, "%.0f ms", s * 1e3);
	else
		snprintf(buf, len, "%.2f s", s);
}

int ctl_print_json(json_t *j)
{
	int rc = json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);

	putchar('\n');
	json_decref(j);
	return rc ? 1 : 0;
}

int ctl_fail(struct ctl *x, int rc)
{
	return ctl_error(x, 1, rc, "%s",
	                 *ckpt_last_error(x->c) ? ckpt_last_error(x->c) : ckpt_strerror(rc));
}

/*
 * A JOB argument, by the agent's own rules (ipc_check_job): false, and the
 * message with the offending byte's offset, for one it would refuse.
 */
static bool job_ok(const struct ctl *x, const char *job)
{
	char err[IPC_ERRLEN];

	if (ipc_check_job(job, err) == 0)
		return true;
	ctl_error(x, EXIT_USAGE, EINVAL, "%s", err);
	return false;
}

#define LIST_PAGE 1000 /* checkpoints asked per List (the agent may send fewer) */

/*
 * Every checkpoint List gives of job ("": all), a page at a time (an agent
 * older than paging sends them all at once): fn(ctx, reply) for each page,
 * which stops the walk by returning non-zero. 0, fn's value, or the call's
 * error (said).
 */
static int list_pages(struct ctl *x, const char *job,
                      int (*fn)(void *ctx, const Ckpt__V1__ListReply *r), void *ctx)
{
	Ckpt__V1__ListRequest req = CKPT__V1__LIST_REQUEST__INIT;
	Ckpt__V1__ListReply *r;
	char token[IPC_MAX_JOB + 32] = "";
	int rc;

	req.job = (char *)job;
	req.limit = LIST_PAGE;
	do {
		req.page_token = token;
		rc = cl_call(x->c, IPC_LIST, &req.base, (ProtobufCMessage **)&r,
		             CL_DEFAULT_TIMEOUT_MS);
		if (rc) {
			ctl_fail(x, rc);
			return rc;
		}
		rc = fn(ctx, r);
		if (!rc && r->next_page_token && *r->next_page_token &&
		    strcmp(r->next_page_token, token) == 0) {
			ctl_error(x, 1, EPROTO,
			          "list: the agent gave the same page token twice (%s)", token);
			rc = -EPROTO;
		}
		snprintf(token, sizeof(token), "%s", r->next_page_token ? r->next_page_token : "");
		protobuf_c_message_free_unpacked(&r->base, NULL);
	} while (!rc && token[0]);
	return rc;
}

struct latest_find {
	const char *job;
	int64_t step;
	bool found;
};

static int latest_page(void *ctx, const Ckpt__V1__ListReply *r)
{
	struct latest_find *f = ctx;

	for (size_t i = 0; i < r->n_checkpoints; i++)
		if (r->checkpoints[i]->latest && strcmp(r->checkpoints[i]->job, f->job) == 0) {
			f->step = r->checkpoints[i]->step;
			f->found = true;
		}
	return 0;
}

/* The step List says is job's LATEST; 0, -ENOENT (not said) or the call's error (said). */
static int latest_of(struct ctl *x, const char *job, int64_t *step)
{
	struct latest_find f = {.job = job};
	int rc = list_pages(x, job, latest_page, &f);

	if (rc)
		return rc;
	if (!f.found)
		return -ENOENT;
	*step = f.step;
	return 0;
}

/*
 * JOB and STEP (argv[0], argv[1]) of command `name`: checked, STEP a number
 * or "latest" (asked of the agent). 0, or the exit status (said).
 */
int ctl_job_step(struct ctl *x, const char *name, char **argv, int64_t *step)
{
	char *end;
	long long v;

	if (!job_ok(x, argv[0]))
		return EXIT_USAGE;
	if (strcmp(argv[1], "latest") == 0) {
		int rc = latest_of(x, argv[0], step);

		if (rc == -ENOENT)
			return ctl_error(
			    x, 1, ENOENT,
			    "job %s has no LATEST (no committed checkpoint; ckptctl list "
			    "shows the jobs)",
			    argv[0]);
		return rc ? 1 : 0;
	}
	errno = 0;
	v = strtoll(argv[1], &end, 10);
	if (errno || end == argv[1] || *end || v < 0 || v > IPC_MAX_STEP)
		return ctl_usage_error(x, name, "'%s' is not a step (0..%lld, or latest)", argv[1],
		                       (long long)IPC_MAX_STEP);
	*step = v;
	return 0;
}

/* ---- status ----------------------------------------------------------- */

json_t *ctl_strings(char **v, size_t n)
{
	json_t *a = json_array();

	for (size_t i = 0; i < n; i++)
		json_array_append_new(a, json_string(v[i]));
	return a;
}

static json_t *status_json(const Ckpt__V1__StatusReply *r)
{
	json_t *saves = json_object(), *flight = json_array(), *j;

	for (size_t i = 0; i < r->n_in_flight; i++)
		json_array_append_new(flight, ctl_summary_json(r->in_flight[i]));
	for (size_t i = 0; i < r->n_saves; i++)
		json_object_set_new(saves, ipc_state_name(r->saves[i]->state),
		                    json_integer((json_int_t)r->saves[i]->count));
	j = json_pack(
	    "{s:s, s:I, s:f, s:s, s:s, s:{s:s, s:s, s:I, s:I, s:I, s:I}, "
	    "s:{s:I, s:I, s:I, s:b, s:b, s:s}, s:{s:i, s:i, s:i}, s:o, s:s, s:s, s:i, "
	    "s:{s:i, s:I, s:I}}",
	    "version", r->version, "pid", (json_int_t)r->pid, "uptime_seconds", r->uptime_seconds,
	    "root", r->root, "listen", r->listen, "io", "engine", r->io_engine, "detail",
	    r->io_detail, "bytes_written", (json_int_t)r->bytes_written, "bytes_read",
	    (json_int_t)r->bytes_read, "errors", (json_int_t)r->io_errors, "retries",
	    (json_int_t)r->io_retries, "pool", "bytes", (json_int_t)r->pool_bytes, "used_bytes",
	    (json_int_t)r->pool_used_bytes, "chunk_bytes", (json_int_t)r->chunk_bytes, "locked",
	    r->pool_locked, "registered", r->pool_registered, "detail", r->pool_detail, "clients",
	    "sessions", r->sessions, "plans", r->plans, "saves_in_flight", r->saves_in_flight,
	    "saves", saves, "last_error", r->last_error, "gpu", r->gpu, "removed_at_start",
	    r->removed_at_start, "retention", "keep_last", (int)r->keep_last, "keep_every",
	    (json_int_t)r->keep_every, "removed", (json_int_t)r->gc_removed);
	json_object_set_new(j, "cluster",
	                    json_pack("{s:s, s:i, s:i, s:i}", "node", r->node, "commit_deadline",
	                              (int)r->commit_deadline, "abandon_after",
	                              (int)r->abandon_after, "kept_at_start",
	                              (int)r->kept_at_start));
	json_object_set_new(j, "in_flight", flight);
	json_object_set_new(j, "restores",
	                    json_pack("{s:I, s:I}", "delivered_bytes",
	                              (json_int_t)r->restored_bytes, "read_bytes",
	                              (json_int_t)r->restore_read_bytes));
	if (*r->upload_root)
		json_object_set_new(
		    j, "upload",
		    json_pack("{s:s, s:s}", "root", r->upload_root, "detail", r->upload_detail));
	json_object_set_new(j, "root_state",
	                    json_pack("{s:s, s:I, s:s}", "state", r->root_state, "since_unix_ns",
	                              (json_int_t)r->root_since_unix_ns, "error", r->root_error));
	return j;
}

static void status_table(const Ckpt__V1__StatusReply *r, const char *endpoint)
{
	char a[32], b[32], c[32];
	int up = (int)r->uptime_seconds;

	printf("ckptd %s, pid %" PRId64 ", up %dh%02dm%02ds\n", r->version, r->pid, up / 3600,
	       up / 60 % 60, up % 60);
	printf("%-12s %s\n", "endpoint", endpoint);
	printf("%-12s %s (commit deadline %u s; uncommitted steps abandoned after %u s)\n", "node",
	       r->node, r->commit_deadline, r->abandon_after);
	if (!*r->root_state || strcmp(r->root_state, "ok") == 0) {
		printf("%-12s %s\n", "root", r->root);
	} else {
		ctl_human_time(r->root_since_unix_ns, a, sizeof(a));
		printf("%-12s %s: %s since %s UTC: %s\n", "root", r->root, r->root_state, a,
		       r->root_error);
	}
	printf("%-12s %s (%s)\n", "I/O", r->io_engine, r->io_detail);
	if (*r->upload_root)
		printf("%-12s %s (%s)\n", "upload tier", r->upload_root, r->upload_detail);
	ctl_human_bytes(r->pool_bytes, a, sizeof(a));
	ctl_human_bytes(r->pool_used_bytes, b, sizeof(b));
	ctl_human_bytes(r->chunk_bytes, c, sizeof(c));
	printf("%-12s %s in %s chunks, %s in use, %s (%s)\n", "staging", a, c, b,
	       r->pool_locked ? "locked" : "not locked", r->pool_detail);
	printf("%-12s %u sessions, %u plans, %u saves in flight\n", "clients", r->sessions,
	       r->plans, r->saves_in_flight);
	ctl_human_bytes(r->bytes_written, a, sizeof(a));
	ctl_human_bytes(r->bytes_read, b, sizeof(b));
	printf("%-12s %s written, %s read, %" PRIu64 " I/O errors, %" PRIu64 " retries\n", "bytes",
	       a, b, r->io_errors, r->io_retries);
	if (r->restored_bytes) {
		ctl_human_bytes(r->restored_bytes, a, sizeof(a));
		ctl_human_bytes(r->restore_read_bytes, b, sizeof(b));
		printf("%-12s %s into trainers, %s read for them\n", "restores", a, b);
	}
	printf("%-12s", "saves");
	for (size_t i = 0; i < r->n_saves; i++)
		printf(" %s %" PRIu64, ipc_state_name(r->saves[i]->state), r->saves[i]->count);
	printf("\n%-12s %s\n", "GPU", r->gpu);
	if (r->removed_at_start || r->kept_at_start)
		printf("%-12s %u uncommitted steps removed at start, %u left to their nodes\n",
		       "recovery", r->removed_at_start, r->kept_at_start);
	if (r->keep_last && r->keep_every)
		printf("%-12s the last %u of each job, every step that is a multiple of %" PRId64
		       ", LATEST and pinned ones; %" PRIu64 " removed since start\n",
		       "retention", r->keep_last, r->keep_every, r->gc_removed);
	else if (r->keep_last)
		printf("%-12s the last %u of each job, LATEST and pinned ones; %" PRIu64
		       " removed since start\n",
		       "retention", r->keep_last, r->gc_removed);
	else
		printf("%-12s off: every checkpoint is kept (--keep-last K turns it on)\n",
		       "retention");
	printf("%-12s %s\n", "last error", *r->last_error ? r->last_error : "-");
	if (r->n_in_flight) {
		printf("\nin flight\n");
		for (size_t i = 0; i < r->n_in_flight; i++)
			ctl_summary_row(r->in_flight[i]);
	}
}

static int cmd_status(struct ctl *x, int argc, char **argv)
{
	Ckpt__V1__StatusRequest req = CKPT__V1__STATUS_REQUEST__INIT;
	Ckpt__V1__StatusReply *r;
	int rc;

	if (!ctl_args_ok(x, "status", argc, argv, 0, 0, NULL))
		return EXIT_USAGE;
	rc = cl_call(x->c, IPC_STATUS, &req.base, (ProtobufCMessage **)&r, CL_DEFAULT_TIMEOUT_MS);
	if (rc)
		return ctl_fail(x, rc);
	if (x->json)
		rc = ctl_print_json(status_json(r));
	else
		status_table(r, cl_endpoint(x->c));
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return rc;
}

/* ---- list ------------------------------------------------------------- */

json_t *ctl_summary_json(const Ckpt__V1__CheckpointSummary *s)
{
	json_t *j = json_pack(
	    "{s:s, s:I, s:s, s:s, s:i, s:I, s:I, s:b, s:b, s:i, s:f, s:f, s:f, s:s}", "job", s->job,
	    "step", (json_int_t)s->step, "run", s->run, "state", ipc_state_name(s->state), "world",
	    s->world, "bytes", (json_int_t)s->bytes, "time_unix_ns", (json_int_t)s->time_unix_ns,
	    "latest", s->latest, "pinned", s->pinned, "tensors", s->tensors, "capture_seconds",
	    s->capture_seconds, "durable_seconds", s->durable_seconds, "commit_seconds",
	    s->commit_seconds, "reason", s->reason ? s->reason : "");

	if (s->state == CKPT__V1__STATE__STATE_COMMITTED) {
		json_object_set_new(j, "nodes", json_integer(s->nodes));
		json_object_set_new(j, "damaged", json_boolean(s->damaged));
	}
	if (s->upload && *s->upload) /* queued, pending, not uploaded: reason says more */
		json_object_set_new(j, "upload", json_string(s->upload));
	if (s->n_parts)
		json_object_set_new(j, "parts", ctl_strings(s->parts, s->n_parts));
	if (s->n_parts_done || s->n_parts_missing) {
		json_object_set_new(j, "parts_done", ctl_strings(s->parts_done, s->n_parts_done));
		json_object_set_new(j, "parts_missing",
		                    ctl_strings(s->parts_missing, s->n_parts_missing));
	}
	return j;
}

/* "parts in: n0, n1; missing: n2 (ranks 4,5)" for a step in flight. */
void ctl_parts_line(char **done, size_t ndone, char **missing, size_t nmissing, char *buf,
                    size_t len)
{
	size_t o = 0;

	buf[0] = '\0';
	if (!ndone && !nmissing)
		return;
	o += (size_t)snprintf(buf + o, len - o, "parts in:");
	for (size_t i = 0; i < ndone && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s %s", i ? "," : "", done[i]);
	if (!ndone && o < len)
		o += (size_t)snprintf(buf + o, len - o, " none");
	if (nmissing && o < len)
		o += (size_t)snprintf(buf + o, len - o, "; missing:");
	for (size_t i = 0; i < nmissing && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s %s", i ? "," : "", missing[i]);
}

void ctl_summary_row(const Ckpt__V1__CheckpointSummary *s)
{
	char size[32], when[32] = "-", cap[16], dur[16], com[16];

	ctl_human_bytes(s->bytes, size, sizeof(size));
	if (s->time_unix_ns)
		ctl_human_time(s->time_unix_ns, when, sizeof(when));
	ctl_human_secs(s->capture_seconds, cap, sizeof(cap));
	ctl_human_secs(s->durable_seconds, dur, sizeof(dur));
	ctl_human_secs(s->commit_seconds, com, sizeof(com));
	printf("%-20s %12" PRId64 " %-10s %5d %11s  %-19s %9s %9s %9s %s%s%s\n", s->job, s->step,
	       s->damaged ? "DAMAGED" : ipc_state_name(s->state), s->world, size, when, cap, dur,
	       com, s->latest ? "LATEST " : "", s->pinned ? "pinned " : "",
	       s->reason && *s->reason ? s->reason : "");
	if (s->n_parts_done || s->n_parts_missing) {
		char parts[1024];

		ctl_parts_line(s->parts_done, s->n_parts_done, s->parts_missing, s->n_parts_missing,
		               parts, sizeof(parts));
		printf("%20s %s\n", "", parts);
	}
}

/* What cmd_list prints as the pages come: a row each, or a JSON array. */
struct list_print {
	json_t *all; /* --json */
	size_t n;
};

static int list_page(void *ctx, const Ckpt__V1__ListReply *r)
{
	struct list_print *p = ctx;

	for (size_t i = 0; i < r->n_checkpoints; i++) {
		if (p->all) {
			json_array_append_new(p->all, ctl_summary_json(r->checkpoints[i]));
			continue;
		}
		if (p->n + i == 0)
			printf("%-20s %12s %-10s %5s %11s  %-19s %9s %9s %9s\n", "JOB", "STEP",
			       "STATE", "WORLD", "SIZE", "COMMITTED (UTC)", "CAPTURE", "DURABLE",
			       "COMMIT");
		ctl_summary_row(r->checkpoints[i]);
	}
	p->n += r->n_checkpoints;
	return 0;
}

static int cmd_list(struct ctl *x, int argc, char **argv)
{
	struct list_print p = {NULL, 0};

	if (!ctl_args_ok(x, "list", argc, argv, 0, 1, NULL) || (argc && !job_ok(x, argv[0])))
		return EXIT_USAGE;
	p.all = x->json ? json_array() : NULL;
	/* a page at a time: a job of many steps never needs a message past the limit */
	if (list_pages(x, argc ? argv[0] : "", list_page, &p)) {
		json_decref(p.all);
		return 1;
	}
	if (p.all)
		return ctl_print_json(json_pack("{s:o}", "checkpoints", p.all));
	if (p.n == 0)
		printf("no checkpoints%s%s\n", argc ? " for job " : "", argc ? argv[0] : "");
	return 0;
}

bool ctl_take_tier(const struct ctl *x, const char *name, int *argc, char ***argv, char **tier)
{
	if (*argc < 1 || strncmp((*argv)[0], "--tier", 6) != 0)
		return true;
	if ((*argv)[0][6] == '=') {
		*tier = (*argv)[0] + 7;
		(*argc)--, (*argv)++;
	} else if (!(*argv)[0][6] && *argc >= 2) {
		*tier = (*argv)[1];
		*argc -= 2, *argv += 2;
	} else {
		ctl_usage_error(x, name, "--tier needs a tier (root or upload)");
		return false;
	}
	if (strcmp(*tier, "root") != 0 && strcmp(*tier, "upload") != 0) {
		ctl_usage_error(x, name, "--tier %s: expected root or upload", *tier);
		return false;
	}
	return true;
}

const char *const ctl_job_step_names[] = {"JOB", "STEP"};

/* ---- verify and delete ------------------------------------------------ */

static int cmd_verify(struct ctl *x, int argc, char **argv)
{
	Ckpt__V1__VerifyRequest req = CKPT__V1__VERIFY_REQUEST__INIT;
	Ckpt__V1__VerifyReply *r;
	char size[32];
	int rc;

	if (!ctl_take_tier(x, "verify", &argc, &argv, &req.tier) ||
	    !ctl_args_ok(x, "verify", argc, argv, 2, 2, ctl_job_step_names))
		return EXIT_USAGE;
	if ((rc = ctl_job_step(x, "verify", argv, &req.step)))
		return rc;
	req.job = argv[0];
	if (!x->json && isatty(STDERR_FILENO))
		fprintf(stderr, "verifying %s step %" PRId64 " (reading every byte)...\n", req.job,
		        req.step);
	rc = cl_call(x->c, IPC_VERIFY, &req.base, (ProtobufCMessage **)&r, CL_NO_TIMEOUT);
	if (rc)
		return ctl_fail(x, rc);
	if (x->json) {
		json_t *p = json_array();

		for (size_t i = 0; i < r->n_problems; i++)
			json_array_append_new(p, json_string(r->problems[i]));
		ctl_print_json(json_pack("{s:s, s:I, s:b, s:I, s:i, s:o, s:I}", "job", req.job,
		                         "step", (json_int_t)req.step, "ok", r->ok, "bytes_checked",
		                         (json_int_t)r->bytes_checked, "tensors_checked",
		                         r->tensors_checked, "problems", p, "more_problems",
		                         (json_int_t)r->more_problems));
	} else {
		ctl_human_bytes(r->bytes_checked, size, sizeof(size));
		printf("%s step %" PRId64 ": %s (%u tensors, %s read and checked)\n", req.job,
		       req.step, r->ok ? "OK" : "CORRUPT", r->tensors_checked, size);
		for (size_t i = 0; i < r->n_problems; i++)
			printf("  %s\n", r->problems[i]);
		if (r->more_problems)
			printf("  ... and %" PRIu64 " more problem%s (not listed)\n",
			       r->more_problems, r->more_problems == 1 ? "" : "s");
	}
	rc = r->ok ? 0 : 1;
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return rc;
}

static int cmd_delete(struct ctl *x, int argc, char **argv)
{
	Ckpt__V1__DeleteRequest req = CKPT__V1__DELETE_REQUEST__INIT;
	ProtobufCMessage *r;
	bool force = argc && strcmp(argv[0], "--force") == 0;
	int64_t latest;
	int rc;

	if (force)
		argc--, argv++;
	if (!ctl_args_ok(x, "delete", argc, argv, 2, 2, ctl_job_step_names))
		return EXIT_USAGE;
	if ((rc = ctl_job_step(x, "delete", argv, &req.step)))
		return rc;
	req.job = argv[0];
	/* LATEST moving back is not to happen by a slip: the agent is asked first */
	if (!force && (rc = latest_of(x, req.job, &latest)) != -ENOENT) {
		if (rc)
			return 1;
		if (latest == req.step)
			return ctl_error(x, EXIT_USAGE, EBUSY,
			                 "job %s step %" PRId64
			                 " is the one LATEST names: deleting it "
			                 "moves LATEST back to the newest step before it; say "
			                 "ckptctl delete --force %s %" PRId64 " to do that",
			                 req.job, req.step, req.job, req.step);
	}
	rc = cl_call(x->c, IPC_DELETE, &req.base, &r, CL_DEFAULT_TIMEOUT_MS);
	if (rc)
		return ctl_fail(x, rc);
	protobuf_c_message_free_unpacked(r, NULL);
	if (x->json)
		return ctl_print_json(json_pack("{s:s, s:I, s:b}", "job", req.job, "step",
		                                (json_int_t)req.step, "deleted", 1));
	printf("deleted %s step %" PRId64 "\n", req.job, req.step);
	return 0;
}

/* ---- retention: pin, unpin, gc ---------------------------------------- */

static int pin_or_unpin(struct ctl *x, int argc, char **argv, bool pinned)
{
	Ckpt__V1__PinRequest req = CKPT__V1__PIN_REQUEST__INIT;
	ProtobufCMessage *r;
	int rc;

	if (!ctl_args_ok(x, pinned ? "pin" : "unpin", argc, argv, 2, 2, ctl_job_step_names))
		return EXIT_USAGE;
	if ((rc = ctl_job_step(x, pinned ? "pin" : "unpin", argv, &req.step)))
		return rc;
	req.job = argv[0];
	req.pinned = pinned;
	rc = cl_call(x->c, IPC_PIN, &req.base, &r, CL_DEFAULT_TIMEOUT_MS);
	if (rc)
		return ctl_fail(x, rc);
	protobuf_c_message_free_unpacked(r, NULL);
	if (x->json)
		return ctl_print_json(json_pack("{s:s, s:I, s:b}", "job", req.job, "step",
		                                (json_int_t)req.step, "pinned", pinned));
	printf("%s %s step %" PRId64 "\n", pinned ? "pinned" : "unpinned", req.job, req.step);
	return 0;
}

static int cmd_pin(struct ctl *x, int argc, char **argv)
{
	return pin_or_unpin(x, argc, argv, true);
}

static int cmd_unpin(struct ctl *x, int argc, char **argv)
{
	return pin_or_unpin(x, argc, argv, false);
}

static json_t *gc_json(const char *job, const Ckpt__V1__GcReply *r)
{
	json_t *removed = json_array(), *kept = json_array(), *problems = json_array();

	for (size_t i = 0; i < r->n_removed; i++)
		json_array_append_new(removed, json_integer((json_int_t)r->removed[i]));
	for (size_t i = 0; i < r->n_kept; i++)
		json_array_append_new(kept,
		                      json_pack("{s:I, s:s}", "step", (json_int_t)r->kept[i]->step,
		                                "reason", r->kept[i]->reason));
	for (size_t i = 0; i < r->n_problems; i++)
		json_array_append_new(problems, json_string(r->problems[i]));
	return json_pack("{s:s, s:i, s:I, s:o, s:I, s:o, s:o}", "job", job, "keep_last",
	                 (int)r->keep_last, "keep_every", (json_int_t)r->keep_every, "removed",
	                 removed, "bytes_removed", (json_int_t)r->bytes_removed, "kept", kept,
	                 "problems", problems);
}

static void gc_table(const char *job, const Ckpt__V1__GcReply *r)
{
	char size[32], every[64] = "";

	ctl_human_bytes(r->bytes_removed, size, sizeof(size));
	if (r->keep_every)
		snprintf(every, sizeof(every), ", multiples of %" PRId64, r->keep_every);
	if (r->keep_last == 0)
		printf(
		    "%s: retention is off (the agent runs with --keep-last 0): nothing removed\n",
		    job);
	else
		printf("%s: removed %zu checkpoints (%s), kept %zu (policy: the last %u%s, LATEST, "
		       "pinned)\n",
		       job, r->n_removed, size, r->n_kept, r->keep_last, every);
	for (size_t i = 0; i < r->n_removed; i++)
		printf("  removed %12" PRId64 "\n", r->removed[i]);
	for (size_t i = 0; i < r->n_kept; i++)
		printf("  kept    %12" PRId64 "  %s\n", r->kept[i]->step, r->kept[i]->reason);
	for (size_t i = 0; i < r->n_problems; i++)
		printf("  FAILED  %s\n", r->problems[i]);
}

static int cmd_gc(struct ctl *x, int argc, char **argv)
{
	Ckpt__V1__GcRequest req = CKPT__V1__GC_REQUEST__INIT;
	Ckpt__V1__GcReply *r;
	int rc;

	if (!ctl_args_ok(x, "gc", argc, argv, 1, 1, ctl_job_step_names) || !job_ok(x, argv[0]))
		return EXIT_USAGE;
	req.job = argv[0];
	rc = cl_call(x->c, IPC_GC, &req.base, (ProtobufCMessage **)&r, CL_NO_TIMEOUT);
	if (rc)
		return ctl_fail(x, rc);
	if (x->json)
		rc = ctl_print_json(gc_json(req.job, r));
	else
		gc_table(req.job, r);
	if (!rc && r->n_problems)
		rc = 1; /* some removals failed: said above, and in the agent's log */
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return rc;
}

/* ---- commit --finish ------------------------------------------------- */

static int cmd_commit(struct ctl *x, int argc, char **argv)
{
	Ckpt__V1__CommitRequest req = CKPT__V1__COMMIT_REQUEST__INIT;
	Ckpt__V1__CommitReply *r;
	char size[32];
	int rc;

	if (!argc || strcmp(argv[0], "--finish") != 0)
		return ctl_usage_error(x, "commit",
		                       "needs --finish (the only way to commit by hand)");
	if (!ctl_args_ok(x, "commit", argc - 1, argv + 1, 2, 2, ctl_job_step_names))
		return EXIT_USAGE;
	if ((rc = ctl_job_step(x, "commit", argv + 1, &req.step)))
		return rc;
	req.job = argv[1];
	rc = cl_call(x->c, IPC_COMMIT, &req.base, (ProtobufCMessage **)&r, CL_NO_TIMEOUT);
	if (rc)
		return ctl_fail(x, rc);
	if (x->json) {
		rc = ctl_print_json(json_pack(
		    "{s:s, s:I, s:b, s:s, s:i, s:I, s:o}", "job", req.job, "step",
		    (json_int_t)req.step, "already", r->already, "run", r->run, "world", r->world,
		    "bytes", (json_int_t)r->bytes, "parts", ctl_strings(r->parts, r->n_parts)));
	} else {
		ctl_human_bytes(r->bytes, size, sizeof(size));
		printf("job %s step %" PRId64 " %s: run %s, world %d, %s, from", req.job, req.step,
		       r->already ? "was already committed" : "committed", r->run, r->world, size);
		for (size_t i = 0; i < r->n_parts; i++)
			printf("%s %s", i ? "," : "", r->parts[i]);
		printf("\n");
	}
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return rc;
}

/*
 * "--json", "--help" or "-h" anywhere after the command: taken out, noted;
 * up to a "--" (taken out too), after which every word is an argument (a
 * job named "-h").
 */
static void take_flags(int *argc, char **argv, int from, struct ctl *x, bool *help)
{
	for (int k = from; k < *argc; k++) {
		bool json = strcmp(argv[k], "--json") == 0;
		bool h = strcmp(argv[k], "--help") == 0 || strcmp(argv[k], "-h") == 0;

		if (strcmp(argv[k], "--") == 0) {
			memmove(&argv[k], &argv[k + 1], (size_t)(*argc - k) * sizeof(*argv));
			(*argc)--;
			return;
		}
		if (!json && !h)
			continue;
		x->json |= json;
		*help |= h;
		memmove(&argv[k], &argv[k + 1], (size_t)(*argc - k) * sizeof(*argv));
		(*argc)--;
		k--;
	}
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
	    {"endpoint", required_argument, NULL, 'e'},
	    {"json", no_argument, NULL, 'j'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, 'V'},
	    {NULL, 0, NULL, 0},
	};
	const struct ctl_cmd *cmd;
	const char *endpoint = NULL;
	struct ctl x = {0};
	bool help = false;
	int opt, rc;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, "+hV", lo, NULL)) != -1) {
		if (opt == 'e')
			endpoint = optarg;
		else if (opt == 'j')
			x.json = true;
		else if (opt == 'h')
			return ctl_usage(stdout), 0;
		else if (opt == 'V')
			return printf("ckptctl %s (protocol ckpt.v1)\n", CKPT_VERSION), 0;
		else if (optopt == 'e' ||
		         (optind > 0 && strcmp(argv[optind - 1], "--endpoint") == 0))
			return ctl_error(&x, EXIT_USAGE, EINVAL,
			                 "--endpoint needs an endpoint (unix:PATH)");
		else
			return ctl_error(&x, EXIT_USAGE, EINVAL,
			                 "unknown option '%s' (ckptctl --help lists them)",
			                 argv[optind - 1]);
	}
	if (optind >= argc) {
		ctl_usage(stderr);
		return ctl_error(&x, EXIT_USAGE, EINVAL, "no command given");
	}
	if (strcmp(argv[optind], "help") == 0) {
		if (optind + 1 >= argc)
			return ctl_usage(stdout), 0;
		if (!(cmd = cmd_named(argv[optind + 1])))
			return ctl_error(&x, EXIT_USAGE, EINVAL,
			                 "no command '%s' (ckptctl help lists them)",
			                 argv[optind + 1]);
		return cmd_help(cmd, stdout), 0;
	}
	if (!(cmd = cmd_named(argv[optind])))
		return ctl_error(&x, EXIT_USAGE, EINVAL,
		                 "unknown command '%s' (ckptctl help lists them)", argv[optind]);
	take_flags(&argc, argv, optind + 1, &x, &help);
	if (help)
		return cmd_help(cmd, stdout), 0;
	rc = cl_open(endpoint, false, &x.c);
	if (rc)
		return ctl_error(&x, 1, rc, "%s",
		                 *ckpt_last_error(NULL) ? ckpt_last_error(NULL)
		                                        : ckpt_strerror(rc));
	rc = cmd->fn(&x, argc - optind - 1, argv + optind + 1);
	ckpt_disconnect(x.c);
	return rc;
}
