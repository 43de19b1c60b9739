/*
 * GET /metrics on a real agent: one save through libckpt, then a scrape
 * parsed back line by line (every sample `name{labels} value`, under a TYPE
 * line of its family) and checked against that save: one committed save,
 * each save histogram with one observation (count 1, sum > 0, cumulative
 * buckets that never go down and end at +Inf == count), the bytes written
 * at least the shard's size; then a restore, counted. Without
 * --metrics-listen nothing listens. With the config file instead of flags,
 * the endpoint comes up and the socket gets the file's socket_group.
 */
#define _GNU_SOURCE /* memmem */
#include <arpa/inet.h>
#include <errno.h>
#include <grp.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <check.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

#define MAX_SAMPLES 512

/* Connects to 127.0.0.1:port; the fd, or -errno. */
static int dial(unsigned port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
	                         .sin_port = htons((uint16_t)port),
	                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct timeval tv = {10, 0};
	int fd = socket(AF_INET, SOCK_STREAM, 0), e;

	ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
		return fd;
	e = errno;
	close(fd);
	return -e;
}

/* GET path over HTTP/1.0; the whole response (malloc'd), NUL-terminated. */
static char *http_get(unsigned port, const char *path)
{
	char req[256], *buf = NULL;
	size_t len = 0, cap = 0;
	int fd = dial(port);
	ssize_t n;

	ck_assert_msg(fd >= 0, "connect to 127.0.0.1:%u: %s", port, strerror(-fd));
	snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%u\r\n\r\n", path, port);
	ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
	do {
		if (cap - len < 4096) {
			buf = realloc(buf, cap += 65536);
			ck_assert_ptr_nonnull(buf);
		}
		n = read(fd, buf + len, cap - len - 1);
		ck_assert_msg(n >= 0, "reading the response: %s", strerror(errno));
		len += (size_t)n;
	} while (n > 0);
	close(fd);
	buf[len] = '\0';
	return buf;
}

struct sample {
	char key[256]; /* name{labels}, as written */
	char family[128];
	double v;
};

struct scrape {
	struct sample s[MAX_SAMPLES];
	size_t n;
	char *raw;
};

/*
 * The family of a sample: its name, or its name less _bucket/_sum/_count for
 * a histogram; false unless its TYPE line comes in the first `upto` bytes.
 */
static bool typed(const char *body, size_t upto, const char *name, char *family, size_t len)
{
	static const char *const sfx[] = {"_bucket", "_sum", "_count"};
	char want[200];

	snprintf(want, sizeof(want), "\n# TYPE %s ", name);
	if (memmem(body, upto, want, strlen(want))) {
		snprintf(family, len, "%s", name);
		return true;
	}
	for (size_t i = 0; i < 3; i++) {
		size_t nl = strlen(name), sl = strlen(sfx[i]);

		if (nl > sl && strcmp(name + nl - sl, sfx[i]) == 0) {
			snprintf(want, sizeof(want), "\n# TYPE %.*s histogram\n", (int)(nl - sl),
			         name);
			if (memmem(body, upto, want, strlen(want))) {
				snprintf(family, len, "%.*s", (int)(nl - sl), name);
				return true;
			}
		}
	}
	return false;
}

/* One sample line: name, optional {k="v",...}, a space, a number, nothing else. */
static void parse_line(struct scrape *sc, const char *line, const char *body, size_t at)
{
	struct sample *s = &sc->s[sc->n];
	const char *p = line, *name_end;
	char name[128], *end;

	ck_assert_msg(sc->n < MAX_SAMPLES, "more than %d samples", MAX_SAMPLES);
	ck_assert_msg((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_',
	              "bad metric name: '%s'", line);
	while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
	       *p == '_' || *p == ':')
		p++;
	name_end = p;
	if (*p == '{') {
		while (*++p != '}') {
			ck_assert_msg(*p && strchr("abcdefghijklmnopqrstuvwxyz_", *p),
			              "bad label in '%s'", line);
			while (*p && *p != '=')
				p++;
			ck_assert_msg(p[0] == '=' && p[1] == '"', "label without =\" in '%s'",
			              line);
			p = strchr(p + 2, '"');
			ck_assert_msg(p, "unterminated label value in '%s'", line);
			ck_assert_msg(p[1] == ',' || p[1] == '}', "junk after a label in '%s'",
			              line);
			if (p[1] == ',')
				p++;
		}
		p++;
	}
	ck_assert_msg(*p == ' ', "no space before the value in '%s'", line);
	snprintf(s->key, sizeof(s->key), "%.*s", (int)(p - line), line);
	snprintf(name, sizeof(name), "%.*s", (int)(name_end - line), line);
	errno = 0;
	s->v = strtod(p + 1, &end);
	ck_assert_msg(!errno && end != p + 1 && *end == '\0', "bad value in '%s'", line);
	ck_assert_msg(typed(body, at, name, s->family, sizeof(s->family)),
	              "no TYPE line for '%s' before it", name);
	sc->n++;
}

