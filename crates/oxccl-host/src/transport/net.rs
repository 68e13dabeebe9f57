//! Peers on other hosts through a network plugin (`ncclNet`, see
//! `oxccl-net`): one plugin connection per channel and direction, used as
//! the same byte streams as the TCP transport.
//!
//! Each half owns one registered host buffer cut into [`SLOTS`] slots; a
//! message is at most one slot (the receiver posts slot-sized receives, so a
//! message always fits). The send half fills the current slot
//! (`reserve`/`commit`) and `flush` posts it with `isend`, at once when
//! nothing is in flight (latency), otherwise when the slot is full or the
//! earlier sends completed: so at most one short message is in flight and a
//! stream holds at least `(SLOTS - 1) * slot` bytes, which keeps the ring's
//! deadlock-freedom bound (slice <= capacity / 2) with the capacities used
//! (1 MiB per stream: 7 * 128 KiB against slices of at most 512 KiB).
//! The receive half keeps every free slot posted (`irecv`) and exposes
//! completed slots in order (`peek`/`consume`).
//!
//! Setup ([`net_connect`]): for each channel this rank listens on the
//! channel's device, sends the handles to the peer through the bootstrap,
//! receives the peer's, and then drives `connect` (from the channel's
//! device) and `accept` (both non-blocking) until every connection is up,
//! within the communicator's timeout and observing its abort flag. Each end
//! picks its channels' devices alone ([`channel_devices`]); the peer's
//! handle carries the device it listens on, so nothing else is exchanged.
//!
//! A failed receive request (the peer closed or reset its end) does not fail
//! the stream at once: like a TCP end of stream, it is an error only when
//! the engine waits for data that can no longer come (`peek`), so a peer
//! that sent everything and left is not an error.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxccl_bootstrap::Bootstrap;
use oxccl_core::{Error, Result};
use oxccl_net::{CommRef, Handle, MrHandle, Net, Poll, RecvComm, Request, SendComm};

use super::control::PeerControl;
use super::{LinkKind, PeerLink, RecvHalf, SendHalf};

/// Slots per stream (NCCL's NCCL_STEPS is also 8).
pub const SLOTS: usize = 8;

/// Bootstrap tag of the handle exchange ("NET" + 0).
const TAG_HANDLES: u32 = 0x4e45_5400;

/// Bytes of one slot for a stream of `capacity` bytes, capped by the
/// device's largest transfer: a multiple of 8, at least 64.
pub fn slot_bytes(capacity: usize, max_transfer: usize) -> usize {
    (capacity / SLOTS).min(max_transfer).max(64) & !7
}

/// One page-aligned, zeroed heap block that the plugin may read or write
/// asynchronously; Rust code only ever makes slices of slots no request
/// covers.
struct Region {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: a plain heap block owned by one half; moving it between threads is
// fine, and the half is used by one thread at a time.
unsafe impl Send for Region {}

impl Region {
    fn new(len: usize) -> Result<Region> {
        let layout = Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| Error::invalid_argument(format!("net buffer of {len} bytes: {e}")))?;
        // SAFETY: non-zero size (max(1) above).
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::system(format!(
                "cannot allocate a {len}-byte net buffer"
            )));
        }
        Ok(Region { ptr, layout })
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
    /// # Safety
    /// No request of the plugin may cover `off..off+len` while the slice lives.
    unsafe fn slice_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        assert!(off + len <= self.len());
        // SAFETY: in bounds (asserted); exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

fn net_error(peer: usize, what: &str, e: &Error) -> Error {
    // The plugin call's error already names the network ("NET/<name>: ...").
    Error::remote(format!("{what} rank {peer} failed: {}", e.message()))
}

