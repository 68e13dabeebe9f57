//! The bound on connections made on first use (`OXCCL_P2P_MAX_PEERS`).
//!
//! A rank keeps the connections of creation (ring and tree peers,
//! `oxccl_core::peers::init_peers`) for the communicator's life. The others,
//! made on first use (`connect.rs`), form a pool of at most `max` peers:
//! before a call connects new ones past it, the least recently used
//! connection that the call does not use is released.
//!
//! Why a handshake, and why this one: a connection is two ends, and either
//! may still have bytes queued on it (a send that completed into the
//! peer's ring before the peer posted its receive), or be in a call that
//! uses it. Each end counts the messages it issued on every stream of the
//! pair (`StreamSeqs`, the numbers the headers carry). The end that wants
//! room, idle on the pair, sends an *offer* with its counts; the other end
//! compares them with its own:
//!
//! - different: a message is still on its way or waits for a call that
//!   has not been made yet; it answers *decline* and both keep the pair;
//! - equal, and no call of its own is using the pair: it answers with its
//!   own offer and drops its end; the first end, reading equal counts,
//!   drops its end too;
//! - equal, but its running call still reads from the pair: everything
//!   that call needs was sent already (the counts say so), so it answers
//!   once the call is done with it, never waiting on the first end.
//!
//! Equal counts on both ends mean every message issued on the pair was
//! consumed, so nothing is lost; both ends drop it at the same point of
//! the pair's traffic, so the next operation between them finds it gone on
//! both and connects anew, in the same call on both (`connect.rs`).
//! Offers crossing (both ends want room) are each other's answers, decided
//! by the same symmetric comparison. A rank answers in every call and wait
//! of the communicator (the start and end of each call, the progress
//! loops, its own wait for an answer), so two ranks each waiting for an
//! answer answer each other. The wait observes the abort flag and the
//! timeout and names the peer; a peer that said goodbye counts as released.
//! When no connection can be released (every one is used by the call, or
//! declined), the call connects past the bound and says so in the log;
//! all-to-all, gather and scatter never need that (when the pool is
//! bounded they run in batches of at most `max` peers, `comm.rs`).

use crate::transport::control::Release;
use crate::transport::{PeerControl, RecvHalf, SendHalf};
use oxccl_core::engine::StreamSeqs;
use oxccl_core::{Error, Result};
use oxccl_env::Subsys;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The per-peer tables a release touches.
pub(crate) struct Links<'a> {
    pub tx: &'a mut [Vec<Box<dyn SendHalf>>],
    pub rx: &'a mut [Vec<Box<dyn RecvHalf>>],
    pub controls: &'a mut [Option<PeerControl>],
    pub seqs: &'a StreamSeqs,
}

impl Links<'_> {
    fn offer(&self, q: usize) -> Release {
        Release::Offer {
            tx: self.seqs.tx[q].clone(),
            rx: self.seqs.rx[q].clone(),
        }
    }

    /// Whether the peer's counts say that every message issued on the pair
    /// by either end was issued by the other too.
    fn matches(&self, q: usize, tx: &[u32], rx: &[u32]) -> bool {
        self.seqs.rx[q] == tx && self.seqs.tx[q] == rx
    }

    fn drop_pair(&mut self, rank: usize, q: usize) {
        self.tx[q] = Vec::new();
        self.rx[q] = Vec::new();
        self.controls[q] = None;
        oxccl_env::info!(
            Subsys::INIT,
            "rank {rank}: released its connection to rank {q} (OXCCL_P2P_MAX_PEERS)"
        );
    }
}

/// How long a rank that needs room waits for a peer's answer before it
/// leaves its offer pending and goes on: a peer inside a call of the
/// communicator answers within milliseconds; one outside any call may not
/// for a long time, and waiting for it could wait on this rank's own
/// progress.
pub(crate) const ANSWER_WINDOW: Duration = Duration::from_secs(1);

/// One rank's pool of first-use connections.
pub(crate) struct Pool {
    rank: usize,
    max: usize,
    bounded: bool,
    /// `creation[q]`: connected at creation, never released.
    creation: Vec<bool>,
    last_use: Vec<u64>,
    /// The first-use peers connected when last looked (a superset of those
    /// connected now: pairs dropped since are pruned at the next look), so
    /// that the waits' answering looks at these few, not every rank.
    linked: Vec<usize>,
    tick: u64,
    /// Peers whose matching offer waits for this rank's call to be done
    /// with the pair.
    deferred: Vec<usize>,
    /// Peers this rank sent an offer to whose answer has not been read,
    /// with the counts offered (the answer is judged against those: this
    /// rank's own may have grown since, by a call now prepared).
    pending: Vec<(usize, Vec<u32>, Vec<u32>)>,
    peak: usize,
}

