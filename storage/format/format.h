/*
 * storage/format/format.h: what ckptd writes and reads back, as bytes: the shard's
 * safetensors header (safetensors.c) and the checkpoint's manifest.json
 * (manifest.c). Pure functions, any thread; what is parsed is hostile input.
 *
 * Errors: negative errno, and a sentence in `err` (IPC_ERRLEN bytes).
 */
#ifndef CKPT_STORAGE_FORMAT_H
#define CKPT_STORAGE_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ipc/base/base.h"

/* ---- safetensors ------------------------------------------------------ */

/* The largest header the safetensors library accepts. */
#define ST_MAX_HEADER 100000000u

struct st_tensor {
	const char *name;
	int dtype;
	size_t ndim;
	const int64_t *shape;
	uint64_t begin, end; /* relative to the start of the data */
};

struct st_meta {
	const char *key;
	const char *value;
};

/*
 * Builds the bytes that open a shard: the 8-byte little-endian header length,
 * then the JSON header (with __metadata__ when nmeta > 0), padded with spaces
 * so that the data starts at a multiple of 8. *out is malloc'd; *len is where
 * the data starts. Tensors must be contiguous from 0 in the order given.
 */
int st_header_build(const struct st_tensor *t, size_t n, const struct st_meta *meta, size_t nmeta,
                    void **out, size_t *len, char *err);

struct st_entry {
	char *name;
	int dtype;
	size_t ndim;
	int64_t shape[IPC_MAX_NDIM];
	uint64_t begin, end; /* relative to data_start */
};

struct st_header {
	uint64_t data_start; /* 8 + header length */
	size_t n;
	struct st_entry *v; /* sorted by begin */
	size_t nmeta;
	char **meta_keys;
	char **meta_values;
};

/*
 * Parses a header the way the safetensors library checks it: length within
 * bounds and the file, a JSON object, known dtypes, shape x dtype = the
 * range, ranges contiguous from 0 to the end of the file. buf holds the
 * first len bytes of a file of file_size bytes; -ENODATA if len is too short
 * for the header (read 8 + the length it announces, and call again).
 */
int st_header_parse(const void *buf, size_t len, uint64_t file_size, struct st_header **out,
                    char *err);
/* Reads and parses the header of an open file. */
int st_header_read(int fd, uint64_t file_size, struct st_header **out, char *err);
void st_header_free(struct st_header *h);
const struct st_entry *st_header_find(const struct st_header *h, const char *name);

/*
 * The stamp that ties a shard's bytes to one save (docs/DESIGN.md §6.2): its
 * header's __metadata__ names the step ("step": 12 digits) and a random
 * number drawn for the save ("save": 16 hex digits). The header is built
 * once per plan with placeholders (ST_STAMP_STEP, ST_STAMP_SAVE); each save writes its own
 * values into its copy (st_stamp_apply). The save's part and the manifest
 * repeat the number, so a part or a manifest copied from another step or
 * attempt names files whose headers say otherwise.
 */
struct st_stamp {
	int64_t step;
	uint64_t save; /* never 0 */
};

/* The two __metadata__ entries to build a header with, "step" and "save": placeholders. */
#define ST_STAMP_STEP "#ckpt-step##" /* 12 characters, as the step's digits */
#define ST_STAMP_SAVE "#ckpt-save######" /* 16, as the save's hex digits */

/* Where a built header holds the placeholders (0: it holds none). */
struct st_stamp_at {
	size_t step, save;
};

/* Finds them in a header built with them; -EINVAL if not there once each. */
int st_stamp_find(const void *header, size_t len, struct st_stamp_at *at, char *err);
/*
 * Whether buf[0, len) holds `"key":"value"` exactly once (in JSON text, only
 * that key's string value): 0 and the value's offset in *at; -ENOENT,
 * -EEXIST (twice or more), -EINVAL (too long to look for).
 */
int st_said_once(const void *buf, size_t len, const char *key, const char *value, size_t *at);
/*
 * Writes st's values over the placeholders, where they fall in the part
 * [off, off + len) of the shard that dst holds.
 */
