//! The ring's network path over an NCCL network plugin (`ncclNet`, through
//! `oxccl-net`) instead of oxccl's own TCP connections: the same shadow
//! windows as `netproxy.rs`, a different way across.
//!
//! One send and one receive connection per (peer, channel). Plugins match a
//! connection's messages in order, which gives flow control for free, so no
//! head message crosses the network:
//!
//! - **sending**: each new slot in the shadow (its bytes, as many as the
//!   kernel recorded) is an `isend`; when the plugin completes it, the slot
//!   is free again, and the proxy writes that count into this rank's own
//!   window as the head the sending kernel waits for;
//! - **receiving**: the proxy keeps `nslots` `irecv`s posted, slot `s % nslots`
//!   of this rank's window for step `s`, and posts the one for step
//!   `s + nslots` only once the receiving kernel's head (written into the
//!   shadow) says step `s` was drained; a completed receive becomes the tail.
//!
//! A sender's `isend` of step `s + nslots` therefore lands only in a slot its
//! receiver has freed. One thread per peer drives every channel's requests.
//!
//! With GPUDirect RDMA (`oxccl_core::gpu::gdr` decides) a link's slots move
//! to GPU memory of their own ([`GpuSlots`]; the kernels find them through
//! `slots_of` in ring.cu) and are registered with the plugin as such: the
//! plugin sends from and receives into GPU memory, nothing is copied
//! through pinned host memory. The header words (tails, heads, sizes) stay
//! in the host-mapped windows the proxy watches. A receive into GPU memory
//! is flushed (`iflush`) before its tail is written when the decision says
//! so. The proxy thread runs with the ring's context current, as plugins
//! that touch GPU memory expect.
//!
//! A rank that tears down in order sends a zero-byte message on every
//! channel (no slot is ever empty: a step moves at least one element), its
//! goodbye: a peer may leave while the others still work with each other,
//! and its closing connections are then no error.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use oxccl_core::{Error, Result};
use oxccl_net::{
    CommRef, DeviceMemory, Handle, ListenComm, MrHandle, Net, Poll, RecvComm, Request, SendComm,
};

use crate::netproxy::{Layout, OnError, HEAD, SIZES, SLOTS, TAIL};

/// One (peer, channel)'s connections and registrations.
struct Chan {
    send: SendComm,
    recv: RecvComm,
    /// The shadow's slots of this channel, registered on `send`.
    smr: MrHandle,
    /// This rank's window's slots of this channel, registered on `recv`.
    rmr: MrHandle,
}

/// GPU memory a peer's slots live in instead of the windows (GPUDirect
/// RDMA): each buffer holds `nch x nslots x slot` bytes, channel `c` at
/// `c x nslots x slot` ([`gpu_slots_bytes`] to allocate).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuSlots {
    /// Device address of the slots this rank sends from; 0: the shadow's.
    pub send: u64,
    /// Device address of the slots the plugin receives into; 0: the window's.
    pub recv: u64,
    /// Register through DMA-BUF descriptors (else by address).
    pub dmabuf: bool,
    /// Flush each receive into GPU memory before the kernel reads it.
    pub flush: bool,
}

/// Bytes to allocate for one [`GpuSlots`] buffer: the slots of every
/// channel, rounded up to 2 MiB (DMA-BUF export takes whole pages, and
/// allocations this size start on a 2 MiB boundary).
pub fn gpu_slots_bytes(layout: &Layout) -> usize {
    let b = layout.nch as u64 * layout.nslots as u64 * layout.slot;
    b.div_ceil(2 << 20).max(1) as usize * (2 << 20)
}

/// The connections of one peer, set up and ready for [`PluginProxy::start`].
pub struct PluginLink {
    net: Arc<dyn Net>,
    layout: Layout,
    me: u32,
    peer: u32,
    shadow: usize,
    window: usize,
    gpu: GpuSlots,
    /// The ring's context, current in the proxy thread (as usize: the raw
    /// pointer is not Send; 0: none).
    ctx: usize,
    chans: Vec<Chan>,
}

