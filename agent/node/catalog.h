/*
 * agent/node/catalog.h: the committed checkpoints (catalog.c), as found on
 * the root at start and since.
 *
 * Locks: the catalog is under agent.mu, but catalog_load (at start, alone)
 * and the calls that say they read the root (not under mu).
 */
#ifndef CKPT_AGENT_NODE_CATALOG_H
#define CKPT_AGENT_NODE_CATALOG_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

#include "agent/node/node.h"
#include "storage/format/format.h"

struct cat_entry {
	char job[IPC_MAX_JOB + 1];
	int64_t step;
	int world;
	uint64_t bytes;
	int64_t time_unix_ns;
	uint32_t tensors;
	double capture_seconds, durable_seconds, commit_seconds;
	unsigned readers; /* restores and verifies reading it */
	bool pinned;
	char run[IPC_MAX_JOB + 1];
	uint32_t nparts; /* nodes whose parts it merged (0: a format-1 manifest) */
	/*
	 * Why it cannot be restored whole, as last found ("": as far as known,
	 * it can): its manifest unreadable (`unreadable`: read again at each
	 * sync), a file missing or not what the manifest says (at start, for
	 * a step newer than LATEST), or a restore or verify that met damage.
	 * Committed still: it is listed (DAMAGED), never taken for absent.
	 */
	char damage[IPC_ERRLEN / 2];
	bool unreadable;
};

int catalog_create(struct catalog **out);
void catalog_destroy(struct catalog *c);
/*
 * Reads every committed manifest under the storage; one that cannot be
 * read, or a step newer than its job's LATEST whose files are not as its
 * manifest says, is listed as damaged (cat_entry.damage), and logged.
 */
int catalog_load(struct catalog *c, struct storage *s, char *err);
/*
 * Takes what the storage holds of one job: entries whose manifest is gone
 * go, committed steps not yet known are read (another node committed
 * them). Under no lock (it reads the disk): the agent's mu is taken inside.
 */
void catalog_sync_job(struct agent *a, const char *job);
/*
 * catalog_sync_job for every job the catalog lists and every job the root
 * holds, each once. Reads the root: not under mu.
 */
void catalog_sync_all(struct agent *a);
int catalog_add(struct catalog *c, const struct cat_entry *e);
void catalog_entry_from_manifest(const struct manifest *m, struct cat_entry *e);
struct cat_entry *catalog_find(struct catalog *c, const char *job, int64_t step);
/* The newest step of job strictly below `below` (INT64_MAX: the newest), damaged or not. */
struct cat_entry *catalog_newest(struct catalog *c, const char *job, int64_t below);
/* The same, leaving out damaged ones: what a restore of LATEST means. */
struct cat_entry *catalog_newest_whole(struct catalog *c, const char *job, int64_t below);
/* Under mu: (job, step) found damaged (why), or whole again (why NULL); false if not listed. */
bool catalog_set_damage(struct catalog *c, const char *job, int64_t step, const char *why);
/* Under mu: how many listed steps are known damaged (a gauge). */
size_t catalog_damaged(const struct catalog *c);
void catalog_remove(struct catalog *c, const char *job, int64_t step);
/* Removes every entry no restore or verify reads now: the root holding them is gone. */
size_t catalog_drop_unread(struct catalog *c);
/* Entries of job (NULL: all), oldest first; *out malloc'd array of pointers. */
size_t catalog_list(struct catalog *c, const char *job, struct cat_entry ***out);

#endif /* CKPT_AGENT_NODE_CATALOG_H */
