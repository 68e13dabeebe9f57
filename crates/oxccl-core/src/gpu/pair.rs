//! The grids of the two-GPU kernels of one process (`kernels/allreduce.cu`:
//! `oxccl_ar1_*` reductions, `oxccl_pcopy` copies; `kernels/copy.cu`:
//! `oxccl_copy`). Both GPUs compute a call's grid from its count and type
//! alone (each launch knows only its own pointers), so their grids match
//! block for block: each block meets its partner on the peer GPU.

use crate::types::DataType;

/// Threads per block (the kernels' `__launch_bounds__`).
pub const THREADS: u32 = 512;

/// Units (16-byte packs or elements) per thread per round (`OXCCL_UNROLL`).
pub const UNROLL: u64 = 4;

/// Most blocks of a launch (`OXCCL_MAX_BLOCKS`): one flag word and a
/// mailbox slot per block on each GPU. 128 <= 132 SMs of an H100/H200, so
/// every block of a launch can be resident at once (a block waits for its
/// partner on the peer GPU, never for another block of its own grid).
pub const MAX_BLOCKS: u32 = 128;

/// Barrier values one call of any pair kernel takes (entry and exit; one spare).
pub const BUDGET: u64 = 3;

/// The grid and the barrier budget of a reduction of `count` elements of
/// `t`: (blocks, sequence values the call may use). Blocks cover the buffer
/// in 16-byte packs, `THREADS x UNROLL` of them a block, at most
/// `max_blocks` (within 1..=[`MAX_BLOCKS`]); the budget is an upper bound
/// that also holds when the kernel falls back to single elements
/// (misaligned buffers).
pub fn reduce_grid(count: u64, t: DataType, max_blocks: u32) -> (u32, u64) {
    let packs = count.saturating_mul(t.size() as u64) / 16;
    let blocks = packs
        .div_ceil(THREADS as u64 * UNROLL)
        .clamp(1, max_blocks.clamp(1, MAX_BLOCKS) as u64);
    // entry + exit (+ a spare): no kernel meets the peer in between
    (blocks as u32, BUDGET)
}

/// The grid of `oxccl_pcopy` for `bytes`, as [`reduce_grid`]'s.
pub fn copy_blocks(bytes: u64, max_blocks: u32) -> u32 {
    (bytes / 16)
        .div_ceil(THREADS as u64 * UNROLL)
        .clamp(1, max_blocks.clamp(1, MAX_BLOCKS) as u64) as u32
}

/// The grid of `oxccl_copy` (copy.cu) for `bytes`: a thread per 16-byte
/// pack, at most 264 blocks (two per SM of an H100/H200; the kernel is
/// grid-stride, so any grid is correct).
pub fn copy_kernel_blocks(bytes: u64) -> u32 {
    (bytes / 16).div_ceil(THREADS as u64).clamp(1, 264) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_cover_the_buffer_within_the_bounds() {
        // 8 KiB of packs a block (512 threads x 4 packs of 16 bytes).
        let per_block = THREADS as u64 * UNROLL * 16;
        assert_eq!(per_block, 32 << 10);
        assert_eq!(reduce_grid(0, DataType::Float32, 128), (1, BUDGET));
        assert_eq!(reduce_grid(1, DataType::Float32, 128), (1, BUDGET));
        assert_eq!(reduce_grid(8192, DataType::Float32, 128).0, 1);
        assert_eq!(reduce_grid(8196, DataType::Float32, 128).0, 2);
        assert_eq!(reduce_grid(1 << 30, DataType::Float64, 128).0, 128);
        assert_eq!(reduce_grid(1 << 30, DataType::Float64, 7).0, 7);
        assert_eq!(reduce_grid(1 << 30, DataType::Float64, 0).0, 1);
        assert_eq!(reduce_grid(1 << 30, DataType::Float64, 500).0, MAX_BLOCKS);
        assert_eq!(reduce_grid(u64::MAX, DataType::Float64, 128).0, 128);
        for bytes in [0u64, 15, 16, 32 << 10, (32 << 10) + 16, 1 << 40] {
            let b = copy_blocks(bytes, 128) as u64;
            assert!((1..=128).contains(&b), "{bytes}");
            assert!(b == 128 || b * per_block >= bytes / 16 * 16, "{bytes}");
            assert_eq!(
                copy_blocks(bytes, 128),
                reduce_grid(bytes, DataType::Uint8, 128).0
            );
        }
        assert_eq!(copy_kernel_blocks(0), 1);
        assert_eq!(copy_kernel_blocks(16 * 512), 1);
        assert_eq!(copy_kernel_blocks(16 * 512 + 16), 2);
        assert_eq!(copy_kernel_blocks(1 << 40), 264);
    }
}
