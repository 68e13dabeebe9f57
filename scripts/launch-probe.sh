#!/usr/bin/env bash
# Runs scripts/probes/launch_probe.cu ON the GPU machine: what the host pays
# per eager launch of an empty kernel (runtime and driver API, PDL on and
# off, 32 and 512 threads) and per helper driver call an eager collective
# makes; then one op of a 2-rank group (two GPUs, or two streams of one):
# two launches against one launch ordered by events or by stream memory
# operations. Output: $OUT/launch_probe.txt (or /tmp). Nothing to build here
# first.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh
B=$(mktemp -d /tmp/launch-probe.XXXXXX)
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -std=c++17 -o "$B/launch_probe" scripts/probes/launch_probe.cu -lcuda || exit 1
timeout 300 "$B/launch_probe" | tee "${OUT:-/tmp}/launch_probe.txt"
