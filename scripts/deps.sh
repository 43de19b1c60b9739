#!/usr/bin/env bash
# Installs the Debian packages ckptd builds and tests with, where missing.
# Usage: scripts/deps.sh [--test]   (--test adds what only the tests need)
set -euo pipefail
pkgs=(build-essential cmake pkg-config liburing-dev libgrpc-dev protobuf-c-compiler
	libprotobuf-c-dev libzstd-dev check libxxhash-dev libjansson-dev libinih-dev
	libmicrohttpd-dev libsystemd-dev libcurl4-openssl-dev)
if [[ ${1:-} == --test ]]; then
	# clang and libclang-rt-14-dev (libFuzzer and the sanitizers' runtimes, only
	# recommended by clang): the fuzz stage; clang-format: the format stage.
	pkgs+=(python3 python3-venv python3-grpcio python3-protobuf protobuf-compiler fio
		gnuplot-nox systemd util-linux e2fsprogs clang libclang-rt-14-dev clang-format)
fi
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed' ||
		missing+=("$p")
done
if ((${#missing[@]})); then
	echo "deps: installing ${missing[*]}"
	if [[ $(id -u) -ne 0 ]]; then
		echo "deps: not root: install them with sudo apt-get install ${missing[*]}" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