impl PluginLink {
    /// Where channel `c`'s send slots start.
    fn send_slots(&self, c: u32) -> usize {
        if self.gpu.send != 0 {
            (self.gpu.send + c as u64 * self.layout.nslots as u64 * self.layout.slot) as usize
        } else {
            slots(&self.layout, self.shadow, self.peer, self.me, c).0
        }
    }

    /// Where channel `c`'s receive slots start.
    fn recv_slots(&self, c: u32) -> usize {
        if self.gpu.recv != 0 {
            (self.gpu.recv + c as u64 * self.layout.nslots as u64 * self.layout.slot) as usize
        } else {
            slots(&self.layout, self.window, self.me, self.peer, c).0
        }
    }
}

impl std::fmt::Debug for PluginLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PluginLink({} to rank {}, {} channels)",
            self.net.name(),
            self.peer,
            self.chans.len()
        )
    }
}

/// Listening objects for the channels a peer will connect to.
pub struct Listens {
    net: Arc<dyn Net>,
    comms: Vec<ListenComm>,
}

impl Listens {
    /// Opens one listen per channel, channel `c` on device `devs[c]`; the
    /// handles go to the peer.
    pub fn open(net: Arc<dyn Net>, devs: &[usize]) -> Result<(Listens, Vec<Handle>)> {
        let mut l = Listens {
            net,
            comms: Vec::new(),
        };
        let mut handles = Vec::new();
        for &dev in devs {
            let (h, c) = l.net.listen(dev)?;
            handles.push(h);
            l.comms.push(c);
        }
        Ok((l, handles))
    }
}

impl Drop for Listens {
    fn drop(&mut self) {
        for c in self.comms.drain(..) {
            let _ = self.net.close_listen(c);
        }
    }
}

/// Base address and length of (owner, other, ch)'s slots in a window.
fn slots(layout: &Layout, base: usize, owner: u32, other: u32, ch: u32) -> (usize, usize) {
    (
        base + (layout.offset(owner, other, ch) + SLOTS) as usize,
        (layout.nslots as u64 * layout.slot) as usize,
    )
}

/// A peer to connect: its rank, this rank's shadow of its window, this
/// rank's listens for it, and its handles for this rank (one per channel).
pub struct PeerPlan<'a> {
    /// The peer's rank.
    pub peer: u32,
    /// Host address of this rank's shadow of the peer's window.
    pub shadow: usize,
    /// The listens the peer connects to.
    pub mine: &'a Listens,
    /// The peer's listen handles for this rank.
    pub theirs: Vec<Handle>,
    /// GPU memory for this peer's slots (GPUDirect RDMA), or none.
    pub gpu: GpuSlots,
}

