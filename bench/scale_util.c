/*
 * scale_util.c: what scale_bench.c and scale_gen.c both call (scale_bench.h):
 * the clock, node names, the head of each JSON line, the counting storage
 * over the local backend, or over the S3 backend where the root is
 * s3://BUCKET[/PREFIX] (commit and watch only: gen writes a directory,
 * which is then copied into the bucket; the store's endpoint, region and
 * credentials file from CKPT_S3_ENDPOINT, CKPT_S3_REGION and
 * CKPT_S3_CREDENTIALS). One thread but gen's workers (open_store: each
 * its own).
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "commit/commit.h"

#include "bench/scale_bench.h"

int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double ms_since(int64_t t)
{
	return (double)(mono_ns() - t) / 1e6;
}

void node_name(int n, char *buf, size_t len)
{
	snprintf(buf, len, "n%05d", n);
}

/* What every line starts with: the phase and the root's shape. */
void line_head(const struct opts *o, const char *phase)
{
	printf("{\"bench\": \"scale\", \"phase\": \"%s\", \"nodes\": %d, \"ranks_per_node\": %d, "
	       "\"tensors\": %d, \"world\": %d, \"chunks\": %lld, \"latency_us\": %" PRId64,
	       phase, o->nodes, o->ranks, o->tensors, o->nodes * o->ranks,
	       (long long)o->nodes * o->ranks * o->tensors, o->latency_us);
}

/* The backend at o->root as `node`, wrapped in the counting storage. */
int open_store(const struct opts *o, const char *node, struct ioeng **io, struct storage **out,
               char *err)
{
	const struct ioeng_opts eo = {IOENG_AUTO, 64, NULL};
	struct storage *in = NULL;
	int rc;

	*out = NULL;
	rc = ioeng_create(&eo, io, err);
	if (rc)
		return rc;
	const struct local_opts lo = {o->root, node, *io, NULL, false};
	/* as many requests in flight as the committer makes */
	const struct s3_opts so = {o->root,
	                           getenv("CKPT_S3_ENDPOINT"),
	                           getenv("CKPT_S3_REGION"),
	                           getenv("CKPT_S3_CREDENTIALS"),
	                           false,
	                           COMMIT_READ_WIDTH,
	                           0,
	                           0,
	                           0,
	                           node,
	                           8u << 20,
	                           0};

	rc = storage_is_s3(o->root) ? s3_create(&so, &in, err) : local_create(&lo, &in, err);
	if (rc == 0)
		rc = cs_create(in, o->latency_us, out, err);
	if (rc && in)
		storage_destroy(in);
	if (rc) {
		ioeng_destroy(*io);
		*io = NULL;
	}
	return rc;
}

/* This process's resident set now, in KiB (/proc/self/statm). */
long rss_now_kb(void)
{
	long pages = 0, res = 0;
	FILE *f = fopen("/proc/self/statm", "r");

	if (f) {
		if (fscanf(f, "%ld %ld", &pages, &res) != 2)
			res = 0;
		fclose(f);
	}
	return res * (sysconf(_SC_PAGESIZE) / 1024);
}

long rss_peak_kb(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss;
}

/* The CPU time this process used so far, every thread, user and system, in ms. */
double cpu_ms(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
	       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

/* A JSON string: quotes and backslashes escaped, control characters dropped. */
void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		if (*s == '"' || *s == '\\')
			fputc('\\', f);
		if ((unsigned char)*s >= 0x20)
			fputc(*s, f);
	}
	fputc('"', f);
}
