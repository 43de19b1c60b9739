#!/usr/bin/env bash
# The many-nodes demo, from a fresh clone on Debian 12 as root: four agents
# on this machine stand for four nodes (each its own --node, socket and
# staging pool) on one shared directory, the only thing they have in common;
# a job of world 8 runs two trainer ranks on each.
#
#   1. the job trains and saves: every checkpoint commits with 4 parts
#   2. node n2 is killed in the middle of a save: the other nodes' ranks
#      fail at the commit deadline, naming n2 and its ranks; LATEST stays
#   3. n2 is back: every rank restores LATEST byte-exact through its own
#      agent, and the job (a new run) trains on and commits again
#
#   scripts/cluster-demo.sh [ROOT]     (ROOT: the shared directory; default a temporary one)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target ckptd ckptctl demo_trainer >/dev/null

work=$(mktemp -d /tmp/ckptd-cluster.XXXXXX)
root=${1:-$work/shared}
nodes=4 world=8 deadline=5
ctl() { build/client/ckptctl --endpoint "unix:$work/$1.sock" "${@:2}"; }
pids=()
start_node() { # n<i>
	build/agent/ckptd --config /dev/null --root "$root" --listen "unix:$work/$1.sock" --node "$1" \
		--staging-mb 256 --commit-deadline "$deadline" --log-level notice >>"$work/$1.log" 2>&1 &
	pids[${1#n}]=$!
	for _ in $(seq 100); do ctl "$1" status >/dev/null 2>&1 && break; sleep 0.1; done
}
trainers() { # mode args...: the 8 ranks, rank r on node n(r/2); waits for all
	local mode=$1 r p=()
	shift
	for ((r = 0; r < world; r++)); do
		build/examples/demo_trainer --endpoint "unix:$work/n$((r / 2)).sock" --job cdemo \
			--rank "$r" --world "$world" --mb 16 --tensors 8 "$@" &
		p+=($!)
	done
	local failed=0
	for pid in "${p[@]}"; do wait "$pid" || failed=$((failed + 1)); done
	echo "== $mode: $((world - failed)) of $world ranks ended well"
}
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT

for ((i = 0; i < nodes; i++)); do start_node "n$i"; done
echo "== 4 agents (nodes n0..n3) on $root; each serves 2 ranks of a world-8 job"

echo "== 1. training, run r1: steps 1..20, a save every 5"
trainers "training" --run r1 --steps 20 --save-every 5 | grep -E "ranks ended|last save"
ctl n0 list cdemo
echo "== the parts each checkpoint merged (ckptctl show cdemo 20, on node n3)"
ctl n3 show cdemo 20 | grep -E "^run|parts"

echo "== 2. node n2 killed in the middle of a save (commit deadline $deadline s)"
trainers "training" --run r1 --from 21 --steps 400 --save-every 100 2>&1 |
	grep -E "ranks ended|last save" &
saving=$!
# n2 goes once its ranks' step-100 save is on its way
until [[ -d $root/cdemo/step-000000000100 ]]; do sleep 0.05; done
{ kill -9 "${pids[2]}" && wait "${pids[2]}"; } 2>/dev/null || true
echo "== n2 killed"
wait "$saving" || true
echo "== what node n0 logged of step 100, and LATEST:"
grep -m1 "step 100 rank 0 FAILED" "$work/n0.log" || true
echo "LATEST = $(cat "$root/cdemo/LATEST")"

echo "== 3. n2 is back; every rank restores LATEST through its own agent"
start_node n2
trainers "restore" --resume | grep -E "ranks ended|verified" | sort
latest=$(cat "$root/cdemo/LATEST")
echo "== and trains on from step $((latest + 1)) as run r2"
trainers "training" --run r2 --from "$((latest + 1))" --steps "$((latest + 10))" --save-every 5 |
	grep -E "ranks ended"
ctl n1 list cdemo | tail -3
echo "== ckptctl verify cdemo $((latest + 10)) (on node n2)"
ctl n2 verify cdemo "$((latest + 10))"
echo "== done: checkpoints are under $root; the agents' logs under $work"
