#!/usr/bin/env bash
# Memory and start-up against the rank count, host path, ranks as threads of
# one process. For each N, one run of crates/oxccl/examples/scale_probe.rs:
# every rank thread starts at one instant, creates its communicator, runs one
# 8-byte collective (checked) and waits for the others. Reported: the slowest
# rank's creation, the slowest rank's time from the start to its finished
# first collective, the process's peak resident memory (VmHWM, also per
# rank) and the load average, which the times depend on and the memory does
# not. With PERF=1 each N is also run as `oxccl perf all_reduce -b 8 -e 8 -n 1
# -w 0 -c 1` under /usr/bin/time (peak RSS and wall time of the whole run;
# perf settles the ranks with 200 barrier all-reduces first, so its wall
# time is mostly those).
#
# Usage: scripts/bench-scale.sh [N ...]        (default: 4 16 64 256 1024)
# Env:   COLL=all_reduce|all_to_all (default all_reduce)
#        PERF=1 (also the oxccl perf run), OXCCL=path (default target/release/oxccl)
#
# Per rank the process holds a thread (its stack is touched a few pages
# deep), a bootstrap listener and accept thread, message channels to at most
# 3 tree peers (a reader thread each), and transport connections to at most
# 8 peers (none are sockets between threads): about 8 descriptors and 5
# threads per rank. The script raises the descriptor limit to the hard limit
# and skips rank counts that would not fit under it.
set -euo pipefail
cd "$(dirname "$0")/.."
COLL=${COLL:-all_reduce}
PROBE=target/release/examples/scale_probe
cargo build --release -p oxccl --example scale_probe >&2
if [ "${PERF:-0}" = 1 ]; then
    OXCCL=${OXCCL:-target/release/oxccl}
    [ -x "$OXCCL" ] || cargo build --release -p oxccl-cli >&2
    [ -x /usr/bin/time ] || { echo "bench-scale: PERF=1 needs /usr/bin/time (GNU time)" >&2; exit 1; }
fi
ulimit -n "$(ulimit -Hn)"
FDS=$(ulimit -n)
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(4 16 64 256 1024)

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo), fd limit $FDS, $COLL"
printf '%6s %10s %10s %10s %12s  %s\n' ranks "init s" "first s" "peak MB" "MB per rank" "load average before"
for n in "${SIZES[@]}"; do
    if [ $((n * 12 + 64)) -gt "$FDS" ]; then
        echo "$n: skipped, needs about $((n * 12 + 64)) descriptors, the limit is $FDS"
        continue
    fi
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    if line=$("$PROBE" "$n" "$COLL" 2>&1 | tail -1) && [[ $line == ranks* ]]; then
        read -r _ _ _ _ _ init _ first _ hwm <<<"$line"
        printf '%6s %10s %10s %10s %12.2f  %s\n' "$n" "$init" "$first" "$hwm" \
            "$(echo "$hwm / $n" | bc -l)" "$load"
    else
        echo "$n: failed: $line"
    fi
    if [ "${PERF:-0}" = 1 ]; then
        log=$(mktemp /tmp/bench-scale.XXXXXX)
        status=ok
        /usr/bin/time -f 'RSS_KB=%M WALL_S=%e' -o "$log.time" \
            "$OXCCL" perf all_reduce --backend cpu --ranks "$n" --launch thread \
            -b 8 -e 8 -n 1 -w 0 -c 1 >"$log" 2>&1 || status="failed"
        grep -q '# Out of bounds values : 0 OK' "$log" || status="$status, wrong or no result"
        echo "       oxccl perf: $(cat "$log.time"), $status"
        rm -f "$log" "$log.time"
    fi
done
