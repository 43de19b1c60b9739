"""ckpt.torch with CUDA tensors (skipped, 77, without a GPU, without torch,
or with a libckpt built without CUDA):
- a model and AdamW on the GPU (AdamW's "step" on the CPU beside them):
  attached, the save reads parameters and state in place through CUDA IPC
  and returns without waiting; the next optimizer step's pre-step hook puts
  the fence on the stream; the checkpoint holds the values at save;
- without attach, CUDA tensors are copied on the stream into the plan's
  buffer at save: the trainer writes them at once, the save keeps the old;
- load into CUDA tensors (in place) and into a fresh optimizer, bit for bit;
- the host time of save() for a 256 MiB model, printed (not asserted)."""

import copy
import os
import sys
import time

try:
    import torch
except ImportError:
    print("skipped: no torch in this Python")
    sys.exit(77)
if not torch.cuda.is_available():
    print("skipped: no CUDA device (torch.cuda.is_available() is False)")
    sys.exit(77)

sys.path.insert(0, os.environ["CKPT_PY_DIR"])
import ckpt  # noqa: E402
from ckpt.torch import Checkpointer  # noqa: E402
from agentproc import run_tests  # noqa: E402

if not ckpt.has_cuda():
    print("skipped: this libckpt was built without CUDA")
    sys.exit(77)

DEV = torch.device("cuda", 0)


def mlp(width=256, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.GELU(),
                               torch.nn.Linear(width, 64)).to(DEV)


def train(model, opt, steps, seed=1):
    g = torch.Generator(device=DEV).manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(32, 64, device=DEV, generator=g)).square().mean().backward()
        opt.step()


def same(a, b, where="sd"):
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.cpu(), b.cpu()), where
    elif isinstance(a, dict):
        assert set(a) == set(b), (where, set(a), set(b))
        for k in a:
            same(a[k], b[k], "%s[%r]" % (where, k))
    elif isinstance(a, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, "%s[%d]" % (where, i))
    else:
        assert a == b, (where, a, b)


def test_attached(ag):
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ck = Checkpointer("gpu", 0, 1, ag.endpoint)
    ck.attach(opt)
    train(model, opt, 2)
    snap = copy.deepcopy({"model": model.state_dict(), "optim": opt.state_dict()})
    h = ck.save(1, {"model": model.state_dict(), "optim": opt.state_dict()})
    assert ck._plan.device.type == "cuda" and any(ck._plan.inplace), ck._plan.inplace
    assert ck._pending == [h]
    train(model, opt, 1)  # the hook fences the stream: the step's writes wait
    assert not ck._pending
    assert h.result() == "COMMITTED"
    model2 = mlp(seed=3)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    sd = {"model": model2.state_dict(), "optim": opt2.state_dict()}
    step, _ = ck.load(sd, 1)
    model2.load_state_dict(sd["model"])
    opt2.load_state_dict(sd["optim"])
    same(snap, {"model": model2.state_dict(), "optim": opt2.state_dict()})
    ck.close()
    print("attached: in place through CUDA IPC, fenced at the next step, values at save")


def test_copied(ag):
    w = torch.randn(1024, 1024, device=DEV)
    keep = w.clone()
    with Checkpointer("gpucopy", 0, 1, ag.endpoint) as ck:
        h = ck.save(1, {"w": w, "n": torch.tensor(7)})
        w.add_(1.0)  # at once: the save copied it on the stream
        assert h.result() == "COMMITTED"
        got = {"w": torch.zeros(1024, 1024, device=DEV), "n": torch.tensor(0)}
        ck.load(got)
    assert torch.equal(got["w"], keep) and int(got["n"]) == 7
    print("copied: CUDA tensors copied on the stream at save; loaded in place on the GPU")


def test_stall(ag):
    model = mlp(width=32768)  # 2 x 64 x 32768 x 4 B x (params + 2 AdamW states): ~48 MiB
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train(model, opt, 1)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    nbytes += sum(t.numel() * t.element_size() for st in opt.state.values()
                  for t in st.values())
    with Checkpointer("gpustall", 0, 1, ag.endpoint) as ck:
        ck.attach(opt)
        times = []
        for step in range(1, 6):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            h = ck.save(step, {"model": model.state_dict(), "optim": opt.state_dict()})
            times.append(time.perf_counter() - t0)
            train(model, opt, 1)
            h.result()
    times.sort()
    print("save() host time, %.0f MiB on the GPU, attached: median %.2f ms [%.2f, %.2f]"
          % (nbytes / 2**20, times[2] * 1e3, times[0] * 1e3, times[-1] * 1e3))


def main():
    run_tests("ckgpu.", test_attached, test_copied, test_stall)


if __name__ == "__main__":
    main()
