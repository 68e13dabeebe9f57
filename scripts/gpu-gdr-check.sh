#!/usr/bin/env bash
# GPUDirect RDMA through a network plugin, checked and timed ON the GPU
# machine with one GPU: two rank processes as two "hosts" (NCCL_HOSTID), the
# repo's test plugin declaring GPU memory (OXTEST_NET_PTR=cuda,dmabuf).
#
# Processes sharing one GPU without MPS take turns in time slices, and each
# plugin copy then waits for its own process's slice (~80 ms), so this starts
# an MPS control daemon of its own (pipe and log folders under $MPS_DIR,
# default /tmp/oxccl-mps: no other process on the machine is served by it)
# and quits it on exit. MPS changes no setting of the GPU.
#
# 1. gpu_procs::across_hosts_gpudirect_decision_is_logged (the ways it
#    stays off), ..._with_gpudirect_through_a_network_plugin (DMA-BUF,
#    receives in GPU memory, sends staged; registration by address with
#    flushed receives; results against the reference, the plugin's byte
#    counts) and ..._gpudirect_sends_reading_gpu_memory (opt-in
#    NCCL_NET_GDR_READ=1), each with the ranks' threads dumped 25 s in.
# 2. all_reduce busbw through the plugin, staged (NCCL_NET_GDR_LEVEL unset)
#    against GPUDirect receives (NCCL_NET_GDR_LEVEL=SYS), alternated for $ROUNDS
#    rounds, results checked (-c 1).
#
# Build here first: scripts/gpu-test.sh --build (gpu_procs, the test plugin,
# libnccl.so.2, the oxccl executable in BUNDLE = $OXCCL_GPU_BUNDLE, default
# target/gpu-bundle); copy BUNDLE to the same path in the GPU machine's
# checkout and run there: scripts/gpu-gdr-check.sh. Logs go to
# /tmp/oxccl-gpu-gdr and, packed with the ranks' NCCL_DEBUG logs and MPS's
# own, to $OUT/gdr-logs.tgz when OUT is set; a pass/fail table and the busbw
# table at the end.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUNDLE=$(realpath -m "${OXCCL_GPU_BUNDLE:-target/gpu-bundle}")
. scripts/gpu-env.sh
OUTDIR=/tmp/oxccl-gpu-gdr
rm -rf "$OUTDIR" && mkdir -p "$OUTDIR/tmp"
# The tests' rank logs land here and stay when a test fails.
export TMPDIR=$OUTDIR/tmp
# A stuck wait ends in an error naming what it waited for, not in the
# run's timeout.
export OXCCL_TIMEOUT_MS=${OXCCL_TIMEOUT_MS:-60000}
B=$BUNDLE/oxccl-cuda
OXCCL=$BUNDLE/oxccl-cli/oxccl
SO=$B/libnccl-net-oxtest.so
ROUNDS=${ROUNDS:-1}
export OXCCL_TEST_NET_PLUGIN=$SO
export OXCCL_CACHE_DIR="${OXCCL_CACHE_DIR:-$(mktemp -d /tmp/oxccl-cache.XXXXXX)}"

# Every kernel for this GPU's architecture once, so the rank processes load
# them instead of each compiling them.
if [ -z "${OXCCL_KERNEL_DIR:-}" ]; then
  KDIR=/tmp/oxccl-gdr-kernels
  CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  "$OXCCL" kernels --out "$KDIR" --arch "$CC" --jobs "$(nproc)" >"$OUTDIR/kernels.log" 2>&1 ||
    { echo "oxccl kernels failed: $OUTDIR/kernels.log"; tail -5 "$OUTDIR/kernels.log"; exit 1; }
  export OXCCL_KERNEL_DIR=$KDIR
fi

MPS_DIR=${MPS_DIR:-/tmp/oxccl-mps}
mkdir -p "$MPS_DIR/pipe" "$MPS_DIR/log"
export CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR/pipe CUDA_MPS_LOG_DIRECTORY=$MPS_DIR/log
if ! nvidia-cuda-mps-control -d; then
  echo "nvidia-cuda-mps-control -d failed: no MPS here, nothing run"
  exit 1
