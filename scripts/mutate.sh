#!/usr/bin/env bash
# Mutation testing: how many small faults put into the code the tests catch.
# Each fault ("mutant") of tests/mutants.txt replaces one exact fragment of
# a source file (\n and \t in it stand for a new line and a tab; it must
# occur once in its file, else the list has gone stale and says so); the tree is built with it and the tests the mutant
# names run (ctest -R, stopping at the first failure). A failing test kills
# it; a mutant every test passes survives: a promise nothing guards. With
# --full, a survivor of its named tests also runs against the whole suite.
#
# Works in build-mutate/: a copy of the working tree's tracked files (src/,
# with .venv linked in) and its build (build/, with fault injection, as the
# test command builds), so the checkout is never touched. The named tests
# must pass unmutated first. S3 tests need CKPT_TEST_S3_* in the environment
# (scripts/rgw.sh), as for ctest; without them they skip.
#
#   scripts/mutate.sh [--full] [--list] [NAME...]   (default: every mutant)
#
# Prints one line per mutant (killed by which test and check, SURVIVED, or
# did not build) and the score; build-mutate/results.txt keeps it, and
# build-mutate/logs/NAME.log what the tests said. Exits 1 when a
# mutant survived or the list is stale. Takes about a minute a mutant on
# two cores: not part of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

full=0 list=0
names=()
for arg in "$@"; do
	case $arg in
	--full) full=1 ;;
	--list) list=1 ;;
	-h | --help)
		sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	-*) echo "mutate.sh: unknown option '$arg' (--full, --list)" >&2; exit 2 ;;
	*) names+=("$arg") ;;
	esac
done

work=build-mutate
mkdir -p "$work"
# tests/mutants.txt → one line per mutant: name, area, file, tests, what (tabs between)
python3 - tests/mutants.txt "$work/list.tsv" "${names[@]}" <<'EOF'
import sys
src, out, want = sys.argv[1], sys.argv[2], sys.argv[3:]
keys = ("name", "area", "what", "file", "from", "to", "tests")
blocks, cur = [], {}
for n, line in enumerate(open(src, encoding="utf-8").read().split("\n"), 1):
    if line.startswith("#"):
        continue
    if not line.strip():
        if cur:
            blocks.append(cur)
        cur = {}
        continue
    key, sep, val = line.partition(": ")
    if not sep or key not in keys or key in cur:
        sys.exit(f"mutate.sh: {src}:{n}: not 'key: value' with a key of {', '.join(keys)} once: {line!r}")
    if "\t" in val:
        sys.exit(f"mutate.sh: {src}:{n}: a tab in the value")
    cur[key] = val
if cur:
    blocks.append(cur)
seen = set()
for b in blocks:
    missing = [k for k in keys if k not in b]
    if missing:
        sys.exit(f"mutate.sh: mutant {b.get('name', '?')}: no {', '.join(missing)}")
    if b["name"] in seen:
        sys.exit(f"mutate.sh: two mutants named {b['name']}")
    seen.add(b["name"])
for w in want:
    if w not in seen:
        sys.exit(f"mutate.sh: no mutant '{w}' in {src}")
with open(out, "w", encoding="utf-8") as f:
    for b in blocks:
        if not want or b["name"] in want:
            f.write("\t".join(b[k] for k in ("name", "area", "file", "tests", "what")) + "\n")
EOF
if ((list)); then
	awk -F'\t' '{ printf "%-28s %-11s %s\n", $1, $2, $5 }' "$work/list.tsv"
	exit 0
fi

# the copy of the tree, refreshed; its build kept from run to run
echo "== copy of the tree and its build ($work)"
mkdir -p "$work/src"
git ls-files -z | tar --null -T - -cf - | tar -C "$work/src" -xf -
[[ -e .venv && ! -e $work/src/.venv ]] && ln -s "$PWD/.venv" "$work/src/.venv"
cmake -S "$work/src" -B "$work/build" -DCKPT_FAULT_INJECTION=ON >/dev/null
build() { cmake --build "$work/build" -j "$(nproc)" >"$work/build.log" 2>&1; }
if ! build; then
	tail -20 "$work/build.log" >&2
	echo "mutate.sh: the unmutated tree does not build (above)" >&2
	exit 1
