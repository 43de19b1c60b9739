/*
 * The S3 backend's walks over the store (s3.h): listings (ListObjectsV2,
 * ListMultipartUploads), what they are used for - the jobs and steps a
 * root holds, a step's removal, the clean-up - and nothing else: no
 * decision about a checkpoint rests on a listing (a manifest is read by its
 * exact key). Replies are hostile input: a reply must be the listing asked
 * for (its root element), every key is checked to be under the prefix asked
 * for, each page's token or markers must move on from the last page's, and
 * a listing stops at S3_LIST_MAX keys or S3_LIST_PAGES pages.
 *
 * Threads: the caller's (the agent's maint, commit and reader threads),
 * blocking on the HTTP thread's requests.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "storage/s3/s3.h"

#define LIST_TOKEN 1024 /* a continuation token's bytes */
#define UPLOAD_MARK 512 /* an upload id marker's bytes */

int64_t s3_parse_time(const char *iso)
{
	struct tm tm = {0};
	int y, mo, d, h, mi, s, n = 0;

	if (sscanf(iso, "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &s, &n) != 6 || n != 19)
		return -1;
	if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 60 || y < 1970)
		return -1;
	tm.tm_year = y - 1900;
	tm.tm_mon = mo - 1;
	tm.tm_mday = d;
	tm.tm_hour = h;
	tm.tm_min = mi;
	tm.tm_sec = s;
	return (int64_t)timegm(&tm);
}

void s3_objs_free(struct s3_obj *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i].key);
	free(v);
}

struct listing {
	const char *prefix;
	size_t plen;
	struct s3_obj *v;
	size_t n, cap;
	int rc;
};

static int add_obj(struct listing *l, const char *full, uint64_t size, int64_t mtime)
{
	/* a key outside what was asked for: the store is wrong, or hostile */
	if (strncmp(full, l->prefix, l->plen) != 0 || !full[l->plen])
		return l->rc = -EPROTO;
	if (l->n >= S3_LIST_MAX)
		return l->rc = -E2BIG;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		struct s3_obj *v = realloc(l->v, cap * sizeof(*v));

		if (!v)
			return l->rc = -ENOMEM;
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n].key = strdup(full + l->plen);
	if (!l->v[l->n].key)
		return l->rc = -ENOMEM;
	l->v[l->n].size = size;
	l->v[l->n].mtime = mtime;
	l->n++;
	return 0;
}

static int on_contents(void *ctx, const char *in, size_t n)
{
	struct listing *l = ctx;
	char key[S3_KEY_MAX], size[32] = "0", mod[40] = "";

	if (s3xml_text(in, n, "Key", key, sizeof(key)))
		return l->rc = -EPROTO;
	s3xml_text(in, n, "Size", size, sizeof(size));
	s3xml_text(in, n, "LastModified", mod, sizeof(mod));
	return add_obj(l, key, strtoull(size, NULL, 10), s3_parse_time(mod));
}

static int on_prefix(void *ctx, const char *in, size_t n)
{
	struct listing *l = ctx;
	char key[S3_KEY_MAX];

	if (s3xml_text(in, n, "Prefix", key, sizeof(key)))
		return l->rc = -EPROTO;
	return add_obj(l, key, 0, -1);
}

static int cmp_obj(const void *a, const void *b)
{
	return strcmp(((const struct s3_obj *)a)->key, ((const struct s3_obj *)b)->key);
}

static int count_one(void *ctx, const char *in, size_t n)
{
	(void)in, (void)n;
	++*(unsigned *)ctx;
	return 0;
}

/* Whether the reply is one element `root` (a 200 with no body, or a proxy's page, is not). */
static bool is_reply(const struct s3req *q, const char *root)
{
	unsigned n = 0;

	return s3xml_each(q->reply, q->reply_len, root, count_one, &n) == 0 && n == 1;
}

/* One page of a listing: Contents, and with delim CommonPrefixes; -EPROTO if not a listing. */
static int list_page(struct listing *l, const struct s3req *q, bool delim)
{
	l->rc = 0;
	if (!is_reply(q, "ListBucketResult"))
		return -EPROTO;
	if (s3xml_each(q->reply, q->reply_len, "Contents", on_contents, l) || l->rc)
		return l->rc ? l->rc : -EPROTO;
	if (delim && (s3xml_each(q->reply, q->reply_len, "CommonPrefixes", on_prefix, l) || l->rc))
		return l->rc ? l->rc : -EPROTO;
	return 0;
}

