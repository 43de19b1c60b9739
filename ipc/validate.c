/*
 * Limits and validation shared by libckpt and the agent: a save's states,
 * dtype x shape, extents inside regions, overlaps and duplicates of a
 * plan's tensors, and a plan request as it arrives (names, steps and ranks
 * are base.c's). Pure functions, any thread. Everything here treats its
 * input as hostile: no overflow, no unbounded work beyond O(n log n) in the
 * number of tensors.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc/ipc.h"

/* ---- states ------------------------------------------------------------ */

const char *ipc_state_name(int state)
{
	static const char *const names[] = {"UNKNOWN",   "QUEUED",   "CAPTURED", "DURABLE",
	                                    "COMMITTED", "UPLOADED", "FAILED",   "SKIPPED"};

	return state > 0 && state < (int)(sizeof(names) / sizeof(names[0])) ? names[state]
	                                                                    : names[0];
}

bool ipc_state_final(int state)
{
	return state == SAVE_COMMITTED || state == SAVE_UPLOADED || state == SAVE_FAILED ||
	       state == SAVE_SKIPPED;
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

/* One tensor alone: its name, dtype x shape = nbytes, global box, and extent in its region. */
static int check_one(const struct ipc_tensor *t, ipc_region_size_fn region_size, void *ctx,
                     char *err)
{
	uint64_t nbytes, size;
	int rc = ipc_check_tensor_name(t->name, err);

	if (!rc)
		rc = ipc_tensor_nbytes(t->name, t->dtype, t->ndim, t->shape, &nbytes, err);
	if (rc)
		return rc;
	if (nbytes != t->nbytes)
		return ipc_errf(err, -EINVAL,
		                "tensor '%s': %llu bytes given, but %s x shape is %llu bytes",
		                t->name, (unsigned long long)t->nbytes, ipc_dtype_name(t->dtype),
		                (unsigned long long)nbytes);
	if ((rc = check_global(t, err)))
		return rc;
	if (t->kind != CKPT__V1__REGION_KIND__REGION_HOST &&
	    t->kind != CKPT__V1__REGION_KIND__REGION_CUDA)
		return ipc_errf(err, -EINVAL, "tensor '%s': unknown region kind %d", t->name,
		                t->kind);
	rc = region_size(ctx, t->kind, t->region, &size);
	if (rc)
		return ipc_errf(err, rc, "tensor '%s': no such %s region (%llu)", t->name,
		                t->kind == CKPT__V1__REGION_KIND__REGION_HOST ? "host" : "CUDA",
		                (unsigned long long)t->region);
	if (t->offset > size || t->nbytes > size - t->offset)
		return ipc_errf(err, -ERANGE,
		                "tensor '%s': bytes [%llu, +%llu) are outside its region of "
		                "%llu bytes",
		                t->name, (unsigned long long)t->offset,
		                (unsigned long long)t->nbytes, (unsigned long long)size);
	return 0;
}

/* The tensors together: no name twice, no two extents overlapping in one region. */
static int check_apart(const struct ipc_tensor *t, size_t n, const struct ipc_tensor **byname,
                       struct extent *ext, size_t next, char *err)
{
	qsort(byname, n, sizeof(*byname), cmp_name);
	for (size_t i = 1; i < n; i++)
		if (strcmp(byname[i - 1]->name, byname[i]->name) == 0)
			return ipc_errf(err, -EINVAL, "tensor name '%s' appears twice in the plan",
			                byname[i]->name);
	qsort(ext, next, sizeof(*ext), cmp_extent);
	for (size_t i = 1; i < next; i++)
		if (ext[i].kind == ext[i - 1].kind && ext[i].region == ext[i - 1].region &&
		    ext[i].begin < ext[i - 1].end)
			return ipc_errf(
			    err, -EINVAL,
			    "tensors '%s' and '%s' overlap in their region (bytes %llu..%llu "
			    "and %llu..%llu)",
			    t[ext[i - 1].idx].name, t[ext[i].idx].name,
			    (unsigned long long)ext[i - 1].begin,
			    (unsigned long long)ext[i - 1].end, (unsigned long long)ext[i].begin,
			    (unsigned long long)ext[i].end);
	return 0;
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
	if (!ext || !byname)
		rc = ipc_errf(err, -ENOMEM, "out of memory checking %zu tensors", n);
	for (size_t i = 0; !rc && i < n; i++) {
		rc = check_one(&t[i], region_size, ctx, err);
		byname[i] = &t[i];
		if (!rc && t[i].nbytes)
			ext[next++] = (struct extent){t[i].kind, t[i].region, t[i].offset,
			                              t[i].offset + t[i].nbytes, i};
	}
	if (!rc)
		rc = check_apart(t, n, byname, ext, next, err);
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