void st_stamp_apply(const struct st_stamp_at *at, const struct st_stamp *st, uint64_t off,
                    void *dst, uint64_t len);
/*
 * The stamp a parsed header carries: 0; -ENODATA where it carries none (a
 * shard an older agent wrote); -EINVAL where it is malformed.
 */
int st_header_stamp(const struct st_header *h, struct st_stamp *out);
/* A __metadata__ value of a parsed header; NULL if there is none. */
const char *st_header_meta(const struct st_header *h, const char *key);

/* ---- shard files ------------------------------------------------------ */

/*
 * A shard is created exclusively (never opened over an existing file), so a
 * late writer can never change bytes a manifest names. Its name says whose
 * it is: "rank-00003.<node>.<attempt>.safetensors", the attempt counting up
 * from 0 when an earlier one's file is in the way. Readers take the name
 * from the manifest, never from a listing. Format-1 manifests name
 * "rank-00003.safetensors".
 */
#define SHARD_FILE_MAX 128

/* The name into buf (SHARD_FILE_MAX bytes); -ENAMETOOLONG if it does not fit. */
int shard_file_name(int rank, const char *node, unsigned attempt, char *buf, size_t len);
/* Whether `name` is a shard file that `node` made (any rank, any attempt). */
bool shard_file_of_node(const char *name, const char *node);
/* A name a manifest or a part may give rank's shard: one path component of ours. */
int shard_file_check(int rank, const char *name, char *err);

/* ---- manifest --------------------------------------------------------- */

#define MANIFEST_FORMAT "ckptd-manifest"
/*
 * 4: the head of a checkpoint of several nodes: it names each node's part
 * (parts/<node>.json, already written and checked) by its length and
 * XXH3-64, and says what a list needs (run, world, bytes, times, rank 0's
 * meta, how many tensors); the ranks and the tensors are in the parts.
 * Small whatever the world (O(nodes)), so a node that watches for the
 * commit reads little, and no limit grows with ranks x tensors.
 * 3: a rank may list the boxes it holds ("holds") apart from the chunks it
 * wrote (replicas written once: docs/DESIGN.md §7.4); written only when one does.
 * 2: run, parts, per-rank meta and shard names. 1 (single node) is still read.
 * A commit of one node's part writes 2 or 3 (one read restores it); of
 * several, 4.
 */
#define MANIFEST_VERSION 4 /* the newest this reader knows */
#define MANIFEST_VERSION_HEAD 4
#define MANIFEST_VERSION_HOLDS 3
#define MANIFEST_VERSION_PLAIN 2
#define MANIFEST_MAX_BYTES (256u << 20)
/* A part's bytes: a node's 8 ranks of 1,000 tensors are ~2.5 MB. */
#define PART_MAX_BYTES (256u << 20)

struct manifest_chunk {
	int rank;
	int64_t global_offset[IPC_MAX_NDIM]; /* zeros unless sharded */
	int64_t shape[IPC_MAX_NDIM]; /* this rank's local shape */
	uint64_t begin, end; /* byte range in the rank's file */
	uint64_t xxh3; /* XXH3-64 of those bytes */
};

struct manifest_tensor {
	char *name;
	int dtype;
	size_t ndim;
	int64_t global_shape[IPC_MAX_NDIM];
	bool sharded;
	size_t nchunks;
	struct manifest_chunk *chunks;
};

struct manifest_rank {
	int rank;
	char *file; /* "rank-00000.<node>.0.safetensors" (format 1: "rank-00000.safetensors") */
	uint64_t size;
	uint64_t header_bytes;
	char *meta_json; /* this rank's user meta; NULL if none (format 1: none here) */
	uint64_t save; /* its shard's stamp (struct st_stamp); 0: not said (an older agent's) */
	/*
	 * Format 3: the boxes the rank holds, when it wrote less of them than it
	 * holds (its replicas wrote the rest): sorted by name, one chunk each of
	 * this rank, no bytes. NULL: it holds exactly the chunks it wrote.
	 */
	size_t nholds;
	struct manifest_tensor *holds;
};

