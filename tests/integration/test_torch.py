"""ckpt.torch and ckpt.dcp against a real agent (CPU tensors; torch from
PyPI in the test environment, skipped without it):
- a model and AdamW state dict, with bf16, fp16, int64 and bool tensors and
  values of every kind JSON cannot hold as is, saved and loaded into a
  fresh model and optimizer: every tensor bit for bit, every value, the
  meta; a step after the load equals a step after the save;
- attach(): parameters and state moved into ckpt host memory, save returns
  before the capture, the optimizer's step waits for it, and the checkpoint
  holds the values at save, not after the step; close() moves them back;
- optimizer.load_state_dict on an attached optimizer (new state tensors,
  the same structure): the next saves hold the loaded state, before a step
  and after one, not the state of before the load;
- a save's buffer is not filled again before its capture ends: step 1's
  capture held between its chunks (CKPT_FAULTS), step 2 saved at once with
  other values; step 1 loads as it was, every byte (skipped without fault
  injection);
- tensors shared by two keys (tied weights) saved once, and tied again;
- clear errors naming the key (non-contiguous, an object, complex, a bad
  key, tensors on two devices) and nothing saved; loading a tensor the
  checkpoint lacks, or a job not saved through ckpt.torch, names it;
- DCP: dcp.save and dcp.async_save through ckpt.dcp, loaded with dcp.load
  into a fresh model and optimizer, equal to the original;
- the example (examples/torch_resume.py): killed with SIGKILL after step
  17, resumed from LATEST: the losses of steps 16.. and the digest of
  every parameter and optimizer state equal an uninterrupted run's."""

import copy
import errno
import math
import json
import os
import struct
import subprocess
import sys
import time

try:
    import torch
except ImportError:
    print("skipped: no torch in this Python (scripts/test.sh installs it into .venv)")
    sys.exit(77)

sys.path.insert(0, os.environ["CKPT_PY_DIR"])
import ckpt  # noqa: E402
import ckpt.dcp  # noqa: E402
from ckpt.torch import Checkpointer  # noqa: E402
from agentproc import fault_injection, run_tests  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "torch_resume.py")


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                               torch.nn.Linear(32, 8))


def train(model, opt, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 16, generator=g)).square().mean().backward()
        opt.step()


def same_bits(a, b, where):
    assert isinstance(b, torch.Tensor), (where, type(b))
    assert a.dtype == b.dtype and a.shape == b.shape, (where, a.dtype, b.dtype, a.shape, b.shape)
    ab = a.detach().reshape(-1).contiguous().view(torch.uint8)
    bb = b.detach().reshape(-1).contiguous().view(torch.uint8)
    assert torch.equal(ab, bb), where


def same(a, b, where="sd"):
    """a and b hold the same tensors bit for bit and the same values."""
    if isinstance(a, torch.Tensor):
        return same_bits(a, b, where)
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b), (where, list(a), list(b))
        for k in a:
            same(a[k], b[k], "%s[%r]" % (where, k))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, "%s[%d]" % (where, i))
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, (where, a, b)


def committed(ag, job):
    r = subprocess.run([ag.ckptctl, "--endpoint", ag.endpoint, "list", job],
                       capture_output=True, text=True, timeout=60)
    return [int(line.split()[1]) for line in r.stdout.splitlines()[1:]
            if line.split()[2:3] == ["COMMITTED"]]


def expect_error(fn, code, *words):
    try:
        fn()
    except ckpt.Error as e:
        assert e.errno == code, (e.errno, str(e))
        for w in words:
            assert w in str(e), (w, str(e))
        return str(e)
    raise AssertionError("no error: expected %s naming %s" % (errno.errorcode[code], words))


