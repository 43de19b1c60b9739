#!/usr/bin/env bash
# system/unit_verify: the systemd side of an installed ckptd.
#
# Installs the build into a temporary prefix (cmake --install --prefix), so
# that the unit's ExecStart= names a ckptd that exists, then checks:
#  - `systemd-analyze verify` accepts the installed unit without a word about
#    it (unknown keys, bad values and a missing binary are all reported
#    there); a copy with a misspelt key must be reported, proving the check
#    works here at all;
#  - ExecStart= is the installed ckptd with --config /etc/ckptd/ckptd.conf;
#  - the syscall filter, expanded group by group, allows io_uring, mlock and
#    what the agent and the CUDA driver call, and denies none of them;
#  - the sandbox is in force as systemd reads it (systemd-analyze security
#    --offline: exposure 3.0 or lower);
#  - sysusers.d and tmpfiles.d, applied to an empty root (--root), make user
#    ckptd, groups ckptd and ckpt with ckptd a member of ckpt, and
#    /var/lib/ckptd 0750 ckptd:ckptd;
#  - the installed ckptd accepts the installed example configuration
#    (--check-config) and reports its defaults.
# Needs systemd-analyze (package systemd: scripts/deps.sh --test); without it
# the test is skipped (77). Works without systemd running as PID 1.
set -uo pipefail

: "${CKPT_BUILD_DIR:?}" "${CKPT_SBINDIR:?}" "${CKPT_UNITDIR:?}" "${CKPT_SYSUSERSDIR:?}"
: "${CKPT_TMPFILESDIR:?}" "${CKPT_DOCDIR:?}"

for tool in systemd-analyze systemd-sysusers systemd-tmpfiles; do
	if ! command -v "$tool" >/dev/null; then
		echo "skipped: $tool not found (apt-get install systemd; scripts/deps.sh --test)"
		exit 77
	fi
done
. "$(dirname "$0")/install_lib.sh"
need_relative "$CKPT_SBINDIR" "$CKPT_UNITDIR" "$CKPT_SYSUSERSDIR" "$CKPT_TMPFILESDIR" "$CKPT_DOCDIR"

install_tmp unit_verify
unit=$prefix/$CKPT_UNITDIR/ckptd.service
ckptd=$prefix/$CKPT_SBINDIR/ckptd
[[ -f $unit ]] || { echo "FAIL: no unit at $unit"; exit 1; }

# ---- systemd-analyze verify ------------------------------------------------
# It exits 0 on unknown keys and bad values (it only warns, as systemd does
# when loading): any line naming ckptd.service is a failure. Lines about
# other units (a host's own broken units) are shown, not counted.
verify() {
	systemd-analyze verify --man=no "$1" >"$tmp/verify.out" 2>&1
	local rc=$?
	grep -F "$(basename "$1")" "$tmp/verify.out" >"$tmp/verify.ours"
	grep -v -F "$(basename "$1")" "$tmp/verify.out" | sed 's/^/  (other unit) /'
	return $rc
}
verify "$unit"
rc=$?
if ((rc != 0)) || [[ -s $tmp/verify.ours ]]; then
	fail "systemd-analyze verify $unit (exit $rc):"
	cat "$tmp/verify.out"
else
	echo "ok: systemd-analyze verify $unit: no complaint"
fi

# The negative control: the same unit with a misspelt key and a bad value.
mkdir -p "$tmp/bad"
sed -e 's/^NoNewPrivileges=yes/NoNewPrivilege=yes/' -e 's/^SystemCallFilter=@system-service$/SystemCallFilter=@system-service io_uring_bogus/' \
	"$unit" >"$tmp/bad/ckptd.service"
verify "$tmp/bad/ckptd.service" >/dev/null
if grep -q "NoNewPrivilege" "$tmp/verify.ours" && grep -q "io_uring_bogus" "$tmp/verify.ours"; then
	echo "ok: systemd-analyze verify reports a misspelt key and an unknown system call"
else
	fail "systemd-analyze verify did not report the broken copy; it said:"
	cat "$tmp/verify.out"
fi

# ---- what the unit runs ------------------------------------------------------
exec_line=$(grep '^ExecStart=' "$unit")
if [[ $exec_line == "ExecStart=$ckptd --config /etc/ckptd/ckptd.conf" ]]; then
	echo "ok: $exec_line"
else
	fail "ExecStart= is '$exec_line', expected 'ExecStart=$ckptd --config /etc/ckptd/ckptd.conf'"
fi
[[ -x $ckptd ]] || fail "$ckptd is not executable"
for want in 'Type=notify' 'User=ckptd' 'Group=ckptd' 'SupplementaryGroups=ckpt' \
	'RuntimeDirectory=ckptd' 'StateDirectory=ckptd' 'LimitMEMLOCK=infinity' \
	'NoNewPrivileges=yes' 'ProtectSystem=strict' 'Restart=on-failure' 'DevicePolicy=closed' \
	'DeviceAllow=char-nvidia-uvm rw' 'DeviceAllow=char-nvidia-frontend rw'; do
	grep -qx -F "$want" "$unit" || fail "the unit has no line '$want'"
done
# Hiding /dev (PrivateDevices) would hide the GPUs; a private IPC namespace or
# user mapping would cut the agent off from trainers' /dev/shm regions and
# the ckpt group.
for bad in 'PrivateDevices=yes' 'PrivateIPC=yes' 'PrivateUsers=yes' 'ProtectProc=invisible'; do
	grep -qx -F "$bad" "$unit" && fail "the unit sets $bad"
done

