/*
 * The base shared by every part of the project, with no protocol in it:
 * errors as a negative errno and a sentence, dtypes, the checks of names,
 * steps, ranks and meta (the same words in libckpt and the agent), a
 * tensor's bytes from its dtype and shape, random ids and the clocks.
 * Pure functions, any thread. Everything here treats its input as hostile.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <jansson.h>

#include "ipc/base/base.h"

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

/* ---- dtypes ----------------------------------------------- */

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

/* ---- back-offs ---------------------------------------------------------- */

int64_t ipc_backoff_next(int64_t prev, int64_t first, int64_t max)
{
	if (prev <= 0)
		return first < max ? first : max;
	return prev > max / 2 ? max : prev * 2;
}

/* ---- random ids and clocks ----------------------------------------- */

int ipc_random(void *buf, size_t len)
{
	for (size_t got = 0; got < len;) {
		ssize_t n = getrandom((char *)buf + got, len - got, 0);

		if (n < 0 && errno != EINTR)
			return -errno;
		if (n > 0)
			got += (size_t)n;
	}
	return 0;
}

uint64_t ipc_random_id(void)
{
	uint64_t id = 0;

	while (id == 0)
		if (ipc_random(&id, sizeof(id)))
			return 0;
	return id;
}

static int64_t clock_ns(clockid_t c)
{
	struct timespec ts;

	clock_gettime(c, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t ipc_now_ns(void)
{
	return clock_ns(CLOCK_REALTIME);
}

int64_t ipc_mono_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}
