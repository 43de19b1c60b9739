/*
 * The agent's configuration (agent/daemon/config.c): a good file with every key,
 * each kind of bad file (the message must name the file, the line and the
 * key), unreadable files, groups, flags over the file in either order,
 * defaults with no file, and what `ckptd --check-config` prints and exits
 * with (through config_command_line, which is all main() does with argv).
 */
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/daemon/config.h"
#include "ipc/ipc.h"
#include "ipc/base/log.h"
#include "support/check_main.h"

#define NOGROUP "ckptd-test-no-such-group"

static char dir[256];

static void setup(void)
{
	const char *tmp = getenv("CK_TMPDIR") ? getenv("CK_TMPDIR") : "/tmp";

	snprintf(dir, sizeof(dir), "%s/cfg.XXXXXX", tmp);
	ck_assert_msg(mkdtemp(dir), "mkdtemp %s: %s", dir, strerror(errno));
}

static void teardown(void)
{
	char cmd[300];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}

/* Writes `text` to <dir>/<name>; the path in path (256 bytes). */
static void write_conf(char *path, const char *name, const char *text)
{
	FILE *f;

	snprintf(path, 256, "%s/%s", dir, name);
	f = fopen(path, "w");
	ck_assert_msg(f, "%s: %s", path, strerror(errno));
	ck_assert_int_eq(fwrite(text, 1, strlen(text), f), strlen(text));
	ck_assert_int_eq(fclose(f), 0);
}

/* A group that exists here: the one we run as. */
static const char *some_group(gid_t *gid)
{
	struct group *g = getgrgid(getegid());

	ck_assert_msg(g, "no name for our own group %u", (unsigned)getegid());
	*gid = g->gr_gid;
	return g->gr_name;
}

/* config_parse_args + config_load on argv (NULL-terminated). */
static int load_argv(struct config *c, const char *default_path, char *err, const char **argv)
{
	struct config_args a;
	int argc = 0, rc;

	while (argv[argc])
		argc++;
	rc = config_parse_args(argc, (char **)argv, &a, err);
	ck_assert_msg(rc == 0, "flags refused: %s", err);
	ck_assert_int_eq(config_init(c), 0);
	return config_load(c, &a, default_path, err);
}

/* ---- good files ------------------------------------------------------- */

