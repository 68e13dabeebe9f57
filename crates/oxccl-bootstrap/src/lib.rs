//! oxccl bootstrap: the unique id, the TCP rendezvous through a root,
//! challenge/response authentication, out-of-band collectives and
//! authenticated peer connections.
//!
//! # Flow
//!
//! 1. [`UniqueId::generate`] (`ncclGetUniqueId`) binds a listener on the
//!    selected interface ([`ifname`]) and starts the root in this process; the
//!    128-byte id ([`id`] documents the layout) carries the root's address, a
//!    random 32-byte secret and a random run id. With `NCCL_COMM_ID` the id
//!    carries that address and a derived secret instead, and rank 0's
//!    [`Bootstrap::init`] starts the root there.
//! 2. [`Bootstrap::init`]: every rank binds its own listener, connects to the
//!    root (refused connects are retried with backoff until `init_timeout`),
//!    authenticates, sends its rank, nranks, run id, listener
//!    address, host name, host hash, pid and process token. The root checks
//!    ranks and nranks; a violation reaches every connected rank as
//!    `InvalidUsage`; ranks that never arrive are named in a `Timeout` sent
//!    to everyone who did. Once all have joined, the root sends the table
//!    of all ranks to the top levels of the binary tree rooted at rank 0
//!    that fit in 128 MiB of tables (`root_table_budget`) and each other rank
//!    its parent's and children's entries; the table then goes down the
//!    tree, each rank forwarding it to its children (at most two), so the
//!    root's bytes grow linearly with `n` and the last rank has the table
//!    within `⌈log2 n⌉ + 1` rounds. A rank whose parent dies before
//!    forwarding fails naming it, and tells its own children.
//! 3. Afterwards ranks talk directly: [`Bootstrap::send`]/[`Bootstrap::recv`]
//!    (tagged messages), [`Bootstrap::allgather`] (a ring), [`Bootstrap::barrier`]
//!    and [`Bootstrap::broadcast`] (binary trees: O(log n) rounds, at most 3
//!    peers per rank), and
//!    [`Bootstrap::connect_peer`]/[`Bootstrap::accept_peer`] for data streams.
//!
//! # Security
//!
//! Every connection (to the root and between ranks) is mutually authenticated
//! with HMAC-SHA256 keyed by the id's secret before anything it sends is
//! parsed; the secret never crosses the wire. Ids from
//! [`UniqueId::generate`] carry a random secret; `NCCL_COMM_ID` ids derive it
//! from `OXCCL_AUTH_SECRET` (or `OXCCL_AUTH_SECRET_FILE`), and without one
//! from a public constant: such a job is open to anyone who can reach the
//! root, which is logged once at WARN, or refused with `auth_required`.
//!
//! Bounds: before authentication only fixed-size fields are read; every
//! listener (the root's, each rank's) admits connections in one poll loop
//! with at most 64 handshakes in flight, 3 s each, and no thread per
//! connection; drops are logged once, then summarised every 10 s. Frames are
//! capped before allocating (4 KiB for the first frame after the handshake,
//! 16 MiB for a message, the rank table by nranks), and each peer may queue
//! at most 32 MiB or 4096 unreceived messages at a rank.
//!
//! # Errors
//!
//! Every wait during init (the rendezvous and the communicator's own setup,
//! until [`Bootstrap::init_done`]) is limited by `init_timeout`, later ones by
//! `timeout`. A peer that dies is noticed within about half a second (see
//! [`Bootstrap`]) and named in the error. Timeouts are `Timeout`; an abort (the `abort` flag of [`BootstrapConfig`],
//! polled every 50 ms) is `Remote` with a message starting
//! "bootstrap: aborted"; a peer that closed or reset is `Remote`; mismatched
//! ranks/nranks or an id of another run are `InvalidUsage`; bad arguments are
//! `InvalidArgument`; OS failures are `System`.
//!
//! Parameters are passed in [`BootstrapConfig`]; this crate never reads the
//! environment for them.

mod auth;
mod bootstrap;
#[doc(hidden)]
pub mod fuzzing;
mod gate;
pub mod id;
pub mod ifname;
mod root;
mod route;
mod sys;
mod wire;

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use oxccl_core::{Error, Result};

pub use bootstrap::{select_interface, Bootstrap};
pub use id::{UniqueId, UNIQUE_ID_BYTES};
/// Every IPv4/IPv6 address of every interface (getifaddrs), for tools such as `oxccl doctor`.
pub use sys::interfaces;
/// Whether a process of this host has exited (zombies included), for
/// cleaning up after a peer that died.
pub use sys::process_gone;

