/*
 * scale_store.c: the counting storage of scale_store.h. Each op of the
 * table counts itself, waits the set time, then calls the wrapped
 * backend's. Shards are wrapped too (their reads and writes name only the
 * shard): a struct cs_shard holds the wrapped one and the counters.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "bench/scale_store.h"

struct cs {
	struct storage base; /* first: a struct storage * is a struct cs * */
	struct storage *in;
	int64_t latency_ns;
	_Atomic uint64_t calls[CS_KINDS], bytes[CS_KINDS];
};

/* What the wrapper hands out for a shard: the wrapped shard and its counters. */
struct cs_shard {
	struct storage_shard *in;
	struct cs *cs;
};

static const char *const kind_names[CS_KINDS] = {
    "obj_get",     "obj_put",      "obj_stat",     "obj_list",   "obj_delete",
    "obj_sync",    "shard_open",   "shard_read",   "shard_stat", "shard_create",
    "shard_write", "shard_finish", "shard_unlink", "list",       "other",
};

static struct cs *to_cs(struct storage *s)
{
	return (struct cs *)s;
}

static struct cs_shard *to_sh(struct storage_shard *sh)
{
	return (struct cs_shard *)sh;
}

/* One call of kind k: counted, then the wait that models the storage's latency. */
static void op(struct cs *c, enum cs_kind k, uint64_t bytes)
{
	atomic_fetch_add_explicit(&c->calls[k], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&c->bytes[k], bytes, memory_order_relaxed);
	if (c->latency_ns > 0) {
		struct timespec ts = {c->latency_ns / 1000000000, c->latency_ns % 1000000000};

		while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
			;
	}
}

/* A wrapped shard for the one the backend opened or made (rc: how that went); -ENOMEM closes it. */
static int wrap_shard(struct cs *c, int rc, struct storage_shard *in, struct storage_shard **out,
                      char *err)
{
	struct cs_shard *w;

	*out = NULL;
	if (rc)
		return rc;
	w = malloc(sizeof(*w));
	if (!w) {
		if (c->in->ops->shard_close)
			c->in->ops->shard_close(in);
		return ipc_errf(err, -ENOMEM, "out of memory wrapping a shard");
	}
	*w = (struct cs_shard){in, c};
	*out = (struct storage_shard *)w;
	return 0;
}

static int cs_shard_create(struct storage *s, const char *job, int64_t step, int rank,
                           uint64_t size, char *file, struct storage_shard **out, char *err)
{
	struct cs *c = to_cs(s);
	struct storage_shard *in = NULL;

	int rc;

	op(c, CS_SHARD_CREATE, 0);
	rc = c->in->ops->shard_create(c->in, job, step, rank, size, file, &in, err);
	return wrap_shard(c, rc, in, out, err);
}

static int cs_shard_create_as(struct storage *s, const char *job, int64_t step, const char *file,
                              uint64_t size, struct storage_shard **out, char *err)
{
	struct cs *c = to_cs(s);
	struct storage_shard *in = NULL;

	int rc;

	op(c, CS_SHARD_CREATE, 0);
	rc = c->in->ops->shard_create_as(c->in, job, step, file, size, &in, err);
	return wrap_shard(c, rc, in, out, err);
}

static void cs_shard_write(struct storage_shard *sh, struct io_req *r)
{
	struct cs_shard *w = to_sh(sh);

	op(w->cs, CS_SHARD_WRITE, r->len);
	w->cs->in->ops->shard_write(w->in, r);
}

static void cs_shard_finish(struct storage_shard *sh, struct io_req *r)
{
	struct cs_shard *w = to_sh(sh);

	op(w->cs, CS_SHARD_FINISH, 0);
	w->cs->in->ops->shard_finish(w->in, r);
}

static int cs_shard_open(struct storage *s, const char *job, int64_t step, const char *file,
                         struct storage_shard **out, uint64_t *size, char *err)
{
	struct cs *c = to_cs(s);
	struct storage_shard *in = NULL;

	int rc;

	op(c, CS_SHARD_OPEN, 0);
	rc = c->in->ops->shard_open(c->in, job, step, file, &in, size, err);
	return wrap_shard(c, rc, in, out, err);
}

static void cs_shard_read(struct storage_shard *sh, struct io_req *r)
{
	struct cs_shard *w = to_sh(sh);

	op(w->cs, CS_SHARD_READ, r->len);
	w->cs->in->ops->shard_read(w->in, r);
}

