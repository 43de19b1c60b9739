/*
 * store_key.c: every key of the layout (store.h), and the check of a job's
 * name and step that each of the store's files makes before it builds one.
 * Under the other store files: it calls none of them. Any thread; no state.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "storage/store_int.h"

/* ---- keys -------------------------------------------------------------- */

void store_key(char *buf, size_t len, const char *job, int64_t step, const char *leaf)
{
	char sn[32] = "";

	if (step >= 0)
		snprintf(sn, sizeof(sn), "/step-%012" PRId64, step);
	snprintf(buf, len, "%s%s%s%s", job, sn, leaf ? "/" : "", leaf ? leaf : "");
}

void store_part_key(char *buf, size_t len, const char *job, int64_t step, const char *node)
{
	char leaf[IPC_MAX_JOB + 16];

	snprintf(leaf, sizeof(leaf), "parts/%s.json", node);
	store_key(buf, len, job, step, leaf);
}

void store_part_summary_key(char *buf, size_t len, const char *job, int64_t step, const char *node)
{
	char leaf[IPC_MAX_JOB + 16];

	snprintf(leaf, sizeof(leaf), "parts/%s.sum", node);
	store_key(buf, len, job, step, leaf);
}

void store_plans_key(char *buf, size_t len, const char *job, const char *node)
{
	snprintf(buf, len, "%s/plans/%s.json", job, node);
}

void store_plans_summary_key(char *buf, size_t len, const char *job, const char *node)
{
	snprintf(buf, len, "%s/plans/%s.sum", job, node);
}

int store_check_job_step(const char *job, int64_t step, char *err)
{
	int rc = ipc_check_job(job, err);

	return rc ? rc : ipc_check_step(step, err);
}
