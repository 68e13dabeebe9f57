#!/usr/bin/env bash
# Coverage-guided fuzzing of every decoder of bytes that come from the network
# or from files (targets in fuzz/targets/, seeds in fuzz/corpus/<target>/),
# with honggfuzz (honggfuzz-rs on the stable toolchain).
#
#   scripts/fuzz.sh [SECONDS]   run each target for SECONDS (default 10)
#   FUZZ_TARGETS="conf elf" scripts/fuzz.sh 600   only those targets
#
# Installs what it needs when missing: Debian's binutils-dev and libunwind-dev,
# and `cargo hfuzz` under target/fuzz-tools (kept there, so a second run skips
# it). Fails when a target crashes (a panic, an abort, a signal) and prints
# where the crashing input was saved. New inputs the fuzzer finds go to
# target/fuzz-ws/<target>/new, not into the repo; copy interesting ones into
# fuzz/corpus/<target>/ by hand.
#
# Time on the 2-core Debian 12 CI machine, 2026-12-02, `scripts/fuzz.sh 10` in
# a fresh clone (nothing under target/, the apt packages and cargo's registry
# cache already there): 4 min 9 s, of which `cargo install honggfuzz` (16 s)
# and the build of the 15 targets take about 1 min 25 s and fuzzing 15 x 11 s.
# The apt packages add about 10 s on a new machine. With target/ kept, the
# install and the build are no-ops.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
root=$PWD
hfuzz_version=0.5.62 # = the honggfuzz version in fuzz/Cargo.toml
tools=$root/target/fuzz-tools
build=$root/target/fuzz
export PATH="$tools/bin:$PATH"

if [ ! -f /usr/include/bfd.h ] || [ ! -f /usr/include/libunwind-ptrace.h ]; then
  apt-get update -qq && apt-get install -y -qq binutils-dev libunwind-dev >/dev/null
fi
if [ "$(cat "$tools/version" 2>/dev/null)" != "$hfuzz_version" ]; then
  cargo install -q --locked --root "$tools" --version "=$hfuzz_version" honggfuzz
  echo "$hfuzz_version" >"$tools/version"
fi
(cd fuzz && CARGO_TARGET_DIR="$build" cargo hfuzz build -q)

targets=${FUZZ_TARGETS:-$(cd fuzz/targets && ls ./*.rs | sed 's#^\./##; s#\.rs$##')}
failed=()
for t in $targets; do
  ws=$root/target/fuzz-ws/$t
  rm -rf "$ws" && mkdir -p "$ws/new"
  # -P: persistent mode; -t 2: an input running over 2 s counts as a timeout;
  # --rlimit_rss: an input that makes a decoder allocate without bound crashes.
  "$build/honggfuzz" -W "$ws" -f "fuzz/corpus/$t" -o "$ws/new" -P -v -l "$ws/log" \
    -n "${FUZZ_THREADS:-2}" -t 2 --rlimit_rss 2048 --run_time "$secs" --exit_upon_crash \
    -- "$build/x86_64-unknown-linux-gnu/release/$t" >/dev/null 2>&1 || true
  summary=$(grep -o 'Summary iterations.*' "$ws/log" | tail -1 || true)
  echo "fuzz $t: ${summary:-no summary (see $ws/log)}"
  timeouts=$(echo "$summary" | sed -n 's/.*timeout_count:\([0-9]*\).*/\1/p')
  if [ "${timeouts:-0}" -gt 0 ]; then
    # Not a failure (a loaded machine gives them too), but a hint of a slow decoder.
    echo "  $timeouts inputs ran over 2 s: look for a slow decoder with a longer run of $t"
  fi
  crashes=$(find "$ws" -maxdepth 1 -name '*.fuzz' | sort)
  if [ -n "$crashes" ] || [ -z "$summary" ]; then
    failed+=("$t")
    for c in $crashes; do echo "  crashing input: $c"; done
    [ -f "$ws/HONGGFUZZ.REPORT.TXT" ] && echo "  report: $ws/HONGGFUZZ.REPORT.TXT"
    echo "  reproduce: (cd fuzz && CARGO_TARGET_DIR=$build cargo hfuzz run-debug $t CRASH_FILE)"
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: no crash in $(echo "$targets" | wc -w) targets, ${secs} s each"
