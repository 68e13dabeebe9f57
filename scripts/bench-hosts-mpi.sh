#!/usr/bin/env bash
# oxccl beside Open MPI and MPICH with ranks on different "hosts": network
# namespaces on one Linux bridge, each with its own address and host name.
#
# Hosts: namespace <tag>_<i> has interface oxh0 (a veth whose peer is a port
# of a bridge in a switch namespace <tag>_sw) with address 198.18.77.<i+1>/24
# (the benchmarking range, routed nowhere). Every command in a host runs under
# its own UTS namespace and host name oxh-h<i>: oxccl's host hash is host
# name + boot id and the namespaces share the boot id, so this is what makes
# oxccl take TCP between them (shared memory within one). Everything is
# deleted on exit.
#
# Part "coll": TCP collectives, one rank per host (HOSTS of them).
#   oxccl: `oxccl perf COLL --backend cpu` started once in each host with
#     RANK, WORLD_SIZE and NCCL_COMM_ID=<host 0>:<port> (oxccl perf's
#     external-launcher mode, as under torchrun).
#   oxccl-nospin: the same with OXCCL_SPIN_US=0 (a waiting rank yields at
#     once), the counterpart of OMPI_YIELD below: a rank spinning through
#     its 2 ms takes a CPU the kernel needs to move its bytes.
#   Open MPI: mpirun.openmpi run in host 0 with --host set to the hosts'
#     addresses; it starts its daemons in the other hosts through
#     --mca plm_rsh_agent <agent>, a script that runs the command in the
#     host's namespace in place of ssh; pml ob1, btl tcp,self on oxh0;
#     mpi_yield_when_idle OMPI_YIELD (below).
#   MPICH (ch4:ucx): mpirun.mpich run in host 0, -launcher ssh
#     -launcher-exec <agent>, -iface oxh0, UCX_TLS=tcp,self on oxh0.
#   All through bench/mpi/coll_bench.c and oxccl perf, every result checked,
#   libraries alternated within each round, medians over ROUNDS into
#   OUTDIR/results.md (the summary of scripts/bench-host-mpi.sh).
# Part "start": start-up across hosts. N ranks as processes spread over
#   START_HOSTS hosts in contiguous blocks (rank 0 in host 0): wall time from
#   launch to the slowest rank's end of initialisation and of its first
#   checked 8-byte all-reduce, and peak RSS per process. oxccl through
#   `scale_probe --process` (crates/oxccl/examples/scale_probe.rs), started
#   by one shell per host; MPI through bench/mpi/scale_probe.c under mpirun
#   (default transports: shared memory within a host, TCP on oxh0 between).
#   Medians over START_ROUNDS into OUTDIR/start.md.
#
# Usage (as root): scripts/bench-hosts-mpi.sh [OUTDIR]
# Environment (defaults in brackets):
#   PARTS ["coll start"]  HOSTS [2]  LIBS ["oxccl oxccl-nospin openmpi mpich"]
#   ROUNDS [3]  COLLS ["all_reduce all_gather broadcast"]
#   MIN_BYTES [8]  MAX_BYTES [67108864]  ITERS [20]  WARMUP [5]
#   START_HOSTS [4]  START_RANKS ["4 16 64"]  START_LIBS ["oxccl openmpi"]
#   START_ROUNDS [3]
#   FIRST_ROUND [1]: with FIRST_ROUND=k the script runs rounds k..ROUNDS
#     (k..START_ROUNDS) into an OUTDIR that holds rounds 1..k-1 and
#     summarises them all, so a long sweep can be taken in several runs
#   RUN_LIMIT [600]: seconds one run may take (a run past it fails the script)
#   LOAD_MAX [0.5] LOAD_WAIT [120]: each run waits (up to LOAD_WAIT s) for
#     the 1-minute load average to fall below LOAD_MAX; the load it starts
#     under is recorded either way
#   OXCCL (the oxccl binary) [built: target/release/oxccl]
#   NET [198.18.77]: the /24 the hosts live in
#   OMPI_YIELD [1]: Open MPI's mpi_yield_when_idle. Its ranks spin while
#     they wait, and it sees one slot per host, so by itself it does not
#     yield; but the "hosts" share this machine's CPUs, and spinning ranks
#     starve the kernel's network work for the veth and bridge (2 ranks on
#     2 vCPUs: 4 ms per 8-byte all-reduce, 17-60 us with 1). 1 is what Open
#     MPI itself picks when it knows ranks outnumber CPUs; 0 measures it
#     as it starts.
# Needs: ip (iproute2), unshare (util-linux); for the MPIs:
#   apt-get install -y libopenmpi-dev openmpi-bin libmpich-dev mpich
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "bench-hosts-mpi.sh: $*" >&2; exit 2; }
have() { command -v "$1" >/dev/null 2>&1; }
[[ $(id -u) == 0 ]] || die "needs root (it makes network namespaces with ip netns); run it as root"
have ip || die "needs ip (iproute2): apt-get install -y iproute2"
have unshare || die "needs unshare (util-linux): apt-get install -y util-linux"

