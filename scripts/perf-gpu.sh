#!/usr/bin/env bash
# Runs `oxccl perf --backend cuda` ON the GPU test machine, from the repo root:
# oxccl's libnccl on 2 GPUs driven by one thread (-g 2), one process per GPU
# (--ranks 2), CUDA graph replays (-G 10), side by side with NVIDIA's NCCL
# (--compare), and every collective once with a check. Logs, JSON and SVG
# plots go to $OUT or /tmp/oxccl-perf-gpu.
#
# Build here first (the GPU machine has no Rust toolchain):
#   scripts/perf-gpu.sh --build      # on the development machine: release
#                                    # oxccl + libnccl.so + the perf_gpu test
#                                    # binary, stripped, into BUNDLE/perf/
#                                    # (BUNDLE: $OXCCL_GPU_BUNDLE, default
#                                    # target/gpu-bundle)
# then, with that folder copied to the GPU machine's checkout, there:
#   scripts/perf-gpu.sh              # everything, then a pass/fail table
#   scripts/perf-gpu.sh quick        # the -g 2 sweep and the checks only
#   scripts/perf-gpu.sh rest         # all but those (where a command may run
#                                    # at most 10 minutes: quick, then rest)
#   scripts/perf-gpu.sh latency      # all_reduce 8 B-1 MB, 2 processes, one-shot
#                                    # LL against ring LL, eager and graphs, vs NCCL
#   scripts/perf-gpu.sh agrs         # all_gather / reduce_scatter to 2 GB vs NCCL
#   scripts/perf-gpu.sh agrs_small   # all_gather / reduce_scatter 8 B-1 MB, 2
#                                    # processes, eager and graphs, vs NCCL
#   scripts/perf-gpu.sh tuning       # NCCL's and oxccl's per-size choices (TUNING log)
#   scripts/perf-gpu.sh net          # the network path (--hosts 2) vs NCCL's sockets
#   scripts/perf-gpu.sh channels     # 512 KB-1 GB, 2 processes, oxccl at its
#                                    # default SMs and capped at NCCL's 24, vs NCCL
#   scripts/perf-gpu.sh ce           # copying collectives, -g 2, copy engines
#                                    # against the copy kernel, vs NCCL
#   scripts/perf-gpu.sh ce_cross     # 32-512 MB, copy engines at every size
#                                    # against the copy kernel (the threshold)
#   scripts/perf-gpu.sh pdl          # small all-reduces (2 processes and -g 2,
#                                    # eager and graphs) with programmatic
#                                    # launches on and off, vs NCCL
#   scripts/perf-gpu.sh xp           # 2 processes, 32 MB-4 GB: copy engines with
#                                    # the peer process against the ring kernels,
#                                    # vs NCCL (OXCCL_XP_COLLS picks collectives)
#   scripts/perf-gpu.sh sweep2       # every collective, 2 processes, 8 B-64 MB,
#                                    # eager and graphs, vs NCCL
#                                    # (OXCCL_SWEEP_COLLS picks collectives)
#   scripts/perf-gpu.sh multi        # every GPU of a 4- or 8-GPU NVSwitch host:
#                                    # checks of every collective, AR/AG/RS
#                                    # sweeps to 8 GB, --ranks N and -g N, vs NCCL
#   scripts/perf-gpu.sh push_variants  # all_reduce / reduce_scatter 128 MB-4 GB,
#                                    # 2 processes: in-place pushes and two copy
#                                    # streams against the defaults, two rounds,
#                                    # vs NCCL; checks (OXCCL_PUSH_COLLS picks)
#   scripts/perf-gpu.sh ar_mid       # all_reduce 256 KB-4 MB, 2 processes, graphs:
#                                    # ring LL on 32 channels (default) against 24
#                                    # and 16, and the Simple ring from 512 KiB
#                                    # (OXCCL_CUDA_LL_MAX=512K), two rounds, vs NCCL
#                                    # (the 1 MiB gap)
#   scripts/perf-gpu.sh small        # all_reduce 8 B-1 MB, 2 processes, graphs and
#                                    # eager: the small one-shot kernel (default)
#                                    # against OXCCL_CUDA_LL1_FAST=0, two rounds, vs NCCL;
#                                    # then broadcast, reduce, all_gather and
#                                    # reduce_scatter 8 B-512 KB under graphs, the same
#                                    # (OXCCL_SMALL_COLLS picks among those four)
#   scripts/perf-gpu.sh joint        # the five small collectives 8 B-256 KB, -g N
#                                    # (every GPU), eager: every rank in one launch
#                                    # (OXCCL_CUDA_JOINT_PEERS=1) against a kernel per
#                                    # GPU, three rounds, vs NCCL; then every type and
#                                    # op checked through it (OXCCL_JOINT_COLLS picks)
#   scripts/perf-gpu.sh twoshot      # all_reduce 16 KB-1 MB, 4 and 8 ranks of one
#                                    # process under graphs: the two-shot LL kernel
#                                    # against the LL ring (OXCCL_CUDA_TWOSHOT_MAX=0),
#                                    # three rounds, vs NCCL where every rank has a
#                                    # GPU of its own (else the ranks share the GPUs,
#                                    # --share-gpus, no NCCL); then every type and op
#                                    # checked (OXCCL_TWOSHOT_RANKS picks the counts)
#   scripts/perf-gpu.sh direct       # all_reduce / all_gather / reduce_scatter
#                                    # 256 KB-64 MB, 4 and 8 ranks of one process
#                                    # under graphs: the direct kernels over Simple
#                                    # slots (OXCCL_CUDA_DIRECT_MAX=1G) against the
#                                    # Simple ring (=0), two rounds, NCCL beside where
#                                    # every rank has a GPU (else --share-gpus); then
#                                    # checked (OXCCL_DIRECT_RANKS, OXCCL_DIRECT_COLLS,
#                                    # OXCCL_DIRECT_CHECK_TYPES pick)
#   scripts/perf-gpu.sh twoshot_wide # all_reduce 256 KB-8 MB, 4 and 8 ranks of one
#                                    # process under graphs: the two-shot past LL's
#                                    # bound (OXCCL_CUDA_TWOSHOT_MAX=8M) against the
#                                    # default (Simple ring from 512 KiB), three
#                                    # rounds, NCCL beside where every rank has a GPU
#                                    # (else --share-gpus, no NCCL); then checked
#   scripts/perf-gpu.sh share        # ranks sharing GPU 0 (--share-gpus, no NCCL):
#                                    # 12 ranks' all_reduce and alltoall and 8
#                                    # ranks' alltoall 1 MB-128 MB, checked (more
#                                    # blocks than the SMs hold once hung, so
#                                    # channels are now SMs / ranks); 5-7 ranks' AR/AG/RS 1 MB-256 MB at the
#                                    # default channels (SMs / ranks) against
#                                    # NCCL_MAX_NCHANNELS=16 (before), two rounds
#   scripts/perf-gpu.sh ce_ar        # all_reduce / reduce_scatter 64 MB-8 GB, -g 2,
#                                    # the copy-engine reduction at its default
#                                    # bound and off (SM kernel), vs NCCL
#                                    # (OXCCL_CE_AR_COLLS="all_reduce" runs one)
#
# NVLink multicast stays off in everything this starts (shared/gpu.md rules).
# Every run has a deadline: -T 120 inside oxccl perf, `timeout` around it.
set -uo pipefail
cd "$(dirname "$0")/.."
# The folder the --build steps fill on the development machine and the
# GPU-side steps read: OXCCL_GPU_BUNDLE, default target/gpu-bundle.
BUNDLE=$(realpath -m "${OXCCL_GPU_BUNDLE:-target/gpu-bundle}")
PERF_DIR=$BUNDLE/perf

