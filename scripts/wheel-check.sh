#!/usr/bin/env bash
# Builds the wheel (scripts/wheel.sh, release profile, with maturin from a
# build environment under target/), installs it into a fresh virtual
# environment and uses it from there: the CLI (`oxccl --version`, `oxccl
# doctor --help`, `python -m oxccl perf`), `oxccl run` on a program that
# loads libnccl.so.2, and examples/c/allreduce.c built against
# `oxccl.include_dir()` and `oxccl.lib_dir()`. Prints the wheel's size and
# the seconds each step took.
# Needs python3 with venv, cc, strip. Usage: scripts/wheel-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
  echo "wheel-check: $*" >&2
  exit 1
}
t0=$SECONDS

build_env=target/wheel-build-venv
if [ ! -x "$build_env/bin/maturin" ]; then
  python3 -m venv "$build_env"
  "$build_env/bin/pip" install -q --disable-pip-version-check 'maturin>=1.5,<2'
fi
rm -f target/wheels/oxccl-*.whl
MATURIN=$PWD/$build_env/bin/maturin scripts/wheel.sh
wheel=$(ls target/wheels/oxccl-*.whl)
t_build=$((SECONDS - t0))

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check "$wheel"
py=$work/venv/bin/python
ox=$work/venv/bin/oxccl

"$ox" --version | grep -q '^oxccl ' || fail "oxccl --version from the venv failed"
"$ox" doctor --help >/dev/null || fail "oxccl doctor --help from the venv failed"
lib=$("$py" -c 'import oxccl; print(oxccl.library_path())')
inc=$("$py" -c 'import oxccl; print(oxccl.include_dir())')
libdir=$("$py" -c 'import oxccl; print(oxccl.lib_dir())')
case $lib in "$work/venv/"*) ;; *) fail "oxccl.library_path() is $lib, outside the venv" ;; esac
[ -f "$lib" ] && [ -f "$libdir/libnccl.so" ] && [ -f "$inc/nccl.h" ] ||
  fail "the package lacks libnccl.so.2, libnccl.so or include/nccl.h"
readelf -d "$lib" | grep -q 'SONAME.*\[libnccl\.so\.2\]' || fail "$lib has no SONAME libnccl.so.2"

# The CLI through the module, on host memory (2 processes over shared memory).
"$py" -m oxccl perf all_reduce --ranks 2 -b 8 -e 1K >"$work/perf.txt" ||
  fail "python -m oxccl perf failed: $(tail -3 "$work/perf.txt")"
grep -q 'Out of bounds values : 0 OK' "$work/perf.txt" || fail "perf output without '0 OK': $(cat "$work/perf.txt")"

# oxccl run finds the library in the package and preloads it.
out=$("$ox" run --check -- "$py" -c 'import ctypes; v = ctypes.c_int(); ctypes.CDLL("libnccl.so.2").ncclGetVersion(ctypes.byref(v)); import time; time.sleep(0.3); print(v.value)' 2>"$work/check.txt") ||
  fail "oxccl run failed: $(cat "$work/check.txt")"
[ "$out" = 22705 ] || fail "oxccl run: the program printed '$out', not oxccl's 22705"
grep -q "bind to oxccl ($lib" "$work/check.txt" || fail "oxccl run --check did not report the package's library: $(cat "$work/check.txt")"

cc examples/c/allreduce.c -I "$inc" -L "$libdir" -lnccl -o "$work/allreduce"
res=$(LD_LIBRARY_PATH=$libdir "$work/allreduce") || fail "allreduce against the wheel's library exited $?"
[[ $res == *": OK" ]] || fail "allreduce printed '$res'"
LD_LIBRARY_PATH=$libdir ldd "$work/allreduce" | grep -q "libnccl.so.2 => $libdir/libnccl.so.2" ||
  fail "allreduce does not load $libdir/libnccl.so.2"

size=$(stat -c %s "$wheel")
echo "wheel-check: OK: $(basename "$wheel"), $((size / 1024)) KiB; build ${t_build} s, install and checks $((SECONDS - t0 - t_build)) s"
