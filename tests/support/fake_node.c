/*
 * The node of fake_node.h: the parts of daemon/agent.c's start a node's
 * objects need (its lock, lists, pool, catalog, committer, commit thread,
 * the hub wired as agent.c wires the checkpoints' and the log's), and the
 * steps of plan_rpc.c, save_rpc.c and the pipeline that make plans and
 * saves and move them on, each under agent.mu as there.
 */
#define _GNU_SOURCE
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/node/catalog.h"
#include "agent/pipe/pool.h"
#include "commit/commit.h"
#include "ipc/ipc.h"
#include "support/fake_node.h"

static struct fake_node *node_of(struct agent *a)
{
	return container_of(a, struct fake_node, a);
}

/* ---- the hub's recorder --------------------------------------------------- */

static void record_save(struct agent *a, struct save *s, enum save_state state)
{
	struct fake_node *n = node_of(a);
	struct fn_save_event *e;

	ck_assert_uint_lt(n->nsaves, FN_MAX_EVENTS);
	e = &n->saves[n->nsaves++];
	*e = (struct fn_save_event){s->id, s->rank, s->step, state, ""};
	snprintf(e->reason, sizeof(e->reason), "%s", s->reason);
}

static void record_ckpt(struct agent *a, const struct hub_ckpt *c)
{
	struct fake_node *n = node_of(a);
	struct fn_ckpt_event *e;

	ck_assert_uint_lt(n->nckpts, FN_MAX_EVENTS);
	e = &n->ckpts[n->nckpts++];
	*e = (struct fn_ckpt_event){"", c->step, c->state, c->wrote};
	snprintf(e->job, sizeof(e->job), "%s", c->job);
}

/* ---- the node ------------------------------------------------------------ */

static void lists_init(struct agent *a)
{
	struct list *l[] = {&a->sessions, &a->plans, &a->saves,  &a->ckpts,
	                    &a->watchers, &a->pubs,  &a->parked, &a->rgroups};

	for (size_t i = 0; i < sizeof(l) / sizeof(l[0]); i++)
		list_init(l[i]);
}

struct fake_node *fn_create(const char *name, unsigned deadline_s)
{
	struct fake_node *n = calloc(1, sizeof(*n));
	struct agent *a = &n->a;
	struct pool_opts po = {.bytes = 4 * 64 * 1024, .chunk_bytes = 64 * 1024};
	struct commit_opts co;
	char err[IPC_ERRLEN];

	ck_assert_ptr_nonnull(n);
	a->cfg.node = name;
	a->cfg.commit_deadline_s = deadline_s;
	a->cfg.backpressure = BACKPRESSURE_BLOCK;
	a->cfg.plans_wait_s = 1;
	a->sock_lock = -1;
	a->started_mono = ipc_mono_ns();
	pthread_mutex_init(&a->mu, NULL);
	lists_init(a);
	n->fs = fake_create();
	a->store = fake_storage(n->fs);
	co = (struct commit_opts){a->store, name, (int64_t)deadline_s * 1000000000, false};
	ck_assert_msg(pool_create(&po, &a->pool, err) == 0, "%s", err);
	ck_assert_msg(committer_create(&co, &a->cm, err) == 0, "%s", err);
	ck_assert_msg(workq_create("commit", 1, &a->commit, err) == 0, "%s", err);
	ck_assert_int_eq(catalog_create(&a->cat), 0);
	/* as agent.c wires them: the log and the recorder; the checkpoints hear plans */
	hub_on_save_new(&a->hub, record_save);
	hub_on_save(&a->hub, save_log);
	hub_on_save(&a->hub, record_save);
	hub_on_ckpt(&a->hub, record_ckpt);
	hub_on_ckpt(&a->hub, save_on_ckpt);
	hub_on_plan(&a->hub, cp_on_plan);
	return n;
}

void fn_destroy(struct fake_node *n)
{
	struct agent *a = &n->a;

	if (n->held) /* a check failed under it (CK_FORK=no: it jumped here) */
		fn_unlock(n);
	fn_settle(n); /* timed jobs still waiting are dropped below */
	a->stopping = true;
	workq_destroy(a->commit);
	a->commit = NULL;
	pthread_mutex_lock(&a->mu);
	while (!list_empty(&a->ckpts))
		cp_free(a, container_of(a->ckpts.next, struct checkpoint, link));
	while (!list_empty(&a->saves))
		save_free(a, container_of(a->saves.next, struct save, link));
	while (!list_empty(&a->plans)) {
		struct plan *p = container_of(a->plans.next, struct plan, link);

		list_del(&p->link);
		plan_put(a, p);
	}
	pthread_mutex_unlock(&a->mu);
	catalog_destroy(a->cat);
	committer_destroy(a->cm);
	pool_destroy(a->pool);
	fake_destroy(n->fs);
	pthread_mutex_destroy(&a->mu);
	free(n);
}

void fn_lock(struct fake_node *n)
{
	pthread_mutex_lock(&n->a.mu);
	n->held = true;
}

void fn_unlock(struct fake_node *n)
{
	n->held = false;
	pthread_mutex_unlock(&n->a.mu);
}

/* ---- plans ---------------------------------------------------------------- */

struct plan *fn_plan(struct fake_node *n, const char *job, const char *run, int rank, int world)
{
	struct plan *p = calloc(1, sizeof(*p));
	struct plan_tensor *t;
	char err[IPC_ERRLEN];

