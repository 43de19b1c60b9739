/*
 * A damaged or forged checkpoint never costs a job its progress: what a
 * restore answers when a committed step cannot be read whole, against a
 * real agent.
 *
 *   deleted_shard_of_latest    LATEST's shard file removed: LATEST restores
 *                              the step before, saying which it passed over
 *                              and why (the reply, the log, the list, the
 *                              metrics); strict and by number: -EBADMSG
 *                              naming the file, counted damaged, never
 *                              -ENOENT; a save of the step again replaces
 *                              it (the damaged gauge back to 0)
 *   only_step_damaged          nothing whole left: -EBADMSG, never -ENOENT,
 *                              also across a restart; an unreadable manifest
 *                              is listed DAMAGED; LATEST naming a step whose
 *                              checkpoints went: -EBADMSG
 *   forged_manifest_at_start   a manifest copied under a newer step (with or
 *                              without the files) is not LATEST after a
 *                              restart, is listed DAMAGED, and LATEST
 *                              restores the real newest step
 *   forged_manifest_running    the same planted while the agent runs: a
 *                              restore of LATEST passes over it (the files'
 *                              stamps are another step's); also with the
 *                              manifest's stamps left out (claimed as an
 *                              older agent's): restore and verify refuse it
 *   removed_while_verifying    a verify whose step goes (retention on
 *                              another node, a delete) says so, never CORRUPT
 *   shard_not_a_file           LATEST's shard replaced by a link or a
 *                              directory: damage like a missing file (passed
 *                              over, -EBADMSG by number), not an I/O error
 *   step_not_a_directory       a step's directory replaced by a link or a
 *                              file, its manifest by a directory: by number
 *                              -EBADMSG, never -ENOENT (the listing does not
 *                              show it, its name is there all the same)
 *   removed_as_latest_was_read a restore of LATEST whose step another node
 *                              removes as it reads, the older ones too, and
 *                              a newer one committed meanwhile: that newer
 *                              step, never "no checkpoint"
 *
 * Each holds a promise of docs/DESIGN.md §9 (a damaged checkpoint is never
 * reported as an absent one); tests/mutants.txt names the faults they catch.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>
#include <jansson.h>

#include "tests/integration/harness.h"
#include "support/check_main.h"

static void commit(struct ckpt_plan *p, int64_t step)
{
	struct ckpt_save *s;

	ck_assert_int_eq(ckpt_save(p, step, NULL, &s), 0);
	ck_assert_msg(ckpt_save_wait(s, CKPT_COMMITTED, 60000) == 0, "step %lld: %s",
	              (long long)step, ckpt_save_reason(s));
	ckpt_save_release(s);
}

/* A job of one rank with steps first..last committed, step k holding the values of seed k. */
struct job {
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct h_model m;
};

static void job_start(struct job *j, const char *name, int first, int last, const char *args)
{
	h_agent_start(&j->a, args);
	j->c = h_connect(&j->a);
	h_model_make(&j->m, j->c, 4, 50003);
	ck_assert_int_eq(ckpt_plan_create(j->c, name, 0, 1, j->m.t, j->m.n, &j->p), 0);
	for (int k = first; k <= last; k++) {
		h_model_fill(&j->m, (uint64_t)k);
		commit(j->p, k);
	}
}

static void job_end(struct job *j)
{
	ckpt_plan_destroy(j->p);
	h_model_free(&j->m);
	ckpt_disconnect(j->c);
	h_agent_cleanup(&j->a);
}

/* Restores LATEST with the options' fallback: rc; *step and the notes (freed by the caller). */
static int restore_latest(struct job *j, enum ckpt_fallback fb, int64_t *step, char **notes)
{
	struct ckpt_restore_opts o = CKPT_RESTORE_OPTS_INIT;
	int rc;

	o.fallback = fb;
	*step = -1;
	h_model_fill(&j->m, 999); /* scribbled over: what comes back is the checkpoint's */
	rc = ckpt_restore_opts(j->p, CKPT_LATEST, &o, step, NULL);
	*notes = o.skipped;
	return rc;
}

/*
 * Step's entry in `ckptctl --json list JOB` as "STATE[ DAMAGED][ LATEST]:
 * reason" into line; false if it is not listed.
 */
