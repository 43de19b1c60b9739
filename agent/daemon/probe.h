/*
 * probe.h: whether the root and the socket's directory a configuration
 * names can be used by this process's user (probe.c).
 */
#ifndef CKPT_AGENT_PROBE_H
#define CKPT_AGENT_PROBE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "ipc/ipc.h"

/*
 * Looks at root (a directory; an s3:// root is left to the agent's start)
 * and the directory of listen (unix:PATH). Each finding goes to out as a
 * "; check: ..." line (--check-config). With out NULL (a start), job
 * directories the user may not write are only logged as a warning. 0 if
 * both can be used; else the first problem's negative errno, said in err
 * (IPC_ERRLEN bytes) with what to do about it.
 */
int probe_paths(const char *root, const char *listen, FILE *out, char *err);

/* The directory of listen's socket (unix:DIR/NAME) into dir; false if none (a bare name). */
bool probe_socket_dir(const char *listen, char *dir, size_t len);

#endif /* CKPT_AGENT_PROBE_H */
