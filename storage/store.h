/*
 * storage/store.h: the layout and the commit's files over any backend
 * (store.c). Keys, then what the protocol reads and writes by exact key
 * (docs/DESIGN.md §6.1, §7.1):
 *
 *   <job>/plans/<node>.json                  a node's plans, rewritten when they change
 *   <job>/plans/<node>.sum                   their ranks and signatures, written after them
 *   <job>/plans/<run>.roster                 every node's summary of a run, by rank 0's node
 *   <job>/plans/<node>.share                 what its ranks write of replicas, by rank 0's node
 *   <job>/plans/<run>.set                    for which generation the shares are, after them
 *   <job>/plans/generation                   a new number after any of them changed
 *   <job>/step-<12d>/parts/<node>.json       a node's part, create-once
 *   <job>/step-<12d>/parts/<node>.sum        what a committer needs of it, written after it
 *   <job>/step-<12d>/manifest.json           the commit, create-once
 *   <job>/step-<12d>/pinned                  a pin (empty)
 *   <job>/LATEST                             a hint: the newest committed step, only forward
 *
 * Nothing here knows whether the backend is a directory or a bucket.
 * Synchronous, any thread; 0 or negative errno, a sentence in err naming
 * the key.
 */
#ifndef CKPT_STORAGE_STORE_H
#define CKPT_STORAGE_STORE_H

#include "storage/storage.h"

#define STORE_KEY_MAX 256

/* "<job>[/step-<12d>][/leaf]" (step < 0: none; leaf NULL: none). */
void store_key(char *buf, size_t len, const char *job, int64_t step, const char *leaf);
/*
 * "<job>/step-<12d>/parts/<node>.json", its summary "parts/<node>.sum",
 * and "<job>/plans/<node>.json", its summary "plans/<node>.sum".
 */
void store_part_key(char *buf, size_t len, const char *job, int64_t step, const char *node);
void store_part_summary_key(char *buf, size_t len, const char *job, int64_t step, const char *node);
void store_plans_key(char *buf, size_t len, const char *job, const char *node);
void store_plans_summary_key(char *buf, size_t len, const char *job, const char *node);

/*
 * The manifest of (job, step), whole: checked, naming that job and step;
 * -ENOENT if none. A head (format 4) comes with the parts it names, read
 * at once (FANOUT_WIDTH in flight), each the part the head names (its
 * length and XXH3-64): a part missing or replaced since is -EBADMSG (the
 * step is damaged), never -ENOENT.
 */
int store_read_manifest(struct storage *s, const char *job, int64_t step, struct manifest **out,
                        char *err);
/*
 * The same, but of a head only the head (head_only: no ranks, no tensors;
 * one read however large the job): what a list, a watching node and the
 * catalog need. Formats 1-3 come whole.
 */
int store_read_manifest_head(struct storage *s, const char *job, int64_t step,
                             struct manifest **out, char *err);
/*
 * What a restore of `rank` in the layout it was saved from needs: of a
 * head, the part that brought the rank (partial: one read beside the
 * head); of a rank past the saving world, or formats 1-3, the whole.
 */
int store_read_manifest_rank(struct storage *s, const char *job, int64_t step, int rank,
                             struct manifest **out, char *err);
/*
 * Writes the manifest create-once. -EEXIST if one is there already (the
 * caller reads it back: another agent committed first).
 */
int store_put_manifest(struct storage *s, const struct manifest *m, char *err);

/*
 * Undoes the commit of (job, step), a checkpoint found damaged that a new
 * save of the step replaces: its manifest is kept aside in the step
 * ("manifest.damaged.<node>.<unix seconds>.json"), then removed; the step
 * is then uncommitted, and the new save commits it anew (its shards of a
 * new attempt, its part in place of the old). 0 also where there is none.
 */
int store_retire_manifest(struct storage *s, const char *job, int64_t step, const char *node,
                          char *err);

/*
 * A node's part of (job, step): -ENOENT if not there yet, -EINVAL if it is
 * no part. Its bytes' length and XXH3-64 in p->file_size, file_xxh3.
 */
int store_read_part(struct storage *s, const char *job, int64_t step, const char *node,
                    struct part **out, char *err);
/*
 * Its summary (format.h, part_summary_from_json): -ENOENT if not there (not
 * yet, or its node is older), -EINVAL if it is none. Small whatever the
 * part: what a committer reads of each node.
 */
