/*
 * Boxes of a global tensor (docs/DESIGN.md §2.2): an offset and a shape in it.
 * What a restore into another split needs: where two boxes overlap, and the
 * overlap as runs of contiguous bytes in a saved chunk and in the rank's
 * tensor (both row-major).
 */
#ifndef CKPT_LAYOUT_BOX_H
#define CKPT_LAYOUT_BOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ipc/base/base.h"

/*
 * The overlap of a chunk of the saved tensor with a box of the rank's, as
 * runs: run k is `run` bytes at src(k) in the chunk and at dst(k) in the
 * rank's tensor, src(k) increasing with k.
 */
struct box_copy {
	size_t outer; /* the dimensions counted by k */
	int64_t count[IPC_MAX_NDIM]; /* the overlap's extent along each of them */
	uint64_t sstride[IPC_MAX_NDIM], dstride[IPC_MAX_NDIM];
	uint64_t src0, dst0; /* run 0 */
	uint64_t nruns, run;
	uint64_t next; /* the copy's cursor: the first run not yet wholly copied */
};

/* A shape or an offset as "[a,b,c]" into buf (cut to len), for messages. */
void box_text(const int64_t *v, size_t n, char *buf, size_t len);

/* Elements in a box of this shape (0-d: 1). */
uint64_t box_volume(size_t nd, const int64_t *shape);

/* The overlap of boxes a and b (offsets and shapes): false if they share no element. */
bool box_intersect(size_t nd, const int64_t *aoff, const int64_t *ashape, const int64_t *boff,
                   const int64_t *bshape, int64_t *ooff, int64_t *oshape);

/* True if box a holds all of box b. */
bool box_contains(size_t nd, const int64_t *aoff, const int64_t *ashape, const int64_t *boff,
                  const int64_t *bshape);

/*
 * Box u less its part i (i inside u, not empty): what is left, as at most
 * 2 * nd disjoint boxes into off[k], shape[k]; how many.
 */
size_t box_subtract(size_t nd, const int64_t *uoff, const int64_t *ushape, const int64_t *ioff,
                    const int64_t *ishape, int64_t (*off)[IPC_MAX_NDIM],
                    int64_t (*shape)[IPC_MAX_NDIM]);

/*
 * The runs of the overlap (ooff, oshape) of a chunk (coff, cshape) and the
 * rank's box (doff, dshape), elements of es bytes. Trailing dimensions both
 * hold whole make runs longer: a split along dimension 0 is one run.
 */
void box_copy_init(struct box_copy *bc, size_t nd, uint64_t es, const int64_t *coff,
                   const int64_t *cshape, const int64_t *doff, const int64_t *dshape,
                   const int64_t *ooff, const int64_t *oshape);

/* Run k's byte offsets in the chunk and in the rank's tensor. */
void box_copy_run(const struct box_copy *bc, uint64_t k, uint64_t *src, uint64_t *dst);

#endif /* CKPT_LAYOUT_BOX_H */
