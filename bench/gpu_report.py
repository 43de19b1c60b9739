#!/usr/bin/env python3
"""Turns bench/gpu_run.sh's raw measurements into the table and a JSON file:
per size, the median [min, max] of each figure and of each ratio, the ratios
computed per repetition from measurements of the same run."""

import argparse
import glob
import json
import os
import platform
import re
import statistics

MIB = 1 << 20


def summary(v):
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)} if v else None


def load(raw):
    s = {}
    for name in ("ckptd.jsonl", "dcp.jsonl"):
        path = os.path.join(raw, name)
        if os.path.exists(path):
            for line in open(path):
                r = json.loads(line)
                s.setdefault((r["metric"], r["mib"]), {})[r["rep"]] = r["seconds"]
    for path in glob.glob(os.path.join(raw, "fio-write-*.json")):
        mib, rep = map(int, re.search(r"fio-write-(\d+)-(\d+)\.json$", path).groups())
        bw = json.load(open(path))["jobs"][0]["write"]["bw_bytes"]
        s.setdefault(("fio_write_seconds", mib), {})[rep] = mib * MIB / bw
    return s


def per_rep(s, a, b, mib, fn):
    x, y = s.get((a, mib), {}), s.get((b, mib), {})
    return [fn(x[r], y[r]) for r in sorted(set(x) & set(y))]


ROWS = [
    # key, label, unit, values(s, mib)
    ("d2h_gbs", "cudaMemcpy D2H into pinned memory", "GB/s",
     lambda s, m: [m * MIB / v / 1e9 for v in s.get(("d2h_pinned", m), {}).values()]),
    ("capture_gbs", "ckptd capture (save to CAPTURED)", "GB/s",
     lambda s, m: [m * MIB / v / 1e9 for v in s.get(("capture", m), {}).values()]),
    ("capture_vs_d2h", "capture / cudaMemcpy D2H (target >= 0.9)", "",
     lambda s, m: per_rep(s, "d2h_pinned", "capture", m, lambda d, c: d / c)),
    ("host_thread_ms", "ckptd trainer host thread, save + fence (target < 1)", "ms",
     lambda s, m: [v * 1e3 for v in s.get(("host_thread", m), {}).values()]),
    ("committed_ms", "ckptd save to COMMITTED", "ms",
     lambda s, m: [v * 1e3 for v in s.get(("committed", m), {}).values()]),
    ("fio_write_gbs", "fio write (O_DIRECT, io_uring, 8M x 8, end_fsync)", "GB/s",
     lambda s, m: [m * MIB / v / 1e9 for v in s.get(("fio_write_seconds", m), {}).values()]),
    ("persist_vs_fio", "ckptd persist (bytes / COMMITTED) / fio write", "",
     lambda s, m: per_rep(s, "fio_write_seconds", "committed", m, lambda f, c: f / c)),
    ("dcp_blocking_ms", "DCP async_save: trainer blocked", "ms",
     lambda s, m: [v * 1e3 for v in s.get(("dcp_blocking", m), {}).values()]),
    ("dcp_durable_ms", "DCP async_save: to durable", "ms",
     lambda s, m: [v * 1e3 for v in s.get(("dcp_durable", m), {}).values()]),
    ("dcp_blocking_vs_ckptd", "DCP blocked / ckptd host thread", "",
     lambda s, m: per_rep(s, "host_thread", "dcp_blocking", m, lambda c, d: d / c)),
    ("dcp_durable_vs_ckptd", "DCP to durable / ckptd to COMMITTED", "",
     lambda s, m: per_rep(s, "committed", "dcp_durable", m, lambda c, d: d / c)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    s = load(a.raw)
    sizes = sorted({m for _, m in s})
    table = {key: {str(m): summary(fn(s, m)) for m in sizes} for key, _, _, fn in ROWS}
    fmt = lambda x: "-" if not x else f"{x['median']:.3g} [{x['min']:.3g}, {x['max']:.3g}]"
    print("| | " + " | ".join(f"{m} MiB" for m in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for key, label, unit, _ in ROWS:
        print(f"| {label}{' (' + unit + ')' if unit else ''} | "
              + " | ".join(fmt(table[key][str(m)]) for m in sizes) + " |")
    status = json.load(open(os.path.join(a.raw, "status.json")))
    with open(a.json, "w") as f:
        json.dump({"host": platform.node(), "gpu": status.get("gpu"), "sizes_mib": sizes,
                   "figures": table}, f, indent=1)
    print(f"\nresults: {a.json}")


if __name__ == "__main__":
    main()
