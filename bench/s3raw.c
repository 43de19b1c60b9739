/*
 * s3raw: the reference figure for the object-store benchmarks: what a plain
 * libcurl client does against the same S3 endpoint with the same bytes. One
 * thread, one curl multi handle, up to P requests in flight on P keep-alive
 * connections; the bytes live in one buffer in memory, filled (put) or
 * faulted in (get) before the clock starts.
 *
 *   s3raw put --endpoint URL --bucket B --key K --bytes N[k|m|g] --part-mb M
 *             --inflight P --credentials FILE --region R [--verify] [--trace]
 *   s3raw get --endpoint URL --bucket B --key K --range-mb M
 *             --inflight P --credentials FILE --region R [--verify] [--trace]
 *
 * M defaults to 8, P to 4, R to us-east-1 (RGW takes any region in the
 * signature's scope); --trace prints libcurl's trace of every request.
 *
 * put: CreateMultipartUpload, UploadPart of each M MiB part (P in flight),
 * CompleteMultipartUpload with the parts' ETags, all timed; an object of at
 * most one part is one PUT. --verify then reads it back (untimed) and
 * compares every byte.
 * get: HEAD for the size, then ranged GETs of M MiB each into one buffer, P
 * in flight, each reply 206 with the asked range and length; both timed, the
 * buffer's page faults between them are not. --verify compares the bytes
 * with what put writes (a pattern that depends only on the offset).
 *
 * One line of JSON on stdout: {"op","bytes","seconds","gbps","parts","inflight"},
 * gbps in 10^9 bytes per second. Errors name the request, the HTTP status and
 * S3's <Code>, and exit 1 (a wrong command line: 2). Requests are signed with libcurl's SigV4
 * ("aws:amz:R:s3"); it does not add x-amz-content-sha256 and signs the query
 * string as written, so both are done here: the header is set on every
 * request, and query parameters are written sorted with values encoded.
 * Addresses are path-style: URL/B/K. The credentials file has lines
 * "access_key = ..." and "secret_key = ..." and must be closed to group and
 * others.
 */
#define _GNU_SOURCE /* asprintf */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include <curl/curl.h>

#define MIB (1ull << 20)
#define MAX_PARTS 10000u /* S3's limit on the parts of one upload */
#define MIN_PART (5ull << 20) /* S3's least size of every part but the last */
#define BODY_MAX (64u << 10) /* the most of a reply's XML body kept */
#define ETAG_MAX 128
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define PATTERN_SEED 0x5333726177ull /* "S3raw" */

struct opts {
	bool put, verify, trace;
	const char *endpoint, *bucket, *key, *credentials, *region;
	uint64_t bytes, piece; /* object size (put); part or range size */
	unsigned inflight;
};

struct creds {
	char access[256], secret[256];
};

/* What every request needs: the object's URL and how to sign. */
struct s3 {
	char *url; /* endpoint/bucket/encoded-key */
	char sigv4[96];
	const struct creds *creds;
	bool trace; /* libcurl's trace of each request on stderr */
};

/* One request slot: an easy handle, reused, and what its reply goes into. */
struct req {
	CURL *easy;
	struct curl_slist *hdrs;
	char *url;
	char what[64]; /* "UploadPart 3": for messages */
	char errbuf[CURL_ERROR_SIZE];
	bool busy;
	size_t job;
	const char *src; /* upload body (PUT) */
	size_t src_len, src_off;
	char *dst; /* ranged GET's bytes */
	size_t dst_len, dst_got;
	bool overrun;
	char *body; /* any other reply body (XML), BODY_MAX at most */
	size_t body_len;
	char etag[ETAG_MAX];
	char range[96]; /* Content-Range as received */
};

struct client {
	CURLM *multi;
	struct req *reqs;
	unsigned n;
};

/* run_jobs: n requests, P at a time; start prepares one, done checks it. */
struct jobs {
	size_t n;
	int (*start)(void *ctx, size_t job, struct req *r);
	int (*done)(void *ctx, size_t job, struct req *r, CURLcode res);
	void *ctx;
};

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int fail(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("s3raw: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	return rc;
}

/* ---- the bytes: a pattern that depends only on the offset ---- */

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* The pattern's bytes [off, off + n) into p; off a multiple of 8. */
static void pattern(unsigned char *p, uint64_t off, size_t n)
{
	for (size_t i = 0; i < n; i += 8) {
		uint64_t w = mix(PATTERN_SEED ^ ((off + i) >> 3));

		memcpy(p + i, &w, n - i < 8 ? n - i : 8);
	}
}

static int verify(const unsigned char *buf, uint64_t n)
{
	unsigned char *want = malloc(MIB);

	if (!want)
		return fail(-ENOMEM, "verify: cannot allocate 1 MiB");
	for (uint64_t o = 0; o < n; o += MIB) {
		size_t len = n - o < MIB ? n - o : MIB;

		pattern(want, o, len);
		if (memcmp(buf + o, want, len)) {
			size_t i = 0;

			while (buf[o + i] == want[i])
				i++;
			free(want);
			return fail(-EIO,
			            "verify: the object differs from what put writes at byte %llu",
			            (unsigned long long)(o + i));
		}
	}
	free(want);
	fprintf(stderr, "s3raw: verify: %llu bytes as written\n", (unsigned long long)n);
	return 0;
}

/* n bytes of memory, every page touched (the clock must not pay the faults). */
static unsigned char *buf_alloc(uint64_t n)
{
	size_t len = n ? n : 1;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		fail(-errno, "cannot map %llu bytes: %s", (unsigned long long)n, strerror(errno));
		return NULL;
	}
	(void)madvise(p, len, MADV_HUGEPAGE); /* fewer faults where THP is madvise; optional */
	memset(p, 0, len);
	return p;
}