static void cs_shard_close(struct storage_shard *sh)
{
	struct cs_shard *w = to_sh(sh);

	if (!w)
		return;
	if (w->cs->in->ops->shard_close)
		w->cs->in->ops->shard_close(w->in);
	free(w);
}

static int cs_shard_stat(struct storage *s, const char *job, int64_t step, const char *file,
                         uint64_t *size, char *err)
{
	struct cs *c = to_cs(s);

	op(c, CS_SHARD_STAT, 0);
	return c->in->ops->shard_stat(c->in, job, step, file, size, err);
}

static int cs_shard_unlink(struct storage *s, const char *job, int64_t step, const char *file,
                           char *err)
{
	struct cs *c = to_cs(s);

	op(c, CS_SHARD_UNLINK, 0);
	return c->in->ops->shard_unlink(c->in, job, step, file, err);
}

static void cs_shard_path(struct storage *s, const char *job, int64_t step, const char *file,
                          char *buf, size_t len)
{
	struct cs *c = to_cs(s);

	c->in->ops->shard_path(c->in, job, step, file, buf, len);
}

static const char *cs_shard_error(struct storage_shard *sh)
{
	struct cs_shard *w = to_sh(sh);

	return w->cs->in->ops->shard_error ? w->cs->in->ops->shard_error(w->in) : NULL;
}

static int cs_obj_put(struct storage *s, const char *key, const void *buf, size_t len,
                      enum obj_put_mode mode, char *err)
{
	struct cs *c = to_cs(s);

	op(c, CS_OBJ_PUT, len);
	return c->in->ops->obj_put(c->in, key, buf, len, mode, err);
}

static int cs_obj_get(struct storage *s, const char *key, size_t max, char **buf, size_t *len,
                      char *err)
{
	struct cs *c = to_cs(s);
	int rc;

	op(c, CS_OBJ_GET, 0);
	rc = c->in->ops->obj_get(c->in, key, max, buf, len, err);
	if (rc == 0)
		atomic_fetch_add_explicit(&c->bytes[CS_OBJ_GET], *len, memory_order_relaxed);
	return rc;
}

static int cs_obj_stat(struct storage *s, const char *key, uint64_t *size, char *err)
{
	struct cs *c = to_cs(s);

	op(c, CS_OBJ_STAT, 0);
	return c->in->ops->obj_stat(c->in, key, size, err);
}

static int cs_obj_delete(struct storage *s, const char *key, char *err)
{
	struct cs *c = to_cs(s);

	op(c, CS_OBJ_DELETE, 0);
	return c->in->ops->obj_delete(c->in, key, err);
}

static int cs_obj_sync(struct storage *s, const char *key, char *err)
{
	struct cs *c = to_cs(s);

	op(c, CS_OBJ_SYNC, 0);
	return c->in->ops->obj_sync(c->in, key, err);
}

static int cs_obj_list(struct storage *s, const char *dir, char ***names, size_t *n, char *err)
{
	struct cs *c = to_cs(s);

	op(c, CS_OBJ_LIST, 0);
	return c->in->ops->obj_list(c->in, dir, names, n, err);
}

static int cs_list_jobs(struct storage *s, char ***jobs, size_t *n, char *err)
{
	struct cs *c = to_cs(s);

	op(c, CS_LIST, 0);
	return c->in->ops->list_jobs(c->in, jobs, n, err);
}

static int cs_list_steps(struct storage *s, const char *job, struct storage_step **steps, size_t *n,
                         char *err)
{
	struct cs *c = to_cs(s);

	op(c, CS_LIST, 0);
	return c->in->ops->list_steps(c->in, job, steps, n, err);
}

static int cs_step_tidy(struct storage *s, const char *job, int64_t step, char *err)
{
	struct cs *c = to_cs(s);

	op(c, CS_OTHER, 0);
	return c->in->ops->step_tidy(c->in, job, step, err);
}

static int cs_remove(struct storage *s, const char *job, int64_t step, char *err)
{
	struct cs *c = to_cs(s);

	op(c, CS_OTHER, 0);
	return c->in->ops->remove(c->in, job, step, err);
}

static int cs_cleanup(struct storage *s, const char *job, int64_t latest,
                      const struct storage_cleanup *pol, struct storage_recovery *rec, char *err)
{
	struct cs *c = to_cs(s);

	op(c, CS_OTHER, 0);
	return c->in->ops->cleanup(c->in, job, latest, pol, rec, err);
}

static int cs_root_check(struct storage *s, bool *reopened, char *err)
{
	struct cs *c = to_cs(s);

	if (!c->in->ops->root_check)
		return 0;
	op(c, CS_OTHER, 0);
	return c->in->ops->root_check(c->in, reopened, err);
}

