/*
 * scale_bench: the many-nodes commit at cluster scale, on a synthetic root
 * of the local backend (bench/scale_run.sh drives it; bench/README.md).
 *
 *   gen     (scale_gen.c) a root of N nodes x R ranks x T tensors: OWNER, each node's
 *           plans, and for each of S steps each rank's shard (a small
 *           safetensors file, stamped) and each node's part naming it
 *   commit  step S committed as the node hosting rank 0 would, in this
 *           process alone: the roster read first (its cost apart), then
 *           commit_poll until COMMITTED, FAILED, or stuck (every part in,
 *           no manifest: the baseline's manifest over its limit)
 *   watch   node k, not committing, polls until it sees the manifest
 *
 * It uses only the public interfaces of commit.h, store.h, storage.h and
 * format.h, so it measures any commit behind them. Every call to the
 * storage goes through a counting wrapper (scale_store.h), which may wait
 * a fixed time per call. One JSON line per measurement on stdout.
 *
 * Threads: gen writes nodes from --threads threads (the backend's calls
 * are thread-safe); commit and watch poll from the main thread.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "commit/commit.h"
#include "bench/scale_bench.h"

/* ---- commit and watch --------------------------------------------------- */

/* How a poll loop ended. */
struct outcome {
	struct commit_result r;
	unsigned polls;
	bool stuck, capped;
	double wall_ms; /* the first poll -> the last poll's return */
	double cpu_ms; /* their CPU time: a machine shared with others inflates wall_ms */
};

/* Polls c (at *next, as an agent) until it ends, is stuck (stuck_polls > 0), or the cap. */
static void poll_until(struct commit *c, const struct opts *o, int stuck_polls, struct outcome *u)
{
	const int64_t start = mono_ns(), cap = (int64_t)(o->cap_s * 1e9);
	const double cpu0 = cpu_ms();
	int allin = 0;
	int64_t next;

	for (;;) {
		commit_poll(c, mono_ns(), &next, &u->r);
		u->polls++;
		u->wall_ms = ms_since(start);
		u->cpu_ms = cpu_ms() - cpu0;
		if (u->r.state != COMMIT_WAITING)
			return;
		/* every part seen, the roster whole, and still no manifest */
		allin = u->r.nmissing == 0 && u->r.ndone > 0 ? allin + 1 : 0;
		if (stuck_polls > 0 && allin >= stuck_polls) {
			u->stuck = true;
			return;
		}
		if (mono_ns() - start >= cap) {
			u->capped = true;
			return;
		}
		commit_result_free(&u->r);
		for (int64_t now = mono_ns(); now < next && now - start < cap; now = mono_ns()) {
			int64_t d = next - now < 1000000000 ? next - now : 1000000000;
			struct timespec ts = {d / 1000000000, d % 1000000000};

			nanosleep(&ts, NULL);
		}
	}
}

static const char *state_text(const struct outcome *u)
{
	if (u->stuck)
		return "STUCK";
	if (u->capped)
		return "CAPPED";
	return u->r.state == COMMIT_COMMITTED ? "COMMITTED"
	       : u->r.state == COMMIT_FAILED  ? "FAILED"
	                                      : "WAITING";
}

/* The manifest's size in the root (not counted), 0 if there is none. */
static uint64_t manifest_bytes(struct storage *s, const struct opts *o)
{
	struct storage *in = cs_inner(s);
	char key[STORE_KEY_MAX], err[IPC_ERRLEN];
	uint64_t size = 0;

	store_key(key, sizeof(key), o->job, o->step, "manifest.json");
	return in->ops->obj_stat(in, key, &size, err) == 0 ? size : 0;
}

/*
 * The roster of the node's run, read once and cached (commit_unclaimed, as
 * an agent does before its first part of a run): its cost. Node n00000
 * holds rank 0, and counts the tensors of every node's plans too.
 */
static int warm_roster(struct committer *cm, struct storage *s, const struct part *own,
                       const struct opts *o, const char *phase)
{
	int *local = malloc((own->nranks + 1) * sizeof(int)), free_ranks[64];
	struct cs_counts a, b, d;
	char why[IPC_ERRLEN] = "";
	size_t n = 0;
	int64_t t;
	int rc;

	if (!local)
		return -ENOMEM;
	for (size_t i = 0; i < own->nranks; i++)
		local[i] = own->ranks[i].rank;
	cs_counts(s, &a);
	t = mono_ns();
	rc = commit_unclaimed(cm, own->job, own->run, own->world, local, own->nranks, false,
	                      free_ranks, 64, &n, why);
	line_head(o, phase);
	printf(", \"step\": %" PRId64 ", \"wall_ms\": %.1f, \"rc\": %d, \"unclaimed\": %zu, "
	       "\"ops\": ",
	       o->step, ms_since(t), rc, n);
	cs_counts(s, &b);
	cs_diff(&b, &a, &d);
	cs_json(&d, stdout);
	printf(", \"problem\": ");
	json_str(stdout, why);
	printf("}\n");
	fflush(stdout);
	free(local);
	return rc;
}

