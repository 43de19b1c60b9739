/*
 * Limits and validation shared by libckpt and the agent: names, steps,
 * ranks, dtype x shape, extents inside regions, overlaps and duplicates.
 * Pure functions, any thread. Everything here treats its input as hostile:
 * no overflow, no unbounded work beyond O(n log n) in the number of tensors.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ipc.h"

int ipc_errf(char *err, int rc, const char *fmt, ...)
{
	if (err) {
		va_list ap;

		va_start(ap, fmt);
		vsnprintf(err, IPC_ERRLEN, fmt, ap);
		va_end(ap);
	}
	return rc;
}

/* ---- dtypes and states ----------------------------------------------- */

static const struct {
	const char *name;
	unsigned size;
} dtypes[IPC_DTYPE_MAX + 1] = {
    [1] = {"BOOL", 1},    [2] = {"U8", 1},   [3] = {"I8", 1},   [4] = {"F8_E5M2", 1},
    [5] = {"F8_E4M3", 1}, [6] = {"I16", 2},  [7] = {"U16", 2},  [8] = {"F16", 2},
    [9] = {"BF16", 2},    [10] = {"I32", 4}, [11] = {"U32", 4}, [12] = {"F32", 4},
    [13] = {"F64", 8},    [14] = {"I64", 8}, [15] = {"U64", 8},
};

unsigned ipc_dtype_size(int dtype)
{
	return dtype > 0 && dtype <= IPC_DTYPE_MAX ? dtypes[dtype].size : 0;
}

const char *ipc_dtype_name(int dtype)
{
	return dtype > 0 && dtype <= IPC_DTYPE_MAX ? dtypes[dtype].name : NULL;
}

int ipc_dtype_from_name(const char *name)
{
	for (int i = 1; i <= IPC_DTYPE_MAX; i++)
		if (name && strcmp(name, dtypes[i].name) == 0)
			return i;
	return 0;
}

const char *ipc_state_name(int state)
{
	static const char *const names[] = {"UNKNOWN",   "QUEUED",   "CAPTURED", "DURABLE",
	                                    "COMMITTED", "UPLOADED", "FAILED",   "SKIPPED"};

	return state > 0 && state < (int)(sizeof(names) / sizeof(names[0])) ? names[state]
	                                                                    : names[0];
}

bool ipc_state_final(int state)
{
	return state == CKPT__V1__STATE__STATE_COMMITTED ||
	       state == CKPT__V1__STATE__STATE_UPLOADED || state == CKPT__V1__STATE__STATE_FAILED ||
	       state == CKPT__V1__STATE__STATE_SKIPPED;
}

/* ---- names ------------------------------------------------------------ */

