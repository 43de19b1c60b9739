/*
 * storage/s3/s3_shard.h: private to the S3 backend's shard files
 * (s3_shard.c: the shard object, parts in flight, the zstd threads;
 * s3_upload.c: writes; s3_read.c: reads) and to s3.c, which puts their
 * calls in its storage_ops and starts the zstd threads.
 */
#ifndef CKPT_STORAGE_S3_SHARD_H
#define CKPT_STORAGE_S3_SHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "storage/s3/s3.h"

struct storage_shard {
	struct s3 *s;
	char key[S3_KEY_MAX];
	char file[SHARD_FILE_MAX];
	uint64_t size;
	bool write;
	unsigned nparts;
	char upload[S3_QUERY_MAX / 2]; /* the upload's id, encoded; "": a single PUT */
	char (*etag)[S3_ETAG_MAX]; /* each part's, once written */
	unsigned nput; /* parts of the upload: nparts, and the seek table's when compressed */
	bool z; /* compressed (s3zstd.c) */
	struct s3z_frame *zf; /* writing: each part's frame */
	struct s3z_table zt; /* reading: where the frames are */
	uint64_t stored; /* the object's size on the store, once known */
	void *ztab; /* the seek table's bytes while it is sent */
	bool completed;
	pthread_mutex_t mu; /* why */
	char why[IPC_ERRLEN]; /* the first failure of its requests */
	struct s3req fin; /* completion, its size check, the abort */
	struct io_req *fin_io;
};

/* One part's write or one range's read in flight. */
struct s3_io {
	struct s3req q;
	struct storage_shard *sh;
	struct io_req *io;
	unsigned part;
	void *zbuf; /* compressed: the part's body, or the frames read */
	uint64_t zoff, zlen; /* a compressed read: the shard bytes wanted */
	unsigned zfirst; /* and the first frame fetched */
	struct s3_io *znext; /* the zstd threads' queue */
};

/* ---- s3_shard.c ----------------------------------------------------------- */

/* A shard file name of ours: one component, nothing but [A-Za-z0-9._-]. */
int s3_check_file(const char *file, char *err);
/* Claims key for an upload of this agent: false if one is open for it already. */
bool s3_claim(struct s3 *s, const char *key);
void s3_unclaim(struct s3 *s, const char *key);
/* The shard's first failure, kept for shard_error. */
void s3_shard_fail(struct storage_shard *sh, const char *why);
struct storage_shard *s3_shard_new(struct s3 *s, bool write);
/* Its claim (a write) let go, its buffers freed. NULL: nothing. */
void s3_shard_free(struct storage_shard *sh);
/* A part's write (S3_PUT) or a range's read (S3_GET) of sh for r; NULL: no memory. */
struct s3_io *s3_io_new(struct storage_shard *sh, struct io_req *r, enum s3_method m);
/* Hands x to the zstd threads; once they are stopped, does it here. */
void s3_zqueue(struct s3 *s, struct s3_io *x);
/* A zstd thread (arg: the struct s3), until s->zquit and its queue is empty. */
void *s3_zthread(void *arg);

/* ---- s3_upload.c: the write side ------------------------------------------ */

int s3_shard_create(struct storage *st, const char *job, int64_t step, int rank, uint64_t size,
                    char *file, struct storage_shard **out, char *err);
int s3_shard_create_as(struct storage *st, const char *job, int64_t step, const char *file,
                       uint64_t size, struct storage_shard **out, char *err);
void s3_shard_write(struct storage_shard *sh, struct io_req *r);
void s3_shard_finish(struct storage_shard *sh, struct io_req *r);
void s3_shard_close(struct storage_shard *sh);
const char *s3_shard_error(struct storage_shard *sh);
/* The uploads whose abort failed, tried again (the root check). */
void s3_abort_again(struct s3 *s);

/* ---- s3_read.c: the read side --------------------------------------------- */

int s3_shard_stat(struct storage *st, const char *job, int64_t step, const char *file,
                  uint64_t *size, char *err);
int s3_shard_open(struct storage *st, const char *job, int64_t step, const char *file,
                  struct storage_shard **out, uint64_t *size, char *err);
void s3_shard_read(struct storage_shard *sh, struct io_req *r);
int s3_shard_unlink(struct storage *st, const char *job, int64_t step, const char *file, char *err);
void s3_shard_path(struct storage *st, const char *job, int64_t step, const char *file, char *buf,
                   size_t len);

#endif /* CKPT_STORAGE_S3_SHARD_H */