static void buf_free(unsigned char *p, uint64_t n)
{
	if (p)
		munmap(p, n ? n : 1);
}

/* ---- credentials ---- */

static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

static int creds_line(struct creds *c, const char *path, int lineno, char *line)
{
	char *eq = strchr(line, '='), *name, *val, *dst;

	if (!eq)
		return fail(-EINVAL, "%s:%d: not \"name = value\"", path, lineno);
	*eq = '\0';
	name = trim(line);
	val = trim(eq + 1);
	if (!strcmp(name, "access_key"))
		dst = c->access;
	else if (!strcmp(name, "secret_key"))
		dst = c->secret;
	else
		return fail(-EINVAL, "%s:%d: unknown name \"%s\" (access_key, secret_key)", path,
		            lineno, name);
	if (!*val || strlen(val) >= sizeof(c->access))
		return fail(-EINVAL, "%s:%d: %s is empty or longer than %zu bytes", path, lineno,
		            name, sizeof(c->access) - 1);
	strcpy(dst, val);
	return 0;
}

static int creds_load(struct creds *c, const char *path)
{
	FILE *f = fopen(path, "r");
	struct stat st;
	char *line = NULL;
	size_t cap = 0;
	int lineno = 0, rc = 0;

	memset(c, 0, sizeof(*c));
	if (!f)
		return fail(-errno, "cannot open the credentials %s: %s", path, strerror(errno));
	if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
		rc = fail(-EINVAL, "the credentials %s are not a regular file", path);
		goto close;
	}
	if (st.st_mode & (S_IRWXG | S_IRWXO)) {
		rc = fail(-EPERM,
		          "the credentials %s are open to group or others (mode %04o): "
		          "chmod 600 %s",
		          path, (unsigned)(st.st_mode & 07777), path);
		goto close;
	}
	while (!rc && getline(&line, &cap, f) >= 0) {
		char *s = trim(line);

		lineno++;
		if (*s && *s != '#')
			rc = creds_line(c, path, lineno, s);
	}
	if (!rc && (!c->access[0] || !c->secret[0]))
		rc = fail(-EINVAL, "%s: access_key and secret_key are both needed", path);
	free(line);
close:
	fclose(f);
	return rc;
}

/* ---- requests ---- */

/* RFC 3986 unreserved bytes kept, the rest %XX; '/' kept when keep_slash. */
static char *uri_encode(const char *s, bool keep_slash)
{
	static const char hex[] = "0123456789ABCDEF";
	char *out = malloc(strlen(s) * 3 + 1), *o = out;

	if (!out)
		return NULL;
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (isalnum(ch) || strchr("-_.~", ch) || (keep_slash && ch == '/')) {
			*o++ = (char)ch;
		} else {
			*o++ = '%';
			*o++ = hex[ch >> 4];
			*o++ = hex[ch & 15];
		}
	}
	*o = '\0';
	return out;
}

/* The text of the first <tag>...</tag> in xml, the five entities decoded. */
static int xml_text(const char *xml, const char *tag, char *out, size_t cap)
{
	static const char *const ent[][2] = {
	    {"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&apos;", "'"}};
	char open[64], close[64];
	const char *a, *b;
	size_t n = 0;

	snprintf(open, sizeof(open), "<%s>", tag);
	snprintf(close, sizeof(close), "</%s>", tag);
	if (!xml || !(a = strstr(xml, open)) || !(b = strstr(a, close)))
		return -ENOENT;
	for (a += strlen(open); a < b && n + 1 < cap; n++) {
		size_t k = 0;

		while (k < 5 && strncmp(a, ent[k][0], strlen(ent[k][0])))
			k++;
		out[n] = k < 5 ? ent[k][1][0] : *a;
		a += k < 5 ? strlen(ent[k][0]) : 1;
	}
	out[n] = '\0';
	return a == b ? 0 : -ENAMETOOLONG;
}

