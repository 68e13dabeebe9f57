//! The driver calls and socket I/O of the two-process copy-engine calls
//! ([`two_process`] decides what they are; this only carries it out).

use super::*;
use oxccl_core::gpu::two_process;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long one read of the per-call channel blocks before it looks at the
/// abort word and the deadline again (an abort is seen within this).
const POLL: Duration = Duration::from_millis(50);

/// A communicator's per-call channel with its peer in another process,
/// and the peer allocations it opened.
#[derive(Debug)]
pub(super) struct TwoProcessChannel {
    peer: usize,
    /// The byte bounds both ranks agreed on.
    bounds: two_process::Bounds,
    chan: Mutex<Chan>,
    /// This rank's allocations' IPC handles by buffer id (`None`: not
    /// exportable), so a buffer passed again costs no driver call.
    exports: Mutex<two_process::Exports>,
    /// The peer's allocations opened here, by its buffer id.
    cache: Mutex<two_process::Cache>,
}

#[derive(Debug)]
struct Chan {
    stream: TcpStream,
    seq: u64,
}

/// Peer allocations open in this process, by (GPU, IPC handle): a handle
/// is opened once per process whatever the number of communicators that
/// use it (a second open of the same handle is refused by the driver), and
/// closed when the last one lets go.
/// (GPU, IPC handle) -> (mapped address, references).
type Imports = HashMap<(i32, [u8; 64]), (u64, usize)>;

fn imports() -> MutexGuard<'static, Imports> {
    static M: OnceLock<Mutex<Imports>> = OnceLock::new();
    lock(M.get_or_init(Default::default))
}

/// Peer allocations open in this process.
pub(super) fn open_mappings() -> usize {
    imports().len()
}

/// Opens (or takes another reference to) the allocation of `handle` in
/// the current context (GPU `ordinal`'s).
pub(super) fn import(ordinal: i32, handle: &[u8; 64]) -> Result<u64> {
    let mut m = imports();
    if let Some(e) = m.get_mut(&(ordinal, *handle)) {
        e.1 += 1;
        return Ok(e.0);
    }
    let p = guarded("cuIpcOpenMemHandle", || {
        let mut h = cu::CUipcMemHandle_st { reserved: [0; 64] };
        for (o, c) in h.reserved.iter_mut().zip(handle.iter()) {
            *o = *c as _;
        }
        // SAFETY: a handle the peer made with cuIpcGetMemHandle for an
        // allocation it passed to this very call (live until the call's
        // last barrier).
        unsafe { cu::ipc_open_mem_handle(h) }
            .map_err(|e| e.context("cuIpcOpenMemHandle (the peer's buffer)"))
    })?;
    m.insert((ordinal, *handle), (p, 1));
    Ok(p)
}

/// Drops a reference taken by [`import`]; the last closes the mapping. The
/// caller made sure no queued work uses it (the context was synchronised).
pub(super) fn release(ordinal: i32, mapped: u64) {
    let mut m = imports();
    let key = m
        .iter()
        .find(|(k, v)| k.0 == ordinal && v.0 == mapped)
        .map(|(k, _)| *k);
    if let Some(k) = key {
        let last = m.get_mut(&k).map(|e| {
            e.1 -= 1;
            e.1 == 0
        });
        if last == Some(true) {
            m.remove(&k);
            // SAFETY: opened by `import`, no reference left, no work queued on it.
            let _ = unsafe { cu::ipc_close_mem_handle(mapped) };
        }
    }
}

/// `CU_POINTER_ATTRIBUTE_BUFFER_ID` of a device pointer.
fn buffer_id(ptr: u64) -> Result<u64> {
    guarded("cuPointerGetAttribute", || {
        // SAFETY: the attribute is an unsigned long long.
        unsafe {
            cu::pointer_attribute_u64(cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr)
        }
        .map_err(|e| e.context("cuPointerGetAttribute(BUFFER_ID)"))
    })
}

