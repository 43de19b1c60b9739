"""The Python package (client/python/ckpt) against a real agent: numpy
arrays in host memory saved and restored with their meta, and failures
raised as ckpt.Error with the agent's words (a request past the message
limit as EMSGSIZE)."""

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

try:
    import numpy as np
except ImportError as e:
    print(f"skipped: numpy is not available ({e})")
    sys.exit(77)

from agentproc import Agent

sys.path.insert(0, os.environ["CKPT_PY_DIR"])
import ckpt  # noqa: E402


def expect_error(fn, code, words):
    try:
        fn()
    except ckpt.Error as e:
        assert e.errno == code, f"errno {e.errno} ({e}), want {code}"
        assert words in str(e), f"{words!r} not in {e}"
        return
    raise AssertionError(f"no error; wanted errno {code} with {words!r}")


def shard_of(agent, job, step):
    d = os.path.join(agent.root, job, "step-%012d" % step)
    with open(os.path.join(d, "manifest.json")) as f:
        return os.path.join(d, json.load(f)["ranks"][0]["file"])


def damaged(c, agent, w):
    """Nothing there and there-but-damaged are two exceptions; a damaged
    newest step is passed over with a warning, or refused (strict)."""
    plan = c.plan("pyd", 0, 1, [ckpt.Tensor("w", w)])
    try:
        plan.restore(ckpt.LATEST)
        raise AssertionError("a restore of a job with no checkpoint succeeded")
    except ckpt.NoCheckpoint as e:
        assert e.errno == errno.ENOENT, e
    for step in (1, 2):
        w[...] = step
        s = plan.save(step)
        s.wait(ckpt.COMMITTED, 60000)
        assert s.state == ckpt.COMMITTED, ckpt.state_name(s.state)
        s.release()
    gone = shard_of(agent, "pyd", 2)
    os.unlink(gone)
    w[...] = -1
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        step, _ = plan.restore(ckpt.LATEST)
    assert step == 1 and (w == 1).all(), step
    assert [x for x in seen if issubclass(x.category, ckpt.PassedOver) and
            "step 2: " in str(x.message) and os.path.basename(gone) in str(x.message)], \
        [str(x.message) for x in seen]
    assert any(n.startswith("step 2: ") for n in plan.skipped), plan.skipped
    try:
        plan.restore(ckpt.LATEST, strict=True)
        raise AssertionError("a strict restore passed over a damaged step")
    except ckpt.DamagedCheckpoint as e:
        assert e.errno == errno.EBADMSG and os.path.basename(gone) in str(e), e
    try:
        plan.restore(2)
        raise AssertionError("a damaged step restored")
    except ckpt.NoCheckpoint:
        raise AssertionError("a damaged step reported as no checkpoint")
    except ckpt.DamagedCheckpoint:
        pass
    plan.destroy()


