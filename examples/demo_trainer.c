/*
 * demo_trainer: a stand-in for a training process that checkpoints through
 * ckptd.
 *
 *   demo_trainer [--endpoint E] [--job J] [--mb N] [--steps N] [--save-every K]
 *                [--from S] [--rank R --world W] [--run RUN]
 *   demo_trainer --resume [--endpoint E] [--job J] [--mb N] [--rank R --world W]
 *
 * It allocates about N MiB of float32 tensors with ckpt_host_alloc (sizes
 * deliberately not multiples of 4096), and at each step rewrites every
 * tensor with values that are a function of (step, tensor, element). Every K
 * steps it saves, waits only for CAPTURED, and goes on; at the end it waits
 * for the last save to commit. With --resume it restores the newest
 * committed checkpoint and checks every byte against that function of the
 * restored step. Steps run from --from (default 1) to --steps.
 *
 * As rank R of W (several trainers, on one node or many), each tensor is
 * sharded by rows: this rank holds rows [R x rows, (R + 1) x rows) of a
 * tensor of W x rows, and the values are those of the global element. The
 * run (default $CKPT_RUN, else "0") names this incarnation of the job.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt.h"

struct opts {
	const char *endpoint, *job, *run;
	int rank, world;
	long mb, steps, every, ntensors, from;
	int resume;
};

struct model {
	size_t n;
	int rank;
	struct ckpt_tensor *t;
	int64_t (*shape)[2];
	int64_t (*gshape)[2], (*goff)[2]; /* sharded by rows across ranks */
	char (*names)[32];
	float *base;
	size_t bytes;
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The value of element j of tensor i after step s: exact in float32. */
static inline float value(int64_t s, size_t i, size_t j)
{
	uint32_t x = (uint32_t)j * 2654435761u + (uint32_t)i * 40503u + (uint32_t)s * 97u;

	return (float)(x >> 8) * (1.0f / 65536.0f);
}

static size_t elems(const struct model *m, size_t i)
{
	return (size_t)(m->shape[i][0] * m->shape[i][1]);
}

static void train_step(struct model *m, int64_t s)
{
	for (size_t i = 0; i < m->n; i++) {
		float *d = m->t[i].data;
		size_t first = (size_t)m->rank * elems(m, i); /* this rank's rows of the tensor */

		for (size_t j = 0, e = elems(m, i); j < e; j++)
			d[j] = value(s, i, first + j);
	}
}

/* Tensors of uneven sizes adding up to about mb MiB, in one host region. */
static int build(struct ckpt_client *c, const struct opts *o, struct model *m)
{
	size_t per = ((size_t)o->mb << 20) / (size_t)o->ntensors / 4, off = 0;
	int rc;

	m->n = (size_t)o->ntensors;
	m->rank = o->rank;
	m->t = calloc(m->n, sizeof(*m->t));
	m->shape = calloc(m->n, sizeof(*m->shape));
	m->gshape = calloc(m->n, sizeof(*m->gshape));
	m->goff = calloc(m->n, sizeof(*m->goff));
	m->names = calloc(m->n, sizeof(*m->names));
	if (!m->t || !m->shape || !m->gshape || !m->goff || !m->names)
		return -ENOMEM;
	for (size_t i = 0; i < m->n; i++) {
		size_t cols = 1000 + 37 * i; /* never a multiple of 1024 floats */

		m->shape[i][1] = (int64_t)cols;
		m->shape[i][0] = (int64_t)((per + i * 4099) / cols + 1);
		m->bytes += elems(m, i) * 4;
	}
	rc = ckpt_host_alloc(c, m->bytes, (void **)&m->base);
	if (rc)
		return rc;
	for (size_t i = 0; i < m->n; i++) {
		snprintf(m->names[i], sizeof(m->names[i]), "layers.%zu.weight", i);
		m->t[i] = (struct ckpt_tensor){.name = m->names[i],
		                               .dtype = CKPT_F32,
		                               .ndim = 2,
		                               .shape = m->shape[i],
		                               .data = m->base + off};
		if (o->world > 1) {
			m->gshape[i][0] = m->shape[i][0] * o->world;
			m->gshape[i][1] = m->shape[i][1];
			m->goff[i][0] = m->shape[i][0] * o->rank;
			m->t[i].global_shape = m->gshape[i];
			m->t[i].global_offset = m->goff[i];
		}
		off += elems(m, i);
	}
	return 0;
}

