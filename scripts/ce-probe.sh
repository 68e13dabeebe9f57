#!/usr/bin/env bash
# Runs scripts/probes/ce_probe.cu ON the GPU machine (2 GPUs): copy engines
# and SMs moving data between the GPUs, one way and both ways. Output:
# $OUT/ce_probe.txt (or stdout). Nothing to build here first.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-env.sh
B=$(mktemp -d /tmp/ce-probe.XXXXXX)
/usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o "$B/ce_probe" scripts/probes/ce_probe.cu -lcuda || exit 1
nvidia-smi topo -m 2>/dev/null | head -5
timeout 300 "$B/ce_probe" "${1:-1024}" | tee "${OUT:-/tmp}/ce_probe.txt"
