/*
 * Worker threads with a FIFO of jobs. A job is a struct work embedded in a
 * longer-lived object (nothing is allocated to queue it). The agent has
 * three queues: capture (copies in, restores out; several threads), commit
 * (one thread: manifests and removal of failed checkpoints) and maint (one
 * thread: verify, show, delete, which read or change the disk).
 */
#ifndef CKPT_AGENT_WORK_H
#define CKPT_AGENT_WORK_H

struct work {
	void (*fn)(struct work *w);
	struct work *next;
};

struct workq;

int workq_create(const char *name, unsigned threads, struct workq **out, char *err);
/* The same, its threads at `nice` (higher: yield to busier work). */
int workq_create_nice(const char *name, unsigned threads, int nice, struct workq **out, char *err);
/* Any thread. */
void workq_push(struct workq *q, struct work *w);
/* Jobs queued or running. */
unsigned workq_busy(struct workq *q);
/* Runs what is queued, then stops the threads. NULL is fine. */
void workq_destroy(struct workq *q);

#endif /* CKPT_AGENT_WORK_H */
