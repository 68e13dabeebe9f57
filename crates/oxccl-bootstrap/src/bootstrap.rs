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
//!
//! The rank table reaches rank 0 from the root and every other rank from
//! its parent in the tree of [`route`](crate::route) ([`table`]).

mod table;

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
use crate::gate;
use crate::id::{derived_secret, parse_comm_id, UniqueId};
use crate::root::{self, decode_table, Join, Route};
use crate::route::tree_of;
use crate::wire::{self, Dec, Enc, Limits, DATA_CAP, MAX_FRAME, POLL};
use crate::{ifname, sys, BootstrapConfig, PeerInfo};

const NS_USER: u8 = 0;
const NS_ALLGATHER: u8 = 1;
const NS_BARRIER: u8 = 2;
/// A rank that gave up init tells the others why (one notice per rank).
const NS_FAILED: u8 = 3;
/// Tree broadcast ([`Bootstrap::broadcast`]).
const NS_BROADCAST: u8 = 4;
/// The rank table, from a rank's parent during init ([`table`]).
const NS_TABLE: u8 = 5;
/// The barrier's two directions (tags in `NS_BARRIER`).
const BARRIER_UP: u32 = 0;
const BARRIER_DOWN: u32 = 1;
const KIND_MSG: u8 = 0;
const KIND_DATA: u8 = 1;
/// Extra time a rank waits for the root's own timeout message.
const ROOT_GRACE: Duration = Duration::from_secs(1);
/// Unreceived bytes one peer may have queued at this rank: two messages of
/// the largest size (oxccl's own setup messages are a few KiB each).
pub(crate) const QUEUE_BYTES: usize = 2 * DATA_CAP;
/// Unreceived messages one peer may have queued at this rank (a rank's
/// setup sends a handful per peer; 4096 leaves room for user tags).
pub(crate) const QUEUE_MSGS: usize = 4096;
/// Data connections one peer may have parked here before `accept_peer`.
const PARKED_STREAMS: usize = 1024;
/// A handshake the other side closed before answering is retried (the
/// listener was shedding a flood); one it rejected after our proof is
/// retried this many times before the key is blamed.
const REJECTIONS_TOLERATED: u32 = 3;

/// First pause before a connect or handshake is retried; it doubles up to
/// [`BACKOFF_MAX`]. A busy listener queues newcomers rather than closing
/// them, so retries are rare (a root that is not listening yet, an evicted
/// slow handshake) and a short pause costs little: with 10 ms to 500 ms, a
/// rank could wait half a second after the root came up.
const BACKOFF_FIRST: Duration = Duration::from_millis(2);
/// Longest pause between retries.
const BACKOFF_MAX: Duration = Duration::from_millis(100);

/// The secret of `NCCL_COMM_ID` ids: `OXCCL_AUTH_SECRET`, else the contents
/// of `OXCCL_AUTH_SECRET_FILE` (less one trailing newline); `None` when
/// neither is set.
fn comm_id_secret(cfg: &BootstrapConfig) -> Result<Option<String>> {
    if let Some(s) = &cfg.auth_secret {
        return Ok(Some(s.clone()));
    }
    let Some(path) = &cfg.auth_secret_file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::invalid_argument(format!(
            "OXCCL_AUTH_SECRET_FILE={}: cannot read it: {e}",
            path.display()
        ))
    })?;
    let secret = text.strip_suffix('\n').unwrap_or(&text);
    let secret = secret.strip_suffix('\r').unwrap_or(secret);
    if secret.is_empty() {
        return Err(Error::invalid_argument(format!(
            "OXCCL_AUTH_SECRET_FILE={}: the file is empty",
            path.display()
        )));
    }
    Ok(Some(secret.to_string()))
}

/// The error for a job that would run without a secret while
/// `OXCCL_AUTH_REQUIRED` asks for one.
fn secret_required(what: &str) -> Error {
    Error::invalid_usage(format!(
        "bootstrap: {what} has no secret, and OXCCL_AUTH_REQUIRED=1 refuses to start without one: set OXCCL_AUTH_SECRET (or OXCCL_AUTH_SECRET_FILE) to the same value on every rank"
    ))
}

