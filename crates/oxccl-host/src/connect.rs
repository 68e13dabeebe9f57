//! Connecting a rank to its peers: at creation to the few that the bounded
//! collectives need ([`oxccl_core::peers::init_peers`]), later to any other
//! on the first operation that talks to it.
//!
//! Both ends of a pair connect in the same call (the operation that needs
//! the pair runs on both), in three passes over every communicator of the
//! call, so that no two ranks wait on each other in a cycle, whatever the
//! order of the pairs or of the communicators of a group:
//!
//! 1. the lower rank of each pair dials the control and data connections
//!    (the peer's listener thread takes them; no wait on the peer) and, for
//!    shared memory, makes its segment and writes the segment's name;
//! 2. the higher rank accepts them (waiting only for pass 1 of the lower),
//!    makes its segment, writes its name and opens the lower's;
//! 3. the lower rank reads the higher's name (written in pass 2) and opens it.
//!
//! A network plugin's connections (`net_connect`) need both ends at once:
//! they are made in pass 2 by the higher rank and in pass 3 by the lower,
//! pair by pair in ascending order on both. Threads of one process share no
//! handshake at all: the first of the two to arrive makes both ends and
//! leaves the other's in a registry.
//!
//! Each shared-memory pair has two segments of its own (each end's receive
//! rings), unlinked by the peer that opens them: a rank's memory grows with
//! the peers it talks to, never with the rank count. Every wait observes the
//! abort flag and the bootstrap's timeout and names the peer.

use crate::transport::{
    inproc_pair, net_connect, net_link, shm_link, tcp_link, LinkKind, PeerControl, PeerLink,
    RecvHalf, SendHalf, ShmRingLayout, ShmSegment,
};
use oxccl_bootstrap::Bootstrap;
use oxccl_core::{Error, Result};
use oxccl_env::Subsys;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub(crate) const TAG_CONTROL: u32 = 0x100;
pub(crate) const TAG_DATA: u32 = 0x200;

/// In-process link ends waiting for their owner: (comm key, holder, peer) → link.
type InprocRegistry = Mutex<HashMap<(u64, usize, usize), PeerLink>>;

fn inproc_registry() -> &'static InprocRegistry {
    static R: OnceLock<InprocRegistry> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Drops the in-process link ends left for `rank` of communicator `key`
/// that it never took (peers that connected to it first): their peers then
/// see it gone.
pub(crate) fn forget_inproc_ends(key: u64, rank: usize) {
    if let Ok(mut reg) = inproc_registry().lock() {
        reg.retain(|&(k, holder, _), _| !(k == key && holder == rank));
    }
}

/// What a rank needs to connect to any peer, at creation or on first use.
pub(crate) struct Connector {
    pub rank: usize,
    pub nranks: usize,
    /// Shared by the communicator's ranks: keys the in-process registry.
    pub key: u64,
    /// Put in shared-memory segment names, so that a failed init finds
    /// every segment of the communicator.
    pub seg_hint: String,
    /// How each peer is reached (None for this rank).
    pub kinds: Vec<Option<LinkKind>>,
    /// Streams per peer (collective plus point-to-point channels).
    pub nch: usize,
    /// Bytes of each stream's ring.
    pub cap: usize,
    pub link_timeout: Duration,
    /// The network plugin and the device of each stream
    /// ([`crate::transport::net::channel_devices`]).
    pub plugin: Option<(Arc<dyn oxccl_net::Net>, Vec<usize>)>,
    pub net_slot: Option<usize>,
}

/// A pair under way after pass 1 on the lower rank.
struct Dialed {
    peer: usize,
    control: TcpStream,
    data: Vec<TcpStream>,
    segment: Option<Arc<ShmSegment>>,
}

/// One communicator's connections to make in one call.
pub(crate) struct Connecting<'a> {
    conn: &'a Connector,
    boot: &'a Bootstrap,
    abort: &'a AtomicBool,
    peers: Vec<usize>,
    dialed: Vec<Dialed>,
    done: Vec<Option<PeerLink>>,
}