static int check(const struct model *m, int64_t s, size_t *bad_tensor, size_t *bad_elem)
{
	for (size_t i = 0; i < m->n; i++) {
		const float *d = m->t[i].data;
		size_t first = (size_t)m->rank * elems(m, i);

		for (size_t j = 0, e = elems(m, i); j < e; j++)
			if (memcmp(&d[j], &(float){value(s, i, first + j)}, 4)) {
				*bad_tensor = i;
				*bad_elem = j;
				return -1;
			}
	}
	return 0;
}

static int train(struct ckpt_client *c, struct ckpt_plan *p, struct model *m, const struct opts *o)
{
	struct ckpt_save *last = NULL;
	double stall_sum = 0;
	int saves = 0, rc = 0;

	for (int64_t s = o->from; s <= o->steps; s++) {
		train_step(m, s);
		if (s % o->every)
			continue;
		char meta[128];
		struct ckpt_save *sv;
		double t0 = now(), stall;

		snprintf(meta, sizeof(meta), "{\"step\":%" PRId64 ",\"rank\":%d,\"loss\":%.4f}", s,
		         o->rank, 4.0 / (double)s);
		rc = ckpt_save(p, s, meta, &sv);
		if (rc) {
			fprintf(stderr, "demo: save of step %" PRId64 ": %s (%s)\n", s,
			        ckpt_strerror(rc), ckpt_last_error(c));
			return rc;
		}
		rc = ckpt_save_wait(sv, CKPT_CAPTURED, -1);
		if (rc) {
			fprintf(stderr, "demo: save of step %" PRId64 ": %s (%s)\n", s,
			        ckpt_strerror(rc), ckpt_save_reason(sv));
			return rc;
		}
		stall = now() - t0;
		stall_sum += stall;
		saves++;
		printf("rank %d step %4" PRId64
		       ": saved, training went on after %.1f ms (CAPTURED)\n",
		       o->rank, s, stall * 1e3);
		fflush(stdout);
		ckpt_save_release(last);
		last = sv;
	}
	if (last) {
		double t0 = now();

		rc = ckpt_save_wait(last, CKPT_COMMITTED, 120000);
		printf("rank %d: last save %s %.1f ms after training ended%s%s; mean stall %.1f ms "
		       "over %d saves\n",
		       o->rank,
		       rc == -EIO ? "FAILED"
		       : rc       ? ckpt_strerror(rc)
		                  : "COMMITTED",
		       (now() - t0) * 1e3, rc ? ": " : "", rc ? ckpt_save_reason(last) : "",
		       saves ? stall_sum / saves * 1e3 : 0.0, saves);
		ckpt_save_release(last);
	}
	return rc;
}

