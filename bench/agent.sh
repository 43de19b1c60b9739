# Sourced by bench/run.sh and bench/gpu_run.sh: the run's agent.
#   start_agent [ckptd flags...]
# starts $ckptd on $work/root with a staging pool the largest of $sizes fits
# in, waits until it serves, saves its status in $raw/status.json, and on exit
# stops it and removes $work. Sets sock and agent.

start_agent() {
	local largest staging
	sock=unix:$work/ckptd.sock
	largest=$(tr , '\n' <<<"$sizes" | sort -n | tail -1)
	staging=$((largest + largest / 8 + 64))
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

stop_agent() {
	kill "$agent" 2>/dev/null || true
	wait "$agent" 2>/dev/null || true
	rm -rf "$work"
}