START_TEST(test_every_key)
{
	char path[256], text[2048], err[IPC_ERRLEN] = "";
	struct config c;
	gid_t gid;
	const char *grp = some_group(&gid);
	const char *argv[] = {"ckptd", "--config", path, NULL};

	snprintf(text, sizeof(text),
	         "# every key\n" /* 1 */
	         "[agent]\n" /* 2 */
	         "listen = unix:/tmp/x/ckptd.sock   # the trainers' socket\n" /* 3 */
	         "socket_mode = 0640\n" /* 4 */
	         "socket_group = %s\n" /* 5 */
	         "log_level = debug   ; inline comment\n" /* 6 */
	         "stop_timeout = 300\n" /* 7 */
	         "[storage]\n" /* 8 */
	         "root = /srv/ckpt\t# shared by the job's nodes\n" /* 9 */
	         "io_engine = pwrite\n" /* 10 */
	         "queue_depth = 32\n" /* 11 */
	         "[staging]\n" /* 12 */
	         "size_mb = 4096\n" /* 13 */
	         "[jobs]\n" /* 14 */
	         "backpressure = skip\n" /* 15 */
	         "keep_last = 3\n" /* 16 */
	         "keep_every = 1000\n" /* 17 */
	         "[metrics]\n" /* 18 */
	         "listen = 127.0.0.1:9464\n" /* 19 */
	         "[cluster]\n" /* 20 */
	         "node = gpu-017.rack3\n" /* 21 */
	         "commit_deadline = 30\n" /* 22 */
	         "abandon_after = 7200\n" /* 23 */
	         "[agent]\n" /* 24 */
	         "admin_group = %s\n" /* 25 */
	         "umask = 077\n" /* 26 */
	         "[limits]\n" /* 27 */
	         "connections_per_user = 10\n" /* 28 */
	         "sessions_per_user = 11\n" /* 29 */
	         "plans_per_user = 12\n" /* 30 */
	         "tensors_per_user = 13\n" /* 31 */
	         "regions_per_user = 14\n" /* 32 */
	         "region_mb_per_user = 15\n" /* 33 */
	         "watchers_per_user = 16\n" /* 34 */
	         "watch_buffer_kb = 17\n" /* 35 */
	         "[s3]\n" /* 36 */
	         "endpoint = https://s3.example.net\n" /* 37 */
	         "region = eu-west-3\n" /* 38 */
	         "credentials = /etc/ckptd/s3#1.key ; a # inside a word stays\n" /* 39 */
	         "addressing = virtual\n" /* 40 */
	         "connections = 4\n" /* 41 */
	         "max_tries = 3\n" /* 42 */
	         "timeout = 9\n" /* 43 */
	         "compress = zstd:2\n" /* 44 */
	         "[upload]\n" /* 45 */
	         "root = s3://bkt/up\n" /* 46 */
	         "keep_last = 5\n" /* 47 */
	         "keep_every = 100\n" /* 48 */
	         "max_mbps = 800\n" /* 49 */
	         "compress = zstd:3\n" /* 50 */
	         "[staging]\n" /* 51 */
	         "chunk_mb = 16\n" /* 52 */
	         "[agent]\n" /* 53 */
	         "capture_threads = 3\n" /* 54 */
	         "copy_threads = 1\n" /* 55 */
	         "[storage]\n" /* 56 */
	         "direct = no\n" /* 57 */
	         "[staging]\n" /* 58 */
	         "lock = off\n" /* 59 */
	         "[storage]\n" /* 60 */
	         "read_once = false\n" /* 61 */
	         "[cluster]\n" /* 62 */
	         "plans_wait = 7\n", /* 63 */
	         grp, grp);
	write_conf(path, "good.conf", text);
	ck_assert_msg(load_argv(&c, NULL, err, argv) == 0, "good file refused: %s", err);
	ck_assert_str_eq(c.cfg.listen, "unix:/tmp/x/ckptd.sock");
	ck_assert_uint_eq(c.cfg.socket_mode, 0640);
	ck_assert_str_eq(c.cfg.socket_group, grp);
	ck_assert_int_eq(c.cfg.socket_gid, (long)gid);
	ck_assert_int_eq(c.cfg.log_level, LOG_DEBUG);
	ck_assert_str_eq(c.cfg.root, "/srv/ckpt");
	ck_assert_int_eq(c.cfg.io_engine, IOENG_PWRITE);
	ck_assert_uint_eq(c.cfg.queue_depth, 32);
	ck_assert_uint_eq(c.cfg.staging_mb, 4096);
	ck_assert_int_eq(c.cfg.backpressure, BACKPRESSURE_SKIP);
	ck_assert_uint_eq(c.cfg.keep_last, 3);
	ck_assert_int_eq(c.cfg.keep_every, 1000);
	ck_assert_str_eq(c.cfg.metrics_listen, "127.0.0.1:9464");
	ck_assert_str_eq(c.cfg.node, "gpu-017.rack3");
	ck_assert_uint_eq(c.cfg.commit_deadline_s, 30);
	ck_assert_uint_eq(c.cfg.plans_wait_s, 7);
	ck_assert_uint_eq(c.cfg.abandon_after_s, 7200);
	ck_assert_uint_eq(c.cfg.stop_timeout_s, 300);
	ck_assert_str_eq(c.cfg.config_path, path);
	ck_assert_int_eq(c.cfg.admin_gid, (long)gid);
	ck_assert_uint_eq(c.cfg.umask, 077);
	ck_assert_uint_eq(c.cfg.lim.connections, 10);
	ck_assert_uint_eq(c.cfg.lim.sessions, 11);
	ck_assert_uint_eq(c.cfg.lim.plans, 12);
	ck_assert_uint_eq(c.cfg.lim.tensors, 13);
	ck_assert_uint_eq(c.cfg.lim.regions, 14);
	ck_assert_uint_eq(c.cfg.lim.region_bytes, 15ull << 20);
	ck_assert_uint_eq(c.cfg.lim.watchers, 16);
	ck_assert_uint_eq(c.cfg.lim.watch_bytes, 17ull << 10);
	ck_assert_str_eq(c.cfg.s3.endpoint, "https://s3.example.net");
	ck_assert_str_eq(c.cfg.s3.region, "eu-west-3");
	ck_assert_str_eq(c.cfg.s3.credentials, "/etc/ckptd/s3#1.key");
	ck_assert(c.cfg.s3.virtual_host);
	ck_assert_uint_eq(c.cfg.s3.connections, 4);
	ck_assert_uint_eq(c.cfg.s3.max_tries, 3);
	ck_assert_uint_eq(c.cfg.s3.timeout_s, 9);
	ck_assert_str_eq(c.cfg.upload.root, "s3://bkt/up");
	ck_assert_uint_eq(c.cfg.upload.keep_last, 5);
	ck_assert_int_eq(c.cfg.upload.keep_every, 100);
	ck_assert_uint_eq(c.cfg.upload.max_mbps, 800);
	ck_assert_int_eq(c.cfg.upload.zstd_level, 3);
	ck_assert_int_eq(c.cfg.s3.zstd_level, 2);
	/* where each came from: the file, at its line */
	{
		static const unsigned lines[CONFIG_NSETTINGS] = {
		    3,  4,  5,  6,  7,  9,  10, 11, 13, 15, 16, 17, 19, 21, 22, 23,
		    25, 26, 28, 29, 30, 31, 32, 33, 34, 35, 37, 38, 39, 40, 41, 42,
		    43, 44, 46, 47, 48, 49, 50, 52, 54, 55, 57, 59, 61, 63};

		for (int s = 0; s < CONFIG_NSETTINGS; s++) {
			ck_assert_msg(c.from[s] == CONFIG_FILE, "setting %d not from the file", s);
			ck_assert_uint_eq(c.line[s], lines[s]);
		}
	}
	/* every flag is a key: the tuning ones too */
	ck_assert_uint_eq(c.cfg.chunk_mb, 16);
	ck_assert_uint_eq(c.cfg.capture_threads, 3);
	ck_assert_int_eq(c.cfg.copy_threads, 1);
	ck_assert(!c.cfg.direct && !c.cfg.lock_pool && !c.cfg.read_once);
	config_free(&c);
}
END_TEST

static void assert_defaults(const struct config *c)
{
	const struct agent_config *a = &c->cfg;

	ck_assert_str_eq(a->root, "/var/lib/ckptd");
	ck_assert_str_eq(a->listen, IPC_DEFAULT_ENDPOINT);
	ck_assert_uint_eq(a->socket_mode, 0660);
	ck_assert_int_eq(a->socket_gid, -1);
	ck_assert_ptr_null(a->socket_group);
	ck_assert_uint_eq(a->staging_mb, 1024);
	ck_assert_uint_eq(a->chunk_mb, 8);
	ck_assert_uint_eq(a->queue_depth, 8);
	ck_assert_int_eq(a->io_engine, IOENG_AUTO);
	ck_assert_int_eq(a->backpressure, BACKPRESSURE_BLOCK);
	ck_assert_uint_eq(a->capture_threads, 2);
	ck_assert_int_eq(a->copy_threads, -1);
	ck_assert_uint_eq(a->commit_deadline_s, 600);
	ck_assert_uint_eq(a->plans_wait_s, 5);
	ck_assert_uint_eq(a->abandon_after_s, 3600);
	ck_assert_uint_eq(a->stop_timeout_s, 0); /* saves in flight finish, however long */
	{
		char host[256] = "";

		ck_assert_int_eq(gethostname(host, sizeof(host) - 1), 0);
		ck_assert_str_eq(a->node, host); /* no node given: the host name */
	}
	ck_assert(a->direct);
	ck_assert(a->lock_pool);
	ck_assert_int_eq(a->log_level, LOG_INFO);
	ck_assert_uint_eq(a->keep_last, 0);
	ck_assert_int_eq(a->keep_every, 0);
	ck_assert_ptr_null(a->metrics_listen);
	for (int s = 0; s < CONFIG_NSETTINGS; s++)
		ck_assert_int_eq(c->from[s], CONFIG_DEFAULT);
}

