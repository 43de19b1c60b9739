#!/usr/bin/env bash
# Object storage: ckptd against an S3 gateway, side by side with a plain
# client (bench/s3raw: one libcurl multi handle, the bytes in memory) moving
# the same bytes to and from the same gateway.
#
#   bench/s3_run.sh [--quick] [--size MiB] [--reps N] [--build DIR] [--out DIR] [--dir DIR]
#
# Each repetition, in this order (interleaved: drift falls on both sides of
# every ratio):
#   raw put     s3raw put of SIZE bytes, 8 MiB parts, 8 in flight
#   raw get     s3raw get of it, 8 MiB ranges, 8 in flight
#   s3 root     a fresh agent on --root s3://BUCKET/repN/root: one rank
#               saving SIZE (ckpt_bench --node --ranks 1): save -> COMMITTED
#               (the shard's multipart upload complete, the manifest put),
#               then its restore (ranged GETs into staging)
#   upload tier a fresh agent on a directory root with --upload-root
#               s3://BUCKET/repN/tier: the same save, committed on disk, then
#               waited for until UPLOADED (ckpt_bench --uploaded); the agent
#               logs "uploaded job J step S: N bytes sent in T s"
#   s3 root zstd, upload tier zstd   the same two with --s3-compress zstd and
#               --upload-compress zstd (level 1): the bytes that went to the
#               store from the agent's status (s3 root) or its log line
# Every ckptd run saves float32 weights ~ N(0, 0.02) (ckpt_bench --weights),
# which zstd level 1 shrinks by ~7 % (bench/zstdcost).
# Both agents: the default chunk (8 MiB, the parts), a staging pool that
# holds the whole rank (start_agent), the default 16 S3 connections,
# --log-level info (their logs are kept in the results).
# The gateway: the one CKPT_TEST_S3_ENDPOINT, _CREDENTIALS, _REGION and _DIR
# name (scripts/rgw.sh up DIR writes them in DIR/env), else one started here
# by scripts/rgw.sh in the work directory (RGW_PORT, default auto) and
# stopped at the end. A bucket of its own per run, removed at the end.
# Writes <out>/<date>-<host>-s3.json and prints the raw records and the
# table (bench/s3_report.py).
# Defaults: SIZE 1024 MiB, 3 repetitions; --quick: 256 MiB, one repetition.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
size=1024 reps=3 dir='' quick=0 build=build-bench out=bench/results
while (($#)); do
	case $1 in
	--quick) quick=1 size=256 reps=1 ;;
	--size) size=$2; shift ;;
	--reps) reps=$2; shift ;;
	--dir) dir=$2; shift ;;
	--build) build=$2; shift ;;
	--out) out=$2; shift ;;
	*) echo "usage: bench/s3_run.sh [--quick] [--size MiB] [--reps N] [--build DIR] [--out DIR] [--dir DIR]" >&2
		exit 2 ;;
	esac
	shift
done
[[ $size =~ ^[1-9][0-9]*$ && $reps =~ ^[1-9][0-9]*$ ]] ||
	{ echo "bench: --size and --reps take positive integers" >&2; exit 2; }

. "$top/bench/agent.sh"
bench_build ckpt_bench s3raw
bench_workdir ckpt-s3
ckptd=$build/agent/ckptd ckptctl=$build/client/ckptctl s3raw=$build/bench/s3raw
own_gw=0 bucket=''

# The end, however it comes: the agent, the bucket (an external gateway) or
# the gateway started here, the work directory. start_agent makes
# stop_agent the EXIT trap: here it does all of this.
stop_agent() {
	kill_agent
	if ((own_gw)); then
		scripts/rgw.sh down "$work/rgw" >&2 || true
	elif [[ -n $bucket ]]; then
		scripts/rgw.sh rmbucket "$CKPT_TEST_S3_DIR" "$bucket" >&2 || true
	fi
	rm -rf "$work"
}
trap stop_agent EXIT
trap 'exit 130' INT TERM

if [[ -n ${CKPT_TEST_S3_ENDPOINT:-} && -n ${CKPT_TEST_S3_CREDENTIALS:-} &&
	-n ${CKPT_TEST_S3_REGION:-} && -n ${CKPT_TEST_S3_DIR:-} ]]; then
	gw_what="external: $CKPT_TEST_S3_ENDPOINT (CKPT_TEST_S3_DIR=$CKPT_TEST_S3_DIR)"
