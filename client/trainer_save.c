/*
 * libckpt's saves (ckpt_save, ckpt_save_on, ckpt_save_fence, ckpt_save_wait,
 * and a save's state, reason and release): one Save call on the caller's
 * thread; the states come from the session thread (session_thread.c), which
 * ckpt_save_wait waits on with the client's condition variable.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>

#include "client/rpc.h"

/* ---- saves ------------------------------------------------------------ */

/* The ring's event is free again at once, or (saved) once the fence passes seq. */
static void event_done(struct ckpt_client *c, struct ckpt_plan *p, int slot, bool saved,
                       uint32_t seq)
{
	pthread_mutex_lock(&c->mu);
	cl_gpu_event_done(&p->gpu, slot, saved, seq);
	pthread_mutex_unlock(&c->mu);
}

/*
 * A save the agent never saw, FAILED with `why`: what a trainer gets while
 * the agent is away, so that its loop goes on and its next save works.
 */
static int save_not_taken(struct ckpt_client *c, struct ckpt_plan *p, const char *why,
                          struct ckpt_save **out)
{
	struct ckpt_save *s = calloc(1, sizeof(*s));

	if (!s)
		return cl_fail(c, -ENOMEM, "out of memory");
	s->c = c;
	s->cuda = p->cuda; /* no fence to wait on (fence_dev 0): ckpt_save_fence passes */
	s->state = CKPT_FAILED;
	snprintf(s->reason, sizeof(s->reason), "%s", why);
	pthread_mutex_lock(&c->mu); /* the session thread renumbers plans under it */
	s->plan_id = p->id;
	s->uploads = p->uploads;
	s->next = c->saves;
	c->saves = s;
	pthread_mutex_unlock(&c->mu);
	*out = s;
	return 0;
}

static int save_call(struct ckpt_plan *p, int64_t step, const char *meta_json, void *stream,
                     struct ckpt_save **out);

int cl_save(struct ckpt_plan *p, int64_t step, const char *meta_json, void *stream,
            struct ckpt_save **out)
{
	char err[IPC_ERRLEN];
	struct ckpt_client *c;
	int rc;

	if (!p || !out)
		return -EINVAL;
	c = p->c;
	*out = NULL;
	if (!c)
		return -ENOTCONN;
	rc = ipc_check_step(step, err);
	if (!rc)
		rc = ipc_check_meta(meta_json, err);
	if (rc)
		return cl_fail(c, rc, "save of job %s step %lld: %s", p->job, (long long)step, err);
	rc = cl_try_enter(c);
	if (rc == -EAGAIN) { /* a training loop is not held while the agent restarts */
		cl_away_reason(c, err, sizeof(err));
		return save_not_taken(c, p, err, out);
	}
	if (rc)
		return rc;
	if (p->lost[0])
		rc = cl_fail(c, -ESTALE, "save of job %s step %lld: %s", p->job, (long long)step,
		             p->lost);
	else
		rc = save_call(p, step, meta_json, stream, out);
	cl_leave(c);
	/* The agent went away under the call: the session thread attaches again. */
	if ((rc == -ECONNREFUSED || rc == -ENOTCONN || rc == -EPIPE) && c->reconnect_ms) {
		pthread_mutex_lock(&c->mu);
		snprintf(err, sizeof(err), "%s; libckpt attaches again when ckptd is back",
		         c->last_error);
		pthread_mutex_unlock(&c->mu);
		return save_not_taken(c, p, err, out);
	}
	return rc;
}

/* The save the agent took, as its reply says; NULL when out of memory. */
static struct ckpt_save *save_of(struct ckpt_client *c, const struct ckpt_plan *p,
                                 const struct save_taken *rep)
{
	struct ckpt_save *s = calloc(1, sizeof(*s));

	if (s) {
		s->c = c;
		s->id = rep->save_id;
		s->plan_id = p->id;
		s->uploads = p->uploads;
		s->state = rep->state;
		s->cuda = p->cuda;
		s->fence_seq = rep->fence_seq;
		s->fence_dev = p->gpu.fence_dev;
		s->dev = p->gpu.dev;
		snprintf(s->reason, sizeof(s->reason), "%s", rep->reason);
	}
	return s;
}

/* Under c->mu: the stream may have told us of this save before its reply arrived. */
static void early_news(struct ckpt_client *c, struct ckpt_save *s)
{
	for (unsigned i = 0; i < CL_EARLY; i++) {
		struct cl_early *e = &c->early[i];

		if (e->save_id == s->id && e->state > s->state) {
			s->state = e->state;
			snprintf(s->reason, sizeof(s->reason), "%s", e->reason);
		}
	}
}

/* The Save call itself, with the CUDA plan's event; inside cl_enter. */
static int save_call(struct ckpt_plan *p, int64_t step, const char *meta_json, void *stream,
                     struct ckpt_save **out)
{
	struct save_spec req = {.plan_id = p->id, .step = step, .meta_json = meta_json};
	struct save_taken rep;
	struct ckpt_client *c = p->c;
	char err[IPC_ERRLEN];
	struct ckpt_save *s;
	int rc, slot = -1;