impl PluginLink {
    /// Connects (channel `c` from device `devs[c]`) to every peer's listens
    /// and accepts every peer's connections, all at once and without blocking (a rank waiting for one
    /// peer while that peer waits for another would deadlock), until
    /// `deadline`; then registers each link's shadow and window slots.
    ///
    /// # Safety
    /// `window` and every plan's `shadow` stay mapped (and `layout`-shaped)
    /// until the links and their proxies are gone, and so do the plans'
    /// GPU buffers ([`gpu_slots_bytes`] each, allocated in `ctx`, which is
    /// current). `ctx` is the ring's context (null: none).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn connect_all(
        net: &Arc<dyn Net>,
        devs: &[usize],
        layout: Layout,
        me: u32,
        window: usize,
        mut plans: Vec<PeerPlan>,
        deadline: Instant,
        ctx: crate::driver::CUcontext,
    ) -> Result<Vec<PluginLink>> {
        let n = layout.nch as usize;
        if devs.len() != n {
            return Err(Error::internal("GPU plugin path: a device per channel"));
        }
        for p in &plans {
            if p.mine.comms.len() != n || p.theirs.len() != n {
                return Err(Error::internal("GPU plugin path: handle count"));
            }
        }
        let mut sends: Vec<Vec<Option<SendComm>>> = plans
            .iter()
            .map(|_| (0..n).map(|_| None).collect())
            .collect();
        let mut recvs: Vec<Vec<Option<RecvComm>>> = plans
            .iter()
            .map(|_| (0..n).map(|_| None).collect())
            .collect();
        loop {
            let mut left = 0;
            for (k, p) in plans.iter_mut().enumerate() {
                for c in 0..n {
                    if sends[k][c].is_none() {
                        sends[k][c] = net.connect(devs[c], &mut p.theirs[c])?;
                        left += sends[k][c].is_none() as usize;
                    }
                    if recvs[k][c].is_none() {
                        recvs[k][c] = net.accept(&p.mine.comms[c])?;
                        left += recvs[k][c].is_none() as usize;
                    }
                }
            }
            if left == 0 {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::remote(format!(
                    "GPU plugin path: {left} connection(s) not up by the init timeout ({})",
                    net.name()
                )));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        let mut links = Vec::new();
        for ((p, ss), rs) in plans.iter().zip(sends).zip(recvs) {
            let mut link = PluginLink {
                net: net.clone(),
                layout,
                me,
                peer: p.peer,
                shadow: p.shadow,
                window,
                gpu: p.gpu,
                ctx: ctx as usize,
                chans: Vec::new(),
            };
            // One DMA-BUF descriptor per GPU buffer, closed once every
            // channel's slice is registered (the plugin keeps what it needs).
            let fds = DmaBufs::open(&layout, &p.gpu)?;
            let per = layout.nslots as u64 * layout.slot;
            for (c, (s, r)) in ss.into_iter().zip(rs).enumerate() {
                let (Some(send), Some(recv)) = (s, r) else {
                    return Err(Error::internal("GPU plugin path: connection lost"));
                };
                let c = c as u32;
                let len = per as usize;
                let how = |fd: i32| {
                    if p.gpu.dmabuf {
                        DeviceMemory::DmaBuf {
                            fd,
                            offset: c as u64 * per,
                        }
                    } else {
                        DeviceMemory::Address
                    }
                };
                let sa = link.send_slots(c);
                let wa = link.recv_slots(c);
                // SAFETY: the caller keeps the windows and GPU buffers
                // alive while the link lives; the registrations are released
                // in Drop before that.
                let smr = unsafe {
                    if p.gpu.send != 0 {
                        net.reg_mr_device(CommRef::Send(&send), sa as *mut u8, len, how(fds.send))
                    } else {
                        net.reg_mr(CommRef::Send(&send), sa as *mut u8, len)
                    }
                };
                // SAFETY: as above.
                let rmr = unsafe {
                    if p.gpu.recv != 0 {
                        net.reg_mr_device(CommRef::Recv(&recv), wa as *mut u8, len, how(fds.recv))
                    } else {
                        net.reg_mr(CommRef::Recv(&recv), wa as *mut u8, len)
                    }
                };
                match (smr, rmr) {
                    (Ok(smr), Ok(rmr)) => link.chans.push(Chan {
                        send,
                        recv,
                        smr,
                        rmr,
                    }),
                    (a, b) => {
                        let why = [&a, &b]
                            .iter()
                            .filter_map(|r| r.as_ref().err().map(|e| e.message().to_string()))
                            .collect::<Vec<_>>()
                            .join("; ");
                        if let Ok(m) = a {
                            let _ = net.dereg_mr(CommRef::Send(&send), m);
                        }
                        if let Ok(m) = b {
                            let _ = net.dereg_mr(CommRef::Recv(&recv), m);
                        }
                        let _ = net.close_send(send);
                        let _ = net.close_recv(recv);
                        return Err(Error::system(format!(
                            "GPU plugin path: {} could not register {} memory for rank {}: {why}",
                            net.name(),
                            if p.gpu.send != 0 || p.gpu.recv != 0 {
                                "GPU and host"
                            } else {
                                "host"
                            },
                            p.peer
                        )));
                    }
                }
            }
            links.push(link);
        }
        Ok(links)
    }
}