static bool list_line(struct job *j, const char *job, int64_t step, char *line, size_t len)
{
	static char out[1 << 16];
	json_t *l, *c;
	size_t i;
	bool found = false;

	ck_assert_int_eq(h_ctl(&j->a, out, sizeof(out), "--json list %s", job), 0);
	l = json_loads(out, 0, NULL);
	ck_assert_msg(l, "%s", out);
	json_array_foreach(json_object_get(l, "checkpoints"), i, c)
	{
		if (json_integer_value(json_object_get(c, "step")) != step)
			continue;
		snprintf(line, len, "%s%s%s: %s", json_string_value(json_object_get(c, "state")),
		         json_is_true(json_object_get(c, "damaged")) ? " DAMAGED" : "",
		         json_is_true(json_object_get(c, "latest")) ? " LATEST" : "",
		         json_string_value(json_object_get(c, "reason")));
		found = true;
	}
	json_decref(l);
	return found;
}

START_TEST(deleted_shard_of_latest)
{
	const unsigned port = h_free_port();
	struct job j;
	char shard[512], line[1024], args[64], *notes;
	int64_t step;

	snprintf(args, sizeof(args), "--metrics-listen 127.0.0.1:%u", port);
	job_start(&j, "dl", 1, 3, args);
	h_shard(&j.a, shard, sizeof(shard), "dl", 3, 0);
	ck_assert_int_eq(unlink(shard), 0);

	/* the default: step 2, saying step 3 was passed over and why */
	ck_assert_msg(restore_latest(&j, CKPT_FALLBACK_DAMAGED, &step, &notes) == 0, "%s",
	              ckpt_last_error(j.c));
	ck_assert_int_eq(step, 2);
	ck_assert(h_model_check(&j.m, 2, NULL));
	ck_assert_msg(notes && strstr(notes, "step 3: ") && strstr(notes, strrchr(shard, '/') + 1),
	              "%s", notes ? notes : "(no notes)");
	free(notes);
	ck_assert_msg(h_log_has(&j.a, "step 3 passed over"), "the log does not say (%s)", j.a.log);
	/* and the metrics the alerts read: one step passed over, one known damaged */
	ck_assert_int_eq(h_metric(port, "ckptd_restore_passed_over_total"), 1);
	ck_assert_int_eq(h_metric(port, "ckptd_checkpoints_damaged"), 1);
	/* the list: step 3 DAMAGED with why, LATEST on step 2 */
	ck_assert(list_line(&j, "dl", 3, line, sizeof(line)));
	ck_assert_msg(strstr(line, "DAMAGED") && strstr(line, strrchr(shard, '/') + 1) &&
	                  !strstr(line, "LATEST"),
	              "%s", line);
	ck_assert(list_line(&j, "dl", 2, line, sizeof(line)));
	ck_assert_msg(strstr(line, "COMMITTED") && strstr(line, "LATEST"), "%s", line);

	/* strict, and by number: the damage, naming the file; never "no checkpoint" */
	ck_assert_int_eq(restore_latest(&j, CKPT_FALLBACK_NEVER, &step, &notes), -EBADMSG);
	ck_assert_msg(strstr(ckpt_last_error(j.c), "step 3") &&
	                  strstr(ckpt_last_error(j.c), strrchr(shard, '/') + 1),
	              "%s", ckpt_last_error(j.c));
	ck_assert_ptr_null(notes);
	ck_assert_int_eq(ckpt_restore(j.p, 3, NULL, NULL), -EBADMSG);
	ck_assert_msg(strstr(ckpt_last_error(j.c), strrchr(shard, '/') + 1), "%s",
	              ckpt_last_error(j.c));
	ck_assert_int_eq(h_metric(port, "ckptd_restores_total{result=\"damaged\"}"), 2);
	ck_assert_int_eq(h_metric(port, "ckptd_restores_total{result=\"absent\"}"), 0);

	/* the same after a restart (LATEST still names 3: it is read again, and passed over) */
	ck_assert_int_eq(h_agent_stop(&j.a), 0);
	h_agent_restart(&j.a);
	ck_assert_int_eq(ckpt_restore(j.p, CKPT_LATEST, &step, NULL), 0);
	ck_assert_int_eq(step, 2);
	ck_assert(h_model_check(&j.m, 2, NULL));

	/* the trainer goes on from 2 and saves 3 again: that save replaces the damaged one */
	h_model_fill(&j.m, 33);
	commit(j.p, 3);
	ck_assert_int_eq(ckpt_restore(j.p, CKPT_LATEST, &step, NULL), 0);
	ck_assert_int_eq(step, 3);
	ck_assert(h_model_check(&j.m, 33, NULL));
	ck_assert(list_line(&j, "dl", 3, line, sizeof(line)));
	ck_assert_msg(strstr(line, "COMMITTED LATEST") && !strstr(line, "DAMAGED"), "%s", line);
	ck_assert_int_eq(h_metric(port, "ckptd_checkpoints_damaged"), 0); /* the alert clears */
	ck_assert_int_eq(h_ctl(&j.a, line, sizeof(line), "verify dl 3"), 0);
	/* a whole step is not saved twice */
	{
		struct ckpt_save *s;

		ck_assert_int_eq(ckpt_save(j.p, 3, NULL, &s), -EEXIST);
	}
	job_end(&j);
}
END_TEST

