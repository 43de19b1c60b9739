"""Train, checkpoint through ckptd, be killed, resume: the loss goes on as if
nothing happened.

A small MLP learns a fixed random map from synthetic data with AdamW. Every
--every steps it saves the model and the optimizer through ckpt.torch (the
optimizer attached: its parameters and state live in ckpt host memory, the
save returns at once and the wait for the capture sits in the optimizer's
next step). At start it restores the newest committed checkpoint of --job
that restores whole (a damaged newer one is passed over, with a warning),
if there is one, and goes on from there; only "no checkpoint at all" starts
at step 0. --kill-at N: SIGKILL itself right
after step N, as a crash would.

    pip install ./client/python torch
    build/agent/ckptd --root /tmp/ckroot --listen unix:/tmp/ck.sock &
    export CKPT_ENDPOINT=unix:/tmp/ck.sock CKPT_LIB=build/client/libckpt.so
    python3 examples/torch_resume.py --job mlp --steps 40 --kill-at 23   # killed
    python3 examples/torch_resume.py --job mlp --steps 40                # resumes at 21

Each step prints "step N loss L" (L exactly, as float.hex); the end prints a
digest of every parameter and optimizer state bit: a run that was killed
and resumed prints the same losses and digest as one that was not.
"""

import argparse
import ctypes
import hashlib
import os
import signal

import torch

import ckpt
from ckpt.torch import Checkpointer


def batch(step, dim):
    """The data of a step: a function of the step only, so a resumed run sees
    what the uninterrupted one saw."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(64, dim, generator=g)
    return x, torch.sin(x @ torch.ones(dim, 1) / dim ** 0.5)


def digest(model, opt):
    h = hashlib.sha256()
    for t in list(model.state_dict().values()) + [
            v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]:
        t = t.detach().reshape(-1).contiguous().cpu()
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return h.hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", default="mlp")
    ap.add_argument("--endpoint", default=None, help="default: $CKPT_ENDPOINT")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    ap.add_argument("--kill-at", type=int, default=0, help="SIGKILL itself after step N")
    ap.add_argument("--dim", type=int, default=32)
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)  # the same reduction order in every run
    model = torch.nn.Sequential(torch.nn.Linear(args.dim, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    ck = Checkpointer(args.job, rank=0, world=1, endpoint=args.endpoint)
    ck.attach(opt)

    start = 0
    sd = {"model": model.state_dict(), "optim": opt.state_dict()}
    try:
        start, meta = ck.load(sd)
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])
        print("resumed from step %d (loss then %s)" % (start, meta["loss"]), flush=True)
    except ckpt.NoCheckpoint:
        # the one answer that means a fresh start: the job has no checkpoint.
        # A damaged one (ckpt.DamagedCheckpoint) raises: never a start over.
        # A damaged newest one is passed over for the one before it, with a
        # ckpt.PassedOver warning on stderr.
        print("no checkpoint of job %s: starting at step 0" % args.job, flush=True)

    pending = []
    for step in range(start + 1, args.steps + 1):
        x, y = batch(step, args.dim)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()  # waits here, if at all, for the last save's capture
        print("step %d loss %s" % (step, loss.item().hex()), flush=True)
        if step % args.every == 0:
            pending.append(ck.save(step, {"model": model.state_dict(),
                                          "optim": opt.state_dict()},
                                   meta={"loss": loss.item()}))
        if step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        while pending and pending[0].done():
            pending.pop(0).result()  # raises if a save failed
    for h in pending:
        h.result()
    print("digest %s" % digest(model, opt), flush=True)
    ck.close()


if __name__ == "__main__":
    main()
