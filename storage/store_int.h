/*
 * storage/store_int.h: private to the store's files (store.c, store_part.c,
 * store_plans.c, store_step.c): the helpers more than one of them uses.
 * Nothing outside storage/ includes it.
 */
#ifndef CKPT_STORAGE_STORE_INT_H
#define CKPT_STORAGE_STORE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/store.h"

/* store_key.c: the job's name checked, and a step >= 0; -EINVAL and err. */
int store_check_job_step(const char *job, int64_t step, char *err);

/*
 * store_part.c: parts and plans files parsed at once, in this process: as
 * many as there are cores. enter waits for a turn; leave gives it back.
 */
void store_parse_enter(void);
void store_parse_leave(void);

/*
 * store_part.c: a node's own object (its part, its plans): create-once; one
 * of its own from before in the way (an earlier attempt, a run that died,
 * an older plan set) is done if it holds the same bytes, else replaced
 * whole. *written: whether bytes went out. Takes json.
 */
int store_put_own(struct storage *s, const char *key, char *json, size_t len, const char *guard,
                  bool *written, char *err);

#endif /* CKPT_STORAGE_STORE_INT_H */
