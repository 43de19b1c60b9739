#!/usr/bin/env python3
"""Turns bench/scale_run.sh's JSON lines (scale_bench's) into the tables of
bench/RESULTS.md and an SVG chart: per case and latency, the commit (the
roster read apart, the first poll to COMMITTED, peak memory, the manifest,
the storage's calls), the watch of a node that does not commit, and the
generation.

    bench/scale_report.py RESULTS.jsonl... [--svg OUT.svg] [--title TEXT]

No dependency beyond the standard library: the chart is written by hand."""

import argparse
import json
import math
import sys


def load(paths):
    lines = []
    for path in paths:
        for text in open(path):
            text = text.strip()
            if text.startswith("{"):
                lines.append(json.loads(text))
    return lines


def case(d):
    return f"{d['nodes']} x {d['ranks_per_node']} x {d['tensors']}"


def mb(n):
    return f"{n / 1e6:.1f}" if n < 1e9 else f"{n / 1e9:.2f} G"


def reads(ops):
    """Calls that read (count) and the bytes they read."""
    kinds = ("obj_get", "shard_read")
    return (sum(ops.get(k, {}).get("n", 0) for k in kinds),
            sum(ops.get(k, {}).get("bytes", 0) for k in kinds))


def ops_text(ops):
    return ", ".join(f"{k} {v['n']}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1]["n"]))


def cpu(d):
    """The CPU seconds of the polls (older lines have none)."""
    return f"{d['cpu_ms'] / 1e3:.2f}" if "cpu_ms" in d else "-"


def key(d):
    return (d["nodes"], d["ranks_per_node"], d["tensors"], d["latency_us"], d.get("step"))


def table_gen(lines):
    out = ["| nodes x ranks x tensors | chunks per step | steps | threads | time (s) | "
           "parts per step (MB) | shards (MB) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for d in lines:
        if d["phase"] == "gen":
            out.append(f"| {case(d)} | {d['chunks']:,} | {d['steps']} | {d['threads']} | "
                       f"{d['wall_ms'] / 1e3:.1f} | {mb(d['parts_bytes_per_step'])} | "
                       f"{mb(d['shard_bytes'])} |")
    return out


def table_commit(lines):
    roster = {key(d): d for d in lines if d["phase"] == "roster"}
    out = ["| nodes x ranks x tensors | latency | roster (s) | state | first poll -> end (s) | "
           "CPU (s) | polls | RSS before / peak (MiB) | manifest (MB) | storage calls | read (MB) |",
           "|---|---:|---:|---|---:|---:|---:|---:|---:|---|---:|"]
    notes = []
    for d in lines:
        if d["phase"] != "commit":
            continue
        ro = roster.get(key(d))
        rs = f"{ro['wall_ms'] / 1e3:.2f}" if ro else "-"
        n, b = reads(d["ops"])
        out.append(f"| {case(d)} | {d['latency_us'] / 1e3:g} ms | {rs} | {d['state']} | "
                   f"{d['wall_ms'] / 1e3:.2f} | {cpu(d)} | {d['polls']} | {d['rss_before_kb'] / 1024:.0f} "
                   f"/ {d['peak_rss_kb'] / 1024:.0f} | {mb(d['manifest_bytes'])} | "
                   f"{d['calls']:,} ({ops_text(d['ops'])}) | {mb(b)} |")
        if d["state"] != "COMMITTED" and d.get("reason"):
            extra = f" (that poll: {d['explain_ms'] / 1e3:.1f} s)" if "explain_ms" in d else ""
            notes.append(f"- {case(d)} at {d['latency_us'] / 1e3:g} ms, {d['state']}: "
                         f"{d['reason']}{extra}")
    return out + ([""] + notes if notes else [])


def roster_text(ro):
    """A roster line: its time, and the reads it made (count, MB)."""
    if not ro:
        return "-"
    n, b = reads(ro["ops"])
    return f"{ro['wall_ms'] / 1e3:.2f} s, {n:,} reads, {mb(b)} MB"


def table_watch(lines):
    roster = {key(d): d for d in lines if d["phase"] == "watch_roster"}
    out = ["| nodes x ranks x tensors | latency | its roster, once a run | state | polls | "
           "time (s) | CPU (s) | storage calls | read (MB) | RSS before / peak (MiB) |",
           "|---|---:|---|---|---:|---:|---:|---|---:|---:|"]
    for d in lines:
        if d["phase"] == "watch":
            out.append(f"| {case(d)} | {d['latency_us'] / 1e3:g} ms | "
                       f"{roster_text(roster.get(key(d)))} | {d['state']} | "
                       f"{d['polls']} | {d['wall_ms'] / 1e3:.2f} | {cpu(d)} | {d['calls']:,} "
                       f"({ops_text(d['ops'])}) | {mb(reads(d['ops'])[1])} | "
                       f"{d['rss_before_kb'] / 1024:.0f} / {d['peak_rss_kb'] / 1024:.0f} |")
    return out


def table_shares(lines):
    """The dedup assignment: node n00000 puts every node's share, node n00001 takes its own."""
    watch = {key(d): d for d in lines if d["phase"] == "share_watch"}
    out = ["| nodes x ranks x tensors | replicas | latency | n00000: time (s) | CPU (s) | "
           "peak RSS (MiB) | storage calls | read (MB) | written (MB) | n00001: calls | "
           "read (KB) | time (ms) | its cuts |",
           "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for d in lines:
        if d["phase"] != "shares":
            continue
        w = watch.get(key(d))
        wn, wb = reads(w["ops"]) if w else (0, 0)
        put = d["ops"].get("obj_put", {}).get("bytes", 0)
        out.append(f"| {case(d)} | {d['replicas']} | {d['latency_us'] / 1e3:g} ms | "
                   f"{d['wall_ms'] / 1e3:.2f} | {cpu(d)} | {d['peak_rss_kb'] / 1024:.0f} | "
                   f"{d['calls']:,} ({ops_text(d['ops'])}) | {mb(reads(d['ops'])[1])} | "
                   f"{mb(put)} | " +
                   (f"{w['calls']} | {wb / 1e3:.1f} | {w['wall_ms']:.1f} | {w['cuts']:,} |"
                    if w else "- | - | - | - |"))
    return out if len(out) > 2 else []


COLORS = ["#1b6ca8", "#d1495b", "#2e8b57", "#8a5a00", "#6a4c93", "#444444"]


def svg(lines, title):
    """Commit time against the number of nodes, one line per (ranks, tensors, latency), log-log."""
    series = {}
    for d in lines:
        if d["phase"] == "commit":
            k = (d["ranks_per_node"], d["tensors"], d["latency_us"])
            series.setdefault(k, []).append((d["nodes"], max(d["wall_ms"], 1) / 1e3, d["state"]))
    pts = [p for v in series.values() for p in v]
    if not pts:
        return None
    W, H, L, R, T, B = 800, 440, 70, 250, 40, 50
    x0, x1 = math.log2(min(p[0] for p in pts)), math.log2(max(p[0] for p in pts))
    y0, y1 = math.floor(math.log10(min(p[1] for p in pts))), math.ceil(
        math.log10(max(p[1] for p in pts)))
    x1, y1 = max(x1, x0 + 1), max(y1, y0 + 1)

    def X(n):
        return L + (math.log2(n) - x0) / (x1 - x0) * (W - L - R)

    def Y(s):
        return H - B - (math.log10(s) - y0) / (y1 - y0) * (H - T - B)

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'font-family="sans-serif" font-size="12">', f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{L}" y="22" font-size="14">{title}</text>']
    for e in range(y0, y1 + 1):
        y = Y(10 ** e)
        o.append(f'<line x1="{L}" y1="{y:.1f}" x2="{W - R}" y2="{y:.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{L - 8}" y="{y + 4:.1f}" text-anchor="end">{10 ** e:g} s</text>')
    for n in sorted({p[0] for p in pts}):
        x = X(n)
        o.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{H - B}" stroke="#eee"/>')
        o.append(f'<text x="{x:.1f}" y="{H - B + 16}" text-anchor="middle">{n}</text>')
    o.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">nodes (log)</text>')
    o.append(f'<text x="16" y="{(T + H - B) / 2}" transform="rotate(-90 16 {(T + H - B) / 2})" '
             f'text-anchor="middle">first poll to the end of the commit (log)</text>')
    for i, (k, v) in enumerate(sorted(series.items())):
        c = COLORS[i % len(COLORS)]
        v.sort()
        path = " ".join(f"{X(n):.1f},{Y(s):.1f}" for n, s, _ in v)
        o.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        for n, s, st in v:
            if st == "COMMITTED":
                o.append(f'<circle cx="{X(n):.1f}" cy="{Y(s):.1f}" r="4" fill="{c}"/>')
            else:
                x, y = X(n), Y(s)
                o.append(f'<path d="M{x - 5:.1f},{y - 5:.1f}L{x + 5:.1f},{y + 5:.1f}M{x - 5:.1f},'
                         f'{y + 5:.1f}L{x + 5:.1f},{y - 5:.1f}" stroke="{c}" stroke-width="2"/>')
                o.append(f'<text x="{x + 8:.1f}" y="{y + 4:.1f}" fill="{c}">{st.lower()}</text>')
        ly = T + 10 + 18 * i
        o.append(f'<line x1="{W - R + 15}" y1="{ly}" x2="{W - R + 35}" y2="{ly}" stroke="{c}" '
                 f'stroke-width="2"/>')
        o.append(f'<text x="{W - R + 40}" y="{ly + 4}">{k[0]} ranks x {k[1]} tensors, '
                 f'{k[2] / 1e3:g} ms/call</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--svg")
    ap.add_argument("--title", default="ckptd: one commit at cluster scale (scale_bench)")
    a = ap.parse_args()
    lines = load(a.results)
    if not lines:
        sys.exit(f"scale_report: no results in {', '.join(a.results)}: did scale_bench run?")
    print("\n".join(["Generation:", ""] + table_gen(lines) + ["", "Commit (node n00000):", ""] +
                    table_commit(lines) + ["", "Watch (node n00001):", ""] + table_watch(lines)))
    shares = table_shares(lines)
    if shares:
        print("\n".join(["", "Shares of the dedup assignment (n00000 puts, n00001 takes):", ""] +
                        shares))
    if a.svg:
        text = svg(lines, a.title)
        if text:
            open(a.svg, "w").write(text)
            print(f"\nchart: {a.svg}")


if __name__ == "__main__":
    main()
