#!/usr/bin/env bash
# oxccl's host collectives beside MPI on one machine: oxccl perf (--backend
# cpu, ranks as processes over shared memory), Open MPI and MPICH (Debian's
# packages, through bench/mpi/coll_bench.c built against each) and, when
# python has torch, Gloo's all_reduce (bench/gloo_all_reduce.py).
#
# Every round runs each library once per (ranks, collective), alternating
# libraries, and starts each run only when the machine is idle (1-minute
# load average below LOAD_MAX, waiting up to LOAD_WAIT seconds, then running
# anyway and saying so). Every result is checked (#wrong must be 0). The
# median over rounds of each time is kept.
#
# Usage: scripts/bench-host-mpi.sh [OUTDIR]
# Environment (defaults in brackets):
#   ROUNDS [5]  RANKS ["2 4"]  COLLS ["all_reduce all_gather reduce_scatter broadcast sendrecv"]
#   MIN_BYTES [8]  MAX_BYTES [8388608]  ITERS [100]  WARMUP [10]
#   LOAD_MAX [0.5]  LOAD_WAIT [120]  LIBS ["oxccl openmpi mpich gloo"]
#   RUN_LIMIT [600]: seconds one run may take; a run past it is stopped and
#     its sizes so far kept (MPICH busy-polls: 4 ranks on 2 CPUs took 20-35
#     ms per 8-byte all_reduce under load, so a full sweep can take hours)
#   GLOO_PYTHON [python3]  OXCCL (the oxccl binary) [built: target/release/oxccl]
#   SUMMARY_ONLY: set to summarise the raw runs already in OUTDIR again
#   TITLE ["oxccl host collectives beside MPI"]: the heading of results.md
#   LOAD_PROCS [0]: busy processes (`yes > /dev/null`) started after the
#     idle gate and stopped right after each run, so every library meets
#     the same fixed background load
# Needs: apt-get install -y libopenmpi-dev openmpi-bin libmpich-dev mpich
# Writes OUTDIR/results.md (tables: median time in us, out of place and in
# place, per library), OUTDIR/<ranks>r/<lib>.<coll>.txt (the medians in
# nccl-tests' layout), OUTDIR/<ranks>r.svg (oxccl plot of those, out of place)
# and the raw runs under OUTDIR/raw/.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-$(mktemp -d /tmp/bench-host-mpi.XXXXXX)}
ROUNDS=${ROUNDS:-5}
RANKS=${RANKS:-"2 4"}
COLLS=${COLLS:-"all_reduce all_gather reduce_scatter broadcast sendrecv"}
MIN_BYTES=${MIN_BYTES:-8}
MAX_BYTES=${MAX_BYTES:-8388608}
ITERS=${ITERS:-100}
WARMUP=${WARMUP:-10}
LOAD_MAX=${LOAD_MAX:-0.5}
LOAD_WAIT=${LOAD_WAIT:-120}
RUN_LIMIT=${RUN_LIMIT:-600}
LIBS=${LIBS:-"oxccl openmpi mpich gloo"}
LOAD_PROCS=${LOAD_PROCS:-0}
TITLE=${TITLE:-oxccl host collectives beside MPI}
PY=${GLOO_PYTHON:-python3}
mkdir -p "$OUT/raw"

have() { command -v "$1" >/dev/null 2>&1; }
libs=()
for lib in $LIBS; do
  case $lib in
    oxccl) libs+=(oxccl) ;;
    openmpi)
      if have mpicc.openmpi && have mpirun.openmpi; then
        mpicc.openmpi -O2 -o "$OUT/coll_bench.openmpi" bench/mpi/coll_bench.c
        libs+=(openmpi)
      else
        echo "# no Open MPI (mpicc.openmpi): left out" >&2
      fi ;;
    mpich)
      if have mpicc.mpich && have mpirun.mpich; then
        mpicc.mpich -O2 -o "$OUT/coll_bench.mpich" bench/mpi/coll_bench.c
        libs+=(mpich)
      else
        echo "# no MPICH (mpicc.mpich): left out" >&2
      fi ;;
    gloo)
      if "$PY" -c "import torch.distributed" 2>/dev/null; then
        libs+=(gloo)
      else
        echo "# no torch for $PY: Gloo left out (set GLOO_PYTHON)" >&2
      fi ;;
    oxccl-*) # another oxccl configuration's runs, from a script that made them
      [[ -n ${SUMMARY_ONLY:-} ]] || { echo "bench-host-mpi.sh: $lib: only with SUMMARY_ONLY" >&2; exit 2; }
      libs+=("$lib") ;;
    *) echo "bench-host-mpi.sh: unknown library $lib (accepted: oxccl openmpi mpich gloo)" >&2; exit 2 ;;
  esac
