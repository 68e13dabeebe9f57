//! The GPU path's decisions, apart from the CUDA executor that acts on
//! them: which kernel runs a collective ([`kernel`]: collective ×
//! algorithm × protocol as types), the ring program's thresholds, channel
//! counts and window layout ([`ring`]), and the settings a device
//! communicator reads once when it is created ([`config`]).
//!
//! Nothing here touches CUDA: oxccl-cuda calls these functions and turns
//! their answers into launches, so every choice is tested without a GPU.

pub mod config;
pub mod joint;
pub mod kernel;
pub mod ring;

pub use kernel::{Collective, PairKernel, RingKernel};
