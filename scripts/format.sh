#!/usr/bin/env bash
# The house format (.clang-format) over every C file of the tree.
#   scripts/format.sh            formats them in place
#   scripts/format.sh --check    changes nothing; lists the files that differ
#                                and fails if any does (the test command's
#                                first stage)
# clang-format 14 (Debian 12's): another version may format differently.
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=$(command -v clang-format-14 || command -v clang-format || true)
if [[ -z $fmt ]]; then
	echo "format.sh: clang-format is missing: scripts/deps.sh --test installs it" >&2
	exit 2
fi
mapfile -t files < <(git ls-files '*.c' '*.h')
if [[ ${1:-} != --check ]]; then
	"$fmt" -i "${files[@]}"
	exit 0
fi
bad=0
for f in "${files[@]}"; do
	if ! "$fmt" --dry-run --Werror "$f" >/dev/null 2>&1; then
		echo "format.sh: $f is not in the house format (scripts/format.sh formats it)" >&2
		bad=1
	fi
done
((!bad)) && echo "format: ${#files[@]} files in the house format"
exit $bad
