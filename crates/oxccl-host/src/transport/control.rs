//! Per-peer liveness and poisoning ([`PeerControl`]).
//!
//! - In-process peers share an `Arc` with an "alive" flag (cleared when either
//!   side's control is dropped) and one poison slot per side.
//! - Peers in other processes (shared memory or TCP) have a dedicated control
//!   TCP connection. The kernel closes a process's sockets when it exits or is
//!   killed (already while it is a zombie), so EOF or a reset on this socket
//!   means the peer is gone. A poison is one frame on it:
//!
//! ```text
//! magic u32 LE "OXP1" | kind u32 LE (ncclResult_t) | len u32 LE (<= 4096) | len bytes of UTF-8
//! ```
//!
//! followed by a write shutdown. A rank that destroys its communicator sends
//! the same frame with kind 0 (`ncclSuccess`) and no text, a *goodbye*: its
//! peers still fail a wait on it at once, but can tell it from a death
//! ([`PeerControl::left`]). Nothing else is ever sent on the socket.

use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oxccl_core::{Error, ErrorKind, Result};

use super::ring::Liveness;

const MAGIC: u32 = u32::from_le_bytes(*b"OXP1");
/// The kind word of a goodbye frame (`ncclSuccess`).
const GOODBYE: u32 = 0;
const FRAME_HEADER: usize = 12;
/// Longest poison text carried (longer texts are cut at a char boundary).
pub const MAX_POISON_TEXT: usize = 4096;
/// The link timeout of a socket control until
/// [`PeerControl::set_link_timeout`] says otherwise (communicators set theirs
/// from `OXCCL_LINK_TIMEOUT_MS`): 5 s idle, then 5 probes 1 s apart.
pub const DEFAULT_LINK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `poison` may spend pushing its frame into the socket.
const POISON_WRITE_BUDGET: Duration = Duration::from_millis(5);

/// State shared by the two ends of an in-process link.
pub(crate) struct InprocShared {
    alive: AtomicBool,
    /// `reported[s]`: the error side `s` poisoned the link with.
    reported: [Mutex<Option<Error>>; 2],
    /// `ranks[s]`: the rank of side `s`.
    ranks: [usize; 2],
}

impl InprocShared {
    pub(crate) fn new(rank_a: usize, rank_b: usize) -> Arc<InprocShared> {
        Arc::new(InprocShared {
            alive: AtomicBool::new(true),
            reported: [Mutex::new(None), Mutex::new(None)],
            ranks: [rank_a, rank_b],
        })
    }

    /// The state of the link as side `side` sees its peer.
    fn status(&self, side: usize) -> Result<()> {
        let other = 1 - side;
        let peer = self.ranks[other];
        let reported = self.reported[other]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(e) = reported {
            return Err(Error::new(
                e.kind(),
                format!("rank {peer} reported: {}", e.message()),
            ));
        }
        if !self.alive.load(Ordering::Acquire) {
            return Err(Error::remote(format!(
                "rank {peer} (a thread of this process) closed its connection: \
                 its communicator was destroyed or its thread exited"
            )));
        }
        Ok(())
    }
}

/// One side's view of an in-process link, given to its rings.
pub(crate) struct InprocView {
    pub(crate) shared: Arc<InprocShared>,
    pub(crate) side: usize,
}

impl Liveness for InprocView {
    fn status(&self) -> Result<()> {
        self.shared.status(self.side)
    }
}

struct SocketControl {
    stream: TcpStream,
    /// How the peer is named in messages ("rank 3 (pid 1234 on host h)").
    who: String,
    rbuf: Vec<u8>,
    poison_sent: bool,
    /// Read a clean end of stream with no partial report.
    closed: bool,
    /// Read a goodbye: the peer destroyed its communicator.
    left: bool,
}

enum Inner {
    InProc {
        shared: Arc<InprocShared>,
        side: usize,
    },
    Socket(SocketControl),
}

