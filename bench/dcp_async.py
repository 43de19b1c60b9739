#!/usr/bin/env python3
"""PyTorch DCP async_save of the same bytes, on the same GPU and directory as
gpu_bench: one JSON object per figure and repetition on stdout.

    dcp_async.py --dir DIR [--sizes MiB,...] [--reps N]

dcp_blocking: the trainer's time in async_save (its staging to host memory);
dcp_durable: async_save until its future is done (FileSystemWriter fsyncs).
Exits 77 where torch or a GPU is missing.
"""
import argparse
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
    print(f"dcp_async: torch is not available ({e})", file=sys.stderr)
    sys.exit(77)


def record(metric, mib, rep, seconds):
    print(json.dumps({"metric": metric, "mib": mib, "rep": rep, "seconds": seconds}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--sizes", default="1024,4096,16384")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("dcp_async: no usable GPU", file=sys.stderr)
        sys.exit(77)
    pg = tempfile.mkdtemp(dir=a.dir)
    # one process, gloo: what async_save needs for its (CPU) collectives
    dist.init_process_group("gloo", init_method=f"file://{pg}/store", rank=0, world_size=1)
    for mib in (int(x) for x in a.sizes.split(",")):
        t = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
        for rep in range(1, a.reps + 1):
            t.fill_(rep & 0xFF)
            torch.cuda.synchronize()
            where = os.path.join(a.dir, f"dcp-{mib}-{rep}")
            t0 = time.monotonic()
            fut = dcp.async_save({"w": t}, checkpoint_id=where)
            t1 = time.monotonic()
            # newer releases may answer with a response holding the future
            getattr(fut, "upload_completion", fut).result()
            t2 = time.monotonic()
            record("dcp_blocking", mib, rep, t1 - t0)
            record("dcp_durable", mib, rep, t2 - t0)
            shutil.rmtree(where, ignore_errors=True)
        del t
        torch.cuda.empty_cache()
    dist.destroy_process_group()
    shutil.rmtree(pg, ignore_errors=True)


if __name__ == "__main__":
    main()
