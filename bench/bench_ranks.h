/*
 * The benchmarks' ranks: one process each (a client of its own, as
 * trainers are), started together; each writes one line of results to a
 * pipe, which the caller reads back. Used by reshard_bench and dedup_bench.
 */
#ifndef CKPT_BENCH_RANKS_H
#define CKPT_BENCH_RANKS_H

#define FANOUT_MAX 64 /* ranks at most */

/* One rank's work: its line to fd; its return is its exit status. */
typedef int (*fanout_rank_fn)(int rank, int world, void *arg, int fd);
/* Each line a rank wrote, in the order they came. */
typedef void (*fanout_line_fn)(const char *line, void *acc);

/* world ranks of fn at once; their lines to line. 0 if every rank exited 0, else -1. */
int fanout(int world, fanout_rank_fn fn, void *arg, fanout_line_fn line, void *acc);

#endif /* CKPT_BENCH_RANKS_H */