if [ "${1:-}" = "--build" ]; then
  set -e
  T="${CARGO_TARGET_DIR:-target}"
  cargo build --release -p oxccl-cli -p oxccl-nccl
  rm -rf "$PERF_DIR" && mkdir -p "$PERF_DIR"
  # Debug info off: a smaller bundle to copy.
  objcopy --strip-debug "$T/release/oxccl" "$PERF_DIR/oxccl"
  # `oxccl perf --backend cuda` finds oxccl's libnccl next to its executable.
  objcopy --strip-debug "$T/release/libnccl.so" "$PERF_DIR/libnccl.so"
  ln -sf libnccl.so "$PERF_DIR/libnccl.so.2"
  cargo test --release -p oxccl-cli --test perf_gpu --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' |
    while read -r exe; do objcopy --strip-debug "$exe" "$PERF_DIR/perf_gpu"; echo "bundled perf_gpu"; done
  ls -la "$PERF_DIR"
  du -sh "$PERF_DIR"
  exit 0
fi

MODE="${1:-all}"
. scripts/gpu-env.sh
export OXCCL_CACHE_DIR="${OXCCL_CACHE_DIR:-$(mktemp -d /tmp/oxccl-cache.XXXXXX)}"
OUTDIR="${OUT:-/tmp/oxccl-perf-gpu}"
mkdir -p "$OUTDIR"
X="$PERF_DIR/oxccl"
NCCL="${OXCCL_PERF_NCCL:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2}"
[ -x "$X" ] || { echo "no $X: run scripts/perf-gpu.sh --build on the development machine and copy $PERF_DIR here"; exit 2; }

echo "== machine"
date -u +%FT%TZ
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
nvidia-smi topo -m
echo "OXCCL_CACHE_DIR=$OXCCL_CACHE_DIR NCCL=$NCCL"
[ -f "$NCCL" ] || echo "NVIDIA NCCL not found at $NCCL: the --compare and --lib NCCL runs will fail"

