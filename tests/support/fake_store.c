/*
 * The in-memory backend of fake_store.h. Objects are (key, bytes) in a
 * list; a listing is the names of the keys directly under a prefix, as a
 * directory or an object store would give them. Every call of the backend
 * takes one lock (a commit reads parts from several threads at once).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/fake_store.h"

/* Every call of the backend, and the test's own calls (a commit thread may run meanwhile). */
static pthread_mutex_t mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;

struct obj {
	struct obj *next;
	char *key;
	char *buf;
	size_t len;
	bool shard; /* a shard of `size` bytes: buf holds its first len, zeros follow */
	uint64_t size;
};

/* An open shard: its key, read through obj at each read. */
struct storage_shard {
	struct fake_store *f;
	char key[512];
};

struct fake_store {
	struct storage base; /* first */
	struct obj *objs;
	struct fake_counts n;
	char fail_needle[256];
	int fail_err;
};

static struct fake_store *F(struct storage *s)
{
	return (struct fake_store *)s;
}

static struct obj *find(struct fake_store *f, const char *key)
{
	for (struct obj *o = f->objs; o; o = o->next)
		if (strcmp(o->key, key) == 0)
			return o;
	return NULL;
}

void fake_put(struct fake_store *f, const char *key, const void *buf, size_t len)
{
	struct obj *o;

	pthread_mutex_lock(&mu);
	o = find(f, key);
	if (!o) {
		o = calloc(1, sizeof(*o));
		o->key = strdup(key);
		o->next = f->objs;
		f->objs = o;
	}
	free(o->buf);
	o->buf = malloc(len + 1);
	memcpy(o->buf, buf, len);
	o->buf[len] = '\0';
	o->len = len;
	o->shard = false;
	pthread_mutex_unlock(&mu);
}

const char *fake_get(struct fake_store *f, const char *key, size_t *len)
{
	struct obj *o;

	pthread_mutex_lock(&mu);
	o = find(f, key);
	if (o && len)
		*len = o->len;
	pthread_mutex_unlock(&mu);
	return o ? o->buf : NULL;
}

void fake_delete(struct fake_store *f, const char *key)
{
	pthread_mutex_lock(&mu);
	for (struct obj **pp = &f->objs; *pp; pp = &(*pp)->next)
		if (strcmp((*pp)->key, key) == 0) {
			struct obj *o = *pp;

			*pp = o->next;
			free(o->key);
			free(o->buf);
			free(o);
			break;
		}
	pthread_mutex_unlock(&mu);
}

void fake_fail_put(struct fake_store *f, const char *needle, int err)
{
	pthread_mutex_lock(&mu);
	snprintf(f->fail_needle, sizeof(f->fail_needle), "%s", needle);
	f->fail_err = err;
	pthread_mutex_unlock(&mu);
}

void fake_counts(struct fake_store *f, struct fake_counts *out)
{
	pthread_mutex_lock(&mu);
	*out = f->n;
	pthread_mutex_unlock(&mu);
}

static void shard_key(char *buf, size_t len, const char *job, int64_t step, const char *file)
{
	snprintf(buf, len, "%s/step-%012" PRId64 "/%s", job, step, file);
}

void fake_add_shard_bytes(struct fake_store *f, const char *job, int64_t step, const char *file,
                          const void *head, size_t len, uint64_t size)
{
	char key[512];
	struct obj *o;

	shard_key(key, sizeof(key), job, step, file);
	pthread_mutex_lock(&mu);
	fake_put(f, key, head, len);
	o = find(f, key);
	o->shard = true;
	o->size = size;
	pthread_mutex_unlock(&mu);
}

void fake_add_shard(struct fake_store *f, const char *job, int64_t step, const char *file,
                    uint64_t size)
{
	fake_add_shard_bytes(f, job, step, file, "", 0, size);
}

static int obj_put(struct storage *s, const char *key, const void *buf, size_t len,
                   enum obj_put_mode mode, char *err)
{
	struct fake_store *f = F(s);

	f->n.puts++;
	if (mode == OBJ_CREATE && find(f, key))
		return ipc_errf(err, -EEXIST, "%s exists already", key);
	if (f->fail_err && strstr(key, f->fail_needle)) {
		int rc = f->fail_err;

		f->fail_err = 0;
		return ipc_errf(err, rc, "%s: injected %s", key, strerror(-rc));
	}
	fake_put(f, key, buf, len);
	return 0;
}

