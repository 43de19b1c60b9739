/*
 * safe_run: a function (safe_copy: a memcpy) under a per-thread jump buffer;
 * the SIGBUS handler jumps back when the fault happened inside one (see
 * safecopy.h for why). Any thread that copies trainer memory: capture
 * workers, copy helpers, restores.
 *
 * The jump leaves memcpy half way: it holds no lock and no state, so nothing
 * is left inconsistent. A SIGBUS outside a guarded copy is a bug of ours:
 * the previous action is put back and the fault happens again, with a core.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "ipc/ipc.h"
#include "agent/pipe/safecopy.h"

/*
 * volatile, and barriers around the call: memcpy is a builtin the compiler
 * knows does not read `guard`, so it would otherwise drop the store before it.
 */
static __thread sigjmp_buf *volatile guard;
static struct sigaction prev_bus;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	(void)si;
	(void)uc;
	if (guard)
		siglongjmp(*guard, 1);
	sigaction(sig, &prev_bus, NULL); /* not ours: fault again, as if we were not here */
}

int safecopy_init(char *err)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &prev_bus))
		return ipc_errf(err, -errno, "installing the SIGBUS handler: %s", strerror(errno));
	return 0;
}

int safe_run(void (*fn)(void *), void *arg)
{
	sigjmp_buf env, *volatile outer = guard; /* a guard already set: put back after */

	if (sigsetjmp(env, 1)) {
		guard = outer;
		return -EFAULT;
	}
	guard = &env;
	__asm__ volatile("" ::: "memory");
	fn(arg);
	__asm__ volatile("" ::: "memory");
	guard = outer;
	return 0;
}

struct copy {
	void *dst;
	const void *src;
	size_t n;
};

static void copy(void *arg)
{
	struct copy *c = arg;

	memcpy(c->dst, c->src, c->n);
}

int safe_copy(void *dst, const void *src, size_t n)
{
	struct copy c = {dst, src, n};

	return safe_run(copy, &c);
}
