//! Admission of incoming bootstrap connections, for the root and for every
//! rank's listener: one thread runs a non-blocking accept loop with poll(2)
//! over the listener and the connections still in their handshake.
//!
//! Bounds, so that strangers cannot stall a rendezvous or grow a process:
//! - at most [`MAX_HANDSHAKES`] connections in their handshake at once; past
//!   that, a newcomer evicts the oldest that has not yet authenticated if it
//!   has had [`EVICT_AGE`] (a real rank's handshake takes two round trips),
//!   else it waits in the kernel's accept queue ([`sys::widen_backlog`]) until
//!   a handshake ends: 1,024 ranks joining at once queue there instead of
//!   being closed and retrying (which took about 100 s at 1,024 ranks on 2
//!   CPUs), and a connection that has proved the secret is never evicted (one
//!   evicted after sending its join saw the root close and failed its init);
//! - each has [`HANDSHAKE_DEADLINE`] to authenticate and send its first frame
//!   (at most [`CTRL_CAP`] bytes), then is handed to the owner;
//! - no thread per connection: file descriptors in use are the listener plus
//!   at most [`MAX_HANDSHAKES`], whatever the number of connection attempts.
//!
//! Dropped connections are logged once in full, then summarised every
//! [`SUMMARY_EVERY`] ([`DropLog`]).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use oxccl_env::warn;

use crate::auth::{self, HandshakeError, ServerSide};
use crate::sys;
use crate::wire::{self, CTRL_CAP, POLL};

/// How long an incoming connection may take to authenticate and send its
/// first frame (a real rank needs two round trips: well under 10 ms on a LAN).
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(3);
/// Most connections in their handshake at once, per listener.
pub const MAX_HANDSHAKES: usize = 64;
/// A handshake at least this old may be evicted for a newcomer.
const EVICT_AGE: Duration = Duration::from_millis(250);
/// How often repeated drops are summarised in one WARN.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(10);
/// Most connections taken from the accept queue per poll round, so that
/// handshakes in progress are served between bursts.
const ACCEPT_BURST: usize = 256;

/// An authenticated connection and its first frame.
pub(crate) struct Admitted {
    pub stream: TcpStream,
    pub peer: SocketAddr,
    pub first: Vec<u8>,
}

/// Why a connection was dropped before admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DropReason {
    Busy,
    Slow,
    Auth,
    NotOxccl,
    Closed,
    BadFrame,
}

const REASONS: [(DropReason, &str); 6] = [
    (DropReason::Busy, "too many handshakes in flight"),
    (DropReason::Slow, "timed out"),
    (DropReason::Auth, "failed authentication"),
    (DropReason::NotOxccl, "not an oxccl handshake"),
    (DropReason::Closed, "closed early"),
    (DropReason::BadFrame, "bad first frame"),
];

/// Rate-limited reporting of dropped connections: the first drop of a
/// window is reported in full, the rest counted and summarised once the
/// window of [`SUMMARY_EVERY`] has passed. Pure: returns the lines to log.
#[derive(Debug)]
pub(crate) struct DropLog {
    what: String,
    window: Option<Instant>,
    counts: [usize; 6],
}

impl DropLog {
    pub fn new(what: String) -> DropLog {
        DropLog {
            what,
            window: None,
            counts: [0; 6],
        }
    }

    /// Records a drop at `now`; returns a line to WARN for the first drop of a window.
    pub fn record(&mut self, now: Instant, why: DropReason, detail: &str) -> Option<String> {
        if self.window.is_none() {
            self.window = Some(now);
            return Some(format!(
                "{}: {detail}; dropped (further drops are summarised every {})",
                self.what,
                wire::secs(SUMMARY_EVERY)
            ));
        }
        let i = REASONS.iter().position(|(r, _)| *r == why).unwrap_or(0);
        self.counts[i] += 1;
        None
    }

    /// At `now`, the summary of the window if it is over and had more drops.
    pub fn flush(&mut self, now: Instant) -> Option<String> {
        let start = self.window?;
        if now.duration_since(start) < SUMMARY_EVERY {
            return None;
        }
        let total: usize = self.counts.iter().sum();
        let parts: Vec<String> = REASONS
            .iter()
            .zip(self.counts)
            .filter(|(_, n)| *n > 0)
            .map(|((_, what), n)| format!("{n} {what}"))
            .collect();
        self.counts = [0; 6];
        if total == 0 {
            self.window = None;
            return None;
        }
        self.window = Some(now);
        Some(format!(
            "{}: dropped {total} more connections that did not complete the handshake in the last {} ({})",
            self.what,
            wire::secs(now.duration_since(start)),
            parts.join(", ")
        ))
    }
}

enum Step {
    Hello,
    Proof(ServerSide),
    Len,
    Body,
}

impl Step {
    /// Whether the peer has proved that it holds the secret.
    fn authenticated(&self) -> bool {
        matches!(self, Step::Len | Step::Body)
    }
}

