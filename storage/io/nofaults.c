/*
 * nofaults: fsops_from_env and fsops_capture_wait in a build without fault
 * injection (the default, and every install build). The tables are
 * fsops_posix; CKPT_FAULTS set is refused, so that a test never runs
 * without the faults it asked for. A build made with
 * -DCKPT_FAULT_INJECTION=ON leaves this file out and links the fault
 * parser (storage/testing/faults.c, library ckpt_faults) instead.
 */
#include <errno.h>
#include <stdlib.h>

#include "ipc/base/base.h"
#include "storage/io/fsops.h"

#define FAULTS_ENV "CKPT_FAULTS"

void fsops_capture_wait(const char *job, int64_t step, int rank, unsigned chunk)
{
	(void)job, (void)step, (void)rank, (void)chunk;
}

int fsops_from_env(const struct fsops **sync, const struct fsops **async,
                   void (*note)(const char *line), char *err)
{
	*sync = *async = &fsops_posix;
	if (getenv(FAULTS_ENV) && getenv(FAULTS_ENV)[0])
		return ipc_errf(
		    err, -EINVAL,
		    FAULTS_ENV " is set, but this ckptd was built without "
		               "fault injection (cmake -DCKPT_FAULT_INJECTION=ON, for tests only): "
		               "unset it");
	return 0;
}
