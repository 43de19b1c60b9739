#!/usr/bin/env python3
"""system/sd_notify: ckptd speaks sd_notify(3) the way a Type=notify unit needs.

ckptd runs with NOTIFY_SOCKET naming a Unix datagram socket this test
listens on (as systemd would), and WATCHDOG_USEC set. Checked:
  - READY=1 arrives, and at that moment `ckptctl status` answers at once
    (the socket is served: READY is not early); the sender is ckptd's own
    pid (SCM_CREDENTIALS: what NotifyAccess=main accepts);
  - STATUS= lines: the first says "serving <endpoint>"; after a trainer
    (ckpt_fixture) saves a step, one says "0 clients, 0 saves in flight,
    1 committed"; an idle agent sends no STATUS= twice in a row (sent only
    when the text changes);
  - WATCHDOG=1 about once a second while WATCHDOG_USEC is set;
  - at SIGTERM: STOPPING=1, then a clean exit (0);
  - without NOTIFY_SOCKET the same agent starts, serves and stops (exit 0).
Standard library only.
"""
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

CKPTD = os.environ["CKPTD_BIN"]
CKPTCTL = os.environ["CKPTCTL_BIN"]
FIXTURE = os.environ["CKPT_FIXTURE_BIN"]

failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)
    return ok


class Listener:
    """systemd's side of NOTIFY_SOCKET: datagrams with the sender's credentials."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.messages = []  # (monotonic time, pid, {key: value}, raw text)

    def receive(self, timeout):
        """Next message, or None after timeout seconds."""
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data, anc, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
        except socket.timeout:
            return None
        pid = None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid, _, _ = struct.unpack("iII", payload[:12])
        text = data.decode()
        fields = {}
        for line in text.split("\n"):
            if "=" in line:
                k, v = line.split("=", 1)
                fields[k] = v
        msg = (time.monotonic(), pid, fields, text)
        self.messages.append(msg)
        return msg

    def wait_for(self, key, seconds, value_has=None):
        """Receives until a message sets key (whose value contains value_has)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg = self.receive(deadline - time.monotonic())
            if msg and key in msg[2] and (value_has is None or value_has in msg[2][key]):
                return msg
        return None

    def drain(self, seconds):
        """Everything that arrives within seconds."""
        got = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg = self.receive(deadline - time.monotonic())
            if msg:
                got.append(msg)
        return got


