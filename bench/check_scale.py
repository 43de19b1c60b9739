#!/usr/bin/env python3
"""Checks what bench/scale_run.sh --quick wrote (its JSON lines): the root
was generated; each step with every part committed, by node n00000, with a
manifest, and node n00001 saw it committed; the storage's calls were
counted (reads and their bytes); a watching node's roster was the run's
roster file that the committer wrote from the summaries; the step without node n00002's part did
not commit and its reason names that node; the dedup assignment's shares
were put by node n00000 alone (every summary and file read, one share a
node and the set mark written) and node n00001 took its own in 3 reads,
writing less than it holds. Nothing about timing.

    bench/check_scale.py RESULTS.jsonl"""

import json
import sys


def main():
    lines = [json.loads(t) for t in open(sys.argv[1]) if t.startswith("{")]
    by = {}
    for d in lines:
        by.setdefault(d["phase"], []).append(d)
    commits, watches = by.get("commit", []), by.get("watch", [])
    gen = [g for g in by.get("gen", []) if g["steps"] > 0]  # steps 0: the plans for shares
    assert len(gen) == 1 and gen[0]["left_out"] == 2, gen
    steps = gen[0]["steps"]
    assert [c["step"] for c in commits] == list(range(1, steps + 1)), commits
    assert len(by.get("roster", [])) == steps and all(r["rc"] == 0 for r in by["roster"]), by
    for c in commits[:-1]:
        assert c["state"] == "COMMITTED" and c["wrote"] and c["manifest_bytes"] > 0, c
        assert c["ops"]["obj_get"]["n"] >= 1 and c["ops"]["obj_get"]["bytes"] > 0, c
        assert c["calls"] == sum(v["n"] for v in c["ops"].values()), c
        assert c["peak_rss_kb"] > 0 and c["rss_before_kb"] > 0, c
    last = commits[-1]
    assert last["state"] != "COMMITTED" and last["manifest_bytes"] == 0, last
    assert last["missing"] == 1 and "n00002" in last["reason"], last
    assert [w["step"] for w in watches] == list(range(1, steps)), watches
    # once a run, rank 0's node reads every node's plans summary and the
    # other nodes' files whole, and writes the run's roster; every other node
    # reads that roster and the plans generation: 2 reads, no listing
    nodes = gen[0]["nodes"]
    wr = by.get("watch_roster", [])
    assert len(wr) == len(watches) and all(r["rc"] == 0 for r in wr), wr
    for r, c in zip(wr, by["roster"]):
        assert c["ops"]["obj_get"]["n"] >= 2 * nodes - 1 and "obj_list" in c["ops"], c
        assert r["ops"]["obj_get"]["n"] == 2 and "obj_list" not in r["ops"], r
    for w in watches:
        assert w["state"] == "COMMITTED" and not w["wrote"] and w["node"] == "n00001", w
        assert w["ops"]["obj_get"]["bytes"] > 0, w
    shares, taken = by.get("shares", []), by.get("share_watch", [])
    assert shares and len(shares) == len(taken), by
    for p, t in zip(shares, taken):
        assert p["rc"] == 0 and p["replicas"] > 1 and p["nodes_read"] == nodes, p
        assert p["ops"]["obj_get"]["n"] == 2 * nodes + 1, p  # generation, summaries, files
        assert p["ops"]["obj_put"]["n"] == nodes + 1, p  # a share a node, the set mark
        assert p["written_bytes"] == p["unique_bytes"] > 0, p
        assert t["rc"] == 0 and t["calls"] == 3 and t["ops"]["obj_get"]["n"] == 3, t
        assert t["cuts"] > 0 and 0 < t["writes_bytes"] < t["holds_bytes"], t
    print(f"check_scale: {len(commits)} commits, {len(watches)} watches, "
          f"{len(shares)} shares as expected")


if __name__ == "__main__":
    main()
