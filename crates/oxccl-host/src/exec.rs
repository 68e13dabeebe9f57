//! The host progress loop: polls the step engines of one group (one or more
//! communicators driven by this thread) until all are done, waiting between
//! polls with a spin-then-yield-then-sleep policy that observes abort, a
//! timeout and the liveness of the peers waited on.

use crate::oneshot::{Progress, ShmOneShot, SlotCall};
use crate::transport::{PeerControl, RecvHalf, SendHalf};
use oxccl_core::engine::{Buffers, Engine};
use oxccl_core::{CollKind, Error, ErrorKind, Reduction, Result};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The streams of one communicator, as the loop needs them.
pub struct Streams<'c> {
    pub tx: &'c mut [Vec<Box<dyn SendHalf>>],
    pub rx: &'c mut [Vec<Box<dyn RecvHalf>>],
    pub controls: &'c mut [Option<PeerControl>],
    pub abort: &'c AtomicBool,
    /// The one-shot slots of a communicator whose ranks share this host.
    pub oneshot: Option<&'c mut ShmOneShot>,
    /// Names the communicator in messages ("rank 2 of 4").
    pub who: RankOf,
    /// The profiler's proxy events of each task's network steps, by task
    /// index (empty when no profiler wants them).
    pub proxy: Vec<Option<crate::proxy_events::ProxyTrack>>,
}

/// "rank 2 of 4", formatted only when a message needs it (a call formats
/// nothing on its way).
#[derive(Debug, Clone, Copy)]
pub struct RankOf {
    pub rank: usize,
    pub nranks: usize,
}

impl std::fmt::Display for RankOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} of {}", self.rank, self.nranks)
    }
}

/// "all_reduce(count 1024, float32, sum)", formatted only when a message
/// needs it.
#[derive(Debug, Clone, Copy)]
pub struct OpLabel {
    pub kind: CollKind,
    pub count: usize,
    pub dtype: oxccl_core::DataType,
    pub op: oxccl_core::RedOp,
}

impl std::fmt::Display for OpLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}(count {}, {}, {})",
            self.kind.snake_name(),
            self.count,
            self.dtype,
            self.op
        )
    }
}

/// The stream key of one-shot slot calls: no real stream, but it keeps a
/// communicator's slot calls in issue order, one at a time (their slots
/// are reused by parity once every peer posted the call before, see
/// [`crate::oneshot`]).
pub const SLOT_STREAM: (usize, usize, bool) = (usize::MAX, usize::MAX, true);

/// A small collective over the one-shot slots, as a task of a group.
#[derive(Debug)]
pub struct SlotTask {
    pub call: SlotCall,
    /// For the reductions.
    pub red: Option<Reduction>,
    /// The sequence number once posted.
    pub seq: Option<u64>,
    /// The peer last seen not to have posted.
    pub waiting_for: usize,
    pub done: bool,
}

/// What a task runs: the step engine over streams, or a slot all-reduce.
pub enum Work {
    Engine(Engine),
    Slots(SlotTask),
}

impl Work {
    pub fn is_done(&self) -> bool {
        match self {
            Work::Engine(e) => e.is_done(),
            Work::Slots(s) => s.done,
        }
    }

    /// (peer, channel, is_send) waited on; a slot wait names the peer and
    /// channel `usize::MAX`.
    pub fn waiting_on(&self) -> Vec<(usize, usize, bool)> {
        match self {
            Work::Engine(e) => e.waiting_on(),
            Work::Slots(s) if !s.done => vec![(s.waiting_for, usize::MAX, false)],
            Work::Slots(_) => Vec::new(),
        }
    }

