/*
 * ckptctl show: a checkpoint's summary (Show, brief: a few lines whatever
 * its size), or with --full or --json every rank, tensor and chunk, the
 * manifest streamed in pieces (ShowDetail), so that no message passes the
 * limit however many chunks it has. An agent without ShowDetail (older)
 * is asked the whole manifest in one Show. Called from ckptctl.c's main.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "client/ckptctl/ckptctl.h"

#define SHOW_PARTS_NAMED 16 /* the summary names this many nodes' parts, then counts */

static void show_tensors(json_t *m)
{
	const char *name;
	json_t *t;

	printf("\n%-40s %-8s %-24s %6s\n", "TENSOR", "DTYPE", "GLOBAL SHAPE", "CHUNKS");
	json_object_foreach(json_object_get(m, "tensors"), name, t)
	{
		char shape[128] = "[";
		size_t o = 1, i;
		json_t *d;

		json_array_foreach(json_object_get(t, "global_shape"), i, d) o +=
		    (size_t)snprintf(shape + o, sizeof(shape) - o, "%s%" JSON_INTEGER_FORMAT,
		                     i ? "," : "", json_integer_value(d));
		if (o < sizeof(shape) - 1)
			strcat(shape, "]");
		printf("%-40s %-8s %-24s %6zu\n", name,
		       json_string_value(json_object_get(t, "dtype")), shape,
		       json_array_size(json_object_get(t, "chunks")));
	}
}

/* "<tensor> <global offset> <shape>": the box a chunk holds; NULL if out of memory. */
static char *box_key(const char *name, json_t *c)
{
	char *off = json_dumps(json_object_get(c, "global_offset"), JSON_ENCODE_ANY);
	char *shp = json_dumps(json_object_get(c, "shape"), JSON_ENCODE_ANY);
	size_t len = strlen(name) + (off ? strlen(off) : 1) + (shp ? strlen(shp) : 1) + 3;
	char *k = malloc(len);

	if (k)
		snprintf(k, len, "%s %s %s", name, off ? off : "-", shp ? shp : "-");
	free(off);
	free(shp);
	return k;
}

/*
 * Each chunk of the manifest m tallied: its bytes and boxes against its rank
 * (one past world not), each box's copies in seen (by box_key), the bytes
 * of every copy past a box's first into *extra. False when out of memory.
 */
static bool tally_chunks(json_t *m, size_t world, uint64_t *bytes, size_t *boxes, json_t *seen,
                         uint64_t *extra)
{
	const char *name;
	json_t *t, *c;
	bool ok = true;
	size_t i;

	json_object_foreach(json_object_get(m, "tensors"), name, t)
	{
		json_array_foreach(json_object_get(t, "chunks"), i, c)
		{
			json_int_t r = json_integer_value(json_object_get(c, "rank"));
			json_t *br = json_object_get(c, "byte_range"), *have;
			json_int_t b0 = json_integer_value(json_array_get(br, 0));
			json_int_t b1 = json_integer_value(json_array_get(br, 1));
			uint64_t n = b0 >= 0 && b1 >= b0 ? (uint64_t)b1 - (uint64_t)b0 : 0;
			char *k;

			if (!json_is_object(c))
				continue;
			if (r >= 0 && (size_t)r < world) {
				bytes[r] += n;
				boxes[r]++;
			}
			if (!(k = box_key(name, c))) {
				ok = false;
				continue;
			}
			if ((have = json_object_get(seen, k))) {
				*extra += n; /* another rank's copy of a box */
				json_integer_set(have, json_integer_value(have) + 1);
			} else if (json_object_set_new(seen, k, json_integer(1))) {
				ok = false;
			}
			free(k);
		}
	}
	return ok;
}

/*
 * How the checkpoint's bytes fall on its ranks, from the manifest: per rank
 * the tensor bytes its file holds and its boxes (chunks written), and the
 * boxes it holds (more, where replicas were written once by others); the
 * balance (the largest ÷ the mean); and how many ranks wrote each box (its
 * copies). NULL if out of memory.
 */
