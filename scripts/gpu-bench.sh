#!/usr/bin/env bash
# PyTorch-driven comparisons ON the GPU machine, one process per GPU:
# NVIDIA's NCCL (PyTorch's own libnccl.so.2) beside oxccl (LD_PRELOAD of the
# library built by scripts/gpu-test.sh --build), in the same job, alternated.
#
#   scripts/gpu-bench.sh sweep [MAX_BYTES]   all_reduce sweep, NCCL then each
#                                            oxccl variant, ROUNDS times
#   scripts/gpu-bench.sh ddp                 DDP losses with both libraries,
#                                            compared line for line
#   scripts/gpu-bench.sh check               scripts/torch_check.py with both,
#                                            digests compared
#   scripts/gpu-bench.sh init                start time and device memory of a
#                                            communicator (torch_init_mem.py),
#                                            oxccl's first and cached starts,
#                                            and a first start with prebuilt
#                                            kernels (KERNELS, default
#                                            BUNDLE/kernels from `oxccl
#                                            kernels --out`) when they exist
#   scripts/gpu-bench.sh share               memory, threads and descriptors per
#                                            process with ranks sharing GPU 0:
#                                            oxccl at 1 2 4 8 16 ranks
#                                            (RANKS_LIST), NCCL at 1
#   scripts/gpu-bench.sh first [N]           process start to the first finished
#                                            all-reduce of five dtype/op pairs
#                                            (torch_first_calls.py), empty home
#                                            and kernel cache: NCCL (one rank
#                                            per GPU), then oxccl with N ranks
#                                            (default 2, sharing GPUs where
#                                            fewer) compiling its kernels, then
#                                            with prebuilt ones (KERNELS),
#                                            ROUNDS times
#   scripts/gpu-bench.sh shrink [N]          torch_shrink.py (shrink_group) with
#                                            N processes (default 4) on oxccl,
#                                            ranks sharing GPUs; with NCCL too
#                                            where there are N GPUs
#
# Environment: ROUNDS (default 2); VARIANTS: space-separated oxccl variants,
# each `label` or `label:VAR=value,VAR=value` (default `default`);
# NCCL_ENV: `VAR=value,...` applied to both libraries (e.g.
# NCCL_P2P_DISABLE=1); LIB: oxccl's libnccl.so.2 (default
# BUNDLE/oxccl-nccl/lib/libnccl.so.2, from scripts/gpu-test.sh --build;
# BUNDLE is $OXCCL_GPU_BUNDLE, default target/gpu-bundle).
# NVLink multicast stays off (shared/gpu.md). Logs go to $OUT (or /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
# The folder the --build steps fill on the development machine and the
# GPU-side steps read: OXCCL_GPU_BUNDLE, default target/gpu-bundle.
BUNDLE=$(realpath -m "${OXCCL_GPU_BUNDLE:-target/gpu-bundle}")
. scripts/gpu-env.sh
export OXCCL_CACHE_DIR="${OXCCL_CACHE_DIR:-/tmp/oxccl-kcache}"
mkdir -p "$OXCCL_CACHE_DIR"
[ -d "$BUNDLE/kcache" ] && cp -n "$BUNDLE"/kcache/* "$OXCCL_CACHE_DIR"/ 2>/dev/null
PY=${PY:-/opt/torch/.venv/bin/python3}
LIB=${LIB:-$BUNDLE/oxccl-nccl/lib/libnccl.so.2}
OUTDIR=${OUT:-/tmp/gpu-bench}
mkdir -p "$OUTDIR"
ROUNDS=${ROUNDS:-2}
NGPU=$(nvidia-smi -L | wc -l)
common_env=()
IFS=',' read -ra kv <<< "${NCCL_ENV:-}"
for x in "${kv[@]}"; do [ -n "$x" ] && common_env+=("$x"); done

launch() { # label preload(0/1) extra-env(csv) script args...
  local label=$1 pre=$2 extra=$3; shift 3
  local envs=("${common_env[@]}")
  IFS=',' read -ra kv <<< "$extra"
  for x in "${kv[@]}"; do [ -n "$x" ] && envs+=("$x"); done
  [ "$pre" = 1 ] && envs+=("LD_PRELOAD=$LIB")
  envs+=("SWEEP_TAG=$label")
  timeout 300 env "${envs[@]}" "$PY" -m torch.distributed.run --standalone \
    --nproc-per-node="${NPROC:-$NGPU}" "$@" 2>&1 | grep -v -e "OMP_NUM_THREADS" -e "^\*\*\*" -e "Warning: \[PG"
}

case "${1:-sweep}" in
sweep)
  MAX=${2:-1073741824}
  for r in $(seq 1 "$ROUNDS"); do
    echo "== round $r"
    launch NCCL 0 "" scripts/torch_ar_sweep.py "$MAX" | tee "$OUTDIR/sweep_nccl_$r.log"
    for v in ${VARIANTS:-default}; do
      label=${v%%:*}; extra=""; [[ $v == *:* ]] && extra=${v#*:}
      launch "$label" 1 "$extra" scripts/torch_ar_sweep.py "$MAX" | tee "$OUTDIR/sweep_${label}_$r.log"
    done
  done
  ;;
ddp)
  launch NCCL 0 "" scripts/torch_ddp.py | tee "$OUTDIR/ddp_nccl.log"
  launch oxccl 1 "" scripts/torch_ddp.py | tee "$OUTDIR/ddp_oxccl.log"
  a=$(grep '^step' "$OUTDIR/ddp_nccl.log"); b=$(grep '^step' "$OUTDIR/ddp_oxccl.log")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "DDP losses: identical ($(echo "$a" | wc -l) steps) PASS"
  else echo "DDP losses differ FAIL"; diff <(echo "$a") <(echo "$b") | head; exit 1; fi
  ;;
check)
  launch NCCL 0 "" scripts/torch_check.py | tee "$OUTDIR/check_nccl.log"
  launch oxccl 1 "" scripts/torch_check.py | tee "$OUTDIR/check_oxccl.log"
  a=$(grep '^digest' "$OUTDIR/check_nccl.log"); b=$(grep '^digest' "$OUTDIR/check_oxccl.log")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "torch_check digests equal: PASS"
  else echo "torch_check digests differ: FAIL ('$a' vs '$b')"; exit 1; fi
  ;;
init)
  # Start cost and device memory: NCCL, then oxccl with an empty kernel
  # cache (first start), then oxccl again (cached start), ROUNDS times.
  for r in $(seq 1 "$ROUNDS"); do
    launch NCCL 0 "" scripts/torch_init_mem.py | grep '^INIT'
    d=$(mktemp -d /tmp/oxccl-init-cache.XXXXXX)
    launch oxccl 1 "OXCCL_CACHE_DIR=$d,INIT_TAG=first-start" scripts/torch_init_mem.py | grep '^INIT'
    launch oxccl 1 "OXCCL_CACHE_DIR=$d,INIT_TAG=cached-start" scripts/torch_init_mem.py | grep '^INIT'
    K=${KERNELS:-$BUNDLE/kernels}
    if [ -d "$K" ]; then
      # Empty cache, kernels from the packaged folder: what an installed
      # oxccl does on its first start.
      d=$(mktemp -d /tmp/oxccl-init-cache.XXXXXX)
      launch oxccl 1 "OXCCL_CACHE_DIR=$d,OXCCL_KERNEL_DIR=$K,INIT_TAG=prebuilt-start" scripts/torch_init_mem.py | grep '^INIT'
      echo "prebuilt-start: $(find "$d" -type f | wc -l) kernels compiled into the empty cache (0: all came from $K)"
    fi
  done
  ;;
share)
  # Memory per process with ranks sharing GPU 0 (torch_init_mem.py,
  # SHARE_GPU=1): oxccl with each rank count in RANKS_LIST, NCCL with one
  # rank (it refuses two on one GPU).
  NPROC=1 launch NCCL 0 "SHARE_GPU=1" scripts/torch_init_mem.py | grep -e '^INIT' -e '^MEM'
  for n in ${RANKS_LIST:-1 2 4 8 16}; do
    NPROC=$n launch oxccl 1 "SHARE_GPU=1,OXCCL_KERNEL_DIR=${KERNELS:-$BUNDLE/kernels}" scripts/torch_init_mem.py |
      grep -e '^INIT' -e '^MEM'
  done
  ;;
first)
  N=${2:-2}
  K=${KERNELS:-$BUNDLE/kernels}
  for r in $(seq 1 "$ROUNDS"); do
    echo "== round $r"
    # A fresh home and kernel cache for every start: a new container's first job.
    fresh() { local h; h=$(mktemp -d /tmp/oxccl-home.XXXXXX); echo "HOME=$h,XDG_CACHE_HOME=$h/.cache,OXCCL_CACHE_DIR=$h/kcache"; }
    NPROC=$((N < NGPU ? N : NGPU)) launch NCCL 0 "$(fresh),FIRST_TAG=ranks$((N < NGPU ? N : NGPU))" scripts/torch_first_calls.py | grep '^FIRST'
    NPROC=$N launch oxccl 1 "$(fresh),OXCCL_KERNEL_DIR=/nonexistent,FIRST_TAG=compiling-ranks$N" scripts/torch_first_calls.py | grep '^FIRST'
    if [ -d "$K" ]; then
      e=$(fresh)
      NPROC=$N launch oxccl 1 "$e,OXCCL_KERNEL_DIR=$K,FIRST_TAG=prebuilt-ranks$N" scripts/torch_first_calls.py | grep '^FIRST'
      d=${e##*OXCCL_CACHE_DIR=}
      echo "prebuilt: $(find "$d" -type f 2>/dev/null | wc -l) kernels compiled into the empty cache (0: all came from $K)"
    fi
  done
  ;;
shrink)
  export NPROC=${2:-4}
  if [ "$NGPU" -ge "$NPROC" ]; then
    launch NCCL 0 "" scripts/torch_shrink.py | tee "$OUTDIR/shrink_nccl.log"
  fi
  launch oxccl 1 "" scripts/torch_shrink.py | tee "$OUTDIR/shrink_oxccl.log"
  ;;
*) sed -n 2,24p "$0"; exit 2 ;;
esac
