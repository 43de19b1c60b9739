/*
 * fuzz_rpc: every RPC's request as the agent takes it off the wire: the
 * decode edge (ipc/wire.c: the scan of string fields, then protobuf-c's
 * unpack), then the checks each handler makes before it looks anything up
 * (ipc/validate.c: names, ranks, steps, meta; for CreatePlan the whole plan,
 * ipc_check_tensors, with regions of a made-up session, and the shard
 * header the plan lays out, as agent/node/plan.c does).
 *
 * Input: one byte choosing the method (modulo IPC_NMETHODS), then the
 * request's bytes. What decodes must hold no NUL or control character in a
 * string (tab, LF, CR in JSON text), and pack and decode again; a plan
 * accepted must lay out a header that st_header_parse accepts.
 */
#include <errno.h>
#include <string.h>

#include "storage/format/format.h"
#include "fuzz/fuzz.h"
#include "ipc/ipc.h"

/* Host regions 1..4 exist, of 1 GiB; CUDA regions are the request's own. */
#define HOST_REGIONS 4
#define HOST_REGION_SIZE (1ull << 30)

static void strings_clean(const ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;

	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const char *base = (const char *)m;
		bool json = strstr(f->name, "_json") != NULL;
		size_t n = 1;
		void *const *v;

		if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			n = *(const size_t *)(base + f->quantifier_offset);
			v = *(void *const *const *)(base + f->offset);
		} else {
			v = (void *const *)(base + f->offset);
		}
		for (size_t k = 0; k < n; k++) {
			if (!v[k])
				continue;
			if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
				strings_clean(v[k]);
				continue;
			}
			for (const unsigned char *s = v[k]; *s; s++)
				FUZZ_CHECK((*s >= 0x20 && *s != 0x7f) ||
				               (json && (*s == '\t' || *s == '\n' || *s == '\r')),
				           "%s.%s holds 0x%02x", d->short_name, f->name, *s);
		}
	}
}

static int region_size(void *ctx, int kind, uint64_t region, uint64_t *size)
{
	const Ckpt__V1__CreatePlanRequest *req = ctx;

	if (kind == CKPT__V1__REGION_KIND__REGION_CUDA) {
		if (region >= req->n_cuda_regions)
			return -ENOENT;
		*size = req->cuda_regions[region]->size;
		return 0;
	}
	if (region < 1 || region > HOST_REGIONS)
		return -ENOENT;
	*size = HOST_REGION_SIZE;
	return 0;
}

/* The shard header agent/node/plan.c lays out for an accepted plan: it must parse. */
static void lay_out(const Ckpt__V1__CreatePlanRequest *req, const struct ipc_tensor *v, size_t n)
{
	struct st_tensor *st = calloc(n + 1, sizeof(*st));
	char rank[16], world[16];
	struct st_meta meta[] = {
	    {"format", "pt"},  {"producer", "ckptd"},
	    {"job", req->job}, {"run", *req->run ? req->run : IPC_DEFAULT_RUN},
	    {"rank", rank},    {"world", world},
	};
	struct st_header *h = NULL;
	char err[IPC_ERRLEN];
	uint64_t pos = 0;
	void *buf = NULL;
	size_t len = 0;
	int rc;

	FUZZ_CHECK(st, "out of memory");
	snprintf(rank, sizeof(rank), "%d", req->rank);
	snprintf(world, sizeof(world), "%d", req->world);
	for (size_t i = 0; i < n; i++) {
		st[i] = (struct st_tensor){v[i].name,  v[i].dtype, v[i].ndim,
		                           v[i].shape, pos,        pos + v[i].nbytes};
		pos += v[i].nbytes;
	}
	rc = st_header_build(st, n, meta, sizeof(meta) / sizeof(meta[0]), &buf, &len, err);
	if (rc == 0) {
		rc = st_header_parse(buf, len, len + pos, &h, err);
		FUZZ_CHECK(rc == 0, "a plan the agent accepts lays out a header it refuses: %s",
		           err);
		FUZZ_CHECK(h->n == n, "%zu tensors laid out, %zu read back", n, h->n);
	}
	st_header_free(h);
	free(buf);
	free(st);
}