/* A node's part that the manifest merged: which ranks it brought. */
struct manifest_part {
	char *node;
	size_t nranks;
	int *ranks; /* ascending */
	/* format 4: the part file's length and XXH3-64, as merged; 0 before */
	uint64_t size, xxh3;
};

struct manifest {
	int version;
	char *job;
	char *run; /* format 1: "0" */
	int64_t step;
	int world;
	int64_t time_unix_ns; /* the last part's: the merge reads no clock */
	char *meta_json; /* rank 0's user meta as text; NULL if none */
	size_t nranks; /* == world, sorted by rank */
	struct manifest_rank *ranks;
	size_t nparts; /* sorted by node; format 1: 0 */
	struct manifest_part *parts;
	size_t ntensors; /* sorted by name */
	struct manifest_tensor *tensors;
	uint64_t bytes; /* sum of the shards' sizes */
	double capture_seconds, durable_seconds, commit_seconds;
	/*
	 * Format 4 read as its head alone (store_read_manifest_head): nranks
	 * and ntensors are 0, the parts say who holds which rank, and
	 * head_tensors how many tensors the checkpoint has. A head assembled
	 * with its parts (store_read_manifest) is whole: head_only false.
	 */
	bool head_only;
	size_t head_tensors;
	/*
	 * Some parts of a head only (store_read_manifest_rank): the ranks of
	 * those parts (the others' rank is -1), the tensors' chunks on them;
	 * the rest as the head says. Not checked whole: a restore of a rank's
	 * own layout reads it, and reads the whole where it falls short.
	 */
	bool partial;
};

/* Structural checks of a manifest built in memory or parsed. */
int manifest_check(const struct manifest *m, char *err);
/* How many tensors it has (a head's count, or its tensors). */
size_t manifest_tensor_count(const struct manifest *m);
int manifest_to_json(const struct manifest *m, char **out, size_t *len, char *err);
/* Parses and checks (manifest_check) bytes read back from disk. */
int manifest_from_json(const char *buf, size_t len, struct manifest **out, char *err);
void manifest_free(struct manifest *m);
const struct manifest_tensor *manifest_find(const struct manifest *m, const char *name);
/* The chunk of `t` saved by `rank` (sharded: the one at global_offset). */
const struct manifest_chunk *manifest_find_chunk(const struct manifest_tensor *t, int rank,
                                                 const int64_t *global_offset);
/*
 * The user meta a rank restoring this checkpoint gets: its own (the same
 * rank number), else rank 0's (restoring into a larger world); NULL if none.
 */
const char *manifest_rank_meta(const struct manifest *m, int rank);
/* The node whose part brought `rank`; NULL in a format-1 manifest. */
const char *manifest_node_of(const struct manifest *m, int rank);
/* "rank-00003.safetensors", the format-1 name, into buf (at least 32 bytes). */
void manifest_rank_file(int rank, char *buf, size_t len);

/* ---- parts (docs/DESIGN.md §6.4): one node's account of a step -------- */

#define PART_FORMAT "ckptd-part"
/* 2: a rank may list what it holds apart from what it wrote (holds); 1 is still read */
#define PART_VERSION 2

/*
 * The ranks one node saved of a step, once all of them are durable: each
 * rank's file and the chunks of its tensors (each tensor with exactly one
 * chunk, of that rank), its meta and its times. The manifest is merged from
 * the parts of one run that together hold every rank exactly once.
 */
struct part_rank {
	int rank;
	char *file;
	uint64_t size, header_bytes;
	char *meta_json; /* NULL if none */
	uint64_t save; /* its shard's stamp (struct st_stamp); 0: not said (an older agent's) */
	int64_t queued_unix_ns, captured_unix_ns, durable_unix_ns;
	size_t ntensors; /* sorted by name, one chunk each: what it wrote */
	struct manifest_tensor *tensors;
	/* version 2: what it holds (its plan), when it wrote less; NULL: what it wrote */
	size_t nholds;
	struct manifest_tensor *holds;
	/*
	 * Read from a summary (part.summary): no tensors, but what they are
	 * (part_rank_signature's number) and whether the rank wrote less than
	 * it holds.
	 */
	uint64_t sig;
	bool has_sig, wrote_less;
	/*
	 * Where it wrote less: tensors_signature of what it wrote (a whole
	 * part's from its tensors; a summary's as said, where it says it).
	 */
	uint64_t wsig;
	bool has_wsig;
};

