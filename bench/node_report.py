#!/usr/bin/env python3
"""Turns bench/node_run.sh's raw measurements (one node: 8 ranks through one
agent, fio with 8 jobs beside it) into the table, a JSON file and a gnuplot
chart of every rank's save -> CAPTURED.

Each ratio is computed per repetition from neighbours (fio write and read,
then ckptd, same size, same repetition), then summarised as the median with
min and max. Per-rank figures are summarised over the ranks of a repetition
(min, median, max rank) and those over the repetitions; the raw per-rank
values are kept."""

import argparse
import glob
import json
import os
import platform
import re
import shutil
import statistics
import sys

from report import MIB, fmt, gnuplot, summary


def load(raw):
    """{total_mib: {rep: {metric: record}}}, {total_mib: skip records}, fio."""
    reps, skip, fio = {}, {}, {}
    for path in sorted(glob.glob(os.path.join(raw, "node-*.json"))):
        tag = re.search(r"node-(.+)\.json$", path).group(1)
        for rec in json.load(open(path)):
            if tag.startswith("skip-"):
                skip.setdefault(rec["size_mib"], {})[rec["metric"]] = rec
            else:
                rep = int(tag.split("-")[1])
                reps.setdefault(rec["size_mib"], {}).setdefault(rep, {})[rec["metric"]] = rec
    for path in sorted(glob.glob(os.path.join(raw, "fio-*.json"))):
        rw, mib, rep = re.search(r"fio-(write|read)-(\d+)-(\d+)\.json$", path).groups()
        job = json.load(open(path))["jobs"][0]  # group_reporting: the 8 jobs together
        fio.setdefault((rw, int(mib)), {})[int(rep)] = job[rw]["bw_bytes"]
    return reps, skip, fio


def states(rec):
    s = rec["per_rank"]
    return {"per_rank": s, "committed": s.count("COMMITTED"), "skipped": s.count("SKIPPED"),
            "failed": s.count("FAILED"),
            "reasons": sorted({r for r in rec["reasons"] if r})}


def size_figures(total, reps, fio, ranks):
    """Per repetition, then summarised; a repetition whose ranks did not all
    commit gives no timing (its states are kept)."""
    b = total * MIB
    per = {k: [] for k in ("captured_ms", "durable_ms", "committed_ms", "restore_ms", "states")}
    v = {k: [] for k in ("captured_ms_min_rank", "captured_ms_median_rank",
                         "captured_ms_max_rank", "durable_ms_slowest_rank",
                         "committed_ms_slowest_rank", "all_committed_ms", "persist_gbs",
                         "fio_write_gbs", "restore_gbs", "fio_read_gbs")}
    q = {"persist_vs_fio_write": [], "restore_vs_fio_read": []}
    for rep in sorted(reps):
        m = reps[rep]
        st = m["rank_state"]["per_rank"]
        per["states"].append(st)
        if st != ["COMMITTED"] * ranks:
            continue
        ms = lambda metric: [round(x * 1e3, 3) for x in m[metric]["per_rank"]]
        cap, dur, com = ms("rank_captured_seconds"), ms("rank_durable_seconds"), \
            ms("rank_committed_seconds")
        per["captured_ms"].append(cap)
        per["durable_ms"].append(dur)
        per["committed_ms"].append(com)
        per["restore_ms"].append(ms("rank_restore_seconds"))
        v["captured_ms_min_rank"].append(min(cap))
        v["captured_ms_median_rank"].append(statistics.median(cap))
        v["captured_ms_max_rank"].append(max(cap))
        v["durable_ms_slowest_rank"].append(max(dur))
        v["committed_ms_slowest_rank"].append(max(com))
        # the first save call -> every rank COMMITTED; the first restore call -> the last done
        whole_commit = m["commit_seconds"]["samples"][0]
        v["all_committed_ms"].append(whole_commit * 1e3)
        persist = b / whole_commit / 1e9
        restore = b / m["restore_seconds"]["samples"][0] / 1e9
        v["persist_gbs"].append(persist)
        v["restore_gbs"].append(restore)
        fw, fr = fio.get(("write", total), {}).get(rep), fio.get(("read", total), {}).get(rep)
        if fw:
            v["fio_write_gbs"].append(fw / 1e9)
            q["persist_vs_fio_write"].append(persist / (fw / 1e9))
        if fr:
            v["fio_read_gbs"].append(fr / 1e9)
            q["restore_vs_fio_read"].append(restore / (fr / 1e9))
    return ({k: summary(x) for k, x in v.items() if x},
            {k: summary(x) for k, x in q.items() if x}, per)


LINES = [
    ("rank save -> CAPTURED, fastest rank", "captured_ms_min_rank", "ms"),
    ("rank save -> CAPTURED, median rank", "captured_ms_median_rank", "ms"),
    ("rank save -> CAPTURED, slowest rank", "captured_ms_max_rank", "ms"),
    ("save -> DURABLE, slowest rank", "durable_ms_slowest_rank", "ms"),
    ("save -> COMMITTED, slowest rank", "committed_ms_slowest_rank", "ms"),
    ("first save call -> every rank COMMITTED", "all_committed_ms", "ms"),
    ("ckptd aggregate to COMMITTED", "persist_gbs", "GB/s"),
    ("fio write, 8 jobs (O_DIRECT, io_uring, 8M x 8)", "fio_write_gbs", "GB/s"),
    ("ckptd restore, 8 ranks at once (aggregate)", "restore_gbs", "GB/s"),
    ("fio read, 8 jobs", "fio_read_gbs", "GB/s"),
]
RATIOS = [("ckptd aggregate / fio write", "persist_vs_fio_write"),
          ("ckptd restore / fio read", "restore_vs_fio_read")]


