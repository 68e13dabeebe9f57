//! The process's environment: parameters and logs.
//!
//! Thin I/O around the pure registry in `oxccl_core`: it reads the
//! environment and configuration files once, and writes `NCCL_DEBUG` lines.

pub mod log;

pub use log::{Level, Subsys};