/// What a peer's answer to this rank's offer did.
enum Answer {
    Released,
    Kept,
    NotYet,
}

impl Pool {
    pub fn new(rank: usize, nranks: usize, max: usize, creation: &[usize]) -> Pool {
        let mut c = vec![false; nranks];
        for &q in creation {
            if q < nranks {
                c[q] = true;
            }
        }
        Pool {
            rank,
            max: max.max(1),
            bounded: oxccl_core::peers::first_use_bounded(nranks, max.max(1)),
            creation: c,
            last_use: vec![0; nranks],
            linked: Vec::new(),
            tick: 0,
            deferred: Vec::new(),
            pending: Vec::new(),
            peak: 0,
        }
    }

    /// Whether the pool can overflow (more peers than it holds, beyond
    /// the peers of creation): the same answer on every rank.
    pub fn bounded(&self) -> bool {
        self.bounded
    }

    /// The bound: most first-use connections held at once.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Whether this rank offered to release its pair with `q` and has not
    /// read the answer: the pair must be settled before a call uses it.
    pub fn is_pending(&self, q: usize) -> bool {
        self.pending.iter().any(|p| p.0 == q)
    }

    /// First-use connections held now.
    pub fn held(&self, controls: &[Option<PeerControl>]) -> usize {
        self.linked
            .iter()
            .filter(|&&q| controls.get(q).is_some_and(Option::is_some))
            .count()
    }

    /// The most first-use connections held at once so far.
    pub fn peak(&self) -> usize {
        self.peak
    }

    /// Notes the first-use connections just made (and the peak).
    pub fn note_peak(&mut self, controls: &[Option<PeerControl>]) {
        self.linked = controls
            .iter()
            .enumerate()
            .filter(|(q, c)| c.is_some() && !self.creation[*q])
            .map(|(q, _)| q)
            .collect();
        self.peak = self.peak.max(self.linked.len());
    }

    /// Marks `peers` as used now (least recently used goes first).
    pub fn touch(&mut self, peers: impl IntoIterator<Item = usize>) {
        self.tick += 1;
        for q in peers {
            if let Some(t) = self.last_use.get_mut(q) {
                *t = self.tick;
            }
        }
    }

    /// Answers the release messages that came and reads the answers to
    /// this rank's pending offers, without waiting. `busy(q)`: a call of
    /// this rank still uses the pair with `q`; a matching offer then waits
    /// for it when `defer`, else is declined. `skip`: the peer whose answer
    /// this rank is waiting for (read by that wait).
    pub fn service(
        &mut self,
        links: &mut Links<'_>,
        busy: &dyn Fn(usize) -> bool,
        skip: Option<usize>,
        defer: bool,
        limit: Duration,
    ) {
        if !self.bounded {
            return;
        }
        self.linked
            .retain(|&q| links.controls.get(q).is_some_and(Option::is_some));
        for i in 0..self.linked.len() {
            let q = self.linked[i];
            if Some(q) == skip || links.controls[q].is_none() {
                continue;
            }
            if self.is_pending(q) {
                // A failure here is the next wait's to report.
                let _ = self.read_answer(links, q);
                continue;
            }
            let Some(c) = links.controls[q].as_mut() else {
                continue;
            };
            // A failed peer's error is for the wait that needs it.
            let Ok(Some(msg)) = c.take_release() else {
                continue;
            };
            let Release::Offer { tx, rx } = msg else {
                // A decline that crossed an answer already read: nothing to do.
                continue;
            };
            if !links.matches(q, &tx, &rx) {
                self.send(links, q, &Release::Decline, limit);
            } else if busy(q) {
                if defer {
                    if !self.deferred.contains(&q) {
                        self.deferred.push(q);
                    }
                } else {
                    self.send(links, q, &Release::Decline, limit);
                }
            } else {
                let mine = links.offer(q);
                self.send(links, q, &mine, limit);
                links.drop_pair(self.rank, q);
            }
        }
        let mut i = 0;
        while i < self.deferred.len() {
            let q = self.deferred[i];
            if links.controls[q].is_none() {
                self.deferred.swap_remove(i);
            } else if !busy(q) {
                self.deferred.swap_remove(i);
                let mine = links.offer(q);
                self.send(links, q, &mine, limit);
                links.drop_pair(self.rank, q);
            } else {
                i += 1;
            }
        }
    }