    fn poll(
        &mut self,
        bufs: &mut Buffers<'_>,
        tx: &mut [Vec<Box<dyn SendHalf>>],
        rx: &mut [Vec<Box<dyn RecvHalf>>],
        oneshot: &mut Option<&mut ShmOneShot>,
    ) -> Result<bool> {
        match self {
            Work::Engine(e) => e.poll(bufs, tx, rx),
            Work::Slots(s) => {
                let slots = oneshot
                    .as_deref_mut()
                    .ok_or_else(|| Error::internal("a slot all_reduce without slots"))?;
                let mut moved = false;
                let (rank, n) = (slots.rank(), slots.nranks());
                let blk = s.call.count * s.call.dtype.size();
                let seq = match s.seq {
                    Some(seq) => seq,
                    None => {
                        // This rank's slot is free once every peer posted
                        // the call before (see crate::oneshot).
                        if let Progress::Waiting { waiting_for, .. } =
                            slots.clear_to_post(s.waiting_for)?
                        {
                            s.waiting_for = waiting_for;
                            return Ok(false);
                        }
                        // In place the executor holds one buffer: the
                        // input is this rank's block of an all-gather's
                        // output, else its start (the whole input of a
                        // reduce-scatter).
                        let posted = s.call.posted_bytes(rank, n);
                        let input: &[u8] = match (bufs.send, s.call.kind) {
                            (Some(b), _) => &b[..posted],
                            (None, CollKind::AllGather) => &bufs.recv[rank * blk..][..posted],
                            (None, _) => &bufs.recv[..posted],
                        };
                        let seq = slots.post(&s.call, input, s.red.as_ref())?;
                        s.seq = Some(seq);
                        moved = true;
                        seq
                    }
                };
                match slots.progress(seq, &s.call, s.waiting_for)? {
                    Progress::Waiting { waiting_for, .. } => s.waiting_for = waiting_for,
                    Progress::Ready => {
                        let out: &mut [u8] = match (bufs.send, s.call.kind) {
                            (None, CollKind::ReduceScatter) => &mut bufs.recv[rank * blk..][..blk],
                            _ => bufs.recv,
                        };
                        slots.finish(seq, &s.call, out, s.red.as_ref());
                        s.done = true;
                        moved = true;
                    }
                }
                Ok(moved)
            }
        }
    }
}

/// One engine with its buffers and the streams it touches.
pub struct Task<'b> {
    pub engine: Work,
    pub bufs: Buffers<'b>,
    /// (peer, channel, is_send) streams this task uses.
    pub streams: HashSet<(usize, usize, bool)>,
    /// For messages: "all_reduce(count 1024, float32, sum)".
    pub what: OpLabel,
}

/// How long to wait and how.
#[derive(Debug, Clone, Copy)]
pub struct WaitPolicy {
    pub timeout: Duration,
    /// Spin this long before yielding the CPU.
    pub spin: Duration,
}