OUT=${1:-$(mktemp -d /tmp/bench-hosts-mpi.XXXXXX)}
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
PARTS=${PARTS:-"coll start"}
HOSTS=${HOSTS:-2}
LIBS=${LIBS:-"oxccl oxccl-nospin openmpi mpich"}
ROUNDS=${ROUNDS:-3}
COLLS=${COLLS:-"all_reduce all_gather broadcast"}
MIN_BYTES=${MIN_BYTES:-8}
MAX_BYTES=${MAX_BYTES:-67108864}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
START_HOSTS=${START_HOSTS:-4}
START_RANKS=${START_RANKS:-"4 16 64"}
START_LIBS=${START_LIBS:-"oxccl openmpi"}
START_ROUNDS=${START_ROUNDS:-3}
FIRST_ROUND=${FIRST_ROUND:-1}
RUN_LIMIT=${RUN_LIMIT:-600}
LOAD_MAX=${LOAD_MAX:-0.5}
LOAD_WAIT=${LOAD_WAIT:-120}
NET=${NET:-198.18.77}
OMPI_YIELD=${OMPI_YIELD:-1}
IF=oxh0
TAG=oxhm$$
mkdir -p "$OUT/raw"

for lib in $LIBS; do
  case $lib in oxccl | oxccl-nospin | openmpi | mpich) ;;
    *) die "LIBS: unknown library $lib (accepted: oxccl oxccl-nospin openmpi mpich)" ;;
  esac
done
for lib in $START_LIBS; do
  case $lib in oxccl | openmpi | mpich) ;;
    *) die "START_LIBS: unknown library $lib (accepted: oxccl openmpi mpich)" ;;
  esac
done
want() { [[ " $PARTS " == *" $1 "* ]]; }
nhosts=0
want coll && nhosts=$HOSTS
want start && ((START_HOSTS > nhosts)) && nhosts=$START_HOSTS
((nhosts >= 2 && nhosts <= 200)) || die "HOSTS=$HOSTS START_HOSTS=$START_HOSTS: accepted 2 to 200 hosts"

# --- builds ---------------------------------------------------------------
all_libs=" $LIBS $START_LIBS "
if [[ $all_libs == *" oxccl"* ]]; then
  if [[ -z ${OXCCL:-} ]]; then
    cargo build --release -q --bin oxccl
    OXCCL="${CARGO_TARGET_DIR:-target}/release/oxccl"
  fi
  OXCCL=$(cd "$(dirname "$OXCCL")" && pwd)/$(basename "$OXCCL")
  cargo build --release -q -p oxccl --example scale_probe
  PROBE=$(cd "${CARGO_TARGET_DIR:-target}/release/examples" && pwd)/scale_probe
fi
for mpi in openmpi mpich; do
  [[ $all_libs == *" $mpi "* ]] || continue
  if ! have "mpicc.$mpi" || ! have "mpirun.$mpi"; then
    die "$mpi asked for (LIBS/START_LIBS) but mpicc.$mpi or mpirun.$mpi is missing"
  fi
  "mpicc.$mpi" -O2 -o "$OUT/coll_bench.$mpi" bench/mpi/coll_bench.c
  "mpicc.$mpi" -O2 -o "$OUT/scale_probe.$mpi" bench/mpi/scale_probe.c
done