def start_agent(tmp, name, env):
    endpoint = "unix:" + os.path.join(tmp, name + ".sock")
    log = open(os.path.join(tmp, name + ".log"), "wb")
    proc = subprocess.Popen(
        [CKPTD, "--config", "/dev/null", "--root", os.path.join(tmp, name + "-root"), "--listen", endpoint,
         "--staging-mb", "64", "--chunk-mb", "1"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
    return proc, endpoint, log


def log_of(tmp, name):
    with open(os.path.join(tmp, name + ".log"), "rb") as f:
        return f.read()[-4000:].decode(errors="replace")


def ctl_status(endpoint):
    return subprocess.run([CKPTCTL, "--endpoint", endpoint, "status"], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None
    return proc.returncode


def under_systemd(tmp):
    listener = Listener(os.path.join(tmp, "notify.sock"))
    env = dict(os.environ)
    env["NOTIFY_SOCKET"] = os.path.join(tmp, "notify.sock")
    env["WATCHDOG_USEC"] = "3000000"
    env.pop("WATCHDOG_PID", None)
    proc, endpoint, log = start_agent(tmp, "agent", env)
    try:
        ready = listener.wait_for("READY", 60)
        if not check(ready is not None, "READY=1 arrives within 60 s"):
            print(log_of(tmp, "agent"))
            return
        # At READY the socket must already be served: one try, no retries. A raw
        # connect first, microseconds after READY, then a real call.
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(endpoint[len("unix:"):])
            connected = None
        except OSError as e:
            connected = e
        finally:
            probe.close()
        check(connected is None, f"the socket accepts connections when READY=1 arrives ({connected})")
        r = ctl_status(endpoint)
        check(r.returncode == 0,
              f"ckptctl status answers at the moment READY=1 arrives (exit {r.returncode}: "
              f"{r.stdout.decode(errors='replace').strip()[:200]})")
        check(ready[1] == proc.pid, f"READY=1 comes from ckptd's pid {proc.pid} (got {ready[1]})")
        check(ready[2].get("STATUS", "").startswith("serving " + endpoint),
              f"READY=1 carries STATUS=serving {endpoint} (got {ready[3]!r})")
        before = listener.messages[:listener.messages.index(ready)]
        check(not any("READY" in m[2] or "STATUS" in m[2] for m in before),
              "no READY or STATUS before READY=1")

        # A trainer saves a step; the STATUS line counts it once it has left.
        fx = subprocess.run([FIXTURE, "--endpoint", endpoint, "--job", "notify", "--step", "7",
                             "--seed", "3"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, timeout=300)
        check(fx.returncode == 0, f"ckpt_fixture saved step 7 (exit {fx.returncode})")
        want = "serving %s: 0 clients, 0 saves in flight, 1 committed" % endpoint
        got = listener.wait_for("STATUS", 10, value_has=want)
        check(got is not None and got[2]["STATUS"] == want,
              f"STATUS={want!r} arrives after the save (last: "
              f"{[m[3] for m in listener.messages if 'STATUS' in m[2]][-3:]!r})")

        # Idle: watchdog pings, and no STATUS= repeated.
        idle = listener.drain(4.5)
        pings = [m for m in idle if m[2].get("WATCHDOG") == "1"]
        check(len(pings) >= 3, f"WATCHDOG=1 about once a second ({len(pings)} in 4.5 s)")
        check(all(m[1] == proc.pid for m in pings), "WATCHDOG=1 from ckptd's pid")
        statuses = [m[2]["STATUS"] for m in listener.messages if "STATUS" in m[2]]
        repeats = [a for a, b in zip(statuses, statuses[1:]) if a == b]
        check(not repeats, f"no STATUS= sent twice in a row ({len(statuses)} sent: {statuses})")

        proc.send_signal(signal.SIGTERM)
        stopping = listener.wait_for("STOPPING", 30)
        check(stopping is not None, "STOPPING=1 arrives after SIGTERM")
        if stopping:
            check(stopping[2].get("STATUS", "").startswith("stopping"),
                  f"STOPPING=1 carries a STATUS=stopping... line (got {stopping[3]!r})")
        rc = stop(proc)
        check(rc == 0, f"ckptd exits 0 after SIGTERM (got {rc})")
        if failures:
            print(log_of(tmp, "agent"))
    finally:
        stop(proc)
        log.close()
        listener.sock.close()


def outside_systemd(tmp):
    env = {k: v for k, v in os.environ.items()
           if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    proc, endpoint, log = start_agent(tmp, "plain", env)
    try:
        deadline = time.monotonic() + 60
        ok = False
        while time.monotonic() < deadline and proc.poll() is None:
            if ctl_status(endpoint).returncode == 0:
                ok = True
                break
            time.sleep(0.1)
        check(ok, "without NOTIFY_SOCKET ckptd serves (ckptctl status)")
        time.sleep(1.5)  # a tick or two: STATUS and watchdog calls are no-ops
        rc = stop(proc)
        check(rc == 0, f"without NOTIFY_SOCKET ckptd exits 0 after SIGTERM (got {rc})")
        text = log_of(tmp, "plain")
        check("notify systemd" not in text, "without NOTIFY_SOCKET nothing is said about systemd")
        if failures:
            print(text)
    finally:
        stop(proc)
        log.close()


def main():
    # A short directory: socket paths must fit in 108 bytes.
    with tempfile.TemporaryDirectory(prefix="sdn.", dir="/tmp") as tmp:
        under_systemd(tmp)
        outside_systemd(tmp)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
