/*
 * The agent as a whole: start-up in dependency order (I/O engine, staging
 * pool, storage and its recovery, catalog, workers, then the socket last, so
 * nobody is served before everything is ready), the run, and an orderly stop
 * that lets captured saves reach COMMITTED before the process exits: as long
 * as they take, saying what is left every few seconds, or up to
 * [agent] stop_timeout, after which they FAIL with the reason.
 */
#include <errno.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/node/node.h"
#include "agent/node/owners.h"
#include "agent/node/session.h"
#include "agent/node/plan.h"
#include "agent/node/park.h"
#include "agent/node/publish.h"
#include "agent/node/checkpoint.h"
#include "agent/node/save.h"
#include "agent/node/catalog.h"
#include "agent/rpc/ops.h"
#include "agent/node/gc.h"
#include "agent/node/root.h"
#include "agent/daemon/agent.h"
#include "agent/rpc/handlers.h"
#include "agent/daemon/metrics.h"

#define CAPTURE_MAX 64 /* capture workers in all, most of them waiting */
#include "agent/rpc/cred_server.h"
#include "agent/pipe/safecopy.h"
#include "agent/daemon/notify.h"
#include "agent/pipe/copier.h"
#include "agent/node/upload.h"
#include "agent/rpc/server.h"
#include "agent/rpc/session_rpc.h"
#include "ipc/base/log.h"

#define STOP_REPORT_NS (5LL * 1000000000) /* at stop, what is left is logged this often */
#define STOP_REPORT_SAVES 4 /* naming at most this many saves */

static const rpc_handler_fn handlers[IPC_NMETHODS] = {
    [IPC_ATTACH] = rpc_attach,
    [IPC_REGISTER_REGION] = rpc_register_region,
    [IPC_DROP_REGION] = rpc_drop_region,
    [IPC_CREATE_PLAN] = rpc_create_plan,
    [IPC_DROP_PLAN] = rpc_drop_plan,
    [IPC_SAVE] = rpc_save,
    [IPC_GET_SAVE] = rpc_get_save,
    [IPC_WATCH] = rpc_watch,
    [IPC_RESTORE] = rpc_restore,
    [IPC_STATUS] = rpc_status,
    [IPC_LIST] = rpc_list,
    [IPC_SHOW] = rpc_show,
    [IPC_VERIFY] = rpc_verify,
    [IPC_DELETE] = rpc_delete,
    [IPC_PIN] = rpc_pin,
    [IPC_GC] = rpc_gc,
    [IPC_COMMIT] = rpc_commit,
    [IPC_SHOW_DETAIL] = rpc_show_detail,
};

/* A fault put in by a test build's CKPT_FAULTS (storage/testing/faults.c): said in the log. */
static void fault_note(const char *line)
{
	log_msg(LOG_WARNING, "%s", line);
}

/* The S3 backend of an s3:// root or of the upload tier, as configured. */
static int s3_open(struct agent *a, const char *root, struct storage **out, char *err)
{
	const struct agent_config *c = &a->cfg;
	struct s3_opts so = {root,
	                     c->s3.endpoint,
	                     c->s3.region,
	                     c->s3.credentials,
	                     c->s3.virtual_host,
	                     c->s3.connections,
	                     c->s3.max_tries,
	                     c->s3.timeout_s,
	                     0,
	                     c->node,
	                     pool_chunk_bytes(a->pool),
	                     root == c->root ? c->s3.zstd_level : c->upload.zstd_level};
	char what[IPC_ERRLEN];
	int rc = s3_create(&so, out, err);

	if (rc)
		return rc;
	(*out)->ops->describe(*out, what, sizeof(what));
	log_msg(LOG_NOTICE, "%s %s: %s", root == c->root ? "root" : "upload tier", root, what);
	return 0;
}

/*
 * The upload tier: its clean-up (this node's uploads that died with the
 * last agent), its thread, and what it has yet to receive, queued.
 */
