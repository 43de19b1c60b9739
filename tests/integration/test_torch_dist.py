"""ckpt.torch with DTensors over two processes (gloo, CPU): each rank saves
its box of a row-sharded weight and a replicated bias; then the checkpoint
is loaded into plain tensors by one process (world 1), and into DTensors
sharded by columns by two: every element where it belongs. The same with
DCP (dcp.save / dcp.load through ckpt.dcp, the coordinator committing in
finish). Skipped without torch."""

import os
import socket
import subprocess
import sys

try:
    import torch
except ImportError:
    print("skipped: no torch in this Python (scripts/test.sh installs it into .venv)")
    sys.exit(77)

sys.path.insert(0, os.environ["CKPT_PY_DIR"])
from ckpt.torch import Checkpointer  # noqa: E402
from agentproc import run_tests  # noqa: E402

WORKER = r'''
import os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard, Replicate
from ckpt.torch import Checkpointer
rank, modes = int(os.environ["RANK"]), sys.argv[1:]
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2,))
full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
bias = torch.linspace(-1, 1, 6)
with Checkpointer("dt", rank, 2, os.environ["CKPT_ENDPOINT"]) as ck:
    for mode in modes:  # one process group for several steps of the test
        if mode == "save":
            sd = {"w": distribute_tensor(full, mesh, [Shard(0)]),
                  "b": distribute_tensor(bias, mesh, [Replicate()])}
            assert sd["w"].to_local().shape == (4, 6)
            ck.save(3, sd, meta={"rank": rank}).result()
        elif mode == "ddp":  # every rank the same plain tensors: replicas
            import ckpt
            sd = {"w": full.clone(), "b": bias.clone()}
            refused = torch.zeros(1)
            with Checkpointer("ddp", rank, 2, os.environ["CKPT_ENDPOINT"]) as ck1:
                try:
                    ck1.save(5, sd)
                except ckpt.Error as e:  # the rank second to plan is told what to do
                    assert "replicated=True" in str(e), str(e)
                    refused += 1
                dist.barrier()
            dist.all_reduce(refused)
            assert int(refused) == 1, int(refused)  # one of the two, whichever came second
            with Checkpointer("ddp", rank, 2, os.environ["CKPT_ENDPOINT"], replicated=True) as ck2:
                ck2.save(6, sd).result()
                got = {"w": torch.zeros(8, 6), "b": torch.zeros(6)}
                ck2.load(got, 6)
                assert torch.equal(got["w"], full) and torch.equal(got["b"], bias)
        elif mode == "attach":  # an optimizer of DTensor parameters, attached
            w = torch.nn.Parameter(distribute_tensor(full.clone(), mesh, [Shard(0)]))
            opt = torch.optim.AdamW([w], lr=0.1)
            w.grad = distribute_tensor(torch.ones(8, 6), mesh, [Shard(0)])
            opt.step()
            # AdamW's "step" is a plain tensor, the same on both ranks: replicated
            with Checkpointer("dt-attach", rank, 2, os.environ["CKPT_ENDPOINT"],
                              replicated=True) as ck2:
                ck2.attach(opt)  # DTensors stay where they are; their local tensors read in place
                want = w.to_local().clone()
                sd = {"w": w.detach(), "optim": opt.state_dict()}
                h = ck2.save(1, sd)
                w.grad = distribute_tensor(torch.ones(8, 6), mesh, [Shard(0)])
                opt.step()  # waits for the capture first
                h.result()
                got = {"w": distribute_tensor(torch.zeros(8, 6), mesh, [Shard(0)])}
                ck2.load(got, 1)
                assert torch.equal(got["w"].to_local(), want), (got["w"].to_local(), want)
        elif mode == "dcp_save":  # DCP's planner, ckptd's storage: the coordinator commits
            import torch.distributed.checkpoint as dcp, ckpt.dcp
            sd = {"w": distribute_tensor(full * 2, mesh, [Shard(0)]),
                  "b": distribute_tensor(bias, mesh, [Replicate()]), "epoch": 9}
            dcp.save(sd, storage_writer=ckpt.dcp.StorageWriter("dt-dcp",
                     endpoint=os.environ["CKPT_ENDPOINT"]), checkpoint_id=4)
        elif mode == "dcp_load":
            import torch.distributed.checkpoint as dcp, ckpt.dcp
            sd = {"w": distribute_tensor(torch.zeros(8, 6), mesh, [Shard(1)]),
                  "b": distribute_tensor(torch.zeros(6), mesh, [Replicate()]), "epoch": 0}
            dcp.load(sd, storage_reader=ckpt.dcp.StorageReader("dt-dcp",
                     endpoint=os.environ["CKPT_ENDPOINT"]))
            assert torch.equal(sd["w"].to_local(), full[:, rank * 3:(rank + 1) * 3] * 2), sd["w"]
            assert torch.equal(sd["b"].to_local(), bias) and sd["epoch"] == 9, sd
        else:
            sd = {"w": distribute_tensor(torch.zeros(8, 6), mesh, [Shard(1)]),
                  "b": distribute_tensor(torch.zeros(6), mesh, [Replicate()])}
            step, meta = ck.load(sd)
            assert step == 3 and meta == {"rank": rank}, (step, meta)
            assert torch.equal(sd["w"].to_local(), full[:, rank * 3:(rank + 1) * 3]), sd["w"]
            assert torch.equal(sd["b"].to_local(), bias)
        dist.barrier()
dist.destroy_process_group()
print("rank", rank, " ".join(modes), "ok")
'''


def two_ranks(ag, *modes):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), CKPT_ENDPOINT=ag.endpoint,
                   PYTHONPATH=os.environ["CKPT_PY_DIR"])
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, *modes], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    bad = ["rank %d (%s) exited %d:\n%s" % (rank, " ".join(modes), p.returncode, out)
           for rank, (p, out) in enumerate(zip(procs, outs)) if p.returncode]
    assert not bad, "\n".join(bad)


def test_checkpointer(ag):
    # saves of several kinds in one process group each (torch starts slowly)
    two_ranks(ag, "save", "attach", "ddp", "dcp_save")
    print("attach with DTensor parameters: their local tensors read in place")
    print("data parallel: the same names on two ranks, refused with a hint, then saved "
          "once with replicated=True")
    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    with Checkpointer("dt", 0, 1, ag.endpoint) as ck:
        sd = {"w": torch.zeros(8, 6), "b": torch.zeros(6)}
        step, _ = ck.load(sd)
    assert step == 3 and torch.equal(sd["w"], full), sd["w"]
    assert torch.equal(sd["b"], torch.linspace(-1, 1, 6)), sd["b"]
    print("world 2 (rows) -> world 1: the whole weight")
    two_ranks(ag, "load", "dcp_load")
    print("world 2 (rows) -> world 2 (columns): each rank its columns")
    print("DCP over two ranks through ckptd: saved by rows, loaded by columns")


def main():
    run_tests("ckdist.", test_checkpointer)


if __name__ == "__main__":
    main()