def print_table(res):
    heads = [f"{r['ranks']} x {r['rank_mib']} MiB, pool {r['staging_mib']} MiB" for r in res]
    print("\nmedian [min, max] over repetitions; times in ms, bandwidth in GB/s\n")
    print(f"{'':56s}" + "".join(f"{h:>30s}" for h in heads))
    for label, key, unit in LINES:
        cells = "".join(f"{fmt(r['figures'][key], 1, 1 if unit == 'ms' else 2):>30s}"
                        if key in r["figures"] else f"{'-':>30s}" for r in res)
        print(f"{label + ' (' + unit + ')':56s}{cells}")
    print("\nratios (per repetition, side by side)")
    for label, key in RATIOS:
        cells = "".join(f"{fmt(r['ratios'][key]):>30s}" if key in r["ratios"] else f"{'-':>30s}"
                        for r in res)
        print(f"{label:56s}{cells}")
    print("\nevery rank's save -> CAPTURED (ms), rank 0 first, per repetition")
    for r in res:
        for i, cap in enumerate(r["per_rank"]["captured_ms"]):
            print(f"  {r['ranks']} x {r['rank_mib']} MiB, rep {i + 1}: "
                  + " ".join(f"{x:.0f}" for x in cap))
    print("\n--backpressure skip, one save of the 8 ranks")
    for r in res:
        s = r.get("skip")
        if s:
            print(f"  {r['ranks']} x {r['rank_mib']} MiB: {s['committed']} COMMITTED, "
                  f"{s['skipped']} SKIPPED, {s['failed']} FAILED "
                  f"({', '.join(s['per_rank'])})")
            for why in s["reasons"]:
                print(f"    reason: {why}")


def ordered(caps, ranks):
    """Per repetition the ranks' CAPTURED times sorted (the k-th to capture),
    then for each k: median, min, max over repetitions. Which rank captures
    first changes from one repetition to the next: the order is what a job
    sees (its step waits for the last)."""
    reps = [sorted(c) for c in caps if len(c) == ranks]
    out = []
    for k in range(ranks):
        vals = [c[k] for c in reps]
        if vals:
            out.append((k + 1, statistics.median(vals), min(vals), max(vals)))
    return out


def chart(res, png):
    """Every rank's save -> CAPTURED, in the order they captured: the median
    over repetitions, min-max bars."""
    gp = shutil.which("gnuplot")
    if not gp:
        return "gnuplot not found: no chart"
    data, plots = png + ".dat", []
    with open(data, "w") as f:
        for i, r in enumerate(res):
            caps = r["per_rank"]["captured_ms"]
            f.write(f"# {r['ranks']} x {r['rank_mib']} MiB: k-th to capture, median_ms min_ms max_ms\n")
            for k, med, lo, hi in ordered(caps, r["ranks"]):
                f.write(f"{k} {med:.3f} {lo:.3f} {hi:.3f}\n")
            f.write("\n\n")
            plots.append(f"'{data}' index {i} using 1:2:3:4 with yerrorlines lw 2 "
                         f"title '{r['ranks']} x {r['rank_mib']} MiB, "
                         f"pool {r['staging_mib']} MiB'")
    script = f"""
set terminal pngcairo size 900,560 enhanced font ',11'
set output '{png}'
set title 'One node: save -> CAPTURED of the k-th rank to capture (median of repetitions, min-max)'
set xlabel 'k-th rank to capture'
set ylabel 'save -> CAPTURED (ms)'
set grid
set key top left
set xtics 1
set xrange [0.5:{max(r['ranks'] for r in res) + 0.5}]
set yrange [0:*]
plot {", ".join(plots)}
"""
    return gnuplot(script, data, png)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--json", required=True)
    ap.add_argument("--png", required=True)
    ap.add_argument("--quick", default="0")
    a = ap.parse_args()
    reps, skip, fio = load(a.raw)
    totals = sorted(set(reps) | set(skip))
    if not totals:
        sys.exit("node_report: no measurements in " + a.raw)
    res = []
    for total in totals:
        figures, ratios, per = size_figures(total, reps.get(total, {}), fio, a.ranks)
        status = json.load(open(os.path.join(a.raw, f"status-{total}.json")))
        r = {"ranks": a.ranks, "rank_mib": total // a.ranks, "total_mib": total,
             "staging_mib": total // 4, "pool": status["pool"]["detail"],
             "reps": len(reps.get(total, {})), "figures": figures, "ratios": ratios,
             "per_rank": per}
        if "rank_state" in skip.get(total, {}):
            r["skip"] = states(skip[total]["rank_state"])
        res.append(r)
    print_table(res)
    out = {
        "date": os.path.basename(a.json)[:10],
        "host": platform.node(),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                                     / (1 << 30), 1)},
        "quick": a.quick == "1",
        "agent": {"io": status["io"]["engine"] + ": " + status["io"]["detail"]},
        "fio": "8 jobs, one file each, O_DIRECT, io_uring, bs 8M, iodepth 8, end_fsync=1, "
               "group_reporting; write, then read of the same files",
        "sizes": res,
    }
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\njson: {a.json}\nchart: {chart(res, a.png)}")


if __name__ == "__main__":
    main()