START_TEST(only_step_damaged)
{
	struct job j;
	char shard[512], path[512], line[1024], *notes;
	int64_t step;
	FILE *f;

	job_start(&j, "od", 1, 1, NULL);
	h_shard(&j.a, shard, sizeof(shard), "od", 1, 0);
	ck_assert_int_eq(unlink(shard), 0);
	/* nothing whole left: the damage, never -ENOENT (a trainer would start over) */
	ck_assert_int_eq(restore_latest(&j, CKPT_FALLBACK_DAMAGED, &step, &notes), -EBADMSG);
	ck_assert_msg(strstr(ckpt_last_error(j.c), strrchr(shard, '/') + 1), "%s",
	              ckpt_last_error(j.c));
	free(notes);
	ck_assert_int_eq(restore_latest(&j, CKPT_FALLBACK_ANY, &step, &notes), -EBADMSG);
	free(notes);

	/* its manifest unreadable too, read at a restart: listed DAMAGED, not gone */
	h_path(&j.a, path, sizeof(path), "od/step-000000000001/manifest.json");
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs("{\"format\": \"ckptd-manifest\", \"version\": 2, \"jo", f);
	fclose(f);
	ck_assert_int_eq(h_agent_stop(&j.a), 0);
	h_agent_restart(&j.a);
	ck_assert(list_line(&j, "od", 1, line, sizeof(line)));
	ck_assert_msg(strstr(line, "DAMAGED") && strstr(line, "manifest"), "%s", line);
	ck_assert_int_eq(restore_latest(&j, CKPT_FALLBACK_DAMAGED, &step, &notes), -EBADMSG);
	ck_assert_msg(strstr(ckpt_last_error(j.c), "manifest"), "%s", ckpt_last_error(j.c));
	free(notes);
	ck_assert_int_eq(ckpt_restore(j.p, 1, NULL, NULL), -EBADMSG);
	/* show says damaged too (DATA_LOSS: EBADMSG), not a usage error nor "not there" */
	{
		char out[4096];

		ck_assert_int_eq(h_ctl(&j.a, out, sizeof(out), "--json show od 1"), 1);
		ck_assert_msg(strstr(out, "\"EBADMSG\"") && strstr(out, "manifest"), "%s", out);
	}

	/* the step's directory gone while LATEST names it: checkpoints were there */
	h_path(&j.a, path, sizeof(path), "od/step-000000000001");
	{
		char cmd[700];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
		ck_assert_int_eq(system(cmd), 0);
	}
	ck_assert_int_eq(ckpt_restore(j.p, CKPT_LATEST, &step, NULL), -EBADMSG);
	ck_assert_msg(strstr(ckpt_last_error(j.c), "LATEST"), "%s", ckpt_last_error(j.c));
	/* a job that never had any: -ENOENT, the one "start over" */
	{
		struct ckpt_plan *p2;

		ck_assert_int_eq(ckpt_plan_create(j.c, "never", 0, 1, j.m.t, j.m.n, &p2), 0);
		ck_assert_int_eq(ckpt_restore(p2, CKPT_LATEST, NULL, NULL), -ENOENT);
		ck_assert_int_eq(ckpt_restore(p2, 4, NULL, NULL), -ENOENT);
		ckpt_plan_destroy(p2);
	}
	job_end(&j);
}
END_TEST

/*
 * step 3's manifest.json copied as step `to`'s, its step rewritten (and,
 * with files, its shard; with unstamped, its ranks' "save" left out).
 */