declare -a rows
# The host's GPUs, and the -g form for `g` ranks of one process: a GPU each
# with NCCL beside (--compare), or, with fewer GPUs than ranks, sharing them
# and no NCCL (it refuses two ranks on one GPU). Sets G and cmp.
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
ranks_form() {
  if [ "$1" -le "$NG" ]; then G="-g $1"; cmp="--compare $NCCL"; else G="-g $1 --share-gpus"; cmp=""; fi
}
run() { # name, seconds, command...
  local name=$1 secs=$2; shift 2
  echo; echo "== $name: $*"
  local t0=$(date +%s.%N)
  timeout "$secs" "$@" > >(tee "$OUTDIR/$name.log") 2> >(tee "$OUTDIR/$name.err" >&2)
  local rc=$?
  sleep 0.2 # let tee finish
  local t1=$(date +%s.%N)
  local dt=$(python3 -c "print(f'{$t1-$t0:.1f}')")
  local oob=$(grep -h "Out of bounds values" "$OUTDIR/$name.log" | tail -1 | sed 's/# Out of bounds values : //')
  local bw=$(grep -h "Avg bus bandwidth" "$OUTDIR/$name.log" | tail -1 | sed 's/# Avg bus bandwidth *: //')
  rows+=("$(printf '%-26s %-4s rc=%-3s %7ss  oob=%-10s avg-busbw=%s' "$name" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$rc" "$dt" "${oob:--}" "${bw:--}")")
}

P="perf -T 120"
if [ "$MODE" = all ] || [ "$MODE" = quick ]; then
  # 1. The headline sweep: one process, one thread driving both GPUs.
  run g2_all_reduce 600 "$X" $P all_reduce --backend cuda -g 2 -b 8 -e 1G -f 4 -c 1 -J "$OUTDIR/g2_all_reduce.json"
  # 2. Every collective once, checked, at a few sizes (8 B .. 8 MB).
  for c in all_reduce all_gather broadcast reduce reduce_scatter alltoall gather scatter sendrecv; do
    run "check_$c" 300 "$X" $P "$c" --backend cuda -g 2 -b 8 -e 8M -f 32 -c 1 -n 5 -w 2
  done
fi
if [ "$MODE" = all ] || [ "$MODE" = rest ]; then
  # 3. One process per GPU (oxccl's libnccl, then NVIDIA's as the measured
  #    library, so a failure of the first is told apart from one of the tool).
  run ranks2_all_reduce 600 "$X" $P all_reduce --backend cuda --ranks 2 -b 8 -e 1G -f 4 -c 1 -J "$OUTDIR/ranks2_all_reduce.json"
  run ranks2_nccl_lib 600 "$X" $P all_reduce --backend cuda --ranks 2 -b 8 -e 1G -f 4 -c 1 --lib "$NCCL"
  # 4. CUDA graphs: the -n loop captured once, 10 replays timed.
  run g2_graph10 600 "$X" $P all_reduce --backend cuda -g 2 -b 8 -e 1G -f 4 -c 1 -G 10 -J "$OUTDIR/g2_graph10.json"
  run g2_graph10_nccl_lib 600 "$X" $P all_reduce --backend cuda -g 2 -b 8 -e 1G -f 4 -c 1 -G 10 --lib "$NCCL"
  # 5. Side by side with NVIDIA's NCCL, interleaved size by size (ratio column).
  run g2_compare_nccl 900 "$X" $P all_reduce --backend cuda -g 2 -b 8 -e 1G -f 4 -c 1 --compare "$NCCL" -J "$OUTDIR/g2_compare_nccl.json"
  # 6. Two threads, one GPU each; blocking calls.
  run t2_all_reduce 600 "$X" $P all_reduce --backend cuda -t 2 -b 8 -e 64M -f 8 -c 1 -z 1
  # 7. The GPU test file (skips nothing here).
  if [ -x "$PERF_DIR/perf_gpu" ]; then
    OXCCL_BIN="$X" OXCCL_PERF_NCCL="$NCCL" run perf_gpu_tests 900 "$PERF_DIR/perf_gpu" --test-threads=1
  fi
fi
# Plots of the JSON files that were written.
if [ "$MODE" = latency ]; then
  # Small all-reduces, 2 processes, beside NCCL (interleaved per size):
  # the one-shot LL kernel (default) and the ring LL (OXCCL_CUDA_ONESHOT_MAX=0),
  # eager and under CUDA graphs, float and bfloat16.
  L="all_reduce --backend cuda --ranks 2 -b 8 -e 1M -f 4 -c 1 -n 200 -w 20 --compare $NCCL"
  run lat_eager 300 "$X" $P $L -J "$OUTDIR/lat_eager.json"
  run lat_graph 300 "$X" $P $L -G 10 -J "$OUTDIR/lat_graph.json"
  run lat_graph_bf16 300 "$X" $P $L -G 10 -d bfloat16
  OXCCL_CUDA_ONESHOT_MAX=0 run lat_eager_ringll 300 "$X" $P $L
  OXCCL_CUDA_ONESHOT_MAX=0 run lat_graph_ringll 300 "$X" $P $L -G 10
  OXCCL_CUDA_ONESHOT_MAX=1M run lat_graph_oneshot1m 300 "$X" $P $L -G 10
  run lat_g2_graph 300 "$X" $P all_reduce --backend cuda -g 2 -b 8 -e 1M -f 4 -c 1 -n 200 -w 20 -G 10 --compare "$NCCL"