static int open_upload(struct agent *a, char *err)
{
	struct storage_cleanup pol = {(int64_t)a->cfg.abandon_after_s, ipc_now_ns() / 1000000000,
	                              true};
	struct storage_recovery rec = {0};
	struct storage *tier;
	char why[IPC_ERRLEN];
	int rc = s3_open(a, a->cfg.upload.root, &tier, err);

	if (rc)
		return rc;
	if (store_cleanup(tier, NULL, &pol, &rec, why))
		log_msg(LOG_WARNING, "upload tier %s: clean-up: %s", a->cfg.upload.root, why);
	rc = upload_create(a, tier, &a->up, err);
	if (rc)
		return rc;
	pthread_mutex_lock(&a->mu);
	upload_resume(a->up);
	pthread_mutex_unlock(&a->mu);
	return 0;
}

static int start_storage(struct agent *a, char *err)
{
	struct ioeng_opts io = {a->cfg.io_engine, a->cfg.queue_depth, &fsops_posix};
	/* Pinned for the GPUs too, by the first CUDA plan (gpu_pin). */
	/* Each save or restore streaming is sure of a window of queue_depth chunks. */
	struct pool_opts po = {a->cfg.staging_mb << 20, a->cfg.chunk_mb << 20, a->cfg.lock_pool,
	                       a->cfg.queue_depth};
	struct local_opts lo = {a->cfg.root, a->cfg.node, NULL, NULL, a->cfg.direct};
	/* At start nothing of ours is in flight: this node's own leftovers are dead. */
	struct storage_cleanup pol = {(int64_t)a->cfg.abandon_after_s, ipc_now_ns() / 1000000000,
	                              true};
	struct commit_opts co = {NULL, a->cfg.node, (int64_t)a->cfg.commit_deadline_s * 1000000000,
	                         false};
	const struct iovec *iov;
	char why[IPC_ERRLEN];
	unsigned n;
	int rc;

	/* fsops_posix, unless a test build was given faults to put in */
	rc = fsops_from_env(&lo.ops, &io.ops, fault_note, err);
	if (rc)
		return rc;
	rc = ioeng_create(&io, &a->io, err);
	if (rc)
		return rc;
	rc = pool_create(&po, &a->pool, err);
	if (rc)
		return rc;
	iov = pool_iovecs(a->pool, &n);
	if (ioeng_register_buffers(a->io, iov, n, why))
		log_msg(LOG_NOTICE, "staging pool not registered with io_uring: %s", why);
	lo.io = a->io;
	rc = storage_is_s3(a->cfg.root) ? s3_open(a, a->cfg.root, &a->store, err)
	                                : local_create(&lo, &a->store, err);
	if (rc)
		return rc;
	/*
	 * The root may be shared with the agents of other nodes, saving right
	 * now: the clean-up removes only what is dead (storage.h).
	 */
	rc = store_cleanup(a->store, NULL, &pol, &a->recovered, err);
	if (rc)
		return rc;
	if (a->recovered.partial_removed || a->recovered.temp_removed ||
	    a->recovered.latest_fixed || a->recovered.own_removed || a->recovered.partial_kept)
		log_msg(LOG_NOTICE,
		        "clean-up of %s (node %s): removed %u uncommitted step directories, %u "
		        "of this node's dead shard files and %u leftovers, fixed %u LATEST files; "
		        "left %u uncommitted steps to their nodes",
		        a->cfg.root, a->cfg.node, a->recovered.partial_removed,
		        a->recovered.own_removed, a->recovered.temp_removed,
		        a->recovered.latest_fixed, a->recovered.partial_kept);
	co.store = a->store;
	co.single_writer = !s3_create_once(a->store);
	rc = committer_create(&co, &a->cm, err);
	if (rc)
		return rc;
	rc = catalog_create(&a->cat);
	if (rc)
		return ipc_errf(err, rc, "out of memory");
	rc = catalog_load(a->cat, a->store, err);
	if (!rc)
		rc = owners_load_all(a, err);
	if (!rc && a->cfg.upload.root)
		rc = open_upload(a, err);
	return rc;
}

