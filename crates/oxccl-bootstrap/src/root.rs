//! The root: collects one join per rank, then sends the whole table to
//! the top levels of the tree that fit in `root_table_budget` (rank 0 at
//! least) and every other rank its route (its parent's and children's
//! entries: [`route`]); the table travels down the tree from there.
//!
//! [`Rendezvous`] is the pure decision (checks and completion); [`spawn_root`]
//! is the driver: an accept thread that runs the [`gate`] (handshakes and
//! join frames of every incoming connection in one poll loop, bounded in
//! number and time, so silent or slow clients cannot hold up the ranks), and
//! a coordinator thread that feeds joins to the [`Rendezvous`].
//!
//! Lifetime: the root serves one rendezvous. Its clock is `init_timeout` from
//! the first join (or from its start while nobody has joined). When it runs
//! out, every waiting rank gets a `Timeout` naming the ranks that never came,
//! and the root exits with a WARN. After a violation (nranks mismatch,
//! duplicate rank) the root answers every connected and every later rank with
//! the same `InvalidUsage` until its clock runs out; likewise with a `Remote`
//! error naming a rank that joined and then closed its connection (it died
//! during init), seen within 50 ms. A rank that dies before it joins is
//! only known as missing when the clock runs out.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use oxccl_core::{Error, Result};
use oxccl_env::log::Waiting;
use oxccl_env::{info, warn, Subsys};

use crate::gate;
use crate::route;
use crate::sys;
use crate::wire::{self, Dec, Enc, Limits, POLL, T_JOIN, T_ROUTE, T_TABLE, T_TOP};
use crate::PeerInfo;

/// What a rank tells the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Join {
    pub nranks: usize,
    pub run_id: u64,
    /// The joining rank's own init timeout, in milliseconds: the root waits
    /// for the missing ranks no longer than the most impatient rank, so that
    /// rank hears which ranks are missing instead of timing out blind.
    pub timeout_ms: u64,
    pub info: PeerInfo,
}

pub(crate) fn encode_peer(m: &mut Enc, p: &PeerInfo) {
    m.u32(p.rank as u32)
        .str(&p.hostname)
        .u64(p.host_hash)
        .u32(p.pid)
        .u64(p.process_token)
        .addr(&p.listen_addr)
        .addr(&p.data_addr);
}

pub(crate) fn decode_peer(d: &mut Dec) -> Result<PeerInfo> {
    Ok(PeerInfo {
        rank: d.u32()? as usize,
        hostname: d.str()?,
        host_hash: d.u64()?,
        pid: d.u32()?,
        process_token: d.u64()?,
        listen_addr: d.addr()?,
        data_addr: d.addr()?,
    })
}

impl Join {
    pub fn encode(&self) -> Vec<u8> {
        let mut m = Enc::new(T_JOIN);
        m.u32(self.nranks as u32)
            .u64(self.run_id)
            .u64(self.timeout_ms);
        encode_peer(&mut m, &self.info);
        m.0
    }
    pub fn decode(b: &[u8]) -> Result<Join> {
        let mut d = Dec::new(b, "join");
        if d.u8()? != T_JOIN {
            return Err(Error::remote("bootstrap: expected a join message"));
        }
        let nranks = d.u32()? as usize;
        let run_id = d.u64()?;
        let timeout_ms = d.u64()?;
        let info = decode_peer(&mut d)?;
        d.end()?;
        Ok(Join {
            nranks,
            run_id,
            timeout_ms,
            info,
        })
    }
}

pub(crate) fn encode_table(t: &[PeerInfo]) -> Vec<u8> {
    table_frame(Enc::new(T_TABLE), t)
}

/// The root's reply to the ranks `0..direct` it sends the table to.
pub(crate) fn encode_top(t: &[PeerInfo], direct: usize) -> Vec<u8> {
    let mut m = Enc::new(T_TOP);
    m.u32(direct as u32);
    table_frame(m, t)
}

