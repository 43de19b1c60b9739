#!/usr/bin/env bash
# system/man: the manual pages in docs/man render without a warning
# (man -l, groff's warnings on), and say what the programs have:
#   ckptd.8        every flag of `ckptd --help`
#   ckptd.conf.5   every key of `ckptd --check-config`, under its [section]
#   ckptctl.1      every command of `ckptctl --help`
# Skipped (77) where man is missing.
#   test_man.sh MANDIR CKPTD CKPTCTL
set -uo pipefail
dir=$1 ckptd=$2 ckptctl=$3
command -v man >/dev/null || { echo "skipped: man not found"; exit 77; }
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for page in ckptd.8 ckptctl.1 ckptd.conf.5; do
	if ! MANWIDTH=80 man --warnings -l "$dir/$page" >"$tmp/$page.txt" 2>"$tmp/$page.err"; then
		fail "man -l $page: $(head -3 "$tmp/$page.err")"
	elif [[ -s $tmp/$page.err ]]; then
		fail "man -l $page warns: $(head -3 "$tmp/$page.err")"
	elif ! grep -q "^NAME" "$tmp/$page.txt"; then
		fail "man -l $page: no NAME section"
	fi
done

# the rendered text (hyphens as they print), a flag at a time
n=0
for flag in $("$ckptd" --help 2>&1 | grep -o -E '^  --[a-z0-9-]+' | tr -d ' '); do
	n=$((n + 1))
	grep -q -- "$flag" "$tmp/ckptd.8.txt" || fail "ckptd.8 does not say $flag"
done
((n > 40)) || fail "ckptd --help gave $n flags"
echo "ok: ckptd.8 says each of the $n flags of ckptd --help"

# keys: "key = value ; where" lines, or "; key = (not set...)", under "[section]"
n=0
section=
while IFS= read -r line; do
	if [[ $line =~ ^\[([a-z0-9]+)\]$ ]]; then
		section=${BASH_REMATCH[1]}
		grep -q -F "[$section]" "$tmp/ckptd.conf.5.txt" || fail "ckptd.conf.5 has no [$section]"
	elif [[ $line =~ ^(\;\ )?([a-z_0-9]+)\ = ]]; then
		key=${BASH_REMATCH[2]}
		n=$((n + 1))
		# the key, then (before the next [section]) under its own section
		awk -v s="[$section]" -v k="$key" '
			$0 == s { in_s = 1; next }
			/^\[[a-z0-9]+\]$/ { in_s = 0 }
			in_s && ($1 == k) { found = 1 }
			END { exit !found }' "$tmp/ckptd.conf.5.txt" ||
			fail "ckptd.conf.5 does not describe [$section] $key"
	fi
done < <("$ckptd" --config /dev/null --check-config 2>/dev/null)
((n > 40)) || fail "ckptd --check-config gave $n keys"
echo "ok: ckptd.conf.5 describes each of the $n keys, in its section"

n=0
for cmd in $("$ckptctl" --help | awk '/^  [a-z]+/ { print $1 }'); do
	n=$((n + 1))
	grep -q -E "^       $cmd( |$)" "$tmp/ckptctl.1.txt" || fail "ckptctl.1 does not describe $cmd"
done
((n >= 10)) || fail "ckptctl --help gave $n commands"
echo "ok: ckptctl.1 describes each of the $n commands"
((fails == 0))