fi
if [ "$MODE" = agrs ]; then
  # All-gather and reduce-scatter from 128 MB, 2 processes, beside NCCL.
  for c in all_gather reduce_scatter; do
    run "big_$c" 400 "$X" $P $c --backend cuda --ranks 2 -b 8 -e 2G -f 8 -c 1 -n 10 -w 3 --compare "$NCCL" -J "$OUTDIR/big_$c.json"
  done
fi
if [ "$MODE" = agrs_small ]; then
  # Small all-gathers and reduce-scatters (the one-shot LL kernel up to
  # 128 KiB per rank for 2 ranks), beside NCCL per size.
  for c in all_gather reduce_scatter; do
    S="$c --backend cuda -b 8 -e 1M -f 4 -c 1 -n 200 -w 20 --compare $NCCL"
    run "small_${c}_eager" 200 "$X" $P $S --ranks 2 -J "$OUTDIR/small_${c}_eager.json"
    run "small_${c}_graph" 200 "$X" $P $S --ranks 2 -G 10 -J "$OUTDIR/small_${c}_graph.json"
  done
fi
if [ "$MODE" = net ]; then
  # The GPU network path beside NCCL's sockets, one machine: each process
  # its own pretend host (--hosts 2 sets NCCL_HOSTID, which both read),
  # interleaved per size, every power of two from 8 B to 1 GB.
  run net_all_reduce 500 "$X" $P all_reduce --backend cuda --ranks 2 --hosts 2 -b 8 -e 1G -f 2 -c 1 -n 10 -w 3 --compare "$NCCL" -J "$OUTDIR/net_all_reduce.json"
fi
if [ "$MODE" = channels ]; then
  # Does oxccl need more SMs than NCCL's 24 (its TUNING log from 512 KB)?
  # The same sweep at the default and with NCCL_MAX_NCHANNELS=24 (which NCCL
  # already uses, so its column is the same library both times).
  for c in all_reduce all_gather reduce_scatter; do
    run "ch_default_$c" 300 "$X" $P $c --backend cuda --ranks 2 -b 512K -e 1G -f 4 -c 1 -n 20 -w 5 --compare "$NCCL" -J "$OUTDIR/ch_default_$c.json"
    NCCL_MAX_NCHANNELS=24 run "ch_24_$c" 300 "$X" $P $c --backend cuda --ranks 2 -b 512K -e 1G -f 4 -c 1 -n 20 -w 5 --compare "$NCCL" -J "$OUTDIR/ch_24_$c.json"
  done
fi
if [ "$MODE" = ce ]; then
  # The copy engines (one process, both GPUs, -g 2): the copying collectives
  # from 1 MB to 1 GB beside NCCL at the default (copy engines from 64 MiB both ways, 128 one way
  # per transfer) and with the copy kernel only (OXCCL_CUDA_CE_MIN=0).
  for c in all_gather broadcast sendrecv alltoall gather scatter; do
    G="$c --backend cuda -g 2 -b 1M -e 1G -f 4 -c 1 -n 10 -w 3 --compare $NCCL"
    run "ce_default_$c" 200 "$X" $P $G -J "$OUTDIR/ce_default_$c.json"
    OXCCL_CUDA_CE_MIN=0 run "ce_off_$c" 200 "$X" $P $G
  done
fi
if [ "$MODE" = ce_cross ]; then
  # Where the copy engines start to win: 32 MB-512 MB, copy engines at every
  # size (=1) against the copy kernel (=0), NCCL beside each.
  for c in all_gather broadcast sendrecv; do
    for m in 1 0; do
      OXCCL_CUDA_CE_MIN=$m run "ce_min${m}_$c" 200 "$X" $P $c --backend cuda -g 2 -b 32M -e 512M -f 2 -c 1 -n 20 -w 5 --compare "$NCCL"
    done
  done
fi
if [ "$MODE" = pdl ]; then
  # Small all-reduces (8 B-1 MB) with programmatic dependent launches (the
  # default) and without (OXCCL_CUDA_PDL=0), NCCL beside each: 2 processes
  # and one process driving both GPUs (-g 2: the pair kernels eager, the
  # ring's one-shot under graphs; OXCCL_CUDA_RING=1 puts eager on the ring
  # too), eager and under CUDA graphs.
  L="all_reduce --backend cuda -b 8 -e 1M -f 4 -c 1 -n 200 -w 20 --compare $NCCL"
  for m in 1 0; do
    for g in "--ranks 2" "-g 2"; do
      tag="pdl${m}_$(echo "$g" | tr -d ' -')"
      OXCCL_CUDA_PDL=$m run "${tag}_eager" 200 "$X" $P $L $g -J "$OUTDIR/${tag}_eager.json"
      OXCCL_CUDA_PDL=$m run "${tag}_graph" 200 "$X" $P $L $g -G 10 -J "$OUTDIR/${tag}_graph.json"
    done
    OXCCL_CUDA_PDL=$m OXCCL_CUDA_RING=1 run "pdl${m}_g2_ring_eager" 200 "$X" $P $L -g 2
  done
  # The other small collectives under graphs, 2 processes, programmatic on.
  for c in all_gather reduce_scatter sendrecv alltoall; do
    run "pdl1_ranks2_${c}_graph" 200 "$X" $P $c --backend cuda --ranks 2 -b 8 -e 1M -f 8 -c 1 -n 200 -w 20 -G 10 --compare "$NCCL"
  done