# --- hosts ----------------------------------------------------------------
ns() { echo "${TAG}_$1"; }
addr() { echo "$NET.$(($1 + 1))"; }
PIDS=()
cleanup() {
  local p i
  local live=()
  for p in "${PIDS[@]:-}"; do
    if [[ -n $p ]]; then kill -- "$p" 2>/dev/null && live+=("$p"); fi
  done
  # Leave the network up while they stop: mpirun stops its remote daemons
  # over it (and hangs if they are gone). Then the rest are killed.
  for ((i = 0; i < 100 && ${#live[@]} > 0; i++)); do
    sleep 0.1
    local still=()
    for p in "${live[@]}"; do kill -0 "$p" 2>/dev/null && still+=("$p"); done
    live=("${still[@]}")
  done
  for p in "${live[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for ((i = 0; i < nhosts; i++)); do ip netns del "$(ns "$i")" 2>/dev/null || true; done
  ip netns del "${TAG}_sw" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "${TAG}_sw"
ip -n "${TAG}_sw" link add br0 type bridge
ip -n "${TAG}_sw" link set br0 up
for ((i = 0; i < nhosts; i++)); do
  ip netns add "$(ns "$i")"
  ip -n "${TAG}_sw" link add "p$i" type veth peer name "$IF" netns "$(ns "$i")"
  ip -n "${TAG}_sw" link set "p$i" master br0 up
  ip -n "$(ns "$i")" addr add "$(addr "$i")/24" dev "$IF"
  ip -n "$(ns "$i")" link set lo up
  ip -n "$(ns "$i")" link set "$IF" up
done

# The launch agent the MPIs use in place of ssh: `agent [-opts] HOST CMD...`
# runs CMD (one shell command line, as ssh would) in HOST's namespace under
# its host name. HOST is an address of $NET.0/24.
AGENT=$OUT/agent.sh
cat >"$AGENT" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case \$1 in -*) shift ;; *) break ;; esac; done
host=\$1; shift
i=\$((\${host##*.} - 1))
exec ip netns exec "${TAG}_\$i" unshare --uts -- sh -c 'hostname "oxh-h\$0" && eval "\$*"' "\$i" "\$*"
EOF
chmod +x "$AGENT"

# spawn I OUT ERR CMD...: CMD in host I under its host name, in the
# background (its pid in LAST and PIDS: ip, unshare, sh, env and timeout each
# exec the next, so that pid is the command's own).
spawn() {
  local i=$1 o=$2 e=$3
  shift 3
  # shellcheck disable=SC2016 # expanded by the inner shell
  ip netns exec "$(ns "$i")" unshare --uts -- sh -c 'hostname "oxh-h$0" && exec "$@"' "$i" "$@" \
    >"$o" 2>"$e" &
  LAST=$!
  PIDS+=("$LAST")
}
# wait_all PID...: waits for each; returns the last failure's status.
wait_all() {
  local p rc=0
  for p in "$@"; do wait "$p" || rc=$?; done
  PIDS=()
  return "$rc"
}

# load1, wait_idle (LOAD_MAX, LOAD_WAIT).
# shellcheck source=scripts/idle-gate.sh
. scripts/idle-gate.sh

PORT=29800
next_port() { PORT=$((PORT + 1)); }

hostlist() { # n: comma-separated addresses of hosts 0..n-1
  local i s=""
  for ((i = 0; i < $1; i++)); do s+="${s:+,}$(addr "$i")"; done
  echo "$s"
}

# mpi_cmd MPI HOSTS RANKS: the mpirun command line (run in host 0).
mpi_cmd() {
  local mpi=$1 h=$2 n=$3 i per=$(( $3 / $2 ))
  case $mpi in
    openmpi)
      local hosts=""
      for ((i = 0; i < h; i++)); do hosts+="${hosts:+,}$(addr "$i"):$per"; done
      MPI_CMD=(mpirun.openmpi --allow-run-as-root -np "$n" --host "$hosts" --map-by slot
        --mca plm_rsh_agent "$AGENT" --mca plm_rsh_no_tree_spawn 1
        --mca oob_tcp_if_include "$IF" --mca btl_tcp_if_include "$IF"
        --mca mpi_yield_when_idle "$OMPI_YIELD")
      ;;
    mpich)
      local hosts=""
      for ((i = 0; i < h; i++)); do hosts+="${hosts:+,}$(addr "$i"):$per"; done
      MPI_CMD=(mpirun.mpich -launcher ssh -launcher-exec "$AGENT" -iface "$IF"
        -hosts "$hosts" -np "$n" -genv UCX_NET_DEVICES "$IF")
      ;;
  esac
}

# --- part 1: collectives, one rank per host ---------------------------------
coll_run() { # lib coll file
  local lib=$1 coll=$2 f=$3 i
  local args=(-b "$MIN_BYTES" -e "$MAX_BYTES" -f 2 -n "$ITERS" -w "$WARMUP")
  case $lib in
    oxccl | oxccl-nospin)
      next_port
      local pids=() spin=()
      [[ $lib == oxccl-nospin ]] && spin=(OXCCL_SPIN_US=0)
      for ((i = HOSTS - 1; i >= 0; i--)); do
        local o=/dev/null
        ((i == 0)) && o=$f
        spawn "$i" "$o" "$f.err.$i" env "${spin[@]}" RANK="$i" WORLD_SIZE="$HOSTS" LOCAL_RANK=0 \
          NCCL_COMM_ID="$(addr 0):$PORT" timeout "$RUN_LIMIT" \
          "$OXCCL" perf "$coll" --backend cpu "${args[@]}" -c 1
        pids+=("$LAST")
      done
      wait_all "${pids[@]}"
      ;;
    openmpi)
      mpi_cmd openmpi "$HOSTS" "$HOSTS"
      spawn 0 "$f" "$f.err" timeout "$RUN_LIMIT" "${MPI_CMD[@]}" --mca pml ob1 --mca btl tcp,self \
        "$OUT/coll_bench.openmpi" "$coll" "${args[@]}"
      wait_all "$LAST"
      ;;
    mpich)
      mpi_cmd mpich "$HOSTS" "$HOSTS"
      spawn 0 "$f" "$f.err" timeout "$RUN_LIMIT" "${MPI_CMD[@]}" -genv UCX_TLS tcp,self \
        "$OUT/coll_bench.mpich" "$coll" "${args[@]}"
      wait_all "$LAST"
      ;;
  esac
}