/* config_print of c, each line without the "; where from" that ends it. */
static char *printed(const struct config *c)
{
	char *buf = NULL, *out, *o;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	ck_assert_ptr_nonnull(f);
	config_print(c, f);
	fclose(f);
	out = o = calloc(1, len + 1);
	ck_assert_ptr_nonnull(out);
	for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
		char *from = NULL;

		for (char *p = strstr(line + 1, "; "); p; p = strstr(p + 1, "; "))
			from = p;
		if (from)
			*from = '\0';
		for (size_t n = strlen(line); n && line[n - 1] == ' '; n--)
			line[n - 1] = '\0';
		o += sprintf(o, "%s\n", line);
	}
	free(buf);
	return out;
}

/*
 * The shipped example (systemd/ckptd.conf.example) says every value in it is
 * the default: loaded, it makes the configuration no file makes, but for
 * socket_group, which the installed unit needs (commented there as not the
 * default; here a group that exists).
 */
START_TEST(test_example_is_defaults)
{
	char path[256], absent[300], line[128], err[IPC_ERRLEN] = "", *text, *at, *ex, *def;
	const char *argv[] = {"ckptd", "--config", path, NULL}, *none[] = {"ckptd", NULL};
	static const char grp_line[] = "\nsocket_group = ckpt\n";
	struct config c, d;
	gid_t gid;
	FILE *f = fopen(CKPT_EXAMPLE_CONF, "r");
	size_t n;

	ck_assert_msg(f, "%s: %s", CKPT_EXAMPLE_CONF, strerror(errno));
	text = calloc(1, 1 << 16);
	n = fread(text, 1, (1 << 16) - 256, f);
	fclose(f);
	text[n] = '\0';
	at = strstr(text, grp_line);
	ck_assert_msg(at, "the example has no '%s'", grp_line + 1);
	snprintf(line, sizeof(line), "\nsocket_group = %s\n", some_group(&gid));
	memmove(at + strlen(line), at + strlen(grp_line), strlen(at + strlen(grp_line)) + 1);
	memcpy(at, line, strlen(line));
	write_conf(path, "example.conf", text);
	ck_assert_msg(load_argv(&c, NULL, err, argv) == 0, "the example refused: %s", err);
	snprintf(absent, sizeof(absent), "%s/absent.conf", dir);
	ck_assert_msg(load_argv(&d, absent, err, none) == 0, "%s", err);
	ex = printed(&c);
	def = printed(&d);
	for (char *e = ex, *g = def; *e || *g;) {
		size_t ne = strcspn(e, "\n"), ng = strcspn(g, "\n");

		if (*e != '#' && strncmp(e, "socket_group = ", 15) != 0 &&
		    strncmp(g, "; socket_group = ", 17) != 0)
			ck_assert_msg(ne == ng && strncmp(e, g, ne) == 0,
			              "the example sets '%.*s', the default is '%.*s'", (int)ne, e,
			              (int)ng, g);
		e += ne + (e[ne] != '\0');
		g += ng + (g[ng] != '\0');
	}
	free(ex);
	free(def);
	free(text);
	config_free(&c);
	config_free(&d);
}
END_TEST

START_TEST(test_defaults_without_file)
{
	char absent[300], err[IPC_ERRLEN] = "";
	const char *argv[] = {"ckptd", NULL};
	struct config c;

	snprintf(absent, sizeof(absent), "%s/absent.conf", dir);
	ck_assert_msg(load_argv(&c, absent, err, argv) == 0, "%s", err);
	assert_defaults(&c);
	ck_assert_ptr_null(c.path);
	ck_assert_ptr_null(c.cfg.config_path);
	config_free(&c);
}
END_TEST

/* With no --config, the default path is read when it exists. */
START_TEST(test_default_path_read)
{
	char path[256], err[IPC_ERRLEN] = "";
	const char *argv[] = {"ckptd", NULL};
	struct config c;

	write_conf(path, "ckptd.conf", "[staging]\nsize_mb = 64\n");
	ck_assert_msg(load_argv(&c, path, err, argv) == 0, "%s", err);
	ck_assert_uint_eq(c.cfg.staging_mb, 64);
	ck_assert_str_eq(c.cfg.config_path, path);
	ck_assert_int_eq(c.from[CS_STAGING_MB], CONFIG_FILE);
	config_free(&c);
	/* and a bad one stops us, as a named one would */
	write_conf(path, "ckptd.conf", "[staging]\nsize_mb = 1\n");
	ck_assert_int_eq(load_argv(&c, path, err, argv), -EINVAL);
	ck_assert_msg(strstr(err, ":2: [staging] size_mb = '1'"), "%s", err);
	config_free(&c);
}
END_TEST

/* Flags win over the file whether they come before or after --config. */
START_TEST(test_flags_override_file)
{
	char path[256], err[IPC_ERRLEN] = "";
	const char *before[] = {"ckptd", "--staging-mb", "32",   "--no-direct", "--config",
	                        path,    "--io-engine",  "auto", NULL};
	const char *after[] = {"ckptd",       "--config", path, "--staging-mb", "32", "--no-direct",
	                       "--io-engine", "auto",     NULL};
	struct config c;

	write_conf(path, "f.conf",
	           "[storage]\nio_engine = pwrite\nqueue_depth = 16\n[staging]\nsize_mb = 64\n");
	ck_assert_msg(load_argv(&c, NULL, err, _i == 0 ? before : after) == 0, "%s", err);
	ck_assert_uint_eq(c.cfg.staging_mb, 32);
	ck_assert_int_eq(c.from[CS_STAGING_MB], CONFIG_FLAG);
	ck_assert_int_eq(c.cfg.io_engine, IOENG_AUTO);
	ck_assert_int_eq(c.from[CS_IO_ENGINE], CONFIG_FLAG);
	ck_assert(!c.cfg.direct);
	ck_assert_int_eq(c.from[CS_DIRECT], CONFIG_FLAG);
	/* what no flag touched stays as the file says */
	ck_assert_uint_eq(c.cfg.queue_depth, 16);
	ck_assert_int_eq(c.from[CS_QUEUE_DEPTH], CONFIG_FILE);
	ck_assert_uint_eq(c.line[CS_QUEUE_DEPTH], 3);
	config_free(&c);
}
END_TEST

