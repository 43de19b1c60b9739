/*
 * Who writes each replicated box (docs/DESIGN.md §2.2, §7.4): ranks whose plans
 * hold the same box (tensor name, dtype, global shape, global offset, local
 * shape) are its replicas, and the box is written `copies` times, by
 * replicas chosen so the bytes each rank writes are balanced. A tensor
 * without a global offset is private to its rank and always written by it;
 * so is a box that one rank alone holds.
 *
 * A replicated box may be cut into pieces along its first dimension (rows:
 * contiguous bytes in every replica's memory), each piece written by other
 * replicas: one large tensor would otherwise make one writer the slowest.
 * A rank writes at most one piece of a box, and the copies of a piece are
 * on different ranks (on different nodes where the replicas allow).
 *
 * The assignment depends on the plans alone, never on the order they came
 * in: every agent of a job computes the same one from the published plans
 * files, once per plan set.
 */
#ifndef CKPT_LAYOUT_ASSIGN_H
#define CKPT_LAYOUT_ASSIGN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/format/format.h"

/* A replicated box of B bytes is cut into B / ASSIGN_MIN_PIECE pieces at most. */
#define ASSIGN_MIN_PIECE (4ull << 20)

/* One rank's plan as the assignment reads it: a plans file's rank, and its node. */
struct assign_input {
	const char *node;
	const struct plans_rank *rank;
};

/* What a rank writes of one tensor of its plan. */
struct assign_piece {
	bool writes;
	int64_t row0, rows; /* along the first dimension (a 0-d tensor: 0, 1) */
	uint64_t nbytes;
};

struct assign_rank {
	int rank;
	const char *node; /* the input's (not copied) */
	size_t ntensors;
	struct assign_piece *piece; /* per tensor of its plan, in its file order */
	uint64_t held_bytes; /* what its plan holds */
	uint64_t bytes; /* what it writes */
	uint64_t private_bytes; /* of which its own tensors and boxes no other rank holds */
};

struct assignment {
	unsigned copies; /* asked for */
	size_t nranks;
	struct assign_rank *r; /* ascending rank */
	size_t nboxes; /* boxes held by more than one rank */
	size_t npieces; /* what they were cut into */
	size_t nshort; /* pieces written fewer than `copies` times (too few replicas) */
	uint64_t unique_bytes; /* every box once, private tensors included */
	uint64_t written_bytes; /* what all ranks write together */
};

/*
 * The assignment of n ranks' plans (each rank once). copies >= 1. 0, or a
 * negative errno with err: a rank twice, a rank holding one box twice, a
 * plan's tensor in pieces, out of memory.
 */
int assign_compute(const struct assign_input *in, size_t n, unsigned copies,
                   struct assignment **out, char *err);
void assign_free(struct assignment *a);

/* The rank's entry, or NULL if it has none. */
const struct assign_rank *assign_rank(const struct assignment *a, int rank);

/*
 * What r writes of k (its plan, the assignment's input) as a share says it
 * (format.h, struct share_rank: its signature, each tensor it does not
 * write whole). -ENOMEM.
 */
int assign_share_of(const struct assign_rank *r, const struct plans_rank *k,
                    struct share_rank *out);
/*
 * The rank's entry from a share another node wrote, checked against k
 * (what the rank's live plan holds): the same signature and tensor count;
 * each cut a tensor with a global offset (a private one is always written
 * by its rank), within its rows. out->piece is malloc'd (out->node NULL).
 * -EINVAL with err where the share cannot be of k.
 */
int assign_rank_of_share(const struct share_rank *s, const struct plans_rank *k,
                         struct assign_rank *out, char *err);

/*
 * The signature (tensors_signature) of what r writes of k as its part says
 * it: each tensor it writes, cut to its piece (the first dimension's rows
 * from row0, the global offset moved by as many). -ENOMEM.
 */
int assign_written_signature(const struct assign_rank *r, const struct plans_rank *k,
                             uint64_t *sig);

/*
 * The balance over the ranks whose plans hold any bytes: the largest
 * bytes written ÷ their mean (1.0: even); 1.0 if none.
 */
double assign_balance(const struct assignment *a);

#endif /* CKPT_LAYOUT_ASSIGN_H */