else
	command -v radosgw >/dev/null ||
		{ echo "bench: no gateway: set CKPT_TEST_S3_* or install radosgw (scripts/deps.sh --test)" >&2; exit 77; }
	own_gw=1
	RGW_PORT=${RGW_PORT:-auto} scripts/rgw.sh up "$work/rgw" >&2
	# shellcheck disable=SC1091 # written by rgw.sh up
	source "$work/rgw/env"
	gw_what="started here by scripts/rgw.sh: $CKPT_TEST_S3_ENDPOINT"
fi
gw_what+="; $(radosgw --version 2>/dev/null | head -1 || true)"
bucket=ckpt-s3bench-$(date -u +%Y%m%d-%H%M%S)-$$
scripts/rgw.sh mkbucket "$CKPT_TEST_S3_DIR" "$bucket"
s3=(--s3-endpoint "$CKPT_TEST_S3_ENDPOINT" --s3-credentials "$CKPT_TEST_S3_CREDENTIALS"
	--s3-region "$CKPT_TEST_S3_REGION")
raw_args=(--endpoint "$CKPT_TEST_S3_ENDPOINT" --bucket "$bucket" --inflight 8
	--credentials "$CKPT_TEST_S3_CREDENTIALS" --region "$CKPT_TEST_S3_REGION")

# A step that fails is recorded (its output or its absence says so), not fatal.
noted() { # WHAT CMD...
	local what=$1 rc=0
	shift
	"$@" || rc=$?
	((!rc)) || echo "bench: $what exited $rc" >&2
}

# One save of SIZE by one rank through a fresh agent; its log kept.
ckptd_run() { # tag rep [ckpt_bench flags] -- [ckptd flags...]
	local tag=$1 rep=$2 flags=()
	shift 2
	while [[ $1 != -- ]]; do
		flags+=("$1")
		shift
	done
	shift
	sizes=$size start_agent --log-level info "${s3[@]}" "$@"
	cp "$raw/status.json" "$raw/status-$tag.json"
	noted "ckpt_bench ($tag, repetition $rep)" timeout 1800 "$build/bench/ckpt_bench" \
		--endpoint "$sock" --dir "$work" --sizes "$size" --ranks 1 --reps 1 --node \
		--weights "${flags[@]}" --out "$raw/$tag-$rep.json"
	"$ckptctl" --endpoint "$sock" --json status >"$raw/status-after-$tag-$rep.json" || true
	kill_agent
	cp "$work/agent.log" "$raw/agent-$tag-$rep.log"
	rm -rf "$work/root"
}

for ((rep = 1; rep <= reps; rep++)); do
	echo "bench: repetition $rep of $reps, $size MiB: raw put and get" >&2
	noted "s3raw put (repetition $rep)" timeout 900 "$s3raw" put "${raw_args[@]}" \
		--key "raw/rep$rep" --bytes "${size}m" --part-mb 8 | tee "$raw/raw-put-$rep.json"
	noted "s3raw get (repetition $rep)" timeout 900 "$s3raw" get "${raw_args[@]}" \
		--key "raw/rep$rep" --range-mb 8 | tee "$raw/raw-get-$rep.json"
	echo "bench: repetition $rep of $reps, $size MiB: ckptd, root s3://$bucket/rep$rep/root" >&2
	ckptd_run s3root "$rep" -- --root "s3://$bucket/rep$rep/root"
	echo "bench: repetition $rep of $reps, $size MiB: ckptd, upload tier s3://$bucket/rep$rep/tier" >&2
	ckptd_run tier "$rep" --uploaded -- --upload-root "s3://$bucket/rep$rep/tier"
	echo "bench: repetition $rep of $reps, $size MiB: the same two compressed (zstd level 1)" >&2
	ckptd_run s3root_z "$rep" -- --root "s3://$bucket/rep$rep/rootz" --s3-compress zstd
	ckptd_run tier_z "$rep" --uploaded -- --upload-root "s3://$bucket/rep$rep/tierz" \
		--upload-compress zstd
done

name=$(date -u +%Y-%m-%d)-$(hostname -s)-s3
python3 "$top/bench/s3_report.py" --raw "$raw" --size "$size" --reps "$reps" \
	--gateway "$gw_what" --json "$out/$name.json" --quick "$quick"
