#!/usr/bin/env bash
# The demo, from a fresh clone on Debian 12 as root: installs the Debian
# packages, builds, starts ckptd in the foreground of this script on a
# temporary root (or the one given), runs the demo trainer (saves every few
# steps, waiting only for CAPTURED), stops it, starts it again with --resume
# (restores LATEST and checks every byte), and shows what ckptctl sees.
#   scripts/demo.sh [ROOT]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target ckptd ckptctl demo_trainer >/dev/null

# the socket's directory; the root too, unless one is given (then it goes at the end)
work=$(mktemp -d /tmp/ckptd-demo.XXXXXX)
root=${1:-$work/root}
sock=unix:$work/ckptd.sock
ctl() { build/client/ckptctl --endpoint "$sock" "$@"; }
tidy() { if [[ -n ${1:-} ]]; then rm -rf "$work"; else rm -f "$work/ckptd.sock"; fi; }

build/agent/ckptd --root "$root" --listen "$sock" --staging-mb 1024 &
agent=$!
trap 'kill $agent 2>/dev/null; wait $agent 2>/dev/null; tidy "${1:-}"' EXIT
for _ in $(seq 100); do ctl status >/dev/null 2>&1 && break; sleep 0.1; done

echo "== the trainer: 256 MiB of tensors, 40 steps, a save every 5"
build/examples/demo_trainer --endpoint "$sock" --mb 256 --steps 40 --save-every 5
echo "== the trainer stopped; started again with --resume"
build/examples/demo_trainer --endpoint "$sock" --mb 256 --resume
echo "== ckptctl list demo"
ctl list demo
latest=$(cat "$root/demo/LATEST")
echo "== ckptctl verify demo $latest"
ctl verify demo "$latest"
echo "== ckptctl status"
ctl status
kill "$agent"
wait "$agent" || true
trap - EXIT
tidy "${1:-}"
echo "== done: checkpoints are under $root"