    /// Sends `msg` to `q`; a peer that cannot be told is gone, and its
    /// failure is reported by the next wait that needs it.
    fn send(&self, links: &mut Links<'_>, q: usize, msg: &Release, limit: Duration) {
        if let Some(c) = links.controls[q].as_mut() {
            let _ = c.send_release(msg, limit.min(Duration::from_secs(10)));
        }
    }

    /// Offers `q` the release of the pair (or answers its offer, already
    /// read and deferred, which releases it at once).
    fn offer(&mut self, links: &mut Links<'_>, q: usize, limit: Duration) {
        let mine = links.offer(q);
        if self.deferred.contains(&q) {
            self.deferred.retain(|&d| d != q);
            self.send(links, q, &mine, limit);
            links.drop_pair(self.rank, q);
            return;
        }
        let sent = links.controls[q]
            .as_mut()
            .map(|c| c.send_release(&mine, limit.min(Duration::from_secs(10))));
        let Release::Offer { tx, rx } = mine else {
            return;
        };
        match sent {
            Some(Ok(())) => self.pending.push((q, tx, rx)),
            // Gone: its failure comes at its next use.
            Some(Err(_)) => links.drop_pair(self.rank, q),
            None => {}
        }
    }

    /// Reads `q`'s answer to this rank's pending offer, if it came: its
    /// own offer with equal counts (both drop the pair), or a decline or
    /// other counts (both keep it).
    fn read_answer(&mut self, links: &mut Links<'_>, q: usize) -> Result<Answer> {
        let rank = self.rank;
        let Some(c) = links.controls[q].as_mut() else {
            self.pending.retain(|p| p.0 != q);
            return Ok(Answer::Released);
        };
        let got = match c.take_release() {
            Ok(m) => m,
            Err(e) => {
                if c.left() {
                    // It destroyed its communicator: nothing more comes.
                    self.pending.retain(|p| p.0 != q);
                    links.drop_pair(rank, q);
                    return Ok(Answer::Released);
                }
                return Err(e.context(format!("rank {rank}: releasing its connection to rank {q}")));
            }
        };
        let Some(got) = got else {
            return Ok(Answer::NotYet);
        };
        let offered = self.pending.iter().position(|p| p.0 == q);
        let answer = match (got, offered) {
            (Release::Offer { tx, rx }, Some(i))
                if self.pending[i].1 == rx && self.pending[i].2 == tx =>
            {
                links.drop_pair(rank, q);
                Answer::Released
            }
            _ => Answer::Kept,
        };
        self.pending.retain(|p| p.0 != q);
        Ok(answer)
    }

    /// Releases least recently used idle connections until the peers of
    /// `in_call` not connected fit under the bound. `in_call`: the peers the call uses (never
    /// released; an offer still pending to one of them is waited for, as
    /// the pair must be settled before the call uses it). Waits for each
    /// other answer at most [`ANSWER_WINDOW`]; every wait observes `abort`
    /// and `limit`, and an error names the peer.
    pub fn make_room(
        &mut self,
        links: &mut Links<'_>,
        in_call: &[usize],
        abort: &AtomicBool,
        limit: Duration,
    ) -> Result<()> {
        if !self.bounded {
            return Ok(());
        }
        let busy = |q: usize| in_call.contains(&q);
        let settling: Vec<usize> = self.pending.iter().map(|p| p.0).collect();
        for q in settling {
            if busy(q) {
                self.await_answer(links, q, &busy, abort, limit, limit)?;
            }
        }
        let need = in_call
            .iter()
            .filter(|&&q| q < links.controls.len() && links.controls[q].is_none())
            .count();
        if need == 0 {
            return Ok(());
        }
        let rank = self.rank;
        let mut tried: Vec<usize> = Vec::new();
        while self.held(links.controls) + need > self.max {
            let victim = self
                .linked
                .iter()
                .copied()
                .filter(|&q| {
                    links.controls[q].is_some()
                        && !self.creation[q]
                        && !busy(q)
                        && !tried.contains(&q)
                        && !self.is_pending(q)
                })
                .min_by_key(|&q| self.last_use[q]);
            let Some(v) = victim else {
                oxccl_env::info!(
                    Subsys::INIT,
                    "rank {rank}: {} connections made on first use held ({} offered for release, not answered yet), {need} more needed: past OXCCL_P2P_MAX_PEERS={}",
                    self.held(links.controls),
                    self.pending.len(),
                    self.max
                );
                return Ok(());
            };
            tried.push(v);
            self.offer(links, v, limit);
            if self.is_pending(v) {
                self.await_answer(links, v, &busy, abort, limit, ANSWER_WINDOW.min(limit))?;
            }
        }
        Ok(())
    }

