/*
 * ckptd's settings loaded (config.h): the file (config_file.c, through
 * inih), then the flags (config_args.c, through getopt_long), each value
 * parsed by the one table (config_table.c), then the defaults that depend
 * on others and the checks across settings (config_finish). main() calls
 * it once, at start-up, on the main thread.
 */
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/daemon/config.h"
#include "agent/daemon/config_int.h"
#include "ipc/ipc.h"
#include "ipc/base/log.h"

static int resolve_group(struct config *c, enum config_setting cs, long *gid, char *err)
{
	const char *name = c->str[cs];
	struct group gr, *res = NULL;
	char where[PATH_MAX + 32], *buf = NULL, *more;
	size_t len = 4096;
	int rc;

	*gid = -1;
	if (!name)
		return 0;
	do { /* a group with many members needs a bigger buffer: ERANGE */
		more = realloc(buf, len *= 2);
		if (!more) {
			free(buf);
			return ipc_errf(err, -ENOMEM, "out of memory");
		}
		buf = more;
		rc = getgrnam_r(name, &gr, buf, len, &res);
	} while (rc == ERANGE && len < (16u << 20));
	if (rc == 0 && res)
		*gid = (long)res->gr_gid;
	free(buf);
	if (*gid >= 0)
		return 0;
	config_origin(c, cs, where, sizeof(where));
	if (c->from[cs] == CONFIG_FILE)
		return ipc_errf(err, -ENOENT, "%s: [agent] %s = '%s': %s", where,
		                config_settings[cs].key, name, rc ? strerror(rc) : "no such group");
	return ipc_errf(err, -ENOENT, "--%s '%s': %s", config_settings[cs].flag, name,
	                rc ? strerror(rc) : "no such group");
}

/*
 * No node given: the host name, which must then be a valid node name (a
 * host name is, unless it has characters a node name may not).
 */
static int default_node(struct config *c, char *err)
{
	char host[256] = "", msg[IPC_ERRLEN];

	if (c->str[CS_NODE])
		return 0;
	if (gethostname(host, sizeof(host) - 1) < 0)
		return ipc_errf(err, -errno,
		                "no --node given and the host name is unreadable "
		                "(%s): set [cluster] node",
		                strerror(errno));
	if (ipc_check_node(host, msg))
		return ipc_errf(err, -EINVAL,
		                "no --node given and the host name cannot be one (%s): set "
		                "[cluster] node or --node",
		                msg);
	c->str[CS_NODE] = strdup(host);
	return c->str[CS_NODE] ? 0 : ipc_errf(err, -ENOMEM, "out of memory");
}

/* "off", "zstd" (level 1) or "zstd:LEVEL" (1 to 19): *level, 0 for off. */
static int compress_level(const struct config *c, int cs, int *level, char *err)
{
	const char *v = c->str[cs];
	char *end;
	long l;

	*level = 0;
	if (!v || strcmp(v, "off") == 0)
		return 0;
	if (strcmp(v, "zstd") == 0)
		return *level = 1, 0;
	if (strncmp(v, "zstd:", 5) == 0) {
		errno = 0;
		l = strtol(v + 5, &end, 10);
		if (!errno && end != v + 5 && !*end && l >= 1 && l <= 19)
			return *level = (int)l, 0;
	}
	return ipc_errf(err, -EINVAL, "[%s] %s = %s: expected off, zstd or zstd:LEVEL (1 to 19)",
	                config_settings[cs].section, config_settings[cs].key, v);
}