if want coll; then
  ((FIRST_ROUND > 1)) || : >"$OUT/raw/loads.txt"
  for r in $(seq "$FIRST_ROUND" "$ROUNDS"); do
    for coll in $COLLS; do
      for lib in $LIBS; do
        f="$OUT/raw/$lib.${HOSTS}r.$coll.$r.txt"
        load=$(wait_idle)
        echo "# round $r/$ROUNDS: $lib $coll, $HOSTS hosts, load $load" >&2
        if ! coll_run "$lib" "$coll" "$f"; then
          echo "bench-hosts-mpi.sh: $lib $coll over $HOSTS hosts failed; output: $f, errors: $f.err*" >&2
          cat "$f".err* >&2 || true
          exit 1
        fi
        echo "$lib $HOSTS $coll $r $load $(load1)" >>"$OUT/raw/loads.txt"
      done
    done
  done
  SUMMARY_ONLY=1 ROUNDS=$ROUNDS RANKS=$HOSTS COLLS=$COLLS LIBS=$LIBS OXCCL=$OXCCL \
    TITLE="oxccl beside MPI over TCP, one rank per host ($HOSTS network-namespace hosts on one bridge)" \
    scripts/bench-host-mpi.sh "$OUT" >/dev/null
  echo "# collectives: $OUT/results.md" >&2
fi