struct part {
	int version;
	char *job, *run, *node;
	int64_t step;
	int world;
	int64_t time_unix_ns; /* when its node wrote it */
	size_t nranks; /* ascending */
	struct part_rank *ranks;
	/* as read back (store_read_part) or written (part_bytes_id): its bytes' length, XXH3-64 */
	uint64_t file_size, file_xxh3;
	/*
	 * Read from its summary (part_summary_from_json): the ranks without
	 * their tensors, file_size and file_xxh3 as its node says of its part.
	 */
	bool summary;
};

/* Structural checks (names, ranks, files, every chunk inside its file's data, no overlap). */
int part_check(const struct part *p, char *err);
int part_to_json(const struct part *p, char **out, size_t *len, char *err);
/* Parses and checks bytes another node wrote. */
int part_from_json(const char *buf, size_t len, struct part **out, char *err);
void part_free(struct part *p);
/*
 * The tensors of a commit's parts, counted and checked as each part comes
 * in (a name on several ranks only as chunks of one sharded tensor, as
 * manifest_merge checks), so that a part's tensors can go once added.
 */
struct names;
int names_create(struct names **out); /* 0 or -ENOMEM */
int names_add(struct names *t, const struct part *p, char *err);
/* The same of one rank's tensors (a plans file's, say); a name seen of that rank before: the same.
 */
int names_add_tensors(struct names *t, const struct manifest_tensor *v, size_t n, int rank,
                      char *err);
int names_copy(const struct names *t, struct names **out); /* 0 or -ENOMEM */
size_t names_count(const struct names *t);
void names_free(struct names *t);
/*
 * A part's summary (parts/<node>.sum beside parts/<node>.json): what a
 * commit of many nodes needs of a part, small whatever its tensors (its
 * ranks, their files and stamps, and for each rank the signature of what
 * it holds), with the length and XXH3-64 of the part's bytes, which a
 * head names. Its node writes it after the part, from the part
 * (file_size and file_xxh3 set: part_bytes_id); a committer reads it in
 * place of the part, and every reader of the tensors still reads the part
 * itself, checked against the head.
 */
#define PART_SUMMARY_FORMAT "ckptd-part-summary"
#define PART_SUMMARY_VERSION 1
int part_summary_to_json(const struct part *p, char **out, size_t *len, char *err);
int part_summary_from_json(const char *buf, size_t len, struct part **out, char *err);
/* The length and XXH3-64 of the bytes part_to_json makes of p, into p->file_size, file_xxh3. */
int part_bytes_id(struct part *p, char *err);
/*
 * Lets a part's tensors and holds go once they were checked and counted
 * (names_add): what a head needs stays (a commit of many nodes holds each
 * part's ranks, not its chunks), and each rank's signatures, as its
 * summary says them (what it holds; where it wrote less, what it wrote).
 */
void part_strip(struct part *p);
/*
 * What a rank's tensors are, as one number: XXH3-64 over each tensor's
 * name, dtype, shape and global placement, in name order (not bytes). A
 * part's rank and the plans it was saved from give the same number; a part
 * that lost, renamed or reshaped a tensor does not. v: one chunk each.
 */
int tensors_signature(const struct manifest_tensor *v, size_t n, uint64_t *sig);
/* The signature of what a part's rank holds (its holds, else what it wrote; a summary's: as said).
 */
int part_rank_signature(const struct part_rank *k, uint64_t *sig);
/*
 * The signature of what a part's rank wrote (its tensors; a summary's as
 * said): -ENOENT where a summary does not say, -ENOMEM.
 */