struct Pending {
    s: TcpStream,
    peer: SocketAddr,
    since: Instant,
    step: Step,
    buf: Vec<u8>,
    need: usize,
}

enum Progress {
    More,
    Done(Vec<u8>),
    Failed(DropReason, String),
}

/// Writes all of `b` at once on a fresh non-blocking socket: at most 72
/// bytes per connection ever go out here, far below any send buffer, so a
/// short write means the peer is gone.
fn write_now(s: &mut TcpStream, b: &[u8]) -> bool {
    matches!(s.write(b), Ok(n) if n == b.len())
}

fn advance(p: &mut Pending, key: &[u8; 32]) -> Progress {
    loop {
        while p.buf.len() < p.need {
            let mut chunk = [0u8; 512];
            let want = (p.need - p.buf.len()).min(chunk.len());
            match p.s.read(&mut chunk[..want]) {
                Ok(0) => {
                    return Progress::Failed(
                        DropReason::Closed,
                        format!(
                            "connection from {} closed before completing its handshake",
                            p.peer
                        ),
                    )
                }
                Ok(n) => p.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Progress::More,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Progress::Failed(
                        DropReason::Closed,
                        format!(
                            "connection from {} failed during its handshake ({e})",
                            p.peer
                        ),
                    )
                }
            }
        }
        let buf = std::mem::take(&mut p.buf);
        match std::mem::replace(&mut p.step, Step::Body) {
            Step::Hello => {
                let hello: &[u8; 40] = buf[..].try_into().expect("40");
                match auth::server_hello(hello) {
                    Ok((side, reply)) => {
                        if !write_now(&mut p.s, &reply) {
                            return Progress::Failed(
                                DropReason::Closed,
                                format!("connection from {} closed during its handshake", p.peer),
                            );
                        }
                        p.step = Step::Proof(side);
                        p.need = 32;
                    }
                    Err(_) => {
                        return Progress::Failed(
                            DropReason::NotOxccl,
                            format!(
                                "connection from {} is not an oxccl bootstrap handshake",
                                p.peer
                            ),
                        )
                    }
                }
            }
            Step::Proof(side) => {
                let theirs: &[u8; 32] = buf[..].try_into().expect("32");
                let mine = match side.finish(key, theirs) {
                    Ok(m) => m,
                    Err(HandshakeError::BadProof) => {
                        return Progress::Failed(
                            DropReason::Auth,
                            format!(
                                "connection from {} failed authentication (it holds another unique id's secret, or none)",
                                p.peer
                            ),
                        )
                    }
                    Err(_) => {
                        return Progress::Failed(
                            DropReason::Auth,
                            format!("connection from {} failed authentication", p.peer),
                        )
                    }
                };
                if !write_now(&mut p.s, &mine) {
                    return Progress::Failed(
                        DropReason::Closed,
                        format!("connection from {} closed during its handshake", p.peer),
                    );
                }
                p.step = Step::Len;
                p.need = 4;
            }
            Step::Len => {
                let len = u32::from_le_bytes(buf[..4].try_into().expect("4")) as usize;
                if len == 0 || len > CTRL_CAP {
                    return Progress::Failed(
                        DropReason::BadFrame,
                        format!(
                            "connection from {} sent a first frame of {len} bytes (the limit is {CTRL_CAP})",
                            p.peer
                        ),
                    );
                }
                p.step = Step::Body;
                p.need = len;
            }
            Step::Body => return Progress::Done(buf),
        }
    }
}

/// The oldest handshake (`pending` is in arrival order) that has not
/// authenticated yet: the only kind a newcomer may evict.
fn evictable(pending: &VecDeque<Pending>) -> Option<usize> {
    pending.iter().position(|p| !p.step.authenticated())
}