/* One poll at the deadline: the reason the step could not commit (the poll's own cost). */
static void explain(struct commit *c, int64_t t0, struct outcome *u)
{
	struct commit_result r;
	int64_t next, t = mono_ns();

	commit_poll(c, t0 + DEADLINE_NS, &next, &r);
	printf(", \"explain_ms\": %.1f, \"explain_state\": \"%s\", \"reason\": ", ms_since(t),
	       r.state == COMMIT_FAILED ? "FAILED" : "other");
	json_str(stdout, r.reason[0] ? r.reason : u->r.reason);
	commit_result_free(&r);
}

/* The measurement's line: state, times, memory, the manifest, the storage's calls. */
static void print_poll_line(const struct opts *o, const char *phase, struct storage *s,
                            const struct outcome *u, long rss_before, long peak,
                            const struct cs_counts *d)
{
	line_head(o, phase);
	printf(", \"step\": %" PRId64 ", \"state\": \"%s\", \"polls\": %u, \"wall_ms\": %.1f, "
	       "\"cpu_ms\": %.1f, "
	       "\"rss_before_kb\": %ld, \"peak_rss_kb\": %ld, \"manifest_bytes\": %" PRIu64
	       ", \"wrote\": %s, \"missing\": %zu, \"ops\": ",
	       o->step, state_text(u), u->polls, u->wall_ms, u->cpu_ms, rss_before, peak,
	       manifest_bytes(s, o), u->r.wrote ? "true" : "false", u->r.nmissing);
	printf(", \"calls\": %" PRIu64, cs_json(d, stdout));
}

/* Node `n`'s part of the step read back, its committer made (the own part's cost said). */
static int start_node(const struct opts *o, struct storage *s, int n, struct committer **cm,
                      struct part **own, char *err)
{
	char node[32];
	const struct commit_opts co = {s, node, DEADLINE_NS, false};
	int rc;

	node_name(n, node, sizeof(node));
	rc = committer_create(&co, cm, err);
	if (rc == 0)
		rc = store_read_part(s, o->job, o->step, node, own, err);
	return rc;
}

static int run_poll(const struct opts *o, bool committing, char *err)
{
	const int n = committing ? 0 : o->node;
	struct storage *s = NULL;
	struct ioeng *io = NULL;
	struct committer *cm = NULL;
	struct commit *c = NULL;
	struct part *own = NULL;
	struct outcome u = {0};
	struct cs_counts a, b, d;
	char node[32];
	long rss_before, peak;
	int64_t t0;
	int rc;

	node_name(n, node, sizeof(node));
	rc = open_store(o, node, &io, &s, err);
	if (rc == 0)
		rc = start_node(o, s, n, &cm, &own, err);
	/* what each node does once a run (before_part): rank 0's counts the tensors too */
	if (rc == 0 && (rc = warm_roster(cm, s, own, o, committing ? "roster" : "watch_roster")))
		ipc_errf(err, rc, "reading the roster of job %s: %s", o->job, strerror(-rc));
	if (rc)
		goto close_store;
	rss_before = rss_now_kb();
	cs_counts(s, &a);
	t0 = mono_ns();
	rc = commit_create(cm, own, committing, t0, &c, err);
	if (rc)
		goto close_store;
	own = NULL; /* the commit's now */
	poll_until(c, o, committing ? o->stuck_polls : 0, &u);
	peak = rss_peak_kb();
	cs_counts(s, &b);
	cs_diff(&b, &a, &d);
	print_poll_line(o, committing ? "commit" : "watch", s, &u, rss_before, peak, &d);
	if (u.r.state == COMMIT_WAITING && o->explain)
		explain(c, t0, &u);
	else {
		printf(", \"reason\": ");
		json_str(stdout, u.r.reason);
	}
	printf(", \"node\": \"%s\"}\n", node);
	commit_result_free(&u.r);
close_store:
	commit_destroy(c);
	part_free(own);
	committer_destroy(cm);
	storage_destroy(s);
	ioeng_destroy(io);
	return rc;
}

/* ---- main --------------------------------------------------------------- */

