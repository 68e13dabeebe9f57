#!/usr/bin/env bash
# Runs the GPU tests ON the GPU test machine, from the repo root: every test
# binary that has some, with `--include-ignored` (the GPU tests are
# `#[ignore = "needs a GPU: ..."]`, so a plain `cargo test` elsewhere lists
# them as ignored; here they run beside the rest, and fail without a GPU).
#
# Build here first (the GPU machine has no Rust toolchain):
#   scripts/gpu-test.sh --build      # on the development machine: builds the
#                                    # release test binaries into the bundle
#                                    # folder ($OXCCL_GPU_BUNDLE, default
#                                    # target/gpu-bundle)
# then copy that folder to the same path in the GPU machine's checkout, and:
#   scripts/gpu-test.sh              # runs them and prints a pass/fail table
#
# NVLink multicast stays off in everything this starts (shared/gpu.md rules).
set -uo pipefail
cd "$(dirname "$0")/.."
# The folder the --build steps fill on the development machine and the
# GPU-side steps read: OXCCL_GPU_BUNDLE, default target/gpu-bundle.
BUNDLE=$(realpath -m "${OXCCL_GPU_BUNDLE:-target/gpu-bundle}")
TESTS_DIR=$BUNDLE/oxccl-cuda

if [ "${1:-}" = "--build" ]; then
  set -e
  rm -rf "$TESTS_DIR" && mkdir -p "$TESTS_DIR"
  # The test executables, found through cargo's JSON messages: oxccl-cuda's,
  # the C API's GPU tests, the Rust device API's tests and `oxccl perf`'s GPU tests.
  { cargo test --release -p oxccl-cuda --no-run --message-format=json 2>/dev/null
    cargo test --release -p oxccl-nccl --test gpu_abi --test gpu_procs --no-run --message-format=json 2>/dev/null
    cargo test --release -p oxccl --test gpu_example --test gpu_device_api --test gpu_tuner --no-run --message-format=json 2>/dev/null
    cargo test --release -p oxccl-cli --test perf_gpu --no-run --message-format=json 2>/dev/null; } |
    python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])' |
    while read -r name exe; do
      [ "$name" = oxccl_cuda ] && continue # the library's unit tests: none need a GPU
      # Debug info off: a smaller bundle to copy.
      objcopy --strip-debug "$exe" "$TESTS_DIR/$name"; echo "bundled $name"
    done
  # libnccl.so.2 + nccl.h for C programs and nccl-tests (NCCL_HOME layout).
  cargo build --release -p oxccl-nccl --lib
  L=$BUNDLE/oxccl-nccl
  rm -rf "$L" && mkdir -p "$L/lib" "$L/include"
  objcopy --strip-debug "${CARGO_TARGET_DIR:-target}/release/libnccl.so" "$L/lib/libnccl.so"
  ln -sf libnccl.so "$L/lib/libnccl.so.2"
  cp crates/oxccl-nccl/include/nccl.h "$L/include/"
  # The `oxccl` executable, for perf_gpu (OXCCL_BIN there).
  cargo build --release -p oxccl-cli
  mkdir -p "$BUNDLE/oxccl-cli"
  objcopy --strip-debug "${CARGO_TARGET_DIR:-target}/release/oxccl" "$BUNDLE/oxccl-cli/oxccl"
  # The repo's network plugin, for gpu_procs' plugin test (no cargo there).
  cargo build -p oxccl-net-test-plugin
  cp "${CARGO_TARGET_DIR:-target}/debug/libnccl_net_oxtest.so" "$TESTS_DIR/libnccl-net-oxtest.so"
  # sm_90 CUBINs of every kernel (the H200s), so the GPU machine's processes
  # load them from the disk cache instead of each compiling for ~30 s.
  # OXCCL_SKIP_KCACHE=1 keeps the last ones (no kernel source changed, or
  # the GPU side uses `oxccl kernels --out`'s folder instead).
  if [ -z "${OXCCL_SKIP_KCACHE:-}" ]; then
    rm -rf "$BUNDLE/kcache" && mkdir -p "$BUNDLE/kcache"
    OXCCL_WARM_CACHE=$BUNDLE/kcache cargo test --release -p oxccl-cuda --test kernels_compile \
      every_program_is_prebuilt_for_each_architecture -- --ignored --nocapture 2>&1 | grep -E "bytes of|prebuilt [0-9]|test result"
  fi
  ls -la "$TESTS_DIR" "$L/lib" "$BUNDLE/kcache"
  exit 0
fi

