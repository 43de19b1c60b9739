/*
 * scale_bench.h: what the parts of scale_bench share (scale_bench.c: the
 * options, commit and watch, main; scale_gen.c: gen; scale_shares.c:
 * shares and share_watch; scale_util.c: the helpers they call). One thread
 * but gen's workers and the storage's fan-out.
 */
#ifndef CKPT_BENCH_SCALE_BENCH_H
#define CKPT_BENCH_SCALE_BENCH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "bench/scale_store.h"

#define DTYPE_F32 12
#define COLS 4 /* each tensor: [world, COLS] F32, one row per rank */
#define ROW_BYTES (COLS * 4)
#define DEADLINE_NS (7LL * 24 * 3600 * 1000000000) /* the parts may be days old */

struct opts {
	const char *cmd, *root, *job, *run;
	int nodes, ranks, tensors, steps, threads;
	int replicas; /* gen: ranks holding each box (data parallel; 1: none) */
	int64_t step; /* commit, watch: which step (0: the last generated) */
	int leave_out; /* gen: this node's part of the last step is not written (-1: none) */
	int node; /* watch: which node */
	int64_t latency_us;
	double cap_s;
	int stuck_polls; /* commit: polls with every part in and no manifest: stuck */
	bool explain; /* commit: once stuck or capped, one poll at the deadline for the reason */
};

int64_t mono_ns(void);
double ms_since(int64_t t);
/* "n00042": node n's name. */
void node_name(int n, char *buf, size_t len);
/* What every line starts with: the phase and the root's shape (the line stays open). */
void line_head(const struct opts *o, const char *phase);
/* The local backend at o->root as `node`, wrapped in the counting storage. */
int open_store(const struct opts *o, const char *node, struct ioeng **io, struct storage **out,
               char *err);
/* This process's resident set now, and at its peak, in KiB. */
long rss_now_kb(void);
long rss_peak_kb(void);
/* The CPU time this process used so far, every thread, user and system, in ms. */
double cpu_ms(void);
/* A JSON string: quotes and backslashes escaped, control characters dropped. */
void json_str(FILE *f, const char *s);
/* gen (scale_gen.c): the root, one JSON line. */
int run_gen(const struct opts *o, char *err);
/*
 * shares, share_watch (scale_shares.c): the dedup assignment's shares put
 * as the node of rank 0 puts them, then taken as node o->node takes its
 * own. One JSON line each.
 */
int run_shares(const struct opts *o, bool writing, char *err);

#endif /* CKPT_BENCH_SCALE_BENCH_H */