int store_read_part_summary(struct storage *s, const char *job, int64_t step, const char *node,
                            struct part **out, char *err);
/*
 * Writes this node's part, once, then its summary (parts/<node>.sum; any
 * summary there goes first, so none is ever of another part). Already
 * there with the same bytes: done.
 * A part of an earlier attempt or another run in the way is replaced
 * atomically: a merge takes one whole part or the other, never a mix;
 * but not once the step is committed (a head names parts by their bytes):
 * -EEXIST.
 */
int store_put_part(struct storage *s, const struct part *p, char *err);

/*
 * The part of (job, step, node) and the manifest of (job, step), copied
 * byte for byte from one store to another (the upload tier): the part as
 * a node's own (store_put_part's create-once or replace), the manifest
 * create-once (-EEXIST: there). A head names parts by their bytes: copies
 * keep what it names. Each is parsed and checked before it goes.
 */
int store_copy_part(struct storage *from, struct storage *to, const char *job, int64_t step,
                    const char *node, char *err);
int store_copy_manifest(struct storage *from, struct storage *to, const char *job, int64_t step,
                        char *err);

/* The plans a node serves: -ENOENT if it has published none. */
int store_read_plans(struct storage *s, const char *job, const char *node, struct plans_file **out,
                     char *err);
/*
 * Their summary (format.h, plans_summary_from_json: ranks and signatures,
 * no tensors): -ENOENT if there is none (not written yet, or an older
 * agent's node): then the file says.
 */
int store_read_plans_summary(struct storage *s, const char *job, const char *node,
                             struct plans_file **out, char *err);
/* One node's plans as store_read_plans_many read them. */
struct store_plans_read {
	struct plans_file *f; /* NULL where nothing could be read: rc, msg say why */
	int rc;
	char msg[IPC_ERRLEN];
};
/*
 * The plans of nodes[0..n) of job, FANOUT_WIDTH read at once into out[0..n):
 * each node's summary (unless whole) where it has one that parses, else its
 * file whole. The caller frees each out[i].f.
 */
void store_read_plans_many(struct storage *s, const char *job, char *const *nodes, size_t n,
                           bool whole, struct store_plans_read *out);
/*
 * Publishes them, then their summary (one of other plans is removed before
 * the file changes, so a summary never says what its file does not);
 * *written: false when the same plan set was there already. Either written
 * is followed by a new number in "<job>/plans/generation".
 */
int store_put_plans(struct storage *s, struct plans_file *f, bool *written, char *err);
/*
 * The job's plans generation: a number that changes after any node's plans
 * file changed (every writer puts a random one after its file). Read before
 * the files, an unchanged number says none changed since. 0: none there,
 * or not one this code wrote (older agents): read the files.
 */
int store_plans_generation(struct storage *s, const char *job, uint64_t *gen, char *err);
/*
 * A run's roster (format.h, roster_file_from_json), checked to be of that
 * job and run: -ENOENT where none was written. Put: written where it is
 * not there with the same bytes.
 */
int store_read_roster(struct storage *s, const char *job, const char *run, struct roster_file **out,
                      char *err);
int store_put_roster(struct storage *s, const struct roster_file *r, char *err);
/*
 * A node's share of its run's dedup assignment (format.h, share_from_json),
 * checked to be that node's of that job: -ENOENT where none was written.
 */
int store_read_share(struct storage *s, const char *job, const char *node, struct plans_share **out,
                     char *err);
/*
 * Puts v[0..n), each replacing its node's share, FANOUT_WIDTH at once. The
 * count of those not put; where any, err says why one was not.
 */
size_t store_put_shares(struct storage *s, struct plans_share *const *v, size_t n, char *err);
/* A run's set mark (format.h), checked to be of that job and run: -ENOENT where none. */
int store_read_set_mark(struct storage *s, const char *job, const char *run, struct set_mark **out,
                        char *err);
/* Put, replacing the run's. */
int store_put_set_mark(struct storage *s, const struct set_mark *m, char *err);
/* The nodes that have published plans for job (sorted, malloc'd); discovery only. */
int store_list_nodes(struct storage *s, const char *job, char ***nodes, size_t *n, char *err);

