#!/usr/bin/env bash
# PyTorch CPU state dicts (model + AdamW) through torch.save + fsync, DCP
# async_save and ckpt.torch (copied at save; attached), side by side in one
# run on one directory, alone and in a training loop (bench/torch_bench.py
# says what each figure is). Prints median [min, max] per figure and the
# ratios ckptd / DCP; writes bench/results/<date>-<host>-torch.json.
# Needs torch and the ckpt package's dependencies in $python (default
# .venv/bin/python3, as scripts/test.sh makes it).
#
#   bench/torch_run.sh [--sizes MiB,...] [--loop-sizes MiB,...] [--reps N] [--dir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
sizes=1024,4096 loop_sizes=1024,4096 reps=3 dir= quick=0 build=build-bench out=bench/results
python=${python:-$top/.venv/bin/python3}
while (($#)); do
	case $1 in
	--sizes) sizes=$2; shift ;;
	--loop-sizes) loop_sizes=$2; shift ;;
	--reps) reps=$2; shift ;;
	--dir) dir=$2; shift ;;
	--build) build=$2; shift ;;
	--out) out=$2; shift ;;
	--quick) quick=1 ;;
	*) echo "usage: bench/torch_run.sh [--sizes MiB,...] [--loop-sizes MiB,...] [--reps N] [--dir DIR]" >&2
		exit 2 ;;
	esac
	shift
done

. "$top/bench/agent.sh"
bench_build ckpt # libckpt, for the ckpt package
ckptd=$build/agent/ckptd ckptctl=$build/client/ckptctl
bench_workdir ckpt-torch
sizes_all=$sizes,$loop_sizes
largest=$(tr , '\n' <<<"$sizes_all" | sort -n | tail -1)
staging_mb=$((largest + largest / 8 + 64))
start_agent --keep-last 2
file=$out/$(date +%F)-$(hostname -s)-torch.json
mkdir -p "$work/dcp"
CKPT_LIB=$top/$build/client/libckpt.so PYTHONPATH=$top/client/python \
	"$python" "$top/bench/torch_bench.py" --dir "$work/dcp" --endpoint "$sock" \
	--sizes "$sizes" --loop-sizes "$loop_sizes" --reps "$reps" | tee "$raw/lines.jsonl"
python3 "$top/bench/torch_report.py" --json "$file" "$raw/lines.jsonl"