fi
if [ "$MODE" = ce_ar ]; then
  # The copy-engine all-reduce / reduce-scatter (one process, both GPUs,
  # -g 2) from 64 MB to 8 GB beside NCCL: at the default bound
  # (OXCCL_CUDA_CE_AR_MIN unset: copy engines from 512 MiB) and with the SM
  # pair kernel only (=0). Buffers up to 8 GB per rank (16 GB with -c's
  # reference), so one run per collective and setting takes minutes.
  for c in ${OXCCL_CE_AR_COLLS:-all_reduce reduce_scatter}; do
    G="$c --backend cuda -g 2 -b 64M -e 8G -f 2 -c 1 -n 10 -w 3 --compare $NCCL"
    run "ce_ar_default_$c" 280 "$X" $P $G -J "$OUTDIR/ce_ar_default_$c.json"
    OXCCL_CUDA_CE_AR_MIN=0 run "ce_ar_off_$c" 280 "$X" $P $G -J "$OUTDIR/ce_ar_off_$c.json"
  done
fi
if [ "$MODE" = xp ]; then
  # One process per GPU (--ranks 2): the copy engines with the peer process
  # (crates/oxccl-cuda/src/xp.rs) at the default bounds, and the ring
  # kernels only (both bounds 0), beside NCCL, 32 MB-4 GB; then a checked
  # run of each collective at 512 MB-1 GB on the engines. Scatters, gathers
  # and all-to-alls take the engines for their transfer with the peer while
  # SMs copy the rank's own part.
  for c in ${OXCCL_XP_COLLS:-all_gather sendrecv reduce_scatter all_reduce broadcast scatter gather alltoall}; do
    R="$c --backend cuda --ranks 2 -b 32M -e 4G -f 2 -c 0 -n 8 -w 2 --compare $NCCL"
    run "xp_default_$c" 240 "$X" $P $R -J "$OUTDIR/xp_default_$c.json"
    OXCCL_CUDA_CE_MIN=0 OXCCL_CUDA_CE_AR_MIN=0 run "xp_off_$c" 240 "$X" $P $R -J "$OUTDIR/xp_off_$c.json"
    run "xp_check_$c" 240 "$X" $P $c --backend cuda --ranks 2 -b 512M -e 1G -f 2 -c 1 -n 2 -w 1
  done
fi
if [ "$MODE" = push_variants ]; then
  # Pushed reductions between two processes, the settings not yet timed on
  # two GPUs against the defaults, two rounds alternated, NCCL beside (its
  # out-of-place time: compare both columns):
  #   in place pushed (OXCCL_CUDA_CE_PUSH_IN_PLACE=1: the first piece into
  #   the peer's scratch, the rest into the peer's copy of this rank's part;
  #   ce_reduce.rs plan_pushed_in_place) against pulled through the scratch
  #   ring (below 256 MiB pulled means the ring kernel);
  #   pieces on two copy streams (OXCCL_CUDA_CE_PUSH_STREAMS=2) against one.
  for c in ${OXCCL_PUSH_COLLS:-all_reduce reduce_scatter}; do
    R="$c --backend cuda --ranks 2 -b 128M -e 4G -f 2 -c 0 -n 8 -w 2 --compare $NCCL"
    # Three settings, two rounds: the defaults; in place pushed; in place
    # pushed and two streams (whose out-of-place column is two streams
    # alone). One collective per device call if both do not fit in 10 min.
    for round in 1 2; do
      run "pv_${c}_default_$round" 240 "$X" $P $R -J "$OUTDIR/pv_${c}_default_$round.json"
      OXCCL_CUDA_CE_PUSH_IN_PLACE=1 run "pv_${c}_inplace_$round" 240 "$X" $P $R -J "$OUTDIR/pv_${c}_inplace_$round.json"
      OXCCL_CUDA_CE_PUSH_IN_PLACE=1 OXCCL_CUDA_CE_PUSH_STREAMS=2 run "pv_${c}_two_$round" 240 "$X" $P $R -J "$OUTDIR/pv_${c}_two_$round.json"
    done
    C="$c --backend cuda --ranks 2 -b 128M -e 1G -f 2 -c 1 -n 1 -w 1"
    OXCCL_CUDA_CE_PUSH_IN_PLACE=1 OXCCL_CUDA_CE_PUSH_STREAMS=2 run "pv_check_${c}_float" 240 "$X" $P $C -d float -o all
    OXCCL_CUDA_CE_PUSH_IN_PLACE=1 OXCCL_CUDA_CE_PUSH_STREAMS=2 run "pv_check_${c}_bf16" 240 "$X" $P $C -d bfloat16 -o sum
  done