START_TEST(test_flag_given_twice)
{
	char err[IPC_ERRLEN] = "";
	const char *argv[] = {"ckptd", "--queue-depth", "4", "--queue-depth", "12", NULL};
	struct config c;

	ck_assert_msg(load_argv(&c, NULL, err, argv) == 0, "%s", err);
	ck_assert_uint_eq(c.cfg.queue_depth, 12);
	config_free(&c);
}
END_TEST

/* ---- bad files -------------------------------------------------------- */

struct bad {
	const char *text;
	unsigned line;
	const char *says; /* what the message must contain after "<path>:<line>: " */
};

static const struct bad bad_files[] = {
    /* unknown section, even an empty one, and keys inside one */
    {"[agent]\nlisten = unix:/a\n[bogus]\n", 3, "[bogus]: unknown section"},
    {"[Agent]\nlisten = unix:/a\n", 1, "[Agent]: unknown section"},
    /* unknown key; a key in the wrong section */
    {"[agent]\nlisten = unix:/a\nlisten_addr = x\n", 3,
     "[agent] listen_addr: unknown key (keys of [agent]: listen, socket_mode"},
    {"[storage]\nchunk_mb = 8\n", 2, "[storage] chunk_mb: unknown key"},
    /* a switch says yes or no */
    {"[storage]\ndirect = maybe\n", 2, "[storage] direct = 'maybe': expected yes or no"},
    {"[staging]\nlock =\n", 2, "[staging] lock = '': expected yes or no"},
    {"[storage]\nsize_mb = 64\n", 2, "[storage] size_mb: unknown key"},
    /* bad values, one per kind */
    {"[staging]\nsize_mb = lots\n", 2,
     "[staging] size_mb = 'lots': expected a whole number in 16..4194304"},
    {"[staging]\nsize_mb = 15\n", 2, "[staging] size_mb = '15': expected a whole number in 16"},
    {"[staging]\nsize_mb = 4194305\n", 2, "[staging] size_mb = '4194305': expected a whole"},
    {"[staging]\nsize_mb = 64k\n", 2, "[staging] size_mb = '64k': expected a whole number"},
    {"[storage]\nqueue_depth = 0\n", 2,
     "[storage] queue_depth = '0': expected a whole number in 1..256"},
    {"[jobs]\nkeep_last = -1\n", 2, "[jobs] keep_last = '-1': expected a whole number in 0.."},
    {"[jobs]\nkeep_every = 1000000000000\n", 2,
     "[jobs] keep_every = '1000000000000': expected a whole number in 0..999999999999"},
    {"[agent]\nsocket_mode = 0999\n", 2,
     "[agent] socket_mode = '0999': expected an octal mode in 0..0777"},
    {"[agent]\nsocket_mode = 01777\n", 2, "[agent] socket_mode = '01777': expected an octal"},
    {"[agent]\nlog_level = loud\n", 2,
     "[agent] log_level = 'loud': expected error, warning, notice, info or debug"},
    {"[storage]\nio_engine = aio\n", 2,
     "[storage] io_engine = 'aio': expected auto, io_uring or pwrite"},
    {"[jobs]\nbackpressure = wait\n", 2, "[jobs] backpressure = 'wait': expected block or skip"},
    {"[agent]\nlisten = /run/ckptd.sock\n", 2,
     "[agent] listen = '/run/ckptd.sock': expected unix:PATH"},
    {"[storage]\nroot =\n", 2, "[storage] root = '': expected a value"},
    {"[agent]\nsocket_group =\n", 2, "[agent] socket_group = '': expected a group name"},
    {"[metrics]\nlisten = localhost\n", 2, "[metrics] listen = 'localhost': expected HOST:PORT"},
    {"[metrics]\nlisten = 127.0.0.1:0\n", 2,
     "[metrics] listen = '127.0.0.1:0': expected a port in 1..65535"},
    {"[metrics]\nlisten = 127.0.0.1:http\n", 2,
     "[metrics] listen = '127.0.0.1:http': expected a port"},
    {"[metrics]\nlisten = ::1:9464\n", 2, "an IPv6 address goes in brackets"},
    /* node names as job names: no '/', not '..', at most 64 characters */
    {"[cluster]\nnode = a/b\n", 2, "[cluster] node = 'a/b': node name 'a/b' has '/' at byte 1"},
    {"[cluster]\nnode = ..\n", 2, "node name '..' begins with '.'"},
    {"[cluster]\nnode = .hidden\n", 2, "node name '.hidden' begins with '.'"},
    {"[cluster]\nnode = n 1\n", 2, "node name 'n 1' has ' ' at byte 1"},
    {"[cluster]\nnode = "
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\n",
     2, "is longer than 64 characters"},
    {"[cluster]\ncommit_deadline = 0\n", 2,
     "[cluster] commit_deadline = '0': expected a whole number in 1..604800"},
    {"[cluster]\nabandon_after = soon\n", 2, "[cluster] abandon_after = 'soon': expected"},
    /* a key set twice, in one section or in the section opened again */
    {"[staging]\nsize_mb = 64\nsize_mb = 128\n", 3,
     "[staging] size_mb: set twice (first on line 2)"},
    {"[jobs]\nkeep_last = 1\n[agent]\n[jobs]\nkeep_last = 2\n", 5,
     "[jobs] keep_last: set twice (first on line 2)"},
    /* malformed lines */
    {"[storage]\nroot /srv\n", 2, "'root /srv': expected key = value"},
    {"[agent\nlisten = unix:/a\n", 1, "'[agent': a section header without its ']'"},
    {"root = /srv\n[storage]\n", 1, "root: a key before any [section]"},
    {"[agent]\nlisten = unix:/a\n   unix:/b\n", 3, "[agent] listen: an indented line continues"},
    {"[storage]\nroot = "
     "/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
     2, "line longer than"},
    /* the first problem is the one named, wherever inih or we found it */
    {"[agent]\nlog_level = info\nnonsense\n[bogus]\n", 3, "'nonsense': expected key = value"},
    {"[agent]\nlog_level = loud\nnonsense\n", 2, "[agent] log_level = 'loud'"},
};

