/*
 * One attempt of an S3 request (s3http_int.h), on the HTTP thread: its
 * easy handle set up (the URL with the key percent-encoded, the headers,
 * libcurl's SigV4, the body and the range), the callbacks that send the
 * body and take the reply and its headers, and what the finished attempt
 * comes to (done, tried again, or the error in words: the HTTP status and
 * the store's error code). The queue, the retries' timing and the thread
 * are s3http.c's; the traps of the signing are described at its top.
 */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <curl/curl.h>

#include "storage/s3/s3http_int.h"

#define CONNECT_TIMEOUT_MS 10000

const char *s3http_method_name(enum s3_method m)
{
	static const char *const names[] = {"GET", "HEAD", "PUT", "POST", "DELETE"};

	return names[m];
}

const char *s3http_name(const struct s3http *h, const char *key, char *buf, size_t len)
{
	snprintf(buf, len, "s3://%s%s%s", h->bucket, *key ? "/" : "", key);
	return buf;
}

/* Percent-encodes s into buf, every byte but the unreserved ones (and '/' if keep_slash). */
static int encode(const char *s, bool keep_slash, char *buf, size_t len)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;

	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		/* ASCII, whatever the locale says isalnum is */
		bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		             (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
		             c == '~' || (keep_slash && c == '/');

		if (o + (plain ? 1 : 3) >= len)
			return -ENAMETOOLONG;
		if (plain) {
			buf[o++] = (char)c;
		} else {
			buf[o++] = '%';
			buf[o++] = hex[c >> 4];
			buf[o++] = hex[c & 15];
		}
	}
	buf[o] = '\0';
	return 0;
}

int s3_encode(const char *s, char *buf, size_t len)
{
	return encode(s, false, buf, len);
}

/* ---- the request's options ------------------------------------------- */

static size_t on_body(char *p, size_t size, size_t n, void *ctx);
static size_t on_header(char *p, size_t size, size_t n, void *ctx);
static size_t on_read(char *p, size_t size, size_t n, void *ctx);
static int on_seek(void *ctx, curl_off_t off, int origin);

/*
 * The request's URL; -ENAMETOOLONG if it does not fit. The key is
 * percent-encoded ('/' kept): a key from a listing is the store's, and
 * may hold '?', '#', spaces or "../" (curl is told to leave dot segments
 * as they are: "a/../b" is a key, not a path to resolve).
 */
static int build_url(const struct s3http *h, struct s3req *r)
{
	const char *sep = strstr(h->endpoint, "://");
	const char *host = sep ? sep + 3 : h->endpoint;
	int scheme = sep ? (int)(sep - h->endpoint) : 0, n;
	char key[S3_KEY_MAX * 3];

	if (encode(r->key, true, key, sizeof(key)))
		return -ENAMETOOLONG;
	if (h->virtual_host)
		n = snprintf(r->url, sizeof(r->url), "%.*s%s%s.%s/%s%s%s", scheme, h->endpoint,
		             sep ? "://" : "", h->bucket, host, key, *r->query ? "?" : "",
		             r->query);
	else
		n = snprintf(r->url, sizeof(r->url), "%s/%s%s%s%s%s", h->endpoint, h->bucket,
		             *key ? "/" : "", key, *r->query ? "?" : "", r->query);
	return n < 0 || (size_t)n >= sizeof(r->url) ? -ENAMETOOLONG : 0;
}

static int add_header(struct s3req *r, const char *line)
{
	struct curl_slist *l = curl_slist_append(r->headers, line);

	if (!l)
		return -ENOMEM;
	r->headers = l;
	return 0;
}

/* An attempt: the easy handle set up for r, afresh (a retry starts over). */
/* What an earlier attempt of r left: its headers, counts, reply. */
static void attempt_reset(struct s3req *r)
{
	curl_slist_free_all(r->headers);
	r->headers = NULL;
	r->sent = r->got = 0;
	r->status = 0;
	r->too_big = r->error_body = r->has_range = false;
	r->sent_first = r->sent_last = 0;
	r->etag[0] = '\0';
	r->length = r->total = r->zstd_size = 0;
	free(r->reply);
	r->reply = NULL;
	r->reply_len = r->reply_cap = 0;
}

