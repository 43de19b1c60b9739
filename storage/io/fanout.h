/*
 * fanout: many small reads of a store at once (the parts of a commit of
 * many nodes, the parts a head names): the latency of a shared filesystem
 * or an object store is paid about once per `width` reads, not once per
 * read. Any thread; each call makes its own threads and joins them.
 */
#ifndef CKPT_STORAGE_FANOUT_H
#define CKPT_STORAGE_FANOUT_H

#include <stddef.h>

/* Reads in flight at once by default: a shared filesystem's or S3's latency, hidden. */
#define FANOUT_WIDTH 64u

/*
 * Runs fn(arg, i) for every i in [0, n), on up to `width` threads, the
 * caller's among them, and returns once every call returned. Where a
 * thread cannot be made, the others (at least the caller) run its share.
 */
void fanout_run(size_t n, unsigned width, void (*fn)(void *arg, size_t i), void *arg);

#endif /* CKPT_STORAGE_FANOUT_H */