/// The sending half of one plugin connection.
pub struct NetSend {
    net: Arc<dyn Net>,
    comm: Option<SendComm>,
    mr: Option<MrHandle>,
    buf: Region,
    slot: usize,
    /// Counter of the slot being filled (its index is `next % SLOTS`).
    next: u64,
    fill: usize,
    reserved: usize,
    /// Posted or waiting-to-be-posted slots, oldest first: (bytes, request).
    inflight: VecDeque<(usize, Option<Request>)>,
    peer: usize,
    tag: i32,
    dead: Option<Error>,
}

/// The receiving half of one plugin connection.
pub struct NetRecv {
    net: Arc<dyn Net>,
    comm: Option<RecvComm>,
    mr: Option<MrHandle>,
    buf: Region,
    slot: usize,
    /// Counter of the slot `peek` reads.
    head: u64,
    /// Counter of the next slot to post.
    post_next: u64,
    /// Completed slots from `head`: bytes each.
    ready: VecDeque<usize>,
    /// Posted receives after the ready slots, oldest first.
    posted: VecDeque<Request>,
    /// Bytes of the head slot already consumed.
    off: usize,
    peeked: usize,
    peer: usize,
    tag: i32,
    /// The connection failed (reported by `peek` once no data is left).
    dead: Option<Error>,
}

impl NetSend {
    fn base(&self, counter: u64) -> usize {
        (counter % SLOTS as u64) as usize * self.slot
    }

    /// Posts the oldest unposted slots; false when the plugin had no room.
    fn post_pending(&mut self) -> Result<bool> {
        let mut moved = false;
        let first = self.next - self.inflight.len() as u64;
        for i in 0..self.inflight.len() {
            if self.inflight[i].1.is_some() {
                continue;
            }
            let len = self.inflight[i].0;
            let at = self.base(first + i as u64);
            let (Some(comm), Some(mr)) = (&self.comm, &self.mr) else {
                return Err(Error::internal("net send half without a connection"));
            };
            // SAFETY: the slot lies in the registered buffer, and neither
            // `reserve` nor anything else touches it until the request
            // completes (it is in `inflight`) or the connection is closed.
            let r = unsafe {
                self.net
                    .isend(comm, self.buf.ptr.add(at), len, self.tag, mr)
            };
            match r {
                Ok(Some(req)) => {
                    self.inflight[i].1 = Some(req);
                    moved = true;
                }
                Ok(None) => break,
                Err(e) => return Err(net_error(self.peer, "send to", &e)),
            }
        }
        Ok(moved)
    }

    fn flush_inner(&mut self) -> Result<bool> {
        let mut moved = false;
        // Completions, oldest first (slots are reused in order).
        while let Some((_, Some(_))) = self.inflight.front() {
            let Some((len, Some(req))) = self.inflight.pop_front() else {
                break;
            };
            match self.net.test(req) {
                Ok(Poll::Done(_)) => moved = true,
                Ok(Poll::Pending(req)) => {
                    self.inflight.push_front((len, Some(req)));
                    break;
                }
                Err(e) => return Err(net_error(self.peer, "send to", &e)),
            }
        }
        // The filled part of the current slot: see the module docs for when.
        if self.fill > 0
            && self.inflight.len() < SLOTS
            && (self.inflight.is_empty() || self.fill == self.slot)
        {
            self.inflight.push_back((self.fill, None));
            self.next += 1;
            self.fill = 0;
        }
        moved |= self.post_pending()?;
        Ok(moved)
    }
}

impl SendHalf for NetSend {
    fn unflushed(&self) -> usize {
        self.fill + self.inflight.iter().map(|(l, _)| *l).sum::<usize>()
    }

    fn reserve(&mut self) -> Result<&mut [u8]> {
        if let Some(e) = &self.dead {
            return Err(e.clone());
        }
        if self.inflight.len() >= SLOTS {
            self.reserved = 0;
            return Ok(&mut []);
        }
        let at = self.base(self.next) + self.fill;
        let len = self.slot - self.fill;
        self.reserved = len;
        // SAFETY: the slot being filled is not in `inflight` (fewer than
        // SLOTS are), so no request covers it.
        Ok(unsafe { self.buf.slice_mut(at, len) })
    }

