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
# --first: a run's first save instead. Four agents (nodes n0..n3) on one
# root, started a second apart, each node's ranks (R / 4 of them) started
# as soon as its agent serves; "meet": the ranks meet once every plan is
# made, then save step 1 (a data-parallel job's start: its first step needs
# every rank), "now": each saves step 1 as soon as its plan is made.
# Agents as they run by default (--plans-wait 5) and with --plans-wait 0
# (no wait: the first save writes every replica, as before the wait); "now"
# also with --plans-wait 30.
# Prints, per start, replicas and wait, the shards' bytes of steps 1 and 2
# (the manifest's) over the unique bytes (step 2's less its extra copies),
# the largest of the repetitions, and the slowest rank's step 1 from
# ckpt_save to COMMITTED; writes bench/results/<date>-<host>-dedup-first.json.
#
#   bench/dedup_run.sh [--mib M] [--reps N] [--dir DIR] [--first]
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
mib=256 reps=3 dir= quick=0 build=build-bench out=bench/results sizes= first=0
while (($#)); do
	case $1 in
	--mib) mib=$2; shift ;;
	--reps) reps=$2; shift ;;
	--dir) dir=$2; shift ;;
	--build) build=$2; shift ;;
	--out) out=$2; shift ;;
	--first) first=1 ;;
	*) echo "usage: bench/dedup_run.sh [--mib M] [--reps N] [--dir DIR] [--first]" >&2
		exit 2 ;;
	esac
	shift
done
sizes=$mib

. "$top/bench/agent.sh"
if ((first)); then
	bench_build dedup_bench
	ckptd=$build/agent/ckptd ckptctl=$build/client/ckptctl
	bench_workdir ckpt-first
	nodes=4 agents=()
	stop_all() {
		local p
		for p in "${agents[@]}"; do
			kill "$p" 2>/dev/null || true
			wait "$p" 2>/dev/null || true
		done
		agents=()
	}
	trap 'stop_all; rm -rf "$work"' EXIT
	for rep in $(seq "$reps"); do
		for r in 4 8; do
			for start_wait in meet:5 meet:0 now:5 now:30; do
				start=${start_wait%:*} wait=${start_wait#*:}
				tag=$start-r$r-w$wait-$rep pids=() meet=()
				if [[ $start == meet ]]; then
					mkdir -p "$work/meet-$tag"
					meet=(--meet "$work/meet-$tag")
				fi
				for i in $(seq 0 $((nodes - 1))); do
					((i == 0)) || sleep 1 # the nodes start at different times
					s=unix:$work/n$i-$tag.sock
					"$ckptd" --root "$work/root-$tag" --node "n$i" --listen "$s" \
						--staging-mb $((mib * r / nodes + 64)) --plans-wait "$wait" \
						--config /dev/null >"$raw/n$i-$tag.log" 2>&1 &
					agents+=($!)
					for _ in $(seq 600); do
						"$ckptctl" --endpoint "$s" status >/dev/null 2>&1 && break
						sleep 0.1
					done
					"$build/bench/dedup_bench" --endpoint "$s" --mib "$mib" --reps 1 \
						--replicas "$r" --nodes "$nodes" --node "$i" --job "first-$start-w$wait-$rep" \
						"${meet[@]}" >"$raw/$tag-n$i.jsonl" &
					pids+=($!)
				done
				for p in "${pids[@]}"; do wait "$p"; done
				job=first-$start-w$wait-$rep-r$r-on-0
				for step in 1 2; do
					"$ckptctl" --endpoint "unix:$work/n0-$tag.sock" --json show "$job" "$step" \
						>"$raw/$tag-$step.json"
				done
				stop_all
			done
		done
	done
	python3 - "$raw" "$out/$(date +%F)-$(hostname -s)-dedup-first.json" "$mib" "$reps" <<'PY'
import json, os, statistics, sys
raw, out, mib, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
res = []
print("start  replicas  plans-wait  step 1 bytes ÷ unique  step 2 ÷ unique  step 1 s (slowest rank): median [min, max]")
for start, w in (("meet", 5), ("meet", 0), ("now", 5), ("now", 30)):
    for r in (4, 8):
        b1, b2, s1 = [], [], []
        for rep in range(1, reps + 1):
            tag = f"{start}-r{r}-w{w}-{rep}"
            m1 = json.load(open(os.path.join(raw, f"{tag}-1.json")))
            m2 = json.load(open(os.path.join(raw, f"{tag}-2.json")))
            unique = m2["bytes"] - m2["layout"]["bytes_in_extra_copies"]
            b1.append(m1["bytes"] / unique)
            b2.append(m2["bytes"] / unique)
            lines = [json.loads(l) for n in range(4)
                     for l in open(os.path.join(raw, f"{tag}-n{n}.jsonl"))]
            s1.append(max(l["first_seconds"] for l in lines))
        print(f"{start:5s}  {r:8d}  {w:10d}  {max(b1):21.3f}  {max(b2):15.3f}  "
              f"{statistics.median(s1):.3f} [{min(s1):.3f}, {max(s1):.3f}]")
        res.append({"start": start, "replicas": r, "plans_wait": w, "step1_over_unique": b1,
                    "step2_over_unique": b2, "step1_seconds": s1})
json.dump({"mib": mib, "nodes": 4, "first": res}, open(out, "w"), indent=1)
PY
	exit 0
fi
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
