//! oxccl's host executor: collectives on host memory between threads of one
//! process, processes of one host (shared memory) and hosts (TCP).
//!
//! The pure core decides what each rank does ([`oxccl_core::schedule`],
//! [`oxccl_core::tuner`]) and moves bytes step by step
//! ([`oxccl_core::engine`]); this crate supplies the transports, the progress
//! loop that waits (observing abort, timeouts and peer liveness) and the
//! communicator that wires them together.

pub mod comm;
mod connect;
pub mod exec;
pub mod oneshot;
pub mod proxy_events;
pub mod stream_copy;
pub mod transport;

pub use comm::{run_group, run_group_unprofiled, HostComm, HostConfig, OpDesc};