fi
if [ "$MODE" = small ]; then
  # The one-shot all-reduce in its own small kernel (oxccl_small_*), 2 processes, under graphs and
  # eager, against the ring kernel's one-shot path, two rounds
  # alternated, NCCL beside each.
  R="all_reduce --backend cuda --ranks 2 -b 8 -e 1M -f 2 -n 500 -w 50 -c 1 --compare $NCCL"
  for round in 1 2; do
    run "small_graph_$round" 150 "$X" $P $R -G 10 -J "$OUTDIR/small_graph_$round.json"
    OXCCL_CUDA_LL1_FAST=0 run "small_graph_ring_$round" 150 "$X" $P $R -G 10 -J "$OUTDIR/small_graph_ring_$round.json"
    run "small_eager_$round" 150 "$X" $P $R -J "$OUTDIR/small_eager_$round.json"
  done
  # The four other one-shot collectives in the same kernel, graphs, against the ring kernel, two rounds, NCCL beside.
  for c in ${OXCCL_SMALL_COLLS:-broadcast reduce all_gather reduce_scatter}; do
    R="$c --backend cuda --ranks 2 -b 8 -e 512K -f 4 -n 500 -w 50 -c 1 -G 10 --compare $NCCL"
    for round in 1 2; do
      run "small_${c}_$round" 150 "$X" $P $R -J "$OUTDIR/small_${c}_$round.json"
      OXCCL_CUDA_LL1_FAST=0 run "small_${c}_ring_$round" 150 "$X" $P $R -J "$OUTDIR/small_${c}_ring_$round.json"
    done
  done
fi

if [ "$MODE" = joint ]; then
  # The one-launch kernel of every rank (oxccl_core::gpu::one_launch) on the GPUs of one
  # process (-g N, every GPU; eager: captured calls never take it), so far
  # timed only with ranks sharing one GPU: OXCCL_CUDA_JOINT_PEERS=1 against
  # the default (a kernel per GPU), three rounds alternated, NCCL beside
  # each; then every type and op through it, checked.
  for c in ${OXCCL_JOINT_COLLS:-all_reduce all_gather reduce_scatter broadcast reduce}; do
    R="$c --backend cuda -g $NG -b 8 -e 256K -f 4 -n 500 -w 50 -c 0 --compare $NCCL"
    for round in 1 2 3; do
      OXCCL_CUDA_JOINT_PEERS=1 run "joint_${c}_$round" 120 "$X" $P $R -J "$OUTDIR/joint_${c}_$round.json"
      run "joint_${c}_per_gpu_$round" 120 "$X" $P $R -J "$OUTDIR/joint_${c}_per_gpu_$round.json"
    done
    ops="-o all"
    case $c in all_gather|broadcast) ops="" ;; esac
    OXCCL_CUDA_JOINT_PEERS=1 run "joint_check_$c" 200 "$X" $P $c --backend cuda -g "$NG" -b 8 -e 256K -f 8 -c 1 -n 3 -w 1 -d all $ops
  done
fi
if [ "$MODE" = twoshot ]; then
  # The two-shot LL all-reduce (3-8 ranks of one host) against the
  # LL ring it replaced, under CUDA graphs (launch-bound eager calls of N
  # ranks from one thread would hide the kernels). On a machine with fewer
  # GPUs than ranks the ranks share them: correctness and the kernels' own
  # time, no NCCL (it refuses two ranks on one GPU). Eager checks with the
  # one-launch path off (it would take every call to 256 KiB there).
  for g in ${OXCCL_TWOSHOT_RANKS:-4 8}; do
    ranks_form "$g"
    R="all_reduce --backend cuda $G -b 16K -e 1M -f 2 -n 100 -w 10 -c 0 -G 5 $cmp"
    for round in 1 2 3; do
      run "twoshot_g${g}_$round" 120 "$X" $P $R -J "$OUTDIR/twoshot_g${g}_$round.json"
      OXCCL_CUDA_TWOSHOT_MAX=0 run "twoshot_g${g}_ring_$round" 120 "$X" $P $R -J "$OUTDIR/twoshot_g${g}_ring_$round.json"
    done
    OXCCL_CUDA_JOINT_MAX=0 run "twoshot_check_g$g" 200 "$X" $P all_reduce --backend cuda $G -b 8 -e 1M -f 4 -c 1 -n 3 -w 1 -d all -o all
  done