/* A short, printable rendering of a name for messages, whatever it holds. */
static const char *shown(const char *s, char *buf, size_t len)
{
	size_t i, j = 0;

	for (i = 0; s[i] && j + 4 < len; i++)
		buf[j++] = (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f ? s[i] : '?';
	if (s[i] && len > 4) {
		memcpy(buf + j, "...", 3);
		j += 3;
	}
	buf[j] = '\0';
	return buf;
}

/* "'/'", "control character 0x0a" or "non-ASCII byte 0xc3", into buf. */
static const char *char_shown(unsigned char ch, char *buf, size_t len)
{
	if (ch >= 0x20 && ch < 0x7f)
		snprintf(buf, len, "'%c'", ch);
	else
		snprintf(buf, len, "%s 0x%02x",
		         ch < 0x20 || ch == 0x7f ? "control character" : "non-ASCII byte", ch);
	return buf;
}

/* [A-Za-z0-9._-]{1,64}, not "." or "..": `what` names the kind in messages. */
static int check_name(const char *what, const char *name, char *err)
{
	char b[48], c[32];
	size_t n;

	if (!name || !*name)
		return ipc_errf(err, -EINVAL, "%s name is empty", what);
	n = strnlen(name, IPC_MAX_JOB + 1);
	if (n > IPC_MAX_JOB)
		return ipc_errf(err, -EINVAL, "%s name '%s' is longer than %d characters", what,
		                shown(name, b, sizeof(b)), IPC_MAX_JOB);
	for (size_t i = 0; i < n; i++) {
		char ch = name[i];

		if (!((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
		      (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-'))
			return ipc_errf(
			    err, -EINVAL,
			    "%s name '%s' has %s at byte %zu: use letters, digits, '.', "
			    "'_' and '-' only",
			    what, shown(name, b, sizeof(b)),
			    char_shown((unsigned char)ch, c, sizeof(c)), i);
	}
	/* ".", "..", and what begins with '.': the agent's own files (temporaries, trash) */
	if (name[0] == '.')
		return ipc_errf(err, -EINVAL,
		                "%s name '%s' begins with '.': names beginning with '.' are the "
		                "agent's own",
		                what, shown(name, b, sizeof(b)));
	return 0;
}

int ipc_check_job(const char *job, char *err)
{
	return check_name("job", job, err);
}

int ipc_check_node(const char *node, char *err)
{
	return check_name("node", node, err);
}

int ipc_check_run(const char *run, char *err)
{
	return check_name("run", run, err);
}

/* Length of the UTF-8 sequence at s, 0 if it is not well formed. */
static size_t utf8_len(const unsigned char *s)
{
	size_t n;
	uint32_t cp;

	if (s[0] < 0x80)
		return 1;
	if ((s[0] & 0xe0) == 0xc0)
		n = 2, cp = s[0] & 0x1f;
	else if ((s[0] & 0xf0) == 0xe0)
		n = 3, cp = s[0] & 0x0f;
	else if ((s[0] & 0xf8) == 0xf0)
		n = 4, cp = s[0] & 0x07;
	else
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	/* overlong forms, surrogates, beyond Unicode */
	if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
		return 0;
	return n;
}

int ipc_check_tensor_name(const char *name, char *err)
{
	char b[64];
	size_t n;

	if (!name || !*name)
		return ipc_errf(err, -EINVAL, "tensor name is empty");
	n = strnlen(name, IPC_MAX_TENSOR_NAME + 1);
	if (n > IPC_MAX_TENSOR_NAME)
		return ipc_errf(err, -EINVAL, "tensor name '%s' is longer than %d bytes",
		                shown(name, b, sizeof(b)), IPC_MAX_TENSOR_NAME);
	if (strcmp(name, "__metadata__") == 0)
		return ipc_errf(err, -EINVAL,
		                "tensor name '__metadata__' is reserved by safetensors");
	for (size_t i = 0; i < n;) {
		const unsigned char *p = (const unsigned char *)name + i;
		size_t l = utf8_len(p);

		if (l == 0 || i + l > n)
			return ipc_errf(err, -EINVAL,
			                "tensor name '%s' is not valid UTF-8 at byte %zu (0x%02x)",
			                shown(name, b, sizeof(b)), i, p[0]);
		if (l == 1 && (p[0] < 0x20 || p[0] == 0x7f))
			return ipc_errf(
			    err, -EINVAL,
			    "tensor name '%s' has control character 0x%02x at byte %zu: "
			    "names may not hold NUL or control characters",
			    shown(name, b, sizeof(b)), p[0], i);
		i += l;
	}
	return 0;
}

int ipc_check_rank(int rank, int world, char *err)
{
	if (world < 1 || world > IPC_MAX_WORLD)
		return ipc_errf(err, -EINVAL, "world %d is out of range: it must be 1..%d", world,
		                IPC_MAX_WORLD);
	if (rank < 0 || rank >= world)
		return ipc_errf(err, -EINVAL,
		                "rank %d is out of range for world %d: it must be 0..%d", rank,
		                world, world - 1);
	return 0;
}

int ipc_check_step(int64_t step, char *err)
{
	if (step < 0 || step > IPC_MAX_STEP)
		return ipc_errf(err, -EINVAL, "step %lld is out of range: it must be 0..%lld",
		                (long long)step, (long long)IPC_MAX_STEP);
	return 0;
}

int ipc_check_meta(const char *meta, char *err)
{
	json_error_t je;
	json_t *v;
	size_t n;

	if (!meta || !*meta)
		return 0;
	n = strnlen(meta, IPC_MAX_META + 1);
	if (n > IPC_MAX_META)
		return ipc_errf(err, -EINVAL, "meta is larger than %d bytes", IPC_MAX_META);
	v = json_loadb(meta, n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
	if (!v)
		return ipc_errf(err, -EINVAL, "meta is not JSON: %s at column %d", je.text,
		                je.column);
	json_decref(v);
	return 0;
}

/* ---- shapes and extents ---------------------------------------------- */

int ipc_tensor_nbytes(const char *what, int dtype, size_t ndim, const int64_t *shape,
                      uint64_t *nbytes, char *err)
{
	uint64_t n = ipc_dtype_size(dtype);

	if (n == 0)
		return ipc_errf(err, -EINVAL, "tensor '%s': unknown dtype %d", what, dtype);
	if (ndim > IPC_MAX_NDIM)
		return ipc_errf(err, -EINVAL, "tensor '%s': %zu dimensions, at most %d", what, ndim,
		                IPC_MAX_NDIM);
	for (size_t i = 0; i < ndim; i++) {
		if (shape[i] < 0)
			return ipc_errf(err, -EINVAL,
			                "tensor '%s': dimension %zu is negative (%lld)", what, i,
			                (long long)shape[i]);
		if (shape[i] != 0 && n > UINT64_MAX / (uint64_t)shape[i])
			return ipc_errf(err, -EOVERFLOW, "tensor '%s': dtype x shape overflows",
			                what);
		n *= (uint64_t)shape[i];
	}
	*nbytes = n;
	return 0;
}

static int check_global(const struct ipc_tensor *t, char *err)
{
	if (t->global_ndim == 0)
		return 0;
	if (t->global_ndim != t->ndim)
		return ipc_errf(err, -EINVAL,
		                "tensor '%s': global shape has %zu dimensions, local shape %zu",
		                t->name, t->global_ndim, t->ndim);
	if (!t->global_offset)
		return ipc_errf(err, -EINVAL, "tensor '%s': global shape without a global offset",
		                t->name);
	for (size_t i = 0; i < t->ndim; i++) {
		int64_t g = t->global_shape[i], o = t->global_offset[i], l = t->shape[i];

		if (g < 0 || o < 0)
			return ipc_errf(
			    err, -EINVAL,
			    "tensor '%s': negative global shape or offset in dimension %zu",
			    t->name, i);
		if (o > g || l > g - o)
			return ipc_errf(err, -EINVAL,
			                "tensor '%s': chunk [%lld, %lld) is outside the global "
			                "dimension %zu of size %lld",
			                t->name, (long long)o, (long long)o + (long long)l, i,
			                (long long)g);
	}
	return 0;
}

struct extent {
	int kind;
	uint64_t region, begin, end;
	size_t idx;
};

static int cmp_extent(const void *a, const void *b)
{
	const struct extent *x = a, *y = b;

	if (x->kind != y->kind)
		return x->kind < y->kind ? -1 : 1;
	if (x->region != y->region)
		return x->region < y->region ? -1 : 1;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_name(const void *a, const void *b)
{
	const struct ipc_tensor *const *x = a, *const *y = b;

	return strcmp((*x)->name, (*y)->name);
}

int ipc_check_tensors(const struct ipc_tensor *t, size_t n, ipc_region_size_fn region_size,
                      void *ctx, char *err)
{
	struct extent *ext = NULL;
	const struct ipc_tensor **byname = NULL;
	size_t next = 0;
	int rc = 0;

	if (n > IPC_MAX_TENSORS)
		return ipc_errf(err, -EINVAL, "%zu tensors in one plan, at most %d", n,
		                IPC_MAX_TENSORS);
	ext = calloc(n ? n : 1, sizeof(*ext));
	byname = calloc(n ? n : 1, sizeof(*byname));
	if (!ext || !byname) {
		rc = ipc_errf(err, -ENOMEM, "out of memory checking %zu tensors", n);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		uint64_t nbytes, size;

		rc = ipc_check_tensor_name(t[i].name, err);
		if (rc)
			goto out;
		rc = ipc_tensor_nbytes(t[i].name, t[i].dtype, t[i].ndim, t[i].shape, &nbytes, err);
		if (rc)
			goto out;
		if (nbytes != t[i].nbytes) {
			rc = ipc_errf(err, -EINVAL,
			              "tensor '%s': %llu bytes given, but %s x shape is %llu bytes",
			              t[i].name, (unsigned long long)t[i].nbytes,
			              ipc_dtype_name(t[i].dtype), (unsigned long long)nbytes);
			goto out;
		}
		rc = check_global(&t[i], err);
		if (rc)
			goto out;
		if (t[i].kind != CKPT__V1__REGION_KIND__REGION_HOST &&
		    t[i].kind != CKPT__V1__REGION_KIND__REGION_CUDA) {
			rc = ipc_errf(err, -EINVAL, "tensor '%s': unknown region kind %d",
			              t[i].name, t[i].kind);
			goto out;
		}
		rc = region_size(ctx, t[i].kind, t[i].region, &size);
		if (rc) {
			ipc_errf(err, rc, "tensor '%s': no such %s region (%llu)", t[i].name,
			         t[i].kind == CKPT__V1__REGION_KIND__REGION_HOST ? "host" : "CUDA",
			         (unsigned long long)t[i].region);
			goto out;
		}
		if (t[i].offset > size || t[i].nbytes > size - t[i].offset) {
			rc = ipc_errf(err, -ERANGE,
			              "tensor '%s': bytes [%llu, +%llu) are outside its region of "
			              "%llu bytes",
			              t[i].name, (unsigned long long)t[i].offset,
			              (unsigned long long)t[i].nbytes, (unsigned long long)size);
			goto out;
		}
		byname[i] = &t[i];
		if (t[i].nbytes)
			ext[next++] = (struct extent){t[i].kind, t[i].region, t[i].offset,
			                              t[i].offset + t[i].nbytes, i};
	}
	qsort(byname, n, sizeof(*byname), cmp_name);
	for (size_t i = 1; i < n; i++)
		if (strcmp(byname[i - 1]->name, byname[i]->name) == 0) {
			rc = ipc_errf(err, -EINVAL, "tensor name '%s' appears twice in the plan",
			              byname[i]->name);
			goto out;
		}
	qsort(ext, next, sizeof(*ext), cmp_extent);
	for (size_t i = 1; i < next; i++)
		if (ext[i].kind == ext[i - 1].kind && ext[i].region == ext[i - 1].region &&
		    ext[i].begin < ext[i - 1].end) {
			rc = ipc_errf(
			    err, -EINVAL,
			    "tensors '%s' and '%s' overlap in their region (bytes %llu..%llu "
			    "and %llu..%llu)",
			    t[ext[i - 1].idx].name, t[ext[i].idx].name,
			    (unsigned long long)ext[i - 1].begin,
			    (unsigned long long)ext[i - 1].end, (unsigned long long)ext[i].begin,
			    (unsigned long long)ext[i].end);
			goto out;
		}
out:
	free(byname);
	free(ext);
	return rc;
}

int ipc_tensors_from_request(const Ckpt__V1__CreatePlanRequest *req, struct ipc_tensor **out,
                             char *err)
{
	struct ipc_tensor *v;

	*out = NULL;
	if (req->n_tensors > IPC_MAX_TENSORS)
		return ipc_errf(err, -EINVAL, "%zu tensors in one plan, at most %d", req->n_tensors,
		                IPC_MAX_TENSORS);
	v = calloc(req->n_tensors ? req->n_tensors : 1, sizeof(*v));
	if (!v)
		return ipc_errf(err, -ENOMEM, "out of memory for %zu tensors", req->n_tensors);
	for (size_t i = 0; i < req->n_tensors; i++) {
		const Ckpt__V1__TensorSpec *s = req->tensors[i];

		v[i] = (struct ipc_tensor){
		    .name = s->name,
		    .dtype = s->dtype,
		    .ndim = s->n_shape,
		    .shape = s->shape,
		    .kind = s->kind,
		    .region = s->region,
		    .offset = s->offset,
		    .nbytes = s->nbytes,
		    .global_ndim = s->n_global_shape,
		    .global_shape = s->global_shape,
		    .global_offset =
		        s->n_global_offset == s->n_global_shape ? s->global_offset : NULL,
		};
	}
	*out = v;
	return 0;
}