def main():
    tmp = tempfile.mkdtemp(prefix="ckpy.", dir=os.environ.get("CK_TMPDIR"))
    agent = Agent(os.environ["CKPTD_BIN"], os.environ["CKPTCTL_BIN"], tmp)
    try:
        agent.wait_ready()
        rng = np.random.default_rng(7)
        with ckpt.Client(agent.endpoint) as c:
            # the agent's release, as its --version says it
            v = subprocess.run([os.environ["CKPTD_BIN"], "--version"], capture_output=True,
                               text=True, check=True).stdout.split()[-1]
            assert c.agent_version == v, (c.agent_version, v)
            mem = c.host_alloc(1 << 20)
            w = mem.ndarray(np.float32, (300, 301))
            b = mem.ndarray(np.int64, (77,), offset=w.nbytes)
            h = mem.ndarray(np.float16, (5, 3), offset=w.nbytes + b.nbytes)
            odd = mem.ndarray(np.uint8, (1001,), offset=w.nbytes + b.nbytes + h.nbytes)
            arrays = {"w": w, "b": b, "h": h, "odd": odd}
            for a in arrays.values():
                a[...] = rng.integers(0, 100, size=a.shape).astype(a.dtype)
            saved = {k: a.copy() for k, a in arrays.items()}
            plan = c.plan("py", 0, 1, [ckpt.Tensor(k, a) for k, a in arrays.items()])
            assert plan.bytes > sum(a.nbytes for a in arrays.values())
            s = plan.save(3, meta={"lr": 0.25, "tokens": 12345})
            s.wait(ckpt.CAPTURED)
            for a in arrays.values():  # train on: the checkpoint keeps step 3
                a[...] = 0
            s.wait(ckpt.COMMITTED, 60000)
            assert s.state == ckpt.COMMITTED, ckpt.state_name(s.state)
            s.release()
            step, meta = plan.restore(ckpt.LATEST)
            assert step == 3, step
            assert meta == {"lr": 0.25, "tokens": 12345}, meta
            for k, a in arrays.items():
                assert np.array_equal(a, saved[k]), f"tensor {k} differs after restore"

            expect_error(lambda: plan.restore(4), errno.ENOENT, "no committed step 4")
            expect_error(lambda: plan.save(3), errno.EEXIST, "already committed")
            expect_error(lambda: c.plan("a/b", 0, 1, [ckpt.Tensor("w", w)]),
                         errno.EINVAL, "'/'")
            # ctypes would cut these at the NUL ("a\0b" saving as job "a"): refused first
            expect_error(lambda: c.plan("a\0b", 0, 1, [ckpt.Tensor("w", w)]),
                         errno.EINVAL, "job name 'a\\x00b' has a NUL at byte 1")
            expect_error(lambda: c.plan("j", 0, 1, [ckpt.Tensor("w\0x", w)]),
                         errno.EINVAL, "has a NUL at byte 1")
            expect_error(lambda: c.plan("j", 0, 1, [ckpt.Tensor("w\x1bx", w)]),
                         errno.EINVAL, "control character 0x1b at byte 1")
            expect_error(lambda: plan.save(9, meta='{"a": 1}\0garbage'),
                         errno.EINVAL, "a NUL at byte 8")
            stray = np.zeros(16, dtype=np.float32)  # not from host_alloc
            expect_error(lambda: c.plan("j", 0, 1, [ckpt.Tensor("x", stray)]),
                         errno.EINVAL, "neither from ckpt_host_alloc")
            plan.destroy()

            # run= names the incarnation: the manifest says it, a bad one is refused
            plan = c.plan("pyrun", 0, 1, [ckpt.Tensor("w", w)], run="r2")
            s = plan.save(1)
            s.wait(ckpt.COMMITTED, 60000)
            assert s.state == ckpt.COMMITTED, ckpt.state_name(s.state)
            s.release()
            with open(os.path.join(agent.root, "pyrun", "step-000000000001",
                                   "manifest.json")) as f:
                run = json.load(f)["run"]
            assert run == "r2", f"manifest run {run!r}, want 'r2'"
            plan.destroy()
            expect_error(lambda: c.plan("pyrun", 0, 1, [ckpt.Tensor("w", w)], run="r/2"),
                         errno.EINVAL, "run")
            damaged(c, agent, w)
            mem.free()
            # a plan whose request passes the 32 MiB one message may carry (70,000
            # names of 500 bytes): EMSGSIZE, which no retry mends, never EAGAIN
            big = c.host_alloc(70000 * 64)
            many = [ckpt.Tensor("t%08d" % i + "x" * 491,
                                big.ndarray(np.uint8, (1,), offset=i * 64))
                    for i in range(70000)]
            expect_error(lambda: c.plan("wide", 0, 1, many), errno.EMSGSIZE,
                         "a retry fails the same way")
            del many
            big.free()
        status = agent.stop()
        assert status == 0, f"ckptd exited with {status}"
        print("ok: save, restore, meta and errors through the Python module")
        return 0
    except AssertionError as e:
        print(f"FAIL: {e}\nagent log:\n{agent.log_tail()}")
        return 1
    finally:
        agent.stop()
        if not os.environ.get("CKPT_TEST_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