done
if [[ " ${libs[*]} " == *" oxccl "* && -z ${OXCCL:-} ]]; then
  cargo build --release -q --bin oxccl
  OXCCL="${CARGO_TARGET_DIR:-target}/release/oxccl"
fi

# load1, wait_idle (LOAD_MAX, LOAD_WAIT).
# shellcheck source=scripts/idle-gate.sh
. scripts/idle-gate.sh

run_one() { # lib ranks coll file
  local lib=$1 n=$2 coll=$3 f=$4
  local args=(-b "$MIN_BYTES" -e "$MAX_BYTES" -f 2 -n "$ITERS" -w "$WARMUP")
  case $lib in
    oxccl) timeout "$RUN_LIMIT" "$OXCCL" perf "$coll" --backend cpu --ranks "$n" "${args[@]}" -c 1 ;;
    openmpi) timeout "$RUN_LIMIT" mpirun.openmpi --allow-run-as-root --oversubscribe -np "$n" \
               "$OUT/coll_bench.openmpi" "$coll" "${args[@]}" ;;
    mpich) timeout "$RUN_LIMIT" mpirun.mpich -np "$n" "$OUT/coll_bench.mpich" "$coll" "${args[@]}" ;;
    gloo) timeout "$RUN_LIMIT" "$PY" bench/gloo_all_reduce.py "$n" "$MIN_BYTES" "$MAX_BYTES" 2>/dev/null ;;
  esac > "$f"
}