START_TEST(test_bad_file)
{
	const struct bad *b = &bad_files[_i];
	char path[256], want[512], err[IPC_ERRLEN] = "";
	struct config c;
	int rc;

	write_conf(path, "bad.conf", b->text);
	ck_assert_int_eq(config_init(&c), 0);
	rc = config_read_file(&c, path, err);
	ck_assert_msg(rc == -EINVAL, "file %d (%s) accepted: rc %d", _i, b->text, rc);
	snprintf(want, sizeof(want), "%s:%u: ", path, b->line);
	ck_assert_msg(strncmp(err, want, strlen(want)) == 0,
	              "file %d: '%s' does not start with '%s'", _i, err, want);
	ck_assert_msg(strstr(err, b->says), "file %d: '%s' does not say '%s'", _i, err, b->says);
	config_free(&c);
}
END_TEST

/* A NUL byte is not text: named at its line, not silently cut. */
START_TEST(test_nul_byte)
{
	char path[256], err[IPC_ERRLEN] = "";
	struct config c;
	FILE *f;

	snprintf(path, sizeof(path), "%s/nul.conf", dir);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fwrite("[agent]\nlog_level = info\0debug\n", 1, 31, f);
	fclose(f);
	ck_assert_int_eq(config_init(&c), 0);
	ck_assert_int_eq(config_read_file(&c, path, err), -EINVAL);
	ck_assert_msg(strstr(err, ":2: a NUL byte"), "%s", err);
	config_free(&c);
}
END_TEST

START_TEST(test_unreadable)
{
	char path[300], err[IPC_ERRLEN] = "";
	const char *argv[] = {"ckptd", "--config", path, NULL};
	struct config c;

	/* named with --config and absent: an error, unlike the default path */
	snprintf(path, sizeof(path), "%s/absent.conf", dir);
	ck_assert_int_eq(load_argv(&c, NULL, err, argv), -ENOENT);
	ck_assert_msg(strstr(err, path) && strstr(err, "No such file"), "%s", err);
	config_free(&c);
	/* a directory */
	snprintf(path, sizeof(path), "%s", dir);
	ck_assert_int_eq(load_argv(&c, NULL, err, argv), -EISDIR);
	ck_assert_msg(strstr(err, path) && strstr(err, "a directory"), "%s", err);
	config_free(&c);
	/* larger than 1 MiB: refused, not cut */
	snprintf(path, sizeof(path), "%s/big.conf", dir);
	{
		FILE *f = fopen(path, "w");

		ck_assert_ptr_nonnull(f);
		for (int i = 0; i < 40000; i++)
			fputs("; a comment line, repeated to make the file large\n", f);
		ck_assert_int_eq(fclose(f), 0);
	}
	ck_assert_int_eq(load_argv(&c, NULL, err, argv), -EFBIG);
	ck_assert_msg(strstr(err, path) && strstr(err, "larger than 1 MiB"), "%s", err);
	config_free(&c);
	/* /dev/null: no settings, and that is fine */
	snprintf(path, sizeof(path), "/dev/null");
	ck_assert_msg(load_argv(&c, NULL, err, argv) == 0, "%s", err);
	assert_defaults(&c);
	config_free(&c);
	/* no permission (root reads anything: that part needs another user) */
	if (geteuid() != 0) {
		snprintf(path, sizeof(path), "%s/secret.conf", dir);
		write_conf(path, "secret.conf", "[staging]\nsize_mb = 64\n");
		ck_assert_int_eq(chmod(path, 0), 0);
		ck_assert_int_eq(load_argv(&c, NULL, err, argv), -EACCES);
		ck_assert_msg(strstr(err, path) && strstr(err, "Permission denied"), "%s", err);
		config_free(&c);
	}
}
END_TEST

START_TEST(test_groups)
{
	char path[256], err[IPC_ERRLEN] = "";
	const char *from_file[] = {"ckptd", "--config", path, NULL};
	const char *from_flag[] = {"ckptd", "--socket-group", NOGROUP, NULL};
	const char *good_flag[] = {"ckptd", "--config", path, "--socket-group", NULL, NULL};
	struct config c;
	gid_t gid;

	write_conf(path, "g.conf", "[agent]\nlog_level = info\nsocket_group = " NOGROUP "\n");
	ck_assert_int_eq(load_argv(&c, NULL, err, from_file), -ENOENT);
	ck_assert_msg(strstr(err, ":3: [agent] socket_group = '" NOGROUP "': no such group"), "%s",
	              err);
	ck_assert_msg(strncmp(err, path, strlen(path)) == 0, "%s", err);
	config_free(&c);
	ck_assert_int_eq(load_argv(&c, NULL, err, from_flag), -ENOENT);
	ck_assert_str_eq(err, "--socket-group '" NOGROUP "': no such group");
	config_free(&c);
	/* the flag's good group wins over the file's bad one */
	good_flag[4] = some_group(&gid);
	ck_assert_msg(load_argv(&c, NULL, err, good_flag) == 0, "%s", err);
	ck_assert_int_eq(c.cfg.socket_gid, (long)gid);
	config_free(&c);
}
END_TEST

/* ---- flags ------------------------------------------------------------ */

struct bad_flags {
	const char *argv[4];
	const char *says;
};

static const struct bad_flags bad_flags[] = {
    {{"--staging-mb", "lots"}, "--staging-mb 'lots': expected a whole number in 16..4194304"},
    {{"--staging-mb", "8"}, "--staging-mb '8': expected a whole number in 16..4194304"},
    {{"--socket-mode", "0999"}, "--socket-mode '0999': expected an octal mode in 0..0777"},
    {{"--io-engine", "aio"}, "--io-engine 'aio': expected auto, io_uring or pwrite"},
    {{"--backpressure", "wait"}, "--backpressure 'wait': expected block or skip"},
    {{"--log-level", "loud"}, "--log-level 'loud': expected error, warning, notice, info or debug"},
    {{"--listen", "tcp:1"}, "--listen 'tcp:1': expected unix:PATH"},
    {{"--metrics-listen", "9464"},
     "--metrics-listen '9464': expected HOST:PORT, e.g. 127.0.0.1:9464"},
    {{"--chunk-mb", "2048"}, "--chunk-mb '2048': expected a whole number in 1..1024"},
    {{"--bogus"}, "unknown option '--bogus'"},
    {{"--root"}, "--root needs a value"},
    {{"--root", "/a", "extra"}, "unexpected argument 'extra'"},
    {{"--node", "../n1"},
     "--node '../n1': node name '../n1' has '/' at byte 2: use letters, digits, "
     "'.', '_' and '-' only"},
    {{"--node", ".."},
     "--node '..': node name '..' begins with '.': names beginning with '.' are the agent's "
     "own"},
    {{"--node", ""}, "--node '': node name is empty"},
    {{"--commit-timeout", "0"}, "--commit-deadline '0': expected a whole number in 1..604800"},
};

