//! A group's launches: the order they go in (each communicator's sends and
//! receives merged into one launch), every local rank's calls as one
//! kernel ([`one_launch`]), and the pairing of two ranks' calls for the
//! copy engines; the counters tests read to see which path ran.

use super::*;

/// Launches operations in order, except that the point-to-point launches of
/// each communicator are merged into one (after the others), so sends and
/// receives of one group meet their peers' whatever order they were called in.
/// Where both ranks of a two-GPU in-process communicator are in `launches`,
/// their large copies go to the copy engines (`pair_for_copy_engines`).
pub fn launch_all(launches: Vec<Launch>) -> Result<()> {
    let used = |l: &Launch| StreamUse {
        clique: Arc::as_ptr(&l.comm.in_process.pair) as usize,
        rank: l.comm.rank,
        ctx: l.comm.gpu.ctx as usize,
        stream: l.stream,
    };
    if let Some((a, b)) = shared_stream(&launches, used) {
        let (c, s) = (&launches[a].comm, launches[a].stream);
        return Err(Error::invalid_usage(format!(
            "ranks {} and {} of one communicator were given the same stream {s:#x} on GPU {}: \
             each rank's kernel would wait for the other's, queued behind it, until the \
             timeout; give every rank its own stream",
            c.rank, launches[b].comm.rank, c.gpu.ordinal
        )));
    }
    if let Some(calls) = one_launch_groups(&launches) {
        return enqueue_one_launch(&launches, &calls);
    }
    let mut ops: Vec<Launch> = Vec::with_capacity(launches.len());
    let mut p2p: Vec<Launch> = Vec::new();
    for l in launches {
        match l.kind {
            LaunchKind::P2p { .. } => {
                let key = Arc::as_ptr(&l.comm);
                if let Some(m) = p2p.iter_mut().find(|m| Arc::as_ptr(&m.comm) == key) {
                    if let (
                        LaunchKind::P2p { f, sends, recvs },
                        LaunchKind::P2p {
                            f: f2,
                            sends: s2,
                            recvs: r2,
                        },
                    ) = (&mut m.kind, l.kind)
                    {
                        if *f == KernelFn::NONE {
                            *f = f2;
                        }
                        sends.extend(s2);
                        recvs.extend(r2);
                    }
                } else {
                    p2p.push(l);
                }
            }
            _ => ops.push(l),
        }
    }
    ops.extend(p2p);
    // Every rank sets the same bounds (the parameters say so): the first
    // launch's communicator speaks for the group.
    if let Some(cfg) = ops.first().map(|l| l.comm.config.clone()) {
        pair_for_copy_engines(&mut ops, cfg.ce_min, cfg.ce_ar_min());
    }
    for l in ops {
        l.enqueue()?;
    }
    Ok(())
}

/// Whether a group runs as one-launch kernels of every rank
/// ([`one_launch::group_up`]), and its calls' launches, rank 0's first.
pub(super) fn one_launch_groups(ls: &[Launch]) -> Option<Vec<Vec<usize>>> {
    // Most groups have a launch that cannot: no list built for them.
    if ls.len() < 2 || ls.iter().any(|l| l.one_launch.is_none()) {
        return None;
    }
    let parts: Vec<_> = ls
        .iter()
        .map(|l| {
            (
                Arc::as_ptr(&l.comm.in_process.pair) as usize,
                l.comm.rank,
                l.one_launch,
            )
        })
        .collect();
    one_launch::group_up(&parts, ls[0].comm.nranks)
}