/* An s3:// root: where the store is and how to reach it, checked before anything starts. */
static int s3_settings(struct config *c, char *err)
{
	struct agent_config *a = &c->cfg;
	char bucket[64], prefix[256];
	const char *s3root;
	int rc;

	a->s3.endpoint = c->str[CS_S3_ENDPOINT];
	a->s3.region = c->str[CS_S3_REGION];
	a->s3.credentials = c->str[CS_S3_CREDENTIALS];
	a->s3.virtual_host = c->num[CS_S3_ADDRESSING] == 1;
	a->s3.connections = (unsigned)c->num[CS_S3_CONNECTIONS];
	a->s3.max_tries = (unsigned)c->num[CS_S3_MAX_TRIES];
	a->s3.timeout_s = (unsigned)c->num[CS_S3_TIMEOUT];
	a->upload.root = c->str[CS_UPLOAD_ROOT];
	a->upload.keep_last = (unsigned)c->num[CS_UPLOAD_KEEP_LAST];
	a->upload.keep_every = c->num[CS_UPLOAD_KEEP_EVERY];
	a->upload.max_mbps = (uint64_t)c->num[CS_UPLOAD_MAX_MBPS];
	/* [s3] compress: the store's; the tier takes it unless [upload] compress is given */
	if ((rc = compress_level(c, CS_S3_COMPRESS, &a->s3.zstd_level, err)) ||
	    (rc = compress_level(c, CS_UPLOAD_COMPRESS, &a->upload.zstd_level, err)))
		return rc;
	if (c->from[CS_UPLOAD_COMPRESS] == CONFIG_DEFAULT)
		a->upload.zstd_level = a->s3.zstd_level;
	else if (!a->upload.root)
		return ipc_errf(err, -EINVAL,
		                "[upload] compress: there is no upload tier ([upload] "
		                "root)");
	if (a->upload.root && storage_is_s3(a->root))
		return ipc_errf(err, -EINVAL,
		                "[upload] root %s: the root %s is an object store already (the "
		                "upload tier is for a filesystem root)",
		                a->upload.root, a->root);
	if (a->upload.root && !storage_is_s3(a->upload.root))
		return ipc_errf(err, -EINVAL, "[upload] root %s: expected s3://BUCKET[/PREFIX]",
		                a->upload.root);
	s3root = a->upload.root ? a->upload.root : a->root;
	if (!storage_is_s3(s3root))
		return 0;
	rc = s3_root_parse(s3root, bucket, sizeof(bucket), prefix, sizeof(prefix), err);
	if (rc)
		return rc;
	if (!a->s3.endpoint)
		return ipc_errf(err, -EINVAL,
		                "%s: set [s3] endpoint (or --s3-endpoint), e.g. "
		                "https://s3.us-east-1.amazonaws.com",
		                s3root);
	if (!a->s3.credentials)
		return ipc_errf(err, -EINVAL,
		                "%s: set [s3] credentials = FILE (access_key = ... and "
		                "secret_key = ... lines, mode 0600)",
		                s3root);
	if (a->chunk_mb < 5)
		return ipc_errf(err, -EINVAL,
		                "%s: --chunk-mb %llu: each staging chunk is a part of an "
		                "upload, and S3 parts are at least 5 MiB",
		                s3root, (unsigned long long)a->chunk_mb);
	return 0;
}

