#!/usr/bin/env bash
# Soak: mixed collectives between 4 local processes, once over shared memory
# and once over TCP on loopback, with RSS / open fds / /dev/shm segments
# sampled every --sample-every ops (see crates/oxccl/examples/soak.rs).
#
# Usage: bench/soak.sh [ops] [ranks]     (defaults: 100000 4)
# Writes the two reports to ${SOAK_OUT:-target/soak}/{shm,tcp}.txt and exits
# non-zero if either run fails.
set -euo pipefail
cd "$(dirname "$0")/.."
ops=${1:-100000}
ranks=${2:-4}
every=$(( ops / 10 > 0 ? ops / 10 : 1 ))
out=${SOAK_OUT:-target/soak}
mkdir -p "$out"
cargo build --release -q -p oxccl --example soak
bin=${CARGO_TARGET_DIR:-target}/release/examples/soak
rc=0
echo "== shared memory: $ops ops, $ranks ranks"
"$bin" --ops "$ops" --ranks "$ranks" --sample-every "$every" | tee "$out/shm.txt" || rc=1
echo "== TCP (NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo): $ops ops, $ranks ranks"
NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo \
    "$bin" --ops "$ops" --ranks "$ranks" --sample-every "$every" | tee "$out/tcp.txt" || rc=1
exit $rc