/// Liveness and poisoning of one peer, beside its data streams.
pub struct PeerControl {
    peer: usize,
    inner: Inner,
    failed: Option<Error>,
    /// The peer's data streams end with a close of their own, after the bytes
    /// sent before it (TCP): see [`PeerControl::check_while_waiting`].
    data_reports_close: bool,
    /// The control connection ended in a clean close with no report.
    closed: bool,
}

impl std::fmt::Debug for PeerControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.inner {
            Inner::InProc { .. } => "inproc",
            Inner::Socket(_) => "socket",
        };
        f.debug_struct("PeerControl")
            .field("peer", &self.peer)
            .field("kind", &kind)
            .field("failed", &self.failed)
            .finish()
    }
}

impl PeerControl {
    /// The two ends of an in-process control: the first is held by `rank_a`
    /// (its peer is `rank_b`), the second by `rank_b`.
    pub(crate) fn inproc_pair(rank_a: usize, rank_b: usize) -> (PeerControl, PeerControl) {
        let shared = InprocShared::new(rank_a, rank_b);
        (
            PeerControl {
                peer: rank_b,
                inner: Inner::InProc {
                    shared: shared.clone(),
                    side: 0,
                },
                failed: None,
                data_reports_close: false,
                closed: false,
            },
            PeerControl {
                peer: rank_a,
                inner: Inner::InProc { shared, side: 1 },
                failed: None,
                data_reports_close: false,
                closed: false,
            },
        )
    }

    /// The shared state of an in-process control (for its rings' liveness).
    pub(crate) fn inproc_view(&self) -> Option<InprocView> {
        match &self.inner {
            Inner::InProc { shared, side } => Some(InprocView {
                shared: shared.clone(),
                side: *side,
            }),
            Inner::Socket(_) => None,
        }
    }

    /// A control over a dedicated TCP connection to `peer`, already connected
    /// and authenticated. `who` names the peer in messages besides its rank,
    /// e.g. `"pid 1234 on host node7"` (messages then say `rank 3 (pid 1234 on
    /// host node7)`); a `who` already starting with `"rank <peer> "` is used as
    /// it is; when empty, the socket's peer address is used. The socket is set
    /// non-blocking.
    pub fn socket(peer: usize, stream: TcpStream, who: impl Into<String>) -> Result<PeerControl> {
        let mut who = who.into();
        if who.is_empty() {
            who = match stream.peer_addr() {
                Ok(a) => a.to_string(),
                Err(_) => "address unknown".to_string(),
            };
        }
        // Accept a full name too ("rank 3 (pid 1234 on h)").
        let who = if who.starts_with(&format!("rank {peer} ")) {
            who
        } else {
            format!("rank {peer} ({who})")
        };
        super::sys::enable_keepalive(&stream, super::sys::link_plan(DEFAULT_LINK_TIMEOUT));
        stream.set_nonblocking(true).map_err(|e| {
            Error::system(format!(
                "control connection to {who}: cannot make it non-blocking: {e}"
            ))
        })?;
        Ok(PeerControl {
            peer,
            inner: Inner::Socket(SocketControl {
                stream,
                who,
                rbuf: Vec::new(),
                poison_sent: false,
                closed: false,
                left: false,
            }),
            failed: None,
            data_reports_close: false,
            closed: false,
        })
    }

    /// How long the control connection may go unanswered (no reply to
    /// keepalive probes, or a frame unacknowledged) before it counts as
    /// broken: an outage shorter than `timeout` is ridden out, a peer whose
    /// host vanished is reported after it. No effect in process.
    pub fn set_link_timeout(&mut self, timeout: Duration) {
        if let Inner::Socket(s) = &self.inner {
            super::sys::enable_keepalive(&s.stream, super::sys::link_plan(timeout));
        }
    }

    /// The peer's rank.
    pub fn peer(&self) -> usize {
        self.peer
    }

