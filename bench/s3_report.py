#!/usr/bin/env python3
"""Turns bench/s3_run.sh's raw measurements (s3raw put and get, ckptd with an
s3:// root, ckptd with a directory root and an upload tier, all against one
gateway, repetitions interleaved) into JSON lines, the table and a JSON file.

Each ratio is computed per repetition from neighbours (s3raw, then the two
agents, same repetition), then summarised as the median with min and max.
GB/s are 10^9 bytes per second: SIZE MiB of tensors over the time for
ckptd's s3 root (save -> COMMITTED; the restore call), the bytes the agent
says it sent over the seconds it says it took for the upload tier."""

import argparse
import datetime
import glob
import json
import os
import platform
import re
import sys

from report import MIB, fmt, summary

UPLOADED = re.compile(r"^(\S+) ckptd info: uploaded job (\S+) step (\d+): (\d+) bytes sent"
                      r"(?: \((\d+) compressed\))? in ([0-9.]+) s$")
COMMITTED = re.compile(r"^(\S+) ckptd info: committed job (\S+) step (\d+) ")
TROUBLE = re.compile(r"^\S+ ckptd (warning|error|critical|alert|emerg): ")


def stamp(s):
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


def s3raw(path):
    try:
        with open(path) as f:
            return json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None


def bench(path):
    """{metric: record} of one ckpt_bench --node run, {} if it wrote none."""
    try:
        with open(path) as f:
            return {r["metric"]: r for r in json.load(f)}
    except (OSError, ValueError):
        return {}


def agent_log(path):
    """The upload line, the commit line's time, and any warning or error."""
    out = {"trouble": []}
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return out
    for line in lines:
        m = UPLOADED.match(line)
        if m:
            out["uploaded_line"] = line
            out["uploaded_at"] = stamp(m.group(1))
            out["sent_bytes"] = int(m.group(4))
            if m.group(5):
                out["stored_bytes"] = int(m.group(5))
            out["sent_seconds"] = float(m.group(6))
        m = COMMITTED.match(line)
        if m:
            out["committed_line"] = line
            out["committed_at"] = stamp(m.group(1))
        if TROUBLE.match(line):
            out["trouble"].append(line)
    return out


def first(rec, metric):
    r = rec.get(metric)
    return r["per_rank"][0] if r else None


def repetition(raw, rep, size_b):
    """One repetition's records (as printed) and figures."""
    put, get = (s3raw(os.path.join(raw, f"raw-{op}-{rep}.json")) for op in ("put", "get"))
    rec = {"rep": rep, "raw_put": put, "raw_get": get}
    for tag, want in TAGS:
        b = bench(os.path.join(raw, f"{tag}-{rep}.json"))
        log = agent_log(os.path.join(raw, f"agent-{tag}-{rep}.log"))
        st = b.get("rank_state")
        r = {"state": st["per_rank"][0] if st else "no record",
             "reason": st["reasons"][0] if st else "ckpt_bench wrote nothing",
             "expected": want}
        for k in ("captured", "durable", "committed", "uploaded", "restore"):
            v = first(b, f"rank_{k}_seconds")
            if v is not None:
                r[f"{k}_s"] = v
        for k in ("sent_bytes", "stored_bytes", "sent_seconds", "committed_line",
                  "uploaded_line"):
            if k in log:
                r[k] = log[k]
        if tag.startswith("s3root"):
            try:  # what went to the store: the agent's HTTP bytes up after the run
                st = json.load(open(os.path.join(raw, f"status-after-{tag}-{rep}.json")))
                r["stored_bytes"] = st["io"]["bytes_written"]
            except (OSError, ValueError, KeyError, TypeError):
                pass
        if "committed_at" in log and "uploaded_at" in log:
            r["log_committed_to_uploaded_s"] = round(log["uploaded_at"] - log["committed_at"], 3)
        r["agent_trouble"] = log["trouble"]
        rec[tag] = r
    return rec