static void forge_as(struct job *j, const char *job, int to, bool files, bool unstamped)
{
	char from[512], dir[512], cmd[1400], p[700];
	json_t *m;

	h_path(&j->a, from, sizeof(from), "%s/step-000000000003", job);
	h_path(&j->a, dir, sizeof(dir), "%s/step-%012d", job, to);
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s' %s '%s'/rank-* '%s'/", dir,
	         files ? "&& cp" : "&& true", from, dir);
	ck_assert_int_eq(system(cmd), 0);
	snprintf(p, sizeof(p), "%s/manifest.json", from);
	m = json_load_file(p, 0, NULL);
	ck_assert_ptr_nonnull(m);
	json_object_set_new(m, "step", json_integer(to));
	if (unstamped) {
		json_t *r;
		size_t i;

		json_array_foreach(json_object_get(m, "ranks"), i, r)
		{
			json_object_del(r, "save");
		}
	}
	snprintf(p, sizeof(p), "%s/manifest.json", dir);
	ck_assert_int_eq(json_dump_file(m, p, 0), 0);
	json_decref(m);
}

static void forge(struct job *j, const char *job, int to, bool files)
{
	forge_as(j, job, to, files, false);
}

static int64_t latest_file(struct job *j, const char *job)
{
	char p[512], buf[32] = "";
	FILE *f;

	h_path(&j->a, p, sizeof(p), "%s/LATEST", job);
	f = fopen(p, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(buf, sizeof(buf), f));
	fclose(f);
	return strtoll(buf, NULL, 10);
}

START_TEST(forged_manifest_at_start)
{
	struct job j;
	char line[1024], *notes;
	int64_t step;

	job_start(&j, "fs", 1, 3, NULL);
	ck_assert_int_eq(h_agent_stop(&j.a), 0);
	forge(&j, "fs", 99, _i == 1);
	h_agent_restart(&j.a);
	ck_assert_int_eq(latest_file(&j, "fs"), 3);
	ck_assert(list_line(&j, "fs", 99, line, sizeof(line)));
	ck_assert_msg(strstr(line, "DAMAGED"), "%s", line);
	ck_assert(list_line(&j, "fs", 3, line, sizeof(line)));
	ck_assert_msg(strstr(line, "LATEST"), "%s", line);
	ck_assert_msg(restore_latest(&j, CKPT_FALLBACK_DAMAGED, &step, &notes) == 0, "%s",
	              ckpt_last_error(j.c));
	ck_assert_int_eq(step, 3);
	ck_assert(h_model_check(&j.m, 3, NULL));
	ck_assert_msg(notes && strstr(notes, "step 99: "), "%s", notes ? notes : "(none)");
	free(notes);
	ck_assert_int_eq(ckpt_restore(j.p, 99, NULL, NULL), -EBADMSG);
	job_end(&j);
}
END_TEST

START_TEST(forged_manifest_running)
{
	struct job j;
	char *notes;
	int64_t step;

	job_start(&j, "fr", 1, 3, NULL);
	forge(&j, "fr", 50, true); /* the files too: their data is step 3's, and whole */
	ck_assert_msg(restore_latest(&j, CKPT_FALLBACK_DAMAGED, &step, &notes) == 0, "%s",
	              ckpt_last_error(j.c));
	ck_assert_int_eq(step, 3);
	ck_assert(h_model_check(&j.m, 3, NULL));
	ck_assert_msg(notes && strstr(notes, "step 50: ") && strstr(notes, "of step 3"), "%s",
	              notes ? notes : "(none)");
	free(notes);
	/* by number: that is no checkpoint of step 50 */
	ck_assert_int_eq(ckpt_restore(j.p, 50, NULL, NULL), -EBADMSG);
	ck_assert_msg(strstr(ckpt_last_error(j.c), "not save"), "%s", ckpt_last_error(j.c));

	/* its manifest claiming no stamps (an older agent's): files of step 3 all the same */
	forge_as(&j, "fr", 60, true, true);
	ck_assert_int_eq(ckpt_restore(j.p, 60, NULL, NULL), -EBADMSG);
	ck_assert_msg(strstr(ckpt_last_error(j.c), "of step 3"), "%s", ckpt_last_error(j.c));
	{
		char out[4096];

		ck_assert_int_eq(h_ctl(&j.a, out, sizeof(out), "verify fr 60"), 1);
		ck_assert_msg(strstr(out, "of step 3"), "verify of a forged step: %s", out);
	}
	job_end(&j);
}
END_TEST

