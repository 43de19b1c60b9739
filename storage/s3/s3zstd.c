/*
 * Compressed shards on an object store (s3.h, docs/DESIGN.md §8.3): each staging
 * chunk one zstd frame, and the object ends with a seek table, so that
 * `zstd -d` of the object gives the safetensors file and a ranged restore
 * reads whole frames.
 *
 * The object is in zstd's seekable format (zstd's contrib/seekable_format):
 *
 *   frame 0 | frame 1 | ... | frame n-1 | seek table
 *
 * where the seek table is a skippable frame (magic 0x184D2A5E) holding, per
 * frame, its compressed and decompressed sizes (4 bytes each, little
 * endian), then the number of frames (4 bytes), a descriptor byte (0: no
 * checksums; ours are in the manifest) and the magic 0x8F92EAB1. A frame
 * that is a part of a multipart upload and compresses below S3's smallest
 * part is followed by a skippable frame of zeros to that size; its seek
 * table entry counts the padding (decoders skip skippable frames).
 *
 * The object's size before compression is in its metadata as well
 * (x-amz-meta-ckpt-zstd), which is how a reader knows the object is
 * compressed; the seek table read back is hostile input and checked
 * against it.
 *
 * Pure functions of their buffers; any thread.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "storage/s3/s3.h"

#define SKIP_PAD 0x184D2A50u
#define SKIP_TABLE 0x184D2A5Eu
#define SEEK_MAGIC 0x8F92EAB1u
#define SKIP_HEAD 8u /* magic, size */
#define FOOT 9u /* frames, descriptor, magic */

static void put32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
	p[2] = (unsigned char)(v >> 16);
	p[3] = (unsigned char)(v >> 24);
}

static uint32_t get32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

size_t s3z_bound(uint64_t len)
{
	size_t b = ZSTD_compressBound((size_t)len);

	/* room to pad a small frame up to a part, and for a table of one frame */
	return (b > S3_MIN_PART ? b : S3_MIN_PART) + SKIP_HEAD + s3z_table_bytes(1);
}

uint64_t s3z_table_bytes(unsigned n)
{
	return SKIP_HEAD + 8ull * n + FOOT;
}

int s3z_frame(int level, const void *src, uint64_t len, void *dst, size_t cap, bool pad,
              uint64_t *out, char *err)
{
	size_t n = ZSTD_compress(dst, cap, src, (size_t)len, level);
	unsigned char *p = dst;

	if (ZSTD_isError(n))
		return ipc_errf(err, -EIO, "zstd: %s", ZSTD_getErrorName(n));
	if (pad && n < S3_MIN_PART) {
		/* a skippable frame is at least its 8-byte head */
		uint64_t fill = S3_MIN_PART - n < SKIP_HEAD ? SKIP_HEAD : S3_MIN_PART - n;

		if (n + fill > cap)
			return ipc_errf(err, -EOVERFLOW, "zstd: no room to pad a frame");
		put32(p + n, SKIP_PAD);
		put32(p + n + 4, (uint32_t)(fill - SKIP_HEAD));
		memset(p + n + SKIP_HEAD, 0, fill - SKIP_HEAD);
		n += fill;
	}
	*out = n;
	return 0;
}

void s3z_table_write(const struct s3z_frame *f, unsigned n, void *dst)
{
	unsigned char *p = dst;

	put32(p, SKIP_TABLE);
	put32(p + 4, (uint32_t)(8u * n + FOOT));
	p += SKIP_HEAD;
	for (unsigned i = 0; i < n; i++, p += 8) {
		put32(p, f[i].csize);
		put32(p + 4, f[i].dsize);
	}
	put32(p, n);
	p[4] = 0;
	put32(p + 5, SEEK_MAGIC);
}

int s3z_footer(const void *foot, unsigned *frames, char *err)
{
	const unsigned char *p = foot;

	if (get32(p + 5) != SEEK_MAGIC || (p[4] & 0x7c))
		return ipc_errf(err, -EBADMSG, "its seek table's footer is not zstd's");
	*frames = get32(p);
	if (*frames == 0 || *frames > S3_MAX_PARTS)
		return ipc_errf(err, -EBADMSG, "its seek table names %u frames", *frames);
	return 0;
}

int s3z_table_parse(const void *buf, uint64_t len, uint64_t object, uint64_t size,
                    struct s3z_table *t, char *err)
{
	const unsigned char *p = buf;
	uint64_t c = 0, d = 0;
	unsigned n;
	int rc;

