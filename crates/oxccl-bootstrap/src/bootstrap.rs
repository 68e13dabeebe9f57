//! The std::net driver: id generation, `Bootstrap::init`, out-of-band
//! collectives and authenticated peer connections.
//!
//! Each `Bootstrap` owns a listener on the selected interface and an accept
//! thread. Every incoming connection is authenticated on its own short-lived
//! thread, then says what it is in a hello frame:
//! - a *message channel*: the sender's persistent connection for
//!   `send`/`allgather`/`barrier`; the thread stays and files each message in
//!   a mailbox keyed by (peer, namespace, tag), so `send` never waits for the
//!   receiver to call `recv` (no send/send deadlock), and different tags never
//!   block each other;
//! - a *data connection* (`connect_peer`): parked under (peer, tag) until
//!   `accept_peer` asks for it.
//!
//! Outgoing message channels are opened on first use and kept per peer.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr, SocketAddrV6, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use oxccl_core::{Error, ErrorKind, Result};
use oxccl_env::log::Waiting;
use oxccl_env::{info, warn, Subsys};

use crate::auth::{self, HandshakeError};
use crate::id::{derived_secret, parse_comm_id, UniqueId};
use crate::root::{self, decode_table, Join, HANDSHAKE_TIMEOUT};
use crate::wire::{self, Dec, Enc, Limits, CTRL_CAP, DATA_CAP, MAX_FRAME, POLL};
use crate::{ifname, sys, BootstrapConfig, PeerInfo};

const NS_USER: u8 = 0;
const NS_ALLGATHER: u8 = 1;
const NS_BARRIER: u8 = 2;
const KIND_MSG: u8 = 0;
const KIND_DATA: u8 = 1;
/// Extra time a rank waits for the root's own timeout message.
const ROOT_GRACE: Duration = Duration::from_secs(1);

/// Selects the interface of the rendezvous per `cfg` (see [`ifname`]):
/// `bootstrap_ifname`, else `ifname`.
pub fn select_interface(cfg: &BootstrapConfig) -> Result<ifname::Selection> {
    select_from(&sys::interfaces()?, cfg)
}

/// [`select_interface`] over an interface list already read.
fn select_from(list: &[ifname::Interface], cfg: &BootstrapConfig) -> Result<ifname::Selection> {
    match &cfg.bootstrap_ifname {
        Some(b) => ifname::select_for("OXCCL_BOOTSTRAP_IFNAME", list, Some(b), cfg.family),
        None => ifname::select(list, cfg.ifname.as_deref(), cfg.family),
    }
}

/// The interface of the data connections, when it differs from the
/// rendezvous': only with `bootstrap_ifname` set and `ifname` choosing
/// another address of `list` (the one the rendezvous was chosen from).
/// `None`: data connections share the bootstrap listener.
fn select_data_interface(
    cfg: &BootstrapConfig,
    list: &[ifname::Interface],
    boot: &ifname::Selection,
) -> Result<Option<ifname::Selection>> {
    if cfg.bootstrap_ifname.is_none() {
        return Ok(None);
    }
    let sel = ifname::select(list, cfg.ifname.as_deref(), cfg.family)?;
    Ok((sel.iface.addr != boot.iface.addr).then_some(sel))
}

/// Binds a listener on the selected interface address (never the wildcard),
/// port 0, and logs "`what`: Using NAME:ADDR<PORT>".
fn bind_on(sel: &ifname::Selection, what: &str) -> Result<TcpListener> {
    let f = &sel.iface;
    let addr = match f.addr {
        IpAddr::V4(_) => SocketAddr::new(f.addr, 0),
        IpAddr::V6(ip) => SocketAddr::V6(SocketAddrV6::new(ip, 0, 0, f.scope_id)),
    };
    let l = TcpListener::bind(addr).map_err(|e| {
        Error::system(format!(
            "{}: cannot listen on {} ({}): {e}",
            what.to_ascii_lowercase(),
            f.addr,
            f.name
        ))
    })?;
    let port = l.local_addr().map(|a| a.port()).unwrap_or(0);
    info!(
        Subsys::BOOTSTRAP,
        "{what}: Using {}:{}<{port}>", f.name, f.addr
    );
    info!(Subsys::BOOTSTRAP, "{what}: {} {}", f.name, sel.reason);
    Ok(l)
}

