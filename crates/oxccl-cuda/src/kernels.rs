//! The CUDA C++ sources in `kernels/`, compiled by NVRTC on first use.

/// Headers the sources `#include`, handed to NVRTC by name.
pub const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../kernels/common.cuh")),
    ("elem.cuh", include_str!("../kernels/elem.cuh")),
];

/// One `.cu` file: a program for NVRTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSource {
    /// File name (also the program's name and the cache file's stem).
    pub name: &'static str,
    /// The CUDA C++ text.
    pub source: &'static str,
}

/// The one-shot all-reduce family: `oxccl_ar1_<type>_<op>`, 12 types x 5 ops.
pub const ALLREDUCE: KernelSource = KernelSource {
    name: "allreduce.cu",
    source: include_str!("../kernels/allreduce.cu"),
};

/// `oxccl_copy(dst, src, bytes)`.
pub const COPY: KernelSource = KernelSource {
    name: "copy.cu",
    source: include_str!("../kernels/copy.cu"),
};

/// The ring collectives over FIFO connections, `oxccl_ring_<type>_<op>`
/// (12 types x 6 ops), and `oxccl_ring_p2p` (sends and receives of a group).
pub const RING: KernelSource = KernelSource {
    name: "ring.cu",
    source: include_str!("../kernels/ring.cu"),
};

/// Every program, for the compile-everything test.
pub const ALL: &[KernelSource] = &[ALLREDUCE, COPY, RING];
