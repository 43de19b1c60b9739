/* bench_ranks.h: fork, a pipe, the lines back, every rank waited for. */
#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>

#include "bench/bench_ranks.h"

int fanout(int world, fanout_rank_fn fn, void *arg, fanout_line_fn line, void *acc)
{
	pid_t pid[FANOUT_MAX];
	char buf[256];
	int fds[2], rc = 0, n = 0;
	FILE *f;

	if (world < 1 || world > FANOUT_MAX || pipe(fds))
		return -1;
	for (; n < world; n++) {
		pid[n] = fork();
		if (pid[n] < 0)
			break;
		if (pid[n] == 0) {
			close(fds[0]);
			_exit(fn(n, world, arg, fds[1]));
		}
	}
	close(fds[1]);
	f = fdopen(fds[0], "r");
	while (f && fgets(buf, sizeof(buf), f))
		line(buf, acc);
	if (f)
		fclose(f);
	else
		close(fds[0]);
	for (int k = 0; k < n; k++) {
		int st;

		if (waitpid(pid[k], &st, 0) != pid[k] || !WIFEXITED(st) || WEXITSTATUS(st))
			rc = -1;
	}
	return n == world ? rc : -1;
}
