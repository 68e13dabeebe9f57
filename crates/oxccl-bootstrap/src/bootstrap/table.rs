//! The rank table down the tree of [`route`](crate::route).
//!
//! Rank 0 has the table from the root; every other rank has from the root
//! its route (its parent's and children's entries) and waits for the table
//! on the message channel its parent opens to it, in messages of at most
//! [`CHUNK`] bytes (the first starts with the table's length), so a table
//! past the 16 MiB message cap still travels. Once a rank has the table it
//! forwards it to its children over the same authenticated channels the
//! barrier and broadcast use afterwards.
//!
//! The wait watches the parent like any wait for a peer: its channel
//! closing, its process exiting (same host), a refused or closed probe
//! connection to it, each for [`GONE_GRACE`]; and the abort flag and the
//! init timeout. A rank that gives up waiting tells its children why (a
//! notice, as [`Bootstrap::announce_failure`] sends), so the whole subtree
//! of a dead rank names it within a fraction of a second per level.

use super::*;
use crate::route;

/// Largest message of the table down the tree: a quarter of the message
/// cap, so a child's mailbox bound (two full messages per peer) holds
/// several in flight.
pub(super) const CHUNK: usize = DATA_CAP / 4;

/// Bytes of the length that starts the first message.
const LEN_BYTES: usize = 8;

#[cfg(test)]
static CHUNK_OVERRIDE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn chunk() -> usize {
    #[cfg(test)]
    {
        let o = CHUNK_OVERRIDE.load(Ordering::Relaxed);
        if o > 0 {
            return o;
        }
    }
    CHUNK
}

/// Whether `table` lists `nranks` ranks in rank order with `me` at its place.
pub(super) fn consistent(table: &[PeerInfo], nranks: usize, me: &PeerInfo) -> bool {
    table.len() == nranks
        && table.iter().enumerate().all(|(i, p)| p.rank == i)
        && table.get(me.rank) == Some(me)
}

/// The messages that carry `table` (its encoding): the first starts with
/// its length (u64, little-endian); each holds at most `chunk` bytes of it
/// (`chunk` > 0).
pub(super) fn split(table: &[u8], chunk: usize) -> Vec<Vec<u8>> {
    let mut parts = table.chunks(chunk.max(1));
    let mut first = (table.len() as u64).to_le_bytes().to_vec();
    first.extend_from_slice(parts.next().unwrap_or(&[]));
    std::iter::once(first)
        .chain(parts.map(<[u8]>::to_vec))
        .collect()
}

/// Reassembles [`split`]'s messages, refusing a length above `cap`.
pub(super) struct Assembly {
    want: Option<usize>,
    buf: Vec<u8>,
    cap: usize,
}

impl Assembly {
    pub fn new(cap: usize) -> Assembly {
        Assembly {
            want: None,
            buf: Vec::new(),
            cap,
        }
    }

    /// Takes the next message; the whole table once it is complete.
    pub fn push(&mut self, m: &[u8]) -> Result<Option<Vec<u8>>> {
        let body = match self.want {
            Some(_) => m,
            None => {
                let (len, rest) = m.split_first_chunk::<LEN_BYTES>().ok_or_else(|| {
                    Error::remote("bootstrap: a rank table message without its length")
                })?;
                let len = u64::from_le_bytes(*len);
                if len > self.cap as u64 {
                    return Err(Error::remote(format!(
                        "bootstrap: a rank table of {len} bytes (at most {} for this many ranks)",
                        self.cap
                    )));
                }
                self.want = Some(len as usize);
                self.buf.reserve(len as usize);
                rest
            }
        };
        let want = self.want.unwrap_or(0);
        if self.buf.len() + body.len() > want {
            return Err(Error::remote(format!(
                "bootstrap: a rank table longer than the {want} bytes announced"
            )));
        }
        self.buf.extend_from_slice(body);
        Ok((self.buf.len() == want).then(|| std::mem::take(&mut self.buf)))
    }
}

/// "rank 3 of 8 (pid 77 on node1)".
fn named(p: &PeerInfo, nranks: usize) -> String {
    format!(
        "rank {} of {nranks} (pid {} on {})",
        p.rank, p.pid, p.hostname
    )
}

