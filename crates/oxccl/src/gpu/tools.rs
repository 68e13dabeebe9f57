//! What oxccl's own tools use of the CUDA executor beyond collectives: the
//! driver and NVRTC probes (`oxccl doctor`, `oxccl perf`), device memory,
//! streams, events and graphs to time a run ([`timing`]: `oxccl perf`'s
//! CUDA backend, which drives a C ABI library through raw device pointers),
//! and the kernel prebuild (`oxccl kernels`). The tools reach the executor
//! only through here, so its internal layout can change under them; these
//! follow the executor's own shape and carry no stability promise.

/// Device memory, streams, events and graphs for timing (`oxccl perf`).
pub use oxccl_cuda::bench_gpu as timing;
/// Ring launches in this process whose kernel a tuner plugin's answer
/// chose (`NCCL_TUNER_PLUGIN`), for tests that check what a plugin forced.
pub use oxccl_cuda::exec::tuned_calls;
pub use oxccl_cuda::loader::{nvrtc, probe_driver, DriverInfo, NvrtcInfo, Unavailable};
pub use oxccl_cuda::{compile, kernels};