def figures(recs, size_b):
    v, q = {}, {}

    def add(d, k, x):
        d.setdefault(k, []).append(x)

    for rec in recs:
        put = rec["raw_put"]["gbps"] if rec["raw_put"] else None
        get = rec["raw_get"]["gbps"] if rec["raw_get"] else None
        if put:
            add(v, "raw_put_gbs", put)
        if get:
            add(v, "raw_get_gbs", get)
        for tag in ("s3root", "s3root_z"):
            s = rec.get(tag)
            if not s or s["state"] != "COMMITTED" or "committed_s" not in s:
                continue
            up = size_b / s["committed_s"] / 1e9
            for k in ("captured", "durable", "committed"):
                add(v, f"{tag}_{k}_s", s[f"{k}_s"])
            add(v, f"{tag}_upload_gbs", up)
            if "stored_bytes" in s:
                add(v, f"{tag}_stored_ratio", size_b / s["stored_bytes"])
            if put:
                add(q, f"{tag}_upload_vs_raw_put", up / put)
            if "restore_s" in s:
                rs = size_b / s["restore_s"] / 1e9
                add(v, f"{tag}_restore_s", s["restore_s"])
                add(v, f"{tag}_restore_gbs", rs)
                if get:
                    add(q, f"{tag}_restore_vs_raw_get", rs / get)
        for tag in ("tier", "tier_z"):
            t = rec.get(tag)
            if not t or t["state"] != "UPLOADED" or "sent_seconds" not in t or \
                    "uploaded_s" not in t:
                continue
            up = t["sent_bytes"] / t["sent_seconds"] / 1e9
            add(v, f"{tag}_committed_s", t["committed_s"])
            add(v, f"{tag}_upload_gbs", up)
            add(v, f"{tag}_sent_s", t["sent_seconds"])
            add(v, f"{tag}_committed_to_uploaded_s", t["uploaded_s"] - t["committed_s"])
            add(v, f"{tag}_save_to_uploaded_s", t["uploaded_s"])
            if "stored_bytes" in t:
                add(v, f"{tag}_stored_ratio", t["sent_bytes"] / t["stored_bytes"])
            if "log_committed_to_uploaded_s" in t:
                add(v, f"{tag}_log_committed_to_uploaded_s", t["log_committed_to_uploaded_s"])
            if "restore_s" in t:
                add(v, f"{tag}_restore_s", t["restore_s"])
            if put:
                add(q, f"{tag}_upload_vs_raw_put", up / put)
    return ({k: summary(x) for k, x in v.items() if x},
            {k: summary(x) for k, x in q.items() if x})


TAGS = (("s3root", "COMMITTED"), ("tier", "UPLOADED"), ("s3root_z", "COMMITTED"),
        ("tier_z", "UPLOADED"))

LINES = [
    ("raw put: s3raw, 8 MiB parts, 8 in flight", "raw_put_gbs", "GB/s"),
    ("raw get: s3raw, 8 MiB ranges, 8 in flight", "raw_get_gbs", "GB/s"),
    ("s3 root: save -> CAPTURED", "s3root_captured_s", "s"),
    ("s3 root: save -> DURABLE (shard's upload complete)", "s3root_durable_s", "s"),
    ("s3 root: save -> COMMITTED", "s3root_committed_s", "s"),
    ("s3 root: upload (SIZE / save -> COMMITTED)", "s3root_upload_gbs", "GB/s"),
    ("s3 root: restore", "s3root_restore_s", "s"),
    ("s3 root: restore (SIZE / restore)", "s3root_restore_gbs", "GB/s"),
    ("upload tier: save -> COMMITTED on the directory root", "tier_committed_s", "s"),
    ("upload tier: the upload, 'sent in T s'", "tier_sent_s", "s"),
    ("upload tier: upload (bytes sent / T)", "tier_upload_gbs", "GB/s"),
    ("upload tier: COMMITTED -> UPLOADED, as the client saw it", "tier_committed_to_uploaded_s",
     "s"),
    ("upload tier: 'committed' -> 'uploaded' log lines", "tier_log_committed_to_uploaded_s", "s"),
    ("upload tier: save -> UPLOADED", "tier_save_to_uploaded_s", "s"),
    ("s3 root, zstd 1: save -> CAPTURED", "s3root_z_captured_s", "s"),
    ("s3 root, zstd 1: save -> COMMITTED", "s3root_z_committed_s", "s"),
    ("s3 root, zstd 1: upload (SIZE / save -> COMMITTED)", "s3root_z_upload_gbs", "GB/s"),
    ("s3 root, zstd 1: restore (SIZE / restore)", "s3root_z_restore_gbs", "GB/s"),
    ("s3 root, zstd 1: SIZE / bytes sent to the store", "s3root_z_stored_ratio", "x"),
    ("s3 root, off: SIZE / bytes sent to the store", "s3root_stored_ratio", "x"),
    ("upload tier, zstd 1: upload (shard bytes / T)", "tier_z_upload_gbs", "GB/s"),
    ("upload tier, zstd 1: COMMITTED -> UPLOADED", "tier_z_committed_to_uploaded_s", "s"),
    ("upload tier, zstd 1: shard bytes / bytes sent", "tier_z_stored_ratio", "x"),
]
RATIOS = [
    ("ckptd s3-root upload / raw put", "s3root_upload_vs_raw_put", ">= 0.8"),
    ("ckptd s3-root restore / raw get", "s3root_restore_vs_raw_get", ">= 0.8"),
    ("upload tier / raw put", "tier_upload_vs_raw_put", ""),
    ("ckptd s3-root zstd upload / raw put", "s3root_z_upload_vs_raw_put", ""),
    ("ckptd s3-root zstd restore / raw get", "s3root_z_restore_vs_raw_get", ""),
    ("upload tier zstd / raw put", "tier_z_upload_vs_raw_put", ""),
]