	if (p->cuda) {
		/* The agent's copies start after everything queued on `stream` so far. */
		pthread_mutex_lock(&c->mu);
		slot = cl_gpu_event_take(&p->gpu, err);
		pthread_mutex_unlock(&c->mu);
		rc = slot < 0 ? slot : cl_gpu_record(&p->gpu, slot, stream, err);
		if (rc) {
			if (slot >= 0)
				event_done(c, p, slot, false, 0);
			return cl_fail(c, rc, "save of job %s step %lld: %s", p->job,
			               (long long)step, err);
		}
		req.cuda_event = p->gpu.ev[slot].handle;
	}
	rc = cl_rpc_save(c, &req, &rep, CL_DEFAULT_TIMEOUT_MS);
	if (rc) {
		/* Timed out, the agent may have the save and wait on it yet: never again. */
		if (slot >= 0 && rc != -ETIMEDOUT)
			event_done(c, p, slot, false, 0);
		return rc;
	}
	if (slot >= 0)
		event_done(c, p, slot, true, rep.fence_seq);
	s = save_of(c, p, &rep);
	if (!s)
		return cl_fail(c, -ENOMEM, "out of memory");
	pthread_mutex_lock(&c->mu);
	early_news(c, s);
	s->next = c->saves;
	c->saves = s;
	if (s->cuda) { /* numbers come in order of the agent's replies: keep the newest */
		if (!p->nsaved++ || !cl_gpu_passed(p->last_seq, s->fence_seq))
			p->last_seq = s->fence_seq;
		if (c->gone) /* no agent will move the fence: it opens here */
			cl_gpu_release(&p->gpu, p->last_seq);
	}
	pthread_mutex_unlock(&c->mu);
	*out = s;
	return 0;
}

int ckpt_save(struct ckpt_plan *p, int64_t step, const char *meta_json, struct ckpt_save **out)
{
	return cl_save(p, step, meta_json, NULL, out);
}

#ifdef CKPT_HAVE_CUDA_API
int ckpt_save_on(struct ckpt_plan *p, int64_t step, const char *meta_json, cudaStream_t stream,
                 struct ckpt_save **out)
{
	return cl_save(p, step, meta_json, (void *)stream, out);
}

int ckpt_save_fence(struct ckpt_save *s, cudaStream_t stream)
{
	char err[IPC_ERRLEN];
	int rc;

	struct ckpt_client *c;
	uintptr_t fence_dev;
	bool gone;

	if (!s)
		return -EINVAL;
	c = s->c;
	if (!c) /* the fence page went with the client */
		return -ENOTCONN;
	if (!s->cuda)
		return cl_fail(c, -EINVAL, "ckpt_save_fence: not a save of a CUDA plan");
	pthread_mutex_lock(&c->mu);
	fence_dev = s->fence_dev;
	gone = c->gone;
	pthread_mutex_unlock(&c->mu);
	/* Its plan destroyed (which waited for the fence to pass it), or no agent: open. */
	if (!fence_dev || gone)
		return 0;
	rc = cl_gpu_fence(s->dev, fence_dev, (void *)stream, s->fence_seq, err);
	return rc ? cl_fail(c, rc, "ckpt_save_fence: %s", err) : 0;
}
#endif

static struct timespec abs_deadline(int timeout_ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	return ts;
}

int ckpt_save_wait(struct ckpt_save *s, enum ckpt_state until, int timeout_ms)
{
	struct timespec deadline = abs_deadline(timeout_ms < 0 ? 0 : timeout_ms);
	struct ckpt_client *c = s ? s->c : NULL;
	int rc = 0;

	if (!s || until < CKPT_QUEUED || until > CKPT_UPLOADED)
		return -EINVAL;
	if (!c)
		return -ENOTCONN;
	if (until > CKPT_COMMITTED && !s->uploads)
		return cl_fail(
		    c, -ENOTSUP,
		    "this agent has no upload tier ([upload] root): nothing is UPLOADED");
	pthread_mutex_lock(&c->mu);
	c->waiters++;
	for (;;) {
		if (s->state == CKPT_FAILED) {
			rc = -EIO;
			snprintf(c->last_error, sizeof(c->last_error), "%s", s->reason);
			break;
		}
		if (s->state == CKPT_SKIPPED) {
			rc = -ECANCELED;
			snprintf(c->last_error, sizeof(c->last_error), "%s", s->reason);
			break;
		}
		if (s->state >= (int)until)
			break;
		if (until == CKPT_UPLOADED && s->upload_failed) {
			rc = -EIO;
			snprintf(c->last_error, sizeof(c->last_error), "%s", s->reason);
			break;
		}
		if (c->gone) {
			rc = -ENOTCONN;
			snprintf(c->last_error, sizeof(c->last_error),
			         "the connection to ckptd at %s was lost", c->endpoint);
			break;
		}
		if (timeout_ms < 0)
			pthread_cond_wait(&c->cv, &c->mu);
		else if (pthread_cond_timedwait(&c->cv, &c->mu, &deadline) == ETIMEDOUT) {
			rc = s->state >= (int)until ? 0 : -ETIMEDOUT;
			break;
		}
	}
	if (--c->waiters == 0)
		pthread_cond_broadcast(&c->idle);
	pthread_mutex_unlock(&c->mu);
	return rc;
}

enum ckpt_state ckpt_save_state(struct ckpt_save *s)
{
	enum ckpt_state st;

	if (!s || !s->c)
		return s ? (enum ckpt_state)s->state : CKPT_FAILED;
	pthread_mutex_lock(&s->c->mu);
	st = (enum ckpt_state)s->state;
	pthread_mutex_unlock(&s->c->mu);
	return st;
}

const char *ckpt_save_reason(struct ckpt_save *s)
{
	return s ? s->reason : "";
}

void ckpt_save_release(struct ckpt_save *s)
{
	struct ckpt_client *c;

	if (!s)
		return;
	c = s->c;
	if (c) {
		pthread_mutex_lock(&c->mu);
		for (struct ckpt_save **ps = &c->saves; *ps; ps = &(*ps)->next)
			if (*ps == s) {
				*ps = s->next;
				break;
			}
		pthread_mutex_unlock(&c->mu);
	}
	free(s);
}
