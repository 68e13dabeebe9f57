#!/usr/bin/env bash
# Two builds of oxccl's libnccl.so.2 timed side by side ON the GPU machine:
# `oxccl perf --backend cuda` through each library in turn, alternated
# round by round in one job, so that a change that should not move speed
# (a restructuring) is checked against the build before it.
#
#   scripts/perf-ab.sh LIB_A LIB_B [ROUNDS]
#
# LIB_A, LIB_B: the two libnccl.so.2 files (A: before, B: after). ROUNDS
# (default 3): how many times each sweep runs through each library.
# COLLS (default `all_reduce all_gather reduce_scatter`): the collectives.
# RANKS (default 2) ranks as processes, sharing the visible GPUs in turn
# (`--share-gpus`: ranks on one GPU time its kernels, not a link).
# PERF_ARGS (default `-b 8 -e 1G -f 4 -n 20 -w 5 -c 0`): each sweep's sizes
# and iterations. OXCCL: the `oxccl` executable (default BUNDLE/oxccl-cli/
# oxccl from scripts/gpu-test.sh --build; BUNDLE is $OXCCL_GPU_BUNDLE,
# default target/gpu-bundle). Each library gets a kernel cache of its own
# (OXCCL_CACHE_DIR under $OUT) unless OXCCL_KERNEL_DIR is set, and a first
# untimed sweep fills it. Prints, per collective and size, the median
# out-of-place time over the rounds for each library and B's time over
# A's; logs and JSON go to $OUT (or /tmp/perf-ab). NVLink multicast stays
# off (shared/gpu.md rules, scripts/gpu-env.sh).
set -uo pipefail
[ $# -ge 2 ] || { sed -n 2,22p "$0"; exit 2; }
cd "$(dirname "$0")/.."
A=$(realpath "$1") B=$(realpath "$2") ROUNDS=${3:-3}
BUNDLE=$(realpath -m "${OXCCL_GPU_BUNDLE:-target/gpu-bundle}")
. scripts/gpu-env.sh
OXCCL=${OXCCL:-$BUNDLE/oxccl-cli/oxccl}
OUTDIR="${OUT:-/tmp/perf-ab}"
mkdir -p "$OUTDIR"
COLLS=${COLLS:-all_reduce all_gather reduce_scatter}
RANKS=${RANKS:-2}
PERF_ARGS=${PERF_ARGS:--b 8 -e 1G -f 4 -n 20 -w 5 -c 0}

sweep() { # label lib coll round
  local log="$OUTDIR/$3_$1_$4"
  OXCCL_CACHE_DIR="${OXCCL_CACHE_DIR_AB:-$OUTDIR/kcache_$1}" timeout 300 "$OXCCL" perf "$3" \
    --backend cuda --lib "$2" --ranks "$RANKS" --share-gpus $PERF_ARGS -J "$log.json" >"$log.log" 2>&1
  local rc=$?
  [ $rc = 0 ] || { echo "$1 $3 round $4: rc=$rc"; tail -5 "$log.log"; }
}

mkdir -p "$OUTDIR/kcache_A" "$OUTDIR/kcache_B"
for c in $COLLS; do
  # Untimed: kernels compiled or loaded, caches filled.
  sweep A "$A" "$c" 0
  sweep B "$B" "$c" 0
done
for r in $(seq 1 "$ROUNDS"); do
  for c in $COLLS; do
    sweep A "$A" "$c" "$r"
    sweep B "$B" "$c" "$r"
  done
done

OUTDIR="$OUTDIR" ROUNDS="$ROUNDS" COLLS="$COLLS" python3 - <<'EOF' | tee "$OUTDIR/summary.txt"
import json, os, statistics
out, rounds = os.environ["OUTDIR"], int(os.environ["ROUNDS"])
for coll in os.environ["COLLS"].split():
    times = {}  # (label, size) -> [us]
    for label in "AB":
        for r in range(1, rounds + 1):
            try:
                doc = json.load(open(f"{out}/{coll}_{label}_{r}.json"))
            except (OSError, ValueError):
                continue
            for row in doc["results"]:
                times.setdefault((label, row["size"]), []).append(row["out_of_place"]["time"])
    sizes = sorted({s for (_, s) in times})
    print(f"{coll}: out-of-place us, median of {rounds} rounds (B/A < 1: B faster)")
    print(f"{'bytes':>12} {'A':>10} {'B':>10} {'B/A':>6}  A range / B range")
    for s in sizes:
        a, b = times.get(("A", s), []), times.get(("B", s), [])
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"{s:>12} {ma:>10.2f} {mb:>10.2f} {mb / ma:>6.3f}  "
              f"{min(a):.2f}-{max(a):.2f} / {min(b):.2f}-{max(b):.2f}")
EOF