/// The IPC handle of the allocation at `base`, or `None` when it cannot be
/// exported (a VMM allocation, or memory from another allocator).
pub(super) fn ipc_handle(base: u64) -> Option<[u8; 64]> {
    guarded("cuIpcGetMemHandle", || {
        // SAFETY: `base` is an allocation's start.
        let h = unsafe { cu::ipc_get_mem_handle(base) }?;
        let mut out = [0u8; 64];
        for (o, c) in out.iter_mut().zip(h.reserved.iter()) {
            *o = *c as u8;
        }
        Ok(out)
    })
    .ok()
}

/// What stops a wait on the channel early: the ring's abort (or a dead
/// peer the watchdog saw), or an error its kernels recorded.
fn ring_stop(ring: &Ring) -> impl Fn() -> Option<Error> + '_ {
    move || {
        if ring.aborted() {
            Some(ring.abort_reason())
        } else {
            ring.error()
        }
    }
}

impl Chan {
    /// The channel over `stream` (a bootstrap connection to the peer): no
    /// Nagle delay, reads that return every [`POLL`].
    fn new(stream: TcpStream) -> Result<Chan> {
        let io = |e: std::io::Error| Error::system(format!("copy-engine channel setup: {e}"));
        stream.set_nodelay(true).map_err(io)?;
        stream.set_read_timeout(Some(POLL)).map_err(io)?;
        Ok(Chan { stream, seq: 0 })
    }

    /// Sends `out` and reads the peer's `len` bytes; gives up with
    /// `stop()`'s error when it has one (checked every [`POLL`]), or with a
    /// timeout after `limit` (zero: none). `peer` and `what` name the wait
    /// in errors.
    fn exchange(
        &mut self,
        out: &[u8],
        len: usize,
        stop: &dyn Fn() -> Option<Error>,
        limit: Duration,
        peer: usize,
        what: &str,
    ) -> Result<Vec<u8>> {
        let lost = |e: std::io::Error| {
            Error::remote(format!(
                "the copy-engine channel with rank {peer} failed during {what}: {e} (its process \
                 ended, or it destroyed the communicator)"
            ))
        };
        self.stream.write_all(out).map_err(lost)?;
        let mut buf = vec![0u8; len];
        let mut got = 0;
        let t0 = Instant::now();
        while got < len {
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(lost(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "connection closed",
                    )))
                }
                Ok(n) => got += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) =>
                {
                    if let Some(e) = stop() {
                        return Err(e);
                    }
                    if !limit.is_zero() && t0.elapsed() > limit {
                        return Err(Error::timeout(format!(
                            "rank {peer} did not reach {what} within {:.0} s (the communicator's \
                             timeout): it is making other calls, or is stuck before this one",
                            limit.as_secs_f64()
                        )));
                    }
                }
                Err(e) => return Err(lost(e)),
            }
        }
        Ok(buf)
    }
}