int part_rank_written_signature(const struct part_rank *k, uint64_t *sig);
/* The node's ranks as "4,5" (or "4-7") into buf, for messages. */
void part_ranks_text(const int *ranks, size_t n, char *buf, size_t len);
/* "n1 (ranks 4,5)": a node and its ranks, for messages. */
void part_node_text(const char *node, const int *ranks, size_t n, char *buf, size_t len);

/*
 * The manifest of parts[0..n): one job, step, run and world; every rank
 * exactly once; tensors on several ranks only as chunks of one sharded
 * tensor. Deterministic: the same parts give the same manifest, byte for
 * byte, whoever merges them (sorted; times from the parts, no clock).
 */
int manifest_merge(struct part *const *parts, size_t n, struct manifest **out, char *err);
/* The same of some parts of a step (each rank at most once): partial, not checked whole. */
int manifest_merge_some(struct part *const *parts, size_t n, struct manifest **out, char *err);
/*
 * The head (format 4) of parts[0..n), each read back with its file's
 * length and XXH3-64 (part.file_size, part.file_xxh3): what manifest_merge
 * would say of them but the ranks' files and the tensors, and `tensors`,
 * the number of tensors the parts hold. The parts' tensors may have been
 * let go (part_strip). Deterministic, as manifest_merge. head_only.
 */
int manifest_merge_head(struct part *const *parts, size_t n, size_t tensors, struct manifest **out,
                        char *err);
/*
 * A head and the parts it names, read back (each checked against its
 * length and XXH3-64 first): the whole manifest (manifest_merge), checked
 * to say what the head says. Takes nothing; *out is new.
 */
int manifest_assemble(const struct manifest *head, struct part *const *parts, size_t n,
                      struct manifest **out, char *err);
/*
 * Of a head, the part named parts_of[0..n) (indexes into head->parts) and
 * those parts, read back: a partial manifest (manifest_merge_some) that
 * says of the rest what the head says.
 */
int manifest_assemble_some(const struct manifest *head, const size_t *parts_of,
                           struct part *const *parts, size_t n, struct manifest **out, char *err);

/* ---- plans files (docs/DESIGN.md §6.5): the plans a node serves for a job */

#define PLANS_FORMAT "ckptd-plans"
#define PLANS_VERSION 1
/*
 * A plans file's summary, <job>/plans/<node>.sum: the file without its
 * tensors, each rank's tensors_signature in their place, and the file's
 * digest. About 60 bytes a rank, whatever the tensors: what every node reads
 * of every other to know who holds which rank (docs/DESIGN.md §6.5).
 */
#define PLANS_SUMMARY_FORMAT "ckptd-plans-summary"
#define PLANS_SUMMARY_VERSION 1

struct plans_rank {
	int rank;
	unsigned copies; /* the plan's option: ranks writing each replicated box (>= 1) */
	size_t ntensors; /* in the rank's file order */
	struct manifest_tensor *tensors; /* one chunk each: shape, offsets; no bytes */
	uint64_t sig; /* a summary's: tensors_signature of them (has_sig); no tensors then */
	bool has_sig;
};

struct plans_file {
	int version;
	char *job, *node, *run;
	int world;
	char digest[17]; /* XXH3-64 of the content, hex: equal digests, equal plan sets */
	/*
	 * Its node writes replicas once and reads parts version 2 and manifests
	 * version 3 ("writes_once": true): a job's ranks write replicas once
	 * only where every node's file says so (an older agent's does not).
	 */
	bool writes_once;
	bool summary; /* read from a summary: ranks with signatures, no tensors */
	size_t nranks; /* ascending */
	struct plans_rank *ranks;
};

