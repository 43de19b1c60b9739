# Sourced by the bench/*_run.sh scripts and bench/run.sh: building, the work directory, the run's agent.
#   start_agent [ckptd flags...]
# starts $ckptd on $work/root with a staging pool of $staging_mb MiB if set,
# else one the largest of $sizes fits in, waits until it serves, saves its
# status in $raw/status.json, and on exit stops it and removes $work. Sets
# sock and agent. kill_agent stops it alone (the next start_agent may follow).
#   bench_build PROGRAM... builds ckptd, ckptctl and bench/PROGRAM... in $build
#                          (RelWithDebInfo, no sanitizer) unless $quick and
#                          they are there already
#   bench_workdir NAME     $work (under $dir, else /var/tmp), $raw and $out made

bench_build() {
	local p missing=0
	for p; do
		[[ -x $build/bench/$p ]] || missing=1
	done
	if ((missing)) || ((! ${quick:-0})); then
		cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_SANITIZE= >/dev/null
		cmake --build "$build" -j "$(nproc)" --target ckptd ckptctl "$@" >/dev/null
	fi
}

bench_workdir() {
	work=$(mktemp -d "${dir:-/var/tmp}/$1.XXXXXX")
	raw=$work/raw
	mkdir -p "$raw" "$out"
}

start_agent() {
	local largest staging
	sock=unix:$work/ckptd.sock
	largest=$(tr , '\n' <<<"$sizes" | sort -n | tail -1)
	staging=${staging_mb:-$((largest + largest / 8 + 64))}
	"$ckptd" --root "$work/root" --listen "$sock" --staging-mb "$staging" \
		--log-level warning --config /dev/null "$@" >"$work/agent.log" 2>&1 &
	agent=$!
	trap stop_agent EXIT
	for _ in $(seq 600); do
		"$ckptctl" --endpoint "$sock" status >/dev/null 2>&1 && break
		sleep 0.1
	done
	"$ckptctl" --endpoint "$sock" --json status >"$raw/status.json"
}

kill_agent() {
	kill "$agent" 2>/dev/null || true
	wait "$agent" 2>/dev/null || true
}

stop_agent() {
	kill_agent
	rm -rf "$work"
}