static size_t on_header(char *buf, size_t size, size_t n, void *arg)
{
	struct req *r = arg;
	size_t len = size * n, v;
	char *dst;

	if (len > 5 && !strncmp(buf, "HTTP/", 5)) { /* a new response (after 100 Continue) */
		r->etag[0] = r->range[0] = '\0';
		return len;
	}
	if (len > 5 && !strncasecmp(buf, "ETag:", 5))
		dst = r->etag, v = 5;
	else if (len > 14 && !strncasecmp(buf, "Content-Range:", 14))
		dst = r->range, v = 14;
	else
		return len;
	while (v < len && (buf[v] == ' ' || buf[v] == '\t'))
		v++;
	while (len > v && isspace((unsigned char)buf[len - 1]))
		len--;
	if (len - v >= (dst == r->etag ? ETAG_MAX : sizeof(r->range)))
		return 0; /* fails the transfer: no such header in S3 */
	memcpy(dst, buf + v, len - v);
	dst[len - v] = '\0';
	return size * n;
}

static size_t on_body(char *buf, size_t size, size_t n, void *arg)
{
	struct req *r = arg;
	size_t len = size * n, keep;
	long status = 0;

	if (r->dst && curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status) == CURLE_OK &&
	    status == 206) {
		if (len > r->dst_len - r->dst_got) {
			r->overrun = true;
			return 0;
		}
		memcpy(r->dst + r->dst_got, buf, len);
		r->dst_got += len;
		return len;
	}
	keep = BODY_MAX - r->body_len < len ? BODY_MAX - r->body_len : len;
	memcpy(r->body + r->body_len, buf, keep);
	r->body_len += keep;
	r->body[r->body_len] = '\0';
	return len;
}

static size_t on_read(char *buf, size_t size, size_t n, void *arg)
{
	struct req *r = arg;
	size_t len = size * n;

	if (len > r->src_len - r->src_off)
		len = r->src_len - r->src_off;
	memcpy(buf, r->src + r->src_off, len);
	r->src_off += len;
	return len;
}

/* A retry on a reused connection that the server had closed rewinds the body. */
static int on_seek(void *arg, curl_off_t off, int origin)
{
	struct req *r = arg;

	if (origin != SEEK_SET || off < 0 || (uint64_t)off > r->src_len)
		return CURL_SEEKFUNC_CANTSEEK;
	r->src_off = (size_t)off;
	return CURL_SEEKFUNC_OK;
}

#define SETOPT(r, opt, val)                                                                        \
	do {                                                                                       \
		CURLcode cc_ = curl_easy_setopt((r)->easy, opt, val);                              \
		if (cc_ != CURLE_OK)                                                               \
			return fail(-EINVAL, "%s: curl_easy_setopt(%s): %s", (r)->what, #opt,      \
			            curl_easy_strerror(cc_));                                      \
	} while (0)

static int req_header(struct req *r, const char *h)
{
	struct curl_slist *l = curl_slist_append(r->hdrs, h);

	if (!l)
		return fail(-ENOMEM, "%s: curl_slist_append failed", r->what);
	r->hdrs = l;
	return 0;
}

/* Forget the last request, keep the handle (its connection stays in the multi's cache). */
static void req_clear(struct req *r)
{
	curl_slist_free_all(r->hdrs);
	free(r->url);
	r->hdrs = NULL;
	r->url = NULL;
	r->src = r->dst = NULL;
	r->src_len = r->src_off = r->dst_len = r->dst_got = r->body_len = 0;
	r->overrun = false;
	r->body[0] = r->etag[0] = r->range[0] = r->errbuf[0] = '\0';
}