fn table_frame(mut m: Enc, t: &[PeerInfo]) -> Vec<u8> {
    m.u32(t.len() as u32);
    for p in t {
        encode_peer(&mut m, p);
    }
    m.0
}

/// Where a rank's table comes from: its parent's entry, and its children's
/// (whom it tells if it gives up before the table came).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Route {
    /// Ranks `0..direct` have the table from the root.
    pub direct: usize,
    pub parent: PeerInfo,
    pub children: Vec<PeerInfo>,
}

impl Route {
    /// Rank `rank`'s route in `table` when the root sends the table to
    /// `direct` ranks (`None` for those).
    pub fn of(rank: usize, table: &[PeerInfo], direct: usize) -> Option<Route> {
        let n = table.len();
        let parent = route::table_parent(rank, n, direct)?;
        Some(Route {
            direct,
            parent: table[parent].clone(),
            children: route::table_children(rank, n, direct)
                .into_iter()
                .map(|c| table[c].clone())
                .collect(),
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut m = Enc::new(T_ROUTE);
        m.u32(self.direct as u32);
        encode_peer(&mut m, &self.parent);
        m.u8(self.children.len() as u8);
        for c in &self.children {
            encode_peer(&mut m, c);
        }
        m.0
    }

    /// Decodes a route (type byte already consumed).
    pub fn decode(d: &mut Dec) -> Result<Route> {
        let direct = d.u32()? as usize;
        let parent = decode_peer(d)?;
        let k = d.u8()? as usize;
        if k > 2 {
            return Err(Error::remote(format!(
                "bootstrap: a route with {k} children (at most 2)"
            )));
        }
        let children = (0..k).map(|_| decode_peer(d)).collect::<Result<_>>()?;
        d.end()?;
        Ok(Route {
            direct,
            parent,
            children,
        })
    }
}

/// Decodes a table (type byte already consumed).
pub(crate) fn decode_table(d: &mut Dec) -> Result<Vec<PeerInfo>> {
    let n = d.u32()? as usize;
    // Each entry is at least 68 bytes: bound n before reserving.
    let mut v = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        v.push(decode_peer(d)?);
    }
    d.end()?;
    Ok(v)
}

/// The root's decision for one join.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Keep the connection and wait for more ranks.
    Wait,
    /// Everyone is here: the table, in rank order.
    Complete(Vec<PeerInfo>),
    /// Refuse this join only (it is not part of this run).
    RejectOne(Error),
    /// The run cannot proceed: tell every connected rank.
    RejectAll(Error),
}

/// The pure rendezvous state.
#[derive(Debug)]
pub(crate) struct Rendezvous {
    run_id: u64,
    first: Option<(usize, usize)>,
    joined: BTreeMap<usize, PeerInfo>,
    failed: Option<Error>,
}

impl Rendezvous {
    pub fn new(run_id: u64) -> Rendezvous {
        Rendezvous {
            run_id,
            first: None,
            joined: BTreeMap::new(),
            failed: None,
        }
    }

    fn fail(&mut self, e: Error) -> Verdict {
        self.failed = Some(e.clone());
        Verdict::RejectAll(e)
    }

    pub fn on_join(&mut self, j: Join) -> Verdict {
        let r = j.info.rank;
        if j.run_id != self.run_id {
            // Deliberately not fatal for the others: a stray rank of another
            // run (which somehow holds our secret) must not kill this one.
            return Verdict::RejectOne(Error::invalid_usage(format!(
                "bootstrap: rank {r} joined with run id {:#x} but this root serves run {:#x}; its unique id belongs to another run",
                j.run_id, self.run_id
            )));
        }
        if let Some(e) = &self.failed {
            return Verdict::RejectOne(e.clone());
        }
        if j.nranks == 0 || r >= j.nranks {
            return self.fail(Error::invalid_usage(format!(
                "bootstrap: rank {r} joined with nranks={} (rank out of range)",
                j.nranks
            )));
        }
        match self.first {
            Some((r0, n0)) if n0 != j.nranks => {
                return self.fail(Error::invalid_usage(format!(
                    "bootstrap: rank {r} joined with nranks={} but rank {r0} said {n0}",
                    j.nranks
                )));
            }
            Some(_) => {}
            None => self.first = Some((r, j.nranks)),
        }
        if self.joined.contains_key(&r) {
            return self.fail(Error::invalid_usage(format!(
                "bootstrap: rank {r} joined twice (were two processes given the same rank?)"
            )));
        }
        self.joined.insert(r, j.info);
        if self.joined.len() == j.nranks {
            Verdict::Complete(self.joined.values().cloned().collect())
        } else {
            Verdict::Wait
        }
    }