START_TEST(test_bad_flag)
{
	const struct bad_flags *b = &bad_flags[_i];
	const char *argv[6] = {"ckptd"};
	char err[IPC_ERRLEN] = "";
	struct config_args a;
	int argc = 1;

	for (int i = 0; b->argv[i]; i++)
		argv[argc++] = b->argv[i];
	ck_assert_int_eq(config_parse_args(argc, (char **)argv, &a, err), -EINVAL);
	ck_assert_str_eq(err, b->says);
}
END_TEST

/* A node name of 10,000 characters: refused, and the message stays short. */
START_TEST(test_node_too_long)
{
	static char node[10001];
	const char *argv[] = {"ckptd", "--node", node, NULL};
	char err[IPC_ERRLEN] = "";
	struct config_args a;

	memset(node, 'n', sizeof(node) - 1);
	ck_assert_int_eq(config_parse_args(3, (char **)argv, &a, err), -EINVAL);
	ck_assert_msg(strstr(err, "is longer than 64 characters"), "%s", err);
	ck_assert_uint_lt(strlen(err), 400);
}
END_TEST

/* Uncommitted steps are abandoned only well after any commit could still happen. */
START_TEST(test_abandon_vs_deadline)
{
	const char *argv[] = {"ckptd", "--commit-deadline", "600", "--abandon-after", "1000", NULL};
	char err[IPC_ERRLEN] = "";
	struct config c;

	ck_assert_int_eq(load_argv(&c, NULL, err, argv), -EINVAL);
	ck_assert_msg(strstr(err, "abandon_after (1000 s) must be at least twice commit_deadline "
	                          "(600 s)"),
	              "%s", err);
	config_free(&c);
}
END_TEST

/* An s3:// root is checked before anything starts: its name, its endpoint, its parts. */
static struct {
	const char *argv[12];
	const char *want;
} s3_roots[] = {
    {{"ckptd", "--root", "s3://b", NULL}, "a bucket name has 3 to 63 characters"},
    {{"ckptd", "--root", "s3://Big_Bucket/p", NULL}, "lower-case letters, digits"},
    {{"ckptd", "--root", "s3://bkt/a/../b", NULL}, "'..' component in the prefix"},
    {{"ckptd", "--root", "s3://bkt/a b", NULL}, "(byte 10 is 0x20)"},
    {{"ckptd", "--root", "s3://bkt/p", NULL}, "set [s3] endpoint"},
    {{"ckptd", "--root", "s3://bkt/p", "--s3-endpoint", "http://h:1", NULL},
     "set [s3] credentials = FILE"},
    {{"ckptd", "--root", "s3://bkt/p", "--s3-endpoint", "http://h:1", "--s3-credentials", "/k",
      "--chunk-mb", "4", NULL},
     "S3 parts are at least 5 MiB"},
    {{"ckptd", "--root", "s3://bkt/p", "--upload-root", "s3://bkt/q", NULL},
     "is an object store already"},
    {{"ckptd", "--upload-root", "/mnt/other", NULL}, "expected s3://BUCKET[/PREFIX]"},
    {{"ckptd", "--upload-root", "s3://bkt/q", "--s3-endpoint", "http://h:1", NULL},
     "s3://bkt/q: set [s3] credentials"},
    {{"ckptd", "--upload-root", "s3://bkt/q", "--upload-compress", "lz4", NULL},
     "[upload] compress = lz4: expected off, zstd or zstd:LEVEL (1 to 19)"},
    {{"ckptd", "--upload-root", "s3://bkt/q", "--upload-compress", "zstd:0", NULL},
     "expected off, zstd or zstd:LEVEL"},
    {{"ckptd", "--upload-root", "s3://bkt/q", "--upload-compress", "zstd:20", NULL},
     "expected off, zstd or zstd:LEVEL"},
    {{"ckptd", "--upload-root", "s3://bkt/q", "--upload-compress", "zstd:3x", NULL},
     "expected off, zstd or zstd:LEVEL"},
    {{"ckptd", "--upload-compress", "zstd", NULL}, "there is no upload tier"},
};

START_TEST(test_s3_root)
{
	char err[IPC_ERRLEN] = "";
	struct config c;

	ck_assert_int_eq(load_argv(&c, NULL, err, s3_roots[_i].argv), -EINVAL);
	ck_assert_msg(strstr(err, s3_roots[_i].want), "%s: %s", s3_roots[_i].want, err);
	config_free(&c);
}
END_TEST

START_TEST(test_s3_root_good)
{
	const char *argv[] = {"ckptd",
	                      "--root",
	                      "s3://my-bkt.1/a/b-c/",
	                      "--s3-endpoint",
	                      "http://127.0.0.1:1",
	                      "--s3-credentials",
	                      "/etc/ckptd/s3.key",
	                      "--s3-compress",
	                      "zstd",
	                      NULL};
	char err[IPC_ERRLEN] = "", bucket[64], prefix[256];
	struct config c;

	ck_assert_msg(load_argv(&c, NULL, err, argv) == 0, "%s", err);
	ck_assert_uint_eq(c.cfg.s3.connections, 16);
	ck_assert_uint_eq(c.cfg.s3.max_tries, 8);
	ck_assert_str_eq(c.cfg.s3.region, "us-east-1");
	ck_assert(!c.cfg.s3.virtual_host);
	ck_assert_int_eq(c.cfg.s3.zstd_level, 1); /* zstd alone: level 1, where it pays most */
	ck_assert_int_eq(c.cfg.upload.zstd_level, 1); /* no tier; it would follow [s3] */
	ck_assert_int_eq(
	    s3_root_parse(c.cfg.root, bucket, sizeof(bucket), prefix, sizeof(prefix), err), 0);
	ck_assert_str_eq(bucket, "my-bkt.1");
	ck_assert_str_eq(prefix, "a/b-c");
	config_free(&c);
}
END_TEST

