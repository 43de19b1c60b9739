/*
 * storage/s3/s3.h: private to the S3 backend (the files of storage/s3/;
 * the unit tests and fuzz targets of s3zstd.c include it too). The backend
 * object and the helpers its files share. The public calls (s3_create, s3_root_parse) are in
 * storage.h; the layout and threads are described at the top of s3.c.
 */
#ifndef CKPT_STORAGE_S3_H
#define CKPT_STORAGE_S3_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "storage/s3/s3http.h"
#include "storage/storage.h"

#define S3_MAX_PARTS 10000u /* S3's limit on the parts of one upload */
#define S3_MIN_PART (5ull << 20) /* every part but the last */
#define S3Z_THREADS 2 /* compress and decompress shards' frames */
#define S3Z_MAX_FRAME (1ull << 30) /* a frame's bytes at most: the largest staging chunk */
#define S3_MANIFEST "manifest.json"
#define S3_PIN "pinned"
#define S3_LIST_MAX 1000000u /* keys one listing agrees to look at */
#define S3_LIST_PAGES 10000u /* and pages (a store whose tokens go round in a circle) */

struct s3_io;

struct s3 {
	struct storage base; /* first: a struct storage * is a struct s3 * */
	struct s3http *http;
	char bucket[64];
	char prefix[256]; /* "" or "a/b": keys are "<prefix>/<job>/..." */
	char node[IPC_MAX_JOB + 1];
	char endpoint[256];
	uint64_t part_bytes;
	int zstd_level; /* shards written compressed at this level; 0: not */
	/* the zstd threads (s3.c): parts compressed, read frames undone */
	pthread_t zthr[S3Z_THREADS];
	unsigned nz;
	pthread_mutex_t zmu;
	pthread_cond_t zcv;
	struct s3_io *zhead, *ztail;
	bool zquit;
	unsigned connections;
	bool create_once; /* the store honours If-None-Match: * on PUT */

	pthread_mutex_t mu; /* writing: the shard keys uploads are open for; unaborted */
	char (*writing)[S3_KEY_MAX];
	size_t nwriting, capwriting;
	struct s3_unaborted *unaborted; /* uploads whose abort failed: tried again later */
	unsigned nunaborted;
};

/* An upload whose abort failed (the store was away): the root check tries again. */
struct s3_unaborted {
	struct s3_unaborted *next;
	char key[S3_KEY_MAX];
	char upload[S3_QUERY_MAX / 2]; /* encoded */
};

static inline struct s3 *to_s3(struct storage *s)
{
	return (struct s3 *)s;
}

/* "<prefix>/<rel>" (or rel alone), -ENAMETOOLONG with err filled. */
int s3_key(const struct s3 *s, const char *rel, char *buf, size_t len, char *err);
/* "<prefix>/<job>/step-<12d>/<leaf>"; leaf "" gives the step's prefix, '/' ended. */
int s3_step_key(const struct s3 *s, const char *job, int64_t step, const char *leaf, char *buf,
                size_t len, char *err);
/*
 * One request without a body, waited for: its errno (err says why) and,
 * if asked, the reply's length (HEAD: the object's size).
 */
int s3_call(struct s3 *s, enum s3_method m, const char *key, const char *query, uint64_t *length,
            char *err);
/* Whether an upload of this key is open in this agent (its writes in flight; s3_shard.c). */
bool s3_writing(struct s3 *s, const char *key);
/* s3_conf.c: the credentials file's access_key and secret_key (len bytes each). */
int s3_read_credentials(const char *path, char *access, char *secret, size_t len, char *err);

/* ---- s3zstd.c: compressed shards ---------------------------------------- */

/* A frame's sizes, as its seek table entry says them. */
struct s3z_frame {
	uint32_t csize; /* on the store, its padding included */
	uint32_t dsize; /* the shard's bytes it holds */
};

/* A seek table read back: where each frame ends, on the store and in the shard. */
struct s3z_table {
	unsigned n;
	uint64_t *cend, *dend;
};

/* The buffer a frame of len bytes needs (padded, or with a one-frame table after it). */
size_t s3z_bound(uint64_t len);
/* The seek table's size for n frames. */
uint64_t s3z_table_bytes(unsigned n);
/* len bytes of src, one frame at level, into dst (cap); pad: at least S3_MIN_PART. */
int s3z_frame(int level, const void *src, uint64_t len, void *dst, size_t cap, bool pad,
              uint64_t *out, char *err);
/* The seek table of n frames into dst (s3z_table_bytes(n)). */
void s3z_table_write(const struct s3z_frame *f, unsigned n, void *dst);
/* From the table's last 9 bytes: how many frames it holds. */
int s3z_footer(const void *foot, unsigned *frames, char *err);
/*
 * The table buf[0, len) read from the end of an object of `object` bytes
 * holding `size` bytes of shard: checked against both.
 */
int s3z_table_parse(const void *buf, uint64_t len, uint64_t object, uint64_t size,
                    struct s3z_table *t, char *err);
void s3z_table_free(struct s3z_table *t);
/* The frame holding shard byte off (t->n: past the end). */
unsigned s3z_find(const struct s3z_table *t, uint64_t off);
/*
 * Shard bytes [off, off + len) into dst, from src: the frames from `first`
 * on, as they are on the store.
 */
int s3z_inflate(const struct s3z_table *t, unsigned first, const void *src, uint64_t off, void *dst,
                uint64_t len, char *err);

/* ---- s3_scan.c: listings, removal, clean-up --------------------------- */

struct s3_obj {
	char *key; /* relative to the listed prefix */
	uint64_t size;
	int64_t mtime; /* the store's clock, unix seconds */
};

/*
 * Every object under `prefix` (a full key prefix), or with delim, those
 * directly under it and the sub-prefixes (as keys ending in '/').
 * *date: the store's clock when it answered. Sorted by key.
 */
int s3_list(struct s3 *s, const char *prefix, bool delim, struct s3_obj **out, size_t *n,
            int64_t *date, char *err);
void s3_objs_free(struct s3_obj *v, size_t n);
/* Aborts the multipart uploads under prefix that keep(ctx, key, initiated) lets go. */
int s3_abort_uploads(struct s3 *s, const char *prefix,
                     bool (*go)(void *ctx, const char *key, int64_t initiated), void *ctx,
                     unsigned *aborted, char *err);
/* "2026-11-23T21:40:00.000Z" to unix seconds; -1 if not that. */
int64_t s3_parse_time(const char *iso);

int s3_obj_list(struct storage *st, const char *dir, char ***names, size_t *n, char *err);
int s3_list_jobs(struct storage *st, char ***jobs, size_t *n, char *err);
int s3_list_steps(struct storage *st, const char *job, struct storage_step **steps, size_t *n,
                  char *err);
int s3_remove(struct storage *st, const char *job, int64_t step, char *err);
int s3_cleanup(struct storage *st, const char *job, int64_t latest,
               const struct storage_cleanup *pol, struct storage_recovery *rec, char *err);

#endif /* CKPT_STORAGE_S3_H */