    /// `Err(Remote)` if the peer is gone or closed the connection, or the
    /// error the peer poisoned the link with (its kind; text prefixed
    /// `"rank R reported: "`). Non-blocking; once it has failed it keeps
    /// returning the same error.
    pub fn check(&mut self) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let peer = self.peer;
        let res = match &mut self.inner {
            Inner::InProc { shared, side } => shared.status(*side),
            Inner::Socket(s) => {
                let r = s.check(peer);
                self.closed = s.closed;
                r
            }
        };
        if let Err(e) = &res {
            self.failed = Some(e.clone());
        }
        res
    }

    /// As [`check`](Self::check), for a rank waiting on this peer's data.
    /// Where the data streams carry their own close (TCP, set by
    /// `tcp_link`), a clean close of the control connection without a report
    /// is not an error here: the peer may have sent its last bytes and exited
    /// normally, and those bytes can still be on the way (delayed, or waiting
    /// for window) when the control's close arrives on its own, emptier
    /// connection. Every data stream of that peer ends with the same close,
    /// after those bytes, so the receive side reports it once it gets there
    /// (`TcpRecv::peek`: "closed by peer while data was expected"), and a
    /// killed peer is still seen at once. A report, a reset or any other
    /// failure of the control counts at once, as in `check`.
    pub fn check_while_waiting(&mut self) -> Result<()> {
        match self.check() {
            Err(_) if self.data_reports_close && self.closed => Ok(()),
            r => r,
        }
    }

    /// Marks this peer's data streams as ones that end with a close of their
    /// own (see [`check_while_waiting`](Self::check_while_waiting)).
    pub(crate) fn set_data_reports_close(&mut self) {
        self.data_reports_close = true;
    }

    /// Whether the peer said goodbye (destroyed its communicator) before
    /// its connection closed: [`check`](Self::check) still fails, but the
    /// peer did not die.
    pub fn left(&self) -> bool {
        match &self.inner {
            Inner::Socket(s) => s.left,
            Inner::InProc { .. } => false,
        }
    }

    /// Tells the peer that this rank is leaving normally (its communicator
    /// is being destroyed), then closes the sending side; best effort, a few
    /// ms at most. Nothing after a poison.
    pub fn goodbye(&mut self) {
        if let Inner::Socket(s) = &mut self.inner {
            if !s.poison_sent {
                s.poison_sent = true;
                s.send_and_shut(&frame(GOODBYE, b""));
            }
        }
    }

    /// Tells the peer that this rank failed with `err` (best effort; never
    /// blocks more than a few ms). Afterwards the peer's `check()` returns the
    /// error with its kind and `"rank <me> reported: "` before its text.
    pub fn poison(&mut self, err: &Error) {
        match &mut self.inner {
            Inner::InProc { shared, side } => {
                let mut slot = shared.reported[*side]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if slot.is_none() {
                    *slot = Some(err.clone());
                }
            }
            Inner::Socket(s) => s.poison(err),
        }
    }
}

impl Drop for PeerControl {
    fn drop(&mut self) {
        if let Inner::InProc { shared, .. } = &self.inner {
            shared.alive.store(false, Ordering::Release);
        }
    }
}

/// Encodes a poison frame for `err` (text cut to [`MAX_POISON_TEXT`] bytes).
fn encode_frame(err: &Error) -> Vec<u8> {
    let msg = err.message();
    let mut cut = msg.len().min(MAX_POISON_TEXT);
    while !msg.is_char_boundary(cut) {
        cut -= 1;
    }
    frame(err.kind().code() as u32, &msg.as_bytes()[..cut])
}

/// A frame of kind word `kind` carrying `text`.
fn frame(kind: u32, text: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(FRAME_HEADER + text.len());
    f.extend_from_slice(&MAGIC.to_le_bytes());
    f.extend_from_slice(&kind.to_le_bytes());
    f.extend_from_slice(&(text.len() as u32).to_le_bytes());
    f.extend_from_slice(text);
    f
}

