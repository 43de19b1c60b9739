#!/usr/bin/env bash
# Runs every test, from a fresh clone on Debian 12 as root: installs the
# Debian packages, makes the Python virtual environment the Python tests
# use (safetensors, numpy, torch), then builds three ways (plain,
# ASan+UBSan, TSan) and runs ctest in each, and once more without CUDA (as where no toolkit exists: it must build,
# and the unit tests and a round trip must pass). The first three are built
# with fault injection (CKPT_FAULTS, storage/testing/faults.c) for test_faults; the
# nocuda one, like an install, without. Tests that cannot run here (no GPU,
# no io_uring) report skipped. Last, the fuzz stage: every parser's
# libFuzzer target (fuzz/README.md), built with clang in build-fuzz, runs
# CKPT_FUZZ_SECONDS (default 10) each and must not crash, leak or time out.
# In the plain build ctest runs four tests at once (no one-at-a-time lock:
# -DCKPT_TESTS_ONE_AT_A_TIME=OFF; the suite passes so, run after run). In
# the ASan build -j2, yet one test at a time but for those that mostly wait
# (CKPT_TESTS_BESIDE in CMakeLists.txt: an agent frozen for two minutes; 6 s
# in the sanitizer builds). In the TSan build one test at a time: timing-
# bound tests such as a skip behind a hog need the cores to themselves there.
# First of all, the format stage: every C file in the house format
# (scripts/format.sh --check), and in the house's shape (scripts/shape.py
# --check: no two files calling each other, no call running back up the
# folders' order, no file over 800 lines, no function over 80). Each stage prints its time as it ends
# ("== plain tests: 160 s"), and the end the whole command's.
# The S3 tests talk to a real S3 server: for the stages that run ctest, a
# RADOS Gateway (scripts/rgw.sh) in build-rgw, on RGW_PORT or else the first
# free of 7480, 7490, ..., stopped at the end; its CKPT_TEST_S3_* variables
# are in the tests' environment. Where the ceph packages are missing or it
# does not start, there is none and those tests skip. CKPT_TEST_S3=0 starts
# none: the tests take the CKPT_TEST_S3_* given, if any.
#   scripts/test.sh [format|plain|asan|tsan|nocuda|fuzz]...   (default: all six)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --test

if ! .venv/bin/python3 -c 'import safetensors, numpy' 2>/dev/null; then
	python3 -m venv .venv
	.venv/bin/pip install -q --disable-pip-version-check safetensors numpy
fi
# torch from PyPI for ckpt.torch and ckpt.dcp (integration/test_torch*):
# several GB with its CUDA libraries, about a minute; it runs without a GPU.
# Installed while the first build compiles; the first ctest waits for it.
torch_pid=
if ! .venv/bin/python3 -c 'import torch' 2>/dev/null; then
	.venv/bin/pip install -q --disable-pip-version-check torch >.venv/pip-torch.log 2>&1 &
	torch_pid=$!
fi
torch_ready() {
	[[ -n $torch_pid ]] || return 0
	if ! wait "$torch_pid"; then
		cat .venv/pip-torch.log >&2
		echo "test.sh: pip install torch failed (above)" >&2
		exit 1
	fi
	torch_pid=
}

jobs=$(nproc)
builds=("$@")
((${#builds[@]})) || builds=(format plain asan tsan nocuda fuzz)

rgw=0
for b in "${builds[@]}"; do
	case $b in plain | asan | tsan | nocuda) rgw=1 ;; esac
done
if ((rgw)) && [[ ${CKPT_TEST_S3:-1} != 0 ]]; then
	unset CKPT_TEST_S3_ENDPOINT CKPT_TEST_S3_CREDENTIALS CKPT_TEST_S3_REGION CKPT_TEST_S3_DIR
	if ! command -v radosgw >/dev/null; then
		echo "== no S3 server (radosgw is not installed): the S3 tests skip"
	else
		echo "== S3 server (build-rgw)"
		scripts/rgw.sh down build-rgw >/dev/null || true # what a killed run left
		trap 'scripts/rgw.sh down build-rgw' EXIT
		if RGW_PORT=${RGW_PORT:-auto} scripts/rgw.sh up build-rgw; then
			# shellcheck disable=SC1091 # written by rgw.sh up
			source build-rgw/env
		else
			echo "== no S3 server (it did not start, above): the S3 tests skip"
		fi
	fi
fi
t_all=0 t_stage=0 # bash's SECONDS: from the start of this script
# Each stage's time as it ends, and the whole command's at the end.
took() { # STAGE
	echo "== $1: $((SECONDS - t_stage)) s (all so far: $((SECONDS - t_all)) s)"
	t_stage=$SECONDS
}
took "setup (packages, Python, the S3 server)"
for b in "${builds[@]}"; do
	cuda=ON tests=. faults=ON par=1 lock=ON
	t_stage=$SECONDS
	case $b in
	format)
		scripts/format.sh --check
		if ! shape=$(scripts/shape.py --check); then
			echo "$shape" >&2
			exit 1
		fi
		echo "shape: no two files calling each other, no call running back up, no file over 800 lines"
		took format
		continue
		;;
	fuzz)
		scripts/fuzz.sh "${CKPT_FUZZ_SECONDS:-10}"
		took fuzz
		continue
		;;
	plain) dir=build san='' par=4 lock=OFF ;;
	asan) dir=build-asan san=address,undefined par=2 ;;
	tsan) dir=build-tsan san=thread par=2 ;;
	nocuda) dir=build-nocuda san='' cuda=OFF faults=OFF tests='unit/|test_roundtrip|test_badreq' ;;
	*) echo "test.sh: unknown build '$b' (format, plain, asan, tsan, nocuda, fuzz)" >&2; exit 2 ;;
	esac
	echo "== $b build ($dir)"
	cmake -S . -B "$dir" -DCKPT_SANITIZE="$san" -DCKPT_WITH_CUDA="$cuda" \
		-DCKPT_FAULT_INJECTION="$faults" -DCKPT_TESTS_ONE_AT_A_TIME="$lock" >/dev/null
	cmake --build "$dir" -j "$jobs" >/dev/null
	took "$b build"
	torch_ready
	(cd "$dir" && ctest --output-on-failure --timeout 900 -j "$par" -R "$tests")
	took "$b tests"
done
torch_ready
echo "== test.sh: every stage passed in $((SECONDS - t_all)) s"
