#!/usr/bin/env python3
"""A shard fetched from the object store, loaded by the real safetensors
library: it must hold exactly what test_cluster's rank RANK saved at STEP
(the "emb" rows of the rank and "opt.rank<R>", MB MiB of bytes).

    s3_load.py FILE STEP RANK MB     exit 0: equal; 1: not (says what)
"""
import sys

import numpy as np
from safetensors.numpy import load_file

ROWS = 1024


def main():
    path, step, rank, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    t = load_file(path)
    names = sorted(t)
    want_names = sorted(["emb", "opt.rank%d" % rank])
    if names != want_names:
        print("%s: tensors %s, want %s" % (path, names, want_names))
        return 1
    i = np.arange(ROWS * 16, dtype=np.int64)
    emb = ((step * 131 + rank * 17 + i) % 100003).astype(np.float32).reshape(ROWS, 16)
    n = mb << 20
    opt = ((step * 7 + rank * 3 + np.arange(n, dtype=np.int64)) % 256).astype(np.uint8)
    if t["emb"].dtype != np.float32 or not np.array_equal(t["emb"], emb):
        print("%s: emb differs from what rank %d saved at step %d" % (path, rank, step))
        return 1
    o = t["opt.rank%d" % rank]
    if o.dtype != np.uint8 or not np.array_equal(o, opt):
        print("%s: opt.rank%d differs from what was saved" % (path, rank))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