static void cs_describe(struct storage *s, char *buf, size_t len)
{
	struct cs *c = to_cs(s);

	if (c->in->ops->describe)
		c->in->ops->describe(c->in, buf, len);
	else if (len)
		buf[0] = '\0';
}

static void cs_stats(struct storage *s, struct storage_stats *out)
{
	struct cs *c = to_cs(s);

	if (c->in->ops->stats)
		c->in->ops->stats(c->in, out);
	else
		*out = (struct storage_stats){0};
}

static void cs_destroy(struct storage *s)
{
	struct cs *c = to_cs(s);

	storage_destroy(c->in);
	pthread_mutex_destroy(&c->base.latest_mu);
	free(c);
}

/* The optional ops stay NULL where the wrapped backend's are (callers test them). */
static struct storage_ops ops_for(const struct storage_ops *in)
{
	return (struct storage_ops){
	    .name = in->name,
	    .shard_create = cs_shard_create,
	    .shard_create_as = in->shard_create_as ? cs_shard_create_as : NULL,
	    .shard_write = cs_shard_write,
	    .shard_finish = cs_shard_finish,
	    .shard_open = cs_shard_open,
	    .shard_read = cs_shard_read,
	    .shard_close = cs_shard_close, /* frees the wrapper: always */
	    .shard_stat = cs_shard_stat,
	    .shard_unlink = cs_shard_unlink,
	    .shard_path = cs_shard_path,
	    .shard_error = in->shard_error ? cs_shard_error : NULL,
	    .obj_put = cs_obj_put,
	    .obj_get = cs_obj_get,
	    .obj_stat = cs_obj_stat,
	    .obj_delete = cs_obj_delete,
	    .obj_sync = in->obj_sync ? cs_obj_sync : NULL,
	    .obj_list = cs_obj_list,
	    .list_jobs = cs_list_jobs,
	    .list_steps = cs_list_steps,
	    .step_tidy = cs_step_tidy,
	    .remove = cs_remove,
	    .cleanup = cs_cleanup,
	    .root_check = in->root_check ? cs_root_check : NULL,
	    .describe = cs_describe,
	    .stats = cs_stats,
	    .destroy = cs_destroy,
	};
}

/* One table per process: every wrapper of this program wraps the local backend. */
static struct storage_ops the_ops;
static pthread_once_t the_ops_once = PTHREAD_ONCE_INIT;
static const struct storage_ops *the_inner;

static void make_ops(void)
{
	the_ops = ops_for(the_inner);
}

int cs_create(struct storage *inner, int64_t latency_us, struct storage **out, char *err)
{
	struct cs *c;

	*out = NULL;
	if (the_inner && the_inner != inner->ops)
		return ipc_errf(err, -EINVAL, "scale_store wraps one kind of backend per process");
	the_inner = inner->ops;
	pthread_once(&the_ops_once, make_ops);
	c = calloc(1, sizeof(*c));
	if (!c)
		return ipc_errf(err, -ENOMEM, "out of memory wrapping the storage");
	storage_init(&c->base, &the_ops);
	c->in = inner;
	c->latency_ns = latency_us * 1000;
	*out = &c->base;
	return 0;
}

void cs_counts(struct storage *s, struct cs_counts *out)
{
	struct cs *c = to_cs(s);

	for (int k = 0; k < CS_KINDS; k++) {
		out->calls[k] = atomic_load(&c->calls[k]);
		out->bytes[k] = atomic_load(&c->bytes[k]);
	}
}

void cs_diff(const struct cs_counts *b, const struct cs_counts *a, struct cs_counts *out)
{
	for (int k = 0; k < CS_KINDS; k++) {
		out->calls[k] = b->calls[k] - a->calls[k];
		out->bytes[k] = b->bytes[k] - a->bytes[k];
	}
}

uint64_t cs_json(const struct cs_counts *c, FILE *f)
{
	uint64_t total = 0;
	bool first = true;

	fputc('{', f);
	for (int k = 0; k < CS_KINDS; k++) {
		if (!c->calls[k])
			continue;
		fprintf(f, "%s\"%s\": {\"n\": %llu, \"bytes\": %llu}", first ? "" : ", ",
		        kind_names[k], (unsigned long long)c->calls[k],
		        (unsigned long long)c->bytes[k]);
		first = false;
		total += c->calls[k];
	}
	fputc('}', f);
	return total;
}

struct storage *cs_inner(struct storage *s)
{
	return to_cs(s)->in;
}