    /// Offers the release of the first-use pairs with `peers`, each of
    /// which does the same at the same point of the pair's traffic (the
    /// end of a batch of rounds of all-to-all, gather or scatter): both
    /// ends offer, each offer is the other's answer. Nothing is awaited
    /// here: the answers are read by the next waits ([`Pool::service`],
    /// [`Pool::settle`]), so a caller may go on with other pairs while they
    /// come. Pairs of creation, and those already released (the peer's
    /// offer came first and was answered), are left alone.
    pub fn offer_all(&mut self, links: &mut Links<'_>, peers: &[usize], limit: Duration) {
        for &q in peers {
            let first_use = !self.creation.get(q).copied().unwrap_or(true);
            if first_use && links.controls[q].is_some() && !self.is_pending(q) {
                self.offer(links, q, limit);
            }
        }
    }

    /// Waits for the answers to this rank's pending offers to `peers`,
    /// answering the others meanwhile; every wait observes `abort` and
    /// `limit`, and an error names the peer.
    pub fn settle(
        &mut self,
        links: &mut Links<'_>,
        peers: &[usize],
        abort: &AtomicBool,
        limit: Duration,
    ) -> Result<()> {
        for &q in peers {
            if self.is_pending(q) {
                self.await_answer(links, q, &|_| false, abort, limit, limit)?;
            }
        }
        Ok(())
    }

    /// Waits until each first-use pair with `peers` is released by the
    /// peer's offer, answered here: for pairs this rank only sent on, whose
    /// peer offers once it has received (an offer from this end could come
    /// before the peer took its receive and be declined). Answers the
    /// others meanwhile; observes `abort` and `limit`, and an error names
    /// the peer. A peer that destroyed its communicator counts as released.
    pub fn await_released(
        &mut self,
        links: &mut Links<'_>,
        peers: &[usize],
        abort: &AtomicBool,
        limit: Duration,
    ) -> Result<()> {
        let rank = self.rank;
        for &q in peers {
            if self.creation.get(q).copied().unwrap_or(true) {
                continue;
            }
            let start = Instant::now();
            let mut polls = 0u32;
            loop {
                self.service(links, &|_| false, None, false, limit);
                let Some(c) = links.controls[q].as_mut() else {
                    break;
                };
                if let Err(e) = c.check_while_waiting() {
                    if c.left() {
                        links.drop_pair(rank, q);
                        break;
                    }
                    return Err(e.context(format!(
                        "rank {rank}: waiting for rank {q} to release their connection"
                    )));
                }
                if abort.load(Ordering::Acquire) {
                    return Err(Error::remote(format!(
                        "rank {rank}: waiting for rank {q} to release their connection: aborted (ncclCommAbort or ncclCommRevoke)"
                    )));
                }
                if start.elapsed() >= limit {
                    return Err(Error::timeout(format!(
                        "rank {rank}: rank {q} did not release their connection within {:.1} s (OXCCL_TIMEOUT_MS)",
                        limit.as_secs_f64()
                    )));
                }
                polls += 1;
                if polls < 200 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
        Ok(())
    }

    /// Waits for `v`'s answer to this rank's pending offer, at most
    /// `window` (then the offer stays pending), answering the others
    /// meanwhile. Fails on an abort, a failed peer, or `limit` passed
    /// (`window` = `limit`), naming `v`.
    fn await_answer(
        &mut self,
        links: &mut Links<'_>,
        v: usize,
        busy: &dyn Fn(usize) -> bool,
        abort: &AtomicBool,
        limit: Duration,
        window: Duration,
    ) -> Result<()> {
        let rank = self.rank;
        let start = Instant::now();
        let mut polls = 0u32;
        loop {
            if abort.load(Ordering::Acquire) {
                return Err(Error::remote(format!(
                    "rank {rank}: releasing its connection to rank {v}: aborted (ncclCommAbort or ncclCommRevoke)"
                )));
            }
            match self.read_answer(links, v)? {
                Answer::Released | Answer::Kept => return Ok(()),
                Answer::NotYet => {}
            }
            // Offers to this rank are answered meanwhile: the peer may be
            // waiting for one of them itself.
            self.service(links, busy, Some(v), false, limit);
            let waited = start.elapsed();
            if waited >= window {
                if window >= limit {
                    return Err(Error::timeout(format!(
                        "rank {rank}: rank {v} did not answer the release of their connection within {:.1} s (OXCCL_TIMEOUT_MS)",
                        limit.as_secs_f64()
                    )));
                }
                return Ok(());
            }
            polls += 1;
            if polls < 200 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}
