/*
 * ckptd's insides: the objects the agent keeps and the calls between its
 * modules. (Its outside is the protocol in ipc/ckpt.proto.)
 *
 *   hub.c      the events: a state changed is published, its listeners
 *              subscribed at start (agent.c's wire)
 *   session.c  clients (the Attach stream); region.c their host regions
 *   plan.c     plans: shard laid out, header built once, the shard image;
 *              plan_rpc.c: CreatePlan (tensors checked) and DropPlan
 *   save.c     saves: states (published on the hub), the capture job;
 *              save_rpc.c: Save (admission) and GetSave
 *   stream.c   a save's chunks: copy -> write || hash -> release; size + fsync
 *              (stream.h; capture_gpu.c: a CUDA plan's copies on its lane)
 *   checkpoint.c checkpoints in flight: this node's ranks durable -> its
 *              part -> the many-nodes commit (commit/) -> COMMITTED or
 *              FAILED; checkpoint_rpc.c `ckptctl commit --finish`;
 *              publish.c each job's plans file
 *   restore.c  restore and verify: the RPCs and the extents to read, read by
 *              stream_read.c: shard -> staging -> checksum -> regions
 *   catalog.c  the committed checkpoints, as found on disk at start and since
 *   root.c     the storage root's health: checked, opened again, followed
 *   ops.c      status, list, show, delete, watch
 *   gc.c       retention (GC after each commit and on request) and pins,
 *              deciding through retention.c
 *   pool.c     the staging pool (pool.h); server.c the gRPC server (server.h)
 *   copier.c   one copy split across threads (the capture of host memory)
 *   gpu.c      GPUs: pinned staging, IPC handles (ipccache.c), lanes; fence.h
 *   config.c   defaults, the config file, the flags; main.c runs the agent
 *   metrics.c  the Prometheus endpoint; notify.c sd_notify for systemd
 *
 * Threads (see README.md): the control thread runs gRPC and every handler;
 * capture workers copy in (saves) and out (restores), with the copier's
 * helpers; the I/O thread (the engine's) writes, reads and fsyncs; the
 * hasher (nice 10) computes checksums as chunks go out; the commit thread
 * writes manifests; the maint thread deletes, pins and collects garbage (one
 * thread: those change the catalog, in order); two reader threads verify and
 * show, so a long verify holds up no retention; libmicrohttpd's thread
 * answers scrapes. Nothing but the I/O thread touches the disk's data path,
 * and the control thread never waits for the disk.
 *
 * One lock, agent.mu, guards every list and every object's state below; it is
 * never held while copying or waiting for I/O. Lock order: a CUDA plan's
 * capture lock (plan_gpu.capture), then agent.mu, then the pool's or the
 * server's.
 */
#ifndef CKPT_AGENT_H
#define CKPT_AGENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <pthread.h>

#include "commit.h"
#include "agent/pipe/copier.h"
#include "agent/pipe/fence.h"
#include "agent/pipe/gpu.h"
#include "ipc.h"
#include "ipc/base/list.h"
#include "ipc/base/log.h"
#include "agent/daemon/metrics.h"
#include "agent/pipe/pool.h"
#include "agent/rpc/server.h"
#include "storage.h"
#include "store.h"
#include "agent/node/upload.h"
#include "agent/node/hub.h"
#include "ipc/base/work.h"

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
	int backpressure; /* CKPT__V1__BACKPRESSURE__* (not DEFAULT) */
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

/* ---- who may do what (access.c) ---------------------------------------- */

enum access_want {
	ACCESS_READ, /* list, show, status, watch, verify */
	ACCESS_MANAGE, /* delete, pin, unpin */
	ACCESS_OWN, /* plans, saves, restores, commits */
};

enum use_kind {
	USE_SESSIONS,
	USE_PLANS,
	USE_TENSORS,
	USE_REGIONS,
	USE_REGION_BYTES,
	USE_WATCHERS,
	USE_NKINDS
};

/* Under mu: 0, or -EACCES with why in err. */
int access_job(struct agent *a, const struct peer *p, const char *job, enum access_want w,
               char *err);