	memset(t, 0, sizeof(*t));
	if (len < s3z_table_bytes(1))
		return ipc_errf(err, -EBADMSG, "no seek table");
	if ((rc = s3z_footer(p + len - FOOT, &n, err)))
		return rc;
	if (p[len - FOOT + 4] & 0x80)
		return ipc_errf(err, -EBADMSG,
		                "its seek table has checksums (not written by ckptd)");
	if (len != s3z_table_bytes(n) || get32(p) != SKIP_TABLE || get32(p + 4) != 8u * n + FOOT)
		return ipc_errf(err, -EBADMSG, "its seek table's head does not match its %u frames",
		                n);
	t->cend = calloc(n, sizeof(*t->cend));
	t->dend = calloc(n, sizeof(*t->dend));
	if (!t->cend || !t->dend) {
		s3z_table_free(t);
		return ipc_errf(err, -ENOMEM, "out of memory");
	}
	p += SKIP_HEAD;
	for (unsigned i = 0; i < n; i++, p += 8) {
		uint32_t cs = get32(p), ds = get32(p + 4);

		/*
		 * every frame holds bytes, no more than a staging chunk (a reader may
		 * need room for a whole one); none is larger than its bound, padding
		 * included
		 */
		if (!ds || ds > S3Z_MAX_FRAME || !cs ||
		    cs > ZSTD_compressBound(ds) + S3_MIN_PART + SKIP_HEAD) {
			s3z_table_free(t);
			return ipc_errf(err, -EBADMSG,
			                "frame %u of its seek table: %u bytes from %u is no frame",
			                i, cs, ds);
		}
		c += cs;
		d += ds;
		t->cend[i] = c;
		t->dend[i] = d;
	}
	t->n = n;
	if (c + len != object || d != size) {
		s3z_table_free(t);
		return ipc_errf(err, -EBADMSG,
		                "its seek table says %llu bytes from %llu; the object is %llu "
		                "bytes from %llu",
		                (unsigned long long)(c + len), (unsigned long long)d,
		                (unsigned long long)object, (unsigned long long)size);
	}
	return 0;
}

void s3z_table_free(struct s3z_table *t)
{
	free(t->cend);
	free(t->dend);
	memset(t, 0, sizeof(*t));
}

unsigned s3z_find(const struct s3z_table *t, uint64_t off)
{
	unsigned lo = 0, hi = t->n;

	/* the first frame whose end is past off */
	while (lo < hi) {
		unsigned mid = lo + (hi - lo) / 2;

		if (t->dend[mid] <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int s3z_inflate(const struct s3z_table *t, unsigned first, const void *src, uint64_t off, void *dst,
                uint64_t len, char *err)
{
	const char *in = src;
	uint64_t base = first ? t->cend[first - 1] : 0, end = off + len;
	ZSTD_DCtx *z = ZSTD_createDCtx();
	void *tmp = NULL;
	int rc = 0;

	if (!z)
		return ipc_errf(err, -ENOMEM, "out of memory");
	for (unsigned i = first; i < t->n && rc == 0; i++) {
		uint64_t d0 = i ? t->dend[i - 1] : 0, d1 = t->dend[i];
		uint64_t c0 = (i ? t->cend[i - 1] : 0) - base, c1 = t->cend[i] - base;
		uint64_t lo = d0 > off ? d0 : off, hi = d1 < end ? d1 : end;
		void *to;
		size_t n;

		if (d0 >= end)
			break;
		/* a frame wholly wanted goes straight to its place; else through tmp */
		if (lo == d0 && hi == d1) {
			to = (char *)dst + (d0 - off);
		} else {
			if (!tmp && !(tmp = malloc(d1 - d0))) {
				rc = ipc_errf(err, -ENOMEM, "out of memory");
				break;
			}
			to = tmp;
		}
		n = ZSTD_decompressDCtx(z, to, d1 - d0, in + c0, c1 - c0);
		if (ZSTD_isError(n) || n != d1 - d0) {
			rc = ipc_errf(err, -EBADMSG, "frame %u: %s", i,
			              ZSTD_isError(n) ? ZSTD_getErrorName(n)
			                              : "fewer bytes than its seek table says");
			break;
		}
		if (to == tmp) {
			memcpy((char *)dst + (lo - off), (char *)tmp + (lo - d0), hi - lo);
			free(tmp);
			tmp = NULL;
		}
	}
	free(tmp); /* a frame that failed into it */
	ZSTD_freeDCtx(z);
	return rc;
}