/// The source of the fixed secret used with `NCCL_COMM_ID` when no
/// `OXCCL_AUTH_SECRET` is set (the id's secret is SHA-256 of these bytes).
pub const UNAUTHENTICATED_SECRET: &str = "oxccl-unauthenticated-v1";

/// An address family (`NCCL_SOCKET_FAMILY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// `AF_INET`.
    V4,
    /// `AF_INET6`.
    V6,
}

impl Family {
    /// `AF_INET` / `AF_INET6`.
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "AF_INET",
            Family::V6 => "AF_INET6",
        }
    }
}

impl FromStr for Family {
    type Err = Error;
    /// Accepts `AF_INET`/`AF_INET6` (case-insensitive; also `inet`/`inet6`, `ipv4`/`ipv6`, `4`/`6`).
    fn from_str(s: &str) -> Result<Family> {
        match s.trim().to_ascii_uppercase().as_str() {
            "AF_INET" | "INET" | "IPV4" | "4" => Ok(Family::V4),
            "AF_INET6" | "INET6" | "IPV6" | "6" => Ok(Family::V6),
            _ => Err(Error::invalid_argument(format!(
                "NCCL_SOCKET_FAMILY={s}: expected AF_INET or AF_INET6"
            ))),
        }
    }
}

/// Bootstrap settings, filled by the caller from the parameter registry.
#[derive(Debug, Clone)]
pub struct BootstrapConfig {
    /// `NCCL_SOCKET_IFNAME`: data connections ([`Bootstrap::connect_peer`]),
    /// and the bootstrap too unless `bootstrap_ifname` names its own.
    pub ifname: Option<String>,
    /// `OXCCL_BOOTSTRAP_IFNAME`: the interface of the rendezvous (the root and
    /// every rank's message listener) when it should differ from the data
    /// connections' (a management network beside the fast one). Same grammar.
    pub bootstrap_ifname: Option<String>,
    /// `NCCL_SOCKET_FAMILY`.
    pub family: Option<Family>,
    /// `NCCL_COMM_ID`.
    pub comm_id: Option<String>,
    /// `OXCCL_AUTH_SECRET` (used with `NCCL_COMM_ID`).
    pub auth_secret: Option<String>,
    /// `OXCCL_AUTH_SECRET_FILE`: a file whose contents (less one trailing
    /// newline) are the secret, when `auth_secret` is unset.
    pub auth_secret_file: Option<std::path::PathBuf>,
    /// `OXCCL_AUTH_REQUIRED`: refuse `NCCL_COMM_ID` without a secret (and any
    /// unique id whose secret is the public one) instead of warning.
    pub auth_required: bool,
    /// `NCCL_HOSTID`: names this host instead of hostname + boot id.
    pub host_id: Option<String>,
    /// Limit for the rendezvous (connecting to the root, waiting for all ranks).
    pub init_timeout: Duration,
    /// Limit for each operation after init (a `recv`, one allgather step...).
    pub timeout: Duration,
    /// Set to make every wait return `Remote("bootstrap: aborted ...")` within ~50 ms.
    pub abort: Arc<AtomicBool>,
    /// Bytes of rank tables the root sends at most (it sends one table
    /// whatever this says): the ranks past it get the table from their
    /// parent in the tree (`oxccl_core::peers::table_direct_ranks`). Only
    /// the root's process reads it. Default 128 MiB; not a setting of the
    /// environment (tests lower it to send every table down the tree).
    pub root_table_budget: usize,
}

impl Default for BootstrapConfig {
    fn default() -> Self {
        BootstrapConfig {
            ifname: None,
            bootstrap_ifname: None,
            family: None,
            comm_id: None,
            auth_secret: None,
            auth_secret_file: None,
            auth_required: false,
            host_id: None,
            init_timeout: Duration::from_secs(120),
            timeout: Duration::from_secs(600),
            abort: Arc::new(AtomicBool::new(false)),
            root_table_budget: oxccl_core::peers::ROOT_TABLE_BUDGET,
        }
    }
}

/// What the rendezvous tells every rank about every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The rank.
    pub rank: usize,
    /// Its host name (at most 255 bytes).
    pub hostname: String,
    /// Hash of host name and boot id: equal means same host.
    pub host_hash: u64,
    /// Its process id.
    pub pid: u32,
    /// A random number drawn once per process.
    pub process_token: u64,
    /// Its bootstrap listener.
    pub listen_addr: SocketAddr,
    /// Where its data connections arrive: `listen_addr`, or a listener of
    /// its own on the data interface when `bootstrap_ifname` chose another.
    pub data_addr: SocketAddr,
}
