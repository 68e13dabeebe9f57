#!/usr/bin/env bash
# oxccl all_reduce over TCP between two "hosts" (network namespaces joined by
# one veth pair, 198.18.2.1 <-> 198.18.2.2) against a plain TCP stream on the
# same pair. Informational: the target is oxccl busbw >= 80% of the stream.
#
# Usage (as root): bench/tcp_hosts.sh [max_bytes]   (default 256 MiB; sizes 1 MiB x4)
# Env: STREAM_BYTES (default 2 GiB), CARGO_TARGET_DIR (default ./target).
# Each namespace runs under its own UTS namespace and host name, so oxccl's
# host hash differs and it picks TCP (not shared memory) between them.
set -euo pipefail

MAX=${1:-$((256 << 20))}
MIN=$((1 << 20))
STREAM_BYTES=${STREAM_BYTES:-$((2 << 30))}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET/release/examples/netns_worker
NS0=oxb$$_0
NS1=oxb$$_1
A0=198.18.2.1
A1=198.18.2.2

if [ "$(id -u)" != 0 ]; then
    echo "SKIPPED: needs root for ip netns" >&2
    exit 0
fi

(cd "$ROOT" && cargo build --release -q -p oxccl --example netns_worker)

PIDS=()
cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    ip netns del "$NS0" 2>/dev/null || true
    ip netns del "$NS1" 2>/dev/null || true
}
trap cleanup EXIT INT TERM

ip netns add "$NS0"
ip netns add "$NS1"
ip -n "$NS0" link add eth0 type veth peer name eth0 netns "$NS1"
ip -n "$NS0" addr add "$A0/24" dev eth0
ip -n "$NS1" addr add "$A1/24" dev eth0
for ns in "$NS0" "$NS1"; do
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
done

# run NS HOSTNAME CMD...: CMD inside NS under its own host name.
run() {
    local ns=$1 h=$2
    shift 2
    ip netns exec "$ns" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$h" "$@"
}

echo "== plain TCP stream $A0 -> $A1, $STREAM_BYTES bytes, one connection"
out=$(mktemp)
run "$NS1" oxb-h1 "$BIN" tcp-recv "$A1:29700" "$STREAM_BYTES" >"$out" &
PIDS+=($!)
rpid=$!
run "$NS0" oxb-h0 "$BIN" tcp-send "$A1:29700" "$STREAM_BYTES"
wait "$rpid"
grep tcp_stream "$out"
TCP=$(awk '/tcp_stream/ {print $NF}' "$out")
rm -f "$out"

echo "== oxccl all_reduce, 2 ranks (one per host), float32 sum, NCCL_COMM_ID=$A0:29701"
export NCCL_COMM_ID=$A0:29701 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
out=$(mktemp)
run "$NS1" oxb-h1 "$BIN" all-reduce 1 2 "$MIN" "$MAX" >/dev/null &
PIDS+=($!)
r1=$!
run "$NS0" oxb-h0 "$BIN" all-reduce 0 2 "$MIN" "$MAX" | tee "$out"
wait "$r1"

BEST=$(awk '$1 ~ /^[0-9]+$/ {if ($4 > b) b = $4} END {print b + 0}' "$out")
LAST=$(awk '$1 ~ /^[0-9]+$/ {l = $4} END {print l + 0}' "$out")
rm -f "$out"
awk -v t="$TCP" -v b="$BEST" -v l="$LAST" 'BEGIN {
    printf "== plain TCP %.3f GB/s; oxccl busbw best %.3f GB/s (%.0f%%), at the largest size %.3f GB/s (%.0f%%); target >= 80%%\n",
        t, b, 100 * b / t, l, 100 * l / t
}'
