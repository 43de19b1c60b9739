/*
 * libckpt: the API of ckpt.h over the connection in rpc.c.
 *
 * A connected client holds the Attach stream open; a thread of its own reads
 * the stream and records each save's state changes, so ckpt_save_wait only
 * waits on a condition variable (no polling, no extra call). Every other
 * call is one unary RPC on the caller's thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <pthread.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#include "client.h"

#define ATTACH_TIMEOUT_MS 10000

/* Why the last connect of this thread failed: ckpt_last_error(NULL). */
static __thread char open_error[1024];

_Static_assert((int)CKPT_BOOL == (int)CKPT__V1__DTYPE__DTYPE_BOOL &&
                   (int)CKPT_F32 == (int)CKPT__V1__DTYPE__DTYPE_F32 &&
                   (int)CKPT_U64 == (int)CKPT__V1__DTYPE__DTYPE_U64,
               "dtype numbers match the protocol");
_Static_assert((int)CKPT_QUEUED == (int)CKPT__V1__STATE__STATE_QUEUED &&
                   (int)CKPT_CAPTURED == (int)CKPT__V1__STATE__STATE_CAPTURED &&
                   (int)CKPT_SKIPPED == (int)CKPT__V1__STATE__STATE_SKIPPED,
               "state numbers match the protocol");

/* ---- the session stream ----------------------------------------------- */

/* Under c->mu: a state change for a save, known or not yet. */
static void apply_event(struct ckpt_client *c, const Ckpt__V1__SaveInfo *info)
{
	struct ckpt_save *s;
	struct cl_early *e;

	for (s = c->saves; s; s = s->next)
		if (s->id == info->save_id) {
			if ((int)info->state > s->state) {
				s->state = info->state;
				snprintf(s->reason, sizeof(s->reason), "%s",
				         info->reason ? info->reason : "");
			}
			if (info->upload_failed && !s->upload_failed) {
				s->upload_failed = true; /* a waiter for UPLOADED wakes to it */
				snprintf(s->reason, sizeof(s->reason), "%s",
				         info->reason ? info->reason : "");
			}
			return;
		}
	e = &c->early[c->nearly++ % CL_EARLY];
	e->save_id = info->save_id;
	e->state = info->state;
	snprintf(e->reason, sizeof(e->reason), "%s", info->reason ? info->reason : "");
}