/// Runs each call (its launches, rank 0's first) as one `oxccl_one_launch_*`
/// kernel on rank 0's stream: every other rank's stream records its event,
/// which rank 0's stream waits for (every input is ready); the kernel
/// runs; every other rank's stream waits for an event recorded after it
/// (every output is written). Returns without waiting for the GPUs.
pub(super) fn enqueue_one_launch(ls: &[Launch], calls: &[Vec<usize>]) -> Result<()> {
    for call in calls {
        let l0 = &ls[call[0]];
        let c0 = &l0.comm;
        let mut parts = Vec::with_capacity(call.len());
        for &i in call {
            ls[i].comm.healthy()?;
            let p = ls[i]
                .one_launch
                .ok_or_else(|| Error::internal("a one-launch call without every rank's part"))?;
            parts.push(p);
        }
        let p0 = parts[0];
        let f = c0.typed_function(Family::OneLaunch, p0.dtype, p0.op, || {
            c0.function_in(
                &kernels::ring_variant(p0.dtype, p0.op),
                &ring::one_launch_kernel_name(p0.dtype, p0.op),
            )
        })?;
        let n = call.len();
        let elem = p0.dtype.size() as u64;
        let blocks =
            one_launch::blocks(one_launch::largest_buffer(p0.collective, p0.count, elem, n));
        let s0 = l0.stream as cu::CUstream;
        let mut ready = Vec::with_capacity(n - 1);
        for &i in &call[1..] {
            let l = &ls[i];
            let _scope = CtxScope::enter(l.comm.gpu.ctx)?;
            let e = l.comm.launches.one_launch_event()?;
            record_event(e, l.stream as cu::CUstream)?;
            ready.push(e);
        }
        let e0 = {
            let _scope = CtxScope::enter(c0.gpu.ctx)?;
            for &e in &ready {
                wait_event(s0, e)?;
            }
            // SAFETY: every part comes from a checked call of this group
            // (one_launch_call: every rank in this process, so each rank's
            // buffers are on rank 0's GPU or on a peer that it can access,
            // enabled when the communicator was created); `f` is of rank
            // 0's context, current here.
            unsafe { ring::launch_one_launch(f.raw(), blocks, s0, one_launch::args(&parts))? };
            ONE_LAUNCH_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let e = c0.launches.one_launch_event()?;
            record_event(e, s0)?;
            e
        };
        for &i in &call[1..] {
            let l = &ls[i];
            let _scope = CtxScope::enter(l.comm.gpu.ctx)?;
            wait_event(l.stream as cu::CUstream, e0)?;
        }
        c0.log_tuning(l0.what, "OneLaunch", "Simple", blocks);
    }
    Ok(())
}

/// `cuEventRecord(e, stream)`; the event's context is current.
pub(super) fn record_event(e: cu::CUevent, stream: cu::CUstream) -> Result<()> {
    guarded("cuEventRecord", || {
        // SAFETY: the callers pass an event of the current context
        // (DevComm::one_launch_event, ce_side) and a stream of it (check_stream
        // at prepare, or ce_side's own).
        Ok(unsafe { cu::event_record(e, stream) }?)
    })
}

/// `cuStreamWaitEvent(stream, e)`; the stream's context is current (the
/// event may be another's).
pub(super) fn wait_event(stream: cu::CUstream, e: cu::CUevent) -> Result<()> {
    guarded("cuStreamWaitEvent", || {
        // SAFETY: a stream of the current context and a live event.
        Ok(unsafe { cu::stream_wait_event(stream, e) }?)
    })
}

/// A launch's communicator (its clique's identity), rank, context and stream.
#[derive(Clone, Copy, Debug)]
pub(super) struct StreamUse {
    pub(super) clique: usize,
    pub(super) rank: usize,
    pub(super) ctx: usize,
    pub(super) stream: usize,
}

/// Two launches of a group (indices) that put different ranks of one
/// communicator on the same stream of one context (two ranks sharing a GPU,
/// one thread, one stream: the first rank's kernel waits for the second's,
/// which the stream holds back behind it). `use_of` reads each item's use,
/// so a group's launch path builds no list for the check.
pub(super) fn shared_stream<T>(
    ls: &[T],
    use_of: impl Fn(&T) -> StreamUse,
) -> Option<(usize, usize)> {
    (0..ls.len()).find_map(|i| {
        (i + 1..ls.len())
            .find(|&j| {
                let (a, b) = (use_of(&ls[i]), use_of(&ls[j]));
                a.clique == b.clique && a.rank != b.rank && a.ctx == b.ctx && a.stream == b.stream
            })
            .map(|j| (i, j))
    })
}