/* The options every request has; query is "" or "?a=b&c=d", sorted, encoded. */
static int req_common(struct req *r, const struct s3 *s3, const char *query, const char *sha256)
{
	char h[128];

	curl_easy_reset(r->easy);
	req_clear(r);
	if (asprintf(&r->url, "%s%s", s3->url, query) < 0)
		return fail(-ENOMEM, "%s: cannot allocate the URL", r->what);
	snprintf(h, sizeof(h), "x-amz-content-sha256: %s", sha256);
	if (req_header(r, h))
		return -ENOMEM;
	SETOPT(r, CURLOPT_URL, r->url);
	SETOPT(r, CURLOPT_HTTPHEADER, r->hdrs); /* its head: later appends are seen */
	SETOPT(r, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
	SETOPT(r, CURLOPT_AWS_SIGV4, s3->sigv4);
	SETOPT(r, CURLOPT_USERNAME, s3->creds->access);
	SETOPT(r, CURLOPT_PASSWORD, s3->creds->secret);
	SETOPT(r, CURLOPT_NOSIGNAL, 1L);
	SETOPT(r, CURLOPT_VERBOSE, s3->trace ? 1L : 0L);
	SETOPT(r, CURLOPT_ERRORBUFFER, r->errbuf);
	SETOPT(r, CURLOPT_PRIVATE, r);
	SETOPT(r, CURLOPT_HEADERFUNCTION, on_header);
	SETOPT(r, CURLOPT_HEADERDATA, r);
	SETOPT(r, CURLOPT_WRITEFUNCTION, on_body);
	SETOPT(r, CURLOPT_WRITEDATA, r);
	SETOPT(r, CURLOPT_BUFFERSIZE, 512L << 10);
	SETOPT(r, CURLOPT_CONNECTTIMEOUT, 10L);
	/* a server that stops (a full OSD does) fails the run instead of hanging it */
	SETOPT(r, CURLOPT_LOW_SPEED_LIMIT, 1L);
	SETOPT(r, CURLOPT_LOW_SPEED_TIME, 60L);
	return 0;
}

static int req_upload(struct req *r, const char *src, size_t len)
{
	r->src = src;
	r->src_len = len;
	SETOPT(r, CURLOPT_UPLOAD, 1L);
	SETOPT(r, CURLOPT_READFUNCTION, on_read);
	SETOPT(r, CURLOPT_READDATA, r);
	SETOPT(r, CURLOPT_SEEKFUNCTION, on_seek);
	SETOPT(r, CURLOPT_SEEKDATA, r);
	SETOPT(r, CURLOPT_INFILESIZE_LARGE, (curl_off_t)len);
	SETOPT(r, CURLOPT_UPLOAD_BUFFERSIZE, 1L << 20);
	/*
	 * libcurl adds "Expect: 100-continue" to a PUT and waits for the 100
	 * before the body. Removing the header ("Expect:") is no way out: 7.88
	 * signs the removed header and the server answers 403. The body goes at
	 * once instead.
	 */
	SETOPT(r, CURLOPT_EXPECT_100_TIMEOUT_MS, 0L);
	return 0;
}

/* The transfer's outcome and the HTTP status: 0 if it is want, else a message. */
static int req_check(struct req *r, CURLcode res, long want)
{
	long status = 0;
	char code[128] = "";
	CURLcode cc;

	if (res != CURLE_OK)
		return fail(-EIO, "%s %s: %s%s%s", r->what, r->url, curl_easy_strerror(res),
		            r->errbuf[0] ? ": " : "", r->errbuf);
	cc = curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &status);
	if (cc != CURLE_OK)
		return fail(-EIO, "%s %s: no HTTP status: %s", r->what, r->url,
		            curl_easy_strerror(cc));
	if (status == want && !(want == 200 && strstr(r->body, "<Error>")))
		return 0;
	if (xml_text(r->body, "Code", code, sizeof(code)))
		snprintf(code, sizeof(code), "(the reply has no <Code>%s)",
		         status == 404 ? ": no such bucket or key" : "");
	return fail(-EIO, "%s %s: HTTP %ld %s%s", r->what, r->url, status, code,
	            !strcmp(code, "SignatureDoesNotMatch") || !strcmp(code, "InvalidAccessKeyId")
	                ? " (check the credentials and --region)"
	                : "");
}

/* ---- the runner: one multi handle, up to c->n requests in flight ---- */

static int client_create(struct client *c, unsigned n)
{
	CURLMcode mc;

	memset(c, 0, sizeof(*c));
	c->multi = curl_multi_init();
	c->reqs = calloc(n, sizeof(*c->reqs));
	if (!c->multi || !c->reqs)
		return fail(-ENOMEM, "cannot create the curl multi handle");
	mc = curl_multi_setopt(c->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)n);
	if (mc == CURLM_OK)
		mc = curl_multi_setopt(c->multi, CURLMOPT_MAXCONNECTS, (long)n);
	if (mc != CURLM_OK)
		return fail(-EINVAL, "curl_multi_setopt: %s", curl_multi_strerror(mc));
	for (; c->n < n; c->n++) {
		struct req *r = &c->reqs[c->n];

		r->easy = curl_easy_init();
		r->body = malloc(BODY_MAX + 1);
		if (!r->easy || !r->body) {
			curl_easy_cleanup(r->easy);
			free(r->body);
			return fail(-ENOMEM, "cannot create curl handle %u", c->n);
		}
		r->body[0] = '\0';
	}
	return 0;
}

static void client_destroy(struct client *c)
{
	for (unsigned i = 0; i < c->n; i++) {
		struct req *r = &c->reqs[i];

		if (r->busy && curl_multi_remove_handle(c->multi, r->easy) != CURLM_OK)
			fail(0, "curl_multi_remove_handle failed at teardown");
		req_clear(r);
		curl_easy_cleanup(r->easy);
		free(r->body);
	}
	free(c->reqs);
	if (c->multi && curl_multi_cleanup(c->multi) != CURLM_OK)
		fail(0, "curl_multi_cleanup failed");
	memset(c, 0, sizeof(*c));
}

static int run_start(struct client *c, const struct jobs *j, size_t *next, unsigned *busy)
{
	for (unsigned i = 0; i < c->n && *next < j->n; i++) {
		struct req *r = &c->reqs[i];
		CURLMcode mc;
		int rc;

		if (r->busy)
			continue;
		r->job = *next;
		rc = j->start(j->ctx, r->job, r);
		if (rc)
			return rc;
		mc = curl_multi_add_handle(c->multi, r->easy);
		if (mc != CURLM_OK)
			return fail(-EIO, "%s: curl_multi_add_handle: %s", r->what,
			            curl_multi_strerror(mc));
		r->busy = true;
		(*next)++;
		(*busy)++;
	}
	return 0;
}