# The background load of one run: LOAD_PROCS busy processes.
load_pids=()
start_load() {
  local i
  for ((i = 0; i < LOAD_PROCS; i++)); do
    yes > /dev/null &
    load_pids+=($!)
  done
}
stop_load() {
  if ((${#load_pids[@]})); then
    kill "${load_pids[@]}" 2>/dev/null || true
    wait "${load_pids[@]}" 2>/dev/null || true
  fi
  load_pids=()
}
trap stop_load EXIT

[[ -n ${SUMMARY_ONLY:-} ]] && ROUNDS_TO_RUN=0 || ROUNDS_TO_RUN=$ROUNDS
for r in $(seq 1 "$ROUNDS_TO_RUN"); do
  for n in $RANKS; do
    for coll in $COLLS; do
      for lib in "${libs[@]}"; do
        [[ $lib == gloo && $coll != all_reduce ]] && continue
        f="$OUT/raw/$lib.${n}r.$coll.$r.txt"
        load=$(wait_idle)
        echo "# round $r/$ROUNDS: $lib $coll, $n ranks, load $load, $LOAD_PROCS busy processes" >&2
        rc=0
        start_load
        run_one "$lib" "$n" "$coll" "$f" || rc=$?
        stop_load
        if (( rc == 124 )); then
          echo "# $lib $coll, $n ranks: stopped after RUN_LIMIT=$RUN_LIMIT s; sizes so far kept" | tee -a "$f" >&2
        elif (( rc != 0 )); then
          echo "bench-host-mpi.sh: $lib $coll with $n ranks failed (output: $f)" >&2
          exit 1
        fi
        echo "$lib $n $coll $r $load $(load1)" >> "$OUT/raw/loads.txt"
      done
    done
  done
done

python3 - "$OUT" "$ROUNDS" "${libs[*]}" "$RANKS" "$COLLS" "$LOAD_PROCS" "$TITLE" <<'PY'
import os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
busy = int(sys.argv[6])
libs, ranks, colls = sys.argv[3].split(), sys.argv[4].split(), sys.argv[5].split()
med = statistics.median

def rows(path, lib):
    """{size: (oop_us, ip_us, count, type, redop, root, factor)} of one run."""
    res = {}
    for line in open(path):
        f = line.split()
        if not f or line.startswith("#"):
            continue
        if lib == "gloo":  # bytes median_us algbw busbw (in place only)
            size, us = int(f[0]), float(f[1])
            alg = float(f[2])
            fac = float(f[3]) / alg if alg > 0 else 0.0
            res[size] = (us, us, size // 4, "float", "sum", "-1", fac, 0)
            continue
        if len(f) < 13 or not f[0].isdigit():
            continue
        num = lambda x: None if x == "N/A" else float(x)  # no in-place send/recv
        size, t_o, t_i = int(f[0]), num(f[5]), num(f[9])
        alg = num(f[6]) or 0.0
        fac = num(f[7]) / alg if alg > 0 else None
        wrong = sum(int(float(x)) for x in (f[8], f[12]) if x != "N/A")
        res[size] = (t_o, t_i, f[1], f[2], f[3], f[4], fac, wrong)
    return res

loads = {}
for line in open(os.path.join(out, "raw", "loads.txt")):
    lib, n, coll, r, before, after = line.split()
    loads.setdefault((lib, n, coll), []).append(float(before))

md = [f"# {sys.argv[7]}\n",
      f"Median of {rounds} alternated rounds; time per call in µs, float32 (sum where reducing); "
      f"out of place / in place. Load: the 1-minute load average at the start of each run "
      f"(median, max)"
      + (f", before {busy} busy processes (`yes > /dev/null`) started for each run" if busy else "")
      + ". Every result checked (#wrong 0) unless marked.\n"]
bad = []
for n in ranks:
    os.makedirs(os.path.join(out, f"{n}r"), exist_ok=True)
    for coll in colls:
        data = {}
        for lib in libs:
            runs = []
            for r in range(1, rounds + 1):
                p = os.path.join(out, "raw", f"{lib}.{n}r.{coll}.{r}.txt")
                if os.path.exists(p):
                    runs.append(rows(p, lib))
            if not runs:
                continue
            sizes = sorted(set().union(*runs))
            agg = {}
            for s in sizes:
                vals = [x[s] for x in runs if s in x]
                wrong = sum(v[7] for v in vals)
                if wrong:
                    bad.append(f"{lib} {coll} {n} ranks {s} B: {wrong} wrong")
                def mid(k):
                    xs = [v[k] for v in vals if v[k] is not None]
                    return med(xs) if xs else None
                agg[s] = (mid(0), mid(1), vals[0], wrong)
            data[lib] = agg
            # The medians in nccl-tests' layout, for oxccl plot.
            with open(os.path.join(out, f"{n}r", f"{lib}.{coll}.txt"), "w") as t:
                t.write(f"# Collective test starting: {coll}_perf\n")
                for rk in range(int(n)):
                    t.write(f"#  Rank {rk:2d} Group  0 Pid 0 on localhost device 0 [host] CPU\n")
                for s, (to, ti, v, _) in sorted(agg.items()):
                    fac = v[6] or 0.0
                    def cells(us):
                        if us is None:
                            return "N/A N/A N/A N/A"
                        alg = s / us / 1e3 if us > 0 else 0.0
                        return f"{us:9.2f} {alg:7.3f} {alg * fac:7.3f} 0"
                    t.write(f"{s:12d} {v[2]} {v[3]} {v[4]} {v[5]} {cells(to)} {cells(ti)}\n")
        if not data:
            continue
        present = [l for l in libs if l in data]
        md.append(f"\n## {coll}, {n} ranks\n")
        load_cells = []
        for l in present:
            ls = loads.get((l, n, coll), [])
            if ls:
                load_cells.append(f"{l} {med(ls):.2f} (max {max(ls):.2f})")
        md.append("Load: " + "; ".join(load_cells) + "\n")
        head = "| size | " + " | ".join(present) + " |"
        if "oxccl" in present and any(not l.startswith("oxccl") for l in present):
            head += " best other / oxccl (in place) |"
        md.append(head)
        md.append("|---" * (head.count("|") - 1) + "|")
        for s in sorted(set().union(*[set(d) for d in data.values()])):
            cells = []
            for l in present:
                v = data[l].get(s)
                fmt = lambda t: "—" if t is None else f"{t:.2f}"
                cells.append("—" if v is None else f"{fmt(v[0])} / {fmt(v[1])}")
            line = f"| {s} | " + " | ".join(cells) + " |"
            if "oxccl" in present and any(not l.startswith("oxccl") for l in present):
                ox = data["oxccl"].get(s)
                # In place where there is one (send/recv: out of place).
                k = 1 if ox and ox[1] is not None else 0
                others = [data[l][s][k] for l in present
                          if not l.startswith("oxccl") and s in data[l] and data[l][s][k] is not None]
                ok = ox and ox[k] is not None and ox[k] > 0 and others
                ratio = f"{min(others) / ox[k]:.2f}" if ok else "—"
                line += f" {ratio} |"
            md.append(line)
stopped = []
for f in sorted(os.listdir(os.path.join(out, "raw"))):
    for line in open(os.path.join(out, "raw", f)):
        if "stopped after RUN_LIMIT" in line:
            stopped.append(f"{f}: {line.strip('# ').strip()}")
if stopped:
    md.append("\n**Runs stopped before the last size:** " + "; ".join(stopped) + "\n")
if bad:
    md.append("\n**Wrong results:** " + "; ".join(bad) + "\n")
open(os.path.join(out, "results.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
if bad:
    sys.exit(1)
PY

if [[ -n ${OXCCL:-} ]]; then
  for n in $RANKS; do
    "$OXCCL" plot --title "host collectives, $n ranks, out of place (median of $ROUNDS rounds)" \
      -o "$OUT/${n}r.svg" "$OUT/${n}r"/*.txt || echo "# oxccl plot failed for $n ranks" >&2
  done
fi
echo "# results: $OUT/results.md, plots: $OUT/*r.svg" >&2
