#!/usr/bin/env bash
# Runs every test, from a fresh clone on Debian 12 as root: installs the
# Debian packages, makes the Python virtual environment the safetensors test
# uses, then builds three ways (plain, ASan+UBSan, TSan) and runs ctest in
# each, and once more without CUDA (as where no toolkit exists: it must build,
# and the unit tests and a round trip must pass). The first three are built
# with fault injection (CKPT_FAULTS, storage/faults.c) for test_faults; the
# nocuda one, like an install, without. Tests that cannot run here (no GPU,
# no io_uring) report skipped. Last, the fuzz stage: every parser's
# libFuzzer target (fuzz/README.md), built with clang in build-fuzz, runs
# CKPT_FUZZ_SECONDS (default 20) each and must not crash, leak or time out.
# First of all, the format stage: every C file in the house format
# (scripts/format.sh --check).
#   scripts/test.sh [format|plain|asan|tsan|nocuda|fuzz]...   (default: all six)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --test

if ! .venv/bin/python3 -c 'import safetensors, numpy' 2>/dev/null; then
	python3 -m venv .venv
	.venv/bin/pip install -q --disable-pip-version-check safetensors numpy
fi

jobs=$(nproc)
builds=("$@")
((${#builds[@]})) || builds=(format plain asan tsan nocuda fuzz)
for b in "${builds[@]}"; do
	cuda=ON tests=. faults=ON
	case $b in
	format)
		scripts/format.sh --check
		continue
		;;
	fuzz)
		scripts/fuzz.sh "${CKPT_FUZZ_SECONDS:-20}"
		continue
		;;
	plain) dir=build san= ;;
	asan) dir=build-asan san=address,undefined ;;
	tsan) dir=build-tsan san=thread ;;
	nocuda) dir=build-nocuda san= cuda=OFF faults=OFF tests='unit/|test_roundtrip|test_badreq' ;;
	*) echo "test.sh: unknown build '$b' (format, plain, asan, tsan, nocuda, fuzz)" >&2; exit 2 ;;
	esac
	echo "== $b build ($dir)"
	cmake -S . -B "$dir" -DCKPT_SANITIZE="$san" -DCKPT_WITH_CUDA="$cuda" \
		-DCKPT_FAULT_INJECTION="$faults" >/dev/null
	cmake --build "$dir" -j "$jobs" >/dev/null
	(cd "$dir" && ctest --output-on-failure --timeout 900 -R "$tests")
done
