#!/usr/bin/env bash
# Runs the `#[ignore]`d tests that need no GPU, on a machine that has what
# each needs (CI's .ci/run does):
#   - oxccl-cuda's kernels_compile: NVRTC 13.0 (`OXCCL_NVRTC` or the search
#     dirs of `oxccl_cuda::loader::nvrtc_search_dirs`); no GPU.
# The GPU tests run on the GPU machine through scripts/gpu-test.sh; child
# halves of multi-process tests (`#[ignore = "child process of ..."]`) are
# started by their parent tests and are not run here.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -p oxccl-cuda --test kernels_compile -- --ignored "$@"