impl Bootstrap {
    /// Waits for the table from `route.parent` (see the module docs); on
    /// failure tells `route.children` why before returning the error.
    pub(super) fn table_from(
        &self,
        route: &Route,
        me: &PeerInfo,
        start: Instant,
    ) -> Result<Vec<PeerInfo>> {
        self.wait_table(route, me, start).inspect_err(|e| {
            self.tell_children(route, e);
        })
    }

    fn wait_table(&self, route: &Route, me: &PeerInfo, start: Instant) -> Result<Vec<PeerInfo>> {
        let (p, n) = (&route.parent, self.nranks);
        let lim = Limits {
            deadline: start.checked_add(self.cfg.init_timeout),
            timeout: self.cfg.init_timeout,
            abort: &self.cfg.abort,
            stop: None,
        };
        let gone = |why: String| {
            self.prefer_notice(Error::remote(format!(
                "bootstrap: {}, the parent of rank {} in the rank table's tree, went away before forwarding the table: {why}",
                named(p, n),
                self.rank
            )))
        };
        let mut asm = Assembly::new(wire::table_cap(n));
        let mut waiting = Waiting::since(start, Subsys::BOOTSTRAP);
        let mut next_look = Instant::now() + LIVENESS_EVERY;
        let mut gone_since: Option<Instant> = None;
        let mut g = self.shared.lock();
        loop {
            while let Some(m) = take(&mut g, p.rank) {
                if let Some(bytes) = asm.push(&m)? {
                    drop(g);
                    return self.decode_forwarded(&bytes, route, me);
                }
            }
            if let Some(e) = self.notice(&g) {
                return Err(e);
            }
            if let Some(why) = g.closed.get(&p.rank).cloned() {
                drop(g);
                return Err(gone(why));
            }
            lim.check().map_err(|e| {
                if e.kind() == ErrorKind::Timeout {
                    Error::timeout(format!(
                        "bootstrap: rank {} of {n}: no rank table from {}, its parent in the rank table's tree, within {}",
                        self.rank,
                        named(p, n),
                        wire::secs(self.cfg.init_timeout)
                    ))
                } else {
                    e
                }
            })?;
            waiting.tick(self.cfg.init_timeout, || {
                format!(
                    "bootstrap: rank {} of {n} waiting for the rank table from {}, its parent in the rank table's tree",
                    self.rank,
                    named(p, n)
                )
            });
            g = self
                .shared
                .cv
                .wait_timeout(g, POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            let now = Instant::now();
            if now >= next_look {
                drop(g);
                let why = self.parent_gone(p, me);
                g = self.shared.lock();
                next_look = Instant::now() + LIVENESS_EVERY;
                match why {
                    None => gone_since = None,
                    Some(why) => {
                        let since = *gone_since.get_or_insert(now);
                        // Its last messages have had GONE_GRACE to arrive.
                        if now.duration_since(since) >= GONE_GRACE
                            && g.msgs
                                .get(&(p.rank, NS_TABLE, 0))
                                .is_none_or(|q| q.is_empty())
                        {
                            drop(g);
                            return Err(gone(why));
                        }
                    }
                }
            }
        }
    }

    /// Why the parent `p` looks gone, or None while it looks alive (the
    /// checks of [`Bootstrap::peer_gone`], from its entry in the route).
    /// Until a probe connection to it succeeds, every look tries one (a
    /// stopped parent holds a probe for at most [`PROBE_LIMIT`]).
    fn parent_gone(&self, p: &PeerInfo, me: &PeerInfo) -> Option<String> {
        let same_process =
            p.host_hash == me.host_hash && p.pid == me.pid && p.process_token == me.process_token;
        if p.host_hash == me.host_hash && !same_process && sys::process_gone(p.pid) {
            return Some(format!(
                "its process (pid {} on {}) exited",
                p.pid, p.hostname
            ));
        }
        let Ok(mut out) = self.out.try_lock() else {
            return None;
        };
        match out.get(&p.rank) {
            Some(s) if sys::stream_closed(s) => {
                out.remove(&p.rank);
                Some("it closed its connection (it exited or was killed)".to_string())
            }
            Some(_) => None,
            None => {
                let left = self.cfg.init_timeout.min(PROBE_LIMIT);
                let lim = Limits::new(left, &self.cfg.abort);
                match self.dial_entry(p, &lim) {
                    // Kept: the channel to the parent serves the barrier.
                    Ok(s) => {
                        out.insert(p.rank, s);
                        None
                    }
                    Err(e) if e.kind() == ErrorKind::Remote => Some(e.message().to_string()),
                    Err(_) => None,
                }
            }
        }
    }

    /// A message channel to the rank of entry `p` (the table is not here
    /// yet, so [`Bootstrap::dial`] cannot look it up).
    fn dial_entry(&self, p: &PeerInfo, lim: &Limits) -> Result<TcpStream> {
        let who = format!("rank {}", p.rank);
        let mut s = connect_authenticated(p.listen_addr, &self.key, lim, &who, false, false, None)?;
        wire::write_frame(
            &mut s,
            &encode_hello(self.rank, self.run_id, KIND_MSG, 0),
            lim,
        )?;
        Ok(s)
    }

    /// Tells the children of `route` that this rank gave up waiting for the
    /// table and why (best effort, [`NOTICE_BUDGET`] in all).
    fn tell_children(&self, route: &Route, e: &Error) {
        if route.children.is_empty() {
            return;
        }
        let why = notice_text(e);
        let mut notice = vec![e.kind().code() as u8];
        notice.extend_from_slice(why.as_bytes());
        let msg = encode_message(NS_FAILED, 0, &notice);
        let lim = Limits::new(NOTICE_BUDGET, &self.cfg.abort);
        for c in &route.children {
            let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
            let sent = match out.remove(&c.rank) {
                Some(s) => Ok(s),
                None => self.dial_entry(c, &lim),
            }
            .and_then(|mut s| wire::write_frame(&mut s, &msg, &lim).map(|()| s));
            if let Ok(s) = sent {
                out.insert(c.rank, s);
            }
        }
    }

    /// The forwarded table, checked against this rank's entry and route.
    fn decode_forwarded(
        &self,
        bytes: &[u8],
        route: &Route,
        me: &PeerInfo,
    ) -> Result<Vec<PeerInfo>> {
        let p = &route.parent;
        let bad = |what: String| {
            Error::internal(format!(
                "bootstrap: rank {} of {} forwarded an inconsistent rank table to rank {}: {what}",
                p.rank, self.nranks, self.rank
            ))
        };
        let mut d = Dec::new(bytes, "rank table");
        if d.u8()? != wire::T_TABLE {
            return Err(bad("not a table".into()));
        }
        let table = decode_table(&mut d).map_err(|e| bad(e.message().to_string()))?;
        if !consistent(&table, self.nranks, me) {
            return Err(bad(format!(
                "{} entries, or this rank's entry differs",
                table.len()
            )));
        }
        let children: Vec<usize> = route.children.iter().map(|c| c.rank).collect();
        let same = table[p.rank] == *p
            && route.children.iter().all(|c| table[c.rank] == *c)
            && children == route::table_children(self.rank, self.nranks, route.direct);
        if !same {
            return Err(bad("its entries differ from the root's".into()));
        }
        Ok(table)
    }

    /// Sends the table to this rank's children in the tree, both at once
    /// (a child that hangs does not hold up its sibling); a child that
    /// cannot be reached fails this rank's init, naming it, and every rank
    /// hears why.
    pub(super) fn forward_table(&self, direct: usize) -> Result<()> {
        let table = root::encode_table(&self.peers);
        let children = route::table_children(self.rank, self.nranks, direct);
        if children.is_empty() {
            return Ok(());
        }
        let parts = split(&table, chunk());
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let hs: Vec<_> = children
                .iter()
                .map(|&c| {
                    let parts = &parts;
                    std::thread::Builder::new()
                        .name("oxccl-bs-table".into())
                        .spawn_scoped(s, move || self.send_parts(c, parts))
                })
                .collect();
            hs.into_iter()
                .zip(&children)
                .map(|(h, &c)| match h {
                    Ok(h) => h.join().unwrap_or_else(|_| {
                        Err(Error::internal(
                            "bootstrap: a table forwarding thread panicked",
                        ))
                    }),
                    // No thread: this one sends.
                    Err(_) => self.send_parts(c, &parts),
                })
                .collect()
        });
        let first = results.into_iter().zip(&children).find_map(|(r, &c)| {
            r.err().map(|e| {
                e.context(format!(
                    "bootstrap: rank {} forwarding the rank table to rank {c}",
                    self.rank
                ))
            })
        });
        match first {
            None => Ok(()),
            Some(e) => {
                self.announce_failure(&e);
                Err(e)
            }
        }
    }

    /// Sends `parts` to child `c` over a channel of its own, dialled
    /// without holding the channel map (sends to other peers go on), then
    /// kept as the channel to `c`.
    fn send_parts(&self, c: usize, parts: &[Vec<u8>]) -> Result<()> {
        let lim = self.limits();
        let held = self
            .out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&c);
        let mut s = match held {
            Some(s) => s,
            None => self
                .dial(c, KIND_MSG, 0, &lim)
                .map_err(|e| self.prefer_notice(e))?,
        };
        for part in parts {
            wire::write_frame(&mut s, &encode_message(NS_TABLE, 0, part), &lim)
                .map_err(|e| self.prefer_notice(e))?;
        }
        self.out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(c)
            .or_insert(s);
        Ok(())
    }
}