/// Runs the tasks of several communicators (`groups[i]` belongs to `streams[i]`)
/// to completion. A task waits for every earlier task of its communicator that
/// shares a stream with it, so operations on one stream keep issue order.
pub fn drive(
    streams: &mut [Streams<'_>],
    groups: &mut [Vec<Task<'_>>],
    policy: WaitPolicy,
) -> Result<()> {
    let start = Instant::now();
    let mut idle_since: Option<Instant> = None;
    let mut last_check = Instant::now();
    let mut yields = 0u32;
    loop {
        let mut moved = false;
        let mut all_done = true;
        for (ci, tasks) in groups.iter_mut().enumerate() {
            let s = &mut streams[ci];
            // TCP streams move bytes only when pumped.
            for (peer, chans) in s.rx.iter_mut().enumerate() {
                for c in chans.iter_mut() {
                    moved |= c.fill().map_err(|e| {
                        reported_cause(s.controls, &[peer], e)
                            .context(format!("{}: from rank {peer}", s.who))
                    })?;
                }
            }
            let mut busy: HashSet<(usize, usize, bool)> = HashSet::new();
            for (ti, t) in tasks.iter_mut().enumerate() {
                if t.engine.is_done() {
                    continue;
                }
                all_done = false;
                if t.streams.iter().any(|k| busy.contains(k)) {
                    busy.extend(t.streams.iter().copied());
                    continue;
                }
                busy.extend(t.streams.iter().copied());
                moved |= t
                    .engine
                    .poll(&mut t.bufs, s.tx, s.rx, &mut s.oneshot)
                    .map_err(|e| {
                        let peers: Vec<usize> = t.streams.iter().map(|k| k.0).collect();
                        reported_cause(s.controls, &peers, e)
                            .context(format!("{}: {}", s.who, t.what))
                    })?;
                if let (Some(Some(p)), Work::Engine(e)) = (s.proxy.get_mut(ti), &t.engine) {
                    p.observe(e);
                }
                if !t.engine.is_done() {
                    all_done = false;
                }
            }
            for (peer, chans) in s.tx.iter_mut().enumerate() {
                for c in chans.iter_mut() {
                    moved |= c.flush().map_err(|e| {
                        reported_cause(s.controls, &[peer], e)
                            .context(format!("{}: to rank {peer}", s.who))
                    })?;
                }
            }
        }
        if all_done
            && groups.iter().all(|g| g.iter().all(|t| t.engine.is_done()))
            && streams
                .iter()
                .all(|s| s.tx.iter().flatten().all(|c| c.unflushed() == 0))
        {
            return Ok(());
        }
        if moved {
            idle_since = None;
            yields = 0;
            continue;
        }
        let now = Instant::now();
        let idle = *idle_since.get_or_insert(now);
        // Liveness, abort and timeout: every 200 µs of waiting. A dead peer's
        // control socket reads EOF at once, so a killed rank is seen within
        // about a millisecond, not at the timeout.
        if now.duration_since(last_check) >= Duration::from_micros(200) {
            last_check = now;
            for (ci, tasks) in groups.iter().enumerate() {
                let s = &mut streams[ci];
                if s.abort.load(Ordering::Acquire) {
                    return Err(Error::new(
                        ErrorKind::InvalidUsage,
                        format!(
                            "{}: operation aborted (ncclCommAbort or ncclCommRevoke)",
                            s.who
                        ),
                    ));
                }
                let mut waits: Vec<(usize, usize, bool)> = tasks
                    .iter()
                    .filter(|t| !t.engine.is_done())
                    .flat_map(|t| t.engine.waiting_on())
                    .collect();
                waits.sort_unstable();
                waits.dedup();
                let mut peers: Vec<usize> = waits.iter().map(|w| w.0).collect();
                peers.dedup();
                for p in peers {
                    if let Some(Some(c)) = s.controls.get_mut(p) {
                        if let Err(e) = c.check_while_waiting() {
                            if !(c.left() && left_bytes_unread(&waits, p, s.rx)) {
                                return Err(e.context(s.who.to_string()));
                            }
                        }
                    }
                }
            }
            if now.duration_since(start) >= policy.timeout {
                return Err(timeout_error(streams, groups, policy.timeout));
            }
        }
        if now.duration_since(idle) < policy.spin {
            std::hint::spin_loop();
        } else if yields < 200 {
            yields += 1;
            std::thread::yield_now();
        } else {
            // Long waits (a peer that is late by milliseconds) sleep briefly so
            // that oversubscribed machines (8 ranks on 2 cores) make progress.
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Whether every wait of this rank on peer `p`, which said goodbye, is a
/// receive whose stream still holds bytes: then its goodbye is no failure
/// yet. A peer writes all it sends before its goodbye, so those bytes are
/// there when the goodbye is read, but the last poll may have come before
/// them: a shared-memory ring has no close of its own that would report the
/// end after them (as TCP's does, `check_while_waiting`). Once they are
/// taken, a wait on the peer that remains fails at the next check. (CI saw
/// a 5-process shared-memory sweep fail so on a send/receive's last bytes.)
fn left_bytes_unread(
    waits: &[(usize, usize, bool)],
    p: usize,
    rx: &mut [Vec<Box<dyn RecvHalf>>],
) -> bool {
    waits.iter().filter(|w| w.0 == p).all(|&(_, ch, is_send)| {
        !is_send
            && rx
                .get_mut(p)
                .and_then(|v| v.get_mut(ch))
                .is_some_and(|r| r.peek().is_ok_and(|b| !b.is_empty()))
    })
}

/// A peer's stream failing (a TCP connection closed or reset) is often the
/// echo of an earlier failure: the peer failed, reported why on its control
/// connection, and exited, closing its sockets. Its report names the root
/// cause (say, the rank that was killed), the broken stream only the
/// messenger, so a report on the control of one of `peers` wins. (Seen in the
/// oxccl tests: with rank 2 killed, rank 0 blamed rank 1's closed socket.)
fn reported_cause(controls: &mut [Option<PeerControl>], peers: &[usize], e: Error) -> Error {
    if e.kind() != ErrorKind::Remote {
        return e;
    }
    for &p in peers {
        if let Some(Some(c)) = controls.get_mut(p) {
            if let Err(r) = c.check() {
                // `PeerControl::check` prefixes a peer's report so.
                if r.message().starts_with(&format!("rank {p} reported: ")) {
                    return r;
                }
            }
        }
    }
    e
}

fn timeout_error(streams: &[Streams<'_>], groups: &[Vec<Task<'_>>], t: Duration) -> Error {
    let mut parts = Vec::new();
    for (ci, tasks) in groups.iter().enumerate() {
        for task in tasks.iter().filter(|t| !t.engine.is_done()) {
            let w: Vec<String> = task
                .engine
                .waiting_on()
                .into_iter()
                .map(|(p, c, send)| {
                    if c == usize::MAX {
                        format!("rank {p}'s one-shot slot")
                    } else if send {
                        format!("room to send to rank {p} (channel {c})")
                    } else {
                        format!("data from rank {p} (channel {c})")
                    }
                })
                .collect();
            parts.push(format!(
                "{}: {} waiting for {}",
                streams[ci].who,
                task.what,
                w.join(", ")
            ));
        }
    }
    Error::timeout(format!(
        "operation did not complete within {:.1} s (OXCCL_TIMEOUT_MS): {}",
        t.as_secs_f64(),
        parts.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receive stream holding `0` or more unread bytes.
    struct Held(Vec<u8>);

    impl RecvHalf for Held {
        fn peek(&mut self) -> Result<&[u8]> {
            Ok(&self.0)
        }
        fn consume(&mut self, n: usize) {
            self.0.drain(..n);
        }
        fn fill(&mut self) -> Result<bool> {
            Ok(false)
        }
    }

    fn rx(held: &[&[usize]]) -> Vec<Vec<Box<dyn RecvHalf>>> {
        held.iter()
            .map(|chans| {
                chans
                    .iter()
                    .map(|&n| Box::new(Held(vec![7; n])) as Box<dyn RecvHalf>)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_goodbye_waits_only_for_bytes_still_to_read_from_the_leaver() {
        // Peer 1 left; this rank receives from it on channels 0 and 1.
        let mut streams = rx(&[&[0, 0], &[8, 0]]);
        let on = |w: &[(usize, usize, bool)], s: &mut Vec<Vec<Box<dyn RecvHalf>>>| {
            left_bytes_unread(w, 1, s)
        };
        assert!(
            on(&[(1, 0, false)], &mut streams),
            "its bytes are still there"
        );
        assert!(!on(&[(1, 1, false)], &mut streams), "nothing left to read");
        assert!(!on(&[(1, 0, false), (1, 1, false)], &mut streams));
        assert!(
            !on(&[(1, 0, true)], &mut streams),
            "a send to it never drains"
        );
        // Waits on other peers do not count; a channel it never had fails.
        assert!(on(&[(0, 0, true), (1, 0, false)], &mut streams));
        assert!(!on(&[(1, 5, false)], &mut streams));
        // Once taken, the goodbye is a failure.
        streams[1][0].consume(8);
        assert!(!on(&[(1, 0, false)], &mut streams));
    }
}