    fn commit(&mut self, n: usize) {
        assert!(
            n <= self.reserved && n % 8 == 0,
            "net commit of {n} bytes: reserved {}, must be a multiple of 8",
            self.reserved
        );
        self.reserved = 0;
        self.fill += n;
    }

    fn flush(&mut self) -> Result<bool> {
        if let Some(e) = &self.dead {
            return Err(e.clone());
        }
        let r = self.flush_inner();
        if let Err(e) = &r {
            self.dead = Some(e.clone());
        }
        r
    }
}

impl NetRecv {
    fn base(&self, counter: u64) -> usize {
        (counter % SLOTS as u64) as usize * self.slot
    }

    fn fill_inner(&mut self) -> Result<bool> {
        let mut moved = false;
        while let Some(req) = self.posted.pop_front() {
            match self.net.test(req)? {
                Poll::Done(n) => {
                    if n % 8 != 0 || n > self.slot {
                        return Err(Error::internal(format!(
                            "a message of {n} bytes from rank {}: not a multiple of 8 or larger than a {}-byte slot",
                            self.peer, self.slot
                        )));
                    }
                    self.ready.push_back(n);
                    moved = true;
                }
                Poll::Pending(req) => {
                    self.posted.push_front(req);
                    break;
                }
            }
        }
        while self.post_next - self.head < SLOTS as u64 {
            let at = self.base(self.post_next);
            let (Some(comm), Some(mr)) = (&self.comm, &self.mr) else {
                return Err(Error::internal("net receive half without a connection"));
            };
            // SAFETY: the slot lies in the registered buffer; it is free (not
            // ready, not posted, not peeked: `post_next - head < SLOTS`), and
            // stays untouched until the request completes or the connection
            // is closed.
            let r = unsafe {
                self.net
                    .irecv(comm, self.buf.ptr.add(at), self.slot, self.tag, mr)
            }?;
            match r {
                Some(req) => {
                    self.posted.push_back(req);
                    self.post_next += 1;
                }
                None => break,
            }
        }
        Ok(moved)
    }
}

impl RecvHalf for NetRecv {
    fn peek(&mut self) -> Result<&[u8]> {
        loop {
            match self.ready.front().copied() {
                Some(len) if self.off >= len => {
                    self.ready.pop_front();
                    self.head += 1;
                    self.off = 0;
                }
                Some(len) => {
                    let at = self.base(self.head) + self.off;
                    let n = len - self.off;
                    self.peeked = n;
                    // SAFETY: the head slot completed and is not posted again
                    // until it is consumed (`post_next - head < SLOTS`).
                    return Ok(unsafe { self.buf.slice_mut(at, n) });
                }
                None => {
                    self.peeked = 0;
                    return match &self.dead {
                        Some(e) => Err(e.clone()),
                        None => Ok(&[]),
                    };
                }
            }
        }
    }

    fn consume(&mut self, n: usize) {
        assert!(
            n <= self.peeked && n % 8 == 0,
            "net consume of {n} bytes: peeked {}, must be a multiple of 8",
            self.peeked
        );
        self.peeked = 0;
        self.off += n;
        if self.ready.front().is_some_and(|&len| self.off >= len) {
            self.ready.pop_front();
            self.head += 1;
            self.off = 0;
        }
    }

    fn fill(&mut self) -> Result<bool> {
        if self.dead.is_some() {
            return Ok(false);
        }
        match self.fill_inner() {
            Ok(m) => Ok(m),
            Err(e) => {
                // Reported by `peek` when data is still expected.
                self.dead = Some(Error::remote(format!(
                    "NET/{}: connection from rank {} failed while data was expected: {}",
                    self.net.name(),
                    self.peer,
                    e.message()
                )));
                Ok(false)
            }
        }
    }
}