/* The query of a listing's page: after `token` ("": the first page). */
static int list_query(struct s3req *q, const char *token, bool delim, const char *enc,
                      const char *prefix, char *err)
{
	char etoken[3072];
	int k;

	/* sorted, encoded: signed as written (s3http.c) */
	if (s3_encode(token, etoken, sizeof(etoken)) ||
	    (k = snprintf(q->query, sizeof(q->query), "%s%s%s%slist-type=2&prefix=%s",
	                  *token ? "continuation-token=" : "", etoken, *token ? "&" : "",
	                  delim ? "delimiter=%2F&" : "", enc)) < 0 ||
	    (size_t)k >= sizeof(q->query))
		return ipc_errf(err, -EPROTO,
		                "listing %s: the store's continuation token is "
		                "too long",
		                prefix);
	return 0;
}

/*
 * After the page q, listed after token (LIST_TOKEN bytes): the next page's
 * token in its place, "" when q was the last; -EPROTO for a token missing,
 * one that does not move, or one page too many.
 */
static int next_token(const struct s3req *q, const char *prefix, char *token, unsigned *pages,
                      char *err)
{
	char last[LIST_TOKEN], more[8];

	more[0] = '\0';
	s3xml_text(q->reply, q->reply_len, "IsTruncated", more, sizeof(more));
	snprintf(last, sizeof(last), "%s", token);
	token[0] = '\0';
	if (strcmp(more, "true") == 0 &&
	    (s3xml_text(q->reply, q->reply_len, "NextContinuationToken", token, LIST_TOKEN) ||
	     !token[0]))
		return ipc_errf(err, -EPROTO, "listing %s: truncated without a usable token",
		                prefix);
	/* a token that does not move would list the same page for ever */
	if (token[0] && (strcmp(token, last) == 0 || ++*pages >= S3_LIST_PAGES))
		return ipc_errf(err, -EPROTO, "listing %s: %s", prefix,
		                strcmp(token, last) == 0
		                    ? "the store gives the same continuation token again"
		                    : "more pages than a listing looks at");
	return 0;
}

int s3_list(struct s3 *s, const char *prefix, bool delim, struct s3_obj **out, size_t *n,
            int64_t *date, char *err)
{
	struct listing l = {prefix, strlen(prefix), NULL, 0, 0, 0};
	char enc[S3_KEY_MAX * 3], token[LIST_TOKEN] = "";
	struct s3req *q = malloc(sizeof(*q));
	unsigned pages = 0;
	int rc = 0;

	*out = NULL;
	*n = 0;
	if (!q)
		return ipc_errf(err, -ENOMEM, "out of memory");
	if (s3_encode(prefix, enc, sizeof(enc)))
		return free(q), ipc_errf(err, -ENAMETOOLONG, "prefix %s: too long", prefix);
	do {
		s3req_init(q, S3_GET, "");
		if ((rc = list_query(q, token, delim, enc, prefix, err)))
			break;
		rc = s3http_do(s->http, q);
		if (rc) {
			ipc_errf(err, rc, "listing %s: %s", prefix, q->err);
			break;
		}
		if (date)
			*date = q->date;
		rc = list_page(&l, q, delim);
		if (rc) {
			ipc_errf(err, rc, "listing %s: %s", prefix,
			         rc == -E2BIG    ? "more keys than a listing looks at"
			         : rc == -ENOMEM ? "out of memory"
			                         : "the store's reply is not a listing of it");
			break;
		}
		if ((rc = next_token(q, prefix, token, &pages, err)))
			break;
		s3req_clear(q);
	} while (token[0]);
	s3req_clear(q);
	free(q);
	if (rc) {
		s3_objs_free(l.v, l.n);
		return rc;
	}
	if (l.n) /* l.v is NULL when nothing was listed */
		qsort(l.v, l.n, sizeof(*l.v), cmp_obj);
	*out = l.v;
	*n = l.n;
	return 0;
}

/* ---- multipart uploads ----------------------------------------------------- */

struct uploads {
	struct s3 *s;
	const char *prefix;
	bool (*go)(void *ctx, const char *key, int64_t initiated);
	void *ctx;
	unsigned aborted;
	int rc;
	char err[IPC_ERRLEN];
};

