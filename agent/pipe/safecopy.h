/*
 * A memcpy that survives the memory going away. Trainer memory is sealed
 * memfds (ipc/shm.c) that cannot shrink, so this should never trigger; but a
 * page the kernel cannot provide (a hole punched in the region and no memory
 * to fill it on a restore's write, a device mapping torn down) raises
 * SIGBUS, which would kill every job's saves on the node. Here it fails the
 * one copy instead.
 */
#ifndef CKPT_AGENT_SAFECOPY_H
#define CKPT_AGENT_SAFECOPY_H

#include <stddef.h>

/* Once, before any copy: the SIGBUS handler (the default action for faults not ours). */
int safecopy_init(char *err);
/* memcpy, or -EFAULT if either side faulted (dst may hold part of src). */
int safe_copy(void *dst, const void *src, size_t n);
/*
 * fn(arg) under the same guard: many small copies for one guard; -EFAULT if
 * one faulted (fn is left where it faulted: it must hold no lock and leave
 * nothing half done but the copy). Nests: an inner guard puts the outer back.
 */
int safe_run(void (*fn)(void *), void *arg);

#endif /* CKPT_AGENT_SAFECOPY_H */
