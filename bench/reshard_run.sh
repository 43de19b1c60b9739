#!/usr/bin/env bash
# Restore into another layout: a job of world 8 saves two float32 tensors
# ("rows" split on dimension 0, "cols" on dimension 1) through one agent;
# then worlds 8 (the saved layout), 4, 2 and 1 restore them, in turn, each
# rank a process timing its ckpt_restore, every byte checked; beside each,
# the same bytes saved by that world and restored as saved. Prints the
# slowest rank's time per world, median [min, max] over the repetitions,
# and writes bench/results/<date>-<host>-reshard.json.
#
#   bench/reshard_run.sh [--mib M] [--reps N] [--dir DIR] [--agent-flag F]...
# (--agent-flag --no-read-once: the same with each rank reading alone;
# the results file is then named ...-reshard-no-read-once.json)
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
mib=512 reps=3 dir= quick=0 build=build-bench out=bench/results sizes= flags=() tag=
while (($#)); do
	case $1 in
	--mib) mib=$2; shift ;;
	--reps) reps=$2; shift ;;
	--dir) dir=$2; shift ;;
	--build) build=$2; shift ;;
	--out) out=$2; shift ;;
	--agent-flag) flags+=("$2"); tag=$tag${2#-}; shift ;;
	*) echo "usage: bench/reshard_run.sh [--mib M] [--reps N] [--dir DIR] [--agent-flag F]..." >&2
		exit 2 ;;
	esac
	shift
done
sizes=$mib

. "$top/bench/agent.sh"
bench_build reshard_bench
ckptd=$build/agent/ckptd ckptctl=$build/client/ckptctl
bench_workdir ckpt-reshard
start_agent "${flags[@]}"
file=$out/$(date +%F)-$(hostname -s)-reshard${tag:+$tag}.json
"$build/bench/reshard_bench" --endpoint "$sock" --mib "$mib" --reps "$reps" \
	--save-world 8 --restore-worlds 8,4,2,1 | tee "$raw/lines.jsonl"
python3 - "$raw/lines.jsonl" "$file" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault((r["world"], r["baseline"]), []).append(r)
out = []
print("world  saved by  restore s, slowest rank: median [min, max]   GB/s   ÷ baseline  exact")
for w in sorted({k[0] for k in by}, reverse=True):
    base = statistics.median(r["seconds"] for r in by[(w, True)])
    for b in (True, False):
        s = [r["seconds"] for r in by[(w, b)]]
        med = statistics.median(s)
        gbs = by[(w, b)][0]["bytes"] / med / 1e9
        ok = all(r["exact"] for r in by[(w, b)])
        print(f"{w:5d}  {'world ' + str(w) if b else 'world 8':8s}  {med:.3f} [{min(s):.3f}, {max(s):.3f}]"
              f"                {gbs:5.2f}   {base / med:5.2f}     {ok}")
        out.append({"world": w, "baseline": b, "seconds": s, "bytes": by[(w, b)][0]["bytes"],
                    "exact": ok})
json.dump({"save_world": 8, "restores": out}, open(sys.argv[2], "w"), indent=1)
PY
