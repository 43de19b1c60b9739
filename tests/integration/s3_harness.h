/*
 * The S3 tests' helpers (test_s3.c, test_upload.c): the gateway that the
 * test command starts (scripts/rgw.sh; its env file names the endpoint, the
 * credentials and the helper's directory), buckets, downloads, and trainer
 * ranks (test_cluster's rank processes, `test_cluster --rank ...`). Built
 * into each of those tests (it needs their CKPT_* definitions).
 */
#ifndef CKPT_TEST_S3_HARNESS_H
#define CKPT_TEST_S3_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "tests/integration/harness.h"

/* The gateway's endpoint, credentials file, region and directory ($CKPT_TEST_S3_*). */
extern const char *s3h_endpoint, *s3h_creds, *s3h_region, *s3h_dir;

/* Reads $CKPT_TEST_S3_*: false (said on stderr) when no gateway runs: skip. */
bool s3h_init(void);
/* Runs `scripts/rgw.sh CMD DIR ARGS`; its stdout into out (if given); its exit code. */
int s3h_rgw(char *out, size_t len, const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A fresh bucket for one test: "ckt-<pid>-<n>". */
void s3h_new_bucket(char *name, size_t len);
/* The multipart uploads open in a bucket. */
int s3h_open_uploads(const char *bucket);
/* Downloads bucket/key into path with curl: its HTTP status. */
int s3h_download(const char *bucket, const char *key, const char *path);
/* The flags that point an agent at the gateway, then `extra`. */
void s3h_args(char *buf, size_t len, const char *extra);

/* A trainer rank on agent a (test_cluster's): its stdout on *out_fd if asked. */
pid_t s3h_spawn_rank(const struct agent_proc *a, const char *job, int rank, int world, long first,
                     long last, long mb, const char *mode, int *out_fd);
/* Ranks spread over agents a[0..n): saves first..last, each COMMITTED (or as mode says). */
void s3h_save_mode(struct agent_proc *a, int n, const char *job, int world, long first, long last,
                   long mb, const char *mode);
void s3h_save_all(struct agent_proc *a, int n, const char *job, int world, long first, long last,
                  long mb);
/* Every rank restores LATEST, byte-exact with its meta: the step. */
long s3h_restore_all(struct agent_proc *a, int n, const char *job, int world, long mb);
/*
 * A compressed shard object key of bucket: downloaded, `zstd -d` of it
 * loads as what rank saved at step (mb). The object's size.
 */
long long s3h_zstd_loads(const char *dir, const char *bucket, const char *key, long step, int rank,
                         long mb);

#endif