static int obj_get(struct storage *s, const char *key, size_t max, char **buf, size_t *len,
                   char *err)
{
	struct obj *o = find(F(s), key);
	size_t n = strlen(key);

	F(s)->n.gets++;
	if (strstr(key, "/parts/") && n > 5 && strcmp(key + n - 5, ".json") == 0)
		F(s)->n.part_gets++;
	if (strstr(key, "/parts/") && n > 4 && strcmp(key + n - 4, ".sum") == 0)
		F(s)->n.summary_gets++;
	if (strstr(key, "/plans/") && n > 5 && strcmp(key + n - 5, ".json") == 0)
		F(s)->n.plans_gets++;
	if (strstr(key, "/plans/") && n > 4 && strcmp(key + n - 4, ".sum") == 0)
		F(s)->n.plans_summary_gets++;
	if (!o)
		return ipc_errf(err, -ENOENT, "%s does not exist", key);
	if (o->len > max)
		return ipc_errf(err, -EFBIG, "%s is too large", key);
	*buf = malloc(o->len + 1);
	memcpy(*buf, o->buf, o->len + 1);
	*len = o->len;
	return 0;
}

static int obj_stat(struct storage *s, const char *key, uint64_t *size, char *err)
{
	struct obj *o = find(F(s), key);

	F(s)->n.stats++;
	if (!o)
		return ipc_errf(err, -ENOENT, "%s does not exist", key);
	*size = o->len;
	return 0;
}

