/*
 * agent/node/node.h: the node, the one object every part of the agent holds:
 * its settings (daemon/config.c fills them), its queues and threads, its
 * lists of objects in flight (each described in its own header of node/),
 * and the lock that guards them.
 *
 * Locks. agent.mu guards every list below it and every object's state on
 * them (session, plan, save, checkpoint, the catalog, owners and usage);
 * it is never held while copying or waiting for I/O. The fields above mu
 * are set at start and read only after, or are atomics. Lock order: a CUDA
 * plan's capture lock (plan_gpu.capture), then agent.mu, then the pool's
 * or the server's.
 */
#ifndef CKPT_AGENT_NODE_NODE_H
#define CKPT_AGENT_NODE_NODE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <pthread.h>

#include "agent/node/hub.h"
#include "storage/io/ioeng.h"
#include "ipc/base/base.h"
#include "ipc/base/list.h"
#include "ipc/base/work.h"
#include "storage/storage.h"

struct pool;
struct server;
struct copier;
struct gpu;
struct uploader;
struct metrics;
struct committer;
struct catalog;
struct cred;
struct owner;
struct usage;
struct root_watch;
struct save;

#define AGENT_KEEP_FINISHED 1024 /* finished saves kept for GetSave */
#define AGENT_SCANS 32 /* jobs whose last clean-up time is remembered */
#define AGENT_UNLISTED 16 /* steps failed here with their manifest visible, remembered */
#define AGENT_READERS 2 /* threads that verify and show (the readers queue) */

/* [limits]: what one user (uid) may hold at once; root is not limited. */
struct agent_limits {
	unsigned connections, sessions, plans, regions, watchers;
	uint64_t tensors, region_bytes;
	uint64_t watch_bytes; /* queued for one Watch stream before it is cut */
};

struct agent_config {
	const char *root;
	const char *listen;
	unsigned socket_mode;
	long socket_gid;
	uint64_t staging_mb;
	uint64_t chunk_mb;
	unsigned queue_depth;
	enum ioeng_kind io_engine;
	enum backpressure backpressure; /* not DEFAULT */
	unsigned capture_threads;
	int copy_threads; /* helpers joining each copy; < 0: one per other CPU */
	bool direct;
	bool lock_pool;
	bool read_once; /* ranks of a node restoring one step together read it once */
	int log_level;
	const char *node; /* this node's name (docs/DESIGN.md §2.2) */
	unsigned commit_deadline_s; /* a step still missing ranks or parts after this fails */
	unsigned plans_wait_s; /* a run's first save waits this long for every rank's plan */
	unsigned abandon_after_s; /* uncommitted steps older than LATEST and this are removed */
	unsigned stop_timeout_s; /* at stop, saves in flight get this long (0: as they need) */
	/* retention, per job: keep the last keep_last committed checkpoints and
	   every one whose step is a multiple of keep_every (0: none); 0/0 keeps all */
	unsigned keep_last;
	int64_t keep_every;
	const char *metrics_listen; /* "127.0.0.1:9464"; NULL: no metrics endpoint */
	const char *socket_group; /* group name for the socket; NULL: leave it */
	const char *config_path; /* the config file read, or NULL */
	const char *admin_group; /* [agent] admin_group; NULL: none */
	long admin_gid; /* its gid, or -1 */
	unsigned umask; /* applied to every file and directory the agent makes */
	struct agent_limits lim;
	struct { /* [s3]: an s3:// root */
		const char *endpoint, *region, *credentials;
		bool virtual_host;
		unsigned connections, max_tries, timeout_s;
		int zstd_level; /* compress: an s3:// root's shards; 0: off */
	} s3;
	struct { /* [upload]: the upload tier behind a filesystem root */
		const char *root; /* s3://...; NULL: none */
		unsigned keep_last;
		int64_t keep_every;
		uint64_t max_mbps; /* megabits per second; 0: no limit */
		int zstd_level; /* compress: the tier's shards; 0: off */
	} upload;
};

struct catalog;
struct cred;
struct owner;
struct usage;
struct root_watch;
struct save;

/* The storage root's health (root.c), under agent.mu. */
enum { ROOT_OK, ROOT_MISSING, ROOT_UNWRITABLE };

struct root_health {
	int state; /* ROOT_* */
	int64_t since_unix_ns; /* when it came to be */
	char error[IPC_ERRLEN]; /* why not ROOT_OK: what failed, on which path */
};

/* A job's last clean-up of abandoned steps (gc.c). */
struct gc_scan {
	char job[IPC_MAX_JOB + 1];
	int64_t at; /* unix seconds */
};

struct agent {
	struct agent_config cfg;
	struct pool *pool;
	struct ioeng *io;
	struct storage *store;
	struct committer *cm; /* the commit thread's alone */
	struct server *srv;
	/* maint: GC, delete, pins (one thread: in order); readers: verify, show */
	struct workq *capture, *commit, *maint, *readers, *hasher;
	struct copier *copier;
	struct gpu *gpu;
	struct uploader *up; /* the upload tier ([upload] root); NULL: none. Read under mu */
	int64_t started_mono;
	struct storage_recovery recovered;
	struct metrics *metrics; /* the /metrics endpoint (metrics.h); NULL: none */
	struct hub hub; /* who hears what changes (hub.h): wired at start, then read only */
	int sock_lock; /* "<socket>.lock", held for the agent's life (-1: none) */
	atomic_uint_fast64_t captured_bytes; /* copied from trainers into staging, since start */
	/* restores since start: tensor bytes into trainers, and the bytes read for them */
	atomic_uint_fast64_t restored_bytes, restore_read_bytes;

	pthread_mutex_t mu; /* everything below */
	struct list sessions;
	struct list plans;
	struct list saves; /* in flight first-come, then finished */
	struct list ckpts; /* checkpoints in flight */
	struct list watchers;
	struct list pubs; /* struct plans_pub: jobs whose plans file is to be (re)written */
	struct list parked; /* layouts.c: saves waiting for their run's plan set */
	struct list rgroups; /* restore.c: restores of one step gathering to read it once */
	struct catalog *cat;
	unsigned nsessions, nplans, inflight, nfinished; /* nplans: live (not dropped) */
	unsigned nregions; /* host regions registered, all sessions */
	unsigned nckpts; /* checkpoints held (the list ckpts): in flight, or failed and kept */
	uint64_t finals[8]; /* finished saves by state */
	bool stopping;
	uint64_t gc_removed; /* checkpoints removed by retention since start */
	struct gc_scan scans[AGENT_SCANS]; /* gc.c: when each job's steps were last looked at */
	/*
	 * Steps whose trainers here were told FAILED though the manifest this
	 * node put became visible (its directory's fsync failed): the catalog
	 * does not take them from the root until a restart (checkpoint.c, catalog.c).
	 * The last AGENT_UNLISTED, in a ring.
	 */
	struct {
		char job[IPC_MAX_JOB + 1];
		int64_t step;
	} unlisted[AGENT_UNLISTED];
	unsigned nunlisted;
	struct owner *owners; /* access.c: jobs' owners as read from the root */
	size_t nowners;
	struct usage *usage; /* access.c: what each uid holds */
	size_t nusage;
	struct cred *cred; /* the credentials socket (cred.h) */
	struct root_health root;
	struct root_watch *rootw; /* root.c's */
};

#endif /* CKPT_AGENT_NODE_NODE_H */
