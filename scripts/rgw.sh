#!/usr/bin/env bash
# A real S3 server for the tests: a throwaway Ceph cluster (one monitor, one
# OSD with BlueStore on a sparse 16 GiB file in DIR, no manager) and its RADOS
# Gateway (beast) on 127.0.0.1, all of it under DIR and stopped by the PIDs
# kept there. Needs Debian's ceph-mon, ceph-osd and radosgw (scripts/deps.sh
# --test installs them).
#   scripts/rgw.sh up DIR        starts it and makes an S3 user with a random
#                                key: DIR/credentials (mode 0600) holds
#                                "access_key = ..." and "secret_key = ...";
#                                DIR/env, for bash to source, exports
#                                CKPT_TEST_S3_ENDPOINT (http://127.0.0.1:PORT),
#                                CKPT_TEST_S3_CREDENTIALS, CKPT_TEST_S3_REGION
#                                and CKPT_TEST_S3_DIR (DIR)
#   scripts/rgw.sh down DIR      stops what up started, waits for it, and
#                                removes the data (DIR/log stays)
#   scripts/rgw.sh stop-gw DIR   stops only the gateway (the store goes away,
#                                mid-request if one is under way)
#   scripts/rgw.sh start-gw DIR  starts it again; returns once it answers
#   scripts/rgw.sh mkbucket DIR NAME
#   scripts/rgw.sh rmbucket DIR NAME   removes every object, aborts every
#                                multipart upload, then removes the bucket
#   scripts/rgw.sh curl DIR [CURL ARGS...]   curl -sS with SigV4 signing and
#                                DIR's credentials; an argument s3://BUCKET/KEY
#                                stands for the gateway's URL of it; unless an
#                                x-amz-content-sha256 header is given, it sends
#                                UNSIGNED-PAYLOAD (RGW wants the header, curl
#                                does not add it). E.g. scripts/rgw.sh curl DIR
#                                -T file s3://b/k; -o out s3://b/k; -I s3://b/k;
#                                's3://b?uploads'. Keys and query values must
#                                be URL-encoded; the query's parameters are
#                                put in the order SigV4 signs them, each with
#                                its "=" (curl signs the query as written).
# Ports, from the environment: RGW_PORT (the gateway, default 7480; "auto":
# the first of 7480, 7490, ..., 7570 where it and the monitor's are free),
# RGW_MON_PORT (the monitor's msgr2, default RGW_PORT-4000) and
# RGW_MON_V1_PORT (its msgr1, default RGW_PORT-1000). The OSD takes ports
# from 6800 to 7300 (Ceph's default).
# RGW keeps deleted and overwritten data for 2 h by default, and a full OSD
# makes PUTs hang without an error: here its garbage collection runs after
# 30 s.
set -euo pipefail