. scripts/gpu-env.sh
export OXCCL_CACHE_DIR="${OXCCL_CACHE_DIR:-$(mktemp -d /tmp/oxccl-cache.XXXXXX)}"
# Kernels compiled by --build (same NVRTC 13.0, sm_90), when bundled. The
# first-start row below then checks the cache path rather than NVRTC.
if [ -n "${OXCCL_USE_KCACHE:-}" ] && [ -d "$BUNDLE/kcache" ]; then
  cp "$BUNDLE"/kcache/* "$OXCCL_CACHE_DIR"/ 2>/dev/null || true
fi
OUTDIR="${OUT:-/tmp/oxccl-gpu-test}"
mkdir -p "$OUTDIR"

echo "== machine"
date -u +%FT%TZ
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
nvidia-smi topo -m
echo "OXCCL_CACHE_DIR=$OXCCL_CACHE_DIR"

declare -a rows
run() { # name, command...  (OXCCL_GPU_ONLY="name ..." runs only those rows)
  local name=$1; shift
  if [ -n "${OXCCL_GPU_ONLY:-}" ] && [[ " $OXCCL_GPU_ONLY " != *" $name "* ]]; then return; fi
  echo; echo "== $name: $*"
  local t0=$(date +%s.%N)
  timeout "${OXCCL_TEST_TIMEOUT:-180}" "$@" 2>&1 | tee "$OUTDIR/$name.log"
  local rc=${PIPESTATUS[0]}
  local t1=$(date +%s.%N)
  local secs=$(python3 -c "print(f'{$t1-$t0:.1f}')")
  # Tests that did not run: libtest's "N ignored" (0 with --include-ignored).
  local ignored=$(grep -oE '[0-9]+ ignored' "$OUTDIR/$name.log" | awk '{s += $1} END {print s + 0}')
  rows+=("$(printf '%-34s %-5s %6ss  ignored=%s' "$name" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$secs" "$ignored")")
}

B=$TESTS_DIR
# Every row runs ignored tests too (`--include-ignored`); tests with a row of
# their own are `--skip`ped in the others. With one GPU the tests that need
# two (`two_gpus_*`, and GPUDirect across hosts, which one GPU runs only
# under MPS: scripts/gpu-gdr-check.sh) are skipped too, and a row says so.
ALL=--include-ignored
NGPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$NGPUS" -lt 2 ]; then
  ALL="$ALL --skip two_gpus --skip across_hosts_with_gpudirect --skip across_hosts_gpudirect_sends"
  rows+=("two_gpus_* tests: not run ($NGPUS GPU visible)  SKIP")
fi
# Processes for the PyTorch rows: one per GPU, two at most.
NPROC=$(( NGPUS < 2 ? 1 : 2 ))
PAIR=two_gpus_a_missing_partner_times_out
run no_driver        "$B/no_driver" --nocapture --test-threads=1 $ALL
run kernels_compile  "$B/kernels_compile" --nocapture $ALL
run gpu_first_start  "$B/gpu" --nocapture --test-threads=1 $ALL --skip two_gpus_timing_one_shot_all_reduce
# A second process start: every kernel must come from the disk cache.
run gpu_second_start "$B/gpu" --nocapture --test-threads=1 $ALL --exact device_memory_round_trip_and_copy_kernel
if [ -f "$OUTDIR/gpu_second_start.log" ]; then
  grep -q "copy.cu: DiskCache" "$OUTDIR/gpu_second_start.log" && echo "second start: kernels from the disk cache" \
    || rows+=("second start did not read the disk cache   FAIL")
fi
ls -la "$OXCCL_CACHE_DIR"
run gpu_abi          "$B/gpu_abi" --nocapture --test-threads=1 $ALL --skip $PAIR
# The Rust device API: its example (two processes all-reduce GPU buffers)
# and every collective with two ranks as threads.
run gpu_example      "$B/gpu_example" --nocapture --test-threads=1 $ALL
run gpu_device_api   "$B/gpu_device_api" --nocapture --test-threads=1 $ALL
# A tuner plugin (compiled here with cc) forcing the GPU ring kernels.
run gpu_tuner        "$B/gpu_tuner" --nocapture --test-threads=1 $ALL
# The same in-process tests through the ring path: forced over peer memory,
# and through pinned host memory (NCCL_P2P_DISABLE=1).
run gpu_abi_ring     env OXCCL_CUDA_RING=1 "$B/gpu_abi" --nocapture --test-threads=1 $ALL --skip $PAIR
run gpu_abi_host     env NCCL_P2P_DISABLE=1 "$B/gpu_abi" --nocapture --test-threads=1 $ALL --skip $PAIR
# Small calls of both ranks of one process: as two kernels on one GPU
# (before the one-launch kernel, oxccl_core::gpu::one_launch, took them there by default), and
# as one launch on two GPUs (off by default until timed there).
run gpu_abi_nojoint  env OXCCL_CUDA_JOINT_MAX=0 "$B/gpu_abi" --nocapture --test-threads=1 $ALL --skip $PAIR
run gpu_abi_joint_peers env OXCCL_CUDA_JOINT_PEERS=1 "$B/gpu_abi" --nocapture --test-threads=1 $ALL --skip $PAIR
# Every copying call of the two-GPU test through the copy engines (the test
# asserts that each one went there).
run gpu_abi_ce       env OXCCL_CUDA_CE_MIN=1 "$B/gpu_abi" --nocapture --test-threads=1 $ALL --skip $PAIR
# Every all-reduce and reduce-scatter (sum, prod, max, min) of the two-GPU
# tests through the copy-engine reduction (two_gpus_copy_engine_reductions
# asserts that each one went there; the others check their results).
OXCCL_TEST_TIMEOUT=300 run gpu_abi_ce_ar env OXCCL_CUDA_CE_AR_MIN=1 "$B/gpu_abi" --nocapture --test-threads=1 $ALL --skip $PAIR
# A pair kernel whose partner never launches ends at the timeout (the test
# runs it in a child process with OXCCL_TIMEOUT_MS=2000).
[ "$NGPUS" -ge 2 ] && run gpu_abi_pair_timeout "$B/gpu_abi" --nocapture --test-threads=1 --ignored --exact $PAIR
# One process per GPU (CUDA IPC), 3 and 4 ranks, host memory, a missing peer.
# (child_rank is each rank's half: the tests start it themselves.)
OXCCL_TEST_TIMEOUT=600 run gpu_procs env OXCCL_TEST_NET_PLUGIN="$B/libnccl-net-oxtest.so" \
  "$B/gpu_procs" --nocapture --test-threads=1 $ALL --skip child_rank
# `oxccl perf --backend cuda` end to end: the bundled executable and library;
# NVIDIA's NCCL from the PyTorch wheel for the comparisons.
OXCCL_TEST_TIMEOUT=600 run perf_gpu env OXCCL_BIN="$BUNDLE/oxccl-cli/oxccl" \
  OXCCL_PERF_LIB="$BUNDLE/oxccl-nccl/lib/libnccl.so.2" "$B/perf_gpu" --nocapture --test-threads=1 $ALL
[ "$NGPUS" -ge 2 ] && run timing "$B/gpu" --nocapture --ignored --test-threads=1 --exact two_gpus_timing_one_shot_all_reduce

if [ -z "${OXCCL_SKIP_TORCH:-}" ] && [ -x /opt/torch/.venv/bin/python3 ] && [ -f scripts/nccl_allreduce_timing.py ]; then
  OXCCL_TEST_TIMEOUT=120 run nccl_reference /opt/torch/.venv/bin/python3 -m torch.distributed.run --standalone --nproc-per-node=$NPROC scripts/nccl_allreduce_timing.py
fi

# PyTorch, one process per GPU, NVIDIA's NCCL then oxccl (LD_PRELOAD): the
# digests of every output must be equal (each run also checks every output
# against values computed on the host). NCCL refuses two ranks on one GPU,
# so with one GPU the pair is one process each, and a third row runs oxccl
# with two processes sharing the GPU.
TR=/opt/torch/.venv/bin/python3
if [ -z "${OXCCL_SKIP_TORCH:-}" ] && [ -x $TR ]; then
  OXCCL_TEST_TIMEOUT=300 run torch_nccl $TR -m torch.distributed.run --standalone --nproc-per-node=$NPROC scripts/torch_check.py
  OXCCL_TEST_TIMEOUT=300 run torch_oxccl env LD_PRELOAD="$BUNDLE/oxccl-nccl/lib/libnccl.so.2" \
    $TR -m torch.distributed.run --standalone --nproc-per-node=$NPROC scripts/torch_check.py
  [ "$NGPUS" -lt 2 ] && OXCCL_TEST_TIMEOUT=300 run torch_oxccl_shared env \
    LD_PRELOAD="$BUNDLE/oxccl-nccl/lib/libnccl.so.2" \
    $TR -m torch.distributed.run --standalone --nproc-per-node=2 scripts/torch_check.py
  if [ -f "$OUTDIR/torch_nccl.log" ] && [ -f "$OUTDIR/torch_oxccl.log" ]; then
    a=$(grep '^digest' "$OUTDIR/torch_nccl.log"); b=$(grep '^digest' "$OUTDIR/torch_oxccl.log")
    if [ -n "$a" ] && [ "$a" = "$b" ]; then rows+=("torch digests equal (NCCL = oxccl)  PASS")
    else rows+=("torch digests differ: '$a' vs '$b'  FAIL"); fi
  fi
fi

echo; echo "== summary"
printf '%s\n' "${rows[@]}" | tee "$OUTDIR/summary.txt"
# (No pipe into grep -q: under pipefail printf's SIGPIPE would turn a FAIL
# into a pass.)
! grep -q FAIL <<<"$(printf '%s\n' "${rows[@]}")"