static int on_upload(void *ctx, const char *in, size_t n)
{
	struct uploads *u = ctx;
	char key[S3_KEY_MAX], id[512], eid[1536], when[40] = "", query[S3_QUERY_MAX],
	                                          why[IPC_ERRLEN];
	int rc;

	if (s3xml_text(in, n, "Key", key, sizeof(key)) ||
	    s3xml_text(in, n, "UploadId", id, sizeof(id)) ||
	    strncmp(key, u->prefix, strlen(u->prefix)) != 0 || s3_encode(id, eid, sizeof(eid)))
		return 0; /* not one of ours to touch */
	s3xml_text(in, n, "Initiated", when, sizeof(when));
	if (s3_writing(u->s, key) || !u->go(u->ctx, key, s3_parse_time(when)))
		return 0;
	snprintf(query, sizeof(query), "uploadId=%s", eid);
	rc = s3_call(u->s, S3_DELETE, key, query, NULL, why);
	if (rc == 0 || rc == -ENOENT)
		u->aborted += rc == 0;
	else if (!u->rc)
		u->rc = rc, snprintf(u->err, sizeof(u->err), "%s", why);
	return 0;
}

/* The query of a page of uploads: after the markers kmark and umark ("": the first page). */
static int uploads_query(struct s3req *q, const char *kmark, const char *umark, const char *enc,
                         const char *prefix, char *err)
{
	char ek[S3_KEY_MAX * 3], eu[1536];
	int k;

	if (s3_encode(kmark, ek, sizeof(ek)) || s3_encode(umark, eu, sizeof(eu)) ||
	    (k = snprintf(q->query, sizeof(q->query), "%s%s%sprefix=%s%s%s%suploads=",
	                  *kmark ? "key-marker=" : "", ek, *kmark ? "&" : "", enc,
	                  *umark ? "&upload-id-marker=" : "", eu, "&")) < 0 ||
	    (size_t)k >= sizeof(q->query))
		return ipc_errf(err, -EPROTO, "uploads under %s: markers too long", prefix);
	return 0;
}

/*
 * After the page q of uploads, listed after kmark (S3_KEY_MAX bytes) and
 * umark (UPLOAD_MARK bytes): 1 when q was the last, else 0 and the next
 * page's markers in their place; -EPROTO for markers missing, markers that
 * do not move, or one page too many.
 */
static int next_markers(const struct s3req *q, const char *prefix, char *kmark, char *umark,
                        unsigned *pages, char *err)
{
	char more[8], klast[S3_KEY_MAX], ulast[UPLOAD_MARK];

	more[0] = '\0';
	s3xml_text(q->reply, q->reply_len, "IsTruncated", more, sizeof(more));
	if (strcmp(more, "true") != 0)
		return 1;
	snprintf(klast, sizeof(klast), "%s", kmark);
	snprintf(ulast, sizeof(ulast), "%s", umark);
	if (s3xml_text(q->reply, q->reply_len, "NextKeyMarker", kmark, S3_KEY_MAX) ||
	    s3xml_text(q->reply, q->reply_len, "NextUploadIdMarker", umark, UPLOAD_MARK))
		return ipc_errf(err, -EPROTO, "uploads under %s: truncated without markers",
		                prefix);
	/* markers that do not move would list the same page for ever */
	if ((strcmp(kmark, klast) == 0 && strcmp(umark, ulast) == 0) || ++*pages >= S3_LIST_PAGES)
		return ipc_errf(err, -EPROTO, "uploads under %s: %s", prefix,
		                *pages >= S3_LIST_PAGES ? "more pages than a listing looks at"
		                                        : "the store gives the same markers again");
	return 0;
}

