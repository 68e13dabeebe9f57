#!/usr/bin/env bash
# Builds the oxccl wheel (release profile) into target/wheels: the `oxccl`
# CLI as its script, and the package `oxccl` with lib/libnccl.so.2,
# lib/libnccl.so, include/nccl.h and, with --kernels DIR, the GPU kernels
# that `oxccl kernels --out DIR` compiled, as lib/oxccl-kernels (the folder
# the library looks for beside itself).
#
# Usage: scripts/wheel.sh [--kernels DIR] [--zig] [MATURIN_ARGS...]
#
# Without --zig the wheel is tagged for the glibc of the build machine
# (manylinux_2_34 on Debian 12: Rust's std takes the newest symbol versions
# it finds). --zig links both the library and the CLI with zig against
# glibc 2.17 (manylinux2014, every distribution since CentOS 7); it needs
# `pip install ziglang` beside maturin and builds into
# target/x86_64-unknown-linux-gnu.
# Needs maturin (`pip install maturin`) and strip (binutils). MATURIN names
# the maturin command when it is not on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

kernels=
zig=0
while [ $# -gt 0 ]; do
  case $1 in
  --kernels)
    kernels=${2:?--kernels needs a folder}
    [ -d "$kernels" ] || { echo "wheel.sh: --kernels $kernels: not a folder" >&2; exit 2; }
    shift 2
    ;;
  --zig) zig=1; shift ;;
  *) break ;;
  esac
done
maturin=${MATURIN:-maturin}

if [ $zig = 1 ]; then
  # maturin's own zig wrapper as the linker, for glibc 2.17.
  triple=x86_64-unknown-linux-gnu
  wrapper=$PWD/target/zig-cc-$triple.sh
  mkdir -p target
  printf '#!/bin/sh\nexec %q zig cc -- -target x86_64-linux-gnu.2.17 "$@"\n' "$(command -v "$maturin")" >"$wrapper"
  chmod +x "$wrapper"
  CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER=$wrapper cargo build --release -p oxccl-nccl --target $triple
  library=target/$triple/release/libnccl.so
  set -- --zig --compatibility manylinux2014 --target $triple "$@"
else
  cargo build --release -p oxccl-nccl
  library=target/release/libnccl.so
fi
pkg=python/oxccl
rm -rf "$pkg/lib" "$pkg/include"
mkdir -p "$pkg/lib" "$pkg/include"
# Debug info off (the release profile keeps line tables for backtraces):
# 24 MB → 3.2 MB. A wheel cannot hold symlinks, so libnccl.so (what
# -lnccl finds) is a second copy.
strip --strip-debug -o "$pkg/lib/libnccl.so.2" "$library"
cp "$pkg/lib/libnccl.so.2" "$pkg/lib/libnccl.so"
cp crates/oxccl-nccl/include/nccl.h "$pkg/include/nccl.h"
if [ -n "$kernels" ]; then
  cp -r "$kernels" "$pkg/lib/oxccl-kernels"
fi
"$maturin" build --release --out target/wheels "$@"