static void create_plan(const Ckpt__V1__CreatePlanRequest *req)
{
	struct ipc_tensor *v = NULL;
	char err[IPC_ERRLEN];

	if (ipc_check_job(req->job, err) || ipc_check_rank(req->rank, req->world, err) ||
	    (req->run && *req->run && ipc_check_run(req->run, err)) || req->backpressure < 0 ||
	    req->backpressure > CKPT__V1__BACKPRESSURE__BACKPRESSURE_SKIP)
		return;
	if (ipc_tensors_from_request(req, &v, err))
		return;
	if (ipc_check_tensors(v, req->n_tensors, region_size, (void *)req, err) == 0)
		lay_out(req, v, req->n_tensors);
	free(v);
}

/* Show, Verify, Delete, Pin, Commit: a job and a step (agent/rpc/ops.c, gc.c, commit.c). */
static void job_step(const char *job, int64_t step)
{
	char err[IPC_ERRLEN];

	if (ipc_check_job(job, err) == 0)
		(void)ipc_check_step(step, err);
}

/* What each handler checks before it looks anything up. */
static void handler_checks(enum ipc_method meth, const ProtobufCMessage *m)
{
	char err[IPC_ERRLEN];

	switch (meth) {
	case IPC_CREATE_PLAN:
		create_plan((const Ckpt__V1__CreatePlanRequest *)m);
		break;
	case IPC_SAVE: {
		const Ckpt__V1__SaveRequest *r = (const void *)m;

		if (ipc_check_step(r->step, err) == 0)
			(void)ipc_check_meta(r->meta_json, err);
		break;
	}
	case IPC_RESTORE: {
		const Ckpt__V1__RestoreRequest *r = (const void *)m;

		if (r->step != -1)
			(void)ipc_check_step(r->step, err);
		break;
	}
	case IPC_LIST:
	case IPC_WATCH: {
		const char *job = meth == IPC_LIST ? ((const Ckpt__V1__ListRequest *)m)->job
		                                   : ((const Ckpt__V1__WatchRequest *)m)->job;

		if (job && *job)
			(void)ipc_check_job(job, err);
		break;
	}
	case IPC_GC:
		(void)ipc_check_job(((const Ckpt__V1__GcRequest *)m)->job, err);
		break;
	case IPC_SHOW:
	case IPC_SHOW_DETAIL:
		job_step(((const Ckpt__V1__ShowRequest *)m)->job,
		         ((const Ckpt__V1__ShowRequest *)m)->step);
		break;
	case IPC_VERIFY:
		job_step(((const Ckpt__V1__VerifyRequest *)m)->job,
		         ((const Ckpt__V1__VerifyRequest *)m)->step);
		break;
	case IPC_DELETE:
		job_step(((const Ckpt__V1__DeleteRequest *)m)->job,
		         ((const Ckpt__V1__DeleteRequest *)m)->step);
		break;
	case IPC_PIN:
		job_step(((const Ckpt__V1__PinRequest *)m)->job,
		         ((const Ckpt__V1__PinRequest *)m)->step);
		break;
	case IPC_COMMIT:
		job_step(((const Ckpt__V1__CommitRequest *)m)->job,
		         ((const Ckpt__V1__CommitRequest *)m)->step);
		break;
	default: /* the rest name ids only, looked up in the agent's tables */
		break;
	}
}

/* Packed again, it decodes again. */
static void repack(const ProtobufCMessageDescriptor *d, const ProtobufCMessage *m)
{
	size_t n = protobuf_c_message_get_packed_size(m);
	uint8_t *buf = malloc(n + 1);
	ProtobufCMessage *m2 = NULL;
	char err[IPC_ERRLEN];
	int rc;

	FUZZ_CHECK(buf, "out of memory");
	protobuf_c_message_pack(m, buf);
	rc = ipc_decode_buf(d, buf, n, &m2, err);
	FUZZ_CHECK(rc == 0, "decoded, packed again, refused: %s", err);
	protobuf_c_message_free_unpacked(m2, NULL);
	free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const ProtobufCMessageDescriptor *d;
	enum ipc_method meth;
	ProtobufCMessage *m = NULL;
	char err[IPC_ERRLEN] = "";

	if (size < 1)
		return 0;
	meth = (enum ipc_method)(data[0] % IPC_NMETHODS);
	d = ipc_methods[meth].request;
	if (ipc_decode_buf(d, data + 1, size - 1, &m, err)) {
		FUZZ_CHECK(m == NULL && err[0], "refused without a word");
		return 0;
	}
	strings_clean(m);
	handler_checks(meth, m);
	repack(d, m);
	protobuf_c_message_free_unpacked(m, NULL);
	return 0;
}