int s3_abort_uploads(struct s3 *s, const char *prefix,
                     bool (*go)(void *ctx, const char *key, int64_t initiated), void *ctx,
                     unsigned *aborted, char *err)
{
	struct uploads u = {s, prefix, go, ctx, 0, 0, ""};
	char enc[S3_KEY_MAX * 3], kmark[S3_KEY_MAX] = "", umark[UPLOAD_MARK] = "";
	struct s3req *q = malloc(sizeof(*q));
	unsigned pages = 0;
	int rc = 0;

	if (!q)
		return ipc_errf(err, -ENOMEM, "out of memory");
	if (s3_encode(prefix, enc, sizeof(enc)))
		return free(q), ipc_errf(err, -ENAMETOOLONG, "prefix %s: too long", prefix);
	for (;;) {
		s3req_init(q, S3_GET, "");
		if ((rc = uploads_query(q, kmark, umark, enc, prefix, err)))
			break;
		rc = s3http_do(s->http, q);
		if (rc) {
			ipc_errf(err, rc, "listing the uploads under %s: %s", prefix, q->err);
			break;
		}
		if (!is_reply(q, "ListMultipartUploadsResult") ||
		    s3xml_each(q->reply, q->reply_len, "Upload", on_upload, &u) < 0) {
			rc = ipc_errf(err, u.rc ? u.rc : -EPROTO, "uploads under %s: %s", prefix,
			              u.rc == -ENOMEM
			                  ? "out of memory"
			                  : "the store's reply is not a listing of them");
			break;
		}
		if ((rc = next_markers(q, prefix, kmark, umark, &pages, err))) {
			rc = rc > 0 ? 0 : rc; /* 1: the last page */
			break;
		}
		s3req_clear(q);
	}
	s3req_clear(q);
	free(q);
	if (aborted)
		*aborted += u.aborted;
	if (!rc && u.rc)
		rc = ipc_errf(err, u.rc, "%s", u.err[0] ? u.err : "out of memory");
	return rc;
}

/* ---- the storage_ops calls ---------------------------------------------------- */

static int names_of(struct s3_obj *v, size_t n, bool dirs, char ***names, size_t *count,
                    bool (*keep)(const char *name))
{
	char **out = calloc(n ? n : 1, sizeof(*out));
	size_t k = 0;

	if (!out)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		size_t l = strlen(v[i].key);
		bool dir = l && v[i].key[l - 1] == '/';

		if (dir != dirs || strchr(v[i].key, '/') != (dir ? v[i].key + l - 1 : NULL))
			continue;
		if (dir)
			v[i].key[l - 1] = '\0';
		if (keep && !keep(v[i].key))
			continue;
		out[k++] = v[i].key;
		v[i].key = NULL;
	}
	*names = out;
	*count = k;
	return 0;
}

static bool is_job(const char *name)
{
	return ipc_check_job(name, NULL) == 0;
}

int s3_obj_list(struct storage *st, const char *dir, char ***names, size_t *n, char *err)
{
	struct s3 *s = to_s3(st);
	char key[S3_KEY_MAX], rel[S3_KEY_MAX];
	struct s3_obj *v;
	size_t nv;
	int rc;

	snprintf(rel, sizeof(rel), "%s/", dir);
	if ((rc = s3_key(s, rel, key, sizeof(key), err)) ||
	    (rc = s3_list(s, key, true, &v, &nv, NULL, err)))
		return rc;
	rc = names_of(v, nv, false, names, n, NULL);
	s3_objs_free(v, nv);
	return rc ? ipc_errf(err, rc, "out of memory") : 0;
}

int s3_list_jobs(struct storage *st, char ***jobs, size_t *n, char *err)
{
	struct s3 *s = to_s3(st);
	char key[S3_KEY_MAX];
	struct s3_obj *v;
	size_t nv;
	int rc;

	snprintf(key, sizeof(key), "%s%s", s->prefix, *s->prefix ? "/" : "");
	if ((rc = s3_list(s, key, true, &v, &nv, NULL, err)))
		return rc;
	rc = names_of(v, nv, true, jobs, n, is_job);
	s3_objs_free(v, nv);
	return rc ? ipc_errf(err, rc, "out of memory") : 0;
}

/* "step-<12 digits>/<leaf>": the step and where the leaf starts, or NULL. */
static const char *step_of(const char *rel, int64_t *step)
{
	int64_t v = 0;

	if (strncmp(rel, "step-", 5) != 0)
		return NULL;
	for (int i = 5; i < 17; i++) {
		if (rel[i] < '0' || rel[i] > '9')
			return NULL;
		v = v * 10 + (rel[i] - '0');
	}
	if (rel[17] != '/')
		return NULL;
	*step = v;
	return rel + 18;
}

