/*
 * The S3 tests' helpers (s3_harness.h): the gateway through scripts/rgw.sh,
 * buckets and downloads with its signing curl, trainer ranks.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <check.h>

#include "tests/integration/s3_harness.h"

const char *s3h_endpoint, *s3h_creds, *s3h_region, *s3h_dir;
static unsigned bucket_seq;

bool s3h_init(void)
{
	s3h_endpoint = getenv("CKPT_TEST_S3_ENDPOINT");
	s3h_creds = getenv("CKPT_TEST_S3_CREDENTIALS");
	s3h_region = getenv("CKPT_TEST_S3_REGION");
	s3h_dir = getenv("CKPT_TEST_S3_DIR");
	if (s3h_endpoint && s3h_creds && s3h_region && s3h_dir)
		return true;
	fprintf(stderr, "no S3 gateway (CKPT_TEST_S3_* unset: scripts/rgw.sh up starts one)\n");
	return false;
}

int s3h_rgw(char *out, size_t len, const char *cmd, const char *fmt, ...)
{
	char args[1024], line[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	snprintf(line, sizeof(line), "%s/scripts/rgw.sh %s '%s' %s", CKPT_SOURCE_DIR, cmd, s3h_dir,
	         args);
	return h_run(out, len, line);
}

void s3h_new_bucket(char *name, size_t len)
{
	snprintf(name, len, "ckt-%d-%u", (int)getpid(), bucket_seq++);
	ck_assert_msg(s3h_rgw(NULL, 0, "mkbucket", "%s", name) == 0, "cannot make bucket %s", name);
}

/* "<Upload>" elements of ListMultipartUploads. */
int s3h_open_uploads(const char *bucket)
{
	char out[65536];
	int n = 0;

	ck_assert_int_eq(
	    s3h_rgw(out, sizeof(out), "curl", "-s '%s/%s?uploads='", s3h_endpoint, bucket), 0);
	ck_assert_msg(strstr(out, "ListMultipartUploadsResult"), "not a listing: %s", out);
	for (const char *p = out; (p = strstr(p, "<Upload>")); p++)
		n++;
	return n;
}

int s3h_download(const char *bucket, const char *key, const char *path)
{
	char out[64];

	s3h_rgw(out, sizeof(out), "curl", "-s -o '%s' -w '%%{http_code}' '%s/%s/%s'", path,
	        s3h_endpoint, bucket, key);
	return atoi(out);
}

void s3h_args(char *buf, size_t len, const char *extra)
{
	snprintf(buf, len,
	         "--s3-endpoint %s --s3-credentials %s --s3-region %s --chunk-mb 5 --staging-mb 64 "
	         "--s3-max-tries 3 %s",
	         s3h_endpoint, s3h_creds, s3h_region, extra ? extra : "");
}

pid_t s3h_spawn_rank(const struct agent_proc *a, const char *job, int rank, int world, long first,
                     long last, long mb, const char *mode, int *out_fd)
{
	return h_spawn_rank(CKPT_CLUSTER_BIN, a, job, "0", rank, world, first, last, mb, mode,
	                    out_fd, false);
}

void s3h_save_mode(struct agent_proc *a, int n, const char *job, int world, long first, long last,
                   long mb, const char *mode)
{
	pid_t pid[16];

	for (int r = 0; r < world; r++)
		pid[r] =
		    s3h_spawn_rank(&a[r * n / world], job, r, world, first, last, mb, mode, NULL);
	for (int r = 0; r < world; r++)
		ck_assert_msg(h_reap(pid[r]) == 0, "rank %d of %s (steps %ld..%ld) did not %s", r,
		              job, first, last, mode);
}

void s3h_save_all(struct agent_proc *a, int n, const char *job, int world, long first, long last,
                  long mb)
{
	s3h_save_mode(a, n, job, world, first, last, mb, "commit");
}

long s3h_restore_all(struct agent_proc *a, int n, const char *job, int world, long mb)
{
	pid_t pid[16];
	int fd[16];
	char out[64];
	long step = -2;

	for (int r = 0; r < world; r++)
		pid[r] =
		    s3h_spawn_rank(&a[r * n / world], job, r, world, 0, 0, mb, "restore", &fd[r]);
	for (int r = 0; r < world; r++) {
		h_read_all(fd[r], out, sizeof(out));
		ck_assert_msg(h_reap(pid[r]) == 0, "rank %d of %s could not restore LATEST", r,
		              job);
		ck_assert_msg(step == -2 || step == atol(out), "ranks restored different steps");
		step = atol(out);
	}
	return step;
}

long long s3h_zstd_loads(const char *dir, const char *bucket, const char *key, long step, int rank,
                         long mb)
{
	char zfile[400], file[400], cmd[1400];
	struct stat st;

	snprintf(zfile, sizeof(zfile), "%s/rank%d.safetensors.zst", dir, rank);
	snprintf(file, sizeof(file), "%s/rank%d.safetensors", dir, rank);
	ck_assert_int_eq(s3h_download(bucket, key, zfile), 200);
	ck_assert_int_eq(stat(zfile, &st), 0);
	snprintf(cmd, sizeof(cmd), "zstd -q -d -f '%s' -o '%s' && '%s' '%s' '%s' %ld %d %ld", zfile,
	         file, CKPT_PYTHON, CKPT_S3_LOAD, file, step, rank, mb);
	ck_assert_msg(system(cmd) == 0, "%s: does not decompress into what was saved", cmd);
	return (long long)st.st_size;
}
