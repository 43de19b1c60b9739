/* Boxes: overlaps and their runs of contiguous bytes (box.h). */
#include <stdio.h>
#include <string.h>

#include "layout/box.h"

void box_text(const int64_t *v, size_t n, char *buf, size_t len)
{
	size_t o = (size_t)snprintf(buf, len, "[");

	for (size_t i = 0; i < n && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? "," : "", (long long)v[i]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
}

uint64_t box_volume(size_t nd, const int64_t *shape)
{
	uint64_t v = 1;

	for (size_t d = 0; d < nd; d++)
		v *= (uint64_t)shape[d];
	return v;
}

bool box_intersect(size_t nd, const int64_t *aoff, const int64_t *ashape, const int64_t *boff,
                   const int64_t *bshape, int64_t *ooff, int64_t *oshape)
{
	for (size_t d = 0; d < nd; d++) {
		int64_t lo = aoff[d] > boff[d] ? aoff[d] : boff[d];
		int64_t ahi = aoff[d] + ashape[d], bhi = boff[d] + bshape[d];
		int64_t hi = ahi < bhi ? ahi : bhi;

		if (hi <= lo)
			return false;
		ooff[d] = lo;
		oshape[d] = hi - lo;
	}
	return true;
}

bool box_contains(size_t nd, const int64_t *aoff, const int64_t *ashape, const int64_t *boff,
                  const int64_t *bshape)
{
	for (size_t d = 0; d < nd; d++)
		if (boff[d] < aoff[d] || boff[d] + bshape[d] > aoff[d] + ashape[d])
			return false;
	return true;
}

size_t box_subtract(size_t nd, const int64_t *uoff, const int64_t *ushape, const int64_t *ioff,
                    const int64_t *ishape, int64_t (*off)[IPC_MAX_NDIM],
                    int64_t (*shape)[IPC_MAX_NDIM])
{
	int64_t co[IPC_MAX_NDIM], cs[IPC_MAX_NDIM]; /* what is left to cut: u, narrowed */
	size_t n = 0;

	for (size_t d = 0; d < nd; d++)
		co[d] = uoff[d], cs[d] = ushape[d];
	/* along each dimension: the slabs of the rest below and above i, then narrow to i */
	for (size_t d = 0; d < nd; d++) {
		int64_t lo = ioff[d], hi = ioff[d] + ishape[d], end = co[d] + cs[d];

		if (lo > co[d]) {
			memcpy(off[n], co, nd * sizeof(*co));
			memcpy(shape[n], cs, nd * sizeof(*cs));
			shape[n][d] = lo - co[d];
			n++;
		}
		if (hi < end) {
			memcpy(off[n], co, nd * sizeof(*co));
			memcpy(shape[n], cs, nd * sizeof(*cs));
			off[n][d] = hi;
			shape[n][d] = end - hi;
			n++;
		}
		co[d] = lo;
		cs[d] = hi - lo;
	}
	return n;
}

void box_copy_init(struct box_copy *bc, size_t nd, uint64_t es, const int64_t *coff,
                   const int64_t *cshape, const int64_t *doff, const int64_t *dshape,
                   const int64_t *ooff, const int64_t *oshape)
{
	uint64_t cs = es, ds = es;
	size_t k;

	*bc = (struct box_copy){.nruns = 1, .run = es};
	if (nd == 0)
		return;
	/* the run's dimension: the first of the trailing ones both boxes hold whole */
	for (k = nd - 1; k > 0 && oshape[k] == cshape[k] && oshape[k] == dshape[k]; k--)
		;
	for (size_t d = nd; d-- > 0;) {
		bc->src0 += (uint64_t)(ooff[d] - coff[d]) * cs;
		bc->dst0 += (uint64_t)(ooff[d] - doff[d]) * ds;
		if (d < k) {
			bc->sstride[d] = cs;
			bc->dstride[d] = ds;
			bc->count[d] = oshape[d];
			bc->nruns *= (uint64_t)oshape[d];
		} else {
			bc->run *= (uint64_t)oshape[d];
		}
		cs *= (uint64_t)cshape[d];
		ds *= (uint64_t)dshape[d];
	}
	bc->outer = k;
}

void box_copy_run(const struct box_copy *bc, uint64_t k, uint64_t *src, uint64_t *dst)
{
	uint64_t s = bc->src0, t = bc->dst0;

	for (size_t d = bc->outer; d-- > 0;) {
		uint64_t i = k % (uint64_t)bc->count[d];

		k /= (uint64_t)bc->count[d];
		s += i * bc->sstride[d];
		t += i * bc->dstride[d];
	}
	*src = s;
	*dst = t;
}