usage() {
	echo "usage: scripts/rgw.sh up|down|stop-gw|start-gw DIR" >&2
	echo "       scripts/rgw.sh mkbucket|rmbucket DIR NAME" >&2
	echo "       scripts/rgw.sh curl DIR [CURL ARGS...]" >&2
	exit 2
}
(($# >= 2)) || usage
cmd=$1
dir=$(realpath -m -- "$2")
shift 2
conf=$dir/ceph.conf
declare -A prog=([mon]=ceph-mon [osd]=ceph-osd [gw]=radosgw)
declare -A logs=([mon]=mon.a [osd]=osd.0 [gw]=client.rgw.a)

now() { echo "${EPOCHREALTIME/./}"; }
since() { # the seconds from $1 (now's microseconds) to now, as 1.2
	local us=$(($(now) - $1))
	printf '%d.%d' $((us / 1000000)) $((us % 1000000 / 100000))
}

# Whether DIR's daemon NAME (mon, osd, gw) runs: the PID in DIR/pid.NAME, still
# that program on DIR's configuration, and not a zombie.
alive() {
	local pid stat cmdline
	pid=$(cat "$dir/pid.$1" 2>/dev/null) || return 1
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
	stat=${stat##*) }
	[[ ${stat%% *} != Z ]] || return 1
	cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
	[[ $(cat "/proc/$pid/comm" 2>/dev/null) == "${prog[$1]}" && $cmdline == *" $conf "* ]]
}

# Whether PID, kept for daemon NAME, is still on its way to being it: a
# child of this script, not a zombie, that has not yet become the program.
# A background job is first this shell's fork, then setsid, and only then
# the daemon (each execs the next in the same PID); a loaded machine can
# hold it there for a while, and alive says no all that time.
launching() { # NAME PID
	local stat st ppid
	stat=$(cat "/proc/$2/stat" 2>/dev/null) || return 1
	read -r st ppid _ <<<"${stat##*) }"
	[[ $st != Z && $ppid == "$$" && $(cat "/proc/$2/comm" 2>/dev/null) != "${prog[$1]}" ]]
}

# Starts daemon NAME in the foreground of a background job (its output to
# DIR/log/NAME.out), keeps its PID, and returns once that PID is the program
# or has ended (30 s at most), so that alive tells the truth from then on.
# In a session of its own: a caller's process group may be killed when it
# ends (libcheck kills a test's), and a gateway started again by a test
# outlives it.
start() {
	local name=$1 pid i
	shift
	setsid "$@" -c "$conf" -f </dev/null >>"$dir/log/$name.out" 2>&1 &
	pid=$!
	echo "$pid" >"$dir/pid.$name"
	for ((i = 0; i < 600; i++)); do
		launching "$name" "$pid" || return 0
		sleep 0.05
	done
}

# Stops daemon NAME: SIGTERM, then after 10 s SIGKILL; returns once it is gone.
stop() {
	local name=$1 pid i
	if ! alive "$name"; then
		rm -f "$dir/pid.$name"
		return 0
	fi
	pid=$(cat "$dir/pid.$name")
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do
		alive "$name" || break
		sleep 0.1
	done
	if alive "$name"; then
		echo "rgw: ${prog[$name]} ($pid) still there 10 s after SIGTERM: SIGKILL" >&2
		kill -KILL "$pid" 2>/dev/null || true
		for ((i = 0; i < 50; i++)); do
			alive "$name" || break
			sleep 0.1
		done
	fi
	if alive "$name"; then
		echo "rgw: ${prog[$name]} ($pid) does not go away" >&2
		return 1
	fi
	rm -f "$dir/pid.$name"
}

# Fails, with the last lines of the logs given.
die() { # MESSAGE [LOG...]
	local f
	echo "rgw: $1" >&2
	for f in "${@:2}"; do
		[[ -s $f ]] || continue
		echo "rgw: the last lines of $f:" >&2
		tail -n 15 "$f" | sed 's/^/    /' >&2
	done
	(($# < 2)) || echo "rgw: logs in $dir/log" >&2
	exit 1
}

# Runs CMD... every 0.2 s until it succeeds; fails after SECONDS or as soon as
# daemon NAME has died (one still launching has not).
await() { # NAME SECONDS WHAT CMD...
	local name=$1 secs=$2 what=$3 t0 l
	shift 3
	t0=$(now)
	l=("$dir/log/$name.out" "$dir/log/${logs[$name]}.log")
	until "$@" >/dev/null 2>&1; do
		alive "$name" || launching "$name" "$(cat "$dir/pid.$name" 2>/dev/null)" ||
			die "${prog[$name]} exited while waiting for $what" "${l[@]}"
		(($(now) - t0 < secs * 1000000)) || die "waited $secs s in vain for $what" "${l[@]}"
		sleep 0.2
	done
}

port_used() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

load_env() {
	[[ -f $dir/env && -f $dir/credentials ]] || die "$dir has no gateway: scripts/rgw.sh up $dir"
	# shellcheck disable=SC1091 # written by up
	source "$dir/env"
	key=$(sed -n 's/^access_key = //p' "$dir/credentials")
	secret=$(sed -n 's/^secret_key = //p' "$dir/credentials")
	sig=(--aws-sigv4 "aws:amz:$CKPT_TEST_S3_REGION:s3" --user "$key:$secret")
}

# The gateway's URL of s3://BUCKET/KEY[?QUERY]. curl signs the query string as
# written, and the server the canonical one: parameters sorted by name, each
# with its "=" (?uploads is ?uploads=).
url() {
	local u=${1#s3://} q
	q=${u#"${u%%\?*}"}
	q=${q#\?}
	u=${u%%\?*}
	if [[ -n $q ]]; then
		q=$(tr '&' '\n' <<<"$q" | sed '/^$/d; /=/!s/$/=/' | LC_ALL=C sort -t= -k1,1 -k2 | paste -sd'&')
		u+="?$q"
	fi
	printf '%s/%s' "$CKPT_TEST_S3_ENDPOINT" "$u"
}

# curl, signed, on the gateway; UNSIGNED-PAYLOAD unless a payload hash is given.
s3() {
	local a args=() hash=0
	for a in "$@"; do
		case $a in
		s3://*) args+=("$(url "$a")") ;;
		*) args+=("$a") ;;
		esac
		[[ ${a,,} != x-amz-content-sha256:* ]] || hash=1
	done
	((hash)) || args+=(-H "x-amz-content-sha256: UNSIGNED-PAYLOAD")
	curl -sS --path-as-is "${sig[@]}" "${args[@]}"
}

# Whether the gateway answers a signed ListBuckets with 200.
answers() { [[ $(s3 --max-time 5 -o /dev/null -w '%{http_code}' s3://) == 200 ]]; }

start_gw() {
	start gw radosgw -n client.rgw.a
	await gw 60 "radosgw to answer on 127.0.0.1:$RGW_PORT" \
		curl -s --max-time 2 -o /dev/null "http://127.0.0.1:$RGW_PORT/"
}

urlencode() { # STRING [SAFE]: percent-encodes all but A-Za-z0-9-._~ and SAFE's
	local LC_ALL=C s=$1 safe=${2:-} out='' c i
	for ((i = 0; i < ${#s}; i++)); do
		c=${s:i:1}
		if [[ $c == [A-Za-z0-9._~-] || (-n $safe && $safe == *"$c"*) ]]; then
			out+=$c
		else
			printf -v c '%%%02X' "'$c"
			out+=$c
		fi
	done
	printf '%s' "$out"
}

xml_text() { # the text of an XML element's content
	local s=$1
	s=${s//&lt;/<}
	s=${s//&gt;/>}
	s=${s//&quot;/\"}
	s=${s//&apos;/\'}
	s=${s//&amp;/\&}
	printf '%s' "$s"
}

# A signed request whose answer must have status WANT: its body goes to $out.
req() { # WANT CURL ARGS...
	local want=$1 code
	shift
	code=$(s3 --max-time 60 -o "$out" -w '%{http_code}' "$@") || true
	if [[ $code != "$want" ]]; then
		echo "rgw: ${*: -1} answered $code, not $want: $(cat "$out" 2>/dev/null)" >&2
		return 1
	fi
}

up() {
	local t0 m fsid osd_uuid id port
	t0=$(now)
	for p in ceph-mon ceph-osd radosgw radosgw-admin ceph ceph-authtool monmaptool curl; do
		command -v "$p" >/dev/null ||
			die "$p is missing: scripts/deps.sh --test installs ceph-mon, ceph-osd and radosgw"
	done
	for d in gw osd mon; do
		! alive $d || die "$dir already runs a cluster: scripts/rgw.sh down $dir first"
	done
	if [[ ${RGW_PORT:-} == auto ]]; then
		RGW_PORT=
		for ((port = 7480; port < 7580; port += 10)); do
			port_used $port || port_used $((port - 4000)) ||
				port_used $((port - 1000)) || {
				RGW_PORT=$port
				break
			}
		done
		[[ -n $RGW_PORT ]] || die "no free ports: 7480 to 7570 and their monitors' are in use"
	fi
	RGW_PORT=${RGW_PORT:-7480}
	[[ $RGW_PORT =~ ^[1-9][0-9]*$ ]] || die "RGW_PORT must be a port number or auto, not '$RGW_PORT'"
	RGW_MON_PORT=${RGW_MON_PORT:-$((RGW_PORT - 4000))}
	RGW_MON_V1_PORT=${RGW_MON_V1_PORT:-$((RGW_PORT - 1000))}
	for port in "$RGW_PORT" "$RGW_MON_PORT" "$RGW_MON_V1_PORT"; do
		[[ $port =~ ^[1-9][0-9]*$ ]] || die "'$port' is not a port number"
		! port_used "$port" || die "port $port of 127.0.0.1 is in use (RGW_PORT, RGW_MON_PORT, RGW_MON_V1_PORT)"
	done

	# From here on, a failure stops what was started.
	ok=0
	trap 'if ((!ok)); then echo "rgw: up failed (logs in $dir/log): stopping what it started" >&2; down >/dev/null; fi' EXIT
	rm -rf "$dir"/{mon.a,osd.0,osd.0.block,rgw.a,run,log,crash,keyring,monmap} \
		"$dir"/{ceph.conf,credentials,env,pid.mon,pid.osd,pid.gw}
	mkdir -p "$dir"/{mon.a,osd.0,run,log}
	fsid=$(cat /proc/sys/kernel/random/uuid)
	m="[v2:127.0.0.1:$RGW_MON_PORT,v1:127.0.0.1:$RGW_MON_V1_PORT]"
	cat >"$conf" <<-EOF
		# scripts/rgw.sh: a throwaway cluster for the tests
		[global]
		fsid = $fsid
		mon host = $m
		public addr = 127.0.0.1
		cluster addr = 127.0.0.1
		public network = 127.0.0.1/32
		ms bind ipv6 = false
		keyring = $dir/keyring
		run dir = $dir/run
		admin socket = $dir/run/\$name.asok
		log file = $dir/log/\$name.log
		pid file = $dir/run/\$name.pid
		crash dir = $dir/crash
		auth allow insecure global id reclaim = false
		mon warn on insecure global id reclaim allowed = false
		osd pool default size = 1
		osd pool default min size = 1
		osd pool default pg num = 8
		osd pool default pgp num = 8
		osd pool default pg autoscale mode = off
		osd crush chooseleaf type = 0
		mon allow pool size one = true
		mon allow pool delete = true
		mon max pg per osd = 1000
		mon warn on pool no redundancy = false
		mon data avail warn = 1
		# pools come in a tenth of the time (the default interval is 1 s)
		paxos propose interval = 0.1
		paxos min wait = 0.01
		[mon]
		mon data = $dir/mon.a
		mon cluster log file = $dir/log/cluster.log
		[osd]
		osd data = $dir/osd.0
		osd objectstore = bluestore
		bluestore block path = $dir/osd.0.block
		bluestore block create = true
		# sparse: only what is written takes disk
		bluestore block size = 17179869184
		bluestore fsck on mkfs = false
		bluestore fsck on mount = false
		# a fixed, small cache rather than one grown to osd memory target (4 GiB)
		bluestore cache autotune = false
		bluestore cache size = 134217728
		[client.rgw.a]
		# tcp_nodelay: else each small request on a kept-alive connection
		# waits ~40 ms for the client's delayed ACK
		rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT tcp_nodelay=1
		rgw data = $dir/rgw.a
		rgw dns name = 127.0.0.1
		rgw enable usage log = false
		rgw thread pool size = 64
		# deleted and overwritten data is freed after 30 s, not 2 h
		rgw gc obj min wait = 30
		rgw gc processor period = 30
		rgw gc processor max time = 30
	EOF

	ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
	ceph-authtool "$dir/keyring" --gen-key -n client.admin --cap mon 'allow *' \
		--cap osd 'allow *' --cap mgr 'allow *' >/dev/null
	ceph-authtool "$dir/keyring" --gen-key -n osd.0 --cap mon 'allow profile osd' \
		--cap mgr 'allow profile osd' --cap osd 'allow *' >/dev/null
	ceph-authtool "$dir/keyring" --gen-key -n client.rgw.a --cap mon 'allow rw' \
		--cap osd 'allow rwx' --cap mgr 'allow rw' >/dev/null
	monmaptool --create --fsid "$fsid" --addv a "$m" "$dir/monmap" >/dev/null
	ceph-mon -c "$conf" -i a --mkfs --monmap "$dir/monmap" >"$dir/log/mon.mkfs.out" 2>&1 ||
		die "ceph-mon --mkfs failed" "$dir/log/mon.mkfs.out"
	start mon ceph-mon -i a
	await mon 30 "the monitor to answer on 127.0.0.1:$RGW_MON_PORT" ceph -c "$conf" --connect-timeout 5 mon stat

	osd_uuid=$(cat /proc/sys/kernel/random/uuid)
	id=$(ceph -c "$conf" --connect-timeout 10 osd new "$osd_uuid" 2>"$dir/log/osd.new.out") ||
		die "ceph osd new failed" "$dir/log/osd.new.out"
	[[ $id == 0 ]] || die "ceph osd new gave osd.$id, not osd.0"
	ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >"$dir/log/osd.mkfs.out" 2>&1 ||
		die "ceph-osd --mkfs failed" "$dir/log/osd.mkfs.out"
	start osd ceph-osd -i 0
	await osd 60 "the OSD to be up" osd_up

	start_gw
	key=$(od -An -N10 -tx1 /dev/urandom | tr -d ' \n' | tr a-f A-F)
	secret=$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')
	(
		umask 077
		printf 'access_key = %s\nsecret_key = %s\n' "$key" "$secret" >"$dir/credentials"
		radosgw-admin -c "$conf" user create --uid=ckpt-test --display-name="ckptd tests" \
			--access-key="$key" --secret-key="$secret" >"$dir/log/user.out" 2>&1
	) || die "radosgw-admin user create failed" "$dir/log/user.out"
	rm -f "$dir/log/user.out"
	{
		echo "# scripts/rgw.sh up: the gateway for the tests' S3 store"
		printf 'export CKPT_TEST_S3_ENDPOINT=%q\n' "http://127.0.0.1:$RGW_PORT"
		printf 'export CKPT_TEST_S3_CREDENTIALS=%q\n' "$dir/credentials"
		printf 'export CKPT_TEST_S3_REGION=%q\n' "$REGION"
		printf 'export CKPT_TEST_S3_DIR=%q\n' "$dir"
	} >"$dir/env"
	load_env
	await gw 30 "radosgw to take the new user's signed requests" answers
	# shellcheck disable=SC2034 # the trap reads it
	ok=1
	echo "rgw: up in $(since "$t0") s: $CKPT_TEST_S3_ENDPOINT (region $REGION);" \
		"source $dir/env; logs in $dir/log"
}

osd_up() { ceph -c "$conf" --connect-timeout 5 osd stat -f json | grep -q '"num_up_osds":1'; }

down() {
	local t0 fail=0
	t0=$(now)
	stop gw || fail=1
	stop osd || fail=1
	stop mon || fail=1
	((!fail)) || die "some daemons of $dir could not be stopped"
	rm -rf "$dir"/{mon.a,osd.0,osd.0.block,rgw.a,run,crash,monmap,keyring,credentials,env}
	echo "rgw: down in $(since "$t0") s"
}

rmbucket() { # NAME
	local b=$1 code keys prev='' uploads line k id
	code=$(s3 --max-time 60 -o /dev/null -w '%{http_code}' -I "s3://$b") || true
	if [[ $code == 404 ]]; then
		echo "rgw: no bucket $b"
		return 0
	fi
	# Objects, a thousand at a time (their keys as listed: already XML text).
	while :; do
		req 200 "s3://$b?list-type=2&max-keys=1000"
		keys=$(tr -d '\n' <"$out" | grep -o '<Key>[^<]*</Key>' | sed 's|.*|<Object>&</Object>|' || true)
		[[ -n $keys ]] || break
		[[ $keys != "$prev" ]] || die "the objects of bucket $b do not go away"
		prev=$keys
		req 200 -X POST --data-binary \
			"<Delete><Quiet>true</Quiet>${keys//$'\n'/}</Delete>" \
			"s3://$b?delete="
		! grep -q '<Error>' "$out" || die "deleting objects of bucket $b: $(cat "$out")"
	done
	prev=
	while :; do
		req 200 "s3://$b?uploads="
		uploads=$(tr -d '\n' <"$out" | sed 's|<Upload>|\n|g' | tail -n +2)
		[[ -n $uploads ]] || break
		[[ $uploads != "$prev" ]] || die "the multipart uploads of bucket $b do not go away"
		prev=$uploads
		while IFS= read -r line; do
			k=$(sed -n 's|.*<Key>\([^<]*\)</Key>.*|\1|p' <<<"$line")
			id=$(sed -n 's|.*<UploadId>\([^<]*\)</UploadId>.*|\1|p' <<<"$line")
			req 204 -X DELETE \
				"s3://$b/$(urlencode "$(xml_text "$k")" /)?uploadId=$(urlencode "$(xml_text "$id")")"
		done <<<"$uploads"
	done
	req 204 -X DELETE "s3://$b"
}

# The region SigV4 requests are signed for. RGW checks none (any is taken);
# us-east-1, as on AWS, is the one where CreateBucket carries no
# LocationConstraint (RGW takes only "default", its zonegroup's, there).
REGION='us-east-1'

case $cmd in
up)
	(($# == 0)) || usage
	up
	;;
down)
	(($# == 0)) || usage
	[[ -d $dir ]] || exit 0
	down
	;;
stop-gw)
	(($# == 0)) || usage
	stop gw
	;;
start-gw)
	(($# == 0)) || usage
	load_env
	if ! alive mon || ! alive osd; then
		die "$dir's monitor or OSD is not running: scripts/rgw.sh up $dir"
	fi
	RGW_PORT=${CKPT_TEST_S3_ENDPOINT##*:}
	if ! alive gw; then
		t0=$(now)
		start_gw
		await gw 30 "radosgw to take signed requests" answers
		echo "rgw: gateway up again in $(since "$t0") s"
	fi
	;;
mkbucket)
	(($# == 1)) || usage
	load_env
	out=$(mktemp "$dir/run/out.XXXXXX")
	trap 'rm -f "$out"' EXIT
	req 200 -X PUT "s3://$1"
	;;
rmbucket)
	(($# == 1)) || usage
	load_env
	out=$(mktemp "$dir/run/out.XXXXXX")
	trap 'rm -f "$out"' EXIT
	rmbucket "$1"
	;;
curl)
	load_env
	s3 "$@"
	;;
*) usage ;;
esac