/* r's headers (the signature adds its own): 0, or -ENOMEM. */
static int request_headers(struct s3req *r)
{
	char line[96];
	int rc = add_header(r, "x-amz-content-sha256: UNSIGNED-PAYLOAD");

	if (r->if_none_match)
		rc |= add_header(r, "If-None-Match: *");
	if (r->meta_zstd) {
		snprintf(line, sizeof(line), "x-amz-meta-ckpt-zstd: %llu",
		         (unsigned long long)r->meta_zstd);
		rc |= add_header(r, line);
	}
	if (r->content_type) {
		snprintf(line, sizeof(line), "Content-Type: %s", r->content_type);
		rc |= add_header(r, line);
	}
	if (r->ranged) {
		snprintf(line, sizeof(line), "Range: bytes=%llu-%llu",
		         (unsigned long long)r->range_off,
		         (unsigned long long)(r->range_off + r->range_len - 1));
		rc |= add_header(r, line);
	}
	return rc ? -ENOMEM : 0;
}

int s3http_prepare(struct s3http *h, CURL *e, struct s3req *r)
{
	int rc;

	curl_easy_reset(e);
	attempt_reset(r);
	if ((rc = build_url(h, r)) || (rc = request_headers(r)))
		return rc;
	if (curl_easy_setopt(e, CURLOPT_URL, r->url) ||
	    curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L) ||
	    curl_easy_setopt(e, CURLOPT_PRIVATE, r) ||
	    curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->headers) ||
	    curl_easy_setopt(e, CURLOPT_AWS_SIGV4, h->region_sig) ||
	    curl_easy_setopt(e, CURLOPT_USERNAME, h->access) ||
	    curl_easy_setopt(e, CURLOPT_PASSWORD, h->secret) ||
	    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L) ||
	    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)CONNECT_TIMEOUT_MS) ||
	    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L) ||
	    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)h->timeout_s) ||
	    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L) ||
	    curl_easy_setopt(e, CURLOPT_EXPECT_100_TIMEOUT_MS, 0L) ||
	    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body) ||
	    curl_easy_setopt(e, CURLOPT_WRITEDATA, r) ||
	    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header) ||
	    curl_easy_setopt(e, CURLOPT_HEADERDATA, r))
		return -EINVAL;
	switch (r->method) {
	case S3_GET:
		break;
	case S3_HEAD:
		rc = curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
		break;
	case S3_PUT:
		rc = curl_easy_setopt(e, CURLOPT_UPLOAD, 1L) ||
		     curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read) ||
		     curl_easy_setopt(e, CURLOPT_READDATA, r) ||
		     curl_easy_setopt(e, CURLOPT_SEEKFUNCTION, on_seek) ||
		     curl_easy_setopt(e, CURLOPT_SEEKDATA, r) ||
		     curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_len);
		break;
	case S3_POST:
		rc = curl_easy_setopt(e, CURLOPT_POST, 1L) ||
		     curl_easy_setopt(e, CURLOPT_POSTFIELDS, r->body ? r->body : "") ||
		     curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
		break;
	case S3_DELETE:
		rc = curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "DELETE");
		break;
	}
	return rc ? -EINVAL : 0;
}

/* ---- the callbacks (the HTTP thread) ---------------------------------- */

static size_t on_read(char *p, size_t size, size_t n, void *ctx)
{
	struct s3req *r = ctx;
	uint64_t left = r->body_len - r->sent, k = size * n < left ? size * n : left;

	memcpy(p, (const char *)r->body + r->sent, k);
	r->sent += k;
	return k;
}

static int on_seek(void *ctx, curl_off_t off, int origin)
{
	struct s3req *r = ctx;

	if (origin != SEEK_SET || off < 0 || (uint64_t)off > r->body_len)
		return CURL_SEEKFUNC_FAIL;
	r->sent = (uint64_t)off;
	return CURL_SEEKFUNC_OK;
}

/* The most bytes of a body r takes: into_cap, else its reply's limit (an error's: S3_REPLY_MAX). */
static uint64_t body_cap(const struct s3req *r)
{
	bool ok = r->status >= 200 && r->status < 300;

	if (r->into && ok && !r->error_body)
		return r->into_cap;
	return ok && r->reply_max ? r->reply_max : S3_REPLY_MAX;
}

/* Appends to the reply in memory, up to its limit. */
static bool keep_reply(struct s3req *r, const char *p, size_t k)
{
	uint64_t max = body_cap(r);

	if (r->reply_len + k > max)
		return false;
	if (r->reply_len + k + 1 > r->reply_cap) {
		size_t cap = r->reply_cap ? r->reply_cap : 4096;
		char *b;

		while (cap < r->reply_len + k + 1)
			cap *= 2;
		b = realloc(r->reply, cap);
		if (!b)
			return false;
		r->reply = b;
		r->reply_cap = cap;
	}
	memcpy(r->reply + r->reply_len, p, k);
	r->reply_len += k;
	r->reply[r->reply_len] = '\0';
	return true;
}