/* GET /metrics: 200, the text format's content type, every line parsed. */
static void scrape(unsigned port, struct scrape *sc)
{
	char *resp = http_get(port, "/metrics"), *body, *nl, line[1024];
	size_t n;

	sc->n = 0;
	sc->raw = resp;
	ck_assert_msg(strncmp(resp, "HTTP/1.", 7) == 0 && strncmp(resp + 8, " 200", 4) == 0,
	              "not 200: %.200s", resp);
	body = strstr(resp, "\r\n\r\n");
	ck_assert_ptr_nonnull(body);
	ck_assert_msg(memmem(resp, (size_t)(body - resp), "text/plain; version=0.0.4", 25),
	              "content type: %.*s", (int)(body - resp), resp);
	body += 3; /* from the '\n' before the first line */
	for (const char *p = body + 1; *p; p = nl ? nl + 1 : p + n) {
		nl = strchr(p, '\n');
		n = nl ? (size_t)(nl - p) : strlen(p);
		ck_assert_msg(n < sizeof(line), "a line of %zu bytes", n);
		snprintf(line, sizeof(line), "%.*s", (int)n, p);
		if (line[0] == '#')
			ck_assert_msg(strncmp(line, "# HELP ", 7) == 0 ||
			                  strncmp(line, "# TYPE ", 7) == 0,
			              "odd comment '%s'", line);
		else if (line[0])
			parse_line(sc, line, body, (size_t)(p - body));
	}
	ck_assert_msg(sc->n > 20, "only %zu samples", sc->n);
}

static double get(const struct scrape *sc, const char *key)
{
	for (size_t i = 0; i < sc->n; i++)
		if (strcmp(sc->s[i].key, key) == 0)
			return sc->s[i].v;
	ck_abort_msg("no sample %s", key);
	return -1;
}

/* A histogram: buckets cumulative, never down, +Inf last and == count; its count and sum. */
static void check_hist(const struct scrape *sc, const char *name, double count, double *sum)
{
	static const char *const kept_le[] = {"0.001", "1", "100", "25000"};
	char bucket[160], key[200];
	double prev_le = -1, first_le = -1, prev = 0, inf = -1;
	size_t nb = 0;

	snprintf(bucket, sizeof(bucket), "%s_bucket{le=\"", name);
	for (size_t i = 0; i < sc->n; i++) {
		const char *k = sc->s[i].key;
		double le;

		if (strncmp(k, bucket, strlen(bucket)) != 0)
			continue;
		ck_assert_msg(inf < 0, "%s: a bucket after +Inf", k);
		nb++;
		ck_assert_msg(sc->s[i].v >= prev, "%s: %g after %g: buckets went down", k,
		              sc->s[i].v, prev);
		prev = sc->s[i].v;
		if (strcmp(k + strlen(bucket), "+Inf\"}") == 0) {
			inf = sc->s[i].v;
			continue;
		}
		le = strtod(k + strlen(bucket), NULL);
		ck_assert_msg(le > prev_le, "%s: bounds not increasing", k);
		prev_le = le;
		if (first_le < 0)
			first_le = le;
	}
	/* suited to 1 ms .. hours (a large checkpoint's persist or restore) */
	ck_assert_msg(nb >= 10 && first_le <= 0.001 && prev_le >= 25000,
	              "%s: %zu buckets, %g to %g", name, nb, first_le, prev_le);
	/* the bounds dashboards already use are kept; the long ones written plainly */
	for (size_t i = 0; i < sizeof(kept_le) / sizeof(kept_le[0]); i++) {
		snprintf(key, sizeof(key), "%s%s\"}", bucket, kept_le[i]);
		get(sc, key); /* fails the test when there is no such sample */
	}
	snprintf(key, sizeof(key), "%s_count", name);
	ck_assert_msg(get(sc, key) == count, "%s: %g, want %g", key, get(sc, key), count);
	ck_assert_msg(inf == count, "%s +Inf bucket %g, count %g", name, inf, count);
	snprintf(key, sizeof(key), "%s_sum", name);
	*sum = get(sc, key);
}