static int resume(struct ckpt_client *c, struct ckpt_plan *p, struct model *m, int rank)
{
	size_t bt = 0, be = 0;
	int64_t step = -1;
	char *meta = NULL;
	double t0 = now();
	int rc;

	memset(m->base, 0, m->bytes); /* whatever was there must not pass the check */
	rc = ckpt_restore(p, CKPT_LATEST, &step, &meta);
	if (rc) {
		fprintf(stderr, "demo: restore: %s\n", ckpt_last_error(c));
		return rc;
	}
	printf("rank %d: restored step %" PRId64 " (%.1f MiB in %.1f ms), meta %s\n", rank, step,
	       m->bytes / 1048576.0, (now() - t0) * 1e3, meta ? meta : "(none)");
	free(meta);
	if (check(m, step, &bt, &be)) {
		fprintf(stderr,
		        "demo: MISMATCH: tensor %s element %zu is not the value of step %" PRId64
		        "\n",
		        m->names[bt], be, step);
		return -EBADMSG;
	}
	printf("rank %d: verified: every byte of %zu tensors (%zu bytes) holds the values of step "
	       "%" PRId64 "\n",
	       rank, m->n, m->bytes, step);
	return 0;
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
	    {"endpoint", required_argument, NULL, 'e'},   {"job", required_argument, NULL, 'j'},
	    {"mb", required_argument, NULL, 'm'},         {"steps", required_argument, NULL, 's'},
	    {"save-every", required_argument, NULL, 'k'}, {"tensors", required_argument, NULL, 't'},
	    {"resume", no_argument, NULL, 'r'},           {"rank", required_argument, NULL, 'R'},
	    {"world", required_argument, NULL, 'W'},      {"run", required_argument, NULL, 'u'},
	    {"from", required_argument, NULL, 'f'},       {NULL, 0, NULL, 0},
	};
	int c;

	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'e':
			o->endpoint = optarg;
			break;
		case 'j':
			o->job = optarg;
			break;
		case 'm':
			o->mb = atol(optarg);
			break;
		case 's':
			o->steps = atol(optarg);
			break;
		case 'k':
			o->every = atol(optarg);
			break;
		case 't':
			o->ntensors = atol(optarg);
			break;
		case 'r':
			o->resume = 1;
			break;
		case 'R':
			o->rank = atoi(optarg);
			break;
		case 'W':
			o->world = atoi(optarg);
			break;
		case 'u':
			o->run = optarg;
			break;
		case 'f':
			o->from = atol(optarg);
			break;
		default:
			return -1;
		}
	}
	return o->mb > 0 && o->steps > 0 && o->every > 0 && o->ntensors > 0 && o->from > 0 &&
	               o->world > 0 && o->rank >= 0 && o->rank < o->world
	           ? 0
	           : -1;
}

int main(int argc, char **argv)
{
	struct opts o = {NULL, "demo", NULL, 0, 1, 256, 40, 5, 24, 1, 0};
	struct ckpt_plan_opts po = CKPT_PLAN_OPTS_INIT;
	struct ckpt_client *c = NULL;
	struct ckpt_plan *p = NULL;
	struct model m = {0};
	int rc;

	if (parse(argc, argv, &o)) {
		fprintf(stderr, "usage: demo_trainer [--endpoint E] [--job J] [--mb N] [--steps N] "
		                "[--save-every K] [--tensors N] [--from S] [--rank R --world W] "
		                "[--run RUN] [--resume]\n");
		return 2;
	}
	rc = ckpt_connect(o.endpoint, &c);
	if (rc) {
		fprintf(stderr, "demo: connect: %s\n", ckpt_strerror(rc));
		return 1;
	}
	rc = build(c, &o, &m);
	po.run = o.run;
	if (!rc)
		rc = ckpt_plan_create_opts(c, o.job, o.rank, o.world, m.t, m.n, &po, &p);
	if (rc) {
		fprintf(stderr, "demo: %s\n", ckpt_last_error(c));
		goto out;
	}
	printf("job %s rank %d/%d: %zu tensors, %.1f MiB in shared memory, shard %.1f MiB\n", o.job,
	       o.rank, o.world, m.n, m.bytes / 1048576.0, ckpt_plan_bytes(p) / 1048576.0);
	rc = o.resume ? resume(c, p, &m, o.rank) : train(c, p, &m, &o);
out:
	ckpt_plan_destroy(p);
	ckpt_host_free(c, m.base);
	ckpt_disconnect(c);
	free(m.t);
	free(m.shape);
	free(m.gshape);
	free(m.goff);
	free(m.names);
	return rc ? 1 : 0;
}
