#!/usr/bin/env bash
# The GPU network path's checks and its benchmark, ON the GPU machine, in one
# command: a peer killed on another "host" (gpu_procs), four
# collectives through the proxies with two pretend hosts (perf_gpu), then the
# all_reduce sweep 8 B - 1 GB beside NCCL's sockets (scripts/perf-gpu.sh net).
#
# Build here first:
#   scripts/gpu-test.sh --build && scripts/perf-gpu.sh --build
#   BUNDLE/perf/oxccl kernels --out BUNDLE/kernels   # optional: the
#       processes then load prebuilt kernels instead of compiling them
# (BUNDLE: $OXCCL_GPU_BUNDLE, default target/gpu-bundle), then copy
# BUNDLE/oxccl-cuda, oxccl-nccl, perf (and kernels) to the same path in the
# GPU machine's checkout and run there: scripts/gpu-net-check.sh
#
# Logs go to $OUT (or /tmp/oxccl-gpu-net); a pass/fail table at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
# The folder the --build steps fill on the development machine and the
# GPU-side steps read: OXCCL_GPU_BUNDLE, default target/gpu-bundle.
BUNDLE=$(realpath -m "${OXCCL_GPU_BUNDLE:-target/gpu-bundle}")
. scripts/gpu-env.sh
export OXCCL_CACHE_DIR="${OXCCL_CACHE_DIR:-$(mktemp -d /tmp/oxccl-cache.XXXXXX)}"
[ -d "$BUNDLE/kernels" ] && export OXCCL_KERNEL_DIR="$BUNDLE/kernels"
OUTDIR="${OUT:-/tmp/oxccl-gpu-net}"
mkdir -p "$OUTDIR"
NCCL="${OXCCL_PERF_NCCL:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2}"
B=$BUNDLE/oxccl-cuda
P=$BUNDLE/perf

declare -a rows
run() { # name, seconds, command...
  local name=$1 secs=$2; shift 2
  echo; echo "== $name: $*"
  local t0=$SECONDS
  timeout "$secs" "$@" > >(tee "$OUTDIR/$name.log") 2>&1
  local rc=$?
  sleep 0.2
  rows+=("$(printf '%-34s %-4s rc=%-3s %4ss' "$name" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$rc" $((SECONDS - t0)))")
}

run killed_peer_other_host 240 "$B/gpu_procs" --nocapture --test-threads=1 --exact \
  a_killed_peer_on_another_host_is_seen_and_the_proxies_stop
OXCCL_BIN="$P/oxccl" OXCCL_PERF_NCCL="$NCCL" run pretend_hosts_four_collectives 300 \
  "$P/perf_gpu" --nocapture --test-threads=1 --exact two_pretend_hosts_take_the_network_path
# The sweep (perf-gpu.sh net writes net_all_reduce.{log,json,svg} to $OUT).
OUT="$OUTDIR" run net_sweep 560 bash scripts/perf-gpu.sh net
# NCCL_DEBUG=INFO of one small network run: the edges oxccl names, and NCCL's own.
NCCL_DEBUG=INFO run net_info_oxccl 120 "$P/oxccl" perf -T 60 all_reduce --backend cuda --ranks 2 --hosts 2 -b 1M -e 1M -n 2 -w 1 -c 1
NCCL_DEBUG=INFO run net_info_nccl 120 "$P/oxccl" perf -T 60 all_reduce --backend cuda --ranks 2 --hosts 2 -b 1M -e 1M -n 2 -w 1 -c 1 --lib "$NCCL"
grep -hE "via|NET/|Channel" "$OUTDIR/net_info_oxccl.log" | sort | uniq -c | head -20
grep -hE "via NET|NET/Socket|Using network" "$OUTDIR/net_info_nccl.log" | sort | uniq -c | head -20

echo; echo "== summary"
printf '%s\n' "${rows[@]}" | tee "$OUTDIR/summary.txt"
# (No pipe into grep -q: under pipefail printf's SIGPIPE would turn a FAIL
# into a pass.)
! grep -q FAIL <<<"$(printf '%s\n' "${rows[@]}")"