impl<'a> Connecting<'a> {
    /// Connections to `peers` (any order, duplicates and this rank ignored).
    pub fn new(
        conn: &'a Connector,
        boot: &'a Bootstrap,
        abort: &'a AtomicBool,
        peers: &[usize],
    ) -> Connecting<'a> {
        let mut peers: Vec<usize> = peers
            .iter()
            .copied()
            .filter(|&q| q != conn.rank && q < conn.nranks)
            .collect();
        peers.sort_unstable();
        peers.dedup();
        Connecting {
            conn,
            boot,
            abort,
            peers,
            dialed: Vec::new(),
            done: Vec::new(),
        }
    }

    fn kind(&self, q: usize) -> Result<LinkKind> {
        self.conn.kinds.get(q).copied().flatten().ok_or_else(|| {
            Error::internal(format!(
                "rank {}: no transport for rank {q}",
                self.conn.rank
            ))
        })
    }

    fn who(&self, q: usize) -> String {
        let p = &self.boot.peers()[q];
        format!("rank {q} (pid {} on {})", p.pid, p.hostname)
    }

    fn context(&self, q: usize) -> impl Fn(Error) -> Error {
        let what = format!(
            "connecting to rank {q} via {}",
            self.conn
                .kinds
                .get(q)
                .copied()
                .flatten()
                .map_or("?", |k| k.name())
        );
        move |e: Error| e.context(&what)
    }

    /// `e`, or the notice of a peer that gave up first; an abort of this
    /// rank keeps `e`, which names the peer waited on.
    fn explain(&self, e: Error) -> Error {
        if self.abort.load(Ordering::Acquire) {
            e
        } else {
            self.boot.explain_failure(e)
        }
    }

    /// Pass 1: in-process pairs, and the lower rank's dials.
    fn pass_dial(&mut self) -> Result<()> {
        let rank = self.conn.rank;
        for q in self.peers.clone() {
            let ctx = self.context(q);
            let kind = self.kind(q)?;
            if kind == LinkKind::InProc {
                let link = self.inproc(q).map_err(&ctx)?;
                self.done.push(Some(link));
                continue;
            }
            if rank > q {
                continue;
            }
            let control = self.boot.connect_peer(q, TAG_CONTROL).map_err(&ctx)?;
            let mut data = Vec::new();
            if kind == LinkKind::Tcp {
                for c in 0..self.conn.nch {
                    data.push(
                        self.boot
                            .connect_peer(q, TAG_DATA + c as u32)
                            .map_err(&ctx)?,
                    );
                }
            }
            let mut d = Dialed {
                peer: q,
                control,
                data,
                segment: None,
            };
            if kind == LinkKind::Shm {
                let seg = self.segment().map_err(&ctx)?;
                write_name(&mut d.control, seg.name(), q).map_err(&ctx)?;
                d.segment = Some(seg);
            }
            self.dialed.push(d);
        }
        Ok(())
    }

    /// Pass 2: the higher rank accepts and completes its pairs.
    fn pass_accept(&mut self) -> Result<()> {
        let rank = self.conn.rank;
        for q in self.peers.clone() {
            let kind = self.kind(q)?;
            if kind == LinkKind::InProc || rank < q {
                continue;
            }
            let ctx = self.context(q);
            let mut control = self
                .boot
                .accept_peer_or_stop(q, TAG_CONTROL, Some(self.abort))
                .map_err(&ctx)?;
            let mut data = Vec::new();
            let mut segment = None;
            match kind {
                LinkKind::Tcp => {
                    for c in 0..self.conn.nch {
                        data.push(
                            self.boot
                                .accept_peer_or_stop(q, TAG_DATA + c as u32, Some(self.abort))
                                .map_err(&ctx)?,
                        );
                    }
                }
                LinkKind::Shm => {
                    let seg = self.segment().map_err(&ctx)?;
                    write_name(&mut control, seg.name(), q).map_err(&ctx)?;
                    segment = Some(seg);
                }
                _ => {}
            }
            let link = self
                .finish(Dialed {
                    peer: q,
                    control,
                    data,
                    segment,
                })
                .map_err(&ctx)?;
            self.done.push(Some(link));
        }
        Ok(())
    }

    /// Pass 3: the lower rank completes the pairs it dialed.
    fn pass_finish(&mut self) -> Result<()> {
        // Pairs not reached yet stay in `dialed` when one fails: their
        // segments (unlinked when dropped) live until the failure has been
        // explained, so peers still opening them fail on the cause, not on
        // a missing segment.
        while !self.dialed.is_empty() {
            let d = self.dialed.remove(0);
            let ctx = self.context(d.peer);
            let link = self.finish(d).map_err(&ctx)?;
            self.done.push(Some(link));
        }
        Ok(())
    }

    /// Both ends' last step: the peer's segment opened (shared memory), the
    /// plugin's connections made (network), the link assembled.
    fn finish(&self, d: Dialed) -> Result<PeerLink> {
        let q = d.peer;
        let kind = self.kind(q)?;
        let Dialed {
            peer: _,
            mut control,
            data,
            segment,
        } = d;
        let theirs = if kind == LinkKind::Shm {
            let name = read_name(&mut control, q, self.boot.wait_timeout(), self.abort)?;
            let seg = ShmSegment::open_rings(&name, self.layout()).map_err(|e| {
                // Its creator unlinks it when it gives up (or its init's
                // cleanup does): the peer's failure, not this rank's.
                let gone = !std::path::Path::new("/dev/shm")
                    .join(name.trim_start_matches('/'))
                    .exists();
                if gone {
                    Error::remote(format!(
                        "rank {q} removed its shared-memory segment before this rank opened it (it gave up or exited): {}",
                        e.message()
                    ))
                } else {
                    e
                }
            })?;
            // This rank is its only opener: the name can go (the mapping stays).
            crate::transport::shm::unlink_name(&name)?;
            Some(seg)
        } else {
            None
        };
        let mut control = PeerControl::socket(q, control, self.who(q))?;
        control.set_link_timeout(self.conn.link_timeout);
        Ok(match kind {
            LinkKind::Shm => {
                let (Some(mine), Some(theirs)) = (segment, theirs) else {
                    return Err(Error::internal("shared-memory pair without its segments"));
                };
                shm_link(q, &mine, 0, &theirs, 0, control)?
            }
            LinkKind::Net => {
                let (net, devs) = self
                    .conn
                    .plugin
                    .as_ref()
                    .ok_or_else(|| Error::internal("net peer without a plugin"))?;
                if devs.len() != self.conn.nch {
                    return Err(Error::internal(format!(
                        "{} plugin devices for {} streams",
                        devs.len(),
                        self.conn.nch
                    )));
                }
                let slot = self
                    .conn
                    .net_slot
                    .ok_or_else(|| Error::internal("net peer without a slot size"))?;
                let conns = net_connect(
                    net,
                    devs,
                    self.boot,
                    q,
                    self.boot.wait_timeout(),
                    self.abort,
                )?;
                net_link(q, net, conns, control, slot)?
            }
            _ => {
                for s in &data {
                    crate::transport::tcp::set_link_timeout(s, self.conn.link_timeout);
                }
                tcp_link(q, data, control, self.conn.cap.max(1 << 20))?
            }
        })
    }

    /// This rank's receive rings from one peer.
    fn layout(&self) -> ShmRingLayout {
        ShmRingLayout {
            npeers: 1,
            nchannels: self.conn.nch,
            capacity: self.conn.cap,
        }
    }

    fn segment(&self) -> Result<Arc<ShmSegment>> {
        ShmSegment::create_rings_named(self.layout(), &self.conn.seg_hint).map_err(|e| {
            e.context(format!(
                "shared-memory rings ({} channels of {} bytes)",
                self.conn.nch, self.conn.cap
            ))
        })
    }

    /// This rank's end of the in-process pair with `q`: taken from the
    /// registry when `q` came first, else made with `q`'s end left there.
    fn inproc(&self, q: usize) -> Result<PeerLink> {
        let (key, rank) = (self.conn.key, self.conn.rank);
        let mut reg = inproc_registry()
            .lock()
            .map_err(|_| Error::internal("inproc registry poisoned"))?;
        if let Some(mine) = reg.remove(&(key, rank, q)) {
            return Ok(mine);
        }
        let (a, b) = if rank < q {
            inproc_pair(rank, q, self.conn.nch, self.conn.cap)?
        } else {
            let (b, a) = inproc_pair(q, rank, self.conn.nch, self.conn.cap)?;
            (a, b)
        };
        reg.insert((key, q, rank), b);
        Ok(a)
    }
}

