#!/usr/bin/env bash
# system/install: `cmake --install` into a temporary prefix gives a tree a
# trainer can build against, and a node can run from:
#  - every file is where it belongs (binaries, the library and its soname
#    links, header, pkg-config file, unit, sysusers.d, tmpfiles.d, example
#    configuration);
#  - a tiny C program, built with nothing but the installed header and
#    `pkg-config --cflags --libs ckpt` (strict C11, -Werror), links against
#    the installed libckpt, runs with it (LD_LIBRARY_PATH, checked with ldd),
#    and gets -ECONNREFUSED with ckpt_strerror's text from ckpt_connect to a
#    socket nobody serves;
#  - the installed ckptd and ckptctl run (--version; ckptctl status with no
#    agent fails with exit 1 and says so).
set -uo pipefail

: "${CKPT_BUILD_DIR:?}" "${CKPT_BINDIR:?}" "${CKPT_SBINDIR:?}" "${CKPT_LIBDIR:?}"
: "${CKPT_INCLUDEDIR:?}" "${CKPT_UNITDIR:?}" "${CKPT_SYSUSERSDIR:?}" "${CKPT_TMPFILESDIR:?}"
: "${CKPT_DOCDIR:?}" "${CKPT_VERSION:?}" "${CKPT_MANDIR:?}"
CC=${CC:-cc}

. "$(dirname "$0")/install_lib.sh"
need_relative "$CKPT_BINDIR" "$CKPT_SBINDIR" "$CKPT_LIBDIR" "$CKPT_INCLUDEDIR" "$CKPT_UNITDIR" \
	"$CKPT_SYSUSERSDIR" "$CKPT_TMPFILESDIR" "$CKPT_DOCDIR" "$CKPT_MANDIR"
for tool in pkg-config "$CC" python3 ldd; do
	command -v "$tool" >/dev/null || { echo "skipped: $tool not found"; exit 77; }
done

install_tmp install

# ---- the tree -------------------------------------------------------------------
lib=$prefix/$CKPT_LIBDIR
expect_file() { [[ -f $1 && ! -L $1 ]] || fail "missing (or not a plain file): $1"; }
expect_link() { [[ -L $1 && $(readlink "$1") == "$2" ]] || fail "$1 is not a link to $2"; }
expect_file "$prefix/$CKPT_SBINDIR/ckptd"
expect_file "$prefix/$CKPT_BINDIR/ckptctl"
[[ -x $prefix/$CKPT_SBINDIR/ckptd && -x $prefix/$CKPT_BINDIR/ckptctl ]] ||
	fail "ckptd or ckptctl is not executable"
expect_file "$lib/libckpt.so.$CKPT_VERSION"
expect_link "$lib/libckpt.so.0" "libckpt.so.$CKPT_VERSION"
expect_link "$lib/libckpt.so" "libckpt.so.0"
expect_file "$prefix/$CKPT_INCLUDEDIR/ckpt.h"
expect_file "$lib/pkgconfig/ckpt.pc"
expect_file "$prefix/$CKPT_UNITDIR/ckptd.service"
expect_file "$prefix/$CKPT_SYSUSERSDIR/ckptd.conf"
expect_file "$prefix/$CKPT_TMPFILESDIR/ckptd.conf"
expect_file "$prefix/$CKPT_DOCDIR/ckptd.conf.example"
expect_file "$prefix/$CKPT_DOCDIR/README.md"
expect_file "$prefix/$CKPT_DOCDIR/DESIGN.md"
for page in man1/ckptctl.1 man5/ckptd.conf.5 man8/ckptd.8; do
	expect_file "$prefix/$CKPT_MANDIR/$page"
done
# The library exports the API and nothing else (libckpt.map).
if nm -D --defined-only "$lib/libckpt.so.0" | awk '$2 ~ /[TDBR]/ { print $3 }' | grep -v '^ckpt_' |
	grep -v '^_' >"$tmp/extra"; then
	fail "libckpt exports symbols outside ckpt_*: $(head -5 "$tmp/extra" | tr '\n' ' ')"
fi
echo "ok: installed tree ($(find "$prefix" -type f | wc -l) files)"