fi
stop_mps() {
  pkill -f "$B/gpu_procs"
  echo quit | nvidia-cuda-mps-control
  cp "$MPS_DIR"/log/*.log "$OUTDIR"/ 2>/dev/null
  [ -n "${OUT:-}" ] && tar -C "$OUTDIR" -czf "$OUT/gdr-logs.tgz" .
}
trap stop_mps EXIT
trap "exit 1" INT TERM

declare -a rows
run() { # name, seconds, command...
  local name=$1 secs=$2; shift 2
  echo; echo "== $name: $*"
  local t0=$SECONDS
  timeout "$secs" "$@" > >(tee "$OUTDIR/$name.log") 2>&1
  local rc=$?
  # Rank processes of a test that timed out would hold the MPS server.
  pkill -f "$B/gpu_procs"
  sleep 0.2
  rows+=("$(printf '%-40s %-4s rc=%-3s %4ss' "$name" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$rc" $((SECONDS - t0)))")
}

# GPUDirect off first: two processes through the plugin under MPS at all.
run gdr_off_logged 150 "$B/gpu_procs" --nocapture --test-threads=1 --ignored --exact \
  across_hosts_gpudirect_decision_is_logged
# Where every thread of the ranks is $STALL_DUMP_S seconds into a run (a
# stalled one shows which wait holds it): name, wchan, syscall, kernel stack.
dump_threads_after() {
  sleep "$1"
  for pid in $(pgrep -f "$B/gpu_procs"); do
    for t in /proc/"$pid"/task/*; do
      echo "== pid $pid tid ${t##*/} $(cat "$t/comm" 2>/dev/null) wchan=$(cat "$t/wchan" 2>/dev/null) syscall=$(cut -d' ' -f1-3 "$t/syscall" 2>/dev/null)"
      head -12 "$t/stack" 2>/dev/null
    done
  done >"$OUTDIR/$2.threads.txt"
}
dump_threads_after "${STALL_DUMP_S:-25}" gdr_checked &
OXCCL_TEST_MPS=1 OXTEST_NET_TRACE=1 run gdr_checked 180 "$B/gpu_procs" --nocapture --test-threads=1 \
  --ignored --exact across_hosts_with_gpudirect_through_a_network_plugin

# Sends reading GPU memory (NCCL_NET_GDR_READ=1, opt-in).
dump_threads_after "${STALL_DUMP_S:-25}" gdr_sends_read_gpu &
OXCCL_TEST_MPS=1 run gdr_sends_read_gpu 120 "$B/gpu_procs" --nocapture --test-threads=1 \
  --ignored --exact across_hosts_gpudirect_sends_reading_gpu_memory

# busbw, staged against GPUDirect, alternated.
SIZES=(-b 1M -e 16M -f 4)
for r in $(seq "$ROUNDS"); do
  for mode in staged gdr; do
    lvl=()
    [ "$mode" = gdr ] && lvl=(NCCL_NET_GDR_LEVEL=SYS)
    run "busbw_${mode}_$r" 90 env NCCL_NET_PLUGIN="$SO" OXTEST_NET_PTR=cuda,dmabuf "${lvl[@]}" \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET NCCL_DEBUG_FILE="$OUTDIR/busbw_${mode}_$r.debug.%p" \
      "$OXCCL" perf --lib "$BUNDLE/oxccl-nccl/lib/libnccl.so.2" -T 40 all_reduce --backend cuda --ranks 2 --share-gpus --hosts 2 "${SIZES[@]}" -n 20 -w 5 -c 1 \
      -J "$OUTDIR/busbw_${mode}_$r.json"
  done
done

echo; echo "== which path each rank took (NCCL_DEBUG=INFO, NET)"
grep -h "GPU Direct RDMA" "$OUTDIR"/busbw_*.debug.* 2>/dev/null | sed 's/^.*NCCL INFO //' | sort | uniq -c

echo; echo "== all_reduce busbw GB/s through the plugin (out of place), staged | GPUDirect, per round"
python3 - "$OUTDIR" "$ROUNDS" <<'EOF'
import json, sys, os
out, rounds = sys.argv[1], int(sys.argv[2])
def rows(mode, r):
    p = os.path.join(out, f"busbw_{mode}_{r}.json")
    try:
        d = json.load(open(p))
    except (OSError, ValueError):
        return {}
    return {x["size"]: x for x in d.get("results", [])}
tables = {(m, r): rows(m, r) for m in ("staged", "gdr") for r in range(1, rounds + 1)}
sizes = sorted({s for t in tables.values() for s in t})
def bw(x):
    o = x.get("out_of_place") or {}
    return o.get("bus_bw")
for s in sizes:
    cells = []
    for m in ("staged", "gdr"):
        cells.append(" ".join(
            f"{bw(tables[(m, r)][s]):7.2f}" if s in tables[(m, r)] and bw(tables[(m, r)][s]) is not None else "      -"
            for r in range(1, rounds + 1)))
    print(f"{s:>11} | {cells[0]} | {cells[1]}")
EOF

echo; echo "== summary"
printf '%s\n' "${rows[@]}" | tee "$OUTDIR/summary.txt"
! grep -q FAIL <<<"$(printf '%s\n' "${rows[@]}")"
