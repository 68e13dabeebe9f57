#!/bin/sh
# Adds the name programs load, libnccl.so.2 (the SONAME), beside the cdylib
# cargo built (libnccl.so, the name `-lnccl` links), as a symlink that keeps
# following later rebuilds:
#   crates/oxccl-nccl/install-names.sh target/release
# Then run with LD_LIBRARY_PATH=target/release (or LD_PRELOAD=.../libnccl.so.2).
set -eu
dir=${1:?usage: install-names.sh DIR (the directory holding libnccl.so, e.g. target/release)}
[ -f "$dir/libnccl.so" ] || { echo "no libnccl.so in $dir: cargo build --release -p oxccl-nccl first" >&2; exit 1; }
ln -sf libnccl.so "$dir/libnccl.so.2"
ls -l "$dir/libnccl.so" "$dir/libnccl.so.2"