/* A job's objects, all of them (steps, plans, LATEST): one listing. */
static int job_objs(struct s3 *s, const char *job, struct s3_obj **v, size_t *n, int64_t *date,
                    char *err)
{
	char rel[IPC_MAX_JOB + 2], key[S3_KEY_MAX];
	int rc;

	if ((rc = ipc_check_job(job, err)))
		return rc;
	snprintf(rel, sizeof(rel), "%s/", job);
	if ((rc = s3_key(s, rel, key, sizeof(key), err)))
		return rc;
	return s3_list(s, key, false, v, n, date, err);
}

int s3_list_steps(struct storage *st, const char *job, struct storage_step **steps, size_t *n,
                  char *err)
{
	struct storage_step *out;
	struct s3_obj *v;
	size_t nv, k = 0;
	int rc = job_objs(to_s3(st), job, &v, &nv, NULL, err);

	*steps = NULL;
	*n = 0;
	if (rc)
		return rc;
	out = calloc(nv ? nv : 1, sizeof(*out));
	if (!out) {
		s3_objs_free(v, nv);
		return ipc_errf(err, -ENOMEM, "out of memory");
	}
	/* keys come sorted: a step's objects are together, and steps ascend */
	for (size_t i = 0; i < nv; i++) {
		int64_t step;
		const char *leaf = step_of(v[i].key, &step);

		if (!leaf)
			continue;
		if (!k || out[k - 1].step != step)
			out[k++] = (struct storage_step){step, false, false};
		if (strcmp(leaf, S3_MANIFEST) == 0)
			out[k - 1].committed = true;
		else if (strcmp(leaf, S3_PIN) == 0)
			out[k - 1].pinned = true;
	}
	for (size_t i = 0; i < k; i++)
		out[i].pinned = out[i].pinned && out[i].committed;
	s3_objs_free(v, nv);
	*steps = out;
	*n = k;
	return 0;
}

static int delete_key(struct s3 *s, const char *key, char *err)
{
	char why[IPC_ERRLEN];
	int rc = s3_call(s, S3_DELETE, key, NULL, NULL, why);

	if (rc && rc != -ENOENT)
		ipc_errf(err, rc, "%s", why);
	return rc == -ENOENT ? 0 : rc;
}

static bool any_upload(void *ctx, const char *key, int64_t initiated)
{
	(void)ctx, (void)key, (void)initiated;
	return true;
}

/*
 * A step's objects, the manifest first: once it is gone the step is no
 * checkpoint (a reader finds no manifest), whatever is left while the rest
 * goes. Then the uploads still open under it.
 */
static int remove_step(struct s3 *s, const char *job, int64_t step, bool *any, char *err)
{
	char key[S3_KEY_MAX], full[S3_KEY_MAX];
	struct s3_obj *v;
	size_t nv;
	int rc, first = 0;

	if ((rc = s3_step_key(s, job, step, "", key, sizeof(key), err)) ||
	    (rc = s3_list(s, key, false, &v, &nv, NULL, err)))
		return rc;
	*any = nv > 0;
	for (int pass = 0; pass < 2; pass++)
		for (size_t i = 0; i < nv; i++) {
			if ((strcmp(v[i].key, S3_MANIFEST) == 0) != (pass == 0))
				continue;
			snprintf(full, sizeof(full), "%s%s", key, v[i].key);
			rc = delete_key(s, full, first ? NULL : err);
			if (rc && !first)
				first = rc;
			if (rc && pass == 0)
				goto out; /* the manifest stays: so does the rest */
		}
	rc = s3_abort_uploads(s, key, any_upload, NULL, NULL, first ? NULL : err);
	if (rc && !first)
		first = rc;
out:
	s3_objs_free(v, nv);
	return first;
}

int s3_remove(struct storage *st, const char *job, int64_t step, char *err)
{
	bool any = false;
	int rc = remove_step(to_s3(st), job, step, &any, err);

	if (!rc && !any)
		return ipc_errf(err, -ENOENT, "%s step %lld: not there", job, (long long)step);
	return rc;
}

/* ---- clean-up ---------------------------------------------------------------- */

struct sweep {
	struct s3 *s;
	const struct storage_cleanup *pol;
	int64_t now; /* the store's clock */
	int64_t latest;
	const struct s3_obj *v;
	size_t nv;
	char steps_key[S3_KEY_MAX]; /* "<prefix>/<job>/" */
};

