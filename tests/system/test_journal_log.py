#!/usr/bin/env python3
"""system/journal_log: ckptd's log lines as journald reads them.

Under systemd, stderr is a stream to journald and JOURNAL_STREAM holds its
"<dev>:<ino>"; a line that starts with "<N>" gets priority N. ckptd runs
here with stderr on a file and JOURNAL_STREAM naming that file. Checked:
  - every line starts with a syslog priority "<0>".."<7>" and nothing else
    (no timestamp: journald adds its own);
  - start-up says "<6>" info lines: the effective configuration in one line
    (root, socket, staging size, I/O engine, retention), and "serving";
  - a failure is an error line: a second agent on a root it cannot create
    says "<3>cannot start: ..." and exits 1;
  - with JOURNAL_STREAM naming another file (stderr is not the journal),
    lines carry a UTC timestamp and the level name instead.
Standard library only.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

CKPTD = os.environ["CKPTD_BIN"]
CKPTCTL = os.environ["CKPTCTL_BIN"]

failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


def run_agent(tmp, name, root, journal_stream_of=None, serve=True):
    """Starts ckptd with stderr on <name>.log; JOURNAL_STREAM names the file given
    (the log itself when None). Serves until ckptctl status answers, then SIGTERM.
    Returns (exit status, log text)."""
    path = os.path.join(tmp, name + ".log")
    endpoint = "unix:" + os.path.join(tmp, name + ".sock")
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM")}
    with open(path, "wb") as log:
        st = os.fstat(log.fileno()) if journal_stream_of is None else os.stat(journal_stream_of)
        env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        proc = subprocess.Popen(
            [CKPTD, "--config", "/dev/null", "--root", root, "--listen", endpoint, "--staging-mb", "64", "--chunk-mb", "1",
             "--keep-last", "5"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env)
        try:
            deadline = time.monotonic() + 60
            while serve and time.monotonic() < deadline and proc.poll() is None:
                r = subprocess.run([CKPTCTL, "--endpoint", endpoint, "status"],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, timeout=30)
                if r.returncode == 0:
                    break
                time.sleep(0.1)
            if serve and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    with open(path, encoding="utf-8", errors="replace") as f:
        return rc, f.read()


def main():
    with tempfile.TemporaryDirectory(prefix="jl.", dir="/tmp") as tmp:
        root = os.path.join(tmp, "root")
        rc, text = run_agent(tmp, "journal", root)
        lines = text.splitlines()
        print("  " + "\n  ".join(lines))
        check(rc == 0, f"ckptd exits 0 after SIGTERM (got {rc})")
        check(len(lines) >= 3, f"at least start, serving and stop are logged ({len(lines)} lines)")
        bad = [l for l in lines if not re.match(r"^<[0-7]>[^<\s]", l)]
        check(not bad, f"every line starts with a journald priority <0>..<7> (not: {bad[:3]})")
        stamped = [l for l in lines if re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", l)]
        check(not stamped, f"no timestamps under journald (journald adds its own): {stamped[:2]}")
        info = [l for l in lines if l.startswith("<6>")]
        check(any(l.startswith("<6>serving unix:") for l in info), "an info line <6>serving ...")
        # The effective configuration, in one line: all of it on the same line.
        want = [f"root={root} ", "listen=unix:", "size_mb=64 ", "io_engine=auto ",
                "keep_last=5 ", "backpressure=block ", "socket_mode=0660 ", "log_level=info "]
        config = [l for l in info if all(w in l for w in want)]
        check(len(config) == 1,
              f"one info line with the effective configuration ({' '.join(want)}): {config}")

        # A failure at start-up is an error line, and exit status 1.
        blocker = os.path.join(tmp, "not-a-dir")
        with open(blocker, "w") as f:
            f.write("a file where the root's parent should be\n")
        rc, text = run_agent(tmp, "broken", os.path.join(blocker, "root"), serve=False)
        print("  " + "\n  ".join(text.splitlines()))
        check(rc == 1, f"ckptd on a root it cannot make exits 1 (got {rc})")
        check(any(l.startswith("<3>") and "cannot start" in l for l in text.splitlines()),
              "the failure is logged at error priority: <3>cannot start: ...")

        # stderr is not the journal: JOURNAL_STREAM names some other file.
        other = os.path.join(tmp, "other")
        open(other, "w").close()
        rc, text = run_agent(tmp, "plain", os.path.join(tmp, "root2"), journal_stream_of=other)
        lines = text.splitlines()
        check(rc == 0, f"ckptd exits 0 (got {rc})")
        check(bool(lines) and all(re.match(
            r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ckptd [a-z]+: ", l) for l in lines),
            f"with JOURNAL_STREAM not naming stderr, lines are timestamped: {lines[:2]}")
        check(not any(l.startswith("<") for l in lines), "and carry no <N> prefix")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
