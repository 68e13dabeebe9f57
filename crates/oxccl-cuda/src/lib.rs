//! oxccl's CUDA executor: guarded driver and NVRTC loading, CUDA C++
//! kernels compiled ahead of time or by NVRTC with an on-disk cache, device
//! memory and peer access, the pair kernels of two GPUs in one process, the
//! ring path (windows, launches, network proxies), the copy engines, and
//! the device communicator that runs them on the caller's streams ([`exec`]),
//! over one layer of driver calls with typed errors (`driver`).
//!
//! Layers, as cudarc's sys -> result -> safe: `driver` makes each driver
//! call and returns its outputs or a typed `DriverError` naming the call and
//! CUDA's code (no other module calls `cudarc::driver::sys`); [`device`],
//! [`bench_gpu`], [`ring`] and [`exec`] hold what the driver made in owned
//! values and act through that layer. A rank's [`exec::DevComm`] keeps its
//! state by concern: its GPU and context, what its launches carry between
//! calls, its peers in this process, the ring path (windows, then network
//! proxies), the copy engines, and the channel with a peer process.
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
//! [`allreduce`], [`ring`], [`exec`], [`bench_gpu`]), and the network plugin
//! and proxies' window words; every block has a `// SAFETY:` line, which
//! clippy's `undocumented_unsafe_blocks` enforces.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod allreduce;
pub mod bench_gpu;
pub mod compile;
pub mod device;
pub(crate) mod driver;
pub mod exec;
pub mod kernels;
pub mod loader;
pub mod netplugin;
pub mod netproxy;
pub mod nvml;
pub mod ring;
pub mod topo;
mod transport;

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
