/*
 * ckptctl.h: what ckptctl's files share (ckptctl.c: the commands table and
 * main; ckptctl_util.c: errors, arguments and output shared by every
 * command; ckptctl_cmds.c: status, list, verify, delete, pin, unpin, gc,
 * commit; ckptctl_show.c: show; ckptctl_watch.c: the live view). Private to
 * ckptctl. Calls go one way: main to the commands, the commands to the
 * helpers (which learn a command's usage line through args_of).
 */
#ifndef CKPT_CKPTCTL_H
#define CKPT_CKPTCTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "client/rpc_call.h"

#define EXIT_USAGE 2

struct ctl {
	struct ckpt_client *c;
	bool json;
	/* The argument line of command `name` ("" or NULL: none), for usage errors (main's table).
	 */
	const char *(*args_of)(const char *name);
};

/* "1.5 GiB" */
void ctl_human_bytes(uint64_t n, char *buf, size_t len);
/* "2025-01-31 12:00:00" (UTC) */
void ctl_human_time(int64_t unix_ns, char *buf, size_t len);
/* "12 ms", "1.50 s", "-" for 0 */
void ctl_human_secs(double s, char *buf, size_t len);
/* Prints j (indented) and frees it; 0, or 1 if it could not be written. */
int ctl_print_json(json_t *j);
/* Prints the agent's message for rc on stderr; returns 1 (the exit status). */
int ctl_fail(struct ctl *x, int rc);
void ctl_usage(FILE *f);
/*
 * A usage error of command `name` (fmt: what is wrong), said with its usage
 * line, on stderr or as JSON with --json; returns EXIT_USAGE.
 */
int ctl_usage_error(const struct ctl *x, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A JSON array of the strings v[0..n). */
json_t *ctl_strings(char **v, size_t n);
/* "parts in: n0, n1; missing: n2 (ranks 4,5)" for a step in flight ("" if nothing known). */
void ctl_parts_line(char **done, size_t ndone, char **missing, size_t nmissing, char *buf,
                    size_t len);

/*
 * An error of ckptctl's own: on stderr, or as {"error", "errno", "code"} on
 * stdout with --json. Returns status.
 */
int ctl_error(const struct ctl *x, int status, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Whether command `name` has min..max arguments (names: what each is); said if not. */
bool ctl_args_ok(const struct ctl *x, const char *name, int argc, char **argv, int min, int max,
                 const char *const names[]);
/* {"JOB", "STEP"}, for ctl_args_ok. */
extern const char *const ctl_job_step_names[];
/*
 * JOB and STEP (argv[0], argv[1]) of command `name`: checked, STEP a number
 * or "latest" (asked of the agent). 0, or the exit status (said).
 */
int ctl_job_step(struct ctl *x, const char *name, char **argv, int64_t *step);
/* A leading "--tier T" or "--tier=T" into *tier, taken off argv; false (said) if bad. */
bool ctl_take_tier(const struct ctl *x, const char *name, int *argc, char ***argv, char **tier);
/*
 * A JOB argument, by the agent's own rules (ipc_check_job): false, and the
 * message with the offending byte's offset, for one it would refuse.
 */
bool ctl_job_ok(const struct ctl *x, const char *job);
/*
 * Every checkpoint List gives of job ("": all), a page at a time: fn(ctx,
 * reply) for each page, which stops the walk by returning non-zero. 0, fn's
 * value, or the call's error (said).
 */
int ctl_list_pages(struct ctl *x, const char *job,
                   int (*fn)(void *ctx, const Ckpt__V1__ListReply *r), void *ctx);
/* The step List says is job's LATEST; 0, -ENOENT (not said) or the call's error (said). */
int ctl_latest_of(struct ctl *x, const char *job, int64_t *step);
/* A checkpoint's summary: as JSON, and as a row of the list's table. */
json_t *ctl_summary_json(const Ckpt__V1__CheckpointSummary *s);
void ctl_summary_row(const Ckpt__V1__CheckpointSummary *s);

/* The commands of ckptctl_cmds.c: argc and argv are the command's arguments; the exit status. */
int cmd_status(struct ctl *x, int argc, char **argv);
int cmd_list(struct ctl *x, int argc, char **argv);
int cmd_verify(struct ctl *x, int argc, char **argv);
int cmd_delete(struct ctl *x, int argc, char **argv);
int cmd_pin(struct ctl *x, int argc, char **argv);
int cmd_unpin(struct ctl *x, int argc, char **argv);
int cmd_gc(struct ctl *x, int argc, char **argv);
int cmd_commit(struct ctl *x, int argc, char **argv);

/* ckptctl show [--full] [--tier T] JOB STEP (ckptctl_show.c). */
int ctl_show(struct ctl *x, int argc, char **argv);

/* ckptctl watch [JOB]: a live view on a terminal, else one line (or JSON object) per event. */
int ctl_watch(struct ctl *x, int argc, char **argv);

#endif /* CKPT_CKPTCTL_H */
