//! The ring's network path: GPU buffers reach a rank on another host
//! through host threads (a proxy per peer) and a TCP connection.
//!
//! For a peer on another host the ring cannot map the peer's window, so the
//! rank keeps a *shadow* of it (pinned host memory, mapped into the GPU at
//! the address the kernels use for that peer's window). The kernels do what
//! they always do (write slots, slot sizes and tails into "the peer's
//! window", heads too) and two threads carry those writes across:
//!
//! - the **sender** polls, in the shadow, each channel's tail (slots this
//!   rank filled for the peer) and head (slots of the peer this rank
//!   drained), and sends each new slot (its bytes, as many as the kernel
//!   recorded in the slot's size word) and each new head value;
//! - the **receiver** applies the peer's messages to this rank's real window:
//!   slot bytes, then the tail (a release store: the GPU sees the bytes
//!   before the tail), and heads.
//!
//! Flow control is the kernels' own: a sender kernel reuses a slot only when
//! the head says the receiver drained it, which happens only after the bytes
//! crossed, so a shadow slot is never rewritten before the proxy sent it.
//! Messages: a 16-byte header `[kind u8, pad u8, channel u16, len u32,
//! value u64]` (kind 0: slot `value` of `len` bytes follows; kind 1: head =
//! `value`; kind 2: goodbye, the peer tore its communicator down in order),
//! little-endian. A connection that closes without a goodbye is a dead peer;
//! one that closes after it is not an error: a rank may leave while its
//! peers still work with others (3 ranks: rank 2's last receive comes from
//! rank 1, so it can destroy while rank 0 still sends to rank 1), and what
//! it would still have been owed (our last heads) it no longer needs. A peer may have several connections (each with
//! its own pair of threads); connection `s` of `n` carries the channels
//! `c` with `c % n == s`, so TCP keeps each channel's messages in order.
//!
//! Memory is reached through raw host addresses that stay valid while the
//! [`Proxy`] lives ([`Proxy::stop`] joins the threads first).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use oxccl_core::{Error, Result};

/// Offsets inside a region (`ring.cu`'s RING_* constants).
pub const TAIL: u64 = 0;
/// The head word.
pub const HEAD: u64 = 128;
/// Slot sizes (u32 per slot, written by the kernel before the tail).
pub const SIZES: u64 = 320;
/// Where the slots start (`RING_HDR`).
pub const SLOTS: u64 = 384;
/// Most slots the size words can describe.
pub const MAX_SLOTS: u32 = 16;

/// Where regions are in a window (as `region_of` in `ring.cu`).
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// Ranks.
    pub nranks: u32,
    /// Channels.
    pub nch: u32,
    /// Simple slots per connection.
    pub nslots: u32,
    /// Bytes per Simple slot.
    pub slot: u64,
    /// Bytes per (rank, channel) region.
    pub region: u64,
}

impl Layout {
    /// Offset of (`other`, `ch`)'s region in `owner`'s window.
    pub fn offset(&self, owner: u32, other: u32, ch: u32) -> u64 {
        let idx = if other < owner { other } else { other - 1 };
        (idx as u64 * self.nch as u64 + ch as u64) * self.region
    }
}