/* Checks the finished transfers; *ended: how many. */
static int run_reap(struct client *c, const struct jobs *j, unsigned *busy, unsigned *ended)
{
	CURLMsg *m;
	int left, rc = 0;

	while (!rc && (m = curl_multi_info_read(c->multi, &left))) {
		struct req *r = NULL;
		CURLMcode mc;
		CURLcode cc;

		if (m->msg != CURLMSG_DONE)
			continue;
		cc = curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
		if (cc != CURLE_OK || !r)
			return fail(-EIO, "a finished transfer has no request: %s",
			            curl_easy_strerror(cc));
		cc = m->data.result; /* m is invalid once the handle is removed */
		mc = curl_multi_remove_handle(c->multi, r->easy);
		if (mc != CURLM_OK)
			return fail(-EIO, "%s: curl_multi_remove_handle: %s", r->what,
			            curl_multi_strerror(mc));
		r->busy = false;
		(*busy)--;
		(*ended)++;
		rc = j->done(j->ctx, r->job, r, cc);
	}
	return rc;
}

/* After an error: what is still in flight is dropped (its connection closed). */
static void run_cancel(struct client *c)
{
	for (unsigned i = 0; i < c->n; i++) {
		struct req *r = &c->reqs[i];
		CURLMcode mc;

		if (!r->busy)
			continue;
		mc = curl_multi_remove_handle(c->multi, r->easy);
		if (mc != CURLM_OK)
			fail(0, "%s: curl_multi_remove_handle: %s", r->what,
			     curl_multi_strerror(mc));
		else
			r->busy = false; /* else the slot stays out of use */
	}
}

static int run_jobs(struct client *c, const struct jobs *j)
{
	size_t next = 0;
	unsigned busy = 0;
	int rc = 0;

	while (!rc && (next < j->n || busy)) {
		unsigned ended = 0;
		int running;
		CURLMcode mc;

		rc = run_start(c, j, &next, &busy);
		if (rc)
			break;
		mc = curl_multi_perform(c->multi, &running);
		if (mc != CURLM_OK)
			return fail(-EIO, "curl_multi_perform: %s", curl_multi_strerror(mc));
		rc = run_reap(c, j, &busy, &ended);
		if (rc || ended || !busy)
			continue;
		mc = curl_multi_poll(c->multi, NULL, 0, 1000, NULL);
		if (mc != CURLM_OK)
			return fail(-EIO, "curl_multi_poll: %s", curl_multi_strerror(mc));
	}
	if (rc)
		run_cancel(c);
	return rc;
}

static int run_one(struct client *c, int (*start)(void *, size_t, struct req *),
                   int (*done)(void *, size_t, struct req *, CURLcode), void *ctx)
{
	struct jobs j = {.n = 1, .start = start, .done = done, .ctx = ctx};

	return run_jobs(c, &j);
}

/* ---- put ---- */

struct put {
	const struct s3 *s3;
	const unsigned char *buf;
	uint64_t size, part;
	size_t nparts;
	char *upload; /* the UploadId, encoded for a query */
	char *etags; /* nparts x ETAG_MAX */
	char *xml; /* CompleteMultipartUpload's body */
};

static int put_single_start(void *ctx, size_t job, struct req *r)
{
	struct put *p = ctx;

	snprintf(r->what, sizeof(r->what), "PutObject");
	if (req_common(r, p->s3, "", "UNSIGNED-PAYLOAD") ||
	    req_header(r, "Content-Type: application/octet-stream"))
		return -EINVAL;
	return req_upload(r, (const char *)p->buf, p->size);
}

static int put_single_done(void *ctx, size_t job, struct req *r, CURLcode res)
{
	return req_check(r, res, 200);
}