/* --commit-timeout, the single-node name, is --commit-deadline. */
START_TEST(test_commit_timeout_alias)
{
	const char *argv[] = {"ckptd", "--commit-timeout", "7", "--node", "n-1", NULL};
	char err[IPC_ERRLEN] = "";
	struct config c;

	ck_assert_msg(load_argv(&c, NULL, err, argv) == 0, "%s", err);
	ck_assert_uint_eq(c.cfg.commit_deadline_s, 7);
	ck_assert_int_eq(c.from[CS_COMMIT_DEADLINE], CONFIG_FLAG);
	ck_assert_str_eq(c.cfg.node, "n-1");
	config_free(&c);
}
END_TEST

START_TEST(test_hostport)
{
	char host[64], why[128];
	unsigned port = 0;

	ck_assert_int_eq(
	    config_split_hostport("127.0.0.1:9464", host, sizeof(host), &port, why, sizeof(why)),
	    0);
	ck_assert_str_eq(host, "127.0.0.1");
	ck_assert_uint_eq(port, 9464);
	ck_assert_int_eq(
	    config_split_hostport("[::1]:80", host, sizeof(host), &port, why, sizeof(why)), 0);
	ck_assert_str_eq(host, "::1");
	ck_assert_uint_eq(port, 80);
	ck_assert_int_eq(
	    config_split_hostport("localhost:65535", host, sizeof(host), &port, why, sizeof(why)),
	    0);
	ck_assert_str_eq(host, "localhost");
	static const char *const bad[] = {":80",      "host:",    "host:65536", "[::1]80", "[::1]",
	                                  "host:+80", "host: 80", "[]:80",      "a:b:80",  ""};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(config_split_hostport(bad[i], host, sizeof(host), &port, why,
		                                    sizeof(why)) == -EINVAL,
		              "'%s' accepted", bad[i]);
}
END_TEST

/* ---- the command line as main() runs it -------------------------------- */

struct run {
	int rc;
	char *out, *errs;
	struct config c;
};

static void run(struct run *r, const char **argv)
{
	size_t olen, elen;
	FILE *out = open_memstream(&r->out, &olen);
	FILE *errs = open_memstream(&r->errs, &elen);
	char absent[300];
	int argc = 0;

	ck_assert(out && errs);
	while (argv[argc])
		argc++;
	snprintf(absent, sizeof(absent), "%s/absent.conf", dir);
	r->rc = config_command_line(argc, (char **)argv, absent, &r->c, out, errs);
	fclose(out);
	fclose(errs);
}

static void run_free(struct run *r)
{
	config_free(&r->c);
	free(r->out);
	free(r->errs);
}

/* Whether `text` has a line starting with `start` and containing `also`. */
static bool has_line(const char *text, const char *start, const char *also)
{
	for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t)(nl - p) : strlen(p);
		char line[1024];

		snprintf(line, sizeof(line), "%.*s", (int)n, p);
		if (strncmp(line, start, strlen(start)) == 0 && strstr(line, also))
			return true;
	}
	return false;
}

START_TEST(test_check_config_prints)
{
	char path[256], want[300], again[256], err[IPC_ERRLEN] = "";
	const char *argv[] = {"ckptd", "--check-config", "--config", path, "--keep-last", "5",
	                      NULL};
	struct config back;
	struct run r;

	write_conf(path, "c.conf",
	           "[storage]\nio_engine = pwrite\n\n[staging]\nsize_mb = 64\n"
	           "[metrics]\nlisten = [::1]:9100\n");
	run(&r, argv);
	ck_assert_msg(r.rc == 0, "rc %d: %s", r.rc, r.errs);
	ck_assert_str_eq(r.errs, "");
	/* every key, in its section, with where it came from */
	snprintf(want, sizeof(want), "; %s:5", path);
	ck_assert_msg(has_line(r.out, "size_mb = 64 ", want), "%s", r.out);
	snprintf(want, sizeof(want), "; %s:2", path);
	ck_assert_msg(has_line(r.out, "io_engine = pwrite ", want), "%s", r.out);
	snprintf(want, sizeof(want), "; %s:7", path);
	ck_assert_msg(has_line(r.out, "listen = [::1]:9100 ", want), "%s", r.out);
	ck_assert_msg(has_line(r.out, "keep_last = 5 ", "; flag --keep-last"), "%s", r.out);
	ck_assert_msg(has_line(r.out, "backpressure = block ", "; default"), "%s", r.out);
	ck_assert_msg(has_line(r.out, "socket_mode = 0660 ", "; default"), "%s", r.out);
	ck_assert_msg(has_line(r.out, "root = /var/lib/ckptd ", "; default"), "%s", r.out);
	ck_assert_msg(has_line(r.out, "; socket_group = (not set", "; default"), "%s", r.out);
	ck_assert_msg(has_line(r.out, "chunk_mb = 8 ", "; default"), "%s", r.out);
	ck_assert_msg(has_line(r.out, "copy_threads = auto ", "; default"), "%s", r.out);
	ck_assert_msg(has_line(r.out, "direct = yes ", "; default"), "%s", r.out);
	for (int s = 0; s < CONFIG_NSETTINGS; s++) {
		static const char *const keys[] = {"listen",
		                                   "socket_mode",
		                                   "socket_group",
		                                   "log_level",
		                                   "stop_timeout",
		                                   "root",
		                                   "io_engine",
		                                   "queue_depth",
		                                   "size_mb",
		                                   "backpressure",
		                                   "keep_last",
		                                   "keep_every",
		                                   "listen",
		                                   "node",
		                                   "commit_deadline",
		                                   "abandon_after",
		                                   "admin_group",
		                                   "umask",
		                                   "connections_per_user",
		                                   "sessions_per_user",
		                                   "plans_per_user",
		                                   "tensors_per_user",
		                                   "regions_per_user",
		                                   "region_mb_per_user",
		                                   "watchers_per_user",
		                                   "watch_buffer_kb",
		                                   "endpoint",
		                                   "region",
		                                   "credentials",
		                                   "addressing",
		                                   "connections",
		                                   "max_tries",
		                                   "timeout",
		                                   "compress",
		                                   "root",
		                                   "keep_last",
		                                   "keep_every",
		                                   "max_mbps",
		                                   "compress",
		                                   "chunk_mb",
		                                   "capture_threads",
		                                   "copy_threads",
		                                   "direct",
		                                   "lock",
		                                   "read_once",
		                                   "plans_wait"};
		char key[64];

		snprintf(key, sizeof(key), "%s = ", keys[s]);
		ck_assert_msg(strstr(r.out, key), "no %s in %s", keys[s], r.out);
	}
	ck_assert(strstr(r.out, "\n[agent]\n") && strstr(r.out, "\n[storage]\n") &&
	          strstr(r.out, "\n[staging]\n") && strstr(r.out, "\n[jobs]\n") &&
	          strstr(r.out, "\n[metrics]\n") && strstr(r.out, "\n[cluster]\n"));
	ck_assert_msg(has_line(r.out, "node = ", "; default: the host name"), "%s", r.out);
	/* and it is a config file that says the same again */
	write_conf(again, "again.conf", r.out);
	ck_assert_int_eq(config_init(&back), 0);
	ck_assert_msg(config_read_file(&back, again, err) == 0, "%s\n%s", err, r.out);
	for (int s = 0; s < CONFIG_NSETTINGS; s++) {
		ck_assert_msg(back.num[s] == r.c.num[s], "setting %d: %lld, printed %lld", s,
		              r.c.num[s], back.num[s]);
		ck_assert_msg(!back.str[s] == !r.c.str[s] &&
		                  (!back.str[s] || strcmp(back.str[s], r.c.str[s]) == 0),
		              "setting %d: '%s', printed '%s'", s, r.c.str[s], back.str[s]);
	}
	config_free(&back);
	run_free(&r);
}
END_TEST

