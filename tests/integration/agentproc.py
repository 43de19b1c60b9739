"""A real ckptd for the Python integration tests: started in a temporary
directory (with more environment where given: a CKPT_FAULTS plan), ready
once `ckptctl status` answers, stopped with SIGTERM (or killed and started
again on the same root and socket)."""

import os
import signal
import subprocess
import tempfile
import time


class Agent:
    def __init__(self, ckptd, ckptctl, tmp, env=None):
        self.ckptd, self.ckptctl = ckptd, ckptctl
        self.env = dict(os.environ, **env) if env else None
        self.root = os.path.join(tmp, "root")
        self.endpoint = "unix:" + os.path.join(tmp, "ckptd.sock")
        self.log_path = os.path.join(tmp, "agent.log")
        self.log = open(self.log_path, "ab")
        self.proc = self._spawn()

    def _spawn(self):
        return subprocess.Popen(
            [self.ckptd, "--config", "/dev/null",  # not the host's /etc/ckptd/ckptd.conf
             "--root", self.root, "--listen", self.endpoint,
             "--staging-mb", "64", "--chunk-mb", "1"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)

    def kill(self):
        """SIGKILL and wait: the agent crashes."""
        self.proc.kill()
        self.proc.wait()

    def restart(self):
        """Starts it again on the same root and socket, once it is down; waits until it answers."""
        assert self.proc.poll() is not None, "restart of a running agent"
        self.proc = self._spawn()
        self.wait_ready()

    def log_tail(self):
        with open(self.log_path, "rb") as f:
            return f.read()[-4000:].decode(errors="replace")

    def log_has(self, text):
        with open(self.log_path, "rb") as f:
            return text.encode() in f.read()

    def wait_ready(self, seconds=30):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ckptd exited at start with {self.proc.returncode}:\n"
                                   + self.log_tail())
            r = subprocess.run([self.ckptctl, "--endpoint", self.endpoint, "status"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=30)
            if r.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"ckptd did not answer 'ckptctl status' within {seconds} s:\n"
                           + self.log_tail())

    def stop(self):
        """SIGTERM and wait; returns the exit status (None if it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self.log.close()
                return None
        self.log.close()
        return self.proc.returncode


def fault_injection():
    """Whether the agent under test takes CKPT_FAULTS (a build with
    -DCKPT_FAULT_INJECTION=ON: ctest says so in $CKPT_FAULT_INJECTION)."""
    return os.environ.get("CKPT_FAULT_INJECTION") == "1"


def run_tests(prefix, *tests, env=None):
    """Starts an agent in a new temporary directory (under $CK_TMPDIR,
    named prefix..., with `env` added to its environment), runs each
    test(agent) against it in turn, prints the agent's log if one fails, and
    stops it: it must exit 0."""
    tmp = tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("CK_TMPDIR"))
    agent = Agent(os.environ["CKPTD_BIN"], os.environ["CKPTCTL_BIN"], tmp, env)
    try:
        agent.wait_ready()
        for test in tests:
            test(agent)
    except BaseException:
        print(agent.log_tail())
        raise
    finally:
        rc = agent.stop()
    assert rc == 0, "ckptd exited %s" % rc