static int put_create_start(void *ctx, size_t job, struct req *r)
{
	struct put *p = ctx;

	snprintf(r->what, sizeof(r->what), "CreateMultipartUpload");
	if (req_common(r, p->s3, "?uploads=", EMPTY_SHA256) ||
	    req_header(r, "Content-Type: application/octet-stream"))
		return -EINVAL;
	SETOPT(r, CURLOPT_POSTFIELDS, "");
	SETOPT(r, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
	return 0;
}

static int put_create_done(void *ctx, size_t job, struct req *r, CURLcode res)
{
	struct put *p = ctx;
	char id[1024];
	int rc = req_check(r, res, 200);

	if (rc)
		return rc;
	if (xml_text(r->body, "UploadId", id, sizeof(id)) || !id[0])
		return fail(-EIO, "%s %s: no <UploadId> in the reply", r->what, r->url);
	p->upload = uri_encode(id, false);
	return p->upload ? 0 : fail(-ENOMEM, "cannot allocate the UploadId");
}

static int put_part_start(void *ctx, size_t job, struct req *r)
{
	struct put *p = ctx;
	uint64_t off = job * p->part;
	char *q;
	int rc;

	snprintf(r->what, sizeof(r->what), "UploadPart %zu", job + 1);
	/* sorted, as libcurl signs the query string as written */
	if (asprintf(&q, "?partNumber=%zu&uploadId=%s", job + 1, p->upload) < 0)
		return fail(-ENOMEM, "%s: cannot allocate the query", r->what);
	rc = req_common(r, p->s3, q, "UNSIGNED-PAYLOAD");
	free(q);
	if (rc)
		return rc;
	return req_upload(r, (const char *)p->buf + off,
	                  p->size - off < p->part ? p->size - off : p->part);
}

static int put_part_done(void *ctx, size_t job, struct req *r, CURLcode res)
{
	struct put *p = ctx;
	int rc = req_check(r, res, 200);

	if (rc)
		return rc;
	if (!r->etag[0])
		return fail(-EIO, "%s %s: no ETag in the reply", r->what, r->url);
	memcpy(p->etags + job * ETAG_MAX, r->etag, ETAG_MAX);
	return 0;
}

static int put_complete_start(void *ctx, size_t job, struct req *r)
{
	struct put *p = ctx;
	size_t len = 0, cap = p->nparts * (ETAG_MAX + 64) + 64;
	char *q;
	int rc;

	snprintf(r->what, sizeof(r->what), "CompleteMultipartUpload");
	free(p->xml);
	p->xml = malloc(cap);
	if (!p->xml)
		return fail(-ENOMEM, "%s: cannot allocate its body", r->what);
	len += snprintf(p->xml + len, cap - len, "<CompleteMultipartUpload>");
	for (size_t i = 0; i < p->nparts; i++)
		len += snprintf(p->xml + len, cap - len,
		                "<Part><PartNumber>%zu</PartNumber><ETag>%s</ETag></Part>", i + 1,
		                p->etags + i * ETAG_MAX);
	len += snprintf(p->xml + len, cap - len, "</CompleteMultipartUpload>");
	if (asprintf(&q, "?uploadId=%s", p->upload) < 0)
		return fail(-ENOMEM, "%s: cannot allocate the query", r->what);
	rc = req_common(r, p->s3, q, "UNSIGNED-PAYLOAD");
	free(q);
	if (rc || req_header(r, "Content-Type: application/xml"))
		return -EINVAL;
	SETOPT(r, CURLOPT_POSTFIELDS, p->xml);
	SETOPT(r, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
	return 0;
}

static int put_abort_start(void *ctx, size_t job, struct req *r)
{
	struct put *p = ctx;
	char *q;
	int rc;

	snprintf(r->what, sizeof(r->what), "AbortMultipartUpload");
	if (asprintf(&q, "?uploadId=%s", p->upload) < 0)
		return fail(-ENOMEM, "%s: cannot allocate the query", r->what);
	rc = req_common(r, p->s3, q, EMPTY_SHA256);
	free(q);
	if (rc)
		return rc;
	SETOPT(r, CURLOPT_CUSTOMREQUEST, "DELETE");
	return 0;
}

static int put_abort_done(void *ctx, size_t job, struct req *r, CURLcode res)
{
	return req_check(r, res, 204);
}

/* The timed upload: one PUT, or create + parts + complete (abort on failure). */
static int put_object(struct client *c, struct put *p, double *seconds)
{
	struct jobs parts = {
	    .n = p->nparts, .start = put_part_start, .done = put_part_done, .ctx = p};
	double t0 = now();
	int rc;

	if (p->nparts == 1) {
		rc = run_one(c, put_single_start, put_single_done, p);
		*seconds = now() - t0;
		return rc;
	}
	rc = run_one(c, put_create_start, put_create_done, p);
	if (rc)
		return rc;
	rc = run_jobs(c, &parts);
	if (!rc)
		rc = run_one(c, put_complete_start, put_single_done, p);
	*seconds = now() - t0;
	if (rc && run_one(c, put_abort_start, put_abort_done, p) == 0)
		fprintf(stderr, "s3raw: the upload is aborted\n");
	return rc;
}

/* ---- get ---- */

struct get {
	const struct s3 *s3;
	unsigned char *buf;
	uint64_t size, range;
	size_t nranges;
};

static int get_head_start(void *ctx, size_t job, struct req *r)
{
	struct get *g = ctx;

	snprintf(r->what, sizeof(r->what), "HeadObject");
	if (req_common(r, g->s3, "", EMPTY_SHA256))
		return -EINVAL;
	SETOPT(r, CURLOPT_NOBODY, 1L);
	return 0;
}

static int get_head_done(void *ctx, size_t job, struct req *r, CURLcode res)
{
	struct get *g = ctx;
	curl_off_t len = -1;
	CURLcode cc;
	int rc = req_check(r, res, 200);

	if (rc)
		return rc;
	cc = curl_easy_getinfo(r->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &len);
	if (cc != CURLE_OK || len < 0)
		return fail(-EIO, "%s %s: no Content-Length in the reply (%s)", r->what, r->url,
		            curl_easy_strerror(cc));
	g->size = (uint64_t)len;
	return 0;
}

static int get_range_start(void *ctx, size_t job, struct req *r)
{
	struct get *g = ctx;
	uint64_t a = job * g->range, len = g->size - a < g->range ? g->size - a : g->range;
	char h[96];

	snprintf(r->what, sizeof(r->what), "GetObject range %zu", job + 1);
	if (req_common(r, g->s3, "", EMPTY_SHA256))
		return -EINVAL;
	snprintf(h, sizeof(h), "Range: bytes=%llu-%llu", (unsigned long long)a,
	         (unsigned long long)(a + len - 1));
	if (req_header(r, h))
		return -ENOMEM;
	r->dst = (char *)g->buf + a;
	r->dst_len = len;
	return 0;
}

static int get_range_done(void *ctx, size_t job, struct req *r, CURLcode res)
{
	struct get *g = ctx;
	unsigned long long a = job * g->range, b = a + r->dst_len - 1;
	char want[96];
	int rc;

	if (r->overrun)
		return fail(-EIO, "%s %s: more than the %zu bytes asked for", r->what, r->url,
		            r->dst_len);
	rc = req_check(r, res, 206);
	if (rc)
		return rc;
	snprintf(want, sizeof(want), "bytes %llu-%llu/%llu", a, b, (unsigned long long)g->size);
	if (r->dst_got != r->dst_len || strcmp(r->range, want))
		return fail(-EIO, "%s %s: %zu bytes, Content-Range \"%s\"; asked for \"%s\"",
		            r->what, r->url, r->dst_got, r->range, want);
	return 0;
}

/* HEAD, then the ranges into g->buf (allocated here); the two requests' time only. */
static int get_object(struct client *c, struct get *g, double *seconds)
{
	struct jobs ranges = {.start = get_range_start, .done = get_range_done, .ctx = g};
	double t0 = now(), head;
	int rc;

	rc = run_one(c, get_head_start, get_head_done, g);
	head = now() - t0;
	if (rc)
		return rc;
	g->nranges = (size_t)((g->size + g->range - 1) / g->range);
	g->buf = buf_alloc(g->size); /* faulted in, off the clock */
	if (!g->buf)
		return -ENOMEM;
	ranges.n = g->nranges;
	t0 = now();
	rc = run_jobs(c, &ranges);
	*seconds = head + (now() - t0);
	return rc;
}

/* ---- main ---- */

static void report(const char *op, uint64_t bytes, double s, size_t parts, unsigned inflight)
{
	printf("{\"op\":\"%s\",\"bytes\":%llu,\"seconds\":%.4f,\"gbps\":%.4f,\"parts\":%zu,"
	       "\"inflight\":%u}\n",
	       op, (unsigned long long)bytes, s, s > 0 ? (double)bytes / s / 1e9 : 0.0, parts,
	       inflight);
}

static int cmd_put(struct client *c, const struct s3 *s3, const struct opts *o)
{
	struct put p = {.s3 = s3, .size = o->bytes, .part = o->piece};
	struct get g = {.s3 = s3, .range = o->piece};
	double s = 0;
	int rc;

	p.nparts = o->bytes <= o->piece ? 1 : (size_t)((o->bytes + o->piece - 1) / o->piece);
	if (p.nparts > MAX_PARTS || (p.nparts > 1 && o->piece < MIN_PART))
		return fail(-EINVAL,
		            "%zu parts of %llu MiB: S3 takes at most %u parts of 5 MiB "
		            "or more (--part-mb)",
		            p.nparts, (unsigned long long)(o->piece / MIB), MAX_PARTS);
	p.buf = buf_alloc(o->bytes);
	p.etags = calloc(p.nparts, ETAG_MAX);
	rc = !p.buf || !p.etags ? fail(-ENOMEM, "cannot allocate the object") : 0;
	if (!rc) {
		pattern((unsigned char *)p.buf, 0, o->bytes); /* off the clock */
		rc = put_object(c, &p, &s);
	}
	if (!rc)
		report("put", o->bytes, s, p.nparts, o->inflight);
	if (!rc && o->verify) {
		rc = get_object(c, &g, &s);
		if (!rc && g.size != o->bytes)
			rc = fail(-EIO, "verify: the object has %llu bytes, not %llu",
			          (unsigned long long)g.size, (unsigned long long)o->bytes);
		if (!rc)
			rc = verify(g.buf, g.size);
	}
	buf_free(g.buf, g.size);
	buf_free((unsigned char *)p.buf, o->bytes);
	free(p.etags);
	free(p.upload);
	free(p.xml);
	return rc;
}

static int cmd_get(struct client *c, const struct s3 *s3, const struct opts *o)
{
	struct get g = {.s3 = s3, .range = o->piece};
	double s = 0;
	int rc = get_object(c, &g, &s);

	if (!rc)
		report("get", g.size, s, g.nranges, o->inflight);
	if (!rc && o->verify)
		rc = verify(g.buf, g.size);
	buf_free(g.buf, g.size);
	return rc;
}

static int usage(void)
{
	fprintf(
	    stderr,
	    "usage: s3raw put --endpoint URL --bucket B --key K --bytes N[k|m|g] [--part-mb 8]\n"
	    "                 [--inflight 4] --credentials FILE [--region us-east-1]\n"
	    "                 [--verify] [--trace]\n"
	    "       s3raw get --endpoint URL --bucket B --key K [--range-mb 8]\n"
	    "                 [--inflight 4] --credentials FILE [--region us-east-1]\n"
	    "                 [--verify] [--trace]\n");
	return 2;
}

/* A count with an optional k, m or g (KiB, MiB, GiB); unit when there is none. */
static int parse_size(const char *s, uint64_t unit, uint64_t *out)
{
	const char *units = "kmg", *u;
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return -EINVAL;
	u = *end ? strchr(units, tolower((unsigned char)*end)) : NULL;
	if (*end && (!u || end[1]))
		return -EINVAL;
	if (u)
		unit = 1ull << (10 * (u - units + 1));
	if (v > UINT64_MAX / unit)
		return -ERANGE;
	*out = v * unit;
	return 0;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option longs[] = {{"endpoint", required_argument, NULL, 'e'},
	                                      {"bucket", required_argument, NULL, 'b'},
	                                      {"key", required_argument, NULL, 'k'},
	                                      {"bytes", required_argument, NULL, 'n'},
	                                      {"part-mb", required_argument, NULL, 'p'},
	                                      {"range-mb", required_argument, NULL, 'p'},
	                                      {"inflight", required_argument, NULL, 'i'},
	                                      {"credentials", required_argument, NULL, 'c'},
	                                      {"region", required_argument, NULL, 'r'},
	                                      {"verify", no_argument, NULL, 'v'},
	                                      {"trace", no_argument, NULL, 't'},
	                                      {NULL, 0, NULL, 0}};
	uint64_t inflight = 4;
	bool have_bytes = false;
	int ch, idx = 0;

	*o = (struct opts){.region = "us-east-1", .piece = 8 * MIB};
	if (argc < 2 || (strcmp(argv[1], "put") && strcmp(argv[1], "get")))
		return -EINVAL;
	o->put = !strcmp(argv[1], "put");
	optind = 2;
	while ((ch = getopt_long(argc, argv, "", longs, &idx)) != -1) {
		int rc = 0;

		switch (ch) {
		case 'e':
			o->endpoint = optarg;
			break;
		case 'b':
			o->bucket = optarg;
			break;
		case 'k':
			o->key = optarg;
			break;
		case 'c':
			o->credentials = optarg;
			break;
		case 'r':
			o->region = optarg;
			break;
		case 'v':
			o->verify = true;
			break;
		case 't':
			o->trace = true;
			break;
		case 'n':
			rc = parse_size(optarg, 1, &o->bytes);
			have_bytes = true;
			break;
		case 'p':
			rc = parse_size(optarg, MIB, &o->piece);
			break;
		case 'i':
			rc = parse_size(optarg, 1, &inflight);
			break;
		default:
			return -EINVAL;
		}
		if (rc)
			return fail(rc, "--%s: not a size: %s", longs[idx].name, optarg);
	}
	if (optind != argc || !o->endpoint || !o->bucket || !o->key || !o->credentials)
		return fail(-EINVAL, "--endpoint, --bucket, --key and --credentials are needed");
	if (o->put != have_bytes)
		return fail(-EINVAL, "--bytes goes with put, and put needs it");
	if (!o->bucket[0] || strchr(o->bucket, '/') || !o->key[0])
		return fail(-EINVAL, "the bucket is a name without '/', the key is not empty");
	if (!o->piece || !inflight || inflight > 256)
		return fail(-EINVAL, "--part-mb/--range-mb must be 1 or more, --inflight 1 to 256");
	o->inflight = (unsigned)inflight;
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	struct creds creds;
	struct s3 s3 = {.creds = &creds};
	struct client c = {0};
	char *key = NULL;
	size_t elen;
	CURLcode cc;
	int rc;

	if (parse_opts(argc, argv, &o))
		return usage();
	if (creds_load(&creds, o.credentials))
		return 1;
	cc = curl_global_init(CURL_GLOBAL_DEFAULT);
	if (cc != CURLE_OK) {
		fail(-EIO, "curl_global_init: %s", curl_easy_strerror(cc));
		return 1;
	}
	snprintf(s3.sigv4, sizeof(s3.sigv4), "aws:amz:%s:s3", o.region);
	s3.trace = o.trace;
	elen = strlen(o.endpoint);
	while (elen && o.endpoint[elen - 1] == '/')
		elen--;
	key = uri_encode(o.key, true);
	rc = !key || asprintf(&s3.url, "%.*s/%s/%s", (int)elen, o.endpoint, o.bucket, key) < 0
	         ? fail(-ENOMEM, "cannot allocate the URL")
	         : 0;
	if (!rc)
		rc = client_create(&c, o.inflight);
	if (!rc)
		rc = o.put ? cmd_put(&c, &s3, &o) : cmd_get(&c, &s3, &o);
	client_destroy(&c);
	free(s3.url);
	free(key);
	explicit_bzero(&creds, sizeof(creds));
	curl_global_cleanup();
	return rc ? 1 : 0;
}
