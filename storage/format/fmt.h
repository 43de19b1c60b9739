/*
 * storage/format/fmt.h: private to storage/format/, what the format files (manifest.c, part.c,
 * plans.c) share: reading JSON fields as hostile input, a tensor and its
 * chunks both ways, the user meta, and the checks of one chunk and of the
 * byte ranges of one file. Every message starts with `what` ("manifest",
 * "part", "plans"), so a reader knows which file said it.
 *
 * Pure functions, any thread; 0 or negative errno, a sentence in err.
 */
#ifndef CKPT_STORAGE_FMT_H
#define CKPT_STORAGE_FMT_H

#include <jansson.h>

#include "storage/format/format.h"

/* obj[key] as an integer in min..max; `where` names obj in the message. */
int fmt_int(const json_t *obj, const char *key, int64_t min, int64_t max, int64_t *out,
            const char *what, const char *where, char *err);
int fmt_str(const json_t *obj, const char *key, const char **out, const char *what,
            const char *where, char *err);
/* obj[key] as a malloc'd copy of a string that `check` accepts (ipc_check_job, ...). */
int fmt_name(const json_t *obj, const char *key, int (*check)(const char *, char *), char **out,
             const char *what, const char *where, char *err);
/* obj[key] as an array of exactly n (n < 0: up to IPC_MAX_NDIM) integers >= 0. */
int fmt_dims(const json_t *obj, const char *key, long n, int64_t *out, size_t *got,
             const char *what, const char *where, char *err);
json_t *fmt_ints(const int64_t *v, size_t n);

/* A tensor and its chunks ({"dtype", "global_shape", "sharded", "chunks"}); sums: with xxh3. */
json_t *fmt_tensor_json(const struct manifest_tensor *t, bool sums);
int fmt_tensor_parse(const char *name, const json_t *o, bool sums, struct manifest_tensor *t,
                     const char *what, char *err);
void fmt_tensors_free(struct manifest_tensor *t, size_t n);
/*
 * Tensors by name ({name: tensor}), as a manifest's "tensors", a part
 * rank's "tensors" and a rank's "holds" hold them: written; parsed from an
 * object the caller checked (sorted by name; *v, half made on a failure,
 * is the caller's to free with *n).
 */
json_t *fmt_tensors_json(const struct manifest_tensor *v, size_t n, bool sums);
int fmt_tensors_parse(const json_t *o, bool sums, struct manifest_tensor **v, size_t *n,
                      const char *what, char *err);
/* A deep copy of v[0..n) into *out (NULL when n is 0). */
int fmt_tensors_dup(const struct manifest_tensor *v, size_t n, struct manifest_tensor **out);

/*
 * What a rank holds apart from what it wrote ({name: tensor without sums}):
 * written, parsed (sorted by name) and checked: names once each, known
 * dtypes, one chunk each of `rank`, inside its global shape.
 */
json_t *fmt_holds_json(const struct manifest_tensor *v, size_t n);
int fmt_holds_parse(const json_t *o, struct manifest_tensor **v, size_t *n, const char *what,
                    char *err);
int fmt_check_holds(const struct manifest_tensor *v, size_t n, int rank, const char *what,
                    char *err);
/* Whether chunk c of t lies in the box v[0..n) holds of t's name (same dtype and global shape). */
bool fmt_holds_chunk(const struct manifest_tensor *v, size_t n, const struct manifest_tensor *t,
                     const struct manifest_chunk *c);
int fmt_cmp_tensor(const void *a, const void *b);

/*
 * A rank's "save" (the number its shard's header is stamped with, format.h):
 * put as 16 hex digits where it is not 0; read as 0 where it is absent (a
 * file an older agent wrote), else exactly that.
 */
int fmt_save_put(json_t *o, uint64_t save);
/* A 64-bit number as exactly 16 lowercase hex digits (one spelling per value), and back. */
int fmt_hex_put(json_t *o, const char *key, uint64_t v);
int fmt_hex_read(const json_t *o, const char *key, uint64_t *v, const char *what, const char *where,
                 char *err);
int fmt_save_read(const json_t *o, uint64_t *save, const char *what, const char *where, char *err);

/* The user meta: its text as a JSON value (null when none), and back. */
int fmt_meta_value(const char *text, json_t **out, const char *what, char *err);
int fmt_meta_text(const json_t *v, char **out, const char *what, char *err);
/*
 * Meta into object o: "meta" (the value, for readers of the file) and,
 * where writing that value again would not give the text back, "meta_raw"
 * (the text exactly as the trainer gave it). NULL or "": "meta" null. 0, or
 * -ENOMEM / -EINVAL (not JSON).
 */
int fmt_meta_put(json_t *o, const char *text, const char *what, char *err);
/*
 * The meta of object o as text, *out malloc'd (NULL for none): "meta_raw"
 * byte for byte where it is there and says what "meta" says (files written
 * before it existed, or a "meta_raw" at odds with "meta": "meta" written
 * out again, as fmt_meta_text).
 */
int fmt_meta_read(const json_t *o, char **out, const char *what, char *err);

/*
 * One chunk of t in the file of k (rank k->rank), world ranks: bytes =
 * dtype x shape, inside the file's data, the box inside the global shape.
 */
int fmt_check_chunk(const struct manifest_tensor *t, size_t j, const struct manifest_rank *k,
                    int world, const char *what, char *err);

/* Byte ranges of one file, collected to check that no two chunks share a byte. */
struct fmt_span {
	int rank;
	uint64_t begin, end;
	const char *tensor;
};

/* v[0..n) sorted, then any two on one rank that overlap: -EINVAL naming them. */
int fmt_check_spans(struct fmt_span *v, size_t n, const char *(*file_of)(const void *, int),
                    const void *ctx, const char *what, char *err);

/* "2026-11-21T19:13:00.123Z" for people; the _ns field is the exact value. */
void fmt_time(int64_t ns, char *buf, size_t len);
/* Bytes of JSON (at most max) into a checked object; -EINVAL naming what is wrong. */
int fmt_load(const char *buf, size_t len, size_t max, json_t **out, const char *what, char *err);
/* The "format" and "version" keys: this format and a version in 1..max. */
int fmt_header(const json_t *root, const char *format, int max, int *version, const char *what,
               char *err);
/* JSON text of root (compact or indented), at most max bytes. */
int fmt_dump(json_t *root, bool indent, size_t max, char **out, size_t *len, const char *what,
             char *err);

/* part_merge.c: the parts agree on job, step, run and world, and hold every rank once. */
int merge_check_set(struct part *const *v, size_t n, char *err);
/* part_merge.c: bytes, time, durations and rank 0's meta of parts v[0..n), into m. */
int merge_summary(struct manifest *m, struct part *const *v, size_t n, char *err);

/* head_json.c: "parts", [{node, ranks}] (format 4: with each part's bytes and xxh3). */
json_t *fmt_parts_json(const struct manifest *m);
/* head_json.c: format 4, the head of a checkpoint of several nodes, both ways. */
int head_json(const struct manifest *m, json_t *meta, char **out, size_t *len, char *err);
int head_parse(struct manifest *m, const json_t *root, char *err);

#endif /* CKPT_STORAGE_FMT_H */
