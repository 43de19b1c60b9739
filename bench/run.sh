#!/usr/bin/env bash
# The benchmark: ckptd side by side with the disk's limit (fio), memcpy, and a
# trainer writing its own checkpoint, in one run on one directory.
#
#   bench/run.sh [--quick] [--dir DIR] [--reps N] [--sizes MiB,MiB,...]
#
# Repetitions are interleaved (fio write, fio read, then ckptd with 1 and 4
# ranks, for each size, rep after rep), so the drift of a noisy machine falls
# on both sides of every ratio alike. Writes bench/results/<date>-<host>.json
# and .png, and prints the table. --quick: 64 MiB, one repetition, well under
# a minute (the test command runs it to check it completes).
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
reps=5 sizes=256,1024,4096 dir= quick=0 build=build-bench out=bench/results
while (($#)); do
	case $1 in
	--quick) quick=1 reps=1 sizes=64 ;;
	--dir) dir=$2; shift ;;
	--reps) reps=$2; shift ;;
	--sizes) sizes=$2; shift ;;
	--build) build=$2; shift ;;
	--out) out=$2; shift ;;
	*) echo "usage: bench/run.sh [--quick] [--dir DIR] [--reps N] [--sizes MiB,...]" >&2; exit 2 ;;
	esac
	shift
done
command -v fio >/dev/null || { echo "bench: fio is needed (apt-get install fio)" >&2; exit 77; }

. "$top/bench/agent.sh"
bench_build ckpt_bench
bench_workdir ckpt-bench
ckptd=$build/agent/ckptd ckptctl=$build/client/ckptctl
start_agent

fio_run() { # rw size_mib rep [tag extra-flags...]
	local rw=$1 mib=$2 rep=$3 tag=${4:-$1}
	shift $(($# < 4 ? $# : 4))
	fio --name=ckpt --filename="$work/fio.dat" --rw="$rw" --bs=8M --iodepth=8 \
		--ioengine=io_uring --direct=1 --size="${mib}M" --end_fsync=1 "$@" \
		--output-format=json >"$raw/fio-$tag-$mib-$rep.json" 2>/dev/null
}

for ((rep = 1; rep <= reps; rep++)); do
	for mib in ${sizes//,/ }; do
		echo "bench: repetition $rep of $reps, $mib MiB" >&2
		fio_run write "$mib" "$rep"
		fio_run read "$mib" "$rep"
		rm -f "$work/fio.dat"
		# the disk's limit as ckptd meets it: registered buffers, like WRITE_FIXED
		fio_run write "$mib" "$rep" writefixed --fixedbufs
		rm -f "$work/fio.dat"
		"$build/bench/ckpt_bench" --endpoint "$sock" --dir "$work" --sizes "$mib" \
			--ranks 1,4 --reps 1 --out "$raw/ckpt-$mib-$rep.json"
	done
done
echo "bench: control plane" >&2
"$build/bench/ckpt_bench" --endpoint "$sock" --dir "$work" --reps "$((reps < 5 ? 5 : reps))" \
	--control-plane "$((quick ? 50 : 1000))" --out "$raw/ckpt-control.json"

name=$(date -u +%Y-%m-%d)-$(hostname -s)
python3 "$top/bench/report.py" --raw "$raw" --json "$out/$name.json" --png "$out/$name.png" \
	--quick "$quick"