/*
 * A verify whose step goes as it reads (another node's retention, a
 * delete): it says so, never CORRUPT. Rank 0's file is read slowly
 * (CKPT_FAULTS), the step is taken out of sight meanwhile, as a removal
 * does, and rank 1's file is then not there.
 */
START_TEST(removed_while_verifying)
{
	struct agent_proc a;
	struct ckpt_client *c;
	struct ckpt_plan *p[2];
	struct h_model m[2];
	char out[8192], from[512], to[512];
	int fd[2], st;
	pid_t pid;

	h_agent_start_env(&a, NULL,
	                  "CKPT_FAULTS=io_read:slow=3000:path=*/step-000000000002/rank-00000*");
	c = h_connect(&a);
	for (int r = 0; r < 2; r++) {
		h_model_make(&m[r], c, 3, 30001);
		for (size_t i = 0; i < m[r].n; i++) { /* names of its own: no replicas */
			snprintf(m[r].name[i], sizeof(m[r].name[i]), "rank%d.t%zu", r, i);
			m[r].t[i].name = m[r].name[i];
		}
		ck_assert_int_eq(ckpt_plan_create(c, "rv", r, 2, m[r].t, m[r].n, &p[r]), 0);
	}
	for (int64_t step = 1; step <= 2; step++) {
		struct ckpt_save *s[2];

		for (int r = 0; r < 2; r++)
			ck_assert_int_eq(ckpt_save(p[r], step, NULL, &s[r]), 0);
		for (int r = 0; r < 2; r++) {
			ck_assert_msg(ckpt_save_wait(s[r], CKPT_COMMITTED, 60000) == 0, "%s",
			              ckpt_save_reason(s[r]));
			ckpt_save_release(s[r]);
		}
	}
	ck_assert_int_eq(pipe(fd), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int rc = h_ctl(&a, out, sizeof(out), "verify rv 2");

		if (write(fd[1], out, strlen(out)) < 0)
			_exit(99);
		_exit(rc);
	}
	close(fd[1]);
	/* rank 0's file is being read (3 s a read): the step goes out of sight */
	usleep(1000 * 1000);
	h_path(&a, from, sizeof(from), "rv/step-000000000002");
	h_path(&a, to, sizeof(to), "rv/.trash.step-000000000002.n9.1.1");
	ck_assert_int_eq(rename(from, to), 0);
	h_read_all(fd[0], out, sizeof(out));
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "verify exited %d: %s",
	              WEXITSTATUS(st), out);
	ck_assert_msg(strstr(out, "was removed") && !strstr(out, "CORRUPT"), "%s", out);
	for (int r = 0; r < 2; r++) {
		ckpt_plan_destroy(p[r]);
		h_model_free(&m[r]);
	}
	ckpt_disconnect(c);
	h_agent_cleanup(&a);
}
END_TEST

/*
 * Two agents on one root: a step the one removes leaves the other's list at
 * once (its list looks at the root), and a restore chosen from that list
 * is never "no checkpoint" while one is there.
 */