/// The DMA-BUF descriptors of a link's GPU buffers (-1: none), closed on drop.
struct DmaBufs {
    send: i32,
    recv: i32,
}

impl DmaBufs {
    fn open(layout: &Layout, gpu: &GpuSlots) -> Result<DmaBufs> {
        let mut d = DmaBufs { send: -1, recv: -1 };
        if !gpu.dmabuf {
            return Ok(d);
        }
        let len = gpu_slots_bytes(layout);
        for (at, fd) in [(gpu.send, &mut d.send), (gpu.recv, &mut d.recv)] {
            if at != 0 {
                // SAFETY: `at` is a live allocation of `len` bytes in the
                // current context (connect_all's contract).
                *fd = unsafe { crate::driver::dmabuf_fd(at, len) }.map_err(Error::from)?;
            }
        }
        Ok(d)
    }
}

impl Drop for DmaBufs {
    fn drop(&mut self) {
        for fd in [self.send, self.recv] {
            if fd >= 0 {
                // SAFETY: a descriptor the driver gave us, closed once.
                unsafe { libc::close(fd) };
            }
        }
    }
}

impl Drop for PluginLink {
    fn drop(&mut self) {
        for ch in self.chans.drain(..) {
            let _ = self.net.dereg_mr(CommRef::Send(&ch.send), ch.smr);
            let _ = self.net.dereg_mr(CommRef::Recv(&ch.recv), ch.rmr);
            let _ = self.net.close_send(ch.send);
            let _ = self.net.close_recv(ch.recv);
        }
    }
}

/// # Safety
/// `addr` is aligned and inside a live window.
unsafe fn w64(addr: usize) -> &'static AtomicU64 {
    // SAFETY: forwarded.
    unsafe { AtomicU64::from_ptr(addr as *mut u64) }
}

/// # Safety
/// As [`w64`].
unsafe fn w32(addr: usize) -> &'static AtomicU32 {
    // SAFETY: forwarded.
    unsafe { AtomicU32::from_ptr(addr as *mut u32) }
}

/// The thread that drives one peer's link.
#[derive(Debug)]
pub struct PluginProxy {
    stop: Arc<AtomicBool>,
    idle_passes: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Progress {
    posted_s: u64,
    done_s: u64,
    sreqs: VecDeque<Request>,
    posted_r: u64,
    done_r: u64,
    rreqs: VecDeque<Request>,
}

impl PluginProxy {
    /// Starts the thread (it owns the link; connections close when it ends).
    pub fn start(link: PluginLink, on_error: OnError) -> Result<PluginProxy> {
        let stop = Arc::new(AtomicBool::new(false));
        let idle_passes = Arc::new(AtomicU64::new(0));
        let (s, ip) = (stop.clone(), idle_passes.clone());
        let t = std::thread::Builder::new()
            .name("oxccl-gpu-netplugin".into())
            .spawn(move || {
                if link.ctx != 0 {
                    // SAFETY: the ring's context outlives its proxies (the
                    // ring stops them before it releases the context).
                    let _ = unsafe { crate::driver::ctx_set_current(link.ctx as _) };
                }
                // SAFETY: the link's windows stay mapped until the ring joined
                // this thread (PluginProxy::stop, before the ring frees them).
                if let Err(e) = unsafe { drive(&link, &s, &ip) } {
                    if !s.load(Ordering::Acquire) {
                        on_error(e);
                    }
                }
                // Connections close here (the link drops), in this thread.
            })
            .map_err(|e| Error::system(format!("cannot start a GPU plugin proxy thread: {e}")))?;
        Ok(PluginProxy {
            stop,
            idle_passes,
            thread: Some(t),
        })
    }

    /// Waits until `deadline` for two passes with every send done (what the
    /// finished kernels wrote has left).
    pub fn drain(&self, deadline: Instant) -> bool {
        crate::netproxy::wait_idle(&self.idle_passes, deadline, || {
            self.thread.as_ref().is_none_or(|t| t.is_finished())
        })
    }