def print_records(recs):
    print("raw records, one line per measurement")
    for r in recs:
        for op in ("raw_put", "raw_get"):
            print(json.dumps({"rep": r["rep"], "run": op, **(r[op] or {"missing": True})}))
        for tag, _ in TAGS:
            d = {k: x for k, x in r[tag].items()
                 if k not in ("committed_line", "uploaded_line", "agent_trouble")}
            print(json.dumps({"rep": r["rep"], "run": tag, **d}))


def print_table(size_mib, reps, fig, rat, recs):
    print(f"\n{size_mib} MiB, one rank; median [min, max] over {reps} repetition(s); "
          "times in s, bandwidth in GB/s (10^9 B/s)\n")
    for label, key, unit in LINES:
        cell = fmt(fig[key], 1, 3) if key in fig else "-"
        print(f"{label + ' (' + unit + ')':66s}{cell:>28s}")
    print("\nratios (per repetition, side by side)")
    for label, key, target in RATIOS:
        cell = fmt(rat[key]) if key in rat else "-"
        print(f"{label:66s}{cell:>28s}   {'target ' + target if target else ''}")
    bad = [(r["rep"], tag, r[tag]) for r in recs for tag, _ in TAGS
           if r[tag]["state"] != r[tag]["expected"]]
    for rep, tag, x in bad:
        print(f"\nrepetition {rep}, {tag}: {x['state']}, not {x['expected']}: {x['reason']}")
    for r in recs:
        for tag, _ in TAGS:
            for line in r[tag]["agent_trouble"]:
                print(f"repetition {r['rep']}, {tag} agent: {line}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--size", type=int, required=True, help="MiB")
    ap.add_argument("--reps", type=int, required=True)
    ap.add_argument("--gateway", default="")
    ap.add_argument("--json", required=True)
    ap.add_argument("--quick", default="0")
    a = ap.parse_args()
    size_b = a.size * MIB
    recs = [repetition(a.raw, rep, size_b) for rep in range(1, a.reps + 1)]
    if not glob.glob(os.path.join(a.raw, "*-1.json")):
        sys.exit("s3_report: no measurements in " + a.raw)
    fig, rat = figures(recs, size_b)
    print_records(recs)
    print_table(a.size, a.reps, fig, rat, recs)
    status = {}
    for tag, _ in TAGS:
        try:
            st = json.load(open(os.path.join(a.raw, f"status-{tag}.json")))
            status[tag] = {"root": st.get("root"), "io": st.get("io"), "pool": st.get("pool"),
                           "upload": st.get("upload")}
        except (OSError, ValueError):
            pass
    out = {
        "date": os.path.basename(a.json)[:10],
        "host": platform.node(),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                                     / (1 << 30), 1)},
        "quick": a.quick == "1",
        "size_mib": a.size,
        "reps": a.reps,
        "gateway": a.gateway,
        "s3raw": "one libcurl multi handle, the bytes in memory; put: multipart, 8 MiB parts, "
                 "8 in flight; get: HEAD then 8 MiB ranged GETs, 8 in flight",
        "ckptd": "one rank (ckpt_bench --node --ranks 1 --reps 1), a fresh agent per run, "
                 "8 MiB chunks, a pool that holds the rank, 16 S3 connections (the default)",
        "agent_status": status,
        "figures": fig,
        "ratios": rat,
        "repetitions": recs,
    }
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\njson: {a.json}")


if __name__ == "__main__":
    main()