impl DevComm {
    /// Sets up the per-call channel when the peer of a 2-rank communicator
    /// is another process of this host with a device window (both ranks
    /// see the same facts, so both connect or neither): the bootstrap's
    /// connection [`two_process::STREAM_INDEX`], then both ranks' byte bounds
    /// ([`two_process::agree_bounds`]).
    pub(super) fn setup_two_process(&self, boot: &RingBoot) -> Result<()> {
        let Some(Ok(r)) = self.ring.get() else {
            return Ok(());
        };
        if self.nranks != 2 || r.kind() != ring::WindowKind::Device {
            return Ok(());
        }
        let peer = 1 - self.rank;
        if r.same_process(peer) || !r.same_host(peer) {
            return Ok(());
        }
        let mut chan = Chan::new((boot.stream)(peer, two_process::STREAM_INDEX)?)?;
        let forced = self.ring_only.load(std::sync::atomic::Ordering::Relaxed);
        let mine = if forced {
            two_process::Bounds::OFF
        } else {
            two_process::Bounds {
                push_streams: self.config.ce_push_streams,
                ..two_process::Bounds::from_settings(
                    self.config.ce_min,
                    self.config.ce_ar_min_set,
                    self.config.ce_push,
                )
            }
        };
        let b = chan.exchange(
            &mine.encode(),
            two_process::Bounds::LEN,
            &ring_stop(r),
            r.timeout(),
            peer,
            "the copy-engine channel setup",
        )?;
        let theirs = two_process::Bounds::decode(&b)
            .ok_or_else(|| Error::internal("copy-engine channel setup: malformed bounds"))?;
        let bounds = two_process::agree_bounds(mine, theirs);
        if bounds != mine {
            oxccl_env::warn!(
                "rank {}: copy engines off with rank {peer}: its bounds (copies {}, \
                 all-reduces {}, reduce-scatters {} bytes, pushed pieces {} on {} streams; \
                 OXCCL_CUDA_CE_MIN, OXCCL_CUDA_CE_AR_MIN, OXCCL_CUDA_CE_PUSH, \
                 OXCCL_CUDA_CE_PUSH_STREAMS, OXCCL_CUDA_RING) differ from this rank's ({}, {}, \
                 {}, {} on {}); set them alike on every rank",
                self.rank,
                theirs.copy,
                theirs.ar,
                theirs.rs,
                theirs.push,
                theirs.push_streams,
                mine.copy,
                mine.ar,
                mine.rs,
                mine.push,
                mine.push_streams
            );
        }
        oxccl_env::info!(
            oxccl_env::log::Subsys::INIT,
            "rank {}: copy engines with rank {peer} (another process): copies from {} bytes, \
             all-reduces from {} (pulled from {}), reduce-scatters from {} (pulled from {}; \
             0: never), out-of-place reductions pushed in pieces of {} (0: pulled) on {} \
             copy streams, in-place ones {} (OXCCL_CUDA_CE_PUSH_IN_PLACE, both ranks)",
            self.rank,
            bounds.copy,
            bounds.ar,
            bounds.pull_ar,
            bounds.rs,
            bounds.pull_rs,
            bounds.push,
            bounds.push_streams,
            if self.config.ce_push_in_place && bounds.push > 0 {
                "pushed"
            } else {
                "pulled"
            }
        );
        let _ = self.two_process.set(TwoProcessChannel {
            peer,
            bounds,
            chan: Mutex::new(chan),
            exports: Mutex::new(two_process::Exports::default()),
            cache: Mutex::new(two_process::Cache::new(two_process::CACHE_SLOTS)),
        });
        Ok(())
    }

    /// `call` when it may take the copy engines with a peer of another
    /// process: the channel is up, the shape is [`two_process::eligible`], and the
    /// stream is not being captured (the reduction's stream memory
    /// operations are not captured; every rank captures alike).
    pub(super) fn two_process_call(
        &self,
        call: two_process::Call,
        stream: usize,
    ) -> Option<two_process::Call> {
        let xs = self.two_process.get()?;
        (two_process::eligible(&call, &xs.bounds) && !capturing(stream)).then_some(call)
    }

    /// This rank's buffer at `ptr` as the peer may open it.
    fn export(&self, xs: &TwoProcessChannel, ptr: u64) -> two_process::Buf {
        let Ok((Memory::Device(o), Some((base, size)))) = locate(ptr as *const c_void) else {
            return two_process::Buf::NONE;
        };
        if o != self.gpu.ordinal || ptr < base {
            return two_process::Buf::NONE;
        }
        let Ok(id) = buffer_id(ptr) else {
            return two_process::Buf::NONE;
        };
        let mut ex = lock(&xs.exports);
        let h = match ex.get(id) {
            Some(h) => h,
            None => {
                let h = ipc_handle(base);
                ex.insert(id, base, h);
                h
            }
        };
        match h {
            Some(handle) => two_process::Buf {
                ok: true,
                id,
                base,
                size,
                offset: ptr - base,
                handle,
            },
            None => two_process::Buf::NONE,
        }
    }