/// WARNs, once per process, that an `NCCL_COMM_ID` job is open to anyone.
fn warn_open_once(comm_id: &str, addr: SocketAddr) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        warn!(
            "bootstrap: NCCL_COMM_ID={comm_id} without OXCCL_AUTH_SECRET: anyone who can reach {addr} can join this job and read its rank table; set OXCCL_AUTH_SECRET (or OXCCL_AUTH_SECRET_FILE) to the same value on every rank to close it, and OXCCL_AUTH_REQUIRED=1 to refuse to start without one"
        );
    }
}
/// How often a wait looks at whether its peer is still there (a /proc read
/// and a poll of one socket: a few microseconds).
const LIVENESS_EVERY: Duration = Duration::from_millis(100);
/// How long a peer must look gone (exited pid, closed or refused
/// connection) before a wait gives up on it: messages it sent just before
/// exiting may still be on their way through this rank's reader threads.
const GONE_GRACE: Duration = Duration::from_millis(300);
/// Limit of a liveness probe's connect and handshake.
const PROBE_LIMIT: Duration = Duration::from_secs(2);
/// Time budget for telling every peer that this rank gave up init.
const NOTICE_BUDGET: Duration = Duration::from_secs(2);
/// Longest notice: the error's kind (one byte) and its reason.
const NOTICE_MAX: usize = 2048;

/// The text of a failure notice: `e`'s message cut at a character boundary
/// to leave room for the kind byte within [`NOTICE_MAX`].
fn notice_text(e: &Error) -> String {
    let mut why = e.message().to_string();
    if why.len() > NOTICE_MAX - 1 {
        let mut end = NOTICE_MAX - 1;
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        why.truncate(end);
    }
    why
}

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
            let secret = comm_id_secret(cfg)?;
            if secret.is_none() {
                if cfg.auth_required {
                    return Err(secret_required(&format!("NCCL_COMM_ID={c}")));
                }
                warn_open_once(c, addr);
            }
            return Ok(UniqueId::for_comm_id(
                addr,
                &derived_secret(secret.as_deref()),
            ));
        }
        let (l, _) = bind_selected(cfg, &sys::interfaces()?)?;
        let addr = l
            .local_addr()
            .map_err(|e| Error::system(format!("bootstrap: local_addr failed: {e}")))?;
        let secret = auth::nonce()?;
        let run_id = random_u64()?;
        root::spawn_root(l, secret, run_id, cfg)?;
        Ok(UniqueId::new(addr, run_id, &secret, 0))
    }
}

#[derive(Default)]
struct Mail {
    msgs: HashMap<(usize, u8, u32), VecDeque<Vec<u8>>>,
    streams: HashMap<(usize, u32), VecDeque<TcpStream>>,
    /// Peers whose message channel to us ended, and why.
    closed: HashMap<usize, String>,
    /// Per peer: unreceived bytes and messages in `msgs` (bounded by
    /// [`QUEUE_BYTES`] and [`QUEUE_MSGS`]).
    queued: HashMap<usize, (usize, usize)>,
    /// Message channel readers running (at most 2 per rank).
    readers: usize,
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
/// Every wait observes `cfg.init_timeout` until [`Bootstrap::init_done`],
/// `cfg.timeout` after, and `cfg.abort`, polled every 50 ms. A wait for a peer
/// also ends, with a `Remote` error naming it, within about 0.5 s of the peer
/// going away (its connection closed or refused, or its process on this host
/// exited), or of a notice from any rank that gave up init
/// ([`Bootstrap::announce_failure`]). Dropping a `Bootstrap` closes its
/// listener and connections; peers blocked in `recv` from it then fail with a
/// `Remote` error.
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
    /// Until [`Bootstrap::init_done`]: waits use `cfg.init_timeout`.
    initializing: AtomicBool,
    /// A peer's notice ended a wait: this rank's failure is second-hand and
    /// is not announced again.
    heard_notice: AtomicBool,
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
        // A peer of the rank table passed the root's authentication: one that
        // closes or resets the connection mid-handshake has exited, given up
        // or been killed (measured: ranks killed during init were reported
        // as failing authentication).
        HandshakeError::Rejected => Error::remote(format!(
            "bootstrap: {who} at {addr} closed the connection during the handshake (it exited, gave up or was killed)"
        )),
        HandshakeError::BadProof => Error::invalid_usage(format!(
            "bootstrap: {who} at {addr} failed mutual authentication (it holds another unique id's secret)"
        )),
        HandshakeError::NotOxccl => Error::invalid_usage(format!(
            "bootstrap: {who} at {addr} is not an oxccl bootstrap endpoint (wrong NCCL_COMM_ID, or a stale unique id whose port was reused?)"
        )),
        HandshakeError::Closed => Error::remote(format!(
            "bootstrap: {who} at {addr} closed the connection before answering the handshake (it is shedding a flood of connections, or it is not an oxccl bootstrap endpoint)"
        )),
        HandshakeError::Io(e) => e.context(format!("bootstrap: handshake with {who} at {addr}")),
    }
}

