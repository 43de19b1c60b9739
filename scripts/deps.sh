#!/usr/bin/env bash
# Installs the Debian packages ckptd builds and tests with, where missing.
# Usage: scripts/deps.sh [--test]   (--test adds what only the tests need)
set -euo pipefail
optional=()
pkgs=(build-essential cmake pkg-config liburing-dev libgrpc-dev protobuf-c-compiler
	libprotobuf-c-dev libzstd-dev check libxxhash-dev libjansson-dev libinih-dev
	libmicrohttpd-dev libsystemd-dev libcurl4-openssl-dev)
if [[ ${1:-} == --test ]]; then
	# clang and libclang-rt-14-dev (libFuzzer and the sanitizers' runtimes, only
	# recommended by clang): the fuzz stage; clang-format and universal-ctags
	# (scripts/shape.py): the format stage.
	pkgs+=(python3 python3-venv python3-grpcio python3-protobuf protobuf-compiler fio
		gnuplot-nox systemd util-linux e2fsprogs clang libclang-rt-14-dev clang-format
		universal-ctags zstd)
	# The S3 tests' server, a RADOS Gateway (scripts/rgw.sh): where these
	# cannot be installed, the rest still is and those tests skip.
	optional=(ceph-mon ceph-osd radosgw)
fi
export DEBIAN_FRONTEND=noninteractive
missing() { # the packages of "$@" not installed
	local p
	for p; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed' ||
			echo "$p"
	done
}
updated=0
install() {
	echo "deps: installing $*"
	if ((!updated)); then
		apt-get update -qq
		updated=1
	fi
	apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
mapfile -t missing < <(missing "${pkgs[@]}")
if ((${#missing[@]})); then
	if [[ $(id -u) -ne 0 ]]; then
		echo "deps: not root: install them with sudo apt-get install ${missing[*]}" >&2
		exit 1
	fi
	install "${missing[@]}"
fi
# promtool, for the alert rules' test (tests/system/test_alerts.sh): taken
# out of Debian's prometheus package into .tools/, not installed (the
# package would start a Prometheus server). Without it that test skips.
tools=$(cd "$(dirname "$0")/.." && pwd)/.tools
if [[ ${1:-} == --test && ! -x $tools/promtool ]]; then
	if [[ $(id -u) -eq 0 ]] && ((!updated)); then
		apt-get update -qq
		updated=1
	fi
	tmp=$(mktemp -d)
	if (cd "$tmp" && apt-get download -qq prometheus >/dev/null 2>&1 &&
		dpkg -x prometheus_*.deb x) && command install -D -m 0755 "$tmp/x/usr/bin/promtool" "$tools/promtool"; then
		echo "deps: promtool in $tools"
	else
		echo "deps: could not fetch Debian's prometheus package: the alert rules' test skips" >&2
	fi
	rm -rf "$tmp"
fi
mapfile -t missing < <(missing "${optional[@]}")
if ((${#missing[@]})); then
	if [[ $(id -u) -ne 0 ]]; then
		echo "deps: not root: without ${missing[*]} (sudo apt-get install ${missing[*]}) the S3 tests skip" >&2
	elif ! install "${missing[@]}"; then
		echo "deps: ${missing[*]} could not be installed: the S3 tests skip" >&2
	fi
fi
