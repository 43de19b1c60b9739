#!/usr/bin/python3
"""The agent is plain gRPC: a second implementation, Debian's python3-grpcio,
calls Status and List with nothing of ckptd's but ipc/ckpt.proto.

ckpt_pb2.py is generated here, with `protoc --python_out`, into a temporary
directory; the calls are made with channel.unary_unary on the method paths,
against a real agent started by the test (agentproc.py), with a checkpoint
made by ckpt_fixture so that List has something to list. Like any client it
first reads a token from the agent's credentials socket (PATH.cred, a
SOCK_SEQPACKET socket: the agent learns the caller's uid from the kernel)
and sends it as 'ckpt-cred' metadata; without one, Status still answers and
List is refused with PERMISSION_DENIED. Also checked: a bad
request gets INVALID_ARGUMENT with a message a person can act on, and a
method the service does not have gets UNIMPLEMENTED.

Environment: CKPTD_BIN, CKPTCTL_BIN, CKPT_FIXTURE_BIN, CKPT_PROTO (set by
CMake). Exits 77 (skipped) without grpc, google.protobuf or protoc.
Run it with /usr/bin/python3, where Debian's python3-grpcio lives.
"""

import json
import os
import socket
import struct
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from agentproc import Agent  # noqa: E402

JOB = "grpcio-job"
STEP = 42


def skip(why):
    print(f"skipped: {why}")
    sys.exit(77)


def fail(why):
    print(f"FAIL: {why}", file=sys.stderr)
    sys.exit(1)


def check(cond, why):
    if not cond:
        fail(why)


try:
    import grpc
except ImportError as e:
    skip(f"no grpc module for {sys.executable} ({e}): apt-get install python3-grpcio")
try:
    import google.protobuf  # noqa: F401
except ImportError as e:
    skip(f"no google.protobuf for {sys.executable} ({e}): apt-get install python3-protobuf")
PROTOC = shutil.which("protoc")
if not PROTOC:
    skip("no protoc: apt-get install protobuf-compiler")


def env(name):
    v = os.environ.get(name)
    if not v:
        fail(f"{name} is not set (run this through ctest)")
    return v