def test_roundtrip(ag):
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train(model, opt, 3)
    sd = {"model": model.state_dict(), "optim": opt.state_dict(),
          "extra": {"bf16": torch.randn(5, 3).to(torch.bfloat16),
                    "fp16": torch.randn(7).to(torch.float16),
                    "i64": torch.arange(-3, 9, dtype=torch.int64).reshape(3, 4),
                    "mask": torch.tensor([True, False, True]),
                    "scalar": torch.tensor(2.5, dtype=torch.float64),
                    "empty": torch.zeros(0, 4)},
          "values": [1, -2.75, float("nan"), float("-inf"), 1 << 70, None, "text", True,
                     (3, (4, "five")), {7: "int key", "k": []}]}
    want = copy.deepcopy(sd)
    with Checkpointer("rt", 0, 1, ag.endpoint) as ck:
        h = ck.save(11, sd, meta={"loss": 0.25, "note": "first"})
        assert h.result() == "COMMITTED" and h.state == "COMMITTED", h.state

        model2 = mlp(seed=5)
        opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
        assert not opt2.state  # a fresh optimizer: load makes its state tensors
        got = {"model": model2.state_dict(), "optim": opt2.state_dict(),
               "extra": {"bf16": torch.zeros(5, 3, dtype=torch.bfloat16)}}
        step, meta = ck.load(got, step=ckpt.LATEST)
    assert step == 11 and meta == {"loss": 0.25, "note": "first"}, (step, meta)
    same(want, got)
    model2.load_state_dict(got["model"])
    opt2.load_state_dict(got["optim"])
    train(model, opt, 1, seed=9)
    train(model2, opt2, 1, seed=9)
    same(model.state_dict(), model2.state_dict(), "model after a step")
    same(opt.state_dict(), opt2.state_dict(), "optim after a step")
    print("round trip: model, AdamW, 6 dtypes and every kind of value, bit for bit")


def test_attach(ag):
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ck = Checkpointer("att", 0, 1, ag.endpoint)
    ck.attach(opt)
    assert all(ck._in_region(p) for p in model.parameters())
    train(model, opt, 2)  # its state is made by the step, and moved after it
    state = [t for st in opt.state.values() for t in st.values()]
    assert state and all(ck._in_region(t) for t in state)
    snap = copy.deepcopy({"model": model.state_dict(), "optim": opt.state_dict()})
    h = ck.save(1, {"model": model.state_dict(), "optim": opt.state_dict()})
    assert ck._pending == [h]  # read in place: the next step waits for it
    waited = []  # the step's hook waits for this save, before the step writes
    real = type(h)._captured_quietly
    type(h)._captured_quietly = lambda self: (waited.append(
        (self, [p.detach().clone() for p in model.parameters()])), real(self))[1]
    try:
        train(model, opt, 1)
    finally:
        type(h)._captured_quietly = real
    assert [w[0] for w in waited] == [h], waited
    same(list(snap["model"].values()), waited[0][1], "parameters when the hook waited")
    assert h.state in ("CAPTURED", "DURABLE", "COMMITTED"), h.state
    assert not ck._pending
    h.result()
    got = {"model": mlp(3).state_dict(), "optim": {}}
    ck.load(got, 1)
    same(snap, got)
    ps = list(model.parameters())
    ck.close()
    assert all(not any(r.holds(p) for r in ck._regions) for p in ps) and not ck._regions
    train(model, opt, 1)  # the tensors live on in ordinary memory
    print("attach: saved in place, the step waited for the capture, the values at save")