static size_t on_body(char *p, size_t size, size_t n, void *ctx)
{
	struct s3req *r = ctx;
	size_t k = size * n;

	/* An error's body is XML to read, never bytes for the caller's buffer. */
	if (r->into && !r->error_body && r->status >= 200 && r->status < 300) {
		if (r->got + k > r->into_cap) {
			r->too_big = true;
			return 0;
		}
		memcpy((char *)r->into + r->got, p, k);
		r->got += k;
		return k;
	}
	r->error_body = r->into != NULL;
	if (!keep_reply(r, p, k)) {
		r->too_big = true;
		return 0;
	}
	r->got += k;
	return k;
}

/* A header value, trimmed, into out; false if the line is not `name`. */
static bool header_is(const char *p, size_t n, const char *name, char *out, size_t outlen)
{
	size_t nl = strlen(name), i, j;

	if (n <= nl || strncasecmp(p, name, nl) != 0 || p[nl] != ':')
		return false;
	for (i = nl + 1; i < n && (p[i] == ' ' || p[i] == '\t'); i++)
		;
	for (j = n; j > i && (p[j - 1] == '\r' || p[j - 1] == '\n' || p[j - 1] == ' '); j--)
		;
	if (j - i >= outlen)
		j = i + outlen - 1;
	memcpy(out, p + i, j - i);
	out[j - i] = '\0';
	return true;
}

static size_t on_header(char *p, size_t size, size_t n, void *ctx)
{
	struct s3req *r = ctx;
	size_t k = size * n;
	char v[128];

	if (k >= 9 && memcmp(p, "HTTP/", 5) == 0) {
		/* a status line: a new response (after a 100 Continue, say) */
		const char *sp = memchr(p, ' ', k);

		r->status = sp ? strtol(sp + 1, NULL, 10) : 0;
		r->etag[0] = '\0';
	} else if (header_is(p, k, "ETag", v, sizeof(v))) {
		size_t l = strlen(v);
		const char *s = v;
		bool usable = true;

		if (l >= 2 && v[0] == '"' && v[l - 1] == '"')
			s = v + 1, l -= 2;
		/* it goes into CompleteMultipartUpload's XML as is: printable, no markup */
		for (size_t i = 0; i < l; i++)
			usable &= s[i] > ' ' && s[i] <= '~' && !strchr("\"<>&", s[i]);
		if (usable && l < sizeof(r->etag)) {
			memcpy(r->etag, s, l);
			r->etag[l] = '\0';
		}
	} else if (header_is(p, k, "Content-Length", v, sizeof(v))) {
		r->length = strtoull(v, NULL, 10);
		/* a body larger than it may be: refused before a byte of it (0 stops curl) */
		if (r->method != S3_HEAD && r->status >= 200 && r->length > body_cap(r)) {
			r->too_big = true;
			return 0;
		}
	} else if (header_is(p, k, "Content-Range", v, sizeof(v))) {
		const char *slash = strchr(v, '/');
		unsigned long long a, b;
		int used = 0;

		if (slash && slash[1] != '*')
			r->total = strtoull(slash + 1, NULL, 10);
		/* "bytes A-B/T": which bytes the body is (checked against those asked for) */
		if (sscanf(v, "bytes %llu-%llu%n", &a, &b, &used) == 2 && v[used] == '/' &&
		    a <= b) {
			r->has_range = true;
			r->sent_first = a;
			r->sent_last = b;
		}
	} else if (header_is(p, k, "x-amz-meta-ckpt-zstd", v, sizeof(v))) {
		char *end;
		unsigned long long z = strtoull(v, &end, 10);

		/* digits alone, or it is not ours (the reader then refuses the object) */
		r->zstd_size = v[0] >= '0' && v[0] <= '9' && !*end ? z : UINT64_MAX;
	} else if (header_is(p, k, "Date", v, sizeof(v))) {
		r->date = curl_getdate(v, NULL);
		if (r->date < 0)
			r->date = 0;
	}
	return k;
}

/* ---- finishing an attempt --------------------------------------------- */

static int errno_of_status(long status)
{
	switch (status) {
	case 400:
		return -EINVAL;
	case 401:
	case 403:
		return -EACCES;
	case 404:
		return -ENOENT;
	case 409:
		return -EBUSY;
	case 412:
		return -EEXIST;
	case 416:
		return -ERANGE;
	default:
		return -EIO;
	}
}