impl Drop for NetSend {
    fn drop(&mut self) {
        // Registration first, then the connection (its requests die with
        // it), then the buffer (`Region`'s drop, after this).
        if let (Some(mr), Some(c)) = (self.mr.take(), &self.comm) {
            let _ = self.net.dereg_mr(CommRef::Send(c), mr);
        }
        self.inflight.clear();
        if let Some(c) = self.comm.take() {
            let _ = self.net.close_send(c);
        }
    }
}

impl Drop for NetRecv {
    fn drop(&mut self) {
        if let (Some(mr), Some(c)) = (self.mr.take(), &self.comm) {
            let _ = self.net.dereg_mr(CommRef::Recv(c), mr);
        }
        self.posted.clear();
        if let Some(c) = self.comm.take() {
            let _ = self.net.close_recv(c);
        }
    }
}

/// The device of each of this rank's `nch` channels to peers on other
/// hosts: [`oxccl_core::topo::nic_per_channel`] over the plugin's usable
/// devices ([`oxccl_net::usable_devices`]) with `NCCL_CROSS_NIC`, where the
/// rank sits on the NUMA node holding every CPU it may run on (when one
/// does) and a device on the NUMA node its PCI path's `numa_node` names;
/// a device whose node is unknown counts as far. `local`: the rank's index
/// among its host's ranks. `dev` (the device `choose` picked) for every
/// channel when the devices cannot be listed. Logs one INFO line (NET).
pub fn channel_devices(
    net: &dyn Net,
    dev: usize,
    settings: &oxccl_net::NetSettings,
    rank: usize,
    local: usize,
    nch: usize,
) -> Vec<usize> {
    use oxccl_core::topo;
    let usable = oxccl_net::usable_devices(net, settings.ib_hca.as_deref());
    let numa = rank_numa_node();
    let nics: Vec<(usize, Option<topo::GpuSite>)> = usable
        .iter()
        .map(|(d, p)| {
            let site = numa.and(p.pci_path.as_deref()).and_then(|path| {
                let at = topo::pci_path_site(path, 0)?;
                let node = read_sys(&format!("/sys/bus/pci/devices/{}/numa_node", at.busid))?
                    .trim()
                    .parse::<u32>()
                    .ok()?;
                Some(topo::GpuSite { numaid: node, ..at })
            });
            (*d, site)
        })
        .collect();
    let site = numa.map_or_else(topo::GpuSite::default, topo::numa_site);
    let mut devs = topo::nic_per_channel(&site, &nics, local, nch as u32, settings.cross_nic);
    if devs.len() != nch {
        devs = vec![dev; nch];
    }
    oxccl_env::info!(
        oxccl_env::Subsys::NET,
        "{}",
        topo::nic_channels_line(
            &format!("rank {rank}"),
            net.name(),
            &devs,
            settings.cross_nic
        )
    );
    devs
}

fn read_sys(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The NUMA node holding every CPU this process may run on, if one does.
fn rank_numa_node() -> Option<u32> {
    // SAFETY: cpu_set_t is a plain bit array: all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>() bytes
    // into `set`, which holds that many.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0
    {
        return None;
    }
    let affinity: Vec<u32> = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE, the number of bits in `set`.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .map(|c| c as u32)
        .collect();
    let nodes: Vec<(u32, Vec<u32>)> = std::fs::read_dir("/sys/devices/system/node")
        .ok()?
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let id = name.strip_prefix("node")?.parse::<u32>().ok()?;
            let cpus = read_sys(&format!("/sys/devices/system/node/{name}/cpulist"))?;
            Some((id, oxccl_core::topo::parse_cpulist(&cpus)?))
        })
        .collect();
    oxccl_core::topo::numa_node_of(&affinity, &nodes)
}

/// The plugin connections of one peer, one per channel and direction.
pub struct NetConns {
    pub send: Vec<SendComm>,
    pub recv: Vec<RecvComm>,
}