def generate(proto, out):
    """ckpt_pb2.py from the project's .proto, imported from `out`."""
    r = subprocess.run([PROTOC, f"--proto_path={os.path.dirname(proto)}",
                        f"--python_out={out}", os.path.basename(proto)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"protoc --python_out failed on {proto}:\n{r.stderr}")
    sys.path.insert(0, out)
    import ckpt_pb2
    return ckpt_pb2


def cred_token(endpoint):
    """Connects to PATH.cred and reads the hello: (socket, token hex).

    The hello is struct ipc_cred_msg (ipc/ipc.h): magic[8], op, seq, status,
    pad (u32 each), size, ticket (u64 each), token[16], message[200].
    """
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(endpoint[len("unix:"):] + ".cred")
    s.settimeout(10)
    msg = s.recv(1024)
    check(len(msg) == 256 and msg[:8] == b"CKPTCRD1", f"hello of {len(msg)} bytes")
    op, _, status = struct.unpack_from("<IIi", msg, 8)
    check(op == 1 and status == 0, f"hello op {op} status {status}")
    return s, msg[40:56].hex()


def unary(channel, method, req_type, rep_type):
    return channel.unary_unary(f"/ckpt.v1.Ckpt/{method}",
                               request_serializer=req_type.SerializeToString,
                               response_deserializer=rep_type.FromString)


def main():
    ckptd, ckptctl = env("CKPTD_BIN"), env("CKPTCTL_BIN")
    fixture, proto = env("CKPT_FIXTURE_BIN"), env("CKPT_PROTO")
    tmproot = os.environ.get("CK_TMPDIR") or None
    with tempfile.TemporaryDirectory(prefix="grpcio.", dir=tmproot) as tmp:
        gen = os.path.join(tmp, "gen")
        os.mkdir(gen)
        pb = generate(proto, gen)
        agent = Agent(ckptd, ckptctl, tmp)
        try:
            agent.wait_ready()
            run(agent, ckptctl, fixture, pb)
        finally:
            rc = agent.stop()
        check(rc == 0, f"ckptd exited with {rc} at SIGTERM:\n{agent.log_tail()}")
    print("ok: Status and List answered a Python grpcio client")


def run(agent, ckptctl, fixture, pb):
    # grpcio takes the same "unix:/path" target as the C core.
    with grpc.insecure_channel(agent.endpoint) as channel:
        status = unary(channel, "Status", pb.StatusRequest, pb.StatusReply)
        r = status(pb.StatusRequest(), timeout=30)
        ctl = json.loads(subprocess.run([ckptctl, "--endpoint", agent.endpoint, "--json",
                                         "status"], check=True, capture_output=True,
                                        text=True).stdout)
        check(r.version and r.version == ctl["version"],
              f"version {r.version!r}, ckptctl says {ctl['version']!r}")
        check(r.io_engine in ("io_uring", "pwrite"), f"io_engine {r.io_engine!r}")
        check(r.io_engine == ctl["io"]["engine"], "io_engine as ckptctl shows it")
        check(len(r.io_detail) > 10, f"io_detail says why: {r.io_detail!r}")
        check(r.pid == agent.proc.pid, f"pid {r.pid}, started {agent.proc.pid}")
        check(r.root == agent.root, f"root {r.root!r}")
        check(r.pool_bytes == 64 << 20, f"pool_bytes {r.pool_bytes}")
        check(r.uptime_seconds > 0, f"uptime {r.uptime_seconds}")

        # a checkpoint, then List shows it
        fx = subprocess.run([fixture, "--endpoint", agent.endpoint, "--job", JOB,
                             "--step", str(STEP), "--seed", "5"],
                            capture_output=True, text=True, timeout=300)
        check(fx.returncode == 0, f"ckpt_fixture: {fx.stderr}")
        lst = unary(channel, "List", pb.ListRequest, pb.ListReply)
        try:
            lst(pb.ListRequest(job=JOB), timeout=30)
            fail("List without credentials was answered")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.PERMISSION_DENIED, f"code {e.code()}")
            check(".cred" in e.details(), f"details {e.details()!r}")
        sock, token = cred_token(agent.endpoint)
        md = (("ckpt-cred", token),)
        rep = lst(pb.ListRequest(job=JOB), timeout=30, metadata=md)
        check(len(rep.checkpoints) == 1, f"List: {rep}")
        c = rep.checkpoints[0]
        check(c.job == JOB and c.step == STEP, f"List: {c}")
        check(c.state == pb.STATE_COMMITTED and c.latest, f"List: {c}")
        check(c.bytes > 0 and c.world == 1 and c.tensors > 0, f"List: {c}")
        r = status(pb.StatusRequest(), timeout=30)
        counts = {s.state: s.count for s in r.saves}
        check(counts.get(pb.STATE_COMMITTED) == 1, f"saves by state: {counts}")
        check(r.bytes_written >= c.bytes, f"bytes_written {r.bytes_written} < {c.bytes}")

        # refusals are gRPC statuses with a message
        try:
            lst(pb.ListRequest(job="../etc"), timeout=30, metadata=md)
            fail("List of job '../etc' was answered")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, f"code {e.code()}")
            check("job" in e.details(), f"details {e.details()!r}")
        nothing = channel.unary_unary("/ckpt.v1.Ckpt/NoSuchMethod",
                                      request_serializer=pb.StatusRequest.SerializeToString,
                                      response_deserializer=pb.StatusReply.FromString)
        try:
            nothing(pb.StatusRequest(), timeout=30)
            fail("a method ckpt.v1 does not have was answered")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.UNIMPLEMENTED, f"code {e.code()}")
        # the token dies with its connection (as soon as the agent has seen it close)
        sock.close()
        for _ in range(100):
            try:
                lst(pb.ListRequest(job=JOB), timeout=30, metadata=md)
                time.sleep(0.05)
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.PERMISSION_DENIED, f"code {e.code()}")
                break
        else:
            fail("List with the token of a closed connection was still answered after 5 s")


if __name__ == "__main__":
    main()