/// Serves `listener` until `keep_going` says no: authenticates with `key`
/// and hands each admitted connection (blocking again) to `admit`. `what`
/// names the listener in logs ("bootstrap root at ADDR").
pub(crate) fn serve(
    listener: TcpListener,
    key: [u8; 32],
    what: String,
    keep_going: impl Fn() -> bool,
    mut admit: impl FnMut(Admitted),
) {
    if let Err(e) = listener.set_nonblocking(true) {
        warn!("{what}: cannot make the listener non-blocking ({e}); no connections are accepted");
        return;
    }
    if let Err(e) = sys::widen_backlog(&listener) {
        warn!("{what}: cannot widen the accept queue ({e}); ranks arriving together may wait for SYN retries");
    }
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut log = DropLog::new(what.clone());
    let dropped = |log: &mut DropLog, why: DropReason, detail: &str| {
        if let Some(line) = log.record(Instant::now(), why, detail) {
            warn!("{line}");
        }
    };
    while keep_going() {
        let now = Instant::now();
        // Expire handshakes past their deadline (oldest first).
        while pending
            .front()
            .is_some_and(|p| now.duration_since(p.since) >= HANDSHAKE_DEADLINE)
        {
            let p = pending.pop_front().expect("front");
            dropped(
                &mut log,
                DropReason::Slow,
                &format!(
                    "connection from {} did not complete its handshake within {}",
                    p.peer,
                    wire::secs(HANDSHAKE_DEADLINE)
                ),
            );
        }
        if let Some(line) = log.flush(now) {
            warn!("{line}");
        }
        // Full: the listener is left out of the poll (newcomers wait in the
        // accept queue) until a handshake ends or one may be evicted.
        let evict_at = if pending.len() >= MAX_HANDSHAKES {
            evictable(&pending).map(|i| pending[i].since + EVICT_AGE)
        } else {
            None
        };
        let listen = pending.len() < MAX_HANDSHAKES || evict_at.is_some_and(|t| t <= now);
        let mut wait = pending
            .front()
            .map(|p| (p.since + HANDSHAKE_DEADLINE).saturating_duration_since(now))
            .unwrap_or(POLL)
            .min(POLL);
        if let Some(t) = evict_at {
            wait = wait.min(t.saturating_duration_since(now));
        }
        let fds: Vec<_> = std::iter::once(listener.as_raw_fd())
            .filter(|_| listen)
            .chain(pending.iter().map(|p| p.s.as_raw_fd()))
            .collect();
        let ready = match sys::poll_readable(&fds, wait) {
            Ok(r) => r,
            Err(e) => {
                warn!("{what}: poll failed ({e}); no more connections are accepted");
                return;
            }
        };
        let (listener_ready, ready) = if listen {
            (ready[0], &ready[1..])
        } else {
            (false, &ready[..])
        };
        let mut still = VecDeque::with_capacity(pending.len());
        for (mut p, r) in pending.drain(..).zip(ready.iter().copied()) {
            if !r {
                still.push_back(p);
                continue;
            }
            match advance(&mut p, &key) {
                Progress::More => still.push_back(p),
                Progress::Done(first) => {
                    if p.s.set_nonblocking(false).is_ok() {
                        admit(Admitted {
                            stream: p.s,
                            peer: p.peer,
                            first,
                        });
                    }
                }
                Progress::Failed(why, detail) => dropped(&mut log, why, &detail),
            }
        }
        pending = still;
        if !listener_ready {
            continue;
        }
        for _ in 0..ACCEPT_BURST {
            if pending.len() >= MAX_HANDSHAKES {
                let now = Instant::now();
                match evictable(&pending)
                    .filter(|&i| now.duration_since(pending[i].since) >= EVICT_AGE)
                {
                    Some(i) => {
                        let old = pending.remove(i).expect("index");
                        dropped(
                            &mut log,
                            DropReason::Busy,
                            &format!(
                                "connection from {} evicted: {MAX_HANDSHAKES} handshakes in flight (a flood of idle connections?)",
                                old.peer
                            ),
                        );
                    }
                    // The rest wait in the accept queue.
                    None => break,
                }
            }
            let (s, peer) = match listener.accept() {
                Ok(x) => x,
                // WouldBlock: the queue is empty; anything else (EMFILE,
                // ECONNABORTED): try again next round.
                Err(_) => break,
            };
            if s.set_nonblocking(true).is_err() || s.set_nodelay(true).is_err() {
                continue;
            }
            pending.push_back(Pending {
                s,
                peer,
                since: Instant::now(),
                step: Step::Hello,
                buf: Vec::with_capacity(40),
                need: 40,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_are_reported_once_then_summarised() {
        let t0 = Instant::now();
        let mut log = DropLog::new("bootstrap root at 10.0.0.1:4444".into());
        let first = log.record(t0, DropReason::Slow, "connection from X did not complete");
        assert_eq!(
            first.as_deref(),
            Some("bootstrap root at 10.0.0.1:4444: connection from X did not complete; dropped (further drops are summarised every 10 s)")
        );
        for i in 0..511 {
            let why = if i % 2 == 0 {
                DropReason::Slow
            } else {
                DropReason::Busy
            };
            assert_eq!(log.record(t0, why, "x"), None);
        }
        assert_eq!(log.flush(t0 + Duration::from_secs(9)), None);
        assert_eq!(
            log.flush(t0 + SUMMARY_EVERY).as_deref(),
            Some("bootstrap root at 10.0.0.1:4444: dropped 511 more connections that did not complete the handshake in the last 10 s (255 too many handshakes in flight, 256 timed out)")
        );
        // A quiet window closes without a line; the next drop is reported in full.
        assert_eq!(log.flush(t0 + 2 * SUMMARY_EVERY), None);
        assert!(log
            .record(t0 + 2 * SUMMARY_EVERY, DropReason::Auth, "y")
            .is_some());
    }
}