/* After one committed save of `shard` bytes on a 64 MiB pool. */
static void check_after_save(const struct scrape *sc, off_t shard)
{
	double stall, persist, commit, latency;

	ck_assert(get(sc, "ckptd_up") == 1);
	/* this node wrote the manifest: one commit latency, within the save's time */
	check_hist(sc, "ckptd_commit_latency_seconds", 1, &latency);
	ck_assert(get(sc, "ckptd_commit_parts_missing_total") == 0);
	ck_assert(get(sc, "ckptd_saves_total{state=\"committed\"}") == 1);
	ck_assert(get(sc, "ckptd_saves_total{state=\"failed\"}") == 0);
	ck_assert(get(sc, "ckptd_saves_total{state=\"skipped\"}") == 0);
	check_hist(sc, "ckptd_save_stall_seconds", 1, &stall);
	check_hist(sc, "ckptd_save_persist_seconds", 1, &persist);
	check_hist(sc, "ckptd_save_commit_seconds", 1, &commit);
	ck_assert_msg(stall > 0 && stall <= persist && persist <= commit,
	              "stall %g, persist %g, commit %g: one save, in that order", stall, persist,
	              commit);
	ck_assert_msg(latency > 0 && latency <= commit, "commit latency %g, save %g", latency,
	              commit);
	ck_assert_msg(get(sc, "ckptd_written_bytes_total") >= (double)shard,
	              "written %g < shard %lld", get(sc, "ckptd_written_bytes_total"),
	              (long long)shard);
	/* each byte of the shard copied once from the trainer (one save) */
	ck_assert_msg(get(sc, "ckptd_captured_bytes_total") == (double)shard,
	              "captured %g, shard %lld", get(sc, "ckptd_captured_bytes_total"),
	              (long long)shard);
	ck_assert(get(sc, "ckptd_checkpoints_held") == 0); /* committed: let go */
	ck_assert(get(sc, "ckptd_pool_bytes") == 64.0 * 1024 * 1024);
	ck_assert(get(sc, "ckptd_pool_used_bytes") <= get(sc, "ckptd_pool_bytes"));
	ck_assert(get(sc, "ckptd_saves_in_flight") == 0);
	ck_assert(get(sc, "ckptd_sessions") == 1);
	ck_assert(get(sc, "ckptd_plans") == 1);
	ck_assert(get(sc, "ckptd_io_errors_total") == 0);
	ck_assert(get(sc, "ckptd_start_time_seconds") > 1.6e9);
}

/* After a restore of that step: counted, and its bytes read. */
static void check_after_restore(const struct scrape *sc, const struct h_model *m)
{
	double bytes = 0, took;

	for (size_t i = 0; i < m->n; i++)
		bytes += (double)h_tensor_bytes(m, i);
	ck_assert(get(sc, "ckptd_restores_total{result=\"ok\"}") == 1);
	ck_assert(get(sc, "ckptd_restores_total{result=\"failed\"}") == 0);
	ck_assert_msg(get(sc, "ckptd_restored_bytes_total") == bytes, "restored %g, tensors %g",
	              get(sc, "ckptd_restored_bytes_total"), bytes);
	ck_assert(get(sc, "ckptd_read_bytes_total") >= bytes);
	ck_assert(get(sc, "ckptd_saves_total{state=\"committed\"}") == 1);
	check_hist(sc, "ckptd_restore_seconds", 1, &took);
	ck_assert_msg(took > 0, "restore took %g s", took);
}

