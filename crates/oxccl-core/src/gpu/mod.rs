//! The GPU path's decisions, apart from the CUDA executor that acts on
//! them:
//!
//! - [`kernel`]: which kernel runs a collective, as types (collective ×
//!   algorithm × protocol), and the one table that turns a choice into the
//!   integer the kernels take;
//! - [`ring`]: the ring program's settings, thresholds, kernel plan, channel
//!   counts, what ranks sharing a GPU may launch, and the window layout;
//! - [`route`]: whether an operation takes the pair kernels or the ring;
//! - [`one_launch`]: one launch for every rank of a process (which calls, which
//!   group, the arguments and grid);
//! - [`copy_engine`], [`copy_engine_reduce`]: the copy-engine schedules of
//!   two GPUs (copies; reductions pulled through a scratch ring or pushed);
//! - [`two_process`]: the copy-engine protocol between two processes (the
//!   messages both ranks trade per call and the plans they agree on);
//! - [`pair`]: the grids of the two-GPU kernels of one process;
//! - [`config`]: the settings a device communicator reads once when it is
//!   created;
//! - [`rooted`]: the record ranks trade so that rooted collectives on
//!   device buffers whose roots differ are refused at the call;
//! - [`gdr`]: GPUDirect RDMA through a network plugin (GPU memory handed
//!   to the plugin, registered how, flushed or not);
//! - [`window`]: the ring windows' descriptors and the transport each
//!   peer's window is reached by (peer access, CUDA IPC, shared host
//!   memory, the network path).
//!
//! Nothing here touches CUDA: oxccl-cuda calls these functions and turns
//! their answers into launches, so every choice is tested without a GPU.

pub mod config;
pub mod copy_engine;
pub mod copy_engine_reduce;
pub mod gdr;
pub mod kernel;
pub mod one_launch;
pub mod pair;
pub mod ring;
pub mod rooted;
pub mod route;
pub mod tuning;
pub mod two_process;
pub mod window;

pub use kernel::{Collective, PairKernel, RingKernel};
