/*
 * libckpt's errors: a call that fails says why in its client's last error
 * (ckpt_last_error), and the session thread's failures in their own place,
 * so a reattach in the background never overwrites what the trainer's
 * last call said. Any thread, under the client's mutex.
 */
#include <stdarg.h>
#include <stdio.h>
#include <pthread.h>

#include "client/client.h"

__thread struct ckpt_client *cl_session_thread;

int cl_fail(struct ckpt_client *c, int err, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&c->mu);
	va_start(ap, fmt);
	/* the session thread's failures are its own: the trainer's last error stays */
	if (cl_session_thread == c)
		vsnprintf(c->session_error, sizeof(c->session_error), fmt, ap);
	else
		vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
	va_end(ap);
	pthread_mutex_unlock(&c->mu);
	return err;
}
