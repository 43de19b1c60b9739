/*
 * Whether a checkpoint's written chunks cover every box its ranks hold
 * (docs/DESIGN.md §7.4): with replicas written once, a rank's file may hold
 * none of a box it holds, and the commit must never name a checkpoint in
 * which some row of a held box was written by no rank (two nodes that
 * assigned the writers from different plan sets could leave one).
 */
#ifndef CKPT_LAYOUT_COVER_H
#define CKPT_LAYOUT_COVER_H

#include "storage/format/format.h"

/* Pieces of one held box still uncovered that the check follows at once, at most. */
#define COVER_MAX_PIECES 4096u

/*
 * 0 if every rank's holds (format 3) are covered by the chunks of m;
 * -EINVAL naming the tensor, the box and a rank holding it if not (a
 * tensor no chunk is of, even an empty one); -E2BIG if the chunks cut a
 * box into more than COVER_MAX_PIECES pieces or the check would take too
 * long (hostile parts); -ENOMEM.
 */
int cover_check(const struct manifest *m, char *err);

#endif /* CKPT_LAYOUT_COVER_H */