/// Parses a frame at the start of `buf`: `Ok(None)` if incomplete.
/// Returns `(kind, text)`. Lengths are checked before anything is sized from them.
fn decode_frame(buf: &[u8]) -> std::result::Result<Option<(ErrorKind, String)>, String> {
    if buf.len() < FRAME_HEADER {
        return Ok(None);
    }
    let word = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    if word(0) != MAGIC {
        return Err(format!("bad magic {:#010x}", word(0)));
    }
    let kind = ErrorKind::from_code(word(4) as i32).unwrap_or(ErrorKind::Remote);
    let len = word(8) as usize;
    if len > MAX_POISON_TEXT {
        return Err(format!("text length {len} over {MAX_POISON_TEXT}"));
    }
    if buf.len() < FRAME_HEADER + len {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&buf[FRAME_HEADER..FRAME_HEADER + len]).into_owned();
    Ok(Some((kind, text)))
}

/// For the fuzz target in `fuzz/` (hidden from the docs; not an API): the
/// control connection's frame decoder on `buf`. A report that decodes is
/// encoded again and must decode to the same kind and text (cut to
/// [`MAX_POISON_TEXT`] bytes, as the sender cuts it); a difference panics.
#[doc(hidden)]
pub fn fuzz_decode_frame(buf: &[u8]) -> std::result::Result<Option<(ErrorKind, String)>, String> {
    let got = decode_frame(buf)?;
    if let Some((kind, text)) = &got {
        let again = decode_frame(&encode_frame(&Error::new(*kind, text.clone())))
            .expect("an encoded report decodes")
            .expect("an encoded report is complete");
        assert_eq!(again.0, *kind, "report kind round trip");
        if text.len() <= MAX_POISON_TEXT {
            assert_eq!(again.1, *text, "report text round trip");
        } else {
            // Invalid UTF-8 decodes to U+FFFD (3 bytes for 1): cut at a char boundary.
            assert!(text.starts_with(&again.1) && again.1.len() > MAX_POISON_TEXT - 4);
        }
    }
    Ok(got)
}

impl SocketControl {
    fn gone(&self, how: &str) -> Error {
        Error::remote(format!("{} {how}: process exited or was killed", self.who))
    }