# --- part 2: start-up across hosts -----------------------------------------
start_run() { # lib ranks file
  local lib=$1 n=$2 f=$3 h=$START_HOSTS i
  local per=$((n / h))
  case $lib in
    oxccl)
      next_port
      local pids=() t0
      t0=$(date +%s.%N)
      for ((i = 0; i < h; i++)); do
        local o=$f.out.$i
        ((i == 0)) && o=$f
        # One shell per host starts its block of ranks (as an MPI daemon would).
        # shellcheck disable=SC2016 # expanded by the inner shell
        spawn "$i" "$o" "$f.err.$i" env WORLD_SIZE="$n" NCCL_COMM_ID="$(addr 0):$PORT" \
          LAUNCH_T0="$t0" FIRST=$((i * per)) PER="$per" PROBE="$PROBE" \
          timeout "$RUN_LIMIT" bash -c '
            pids=()
            trap '\''kill "${pids[@]}" 2>/dev/null; exit 143'\'' TERM
            for ((r = FIRST; r < FIRST + PER; r++)); do
              RANK=$r LOCAL_RANK=$((r - FIRST)) "$PROBE" --process & pids+=($!)
            done
            rc=0
            for p in "${pids[@]}"; do wait "$p" || rc=1; done
            exit $rc'
        pids+=("$LAST")
      done
      wait_all "${pids[@]}"
      ;;
    openmpi | mpich)
      mpi_cmd "$lib" "$h" "$n"
      local t0 extra
      t0=$(date +%s.%N)
      # LAUNCH_T0 reaches every rank, the remote ones too.
      if [[ $lib == openmpi ]]; then
        # shellcheck disable=SC2054 # one argument: a list of components
        extra=(--mca btl tcp,vader,self -x "LAUNCH_T0=$t0")
      else
        extra=(-genv LAUNCH_T0 "$t0")
      fi
      spawn 0 "$f" "$f.err" timeout "$RUN_LIMIT" "${MPI_CMD[@]}" "${extra[@]}" \
        "$OUT/scale_probe.$lib"
      wait_all "$LAST"
      ;;
  esac
}

if want start; then
  ((FIRST_ROUND > 1)) || : >"$OUT/raw/start.txt"
  for r in $(seq "$FIRST_ROUND" "$START_ROUNDS"); do
    for n in $START_RANKS; do
      ((n % START_HOSTS == 0)) || die "START_RANKS: $n is not a multiple of START_HOSTS=$START_HOSTS"
      for lib in $START_LIBS; do
        f="$OUT/raw/start.$lib.${n}r.$r.txt"
        : >"$f"
        load=$(wait_idle)
        echo "# start-up round $r/$START_ROUNDS: $lib, $n ranks over $START_HOSTS hosts, load $load" >&2
        if ! start_run "$lib" "$n" "$f"; then
          echo "bench-hosts-mpi.sh: start-up of $lib with $n ranks over $START_HOSTS hosts failed; output: $f, errors: $f.err" >&2
          cat "$f".err* >&2 || true
          exit 1
        fi
        line=$(grep '^ranks' "$f" || true)
        [[ $line == "ranks $n "* ]] || { echo "bench-hosts-mpi.sh: $lib $n ranks: no result line in $f" >&2; exit 1; }
        echo "$lib $n $r $load $line" >>"$OUT/raw/start.txt"
      done
    done
  done
  python3 - "$OUT" "$START_HOSTS" "$START_ROUNDS" <<'PY' | tee "$OUT/start.md"
import statistics, sys
out, hosts, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
med = statistics.median
runs = {}
for line in open(f"{out}/raw/start.txt"):
    f = line.split()
    lib, n, load = f[0], int(f[1]), float(f[3])
    kv = dict(zip(f[4::2], f[5::2]))
    runs.setdefault((lib, n), []).append((float(kv["launch_to_init_s"]),
        float(kv["launch_to_first_s"]), float(kv["peak_mb_per_rank"]), load))
print(f"# Start-up across {hosts} hosts\n")
print(f"Median of {rounds} alternated rounds (min–max in brackets). Times from launch to the "
      "slowest rank's end of initialisation and of its first checked 8-byte all-reduce; "
      "peak RSS (VmHWM) per process, averaged over the ranks. Load: the 1-minute load "
      "average at the start of each run.\n")
print("| library | ranks | to init s | to first all-reduce s | peak MB per rank | load |")
print("|---|---|---|---|---|---|")
for (lib, n), v in sorted(runs.items(), key=lambda x: (x[0][1], x[0][0])):
    cell = lambda k, p: f"{med([x[k] for x in v]):.{p}f} ({min(x[k] for x in v):.{p}f}–{max(x[k] for x in v):.{p}f})"
    print(f"| {lib} | {n} | {cell(0, 3)} | {cell(1, 3)} | {cell(2, 2)} | {cell(3, 2)} |")
PY
  echo "# start-up: $OUT/start.md" >&2
fi
