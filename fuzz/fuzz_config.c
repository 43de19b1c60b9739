/*
 * fuzz_config: agent/daemon/config.c, the agent's configuration as main() takes it
 * at start-up: the INI file (config_read_file; inih under it), the flags
 * (config_parse_args, config_apply_args on top), then config_finish and
 * config_print (what --check-config shows).
 *
 * Input: the file's bytes, then optionally a NUL and the flags, NUL
 * separated (at most 32). config_read_file takes a path: the file is a
 * memfd, named /proc/self/fd/N. A --config among the flags is not followed
 * (it could name a FIFO or a terminal); the file is always the memfd.
 */
#define _GNU_SOURCE
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "agent/daemon/config.h"
#include "fuzz/fuzz.h"

#define MAX_ARGS 32

static int file_fd = -1;
static char file_path[64];
static FILE *devnull;

static void once(void)
{
	file_fd = memfd_create("ckptd-fuzz.conf", MFD_CLOEXEC);
	FUZZ_CHECK(file_fd >= 0, "memfd_create failed");
	snprintf(file_path, sizeof(file_path), "/proc/self/fd/%d", file_fd);
	devnull = fopen("/dev/null", "w");
	FUZZ_CHECK(devnull, "cannot open /dev/null");
}

static void put_file(const uint8_t *data, size_t len)
{
	FUZZ_CHECK(ftruncate(file_fd, 0) == 0, "ftruncate of the memfd failed");
	FUZZ_CHECK(pwrite(file_fd, data, len, 0) == (ssize_t)len, "writing the memfd failed");
}

/* The flags after the first NUL: argv (strings in buf), argc. */
static int split_args(const uint8_t *data, size_t len, char *buf, char **argv)
{
	int argc = 0;

	argv[argc++] = "ckptd";
	argv[argc] = NULL;
	if (!len)
		return argc;
	memcpy(buf, data, len);
	buf[len] = '\0';
	for (char *p = buf; argc < MAX_ARGS && p <= buf + len; p += strlen(p) + 1)
		argv[argc++] = p;
	argv[argc] = NULL;
	return argc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nul = memchr(data, '\0', size);
	size_t flen = nul ? (size_t)(nul - data) : size;
	char err[IPC_ERRLEN] = "", *buf = malloc(size + 1), *argv[MAX_ARGS + 1];
	struct config_args a;
	struct config c;
	int argc, rc;

	FUZZ_CHECK(buf, "out of memory");
	if (file_fd < 0)
		once();
	put_file(data, flen);
	argc = split_args(nul ? nul + 1 : NULL, nul ? size - flen - 1 : 0, buf, argv);
	FUZZ_CHECK(config_init(&c) == 0, "config_init failed");
	rc = config_read_file(&c, file_path, err);
	if (rc == 0 && argc > 1) {
		rc = config_parse_args(argc, argv, &a, err);
		if (rc == 0 && (a.action == CONFIG_RUN || a.action == CONFIG_CHECK))
			rc = config_apply_args(&c, &a, err);
	}
	if (rc == 0)
		rc = config_finish(&c, err);
	if (rc == 0)
		config_print(&c, devnull);
	FUZZ_CHECK(rc == 0 || err[0], "refused (%d) without a word", rc);
	config_free(&c);
	free(buf);
	return 0;
}
