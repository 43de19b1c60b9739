#!/usr/bin/env bash
# system/alerts: the Prometheus files of systemd/prometheus are what
# promtool (Debian's prometheus package) accepts: the scrape configuration
# with its rule file, and the alert rules, each firing on synthetic series
# when it should and not before (ckptd-alerts.test.yml). Every ckptd_ metric
# the rules use is one the agent exports (agent/daemon/metrics.c).
# promtool: $CKPT_PROMTOOL, else .tools/promtool (scripts/deps.sh --test
# takes it out of the package), else the PATH's; skipped (77) without one.
#   test_alerts.sh SOURCE_DIR
set -uo pipefail
src=$1
promtool=${CKPT_PROMTOOL:-}
[[ -z $promtool && -x $src/.tools/promtool ]] && promtool=$src/.tools/promtool
[[ -z $promtool ]] && promtool=$(command -v promtool || true)
[[ -n $promtool ]] || { echo "skipped: no promtool (scripts/deps.sh --test fetches it)"; exit 77; }
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

dir=$src/systemd/prometheus
"$promtool" check config "$dir/prometheus.yml" || fail "promtool check config"
"$promtool" check rules "$dir/ckptd-alerts.yml" || fail "promtool check rules"
(cd "$src/tests/system" && "$promtool" test rules ckptd-alerts.test.yml) || fail "promtool test rules"
while read -r m; do
	grep -q -e "\"$m\"" -e "$m{" -e "# HELP $m " "$src/agent/daemon/metrics.c" ||
		fail "the rules use $m, which the agent does not export"
done < <(grep -o 'ckptd_[A-Za-z0-9_]*' "$dir/ckptd-alerts.yml" | sort -u)
((fails == 0)) && echo "ok: promtool accepts the scrape configuration and the rules; each alert fires as its test says"
((fails == 0))