bool access_may_read(struct agent *a, const struct peer *p, const char *job);
/* Not under mu: whether the caller may; if not, the call is failed (PERMISSION_DENIED). */
bool access_check(struct agent *a, struct rpc *c, const char *what, const char *job,
                  enum access_want w);
/* Under mu: the owner known in memory: 0; -ENOENT: none; -EAGAIN: not looked up yet. */
int owner_lookup(struct agent *a, const char *job, uint32_t *uid);
void owner_note(struct agent *a, const char *job, bool found, uint32_t uid);
/* Not under mu (reads the root): the job's owner into memory. */
int owner_load(struct agent *a, const char *job, char *err);
/* At start: the owners of every job in the root. */
int owners_load_all(struct agent *a, char *err);
void owners_free(struct agent *a);
/* Under mu: -EAGAIN naming the limit and its key when uid would hold too much. */
int usage_charge(struct agent *a, uid_t uid, enum use_kind k, uint64_t n, char *err);
void usage_release(struct agent *a, uid_t uid, enum use_kind k, uint64_t n);
uint64_t usage_held(struct agent *a, uid_t uid, enum use_kind k);

/* ---- sessions and regions (session.c) -------------------------------- */

struct session {
	struct list link;
	struct agent *a;
	uint64_t id;
	struct rpc *stream; /* the Attach call; NULL once the client left */
	char client[64];
	uint32_t pid;
	struct peer who; /* the credentials it attached with */
	struct list regions;
	struct list plans;
};

struct region {
	struct list link; /* session->regions while registered */
	uint64_t id;
	int kind;
	struct ipc_shm shm;
	unsigned refs; /* 1 while registered, + 1 per plan using it */
	uid_t uid; /* charged to */
};