fi

# ctest on the named tests (its output in build-mutate/logs/LOG.log); prints
# the first that failed, if any, with the check that failed in it
run_tests() { # regex log
	local r=0 t check
	mkdir -p "$work/logs"
	(cd "$work/build" && ctest -R "$1" --timeout 300 --stop-on-failure -j 2 \
		--output-on-failure >"../logs/$2.log" 2>&1) || r=1
	if ((r)); then
		t=$(sed -n 's/^[0-9]*:\([^ ]*\).*/\1/p' \
			"$work/build/Testing/Temporary/LastTestsFailed.log" | head -1)
		# libcheck's "file:line:F:tcase:test:..."
		check=$(sed -n 's/^[^ :]*:[0-9]*:[FE]:[^:]*:\([^:]*\):.*/\1/p' "$work/logs/$2.log" |
			head -1)
		echo "$t${check:+ ($check)}"
	fi
	return $r
}

all_tests=$(cut -f4 "$work/list.tsv" | paste -sd'|')
echo "== the named tests, unmutated"
if ! first=$(run_tests "$all_tests" unmutated); then
	echo "mutate.sh: $first fails without any mutant: fix that first ($work/logs/unmutated.log)" >&2
	exit 1
fi

# apply NAME: the fragment replaced in the copy; 2 when it is not there once
mutant() { # apply|revert name
	python3 - "$1" "$2" tests/mutants.txt "$work/src" <<'EOF'
import os, sys
op, name, src, root = sys.argv[1:]
for block in open(src, encoding="utf-8").read().split("\n\n"):
    b = dict(l.partition(": ")[::2] for l in block.split("\n") if l and not l.startswith("#"))
    if b.get("name") == name:
        break
path = os.path.join(root, b["file"])
orig = open(b["file"], encoding="utf-8").read()  # the checkout's, as it is
if op == "revert":
    if open(path, encoding="utf-8").read() != orig:
        open(path, "w", encoding="utf-8").write(orig)
    sys.exit(0)
def text(v):  # \n and \t stand for a new line and a tab
    return v.replace("\\n", "\n").replace("\\t", "\t")
frm, to = text(b["from"]), text(b["to"])
n = orig.count(frm)
if n != 1:
    print(f"'{b['from']}' occurs {n} times in {b['file']}")
    sys.exit(2)
open(path, "w", encoding="utf-8").write(orig.replace(frm, to))
EOF
}

: >"$work/results.txt"
killed=0 survived=0 stale=0 stillborn=0
say() { echo "$1" | tee -a "$work/results.txt"; }
while IFS=$'\t' read -r name area _file tests what; do
	if ! why=$(mutant apply "$name"); then
		say "$(printf '%-28s %-11s STALE: %s' "$name" "$area" "$why")"
		stale=$((stale + 1))
		continue
	fi
	if ! build; then
		say "$(printf '%-28s %-11s did not build (not counted)' "$name" "$area")"
		stillborn=$((stillborn + 1))
	elif by=$(run_tests "$tests" "$name"); then
		if ((full)); then
			by=$(run_tests . "$name.full") || true
		fi
		if [[ -z $by ]]; then
			say "$(printf '%-28s %-11s SURVIVED: %s' "$name" "$area" "$what")"
			survived=$((survived + 1))
		else
			say "$(printf '%-28s %-11s killed by %s (outside its named tests)' "$name" "$area" "$by")"
			killed=$((killed + 1))
		fi
	else
		say "$(printf '%-28s %-11s killed by %s' "$name" "$area" "$by")"
		killed=$((killed + 1))
	fi
	mutant revert "$name"
done <"$work/list.tsv"
build || true # the copy as it was, for the next run
counted=$((killed + survived))
say "score: $killed of $counted mutants killed, $survived survived$( ((stale)) && echo ", $stale stale")$( ((stillborn)) && echo ", $stillborn did not build")"
((survived == 0 && stale == 0))