/* Fills in the digest and writes the file's bytes. */
int plans_to_json(struct plans_file *f, char **out, size_t *len, char *err);
int plans_from_json(const char *buf, size_t len, struct plans_file **out, char *err);
/* f's summary (its digest filled in first by plans_to_json), and back (summary set). */
int plans_summary_to_json(const struct plans_file *f, char **out, size_t *len, char *err);
int plans_summary_from_json(const char *buf, size_t len, struct plans_file **out, char *err);
/* What a plans rank holds as one number: its summary's, or its tensors' (-ENOMEM). */
int plans_rank_signature(const struct plans_rank *k, uint64_t *sig);
/* f made its summary in place: each rank's signature for its tensors, let go. -ENOMEM. */
int plans_summarize(struct plans_file *f);
void plans_free(struct plans_file *f);
/* What k holds let go, k emptied (not freed). */
void plans_rank_clear(struct plans_rank *k);

/*
 * A run's roster, <job>/plans/<run>.roster: every node's summary of one run
 * in one file, written by the node of rank 0 from the summaries it read,
 * with the job's plans generation it read before them (readers take it
 * only where the generation has not moved since). The other nodes read it
 * in place of every node's summary: one read a node, not one per node.
 */
#define ROSTER_FORMAT "ckptd-roster"
#define ROSTER_VERSION 1

struct roster_file {
	char *job, *run;
	int world;
	uint64_t generation;
	size_t nnodes; /* in name order, no rank twice */
	struct plans_file **nodes; /* summaries (or files: their ranks' signatures are written) */
};

int roster_file_to_json(const struct roster_file *r, char **out, size_t *len, char *err);
int roster_file_from_json(const char *buf, size_t len, struct roster_file **out, char *err);
/* What r holds let go, r emptied (not freed); and r freed. */
void roster_file_clear(struct roster_file *r);
void roster_file_free(struct roster_file *r);

/*
 * A node's share of a run's dedup assignment, <job>/plans/<node>.share:
 * what each of its ranks writes of what it holds, where that is not all of
 * it. Written by the node of rank 0, which reads every plans file whole
 * and computes the assignment (layout/assign.c) for every node, so that
 * the others read one small object in place of every node's file. A reader
 * takes it only for the plan set it names (`set`: the key of every rank's
 * signature, its node and the copies), each rank's signature the one its
 * live plan has, and each cut within that plan's tensors (assign.h,
 * assign_rank_of_share).
 */
#define SHARE_FORMAT "ckptd-plans-share"
#define SHARE_VERSION 1

/* A tensor its rank does not write whole: the rows it writes (0: none of it). */
struct share_cut {
	size_t tensor; /* its index among the rank's tensors in name order, ascending */
	int64_t row0, rows;
};

struct share_rank {
	int rank;
	uint64_t sig; /* tensors_signature of what its plan holds */
	size_t ntensors;
	size_t ncuts; /* none: it writes all it holds */
	struct share_cut *cuts;
};

struct plans_share {
	char *job, *node, *run;
	int world;
	uint64_t set; /* the plan set's key (agent/node/layouts.c), never 0 */
	size_t nranks; /* ascending */
	struct share_rank *ranks;
};

/*
 * A run's plan set as rank 0's node last found it, <job>/plans/<run>.set:
 * its key, and the job's plans generation read before the summaries that
 * made it. Written after every node's share of that set; a reader whose
 * generation is the same knows that no plans file changed since, so the
 * share it reads of that key is of the set as it is. `writes_all`: no
 * assignment (an older agent's node, copies as many as the world), and no
 * shares: every rank writes all it holds.
 */
#define SET_MARK_FORMAT "ckptd-plans-set"
#define SET_MARK_VERSION 1

struct set_mark {
	char *job, *run;
	int world;
	uint64_t set; /* 0: the plans held no complete set (a rank missing, or twice) */
	uint64_t generation; /* not 0 */
	bool writes_all;
};

int set_mark_to_json(const struct set_mark *m, char **out, size_t *len, char *err);
int set_mark_from_json(const char *buf, size_t len, struct set_mark **out, char *err);
void set_mark_free(struct set_mark *m);

int share_to_json(const struct plans_share *s, char **out, size_t *len, char *err);
int share_from_json(const char *buf, size_t len, struct plans_share **out, char *err);
void share_free(struct plans_share *s);

#endif /* CKPT_STORAGE_FORMAT_H */