/*
 * An upload the clean-up may abort: this node's shard (at start nothing of
 * ours is in flight; later, once abandoned), or another node's once old and
 * of a step older than LATEST (as that step itself would go).
 */
static bool stale_upload(void *ctx, const char *key, int64_t initiated)
{
	struct sweep *w = ctx;
	const char *rel = key + strlen(w->steps_key), *leaf, *slash = strrchr(key, '/');
	bool old = initiated >= 0 && w->now - initiated > w->pol->abandon_after_s;
	int64_t step;

	leaf = step_of(rel, &step);
	if (!leaf || !slash)
		return false;
	if (shard_file_of_node(slash + 1, w->s->node))
		return w->pol->at_start || old;
	return old && w->latest >= 0 && step < w->latest;
}

/* Whether an object named `leaf` of `step` is in the (sorted) listing. */
static bool listed(const struct sweep *w, int64_t step, const char *leaf)
{
	char want[S3_KEY_MAX];

	snprintf(want, sizeof(want), "step-%012lld/%s", (long long)step, leaf);
	for (size_t i = 0; i < w->nv; i++)
		if (strcmp(w->v[i].key, want) == 0)
			return true;
	return false;
}

/* One uncommitted step: v[from, to) are its objects. */
static int sweep_step(struct sweep *w, const char *job, int64_t step, size_t from, size_t to,
                      struct storage_recovery *rec, char *err)
{
	char part[IPC_MAX_JOB + 16], full[S3_KEY_MAX];
	int64_t newest = -1;
	bool any = false;
	size_t left = to - from;
	int rc;

	for (size_t i = from; i < to; i++)
		if (w->v[i].mtime > newest)
			newest = w->v[i].mtime;
	/* abandoned: older than LATEST and untouched for abandon_after (the store's clock) */
	if (w->latest >= 0 && step < w->latest && newest >= 0 &&
	    w->now - newest > w->pol->abandon_after_s) {
		rc = remove_step(w->s, job, step, &any, err);
		if (rc)
			return rc;
		rec->partial_removed++;
		return 0;
	}
	/* at start, this node's shards where it wrote no part: their saves died with it */
	snprintf(part, sizeof(part), "parts/%s.json", w->s->node);
	if (w->pol->at_start && !listed(w, step, part))
		for (size_t i = from; i < to; i++) {
			const char *leaf = step_of(w->v[i].key, &step);

			if (!leaf || !shard_file_of_node(leaf, w->s->node))
				continue;
			snprintf(full, sizeof(full), "%s%s", w->steps_key, w->v[i].key);
			if (delete_key(w->s, full, NULL) == 0)
				rec->own_removed++, left--;
		}
	if (left)
		rec->partial_kept++;
	return 0;
}

int s3_cleanup(struct storage *st, const char *job, int64_t latest,
               const struct storage_cleanup *pol, struct storage_recovery *rec, char *err)
{
	struct s3 *s = to_s3(st);
	struct sweep w = {s, pol, 0, latest, NULL, 0, ""};
	struct s3_obj *v;
	size_t nv, i = 0;
	int64_t date = 0;
	int rc, first = 0;
	char rel[IPC_MAX_JOB + 2];

	if ((rc = job_objs(s, job, &v, &nv, &date, err)))
		return rc;
	snprintf(rel, sizeof(rel), "%s/", job);
	s3_key(s, rel, w.steps_key, sizeof(w.steps_key), NULL);
	w.now = date > 0 ? date : pol->now_unix_s;
	w.v = v;
	w.nv = nv;
	/* Keeps going past an error: one bad step must not block the rest. */
	while (i < nv) {
		int64_t step, other;
		size_t j = i;
		bool committed = false;

		if (!step_of(v[i].key, &step)) {
			i++;
			continue;
		}
		for (; j < nv && step_of(v[j].key, &other) && other == step; j++)
			committed |= strcmp(step_of(v[j].key, &other), S3_MANIFEST) == 0;
		if (!committed) {
			rc = sweep_step(&w, job, step, i, j, rec, first ? NULL : err);
			if (rc && !first)
				first = rc;
		}
		i = j;
	}
	rc = s3_abort_uploads(s, w.steps_key, stale_upload, &w, &rec->temp_removed,
	                      first ? NULL : err);
	if (rc && !first)
		first = rc;
	s3_objs_free(v, nv);
	return first;
}