    fn check(&mut self, peer: usize) -> Result<()> {
        let mut tmp = [0u8; 512];
        loop {
            match self.stream.read(&mut tmp) {
                Ok(0) => {
                    if !self.rbuf.is_empty() {
                        return Err(Error::remote(format!(
                            "{} closed its connection in the middle of an error report",
                            self.who
                        )));
                    }
                    self.closed = true;
                    return Err(self.gone("closed its connection"));
                }
                Ok(n) => {
                    self.rbuf.extend_from_slice(&tmp[..n]);
                    match decode_frame(&self.rbuf) {
                        Ok(None) => {}
                        Ok(Some(_)) if self.rbuf[4..8] == GOODBYE.to_le_bytes() => {
                            // A goodbye: still an error for whoever waits on
                            // this peer, but not a death; a clean close as
                            // far as check_while_waiting is concerned (the
                            // data streams still carry their last bytes).
                            self.left = true;
                            self.closed = true;
                            return Err(Error::remote(format!(
                                "{} left: it destroyed its communicator",
                                self.who
                            )));
                        }
                        Ok(Some((kind, text))) => {
                            return Err(Error::new(kind, format!("rank {peer} reported: {text}")));
                        }
                        Err(why) => {
                            return Err(Error::remote(format!(
                                "{} sent a malformed message on its control connection ({why})",
                                self.who
                            )));
                        }
                    }
                }
                Err(e) if e.kind() == IoKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) if e.kind() == IoKind::ConnectionReset => {
                    return Err(self.gone("reset its connection"));
                }
                Err(e) => {
                    return Err(Error::remote(format!(
                        "control connection to {} failed: {e}",
                        self.who
                    )));
                }
            }
        }
    }

    fn poison(&mut self, err: &Error) {
        if self.poison_sent {
            return;
        }
        self.poison_sent = true;
        self.send_and_shut(&encode_frame(err));
    }

    /// Writes `frame` within [`POISON_WRITE_BUDGET`], then shuts the
    /// sending side.
    fn send_and_shut(&mut self, frame: &[u8]) {
        let deadline = Instant::now() + POISON_WRITE_BUDGET;
        let mut off = 0;
        while off < frame.len() {
            match self.stream.write(&frame[off..]) {
                Ok(0) => break,
                Ok(n) => off += n,
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) if e.kind() == IoKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        break;
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
                Err(_) => break,
            }
        }
        let _ = self.stream.shutdown(Shutdown::Write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip_and_limits() {
        let e = Error::invalid_usage("mismatch: all_reduce vs broadcast");
        let f = encode_frame(&e);
        let (k, t) = decode_frame(&f).unwrap().unwrap();
        assert_eq!(k, ErrorKind::InvalidUsage);
        assert_eq!(t, e.message());
        assert_eq!(decode_frame(&f[..f.len() - 1]).unwrap(), None);
        let long = Error::remote("é".repeat(5000));
        let f = encode_frame(&long);
        let (_, t) = decode_frame(&f).unwrap().unwrap();
        assert!(t.len() <= MAX_POISON_TEXT && t.chars().all(|c| c == 'é'));
        let mut bad = encode_frame(&e);
        bad[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_frame(&bad).is_err());
        assert!(decode_frame(b"garbage garbage").is_err());
    }

    /// Two socket controls over a loopback connection.
    fn socket_pair() -> (PeerControl, PeerControl) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (
            PeerControl::socket(1, a, "pid 1 on host a").unwrap(),
            PeerControl::socket(0, b, "pid 0 on host b").unwrap(),
        )
    }

    /// Polls `c.check()` until it fails (at most 2 s).
    fn failure_of(c: &mut PeerControl) -> Error {
        let t = Instant::now();
        loop {
            if let Err(e) = c.check() {
                return e;
            }
            assert!(t.elapsed() < Duration::from_secs(2), "no failure seen");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_goodbye_fails_waits_but_is_not_a_death() {
        let (mut a, mut b) = socket_pair();
        assert!(a.check().is_ok() && b.check().is_ok());
        b.goodbye();
        b.goodbye(); // once only
        drop(b);
        let e = failure_of(&mut a);
        assert_eq!(e.kind(), ErrorKind::Remote);
        assert_eq!(
            e.message(),
            "rank 1 (pid 1 on host a) left: it destroyed its communicator"
        );
        assert!(a.left());
        // The verdict stays.
        assert!(a.check().is_err() && a.left());
        // Where the data streams end with their own close (TCP), a wait
        // leaves the verdict to them, as for a plain close.
        assert!(a.check_while_waiting().is_err());
        a.set_data_reports_close();
        assert!(a.check_while_waiting().is_ok());
    }

    #[test]
    fn a_close_without_goodbye_or_a_poison_is_not_a_departure() {
        let (mut a, b) = socket_pair();
        drop(b);
        let e = failure_of(&mut a);
        assert!(e.message().contains("closed its connection"), "{e}");
        assert!(!a.left());
        let (mut a, mut b) = socket_pair();
        b.poison(&Error::invalid_usage("bad call"));
        b.goodbye(); // nothing after a poison
        let e = failure_of(&mut a);
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        assert!(!a.left());
    }

    #[test]
    fn inproc_poison_and_drop() {
        let (mut a, mut b) = PeerControl::inproc_pair(0, 1);
        assert!(a.check().is_ok() && b.check().is_ok());
        a.poison(&Error::invalid_usage("bad call"));
        let e = b.check().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        assert_eq!(e.message(), "rank 0 reported: bad call");
        drop(b);
        let e = a.check().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Remote);
        assert!(e.message().contains("rank 1"), "{e}");
    }
}
