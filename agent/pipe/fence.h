/*
 * A CUDA plan's fence: the numbers of its saves, released in order. Each
 * accepted save gets the next number; when it is CAPTURED (or fails, or is
 * skipped) it is finished; the fence word the trainer's GPU waits on
 * (ckpt_save_fence) may only move past n once every save up to n has
 * finished, whatever order they finish in. At most 64 saves of one plan are
 * unfinished at once.
 *
 * Pure; the caller serialises (agent.mu).
 */
#ifndef CKPT_AGENT_FENCE_H
#define CKPT_AGENT_FENCE_H

#include <errno.h>
#include <stdint.h>

#define FENCE_WINDOW 64

struct fence {
	uint32_t issued; /* the last number given out */
	uint32_t released; /* the fence word: every save up to it has finished */
	uint64_t done; /* bit i: save released + 1 + i has finished */
};

/* The next save's number; -EBUSY with FENCE_WINDOW saves unfinished. */
static inline int fence_issue(struct fence *f, uint32_t *seq)
{
	if (f->issued - f->released >= FENCE_WINDOW)
		return -EBUSY;
	*seq = ++f->issued;
	return 0;
}

/* Save `seq` has finished; returns the fence word now (store it). */
static inline uint32_t fence_finish(struct fence *f, uint32_t seq)
{
	uint32_t ahead = seq - f->released; /* 1 .. FENCE_WINDOW when valid */

	if (ahead == 0 || ahead > FENCE_WINDOW || seq - f->released > f->issued - f->released)
		return f->released; /* already released, or not ours */
	f->done |= 1ull << (ahead - 1);
	while (f->done & 1) {
		f->done >>= 1;
		f->released++;
	}
	return f->released;
}

#endif /* CKPT_AGENT_FENCE_H */
