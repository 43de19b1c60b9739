/*
 * A CUDA plan's capture, on a capture worker (save.c's save_capture): the
 * trainer's event waited for on the plan's lane (its GPU work before
 * ckpt_save done), then the save's pool and file (stream_setup), then each
 * chunk's copies queued on the lane and handed on (stream_submit) once the
 * lane has passed them: chunk k+1 is on the copy engine while chunk k goes to
 * disk. The lane is the capture's alone: it holds the plan's capture lock
 * (plan_gpu.capture) throughout, and a plan's captures run one at a time in
 * the order of their saves (capture_queue and capture_next, under agent.mu).
 */
#include <errno.h>

#include "agent/pipe/stream.h"
#include "ipc/base/log.h"

/*
 * Waits (on the plan's lane) for the trainer's event: its GPU work before
 * ckpt_save is done, so every byte copied after reads the step it saved,
 * host tensors included. The one wait that may never end (a trainer that
 * dies or hangs with work queued): it comes before the pool, so it holds no
 * chunks, and an abort ends it. A lane that has queued the wait and then
 * failed is abandoned for a fresh one.
 */
static int gpu_wait_trainer(struct save *s, char *why)
{
	struct plan_gpu *g = s->plan->gpu;
	struct gpu_lane *fresh;
	int rc;

	if (!g->lane)
		return ipc_errf(why, -EIO,
		                "the plan has no GPU stream (an abort left it none): "
		                "create the plan again");
	rc = gpu_lane_after(g->lane, s->cuda_event, sizeof(s->cuda_event), why);
	if (rc)
		return rc; /* nothing queued */
	rc = gpu_lane_mark(g->lane, 1, why);
	if (!rc) {
		workq_wait_begin(s->a->capture); /* the trainer's GPU work: no CPU of ours */
		rc = gpu_lane_wait(g->lane, 1, &s->abort, why);
		workq_wait_end(s->a->capture);
	}
	if (rc) { /* the lane may hold a wait that never ends: never sync it */
		char err[IPC_ERRLEN];

		gpu_lane_abandon(g->lane);
		g->lane = NULL;
		if (gpu_lane_create(s->a->gpu, g->dev, &fresh, err))
			log_msg(LOG_WARNING, "job %s rank %d: no new GPU stream: %s", s->plan->job,
			        s->plan->rank, err);
		else
			g->lane = fresh;
	}
	return rc;
}

/*
 * GPU memory: the copies of a chunk are queued on the plan's lane, the lane
 * marks the chunk, and the chunk before it, done by then or soon, is waited
 * for and written: chunk k+1 is on the copy engine while chunk k goes to
 * disk. The capture worker waits; the trainer's host thread never does.
 */
static int capture_chunks_gpu(struct save *s, char *why)
{
	struct agent *a = s->a;
	struct plan_gpu *g = s->plan->gpu;
	const uint64_t cb = pool_chunk_bytes(a->pool);
	struct pool_chunk *prev = NULL, *c = NULL;
	unsigned k;
	int rc;

	for (k = 0, rc = 0; !rc && k < s->nchunks; k++) {
		c = pool_take(&s->resv, &s->abort, a->capture);
		if (!c) {
			rc = -ECANCELED;
			break;
		}
		rc = s->image(s, (uint64_t)k * cb, c->buf, stream_chunk_fill(s, k, cb), why);
		if (!rc)
			rc = gpu_lane_mark(g->lane, (int)k, why);
		if (!rc && atomic_load(&s->abort)) /* nothing more is written */
			rc = -ECANCELED;
		if (!rc && prev && !(rc = gpu_lane_wait(g->lane, (int)k - 1, NULL, why))) {
			atomic_fetch_add(&a->captured_bytes, stream_chunk_fill(s, k - 1, cb));
			stream_submit(s, prev, (uint64_t)(k - 1) * cb,
			              stream_chunk_fill(s, k - 1, cb));
		}
		if (!rc) {
			prev = c;
			c = NULL;
		}
	}
	if (!rc && prev && !(rc = gpu_lane_wait(g->lane, (int)k - 1, NULL, why))) {
		atomic_fetch_add(&a->captured_bytes, stream_chunk_fill(s, k - 1, cb));
		stream_submit(s, prev, (uint64_t)(k - 1) * cb, stream_chunk_fill(s, k - 1, cb));
		prev = NULL;
	}
	if (rc && (prev || c)) {
		/* Past the trainer's event the queue is ours and finite: drain it, so
		 * that no copy is still landing in a chunk that goes back. */
		gpu_lane_sync(g->lane);
		if (prev)
			pool_give(&s->resv, prev);
		if (c)
			pool_give(&s->resv, c);
	}
	return rc;
}

/*
 * A CUDA plan's capture: the trainer's work first, then pool and file, then
 * the copies; the lane is its alone meanwhile. *t2: when setup ended.
 */
int capture_gpu(struct save *s, char *why, int64_t *t2)
{
	struct plan_gpu *g = s->plan->gpu;
	int rc;

	pthread_mutex_lock(&g->capture);
	rc = atomic_load(&s->abort) ? -ECANCELED : gpu_wait_trainer(s, why);
	if (!rc)
		rc = stream_setup(s, why);
	*t2 = ipc_mono_ns();
	if (!rc)
		rc = capture_chunks_gpu(s, why);
	pthread_mutex_unlock(&g->capture);
	return rc;
}

/* Under mu: the capture job goes to the workers. */
static void push_capture(struct agent *a, struct save *s)
{
	workq_push(a->capture, &s->work);
}

/* Under mu: a CUDA plan's capture has returned (s, its fence moved); the next may run. */
void capture_next(struct agent *a, struct save *s)
{
	struct plan_gpu *g = s->plan->gpu;
	struct save *n = g->next_capture;

	if (!n) {
		g->capturing = false;
		return;
	}
	g->next_capture = n->next_capture;
	if (!g->next_capture)
		g->last_capture = NULL;
	push_capture(a, n);
}

/* Under mu: queues the capture; a CUDA plan's waits for the plan's earlier ones. */
void capture_queue(struct agent *a, struct save *s)
{
	struct plan_gpu *g = s->plan->gpu;

	s->capturing = true;
	if (!g || !g->capturing) {
		if (g)
			g->capturing = true;
		push_capture(a, s);
		return;
	}
	s->next_capture = NULL;
	if (g->last_capture)
		g->last_capture->next_capture = s;
	else
		g->next_capture = s;
	g->last_capture = s;
}
