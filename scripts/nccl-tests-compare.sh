#!/usr/bin/env bash
# Runs ALREADY-BUILT nccl-tests binaries against NVIDIA's libnccl.so.2 and
# oxccl's, alternating, on the GPU machine, and prints the two tables side by
# side (median per size over the rounds) with the ratio. Nothing here builds
# nccl-tests: build it yourself, by hand, once against each library (see
# docs/performance-gpu.md for what the binaries must be).
#
#   scripts/nccl-tests-compare.sh REF_BUILD REF_LIBDIR OURS_BUILD OURS_LIBDIR [ROUNDS]
#
# REF_BUILD/OURS_BUILD: nccl-tests' build folder (holding <coll>_perf) for
# each library, or one all_reduce_perf binary each; *_LIBDIR: the folder
# holding that library's libnccl.so.2 (put first in LD_LIBRARY_PATH for its
# runs). ROUNDS (default 2): how many times each runs.
# COLLS: the collectives of the timing sweep (default all_reduce);
# PERF_ARGS overrides the timing sweep's arguments.
# CHECK_COLLS (default: COLLS) and CHECK_ARGS (default `-d all -o all -b 8
# -e 4M -f 8 -g 2 -c 1`): the correctness sweep, run on oxccl only (N/A in
# a #wrong column: nccl-tests has no in-place variant of that test).
# LAUNCH (default none): a command that every run starts under, e.g.
# `mpirun -np 2 -x NCCL_TESTS_DEVICE=0` for two processes sharing GPU 0
# (binaries built with MPI=1; oxccl allows ranks to share a GPU, NCCL does
# not, so such runs check oxccl alone: COLLS="" for no timing sweep).
# Writes perf_<coll>_<lib>_<round>.log, check_<coll>.log and summary.txt into
# $OUT (or /tmp/nccl-tests-compare). NVLink multicast stays off (shared/gpu.md).
set -uo pipefail
[ $# -ge 4 ] || { sed -n 2,20p "$0"; exit 2; }
REF=$1 REF_LIB=$2 OURS=$3 OURS_LIB=$4 ROUNDS=${5:-2}
. "$(dirname "$0")/gpu-env.sh"
OUTDIR="${OUT:-/tmp/nccl-tests-compare}"
mkdir -p "$OUTDIR"
COLLS=${COLLS:-all_reduce}
CHECK_COLLS=${CHECK_COLLS-$COLLS}
PERF_ARGS=${PERF_ARGS:--b 8 -e 1G -f 4 -g 2 -c 1 -n 20 -w 5}
CHECK_ARGS=${CHECK_ARGS:--d all -o all -b 8 -e 4M -f 8 -g 2 -c 1}
T=${OXCCL_TEST_TIMEOUT:-150}
read -ra LAUNCH <<< "${LAUNCH:-}"

bin() { # build-or-binary coll
  if [ -d "$1" ]; then echo "$1/$2_perf"; else echo "$1"; fi
}

perf() { # coll label bin libdir round
  local log="$OUTDIR/perf_$1_$2_$5.log"
  echo "== $1 $2 round $5: $3 $PERF_ARGS"
  local t0=$(date +%s.%N)
  LD_LIBRARY_PATH="$4:$LD_LIBRARY_PATH" timeout "$T" "${LAUNCH[@]}" "$3" $PERF_ARGS >"$log" 2>&1
  local rc=$?
  echo "   rc=$rc wall=$(python3 -c "print(f'{$(date +%s.%N)-$t0:.1f}')")s $(grep -m1 'nccl-library' "$log")"
  grep -E 'Avg bus bandwidth|Out of bounds' "$log" | sed 's/^/   /'
  [ $rc = 0 ] || tail -20 "$log"
}

for c in $CHECK_COLLS; do
  log="$OUTDIR/check_$c.log"
  echo "== oxccl correctness: ${c}_perf $CHECK_ARGS"
  LD_LIBRARY_PATH="$OURS_LIB:$LD_LIBRARY_PATH" timeout "$T" "${LAUNCH[@]}" "$(bin "$OURS" "$c")" $CHECK_ARGS >"$log" 2>&1
  echo "   rc=$? lines=$(grep -cE '^ +[0-9]+ ' "$log") nonzero-#wrong=$(awk '/^ +[0-9]+ /{ a = NF - 4; b = NF; if (($a != 0 && $a != "N/A") || ($b != 0 && $b != "N/A")) n++ } END { print n+0 }' "$log")"
  grep -E 'Out of bounds|failure|WARN|rror' "$log" | head -5 | sed 's/^/   /'
done

for r in $(seq 1 "$ROUNDS"); do
  for c in $COLLS; do
    perf "$c" nccl "$(bin "$REF" "$c")" "$REF_LIB" "$r"
    perf "$c" oxccl "$(bin "$OURS" "$c")" "$OURS_LIB" "$r"
  done
done

python3 - "$OUTDIR" "$ROUNDS" $COLLS <<'PY' | tee "$OUTDIR/summary.txt"
import os, statistics, sys
out, rounds, colls = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def table(coll, lib):
    rows = {}
    for r in range(1, rounds + 1):
        p = os.path.join(out, f"perf_{coll}_{lib}_{r}.log")
        if not os.path.exists(p):
            continue
        for line in open(p, errors="replace"):
            f = line.split()
            if len(f) >= 13 and f[0].isdigit() and f[4].lstrip("-").isdigit():
                rows.setdefault(int(f[0]), []).append(
                    (float(f[5]), float(f[7]), f[8], float(f[9]), float(f[11]), f[12]))
    return rows
for coll in colls:
    ref, ours = table(coll, "nccl"), table(coll, "oxccl")
    print()
    print("# %s_perf -g 2, float; median over %d rounds of each library, alternated" % (coll, rounds))
    print("# time in us, busbw in GB/s; oop = out of place, ip = in place; ratio = NCCL time / oxccl time (>1: oxccl faster)")
    print("%12s | %9s %8s %9s %8s | %9s %8s %9s %8s | %6s %6s | %s" % (
        "bytes", "nccl oop", "busbw", "nccl ip", "busbw", "oxccl oop", "busbw", "oxccl ip", "busbw",
        "r.oop", "r.ip", "#wrong nccl/oxccl"))
    for size in sorted(set(ref) | set(ours)):
        def med(rows, i):
            v = [x[i] for x in rows.get(size, [])]
            return statistics.median(v) if v else float("nan")
        def wrong(rows):
            return ",".join(sorted({x[2] for x in rows.get(size, [])} | {x[5] for x in rows.get(size, [])})) or "-"
        rt, ri = med(ref, 0), med(ref, 3)
        ot, oi = med(ours, 0), med(ours, 3)
        print("%12d | %9.2f %8.2f %9.2f %8.2f | %9.2f %8.2f %9.2f %8.2f | %6.2f %6.2f | %s/%s" % (
            size, rt, med(ref, 1), ri, med(ref, 4), ot, med(ours, 1), oi, med(ours, 4),
            rt / ot if ot else float("nan"), ri / oi if oi else float("nan"), wrong(ref), wrong(ours)))
PY