/// Waits until `deadline` for two more passes of a sender that found nothing
/// left to send (`idle_passes` counts them; two, so one whole pass began
/// after this call): false at the deadline or when `gone()` says the sender
/// ended. The TCP proxy's and the plugin proxy's drain.
pub(crate) fn wait_idle(
    idle_passes: &AtomicU64,
    deadline: Instant,
    gone: impl Fn() -> bool,
) -> bool {
    let start = idle_passes.load(Ordering::Acquire);
    while idle_passes.load(Ordering::Acquire) < start + 2 {
        if Instant::now() > deadline || gone() {
            return false;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    true
}

/// What one connection of a peer link serves.
#[derive(Debug, Clone)]
pub struct Link {
    /// The windows' shape.
    pub layout: Layout,
    /// This rank.
    pub me: u32,
    /// The peer on another host.
    pub peer: u32,
    /// Host address of this rank's shadow of the peer's window.
    pub shadow: usize,
    /// Host address of this rank's own window.
    pub window: usize,
    /// The channels this connection carries.
    pub channels: Vec<u32>,
}

/// A peer's proxy threads.
#[derive(Debug)]
pub struct Proxy {
    stop: Arc<AtomicBool>,
    /// The peer said goodbye: later send failures are not errors.
    left: Arc<AtomicBool>,
    /// Passes of the sender that found nothing to send (see `drain`).
    idle_passes: Arc<AtomicU64>,
    stream: TcpStream,
    threads: Vec<JoinHandle<()>>,
}

/// What a proxy reports when the link fails (the ring stops its kernels).
pub type OnError = Arc<dyn Fn(Error) + Send + Sync>;

/// # Safety
/// `addr` is 8-byte aligned and valid for the proxy's life.
unsafe fn word(addr: usize) -> &'static AtomicU64 {
    // SAFETY: forwarded from the caller (aligned, live memory that the GPU
    // and this thread access only atomically or by volatile accesses).
    unsafe { AtomicU64::from_ptr(addr as *mut u64) }
}

/// # Safety
/// As [`word`], 4-byte aligned.
unsafe fn word32(addr: usize) -> &'static AtomicU32 {
    // SAFETY: as in `word`.
    unsafe { AtomicU32::from_ptr(addr as *mut u32) }
}