static void usage(void)
{
	fprintf(
	    stderr,
	    "usage: scale_bench gen|commit|watch|shares|share_watch --root DIR|s3://BUCKET\n"
	    "         [--job J] [--run R] [--nodes N] [--ranks R] [--tensors T] [--steps S]\n"
	    "         [--threads K] [--replicas D]\n"
	    "         [--leave-out NODE] [--step S] [--node K] [--op-latency-us US]\n"
	    "         [--cap-s SECONDS] [--stuck-polls P] [--no-explain]\n"
	    "  gen: a root of N nodes x R ranks x T tensors, S steps (defaults 4 x 8 x 300, 2)\n"
	    "  commit: step S (default: --steps) committed as node n00000 would\n"
	    "  watch: node K (default 1) polls until it sees step S committed\n"
	    "  shares: the dedup assignment's shares put as node n00000 puts them\n"
	    "  share_watch: node K takes its share (gen --replicas D: D ranks hold each box)\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {{"root", 1, 0, 'r'},
	                                   {"job", 1, 0, 'j'},
	                                   {"run", 1, 0, 'u'},
	                                   {"nodes", 1, 0, 'n'},
	                                   {"ranks", 1, 0, 'k'},
	                                   {"tensors", 1, 0, 't'},
	                                   {"steps", 1, 0, 's'},
	                                   {"threads", 1, 0, 'T'},
	                                   {"leave-out", 1, 0, 'L'},
	                                   {"step", 1, 0, 'S'},
	                                   {"node", 1, 0, 'N'},
	                                   {"op-latency-us", 1, 0, 'l'},
	                                   {"cap-s", 1, 0, 'c'},
	                                   {"stuck-polls", 1, 0, 'p'},
	                                   {"no-explain", 0, 0, 'x'},
	                                   {"replicas", 1, 0, 'R'},
	                                   {0, 0, 0, 0}};
	long nproc = sysconf(_SC_NPROCESSORS_ONLN);
	int ch;

	*o = (struct opts){.job = "scale",
	                   .run = "r1",
	                   .nodes = 4,
	                   .ranks = 8,
	                   .tensors = 300,
	                   .steps = 2,
	                   .threads = nproc > 0 ? (int)nproc : 1,
	                   .leave_out = -1,
	                   .node = 1,
	                   .cap_s = 600,
	                   .stuck_polls = 1,
	                   .replicas = 1,
	                   .explain = true};
	if (argc < 2)
		return -EINVAL;
	o->cmd = argv[1];
	while ((ch = getopt_long(argc - 1, argv + 1, "", lo, NULL)) != -1) {
		switch (ch) {
		case 'r':
			o->root = optarg;
			break;
		case 'j':
			o->job = optarg;
			break;
		case 'u':
			o->run = optarg;
			break;
		case 'n':
			o->nodes = atoi(optarg);
			break;
		case 'k':
			o->ranks = atoi(optarg);
			break;
		case 't':
			o->tensors = atoi(optarg);
			break;
		case 's':
			o->steps = atoi(optarg);
			break;
		case 'T':
			o->threads = atoi(optarg);
			break;
		case 'L':
			o->leave_out = atoi(optarg);
			break;
		case 'S':
			o->step = atoll(optarg);
			break;
		case 'N':
			o->node = atoi(optarg);
			break;
		case 'l':
			o->latency_us = atoll(optarg);
			break;
		case 'c':
			o->cap_s = atof(optarg);
			break;
		case 'p':
			o->stuck_polls = atoi(optarg);
			break;
		case 'x':
			o->explain = false;
			break;
		case 'R':
			o->replicas = atoi(optarg);
			break;
		default:
			return -EINVAL;
		}
	}
	if (!o->step)
		o->step = o->steps;
	/* gen --steps 0: the plans alone (for shares and share_watch) */
	if (!o->root || o->nodes < 1 || o->ranks < 1 || o->tensors < 1 || o->steps < 0 ||
	    o->threads < 1 || (long)o->nodes * o->ranks > IPC_MAX_WORLD || o->latency_us < 0 ||
	    ((o->step < 1 || o->step > o->steps) && strcmp(o->cmd, "gen") != 0 &&
	     strncmp(o->cmd, "share", 5) != 0) ||
	    o->replicas < 1 || (o->nodes * o->ranks) % o->replicas != 0 ||
	    ((strcmp(o->cmd, "watch") == 0 || strcmp(o->cmd, "share_watch") == 0) &&
	     (o->node < 0 || o->node >= o->nodes)))
		return -EINVAL;
	return 0;
}

int main(int argc, char **argv)
{
	char err[IPC_ERRLEN] = "";
	struct opts o;
	int rc;

	if (parse(argc, argv, &o)) {
		usage();
		return 2;
	}
	if (strcmp(o.cmd, "gen") == 0 && storage_is_s3(o.root))
		rc =
		    ipc_errf(err, -EINVAL,
		             "gen writes a directory: copy it into the bucket (bench/scale_s3.sh)");
	else if (strcmp(o.cmd, "gen") == 0)
		rc = run_gen(&o, err);
	else if (strcmp(o.cmd, "commit") == 0 || strcmp(o.cmd, "watch") == 0)
		rc = run_poll(&o, strcmp(o.cmd, "commit") == 0, err);
	else if (strcmp(o.cmd, "shares") == 0 || strcmp(o.cmd, "share_watch") == 0)
		rc = run_shares(&o, strcmp(o.cmd, "shares") == 0, err);
	else {
		usage();
		return 2;
	}
	fflush(stdout);
	if (rc)
		fprintf(stderr, "scale_bench %s: %s\n", o.cmd, err);
	return rc ? 1 : 0;
}
