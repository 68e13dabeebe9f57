#!/usr/bin/env bash
# Runs ALREADY-BUILT nccl-tests all_reduce_perf binaries against NVIDIA's
# libnccl.so.2 and oxccl's, alternating, on the GPU machine, and prints the
# two tables side by side (median per size over the rounds) with the ratio.
# Nothing here builds nccl-tests: build it yourself, by hand, once against
# each library (see docs/performance-gpu.md for what the binaries must be).
#
#   scripts/nccl-tests-compare.sh REF_BIN REF_LIBDIR OURS_BIN OURS_LIBDIR [ROUNDS]
#
# REF_BIN/OURS_BIN: all_reduce_perf built against each library's nccl.h;
# *_LIBDIR: the folder holding that library's libnccl.so.2 (put first in
# LD_LIBRARY_PATH for its runs). ROUNDS (default 2): how many times each runs.
# PERF_ARGS overrides the timing sweep; CHECK_OPS the ops of the correctness
# sweep run on oxccl only (every type, one op at a time; mulsum is not in the
# default list: oxccl's GPU kernels have no PreMulSum yet).
# Writes perf_<lib>_<round>.log, check_<op>.log and summary.txt into $OUT
# (or /tmp/nccl-tests-compare). NVLink multicast stays off (shared/gpu.md).
set -uo pipefail
[ $# -ge 4 ] || { sed -n 2,19p "$0"; exit 2; }
REF_BIN=$1 REF_LIB=$2 OURS_BIN=$3 OURS_LIB=$4 ROUNDS=${5:-2}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for d in /usr/local/cuda-13.0/targets/x86_64-linux/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && break
done
OUTDIR="${OUT:-/tmp/nccl-tests-compare}"
mkdir -p "$OUTDIR"
PERF_ARGS=${PERF_ARGS:--b 8 -e 1G -f 4 -g 2 -c 1 -n 20 -w 5}
CHECK_OPS=${CHECK_OPS:-sum prod max min avg}
T=${OXCCL_TEST_TIMEOUT:-150}

perf() { # label bin libdir round
  local log="$OUTDIR/perf_$1_$4.log"
  echo "== $1 round $4: $2 $PERF_ARGS"
  local t0=$(date +%s.%N)
  LD_LIBRARY_PATH="$3:$LD_LIBRARY_PATH" timeout "$T" "$2" $PERF_ARGS >"$log" 2>&1
  local rc=$?
  echo "   rc=$rc wall=$(python3 -c "print(f'{$(date +%s.%N)-$t0:.1f}')")s $(grep -m1 'nccl-library' "$log")"
  grep -E 'Avg bus bandwidth|Out of bounds' "$log" | sed 's/^/   /'
  [ $rc = 0 ] || tail -20 "$log"
}

for r in $(seq 1 "$ROUNDS"); do
  perf nccl "$REF_BIN" "$REF_LIB" "$r"
  perf oxccl "$OURS_BIN" "$OURS_LIB" "$r"
done

for op in $CHECK_OPS; do
  log="$OUTDIR/check_$op.log"
  echo "== oxccl correctness: -d all -o $op -b 8 -e 1M -f 16 -g 2 -c 1"
  LD_LIBRARY_PATH="$OURS_LIB:$LD_LIBRARY_PATH" timeout "$T" "$OURS_BIN" -d all -o "$op" -b 8 -e 1M -f 16 -g 2 -c 1 -n 2 -w 1 >"$log" 2>&1
  echo "   rc=$? lines=$(grep -cE '^ +[0-9]+ ' "$log") nonzero-#wrong=$(awk '/^ +[0-9]+ /{ if ($9 != 0 || $13 != 0) n++ } END { print n+0 }' "$log")"
  grep -E 'Out of bounds|failure|WARN' "$log" | head -5 | sed 's/^/   /'
done

python3 - "$OUTDIR" "$ROUNDS" <<'PY' | tee "$OUTDIR/summary.txt"
import glob, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def table(lib):
    rows = {}
    for r in range(1, rounds + 1):
        p = os.path.join(out, f"perf_{lib}_{r}.log")
        if not os.path.exists(p):
            continue
        for line in open(p, errors="replace"):
            f = line.split()
            if len(f) >= 13 and f[0].isdigit() and f[4].lstrip("-").isdigit():
                rows.setdefault(int(f[0]), []).append(
                    (float(f[5]), float(f[7]), f[8], float(f[9]), float(f[11]), f[12]))
    return rows
ref, ours = table("nccl"), table("oxccl")
print("# all_reduce_perf -g 2, float sum; median over %d rounds of each library, alternated" % rounds)
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
