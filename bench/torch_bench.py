#!/usr/bin/env python3
"""PyTorch CPU state dicts (a model and its AdamW state) saved four ways,
side by side in one run, on one directory: one JSON object per figure and
repetition on stdout (the agent at --endpoint writes under the same disk).

    torch_bench.py --dir DIR --endpoint EP [--sizes MiB,...] [--reps N]
                   [--loop-sizes MiB,...] [--loop-saves N] [--every N]

Alone (no compute), per size and repetition, the methods alternating:
- torch_save: torch.save + fsync; the trainer waits for all of it;
- dcp_async: torch.distributed.checkpoint.async_save (its default stager
  and FileSystemWriter): stall = the call, durable = its future done;
- ckpt_copy: ckpt.torch, the state copied into ckpt host memory at save:
  stall = save(), durable = COMMITTED;
- ckpt_attached: ckpt.torch with attach(opt) (parameters and state moved
  into ckpt host memory once): stall = save() until CAPTURED (nothing to
  overlap with here), durable = COMMITTED.
In a training loop (forward + backward + AdamW, the batch sized so that a
forward and backward take about as long as ckptd's capture), a save every
--every steps, --loop-saves saves: what the loop loses per checkpoint =
(its time - the same loop's time without saves) / saves; DCP's loop waits
for the previous async_save before the next (as its documentation asks),
ckptd's leaves the wait for CAPTURED to the optimizer's pre-step hook.
Figures: metric, mib (the state dict's size), rep, seconds.
"""

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time

try:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
except ImportError as e:
    print("torch_bench: torch is not available (%s)" % e, file=sys.stderr)
    sys.exit(77)

import ckpt
from ckpt.torch import Checkpointer

WIDTH = 4096  # a Linear(4096, 4096) is 64 MiB of float32 weights


def record(metric, mib, rep, seconds, **extra):
    print(json.dumps(dict(metric=metric, mib=mib, rep=rep, seconds=seconds, **extra)),
          flush=True)


