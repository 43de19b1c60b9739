/*
 * The Prometheus endpoint: GET /metrics in the text exposition format,
 * served by libmicrohttpd on its own thread, only where
 * `[metrics] listen` / --metrics-listen names a HOST:PORT (and only there).
 *
 * Save durations are observed as saves change state (save_set_state, under
 * agent.mu); everything else (bytes, I/O errors and retries, the pool,
 * saves by final state, sessions, plans) is read when scraped. A scrape
 * takes agent.mu only to copy a few numbers, never while formatting or
 * writing, so it never holds up the agent.
 *
 * Lock order: agent.mu, then the metrics' own mutex.
 */
#ifndef CKPT_AGENT_METRICS_H
#define CKPT_AGENT_METRICS_H

#include <stdint.h>

struct agent;
struct metrics;
struct save;

/* Binds listen ("HOST:PORT", "[V6]:PORT") and serves a's metrics; 0 or -errno with err. */
int metrics_create(struct agent *a, const char *listen, struct metrics **out, char *err);
/* Stops serving (waits for a scrape in progress). NULL is fine. */
void metrics_destroy(struct metrics *m);
/* Under agent.mu (a hub_save_fn): s has just reached `state` (its t_* are set). */
void metrics_on_save(struct agent *a, struct save *s, enum save_state state);
/*
 * A step's commit ended: latency_ns (>= 0) when this node wrote the
 * manifest (the last part durable to the manifest durable), else -1;
 * parts_missing: other nodes' parts missing at the deadline.
 */
void metrics_on_commit(struct metrics *m, int64_t latency_ns, unsigned parts_missing);
/*
 * A restore ended (before its trainer is told): rc 0 (and bytes restored) or its error; read:
 * the bytes read for it (a group's, for one of its ranks); passed_over:
 * damaged newer steps it passed over. NULL m: nothing.
 */
void metrics_on_restore(struct metrics *m, int rc, uint64_t bytes, uint64_t read, int64_t start_ns,
                        unsigned passed_over);

#endif /* CKPT_AGENT_METRICS_H */