/// Queues `x` on `on` (context current).
///
/// # Safety
/// Both ranges must be device memory this context can reach, live until the
/// copy ran.
pub(super) unsafe fn copy_async(x: &ce::Xfer, on: cu::CUstream) -> Result<()> {
    guarded("cuMemcpyAsync", || {
        // SAFETY: the caller's contract.
        Ok(unsafe { cu::memcpy_async(x.dst, x.src, x.bytes as usize, on) }?)
    })
}

/// Rank calls that went to the copy engines in this process (each rank's
/// half counts once): what tests read to know the path was taken.
pub(super) static CE_CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Peer allocations this process holds open for the copy engines between
/// processes (`two_process_io`): what tests read to see that freed ones are let go.
pub fn peer_mappings() -> usize {
    two_process_io::open_mappings()
}

/// How many calls of this process ran as one-launch kernels of every rank
/// so far (every rank's call counts once together; [`oxccl_core::gpu::one_launch`]).
pub fn one_launch_calls() -> u64 {
    ONE_LAUNCH_CALLS.load(std::sync::atomic::Ordering::Relaxed)
}

pub(super) static ONE_LAUNCH_CALLS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// How many rank calls of this process took the copy engines so far.
pub fn ce_calls() -> u64 {
    CE_CALLS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Of [`ce_calls`], the in-place reductions whose pieces were pushed
/// ([`crate::ce_reduce::plan_pushed_in_place`], [`crate::ce_reduce::plan_pushed_ring`]).
pub(super) static CE_IN_PLACE_PUSHES: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// How many rank calls of this process pushed an in-place all-reduce or
/// reduce-scatter.
pub fn ce_in_place_pushes() -> u64 {
    CE_IN_PLACE_PUSHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Of [`ce_in_place_pushes`], those through the peer's scratch ring
/// (reduce-scatters, [`crate::ce_reduce::plan_pushed_ring`]).
pub(super) static CE_RING_PUSHES: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// How many rank calls of this process pushed into the peer's scratch ring.
pub fn ce_ring_pushes() -> u64 {
    CE_RING_PUSHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether a launch may take part in the copy-engine pairing (copies when
/// `min` > 0, reductions when `ar_min` > 0): not a ring launch, not a
/// reduction the copy-engine path does not do, not nothing to do.
pub(super) fn ce_candidate(l: &Launch, min: u64, ar_min: u64) -> bool {
    let c = &l.comm;
    if c.nranks != 2 {
        return false;
    }
    match &l.kind {
        LaunchKind::Pcopy { args, .. } => min > 0 && args.mode != PairKernel::SendRecv.mode(),
        LaunchKind::P2p { f, .. } => min > 0 && *f != KernelFn::NONE && !c.ring_for(l.stream),
        LaunchKind::Half { ce, .. } => ar_min > 0 && ce.is_some(),
        _ => false,
    }
}

/// Rewrites matching copy launches of both ranks of a communicator into
/// copy-engine launches ([`crate::ce`]; who meets whom: [`ce::match_pairs`]),
/// and matching all-reduces / reduce-scatters into copy-engine reductions
/// ([`crate::ce_reduce`]). A communicator whose candidates do not line up
/// keeps its kernels, as does any pair whose largest transfer is below `min`
/// (a reduction: whose size is below `ar_min`). Both ranks of a pair change
/// together, and a copy-engine launch takes the same barrier values on both.
pub(super) fn pair_for_copy_engines(ops: &mut [Launch], min: u64, ar_min: u64) {
    if min == 0 && ar_min == 0 {
        return;
    }
    let pairs = {
        let cands: Vec<Option<(&[u8], usize)>> = ops
            .iter()
            .map(|l| ce_candidate(l, min, ar_min).then(|| (l.comm.key.as_slice(), l.comm.rank)))
            .collect();
        ce::match_pairs(&cands)
    };
    for (i, j) in pairs {
        if let (LaunchKind::Half { ce: Some(a), .. }, LaunchKind::Half { ce: Some(b), .. }) =
            (&ops[i].kind, &ops[j].kind)
        {
            let (a, b) = (*a, *b);
            if let Some((k0, k1)) = reduce_pair(&ops[i].comm, &ops[j].comm, [a, b], ar_min) {
                ops[i].kind = k0;
                ops[j].kind = k1;
            }
            continue;
        }
        let plans = match (&ops[i].kind, &ops[j].kind) {
            (LaunchKind::Pcopy { args: x, .. }, LaunchKind::Pcopy { args: y, .. }) => {
                ce::pair_collective([copying(x), copying(y)])
            }
            (
                LaunchKind::P2p {
                    sends: s0,
                    recvs: r0,
                    ..
                },
                LaunchKind::P2p {
                    sends: s1,
                    recvs: r1,
                    ..
                },
            ) => ce::pair_p2p([
                ce::P2pSide {
                    sends: s0,
                    recvs: r0,
                },
                ce::P2pSide {
                    sends: s1,
                    recvs: r1,
                },
            ]),
            _ => None,
        };
        let Some([p0, p1]) = plans.filter(|p| ce::worth_it(p, min)) else {
            continue;
        };
        let (Ok(f0), Ok(f1)) = (
            ops[i].comm.function("oxccl_pcopy"),
            ops[j].comm.function("oxccl_pcopy"),
        ) else {
            continue;
        };
        ops[i].kind = LaunchKind::Ce { f: f0, plan: p0 };
        ops[j].kind = LaunchKind::Ce { f: f1, plan: p1 };
    }
}

/// The copy-engine reduction launches of a matching pair of reductions
/// (rank 0's comm `c0` and call first), or `None` to keep the SM kernels:
/// the calls do not qualify ([`ce_reduce::qualifies`]), or a scratch ring
/// or a kernel could not be had (an INFO line says why; the SM path runs
/// the call correctly either way).
pub(super) fn reduce_pair(
    c0: &Arc<DevComm>,
    c1: &Arc<DevComm>,
    calls: [ce_reduce::Call; 2],
    ar_min: u64,
) -> Option<(LaunchKind, LaunchKind)> {
    if !ce_reduce::qualifies(&calls, ar_min) {
        return None;
    }
    let build = || -> Result<(LaunchKind, LaunchKind)> {
        // Before any launch of this group (launch_all pairs first): the
        // first allocation synchronises this rank's context, which would
        // wait forever on a pair kernel of this group whose partner is not
        // launched yet.
        let scratch = [c0.ce_scratch()?, c1.ce_scratch()?];
        let [p0, p1] = ce_reduce::pair(calls, scratch, ar_min)
            .ok_or_else(|| Error::internal("ce_reduce::pair refused a qualifying pair"))?;
        let src = kernels::ce_reduce_variant(calls[0].dtype, calls[0].op);
        let name = kernels::ce_reduce_kernel(calls[0].dtype, calls[0].op);
        Ok((
            LaunchKind::CeReduce {
                f: c0.function("oxccl_pcopy")?,
                fr: c0.function_in(&src, &name)?,
                plan: p0,
            },
            LaunchKind::CeReduce {
                f: c1.function("oxccl_pcopy")?,
                fr: c1.function_in(&src, &name)?,
                plan: p1,
            },
        ))
    };
    match build() {
        Ok(k) => Some(k),
        Err(e) => {
            oxccl_env::info!(
                oxccl_env::log::Subsys::COLL,
                "copy-engine reduction not taken, the SM kernel runs it: {}",
                e.message()
            );
            None
        }
    }
}

/// A copy kernel launch's collective, for [`ce::pair_collective`].
pub(super) fn copying(a: &CpArgs) -> ce::Copying {
    if a.mode == PairKernel::Broadcast.mode() {
        ce::Copying::Broadcast {
            input: a.input,
            output: a.output,
            bytes: a.bytes,
            root: a.root,
        }
    } else {
        ce::Copying::AllGather {
            input: a.input,
            output: a.output,
            bytes: a.bytes,
        }
    }
}

impl LaunchState {
    /// The event of [`enqueue_one_launch`], created on first use (this rank's context
    /// current).
    pub(super) fn one_launch_event(&self) -> Result<cu::CUevent> {
        let mut e = lock(&self.one_launch_event);
        if *e == 0 {
            *e = guarded("cuEventCreate", || {
                // This rank's context is current (the caller's scope).
                // 2: CU_EVENT_DISABLE_TIMING.
                Ok(cu::event_create(2)? as usize)
            })?;
        }
        Ok(*e as cu::CUevent)
    }
}
