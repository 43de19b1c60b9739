#!/usr/bin/env bash
# The many-nodes commit at cluster scale (bench/scale_bench.c): for each
# case NODESxRANKSxTENSORS, a synthetic root with one step per latency;
# then, per latency, step i committed by node n00000 in a fresh process
# (the roster read apart), and node n00001 watching it in another. Each
# storage call waits the latency (0; 1000 us: a shared filesystem's
# metadata; 10000 us: an object store's request). Appends the JSON lines to
# bench/results/<date>-<host>-scale[-LABEL].jsonl and prints the table
# (bench/scale_report.py).
#
#   bench/scale_run.sh [--quick] [--cases 256x8x300,1024x8x300] [--latencies 0,1000,10000]
#                      [--replicas D [--only-shares]] [--cap-s S] [--mem-gb G] [--label L]
#                      [--dir DIR] [--build B] [--out O]
#
# A commit that has not ended after --cap-s seconds (default 600) is
# stopped and said (CAPPED); one with every part in and no manifest is
# STUCK (the reason from one more poll, at the deadline). Each process runs
# under ulimit -v of --mem-gb GiB (default 12): past it, its allocations
# fail and it says so, rather than the machine running out.
# --replicas D: then, per case, a root of the plans alone where D ranks hold
# each box, and per latency the dedup assignment's shares put as node n00000
# puts them (shares) and node n00001's taken (share_watch); --only-shares:
# those alone, no step generated or committed.
# --quick: 3 nodes x 2 ranks x 3 tensors at 0 and 1000 us, and a third step
# without node n00002's part, capped at 1 s, and 2 replicas (the test
# command runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
cases=256x8x300,1024x8x300 latencies=0,1000,10000 cap=600 mem_gb=12 label= dir= quick=0
replicas=0 only_shares=0
build=build-bench out=bench/results
while (($#)); do
	case $1 in
	--quick) quick=1 cases=3x2x3 latencies=0,1000 cap=20 replicas=2 ;;
	--replicas) replicas=$2; shift ;;
	--only-shares) only_shares=1 ;;
	--cases) cases=$2; shift ;;
	--latencies) latencies=$2; shift ;;
	--cap-s) cap=$2; shift ;;
	--mem-gb) mem_gb=$2; shift ;;
	--label) label=-$2; shift ;;
	--dir) dir=$2; shift ;;
	--build) build=$2; shift ;;
	--out) out=$2; shift ;;
	*) echo "usage: bench/scale_run.sh [--quick] [--cases NxRxT,...] [--latencies US,...]" \
		"[--cap-s S] [--mem-gb G] [--label L] [--dir DIR] [--build B] [--out O]" >&2
		exit 2 ;;
	esac
	shift
done

. "$top/bench/agent.sh"
if [[ ! -x $build/bench/scale_bench ]] || ((! quick)); then
	cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_SANITIZE= >/dev/null
	cmake --build "$build" -j "$(nproc)" --target scale_bench >/dev/null
fi
bench=$build/bench/scale_bench
bench_workdir ckpt-scale
trap 'rm -rf "$work"' EXIT
results=$out/$(date +%F)-$(hostname -s)-scale$label.jsonl
((quick)) && results=$out/quick-scale.jsonl && : >"$results"

# Runs scale_bench under the memory cap; its lines go to the results and the terminal.
sb() {
	(ulimit -v $((mem_gb * 1024 * 1024)) && exec "$bench" "$@") | tee -a "$results"
}

IFS=, read -ra lats <<<"$latencies"
for c in ${cases//,/ }; do
	IFS=x read -r n r t <<<"$c"
	root=$work/root-$c
	steps=${#lats[@]}
	extra=()
	if ((quick)); then
		steps=$((steps + 1)) extra=(--leave-out 2)
	fi
	if ((only_shares)); then
		steps=0
	fi
	((steps)) && echo "scale: $n nodes x $r ranks x $t tensors, $steps steps" >&2
	((steps)) && sb gen --root "$root" --nodes "$n" --ranks "$r" --tensors "$t" --steps "$steps" "${extra[@]}"
	for i in "${!lats[@]}"; do
		((steps)) || break
		step=$((i + 1)) lat=${lats[i]}
		common=(--root "$root" --nodes "$n" --ranks "$r" --tensors "$t" --steps "$steps"
			--step "$step" --op-latency-us "$lat" --cap-s "$cap")
		echo "scale: $c step $step, $lat us per storage call: commit, then watch" >&2
		sb commit "${common[@]}" || echo "scale: the commit of $c step $step failed" >&2
		if [[ $(tail -1 "$results") == *'"state": "COMMITTED"'* ]]; then
			sb watch "${common[@]}" --node $((n > 1 ? 1 : 0)) ||
				echo "scale: the watch of $c step $step failed" >&2
		fi
	done
	if ((quick)); then
		echo "scale: $c step $steps without n00002's part, capped at 1 s" >&2
		sb commit --root "$root" --nodes "$n" --ranks "$r" --tensors "$t" --steps "$steps" \
			--step "$steps" --cap-s 1
	fi
	rm -rf "$root"
	if ((replicas > 0)); then
		# the dedup assignment: plans of D-way replicas, the shares put and one taken
		echo "scale: $c, $replicas replicas of each box: shares, then share_watch" >&2
		sb gen --root "$root" --nodes "$n" --ranks "$r" --tensors "$t" --steps 0 \
			--replicas "$replicas"
		for lat in "${lats[@]}"; do
			common=(--root "$root" --nodes "$n" --ranks "$r" --tensors "$t"
				--replicas "$replicas" --op-latency-us "$lat")
			sb shares "${common[@]}" || echo "scale: the shares of $c failed" >&2
			sb share_watch "${common[@]}" --node $((n > 1 ? 1 : 0)) ||
				echo "scale: the share_watch of $c failed" >&2
		done
		rm -rf "$root"
	fi
done
python3 "$top/bench/scale_report.py" "$results"
