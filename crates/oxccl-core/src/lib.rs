//! oxccl's pure core: data types, errors, the parameter registry, the tuner's
//! cost model, algorithm schedules and the reduction kernels.
//!
//! Nothing here does I/O or uses `unsafe`: every decision is a function of its
//! inputs, so it can be tested exhaustively and planned for any rank count on
//! a laptop. Executors (host, CUDA) and shells (Rust API, C ABI, CLI) sit above.
#![forbid(unsafe_code)]

pub mod algo;
pub mod elf;
pub mod engine;
pub mod error;
pub mod float;
pub mod gpu;
pub mod logfmt;
pub mod namelist;
pub mod params;
pub mod peers;
pub mod profiler_plugin;
pub mod reduce;
pub mod schedule;
pub mod slots;
pub mod suggest;
pub mod topo;
pub mod tuner;
pub mod tuner_plugin;
pub mod types;

pub use error::{Error, ErrorKind, Result};
pub use reduce::Reduction;
pub use types::{byte_len, CollKind, DataType, RedOp, Scalar};
