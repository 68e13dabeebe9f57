#!/usr/bin/env bash
# Runs scripts/probes/ll_probe.cu ON the GPU machine: the floor of a small
# two-rank exchange between kernels under CUDA graphs (launch, PDL, one
# 16-byte line each way). One GPU: both ranks share it; two: rank 1 on
# GPU 1 (`scripts/ll-probe.sh N one` keeps both on GPU 0). Output:
# $OUT/ll_probe.txt (or stdout). Nothing to build here first.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh
B=$(mktemp -d /tmp/ll-probe.XXXXXX)
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -std=c++17 -o "$B/ll_probe" scripts/probes/ll_probe.cu || exit 1
timeout 300 "$B/ll_probe" "${1:-20000}" ${2:-} | tee "${OUT:-/tmp}/ll_probe.txt"