static void *session_thread(void *arg)
{
	struct ckpt_client *c = arg;
	grpc_byte_buffer *in = NULL;
	int tag_recv;
	grpc_op op;

	for (;;) {
		grpc_event ev;

		memset(&op, 0, sizeof(op));
		op.op = GRPC_OP_RECV_MESSAGE;
		op.data.recv_message.recv_message = &in;
		if (grpc_call_start_batch(c->scall, &op, 1, &tag_recv, NULL) != GRPC_CALL_OK)
			break;
		do
			ev = grpc_completion_queue_next(c->scq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
			                                NULL);
		while (ev.type == GRPC_OP_COMPLETE && ev.tag != &tag_recv);
		if (ev.type != GRPC_OP_COMPLETE || !in)
			break; /* the stream ended: cancelled by us, or the agent went */
		Ckpt__V1__SessionEvent *m =
		    (Ckpt__V1__SessionEvent *)ipc_unpack(&ckpt__v1__session_event__descriptor, in);

		grpc_byte_buffer_destroy(in);
		in = NULL;
		if (!m)
			continue;
		pthread_mutex_lock(&c->mu);
		if (m->save)
			apply_event(c, m->save);
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
		protobuf_c_message_free_unpacked(&m->base, NULL);
	}
	pthread_mutex_lock(&c->mu);
	c->gone = true;
	/* No agent to move the fences any more: a trainer's GPU must not wait forever. */
	for (struct ckpt_plan *p = c->plans; p; p = p->next)
		if (p->cuda)
			cl_gpu_release(&p->gpu, p->last_seq);
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

/*
 * Waits on the session queue until *flag is set (or the deadline); whether it
 * was. Every completion on the way is recorded, whichever batch it is: they
 * come in any order.
 */
static bool wait_flag(struct ckpt_client *c, struct attach_tags *t, bool *flag,
                      gpr_timespec deadline)
{
	while (!*flag) {
		grpc_event e = grpc_completion_queue_next(c->scq, deadline, NULL);

		if (e.type != GRPC_OP_COMPLETE)
			return false;
		if (e.tag == &t->start)
			t->start = true;
		else if (e.tag == &t->status)
			t->status = true;
		else if (e.tag == &t->recv)
			t->recv = true;
	}
	return true;
}

/*
 * Opens the Attach stream and reads the session id, before the thread
 * starts. The stream's status is asked for at once, so a refusal reaches the
 * caller in the agent's words.
 */
static int attach(struct ckpt_client *c)
{
	Ckpt__V1__AttachRequest req = CKPT__V1__ATTACH_REQUEST__INIT;
	struct attach_tags *t = &c->atags;
	int rc = 0;
	grpc_byte_buffer *in = NULL;
	Ckpt__V1__SessionEvent *ev = NULL;
	char prog[64] = "libckpt";
	grpc_op ops[4];

	if (readlink("/proc/self/exe", prog, sizeof(prog) - 1) > 0)
		prog[sizeof(prog) - 1] = '\0';
	req.client = strrchr(prog, '/') ? strrchr(prog, '/') + 1 : prog;
	req.pid = (uint32_t)getpid();
	c->sreq = ipc_pack(&req.base);
	c->scq = grpc_completion_queue_create_for_next(NULL);
	c->scall =
	    grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, c->scq,
	                             grpc_slice_from_static_string(ipc_methods[IPC_ATTACH].path),
	                             NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	cl_metadata(c, &ops[0]);
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = c->sreq;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &c->smd;
	memset(t, 0, sizeof(*t));
	grpc_call_start_batch(c->scall, ops, 4, &t->start, NULL);
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	ops[0].data.recv_status_on_client.trailing_metadata = &c->strail;
	ops[0].data.recv_status_on_client.status = &c->sstatus;
	ops[0].data.recv_status_on_client.status_details = &c->sdetails;
	grpc_call_start_batch(c->scall, ops, 1, &t->status, NULL);
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_RECV_MESSAGE;
	ops[0].data.recv_message.recv_message = &in;
	grpc_call_start_batch(c->scall, ops, 1, &t->recv, NULL);
	if (!wait_flag(c, t, &t->recv, cl_deadline(ATTACH_TIMEOUT_MS))) {
		/* No answer in time: cancel, and let the batch finish before `in` goes. */
		grpc_call_cancel(c->scall, NULL);
		wait_flag(c, t, &t->recv, gpr_inf_future(GPR_CLOCK_MONOTONIC));
		rc = cl_fail(c, -ETIMEDOUT, "ckptd at %s did not answer within %d s", c->endpoint,
		             ATTACH_TIMEOUT_MS / 1000);
	} else if (!in) {
		/* The stream ended at once: refused, or nobody there. */
		wait_flag(c, t, &t->status, gpr_inf_future(GPR_CLOCK_MONOTONIC));
		rc = cl_status(c, ipc_methods[IPC_ATTACH].path, c->sstatus, c->sdetails, NULL);
		if (rc == 0)
			rc = cl_fail(c, -EPROTO, "ckptd ended the session without a word");
	} else {
		ev = (Ckpt__V1__SessionEvent *)ipc_unpack(&ckpt__v1__session_event__descriptor, in);
		if (!ev || !ev->session_id)
			rc = cl_fail(c, -EPROTO, "%s does not speak ckpt.v1", c->endpoint);
		else
			c->session_id = ev->session_id;
	}
	if (ev)
		protobuf_c_message_free_unpacked(&ev->base, NULL);
	if (in)
		grpc_byte_buffer_destroy(in);
	return rc;
}

/* ---- connect / disconnect -------------------------------------------- */

static void client_free(struct ckpt_client *c)
{
	grpc_event ev;

	if (c->scall) {
		grpc_call_cancel(c->scall, NULL);
		if (c->attached)
			pthread_join(c->thread, NULL);
		grpc_call_unref(c->scall);
	}
	/* Threads still in ckpt_save_wait leave (-ENOTCONN) before c goes. */
	pthread_mutex_lock(&c->mu);
	c->gone = true;
	pthread_cond_broadcast(&c->cv);
	while (c->waiters)
		pthread_cond_wait(&c->idle, &c->mu);
	pthread_mutex_unlock(&c->mu);
	if (c->scq) {
		grpc_completion_queue_shutdown(c->scq);
		do
			ev = grpc_completion_queue_next(c->scq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
			                                NULL);
		while (ev.type != GRPC_QUEUE_SHUTDOWN);
		grpc_completion_queue_destroy(c->scq);
	}
	if (c->sreq)
		grpc_byte_buffer_destroy(c->sreq);
	grpc_metadata_array_destroy(&c->smd);
	grpc_metadata_array_destroy(&c->strail);
	grpc_slice_unref(c->sdetails);
	if (c->ch)
		grpc_channel_destroy(c->ch);
	cl_cred_close(c); /* the agent forgets our token: after the last call */
	/*
	 * CUDA plans the user still holds: their fences open (no agent moves them
	 * now), then their pages are unregistered before they go.
	 */
	for (struct ckpt_plan *p = c->plans; p; p = p->next) {
		cl_gpu_release(&p->gpu, p->last_seq);
		cl_gpu_plan_free(&p->gpu);
		p->fence_mem = NULL;
	}
	while (c->allocs) {
		struct cl_alloc *a = c->allocs;

		c->allocs = a->next;
		ipc_shm_unmap(&a->shm);
		free(a);
	}
	/* Plans and saves the user still holds outlive us: they learn we are gone. */
	for (struct ckpt_save *s = c->saves; s; s = s->next)
		s->c = NULL;
	for (struct ckpt_plan *p = c->plans; p; p = p->next)
		p->c = NULL;
	pthread_mutex_destroy(&c->mu);
	pthread_mutex_destroy(&c->cred_mu);
	pthread_cond_destroy(&c->cv);
	pthread_cond_destroy(&c->idle);
	free(c);
	grpc_shutdown();
}

int cl_open(const char *endpoint, bool session, struct ckpt_client **out)
{
	grpc_arg args[1] = {{.type = GRPC_ARG_INTEGER,
	                     .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
	                     .value.integer = IPC_MAX_MESSAGE}};
	grpc_channel_args cargs = {1, args};
	grpc_channel_credentials *creds;
	struct ckpt_client *c;
	int rc;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!endpoint)
		endpoint = getenv("CKPT_ENDPOINT");
	if (!endpoint || !*endpoint)
		endpoint = IPC_DEFAULT_ENDPOINT;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->cred_mu, NULL);
	c->cred_sock = -1;
	pthread_cond_init(&c->cv, NULL);
	pthread_cond_init(&c->idle, NULL);
	grpc_metadata_array_init(&c->smd);
	grpc_metadata_array_init(&c->strail);
	c->sdetails = grpc_empty_slice();
	snprintf(c->endpoint, sizeof(c->endpoint), "%s", endpoint);
	grpc_init();
	rc = cl_cred_connect(c);
	if (rc) {
		if (session) /* ckpt_connect has no client to ask ckpt_last_error of */
			fprintf(stderr, "libckpt: %s\n", c->last_error);
		snprintf(open_error, sizeof(open_error), "%s", c->last_error);
		client_free(c);
		return rc;
	}
	creds = grpc_insecure_credentials_create();
	c->ch = grpc_channel_create(c->endpoint, creds, &cargs);
	grpc_channel_credentials_release(creds);
	if (session) {
		rc = attach(c);
		if (!rc)
			rc = -pthread_create(&c->thread, NULL, session_thread, c);
		if (rc) {
			/* ckpt_connect has no client to ask ckpt_last_error of: say it here */
			fprintf(stderr, "libckpt: %s\n", c->last_error);
			snprintf(open_error, sizeof(open_error), "%s", c->last_error);
			client_free(c);
			return rc;
		}
		c->attached = true;
	}
	*out = c;
	return 0;
}

int ckpt_connect(const char *endpoint, struct ckpt_client **out)
{
	return cl_open(endpoint, true, out);
}

void ckpt_disconnect(struct ckpt_client *c)
{
	if (c)
		client_free(c);
}

const char *ckpt_last_error(struct ckpt_client *c)
{
	return c ? c->last_error : open_error;
}

const char *ckpt_strerror(int err)
{
	switch (err) {
	case -ECONNREFUSED:
		return "no ckptd answers at the endpoint (is it running?)";
	case -ECANCELED:
		return "the save was skipped: the staging pool was full";
	case -EBADMSG:
		return "checksum mismatch: the checkpoint is corrupt";
	case -ENOTCONN:
		return "the connection to ckptd was lost";
	default:
		return strerror(err < 0 ? -err : err);
	}
}

const char *ckpt_state_name(enum ckpt_state s)
{
	return ipc_state_name(s);
}
