#!/usr/bin/env bash
# Checks the build and install commands end to end: `cargo xtask build` and
# `cargo xtask install` (debug profile, so CI reuses the test build), then
# builds examples/c/allreduce.c three ways (against target/debug, against the
# install with -I/-L, and with pkg-config's flags) and runs each; checks the
# install's layout and that the library's SONAME is libnccl.so.2.
# Needs cc, pkg-config and readelf. Usage: scripts/install-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

fail() {
  echo "install-check: $*" >&2
  exit 1
}

# Runs a built example with LD_LIBRARY_PATH=$1 and checks it reports OK.
run_example() {
  local libdir=$1 exe=$2 out
  out=$(LD_LIBRARY_PATH=$libdir "$exe") || fail "$exe exited $? (LD_LIBRARY_PATH=$libdir)"
  [[ $out == *": OK" ]] || fail "$exe printed '$out', not a line ending in ': OK'"
  # The program must load the library just installed, not some other copy.
  # (ldd's output is taken whole: `ldd | grep -q` under pipefail fails at
  # random when grep exits on its match before ldd's last write.)
  local libs
  libs=$(LD_LIBRARY_PATH=$libdir ldd "$exe")
  [[ $libs == *"libnccl.so.2 => $libdir/libnccl.so.2"* ]] ||
    fail "$exe does not load $libdir/libnccl.so.2: $libs"
  echo "$exe: $out"
}

cargo xtask build --debug
[ "$(readlink target/debug/libnccl.so.2)" = libnccl.so ] ||
  fail "target/debug/libnccl.so.2 is not a symlink to libnccl.so"
cc examples/c/allreduce.c -I crates/oxccl-nccl/include -L target/debug -lnccl -o "$work/allreduce-target"
run_example "$PWD/target/debug" "$work/allreduce-target"

cargo xtask install --prefix "$prefix" --debug
[ -x "$prefix/bin/oxccl" ] || fail "no executable $prefix/bin/oxccl"
"$prefix/bin/oxccl" --version >/dev/null || fail "$prefix/bin/oxccl --version failed"
[ -f "$prefix/lib/libnccl.so.2" ] && [ ! -L "$prefix/lib/libnccl.so.2" ] ||
  fail "$prefix/lib/libnccl.so.2 is not a plain file"
[ "$(readlink "$prefix/lib/libnccl.so")" = libnccl.so.2 ] ||
  fail "$prefix/lib/libnccl.so is not a symlink to libnccl.so.2"
cmp -s crates/oxccl-nccl/include/nccl.h "$prefix/include/nccl.h" ||
  fail "$prefix/include/nccl.h differs from crates/oxccl-nccl/include/nccl.h"
grep -q 'SONAME.*\[libnccl\.so\.2\]' <<<"$(readelf -d "$prefix/lib/libnccl.so.2")" ||
  fail "$prefix/lib/libnccl.so.2 has no SONAME libnccl.so.2"

cc examples/c/allreduce.c -I "$prefix/include" -L "$prefix/lib" -lnccl -o "$work/allreduce-flags"
run_example "$prefix/lib" "$work/allreduce-flags"

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
version=$(pkg-config --modversion nccl)
header_version=$(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v ? "." : "") $3} END{print v}' "$prefix/include/nccl.h")
[ "$version" = "$header_version" ] || fail "nccl.pc says $version, nccl.h $header_version"
# shellcheck disable=SC2046 # pkg-config's output is meant to split into flags
cc examples/c/allreduce.c $(pkg-config --cflags --libs nccl) -o "$work/allreduce-pc"
run_example "$prefix/lib" "$work/allreduce-pc"
echo "install-check: OK (nccl.pc version $version)"