/* [limits]: what each user may hold. */
static void limit_settings(struct config *c)
{
	struct agent_config *a = &c->cfg;
	const long long *n = c->num;

	a->lim.connections = (unsigned)n[CS_LIM_CONNECTIONS];
	a->lim.sessions = (unsigned)n[CS_LIM_SESSIONS];
	a->lim.plans = (unsigned)n[CS_LIM_PLANS];
	a->lim.tensors = (uint64_t)n[CS_LIM_TENSORS];
	a->lim.regions = (unsigned)n[CS_LIM_REGIONS];
	a->lim.region_bytes = (uint64_t)n[CS_LIM_REGION_MB] << 20;
	if (!a->lim.region_bytes) /* the node's memory: more cannot be registered anyway */
		a->lim.region_bytes =
		    (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
	a->lim.watchers = (unsigned)n[CS_LIM_WATCHERS];
	a->lim.watch_bytes = (uint64_t)n[CS_LIM_WATCH_KB] << 10;
}

int config_finish(struct config *c, char *err)
{
	struct agent_config *a = &c->cfg;
	const long long *n = c->num;
	int rc;

	memset(a, 0, sizeof(*a));
	rc = resolve_group(c, CS_SOCKET_GROUP, &a->socket_gid, err);
	if (!rc)
		rc = resolve_group(c, CS_ADMIN_GROUP, &a->admin_gid, err);
	if (!rc)
		rc = default_node(c, err);
	if (rc)
		return rc;
	a->node = c->str[CS_NODE];
	a->listen = c->str[CS_LISTEN];
	a->socket_mode = (unsigned)n[CS_SOCKET_MODE];
	a->socket_group = c->str[CS_SOCKET_GROUP];
	a->log_level = (int)n[CS_LOG_LEVEL];
	a->root = c->str[CS_ROOT];
	a->io_engine = (enum ioeng_kind)n[CS_IO_ENGINE];
	a->queue_depth = (unsigned)n[CS_QUEUE_DEPTH];
	a->staging_mb = (uint64_t)n[CS_STAGING_MB];
	a->backpressure = (int)n[CS_BACKPRESSURE];
	a->keep_last = (unsigned)n[CS_KEEP_LAST];
	a->keep_every = n[CS_KEEP_EVERY];
	a->metrics_listen = c->str[CS_METRICS_LISTEN];
	a->chunk_mb = (uint64_t)n[CS_CHUNK_MB];
	a->capture_threads = (unsigned)n[CS_CAPTURE_THREADS];
	a->copy_threads = (int)n[CS_COPY_THREADS];
	a->commit_deadline_s = (unsigned)n[CS_COMMIT_DEADLINE];
	a->abandon_after_s = (unsigned)n[CS_ABANDON_AFTER];
	a->plans_wait_s = (unsigned)n[CS_PLANS_WAIT];
	a->stop_timeout_s = (unsigned)n[CS_STOP_TIMEOUT];
	/*
	 * A step is abandoned only once no agent can still commit it: every
	 * commit ends by its deadline, counted from files in that step.
	 */
	if (n[CS_ABANDON_AFTER] < 2 * n[CS_COMMIT_DEADLINE])
		return ipc_errf(
		    err, -EINVAL,
		    "abandon_after (%lld s) must be at least twice commit_deadline (%lld "
		    "s): a step may be removed only when no agent can still commit it",
		    n[CS_ABANDON_AFTER], n[CS_COMMIT_DEADLINE]);
	a->direct = n[CS_DIRECT] != 0;
	a->lock_pool = n[CS_LOCK] != 0;
	a->read_once = n[CS_READ_ONCE] != 0;
	a->admin_group = c->str[CS_ADMIN_GROUP];
	a->umask = (unsigned)n[CS_UMASK];
	limit_settings(c);
	a->config_path = c->path;
	return s3_settings(c, err);
}

int config_load(struct config *c, const struct config_args *a, const char *default_path, char *err)
{
	int rc = 0;

	if (a->config_path)
		rc = config_read_file(c, a->config_path, err);
	else if (default_path) {
		rc = config_read_file(c, default_path, err);
		if (rc == -ENOENT)
			rc = 0; /* no file: the defaults */
	}
	if (!rc)
		rc = config_apply_args(c, a, err);
	if (!rc)
		rc = config_finish(c, err);
	return rc;
}

int config_command_line(int argc, char **argv, const char *default_path, struct config *c,
                        FILE *out, FILE *errs)
{
	struct config_args args;
	char err[IPC_ERRLEN];

	memset(c, 0, sizeof(*c));
	if (config_parse_args(argc, argv, &args, err)) {
		fprintf(errs, "ckptd: %s (ckptd --help lists the options)\n", err);
		return 2;
	}
	if (args.action == CONFIG_HELP)
		return config_usage(out), 0;
	if (args.action == CONFIG_VERSION)
		return fprintf(out, "ckptd %s\n", CKPTD_VERSION), 0;
	if (config_init(c))
		return fprintf(errs, "ckptd: out of memory\n"), 1;
	if (config_load(c, &args, default_path, err))
		return fprintf(errs, "ckptd: %s\n", err), 1;
	c->action = args.action;
	if (args.action == CONFIG_CHECK)
		return config_print(c, out), 0;
	return -1;
}
