#!/usr/bin/env bash
# Builds the prebuilt GPU kernels that the wheel ships: every program as a
# CUBIN for sm_80 (A100), sm_90 (H100/H200) and sm_100 (B200), and as PTX
# for compute_100, which the driver compiles at load on newer GPUs
# (`oxccl kernels --arch 80,90,100 --ptx`). The folder is emptied first, so
# no file of an older source is shipped. Compiles through the kernel cache
# CACHE (OXCCL_CACHE_DIR), so a second run with the same sources only copies.
# Prints the time it took and the folder's size.
# Needs NVRTC 13.0 (OXCCL_NVRTC, see .ci/run). Usage: scripts/kernels-ci.sh OUT CACHE
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/kernels-ci.sh OUT CACHE}
cache=${2:?usage: scripts/kernels-ci.sh OUT CACHE}
cargo build -q -p oxccl-cli
rm -rf "$out"
t0=$SECONDS
OXCCL_CACHE_DIR=$cache "${CARGO_TARGET_DIR:-target}/debug/oxccl" kernels --out "$out" --arch 80,90,100 --ptx
echo "kernels-ci: $(find "$out" -type f | wc -l) files, $(du -sm "$out" | cut -f1) MiB, in $((SECONDS - t0)) s on $(nproc) CPUs"