    /// Closes the mappings of the peer's allocations that its message says
    /// it freed (never one this call shares), after synchronising the
    /// context: no queued copy may still use them.
    fn close_dead(&self, xs: &TwoProcessChannel, theirs: &two_process::Msg) -> Result<()> {
        let mut cache = lock(&xs.cache);
        let ids: Vec<u64> = theirs
            .dead
            .iter()
            .copied()
            .filter(|&id| {
                id != 0
                    && theirs
                        .bufs
                        .iter()
                        .chain([&theirs.stage])
                        .all(|b| b.id != id)
            })
            .collect();
        let gone: Vec<u64> = ids.into_iter().filter_map(|id| cache.remove(id)).collect();
        if !gone.is_empty() {
            synchronize_current()?;
            for m in gone {
                release(self.gpu.ordinal, m);
            }
        }
        Ok(())
    }

    /// Where the peer's two allocations are mapped here (opened now when
    /// not yet; an evicted one closed after synchronising the context).
    fn open_peer(&self, xs: &TwoProcessChannel, bufs: &[two_process::Buf; 2]) -> Result<[u64; 2]> {
        let mut cache = lock(&xs.cache);
        let mut out = [0u64; 2];
        for (i, b) in bufs.iter().enumerate() {
            if !b.ok {
                // Not shared (a send/receive's unused side): never read.
                continue;
            }
            if let Some(m) = cache.get(b.id) {
                out[i] = m;
                continue;
            }
            let m = import(self.gpu.ordinal, &b.handle)?;
            if let Some(ev) = cache.insert(b.id, m) {
                // Earlier calls' copies may still read the evicted mapping.
                synchronize_current()?;
                release(self.gpu.ordinal, ev);
            }
            out[i] = m;
        }
        Ok(out)
    }