    /// Rank `r`, which joined, closed its connection before the table went
    /// out: it exited or was killed during init, so the rendezvous cannot
    /// complete. Every connected rank, and every later one, hears its name
    /// now instead of at the init timeout.
    pub fn on_leave(&mut self, r: usize) -> Verdict {
        if let Some(e) = &self.failed {
            return Verdict::RejectOne(e.clone());
        }
        let n = self.first.map_or(0, |(_, n)| n);
        let who = match self.joined.remove(&r) {
            Some(p) => format!("rank {r} of {n} (pid {} on {})", p.pid, p.hostname),
            None => format!("rank {r} of {n}"),
        };
        self.fail(Error::remote(format!(
            "bootstrap: {who} closed its connection to the root before every rank had joined: its process exited or was killed during init"
        )))
    }

    pub fn any_joined(&self) -> bool {
        self.first.is_some()
    }

    pub fn failed(&self) -> bool {
        self.failed.is_some()
    }

    /// "rank 3" / "ranks 3, 5" (at most 16 named, then how many more) and
    /// nranks: the ranks that have not joined. `None` before the first join
    /// (nranks is not known yet).
    fn missing(&self) -> Option<(String, usize)> {
        const NAMED: usize = 16;
        let (_, n) = self.first?;
        let missing: Vec<usize> = (0..n).filter(|r| !self.joined.contains_key(r)).collect();
        let who = if missing.len() == 1 { "rank" } else { "ranks" };
        let mut list: Vec<String> = missing.iter().take(NAMED).map(|r| r.to_string()).collect();
        if missing.len() > NAMED {
            list.push(format!("and {} more", missing.len() - NAMED));
        }
        Some((format!("{who} {}", list.join(", ")), n))
    }

    /// "ranks 3, 5 of 8 never connected to the root at ADDR within 30 s".
    pub fn missing_message(&self, root: SocketAddr, t: Duration) -> Option<String> {
        let (who, n) = self.missing()?;
        Some(format!(
            "bootstrap: {who} of {n} never connected to the root at {root} within {}",
            wire::secs(t)
        ))
    }

    /// What the root is waiting for, for its periodic notice: "bootstrap:
    /// root at ADDR waiting for rank 1 of 2 to connect, 1 connected".
    pub fn waiting_message(&self, root: SocketAddr) -> String {
        match self.missing() {
            Some((who, n)) => format!(
                "bootstrap: root at {root} waiting for {who} of {n} to connect, {} connected",
                self.joined.len(),
            ),
            None => format!("bootstrap: root at {root} waiting for the first rank to connect"),
        }
    }
}

struct Arrival {
    stream: TcpStream,
    join: Join,
}