static int errno_of_curl(CURLcode c)
{
	switch (c) {
	case CURLE_COULDNT_CONNECT:
		return -ECONNREFUSED;
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_COULDNT_RESOLVE_PROXY:
		return -EHOSTUNREACH;
	case CURLE_OPERATION_TIMEDOUT:
		return -ETIMEDOUT;
	case CURLE_OUT_OF_MEMORY:
		return -ENOMEM;
	default:
		return -EIO;
	}
}

static bool retryable_curl(CURLcode c)
{
	return c == CURLE_COULDNT_CONNECT || c == CURLE_OPERATION_TIMEDOUT ||
	       c == CURLE_SEND_ERROR || c == CURLE_RECV_ERROR || c == CURLE_GOT_NOTHING ||
	       c == CURLE_PARTIAL_FILE || c == CURLE_COULDNT_RESOLVE_HOST ||
	       c == CURLE_HTTP2_STREAM || c == CURLE_HTTP2;
}

static const char *tries_text(const struct s3req *r, bool again, char *buf, size_t len)
{
	if (!again)
		return "";
	snprintf(buf, len, ", after %u %s", r->tries, r->tries == 1 ? "try" : "tries");
	return buf;
}

/*
 * A ranged GET answered: the bytes that came are those asked for, from
 * range_off on (a 206 whose Content-Range says so, or a 200 of the whole
 * object, when range_off is 0); -EPROTO if not: they would land in the
 * caller's buffer as the wrong bytes.
 */
static int range_sent(struct s3req *r, const char *name)
{
	if (r->method != S3_GET || !r->ranged || r->error_body)
		return 0;
	if (r->status == 200 && r->range_off == 0)
		return 0;
	if (r->status == 206 && r->has_range && r->sent_first == r->range_off &&
	    r->sent_last - r->sent_first + 1 == r->got)
		return 0;
	if (r->status == 206 && r->has_range)
		return ipc_errf(r->err, -EPROTO,
		                "GET %s: bytes %llu-%llu asked for, the store sent %llu bytes "
		                "saying they are bytes %llu-%llu",
		                name, (unsigned long long)r->range_off,
		                (unsigned long long)(r->range_off + r->range_len - 1),
		                (unsigned long long)r->got, (unsigned long long)r->sent_first,
		                (unsigned long long)r->sent_last);
	return ipc_errf(
	    r->err, -EPROTO, "GET %s: bytes %llu-%llu asked for, the store answered HTTP %ld %s",
	    name, (unsigned long long)r->range_off,
	    (unsigned long long)(r->range_off + r->range_len - 1), r->status,
	    r->status == 206 ? "without a usable Content-Range" : "with the object from its start");
}

/*
 * What an attempt came to: 0 done, 1 to be tried again, else the error
 * (r->err says it).
 */
int s3http_outcome(struct s3http *h, struct s3req *r, CURLcode cc)
{
	char name[S3_KEY_MAX + 80], code[64] = "", msg[160] = "", tries[32];
	const char *body = r->reply ? r->reply : "";
	bool again;

	s3http_name(h, r->key, name, sizeof(name));
	if (cc == CURLE_WRITE_ERROR && r->too_big)
		return ipc_errf(r->err, -EFBIG, "%s %s: the reply is larger than %llu bytes",
		                s3http_method_name(r->method), name,
		                (unsigned long long)body_cap(r));
	if (cc != CURLE_OK) {
		again = retryable_curl(cc);
		if (again && r->tries < h->max_tries)
			return 1;
		return ipc_errf(r->err, errno_of_curl(cc), "%s %s: %s (curl %d)%s",
		                s3http_method_name(r->method), name, curl_easy_strerror(cc),
		                (int)cc, tries_text(r, again, tries, sizeof(tries)));
	}
	if (r->reply_len)
		s3xml_text(body, r->reply_len, "Code", code, sizeof(code)),
		    s3xml_text(body, r->reply_len, "Message", msg, sizeof(msg));
	/* S3 may answer 200 and put an error in the body (CompleteMultipartUpload) */
	if (r->status == 200 && r->method == S3_POST && *code && strstr(body, "<Error"))
		r->status = 500;
	if (r->status >= 200 && r->status < 300)
		return range_sent(r, name);
	again = r->status >= 500 || r->status == 429 ||
	        (r->status == 400 && strcmp(code, "RequestTimeout") == 0);
	if (again && r->tries < h->max_tries)
		return 1;
	return ipc_errf(r->err, again ? -EIO : errno_of_status(r->status),
	                "%s %s: HTTP %ld%s%s%s%s%s%s", s3http_method_name(r->method), name,
	                r->status, *code ? " " : "", code, *msg ? " (" : "", msg, *msg ? ")" : "",
	                tries_text(r, again, tries, sizeof(tries)));
}