    /// Runs `call` on the copy engines with the peer process when both
    /// ranks can (true), or tells the caller to launch the ring kernel
    /// (false: both ranks decide alike). Errors: the peer's call differs,
    /// the channel broke, abort or timeout while waiting for the peer.
    pub(super) fn enqueue_two_process(
        &self,
        call: &two_process::Call,
        stream: usize,
    ) -> Result<bool> {
        let Some(xs) = self.two_process.get() else {
            return Ok(false);
        };
        let r = self.ring()?;
        let _scope = CtxScope::enter(self.gpu.ctx)?;
        let bufs = [self.export(xs, call.input), self.export(xs, call.output)];
        // An in-place reduction shares this rank's scratch, where the peer
        // may push (two_process::in_place_pushable).
        let stage = if self.config.ce_push_in_place
            && xs.bounds.push > 0
            && two_process::in_place(call, &bufs, self.rank)
        {
            match self.ce_scratch() {
                Ok(p) => self.export(xs, p),
                Err(_) => two_process::Buf::NONE,
            }
        } else {
            two_process::Buf::NONE
        };
        let dead = {
            // One driver call per allocation shared so far (a training loop
            // shares a few): which of them were freed since.
            let mut ex = lock(&xs.exports);
            ex.sweep(|base| buffer_id(base).ok());
            ex.take_dead()
        };
        let mut ch = lock(&xs.chan);
        let mine = two_process::Msg {
            seq: ch.seq,
            call: *call,
            bufs,
            stage,
            dead,
        };
        ch.seq += 1;
        let what = format!("its copy-engine call #{}", mine.seq);
        let stop = ring_stop(r);
        let b = ch.exchange(
            &mine.encode(),
            two_process::MSG_LEN,
            &stop,
            r.timeout(),
            xs.peer,
            &what,
        )?;
        let theirs = two_process::Msg::decode(&b)?;
        self.close_dead(xs, &theirs)?;
        if two_process::check(&mine, &theirs, xs.peer)? == two_process::Verdict::Kernel {
            return Ok(false);
        }
        // A reduction that took the engines by its shape but pulls below
        // the pulled bounds runs the ring kernel on both ranks (each decided
        // from both messages): without opening the peer's buffers or the
        // second round trip that would say so.
        if two_process::declined(&mine, &theirs, &xs.bounds, self.rank) {
            return Ok(false);
        }
        let ready = (|| -> Result<(two_process::RankPlan, KernelFn, KernelFn)> {
            let mapped = self.open_peer(xs, &theirs.bufs)?;
            let pc = two_process::translate(&theirs, mapped);
            let reduction = matches!(
                call.coll,
                two_process::Coll::AllReduce | two_process::Coll::ReduceScatter
            );
            let push = two_process::pushable(&mine, &theirs);
            // Pushed pieces need no scratch ring (nor its 256 MiB).
            let scratch = if reduction && !(push && xs.bounds.push > 0) {
                self.ce_scratch()?
            } else {
                0
            };
            let stage = if xs.bounds.push > 0
                && two_process::in_place_pushable(&mine, &theirs, self.rank)
            {
                let [peer_scratch, _] =
                    self.open_peer(xs, &[theirs.stage, two_process::Buf::NONE])?;
                Some([self.ce_scratch()?, peer_scratch + theirs.stage.offset])
            } else {
                None
            };
            let plan = two_process::plan(call, &pc, self.rank, scratch, &xs.bounds, push, stage)
                .ok_or_else(|| Error::internal("two_process::plan refused an eligible call"))?;
            let fb = self.function_in(&kernels::ring_p2p(), "oxccl_ring_barrier")?;
            let fr = match &plan {
                two_process::RankPlan::Reduce(p) => self.function_in(
                    &kernels::ce_reduce_variant(p.dtype, p.op),
                    &kernels::ce_reduce_kernel(p.dtype, p.op),
                )?,
                two_process::RankPlan::Pushed(p) => self.function_in(
                    &kernels::ce_reduce_variant(p.dtype, p.op),
                    &kernels::ce_reduce_kernel(p.dtype, p.op),
                )?,
                two_process::RankPlan::Copy(_) => KernelFn::NONE,
            };
            Ok((plan, fb, fr))
        })();
        let ans = ch.exchange(
            &[ready.is_ok() as u8],
            1,
            &stop,
            r.timeout(),
            xs.peer,
            &what,
        )?;
        let (plan, fb, fr) = match ready {
            Ok(x) if ans[0] == 1 => x,
            Ok(_) => {
                oxccl_env::info!(
                    oxccl_env::log::Subsys::COLL,
                    "rank {}: rank {} could not open this call's buffers: the ring kernel runs it",
                    self.rank,
                    xs.peer
                );
                return Ok(false);
            }
            Err(e) => {
                oxccl_env::info!(
                    oxccl_env::log::Subsys::COLL,
                    "rank {}: copy engines not taken with rank {}, the ring kernel runs it: {}",
                    self.rank,
                    xs.peer,
                    e.message()
                );
                return Ok(false);
            }
        };
        let st = stream as cu::CUstream;
        let args = r.barrier_args(xs.peer);
        // SAFETY: the barrier of this live ring with its peer, which queues
        // the same barriers (it decided alike from the same messages).
        let bar = || unsafe { ring::launch_barrier(fb.raw(), st, args, r.may_pdl(1)) };
        match &plan {
            two_process::RankPlan::Copy(p) => self.queue_ce(&bar, p, st)?,
            // One copy stream: two lost 2-7% here at 512 MiB-2 GiB (all-reduce
            // 1,665 against 1,595 µs at 512 MiB, reduce-scatter 925 against
            // 864) where they win for -g 2 (see enqueue_copy_engine_reduce). 2xH200,
            // 2026-11-30, both on one machine.
            two_process::RankPlan::Reduce(p) => self.queue_ce_reduce(&bar, fr, p, st, false)?,
            two_process::RankPlan::Pushed(p) => self.queue_pushed(&bar, fr, p, st, r, xs.peer)?,
        }
        Ok(true)
    }

