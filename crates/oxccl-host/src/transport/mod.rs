//! Host transports: for each peer, `nchannels` ordered byte streams in each
//! direction (in-process rings, shared-memory rings, TCP sockets) and a
//! [`PeerControl`] for liveness and poisoning. See ADR 0001.
//!
//! All stream byte counts are multiples of 8 and ring capacities are
//! multiples of 8, so an element never straddles a wrap point.

pub mod control;
pub mod inproc;
pub mod net;
pub mod ring;
pub mod shm;
mod sys;
pub mod tcp;

pub use control::PeerControl;
pub use inproc::inproc_pair;
pub use net::{net_connect, net_link};
pub use shm::{shm_link, ShmRingLayout, ShmSegment};
pub use tcp::tcp_link;

// The stream halves are the core engine's traits: the engine polls them and
// every transport implements them (one definition, see ADR 0001).
pub use oxccl_core::engine::{RecvHalf, SendHalf};

/// How a peer is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// Another thread of this process (heap rings).
    InProc,
    /// Another process of this host (shared-memory rings).
    Shm,
    /// Another host (TCP sockets).
    Tcp,
    /// Another host through a network plugin (`NCCL_NET_PLUGIN`).
    Net,
}

impl LinkKind {
    /// The name used in logs ("via SHM", "via NET/Socket").
    pub fn name(self) -> &'static str {
        match self {
            LinkKind::InProc => "P2P/inproc",
            LinkKind::Shm => "SHM",
            LinkKind::Tcp => "NET/Socket",
            LinkKind::Net => "NET/Plugin",
        }
    }
}

impl std::fmt::Display for LinkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything one rank has to talk to one peer.
pub struct PeerLink {
    /// The peer's rank.
    pub peer: usize,
    /// How the peer is reached.
    pub kind: LinkKind,
    /// One sending half per channel.
    pub send: Vec<Box<dyn SendHalf>>,
    /// One receiving half per channel.
    pub recv: Vec<Box<dyn RecvHalf>>,
    /// Liveness and poisoning of the peer.
    pub control: PeerControl,
}

impl PeerLink {
    /// The number of channels (streams in each direction).
    pub fn nchannels(&self) -> usize {
        self.send.len()
    }
}

impl std::fmt::Debug for PeerLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerLink")
            .field("peer", &self.peer)
            .field("kind", &self.kind)
            .field("nchannels", &self.send.len())
            .field("control", &self.control)
            .finish()
    }
}