def test_load_state_dict(ag):
    """opt.load_state_dict() on an attached optimizer puts new state tensors
    in (the same names, dtypes and shapes, other storage): the plan that
    read the old ones in place must not serve the next save, before the next
    step (the loaded tensors, copied) nor after it (moved, read in place)."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    other_model = mlp(seed=4)
    other = torch.optim.AdamW(other_model.parameters(), lr=1e-2)
    train(other_model, other, 5, seed=6)  # another state, and another step count
    loaded = copy.deepcopy(other.state_dict())
    with Checkpointer("reload", 0, 1, ag.endpoint) as ck:
        ck.attach(opt)
        train(model, opt, 3)
        ck.save(1, {"model": model.state_dict(), "optim": opt.state_dict()}).result()
        opt.load_state_dict(copy.deepcopy(loaded))
        twin = copy.deepcopy(model)  # plain memory, not attached: what the steps give
        twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2)
        twin_opt.load_state_dict(copy.deepcopy(loaded))
        sd = {"model": model.state_dict(), "optim": opt.state_dict()}
        same(loaded["state"], sd["optim"]["state"], "the state load_state_dict put in")
        want = {2: copy.deepcopy(sd)}
        ck.save(2, sd).result()
        train(model, opt, 1, seed=9)
        train(twin, twin_opt, 1, seed=9)
        state = [t for st in opt.state.values() for t in st.values()]
        assert all(ck._in_region(t) for t in state), "the loaded state was not moved"
        want[3] = {"model": twin.state_dict(), "optim": twin_opt.state_dict()}
        ck.save(3, {"model": model.state_dict(), "optim": opt.state_dict()}).result()
        for step in (2, 3):
            got = {"model": mlp(7).state_dict(), "optim": {}}
            assert ck.load(got, step=step)[0] == step
            same(want[step], got, "step %d" % step)
    print("load_state_dict: the next saves hold the loaded state, before and after a step")


# step 1's capture waits 1 s before its second chunk (of 1 MiB): a fill for
# step 2 that does not wait for the capture lands in the middle of it
MIXED_FAULTS = {"CKPT_FAULTS": "capture:slow=1000:path=mixed/step-000000000001/rank-0/chunk-1"}


def test_no_mixed_steps(ag):
    """Tensors copied at save go into the plan's buffer, which the next save
    fills again only once the last one is captured: step 1's capture is held
    between its chunks while the trainer changes every tensor and saves step
    2 at once; step 1 loads with its own values, every byte of each tensor
    (a mix of the two steps otherwise), and step 2 with its."""
    g = torch.Generator().manual_seed(3)
    sd = {"a": torch.randn(3 << 18, generator=g),  # 3 MiB: chunks 0 to 2
          "b": torch.randn(300, 700, generator=g).to(torch.bfloat16),
          "n": torch.arange(1 << 18, dtype=torch.int64)}
    want = {1: copy.deepcopy(sd)}
    with Checkpointer("mixed", 0, 1, ag.endpoint) as ck:
        h1 = ck.save(1, sd)
        for t in sd.values():  # the next step's values, as soon as save returns
            t.add_(1)
        want[2] = copy.deepcopy(sd)
        h2 = ck.save(2, sd)
        h1.result()
        h2.result()
        assert ag.log_has("fault injected: capture(mixed/step-000000000001/rank-0/chunk-1)"), \
            "step 1's capture was not held"
        for step in (1, 2):
            got = {k: torch.zeros_like(t) for k, t in sd.items()}
            assert ck.load(got, step=step)[0] == step
            same(want[step], got, "step %d" % step)
    print("no mixed steps: step 1 loads as saved while step 2 was saved during its capture")


def test_tied(ag):
    w = torch.randn(6, 4)
    sd = {"emb": w, "head": w, "other": torch.ones(3)}
    with Checkpointer("tied", 0, 1, ag.endpoint) as ck:
        ck.save(1, sd).result()
        got = {"emb": torch.zeros(6, 4), "head": torch.zeros(6, 4), "other": torch.zeros(3)}
        ck.load(got)
        same_bits(w, got["emb"], "emb")
        same_bits(w, got["head"], "head")
        fresh = {}
        ck.load(fresh)
    assert fresh["emb"] is fresh["head"], "tied tensors made once"
    same_bits(w, fresh["head"], "head")
    print("tied tensors: saved once, loaded into both keys")


def test_errors(ag):
    ck = Checkpointer("bad", 0, 1, ag.endpoint)
    ck.save(1, {"w": torch.ones(2)}).result()
    cases = [
        ({"m": {"w": torch.ones(4, 3).t()}}, ["state_dict['m']['w']", "not contiguous"]),
        ({"m": {"f": object()}}, ["state_dict['m']['f']", "object"]),
        ({"c": torch.ones(2, dtype=torch.complex64)}, ["state_dict['c']", "complex64"]),
        ({"m": {(1, 2): torch.ones(1)}}, ["state_dict['m']", "(1, 2)", "str or int"]),
        ({"a.b": torch.ones(1), "a": {"b": torch.ones(1)}}, ["'a.b'", "rename"]),
        ([torch.ones(1)], ["must be a dict"]),
    ]
    for sd, words in cases:
        expect_error(lambda: ck.save(2, sd), errno.EINVAL, *words)
    assert committed(ag, "bad") == [1], committed(ag, "bad")
    msg = expect_error(lambda: ck.load({"w": torch.ones(2), "nope": torch.ones(3)}),
                       errno.EINVAL, "nope")
    ck.close()
    c = ckpt.Client(ag.endpoint)  # a job saved with the plain API, not ckpt.torch
    mem = c.host_alloc(64 + 32768)
    p = c.plan("plain", 0, 1, [ckpt.Tensor("w", dtype="U8", shape=(16,), address=mem.address)])
    p.save(3).wait(ckpt.COMMITTED)
    p.destroy()
    with Checkpointer("plain", 0, 1, ag.endpoint) as ck2:
        expect_error(lambda: ck2.load({"w": torch.zeros(16, dtype=torch.uint8)}),
                     errno.EINVAL, "ckpt.torch")
        expect_error(lambda: ck2.load({}, step=99), errno.ENOENT)
    # forged heads and trees, as a hostile or broken writer would leave them
    forged = [(b'{"ckpt.torch":1,"tree":{"D":[["w",{"T":["F32","x"]}]]}}', 0),
              (b'{"ckpt.torch":1,"tree":{"D":[["w",{"A":"nothing"}]]}}', 0),
              (b'{"ckpt.torch":1,"tree":{"D":[["w",{"T":["Q9",[2]]}]]}}', 0),
              (b'not json at all', 0),
              (b'{"ckpt.torch":1}', 0),
              (b'{"ckpt.torch":true,"tree":{"D":[]}}', 0),
              (b'{"ckpt.torch":1,"tree":{"D":[["a"]]}}', 0),
              (b'{"ckpt.torch":1,"tree":{"D":[["a",{"F":1}]]}}', 0),
              (b'{"ckpt.torch":1,"tree":' + b'{"L":[' * 3000 + b']}' * 3000 + b'}', 0),
              (b'{}', 1 << 20)]  # a length past the capacity
    for i, (text, extra) in enumerate(forged):
        job = "forged%d" % i
        buf, cap = mem.buffer(), 4096 if len(text) <= 4096 else 32768
        buf[:16] = struct.pack("<QQ", cap, len(text) + extra)
        buf[64:64 + cap] = text.ljust(cap, b" ")
        p = c.plan(job, 0, 1, [
            ckpt.Tensor("ckpt.torch.0", dtype="U8", shape=(16,), address=mem.address),
            ckpt.Tensor("ckpt.torch.tree.0", dtype="U8", shape=(cap,),
                        address=mem.address + 64)])
        p.save(1).wait(ckpt.COMMITTED)
        p.destroy()
        with Checkpointer(job, 0, 1, ag.endpoint) as ck3:
            sd = {}
            expect_error(lambda: ck3.load(sd), errno.EBADMSG, job)
    c.close()
    print("errors named:", msg)


def test_dcp(ag):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                         set_optimizer_state_dict)
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train(model, opt, 2)
    sd = {"model": model.state_dict(), "optim": get_optimizer_state_dict(model, opt),
          "epoch": 4}
    want = copy.deepcopy({"model": model.state_dict(), "optim": opt.state_dict()})
    dcp.save(sd, storage_writer=ckpt.dcp.StorageWriter("dcp", endpoint=ag.endpoint),
             checkpoint_id=5)
    train(model, opt, 1)
    sd = {"model": model.state_dict(), "optim": get_optimizer_state_dict(model, opt),
          "epoch": 5}
    want6 = copy.deepcopy({"model": model.state_dict(), "optim": opt.state_dict()})
    f = dcp.async_save(sd, storage_writer=ckpt.dcp.StorageWriter("dcp", endpoint=ag.endpoint),
                       checkpoint_id="6")
    (f.result if hasattr(f, "result") else f.upload_completion.result)()
    assert committed(ag, "dcp") == [5, 6], committed(ag, "dcp")
    for step, expect, epoch in ((None, want6, 5), (5, want, 4)):
        model2 = mlp(seed=7)
        opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
        got = {"model": model2.state_dict(), "optim": get_optimizer_state_dict(model2, opt2),
               "epoch": 0}
        dcp.load(got, storage_reader=ckpt.dcp.StorageReader("dcp", endpoint=ag.endpoint),
                 checkpoint_id=step)
        model2.load_state_dict(got["model"])
        set_optimizer_state_dict(model2, opt2, got["optim"])
        same(expect, {"model": model2.state_dict(), "optim": opt2.state_dict()})
        assert got["epoch"] == epoch, got["epoch"]
    expect_error(lambda: ckpt.dcp.StorageWriter("dcp").reset("/a/path"), errno.EINVAL,
                 "not a step")
    for doc in ({"ckpt.dcp": True, "sd": {}}, {"ckpt.dcp": 1, "sd": {"x": {"b": -5}}},
                {"ckpt.dcp": 1, "sd": {"x": {"t": "F32", "size": [2],
                                              "chunks": [[[10], [20]]]}}},
                {"ckpt.dcp": 1, "sd": {}, "planner": {"a": 1}}):
        expect_error(lambda: ckpt.dcp._metadata_from(doc, "forged"), errno.EBADMSG, "forged")
    # more saves than the agent's sessions per user (64): DCP never closes a
    # storage writer, so each save's session must end with it
    for step in range(100, 166):
        dcp.save({"x": torch.tensor([step])}, checkpoint_id=step,
                 storage_writer=ckpt.dcp.StorageWriter("dcp-many", endpoint=ag.endpoint))
    got = {"x": torch.tensor([0])}
    reader = ckpt.dcp.StorageReader("dcp-many", endpoint=ag.endpoint)
    dcp.load(got, storage_reader=reader)
    assert int(got["x"]) == 165, got
    dcp.save({"x": torch.tensor([166])}, checkpoint_id=166,
             storage_writer=ckpt.dcp.StorageWriter("dcp-many", endpoint=ag.endpoint))
    dcp.load(got, storage_reader=reader)  # the same reader finds the newest again
    assert int(got["x"]) == 166, got
    dcp.load(got, storage_reader=reader, checkpoint_id=120)
    assert int(got["x"]) == 120, got
    print("DCP: save and async_save through ckptd, load equals the original")


def test_resume(ag):
    env = dict(os.environ, CKPT_ENDPOINT=ag.endpoint, PYTHONPATH=os.environ["CKPT_PY_DIR"])

    def run(job, *extra):
        r = subprocess.run([sys.executable, EXAMPLE, "--job", job, "--steps", "24",
                            "--every", "5", *extra], env=env, capture_output=True,
                           text=True, timeout=300)
        return r.returncode, r.stdout.splitlines(), r.stderr

    rc, ref, err = run("ref")
    assert rc == 0, err
    rc, killed, err = run("kr", "--kill-at", "17")
    assert rc == -9, (rc, err)
    assert killed[-1] == ref[17], (killed[-1], ref[17])  # it died right after step 17
    rc, resumed, err = run("kr")
    assert rc == 0, err
    assert resumed[0].startswith("resumed from step 15"), resumed[0]
    steps = lambda lines, k: [x for x in lines if x.startswith(("step", "digest")) and
                              (not x.startswith("step") or int(x.split()[1]) > k)]
    assert steps(resumed, 15) == steps(ref, 15), "\n".join(resumed + ["--"] + ref)
    assert resumed[-1].startswith("digest"), resumed[-1]
    print("kill and resume: steps 16-24 and", resumed[-1], "as the uninterrupted run")

    # the newest checkpoint damaged (its shard file lost): the loop resumes
    # from the one before, saying so, never from step 0
    rc, killed, err = run("kd", "--kill-at", "17")
    assert rc == -9, (rc, err)
    d = os.path.join(ag.root, "kd", "step-%012d" % 15)
    for _ in range(600):  # captured before the kill: the agent commits it on its own
        if os.path.exists(os.path.join(d, "manifest.json")):
            break
        time.sleep(0.1)
    with open(os.path.join(d, "manifest.json")) as f:
        os.unlink(os.path.join(d, json.load(f)["ranks"][0]["file"]))
    rc, resumed, err = run("kd")
    assert rc == 0, err
    assert resumed[0].startswith("resumed from step 10"), (resumed[0], err)
    assert "step 15: " in err and "passed over" in err, err
    assert steps(resumed, 10) == steps(ref, 10), "\n".join(resumed + ["--"] + ref)
    print("newest checkpoint damaged: resumed from step 10, steps 11-24 as the uninterrupted run")


def test_agent_restart(ag):
    """The agent SIGKILLed and started again under a training loop that saves
    every step (AdamW attached: saves read it in place): the loop goes on as
    written, a save the agent never finished raises from result() saying
    ckptd went away, the next ones commit, and loads give the values at save."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    snap, failed, committed = {}, [], None
    with Checkpointer("restart", 0, 1, ag.endpoint) as ck:
        ck.attach(opt)
        for step in range(1, 300):
            train(model, opt, 1, seed=step)
            sd = {"model": model.state_dict(), "optim": opt.state_dict()}
            snap[step] = copy.deepcopy(sd)
            h = ck.save(step, sd)
            try:
                h.result()
            except ckpt.Error as e:
                failed.append((step, str(e)))
                time.sleep(0.1)
                continue
            if step == 3:
                ag.kill()
                ag.restart()
            elif step > 3:
                committed = step
                break
        assert committed, failed
        assert all("ckptd" in why for _, why in failed), failed
        for want in (committed, 3):
            got = {"model": mlp(7).state_dict(), "optim": {}}
            step, _ = ck.load(got, step=want)
            assert step == want, (step, want)
            same(snap[want], got, "step %d" % want)
    print("agent restart: saves went on; step %d committed after %d not taken; "
          "bit for bit" % (committed, len(failed)))


def main():
    run_tests("cktorch.", test_roundtrip, test_attach, test_load_state_dict, test_tied,
              test_errors, test_dcp, test_resume, test_agent_restart)
    if fault_injection():
        run_tests("cktorchf.", test_no_mixed_steps, env=MIXED_FAULTS)
    else:
        print("no mixed steps: skipped (ckptd is built without -DCKPT_FAULT_INJECTION=ON)")


if __name__ == "__main__":
    main()