/// Starts the root on `listener` (threads; returns at once).
pub(crate) fn spawn_root(
    listener: TcpListener,
    secret: [u8; 32],
    run_id: u64,
    cfg: &crate::BootstrapConfig,
) -> Result<()> {
    let (init_timeout, abort, budget) =
        (cfg.init_timeout, cfg.abort.clone(), cfg.root_table_budget);
    let addr = listener
        .local_addr()
        .map_err(|e| Error::system(format!("bootstrap root: local_addr failed: {e}")))?;
    let done = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<Arrival>();
    {
        let done = done.clone();
        std::thread::Builder::new()
            .name("oxccl-root-accept".into())
            .spawn(move || accept_loop(listener, addr, secret, tx, done))
            .map_err(|e| Error::system(format!("bootstrap root: cannot spawn a thread: {e}")))?;
    }
    std::thread::Builder::new()
        .name("oxccl-root".into())
        .spawn(move || {
            coordinate(addr, run_id, init_timeout, budget, &abort, rx);
            done.store(true, Ordering::Relaxed);
        })
        .map_err(|e| Error::system(format!("bootstrap root: cannot spawn a thread: {e}")))?;
    Ok(())
}

/// Admits connections through the [`gate`] and forwards each valid join to
/// the coordinator, until the coordinator is done.
fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    secret: [u8; 32],
    tx: mpsc::Sender<Arrival>,
    done: Arc<AtomicBool>,
) {
    let what = format!("bootstrap root at {addr}");
    gate::serve(
        listener,
        secret,
        what,
        || !done.load(Ordering::Relaxed),
        |a| match Join::decode(&a.first) {
            Ok(join) => {
                if wire::prepare(&a.stream).is_ok() {
                    let _ = tx.send(Arrival {
                        stream: a.stream,
                        join,
                    });
                }
            }
            Err(e) => warn!(
                "bootstrap: connection from {}: {}; dropped",
                a.peer,
                e.message()
            ),
        },
    );
}

fn send_best_effort(s: &mut TcpStream, payload: &[u8], abort: &AtomicBool) {
    let lim = Limits::new(Duration::from_secs(2), abort);
    let _ = wire::write_frame(s, payload, &lim);
}