fi
if [ "$MODE" = direct ]; then
  # The direct kernels (3-8 ranks of one host: all-gathers and
  # reduce-scatters in one crossing of Simple slots, all-reduces in two)
  # against the Simple ring's n - 1 (2 (n - 1)) steps, at every size of the
  # range (the default bound is 1 MiB per rank block), under CUDA graphs,
  # the one-launch path off. Then checked at every size with LL off.
  for g in ${OXCCL_DIRECT_RANKS:-4 8}; do
    ranks_form "$g"
    for c in ${OXCCL_DIRECT_COLLS:-all_reduce all_gather reduce_scatter}; do
      R="$c --backend cuda $G -b 256K -e 64M -f 4 -n 50 -w 5 -c 0 -G 5 $cmp"
      for round in 1 2; do
        OXCCL_CUDA_DIRECT_MAX=1G OXCCL_CUDA_JOINT_MAX=0 run "direct_${c}_g${g}_$round" 120 "$X" $P $R -J "$OUTDIR/direct_${c}_g${g}_$round.json"
        OXCCL_CUDA_DIRECT_MAX=0 OXCCL_CUDA_JOINT_MAX=0 run "direct_${c}_g${g}_ring_$round" 120 "$X" $P $R -J "$OUTDIR/direct_${c}_g${g}_ring_$round.json"
      done
    done
    for c in ${OXCCL_DIRECT_COLLS:-all_reduce all_gather reduce_scatter}; do
      OXCCL_CUDA_DIRECT_MAX=1G OXCCL_CUDA_JOINT_MAX=0 NCCL_PROTO=Simple run "direct_check_${c}_g$g" 200 "$X" $P $c --backend cuda $G -b 8 -e 8M -f 8 -c 1 -n 2 -w 1 -d "${OXCCL_DIRECT_CHECK_TYPES:-all}" -o all
    done
  done
fi
if [ "$MODE" = share ]; then
  # Where ranks share a GPU every rank's blocks must be resident
  # at once (a ring block fills an SM); the channels come down to SMs /
  # ranks, send/receive launches to 2 x SMs / ranks. One GPU is enough.
  S="--backend cuda --share-gpus -c 1 -n 10 -w 2"
  OXCCL_CUDA_JOINT_MAX=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=GRAPH run share_g12_ar 200 "$X" $P all_reduce $S -g 12 -b 1M -e 64M -f 8
  OXCCL_CUDA_JOINT_MAX=0 run share_g12_a2a 200 "$X" $P alltoall $S -g 12 -b 12M -e 96M -f 8
  OXCCL_CUDA_JOINT_MAX=0 run share_g8_a2a 200 "$X" $P alltoall $S -g 8 -b 1M -e 128M -f 4
  for round in 1 2; do
    for g in 5 6 7; do
      for c in all_reduce all_gather reduce_scatter; do
        OXCCL_CUDA_JOINT_MAX=0 run "share_${c}_g${g}_$round" 120 "$X" $P $c $S -g $g -b 1M -e 256M -f 4 -J "$OUTDIR/share_${c}_g${g}_$round.json"
        OXCCL_CUDA_JOINT_MAX=0 NCCL_MAX_NCHANNELS=16 run "share_${c}_g${g}_ch16_$round" 120 "$X" $P $c $S -g $g -b 1M -e 256M -f 4 -J "$OUTDIR/share_${c}_g${g}_ch16_$round.json"
      done
    done
  done
fi
if [ "$MODE" = twoshot_wide ]; then
  # Where the two-shot should stop on NVSwitch machines: published one- and
  # two-shot kernels keep a two-shot to ~4 MB on 8 GPUs, where ours takes
  # the Simple ring from LL's 512 KiB. OXCCL_CUDA_TWOSHOT_MAX alone moves
  # the bound (NCCL_PROTO would change NCCL's run beside it too).
  for g in ${OXCCL_TWOSHOT_RANKS:-4 8}; do
    ranks_form "$g"
    R="all_reduce --backend cuda $G -b 256K -e 8M -f 2 -n 100 -w 10 -c 0 -G 5 $cmp"
    for round in 1 2 3; do
      OXCCL_CUDA_TWOSHOT_MAX=8M run "twoshot_wide_g${g}_$round" 120 "$X" $P $R -J "$OUTDIR/twoshot_wide_g${g}_$round.json"
      run "twoshot_wide_g${g}_default_$round" 120 "$X" $P $R -J "$OUTDIR/twoshot_wide_g${g}_default_$round.json"
    done
    OXCCL_CUDA_TWOSHOT_MAX=8M OXCCL_CUDA_JOINT_MAX=0 run "twoshot_wide_check_g$g" 200 "$X" $P all_reduce --backend cuda $G -b 40004 -e 8000004 -f 3 -c 1 -n 3 -w 1 -d float,bfloat16,int8,double,half -o sum,max,avg
  done
