# Sourced by the system tests that install the build (test_install.sh,
# test_unit_verify.sh):
#   fail MSG              reports a failure and counts it in $fails
#   need_relative DIR...  skips (77) if an install directory is absolute: it
#                         could not go under a temporary prefix
#   install_tmp NAME      cmake --install of $CKPT_BUILD_DIR into a new
#                         temporary prefix; sets tmp (removed on exit) and prefix

fails=0
fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

need_relative() {
	local d
	for d in "$@"; do
		if [[ $d == /* ]]; then
			echo "skipped: install directory $d is absolute: it cannot go under a temporary prefix"
			exit 77
		fi
	done
}

install_tmp() {
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX") || exit 1
	trap 'rm -rf "$tmp"' EXIT
	prefix=$tmp/prefix
	if ! cmake --install "$CKPT_BUILD_DIR" --prefix "$prefix" >"$tmp/install.log" 2>&1; then
		cat "$tmp/install.log"
		echo "FAIL: cmake --install $CKPT_BUILD_DIR --prefix $prefix"
		exit 1
	fi
}
