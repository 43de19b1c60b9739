#!/usr/bin/env bash
# Replicas written once vs every replica writing its copy: 4 and 8 data-
# parallel replicas of one model (float32, M MiB) save through one agent,
# each rank a process; step 2 (the plan set complete since step 1) is timed
# from ckpt_save to COMMITTED, the slowest rank's; the bytes written are
# the shards' sizes the manifest records. Prints, per replicas, dedup off
# and on: seconds median [min, max], bytes, and the ratios. Then read-once:
# the replicas (dedup on) restore LATEST together (each rank's plan made
# first), timed, through an agent with read-once and one with
# --no-read-once; bytes read and delivered from `ckptctl status`. Writes
# bench/results/<date>-<host>-dedup.json.
#
#   bench/dedup_run.sh [--mib M] [--reps N] [--dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
mib=256 reps=3 dir= quick=0 build=build-bench out=bench/results sizes=
while (($#)); do
	case $1 in
	--mib) mib=$2; shift ;;
	--reps) reps=$2; shift ;;
	--dir) dir=$2; shift ;;
	--build) build=$2; shift ;;
	--out) out=$2; shift ;;
	*) echo "usage: bench/dedup_run.sh [--mib M] [--reps N] [--dir DIR]" >&2
		exit 2 ;;
	esac
	shift
done
sizes=$mib

. "$top/bench/agent.sh"
bench_build dedup_bench
ckptd=$build/agent/ckptd ckptctl=$build/client/ckptctl
bench_workdir ckpt-dedup
staging_mb=$((mib * 2 + 64))
start_agent
file=$out/$(date +%F)-$(hostname -s)-dedup.json
"$build/bench/dedup_bench" --endpoint "$sock" --mib "$mib" --reps "$reps" | tee "$raw/lines.jsonl"
while read -r line; do
	j=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["job"])' "$line")
	"$ckptctl" --endpoint "$sock" --json show "$j" 2 >"$raw/$j.json"
done <"$raw/lines.jsonl"
# read-once on and off, the same restores through agents started each way
restores() { # $1: on|off, $2: rep
	local r s0 s1
	for r in 4 8; do
		s0=$("$ckptctl" --endpoint "$sock" --json status)
		"$build/bench/dedup_bench" --endpoint "$sock" --mib "$mib" --reps 1 --replicas "$r" \
			--restore --job "ro-$1-$2" >"$raw/ro.line"
		s1=$("$ckptctl" --endpoint "$sock" --json status)
		python3 -c '
import json, sys
l = json.loads(open(sys.argv[1]).read()); a = json.loads(sys.argv[2]); b = json.loads(sys.argv[3])
l["read_once"] = sys.argv[4] == "on"
l["read_bytes"] = b["restores"]["read_bytes"] - a["restores"]["read_bytes"]
l["delivered_bytes"] = b["restores"]["delivered_bytes"] - a["restores"]["delivered_bytes"]
print(json.dumps(l))' "$raw/ro.line" "$s0" "$s1" "$1" >>"$raw/restores.jsonl"
	done
}
for rep in $(seq "$reps"); do
	for mode in on off; do
		kill_agent
		if [[ $mode == on ]]; then start_agent; else start_agent --no-read-once; fi
		restores "$mode" "$rep"
	done
done
cat "$raw/restores.jsonl"
python3 - "$raw" "$file" "$mib" <<'PY'
import json, os, statistics, sys
raw, out, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(os.path.join(raw, "lines.jsonl"))]
by = {}
for r in rows:
    m = json.load(open(os.path.join(raw, r["job"] + ".json")))
    r["bytes"] = m["bytes"]
    r["balance"] = m["layout"]["balance"]
    by.setdefault((r["replicas"], r["dedup"]), []).append(r)
res = []
print("replicas  dedup  save s (to COMMITTED, slowest rank): median [min, max]  bytes written  balance")
for rep in sorted({k[0] for k in by}):
    for d in (False, True):
        v = by[(rep, d)]
        s = [r["seconds"] for r in v]
        print(f"{rep:8d}  {'on ' if d else 'off'}    {statistics.median(s):.3f} [{min(s):.3f}, {max(s):.3f}]"
              f"                     {v[0]['bytes']:13d}  {v[0]['balance']:.3f}")
        res.append({"replicas": rep, "dedup": d, "seconds": s, "bytes": v[0]["bytes"],
                    "balance": v[0]["balance"]})
    off = statistics.median(r["seconds"] for r in by[(rep, False)])
    on = statistics.median(r["seconds"] for r in by[(rep, True)])
    print(f"          on ÷ off: time {on / off:.2f}, bytes "
          f"{by[(rep, True)][0]['bytes'] / by[(rep, False)][0]['bytes']:.3f} (1/{rep} = {1 / rep:.3f})")
ro = [json.loads(l) for l in open(os.path.join(raw, "restores.jsonl"))]
rres = []
print("replicas  read-once  restore s (slowest rank): median [min, max]  bytes read  delivered  read ÷ delivered")
for rep in sorted({r["replicas"] for r in ro}):
    for on in (False, True):
        v = [r for r in ro if r["replicas"] == rep and r["read_once"] == on]
        s = [r["restore_seconds"] for r in v]
        print(f"{rep:8d}  {'on ' if on else 'off'}        {statistics.median(s):.3f} [{min(s):.3f}, {max(s):.3f}]"
              f"                   {v[0]['read_bytes']:11d}  {v[0]['delivered_bytes']:9d}  "
              f"{v[0]['read_bytes'] / v[0]['delivered_bytes']:.3f}")
        rres.append({"replicas": rep, "read_once": on, "restore_seconds": s,
                     "read_bytes": [r["read_bytes"] for r in v],
                     "delivered_bytes": [r["delivered_bytes"] for r in v]})
    off = statistics.median(r["restore_seconds"] for r in ro if r["replicas"] == rep and not r["read_once"])
    on = statistics.median(r["restore_seconds"] for r in ro if r["replicas"] == rep and r["read_once"])
    print(f"          on ÷ off: restore time {on / off:.2f}")
json.dump({"mib": mib, "runs": res, "restores": rres}, open(out, "w"), indent=1)
PY
