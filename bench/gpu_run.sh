#!/usr/bin/env bash
# The CUDA transport on a GPU, side by side in one run on one GPU and one
# directory: cudaMemcpy D2H into pinned memory (the copy engine's limit), fio
# sequential write (the disk's), ckptd (bench/gpu_bench.c) and PyTorch DCP
# async_save (bench/dcp_async.py, where torch is installed) of the same bytes.
#
#   bench/gpu_run.sh [--dir DIR] [--reps N] [--sizes MiB,...] [--build DIR]
#
# Programs come from PATH first (a device bundle's env.sh), else the build
# directory. Writes bench/results/<date>-<host>-gpu.json and prints the table.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
reps=5 sizes=1024,4096,16384 dir= build=build-bench out=bench/results
while (($#)); do
	case $1 in
	--dir) dir=$2; shift ;;
	--reps) reps=$2; shift ;;
	--sizes) sizes=$2; shift ;;
	--build) build=$2; shift ;;
	--out) out=$2; shift ;;
	*) echo "usage: bench/gpu_run.sh [--dir DIR] [--reps N] [--sizes MiB,...] [--build DIR]" >&2; exit 2 ;;
	esac
	shift
done
prog() { command -v "$1" 2>/dev/null || echo "$build/$2/$1"; }
ckptd=$(prog ckptd agent) ckptctl=$(prog ckptctl client) gpu_bench=$(prog gpu_bench bench)
if [[ ! -x $gpu_bench ]]; then
	cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_SANITIZE= >/dev/null
	cmake --build "$build" -j "$(nproc)" --target ckptd ckptctl gpu_bench >/dev/null
	[[ -x $gpu_bench ]] || { echo "bench: no gpu_bench (built without CUDA?)" >&2; exit 77; }
fi
work=$(mktemp -d "${dir:-/var/tmp}/ckpt-gpubench.XXXXXX")
raw=$work/raw
mkdir -p "$raw" "$out"
. "$top/bench/agent.sh"
start_agent --keep-last 1

if command -v fio >/dev/null; then
	for ((rep = 1; rep <= reps; rep++)); do
		for mib in ${sizes//,/ }; do
			fio --name=ckpt --filename="$work/fio.dat" --rw=write --bs=8M --iodepth=8 \
				--ioengine=io_uring --direct=1 --size="${mib}M" --end_fsync=1 \
				--output-format=json >"$raw/fio-write-$mib-$rep.json" 2>/dev/null
			rm -f "$work/fio.dat"
		done
	done
else
	echo "bench: no fio here: the disk reference is left out" >&2
fi
echo "bench: ckptd" >&2
"$gpu_bench" --endpoint "$sock" --sizes "$sizes" --reps "$reps" >"$raw/ckptd.jsonl" || exit $?
echo "bench: DCP async_save" >&2
rc=0
python3 "$top/bench/dcp_async.py" --dir "$work" --sizes "$sizes" --reps "$reps" \
	>"$raw/dcp.jsonl" || rc=$?
((rc == 0 || rc == 77)) || exit "$rc"

name=$(date -u +%Y-%m-%d)-$(hostname -s)-gpu
python3 "$top/bench/gpu_report.py" --raw "$raw" --json "$out/$name.json"