/// Makes the connections of several communicators (one call or group on
/// this thread) in the three passes of the module docs; returns each one's
/// links. On error the links made so far are dropped (their peers see them
/// closed).
pub(crate) fn connect_peers(comms: &mut [Connecting<'_>]) -> Result<Vec<Vec<Option<PeerLink>>>> {
    // A peer that gave up (init: its settings differ) closes its
    // connections: its notice, not the reset, is the error.
    for c in comms.iter_mut() {
        c.pass_dial().map_err(|e| c.explain(e))?;
    }
    for c in comms.iter_mut() {
        c.pass_accept().map_err(|e| c.explain(e))?;
    }
    for c in comms.iter_mut() {
        c.pass_finish().map_err(|e| c.explain(e))?;
    }
    Ok(comms
        .iter_mut()
        .map(|c| std::mem::take(&mut c.done))
        .collect())
}

/// Puts a link's streams and control in a communicator's per-peer tables.
pub(crate) fn install(
    tx: &mut [Vec<Box<dyn SendHalf>>],
    rx: &mut [Vec<Box<dyn RecvHalf>>],
    controls: &mut [Option<PeerControl>],
    link: PeerLink,
) {
    let q = link.peer;
    tx[q] = link.send;
    rx[q] = link.recv;
    controls[q] = Some(link.control);
}

/// Longest shared-memory segment name exchanged (names are about 50 bytes).
const NAME_MAX: usize = 255;

fn write_name(s: &mut TcpStream, name: &str, peer: usize) -> Result<()> {
    let b = name.as_bytes();
    if b.len() > NAME_MAX {
        return Err(Error::internal(format!("segment name {name} is too long")));
    }
    let mut frame = Vec::with_capacity(1 + b.len());
    frame.push(b.len() as u8);
    frame.extend_from_slice(b);
    // A few bytes on a fresh connection: the socket buffer takes them at once.
    s.set_write_timeout(Some(Duration::from_secs(10)))
        .and_then(|()| s.write_all(&frame))
        .map_err(|e| {
            Error::remote(format!(
                "sending a shared-memory segment name to rank {peer}: {e}"
            ))
        })
}

fn read_name(
    s: &mut TcpStream,
    peer: usize,
    limit: Duration,
    abort: &AtomicBool,
) -> Result<String> {
    let mut len = [0u8; 1];
    read_within(s, &mut len, peer, limit, abort)?;
    let mut name = vec![0u8; usize::from(len[0])];
    read_within(s, &mut name, peer, limit, abort)?;
    String::from_utf8(name).map_err(|_| {
        Error::remote(format!(
            "rank {peer} sent a shared-memory segment name that is not UTF-8"
        ))
    })
}

/// Fills `buf` from `s` within `limit`, in reads of at most 50 ms so that
/// an abort is seen.
fn read_within(
    s: &mut TcpStream,
    buf: &mut [u8],
    peer: usize,
    limit: Duration,
    abort: &AtomicBool,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    s.set_read_timeout(Some(Duration::from_millis(50)))
        .map_err(|e| Error::system(format!("connection to rank {peer}: {e}")))?;
    let mut got = 0;
    while got < buf.len() {
        if abort.load(Ordering::Acquire) {
            return Err(Error::remote(format!(
                "connecting to rank {peer}: aborted (ncclCommAbort or ncclCommRevoke)"
            )));
        }
        match s.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(Error::remote(format!(
                    "rank {peer} closed the connection before answering (it exited, failed or destroyed its communicator)"
                )))
            }
            Ok(k) => got += k,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                if Instant::now() >= deadline {
                    return Err(Error::timeout(format!(
                        "rank {peer} did not answer within {:.1} s (OXCCL_TIMEOUT_MS)",
                        limit.as_secs_f64()
                    )));
                }
            }
            Err(e) => {
                return Err(Error::remote(format!(
                    "connection to rank {peer} failed: {e}"
                )))
            }
        }
    }
    s.set_read_timeout(None)
        .map_err(|e| Error::system(format!("connection to rank {peer}: {e}")))
}

/// Logs a connection made on first use.
pub(crate) fn log_lazy(rank: usize, link: &PeerLink) {
    oxccl_env::info!(
        Subsys::INIT,
        "rank {rank}: connected to rank {} via {} on first use",
        link.peer,
        link.kind
    );
}