# ---- the syscall filter --------------------------------------------------------
# Expand every allowed group, recursively, as this systemd defines it.
declare -A allowed=() denied=() seen=()
expand() { # expand NAME... -> adds to the array named by $set
	local name
	for name in "$@"; do
		if [[ $name == @* ]]; then
			[[ -n ${seen[$set$name]:-} ]] && continue
			seen[$set$name]=1
			# shellcheck disable=SC2046
			expand $(systemd-analyze syscall-filter "$name" | sed -e '1d' -e 's/#.*//' | tr -s ' \n' '  ')
		elif [[ $set == allowed ]]; then
			allowed[$name]=1
		else
			denied[$name]=1
		fi
	done
}
while IFS= read -r line; do
	v=${line#SystemCallFilter=}
	if [[ $v == "~"* ]]; then set=denied; v=${v#\~}; else set=allowed; fi
	# shellcheck disable=SC2086
	expand $v
done < <(grep '^SystemCallFilter=' "$unit")
((${#allowed[@]} > 100)) || fail "the filter allows only ${#allowed[@]} system calls: not expanded?"
# io_uring, the pinned pool, the hash thread's nice, CUDA's ioctl and mmap,
# the socket, sd_notify.
for sc in io_uring_setup io_uring_enter io_uring_register mlock munlock mmap munmap madvise \
	ioctl setpriority sched_setaffinity pwrite64 pwritev fsync fdatasync renameat2 sendmsg \
	socket bind listen accept4 fchown fchmod memfd_create openat; do
	if [[ -z ${allowed[$sc]:-} || -n ${denied[$sc]:-} ]]; then
		fail "SystemCallFilter does not allow $sc"
	fi
done
echo "ok: SystemCallFilter allows ${#allowed[@]} system calls, io_uring and mlock among them"

# ---- the sandbox as systemd reads it ---------------------------------------------
# Exposure 0..10, as shown; --threshold counts in tenths.
if systemd-analyze security --offline=true --threshold=30 "$unit" >"$tmp/security.out" 2>&1; then
	echo "ok: $(grep 'Overall exposure level' "$tmp/security.out")"
else
	cat "$tmp/security.out"
	fail "systemd-analyze security: exposure above 3.0"
fi

# ---- sysusers.d and tmpfiles.d into an empty root ----------------------------------
root=$tmp/root
mkdir -p "$root/etc"
if ! systemd-sysusers --root="$root" "$prefix/$CKPT_SYSUSERSDIR/ckptd.conf" >"$tmp/sysusers.out" 2>&1; then
	cat "$tmp/sysusers.out"
	fail "systemd-sysusers $prefix/$CKPT_SYSUSERSDIR/ckptd.conf"
fi
grep -q '^ckptd:x:[0-9]*:[0-9]*:.*:/usr/sbin/nologin$' "$root/etc/passwd" ||
	fail "no system user ckptd (nologin) in $root/etc/passwd: $(cat "$root/etc/passwd" 2>&1)"
grep -q '^ckpt:x:[0-9]*:ckptd$' "$root/etc/group" ||
	fail "no group ckpt with member ckptd in $root/etc/group: $(cat "$root/etc/group" 2>&1)"
grep -q '^ckptd:x:[0-9]*:$' "$root/etc/group" || fail "no group ckptd in $root/etc/group"
if ! systemd-tmpfiles --root="$root" --create "$prefix/$CKPT_TMPFILESDIR/ckptd.conf" >"$tmp/tmpfiles.out" 2>&1; then
	cat "$tmp/tmpfiles.out"
	fail "systemd-tmpfiles --create $prefix/$CKPT_TMPFILESDIR/ckptd.conf"
fi
uid=$(awk -F: '$1 == "ckptd" { print $3 }' "$root/etc/passwd")
gid=$(awk -F: '$1 == "ckptd" { print $3 }' "$root/etc/group")
got=$(stat -c '%a %u:%g' "$root/var/lib/ckptd" 2>&1)
[[ $got == "750 $uid:$gid" ]] || fail "/var/lib/ckptd in the root is '$got', expected '750 $uid:$gid'"
[[ -d $root/etc/ckptd ]] || fail "tmpfiles.d made no /etc/ckptd"
((fails == 0)) && echo "ok: sysusers.d and tmpfiles.d make ckptd, ckpt and /var/lib/ckptd"

# ---- the example configuration, read by the installed agent --------------------------
# Every key of the example is read from it (--check-config says where each
# value came from) and is the documented default. The group ckpt exists
# once sysusers.d has run on the node; where it does not, a flag stands in.
example=$prefix/$CKPT_DOCDIR/ckptd.conf.example
group_flag=()
getent group ckpt >/dev/null || group_flag=(--socket-group "$(id -gn)")
if "$ckptd" --config "$example" "${group_flag[@]}" --check-config >"$tmp/check.out" 2>&1; then
	n=0
	for kv in "listen = unix:/run/ckptd/ckptd.sock" "socket_mode = 0660" "socket_group = ckpt" \
		"log_level = info" "root = /var/lib/ckptd" "io_engine = auto" "queue_depth = 8" \
		"size_mb = 1024" "backpressure = block" "keep_last = 0" "keep_every = 0"; do
		[[ ${#group_flag[@]} -gt 0 && $kv == socket_group* ]] && continue
		if grep -q -E "^${kv} +; ${example}:[0-9]+\$" "$tmp/check.out"; then
			n=$((n + 1))
		else
			fail "--check-config of the example does not show '$kv' from $example"
		fi
	done
	grep -q -E '^; listen = \(not set' "$tmp/check.out" ||
		fail "the example sets [metrics] listen: it is to be off by default"
	echo "ok: ckptd --check-config reads $n keys from $example, each its default"
else
	fail "ckptd --config $example --check-config"
fi
cat "$tmp/check.out" | sed 's/^/  /'

if ((fails)); then
	echo "$fails check(s) failed"
	exit 1
fi
echo "all checks passed"