fn coordinate(
    addr: SocketAddr,
    run_id: u64,
    t: Duration,
    budget: usize,
    abort: &AtomicBool,
    rx: mpsc::Receiver<Arrival>,
) {
    let mut rv = Rendezvous::new(run_id);
    let mut deadline = Instant::now() + t;
    // The shortest timeout in play, for messages.
    let mut eff = t;
    // The connections of the ranks that joined, each with its rank.
    let mut conns: Vec<(usize, TcpStream)> = Vec::new();
    let mut waiting = Waiting::new(Subsys::BOOTSTRAP);
    loop {
        if !rv.failed() {
            waiting.tick(eff, || rv.waiting_message(addr));
        }
        if abort.load(Ordering::Relaxed) {
            let e = wire::encode_error(&wire::aborted());
            for (_, c) in &mut conns {
                send_best_effort(c, &e, abort);
            }
            return;
        }
        let now = Instant::now();
        if now >= deadline {
            if rv.failed() {
                return;
            }
            match rv.missing_message(addr, eff) {
                Some(msg) => {
                    warn!("{msg}; the root gives up");
                    let e = wire::encode_error(&Error::timeout(msg));
                    for (_, c) in &mut conns {
                        send_best_effort(c, &e, abort);
                    }
                }
                None => warn!(
                    "bootstrap: no rank connected to the root at {addr} within {}; the root exits",
                    wire::secs(t)
                ),
            }
            return;
        }
        // A rank that joined never writes again before the table: a closed
        // connection is a rank that died (checked every POLL, 50 ms).
        if let Some(i) = conns.iter().position(|(_, c)| sys::stream_closed(c)) {
            let (r, _) = conns.remove(i);
            if let Verdict::RejectAll(e) = rv.on_leave(r) {
                warn!("{}", e.message());
                let p = wire::encode_error(&e);
                for (_, c) in &mut conns {
                    send_best_effort(c, &p, abort);
                }
                conns.clear();
            }
            continue;
        }
        let a = match rx.recv_timeout((deadline - now).min(POLL)) {
            Ok(a) => a,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        // The root's clock: its own timeout from the first arrival, shortened
        // to any joining rank's timeout (counted from that rank's arrival).
        let now = Instant::now();
        let jt = Duration::from_millis(a.join.timeout_ms.max(1));
        if !rv.any_joined() {
            deadline = now + t.min(jt);
        } else {
            deadline = deadline.min(now + jt);
        }
        eff = eff.min(jt);
        let mut s = a.stream;
        let rank = a.join.info.rank;
        match rv.on_join(a.join) {
            Verdict::Wait => conns.push((rank, s)),
            Verdict::RejectOne(e) => {
                warn!("{}", e.message());
                send_best_effort(&mut s, &wire::encode_error(&e), abort);
            }
            Verdict::RejectAll(e) => {
                warn!("{}", e.message());
                let p = wire::encode_error(&e);
                conns.push((rank, s));
                for (_, c) in &mut conns {
                    send_best_effort(c, &p, abort);
                }
                conns.clear();
            }
            Verdict::Complete(table) => {
                conns.push((rank, s));
                // The table to the top of the tree first (rank order is
                // level order), then each other rank its route (one to
                // three entries).
                let len = encode_table(&table).len();
                let direct = route::table_direct_ranks_within(table.len(), len, budget);
                let p = encode_top(&table, direct);
                conns.sort_by_key(|(r, _)| (*r >= direct, *r));
                let lim = Limits::new(t, abort);
                for (r, c) in &mut conns {
                    let _ = match Route::of(*r, &table, direct) {
                        None => wire::write_frame(c, &p, &lim),
                        Some(route) => wire::write_frame(c, &route.encode(), &lim),
                    };
                }
                info!(
                    Subsys::BOOTSTRAP,
                    "bootstrap: root at {addr}: all {} ranks connected",
                    table.len()
                );
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn j(rank: usize, nranks: usize, run: u64) -> Join {
        Join {
            nranks,
            run_id: run,
            timeout_ms: 1000,
            info: PeerInfo {
                rank,
                hostname: "h".into(),
                host_hash: 1,
                pid: 2,
                process_token: 3,
                listen_addr: "127.0.0.1:9".parse().unwrap(),
                data_addr: "127.0.0.1:9".parse().unwrap(),
            },
        }
    }

    #[test]
    fn completes_in_rank_order() {
        let mut r = Rendezvous::new(7);
        assert_eq!(r.on_join(j(2, 3, 7)), Verdict::Wait);
        assert_eq!(r.on_join(j(0, 3, 7)), Verdict::Wait);
        match r.on_join(j(1, 3, 7)) {
            Verdict::Complete(t) => {
                assert_eq!(t.iter().map(|p| p.rank).collect::<Vec<_>>(), [0, 1, 2])
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_rank_that_leaves_fails_the_run_naming_it() {
        let mut r = Rendezvous::new(7);
        assert_eq!(r.on_join(j(0, 3, 7)), Verdict::Wait);
        assert_eq!(r.on_join(j(2, 3, 7)), Verdict::Wait);
        let Verdict::RejectAll(e) = r.on_leave(2) else {
            panic!("a leaving rank must fail the run")
        };
        assert_eq!(e.kind(), oxccl_core::ErrorKind::Remote);
        assert!(
            e.message().starts_with(
                "bootstrap: rank 2 of 3 (pid 2 on h) closed its connection to the root"
            ),
            "{e}"
        );
        // Later joins hear the same.
        assert_eq!(r.on_join(j(1, 3, 7)), Verdict::RejectOne(e.clone()));
        assert_eq!(r.on_leave(0), Verdict::RejectOne(e));
    }

    #[test]
    fn violations() {
        let mut r = Rendezvous::new(7);
        assert_eq!(r.on_join(j(0, 8, 7)), Verdict::Wait);
        match r.on_join(j(3, 4, 7)) {
            Verdict::RejectAll(e) => assert_eq!(
                e.message(),
                "bootstrap: rank 3 joined with nranks=4 but rank 0 said 8"
            ),
            v => panic!("{v:?}"),
        }
        // Later arrivals get the same error.
        assert!(matches!(r.on_join(j(1, 8, 7)), Verdict::RejectOne(_)));

        let mut r = Rendezvous::new(7);
        r.on_join(j(2, 4, 7));
        match r.on_join(j(2, 4, 7)) {
            Verdict::RejectAll(e) => assert!(e.message().contains("rank 2 joined twice")),
            v => panic!("{v:?}"),
        }
        let mut r = Rendezvous::new(7);
        assert!(matches!(r.on_join(j(0, 2, 8)), Verdict::RejectOne(_)));
        assert!(!r.any_joined());
    }

    #[test]
    fn missing_names_ranks() {
        let mut r = Rendezvous::new(1);
        for k in [0, 1, 2, 4, 6, 7] {
            r.on_join(j(k, 8, 1));
        }
        assert_eq!(
            r.missing_message("10.0.0.1:4444".parse().unwrap(), Duration::from_secs(30))
                .unwrap(),
            "bootstrap: ranks 3, 5 of 8 never connected to the root at 10.0.0.1:4444 within 30 s"
        );
        assert_eq!(
            r.waiting_message("10.0.0.1:4444".parse().unwrap()),
            "bootstrap: root at 10.0.0.1:4444 waiting for ranks 3, 5 of 8 to connect, 6 connected"
        );
        let fresh = Rendezvous::new(1);
        assert_eq!(
            fresh.waiting_message("10.0.0.1:4444".parse().unwrap()),
            "bootstrap: root at 10.0.0.1:4444 waiting for the first rank to connect"
        );
        let mut big = Rendezvous::new(1);
        big.on_join(j(0, 100, 1));
        let m = big.missing_message("10.0.0.1:4444".parse().unwrap(), Duration::from_secs(1));
        assert!(
            m.unwrap().starts_with("bootstrap: ranks 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, and 83 more of 100 never"),
        );
    }

    #[test]
    fn codec_round_trip() {
        let x = j(5, 9, 3);
        assert_eq!(Join::decode(&x.encode()).unwrap(), x);
        let t = vec![x.info.clone(), j(6, 9, 3).info];
        let b = encode_table(&t);
        let mut d = Dec::new(&b[1..], "table");
        assert_eq!(decode_table(&mut d).unwrap(), t);
        assert!(Join::decode(&b[..10]).is_err());
    }

    #[test]
    fn routes_name_the_parent_and_children() {
        let table: Vec<PeerInfo> = (0..6).map(|r| j(r, 6, 1).info).collect();
        assert_eq!(Route::of(0, &table, 1), None);
        let r2 = Route::of(2, &table, 1).unwrap();
        assert_eq!(r2.parent.rank, 0);
        assert_eq!(r2.children.iter().map(|p| p.rank).collect::<Vec<_>>(), [5]);
        let r1 = Route::of(1, &table, 1).unwrap();
        assert_eq!(
            r1.children.iter().map(|p| p.rank).collect::<Vec<_>>(),
            [3, 4]
        );
        assert!(Route::of(5, &table, 1).unwrap().children.is_empty());
        // The root serving ranks 0..3: rank 1 forwards to 3 and 4; 2 gets
        // the table from the root.
        assert_eq!(Route::of(2, &table, 3), None);
        assert_eq!(Route::of(3, &table, 3).unwrap().parent.rank, 1);
        for r in [r1, r2] {
            let b = r.encode();
            assert_eq!(b[0], T_ROUTE);
            let mut d = Dec::new(&b[1..], "route");
            assert_eq!(Route::decode(&mut d).unwrap(), r);
            // Truncated or padded: refused.
            assert!(Route::decode(&mut Dec::new(&b[1..b.len() - 1], "route")).is_err());
            let padded = [&b[1..], &[0]].concat();
            assert!(Route::decode(&mut Dec::new(&padded, "route")).is_err());
        }
    }
}
