/*
 * ckptctl's commands over one call each: status, list, verify, delete, pin,
 * unpin, gc and commit (show: ckptctl_show.c; watch: ckptctl_watch.c).
 * Called from main (ckptctl.c) through the commands table; main thread.
 */
#define _GNU_SOURCE /* strerrorname_np */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "client/ckptctl/ckptctl.h"

/* ---- status ----------------------------------------------------------- */

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

/* status's retention line: the policy, and what it removed since start. */
static void retention_line(const Ckpt__V1__StatusReply *r)
{
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
	retention_line(r);
	printf("%-12s %s\n", "last error", *r->last_error ? r->last_error : "-");
	if (r->n_in_flight) {
		printf("\nin flight\n");
		for (size_t i = 0; i < r->n_in_flight; i++)
			ctl_summary_row(r->in_flight[i]);
	}
}

int cmd_status(struct ctl *x, int argc, char **argv)
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

int cmd_list(struct ctl *x, int argc, char **argv)
{
	struct list_print p = {NULL, 0};

	if (!ctl_args_ok(x, "list", argc, argv, 0, 1, NULL) || (argc && !ctl_job_ok(x, argv[0])))
		return EXIT_USAGE;
	p.all = x->json ? json_array() : NULL;
	/* a page at a time: a job of many steps never needs a message past the limit */
	if (ctl_list_pages(x, argc ? argv[0] : "", list_page, &p)) {
		json_decref(p.all);
		return 1;
	}
	if (p.all)
		return ctl_print_json(json_pack("{s:o}", "checkpoints", p.all));
	if (p.n == 0)
		printf("no checkpoints%s%s\n", argc ? " for job " : "", argc ? argv[0] : "");
	return 0;
}
/* ---- verify and delete ------------------------------------------------ */

int cmd_verify(struct ctl *x, int argc, char **argv)
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

int cmd_delete(struct ctl *x, int argc, char **argv)
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
	if (!force && (rc = ctl_latest_of(x, req.job, &latest)) != -ENOENT) {
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

int cmd_pin(struct ctl *x, int argc, char **argv)
{
	return pin_or_unpin(x, argc, argv, true);
}

int cmd_unpin(struct ctl *x, int argc, char **argv)
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

int cmd_gc(struct ctl *x, int argc, char **argv)
{
	Ckpt__V1__GcRequest req = CKPT__V1__GC_REQUEST__INIT;
	Ckpt__V1__GcReply *r;
	int rc;

	if (!ctl_args_ok(x, "gc", argc, argv, 1, 1, ctl_job_step_names) || !ctl_job_ok(x, argv[0]))
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

int cmd_commit(struct ctl *x, int argc, char **argv)
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