/// The rendezvous listener, on [`select_interface`]'s address chosen from
/// `list`.
fn bind_selected(
    cfg: &BootstrapConfig,
    list: &[ifname::Interface],
) -> Result<(TcpListener, ifname::Selection)> {
    let sel = select_from(list, cfg)?;
    Ok((bind_on(&sel, "Bootstrap")?, sel))
}

fn random_u64() -> Result<u64> {
    let n = auth::nonce()?;
    Ok(u64::from_le_bytes(n[..8].try_into().expect("8")))
}

impl UniqueId {
    /// `ncclGetUniqueId`. Without `cfg.comm_id`: binds a listener on the
    /// selected interface and starts the root in this process (it serves one
    /// rendezvous, then exits). With `cfg.comm_id`: encodes that address with
    /// a derived secret and starts nothing; rank 0's `init` starts the root.
    pub fn generate(cfg: &BootstrapConfig) -> Result<UniqueId> {
        if let Some(c) = &cfg.comm_id {
            let addr = parse_comm_id(c, cfg.family)?;
            if cfg.auth_secret.is_none() {
                info!(
                    Subsys::BOOTSTRAP,
                    "bootstrap: NCCL_COMM_ID={c} without OXCCL_AUTH_SECRET: the rendezvous is unauthenticated (anyone who can reach {addr} can join)"
                );
            }
            return Ok(UniqueId::for_comm_id(
                addr,
                &derived_secret(cfg.auth_secret.as_deref()),
            ));
        }
        let (l, _) = bind_selected(cfg, &sys::interfaces()?)?;
        let addr = l
            .local_addr()
            .map_err(|e| Error::system(format!("bootstrap: local_addr failed: {e}")))?;
        let secret = auth::nonce()?;
        let run_id = random_u64()?;
        root::spawn_root(l, secret, run_id, cfg.init_timeout, cfg.abort.clone())?;
        Ok(UniqueId::new(addr, run_id, &secret, 0))
    }
}

#[derive(Default)]
struct Mail {
    msgs: HashMap<(usize, u8, u32), VecDeque<Vec<u8>>>,
    streams: HashMap<(usize, u32), VecDeque<TcpStream>>,
    /// Peers whose message channel to us ended, and why.
    closed: HashMap<usize, String>,
}

