#!/usr/bin/env bash
# The MPI reference beside scripts/bench-scale.sh: memory per rank and the
# time from launch to the first finished 8-byte all-reduce against the rank
# count, for Open MPI and MPICH (Debian's packages; ranks as processes on
# this host, oversubscribed), through bench/mpi/scale_probe.c built against
# each. oxccl's figures come from bench-scale.sh (ranks as threads of one
# process: the library is mapped once; here each process maps its own).
#
# Usage: scripts/bench-scale-mpi.sh [N ...]     (default: 4 16 64 256)
# Env:   MPIS="openmpi mpich" (which to run), TIMEOUT_S=300 per run
#
# A rank count whose processes would not fit (about 30 MB each counted
# against MemAvailable) is skipped with a line saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(4 16 64 256)
MPIS=${MPIS:-openmpi mpich}
TIMEOUT_S=${TIMEOUT_S:-300}
OUT=$(mktemp -d /tmp/bench-scale-mpi.XXXXXX)
have() { command -v "$1" >/dev/null 2>&1; }
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
printf '%-8s %6s %10s %10s %12s %12s  %s\n' mpi ranks "init s" "first s" "peak MB" "MB per rank" "load average before"
for mpi in $MPIS; do
    if ! have "mpicc.$mpi" || ! have "mpirun.$mpi"; then
        echo "# no $mpi (mpicc.$mpi, mpirun.$mpi): left out"
        continue
    fi
    "mpicc.$mpi" -O2 -o "$OUT/scale_probe.$mpi" bench/mpi/scale_probe.c
    for n in "${SIZES[@]}"; do
        avail_mb=$(awk '/MemAvailable/ {print int($2/1024)}' /proc/meminfo)
        if [ $((n * 30)) -gt "$avail_mb" ]; then
            echo "$mpi $n: skipped, about $((n * 30)) MB needed, $avail_mb MB available"
            continue
        fi
        case $mpi in
            openmpi) args=(--allow-run-as-root --oversubscribe -np "$n") ;;
            *) args=(-np "$n") ;;
        esac
        load=$(cut -d' ' -f1-3 /proc/loadavg)
        if line=$(LAUNCH_T0=$(date +%s.%N) timeout "$TIMEOUT_S" \
            "mpirun.$mpi" "${args[@]}" "$OUT/scale_probe.$mpi" 2>&1 | grep '^ranks' | tail -1) &&
            [[ $line == ranks* ]]; then
            read -r _ _ _ init _ first _ total _ per <<<"$line"
            printf '%-8s %6s %10s %10s %12s %12s  %s\n' "$mpi" "$n" "$init" "$first" "$total" "$per" "$load"
        else
            echo "$mpi $n: failed or over ${TIMEOUT_S} s"
        fi
    done
done
rm -rf "$OUT"
