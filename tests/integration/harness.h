/*
 * Integration-test harness: a real ckptd in a temporary directory, started,
 * stopped, killed and restarted by the test; ckptctl run against it; and a
 * trainer-side helper that fills host tensors with known values.
 */
#ifndef CKPT_TEST_HARNESS_H
#define CKPT_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <jansson.h>

#include "client/ckpt.h"

struct agent_proc {
	pid_t pid;
	char dir[256]; /* the test's temporary directory */
	char root[320]; /* <dir>/root */
	char endpoint[340]; /* unix:<dir>/ckptd.sock */
	char log[320]; /* <dir>/agent.log */
	char args[512]; /* extra flags given at start */
	char node[72]; /* its --node, or "" (the host name) */
	char env[8192]; /* "NAME=value" added to its environment, or "" */
};

/* Makes the directory and starts ckptd with `args` (may be NULL); waits until it serves. */
void h_agent_start(struct agent_proc *a, const char *args);
/*
 * h_agent_start with `env` ("NAME=value", e.g. a CKPT_FAULTS plan) in its
 * environment; restarts keep it (clear a->env first to restart without).
 */
void h_agent_start_env(struct agent_proc *a, const char *args, const char *env);
/*
 * Starts ckptd as node `node` on `root`, a directory other agents share
 * (one node each, the many nodes of a job on one machine); its socket and
 * log in a directory of its own. h_agent_cleanup leaves the root alone.
 */
void h_agent_start_node(struct agent_proc *a, const char *root, const char *node, const char *args);
/* h_agent_start_node with `env` in its environment (as h_agent_start_env). */
void h_agent_start_node_env(struct agent_proc *a, const char *root, const char *node,
                            const char *args, const char *env);
/* Starts it again on the same directory and flags. */
void h_agent_restart(struct agent_proc *a);
/* SIGTERM and wait; returns its exit status. */
int h_agent_stop(struct agent_proc *a);
/* SIGKILL and wait. */
void h_agent_kill(struct agent_proc *a);
/* Stops the agent if running and removes the directory. */
void h_agent_cleanup(struct agent_proc *a);
/* Whether the agent's log contains `needle`. */
bool h_log_has(const struct agent_proc *a, const char *needle);

/* A loopback TCP port nobody listens on now: bound to port 0, read back, closed. */
unsigned h_free_port(void);
/*
 * The value of one sample ("ckptd_up", "ckptd_restores_total{result=\"ok\"}")
 * in a scrape of the agent's metrics on 127.0.0.1:port; fails the test if
 * the scrape does not have it.
 */
double h_metric(unsigned port, const char *sample);
/* ckpt_connect to the agent, asserting it works. */
struct ckpt_client *h_connect(const struct agent_proc *a);