void rpc_attach(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_register_region(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_drop_region(struct rpc *c, ProtobufCMessage *req, void *ctx);
/* Under mu. */
struct session *session_find(struct agent *a, uint64_t id);
/* The caller's own session (another user's is refused): NULL with why in err. */
struct session *session_of(struct agent *a, struct rpc *c, uint64_t id, char *err);
/* Under mu (region.c): s's region of that id, or NULL. */
struct region *region_find(struct session *s, uint64_t id);
/* Under mu (region.c): a reference let go; the last unmaps it. */
void region_put(struct region *r);
/* Under mu (a hub_save_fn): sends a save's new state to its client's Attach stream. */
void session_on_save(struct agent *a, struct save *s, int state);

/* ---- plans (plan.c) --------------------------------------------------- */

struct plan_tensor {
	char *name;
	int dtype;
	size_t ndim;
	int64_t shape[IPC_MAX_NDIM];
	bool sharded;
	int64_t global_shape[IPC_MAX_NDIM];
	int64_t global_offset[IPC_MAX_NDIM];
	struct region *region; /* host memory; NULL for a GPU tensor */
	void *dptr; /* GPU tensor: where it is, in the agent's mapping */
	uint64_t offset;
	uint64_t nbytes;
	uint64_t begin, end; /* bytes of the shard file */
};

/*
 * What a save's shard holds: bytes of the plan's tensors in file order
 * (each whole, or a piece of rows), its header and its size. A plan's own
 * layout (`whole`: every tensor) is made with it; where replicas are
 * written once (layouts.c), the layout of the assignment the plan set
 * gives, made once per plan set. A save keeps the one it was admitted
 * with: its file, chunks and checksums follow it.
 */
struct shard_layout {
	unsigned refs; /* under mu: a plan's `dedup` + 1 per save using it (whole: unused) */
	size_t n;
	struct plan_tensor *t; /* names are the plan's; region, offset, dptr moved to the rows */
	void *header; /* the shard's first header_len bytes, with the stamp's placeholders */
	uint64_t header_len;
	struct st_stamp_at stamp_at; /* where each save writes its stamp into them */
	uint64_t shard_bytes;
	uint64_t held_bytes; /* the plan's tensors' bytes, all of them */
	uint64_t key; /* the plan set it was made for; 0: the plan's own */
};

/* A CUDA plan's GPU side: its allocations (opened once: gpu.h), its lane, its fence. */
struct plan_gpu {
	struct agent *agent;
	struct work close; /* its CUDA teardown, queued once its plan lets it go */
	int dev;
	size_t n;
	void **mem; /* the opened allocations, in the request's order */
	/*
	 * Held by a capture from its first wait to its last copy: captures of
	 * one plan use the lane (and may replace it) one at a time.
	 */
	pthread_mutex_t capture;
	struct gpu_lane *lane; /* the stream its copies go on */
	struct region *fence_region; /* the trainer's fence page */
	struct fence fence;
	/*
	 * Under mu: its captures run one after another in fence order, each
	 * queued by the one before (a capture may wait for the trainer's work,
	 * which may wait on the fence of the save before).
	 */
	bool capturing;
	struct save *next_capture, *last_capture;
};

struct plan {
	struct list link; /* agent->plans */
	struct list slink; /* session->plans */
	uint64_t id;
	struct session *sess; /* NULL once dropped */
	char job[IPC_MAX_JOB + 1];
	char run[IPC_MAX_JOB + 1]; /* the trainer's run ("0" unless it said) */
	int rank, world;
	int backpressure;
	unsigned copies; /* ranks writing each replicated box (>= 1; the plan option) */
	size_t n;
	struct plan_tensor *t; /* in file order */
	struct shard_layout whole; /* every tensor, whole (t: the plan's) */
	/*
	 * Under mu: the layout saves use where this rank writes less than it
	 * holds (layouts.c); NULL: whole. dedup_key: the plan set it follows
	 * (0: none complete yet).
	 */
	struct shard_layout *dedup;
	uint64_t dedup_key;
	int64_t dedup_at; /* monotonic ns of the last look at the plan set (layouts.c) */
	uint64_t set_gen; /* the job's plans generation at that look (0: none known) */
	int set_ranks; /* ranks the run's plans files held once at that look */
	bool set_missing; /* they did not hold every rank once */
	bool set_waited; /* a save of it waited --plans-wait in vain: the next do not */
	int64_t mark_since; /* monotonic ns it began waiting for rank 0's node's set (0: not) */
	uint64_t shares_key; /* rank 0's node: the set whose shares it wrote */
	/*
	 * A look that failed (plans files not read or not the set their
	 * summaries say; shares or the set mark not put; no generation): the
	 * next is made at relook_at (monotonic ns; 0: none owed), after a
	 * back-off of relook_ns that grows while they keep failing.
	 */
	int64_t relook_at, relook_ns;
	struct plan_gpu *gpu; /* NULL: host memory only */
	unsigned refs; /* 1 until dropped, + 1 per save or restore holding it */
	unsigned active; /* captures and restores using its regions now */
	unsigned restoring; /* restores writing its regions: saves must wait */
	bool gathered; /* its restore is past read-once's gathering: nobody waits for it */
	bool dropped;
	uid_t uid; /* its user's (limits) */
};

/* plan_rpc.c: a plan made from a request, or dropped. */
void rpc_create_plan(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_drop_plan(struct rpc *c, ProtobufCMessage *req, void *ctx);
/* Under mu. */
struct plan *plan_find(struct agent *a, uint64_t id);
/* The caller's own plan: another user's is as good as none. */
struct plan *plan_of(struct agent *a, struct rpc *c, uint64_t id);
void plan_drop(struct agent *a, struct plan *p);
void plan_get(struct plan *p);
void plan_put(struct agent *a, struct plan *p);
/* Under mu: a plan never added (its creation failed) freed, whatever its references. */
void plan_free(struct agent *a, struct plan *p);
/* A CUDA plan's GPU side closed (its mappings, lane, fence). */
void plan_gpu_close(struct agent *a, struct plan_gpu *g);
/* Its regions are in use / no longer: once dropped and idle they are released. */
void plan_busy(struct plan *p);
void plan_idle(struct agent *a, struct plan *p);
/*
 * Bytes [off, off + len) (header and tensors) of a shard of layout l into
 * dst, its header stamped with st (the save's step and number): host
 * bytes copied now, a CUDA plan's GPU bytes queued on its lane (wait for
 * them with gpu_lane_wait). No lock. Fails only for a GPU copy, or a fault
 * of host memory.
 */
int plan_queue_image(const struct plan *p, const struct shard_layout *l, const struct st_stamp *st,
                     uint64_t off, void *dst, uint64_t len, char *err);
/*
 * l's header, and each tensor's place in the file: t[0..n) laid out one
 * after the other (the shard of rank of job/run). No lock.
 */
int shard_layout_header(struct shard_layout *l, const struct plan *p, char *err);

/*
 * Under mu: what plan p holds, as tensors of one chunk each of its rank
 * (file order), into *v, *n (freed with them, as a plans_rank's). -ENOMEM.
 */
int plan_holds(const struct plan *p, struct manifest_tensor **v, size_t *n);
/* Under mu: a reference to l let go (a plan's whole layout is never freed here). */
void layout_put(struct shard_layout *l);
/* Tensor t of rank `rank`, as a manifest's entry of one chunk, whole (-ENOMEM, half made). */
int plan_tensor_entry(struct manifest_tensor *mt, const struct plan_tensor *t, int rank);

/* ---- replicas written once (layouts.c) ---------------------------------- */

/*
 * Commit thread: the plans files of every node of (job, run) read; where
 * they make a complete plan set, each of this node's plans of that run
 * gets the layout of what the assignment (layout/assign.h) gives its rank
 * to write, made once per plan set. Where the set is not complete, saves
 * write their whole plan. The files are read only where the job's plans
 * generation moved since each plan's last look, or `force`. Saves parked
 * for the set go on once it is complete.
 */
void layouts_refresh(struct agent *a, const char *job, const char *run, bool force);
/*
 * Under mu: whether a save of (job, run) would wait for its plan set now:
 * some plan of it that may hold replicas has no complete set yet.
 */
bool layouts_waiting(struct agent *a, const char *job, const char *run);
/*
 * Under mu: whether this node holds rank 0 of (job, run), of a world of
 * more than one: it looks at the job's plans generation every second while
 * it does (one small read), so that the run's set mark follows the other
 * nodes' plans, whatever its own plans wait for.
 */
bool layouts_rank0(struct agent *a, const char *job, const char *run);
/*
 * Under mu: whether p's run has no complete plan set yet, and p holds a
 * tensor that may have replicas: its run's first save waits (park.c).
 */
bool layouts_plan_waits(const struct plan *p);
/*
 * Under mu: a CUDA plan's save is done with the trainer's memory and event
 * (captured, or ended with no capture job left); moves the trainer's fence.
 */
void plan_fence_finish(struct plan *p, uint32_t seq);
/* Where shard bytes [off, ...) of tensor i live in memory. No lock. */
void *plan_tensor_addr(const struct plan *p, size_t i);

/* ---- a run's first save, parked for its plan set (park.c) --------------- */

/* Under mu: a parked save that goes on (m, checked, is its request): admitted or refused. */
typedef void (*park_admit_fn)(struct agent *a, struct rpc *c, ProtobufCMessage *m);
/*
 * Under mu, rpc_save's: a save of p's that waits for the run's plan set
 * (its first, where the set is not complete: at most --plans-wait) is
 * parked: true, and admit(c, m) is called once it goes on.
 */
bool park_save(struct agent *a, struct plan *p, struct rpc *c, ProtobufCMessage *m,
               park_admit_fn admit);
/*
 * Under mu: parked saves whose set is complete, plan gone, or wait over, go
 * on (all: every one). After each look at the plans, and at the tick.
 */
void park_release(struct agent *a, bool all);

/* ---- each job's plans file (publish.c) ---------------------------------- */

/* Under mu: plans of job (of run) changed: its plans file is written again (commit thread). */
void plans_publish(struct agent *a, const char *job, const char *run);
/* Commit thread: the plans file of (job, run), written if it changed. 0 or -errno (err). */
int plans_put(struct agent *a, const char *job, const char *run, char *err);
/* Under mu (a hub_plan_fn): a plan made: its job's plans file written again. */
void plans_on_plan(struct agent *a, struct plan *p, bool dropped);
/* Under mu (a hub_root_fn): the root is back: every live plan's plans file written again. */
void plans_on_root_back(struct agent *a);

/* ---- checkpoints in flight (checkpoint.c) ------------------------------ */

struct checkpoint {
	struct list link;
	struct agent *a;
	char job[IPC_MAX_JOB + 1];
	char run[IPC_MAX_JOB + 1];
	int64_t step;
	int world;
	struct save **rank; /* [world], NULL until that rank saves here */
	unsigned nsaved, ndurable, nrunning; /* of this node's ranks */
	int state; /* QUEUED (in flight), COMMITTED, FAILED */
	char reason[IPC_ERRLEN];
	struct work work; /* the commit thread's: part, polls, clean-up */
	int64_t t_first; /* monotonic ns of the first rank's save here */
	/*
	 * The commit job is queued, waiting for its time or running: it decides
	 * the checkpoint's end (a failure meanwhile is noted in `abort`).
	 */
	bool committing;
	bool part_built; /* this node's part is made: no save of this step joins it now */
	bool part_written; /* this node's part is in the root: a manifest may name its files */
	int64_t backoff; /* before the part: the wait for every rank to be claimed */
	bool cleaning, cleaned; /* failed: removal of this node's files queued, done */
	/*
	 * Failed, and none of its missing ranks is waited for any more (a newer
	 * step committed, its deadline passed, or a rank saves the step again):
	 * cp_get passes it over; let go once nothing of it runs.
	 */
	bool retired;
	/*
	 * The step was committed, and damaged (the catalog said so): this
	 * save replaces it, its manifest retired by the commit thread before
	 * this node's part (store_retire_manifest).
	 */
	bool replaces_damaged;
	char abort[IPC_ERRLEN]; /* why to stop committing ("" while it goes on) */
	struct commit *commit; /* the commit thread's alone */
	/* the last poll's view, for list, status and watch */
	char **parts_done, **parts_missing;
	size_t nparts_done, nparts_missing;
};

/* Under mu: the checkpoint (job, step, run), created if new. */
int cp_get(struct agent *a, const char *job, int64_t step, int world, const char *run,
           struct checkpoint **out, char *err);
/* Under mu: a rank is DURABLE; once all of this node's are, the commit starts. */
void cp_rank_durable(struct agent *a, struct checkpoint *cp);
/* Under mu: s, just made, is its rank's save of cp; it tells cp what befalls it (save.tell). */
void cp_join(struct agent *a, struct checkpoint *cp, struct save *s);

/*
 * Under mu (a hub_plan_fn): a plan dropped: its saves not CAPTURED yet fail
 * (they lose their source), and so do the steps in flight its rank had not
 * saved.
 */
void cp_on_plan(struct agent *a, struct plan *p, bool dropped);
void rpc_commit(struct rpc *c, ProtobufCMessage *req, void *ctx);
/* "n0 (ranks 0,1)" for each part m merged: malloc'd array of m->nparts (NULL: no memory). */
char **parts_text(const struct manifest *m);
/* Under mu: the checkpoint fails; every rank's save with it. */
void cp_fail(struct agent *a, struct checkpoint *cp, const char *reason);
/*
 * Under mu: the plan of (job, run, rank) is gone: steps still missing that
 * rank cannot commit; failed ones waiting for it need not wait.
 */
void cp_rank_gone(struct agent *a, const char *job, const char *run, int rank);
/*
 * Under mu: fails steps that have waited for missing ranks longer than the
 * timeout; failed ones past it wait for no rank any more (let go once idle).
 */
void cp_expire(struct agent *a, int64_t now_mono);
/* Under mu: whether any checkpoint still has I/O running or queued work. */
bool cp_any_busy(struct agent *a);
/* Under mu: a rank's pipeline has stopped (success or not). */
void cp_rank_stopped(struct agent *a, struct checkpoint *cp);
/* Under mu: drop checkpoints that are finished and unreferenced. */
void cp_release(struct agent *a, struct checkpoint *cp);
/* At exit: frees a checkpoint whatever its state. */
void cp_free(struct agent *a, struct checkpoint *cp);

/* ---- saves (save.c) --------------------------------------------------- */

/* What a save tells its checkpoint (save.tell). */
enum save_news {
	SAVE_NEWS_FAILED, /* it failed (why: "rank R: ..."): so does the checkpoint */
	SAVE_NEWS_SKIPPED, /* no room in the pool under the skip policy: the checkpoint fails */
	SAVE_NEWS_DURABLE, /* its shard is durable */
	SAVE_NEWS_STOPPED, /* its pipeline stopped (after any of the above, or aborted) */
};

struct save {
	struct list link; /* agent->saves */
	struct work work; /* the capture job */
	uint64_t id;
	struct agent *a;
	struct plan *plan; /* until its checkpoint is released */
	struct shard_layout *lay; /* what its shard holds (the plan's whole, or dedup) */
	char job[IPC_MAX_JOB + 1];
	int rank, world;
	uint64_t bytes_total;
	struct checkpoint *cp;
	struct session *sess; /* to tell; NULL once the client left */
	int64_t step;
	int state;
	char reason[IPC_ERRLEN];
	atomic_bool abort;
	bool fenced; /* a CUDA plan's: it holds a number on the plan's fence */
	uint32_t fence_seq; /* that number */
	bool fence_done; /* it has released its number */
	bool capturing; /* its capture job is queued or running */
	struct save *next_capture; /* plan_gpu's queue */
	uint8_t cuda_event[GPU_EVENT_HANDLE_BYTES]; /* the trainer's event for this save */
	bool pool_limited;
	bool upload_failed; /* COMMITTED, and it will not be UPLOADED: reason says why */
	unsigned want; /* chunks to reserve; counted in queued_chunks until then */
	struct pool_resv resv;
	struct storage_shard *shard;
	char file[SHARD_FILE_MAX]; /* the shard's name, once created */
	char *meta; /* the user meta of this rank's save, or NULL */
	unsigned nchunks;
	atomic_uint_fast64_t bytes_captured, bytes_written;
	atomic_int stages; /* capture running + chunks in flight + fsync */
	atomic_int io_err; /* first I/O error (the thread its write ended on) */
	/* checksums, the hasher's alone while it streams: a tensor at a time, in file order */
	void *xs;
	size_t hash_next;
	uint64_t *digest;
	struct io_req finish;
	int64_t t_queued, t_captured, t_durable, t_committed; /* monotonic ns */
	int64_t queued_unix_ns;
	struct st_stamp stamp; /* its step and a random number: its header's, its part's */
	/*
	 * Under mu: its pipeline has stopped (stream.c): durable (the final
	 * fsync done), or failure (why; NULL: aborted, and it says why already).
	 * Set by whoever started it (save.c).
	 */
	void (*ended)(struct agent *a, struct save *s, bool durable, const char *failure);
	/* Under mu: its checkpoint hears what befalls it (set as it joins: cp_join). */
	void (*tell)(struct agent *a, struct save *s, enum save_news what, const char *why);
};

/*
 * Under mu: a save of plan p's rank for step, QUEUED, its capture job set
 * (not queued), counted in flight; NULL without memory. It joins its
 * checkpoint next (cp_join).
 */
struct save *save_new(struct agent *a, struct plan *p, int64_t step);
/* save_rpc.c: a save admitted, or parked for its run's plan set; GetSave. */
void rpc_save(struct rpc *c, ProtobufCMessage *req, void *ctx);
/* Under mu: a checked SaveRequest admitted (or refused) and answered; m freed. */
void save_admit(struct agent *a, struct rpc *c, ProtobufCMessage *m);
void rpc_get_save(struct rpc *c, ProtobufCMessage *req, void *ctx);
/*
 * Under mu: moves s to `state` (monotonic), then publishes it (hub_save:
 * each subscriber hears it once s is there, its t_* set, and changes
 * nothing of the save).
 */
void save_set_state(struct agent *a, struct save *s, int state, const char *reason);
/* Under mu (a hub_save_fn): the log hears of saves that end other than committed. */
void save_log(struct agent *a, struct save *s, int state);
/*
 * Under mu (a hub_ckpt_fn): a step uploaded to the tier, or given up: this
 * node's COMMITTED saves of it are UPLOADED, or say why not.
 */
void save_on_ckpt(struct agent *a, const struct hub_ckpt *c);
/*
 * Under mu: a COMMITTED save will not be UPLOADED (upload.c gave it up): the
 * trainer (waiting for UPLOADED) and watchers hear why; its state stays.
 */
void save_upload_failed(struct agent *a, struct save *s, const char *why);
/* Under mu: fills `info` (strings point into s). */
void save_info(struct save *s, Ckpt__V1__SaveInfo *info);
/* Under mu: the client left; its saves tell nobody. */
void save_forget_session(struct agent *a, struct session *sess);
/* Under mu: frees finished saves beyond AGENT_KEEP_FINISHED. */
void save_trim(struct agent *a);
/* Under mu: its checkpoint is released; the plan and checksums are no longer needed. */
void save_detach(struct agent *a, struct save *s);
/* Unlinks and frees a save whose pipeline has stopped. */
void save_free(struct agent *a, struct save *s);

/* ---- restore and verify (restore.c) ---------------------------------- */

void rpc_restore(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_verify(struct rpc *c, ProtobufCMessage *req, void *ctx);

/* ---- the committed checkpoints (catalog.c) --------------------------- */

struct cat_entry {
	char job[IPC_MAX_JOB + 1];
	int64_t step;
	int world;
	uint64_t bytes;
	int64_t time_unix_ns;
	uint32_t tensors;
	double capture_seconds, durable_seconds, commit_seconds;
	unsigned readers; /* restores and verifies reading it */
	bool pinned;
	char run[IPC_MAX_JOB + 1];
	uint32_t nparts; /* nodes whose parts it merged (0: a format-1 manifest) */
	/*
	 * Why it cannot be restored whole, as last found ("": as far as known,
	 * it can): its manifest unreadable (`unreadable`: read again at each
	 * sync), a file missing or not what the manifest says (at start, for
	 * a step newer than LATEST), or a restore or verify that met damage.
	 * Committed still: it is listed (DAMAGED), never taken for absent.
	 */
	char damage[IPC_ERRLEN / 2];
	bool unreadable;
};

int catalog_create(struct catalog **out);
void catalog_destroy(struct catalog *c);
/*
 * Reads every committed manifest under the storage; one that cannot be
 * read, or a step newer than its job's LATEST whose files are not as its
 * manifest says, is listed as damaged (cat_entry.damage), and logged.
 */
int catalog_load(struct catalog *c, struct storage *s, char *err);
/*
 * Takes what the storage holds of one job: entries whose manifest is gone
 * go, committed steps not yet known are read (another node committed
 * them). Under no lock (it reads the disk): the agent's mu is taken inside.
 */
void catalog_sync_job(struct agent *a, const char *job);
/*
 * The jobs the catalog lists and those the root holds, each named once
 * (malloc'd array of malloc'd names; an entry may be NULL where out of
 * memory); their number. Reads the root: not under mu.
 */
size_t catalog_jobs(struct agent *a, char ***out);
int catalog_add(struct catalog *c, const struct cat_entry *e);
void catalog_entry_from_manifest(const struct manifest *m, struct cat_entry *e);
struct cat_entry *catalog_find(struct catalog *c, const char *job, int64_t step);
/* The newest step of job strictly below `below` (INT64_MAX: the newest), damaged or not. */
struct cat_entry *catalog_newest(struct catalog *c, const char *job, int64_t below);
/* The same, leaving out damaged ones: what a restore of LATEST means. */
struct cat_entry *catalog_newest_whole(struct catalog *c, const char *job, int64_t below);
/* Under mu: (job, step) found damaged (why), or whole again (why NULL); false if not listed. */
bool catalog_set_damage(struct catalog *c, const char *job, int64_t step, const char *why);
/* Under mu: how many listed steps are known damaged (a gauge). */
size_t catalog_damaged(const struct catalog *c);
void catalog_remove(struct catalog *c, const char *job, int64_t step);
/* Removes every entry no restore or verify reads now: the root holding them is gone. */
size_t catalog_drop_unread(struct catalog *c);
/* Entries of job (NULL: all), oldest first; *out malloc'd array of pointers. */
size_t catalog_list(struct catalog *c, const char *job, struct cat_entry ***out);

/* ---- operations (ops.c) ---------------------------------------------- */

void rpc_status(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_list(struct rpc *c, ProtobufCMessage *req, void *ctx);
/* A committed step's summary, as list and show give it (pointers into e). */
void ops_summary(const struct cat_entry *e, bool latest, Ckpt__V1__CheckpointSummary *s);

/* A call about one step of a job, handed to a worker (show, delete). */
struct job_step_op {
	struct work work;
	struct agent *a;
	struct rpc *call;
	char job[IPC_MAX_JOB + 1];
	int64_t step;
	struct storage *store; /* show: the root or the upload tier */
	bool tier; /* the upload tier: the root's catalog says nothing of it */
	bool brief; /* show: the summary only */
};

#define OPS_STREAM 1u /* the call is held open (rpc_stream_hold) for fn, which ends it */
#define OPS_BRIEF 2u /* job_step_op.brief */
/*
 * Checks job, step, tier and access (a refusal answers the call), then
 * queues fn on q with a new job_step_op (flags: OPS_*), which fn frees.
 * 0 or negative errno.
 */
int ops_queue_job_step(struct rpc *c, struct agent *a, const char *what, const char *job,
                       int64_t step, const char *tier, enum access_want want,
                       void (*fn)(struct work *), struct workq *q, unsigned flags);

/* ---- show (show.c): a summary, the manifest whole, or streamed -------- */

void rpc_show(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_show_detail(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_delete(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_watch(struct rpc *c, ProtobufCMessage *req, void *ctx);
/* Under mu (a hub_save_fn): sends a save's new state to the watchers of its job. */
void watchers_on_save(struct agent *a, struct save *s, int state);
/* Under mu: sends watchers the bytes moved by every save in flight (progress = true). */
void watchers_progress(struct agent *a);
/* Under mu: tells only the watchers where s is (a new save's QUEUED: its client has the reply). */
void watchers_tell(struct agent *a, struct save *s, bool progress);

/* ---- retention and pins (gc.c; the decision in retention.c) ----------- */

/*
 * Removes a checkpoint already out of the catalog (store_remove); one that
 * is still there after all (pinned through another node, a removal that
 * failed before it went) goes back into the catalog. Maint thread.
 */
int gc_remove(struct agent *a, const struct cat_entry *e, char *err);
/*
 * Under mu: this node committed a checkpoint of job; queues its GC (retention,
 * then abandoned uncommitted steps) on the maint thread.
 */
void gc_queue(struct agent *a, const char *job);
/* Under mu: another node committed one: the catalog of job is brought up to date (maint). */
void gc_queue_sync(struct agent *a, const char *job);
/*
 * Under mu (a hub_ckpt_fn): a step committed, retention applied (gc_queue)
 * where this node put its manifest, else the catalog brought up to date
 * (gc_queue_sync): the node that committed applies it, the others look.
 */
void gc_on_ckpt(struct agent *a, const struct hub_ckpt *c);
void rpc_gc(struct rpc *c, ProtobufCMessage *req, void *ctx);
void rpc_pin(struct rpc *c, ProtobufCMessage *req, void *ctx);

/* ---- the storage root's health (root.c) ------------------------------ */

/* Starts the root's checks (the root was opened at start: ROOT_OK). */
int root_watch_start(struct agent *a, char *err);
void root_watch_stop(struct agent *a);
/* Checks the root now, on a thread that may wait for the disk; 0: usable. No lock held. */
int root_check_now(struct agent *a, bool *reopened, char *err);
/*
 * A shard could not be created (rc): if the root may be why, it is checked
 * now. True: it is usable now and may not have been (made anew and open
 * again): create once more. Else err says what is wrong with the root,
 * when something is. No lock held.
 */
bool root_after_failure(struct agent *a, int rc, char *err);
const char *root_state_name(int state);

/* ---- the agent (agent.c) --------------------------------------------- */

int agent_start(const struct agent_config *cfg, struct agent **out, char *err);
/* Serves until *stop; then lets saves in flight finish and stops. */
void agent_run(struct agent *a, atomic_bool *stop);
void agent_destroy(struct agent *a);

#endif /* CKPT_AGENT_H */
