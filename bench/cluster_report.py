#!/usr/bin/env python3
"""Turns bench/cluster_run.sh's raw files into the table, a JSON file and a
gnuplot chart: for each number of agents, the commit latency of every step
(the last part durable to the manifest durable, from the committing agent's
log line "committed job cb step S ... commit latency X ms") and the whole
save (cluster_bench's "step S whole_ms W"), as median and p99; and the CPU a
step of the agents (each) and of the trainers' process, and of both over the
machine's cores."""

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

LATENCY = re.compile(r"committed job cb step (\d+) \(run \S+\): (\d+) ranks from (\d+) nodes?.*"
                     r"commit latency ([0-9.]+) ms")
WHOLE = re.compile(r"step (\d+) whole_ms ([0-9.]+)")


def p99(values):
    """The 99th percentile, nearest rank (with few samples: the largest)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, -(-99 * len(s) // 100) - 1))]


def summary(values):
    return {"median": statistics.median(values), "p99": p99(values), "min": min(values),
            "max": max(values), "n": len(values)}


def load(raw, n, warmup):
    lat, whole = {}, {}
    for path in glob.glob(os.path.join(raw, f"agent-{n}-n*.log")):
        for line in open(path, errors="replace"):
            m = LATENCY.search(line)
            if m and int(m.group(1)) > warmup:
                if int(m.group(2)) != n or int(m.group(3)) != n:
                    sys.exit(f"{path}: step {m.group(1)} has {m.group(2)} ranks from "
                             f"{m.group(3)} nodes, not {n}")
                if m.group(1) in lat:
                    sys.exit(f"step {m.group(1)} committed twice")
                lat[m.group(1)] = float(m.group(4))
    for line in open(os.path.join(raw, f"whole-{n}.txt")):
        m = WHOLE.search(line)
        if m:
            whole[m.group(1)] = float(m.group(2))
    missing = set(whole) - set(lat)
    if missing:
        sys.exit(f"{n} agents: no commit latency logged for steps {sorted(missing)}")
    return [lat[k] for k in sorted(whole, key=int)], [whole[k] for k in sorted(whole, key=int)]


def cpu(raw, n, steps):
    """The CPU of the run a step: per agent, the trainers' process, and all of it over the
    machine's cores (the whole save can be no shorter where every core is busy). None where
    the raw files have no CPU figures (older runs)."""
    try:
        ticks, hz = (int(x) for x in open(os.path.join(raw, f"agents-cpu-{n}.txt")).read().split())
        user, sys_ = (float(x) for x in
                      open(os.path.join(raw, f"trainers-cpu-{n}.txt")).read().split()[-2:])
    except (OSError, ValueError):
        return None
    agents_ms = ticks / hz * 1e3 / steps
    trainers_ms = (user + sys_) * 1e3 / steps
    return {"agent_ms_per_step": agents_ms / n, "trainers_ms_per_step": trainers_ms,
            "all_cores_busy_ms_per_step": (agents_ms + trainers_ms) / (os.cpu_count() or 1)}


def plot(results, png):
    if not shutil.which("gnuplot"):
        print("bench: no gnuplot, no chart", file=sys.stderr)
        return
    data = png + ".dat"
    with open(data, "w") as f:
        for r in results:
            f.write(f"{r['agents']} {r['commit_latency_ms']['median']} "
                    f"{r['commit_latency_ms']['p99']} {r['whole_save_ms']['median']} "
                    f"{r['whole_save_ms']['p99']}\n")
    script = f"""
set terminal pngcairo size 900,500
set output '{png}'
set title 'ckptd, many nodes on one machine: commit latency and whole save'
set xlabel 'agents (one rank each, one shared directory)'
set ylabel 'ms'
set logscale x 2
set key left top
set grid
plot '{data}' using 1:2 with linespoints title 'commit latency, median', \\
     '{data}' using 1:3 with linespoints title 'commit latency, p99', \\
     '{data}' using 1:4 with linespoints title 'whole save, median', \\
     '{data}' using 1:5 with linespoints title 'whole save, p99', \\
     1000 with lines dashtype 2 title 'target: commit p99 1 s at 16 agents'
"""
    subprocess.run(["gnuplot"], input=script.encode(), check=True)
    os.unlink(data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--agents", required=True)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", required=True)
    ap.add_argument("--png", required=True)
    ap.add_argument("--quick", default="0")
    a = ap.parse_args()
    results = []
    for n in [int(x) for x in a.agents.split(",")]:
        lat, whole = load(a.raw, n, a.warmup)
        results.append({"agents": n, "steps": len(whole),
                        "commit_latency_ms": summary(lat), "whole_save_ms": summary(whole),
                        "cpu": cpu(a.raw, n, len(whole) + a.warmup)})
    verdict = None
    for r in results:
        if r["agents"] == 16:
            verdict = {"target": "commit latency p99 <= 1000 ms at 16 agents",
                       "p99_ms": r["commit_latency_ms"]["p99"],
                       "met": r["commit_latency_ms"]["p99"] <= 1000}
    out = {"machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                       "node": platform.node()},
           "quick": a.quick == "1", "results": results, "verdict": verdict}
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"{'agents':>6} {'steps':>5} | {'commit latency median':>22} {'p99':>8} | "
          f"{'whole save median':>18} {'p99':>8}")
    for r in results:
        c, w = r["commit_latency_ms"], r["whole_save_ms"]
        u = r["cpu"]
        print(f"{r['agents']:>6} {r['steps']:>5} | {c['median']:>19.1f} ms {c['p99']:>5.1f} ms"
              f" | {w['median']:>15.1f} ms {w['p99']:>5.1f} ms" +
              (f" | CPU a step: {u['agent_ms_per_step']:.1f} ms an agent, trainers "
               f"{u['trainers_ms_per_step']:.1f} ms, all cores busy "
               f"{u['all_cores_busy_ms_per_step']:.1f} ms" if u else ""))
    if verdict:
        print(f"target (docs/DESIGN.md §5.2): {verdict['target']}: p99 {verdict['p99_ms']:.1f} ms,"
              f" {'met' if verdict['met'] else 'MISSED'}")
    plot(results, a.png)


if __name__ == "__main__":
    main()
