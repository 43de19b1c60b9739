/*
 * The copier: one copy split across threads. A capture worker hands it a
 * chunk's copy; the copy is cut into parts which the caller and the
 * copier's helper threads claim one by one (an atomic counter), and the call
 * returns when every part is done. One core's memcpy is bound by its memory
 * latency, not by the memory's bandwidth: two copying threads move about
 * 1.8x as much on the 2-core machines here, and the trainer's stall is that
 * copy.
 *
 * One copy at a time uses the helpers; a caller that finds them busy (another
 * rank's capture) copies alone, which is what several ranks at once want.
 */
#ifndef CKPT_AGENT_COPIER_H
#define CKPT_AGENT_COPIER_H

#include <stdint.h>

struct copier;

/* Copies [off, off + len) of an image into dst: the part's worth of work; 0 or -errno. */
typedef int (*copier_fn)(const void *src, uint64_t off, void *dst, uint64_t len);

/* helpers: threads besides the caller (0: the caller always copies alone). */
int copier_create(unsigned helpers, struct copier **out, char *err);
void copier_destroy(struct copier *c);
/*
 * fn over [off, off + len) into dst, split into parts of at least min_part
 * bytes; the first part's error (every part is still run), or 0.
 */
int copier_run(struct copier *c, copier_fn fn, const void *src, uint64_t off, void *dst,
               uint64_t len, uint64_t min_part);
unsigned copier_helpers(const struct copier *c);

#endif /* CKPT_AGENT_COPIER_H */