impl Proxy {
    /// Starts the two threads for `peer`: `shadow` is the host address of
    /// this rank's shadow of the peer's window, `window` of this rank's own
    /// window (both `layout`-shaped, alive until [`Proxy::stop`]).
    ///
    /// # Safety
    /// Both addresses must stay mapped until `stop` returns, 128-byte aligned.
    pub unsafe fn start(link: Link, stream: TcpStream, on_error: OnError) -> Result<Proxy> {
        let (layout, peer) = (link.layout, link.peer);
        if link.channels.iter().any(|&c| c >= layout.nch) {
            return Err(Error::invalid_argument(format!(
                "GPU network path: channel list {:?} for {} channels",
                link.channels, layout.nch
            )));
        }

        if layout.nslots > MAX_SLOTS {
            return Err(Error::invalid_argument(format!(
                "GPU network path: {} slots per connection (at most {MAX_SLOTS})",
                layout.nslots
            )));
        }
        stream
            .set_nodelay(true)
            .map_err(|e| Error::system(format!("TCP_NODELAY to rank {peer}: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let left = Arc::new(AtomicBool::new(false));
        let idle_passes = Arc::new(AtomicU64::new(0));
        let ip = idle_passes.clone();
        let tx = stream
            .try_clone()
            .map_err(|e| Error::system(format!("socket to rank {peer}: {e}")))?;
        let rx = stream
            .try_clone()
            .map_err(|e| Error::system(format!("socket to rank {peer}: {e}")))?;
        let mut threads = Vec::new();
        let (s1, e1, left1, left2) = (stop.clone(), on_error.clone(), left.clone(), left.clone());
        let (l1, l2) = (link.clone(), link);
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| Error::system(format!("cannot start a GPU proxy thread: {e}")))
        };
        threads.push(spawn(
            "oxccl-gpu-net-tx",
            Box::new(move || {
                // SAFETY: the caller keeps the shadow mapped until stop joins us.
                if let Err(e) = unsafe { send_loop(&l1, tx, &s1, &ip) } {
                    if !s1.load(Ordering::Acquire) && !left1.load(Ordering::Acquire) {
                        e1(e);
                    }
                }
            }),
        )?);
        let (s2, e2) = (stop.clone(), on_error);
        threads.push(spawn(
            "oxccl-gpu-net-rx",
            Box::new(move || {
                // SAFETY: the caller keeps the window mapped until stop joins us.
                if let Err(e) = unsafe { recv_loop(&l2, rx, &s2, &left2) } {
                    if !s2.load(Ordering::Acquire) {
                        e2(e);
                    }
                }
            }),
        )?);
        Ok(Proxy {
            stop,
            left,
            idle_passes,
            stream,
            threads,
        })
    }

    /// Waits (until `deadline`) for a full pass of the sender that found
    /// nothing left to send: every slot and head the kernels wrote before
    /// this call has left. A rank's kernels can finish before their last
    /// slots crossed (the proxy sends after the tail), so a rank that tears
    /// down drains first, or its peer would wait for bytes that never come.
    pub fn drain(&self, deadline: Instant) -> bool {
        wait_idle(&self.idle_passes, deadline, || {
            self.threads.iter().any(|t| t.is_finished())
        })
    }

    /// Marks the proxy as stopping: from now on a closed connection is not
    /// reported (both ends of a link being torn down close it).
    pub fn halt(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Whether the peer said goodbye (tore its side down in order).
    pub fn peer_left(&self) -> bool {
        self.left.load(Ordering::Acquire)
    }

    /// Stops and joins both threads (the socket is shut down to wake the
    /// receiver). The sender says goodbye first: it gets 500 ms, enough for
    /// a 16-byte write into a socket whose peer reads (a peer that does not
    /// read cannot hold teardown longer).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let until = Instant::now() + Duration::from_millis(500);
        while self.threads.first().is_some_and(|t| !t.is_finished()) && Instant::now() < until {
            std::thread::sleep(Duration::from_micros(100));
        }
        let _ = self.stream.shutdown(Shutdown::Both);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

fn io(peer: u32, what: &str, e: std::io::Error) -> Error {
    Error::remote(format!(
        "GPU network path to rank {peer}: {what}: {e} (the peer died or the network failed)"
    ))
}

/// # Safety
/// `shadow` is a live, aligned `layout`-shaped window copy.
unsafe fn send_loop(
    link: &Link,
    mut tx: TcpStream,
    stop: &AtomicBool,
    idle_passes: &AtomicU64,
) -> Result<()> {
    let Link {
        layout,
        me,
        peer,
        shadow,
        ref channels,
        ..
    } = *link;
    let nch = layout.nch as usize;
    let (mut sent, mut heads) = (vec![0u64; nch], vec![0u64; nch]);
    let mut idle = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let mut busy = false;
        for &c in channels.iter() {
            let base = shadow + layout.offset(peer, me, c) as usize;
            // SAFETY: inside the shadow (offsets from the layout), aligned.
            let (tail, head) = unsafe {
                (
                    word(base + TAIL as usize).load(Ordering::Acquire),
                    word(base + HEAD as usize).load(Ordering::Acquire),
                )
            };
            let ci = c as usize;
            while sent[ci] < tail {
                let s = sent[ci] % layout.nslots as u64;
                // SAFETY: the size word of slot s, written before the tail.
                let len = unsafe { word32(base + SIZES as usize + 4 * s as usize) }
                    .load(Ordering::Acquire)
                    .min(layout.slot as u32);
                let h = header(0, c, len, sent[ci]);
                let at = base + SLOTS as usize + (s * layout.slot) as usize;
                // SAFETY: `len` <= slot bytes of slot s, inside the shadow;
                // the kernel does not rewrite it before its bytes crossed.
                let body = unsafe { std::slice::from_raw_parts(at as *const u8, len as usize) };
                write_two(&mut tx, &h, body).map_err(|e| io(peer, "sending a slot", e))?;
                sent[ci] += 1;
                busy = true;
            }
            if head > heads[ci] {
                tx.write_all(&header(1, c, 0, head))
                    .map_err(|e| io(peer, "sending a head", e))?;
                heads[ci] = head;
                busy = true;
            }
        }
        if busy {
            idle = Instant::now();
        } else {
            idle_passes.fetch_add(1, Ordering::AcqRel);
            if idle.elapsed() > Duration::from_millis(1) {
                // Idle for a millisecond: poll every 20 us instead of
                // spinning (a small message then waits at most ~20 us more).
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::hint::spin_loop();
            }
        }
    }
    // Stopped in order (the ring drained us first): say so, so the peer
    // does not take the closing connection for a death.
    tx.write_all(&header(2, 0, 0, 0))
        .map_err(|e| io(peer, "sending goodbye", e))?;
    Ok(())
}

/// A message header (see the module docs: kind, channel, length, value).
fn header(kind: u8, channel: u32, len: u32, value: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0] = kind;
    h[2..4].copy_from_slice(&(channel as u16).to_le_bytes());
    h[4..8].copy_from_slice(&len.to_le_bytes());
    h[8..16].copy_from_slice(&value.to_le_bytes());
    h
}

/// Writes `head` then `body` with gathered writes, straight from the shadow
/// (a copy into one buffer first cost a memcpy of every 512 KiB slot).
fn write_two(tx: &mut TcpStream, head: &[u8], body: &[u8]) -> std::io::Result<()> {
    let (mut h, mut b) = (head, body);
    while !h.is_empty() || !b.is_empty() {
        let n = match tx.write_vectored(&[std::io::IoSlice::new(h), std::io::IoSlice::new(b)]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let from_h = n.min(h.len());
        h = &h[from_h..];
        b = &b[n - from_h..];
    }
    Ok(())
}

/// # Safety
/// `window` is this rank's live, aligned `layout`-shaped window.
unsafe fn recv_loop(
    link: &Link,
    mut rx: TcpStream,
    stop: &AtomicBool,
    left: &AtomicBool,
) -> Result<()> {
    let Link {
        layout,
        me,
        peer,
        window,
        ref channels,
        ..
    } = *link;
    let mut h = [0u8; 16];
    loop {
        if let Err(e) = rx.read_exact(&mut h) {
            if stop.load(Ordering::Acquire) {
                return Ok(());
            }
            return Err(io(peer, "receiving", e));
        }
        let kind = h[0];
        let c = u16::from_le_bytes([h[2], h[3]]) as u32;
        let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as u64;
        let value = u64::from_le_bytes(h[8..16].try_into().unwrap_or_default());
        if kind == 2 {
            left.store(true, Ordering::Release);
            return Ok(());
        }
        if !channels.contains(&c) || kind > 1 || len > layout.slot {
            return Err(Error::remote(format!(
                "GPU network path: rank {peer} sent a malformed message \
                 (kind {kind}, channel {c}, {len} bytes)"
            )));
        }
        let base = window + layout.offset(me, peer, c) as usize;
        if kind == 0 {
            let s = value % layout.nslots as u64;
            let at = base + SLOTS as usize + (s * layout.slot) as usize;
            // SAFETY: slot s of (peer, c)'s region of our window, `len` <= slot
            // bytes; the GPU reads it only after the tail below says so.
            let dst = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, len as usize) };
            if let Err(e) = rx.read_exact(dst) {
                if stop.load(Ordering::Acquire) {
                    return Ok(());
                }
                return Err(io(peer, "receiving a slot", e));
            }
            // SAFETY: the region's tail word; release: the bytes come first.
            unsafe { word(base + TAIL as usize) }.store(value + 1, Ordering::Release);
        } else {
            // SAFETY: the region's head word.
            unsafe { word(base + HEAD as usize) }.store(value, Ordering::Release);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A 128-byte aligned zeroed buffer standing for a window.
    pub(crate) struct Mem(pub(crate) Vec<u128>);
    impl Mem {
        pub(crate) fn new(bytes: u64) -> Mem {
            Mem(vec![0u128; (bytes as usize).div_ceil(16) + 8])
        }
        pub(crate) fn addr(&self) -> usize {
            (self.0.as_ptr() as usize + 127) & !127
        }
    }

    /// Two ranks' windows and each one's shadow of the other's, for 3
    /// channels of 4 slots of 4 KiB: what the proxy tests (TCP and plugin)
    /// link.
    pub(crate) struct TwoRanks {
        pub(crate) layout: Layout,
        pub(crate) w0: Mem,
        pub(crate) w1: Mem,
        pub(crate) sh0: Mem,
        pub(crate) sh1: Mem,
    }

    impl TwoRanks {
        pub(crate) fn new() -> TwoRanks {
            let layout = Layout {
                nranks: 2,
                nch: 3,
                nslots: 4,
                slot: 4096,
                region: SLOTS + 4 * 4096,
            };
            let bytes = layout.region * layout.nch as u64;
            TwoRanks {
                layout,
                w0: Mem::new(bytes),
                w1: Mem::new(bytes),
                sh0: Mem::new(bytes),
                sh1: Mem::new(bytes),
            }
        }
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    type Errors = Arc<std::sync::Mutex<Vec<String>>>;

    /// Rank 0's proxy towards rank 1 over a fresh loopback connection: the
    /// proxy, the connection's other end, and the errors it reported.
    fn proxy_to_rank1(layout: Layout, window: &Mem, shadow: &Mem) -> (Proxy, TcpStream, Errors) {
        let (a, b) = pair();
        let errs: Errors = Default::default();
        let e2 = errs.clone();
        // SAFETY: the callers keep both buffers alive until the proxy stops.
        let p = unsafe {
            Proxy::start(
                Link {
                    layout,
                    me: 0,
                    peer: 1,
                    shadow: shadow.addr(),
                    window: window.addr(),
                    channels: (0..layout.nch).collect(),
                },
                a,
                Arc::new(move |e: Error| e2.lock().unwrap().push(e.message().to_string())),
            )
        }
        .unwrap();
        (p, b, errs)
    }

    /// Waits up to 5 s for a first error.
    fn first_error(errs: &Errors) -> Option<String> {
        let t0 = Instant::now();
        while errs.lock().unwrap().is_empty() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(2));
        }
        errs.lock().unwrap().first().cloned()
    }

    /// Plays two kernels through a link between two ranks' windows: rank 0
    /// sends `steps` slots per channel (varying lengths, wrapping the slots
    /// several times) by writing its shadow of rank 1's window (bytes, size,
    /// tail) and waiting for the head in its own window; rank 1 waits for
    /// each tail in its window, checks every byte, and writes its head into
    /// its shadow of rank 0's window. A stale, overtaken or lost slot fails.
    pub(crate) fn run_kernels(
        layout: Layout,
        w0a: usize,
        sh0a: usize,
        w1a: usize,
        sh1a: usize,
        steps: u64,
    ) {
        let byte = |c: u32, s: u64, i: usize| (c as u64 * 31 + s * 7 + i as u64) as u8;
        let sender = std::thread::spawn(move || {
            for s in 0..steps {
                for c in 0..layout.nch {
                    // Rank 0's view of rank 1's window: region (owner 1, other 0).
                    let base = sh0a + layout.offset(1, 0, c) as usize;
                    // Wait for a free slot: rank 1's head, in rank 0's window.
                    let hb = w0a + layout.offset(0, 1, c) as usize;
                    let t0 = Instant::now();
                    let head = || {
                        // SAFETY: rank 1's head word in rank 0's live test window.
                        unsafe { word(hb + HEAD as usize) }.load(Ordering::Acquire)
                    };
                    while s + 1 > layout.nslots as u64 && head() < s + 1 - layout.nslots as u64 {
                        assert!(t0.elapsed() < Duration::from_secs(10), "no head");
                        std::hint::spin_loop();
                    }
                    let len = 1 + ((s as usize * 977 + c as usize * 131) % 4096);
                    let slot = s % layout.nslots as u64;
                    let at = base + SLOTS as usize + (slot * layout.slot) as usize;
                    for i in 0..len {
                        // SAFETY: inside the slot (at most 4096 bytes, the
                        // slot holds more) of the live shadow window.
                        unsafe { *((at + i) as *mut u8) = byte(c, s, i) };
                    }
                    // SAFETY: the slot's size word in the live shadow window.
                    unsafe { word32(base + SIZES as usize + 4 * slot as usize) }
                        .store(len as u32, Ordering::Release);
                    // SAFETY: the region's tail word in the live shadow window.
                    unsafe { word(base + TAIL as usize) }.store(s + 1, Ordering::Release);
                }
            }
        });
        for s in 0..steps {
            for c in 0..layout.nch {
                // Rank 1's own window: region (owner 1, other 0).
                let base = w1a + layout.offset(1, 0, c) as usize;
                let t0 = Instant::now();
                // SAFETY: the region's tail word in rank 1's live window.
                while unsafe { word(base + TAIL as usize) }.load(Ordering::Acquire) < s + 1 {
                    assert!(t0.elapsed() < Duration::from_secs(10), "no tail");
                    std::hint::spin_loop();
                }
                let len = 1 + ((s as usize * 977 + c as usize * 131) % 4096);
                let at =
                    base + SLOTS as usize + ((s % layout.nslots as u64) * layout.slot) as usize;
                for i in 0..len {
                    // SAFETY: inside the slot of rank 1's live window.
                    let v = unsafe { *((at + i) as *const u8) };
                    assert_eq!(v, byte(c, s, i), "channel {c} step {s} byte {i}");
                }
                // Drained: the head goes to rank 0 through rank 1's shadow.
                let hb = sh1a + layout.offset(0, 1, c) as usize;
                // SAFETY: the head word in rank 1's live shadow window.
                unsafe { word(hb + HEAD as usize) }.store(s + 1, Ordering::Release);
            }
        }
        sender.join().unwrap();
    }

    /// Two ranks, each with its window and a shadow of the other's: rank 0
    /// plays a sending kernel (slot bytes, size, tail into its shadow of
    /// rank 1's window), rank 1 a receiving one (waits for the tail in its
    /// window, checks the bytes, writes its head into its shadow of rank 0's
    /// window); every slot index wraps several times, so a stale or
    /// overtaken slot would show.
    fn slots_and_heads_cross_in_order(nstreams: u32) {
        let TwoRanks {
            layout,
            w0,
            w1,
            sh0,
            sh1,
        } = TwoRanks::new();
        let errs = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let on = |errs: Arc<std::sync::Mutex<Vec<String>>>| -> OnError {
            Arc::new(move |e: Error| errs.lock().unwrap().push(e.message().to_string()))
        };
        // Connection s carries the channels c with c % nstreams == s.
        let mut proxies = Vec::new();
        for st in 0..nstreams {
            let (a, b) = pair();
            let chans: Vec<u32> = (0..layout.nch).filter(|c| c % nstreams == st).collect();
            let link = |me, peer, shadow, window, channels| Link {
                layout,
                me,
                peer,
                shadow,
                window,
                channels,
            };
            // SAFETY: the buffers outlive the proxies (stopped below).
            let p0 = unsafe {
                Proxy::start(
                    link(0, 1, sh0.addr(), w0.addr(), chans.clone()),
                    a,
                    on(errs.clone()),
                )
            }
            .unwrap();
            // SAFETY: as above.
            let p1 = unsafe {
                Proxy::start(
                    link(1, 0, sh1.addr(), w1.addr(), chans),
                    b,
                    on(errs.clone()),
                )
            }
            .unwrap();
            proxies.push((p0, p1));
        }
        run_kernels(layout, w0.addr(), sh0.addr(), w1.addr(), sh1.addr(), 23);
        let deadline = Instant::now() + Duration::from_secs(5);
        for (p0, p1) in &proxies {
            assert!(p0.drain(deadline) && p1.drain(deadline));
        }
        for (p0, p1) in &proxies {
            p0.halt();
            p1.halt();
        }
        for (mut p0, mut p1) in proxies {
            p0.stop();
            p1.stop();
        }
        assert!(
            errs.lock().unwrap().is_empty(),
            "{:?}",
            errs.lock().unwrap()
        );
    }

    #[test]
    fn slots_and_heads_cross_in_order_one_connection() {
        slots_and_heads_cross_in_order(1);
    }

    #[test]
    fn slots_and_heads_cross_in_order_two_connections() {
        slots_and_heads_cross_in_order(2);
    }

    /// Messages from the network are checked before anything is written:
    /// a bad kind, a channel out of range or a length past a slot ends the
    /// link with an error naming the peer, and the window is untouched.
    #[test]
    fn malformed_messages_are_refused() {
        let layout = Layout {
            nranks: 2,
            nch: 2,
            nslots: 4,
            slot: 1024,
            region: SLOTS + 4 * 1024,
        };
        let bad: [[u8; 16]; 3] = [
            // kind 7
            [7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            // channel 9 of 2
            [0, 0, 9, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            // 4 GiB - 1 bytes into a 1 KiB slot
            [0, 0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 0, 0, 0, 0, 0],
        ];
        for h in bad {
            let (w, sh) = (Mem::new(layout.region * 2), Mem::new(layout.region * 2));
            let (mut p, mut b, errs) = proxy_to_rank1(layout, &w, &sh);
            b.write_all(&h).unwrap();
            let e = first_error(&errs);
            p.stop();
            assert!(
                e.as_ref()
                    .is_some_and(|m| m.contains("malformed") && m.contains("rank 1")),
                "{h:?}: {e:?}"
            );
            // Nothing was written into the window.
            assert!(w.0.iter().all(|&x| x == 0));
        }
    }

    /// Two ranks, one channel of four 1 KiB slots.
    fn one_channel() -> Layout {
        Layout {
            nranks: 2,
            nch: 1,
            nslots: 4,
            slot: 1024,
            region: SLOTS + 4 * 1024,
        }
    }

    /// A peer that goes away is reported (once the proxy is not stopping).
    #[test]
    fn a_closed_peer_is_an_error() {
        let layout = one_channel();
        let (w, sh) = (Mem::new(layout.region), Mem::new(layout.region));
        let (mut p, b, errs) = proxy_to_rank1(layout, &w, &sh);
        drop(b);
        let e = first_error(&errs);
        p.stop();
        assert!(e.as_ref().is_some_and(|m| m.contains("rank 1")), "{e:?}");
    }

    /// A peer that tears down in order says goodbye first: its closing
    /// connection is then no error here (3 ranks: one may leave while the
    /// others still work), while one that closes without it still is.
    #[test]
    fn a_peer_that_says_goodbye_is_not_an_error() {
        let layout = one_channel();
        let (w0, sh0) = (Mem::new(layout.region), Mem::new(layout.region));
        let (w1, sh1) = (Mem::new(layout.region), Mem::new(layout.region));
        let (mut p0, b, errs) = proxy_to_rank1(layout, &w0, &sh0);
        let errs1: Errors = Default::default();
        let e1 = errs1.clone();
        // SAFETY: both buffers outlive the proxy (stopped below).
        let mut p1 = unsafe {
            Proxy::start(
                Link {
                    layout,
                    me: 1,
                    peer: 0,
                    shadow: sh1.addr(),
                    window: w1.addr(),
                    channels: vec![0],
                },
                b,
                Arc::new(move |e: Error| e1.lock().unwrap().push(e.message().to_string())),
            )
        }
        .unwrap();
        // Rank 1 leaves; rank 0 goes on (its proxy still running).
        p1.halt();
        p1.stop();
        let t0 = Instant::now();
        while !p0.peer_left() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(p0.peer_left(), "rank 0 did not see rank 1's goodbye");
        // A head rank 0's kernels write for the departed peer: its sender
        // tries to send it into the closed connection, and that is no error.
        // SAFETY: the head word of (peer 1, channel 0) in rank 0's shadow.
        unsafe { word(sh0.addr() + layout.offset(1, 0, 0) as usize + HEAD as usize) }
            .store(1, Ordering::Release);
        std::thread::sleep(Duration::from_millis(200));
        p0.stop();
        assert!(
            errs.lock().unwrap().is_empty(),
            "{:?}",
            errs.lock().unwrap()
        );
        assert!(
            errs1.lock().unwrap().is_empty(),
            "{:?}",
            errs1.lock().unwrap()
        );
    }
}