    /// A group's sends and receives as the copy engines with the peer
    /// process would take them: at most one send to the peer and one
    /// receive from it, nothing to this rank itself, large enough
    /// ([`two_process::eligible`]), the stream not being captured. Both ranks see
    /// mirrored groups, so both decide alike.
    pub(super) fn xp_p2p(
        &self,
        sends: &[(usize, u64, usize)],
        recvs: &[(usize, u64, usize)],
        stream: usize,
    ) -> Option<two_process::Call> {
        let xs = self.two_process.get()?;
        self.two_process_call(
            two_process::p2p_call(sends, recvs, self.rank, xs.peer)?,
            stream,
        )
    }

    /// Lets go of the peer allocations (the context current and synchronised).
    pub(super) fn close_two_process(&self) {
        if let Some(xs) = self.two_process.get() {
            for m in lock(&xs.cache).drain() {
                release(self.gpu.ordinal, m);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ends of a loopback connection as channels.
    fn pair() -> (Chan, Chan) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (Chan::new(a).unwrap(), Chan::new(b).unwrap())
    }

    const LONG: Duration = Duration::from_secs(20);

    #[test]
    fn both_ends_get_each_others_bytes() {
        let (mut a, mut b) = pair();
        let t = std::thread::spawn(move || {
            b.exchange(
                &[7u8; 300],
                two_process::MSG_LEN,
                &|| None,
                LONG,
                0,
                "call #0",
            )
            .unwrap()
        });
        let got = a
            .exchange(
                &vec![9u8; two_process::MSG_LEN],
                300,
                &|| None,
                LONG,
                1,
                "call #0",
            )
            .unwrap();
        assert_eq!(got, vec![7u8; 300]);
        assert_eq!(t.join().unwrap(), vec![9u8; two_process::MSG_LEN]);
    }

    #[test]
    fn a_peer_that_closes_is_a_remote_error_naming_it() {
        let (mut a, b) = pair();
        drop(b);
        let e = a
            .exchange(&[1], 1, &|| None, LONG, 1, "its copy-engine call #4")
            .unwrap_err();
        assert_eq!(e.kind(), oxccl_core::ErrorKind::Remote);
        assert!(
            e.message().contains("rank 1") && e.message().contains("call #4"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn a_silent_peer_is_a_timeout_naming_it_and_the_call() {
        let (mut a, _b) = pair();
        let t0 = Instant::now();
        let e = a
            .exchange(
                &[1],
                1,
                &|| None,
                Duration::from_millis(300),
                1,
                "its copy-engine call #9",
            )
            .unwrap_err();
        let took = t0.elapsed();
        assert_eq!(e.kind(), oxccl_core::ErrorKind::Timeout);
        assert!(
            e.message()
                .contains("rank 1 did not reach its copy-engine call #9"),
            "{}",
            e.message()
        );
        // The deadline plus at most a poll or two.
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(5),
            "{took:?}"
        );
    }

    #[test]
    fn an_abort_ends_the_wait_with_its_reason() {
        let (mut a, _b) = pair();
        let aborted = std::sync::atomic::AtomicBool::new(false);
        let stop = || {
            aborted
                .load(std::sync::atomic::Ordering::Acquire)
                .then(|| Error::invalid_usage("communicator aborted"))
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                aborted.store(true, std::sync::atomic::Ordering::Release);
            });
            let t0 = Instant::now();
            let e = a.exchange(&[1], 1, &stop, LONG, 1, "call #0").unwrap_err();
            assert_eq!(e.message(), "communicator aborted");
            assert!(t0.elapsed() < Duration::from_secs(5));
        });
    }
}
