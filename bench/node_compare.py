#!/usr/bin/env python3
"""Two runs of bench/node_run.sh side by side (e.g. before and after a change
to the agent): every rank's save -> CAPTURED in the order the ranks captured,
one series per size and run, and the main figures of each.

    bench/node_compare.py BEFORE.json AFTER.json OUT.png [--labels before,after]
"""

import argparse
import json
import shutil
import sys

from node_report import ordered
from report import gnuplot


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs=2)
    ap.add_argument("png")
    ap.add_argument("--labels", default="before,after")
    a = ap.parse_args()
    labels = a.labels.split(",")
    gp = shutil.which("gnuplot")
    if not gp:
        sys.exit("node_compare: gnuplot not found")
    data, plots, i = a.png + ".dat", [], 0
    with open(data, "w") as f:
        for label, path in zip(labels, a.runs):
            for r in json.load(open(path))["sizes"]:
                fig = r["figures"]
                print(f"{label:>8} {r['ranks']} x {r['rank_mib']} MiB: CAPTURED median rank "
                      f"{fig['captured_ms_median_rank']['median']:.0f} ms, slowest "
                      f"{fig['captured_ms_max_rank']['median']:.0f} ms; skip: "
                      f"{r['skip']['committed']} of {r['ranks']} committed")
                f.write(f"# {label} {r['ranks']} x {r['rank_mib']} MiB\n")
                for k, med, lo, hi in ordered(r["per_rank"]["captured_ms"], r["ranks"]):
                    f.write(f"{k} {med:.3f} {lo:.3f} {hi:.3f}\n")
                f.write("\n\n")
                dash = "dt 1" if label == labels[-1] else "dt 2"
                plots.append(f"'{data}' index {i} using 1:2:3:4 with yerrorlines lw 2 {dash} "
                             f"title '{label}: {r['ranks']} x {r['rank_mib']} MiB, "
                             f"pool {r['staging_mib']} MiB'")
                i += 1
    script = f"""
set terminal pngcairo size 900,560 enhanced font ',11'
set output '{a.png}'
set title 'One node, 8 ranks: save -> CAPTURED of the k-th rank to capture (median, min-max)'
set xlabel 'k-th rank to capture'
set ylabel 'save -> CAPTURED (ms)'
set grid
set key top left
set xtics 1
set xrange [0.5:8.5]
set yrange [0:*]
plot {", ".join(plots)}
"""
    print(gnuplot(script, data, a.png))


if __name__ == "__main__":
    main()
