"""What bench/quick asserts of the results run.sh --quick wrote (the newest
DIR/*-vm.json or the like): every size asked has every figure and ratio, each
measured as often as asked (n) with finite values above zero; every verdict is
"met" or "MISSED" and there is one per ratio with a target; the control plane
timed every call it made. Nothing about how fast: figures on a shared machine
vary, what they are made of must not.

    python3 bench/check_quick.py DIR
"""
import glob
import json
import math
import sys

FIGURES = {"fio_write_gbs", "fio_read_gbs", "fio_writefixed_gbs", "memcpy_s", "intrainer_s",
           "stall_s_1r", "durable_s_1r", "commit_s_1r", "persist_gbs_1r", "restore_s_1r",
           "restore_gbs_1r", "stall_s_4r", "durable_s_4r", "commit_s_4r", "persist_gbs_4r",
           "restore_s_4r", "restore_gbs_4r"}
RATIOS = {"persist_vs_fio_write", "persist_vs_fio_writefixed", "restore_vs_fio_read",
          "stall_vs_memcpy", "intrainer_vs_stall", "intrainer_vs_memcpy",
          "aggregate4_vs_fio_write"}


def stat_ok(name, s, n):
    assert s["n"] == n, f"{name}: measured {s['n']} times, not {n}"
    for k in ("median", "min", "max"):
        v = s[k]
        assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, f"{name}: {k} = {v!r}"
    assert s["min"] <= s["median"] <= s["max"], f"{name}: {s}"


def main(d):
    files = [f for f in sorted(glob.glob(d + "/*.json")) if not f.endswith(("-cluster.json", "-node.json"))]
    assert files, f"no results in {d}"
    j = json.load(open(files[-1]))
    assert j["quick"] is True, j["quick"]
    sizes = [str(s) for s in j["sizes_mib"]]
    assert sizes == ["64"], sizes
    for size in sizes:
        fig, rat = j["figures"][size], j["ratios"][size]
        assert set(fig) == FIGURES, f"figures of {size} MiB: {sorted(set(fig) ^ FIGURES)}"
        assert set(rat) == RATIOS, f"ratios of {size} MiB: {sorted(set(rat) ^ RATIOS)}"
        for k, s in fig.items():
            stat_ok(f"{size} MiB {k}", s, 1)
        for k, s in rat.items():
            stat_ok(f"{size} MiB {k}", s, 1)
    v = j["verdicts"]
    assert v and set(v) <= RATIOS, v
    assert all(x in ("met", "MISSED") for x in v.values()), v
    cp = j["control_plane"]
    stat_ok("save_call_ms", cp["save_call_ms"], 50)
    stat_ok("plan_create_ms", cp["plan_create_ms"], 5)
    print(f"ok: {files[-1]}: {len(FIGURES)} figures, {len(RATIOS)} ratios, {len(v)} verdicts")


if __name__ == "__main__":
    main(sys.argv[1])