/// Connects within `lim`, in attempts of at most 1 s so an abort is seen.
/// With `retry_refused` (during init: the root may not be listening yet) a
/// refused connect is retried with backoff ([`BACKOFF_FIRST`] doubling to
/// [`BACKOFF_MAX`]); without it (after
/// init every rank's listener exists, so a refusal means the peer is gone) it
/// is a `Remote` error at once.
fn connect_retry(
    addr: SocketAddr,
    lim: &Limits,
    who: &str,
    retry_refused: bool,
) -> Result<TcpStream> {
    let mut backoff = BACKOFF_FIRST;
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
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Connects to `addr` and authenticates with `key` within `lim`, retrying
/// with backoff ([`BACKOFF_FIRST`] to [`BACKOFF_MAX`]) while the other side closes or resets the
/// connection before answering (a listener shedding a flood of idle
/// connections closes newcomers), and a few times when it rejects our proof.
fn connect_authenticated(
    addr: SocketAddr,
    key: &[u8; 32],
    lim: &Limits,
    who: &str,
    retry_refused: bool,
    root: bool,
    connect_context: Option<&str>,
) -> Result<TcpStream> {
    let mut backoff = BACKOFF_FIRST;
    let mut rejections = 0;
    loop {
        let mut s =
            connect_retry(addr, lim, who, retry_refused).map_err(|e| match connect_context {
                Some(c) => e.context(c.to_string()),
                None => e,
            })?;
        wire::prepare(&s)?;
        let e = match auth::client(&mut s, key, lim) {
            Ok(()) => return Ok(s),
            Err(HandshakeError::Closed) => HandshakeError::Closed,
            Err(HandshakeError::Rejected) if rejections < REJECTIONS_TOLERATED => {
                rejections += 1;
                HandshakeError::Rejected
            }
            Err(e) => return Err(handshake_error(e, who, addr, root)),
        };
        drop(s);
        let until = Instant::now() + backoff;
        while Instant::now() < until {
            if let Err(err) = lim.check() {
                return Err(if err.kind() == ErrorKind::Timeout {
                    handshake_error(e, who, addr, root).context(format!(
                        "bootstrap: no handshake with {who} at {addr} completed within {}",
                        wire::secs(lim.timeout)
                    ))
                } else {
                    err
                });
            }
            std::thread::sleep(POLL.min(backoff));
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
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
        if cfg.auth_required && *id.secret() == derived_secret(None) {
            return Err(secret_required("this unique id (made from NCCL_COMM_ID)"));
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
            initializing: AtomicBool::new(true),
            heard_notice: AtomicBool::new(false),
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
            root::spawn_root(l, key, run_id, cfg)?;
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
        let (peers, direct) = match join_root(id, nranks, me.clone(), cfg, start)? {
            RootReply::Table(t, direct) => (t, direct),
            RootReply::Route(route) => (boot.table_from(&route, &me, start)?, route.direct),
        };
        boot.peers = peers;
        boot.forward_table(direct)?;
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
        Limits::new(self.wait_timeout(), &self.cfg.abort)
    }

    /// The limit of each wait now: `init_timeout` until [`Bootstrap::init_done`],
    /// then `timeout`.
    pub fn wait_timeout(&self) -> Duration {
        if self.initializing.load(Ordering::Relaxed) {
            self.cfg.init_timeout
        } else {
            self.cfg.timeout
        }
    }

    /// Ends the init phase: later waits use the operation timeout. Called
    /// once the communicator built on this bootstrap is connected.
    pub fn init_done(&self) {
        self.initializing.store(false, Ordering::Relaxed);
    }

    /// Why `peer` looks gone, or None while it looks alive: its message
    /// channel to this rank ended, it runs on this host and its process has
    /// exited, or this rank's message channel to it was closed or refused.
    /// Without a channel to it, `probe` allows one connection attempt (which
    /// then stays as the channel). Never called with the mailbox locked.
    fn peer_gone(&self, peer: usize, probe: bool) -> Option<String> {
        if let Some(why) = self.shared.lock().closed.get(&peer) {
            return Some(why.clone());
        }
        let p = &self.peers[peer];
        // A rank of this process is not looked up in /proc: at 1,024 ranks
        // as threads that was 10,000 reads a second while they waited.
        if self.is_same_host(peer) && !self.is_same_process(peer) && sys::process_gone(p.pid) {
            return Some(format!(
                "bootstrap: rank {peer} (pid {} on {}) exited",
                p.pid, p.hostname
            ));
        }
        let Ok(mut out) = self.out.try_lock() else {
            // A send to it is under way: it will report a closed peer itself.
            return None;
        };
        match out.get(&peer) {
            Some(s) if sys::stream_closed(s) => {
                out.remove(&peer);
                Some(format!(
                    "bootstrap: rank {peer} closed its connection (it exited or was killed)"
                ))
            }
            Some(_) => None,
            None if probe => {
                let lim = Limits::new(PROBE_LIMIT.min(self.wait_timeout()), &self.cfg.abort);
                match self.dial(peer, KIND_MSG, 0, &lim) {
                    Ok(s) => {
                        out.insert(peer, s);
                        None
                    }
                    Err(e) if e.kind() == ErrorKind::Remote => Some(e.message().to_string()),
                    Err(_) => None,
                }
            }
            None => None,
        }
    }

    /// `e`, or when it says that a peer went away, the notice of a rank
    /// that gave up first (waiting up to [`GONE_GRACE`] for it to arrive):
    /// a neighbour that gave up because another rank died must not be
    /// blamed for that death.
    fn prefer_notice(&self, e: Error) -> Error {
        if e.kind() != ErrorKind::Remote {
            return e;
        }
        // This rank's own abort ended the wait (its reader threads close
        // their channels when they see the flag): no notice to wait for.
        if self.cfg.abort.load(Ordering::Relaxed) {
            return wire::aborted();
        }
        let until = Instant::now() + GONE_GRACE;
        let mut g = self.shared.lock();
        loop {
            if let Some(n) = self.notice(&g) {
                return n;
            }
            let now = Instant::now();
            if now >= until {
                return e;
            }
            g = self
                .shared
                .cv
                .wait_timeout(g, (until - now).min(POLL))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// [`prefer_notice`](Self::prefer_notice) for waits outside the
    /// bootstrap (a transport's own connection to a peer): `e`, or when it
    /// is a `Remote` error, the notice of a rank that gave up first, waited
    /// for up to 0.3 s. A rank whose settings differ gives up and closes
    /// its connections; its neighbours then report why, not the reset.
    pub fn explain_failure(&self, e: Error) -> Error {
        self.prefer_notice(e)
    }

    /// A notice from a peer that gave up init, as the error of a wait.
    fn notice(&self, g: &Mail) -> Option<Error> {
        let (&(from, _, _), q) = g
            .msgs
            .iter()
            .find(|((_, ns, _), q)| *ns == NS_FAILED && !q.is_empty())?;
        // The first byte is the kind of the sender's error: ranks that
        // learn of a misuse (settings that differ) from a notice report it
        // as the misuse it is, not as a remote failure.
        let (&code, why) = q.front()?.split_first()?;
        let kind = ErrorKind::from_code(i32::from(code)).unwrap_or(ErrorKind::Remote);
        let why = String::from_utf8_lossy(why);
        self.heard_notice.store(true, Ordering::Relaxed);
        Some(Error::new(
            kind,
            format!("bootstrap: rank {from} gave up: {why}"),
        ))
    }

    /// Tells every peer that this rank gave up init and why (best effort,
    /// about 2 s at most in all), so that ranks waiting on others than this
    /// one learn which rank failed first instead of blaming their neighbour
    /// or waiting for their timeout. A failure that came from another rank's
    /// notice is not announced again.
    pub fn announce_failure(&self, e: &Error) {
        if self.heard_notice.load(Ordering::Relaxed) || self.nranks < 2 {
            return;
        }
        let why = notice_text(e);
        let lim = Limits::new(NOTICE_BUDGET, &self.cfg.abort);
        for q in (0..self.nranks).filter(|&q| q != self.rank) {
            if lim.check().is_err() {
                break;
            }
            let gone = self.shared.lock().closed.contains_key(&q)
                || (self.is_same_host(q) && sys::process_gone(self.peers[q].pid));
            if !gone {
                let mut notice = Vec::with_capacity(1 + why.len());
                notice.push(e.kind().code() as u8);
                notice.extend_from_slice(why.as_bytes());
                let _ = self.send_within(q, NS_FAILED, 0, &notice, &lim);
            }
        }
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
        let s = connect_authenticated(addr, &self.key, lim, &who, false, false, None);
        let mut s = s.map_err(|e| {
            // Its pid tells a dead peer from a stranger holding the port.
            if self.is_same_host(peer) && sys::process_gone(p.pid) {
                return Error::remote(format!(
                    "bootstrap: rank {peer} (pid {} on {}) exited during the handshake",
                    p.pid, p.hostname
                ));
            }
            e
        })?;
        let hello = encode_hello(self.rank, self.run_id, kind, tag);
        wire::write_frame(&mut s, &hello, lim)?;
        Ok(s)
    }

    fn send_ns(&self, peer: usize, ns: u8, tag: u32, data: &[u8]) -> Result<()> {
        self.send_ns_raw(peer, ns, tag, data)
            .map_err(|e| self.prefer_notice(e))
    }

    fn send_ns_raw(&self, peer: usize, ns: u8, tag: u32, data: &[u8]) -> Result<()> {
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
        self.send_within(peer, ns, tag, data, &self.limits())
    }

    /// Sends over the message channel to `peer` (opened on first use) within `lim`.
    fn send_within(&self, peer: usize, ns: u8, tag: u32, data: &[u8], lim: &Limits) -> Result<()> {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let s = match out.entry(peer) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(self.dial(peer, KIND_MSG, 0, lim)?)
            }
        };
        if let Err(e) = wire::write_frame(s, &encode_message(ns, tag, data), lim) {
            out.remove(&peer);
            return Err(e);
        }
        Ok(())
    }

    fn recv_ns(&self, peer: usize, ns: u8, tag: u32) -> Result<Vec<u8>> {
        let lim = self.limits();
        let mut waiting = Waiting::new(Subsys::BOOTSTRAP);
        let mut watch = Watch::new(peer);
        let mut g = self.shared.lock();
        loop {
            if let Some(q) = g.msgs.get_mut(&(peer, ns, tag)) {
                if let Some(m) = q.pop_front() {
                    if q.is_empty() {
                        g.msgs.remove(&(peer, ns, tag));
                    }
                    if let Some(c) = g.queued.get_mut(&peer) {
                        c.0 = c.0.saturating_sub(m.len());
                        c.1 = c.1.saturating_sub(1);
                    }
                    return Ok(m);
                }
            }
            // A notice first: the peer that sent it closes right after.
            if let Some(e) = self.notice(&g) {
                return Err(e);
            }
            if let Some(why) = g.closed.get(&peer).cloned() {
                drop(g);
                return Err(self.prefer_notice(Error::remote(why)));
            }
            lim.check()?;
            waiting.tick(self.wait_timeout(), || {
                recv_wait_text(self.rank, self.nranks, peer, ns, tag)
            });
            g = self
                .shared
                .cv
                .wait_timeout(g, POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            if watch.due() {
                drop(g);
                let gone = watch.look(self);
                g = self.shared.lock();
                if let Some(why) = gone {
                    // Its last messages have had GONE_GRACE to arrive.
                    if let Some(m) = g.msgs.get_mut(&(peer, ns, tag)).and_then(|q| q.pop_front()) {
                        return Ok(m);
                    }
                    drop(g);
                    return Err(self.prefer_notice(Error::remote(why)));
                }
            }
        }
    }

    /// Sends `data` to `peer` under `tag`. Returns once the bytes are handed
    /// to the kernel (it does not wait for the peer's `recv`). At most 16 MiB;
    /// the peer closes the channel past 32 MiB or 4096 messages it has not received.
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

    /// Returns once every rank has entered the barrier: a binary tree, each
    /// rank waiting for its children's arrival, telling its parent, then
    /// waiting for its parent's release and passing it on. 2·(⌈log2(n+1)⌉-1)
    /// rounds, at most 3 peers per rank (a dissemination barrier's ⌈log2 n⌉
    /// peers each way held 21 sockets and 10 reader threads per rank at
    /// 1,024 ranks).
    pub fn barrier(&self) -> Result<()> {
        let _g = self.coll.lock().unwrap_or_else(|p| p.into_inner());
        let (parent, children) = tree_of(self.rank, self.nranks, 0);
        for &c in &children {
            self.recv_ns(c, NS_BARRIER, BARRIER_UP)
                .map_err(|e| e.context(format!("bootstrap barrier: recv from rank {c}")))?;
        }
        if let Some(p) = parent {
            self.send_ns(p, NS_BARRIER, BARRIER_UP, &[])
                .map_err(|e| e.context(format!("bootstrap barrier: send to rank {p}")))?;
            self.recv_ns(p, NS_BARRIER, BARRIER_DOWN)
                .map_err(|e| e.context(format!("bootstrap barrier: recv from rank {p}")))?;
        }
        for &c in &children {
            self.send_ns(c, NS_BARRIER, BARRIER_DOWN, &[])
                .map_err(|e| e.context(format!("bootstrap barrier: send to rank {c}")))?;
        }
        Ok(())
    }

    /// `data` of rank `root`, on every rank (what other ranks pass is
    /// ignored): down a binary tree rooted at `root`, ⌈log2(n+1)⌉-1 rounds,
    /// at most 3 peers per rank. Like any collective, called in the same
    /// order on every rank.
    pub fn broadcast(&self, root: usize, data: &[u8]) -> Result<Vec<u8>> {
        self.check_peer(root, "broadcast")?;
        let _g = self.coll.lock().unwrap_or_else(|p| p.into_inner());
        let (parent, children) = tree_of(self.rank, self.nranks, root);
        let got = match parent {
            None => data.to_vec(),
            Some(p) => self
                .recv_ns(p, NS_BROADCAST, 0)
                .map_err(|e| e.context(format!("bootstrap broadcast: recv from rank {p}")))?,
        };
        for &c in &children {
            self.send_ns(c, NS_BROADCAST, 0, &got)
                .map_err(|e| e.context(format!("bootstrap broadcast: send to rank {c}")))?;
        }
        Ok(got)
    }

    /// Opens an authenticated data connection to `peer`, which must call
    /// `accept_peer(self.rank(), tag)`. Blocking stream, TCP_NODELAY set.
    pub fn connect_peer(&self, peer: usize, tag: u32) -> Result<TcpStream> {
        self.check_peer(peer, "connect_peer")?;
        let lim = self.limits();
        let s = self.dial(peer, KIND_DATA, tag, &lim).map_err(|e| {
            self.prefer_notice(e).context(format!(
                "bootstrap: connect_peer to rank {peer} (tag {tag})"
            ))
        })?;
        blocking(s)
    }

    /// Waits for the data connection that `peer` opens with
    /// `connect_peer(self.rank(), tag)`. Connections for other (peer, tag) pairs
    /// that arrive meanwhile are kept for their own `accept_peer`.
    pub fn accept_peer(&self, peer: usize, tag: u32) -> Result<TcpStream> {
        self.accept_peer_or_stop(peer, tag, None)
    }

    /// [`Bootstrap::accept_peer`] that also ends, with a `Remote` error,
    /// within 50 ms of `stop` being set (a communicator's revoke, which
    /// leaves the bootstrap's own abort flag alone).
    pub fn accept_peer_or_stop(
        &self,
        peer: usize,
        tag: u32,
        stop: Option<&AtomicBool>,
    ) -> Result<TcpStream> {
        self.check_peer(peer, "accept_peer")?;
        let lim = self.limits();
        let mut waiting = Waiting::new(Subsys::BOOTSTRAP);
        let mut watch = Watch::new(peer);
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
            let what = || format!("bootstrap: accept_peer from rank {peer} (tag {tag})");
            if let Some(e) = self.notice(&g) {
                return Err(e.context(what()));
            }
            lim.check().map_err(|e| e.context(what()))?;
            if stop.is_some_and(|s| s.load(Ordering::Acquire)) {
                return Err(Error::remote(
                    "bootstrap: stopped (the communicator was revoked or aborted)",
                )
                .context(what()));
            }
            waiting.tick(self.wait_timeout(), || {
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
            if watch.due() {
                drop(g);
                let gone = watch.look(self);
                g = self.shared.lock();
                if let Some(why) = gone {
                    if g.streams.get(&(peer, tag)).is_some_and(|q| !q.is_empty()) {
                        continue;
                    }
                    drop(g);
                    return Err(self.prefer_notice(Error::remote(why)).context(what()));
                }
            }
        }
    }
}

/// A wait's view of whether its peer is still there: looked at every
/// [`LIVENESS_EVERY`]; a peer that stays gone for [`GONE_GRACE`] ends the wait.
struct Watch {
    peer: usize,
    next: Instant,
    gone_since: Option<Instant>,
    probed: bool,
}

impl Watch {
    fn new(peer: usize) -> Watch {
        Watch {
            peer,
            next: Instant::now() + LIVENESS_EVERY,
            gone_since: None,
            probed: false,
        }
    }

    fn due(&self) -> bool {
        Instant::now() >= self.next
    }

    /// Why the peer is gone, once it has looked gone for [`GONE_GRACE`].
    fn look(&mut self, b: &Bootstrap) -> Option<String> {
        // A refused probe is retried while the grace runs, so it can last.
        let probe = !std::mem::replace(&mut self.probed, true) || self.gone_since.is_some();
        let why = b.peer_gone(self.peer, probe);
        let now = Instant::now();
        self.next = now + LIVENESS_EVERY;
        match why {
            None => {
                self.gone_since = None;
                None
            }
            Some(why) => {
                let since = *self.gone_since.get_or_insert(now);
                (now.duration_since(since) >= GONE_GRACE).then_some(why)
            }
        }
    }
}

/// What a rank's receive in namespace `ns` waits for: "bootstrap allgather:
/// rank 0 of 2 waiting for rank 1".
fn recv_wait_text(me: usize, nranks: usize, peer: usize, ns: u8, tag: u32) -> String {
    let what = match ns {
        NS_ALLGATHER => "bootstrap allgather".to_string(),
        NS_BARRIER if tag == BARRIER_UP => "bootstrap barrier (arrival)".to_string(),
        NS_BARRIER => "bootstrap barrier (release)".to_string(),
        NS_BROADCAST => "bootstrap broadcast".to_string(),
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

/// Joins at the root; its answer: the table (rank 0) or where the table
/// comes from (every other rank).
fn join_root(
    id: &UniqueId,
    nranks: usize,
    me: PeerInfo,
    cfg: &BootstrapConfig,
    start: Instant,
) -> Result<RootReply> {
    let root = id.root_addr();
    let rank = me.rank;
    let lim = Limits {
        deadline: start.checked_add(cfg.init_timeout),
        timeout: cfg.init_timeout,
        abort: &cfg.abort,
        stop: None,
    };
    let ctx = format!("rank {rank} of {nranks}");
    let mut s = connect_authenticated(root, id.secret(), &lim, "the root", true, true, Some(&ctx))?;
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
                "bootstrap: rank {rank} of {nranks} waiting for the root at {root} to send the rank table (or, to ranks other than 0, where it comes from), which comes once all {nranks} ranks have connected"
            )
        })
    });
    let cap = wire::table_cap(nranks);
    let frame = match ready.and_then(|()| wire::read_frame(&mut s, cap, &wait, true)) {
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
    let reply = decode_root_reply(&frame, root)?;
    let ok = match &reply {
        RootReply::Table(table, direct) => {
            rank < *direct && *direct <= nranks && table::consistent(table, nranks, &me)
        }
        // The parent in the tree; children of it that the root does not serve.
        RootReply::Route(r) => {
            let (parent, children) = tree_of(rank, nranks, 0);
            rank >= r.direct
                && parent == Some(r.parent.rank)
                && r.children.iter().all(|c| children.contains(&c.rank))
        }
    };
    if !ok {
        return Err(Error::internal(format!(
            "bootstrap: the root at {root} sent rank {rank} of {nranks} an inconsistent answer ({})",
            match &reply {
                RootReply::Table(t, _) => format!("a table of {} entries", t.len()),
                RootReply::Route(r) => format!("parent {}", r.parent.rank),
            }
        )));
    }
    Ok(reply)
}

/// The root's answer to a join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootReply {
    /// The whole table, and how many ranks (`0..k`) the root sends it to.
    Table(Vec<PeerInfo>, usize),
    /// Where the table comes from (every other rank).
    Route(Route),
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
    let what = match listener.local_addr() {
        Ok(a) => format!("bootstrap listener at {a}"),
        Err(_) => "bootstrap listener".to_string(),
    };
    std::thread::Builder::new()
        .name("oxccl-bs-accept".into())
        .spawn(move || {
            let ctx = ConnCtx {
                accepts,
                run_id,
                nranks,
                shared: shared.clone(),
                abort,
            };
            gate::serve(
                listener,
                key,
                what,
                || !shared.stop.load(Ordering::Relaxed),
                |a| ctx.admitted(a),
            );
        })
        .map_err(|e| Error::system(format!("bootstrap: cannot spawn a thread: {e}")))
}

/// What a rank's listener needs to file an admitted connection.
struct ConnCtx {
    accepts: Accepts,
    run_id: u64,
    nranks: usize,
    shared: Arc<Shared>,
    abort: Arc<AtomicBool>,
}

impl ConnCtx {
    /// Files an authenticated connection by its hello: a data connection is
    /// parked for `accept_peer`; a message channel gets a reader thread (at
    /// most two per rank: one live, one replacing it).
    fn admitted(&self, a: gate::Admitted) {
        let gate::Admitted {
            stream: s,
            peer: addr,
            first: hello,
        } = a;
        let (run_id, nranks) = (self.run_id, self.nranks);
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
        if self.accepts == Accepts::DataOnly && kind != KIND_DATA {
            warn!("bootstrap: rank {from} sent a bootstrap message to the data listener (from {addr}); dropped");
            return;
        }
        if wire::prepare(&s).is_err() {
            return;
        }
        let shared = &self.shared;
        if kind == KIND_DATA {
            let mut g = shared.lock();
            let q = g.streams.entry((from, tag)).or_default();
            if q.len() >= PARKED_STREAMS {
                warn!("bootstrap: rank {from} (from {addr}) has {PARKED_STREAMS} data connections waiting for accept_peer (the bound per peer and tag); this one is dropped");
                return;
            }
            q.push_back(s);
            shared.cv.notify_all();
            return;
        }
        {
            let mut g = shared.lock();
            if g.readers >= 2 * nranks {
                warn!("bootstrap: {} message channels are open to this rank (the bound is 2 per rank); the one from rank {from} at {addr} is dropped", g.readers);
                return;
            }
            g.readers += 1;
            g.closed.remove(&from);
        }
        let (shared, abort) = (shared.clone(), self.abort.clone());
        let spawned = std::thread::Builder::new()
            .name("oxccl-bs-conn".into())
            .spawn(move || {
                let why = read_messages(s, from, &shared, &abort);
                let mut g = shared.lock();
                g.readers -= 1;
                g.closed.insert(from, why);
                shared.cv.notify_all();
            });
        if spawned.is_err() {
            self.shared.lock().readers -= 1;
            warn!("bootstrap: cannot spawn a thread; the message channel from rank {from} at {addr} is dropped");
        }
    }
}

/// Files the messages of rank `from`'s channel in the mailbox until it ends;
/// returns why it ended. A peer past its bound ([`QUEUE_BYTES`],
/// [`QUEUE_MSGS`] unreceived, or a frame larger than [`DATA_CAP`] plus a
/// header) has its channel closed.
fn read_messages(mut s: TcpStream, from: usize, shared: &Shared, abort: &AtomicBool) -> String {
    let read = Limits {
        deadline: None,
        timeout: Duration::ZERO,
        abort,
        stop: Some(&shared.stop),
    };
    loop {
        let f = match wire::read_frame(&mut s, MAX_FRAME, &read, true) {
            Ok(Some(f)) => f,
            Ok(None) => return format!("bootstrap: rank {from} closed its connection (it exited or destroyed its communicator)"),
            Err(e) => return format!("bootstrap: connection from rank {from} failed: {}", e.message()),
        };
        let Ok((ns, tag, body)) = decode_message(&f) else {
            return format!("bootstrap: rank {from} sent a malformed message");
        };
        let body = body.to_vec();
        let mut g = shared.lock();
        let c = g.queued.entry(from).or_default();
        if c.0 + body.len() > QUEUE_BYTES || c.1 + 1 > QUEUE_MSGS {
            let why = format!(
                "bootstrap: rank {from} queued more than this rank has received (bound per peer: {} MiB or {QUEUE_MSGS} messages; {} bytes in {} messages waiting, {} more arrived); its connection was closed",
                QUEUE_BYTES >> 20,
                c.0,
                c.1,
                body.len()
            );
            drop(g);
            warn!("{why}");
            return why;
        }
        c.0 += body.len();
        c.1 += 1;
        g.msgs.entry((from, ns, tag)).or_default().push_back(body);
        shared.cv.notify_all();
    }
}

/// Decodes the root's reply to a join: the rank table or a route, or the
/// error the root sent (as that error), or a `Remote` error for a malformed
/// reply.
pub(crate) fn decode_root_reply(frame: &[u8], root: SocketAddr) -> Result<RootReply> {
    let mut d = Dec::new(frame, "root reply");
    match d.u8()? {
        wire::T_TOP => {
            let direct = d.u32()? as usize;
            decode_table(&mut d).map(|t| RootReply::Table(t, direct))
        }
        wire::T_ROUTE => Route::decode(&mut d).map(RootReply::Route),
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
            recv_wait_text(3, 8, 7, NS_BARRIER, BARRIER_UP),
            "bootstrap barrier (arrival): rank 3 of 8 waiting for rank 7"
        );
        assert_eq!(
            recv_wait_text(1, 4, 0, NS_USER, 9),
            "bootstrap recv (tag 9): rank 1 of 4 waiting for rank 0"
        );
    }
}
