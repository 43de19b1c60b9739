"""A checkpoint of a cluster of a thousand nodes, on this machine: a root
of SCALE_NODES nodes (1,024 by default) x 8 ranks x 2 sharded tensors
written by the project's own writers (bench/scale_bench gen: plans, stamped
shards, parts), committed by the project's own commit (scale_bench commit,
as the node of rank 0 would), then read by a real agent: the manifest is a
head naming every part by its bytes; ckptctl show and verify answer; a
rank of the saving layout and a rank of another layout (two ranks, each
half of every tensor) restore byte for byte."""

import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError as e:
    print(f"skipped: numpy is not available ({e})")
    sys.exit(77)

from agentproc import Agent

sys.path.insert(0, os.environ["CKPT_PY_DIR"])
import ckpt  # noqa: E402

NODES = int(os.environ.get("SCALE_NODES", "1024"))
RANKS, TENSORS, COLS, STEP = 8, 2, 4, 1
WORLD = NODES * RANKS


def bench(*args):
    """scale_bench with the root's shape; its last JSON line."""
    cmd = [os.environ["SCALE_BENCH_BIN"], *args, "--nodes", str(NODES), "--ranks",
           str(RANKS), "--tensors", str(TENSORS)]
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, f"{cmd}: {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def expected(rank, t):
    """Row `rank` of tensor t, as the generator wrote it."""
    return np.array([rank + c / 8 + STEP * 1000 + t for c in range(COLS)], dtype=np.float32)


def ctl(agent, *args):
    r = subprocess.run([agent.ckptctl, "--endpoint", agent.endpoint, *args],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout + r.stderr


def restore(c, rank, world, rows, offset):
    """Every tensor as `rows` rows from row `offset`, restored as rank of world."""
    mem = c.host_alloc(TENSORS * rows * COLS * 4)
    arrays = [mem.ndarray(np.float32, (rows, COLS), offset=t * rows * COLS * 4)
              for t in range(TENSORS)]
    for a in arrays:
        a[...] = -1
    tensors = [ckpt.Tensor("t%05d" % t, arrays[t], global_shape=(WORLD, COLS),
                           global_offset=(offset, 0)) for t in range(TENSORS)]
    plan = c.plan("scale", rank, world, tensors)
    step, _ = plan.restore(STEP)
    assert step == STEP, step
    for t in range(TENSORS):
        want = np.stack([expected(offset + i, t) for i in range(rows)])
        assert np.array_equal(arrays[t], want), (rank, world, t, arrays[t][:2], want[:2])
    plan.destroy()


def main():
    with tempfile.TemporaryDirectory(dir=os.environ.get("CK_TMPDIR")) as tmp:
        root = os.path.join(tmp, "root")
        gen = bench("gen", "--root", root, "--steps", str(STEP))
        assert gen["world"] == WORLD, gen
        done = bench("commit", "--root", root, "--step", str(STEP))
        assert done["state"] == "COMMITTED", done
        with open(os.path.join(root, "scale", "step-%012d" % STEP, "manifest.json")) as f:
            head = json.load(f)
        assert head["version"] == 4 and len(head["parts"]) == NODES, head.get("version")
        assert sum(len(p["ranks"]) for p in head["parts"]) == WORLD
        assert all(len(p["xxh3"]) == 16 and p["bytes"] > 0 for p in head["parts"])
        assert "ranks" not in head and head["tensors"] == TENSORS
        agent = Agent(os.environ["CKPTD_BIN"], os.environ["CKPTCTL_BIN"], tmp)
        try:
            agent.wait_ready()
            rc, out = ctl(agent, "show", "scale", str(STEP))
            assert rc == 0 and str(WORLD) in out, out[-2000:]
            rc, out = ctl(agent, "verify", "scale", str(STEP))
            assert rc == 0 and "OK" in out, out[-2000:]
            with ckpt.Client(agent.endpoint) as c:
                # a rank of the saving layout: its node's part alone
                restore(c, WORLD - 3, WORLD, 1, WORLD - 3)
                # another layout: rank 1 of 2, half of every tensor, from every part
                restore(c, 1, 2, WORLD // 2, WORLD // 2)
            print(f"{NODES} nodes x {RANKS} ranks x {TENSORS} tensors: committed as a head "
                  f"of {os.path.getsize(os.path.join(root, 'scale', 'step-%012d' % STEP, 'manifest.json'))} "
                  f"bytes; show, verify, both restores: ok")
        finally:
            agent.stop()


if __name__ == "__main__":
    main()