fi
if [ "$MODE" = ar_mid ]; then
  # All-reduce at 1 MiB is the one 2-process size below NCCL (0.94-0.96x
  # under graphs, 2xH200, 2026-11-30 and 2026-12-01): ours is ring LL on 32 channels, NCCL's
  # ring LL on 24 at 512 KB (its TUNING line). Fewer, fuller channels
  # against the default, two rounds alternated, NCCL beside. The setting
  # caps NCCL's run too: 24 is its own choice there, but with 16 compare
  # oxccl's rows across runs, not the ratio.
  R="all_reduce --backend cuda --ranks 2 -b 256K -e 4M -f 2 -n 200 -w 20 -G 10 -c 1 --compare $NCCL"
  for round in 1 2; do
    run "arm_default_$round" 120 "$X" $P $R -J "$OUTDIR/arm_default_$round.json"
    NCCL_MAX_NCHANNELS=24 run "arm_ch24_$round" 120 "$X" $P $R -J "$OUTDIR/arm_ch24_$round.json"
    NCCL_MAX_NCHANNELS=16 run "arm_ch16_$round" 120 "$X" $P $R -J "$OUTDIR/arm_ch16_$round.json"
    # The Simple ring from 512 KiB instead of 1 MiB (its steps cost ~10 us
    # less since one system fence per step; NCCL's run beside it unchanged).
    OXCCL_CUDA_LL_MAX=512K run "arm_ll512k_$round" 120 "$X" $P $R -J "$OUTDIR/arm_ll512k_$round.json"
  done
fi
if [ "$MODE" = sweep2 ]; then
  # Every collective, one process per GPU, 8 B-64 MB, eager and under CUDA
  # graphs, beside NCCL (the sizes where oxccl is still below NCCL in
  # docs/performance-gpu.md come from these); then 2-rank all-reduces 256 KB-4 MB in
  # steps of 2 (1 MiB is where the LL ring's bound sits).
  for c in ${OXCCL_SWEEP_COLLS:-sendrecv alltoall all_gather reduce_scatter broadcast reduce gather scatter all_reduce}; do
    S="$c --backend cuda --ranks 2 -b 8 -e 64M -f 4 -c 1 -n 50 -w 5 --compare $NCCL"
    run "sweep2_${c}_eager" 120 "$X" $P $S -J "$OUTDIR/sweep2_${c}_eager.json"
    run "sweep2_${c}_graph" 120 "$X" $P $S -G 10 -J "$OUTDIR/sweep2_${c}_graph.json"
  done
  run "sweep2_all_reduce_1m" 120 "$X" $P all_reduce --backend cuda --ranks 2 -b 256K -e 4M -f 2 -c 1 -n 60 -w 10 -G 10 --compare "$NCCL"
fi
if [ "$MODE" = multi ]; then
  # 4- or 8-GPU NVSwitch hosts (not yet measured on one): every GPU of the host, one process per GPU and one process
  # driving all, every collective checked at a few sizes, then the
  # all-reduce, all-gather and reduce-scatter sweeps to 8 GB beside NCCL.
  # OXCCL_MULTI_MAX caps the sweeps' largest size (default 8G).
  for c in all_reduce all_gather broadcast reduce reduce_scatter alltoall gather scatter sendrecv; do
    run "multi_check_ranks_$c" 300 "$X" $P "$c" --backend cuda --ranks "$NG" -b 8 -e 8M -f 32 -c 1 -n 5 -w 2
    run "multi_check_g_$c" 300 "$X" $P "$c" --backend cuda -g "$NG" -b 8 -e 8M -f 32 -c 1 -n 5 -w 2
  done
  for c in all_reduce all_gather reduce_scatter; do
    S="$c --backend cuda -b 8 -e ${OXCCL_MULTI_MAX:-8G} -f 4 -c 0 -n 10 -w 3 --compare $NCCL"
    run "multi_ranks_$c" 600 "$X" $P $S --ranks "$NG" -J "$OUTDIR/multi_ranks${NG}_$c.json"
    run "multi_g_$c" 600 "$X" $P $S -g "$NG" -J "$OUTDIR/multi_g${NG}_$c.json"
  done
fi
if [ "$MODE" = tuning ]; then
  # NCCL's own choice per size (algorithm, protocol, channels = SMs), from
  # its TUNING log, for the SM table of performance-gpu.md.
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING "$X" $P all_reduce --backend cuda --ranks 2 -b 8 -e 1G -f 16 -c 0 -n 2 -w 1 --lib "$NCCL" \
    > "$OUTDIR/nccl_tuning.log" 2>&1
  grep -iE "channel|algo|proto" "$OUTDIR/nccl_tuning.log" | sort | uniq -c | sort -rn | head -40
  # oxccl's own choice per size, in the same shape (rank 0's lines).
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING "$X" $P all_reduce --backend cuda --ranks 2 -b 8 -e 1G -f 16 -c 0 -n 2 -w 1 \
    > "$OUTDIR/oxccl_tuning.log" 2>&1
  grep -E "Bytes -> Algo" "$OUTDIR/oxccl_tuning.log" | sed 's/.*NCCL INFO //' | sort | uniq -c | head -40
fi
for j in "$OUTDIR"/*.json; do
  [ -s "$j" ] && "$X" plot "$j" -o "${j%.json}.svg" && echo "plot: ${j%.json}.svg"
done

echo; echo "== summary"
printf '%s\n' "${rows[@]}" | tee "$OUTDIR/summary.txt"
# (No pipe into grep -q: under pipefail printf's SIGPIPE would turn a FAIL
# into a pass.)
! grep -q FAIL <<<"$(printf '%s\n' "${rows[@]}")"