START_TEST(scrape_after_save)
{
	static struct scrape sc; /* big: not on the stack */
	char args[128], path[512], *r;
	unsigned port = h_free_port();
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct ckpt_save *s;
	struct h_model m;
	struct stat st;
	double sum;

	snprintf(args, sizeof(args), "--staging-mb 64 --chunk-mb 1 --metrics-listen 127.0.0.1:%u",
	         port);
	h_agent_start(&a, args);
	ck_assert_int_eq(ckpt_connect(a.endpoint, &c), 0);
	h_model_make(&m, c, 5, 300001);
	ck_assert_int_eq(ckpt_plan_create(c, "metrics", 0, 1, m.t, m.n, &p), 0);
	scrape(port, &sc); /* before any save: nothing observed */
	check_hist(&sc, "ckptd_save_stall_seconds", 0, &sum);
	ck_assert(sum == 0 && get(&sc, "ckptd_saves_total{state=\"committed\"}") == 0);
	free(sc.raw);
	h_model_fill(&m, 1);
	ck_assert_int_eq(ckpt_save(p, 1, NULL, &s), 0);
	ck_assert_msg(ckpt_save_wait(s, CKPT_COMMITTED, 60000) == 0, "save: %s",
	              ckpt_save_reason(s));
	ckpt_save_release(s);
	h_shard(&a, path, sizeof(path), "metrics", 1, 0);
	ck_assert_msg(stat(path, &st) == 0, "%s: %s", path, strerror(errno));
	scrape(port, &sc);
	check_after_save(&sc, st.st_size);
	free(sc.raw);
	ck_assert_int_eq(ckpt_restore(p, 1, NULL, NULL), 0);
	scrape(port, &sc);
	check_after_restore(&sc, &m);
	free(sc.raw);
	r = http_get(port, "/"); /* anything but /metrics is not found */
	ck_assert_msg(strncmp(r + 8, " 404", 4) == 0, "%.100s", r);
	free(r);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/* What the samples of key say after up to timeout_ms of scrapes, once it is want. */
static bool reaches(unsigned port, const char *key, double want, int timeout_ms)
{
	static struct scrape sc;

	for (int waited = 0; waited <= timeout_ms; waited += 100) {
		bool hit = false;

		scrape(port, &sc);
		for (size_t i = 0; i < sc.n; i++)
			hit |= strcmp(sc.s[i].key, key) == 0 && sc.s[i].v == want;
		free(sc.raw);
		if (hit)
			return true;
		usleep(100 * 1000);
	}
	return false;
}

/*
 * Series per job, to alert on: two jobs, three commits; each job's saves
 * by final state, committed bytes (together, what was captured), the step
 * and time of its last commit; the root's free space; a checkpoint that
 * retention removed (keep_last 1).
 */
START_TEST(per_job_series)
{
	static struct scrape sc;
	static const char *const jobs[] = {"ja", "jb"};
	char args[160];
	unsigned port = h_free_port();
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p[2];
	struct h_model m[2];
	struct timeval t0, t1;
	double ja, jb, when;

	snprintf(args, sizeof(args),
	         "--staging-mb 64 --chunk-mb 1 --keep-last 1 --metrics-listen 127.0.0.1:%u", port);
	h_agent_start(&a, args);
	ck_assert_int_eq(ckpt_connect(a.endpoint, &c), 0);
	gettimeofday(&t0, NULL);
	for (int j = 0; j < 2; j++) {
		h_model_make(&m[j], c, 3, 100003);
		ck_assert_int_eq(ckpt_plan_create(c, jobs[j], 0, 1, m[j].t, m[j].n, &p[j]), 0);
	}
	for (int k = 0; k < 3; k++) { /* ja 1, ja 2, jb 1 */
		int j = k == 2, step = k == 1 ? 2 : 1;
		struct ckpt_save *s;

		h_model_fill(&m[j], (uint64_t)k);
		ck_assert_int_eq(ckpt_save(p[j], step, NULL, &s), 0);
		ck_assert_int_eq(ckpt_save_wait(s, CKPT_COMMITTED, 60000), 0);
		ckpt_save_release(s);
	}
	gettimeofday(&t1, NULL);
	/* ja's step 1 goes (keep_last 1), on the maintenance thread */
	ck_assert_msg(reaches(port, "ckptd_retention_removed_total", 1, 20000),
	              "retention removed nothing");
	scrape(port, &sc);
	ck_assert(get(&sc, "ckptd_job_saves_total{job=\"ja\",state=\"committed\"}") == 2);
	ck_assert(get(&sc, "ckptd_job_saves_total{job=\"jb\",state=\"committed\"}") == 1);
	ck_assert(get(&sc, "ckptd_job_saves_total{job=\"ja\",state=\"failed\"}") == 0);
	ck_assert(get(&sc, "ckptd_job_saves_total{job=\"jb\",state=\"skipped\"}") == 0);
	ja = get(&sc, "ckptd_job_committed_bytes_total{job=\"ja\"}");
	jb = get(&sc, "ckptd_job_committed_bytes_total{job=\"jb\"}");
	ck_assert_msg(ja == 2 * jb && ja + jb == get(&sc, "ckptd_captured_bytes_total"),
	              "committed bytes ja %g, jb %g; captured %g", ja, jb,
	              get(&sc, "ckptd_captured_bytes_total"));
	ck_assert(get(&sc, "ckptd_job_plans{job=\"ja\"}") == 1); /* its plan is still there */
	ck_assert(get(&sc, "ckptd_job_last_commit_step{job=\"ja\"}") == 2);
	ck_assert(get(&sc, "ckptd_job_last_commit_step{job=\"jb\"}") == 1);
	when = get(&sc, "ckptd_job_last_commit_timestamp_seconds{job=\"jb\"}");
	ck_assert_msg(when >= (double)t0.tv_sec && when <= (double)t1.tv_sec + 1,
	              "jb's last commit at %f, not within %ld..%ld", when, (long)t0.tv_sec,
	              (long)t1.tv_sec);
	ck_assert(get(&sc, "ckptd_job_last_commit_timestamp_seconds{job=\"ja\"}") <= when);
	ck_assert(get(&sc, "ckptd_root_free_bytes") > 0 &&
	          get(&sc, "ckptd_root_free_bytes") <= get(&sc, "ckptd_root_size_bytes"));
	free(sc.raw);
	for (int j = 0; j < 2; j++) {
		ckpt_plan_destroy(p[j]);
		h_model_free(&m[j]);
	}
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

START_TEST(absent_without_flag)
{
	unsigned port = h_free_port();
	struct agent_proc a;
	int fd;

	h_agent_start(&a, NULL);
	fd = dial(port);
	ck_assert_msg(fd == -ECONNREFUSED, "port %u: %s", port,
	              fd >= 0 ? "something listens" : strerror(-fd));
	ck_assert(!h_log_has(&a, "metrics: http://"));
	h_agent_cleanup(&a);
}
END_TEST

/* A group to give the socket: one we are not in by default, where we may (root). */
static gid_t other_group(char *name, size_t len)
{
	struct group *g;
	gid_t gid;

	setgrent();
	while ((g = getgrent()))
		if (geteuid() == 0 ? g->gr_gid != getegid() : g->gr_gid == getegid())
			break;
	ck_assert_msg(g, "no group to use");
	snprintf(name, len, "%s", g->gr_name);
	gid = g->gr_gid;
	endgrent();
	return gid;
}

/* The same endpoint and the socket's group, from the config file instead of flags. */
START_TEST(from_config_file)
{
	const char *tmp = getenv("CK_TMPDIR") ? getenv("CK_TMPDIR") : "/tmp";
	char conf[300], args[400], group[64], sock[400];
	unsigned port = h_free_port();
	gid_t gid = other_group(group, sizeof(group));
	struct scrape *sc = calloc(1, sizeof(*sc));
	struct agent_proc a;
	struct stat st;
	FILE *f;

	snprintf(conf, sizeof(conf), "%s/metrics.%d.conf", tmp, (int)getpid());
	f = fopen(conf, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f,
	        "[agent]\nsocket_group = %s\n[staging]\nsize_mb = 64\n[metrics]\n"
	        "listen = 127.0.0.1:%u\n",
	        group, port);
	ck_assert_int_eq(fclose(f), 0);
	snprintf(args, sizeof(args), "--config %s --chunk-mb 1", conf);
	h_agent_start(&a, args);
	snprintf(sock, sizeof(sock), "%s", a.endpoint + strlen("unix:"));
	ck_assert_msg(stat(sock, &st) == 0, "%s: %s", sock, strerror(errno));
	ck_assert_msg(st.st_gid == gid, "socket group %u, want %u (%s)", (unsigned)st.st_gid,
	              (unsigned)gid, group);
	scrape(port, sc);
	ck_assert(get(sc, "ckptd_pool_bytes") == 64.0 * 1024 * 1024);
	free(sc->raw);
	free(sc);
	h_agent_cleanup(&a);
	unlink(conf);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("metrics");
	TCase *tc = tcase_create("metrics");

	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, scrape_after_save);
	tcase_add_test(tc, per_job_series);
	tcase_add_test(tc, absent_without_flag);
	tcase_add_test(tc, from_config_file);
	suite_add_tcase(s, tc);
	return s;
}