# ---- pkg-config ----------------------------------------------------------------------
export PKG_CONFIG_PATH=$lib/pkgconfig
cflags=$(pkg-config --cflags ckpt) || fail "pkg-config --cflags ckpt"
libs=$(pkg-config --libs ckpt) || fail "pkg-config --libs ckpt"
version=$(pkg-config --modversion ckpt)
[[ $cflags == *"-I$prefix/$CKPT_INCLUDEDIR"* ]] ||
	fail "pkg-config --cflags ckpt is '$cflags': not the installed include directory"
[[ $libs == *"-L$lib"* && $libs == *"-lckpt"* ]] ||
	fail "pkg-config --libs ckpt is '$libs': not -L$lib -lckpt"
[[ $version == "$CKPT_VERSION" ]] || fail "pkg-config --modversion ckpt is '$version'"
echo "ok: pkg-config ckpt $version: $cflags $libs"

# ---- a trainer built against the installed tree ---------------------------------------------
cat >"$tmp/hello_ckpt.c" <<'C'
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <ckpt.h>

int main(int argc, char **argv)
{
	struct ckpt_client *c = NULL;
	int rc;

	if (argc != 2)
		return 2;
	rc = ckpt_connect(argv[1], &c);
	printf("ckpt_connect: %d: %s\n", rc, ckpt_strerror(rc));
	if (rc != -ECONNREFUSED || c != NULL)
		return 1;
	if (strcmp(ckpt_strerror(rc), strerror(ECONNREFUSED)) == 0)
		return 1; /* ckpt_strerror has its own text for this one */
	printf("CKPT_VERSION %d.%d\n", CKPT_VERSION_MAJOR, CKPT_VERSION_MINOR);
	return 0;
}
C
san=()
[[ -n ${CKPT_SANITIZE:-} ]] && san=(-fsanitize="$CKPT_SANITIZE")
# shellcheck disable=SC2086
if ! "$CC" -std=c11 -pedantic -Wall -Wextra -Werror "${san[@]}" $cflags -o "$tmp/hello_ckpt" \
	"$tmp/hello_ckpt.c" $libs 2>"$tmp/cc.out"; then
	cat "$tmp/cc.out"
	fail "building a program with the installed ckpt.h and pkg-config"
else
	echo "ok: built hello_ckpt with $CC -std=c11 -pedantic -Werror $cflags $libs"
	export LD_LIBRARY_PATH=$lib
	loaded=$(ldd "$tmp/hello_ckpt" | awk '$1 == "libckpt.so.0" { print $3 }')
	[[ $loaded == "$lib/libckpt.so.0" ]] ||
		fail "hello_ckpt loads libckpt.so.0 from '$loaded', not $lib/libckpt.so.0"
	# A socket file nobody listens on: bound, then its owner gone.
	python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$tmp/dead.sock"
	out=$("$tmp/hello_ckpt" "unix:$tmp/dead.sock" 2>&1)
	rc=$?
	echo "$out" | sed 's/^/  hello_ckpt: /'
	if ((rc != 0)); then
		fail "hello_ckpt exited $rc: expected -ECONNREFUSED with ckpt_strerror's text"
	elif ! grep -q "ckpt_connect: -$(python3 -c 'import errno; print(errno.ECONNREFUSED)'): no ckptd answers" <<<"$out"; then
		fail "hello_ckpt's output is not ckpt_strerror(-ECONNREFUSED)"
	else
		echo "ok: the installed libckpt runs: ckpt_connect to a dead socket is -ECONNREFUSED"
	fi
	unset LD_LIBRARY_PATH
fi

# ---- the installed programs run ----------------------------------------------------------
v=$(LD_LIBRARY_PATH=$lib "$prefix/$CKPT_SBINDIR/ckptd" --version 2>&1)
[[ $v == "ckptd $CKPT_VERSION" ]] || fail "ckptd --version says '$v'"
LD_LIBRARY_PATH=$lib "$prefix/$CKPT_BINDIR/ckptctl" --endpoint "unix:$tmp/dead.sock" status \
	>"$tmp/ctl.out" 2>&1
rc=$?
((rc == 1)) && grep -q . "$tmp/ctl.out" ||
	fail "ckptctl status with no agent: exit $rc, '$(cat "$tmp/ctl.out")' (expected 1 and a message)"
((fails == 0)) && echo "ok: installed ckptd --version and ckptctl status run"

if ((fails)); then
	echo "$fails check(s) failed"
	exit 1
fi
echo "all checks passed"