def model_of(mib):
    """An MLP whose parameters and AdamW state come to about `mib` MiB."""
    layers = max(1, round(mib / (3 * 64)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step(model, opt, 1)  # makes the AdamW state
    return model, opt


def nbytes(sd):
    if torch.is_tensor(sd):
        return sd.numel() * sd.element_size()
    if isinstance(sd, dict):
        return sum(nbytes(v) for v in sd.values())
    if isinstance(sd, (list, tuple)):
        return sum(nbytes(v) for v in sd)
    return 0


def step(model, opt, batch):
    x = torch.randn(batch, WIDTH)
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def state(model, opt):
    return {"model": model.state_dict(), "optim": opt.state_dict()}


class Methods:
    def __init__(self, a, model, opt, mib):
        self.a, self.model, self.opt = a, model, opt
        self.step = 0
        self.copy = Checkpointer("bench-copy-%d" % mib, 0, 1, a.endpoint)
        self.att = Checkpointer("bench-attached-%d" % mib, 0, 1, a.endpoint)
        self.att.attach(opt)  # moves parameters and state into ckpt host memory, once

    def next_step(self):
        self.step += 1
        return self.step

    def torch_save(self):
        path = os.path.join(self.a.dir, "torch_save.pt")
        t0 = time.monotonic()
        with open(path, "wb") as f:
            torch.save(state(self.model, self.opt), f)
            f.flush()
            os.fsync(f.fileno())
        t1 = time.monotonic()
        os.unlink(path)
        return t1 - t0, t1 - t0

    def dcp_async(self, prev=None):
        where = os.path.join(self.a.dir, "dcp-%d" % self.next_step())
        t0 = time.monotonic()
        fut = dcp.async_save(state(self.model, self.opt), checkpoint_id=where)
        t1 = time.monotonic()
        getattr(fut, "upload_completion", fut).result()
        t2 = time.monotonic()
        shutil.rmtree(where, ignore_errors=True)
        return t1 - t0, t2 - t0

    def ckpt_copy(self):
        t0 = time.monotonic()
        h = self.copy.save(self.next_step(), state(self.model, self.opt))
        t1 = time.monotonic()
        h.result()
        return t1 - t0, time.monotonic() - t0

    def ckpt_attached(self):
        t0 = time.monotonic()
        h = self.att.save(self.next_step(), state(self.model, self.opt))
        h.wait("CAPTURED")
        t1 = time.monotonic()
        h.result()
        return t1 - t0, time.monotonic() - t0

    def close(self):
        self.copy.close()
        self.att.close()


def loop(m, method, steps, every, batch):
    """Seconds for `steps` training steps saving every `every` with `method`."""
    pending = []
    t0 = time.monotonic()
    for i in range(1, steps + 1):
        step(m.model, m.opt, batch)
        if method == "none" or i % every:
            continue
        if method == "dcp_async":
            for f in pending:  # DCP: the previous async_save must be done first
                getattr(f, "upload_completion", f).result()
            pending = [dcp.async_save(state(m.model, m.opt),
                                      checkpoint_id=os.path.join(m.a.dir,
                                                                 "dcp-%d" % m.next_step()))]
        else:
            ck = m.att if method == "ckpt_attached" else m.copy
            pending.append(ck.save(m.next_step(), state(m.model, m.opt)))
    t1 = time.monotonic()
    for p in pending:  # not counted: the loop went on without them
        (p.result if hasattr(p, "result") else p.upload_completion.result)()
    for d in os.listdir(m.a.dir):
        if d.startswith("dcp-"):
            shutil.rmtree(os.path.join(m.a.dir, d), ignore_errors=True)
    return t1 - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--sizes", default="1024,4096")
    ap.add_argument("--loop-sizes", default="1024,4096")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--loop-saves", type=int, default=4)
    ap.add_argument("--every", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    pg = tempfile.mkdtemp(dir=a.dir)
    dist.init_process_group("gloo", init_method="file://%s/store" % pg, rank=0, world_size=1)
    sizes = sorted({int(x) for x in a.sizes.split(",") if x} |
                   {int(x) for x in a.loop_sizes.split(",") if x})
    for mib in sizes:
        model, opt = model_of(mib)
        m = Methods(a, model, opt, mib)
        real = nbytes(state(model, opt)) / 2**20
        if str(mib) in a.sizes.split(","):
            for rep in range(1, a.reps + 1):
                for name in ("torch_save", "dcp_async", "ckpt_copy", "ckpt_attached"):
                    stall, durable = getattr(m, name)()
                    record(name + "_stall", mib, rep, stall, real_mib=real)
                    record(name + "_durable", mib, rep, durable, real_mib=real)
        if str(mib) in a.loop_sizes.split(","):
            # a batch whose forward and backward take about ckptd's capture
            m.ckpt_attached()
            stall, _ = m.ckpt_attached()
            t0 = time.monotonic()
            step(model, opt, 16)
            per16 = time.monotonic() - t0
            batch = max(1, round(16 * stall / per16))
            t0 = time.monotonic()
            step(model, opt, batch)
            record("loop_step", mib, 0, time.monotonic() - t0, batch=batch, capture=stall)
            steps = a.loop_saves * a.every
            for rep in range(1, max(2, a.reps - 1) + 1):
                base = loop(m, "none", steps, a.every, batch)
                record("loop_none", mib, rep, base, steps=steps)
                for name in ("dcp_async", "ckpt_copy", "ckpt_attached"):
                    t = loop(m, name, steps, a.every, batch)
                    record("loop_" + name, mib, rep, t, steps=steps)
                    record("loop_lost_" + name, mib, rep, (t - base) / a.loop_saves)
        m.close()
        del m, model, opt
        gc.collect()
    dist.destroy_process_group()
    shutil.rmtree(pg, ignore_errors=True)


if __name__ == "__main__":
    main()