	ck_assert_ptr_nonnull(p);
	snprintf(p->job, sizeof(p->job), "%s", job);
	snprintf(p->run, sizeof(p->run), "%s", run);
	p->rank = rank;
	p->world = world;
	p->backpressure = BACKPRESSURE_BLOCK;
	p->copies = 1;
	p->refs = 1;
	p->n = 1;
	p->t = t = calloc(1, sizeof(*t));
	ck_assert_ptr_nonnull(t);
	ck_assert_int_ge(asprintf(&t->name, "r%d.w", rank), 0);
	t->dtype = 12; /* F32 */
	t->ndim = 1;
	t->shape[0] = t->global_shape[0] = 4;
	t->nbytes = 16;
	p->whole = (struct shard_layout){.n = p->n, .t = p->t, .held_bytes = t->nbytes};
	ck_assert_msg(shard_layout_header(&p->whole, p, err) == 0, "%s", err);
	p->id = ipc_random_id();
	list_init(&p->slink); /* no session: plan_drop unlinks it from itself */
	fn_lock(n);
	list_add_tail(&n->a.plans, &p->link);
	n->a.nplans++;
	fn_unlock(n);
	return p;
}

void fn_drop(struct fake_node *n, struct plan *p)
{
	fn_lock(n);
	plan_drop(&n->a, p);
	fn_unlock(n);
}

/* ---- saves and their pipeline -------------------------------------------- */

int fn_save(struct fake_node *n, struct plan *p, int64_t step, struct save **out, char *err)
{
	struct agent *a = &n->a;
	struct checkpoint *cp;
	struct save *s;
	int rc;

	*out = NULL;
	fn_lock(n);
	rc = cp_get(a, p->job, step, p->world, p->run, &cp, err);
	if (!rc && cp->rank[p->rank])
		rc = ipc_errf(err, -EEXIST, "rank %d saved step %lld already", p->rank,
		              (long long)step);
	if (!rc) {
		s = save_new(a, p, step);
		ck_assert_ptr_nonnull(s);
		cp_join(a, cp, s);
		hub_save_new(&a->hub, a, s, s->state);
		if (cp->state == SAVE_FAILED) { /* as save_go: born failed */
			char why[IPC_ERRLEN + 64];

			snprintf(why, sizeof(why), "checkpoint %s step %lld failed: %s", cp->job,
			         (long long)cp->step, cp->reason);
			atomic_store(&s->abort, true);
			save_set_state(a, s, SAVE_FAILED, why);
		}
		*out = s;
	}
	fn_unlock(n);
	return rc;
}

void fn_start(struct fake_node *n, struct save *s)
{
	fn_lock(n);
	atomic_store(&s->stages, 1);
	s->cp->nrunning++;
	plan_busy(s->plan);
	fn_unlock(n);
}

void fn_captured(struct fake_node *n, struct save *s)
{
	fn_lock(n);
	if (!atomic_load(&s->abort))
		save_set_state(&n->a, s, SAVE_CAPTURED, NULL);
	plan_idle(&n->a, s->plan);
	fn_unlock(n);
}

/* The shard of s in the root, as its pipeline leaves it: its header stamped, its size. */
static void put_shard(struct fake_node *n, struct save *s)
{
	const struct shard_layout *l = s->lay;
	char *head = malloc(l->header_len);

	ck_assert_ptr_nonnull(head);
	ck_assert_int_eq(shard_file_name(s->rank, n->a.cfg.node, 0, s->file, sizeof(s->file)), 0);
	memcpy(head, l->header, l->header_len);
	st_stamp_apply(&l->stamp_at, &s->stamp, 0, head, l->header_len);
	fake_add_shard_bytes(n->fs, s->job, s->step, s->file, head, l->header_len, l->shard_bytes);
	free(head);
}

static void ended(struct fake_node *n, struct save *s, bool durable, const char *failure)
{
	fn_lock(n);
	atomic_store(&s->stages, 0);
	s->ended(&n->a, s, durable, failure);
	fn_unlock(n);
}

void fn_durable(struct fake_node *n, struct save *s)
{
	put_shard(n, s);
	ended(n, s, true, NULL);
}

void fn_durable_held(struct fake_node *n, struct save *s)
{
	put_shard(n, s);
	atomic_store(&s->stages, 0);
	s->ended(&n->a, s, true, NULL);
}

void fn_broke(struct fake_node *n, struct save *s, const char *why)
{
	put_shard(n, s); /* a file half written */
	ended(n, s, false, why);
}

void fn_stopped(struct fake_node *n, struct save *s)
{
	ended(n, s, false, NULL);
}

/* ---- looking ------------------------------------------------------------- */

bool fn_settle(struct fake_node *n)
{
	for (int i = 0; i < 1000; i++) {
		if (!n->a.commit || workq_busy(n->a.commit) == 0)
			return true;
		nanosleep(&(struct timespec){0, 10000000}, NULL);
	}
	return false;
}

struct checkpoint *fn_ckpt(struct fake_node *n, const char *job, int64_t step)
{
	struct list *pos;

	list_for_each(pos, &n->a.ckpts)
	{
		struct checkpoint *cp = container_of(pos, struct checkpoint, link);

		if (cp->step == step && strcmp(cp->job, job) == 0)
			return cp;
	}
	return NULL;
}

const char *fn_states(struct fake_node *n, const struct save *s, char *buf, size_t len)
{
	size_t o = 0;

	buf[0] = '\0';
	fn_lock(n);
	for (unsigned i = 0; i < n->nsaves && o < len; i++)
		if (n->saves[i].id == s->id)
			o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? " " : "",
			                      ipc_state_name(n->saves[i].state));
	fn_unlock(n);
	return buf;
}

unsigned fn_ends(struct fake_node *n, const char *job, int64_t step, enum save_state state)
{
	unsigned k = 0;

	fn_lock(n);
	for (unsigned i = 0; i < n->nckpts; i++)
		k += n->ckpts[i].step == step && n->ckpts[i].state == state &&
		     strcmp(n->ckpts[i].job, job) == 0;
	fn_unlock(n);
	return k;
}