START_TEST(listed_until_removed)
{
	struct agent_proc a0, a1;
	struct ckpt_client *c;
	struct ckpt_plan *p;
	struct h_model m;
	char root[512], out[16384];

	snprintf(root, sizeof(root), "%s/shared-XXXXXX", getenv("CK_TMPDIR") ?: "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(root));
	h_agent_start_node(&a0, root, "n0", NULL);
	h_agent_start_node(&a1, root, "n1", NULL);
	c = h_connect(&a0);
	h_model_make(&m, c, 3, 20001);
	ck_assert_int_eq(ckpt_plan_create(c, "lr", 0, 1, m.t, m.n, &p), 0);
	for (int k = 1; k <= 3; k++) {
		h_model_fill(&m, (uint64_t)k);
		commit(p, k);
	}
	/* a job n1 never served: its list of every job shows it all the same */
	ck_assert_int_eq(h_ctl(&a1, out, sizeof(out), "--json list"), 0);
	ck_assert_msg(strstr(out, "\"job\": \"lr\"") && strstr(out, "\"step\": 2,"),
	              "n1 does not list job lr: %s", out);
	ck_assert_int_eq(h_ctl(&a1, out, sizeof(out), "list lr"), 0);
	ck_assert_msg(strstr(out, "lr ") && strstr(out, " 2 "), "n1 does not list step 2: %s", out);
	ck_assert_int_eq(h_ctl(&a0, out, sizeof(out), "delete lr 2"), 0);
	ck_assert_int_eq(h_ctl(&a1, out, sizeof(out), "--json list lr"), 0);
	ck_assert_msg(!strstr(out, "\"step\": 2,") && strstr(out, "\"step\": 3,"),
	              "n1 still lists step 2 (or lost 3): %s", out);
	ckpt_plan_destroy(p);
	h_model_free(&m);
	ckpt_disconnect(c);
	h_agent_cleanup(&a0);
	h_agent_cleanup(&a1);
	snprintf(out, sizeof(out), "rm -rf '%s'", root);
	ck_assert_int_eq(system(out), 0);
}
END_TEST

/*
 * LATEST's shard file replaced by something else under its name: a link to
 * a copy of it (_i 0) or a directory (_i 1). The agent follows no link: it
 * is not the file the manifest names, damage like a missing one.
 */
START_TEST(shard_not_a_file)
{
	struct job j;
	char shard[512], copy[600], *notes;
	int64_t step;

	job_start(&j, "nf", 1, 3, NULL);
	h_shard(&j.a, shard, sizeof(shard), "nf", 3, 0);
	snprintf(copy, sizeof(copy), "%s.elsewhere", shard);
	ck_assert_int_eq(rename(shard, copy), 0);
	if (_i == 0)
		ck_assert_int_eq(symlink(copy, shard), 0);
	else
		ck_assert_int_eq(mkdir(shard, 0755), 0);

	ck_assert_msg(restore_latest(&j, CKPT_FALLBACK_DAMAGED, &step, &notes) == 0, "%s",
	              ckpt_last_error(j.c));
	ck_assert_int_eq(step, 2);
	ck_assert(h_model_check(&j.m, 2, NULL));
	ck_assert_msg(notes && strstr(notes, "step 3: ") && strstr(notes, strrchr(shard, '/') + 1),
	              "%s", notes ? notes : "(no notes)");
	free(notes);
	ck_assert_int_eq(restore_latest(&j, CKPT_FALLBACK_NEVER, &step, &notes), -EBADMSG);
	free(notes);
	ck_assert_int_eq(ckpt_restore(j.p, 3, NULL, NULL), -EBADMSG);
	ck_assert_msg(strstr(ckpt_last_error(j.c), strrchr(shard, '/') + 1), "%s",
	              ckpt_last_error(j.c));
	job_end(&j);
}
END_TEST

/*
 * Step 3's directory moved away and a link left under its name (_i 0), a
 * file in its place (_i 1), or its manifest replaced by a directory (_i 2):
 * no listing shows it (the agent follows no link, and takes only a regular
 * file for a manifest), yet a restore of it by number is damage, not "no
 * such checkpoint". LATEST restores the step before.
 */
START_TEST(step_not_a_directory)
{
	struct job j;
	char dir[512], away[600], mf[600];
	int64_t step;

	job_start(&j, "nd", 1, 3, NULL);
	h_path(&j.a, dir, sizeof(dir), "nd/step-000000000003");
	snprintf(away, sizeof(away), "%s.away", dir);
	snprintf(mf, sizeof(mf), "%s/manifest.json", dir);
	if (_i == 0) {
		ck_assert_int_eq(rename(dir, away), 0);
		ck_assert_int_eq(symlink(away, dir), 0);
	} else if (_i == 1) {
		ck_assert_int_eq(rename(dir, away), 0);
		ck_assert_int_eq(close(open(dir, O_CREAT | O_WRONLY, 0644)), 0);
	} else {
		ck_assert_int_eq(unlink(mf), 0);
		ck_assert_int_eq(mkdir(mf, 0755), 0);
	}
	/* listed (this agent committed it), then not (a restore of LATEST looked at the root) */
	ck_assert_int_eq(ckpt_restore(j.p, 3, NULL, NULL), -EBADMSG);
	ck_assert_int_eq(ckpt_restore(j.p, CKPT_LATEST, &step, NULL), 0);
	ck_assert_int_eq(step, 2);
	ck_assert_int_eq(ckpt_restore(j.p, 3, NULL, NULL), -EBADMSG);
	ck_assert_msg(strstr(ckpt_last_error(j.c), "step 3"), "%s", ckpt_last_error(j.c));
	/* a step that was never there: still "no such checkpoint" */
	ck_assert_int_eq(ckpt_restore(j.p, 4, NULL, NULL), -ENOENT);
	job_end(&j);
}
END_TEST

/* What another node does while a1's restore of LATEST reads step 2. */
struct remover {
	struct agent_proc *reader, *other;
	struct ckpt_plan *p;
	struct h_model *m;
	char out[4096];
	int rc;
};

static void *remove_under_reader(void *arg)
{
	struct remover *x = arg;
	struct ckpt_save *s;

	/* the reader is held opening step 2's shard (CKPT_FAULTS): step 3, then 1 and 2 go */
	for (int i = 0; i < 3000 && !h_log_has(x->reader, "fault injected: openat("); i++)
		usleep(10 * 1000);
	h_model_fill(x->m, 3);
	x->rc = ckpt_save(x->p, 3, NULL, &s);
	if (x->rc == 0) {
		x->rc = ckpt_save_wait(s, CKPT_COMMITTED, 60000);
		ckpt_save_release(s);
	}
	if (x->rc == 0)
		x->rc = h_ctl(x->other, x->out, sizeof(x->out), "delete rr 2");
	if (x->rc == 0)
		x->rc = h_ctl(x->other, x->out, sizeof(x->out), "delete rr 1");
	return NULL;
}

/*
 * Two agents on one root. n1's trainer commits steps 1 and 2; a trainer on
 * n0 restores LATEST (step 2), held as it opens step 2's shard; meanwhile
 * n1 commits step 3 and removes steps 2 and 1 (retention would). The
 * restore is the newest step there is, 3: going on to the older steps it
 * had listed would end at "no checkpoint", and the trainer would start over.
 */
START_TEST(removed_as_latest_was_read)
{
	struct agent_proc a0, a1;
	struct ckpt_client *c0, *c1;
	struct ckpt_plan *p0, *p1;
	struct h_model m0, m1;
	struct remover x;
	char root[512], cmd[600];
	pthread_t th;
	int64_t step = -1;
	int rc;

	snprintf(root, sizeof(root), "%s/shared-XXXXXX", getenv("CK_TMPDIR") ?: "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(root));
	h_agent_start_node(&a1, root, "n1", NULL);
	c1 = h_connect(&a1);
	h_model_make(&m1, c1, 3, 20001);
	ck_assert_int_eq(ckpt_plan_create(c1, "rr", 0, 1, m1.t, m1.n, &p1), 0);
	for (int k = 1; k <= 2; k++) {
		h_model_fill(&m1, (uint64_t)k);
		commit(p1, k);
	}
	h_agent_start_node_env(&a0, root, "n0", NULL,
	                       "CKPT_FAULTS=openat:slow=4000:path=*/step-000000000002/rank-*:"
	                       "count=inf");
	c0 = h_connect(&a0);
	h_model_make(&m0, c0, 3, 20001);
	ck_assert_int_eq(ckpt_plan_create(c0, "rr", 0, 1, m0.t, m0.n, &p0), 0);

	x = (struct remover){.reader = &a0, .other = &a1, .p = p1, .m = &m1, .rc = -1};
	ck_assert_int_eq(pthread_create(&th, NULL, remove_under_reader, &x), 0);
	h_model_fill(&m0, 999);
	rc = ckpt_restore(p0, CKPT_LATEST, &step, NULL);
	pthread_join(th, NULL);
	ck_assert_msg(x.rc == 0, "n1: %d %s", x.rc, x.out);
	ck_assert_msg(rc == 0, "restore of LATEST: %d %s", rc, ckpt_last_error(c0));
	ck_assert_int_eq(step, 3);
	ck_assert(h_model_check(&m0, 3, NULL));
	ck_assert_msg(h_log_has(&a0, "step 2 was removed as it was read"), "%s", a0.log);

	ckpt_plan_destroy(p0);
	ckpt_plan_destroy(p1);
	h_model_free(&m0);
	h_model_free(&m1);
	ckpt_disconnect(c0);
	ckpt_disconnect(c1);
	h_agent_cleanup(&a0);
	h_agent_cleanup(&a1);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/*
 * A damaged step of two nodes is not replaced by one of them: the other
 * node's part of it stays, and a step saved anew beside it would mix two
 * saves. The save is refused, naming the remedy; after the delete, the
 * step is saved again by both.
 */
START_TEST(damaged_of_two_nodes_not_replaced)
{
	struct agent_proc a[2];
	struct ckpt_client *c[2];
	struct ckpt_plan *p[2];
	struct h_model m[2];
	struct ckpt_save *s[2];
	char root[512], shard[600], out[4096];
	int64_t step;

	snprintf(root, sizeof(root), "%s/shared-XXXXXX", getenv("CK_TMPDIR") ?: "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(root));
	for (int r = 0; r < 2; r++) {
		char node[8];

		snprintf(node, sizeof(node), "n%d", r);
		h_agent_start_node(&a[r], root, node, NULL);
		c[r] = h_connect(&a[r]);
		h_model_make(&m[r], c[r], 3, 20001);
		for (size_t i = 0; i < m[r].n; i++) { /* names of its own: no replicas */
			snprintf(m[r].name[i], sizeof(m[r].name[i]), "rank%d.t%zu", r, i);
			m[r].t[i].name = m[r].name[i];
		}
		ck_assert_int_eq(ckpt_plan_create(c[r], "d2", r, 2, m[r].t, m[r].n, &p[r]), 0);
	}
	for (int64_t k = 1; k <= 2; k++) {
		for (int r = 0; r < 2; r++)
			ck_assert_int_eq(ckpt_save(p[r], k, NULL, &s[r]), 0);
		for (int r = 0; r < 2; r++) {
			ck_assert_msg(ckpt_save_wait(s[r], CKPT_COMMITTED, 60000) == 0, "%s",
			              ckpt_save_reason(s[r]));
			ckpt_save_release(s[r]);
		}
	}
	h_shard(&a[0], shard, sizeof(shard), "d2", 2, 0);
	ck_assert_int_eq(unlink(shard), 0);
	ck_assert_int_eq(ckpt_restore(p[0], CKPT_LATEST, &step, NULL), 0);
	ck_assert_int_eq(step, 1);
	ck_assert_int_eq(ckpt_save(p[0], 2, NULL, &s[0]), -EEXIST);
	ck_assert_msg(strstr(ckpt_last_error(c[0]), "several nodes") &&
	                  strstr(ckpt_last_error(c[0]), "ckptctl delete --force d2 2"),
	              "%s", ckpt_last_error(c[0]));
	/* the remedy; the other node learns of the delete as it looks at the root (a list) */
	ck_assert_int_eq(h_ctl(&a[0], out, sizeof(out), "delete --force d2 2"), 0);
	ck_assert_int_eq(h_ctl(&a[1], out, sizeof(out), "list d2"), 0);
	for (int r = 0; r < 2; r++)
		ck_assert_int_eq(ckpt_save(p[r], 2, NULL, &s[r]), 0);
	for (int r = 0; r < 2; r++) {
		ck_assert_msg(ckpt_save_wait(s[r], CKPT_COMMITTED, 60000) == 0, "%s",
		              ckpt_save_reason(s[r]));
		ckpt_save_release(s[r]);
	}
	ck_assert_int_eq(h_ctl(&a[1], out, sizeof(out), "verify d2 2"), 0);
	for (int r = 0; r < 2; r++) {
		ckpt_plan_destroy(p[r]);
		h_model_free(&m[r]);
		ckpt_disconnect(c[r]);
		h_agent_cleanup(&a[r]);
	}
	snprintf(out, sizeof(out), "rm -rf '%s'", root);
	ck_assert_int_eq(system(out), 0);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("damage");
	TCase *tc = tcase_create("damage");

	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, deleted_shard_of_latest);
	tcase_add_test(tc, only_step_damaged);
	tcase_add_loop_test(tc, forged_manifest_at_start, 0, 2);
	tcase_add_test(tc, forged_manifest_running);
	tcase_add_test(tc, removed_while_verifying);
	tcase_add_test(tc, listed_until_removed);
	tcase_add_test(tc, damaged_of_two_nodes_not_replaced);
	tcase_add_loop_test(tc, shard_not_a_file, 0, 2);
	tcase_add_loop_test(tc, step_not_a_directory, 0, 3);
	tcase_add_test(tc, removed_as_latest_was_read);
	suite_add_tcase(s, tc);
	return s;
}
