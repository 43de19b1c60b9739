#!/usr/bin/env bash
# The many-nodes benchmark: N agents on one machine (each its own node name,
# socket and staging pool) on one shared directory, a job of world N (one
# rank per agent), S saves. For N in 2, 4, 8, 16: the commit latency of
# every step (the last part durable -> the manifest durable, as the agent
# that commits logs it) and the whole save (the first save call -> the last
# rank told COMMITTED), median and p99, and the CPU the agents and the
# trainers' process used for the steps (warm-up included). Writes
# bench/results/<date>-<host>-cluster.{json,png} and prints the table.
#
#   bench/cluster_run.sh [--quick] [--agents 2,4,8,16] [--steps S] [--mib M] [--tensors T] [--dir DIR]
#
# --quick: 2 and 4 agents, 5 steps (seconds; the test command runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
agents=2,4,8,16 steps=100 mib=4 tensors=1 dir= quick=0 build=build-bench out=bench/results
while (($#)); do
	case $1 in
	--quick) quick=1 agents=2,4 steps=5 ;;
	--agents) agents=$2; shift ;;
	--steps) steps=$2; shift ;;
	--mib) mib=$2; shift ;;
	--tensors) tensors=$2; shift ;;
	--dir) dir=$2; shift ;;
	--build) build=$2; shift ;;
	--out) out=$2; shift ;;
	*) echo "usage: bench/cluster_run.sh [--quick] [--agents N,...] [--steps S] [--mib M] [--dir DIR]" >&2
		exit 2 ;;
	esac
	shift
done

. "$top/bench/agent.sh"
bench_build cluster_bench
ckptd=$build/agent/ckptd ckptctl=$build/client/ckptctl
bench_workdir ckpt-cluster
pids=()
stop_all() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	pids=()
}
trap 'stop_all; rm -rf "$work"' EXIT
# The CPU the agents have used so far, in clock ticks (user + system, /proc/PID/stat).
agents_cpu_ticks() {
	local p t=0 f
	for p in "${pids[@]}"; do
		read -ra f <"/proc/$p/stat"
		# fields 14 and 15 (utime, stime), counted from the end: comm may hold spaces
		t=$((t + f[${#f[@]} - 39] + f[${#f[@]} - 38]))
	done
	echo "$t"
}

for n in ${agents//,/ }; do
	echo "bench: $n agents, $steps steps of $mib MiB per rank" >&2
	root=$work/root-$n
	eps=()
	for ((i = 0; i < n; i++)); do
		sock=unix:$work/n$i.sock
		# a small pool each: 16 agents share this machine's memory and 2 cores
		"$ckptd" --config /dev/null --root "$root" --listen "$sock" --node "n$i" \
			--staging-mb 32 --chunk-mb 4 --capture-threads 1 --copy-threads 0 \
			--log-level info >"$raw/agent-$n-n$i.log" 2>&1 &
		pids+=($!)
		eps+=("$sock")
	done
	for sock in "${eps[@]}"; do
		for _ in $(seq 600); do
			"$ckptctl" --endpoint "$sock" status >/dev/null 2>&1 && break
			sleep 0.1
		done
	done
	a0=$(agents_cpu_ticks)
	# the trainers' process, its user and system CPU into trainers-cpu-N.txt
	python3 -c 'import resource, subprocess, sys
rc = subprocess.run(sys.argv[2:]).returncode
r = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "w").write(f"{r.ru_utime} {r.ru_stime}\n")
sys.exit(rc)' "$raw/trainers-cpu-$n.txt" \
		"$build/bench/cluster_bench" --job cb --steps "$steps" --mib "$mib" --tensors "$tensors" \
		--warmup 3 "${eps[@]}" >"$raw/whole-$n.txt"
	echo "$(($(agents_cpu_ticks) - a0)) $(getconf CLK_TCK)" >"$raw/agents-cpu-$n.txt"
	stop_all
	rm -rf "$root"
done

name=$(date -u +%Y-%m-%d)-$(hostname -s)-cluster
python3 "$top/bench/cluster_report.py" --raw "$raw" --agents "$agents" --warmup 3 \
	--json "$out/$name.json" --png "$out/$name.png" --quick "$quick"