/* LATEST: -ENOENT if none, -EINVAL if it is not a step number. */
int store_latest_get(struct storage *s, const char *job, int64_t *step, char *err);
/*
 * The newest step of job whose manifest is there (a listing; no file is
 * read): what LATEST would name, where LATEST itself is lost or unreadable.
 * -ENOENT if none.
 */
int store_newest_committed(struct storage *s, const char *job, int64_t *step, char *err);
/*
 * Moves LATEST to step unless it names a newer one already; read back after
 * the write, so that a racing writer of an older step is undone.
 */
int store_latest_advance(struct storage *s, const char *job, int64_t step, char *err);

/*
 * The job's owner (<job>/OWNER: the uid that first planned it, written
 * once): 0 and *uid; -ENOENT when none is recorded; -EBADMSG unreadable.
 */
int store_owner_get(struct storage *s, const char *job, uint32_t *uid, char *err);
/* Records uid as the owner unless one is; *owner: whoever owns it now. */
int store_owner_claim(struct storage *s, const char *job, uint32_t uid, uint32_t *owner, char *err);

/*
 * Makes the manifest of (job, step), which is there, durable under its name
 * (store_put_manifest failed after it became visible).
 */
int store_sync_manifest(struct storage *s, const char *job, int64_t step, char *err);
/* Whether (job, step) has a manifest (a stat, no read). */
bool store_committed(struct storage *s, const char *job, int64_t step);
/* Pins (or unpins) a committed checkpoint durably; -ENOENT when it is not committed. */
int store_set_pinned(struct storage *s, const char *job, int64_t step, bool pinned, char *err);
/* Removes a checkpoint; LATEST first moves off it (to the newest other committed step). */
int store_remove(struct storage *s, const char *job, int64_t step, char *err);

/*
 * Clean-up of one job (job) or all (NULL), under the rules of struct
 * storage_cleanup, then LATEST made to name the newest committed step (only
 * forward, or off a step that is gone). Keeps going past errors; returns the
 * first.
 */
int store_cleanup(struct storage *s, const char *job, const struct storage_cleanup *pol,
                  struct storage_recovery *rec, char *err);

/* ---- what ties parts and manifests to the shards' bytes (stamp.c) ------- */

/*
 * The safetensors header of shard `file` of (job, step): one small read
 * of `hint` bytes (what the header is said to be; 0: 64 KiB), a second
 * only where the header is longer, parsed as hostile input; *size: the
 * file's. -ENOENT: not there; -EBADMSG: not a safetensors header that fits
 * the file, or no file under its name (a link, a directory).
 */
int store_read_header(struct storage *s, const char *job, int64_t step, const char *file,
                      uint64_t hint, struct st_header **out, uint64_t *size, char *err);

/* What a part or a manifest says of one rank's file. */
struct store_claim {
	const char *run;
	int64_t step;
	int rank;
	const char *file;
	uint64_t size, header_bytes;
	uint64_t save; /* its stamp; 0: none claimed (an older agent's file) */
};

/*
 * Whether the file is what c says: there, of its size, its header of
 * header_bytes and of c's run and rank, stamped with c's step and save (a
 * file an older agent wrote carries no stamp: then c claims none). One read
 * of its header (header_bytes, rounded up to 4 KiB). 0; -EBADMSG saying what differs; else why it
 * could not be read (-ENOENT: not there; -EIO, ...).
 */
int store_check_file(struct storage *s, const char *job, const struct store_claim *c, char *err);
/*
 * The same question for a commit of many files: answered from the file's
 * first 4 KiB, unparsed (its size, its header's length, and its header's
 * step, save, run and rank each said once as c claims), and where that
 * does not say yes, by store_check_file (then its answer and its words).
 */
int store_check_bound(struct storage *s, const char *job, const struct store_claim *c, char *err);

/*
 * Whether (job, step) is whole as far as its files' heads tell: its
 * manifest read and checked, every rank's file as the manifest says
 * (store_check_file); no tensor byte is read. 0; -ENOENT: no manifest;
 * -EBADMSG: damaged (what, in err); else why it could not tell (-EIO).
 * O(world) small reads: for start-up and for a step about to be named
 * LATEST, not per save.
 */
int store_step_intact(struct storage *s, const char *job, int64_t step, char *err);
/* The same of a manifest read already (stamp.c; store_step_intact reads it). */
int store_files_intact(struct storage *s, const struct manifest *m, char *err);

#endif /* CKPT_STORAGE_STORE_H */