/* Runs ckptctl --endpoint <a> <args>; stdout+stderr into out; returns its exit status. */
int h_ctl(const struct agent_proc *a, char *out, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A shell command: its stdout into out (if given), its exit code (-1: killed). */
int h_run(char *out, size_t len, const char *cmd);

/*
 * Sends `len` raw bytes as the request of `method` ("/ckpt.v1.Ckpt/Save"),
 * bypassing libckpt's checks; returns the gRPC status code, its message in msg.
 */
int h_raw_call(const struct agent_proc *a, const char *method, const void *buf, size_t len,
               char *msg, size_t msglen);
/* The same with a given token (NULL: none). */
int h_raw_call_token(const struct agent_proc *a, const char *token, const char *method,
                     const void *buf, size_t len, char *msg, size_t msglen);
/* The same with or without a token (without: as an anonymous gRPC client). */
int h_raw_call_as(const struct agent_proc *a, const char *method, const void *buf, size_t len,
                  char *msg, size_t msglen, bool with_token);
/*
 * Connects to the agent's credentials socket and reads its hello: the
 * token (hex) into hex[IPC_TOKEN_HEX + 1]; returns the socket (close it to
 * end the token's life).
 */
int h_cred_token(const struct agent_proc *a, char *hex);
/*
 * Polls `ckptctl --json list job` until step has `state` (or timeout_ms);
 * whether it did. "IN_FLIGHT" matches any state short of COMMITTED/FAILED.
 */
bool h_wait_state(const struct agent_proc *a, const char *job, long long step, const char *state,
                  int timeout_ms);

/* A path under the agent's root: "<root>/<rel>". */
/* Where a spawned child's output goes (h_spawn). */
enum h_out {
	H_OUT_KEEP, /* this process's stdout and stderr */
	H_OUT_PIPE, /* stdout into a pipe: its read end on *out_fd, or closed */
	H_OUT_PIPE_ALL, /* stdout and stderr into that pipe */
};
/*
 * A child of a test program in a role, in a process of its own: bin (NULL:
 * this program itself, /proc/self/exe) run with argv (argv[0] the program's
 * name, then the role as its test_before reads it: "--rank", "--trainer" and
 * their arguments; NULL-ended).
 */
pid_t h_spawn(const char *bin, enum h_out out, int *out_fd, const char *const *argv);
/*
 * A trainer of this program (prog: its name) in a process of its own:
 * `--trainer ENDPOINT JOB STEP MB MODE`, its output this process's.
 */
pid_t h_spawn_trainer(const char *prog, const struct agent_proc *a, const char *job, long step,
                      long mb, const char *mode);
/*
 * A trainer rank in a process of its own: `bin --rank ENDPOINT JOB RUN RANK
 * WORLD FIRST LAST MB MODE` (test_cluster's rank_main). Its stdout (and
 * stderr too with with_stderr) on *out_fd if asked.
 */
pid_t h_spawn_rank(const char *bin, const struct agent_proc *a, const char *job, const char *run,
                   int rank, int world, long first, long last, long mb, const char *mode,
                   int *out_fd, bool with_stderr);
/* All of fd (closed after) into buf, NUL-terminated. */
void h_read_all(int fd, char *buf, size_t len);

void h_path(const struct agent_proc *a, char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool h_exists(const char *path);
/*
 * A step's manifest.json as JSON; where it is a head (version 4), with the
 * "ranks" its parts hold (each rank's entry of its node's part, in rank
 * order), as a reader assembles them.
 */
json_t *h_manifest_load(const char *path);
/* How many ranks a manifest's JSON as written says: a head's parts' ranks, else "ranks". */
size_t h_manifest_ranks(json_t *m);
/*
 * The path of rank's shard of (job, step), as the step's manifest names it
 * (readers follow the manifest: shard names carry the node and an attempt).
 */
void h_shard(const struct agent_proc *a, char *buf, size_t len, const char *job, long long step,
             int rank);
/* Flips one bit of the byte at `off` of a file. */
void h_flip_byte(const char *path, uint64_t off);
/* A wait status as a shell would say it: the exit code, or 128 + the signal. */
int h_exit_code(int status);
/* Waits for child pid (asserting it is ours); its h_exit_code. */
int h_reap(pid_t pid);

/* Test tensors: n tensors of varied dtypes and odd sizes in one host region. */
struct h_model {
	size_t n;
	struct ckpt_tensor *t;
	int64_t (*shape)[2];
	char (*name)[48];
	void *base;
	size_t bytes;
	struct ckpt_client *c;
};

/* n tensors, the i-th of about `scale` bytes (never a multiple of 4096). */
void h_model_make(struct h_model *m, struct ckpt_client *c, size_t n, size_t scale);
/* Writes the values of (seed, tensor, byte) into every tensor. */
void h_model_fill(struct h_model *m, uint64_t seed);
/* Whether every tensor holds the values of seed; on a miss, which tensor. */
bool h_model_check(const struct h_model *m, uint64_t seed, size_t *bad);
void h_model_free(struct h_model *m);
size_t h_tensor_bytes(const struct h_model *m, size_t i);
/* The byte written at (seed, tensor i, byte j). */
uint8_t h_value(uint64_t seed, size_t i, size_t j);

#endif
