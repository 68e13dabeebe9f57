#!/usr/bin/env bash
# The MPI and Gloo reference beside scripts/bench-scale.sh: memory per rank
# and the time from launch to the first finished 8-byte all-reduce against
# the rank count, for Open MPI and MPICH (Debian's packages; ranks as
# processes on this host, oversubscribed), through bench/mpi/scale_probe.c
# built against each, and for Gloo (torch.distributed, processes started by
# bench/gloo_scale_probe.py; its line adds the import's share: import_s and
# the resident memory after `import torch`), and for oxccl the same way:
# N processes of `scale_probe --process` (crates/oxccl/examples), the
# rendezvous at 127.0.0.1 (NCCL_COMM_ID), so all four pay a process per
# rank. oxccl's figures come from bench-scale.sh (ranks as threads of one
# process: the library is mapped once; here each process maps its own).
#
# Usage: scripts/bench-scale-mpi.sh [N ...]     (default: 4 16 64 256)
# Env:   MPIS="openmpi mpich gloo" (which to run), TIMEOUT_S=300 per run,
#        GLOO_PYTHON=python with torch [python3]
#
# A rank count whose processes would not fit (about 30 MB each for the
# MPIs, 600 MB for Gloo, whose processes hold torch, counted against
# MemAvailable) is skipped with a line saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(4 16 64 256)
MPIS=${MPIS:-oxccl openmpi mpich gloo}
PY=${GLOO_PYTHON:-python3}
TIMEOUT_S=${TIMEOUT_S:-300}
OUT=$(mktemp -d /tmp/bench-scale-mpi.XXXXXX)
have() { command -v "$1" >/dev/null 2>&1; }
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
printf '%-8s %6s %10s %10s %12s %12s  %s\n' mpi ranks "init s" "first s" "peak MB" "MB per rank" "load average before"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
for mpi in $MPIS; do
    if [ "$mpi" = oxccl ]; then
        cargo build --release -q -p oxccl --example scale_probe >&2
        probe=target/release/examples/scale_probe
        for n in "${SIZES[@]}"; do
            avail_mb=$(awk '/MemAvailable/ {print int($2/1024)}' /proc/meminfo)
            if [ $((n * 30)) -gt "$avail_mb" ]; then
                echo "oxccl $n: skipped, about $((n * 30)) MB needed, $avail_mb MB available"
                continue
            fi
            load=$(cut -d' ' -f1-3 /proc/loadavg)
            port=$(free_port)
            t0=$(date +%s.%N)
            pids=()
            for ((r = 0; r < n; r++)); do
                RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r NCCL_COMM_ID=127.0.0.1:$port LAUNCH_T0=$t0 \
                    timeout "$TIMEOUT_S" "$probe" --process >"$OUT/oxccl.$r" 2>&1 &
                pids+=($!)
            done
            rc=0
            for p in "${pids[@]}"; do wait "$p" || rc=1; done
            line=$(grep '^ranks' "$OUT/oxccl.0" | tail -1 || true)
            if [ $rc = 0 ] && [[ $line == ranks* ]]; then
                read -r _ _ _ init _ first _ total _ per <<<"$line"
                printf '%-8s %6s %10s %10s %12s %12s  %s\n' oxccl "$n" "$init" "$first" "$total" "$per" "$load"
            else
                echo "oxccl $n: failed or over ${TIMEOUT_S} s ($(head -c 300 "$OUT/oxccl.0"))"
            fi
        done
        continue
    fi
    if [ "$mpi" = gloo ]; then
        if ! "$PY" -c "import torch.distributed" 2>/dev/null; then
            echo "# no torch for $PY: Gloo left out (set GLOO_PYTHON)"
            continue
        fi
        for n in "${SIZES[@]}"; do
            avail_mb=$(awk '/MemAvailable/ {print int($2/1024)}' /proc/meminfo)
            if [ $((n * 600)) -gt "$avail_mb" ]; then
                echo "gloo $n: skipped, about $((n * 600)) MB needed, $avail_mb MB available"
                continue
            fi
            load=$(cut -d' ' -f1-3 /proc/loadavg)
            if line=$(LAUNCH_T0=$(date +%s.%N) timeout "$TIMEOUT_S" \
                "$PY" bench/gloo_scale_probe.py "$n" 2>&1 | grep '^ranks' | tail -1) &&
                [[ $line == ranks* ]]; then
                read -r _ _ _ init _ first _ total _ per _ imp _ rss <<<"$line"
                printf '%-8s %6s %10s %10s %12s %12s  %s  (import %s s, %s MB after import)\n' \
                    gloo "$n" "$init" "$first" "$total" "$per" "$load" "$imp" "$rss"
            else
                echo "gloo $n: failed or over ${TIMEOUT_S} s"
            fi
        done
        continue
    fi
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
