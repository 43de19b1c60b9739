#!/usr/bin/env bash
# Runs every test, from a fresh clone on Debian 12 as root: installs the
# Debian packages, makes the Python virtual environment the safetensors test
# uses, then builds three ways (plain, ASan+UBSan, TSan) and runs ctest in
# each. Tests that cannot run here (no GPU, no io_uring) report skipped.
#   scripts/test.sh [plain|asan|tsan]...   (default: all three)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --test

if ! .venv/bin/python3 -c 'import safetensors, numpy' 2>/dev/null; then
	python3 -m venv .venv
	.venv/bin/pip install -q --disable-pip-version-check safetensors numpy
fi

jobs=$(nproc)
builds=("$@")
((${#builds[@]})) || builds=(plain asan tsan)
for b in "${builds[@]}"; do
	case $b in
	plain) dir=build san= ;;
	asan) dir=build-asan san=address,undefined ;;
	tsan) dir=build-tsan san=thread ;;
	*) echo "test.sh: unknown build '$b' (plain, asan, tsan)" >&2; exit 2 ;;
	esac
	echo "== $b build ($dir)"
	cmake -S . -B "$dir" -DCKPT_SANITIZE="$san" >/dev/null
	cmake --build "$dir" -j "$jobs" >/dev/null
	(cd "$dir" && ctest --output-on-failure --timeout 900)
done