/// Connects `devs.len()` channels each way to `peer` through `net`,
/// channel `c` on this rank's device `devs[c]` ([`channel_devices`]):
/// listens, exchanges handles with the peer through the bootstrap, then
/// drives `connect` and `accept` until all are up. Bounded by `timeout`;
/// returns early when `abort` is set.
pub fn net_connect(
    net: &Arc<dyn Net>,
    devs: &[usize],
    bootstrap: &Bootstrap,
    peer: usize,
    timeout: Duration,
    abort: &AtomicBool,
) -> Result<NetConns> {
    let nch = devs.len();
    let name = net.name().to_string();
    let ctx = |e: Error| e.context(format!("NET/{name}: connecting to rank {peer}"));
    let mut listens: Vec<Option<oxccl_net::ListenComm>> = Vec::with_capacity(nch);
    let mut mine = Vec::with_capacity(nch * std::mem::size_of::<Handle>());
    for (c, &dev) in devs.iter().enumerate() {
        match net.listen(dev) {
            Ok((h, l)) => {
                mine.extend_from_slice(&h);
                listens.push(Some(l));
            }
            Err(e) => {
                for l in listens.iter_mut().filter_map(Option::take) {
                    let _ = net.close_listen(l);
                }
                return Err(ctx(e.context(format!("channel {c}, device {dev}"))));
            }
        }
    }
    let close_all = |ls: &mut Vec<Option<oxccl_net::ListenComm>>| {
        for l in ls.iter_mut().filter_map(Option::take) {
            let _ = net.close_listen(l);
        }
    };
    // `send` does not wait for the peer's `recv`, so both ends send first.
    let exchanged = bootstrap
        .send(peer, TAG_HANDLES, &mine)
        .and_then(|()| bootstrap.recv(peer, TAG_HANDLES));
    let theirs = match exchanged {
        Ok(t) => t,
        Err(e) => {
            close_all(&mut listens);
            return Err(ctx(e));
        }
    };
    let hb = std::mem::size_of::<Handle>();
    if theirs.len() != nch * hb {
        close_all(&mut listens);
        return Err(ctx(Error::invalid_usage(format!(
            "rank {peer} sent {} bytes of handles, expected {} ({nch} channels): ranks disagree on channels",
            theirs.len(),
            nch * hb
        ))));
    }
    let mut handles: Vec<Handle> = theirs
        .chunks_exact(hb)
        .map(|c| c.try_into().expect("exact chunk"))
        .collect();
    let mut send: Vec<Option<SendComm>> = (0..nch).map(|_| None).collect();
    let mut recv: Vec<Option<RecvComm>> = (0..nch).map(|_| None).collect();
    let start = Instant::now();
    let result = loop {
        let mut progress = false;
        let mut err = None;
        for c in 0..nch {
            if send[c].is_none() {
                match net.connect(devs[c], &mut handles[c]) {
                    Ok(Some(s)) => {
                        send[c] = Some(s);
                        progress = true;
                    }
                    Ok(None) => {}
                    Err(e) => err = Some(e),
                }
            }
            if recv[c].is_none() {
                if let Some(l) = &listens[c] {
                    match net.accept(l) {
                        Ok(Some(r)) => {
                            recv[c] = Some(r);
                            progress = true;
                            if let Some(l) = listens[c].take() {
                                let _ = net.close_listen(l);
                            }
                        }
                        Ok(None) => {}
                        Err(e) => err = Some(e),
                    }
                }
            }
        }
        if let Some(e) = err {
            break Err(ctx(e));
        }
        if send.iter().all(Option::is_some) && recv.iter().all(Option::is_some) {
            break Ok(());
        }
        if abort.load(Ordering::Acquire) {
            break Err(ctx(Error::invalid_usage(
                "aborted (ncclCommAbort or ncclCommRevoke)",
            )));
        }
        if start.elapsed() >= timeout {
            let (s, r) = (
                send.iter().filter(|x| x.is_some()).count(),
                recv.iter().filter(|x| x.is_some()).count(),
            );
            break Err(ctx(Error::timeout(format!(
                "{s} of {nch} connections out and {r} of {nch} in after {} ms (OXCCL_TIMEOUT_MS)",
                timeout.as_millis()
            ))));
        }
        if !progress {
            std::thread::sleep(Duration::from_micros(200));
        }
    };
    close_all(&mut listens);
    match result {
        Ok(()) => Ok(NetConns {
            send: send.into_iter().flatten().collect(),
            recv: recv.into_iter().flatten().collect(),
        }),
        Err(e) => {
            for s in send.into_iter().flatten() {
                let _ = net.close_send(s);
            }
            for r in recv.into_iter().flatten() {
                let _ = net.close_recv(r);
            }
            Err(e)
        }
    }
}

