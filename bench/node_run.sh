#!/usr/bin/env bash
# One node at full size: 8 trainer ranks (threads of ckpt_bench --node, each
# its own client, as separate trainer processes would be) through one agent,
# each rank's checkpoint larger than its share of the staging pool (the pool
# is a quarter of the step), side by side with fio writing and then reading
# the same bytes as 8 jobs in the same directory.
#
#   bench/node_run.sh [--quick] [--build DIR] [--out DIR] [--reps N] [--dir DIR]
#
# Sizes: 8 x 512 MiB through a 1 GiB pool, 8 x 1 GiB through a 2 GiB pool.
# Repetitions are interleaved (for each size: a fresh agent, fio write, fio
# read, ckptd save of the 8 ranks and their restore at once), so drift falls
# on both sides of every ratio. Then, once per size, the same save with the
# agent's --backpressure skip: how many ranks committed, how many SKIPPED.
# Writes <out>/<date>-<host>-node.json and .png and prints the table.
# --quick: 8 x 32 MiB through a 64 MiB pool, one repetition (seconds; the
# test command runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
ranks=8 reps=3 rank_sizes=512,1024 dir= quick=0 build=build-bench out=bench/results
while (($#)); do
	case $1 in
	--quick) quick=1 reps=1 rank_sizes=32 ;;
	--dir) dir=$2; shift ;;
	--reps) reps=$2; shift ;;
	--build) build=$2; shift ;;
	--out) out=$2; shift ;;
	*) echo "usage: bench/node_run.sh [--quick] [--build DIR] [--out DIR] [--reps N] [--dir DIR]" >&2
		exit 2 ;;
	esac
	shift
done
command -v fio >/dev/null || { echo "bench: fio is needed (apt-get install fio)" >&2; exit 77; }

. "$top/bench/agent.sh"
bench_build ckpt_bench
bench_workdir ckpt-node
ckptd=$build/agent/ckptd ckptctl=$build/client/ckptctl
trap stop_agent EXIT

fio_run() { # rw rank_mib total_mib rep: 8 jobs, one file each, in $work/fio
	fio --name=ckpt --directory="$work/fio" --rw="$1" --bs=8M --iodepth=8 \
		--ioengine=io_uring --direct=1 --size="$2M" --numjobs="$ranks" --group_reporting \
		--end_fsync=1 --output-format=json >"$raw/fio-$1-$3-$4.json" 2>/dev/null
}

node_run() { # rank_mib tag [ckptd flags...]: one save and restore of the 8 ranks
	local rmib=$1 tag=$2 total=$(($1 * ranks))
	shift 2
	staging_mb=$((total / 4)) sizes=$total start_agent "$@"
	cp "$raw/status.json" "$raw/status-$total.json"
	"$build/bench/ckpt_bench" --endpoint "$sock" --dir "$work" --sizes "$total" \
		--ranks "$ranks" --reps 1 --node --out "$raw/node-$tag.json"
	kill_agent
	rm -rf "$work/root" # the step is deleted already; the next agent starts bare
}

for ((rep = 1; rep <= reps; rep++)); do
	for rmib in ${rank_sizes//,/ }; do
		total=$((rmib * ranks))
		echo "bench: repetition $rep of $reps, $ranks x $rmib MiB, pool $((total / 4)) MiB" >&2
		mkdir -p "$work/fio"
		fio_run write "$rmib" "$total" "$rep"
		fio_run read "$rmib" "$total" "$rep"
		rm -rf "$work/fio"
		node_run "$rmib" "$total-$rep"
	done
done
for rmib in ${rank_sizes//,/ }; do
	echo "bench: $ranks x $rmib MiB with --backpressure skip" >&2
	node_run "$rmib" "skip-$((rmib * ranks))" --backpressure skip
done

name=$(date -u +%Y-%m-%d)-$(hostname -s)-node
python3 "$top/bench/node_report.py" --raw "$raw" --ranks "$ranks" --json "$out/$name.json" \
	--png "$out/$name.png" --quick "$quick"
