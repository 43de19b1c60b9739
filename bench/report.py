#!/usr/bin/env python3
"""Turns bench/run.sh's raw measurements into the table, the ratios against
their targets (docs/DESIGN.md §5.2), a JSON file and a gnuplot chart.

Every ratio is computed per repetition from measurements taken side by side
(fio then ckptd, same size, same repetition), then summarised as the median
with min and max."""

import argparse
import glob
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys

MIB = 1 << 20


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def load(raw):
    """{(metric, size_mib, ranks): [samples by repetition]} and fio bandwidths."""
    samples, fio = {}, {}
    for path in sorted(glob.glob(os.path.join(raw, "ckpt-*.json"))):
        m = re.search(r"ckpt-(\d+|control)(?:-(\d+))?\.json$", path)
        for rec in json.load(open(path)):
            key = (rec["metric"], rec["size_mib"], rec["ranks"])
            samples.setdefault(key, []).extend(rec["samples"])
    for path in sorted(glob.glob(os.path.join(raw, "fio-*.json"))):
        tag, mib, rep = re.search(r"fio-(write|read|writefixed)-(\d+)-(\d+)\.json$",
                                  path).groups()
        job = json.load(open(path))["jobs"][0]
        rw = "read" if tag == "read" else "write"
        fio.setdefault((tag, int(mib)), []).append((int(rep), job[rw]["bw_bytes"]))
    for k in fio:
        fio[k] = [bw for _, bw in sorted(fio[k])]
    return samples, fio


def paired(a, b, fn):
    return [fn(x, y) for x, y in zip(a, b)]


TARGETS = [
    # key, what, target text, test
    ("persist_vs_fio_write", "persist / fio write (1 rank)", ">= 0.9", lambda v: v >= 0.9),
    ("persist_vs_fio_writefixed", "persist / fio write, registered buffers", ">= 0.9",
     lambda v: v >= 0.9),
    ("restore_vs_fio_read", "restore / fio read (1 rank)", ">= 0.9", lambda v: v >= 0.9),
    ("stall_vs_memcpy", "stall / memcpy (fits in staging)", "<= 1.25", lambda v: v <= 1.25),
    ("intrainer_vs_stall", "in-trainer stall / ckptd stall", ">= 20", lambda v: v >= 20),
    ("aggregate4_vs_fio_write", "4 ranks aggregate / fio write", ">= 0.9", lambda v: v >= 0.9),
]


def compute(samples, fio, sizes):
    rows, ratios = {}, {}
    for mib in sizes:
        b = mib * MIB
        g = lambda metric, ranks=1: samples.get((metric, mib, ranks), [])
        r = {
            "fio_write_gbs": [x / 1e9 for x in fio.get(("write", mib), [])],
            "fio_read_gbs": [x / 1e9 for x in fio.get(("read", mib), [])],
            "fio_writefixed_gbs": [x / 1e9 for x in fio.get(("writefixed", mib), [])],
            "memcpy_s": g("memcpy_seconds"),
            "intrainer_s": g("intrainer_seconds"),
        }
        for ranks in (1, 4):
            for m in ("stall", "durable", "commit", "restore"):
                r[f"{m}_s_{ranks}r"] = g(f"{m}_seconds", ranks)
            r[f"persist_gbs_{ranks}r"] = [b / s / 1e9 for s in g("commit_seconds", ranks)]
            r[f"restore_gbs_{ranks}r"] = [b / s / 1e9 for s in g("restore_seconds", ranks)]
        rows[mib] = {k: summary(v) for k, v in r.items() if v}
        q = {
            "persist_vs_fio_write": paired(r["persist_gbs_1r"], r["fio_write_gbs"],
                                           lambda x, y: x / y),
            "persist_vs_fio_writefixed": paired(r["persist_gbs_1r"], r["fio_writefixed_gbs"],
                                                lambda x, y: x / y),
            "restore_vs_fio_read": paired(r["restore_gbs_1r"], r["fio_read_gbs"],
                                          lambda x, y: x / y),
            "stall_vs_memcpy": paired(r["stall_s_1r"], r["memcpy_s"], lambda x, y: x / y),
            "intrainer_vs_stall": paired(r["intrainer_s"], r["stall_s_1r"], lambda x, y: x / y),
            "intrainer_vs_memcpy": paired(r["intrainer_s"], r["memcpy_s"], lambda x, y: x / y),
            "aggregate4_vs_fio_write": paired(r["persist_gbs_4r"], r["fio_write_gbs"],
                                              lambda x, y: x / y),
        }
        ratios[mib] = {k: summary(v) for k, v in q.items() if v}
    return rows, ratios


def fmt(s, scale=1.0, digits=2):
    return f"{s['median'] * scale:.{digits}f} [{s['min'] * scale:.{digits}f}, " \
           f"{s['max'] * scale:.{digits}f}]"