/*
 * What `systemctl status ckptd` shows (STATUS=, sent only when it changes),
 * and the watchdog ping: a control thread that stops turning stops pinging.
 * The counters are read under mu; the datagram goes out after it is dropped.
 */
static void tell_systemd(struct agent *a)
{
	unsigned clients, inflight;
	unsigned long long committed, failed;
	bool stopping;
	int root;

	pthread_mutex_lock(&a->mu);
	root = a->root.state;
	clients = a->nsessions;
	inflight = a->inflight;
	committed = a->finals[SAVE_COMMITTED];
	failed = a->finals[SAVE_FAILED];
	stopping = a->stopping;
	pthread_mutex_unlock(&a->mu);
	if (stopping)
		; /* the stop says what is left itself (stop_progress) */
	else if (root != ROOT_OK)
		notify_status(
		    "serving %s, but the storage root %s is %s: saves fail (ckptctl status "
		    "says why)",
		    a->cfg.listen, a->cfg.root, root_state_name(root));
	else if (failed)
		notify_status("serving %s: %u client%s, %u save%s in flight, %llu committed, "
		              "%llu failed",
		              a->cfg.listen, clients, clients == 1 ? "" : "s", inflight,
		              inflight == 1 ? "" : "s", committed, failed);
	else
		notify_status("serving %s: %u client%s, %u save%s in flight, %llu committed",
		              a->cfg.listen, clients, clients == 1 ? "" : "s", inflight,
		              inflight == 1 ? "" : "s", committed);
	notify_watchdog();
}

/* The control thread, once a second. */
/* Region descriptors a client may have sent and not yet registered. */
#define CRED_FDS_PER_CONN 8

static void adopt(void *ctx, int fd)
{
	struct agent *a = ctx;

	server_adopt(a->srv, fd);
}

static int identify(void *ctx, const char *hex, size_t len, struct peer *p)
{
	struct agent *a = ctx;

	return cred_identify(a->cred, hex, len, p);
}

static void tick(void *ctx)
{
	struct agent *a = ctx;

	pthread_mutex_lock(&a->mu);
	cp_expire(a, ipc_mono_ns());
	park_release(a, false); /* saves that waited --plans-wait for their plan set */
	watchers_progress(a);
	pthread_mutex_unlock(&a->mu);
	tell_systemd(a);
}

/*
 * The effective configuration, one line at start-up, with the config file's
 * key names (flags-only settings after them), so that the journal says what
 * this run used whatever the file, the flags and the defaults said.
 */
static void log_config(const struct agent_config *c)
{
	static const char *const engines[] = {
	    [IOENG_AUTO] = "auto", [IOENG_URING] = "io_uring", [IOENG_PWRITE] = "pwrite"};
	char copy[16] = "auto";

	if (c->copy_threads >= 0)
		snprintf(copy, sizeof(copy), "%d", c->copy_threads);
	log_msg(
	    LOG_INFO,
	    "configuration (%s): listen=%s socket_mode=%04o socket_group=%s log_level=%s "
	    "root=%s io_engine=%s queue_depth=%u size_mb=%llu backpressure=%s keep_last=%u "
	    "keep_every=%lld metrics=%s node=%s commit_deadline=%u plans_wait=%u abandon_after=%u "
	    "stop_timeout=%u; chunk_mb=%llu capture_threads=%u copy_threads=%s direct=%s lock=%s",
	    c->config_path ? c->config_path : "no file", c->listen, c->socket_mode,
	    c->socket_group ? c->socket_group : "-", log_level_name(c->log_level), c->root,
	    c->io_engine <= IOENG_PWRITE ? engines[c->io_engine] : "?", c->queue_depth,
	    (unsigned long long)c->staging_mb,
	    c->backpressure == BACKPRESSURE_SKIP ? "skip" : "block", c->keep_last,
	    (long long)c->keep_every, c->metrics_listen ? c->metrics_listen : "off", c->node,
	    c->commit_deadline_s, c->plans_wait_s, c->abandon_after_s, c->stop_timeout_s,
	    (unsigned long long)c->chunk_mb, c->capture_threads, copy, c->direct ? "yes" : "no",
	    c->lock_pool ? "yes" : "no");
}

