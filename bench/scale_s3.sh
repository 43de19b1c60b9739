#!/usr/bin/env bash
# The many-nodes commit on an object store: for each case NODESxRANKSxTENSORS,
# a synthetic root of one step (bench/scale_bench gen, a directory) copied
# into a bucket of a local Ceph RGW (scripts/rgw.sh), then step 1 committed
# by node n00000 from the bucket and watched by node n00001, each request
# counted and timed as the store answers it (nothing injected). Appends the
# JSON lines to bench/results/<date>-<host>-scale-s3.jsonl and prints the
# table (bench/scale_report.py).
#
#   bench/scale_s3.sh [--cases 64x8x300,256x8x300] [--build B] [--dir DIR] [--out O]
#
# The gateway is started in the work directory and stopped at the end;
# nothing of the root is left.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
cases=64x8x300,256x8x300 dir= build=build-bench out=bench/results
while (($#)); do
	case $1 in
	--cases) cases=$2; shift ;;
	--build) build=$2; shift ;;
	--dir) dir=$2; shift ;;
	--out) out=$2; shift ;;
	*) echo "usage: bench/scale_s3.sh [--cases NxRxT,...] [--build B] [--dir DIR] [--out O]" >&2
		exit 2 ;;
	esac
	shift
done

. "$top/bench/agent.sh"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_SANITIZE= >/dev/null
cmake --build "$build" -j "$(nproc)" --target scale_bench >/dev/null
bench=$build/bench/scale_bench
bench_workdir ckpt-scale-s3
rgw=$work/rgw
trap 'scripts/rgw.sh down "$rgw" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
results=$out/$(date +%F)-$(hostname -s)-scale-s3.jsonl

RGW_PORT=auto scripts/rgw.sh up "$rgw" >&2
# shellcheck disable=SC1091 # written by rgw.sh up
source "$rgw/env"
export CKPT_S3_ENDPOINT=$CKPT_TEST_S3_ENDPOINT CKPT_S3_REGION=$CKPT_TEST_S3_REGION
export CKPT_S3_CREDENTIALS=$CKPT_TEST_S3_CREDENTIALS

# Every file of a directory root into s3://BUCKET/, as the S3 backend names
# them: one curl (signed, 32 at once), its transfers in a config file.
copy_root() {
	local root=$1 bucket=$2 conf=$work/copy.conf f n=0
	: >"$conf"
	while IFS= read -r f; do
		printf 'upload-file = "%s"\nurl = "%s/%s/%s"\n' "$root/$f" \
			"$CKPT_TEST_S3_ENDPOINT" "$bucket" "$f" >>"$conf"
		n=$((n + 1))
	done < <(cd "$root" && find . -type f ! -name '*.tmp' | sed 's|^\./||')
	scripts/rgw.sh curl "$rgw" -Z --parallel-max 32 -f -K "$conf" >/dev/null
	echo "scale-s3: $n objects into $bucket" >&2
}

for c in ${cases//,/ }; do
	IFS=x read -r n r t <<<"$c"
	root=$work/root-$c bucket=scale-${c//x/-}
	echo "scale-s3: $n nodes x $r ranks x $t tensors: gen, copy into $bucket" >&2
	"$bench" gen --root "$root" --nodes "$n" --ranks "$r" --tensors "$t" --steps 1 >/dev/null
	scripts/rgw.sh mkbucket "$rgw" "$bucket" >&2
	copy_root "$root" "$bucket"
	rm -rf "$root"
	common=(--root "s3://$bucket" --nodes "$n" --ranks "$r" --tensors "$t" --steps 1 --step 1)
	"$bench" commit "${common[@]}" | tee -a "$results"
	if [[ $(tail -1 "$results") == *'"state": "COMMITTED"'* ]]; then
		"$bench" watch "${common[@]}" --node 1 | tee -a "$results"
	fi
done
python3 bench/scale_report.py "$results"
