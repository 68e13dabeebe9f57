#!/usr/bin/env bash
# Builds the wheel (scripts/wheel.sh, release profile, with maturin from a
# build environment under target/), installs it into a fresh virtual
# environment and uses it from there: the CLI (`oxccl --version`, `oxccl
# doctor --help`, `python -m oxccl perf`), `oxccl run` on a program that
# loads libnccl.so.2, and examples/c/allreduce.c built against
# `oxccl.include_dir()` and `oxccl.lib_dir()`. Prints the wheel's size and
# the seconds each step took. With --kernels DIR (a folder `oxccl kernels
# --out` wrote for sm_80, sm_90 and sm_100 with --ptx: scripts/kernels-ci.sh)
# the wheel carries it, and `oxccl kernels --list` from the environment must
# find every program for each of those GPUs and PTX for a newer one, in
# the folder beside the installed libnccl.so.2.
# Needs python3 with venv, cc, strip.
# Usage: scripts/wheel-check.sh [--kernels DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
kernels=()
if [ "${1:-}" = --kernels ]; then
  kernels=(--kernels "${2:?--kernels needs a folder}")
fi

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
MATURIN=$PWD/$build_env/bin/maturin scripts/wheel.sh "${kernels[@]}"
wheel=$(ls target/wheels/oxccl-*.whl)
t_build=$((SECONDS - t0))

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check "$wheel"
py=$work/venv/bin/python
ox=$work/venv/bin/oxccl

grep -q '^oxccl ' <<<"$("$ox" --version)" || fail "oxccl --version from the venv failed"
"$ox" doctor --help >/dev/null || fail "oxccl doctor --help from the venv failed"
lib=$("$py" -c 'import oxccl; print(oxccl.library_path())')
inc=$("$py" -c 'import oxccl; print(oxccl.include_dir())')
libdir=$("$py" -c 'import oxccl; print(oxccl.lib_dir())')
case $lib in "$work/venv/"*) ;; *) fail "oxccl.library_path() is $lib, outside the venv" ;; esac
[ -f "$lib" ] && [ -f "$libdir/libnccl.so" ] && [ -f "$inc/nccl.h" ] ||
  fail "the package lacks libnccl.so.2, libnccl.so or include/nccl.h"
# (Outputs are taken whole, not piped into `grep -q`: under pipefail the
# writer's SIGPIPE after grep's early exit fails the check at random.)
grep -q 'SONAME.*\[libnccl\.so\.2\]' <<<"$(readelf -d "$lib")" || fail "$lib has no SONAME libnccl.so.2"

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
libs=$(LD_LIBRARY_PATH=$libdir ldd "$work/allreduce")
[[ $libs == *"libnccl.so.2 => $libdir/libnccl.so.2"* ]] ||
  fail "allreduce does not load $libdir/libnccl.so.2: $libs"

# The kernels: in the folder the installed library looks in (oxccl-kernels
# beside it), each program as a CUBIN for sm_80 (which an sm_86 GPU takes
# too), sm_90 and sm_100, and as PTX for a GPU newer than all of them (sm_120).
if [ ${#kernels[@]} -gt 0 ]; then
  "$ox" kernels --list --arch 80,86,90,100,120 >"$work/list.txt" 2>&1 ||
    fail "oxccl kernels --list: a program is not prebuilt: $(grep -E 'not prebuilt|^oxccl' "$work/list.txt" | head -5)"
  grep -qxF "prebuilt kernels in $(readlink -f "$libdir/oxccl-kernels")" "$work/list.txt" ||
    fail "the kernels listed are not the ones beside $lib: $(head -1 "$work/list.txt")"
  for a in 80 86 90 100; do
    grep -Eq "^sm_$a: [0-9]+ programs: [0-9]+ CUBIN, 0 PTX, 0 to compile\$" "$work/list.txt" ||
      fail "sm_$a: not every program has a CUBIN: $(grep "^sm_$a:" "$work/list.txt")"
  done
  grep -Eq "^sm_120: [0-9]+ programs: 0 CUBIN, [0-9]+ PTX, 0 to compile\$" "$work/list.txt" ||
    fail "sm_120: not every program has PTX: $(grep '^sm_120:' "$work/list.txt")"
  echo "wheel-check: kernels: $(grep -E '^sm_[0-9]+:' "$work/list.txt" | tr '\n' ';')"
fi

size=$(stat -c %s "$wheel")
echo "wheel-check: OK: $(basename "$wheel"), $((size / 1024)) KiB; build ${t_build} s, install and checks $((SECONDS - t0 - t_build)) s"