/*
 * One agent per socket: "<socket>.lock" next to it, locked and naming this
 * process before anything else is done, and held until the agent is freed
 * (after its socket is removed). A second agent on the socket stops here,
 * before it has touched the socket, the root or any file of the first.
 */
static int lock_socket(struct agent *a, char *err)
{
	const char *sock = a->cfg.listen + 5;
	char path[PATH_MAX], who[48] = "another ckptd";
	long holder;
	int rc;

	if (strncmp(a->cfg.listen, "unix:", 5) != 0 || !*sock)
		return 0; /* server_create says what is wrong with the address */
	if (snprintf(path, sizeof(path), "%s.lock", sock) >= (int)sizeof(path))
		return ipc_errf(err, -ENAMETOOLONG, "socket path %s is too long", sock);
	a->sock_lock = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (a->sock_lock < 0)
		return ipc_errf(err, -errno,
		                "cannot open the socket's lock file %s: %s (does its directory "
		                "exist and is it writable?)",
		                path, strerror(errno));
	rc = pidlock_take(a->sock_lock, &holder);
	if (rc == -EBUSY) {
		close(a->sock_lock);
		a->sock_lock = -1;
		if (holder > 0)
			snprintf(who, sizeof(who), "ckptd pid %ld", holder);
		return ipc_errf(err, -EADDRINUSE,
		                "socket %s is served by %s (lock %s): stop that agent first, or "
		                "give this one another --listen",
		                sock, who, path);
	}
	if (rc)
		log_msg(LOG_NOTICE,
		        "no lock on %s (%s): a second agent on %s is refused only while the first "
		        "answers on it",
		        path, strerror(-rc), sock);
	return 0;
}

/* The copier's helpers and the work queues. */
static int start_workers(struct agent *a, char *err)
{
	const struct agent_config *cfg = &a->cfg;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned helpers = cfg->copy_threads >= 0 ? (unsigned)cfg->copy_threads
	                                          : (unsigned)(cpus > 1 ? cpus - 1 : 0);
	int rc = copier_create(helpers, &a->copier, err);

	/*
	 * A capture of GPU memory mostly waits for its copies: one worker per
	 * GPU at least. capture_threads copy at once; a capture or restore
	 * waiting for its chunks or the disk lets another start (several saves
	 * stream side by side), up to CAPTURE_MAX workers.
	 */
	if (!rc)
		rc = workq_create_elastic("ckpt-capture",
		                          cfg->capture_threads > gpu_count(a->gpu)
		                              ? cfg->capture_threads
		                              : gpu_count(a->gpu),
		                          CAPTURE_MAX, &a->capture, err);
	if (!rc)
		rc = workq_create("ckpt-commit", 1, &a->commit, err);
	/* One thread for what changes the catalog: GC, deletes and pins keep their order. */
	if (!rc)
		rc = workq_create("ckpt-maint", 1, &a->maint, err);
	/* Verifies and shows only read: a long verify holds up neither retention nor the others. */
	if (!rc)
		rc = workq_create("ckpt-read", AGENT_READERS, &a->readers, err);
	/* Checksums at a lower priority: while a capture copies on every core, they wait. */
	if (!rc)
		rc = workq_create_nice("ckpt-hash", 1, 10, &a->hasher, err);
	return rc;
}

/* The metrics hear a commit's and a restore's end (hub.h). */
static void metrics_on_commit_end(struct agent *a, const struct hub_commit *c)
{
	metrics_on_commit(a->metrics, c->latency_ns, c->parts_missing);
}

