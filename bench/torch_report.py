#!/usr/bin/env python3
"""The table of bench/torch_bench.py's figures: median [min, max] per
method and size, and the ratios ckptd / DCP async_save.

    torch_report.py --json OUT.json LINES.jsonl...

Lines from several runs may be given (each figure is side by side within
its own run); they are written together to OUT.json.
"""
import argparse
import json
import statistics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("lines", nargs="+")
    a = ap.parse_args()
    lines = [json.loads(x) for f in a.lines for x in open(f) if x.startswith("{")]
    json.dump(lines, open(a.json, "w"), indent=1)
    by = {}
    for x in lines:
        by.setdefault((x["metric"], x["mib"]), []).append(x["seconds"])

    def fig(metric, mib):
        v = by.get((metric, mib))
        return (statistics.median(v), min(v), max(v)) if v else None

    def show(v):
        return "%.3f [%.3f, %.3f]" % v if v else "-"

    for mib in sorted({m for _, m in by}):
        real = next((x["real_mib"] for x in lines if x["mib"] == mib and "real_mib" in x), mib)
        print("\n%d MiB (%.0f MiB of tensors):" % (mib, real))
        print("  %-14s %-28s %-28s" % ("method", "stall s", "durable s"))
        for m in ("torch_save", "dcp_async", "ckpt_copy", "ckpt_attached"):
            if fig(m + "_stall", mib):
                print("  %-14s %-28s %-28s" % (m, show(fig(m + "_stall", mib)),
                                               show(fig(m + "_durable", mib))))
        d, dd = fig("dcp_async_stall", mib), fig("dcp_async_durable", mib)
        for m in ("ckpt_copy", "ckpt_attached"):
            s, du = fig(m + "_stall", mib), fig(m + "_durable", mib)
            if d and s:
                print("  %s / dcp_async: stall %.3f, durable %.3f"
                      % (m, s[0] / d[0], du[0] / dd[0]))
        ls = [x for x in lines if x["metric"] == "loop_step" and x["mib"] == mib]
        if ls:
            print("  loop: batch %d, a step %.3f s, the capture %.3f s"
                  % (ls[0]["batch"], ls[0]["seconds"], ls[0]["capture"]))
            print("  %-14s %-28s %-28s" % ("method", "loop s", "lost per checkpoint s"))
            print("  %-14s %-28s" % ("none", show(fig("loop_none", mib))))
            for m in ("dcp_async", "ckpt_copy", "ckpt_attached"):
                print("  %-14s %-28s %-28s" % (m, show(fig("loop_" + m, mib)),
                                               show(fig("loop_lost_" + m, mib))))
            d = fig("loop_lost_dcp_async", mib)
            for m in ("ckpt_copy", "ckpt_attached"):
                v = fig("loop_lost_" + m, mib)
                if d and v and d[0] > 0:
                    print("  %s / dcp_async, lost per checkpoint: %.3f" % (m, v[0] / d[0]))
    print("\nraw:", a.json)


if __name__ == "__main__":
    main()