static json_t *layout_json(json_t *m)
{
	json_t *ranks = json_array(), *seen = json_object(), *copies = json_object(), *t;
	json_t *out = NULL;
	size_t world = json_array_size(json_object_get(m, "ranks")), i;
	uint64_t *bytes = calloc(world ? world : 1, sizeof(*bytes));
	size_t *boxes = calloc(world ? world : 1, sizeof(*boxes));
	uint64_t max = 0, sum = 0, extra = 0;
	const char *key;
	bool ok = ranks && seen && copies && bytes && boxes;

	ok = ok && tally_chunks(m, world, bytes, boxes, seen, &extra);
	for (i = 0; ok && i < world; i++) {
		json_t *h =
		    json_object_get(json_array_get(json_object_get(m, "ranks"), i), "holds");

		max = bytes[i] > max ? bytes[i] : max;
		sum += bytes[i];
		ok = !json_array_append_new(
		    ranks,
		    json_pack("{s:I, s:I, s:I, s:I}", "rank", (json_int_t)i, "bytes",
		              (json_int_t)bytes[i], "boxes", (json_int_t)boxes[i], "boxes_held",
		              (json_int_t)(json_is_object(h) ? json_object_size(h) : boxes[i])));
	}
	json_object_foreach(ok ? seen : NULL, key, t)
	{
		char n[24];
		json_t *have;

		snprintf(n, sizeof(n), "%" JSON_INTEGER_FORMAT, json_integer_value(t));
		have = json_object_get(copies, n);
		if (have)
			json_integer_set(have, json_integer_value(have) + 1);
		else
			ok = !json_object_set_new(copies, n, json_integer(1));
	}
	if (ok)
		out = json_pack("{s:O, s:f, s:O, s:I}", "ranks", ranks, "balance",
		                sum ? (double)max / ((double)sum / (double)world) : 1.0,
		                "boxes_by_copies", copies, "bytes_in_extra_copies",
		                (json_int_t)extra);
	json_decref(ranks);
	json_decref(seen);
	json_decref(copies);
	free(bytes);
	free(boxes);
	return out;
}

static void show_layout(json_t *l)
{
	const char *n;
	json_t *v;
	bool first = true;

	printf("\nbalance: the largest rank's tensor bytes / the mean: %.2f; boxes by copies:",
	       json_real_value(json_object_get(l, "balance")));
	json_object_foreach(json_object_get(l, "boxes_by_copies"), n, v)
	{
		printf("%s %" JSON_INTEGER_FORMAT " written by %s rank%s", first ? "" : ",",
		       json_integer_value(v), n, strcmp(n, "1") ? "s" : "");
		first = false;
	}
	printf("; %" JSON_INTEGER_FORMAT " bytes in extra copies\n",
	       json_integer_value(json_object_get(l, "bytes_in_extra_copies")));
}

/* A leading "--tier root|upload": *tier, and the arguments after it; false if bad (said). */

/* A reply the agent should not have sent: said (EPROTO); -EPROTO. */
__attribute__((format(printf, 2, 3))) static int say_proto(struct ctl *x, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	ctl_error(x, 1, EPROTO, "show: %s", msg);
	return -EPROTO;
}

/*
 * An agent older than brief sends the whole manifest: the counts from it.
 * Nothing when it sent none, or the counts.
 */
static void counts_from_json(Ckpt__V1__ShowReply *r)
{
	json_t *m, *t, *meta;
	const char *name;

	if (r->ranks || !r->manifest_json || !*r->manifest_json)
		return;
	m = json_loads(r->manifest_json, 0, NULL);
	if (!m)
		return;
	r->ranks = (uint32_t)json_array_size(json_object_get(m, "ranks"));
	json_object_foreach(json_object_get(m, "tensors"), name, t)
	{
		r->chunks += json_array_size(json_object_get(t, "chunks"));
	}
	meta = json_object_get(m, "meta_raw");
	if (json_is_string(meta))
		r->meta_bytes = json_string_length(meta);
	json_decref(m);
}