static void metrics_on_restore_end(struct agent *a, const struct hub_restore *r)
{
	metrics_on_restore(a->metrics, r->rc, r->bytes, r->read, r->start_ns, r->passed_over);
}

/*
 * Who hears what changes (hub.h), in the order they are told: a save made
 * reaches the watchers; a save's state, the log, the metrics, its client's stream and the
 * watchers; a commit, the upload tier and then retention; an upload, the
 * saves; a plan made or dropped, the checkpoints in flight and the plans
 * file; the root back, the plans files; a commit's or a restore's end, the
 * metrics.
 */
static void wire(struct hub *h)
{
	hub_on_save_new(h, watchers_on_save);
	hub_on_save(h, save_log);
	hub_on_save(h, metrics_on_save);
	hub_on_save(h, session_on_save);
	hub_on_save(h, watchers_on_save);
	hub_on_save_note(h, session_on_save);
	hub_on_save_note(h, watchers_on_save);
	hub_on_ckpt(h, upload_on_ckpt);
	hub_on_ckpt(h, gc_on_ckpt);
	hub_on_ckpt(h, save_on_ckpt);
	hub_on_plan(h, plans_on_plan);
	hub_on_plan(h, cp_on_plan);
	hub_on_root_back(h, plans_on_root_back);
	hub_on_commit_end(h, metrics_on_commit_end);
	hub_on_restore_end(h, metrics_on_restore_end);
}

int agent_start(const struct agent_config *cfg, struct agent **out, char *err)
{
	struct server_opts so = {.listen = cfg->listen,
	                         .tick = tick,
	                         .socket_mode = cfg->socket_mode,
	                         .socket_gid = cfg->socket_gid};
	struct cred_opts co = {0};
	struct agent *a;
	int rc;

	log_config(cfg);
	/* Checkpoints are the job's user's: not for every account on the machine. */
	umask(cfg->umask);
	/* A fault in trainer memory fails that copy, not the agent. */
	rc = safecopy_init(err);
	if (rc)
		return rc;
	a = calloc(1, sizeof(*a));
	if (!a)
		return ipc_errf(err, -ENOMEM, "out of memory");
	a->cfg = *cfg;
	a->sock_lock = -1;
	a->started_mono = ipc_mono_ns();
	pthread_mutex_init(&a->mu, NULL);
	list_init(&a->sessions);
	list_init(&a->plans);
	list_init(&a->saves);
	list_init(&a->ckpts);
	list_init(&a->watchers);
	list_init(&a->pubs);
	list_init(&a->parked);
	list_init(&a->rgroups);
	wire(&a->hub);
	rc = lock_socket(a, err);
	if (rc)
		goto fail;
	rc = gpu_create(&a->gpu, err);
	if (rc)
		goto fail;
	log_msg(LOG_INFO, "GPU: %s", gpu_status(a->gpu));
	rc = start_storage(a, err);
	if (rc)
		goto fail;
	rc = root_watch_start(a, err);
	if (rc)
		goto fail;
	rc = start_workers(a, err);
	if (rc)
		goto fail;
	memcpy(so.handlers, handlers, sizeof(handlers));
	so.ctx = a;
	if (cfg->metrics_listen && (rc = metrics_create(a, cfg->metrics_listen, &a->metrics, err)))
		goto fail;
	so.identify = identify;
	rc = server_create(&so, &a->srv, err);
	if (rc)
		goto fail;
	co.endpoint = cfg->listen;
	co.socket_mode = cfg->socket_mode;
	co.socket_gid = cfg->socket_gid;
	co.admin_gid = cfg->admin_gid;
	co.conns_per_user = cfg->lim.connections;
	co.fds_per_conn = CRED_FDS_PER_CONN;
	co.grpc_lfd = server_listen_fd(a->srv);
	co.adopt = adopt;
	co.adopt_ctx = a;
	rc = cred_create(&co, &a->cred, err);
	if (rc)
		goto fail;
	*out = a;
	return 0;
fail:
	agent_destroy(a);
	return rc;
}