START_TEST(test_command_line_exits)
{
	char path[256], want[512];
	const char *check_bad[] = {"ckptd", "--check-config", "--config", path, NULL};
	const char *run_bad[] = {"ckptd", "--config", path, NULL};
	const char *bad_flag[] = {"ckptd", "--check-config", "--queue-depth", "0", NULL};
	const char *help[] = {"ckptd", "--help", NULL};
	const char *version[] = {"ckptd", "--version", NULL};
	const char *good[] = {"ckptd", "--root", "/srv", NULL};
	struct run r;

	write_conf(path, "x.conf", "[agent]\nlog_level = info\n\n[staging]\nsize_mb = lots\n");
	snprintf(want, sizeof(want),
	         "ckptd: %s:5: [staging] size_mb = 'lots': expected a whole number in "
	         "16..4194304\n",
	         path);
	run(&r, check_bad);
	ck_assert_int_eq(r.rc, 1);
	ck_assert_str_eq(r.errs, want);
	ck_assert_str_eq(r.out, "");
	run_free(&r);
	run(&r, run_bad); /* a bad file stops start-up just the same */
	ck_assert_int_eq(r.rc, 1);
	ck_assert_str_eq(r.errs, want);
	run_free(&r);
	run(&r, bad_flag);
	ck_assert_int_eq(r.rc, 2);
	ck_assert_msg(strstr(r.errs, "--queue-depth '0': expected a whole number in 1..256"), "%s",
	              r.errs);
	run_free(&r);
	run(&r, help);
	ck_assert_int_eq(r.rc, 0);
	ck_assert_msg(strstr(r.out, "--config FILE") && strstr(r.out, "--check-config") &&
	                  strstr(r.out, "--metrics-listen HOST:PORT"),
	              "%s", r.out);
	run_free(&r);
	run(&r, version);
	ck_assert_int_eq(r.rc, 0);
	ck_assert_msg(strncmp(r.out, "ckptd ", 6) == 0, "%s", r.out);
	run_free(&r);
	run(&r, good); /* the agent is to run: nothing printed */
	ck_assert_int_eq(r.rc, -1);
	ck_assert_str_eq(r.out, "");
	ck_assert_str_eq(r.errs, "");
	ck_assert_str_eq(r.c.cfg.root, "/srv");
	run_free(&r);
}
END_TEST

Suite *test_suite(void)
{
	Suite *s = suite_create("config");
	TCase *good = tcase_create("good"), *bad = tcase_create("bad"),
	      *cli = tcase_create("command line");

	tcase_add_checked_fixture(good, setup, teardown);
	tcase_add_test(good, test_every_key);
	tcase_add_test(good, test_example_is_defaults);
	tcase_add_test(good, test_defaults_without_file);
	tcase_add_test(good, test_default_path_read);
	tcase_add_loop_test(good, test_flags_override_file, 0, 2);
	tcase_add_test(good, test_flag_given_twice);
	suite_add_tcase(s, good);
	tcase_add_checked_fixture(bad, setup, teardown);
	tcase_add_loop_test(bad, test_bad_file, 0, sizeof(bad_files) / sizeof(bad_files[0]));
	tcase_add_test(bad, test_nul_byte);
	tcase_add_test(bad, test_unreadable);
	tcase_add_test(bad, test_groups);
	suite_add_tcase(s, bad);
	tcase_add_checked_fixture(cli, setup, teardown);
	tcase_add_loop_test(cli, test_bad_flag, 0, sizeof(bad_flags) / sizeof(bad_flags[0]));
	tcase_add_test(cli, test_node_too_long);
	tcase_add_test(cli, test_commit_timeout_alias);
	tcase_add_test(cli, test_abandon_vs_deadline);
	tcase_add_loop_test(cli, test_s3_root, 0, sizeof(s3_roots) / sizeof(s3_roots[0]));
	tcase_add_test(cli, test_s3_root_good);
	tcase_add_test(cli, test_hostport);
	tcase_add_test(cli, test_check_config_prints);
	tcase_add_test(cli, test_command_line_exits);
	suite_add_tcase(s, cli);
	return s;
}