def print_table(rows, ratios, control, sizes, verdicts):
    print("\nmedian [min, max] of each figure; times in ms, bandwidth in GB/s\n")
    lines = [
        ("fio write (O_DIRECT, io_uring, 8M x 8)", "fio_write_gbs", 1, "GB/s"),
        ("fio write, --fixedbufs (registered)", "fio_writefixed_gbs", 1, "GB/s"),
        ("fio read", "fio_read_gbs", 1, "GB/s"),
        ("memcpy into warm memory", "memcpy_s", 1e3, "ms"),
        ("in-trainer write + fsync (stall)", "intrainer_s", 1e3, "ms"),
        ("ckptd 1 rank: stall (save -> CAPTURED)", "stall_s_1r", 1e3, "ms"),
        ("ckptd 1 rank: save -> DURABLE", "durable_s_1r", 1e3, "ms"),
        ("ckptd 1 rank: save -> COMMITTED", "commit_s_1r", 1e3, "ms"),
        ("ckptd 1 rank: persist", "persist_gbs_1r", 1, "GB/s"),
        ("ckptd 1 rank: restore", "restore_gbs_1r", 1, "GB/s"),
        ("ckptd 4 ranks: stall (mean rank)", "stall_s_4r", 1e3, "ms"),
        ("ckptd 4 ranks: save -> COMMITTED", "commit_s_4r", 1e3, "ms"),
        ("ckptd 4 ranks: persist (aggregate)", "persist_gbs_4r", 1, "GB/s"),
        ("ckptd 4 ranks: restore (aggregate)", "restore_gbs_4r", 1, "GB/s"),
    ]
    head = f"{'':46s}" + "".join(f"{str(m) + ' MiB':>26s}" for m in sizes)
    print(head)
    for label, key, scale, unit in lines:
        cells = "".join(f"{fmt(rows[m][key], scale, 1 if unit == 'ms' else 2):>26s}"
                        if key in rows[m] else f"{'-':>26s}" for m in sizes)
        print(f"{label + ' (' + unit + ')':46s}{cells}")
    print("\nratios (per repetition, side by side)")
    print(head + f"{'target':>10s}{'verdict':>9s}")
    for key, what, target, _ in TARGETS:
        cells = "".join(f"{fmt(ratios[m][key]):>26s}" if key in ratios[m] else f"{'-':>26s}"
                        for m in sizes)
        print(f"{what:46s}{cells}{target:>10s}{verdicts.get(key, '-'):>9s}")
    cells = "".join(f"{fmt(ratios[m]['intrainer_vs_memcpy']):>26s}"
                    if "intrainer_vs_memcpy" in ratios[m] else f"{'-':>26s}" for m in sizes)
    print(f"{'(ceiling for any copying capture: in-trainer / memcpy)':46s}{cells}")
    if control:
        pc, sc = control["plan_create_ms"], control["save_call_ms"]
        ok = "met" if sc["median"] < 1.0 else "MISSED"
        print(f"\ncontrol plane, cached plan of 1,000 tensors: ckpt_save client time "
              f"{fmt(sc, 1, 3)} ms (target < 1 ms: {ok}); ckpt_plan_create {fmt(pc, 1, 2)} ms")


def chart(rows, sizes, png):
    gp = shutil.which("gnuplot")
    if not gp:
        return "gnuplot not found: no chart"
    data = png + ".dat"
    with open(data, "w") as f:
        f.write("# MiB ckptd_stall_ms ckptd_durable_ms intrainer_ms memcpy_ms\n")
        for m in sizes:
            r = rows[m]
            vals = [r.get(k, {}).get("median", float("nan")) * 1e3
                    for k in ("stall_s_1r", "durable_s_1r", "intrainer_s", "memcpy_s")]
            f.write(f"{m} " + " ".join(f"{v:.3f}" for v in vals) + "\n")
    script = f"""
set terminal pngcairo size 900,560 enhanced font ',11'
set output '{png}'
set title 'What a checkpoint costs the trainer (1 rank, median)'
set xlabel 'checkpoint size (MiB)'
set ylabel 'time (ms)'
set logscale xy
set grid
set key top left
set xtics ({", ".join(f'"{m}" {m}' for m in sizes)})
plot '{data}' using 1:4 with linespoints lw 2 title 'in-trainer write+fsync: stall = durable', \\
     '' using 1:3 with linespoints lw 2 title 'ckptd: save -> DURABLE (trainer goes on)', \\
     '' using 1:2 with linespoints lw 2 title 'ckptd: stall (save -> CAPTURED)', \\
     '' using 1:5 with linespoints dt 2 title 'memcpy of the same bytes'
"""
    return gnuplot(script, data, png)


def gnuplot(script, data, png):
    """Runs the script (which reads `data`, then removed); png, or why not."""
    r = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
    os.unlink(data)
    if r.returncode:
        return "gnuplot failed: " + r.stderr.strip()
    return png


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--png", required=True)
    ap.add_argument("--quick", default="0")
    a = ap.parse_args()
    samples, fio = load(a.raw)
    sizes = sorted({k[1] for k in samples if k[1] > 0})
    if not sizes:
        sys.exit("report: no measurements in " + a.raw)
    rows, ratios = compute(samples, fio, sizes)
    control = {}
    if ("save_call_seconds", 0, 1) in samples:
        control = {"save_call_ms": summary([s * 1e3 for s in samples[("save_call_seconds", 0, 1)]]),
                   "plan_create_ms": summary(
                       [s * 1e3 for s in samples[("plan_create_seconds", 0, 1)]])}
    # Each target is judged at the largest size measured (docs/DESIGN.md §5.3: 4 GiB).
    big = sizes[-1]
    verdicts = {k: ("met" if test(ratios[big][k]["median"]) else "MISSED")
                for k, _, _, test in TARGETS if k in ratios[big]}
    print_table(rows, ratios, control, sizes, verdicts)
    status = json.load(open(os.path.join(a.raw, "status.json")))
    out = {
        "date": os.path.basename(a.json)[:10],
        "host": platform.node(),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                                     / (1 << 30), 1)},
        "quick": a.quick == "1",
        "agent": {"io": status["io"]["engine"] + ": " + status["io"]["detail"],
                  "pool": status["pool"]["detail"]},
        "sizes_mib": sizes,
        "figures": {str(m): rows[m] for m in sizes},
        "ratios": {str(m): ratios[m] for m in sizes},
        "verdicts_at_mib": big,
        "verdicts": verdicts,
        "control_plane": control,
    }
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\njson: {a.json}\nchart: {chart(rows, sizes, a.png)}")


if __name__ == "__main__":
    main()