struct stop_state {
	struct agent *a;
	int64_t since, next_report;
	bool aborted;
};

static double mib(uint64_t bytes)
{
	return (double)bytes / (1024.0 * 1024.0);
}

/* Under mu: bytes of this node's saves of cp not yet written. */
static uint64_t cp_left(const struct checkpoint *cp)
{
	uint64_t left = 0;

	for (int r = 0; r < cp->world; r++) {
		const struct save *s = cp->rank[r];

		if (s && !ipc_state_final(s->state))
			left += s->bytes_total - atomic_load(&s->bytes_written);
	}
	return left;
}

/* Under mu: which saves the stop waits for, and the bytes each has left. */
static void stop_progress(struct agent *a, int64_t waited_ns)
{
	char text[640] = "";
	uint64_t left = 0;
	unsigned n = 0;
	struct list *pos;
	size_t o = 0;

	list_for_each(pos, &a->saves)
	{
		const struct save *s = container_of(pos, struct save, link);
		uint64_t l;

		if (ipc_state_final(s->state))
			continue;
		l = s->bytes_total - atomic_load(&s->bytes_written);
		left += l;
		if (n++ < STOP_REPORT_SAVES && o < sizeof(text))
			o += (size_t)snprintf(
			    text + o, sizeof(text) - o,
			    "%sjob %s step %lld rank %d (%s): %.1f of %.1f MiB left",
			    n > 1 ? "; " : "", s->job, (long long)s->step, s->rank,
			    ipc_state_name(s->state), mib(l), mib(s->bytes_total));
	}
	if (n > STOP_REPORT_SAVES && o < sizeof(text))
		snprintf(text + o, sizeof(text) - o, "; and %u more", n - STOP_REPORT_SAVES);
	log_msg(LOG_NOTICE, "stopping for %lld s: %u save%s in flight, %.1f MiB left to write%s%s",
	        (long long)(waited_ns / 1000000000), n, n == 1 ? "" : "s", mib(left), n ? ": " : "",
	        text);
	notify_status("stopping: %u save%s in flight, %.1f MiB left to write", n, n == 1 ? "" : "s",
	              mib(left));
}

/* Under mu: stop_timeout has passed; every checkpoint still in flight fails, saying so. */
static void stop_abort(struct agent *a, int64_t waited_ns)
{
	char why[IPC_ERRLEN];
	struct list *pos;

	log_msg(LOG_WARNING,
	        "stopping: %u saves still in flight after %lld s (stop_timeout): "
	        "they fail",
	        a->inflight, (long long)(waited_ns / 1000000000));
	list_for_each(pos, &a->ckpts)
	{
		struct checkpoint *cp = container_of(pos, struct checkpoint, link);

		snprintf(
		    why, sizeof(why),
		    "the agent stopped after %lld s (stop_timeout) with %.1f MiB of this node's "
		    "saves of it left to write",
		    (long long)(waited_ns / 1000000000), mib(cp_left(cp)));
		cp_fail(a, cp, why);
	}
}

/*
 * Polled by the server once it has stopped taking calls (every 100 ms):
 * whether everything in flight has finished. Saves past CAPTURED are
 * written to the end, saying every STOP_REPORT_NS what is left; with
 * stop_timeout set, those still in flight then fail (their files removed)
 * rather than being left half done or dropped unsaid.
 */