/// A link to `peer` over plugin connections (`conns`, one per channel each
/// way), with `buf_capacity` bytes per stream cut into [`SLOTS`] slots of
/// `slot` bytes ([`slot_bytes`]).
pub fn net_link(
    peer: usize,
    net: &Arc<dyn Net>,
    conns: NetConns,
    mut control: PeerControl,
    slot: usize,
) -> Result<PeerLink> {
    if conns.send.is_empty() || conns.send.len() != conns.recv.len() {
        return Err(Error::invalid_argument(format!(
            "net link to rank {peer}: {} send and {} receive connections",
            conns.send.len(),
            conns.recv.len()
        )));
    }
    if slot % 8 != 0 || slot < 64 {
        return Err(Error::invalid_argument(format!(
            "net link to rank {peer}: slot of {slot} bytes (a multiple of 8, at least 64)"
        )));
    }
    let nch = conns.send.len();
    let mut send: Vec<Box<dyn SendHalf>> = Vec::with_capacity(nch);
    let mut recv: Vec<Box<dyn RecvHalf>> = Vec::with_capacity(nch);
    for (c, (s, r)) in conns.send.into_iter().zip(conns.recv).enumerate() {
        let mut half = NetSend {
            net: net.clone(),
            comm: Some(s),
            mr: None,
            buf: Region::new(SLOTS * slot)?,
            slot,
            next: 0,
            fill: 0,
            reserved: 0,
            inflight: VecDeque::new(),
            peer,
            tag: c as i32,
            dead: None,
        };
        let comm = half.comm.as_ref().expect("just set");
        // SAFETY: the buffer lives in the half, which deregisters before
        // freeing it (Drop order: NetSend::drop, then its fields).
        half.mr = Some(unsafe { net.reg_mr(CommRef::Send(comm), half.buf.ptr, half.buf.len()) }?);
        send.push(Box::new(half));
        let mut half = NetRecv {
            net: net.clone(),
            comm: Some(r),
            mr: None,
            buf: Region::new(SLOTS * slot)?,
            slot,
            head: 0,
            post_next: 0,
            ready: VecDeque::new(),
            posted: VecDeque::new(),
            off: 0,
            peeked: 0,
            peer,
            tag: c as i32,
            dead: None,
        };
        let comm = half.comm.as_ref().expect("just set");
        // SAFETY: as above, for the receive half.
        half.mr = Some(unsafe { net.reg_mr(CommRef::Recv(comm), half.buf.ptr, half.buf.len()) }?);
        // Post the receives now, so that a plugin whose sends wait for the
        // receiver's buffers (RDMA) can start at once.
        half.fill()?;
        recv.push(Box::new(half));
    }
    // As for TCP: a peer that sent its last bytes and left is reported by the
    // data connections once those bytes are in (a failed receive), not by
    // its control connection closing first.
    control.set_data_reports_close();
    oxccl_env::info!(
        oxccl_env::Subsys::NET,
        "connected to rank {peer} via NET/{}: {nch} channels, {SLOTS} slots of {slot} bytes per stream",
        net.name()
    );
    Ok(PeerLink {
        peer,
        kind: LinkKind::Net,
        send,
        recv,
        control,
    })
}
