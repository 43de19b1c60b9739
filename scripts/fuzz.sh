#!/usr/bin/env bash
# Runs the libFuzzer targets of fuzz/ (what each covers: fuzz/README.md).
# Builds build-fuzz with clang (-DCKPT_FUZZ=ON), then runs each target for
# SECONDS (default 3600) on its corpus, build-fuzz/corpus/<target>, which is
# kept from run to run and seeded from fuzz/corpus/<target> (checked in:
# real files and every input that once crashed a parser) and, for rpc, from
# requests made at build time from ckpt.proto.
#
# Fails if any target crashes, leaks, or takes over 10 s on one input: the
# input is kept in build-fuzz/crashes/<target>/, and the log says how to
# replay it (build-fuzz/fuzz/fuzz_<target> INPUT).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]   targets: manifest part plans safetensors config rpc s3xml s3zstd
#   CKPT_FUZZ_JOBS=N   N processes per target (libFuzzer -fork=N), default 1
#   CKPT_FUZZ_PAR=N    N targets at once, default one per core
#   CKPT_FUZZ_FLAGS="-use_value_profile=1 ..."   more libFuzzer options
set -euo pipefail
cd "$(dirname "$0")/.."

all=(manifest part plans safetensors config rpc s3xml s3zstd)
secs=${1:-3600}
(($# > 0)) && shift
if ! [[ $secs =~ ^[1-9][0-9]*$ ]]; then
	echo "fuzz.sh: SECONDS must be a whole number above 0, not '$secs'" >&2
	exit 2
fi
targets=("$@")
((${#targets[@]})) || targets=("${all[@]}")
for t in "${targets[@]}"; do
	if [[ " ${all[*]} " != *" $t "* ]]; then
		echo "fuzz.sh: no target '$t' (there are: ${all[*]})" >&2
		exit 2
	fi
done
if ! command -v clang >/dev/null; then
	echo "fuzz.sh: clang is missing: scripts/deps.sh --test installs it" >&2
	exit 1
fi

echo "== fuzz build (build-fuzz)"
CC=clang cmake -S . -B build-fuzz -DCKPT_FUZZ=ON -DCKPT_WITH_CUDA=OFF >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target fuzz >/dev/null

# One target: its lines into build-fuzz/fuzz-<target>.out, and
# build-fuzz/fuzz-<target>.failed if it failed.
fuzz_one() {
	local t=$1 corpus=build-fuzz/corpus/$1 crashes=build-fuzz/crashes/$1
	local log=build-fuzz/fuzz-$1.log d execs input
	local seeds=() opts=()
	mkdir -p "$corpus" "$crashes"
	rm -f "build-fuzz/fuzz-$t.failed"
	for d in fuzz/corpus/$t build-fuzz/fuzz/seeds/$t; do
		[[ -d $d ]] && seeds+=("$d")
	done
	opts=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
		-artifact_prefix="$crashes/")
	case $t in
	manifest | part | plans) opts+=(-dict=fuzz/manifest.dict) ;;
	safetensors | config | s3xml) opts+=("-dict=fuzz/$t.dict") ;;
	esac
	# shellcheck disable=SC2206 # the flags are words
	opts+=(${CKPT_FUZZ_FLAGS:-})
	if ((${CKPT_FUZZ_JOBS:-1} > 1)); then
		opts+=(-fork="$CKPT_FUZZ_JOBS")
	fi
	echo "== fuzz_$t: $secs s (log: $log)"
	if build-fuzz/fuzz/fuzz_"$t" "${opts[@]}" "$corpus" "${seeds[@]}" >"$log" 2>&1; then
		execs=$(grep -o 'number_of_executed_units: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
		echo "   ok: ${execs:-?} inputs run; corpus $(find "$corpus" -type f | wc -l) inputs"
	else
		tail -n 40 "$log"
		input=$(grep -o "Test unit written to [^ ]*" "$log" | tail -1 | cut -d' ' -f5)
		echo "   FAILED: fuzz_$t (log: $log)"
		echo "   replay: build-fuzz/fuzz/fuzz_$t ${input:-$crashes/...}"
		touch "build-fuzz/fuzz-$t.failed"
	fi
}

# CKPT_FUZZ_PAR targets at once (default: one per core, each one process),
# their lines printed in order once all have run.
par=${CKPT_FUZZ_PAR:-$(nproc)}
for t in "${targets[@]}"; do
	while (($(jobs -rp | wc -l) >= par)); do
		wait -n || true
	done
	fuzz_one "$t" >"build-fuzz/fuzz-$t.out" 2>&1 &
done
wait
failed=()
for t in "${targets[@]}"; do
	cat "build-fuzz/fuzz-$t.out"
	[[ -e build-fuzz/fuzz-$t.failed || ! -s build-fuzz/fuzz-$t.out ]] && failed+=("$t")
done
if ((${#failed[@]})); then
	echo "fuzz.sh: ${failed[*]} failed" >&2
	exit 1
fi