static bool drained(void *ctx)
{
	struct stop_state *st = ctx;
	struct agent *a = st->a;
	int64_t now = ipc_mono_ns();
	bool idle;

	pthread_mutex_lock(&a->mu);
	if (!st->since) {
		st->since = now;
		st->next_report = now + STOP_REPORT_NS;
		a->stopping = true;
		park_release(a, true); /* saves waiting for their plan set: refused */
		log_msg(LOG_INFO, "stopping: %u saves in flight", a->inflight);
		notify_stopping("stopping: %u save%s in flight", a->inflight,
		                a->inflight == 1 ? "" : "s");
	}
	if (!st->aborted && a->cfg.stop_timeout_s && a->inflight &&
	    now - st->since >= (int64_t)a->cfg.stop_timeout_s * 1000000000) {
		st->aborted = true;
		stop_abort(a, now - st->since);
	} else if (now >= st->next_report && a->inflight) {
		st->next_report = now + STOP_REPORT_NS;
		stop_progress(a, now - st->since);
	}
	/* Failed saves may still have writes in flight, and cleanups queued. */
	idle = a->inflight == 0 && !cp_any_busy(a);
	pthread_mutex_unlock(&a->mu);
	/* maint before readers: a job of maint may queue a verify on readers. */
	return idle && workq_busy(a->capture) == 0 && workq_busy(a->commit) == 0 &&
	       workq_busy(a->maint) == 0 && workq_busy(a->readers) == 0 &&
	       workq_busy(a->hasher) == 0;
}

void agent_run(struct agent *a, atomic_bool *stop)
{
	struct stop_state st = {a, 0, 0, false};

	log_msg(LOG_INFO, "serving %s (root %s, staging %llu MiB, %s)", a->cfg.listen, a->cfg.root,
	        (unsigned long long)a->cfg.staging_mb, ioeng_detail(a->io));
	/* The socket is bound and calls are requested: they are served from here on. */
	notify_ready("serving %s", a->cfg.listen);
	server_run(a->srv, stop, drained, &st);
	log_msg(LOG_INFO, "stopped");
}

/* After the run: what is left in the lists is finished; free it. */
static void free_objects(struct agent *a)
{
	struct list *pos, *tmp;

	list_for_each_safe(pos, tmp, &a->ckpts)
	    cp_free(a, container_of(pos, struct checkpoint, link));
	list_for_each_safe(pos, tmp, &a->saves) save_free(a, container_of(pos, struct save, link));
	list_for_each_safe(pos, tmp, &a->plans) plan_drop(a, container_of(pos, struct plan, link));
}

void agent_destroy(struct agent *a)
{
	struct uploader *up;

	if (!a)
		return;
	metrics_destroy(a->metrics); /* first: a scrape reads the pool and the engine */
	/* No connection adopted into the server while it goes (a client attaching again). */
	cred_stop(a->cred);
	server_destroy(a->srv);
	cred_destroy(a->cred); /* after the handlers that ask it */
	/* Uploads first: they read the root through the engine (the tier stays, for restores). */
	upload_stop(a->up);
	/* The engine next: its last completions may still queue commit-thread work. */
	ioeng_destroy(a->io);
	/* Each queue before the ones its last jobs may push to. */
	workq_destroy(a->capture); /* its last jobs may still push to it (a CUDA plan's next) */
	/*
	 * Plans let go from here on close their GPU side at once (release_gpu
	 * reads this under mu). Nothing is in flight by now (agent_run waited
	 * for it), so no other thread lets a plan go in between.
	 */
	pthread_mutex_lock(&a->mu);
	a->capture = NULL;
	pthread_mutex_unlock(&a->mu);
	workq_destroy(a->hasher);
	root_watch_stop(a); /* after the captures (they check it), before the commit queue */
	workq_destroy(a->commit);
	workq_destroy(a->maint);
	workq_destroy(a->readers); /* after maint: it may queue a verify here */
	pthread_mutex_lock(&a->mu);
	up = a->up; /* no restore reads the tier any more */
	a->up = NULL;
	pthread_mutex_unlock(&a->mu);
	upload_destroy(up);
	copier_destroy(a->copier);
	free_objects(a);
	committer_destroy(a->cm);
	storage_destroy(a->store);
	gpu_destroy(a->gpu); /* after the plans (their mappings); unpins the pool */
	pool_destroy(a->pool);
	catalog_destroy(a->cat);
	owners_free(a);
	if (a->sock_lock >= 0)
		close(a->sock_lock); /* last: the socket is gone; another agent may have it */
	pthread_mutex_destroy(&a->mu);
	free(a);
}