struct Shared {
    mail: Mutex<Mail>,
    cv: Condvar,
    stop: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Mail> {
        self.mail.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A rank's bootstrap: the peer table, out-of-band collectives and peer connections.
///
/// Methods take `&self`. `send`, `recv`, `connect_peer` and `accept_peer` may be
/// called from several threads; `allgather` and `barrier` are serialised by an
/// internal lock, and like any collective must be called in the same order on
/// every rank. Intended use is one thread at a time per `Bootstrap`.
///
/// Every wait observes `cfg.timeout` (after init) and `cfg.abort`, polled every
/// 50 ms. Dropping a `Bootstrap` closes its listener and connections; peers
/// blocked in `recv` from it then fail with a `Remote` error.
pub struct Bootstrap {
    rank: usize,
    nranks: usize,
    peers: Vec<PeerInfo>,
    cfg: BootstrapConfig,
    key: [u8; 32],
    run_id: u64,
    shared: Arc<Shared>,
    out: Mutex<HashMap<usize, TcpStream>>,
    coll: Mutex<()>,
    /// The rendezvous listener's accept thread, and the data listener's
    /// when there is one.
    acceptors: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bootstrap")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("run_id", &format_args!("{:#018x}", self.run_id))
            .finish_non_exhaustive()
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.cv.notify_all();
        for h in self.acceptors.drain(..) {
            let _ = h.join();
        }
    }
}

fn handshake_error(e: HandshakeError, who: &str, addr: SocketAddr, root: bool) -> Error {
    match e {
        HandshakeError::Rejected | HandshakeError::BadProof if root => Error::invalid_usage(
            format!("bootstrap: the root at {addr} did not accept this unique id (it belongs to another run?)"),
        ),
        HandshakeError::Rejected | HandshakeError::BadProof => Error::invalid_usage(format!(
            "bootstrap: {who} at {addr} failed mutual authentication (it holds another unique id's secret)"
        )),
        HandshakeError::NotOxccl => Error::invalid_usage(format!(
            "bootstrap: {who} at {addr} is not an oxccl bootstrap endpoint (wrong NCCL_COMM_ID, or a stale unique id whose port was reused?)"
        )),
        HandshakeError::Io(e) => e.context(format!("bootstrap: handshake with {who} at {addr}")),
    }
}

/// Connects within `lim`, in attempts of at most 1 s so an abort is seen.
/// With `retry_refused` (during init: the root may not be listening yet) a
/// refused connect is retried with backoff from 10 ms to 500 ms; without it (after
/// init every rank's listener exists, so a refusal means the peer is gone) it
/// is a `Remote` error at once.
fn connect_retry(
    addr: SocketAddr,
    lim: &Limits,
    who: &str,
    retry_refused: bool,
) -> Result<TcpStream> {
    let mut backoff = Duration::from_millis(10);
    let mut waiting = Waiting::new(Subsys::BOOTSTRAP);
    loop {
        let left = lim
            .remaining()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        let last = match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(1))) {
            Ok(s) => return Ok(s),
            Err(e) => e,
        };
        let refused = last.kind() == std::io::ErrorKind::ConnectionRefused;
        if refused && !retry_refused {
            return Err(Error::remote(format!(
                "bootstrap: {who} at {addr} refused the connection (did it exit or destroy its communicator?)"
            )));
        }
        let pause = if refused || retry_refused {
            backoff
        } else {
            Duration::ZERO
        };
        waiting.tick(lim.timeout, || {
            format!("bootstrap: waiting to connect to {who} at {addr} (last error: {last})")
        });
        let until = Instant::now() + pause;
        loop {
            if let Err(e) = lim.check() {
                return Err(if e.kind() == ErrorKind::Timeout {
                    Error::timeout(format!(
                        "bootstrap: could not connect to {who} at {addr} within {} (last error: {last}); is it running and reachable from this host?",
                        wire::secs(lim.timeout)
                    ))
                } else {
                    e
                });
            }
            let now = Instant::now();
            if now >= until {
                break;
            }
            std::thread::sleep((until - now).min(POLL));
        }
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

impl Bootstrap {
    /// Joins the rendezvous of `id` as `rank` of `nranks` (see the crate docs).
    pub fn init(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        cfg: &BootstrapConfig,
    ) -> Result<Bootstrap> {
        if nranks == 0 {
            return Err(Error::invalid_argument(
                "bootstrap: nranks must be at least 1 (got 0)",
            ));
        }
        if nranks > i32::MAX as usize {
            return Err(Error::invalid_argument(format!(
                "bootstrap: nranks={nranks} is too large"
            )));
        }
        if rank >= nranks {
            return Err(Error::invalid_argument(format!(
                "bootstrap: rank {rank} is out of range for nranks={nranks} (ranks are 0..={})",
                nranks - 1
            )));
        }
        let start = Instant::now();
        // One reading of the interfaces serves both choices.
        let interfaces = sys::interfaces()?;
        let (listener, sel) = bind_selected(cfg, &interfaces)?;
        let local = |l: &TcpListener| {
            l.local_addr()
                .map_err(|e| Error::system(format!("bootstrap: local_addr failed: {e}")))
        };
        let listen_addr = local(&listener)?;
        let data_listener = match select_data_interface(cfg, &interfaces, &sel)? {
            Some(d) => Some(bind_on(&d, "Bootstrap data connections")?),
            None => None,
        };
        let data_addr = match &data_listener {
            Some(l) => local(l)?,
            None => listen_addr,
        };
        let shared = Arc::new(Shared {
            mail: Mutex::new(Mail::default()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let key = *id.secret();
        let run_id = id.run_id();
        let mut acceptors = vec![spawn_acceptor(
            listener,
            Accepts::Everything,
            key,
            run_id,
            nranks,
            shared.clone(),
            cfg.abort.clone(),
        )?];
        if let Some(l) = data_listener {
            acceptors.push(spawn_acceptor(
                l,
                Accepts::DataOnly,
                key,
                run_id,
                nranks,
                shared.clone(),
                cfg.abort.clone(),
            )?);
        }
        let mut boot = Bootstrap {
            rank,
            nranks,
            peers: Vec::new(),
            cfg: cfg.clone(),
            key,
            run_id,
            shared,
            out: Mutex::new(HashMap::new()),
            coll: Mutex::new(()),
            acceptors,
        };
        if id.rank0_starts_root() && rank == 0 {
            let addr = id.root_addr();
            let l = TcpListener::bind(addr).map_err(|e| {
                Error::system(format!(
                    "bootstrap: rank 0 cannot start the root at {addr} (NCCL_COMM_ID): {e}; the address must be one of this host's and the port free"
                ))
            })?;
            info!(
                Subsys::BOOTSTRAP,
                "bootstrap: rank 0 started the root at {addr}"
            );
            root::spawn_root(l, key, run_id, cfg.init_timeout, cfg.abort.clone())?;
        }
        let me = PeerInfo {
            rank,
            hostname: sys::hostname(),
            host_hash: sys::host_hash(cfg.host_id.as_deref()),
            pid: std::process::id(),
            process_token: sys::process_token(),
            listen_addr,
            data_addr,
        };
        boot.peers = join_root(id, nranks, me, cfg, start)?;
        Ok(boot)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Every rank's information, in rank order.
    pub fn peers(&self) -> &[PeerInfo] {
        &self.peers
    }

    /// Whether `peer` runs on this host (same host hash); false when out of range.
    pub fn is_same_host(&self, peer: usize) -> bool {
        self.peers
            .get(peer)
            .is_some_and(|p| p.host_hash == self.peers[self.rank].host_hash)
    }

    /// Whether `peer` runs in this process (same host, pid and process token);
    /// false when out of range.
    pub fn is_same_process(&self, peer: usize) -> bool {
        let b = &self.peers[self.rank];
        self.peers.get(peer).is_some_and(|a| {
            a.host_hash == b.host_hash && a.pid == b.pid && a.process_token == b.process_token
        })
    }

    fn check_peer(&self, peer: usize, what: &str) -> Result<()> {
        if peer >= self.nranks {
            return Err(Error::invalid_argument(format!(
                "bootstrap {what}: peer {peer} is out of range for nranks={}",
                self.nranks
            )));
        }
        Ok(())
    }

    fn limits(&self) -> Limits<'_> {
        Limits::new(self.cfg.timeout, &self.cfg.abort)
    }

    /// Opens an authenticated connection to `peer` and sends the hello.
    fn dial(&self, peer: usize, kind: u8, tag: u32, lim: &Limits) -> Result<TcpStream> {
        let p = &self.peers[peer];
        let addr = if kind == KIND_DATA {
            p.data_addr
        } else {
            p.listen_addr
        };
        let who = format!("rank {peer}");
        let mut s = connect_retry(addr, lim, &who, false)?;
        wire::prepare(&s)?;
        auth::client(&mut s, &self.key, lim).map_err(|e| handshake_error(e, &who, addr, false))?;
        let hello = encode_hello(self.rank, self.run_id, kind, tag);
        wire::write_frame(&mut s, &hello, lim)?;
        Ok(s)
    }

    fn send_ns(&self, peer: usize, ns: u8, tag: u32, data: &[u8]) -> Result<()> {
        if data.len() > DATA_CAP {
            return Err(Error::invalid_argument(format!(
                "bootstrap: message of {} bytes exceeds the {} MiB limit",
                data.len(),
                DATA_CAP >> 20
            )));
        }
        if peer == self.rank {
            let mut g = self.shared.lock();
            g.msgs
                .entry((peer, ns, tag))
                .or_default()
                .push_back(data.to_vec());
            self.shared.cv.notify_all();
            return Ok(());
        }
        let lim = self.limits();
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let s = match out.entry(peer) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(self.dial(peer, KIND_MSG, 0, &lim)?)
            }
        };
        if let Err(e) = wire::write_frame(s, &encode_message(ns, tag, data), &lim) {
            out.remove(&peer);
            return Err(e);
        }
        Ok(())
    }

    fn recv_ns(&self, peer: usize, ns: u8, tag: u32) -> Result<Vec<u8>> {
        let lim = self.limits();
        let mut waiting = Waiting::new(Subsys::BOOTSTRAP);
        let mut g = self.shared.lock();
        loop {
            if let Some(q) = g.msgs.get_mut(&(peer, ns, tag)) {
                if let Some(m) = q.pop_front() {
                    if q.is_empty() {
                        g.msgs.remove(&(peer, ns, tag));
                    }
                    return Ok(m);
                }
            }
            if let Some(why) = g.closed.get(&peer) {
                return Err(Error::remote(why.clone()));
            }
            lim.check()?;
            waiting.tick(self.cfg.timeout, || {
                recv_wait_text(self.rank, self.nranks, peer, ns, tag)
            });
            g = self
                .shared
                .cv
                .wait_timeout(g, POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Sends `data` to `peer` under `tag`. Returns once the bytes are handed
    /// to the kernel (it does not wait for the peer's `recv`). At most 64 MiB.
    pub fn send(&self, peer: usize, tag: u32, data: &[u8]) -> Result<()> {
        self.check_peer(peer, "send")?;
        self.send_ns(peer, NS_USER, tag, data)
            .map_err(|e| e.context(format!("bootstrap: send to rank {peer} (tag {tag})")))
    }

    /// Receives the next message from `peer` under `tag` (per (peer, tag), in
    /// send order; other tags are buffered meanwhile).
    pub fn recv(&self, peer: usize, tag: u32) -> Result<Vec<u8>> {
        self.check_peer(peer, "recv")?;
        self.recv_ns(peer, NS_USER, tag)
            .map_err(|e| e.context(format!("bootstrap: recv from rank {peer} (tag {tag})")))
    }

    /// Every rank's `mine`, in rank order. Ring: n-1 steps, each rank sends
    /// and receives n-1 messages (sum of all payloads minus its own, in bytes).
    pub fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let _g = self.coll.lock().unwrap_or_else(|p| p.into_inner());
        let (n, r) = (self.nranks, self.rank);
        let mut all = vec![Vec::new(); n];
        all[r] = mine.to_vec();
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        for step in 0..n.saturating_sub(1) {
            let s = (r + n - step) % n;
            let d = (r + n - step - 1) % n;
            self.send_ns(next, NS_ALLGATHER, 0, &all[s])
                .map_err(|e| e.context(format!("bootstrap allgather: send to rank {next}")))?;
            all[d] = self
                .recv_ns(prev, NS_ALLGATHER, 0)
                .map_err(|e| e.context(format!("bootstrap allgather: recv from rank {prev}")))?;
        }
        Ok(all)
    }

    /// Returns once every rank has entered the barrier (dissemination:
    /// ceil(log2 n) rounds of one empty message each).
    pub fn barrier(&self) -> Result<()> {
        let _g = self.coll.lock().unwrap_or_else(|p| p.into_inner());
        let (n, r) = (self.nranks, self.rank);
        let mut k = 0u32;
        while (1usize << k) < n {
            let d = 1usize << k;
            let (to, from) = ((r + d) % n, (r + n - d % n) % n);
            self.send_ns(to, NS_BARRIER, k, &[])
                .map_err(|e| e.context(format!("bootstrap barrier: send to rank {to}")))?;
            self.recv_ns(from, NS_BARRIER, k)
                .map_err(|e| e.context(format!("bootstrap barrier: recv from rank {from}")))?;
            k += 1;
        }
        Ok(())
    }

    /// Opens an authenticated data connection to `peer`, which must call
    /// `accept_peer(self.rank(), tag)`. Blocking stream, TCP_NODELAY set.
    pub fn connect_peer(&self, peer: usize, tag: u32) -> Result<TcpStream> {
        self.check_peer(peer, "connect_peer")?;
        let lim = self.limits();
        let s = self.dial(peer, KIND_DATA, tag, &lim).map_err(|e| {
            e.context(format!(
                "bootstrap: connect_peer to rank {peer} (tag {tag})"
            ))
        })?;
        blocking(s)
    }

    /// Waits for the data connection that `peer` opens with
    /// `connect_peer(self.rank(), tag)`. Connections for other (peer, tag) pairs
    /// that arrive meanwhile are kept for their own `accept_peer`.
    pub fn accept_peer(&self, peer: usize, tag: u32) -> Result<TcpStream> {
        self.check_peer(peer, "accept_peer")?;
        let lim = self.limits();
        let mut waiting = Waiting::new(Subsys::BOOTSTRAP);
        let mut g = self.shared.lock();
        loop {
            if let Some(q) = g.streams.get_mut(&(peer, tag)) {
                if let Some(s) = q.pop_front() {
                    if q.is_empty() {
                        g.streams.remove(&(peer, tag));
                    }
                    drop(g);
                    return blocking(s);
                }
            }
            lim.check().map_err(|e| {
                e.context(format!(
                    "bootstrap: accept_peer from rank {peer} (tag {tag})"
                ))
            })?;
            waiting.tick(self.cfg.timeout, || {
                format!(
                    "bootstrap: rank {} of {} waiting for rank {peer}'s data connection (tag {tag})",
                    self.rank, self.nranks
                )
            });
            g = self
                .shared
                .cv
                .wait_timeout(g, POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// What a rank's receive in namespace `ns` waits for: "bootstrap allgather:
/// rank 0 of 2 waiting for rank 1".
fn recv_wait_text(me: usize, nranks: usize, peer: usize, ns: u8, tag: u32) -> String {
    let what = match ns {
        NS_ALLGATHER => "bootstrap allgather".to_string(),
        NS_BARRIER => format!("bootstrap barrier (round {tag})"),
        _ => format!("bootstrap recv (tag {tag})"),
    };
    format!("{what}: rank {me} of {nranks} waiting for rank {peer}")
}

/// Returns once `s` has bytes to read (or has closed), calling `tick` at
/// every poll; the limits' errors otherwise. The read itself is the caller's.
fn wait_readable(s: &TcpStream, lim: &Limits, mut tick: impl FnMut()) -> Result<()> {
    let mut one = [0u8; 1];
    loop {
        // The stream's read timeout is wire::POLL (wire::prepare).
        match s.peek(&mut one) {
            Ok(_) => return Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            // Let the read report it.
            Err(_) => return Ok(()),
        }
        lim.check()?;
        tick();
    }
}

fn blocking(s: TcpStream) -> Result<TcpStream> {
    let r = s
        .set_read_timeout(None)
        .and_then(|_| s.set_write_timeout(None))
        .and_then(|_| s.set_nodelay(true));
    r.map_err(|e| Error::system(format!("bootstrap: socket setup failed: {e}")))?;
    Ok(s)
}

fn join_root(
    id: &UniqueId,
    nranks: usize,
    me: PeerInfo,
    cfg: &BootstrapConfig,
    start: Instant,
) -> Result<Vec<PeerInfo>> {
    let root = id.root_addr();
    let rank = me.rank;
    let lim = Limits {
        deadline: start.checked_add(cfg.init_timeout),
        timeout: cfg.init_timeout,
        abort: &cfg.abort,
        stop: None,
    };
    let mut s = connect_retry(root, &lim, "the root", true)
        .map_err(|e| e.context(format!("rank {rank} of {nranks}")))?;
    wire::prepare(&s)?;
    auth::client(&mut s, id.secret(), &lim)
        .map_err(|e| handshake_error(e, "the root", root, true))?;
    let join = Join {
        nranks,
        run_id: id.run_id(),
        timeout_ms: cfg.init_timeout.as_millis().min(u64::MAX as u128) as u64,
        info: me.clone(),
    };
    wire::write_frame(&mut s, &join.encode(), &lim).map_err(|e| {
        e.context(format!(
            "bootstrap: sending rank {rank}'s join to the root at {root}"
        ))
    })?;
    let wait = Limits {
        deadline: lim.deadline.and_then(|d| d.checked_add(ROOT_GRACE)),
        ..lim
    };
    let mut waiting = Waiting::since(start, Subsys::BOOTSTRAP);
    let ready = wait_readable(&s, &wait, || {
        waiting.tick(cfg.init_timeout, || {
            format!(
                "bootstrap: rank {rank} of {nranks} waiting for the root at {root} to send the rank table, which comes once all {nranks} ranks have connected"
            )
        })
    });
    let frame = match ready.and_then(|()| wire::read_frame(&mut s, MAX_FRAME, &wait, true)) {
        Ok(Some(f)) => f,
        Ok(None) => {
            return Err(Error::remote(format!(
                "bootstrap: the root at {root} closed the connection before sending the rank table (did the process that created the unique id exit or abort?)"
            )))
        }
        Err(e) if e.kind() == ErrorKind::Timeout => {
            return Err(Error::timeout(format!(
                "bootstrap: rank {rank} of {nranks}: no rank table from the root at {root} within {}",
                wire::secs(cfg.init_timeout)
            )))
        }
        Err(e) => return Err(e.context(format!("bootstrap: waiting for the root at {root}"))),
    };
    let table = decode_root_reply(&frame, root)?;
    let ok = table.len() == nranks
        && table.iter().enumerate().all(|(i, p)| p.rank == i)
        && table[rank] == me;
    if !ok {
        return Err(Error::internal(format!(
            "bootstrap: the root at {root} sent an inconsistent rank table ({} entries for nranks={nranks})",
            table.len()
        )));
    }
    Ok(table)
}

/// What a listener takes: the rendezvous listener everything, a separate
/// data listener only data connections.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Accepts {
    Everything,
    DataOnly,
}

fn spawn_acceptor(
    listener: TcpListener,
    accepts: Accepts,
    key: [u8; 32],
    run_id: u64,
    nranks: usize,
    shared: Arc<Shared>,
    abort: Arc<AtomicBool>,
) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("oxccl-bs-accept".into())
        .spawn(move || {
            while !shared.stop.load(Ordering::Relaxed) {
                match sys::wait_acceptable(&listener, POLL) {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        warn!(
                            "bootstrap: poll on the listener failed: {e}; no more peer connections"
                        );
                        return;
                    }
                }
                let Ok((s, addr)) = listener.accept() else {
                    continue;
                };
                let (shared, abort) = (shared.clone(), abort.clone());
                let r = std::thread::Builder::new()
                    .name("oxccl-bs-conn".into())
                    .spawn(move || {
                        serve_conn(s, addr, accepts, key, run_id, nranks, &shared, &abort)
                    });
                if r.is_err() {
                    warn!("bootstrap: cannot spawn a thread; connection from {addr} dropped");
                }
            }
        })
        .map_err(|e| Error::system(format!("bootstrap: cannot spawn a thread: {e}")))
}

#[allow(clippy::too_many_arguments)] // one connection's whole context, passed once
fn serve_conn(
    mut s: TcpStream,
    addr: SocketAddr,
    accepts: Accepts,
    key: [u8; 32],
    run_id: u64,
    nranks: usize,
    shared: &Shared,
    abort: &AtomicBool,
) {
    let mut lim = Limits::new(HANDSHAKE_TIMEOUT, abort);
    lim.stop = Some(&shared.stop);
    if wire::prepare(&s).is_err() {
        return;
    }
    if let Err(e) = auth::server(&mut s, &key, &lim) {
        root::log_drop(addr, &e);
        return;
    }
    let hello = match wire::read_frame(&mut s, CTRL_CAP, &lim, false) {
        Ok(Some(f)) => f,
        _ => return,
    };
    let (from, their_run, kind, tag) = match decode_hello(&hello) {
        Ok(x) => x,
        Err(e) => {
            warn!(
                "bootstrap: connection from {addr}: {}; dropped",
                e.message()
            );
            return;
        }
    };
    if their_run != run_id || from >= nranks || kind > KIND_DATA {
        warn!("bootstrap: connection from {addr} claims rank {from} of run {their_run:#x} (this is run {run_id:#x} with {nranks} ranks); dropped");
        return;
    }
    if accepts == Accepts::DataOnly && kind != KIND_DATA {
        warn!("bootstrap: rank {from} sent a bootstrap message to the data listener (from {addr}); dropped");
        return;
    }
    if kind == KIND_DATA {
        let mut g = shared.lock();
        g.streams.entry((from, tag)).or_default().push_back(s);
        shared.cv.notify_all();
        return;
    }
    shared.lock().closed.remove(&from);
    let read = Limits {
        deadline: None,
        timeout: Duration::ZERO,
        abort,
        stop: Some(&shared.stop),
    };
    let why = loop {
        let f = match wire::read_frame(&mut s, MAX_FRAME, &read, true) {
            Ok(Some(f)) => f,
            Ok(None) => break format!("bootstrap: rank {from} closed its connection (it exited or destroyed its communicator)"),
            Err(e) => break format!("bootstrap: connection from rank {from} failed: {}", e.message()),
        };
        let Ok((ns, tag, body)) = decode_message(&f) else {
            break format!("bootstrap: rank {from} sent a malformed message");
        };
        let body = body.to_vec();
        let mut g = shared.lock();
        g.msgs.entry((from, ns, tag)).or_default().push_back(body);
        shared.cv.notify_all();
    };
    let mut g = shared.lock();
    g.closed.insert(from, why);
    shared.cv.notify_all();
}

/// Decodes the root's reply to a join: the rank table, or the error the root
/// sent (as that error), or a `Remote` error for a malformed reply.
pub(crate) fn decode_root_reply(frame: &[u8], root: SocketAddr) -> Result<Vec<PeerInfo>> {
    let mut d = Dec::new(frame, "root reply");
    match d.u8()? {
        wire::T_TABLE => decode_table(&mut d),
        wire::T_ERROR => Err(wire::decode_error(&mut d)?),
        t => Err(Error::remote(format!(
            "bootstrap: unexpected message type {t} from the root at {root}"
        ))),
    }
}

/// The first frame on a connection between ranks: who dials, for which run,
/// what the connection carries (`KIND_MSG` or `KIND_DATA`) and its tag.
pub(crate) fn encode_hello(rank: usize, run_id: u64, kind: u8, tag: u32) -> Vec<u8> {
    let mut m = Enc::new(wire::T_HELLO);
    m.u32(rank as u32).u64(run_id).u8(kind).u32(tag);
    m.0
}

/// Decodes [`encode_hello`]'s frame: `(rank, run_id, kind, tag)`, unchecked.
pub(crate) fn decode_hello(b: &[u8]) -> Result<(usize, u64, u8, u32)> {
    let mut d = Dec::new(b, "hello");
    if d.u8()? != wire::T_HELLO {
        return Err(Error::remote("expected a hello"));
    }
    let r = (d.u32()? as usize, d.u64()?, d.u8()?, d.u32()?);
    d.end()?;
    Ok(r)
}

/// A tagged message between ranks: namespace, tag, then the payload.
pub(crate) fn encode_message(ns: u8, tag: u32, data: &[u8]) -> Vec<u8> {
    let mut m = Enc::new(wire::T_MSG);
    m.u8(ns).u32(tag);
    m.0.extend_from_slice(data);
    m.0
}

/// Decodes [`encode_message`]'s frame: `(ns, tag, payload)`.
pub(crate) fn decode_message(b: &[u8]) -> Result<(u8, u32, &[u8])> {
    let mut d = Dec::new(b, "message");
    if d.u8()? != wire::T_MSG {
        return Err(Error::remote("expected a message"));
    }
    Ok((d.u8()?, d.u32()?, d.rest()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_between_ranks_decode_what_was_encoded() {
        let h = encode_hello(7, 0xfeed, KIND_DATA, 3);
        assert_eq!(decode_hello(&h).unwrap(), (7, 0xfeed, KIND_DATA, 3));
        assert!(decode_hello(&h[..h.len() - 1]).is_err());
        assert!(decode_hello(&[h.as_slice(), &[0]].concat()).is_err());
        let m = encode_message(NS_BARRIER, 9, b"abc");
        assert_eq!(decode_message(&m).unwrap(), (NS_BARRIER, 9, &b"abc"[..]));
        assert!(decode_message(&h).is_err(), "a hello is not a message");
        let root: SocketAddr = ([127, 0, 0, 1], 9).into();
        let e = decode_root_reply(&wire::encode_error(&Error::invalid_usage("nranks")), root)
            .unwrap_err();
        assert_eq!((e.kind(), e.message()), (ErrorKind::InvalidUsage, "nranks"));
        let e = decode_root_reply(&[9], root).unwrap_err();
        assert!(e.message().contains("unexpected message type 9"), "{e}");
    }

    #[test]
    fn recv_waits_name_the_collective_and_the_peer() {
        assert_eq!(
            recv_wait_text(0, 2, 1, NS_ALLGATHER, 0),
            "bootstrap allgather: rank 0 of 2 waiting for rank 1"
        );
        assert_eq!(
            recv_wait_text(3, 8, 7, NS_BARRIER, 2),
            "bootstrap barrier (round 2): rank 3 of 8 waiting for rank 7"
        );
        assert_eq!(
            recv_wait_text(1, 4, 0, NS_USER, 9),
            "bootstrap recv (tag 9): rank 1 of 4 waiting for rank 0"
        );
    }
}