static int obj_delete(struct storage *s, const char *key, char *err)
{
	F(s)->n.deletes++;
	if (!find(F(s), key))
		return ipc_errf(err, -ENOENT, "%s does not exist", key);
	fake_delete(F(s), key);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int obj_list(struct storage *s, const char *dir, char ***names, size_t *n, char *err)
{
	struct fake_store *f = F(s);
	size_t dl = strlen(dir), k = 0, cap = 0;
	char **v = NULL;

	f->n.lists++;
	for (struct obj *o = f->objs; o; o = o->next) {
		const char *rest = o->key + dl;

		if (strncmp(o->key, dir, dl) != 0 || rest[0] != '/' || strchr(rest + 1, '/'))
			continue;
		if (k == cap)
			v = realloc(v, (cap = cap ? cap * 2 : 8) * sizeof(*v));
		v[k++] = strdup(rest + 1);
	}
	if (k)
		qsort(v, k, sizeof(*v), cmp_str);
	*names = v;
	*n = k;
	(void)err;
	return 0;
}

static int shard_stat(struct storage *s, const char *job, int64_t step, const char *file,
                      uint64_t *size, char *err)
{
	char key[512];
	struct obj *o;

	F(s)->n.shard_stats++;
	shard_key(key, sizeof(key), job, step, file);
	o = find(F(s), key);
	if (!o)
		return ipc_errf(err, -ENOENT, "%s does not exist", key);
	*size = o->size;
	return 0;
}

static int shard_open(struct storage *s, const char *job, int64_t step, const char *file,
                      struct storage_shard **out, uint64_t *size, char *err)
{
	struct storage_shard *sh = calloc(1, sizeof(*sh));
	int rc;

	sh->f = F(s);
	shard_key(sh->key, sizeof(sh->key), job, step, file);
	rc = shard_stat(s, job, step, file, size, err);
	if (rc) {
		free(sh);
		sh = NULL;
	}
	*out = sh;
	return rc;
}

/* Synchronous: done on the caller's thread, as an engine's completion would be. */
static void shard_read(struct storage_shard *sh, struct io_req *r)
{
	struct obj *o = find(sh->f, sh->key);
	uint64_t end;

	sh->f->n.shard_reads++;
	sh->f->n.shard_read_bytes += r->len;
	if (!o) {
		r->res = -ENOENT;
		r->done(r);
		return;
	}
	end = r->off + r->len < o->size ? r->off + r->len : o->size;
	r->res = end > r->off ? (int64_t)(end - r->off) : 0;
	memset(r->buf, 0, r->res > 0 ? (size_t)r->res : 0);
	for (uint64_t i = r->off; i < end && i < o->len; i++)
		((char *)r->buf)[i - r->off] = o->buf[i];
	r->done(r);
}

static int shard_unlink(struct storage *s, const char *job, int64_t step, const char *file,
                        char *err)
{
	char key[512];

	F(s)->n.shard_unlinks++;
	shard_key(key, sizeof(key), job, step, file);
	if (!find(F(s), key))
		return ipc_errf(err, -ENOENT, "%s does not exist", key);
	fake_delete(F(s), key);
	return 0;
}

/* Counted only: the fake keeps no directories to remove. */
static int step_tidy(struct storage *s, const char *job, int64_t step, char *err)
{
	(void)job;
	(void)step;
	(void)err;
	F(s)->n.step_tidies++;
	return 0;
}

static void shard_close(struct storage_shard *sh)
{
	free(sh);
}

static void shard_path(struct storage *s, const char *job, int64_t step, const char *file,
                       char *buf, size_t len)
{
	(void)s;
	shard_key(buf, len, job, step, file);
}

/* Steps of a job: "<job>/step-<12d>/..." keys; committed if it has a manifest. */
static int list_steps(struct storage *s, const char *job, struct storage_step **steps, size_t *n,
                      char *err)
{
	struct fake_store *f = F(s);
	struct storage_step *v = NULL;
	size_t k = 0, jl = strlen(job);

	for (struct obj *o = f->objs; o; o = o->next) {
		int64_t step;
		char rest[64];
		bool seen = false;

		if (strncmp(o->key, job, jl) != 0 ||
		    sscanf(o->key + jl, "/step-%12" SCNd64 "/%63s", &step, rest) != 2)
			continue;
		for (size_t i = 0; i < k; i++)
			if (v[i].step == step) {
				seen = true;
				v[i].committed |= strcmp(rest, "manifest.json") == 0;
			}
		if (!seen) {
			v = realloc(v, (k + 1) * sizeof(*v));
			v[k++] =
			    (struct storage_step){step, strcmp(rest, "manifest.json") == 0, false};
		}
	}
	for (size_t i = 0; i < k; i++) /* sorted, as backends give them */
		for (size_t j = i + 1; j < k; j++)
			if (v[j].step < v[i].step) {
				struct storage_step t = v[i];

				v[i] = v[j];
				v[j] = t;
			}
	*steps = v;
	*n = k;
	(void)err;
	return 0;
}

static void destroy(struct storage *s)
{
	fake_destroy(F(s));
}

#define LOCKED(ret, name, params, args)                                                            \
	static ret locked_##name params                                                            \
	{                                                                                          \
		ret rc;                                                                            \
                                                                                                   \
		pthread_mutex_lock(&mu);                                                           \
		rc = name args;                                                                    \
		pthread_mutex_unlock(&mu);                                                         \
		return rc;                                                                         \
	}

LOCKED(int, shard_open,
       (struct storage * s, const char *job, int64_t step, const char *file,
        struct storage_shard **out, uint64_t *size, char *err),
       (s, job, step, file, out, size, err))
LOCKED(int, shard_stat,
       (struct storage * s, const char *job, int64_t step, const char *file, uint64_t *size,
        char *err),
       (s, job, step, file, size, err))
LOCKED(int, shard_unlink,
       (struct storage * s, const char *job, int64_t step, const char *file, char *err),
       (s, job, step, file, err))
LOCKED(int, step_tidy, (struct storage * s, const char *job, int64_t step, char *err),
       (s, job, step, err))
LOCKED(int, obj_put,
       (struct storage * s, const char *key, const void *buf, size_t len, enum obj_put_mode flags,
        char *err),
       (s, key, buf, len, flags, err))
LOCKED(int, obj_get,
       (struct storage * s, const char *key, size_t max, char **buf, size_t *len, char *err),
       (s, key, max, buf, len, err))
LOCKED(int, obj_stat, (struct storage * s, const char *key, uint64_t *size, char *err),
       (s, key, size, err))
LOCKED(int, obj_delete, (struct storage * s, const char *key, char *err), (s, key, err))
LOCKED(int, obj_list, (struct storage * s, const char *dir, char ***names, size_t *n, char *err),
       (s, dir, names, n, err))
LOCKED(int, list_steps,
       (struct storage * s, const char *job, struct storage_step **steps, size_t *n, char *err),
       (s, job, steps, n, err))

static void locked_shard_read(struct storage_shard *sh, struct io_req *r)
{
	pthread_mutex_lock(&mu);
	shard_read(sh, r);
	pthread_mutex_unlock(&mu);
}

static const struct storage_ops fake_ops = {
    .name = "fake",
    .shard_open = locked_shard_open,
    .shard_read = locked_shard_read,
    .shard_close = shard_close,
    .shard_stat = locked_shard_stat,
    .shard_unlink = locked_shard_unlink,
    .shard_path = shard_path,
    .obj_put = locked_obj_put,
    .obj_get = locked_obj_get,
    .obj_stat = locked_obj_stat,
    .obj_delete = locked_obj_delete,
    .obj_list = locked_obj_list,
    .list_steps = locked_list_steps,
    .step_tidy = locked_step_tidy,
    .destroy = destroy,
};

struct fake_store *fake_create(void)
{
	struct fake_store *f = calloc(1, sizeof(*f));

	storage_init(&f->base, &fake_ops);
	return f;
}

struct storage *fake_storage(struct fake_store *f)
{
	return &f->base;
}

void fake_destroy(struct fake_store *f)
{
	if (!f)
		return;
	while (f->objs) {
		struct obj *o = f->objs;

		f->objs = o->next;
		free(o->key);
		free(o->buf);
		free(o);
	}
	free(f);
}
