//! oxccl's CUDA executor: guarded driver and NVRTC loading, CUDA C++
//! kernels compiled ahead of time or by NVRTC with an on-disk cache, device
//! memory and peer access, the pair kernels of two GPUs in one process, the
//! ring path (windows, launches, network proxies), the copy engines, and
//! what the C ABI needs to run them on the caller's streams ([`capi`]).
//!
//! It acts; it does not decide: which kernel, how many blocks and channels,
//! when the copy engines or one launch for every local rank pay, and every
//! setting a communicator reads are pure functions in `oxccl_core::gpu`,
//! tested without a GPU.
//!
//! Everything builds and tests without CUDA: CUDA is reached through cudarc's
//! dynamic loading, and every entry point first checks (with `dlopen`/`dlsym`,
//! see [`loader`]) that the library and symbols cudarc would load are there,
//! so a machine without a GPU gets an [`oxccl_core::Error`] ("no CUDA driver:
//! ..."), never a panic.
//!
//! `unsafe` is for FFI: dlopen/dlsym ([`loader`], [`nvml`]), NVRTC
//! ([`compile`]), driver calls and the memory they share ([`device`],
//! [`allreduce`], [`ring`], [`capi`], [`perfio`]), and the network plugin
//! and proxies' window words; every block has a `// SAFETY:` line, which
//! clippy's `undocumented_unsafe_blocks` enforces.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod allreduce;
pub mod capi;
pub mod compile;
pub mod device;
pub mod kernels;
pub mod loader;
pub mod netplugin;
pub mod netproxy;
pub mod nvml;
pub mod perfio;
pub mod ring;
pub mod topo;

pub use allreduce::OneShot2;
// The copy-engine schedules are pure decisions of the core; these names
// keep the paths callers know.
pub use device::{DeviceBuffer, Event, Gpu};
pub use loader::{driver, nvrtc, probe_driver, DriverInfo, NvrtcInfo, Unavailable};
pub use oxccl_core::gpu::copy_engine as ce;
pub use oxccl_core::gpu::copy_engine_reduce as ce_reduce;

/// Helpers of the unit tests.
#[cfg(test)]
pub(crate) mod testutil {
    /// `len` pseudo-random bytes (xorshift64 from `*state`, which advances):
    /// for decoders that must refuse any input without panicking.
    pub fn noise(state: &mut u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|_| {
                *state ^= *state << 13;
                *state ^= *state >> 7;
                *state ^= *state << 17;
                *state as u8
            })
            .collect()
    }
}