/* The manifest, every rank, tensor and chunk, as text (r: its summary). */
static void show_full(const Ckpt__V1__ShowReply *r, json_t *m, json_t *l)
{
	json_t *rk;
	size_t i;

	printf("%-20s %12s %-10s %5s %11s  %-19s %9s %9s %9s\n", "JOB", "STEP", "STATE", "WORLD",
	       "SIZE", "COMMITTED (UTC)", "CAPTURE", "DURABLE", "COMMIT");
	ctl_summary_row(r->summary);
	printf("\nrun %s; %zu part%s:", r->summary->run, r->summary->n_parts,
	       r->summary->n_parts == 1 ? "" : "s");
	for (size_t k = 0; k < r->summary->n_parts; k++)
		printf("%s %s", k ? "," : "", r->summary->parts[k]);
	printf("\n\n%-6s %-40s %14s  %s\n", "RANK", "FILE", "BYTES", "META");
	json_array_foreach(json_object_get(m, "ranks"), i, rk)
	{
		json_t *meta_j = json_object_get(rk, "meta");
		char *meta = !meta_j || json_is_null(meta_j)
		                 ? NULL
		                 : json_dumps(meta_j, JSON_ENCODE_ANY | JSON_COMPACT);

		printf("%-6" JSON_INTEGER_FORMAT " %-40s %14" JSON_INTEGER_FORMAT "  %.60s\n",
		       json_integer_value(json_object_get(rk, "rank")),
		       json_string_value(json_object_get(rk, "file")),
		       json_integer_value(json_object_get(rk, "size")), meta ? meta : "-");
		free(meta);
	}
	show_tensors(m);
	show_layout(l);
	if (json_is_string(json_object_get(m, "meta_raw"))) { /* as the trainer gave it */
		printf("\nmeta %s\n", json_string_value(json_object_get(m, "meta_raw")));
	} else if (json_object_get(m, "meta") && !json_is_null(json_object_get(m, "meta"))) {
		char *meta = json_dumps(json_object_get(m, "meta"), JSON_ENCODE_ANY);

		printf("\nmeta %s\n", meta ? meta : "?");
		free(meta);
	}
}

/* The manifest text: the layout computed, then printed (JSON or text). 0 or 1. */
static int show_manifest(struct ctl *x, const Ckpt__V1__ShowReply *r, const char *text, size_t len)
{
	json_error_t jerr;
	json_t *m, *l = NULL;
	int rc = 0;

	m = json_loadb(text, len, 0, &jerr);
	if (!m) {
		fprintf(stderr,
		        "ckptctl: the agent sent a manifest that is not JSON (%s, at byte %d)\n",
		        jerr.text, jerr.position);
		return 1;
	}
	if (!(l = layout_json(m))) {
		fprintf(stderr, "ckptctl: out of memory\n");
		rc = 1;
	} else if (x->json) { /* the manifest, and how its bytes fall on the ranks */
		json_object_set(m, "layout", l);
		rc = ctl_print_json(json_incref(m));
	} else {
		show_full(r, m, l);
	}
	json_decref(l);
	json_decref(m);
	return rc;
}

/*
 * One message of the stream: the first (*first still NULL) kept, with the
 * buffer for all of it; its piece copied in. 0, or -EPROTO (said).
 */
static int show_take(struct ctl *x, Ckpt__V1__ShowPiece *p, Ckpt__V1__ShowPiece **first, char **buf,
                     size_t *total, size_t *off)
{
	if (!*first) {
		*first = p;
		if (!p->head || !p->head->summary)
			return say_proto(x,
			                 "the agent's first piece of the manifest has no summary");
		*total = p->manifest_bytes;
		*buf = malloc(*total + 1);
		if (!*buf)
			return say_proto(x, "out of memory for a manifest of %zu bytes", *total);
	} else if (p->head) {
		protobuf_c_message_free_unpacked(&p->base, NULL);
		return say_proto(x, "the agent sent the summary twice");
	}
	if (p->manifest_json.len > *total - *off) {
		if (p != *first)
			protobuf_c_message_free_unpacked(&p->base, NULL);
		return say_proto(x,
		                 "the agent sent more of the manifest than the %zu bytes it "
		                 "announced",
		                 *total);
	}
	memcpy(*buf + *off, p->manifest_json.data, p->manifest_json.len);
	*off += p->manifest_json.len;
	if (p != *first)
		protobuf_c_message_free_unpacked(&p->base, NULL);
	return 0;
}

/*
 * ShowDetail: the manifest streamed, joined in *text (malloc'd, *len bytes);
 * *first: the first message (its head is the summary). 0, -ENOTSUP from an
 * agent without it (not said), or another negative errno (said).
 */