    /// Marks the proxy as stopping: from now on a failing connection (the
    /// other end tearing down too) is not reported.
    pub fn halt(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Stops and joins the thread (its connections close).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for PluginProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

fn net_err(peer: u32, what: &str, e: Error) -> Error {
    Error::remote(format!(
        "GPU plugin path to rank {peer}: {what}: {} (the peer died or the network failed)",
        e.message()
    ))
}

/// # Safety
/// The link's shadow and window are live and `layout`-shaped.
unsafe fn drive(link: &PluginLink, stop: &AtomicBool, idle_passes: &AtomicU64) -> Result<()> {
    let PluginLink {
        ref net,
        layout,
        me,
        peer,
        shadow,
        window,
        gpu,
        ref chans,
        ..
    } = *link;
    let nslots = layout.nslots as u64;
    let mut st: Vec<Progress> = (0..chans.len()).map(|_| Progress::default()).collect();
    let mut idle = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let mut busy = false;
        let mut sends_left = false;
        for (c, (ch, p)) in chans.iter().zip(st.iter_mut()).enumerate() {
            let c = c as u32;
            let sbase = shadow + layout.offset(peer, me, c) as usize;
            let wbase = window + layout.offset(me, peer, c) as usize;
            // The word accesses below: header words of this channel's
            // regions, inside the live windows.
            // SAFETY: the shadow region's tail word, inside the live shadow.
            let tail = unsafe { w64(sbase + TAIL as usize) }.load(Ordering::Acquire);
            while p.posted_s < tail && (p.sreqs.len() as u64) < nslots {
                let slot = p.posted_s % nslots;
                // SAFETY: the slot's size word, inside the live shadow.
                let len = unsafe { w32(sbase + SIZES as usize + 4 * slot as usize) }
                    .load(Ordering::Acquire)
                    .min(layout.slot as u32) as usize;
                let at = link.send_slots(c) + (slot * layout.slot) as usize;
                // SAFETY: slot `slot` of the registered send slots; the
                // kernel does not rewrite it before this send completes
                // (the head written below says when).
                let r = unsafe { net.isend(&ch.send, at as *const u8, len, 0, &ch.smr) }
                    .map_err(|e| net_err(peer, "isend", e))?;
                let Some(r) = r else { break };
                p.sreqs.push_back(r);
                p.posted_s += 1;
                busy = true;
            }
            while let Some(r) = p.sreqs.pop_front() {
                match net.test(r).map_err(|e| net_err(peer, "test(send)", e))? {
                    Poll::Done(_) => {
                        p.done_s += 1;
                        // SAFETY: the window region's head word, inside the live window.
                        unsafe { w64(wbase + HEAD as usize) }.store(p.done_s, Ordering::Release);
                        busy = true;
                    }
                    Poll::Pending(r) => {
                        p.sreqs.push_front(r);
                        break;
                    }
                }
            }
            sends_left |= !p.sreqs.is_empty() || p.posted_s < tail;
            // The receiving kernel's head for this peer (in the shadow).
            // SAFETY: the shadow region's head word, inside the live shadow.
            let drained = unsafe { w64(sbase + HEAD as usize) }.load(Ordering::Acquire);
            while p.posted_r < drained + nslots && (p.rreqs.len() as u64) < nslots {
                let slot = p.posted_r % nslots;
                let at = link.recv_slots(c) + (slot * layout.slot) as usize;
                // SAFETY: slot `slot` of our registered receive slots, which
                // the kernel has drained (head) and reads again only after
                // the tail below.
                let r =
                    unsafe { net.irecv(&ch.recv, at as *mut u8, layout.slot as usize, 0, &ch.rmr) }
                        .map_err(|e| net_err(peer, "irecv", e))?;
                let Some(r) = r else { break };
                p.rreqs.push_back(r);
                p.posted_r += 1;
                busy = true;
            }
            while let Some(r) = p.rreqs.pop_front() {
                match net.test(r).map_err(|e| net_err(peer, "test(recv)", e))? {
                    Poll::Done(0) => {
                        // The peer's goodbye: it left in order and wants
                        // nothing more from us.
                        return Ok(());
                    }
                    Poll::Done(n) => {
                        if gpu.recv != 0 && gpu.flush {
                            let slot = p.done_r % nslots;
                            let at = link.recv_slots(c) + (slot * layout.slot) as usize;
                            // SAFETY: the receive just completed into this
                            // registered slot; the kernel reads it only
                            // after the tail below.
                            unsafe { flush(net.as_ref(), ch, at, n, stop) }
                                .map_err(|e| net_err(peer, "iflush", e))?;
                        }
                        p.done_r += 1;
                        // SAFETY: the window region's tail word, inside the live window.
                        unsafe { w64(wbase + TAIL as usize) }.store(p.done_r, Ordering::Release);
                        busy = true;
                    }
                    Poll::Pending(r) => {
                        p.rreqs.push_front(r);
                        break;
                    }
                }
            }
        }
        if !sends_left && !busy {
            idle_passes.fetch_add(1, Ordering::AcqRel);
        }
        if busy {
            idle = Instant::now();
        } else if idle.elapsed() > Duration::from_millis(1) {
            std::thread::sleep(Duration::from_micros(20));
        } else {
            std::hint::spin_loop();
        }
    }
    goodbye(link);
    Ok(())
}

/// Flushes `n` received bytes at `at` and waits for the flush (short: the
/// NIC's last writes reaching GPU memory), or until `stop`.
///
/// # Safety
/// `at..at+n` is a completed receive's slot, registered as `ch.rmr`.
unsafe fn flush(net: &dyn Net, ch: &Chan, at: usize, n: usize, stop: &AtomicBool) -> Result<()> {
    // SAFETY: forwarded.
    let Some(mut r) = (unsafe { net.iflush(&ch.recv, at as *mut u8, n, &ch.rmr) })? else {
        return Ok(());
    };
    loop {
        match net.test(r)? {
            Poll::Done(_) => return Ok(()),
            Poll::Pending(x) if !stop.load(Ordering::Acquire) => {
                r = x;
                std::hint::spin_loop();
            }
            Poll::Pending(_) => return Ok(()),
        }
    }
}

/// Stopped in order (the ring drained us first): a zero-byte message on
/// every channel. 500 ms at most: a peer that does not receive cannot hold
/// teardown longer, and a failure here changes nothing (we are leaving).
fn goodbye(link: &PluginLink) {
    let until = Instant::now() + Duration::from_millis(500);
    let mut reqs = Vec::new();
    for (c, ch) in link.chans.iter().enumerate() {
        let at = link.send_slots(c as u32);
        loop {
            // SAFETY: zero bytes at the start of this channel's registered
            // shadow slots (nothing is read).
            match unsafe { link.net.isend(&ch.send, at as *const u8, 0, 0, &ch.smr) } {
                Ok(Some(r)) => {
                    reqs.push(r);
                    break;
                }
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_micros(20)),
                _ => break,
            }
        }
    }
    for mut r in reqs {
        loop {
            match link.net.test(r) {
                Ok(Poll::Pending(x)) if Instant::now() < until => {
                    r = x;
                    std::thread::sleep(Duration::from_micros(20));
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netproxy::tests::{run_kernels, TwoRanks};

    fn plugin() -> Arc<dyn Net> {
        let so = oxccl_net::testing::build_test_plugin("", "cuda");
        match oxccl_net::load(Some(&[so.display().to_string()])) {
            oxccl_net::LoadOutcome::Loaded(p) => p,
            other => panic!("test plugin did not load: {other:?}"),
        }
    }

    /// Two ranks linked through the repo's test plugin (the real ncclNet
    /// ABI over its TCP): the same kernel play as the TCP proxy's test, with
    /// no head messages on the wire (the plugin's ordered receives carry the
    /// flow control), then a clean teardown.
    #[test]
    fn slots_cross_through_a_plugin() {
        through_a_plugin(false);
    }

    /// Rank 1 tears down while rank 0's proxy still runs (its receives
    /// posted): rank 1's zero-byte goodbye makes that no error; without it
    /// the plugin's failing receive was one (3 processes on the GPU machine).
    #[test]
    fn a_peer_leaving_in_order_is_not_an_error() {
        through_a_plugin(true);
    }

    /// Channels spread over every device of the plugin (the test plugin's
    /// interfaces: loopback and whichever are up), as ring setup spreads
    /// them over equally near NICs.
    fn spread(net: &dyn Net, nch: u32) -> Vec<usize> {
        let nics: Vec<(usize, Option<oxccl_core::topo::GpuSite>)> =
            oxccl_net::usable_devices(net, None)
                .into_iter()
                .map(|(d, _)| (d, None))
                .collect();
        let devs = oxccl_core::topo::nic_per_channel(
            &Default::default(),
            &nics,
            0,
            nch,
            oxccl_core::topo::CrossNic::Allowed,
        );
        assert_eq!(devs.len(), nch as usize);
        devs
    }

    fn through_a_plugin(one_leaves_first: bool) {
        let net = plugin();
        let TwoRanks {
            layout,
            w0,
            w1,
            sh0,
            sh1,
        } = TwoRanks::new();
        let devs = spread(net.as_ref(), layout.nch);
        let (l0, h0) = Listens::open(net.clone(), &devs).unwrap();
        let (l1, h1) = Listens::open(net.clone(), &devs).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let (w0a, w1a, sh0a, sh1a) = (w0.addr(), w1.addr(), sh0.addr(), sh1.addr());
        let errs = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        // Rank 0 in a thread of its own (it owns its listens: they are not
        // shared between threads), rank 1 here, both at once.
        let n0 = net.clone();
        let d0 = devs.clone();
        let t0 = std::thread::spawn(move || {
            let plan = PeerPlan {
                peer: 1,
                shadow: sh0a,
                mine: &l0,
                theirs: h1,
                gpu: GpuSlots::default(),
            };
            // SAFETY: the buffers outlive the links (stopped below).
            let r = unsafe {
                PluginLink::connect_all(
                    &n0,
                    &d0,
                    layout,
                    0,
                    w0a,
                    vec![plan],
                    deadline,
                    std::ptr::null_mut(),
                )
            };
            (r, l0)
        });
        let plan = PeerPlan {
            peer: 0,
            shadow: sh1a,
            mine: &l1,
            theirs: h0,
            gpu: GpuSlots::default(),
        };
        // SAFETY: as above.
        let links1 = unsafe {
            PluginLink::connect_all(
                &net,
                &devs,
                layout,
                1,
                w1a,
                vec![plan],
                deadline,
                std::ptr::null_mut(),
            )
        };
        let (links0, l0) = t0.join().unwrap();
        let on = |errs: Arc<std::sync::Mutex<Vec<String>>>| -> OnError {
            Arc::new(move |e: Error| errs.lock().unwrap().push(e.message().to_string()))
        };
        let mut p0 = PluginProxy::start(links0.unwrap().pop().unwrap(), on(errs.clone())).unwrap();
        let mut p1 = PluginProxy::start(links1.unwrap().pop().unwrap(), on(errs.clone())).unwrap();
        run_kernels(layout, w0a, sh0a, w1a, sh1a, 23);
        let d = Instant::now() + Duration::from_secs(5);
        assert!(p0.drain(d) && p1.drain(d));
        if one_leaves_first {
            p1.halt();
            p1.stop();
            // Rank 0 sees the goodbye, its thread ends without an error.
            let t = Instant::now();
            while p0.thread.as_ref().is_some_and(|t| !t.is_finished())
                && t.elapsed() < Duration::from_secs(5)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(p0.thread.as_ref().is_some_and(|t| t.is_finished()));
        }
        p0.halt();
        p1.halt();
        p0.stop();
        p1.stop();
        drop((l0, l1));
        assert!(
            errs.lock().unwrap().is_empty(),
            "{:?}",
            errs.lock().unwrap()
        );
    }
}
