#!/usr/bin/env bash
# Builds the oxccl wheel (release profile) into target/wheels: the `oxccl`
# CLI as its script, and the package `oxccl` with lib/libnccl.so.2,
# lib/libnccl.so, include/nccl.h and, with --kernels DIR, the GPU kernels
# that `oxccl kernels --out DIR` compiled, as lib/oxccl-kernels (the folder
# the library looks for beside itself).
#
# Usage: scripts/wheel.sh [--kernels DIR] [MATURIN_ARGS...]
# Needs maturin (`pip install maturin`) and strip (binutils). MATURIN names
# the maturin command when it is not on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

kernels=
if [ "${1:-}" = --kernels ]; then
  kernels=${2:?--kernels needs a folder}
  [ -d "$kernels" ] || { echo "wheel.sh: --kernels $kernels: not a folder" >&2; exit 2; }
  shift 2
fi
maturin=${MATURIN:-maturin}

cargo build --release -p oxccl-nccl
pkg=python/oxccl
rm -rf "$pkg/lib" "$pkg/include"
mkdir -p "$pkg/lib" "$pkg/include"
# Debug info off (the release profile keeps line tables for backtraces):
# 24 MB → about a third. A wheel cannot hold symlinks, so libnccl.so (what
# -lnccl finds) is a second copy.
strip --strip-debug -o "$pkg/lib/libnccl.so.2" target/release/libnccl.so
cp "$pkg/lib/libnccl.so.2" "$pkg/lib/libnccl.so"
cp crates/oxccl-nccl/include/nccl.h "$pkg/include/nccl.h"
if [ -n "$kernels" ]; then
  cp -r "$kernels" "$pkg/lib/oxccl-kernels"
fi
$maturin build --release --out target/wheels "$@"
