/*
 * Worker threads with a FIFO of jobs, and jobs that wait for their time. A
 * job is a struct work embedded in a longer-lived object (nothing is
 * allocated to queue it). The agent has five queues: capture (copies in,
 * restores out; several threads), hasher (checksums), commit (one thread:
 * plans, parts, manifests, the polls of the many-nodes commit, removal of
 * failed saves' files), maint (one thread: GC, delete, pins) and readers
 * (two threads: verify, show).
 */
#ifndef CKPT_AGENT_WORK_H
#define CKPT_AGENT_WORK_H

#include <stdbool.h>
#include <stdint.h>

struct work {
	void (*fn)(struct work *w);
	struct work *next;
	int64_t when; /* workq_push_at: the monotonic ns it runs at */
};

struct workq;

int workq_create(const char *name, unsigned threads, struct workq **out, char *err);
/* The same, its threads at `nice` (higher: yield to busier work). */
int workq_create_nice(const char *name, unsigned threads, int nice, struct workq **out, char *err);
/*
 * Workers whose jobs may wait long for something other than the CPU (a
 * streaming save waiting for its staging chunks to be written, a restore
 * for its reads): `threads` of them run jobs at once, and a job that says
 * it waits (workq_wait_begin) lets another worker take the next job while
 * it waits, up to `max` workers in all (started as they are needed).
 */
int workq_create_elastic(const char *name, unsigned threads, unsigned max, struct workq **out,
                         char *err);
/*
 * From inside a job of q: the job now waits (for the disk, for chunks) and
 * does not count against q's `threads` until workq_wait_end. NULL is fine.
 */
void workq_wait_begin(struct workq *q);
void workq_wait_end(struct workq *q);
/* Any thread. */
void workq_push(struct workq *q, struct work *w);
/*
 * Runs w once CLOCK_MONOTONIC reaches `when` (ns), after the jobs already
 * due. Any thread. Jobs still waiting for their time when the queue is
 * destroyed are dropped: their owner frees what they hold.
 */
void workq_push_at(struct workq *q, struct work *w, int64_t when);
/*
 * w, waiting for its time in q (workq_push_at), runs now instead, after
 * the jobs already due; false where it was not waiting (queued, running,
 * or not in q). Any thread.
 */
bool workq_hurry(struct workq *q, struct work *w);
/* Jobs queued, waiting for their time, or running. */
unsigned workq_busy(struct workq *q);
/* Runs what is queued, then stops the threads. NULL is fine. */
void workq_destroy(struct workq *q);

#endif /* CKPT_AGENT_WORK_H */