static int show_stream(struct ctl *x, Ckpt__V1__ShowRequest *req, Ckpt__V1__ShowPiece **first,
                       char **text, size_t *len)
{
	Ckpt__V1__ShowPiece *p = NULL;
	struct cl_stream *s;
	size_t total = 0, off = 0;
	char *buf = NULL;
	bool said = false;
	int rc;

	*first = NULL;
	rc = cl_stream_open(x->c, IPC_SHOW_DETAIL, &req->base, &s);
	if (rc) {
		ctl_fail(x, rc);
		return rc;
	}
	while ((rc = cl_stream_next(s, (ProtobufCMessage **)&p, CL_DEFAULT_TIMEOUT_MS)) == 1)
		if ((rc = show_take(x, p, first, &buf, &total, &off))) {
			said = true;
			break;
		}
	if (rc == 0 && (!*first || off != total))
		rc = say_proto(x, "the manifest's stream ended after %zu of its %zu bytes", off,
		               total);
	else if (rc < 0 && !said && (rc != -ENOTSUP || *first))
		ctl_fail(x, rc); /* the stream's own failure */
	cl_stream_close(s);
	if (rc) {
		free(buf);
		if (*first)
			protobuf_c_message_free_unpacked(&(*first)->base, NULL);
		*first = NULL;
		return rc;
	}
	buf[off] = '\0';
	*text = buf;
	*len = off;
	return 0;
}

/* Every rank, tensor and chunk: streamed, or from an older agent in one Show. */
static int show_detail(struct ctl *x, Ckpt__V1__ShowRequest *req)
{
	Ckpt__V1__ShowPiece *first;
	Ckpt__V1__ShowReply *r;
	char *text;
	size_t len;
	int rc;

	rc = show_stream(x, req, &first, &text, &len);
	if (rc == 0) {
		rc = show_manifest(x, first->head, text, len);
		free(text);
		protobuf_c_message_free_unpacked(&first->base, NULL);
		return rc;
	}
	if (rc != -ENOTSUP)
		return 1;
	/* an agent older than ShowDetail: the whole manifest in one reply */
	rc = cl_call(x->c, IPC_SHOW, &req->base, (ProtobufCMessage **)&r, CL_DEFAULT_TIMEOUT_MS);
	if (rc)
		return ctl_fail(x, rc);
	rc = show_manifest(x, r, r->manifest_json, strlen(r->manifest_json));
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return rc;
}

/* The summary: a few lines, whatever the checkpoint's size. */
static void show_summary(const Ckpt__V1__ShowReply *r, const char *job, int64_t step)
{
	const Ckpt__V1__CheckpointSummary *s = r->summary;
	size_t named = s->n_parts < SHOW_PARTS_NAMED ? s->n_parts : SHOW_PARTS_NAMED;

	printf("%-20s %12s %-10s %5s %11s  %-19s %9s %9s %9s\n", "JOB", "STEP", "STATE", "WORLD",
	       "SIZE", "COMMITTED (UTC)", "CAPTURE", "DURABLE", "COMMIT");
	ctl_summary_row(s);
	printf("\nrun %s; %zu part%s:", s->run, s->n_parts, s->n_parts == 1 ? "" : "s");
	for (size_t k = 0; k < named; k++)
		printf("%s %s", k ? "," : "", s->parts[k]);
	if (named < s->n_parts)
		printf(" and %zu more", s->n_parts - named);
	printf("\n%u tensor%s in %" PRIu64 " chunk%s; %u rank file%s; meta %" PRIu64 " bytes\n",
	       s->tensors, s->tensors == 1 ? "" : "s", r->chunks, r->chunks == 1 ? "" : "s",
	       r->ranks, r->ranks == 1 ? "" : "s", r->meta_bytes);
	printf("ckptctl show --full %s %" PRId64 ": every rank, tensor and chunk\n", job, step);
}

int ctl_show(struct ctl *x, int argc, char **argv)
{
	Ckpt__V1__ShowRequest req = CKPT__V1__SHOW_REQUEST__INIT;
	Ckpt__V1__ShowReply *r;
	bool full = false;
	int rc;

	for (;;) {
		if (argc && strcmp(argv[0], "--full") == 0) {
			full = true;
			argc--, argv++;
		} else if (argc && strncmp(argv[0], "--tier", 6) == 0) {
			if (!ctl_take_tier(x, "show", &argc, &argv, &req.tier))
				return EXIT_USAGE;
		} else {
			break;
		}
	}
	if (!ctl_args_ok(x, "show", argc, argv, 2, 2, ctl_job_step_names))
		return EXIT_USAGE;
	if ((rc = ctl_job_step(x, "show", argv, &req.step)))
		return rc;
	req.job = argv[0];
	if (full || x->json)
		return show_detail(x, &req);
	req.brief = true;
	rc = cl_call(x->c, IPC_SHOW, &req.base, (ProtobufCMessage **)&r, CL_DEFAULT_TIMEOUT_MS);
	if (rc)
		return ctl_fail(x, rc);
	counts_from_json(r);
	show_summary(r, req.job, req.step);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return 0;
}
