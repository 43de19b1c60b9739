/*
 * agent/node/owners.h: the owners of jobs and what each user (uid) holds
 * against [limits] (owners.c).
 *
 * Locks: the owners and usage tables are under agent.mu, as each call says.
 */
#ifndef CKPT_AGENT_NODE_OWNERS_H
#define CKPT_AGENT_NODE_OWNERS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent/node/node.h"

enum use_kind {
	USE_SESSIONS,
	USE_PLANS,
	USE_TENSORS,
	USE_REGIONS,
	USE_REGION_BYTES,
	USE_WATCHERS,
	USE_NKINDS
};

/* Under mu: the owner known in memory: 0; -ENOENT: none; -EAGAIN: not looked up yet. */
int owner_lookup(struct agent *a, const char *job, uint32_t *uid);
void owner_note(struct agent *a, const char *job, bool found, uint32_t uid);
/* Not under mu (reads the root): the job's owner into memory. */
int owner_load(struct agent *a, const char *job, char *err);
/* At start: the owners of every job in the root. */
int owners_load_all(struct agent *a, char *err);
void owners_free(struct agent *a);
/* Under mu: -EAGAIN naming the limit and its key when uid would hold too much. */
int usage_charge(struct agent *a, uid_t uid, enum use_kind k, uint64_t n, char *err);
void usage_release(struct agent *a, uid_t uid, enum use_kind k, uint64_t n);
uint64_t usage_held(struct agent *a, uid_t uid, enum use_kind k);

#endif /* CKPT_AGENT_NODE_OWNERS_H */
