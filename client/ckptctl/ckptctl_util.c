/*
 * ckptctl's shared helpers, for every command (ckptctl_cmds.c,
 * ckptctl_show.c, ckptctl_watch.c): errors and usage errors (plain or
 * --json), the human forms of sizes and times, JSON output, the JOB and
 * STEP arguments ("latest" asked of the agent with List, a page at a time),
 * a checkpoint's summary as JSON or a table row. Main thread only.
 */
#define _GNU_SOURCE /* strerrorname_np */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "client/ckptctl/ckptctl.h"

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
	const char *args = x && x->args_of ? x->args_of(name) : NULL;
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return ctl_error(x, EXIT_USAGE, EINVAL, "%s %s (usage: ckptctl %s%s%s; ckptctl %s --help)",
	                 name, msg, name, args && *args ? " " : "", args ? args : "", name);
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
bool ctl_job_ok(const struct ctl *x, const char *job)
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
int ctl_list_pages(struct ctl *x, const char *job,
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
int ctl_latest_of(struct ctl *x, const char *job, int64_t *step)
{
	struct latest_find f = {.job = job};
	int rc = ctl_list_pages(x, job, latest_page, &f);

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

	if (!ctl_job_ok(x, argv[0]))
		return EXIT_USAGE;
	if (strcmp(argv[1], "latest") == 0) {
		int rc = ctl_latest_of(x, argv[0], step);

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

json_t *ctl_strings(char **v, size_t n)
{
	json_t *a = json_array();

	for (size_t i = 0; i < n; i++)
		json_array_append_new(a, json_string(v[i]));
	return a;
}

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