/// The next message of the table from `from`, off the mailbox's count.
fn take(g: &mut Mail, from: usize) -> Option<Vec<u8>> {
    let key = (from, NS_TABLE, 0);
    let q = g.msgs.get_mut(&key)?;
    let m = q.pop_front()?;
    if q.is_empty() {
        g.msgs.remove(&key);
    }
    if let Some(c) = g.queued.get_mut(&from) {
        c.0 = c.0.saturating_sub(m.len());
        c.1 = c.1.saturating_sub(1);
    }
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_reassemble_at_every_chunk_size() {
        let table: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        for chunk in [1, 2, 3, 99, 999, 1000, 1001, 1 << 20] {
            let parts = split(&table, chunk);
            assert_eq!(
                parts.len(),
                table.len().div_ceil(chunk).max(1),
                "chunk {chunk}"
            );
            assert!(parts.iter().skip(1).all(|p| p.len() <= chunk));
            let mut a = Assembly::new(table.len());
            let mut whole = None;
            for (i, p) in parts.iter().enumerate() {
                let got = a.push(p).unwrap();
                assert_eq!(
                    got.is_some(),
                    i + 1 == parts.len(),
                    "chunk {chunk} part {i}"
                );
                whole = whole.or(got);
            }
            assert_eq!(whole.unwrap(), table);
        }
        // An empty table is one message of its length.
        let parts = split(&[], 4);
        assert_eq!(parts, [vec![0u8; 8]]);
        assert_eq!(Assembly::new(0).push(&parts[0]).unwrap(), Some(vec![]));
    }

    #[test]
    fn reassembly_refuses_what_was_not_announced() {
        let parts = split(&[1, 2, 3, 4], 2);
        // Past the cap.
        let e = Assembly::new(3).push(&parts[0]).err().unwrap();
        assert!(
            e.message().contains("rank table of 4 bytes (at most 3"),
            "{e}"
        );
        // More than announced.
        let mut a = Assembly::new(10);
        a.push(&parts[0]).unwrap();
        assert!(a.push(&[9, 9, 9]).is_err());
        // No length.
        assert!(Assembly::new(10).push(&[1, 2]).is_err());
    }

    /// Joins as `rank` of `n` at the root of `id`, as a rank of another host
    /// whose listener is already closed, and returns the root's answer
    /// without forwarding anything: a rank that died after joining.
    fn join_and_vanish(id: &UniqueId, n: usize, rank: usize, cfg: &BootstrapConfig) -> RootReply {
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let me = PeerInfo {
            rank,
            hostname: "elsewhere".into(),
            host_hash: 1,
            pid: 1,
            process_token: 2,
            listen_addr: closed,
            data_addr: closed,
        };
        join_root(id, n, me, cfg, Instant::now()).unwrap()
    }

    /// Does `m` name rank 1 (of 10 ranks: no other rank starts with 1)?
    fn names_rank_1(m: &str) -> bool {
        m.contains("rank 1 ") || m.contains("rank 1:") || m.contains("rank 1,")
    }

    /// Rank 1 of 10 joins and is gone before forwarding: its children (3,
    /// 4) and grandchildren (7, 8, 9) fail naming it, well before the init
    /// timeout; rank 0 fails naming it (it cannot forward to it); rank 2,
    /// in the other subtree, has its table.
    #[test]
    fn a_parent_gone_before_forwarding_is_named_by_its_subtree() {
        let cfg = BootstrapConfig {
            ifname: Some("lo".into()),
            init_timeout: Duration::from_secs(60),
            // Every table but rank 0's down the tree.
            root_table_budget: 1,
            ..Default::default()
        };
        let id = UniqueId::generate(&cfg).unwrap();
        let n = 10;
        let t = Instant::now();
        let (results, reply) = std::thread::scope(|s| {
            let fake = s.spawn(|| join_and_vanish(&id, n, 1, &cfg));
            let hs: Vec<_> = (0..n)
                .filter(|&r| r != 1)
                .map(|r| {
                    let (id, cfg) = (&id, &cfg);
                    s.spawn(move || (r, Bootstrap::init(id, n, r, cfg).map(|b| b.peers().len())))
                })
                .collect();
            let results: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            (results, fake.join().unwrap())
        });
        let RootReply::Route(route) = reply else {
            panic!("rank 1 got the table from the root")
        };
        assert_eq!(route.parent.rank, 0);
        assert_eq!(
            route.children.iter().map(|c| c.rank).collect::<Vec<_>>(),
            [3, 4]
        );
        for (r, res) in results {
            match (r, res) {
                (2, Ok(len)) => assert_eq!(len, n),
                (2, Err(e)) => panic!("rank 2 has its table from rank 0: {e}"),
                // Rank 2 forwards to them; rank 0's notice may come first.
                (5 | 6, Ok(len)) => assert_eq!(len, n),
                (r, Ok(_)) => panic!("rank {r} finished init without rank 1"),
                (r, Err(e)) => {
                    assert_ne!(e.kind(), ErrorKind::Timeout, "rank {r}: {e}");
                    assert!(names_rank_1(e.message()), "rank {r}: {e}");
                    if [3, 4].contains(&r) {
                        assert!(
                            e.message()
                                .contains("rank 1 of 10 (pid 1 on elsewhere), the parent of rank")
                                || e.message().contains("rank 0 gave up"),
                            "rank {r}: {e}"
                        );
                    }
                }
            }
        }
        assert!(t.elapsed() < cfg.init_timeout, "{:?}", t.elapsed());
    }

    /// Rank 1 of 10 joins with a listener of its own, takes the table from
    /// rank 0, sees a stranger holding another key refused at its child's
    /// listener, then goes away (its listener and channels close) without
    /// forwarding it: its children (3, 4) see it gone themselves and fail
    /// naming it; their children (7, 8, 9) hear it from them; rank 0 and
    /// the other subtree (2, 5, 6) finish init.
    #[test]
    fn children_watch_a_parent_that_took_the_table_and_left() {
        let cfg = BootstrapConfig {
            ifname: Some("lo".into()),
            init_timeout: Duration::from_secs(60),
            // Every table but rank 0's down the tree.
            root_table_budget: 1,
            ..Default::default()
        };
        let id = UniqueId::generate(&cfg).unwrap();
        let n = 10;
        let shared = Arc::new(Shared {
            mail: Mutex::new(Mail::default()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let acceptor = spawn_acceptor(
            l,
            Accepts::Everything,
            *id.secret(),
            id.run_id(),
            n,
            shared.clone(),
            Arc::new(AtomicBool::new(false)),
        )
        .unwrap();
        let me = PeerInfo {
            rank: 1,
            hostname: "elsewhere".into(),
            host_hash: 1,
            pid: 1,
            process_token: 2,
            listen_addr: addr,
            data_addr: addr,
        };
        let results = std::thread::scope(|s| {
            let fake = s.spawn(|| {
                let reply = join_root(&id, n, me, &cfg, Instant::now()).unwrap();
                // The whole table from rank 0, then gone.
                let end = Instant::now() + Duration::from_secs(30);
                let mut asm = Assembly::new(wire::table_cap(n));
                let mut g = shared.lock();
                let whole = loop {
                    if let Some(m) = take(&mut g, 0) {
                        if let Some(t) = asm.push(&m).unwrap() {
                            break t;
                        }
                        continue;
                    }
                    assert!(Instant::now() < end, "no table from rank 0");
                    g = shared.cv.wait_timeout(g, POLL).unwrap().0;
                };
                drop(g);
                // A stranger (another key) at rank 3's listener while it
                // waits is refused; rank 3 goes on waiting for rank 1.
                let RootReply::Route(route) = &reply else {
                    panic!("rank 1 got the table from the root")
                };
                let never = AtomicBool::new(false);
                let lim = Limits::new(Duration::from_secs(10), &never);
                let c3 = &route.children[0];
                assert_eq!(c3.rank, 3);
                let stranger = connect_authenticated(
                    c3.listen_addr,
                    &[7; 32],
                    &lim,
                    "rank 3",
                    false,
                    false,
                    None,
                );
                assert!(stranger.is_err(), "a stranger authenticated at rank 3");
                shared.stop.store(true, Ordering::Relaxed);
                shared.cv.notify_all();
                acceptor.join().unwrap();
                (reply, whole)
            });
            let hs: Vec<_> = (0..n)
                .filter(|&r| r != 1)
                .map(|r| {
                    let (id, cfg) = (&id, &cfg);
                    s.spawn(move || (r, Bootstrap::init(id, n, r, cfg).map(|b| b.peers().len())))
                })
                .collect();
            let results: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            let (reply, whole) = fake.join().unwrap();
            assert!(matches!(reply, RootReply::Route(_)));
            assert_eq!(whole[0], wire::T_TABLE);
            results
        });
        for (r, res) in results {
            match (r, res) {
                (0 | 2 | 5 | 6, Ok(len)) => assert_eq!(len, n),
                (r, Ok(_)) => panic!("rank {r} finished init without rank 1's table"),
                (r, Err(e)) => {
                    assert!(![0, 2, 5, 6].contains(&r), "rank {r}: {e}");
                    assert_eq!(e.kind(), ErrorKind::Remote, "rank {r}: {e}");
                    assert!(
                        e.message().contains(
                            "rank 1 of 10 (pid 1 on elsewhere), the parent of rank 3 in the rank table's tree, went away before forwarding the table"
                        ) || e.message().contains(
                            "rank 1 of 10 (pid 1 on elsewhere), the parent of rank 4 in the rank table's tree, went away before forwarding the table"
                        ),
                        "rank {r}: {e}"
                    );
                    if [7, 8].contains(&r) {
                        assert!(
                            e.message().starts_with("bootstrap: rank 3 gave up: "),
                            "rank {r}: {e}"
                        );
                    }
                    if r == 9 {
                        assert!(
                            e.message().starts_with("bootstrap: rank 4 gave up: "),
                            "rank {r}: {e}"
                        );
                    }
                }
            }
        }
    }

    /// Real sockets, ranks as threads, the table in messages of 97 bytes:
    /// every rank ends with the same table.
    #[test]
    fn small_chunks_reach_every_rank() {
        CHUNK_OVERRIDE.store(97, Ordering::Relaxed);
        let cfg = BootstrapConfig {
            ifname: Some("lo".into()),
            init_timeout: Duration::from_secs(20),
            root_table_budget: 1,
            ..Default::default()
        };
        let id = UniqueId::generate(&cfg).unwrap();
        let n = 13;
        let tables: Vec<Vec<PeerInfo>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|r| {
                    let (id, cfg) = (&id, &cfg);
                    s.spawn(move || Bootstrap::init(id, n, r, cfg).unwrap().peers().to_vec())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        CHUNK_OVERRIDE.store(0, Ordering::Relaxed);
        assert_eq!(tables[0].len(), n);
        assert!(tables.iter().all(|t| *t == tables[0]));
    }
}
