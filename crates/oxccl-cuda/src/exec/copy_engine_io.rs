//! The copy-engine paths of two GPUs of one process, as queued work: the
//! barriers around them, the side streams, and the copies and reducing
//! kernels of the plans that [`ce`] and [`ce_reduce`] make.

use super::*;

impl DevComm {
    /// A barrier with the peer on `stream`: the copy kernel with nothing to
    /// copy, one block (the peer launches the same), barrier values from the
    /// shared counter like every pair kernel.
    pub(super) fn ce_barrier(
        &self,
        f: KernelFn,
        peer_flags: u64,
        stream: cu::CUstream,
    ) -> Result<()> {
        let mut seq = lock(&self.launches.seq);
        let args = CpArgs {
            input: 0,
            output: 0,
            my_flags: self.launches.flags,
            peer_flags,
            bytes: 0,
            seq: *seq,
            mode: PairKernel::SendRecv.mode(),
            rank: self.rank as u32,
            root: 0,
            pad: 0,
            ..Default::default()
        };
        // SAFETY: no buffers (nothing is copied); both flag buffers are live
        // FLAG_BYTES buffers with peer access; the peer's matching launch of
        // the same pair (made by the same launch_all) has one block too.
        unsafe { allreduce::launch_copy(f.raw(), 1, stream, args)? };
        *seq += allreduce::BUDGET;
        Ok(())
    }

    /// Runs this rank's half of a copy-engine call on `stream`: barrier,
    /// the local copies on the side stream beside the pulls from the peer on
    /// `stream`, join, barrier. Returns without waiting.
    pub(super) fn enqueue_copy_engine(
        &self,
        f: KernelFn,
        plan: &ce::Plan,
        stream: cu::CUstream,
    ) -> Result<()> {
        let peer = self.peer()?;
        let _scope = CtxScope::enter(self.gpu.ctx)?;
        self.queue_ce(&|| self.ce_barrier(f, peer.flags, stream), plan, stream)
    }

    /// Queues a copy-engine plan on `stream` between two `barrier`s (this
    /// rank's context current): the pulls on `stream`, the local copies on
    /// the side stream beside them.
    pub(super) fn queue_ce(
        &self,
        barrier: &dyn Fn() -> Result<()>,
        plan: &ce::Plan,
        stream: cu::CUstream,
    ) -> Result<()> {
        barrier()?;
        let copy = |x: &ce::Xfer, on: cu::CUstream| {
            // SAFETY: the plan's ranges were checked by both ranks' prepare
            // calls to be device memory of their GPUs, which have peer
            // access to each other (unified addressing routes the copy); the
            // barrier before keeps both buffers live.
            unsafe { copy_async(x, on) }
        };
        // A copy between two devices issued into the legacy default stream
        // waits for everything issued before it to either device and holds
        // back everything issued after it to either: the peer's first
        // barrier, issued after this copy, could then never start, and this
        // stream's barrier waits for it (the first device run hung there).
        // So on a default stream (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD)
        // the pulls go to the side stream as well.
        let pulls_on_side = (stream as usize) <= 2;
        let side = if plan.local.is_empty() && !pulls_on_side {
            None
        } else {
            Some(self.copy_engines.side_at(0)?)
        };
        if let Some(sd) = side {
            let st = sd.stream as cu::CUstream;
            self.fork_side(sd, stream)?;
            for x in &plan.local {
                copy(x, st)?;
            }
            if pulls_on_side {
                for x in &plan.remote {
                    copy(x, st)?;
                }
            }
        }
        if !pulls_on_side {
            for x in &plan.remote {
                copy(x, stream)?;
            }
        }
        if let Some(sd) = side {
            self.join_side(sd, stream)?;
        }
        barrier()?;
        CE_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

impl DevComm {
    /// The copy-engine reduction's scratch ring and zeroed flags
    /// ([`ce_reduce::SCRATCH_BYTES`]), allocated on first use. Call it
    /// before the group launches anything (it synchronises the context).
    pub(super) fn ce_scratch(&self) -> Result<u64> {
        let mut sc = lock(&self.copy_engines.scratch);
        if let Some(p) = *sc {
            return Ok(p);
        }
        let _scope = CtxScope::enter(self.gpu.ctx)?;
        // Only the flags must start at zero; the slots are written before read.
        let p = alloc_zeroed(
            ce_reduce::SCRATCH_BYTES as usize,
            ce_reduce::FLAGS_OFFSET,
            ce_reduce::FLAGS_BYTES as usize,
            "copy-engine reduction scratch",
        )?;
        *sc = Some(p);
        Ok(p)
    }

    /// Runs this rank's half of a copy-engine reduction on `stream`
    /// ([`ce_reduce`]): barrier; the reduce kernel on `stream` beside the
    /// copy stream (the side stream) that feeds it; join; barrier; for an
    /// all-reduce the pull of the peer's part and a last barrier. Returns
    /// without waiting.
    pub(super) fn enqueue_copy_engine_reduce(
        &self,
        f: KernelFn,
        fr: KernelFn,
        plan: &ce_reduce::RankPlan,
        stream: cu::CUstream,
    ) -> Result<()> {
        let peer = self.peer()?;
        let _scope = CtxScope::enter(self.gpu.ctx)?;
        // Two copy streams (odd slots on the second): 2 GiB all-reduce 5,794
        // µs against 5,939 with one (370.7 against 361.6 GB/s busbw), 4 GiB
        // 375.9 against 364.4, 1 GiB 361.1 against 355.4; reduce-scatter
        // 4 GiB 359.9 against 342.3 (2xH200, -g 2, 2026-11-30, one machine):
        // a piece's copy starts while the one before lands, instead of
        // after its flag write.
        self.queue_ce_reduce(
            &|| self.ce_barrier(f, peer.flags, stream),
            fr,
            plan,
            stream,
            true,
        )
    }

    /// Queues a copy-engine reduction on `stream` (this rank's context
    /// current), `barrier` between its phases; `two_streams`: the odd
    /// slots' copies and flags on a second side stream.
    pub(super) fn queue_ce_reduce(
        &self,
        barrier: &dyn Fn() -> Result<()>,
        fr: KernelFn,
        plan: &ce_reduce::RankPlan,
        stream: cu::CUstream,
        two_streams: bool,
    ) -> Result<()> {
        let scratch = (*lock(&self.copy_engines.scratch))
            .ok_or_else(|| Error::internal("copy-engine reduction without its scratch"))?;
        let sd = self.copy_engines.side_at(0)?;
        let side = sd.stream as cu::CUstream;
        let flags = scratch + ce_reduce::FLAGS_OFFSET;
        let word = |w: u32| flags + 4 * w as u64;
        barrier()?;
        let r = &plan.reduce;
        if r.count > 0 {
            self.fork_side(sd, stream)?;
            // Each slot's steps stay in order on one stream (its waits,
            // copies and flags), so the schedule holds with two.
            let sd2 = if two_streams {
                let s2 = self.copy_engines.side_at(1)?;
                self.fork_side(s2, stream)?;
                Some(s2)
            } else {
                None
            };
            let side_of = |slot: u32| match sd2 {
                Some(s2) if slot % 2 == 1 => s2.stream as cu::CUstream,
                _ => side,
            };
            // The kernel is queued before the copies it waits for: were the
            // two streams to share a hardware queue, the copies behind a
            // kernel still run, a kernel behind a waiting copy would not.
            let args = allreduce::CerArgs {
                input: r.input,
                output: r.output,
                scratch,
                flags,
                count: r.count,
                piece: r.piece,
                slots: r.slots,
                rank: r.rank,
                ..Default::default()
            };
            // SAFETY: the part's ranges are this GPU's device memory (checked
            // by prepare); the scratch is this communicator's live ring of
            // SCRATCH_BYTES; the steps queued next fill it as the kernel
            // expects (ce_reduce's schedule for this very Reduce).
            unsafe { allreduce::launch_cer(fr.raw(), stream, args)? };
            for st in &plan.steps {
                match *st {
                    ce_reduce::Step::WaitConsumed { slot, value } => {
                        // SAFETY: a flag word inside the live scratch.
                        unsafe {
                            stream_wait32(
                                side_of(slot),
                                word(ce_reduce::CONSUMED_WORD + slot),
                                value,
                            )?
                        }
                    }
                    ce_reduce::Step::ClearConsumed { slot } => {
                        // SAFETY: as above.
                        unsafe {
                            stream_write32(side_of(slot), word(ce_reduce::CONSUMED_WORD + slot), 0)?
                        }
                    }
                    // SAFETY: the peer's input part (checked by its prepare,
                    // live until the barrier after the join) into this GPU's
                    // slot; peer access is enabled both ways.
                    ce_reduce::Step::Pull { xfer, slot } => unsafe {
                        copy_async(&xfer, side_of(slot))?
                    },
                    ce_reduce::Step::Land { slot, value } => {
                        // SAFETY: a flag word inside the live scratch.
                        unsafe { stream_write32(side_of(slot), word(slot), value)? }
                    }
                }
            }
            self.join_side(sd, stream)?;
            if let Some(s2) = sd2 {
                self.join_side(s2, stream)?;
            }
        }
        barrier()?;
        // SAFETY: the peer's output part, written by its kernel before the
        // barrier above, into this GPU's output (`-g 2`), or this rank's
        // part into the peer's mapped output (two processes, two_process::plan; the
        // peer no longer reads that range); both checked by prepare, the
        // barrier after keeps them live.
        unsafe { self.queue_gather(&plan.gather, stream, sd)? };
        if plan.kind == ce_reduce::Kind::AllReduce {
            barrier()?;
        }
        CE_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Queues an all-reduce's gather copies in `stream`'s order (on the
    /// side stream `sd` when `stream` is a default stream: a copy between
    /// devices must not be on one, as in enqueue_copy_engine).
    ///
    /// # Safety
    /// Every copy's ranges are live device memory that nothing else touches
    /// until the stream's next barrier.
    pub(super) unsafe fn queue_gather(
        &self,
        gather: &[ce::Xfer],
        stream: cu::CUstream,
        sd: CeSide,
    ) -> Result<()> {
        if gather.is_empty() {
            return Ok(());
        }
        let on_side = (stream as usize) <= 2;
        let on = if on_side {
            self.fork_side(sd, stream)?;
            sd.stream as cu::CUstream
        } else {
            stream
        };
        for x in gather {
            // SAFETY: the caller's contract.
            unsafe { copy_async(x, on)? };
        }
        if on_side {
            self.join_side(sd, stream)?;
        }
        Ok(())
    }

    /// Queues this rank's half of a reduction with pushed pieces
    /// ([`ce_reduce::PushedPlan`], two processes) on `stream`: barrier (both
    /// outputs free, both inputs ready); the reduce kernel on `stream`,
    /// whose waits for the peer's pieces are bounded by the ring's abort
    /// word and timeout, beside this rank's pushes into the peer's output on
    /// the side stream, each followed by its count in the peer's landed
    /// counter; join; an all-reduce's gather push (this rank's part is
    /// reduced once the kernel ends, and the peer never touches that part
    /// of its output); a last barrier for an all-reduce (the peer's gather
    /// into this output is done). A reduce-scatter needs none: once the
    /// kernel has seen every piece, nothing of the peer touches this rank's
    /// memory, and the next call pushes only after its first barrier.
    /// Returns without waiting.
    pub(super) fn queue_pushed(
        &self,
        barrier: &dyn Fn() -> Result<()>,
        fr: KernelFn,
        plan: &ce_reduce::PushedPlan,
        stream: cu::CUstream,
        ring: &ring::Ring,
        peer: usize,
    ) -> Result<()> {
        let no_word = || {
            Error::internal(format!(
                "no window word of the pushed reduction with rank {peer}"
            ))
        };
        // Landing in this rank's copy of the peer's part (an in-place
        // all-reduce), the counter is the other word (plan_pushed_in_place):
        // the copy stream waits on it too, so the kernel does not reset it.
        // Landing in a slot ring (an in-place reduce-scatter), the copy
        // stream waits on the peer kernel's consumed count instead.
        let zone = plan.landing.filter(|l| l.slots == 0);
        let slots = plan.landing.filter(|l| l.slots > 0);
        let word = |owner, other| match zone {
            Some(_) => ring.ce_pushed_word(owner, other),
            None => ring.ce_landed_word(owner, other),
        };
        let mine = word(self.rank, peer).ok_or_else(no_word)?;
        let theirs = word(peer, self.rank).ok_or_else(no_word)?;
        let consumed = [
            ring.ce_consumed_word(self.rank, peer).ok_or_else(no_word)?,
            ring.ce_consumed_word(peer, self.rank).ok_or_else(no_word)?,
        ];
        let fw = match plan.landing {
            Some(_) => self.function_in(
                &kernels::ce_reduce_variant(plan.dtype, plan.op),
                "oxccl_cer_wait",
            )?,
            None => KernelFn::NONE,
        };
        // Pushes alternate on `streams` side streams (ce_reduce::counter_slot).
        let sides = (0..plan.streams.clamp(1, 2) as usize)
            .map(|i| self.copy_engines.side_at(i))
            .collect::<Result<Vec<_>>>()?;
        let sd = sides[0];
        barrier()?;
        if slots.is_some() {
            // The peer's kernel wrote its last count of the previous such
            // call before this barrier, and writes the next one only after
            // this rank's first push lands, queued after this write.
            // SAFETY: this rank's own word in its ring window.
            unsafe { stream_write32(stream, consumed[0], 0)? };
        }
        // The side streams fork here, before the kernel: forked after it, the
        // pushes would wait for this rank's kernel, which waits for the
        // peer's pushes, which wait for the peer's kernel (a deadlock the
        // first device run found).
        let pushing = !plan.pushes.is_empty();
        if pushing {
            for s in &sides {
                self.fork_side(*s, stream)?;
            }
        }
        let r = &plan.reduce;
        if r.count > 0 {
            let args = allreduce::CerArgs {
                input: r.input,
                output: r.output,
                scratch: plan.landing.map_or(0, |l| l.scratch),
                // The slot ring's per-slot block counters (the scratch's
                // flag words, 0 between uses).
                flags: slots.map_or(0, |l| l.scratch + ce_reduce::FLAGS_OFFSET),
                count: r.count,
                piece: r.piece,
                slots: slots.map_or(r.slots, |l| l.slots),
                rank: r.rank,
                landed_at: mine,
                ctrl: ring.ctrl_device(),
                timeout_ns: ring.timeout_ns(),
                peer: peer as u32,
                taper: r.taper,
                zone: zone.map_or(0, |l| l.zone),
                streams: plan.streams,
                consumed_at: slots.map_or(0, |_| consumed[1]),
            };
            // SAFETY: the part's ranges are this GPU's device memory (checked
            // by prepare), the counter and the control words are the live
            // ring's; the peer queues the matching pushes (same plan from the
            // same messages), and a peer that does not is met by the
            // kernel's bounded wait.
            unsafe { allreduce::launch_cer(fr.raw(), stream, args)? };
        }
        if pushing {
            // Queued after the kernel, as in queue_ce_reduce.
            for (k, x) in plan.pushes.iter().enumerate() {
                let (h, v) = ce_reduce::counter_slot(k as u64, plan.streams);
                let side = sides[h as usize].stream as cu::CUstream;
                if let Some(&w) = plan.waits.get(k).filter(|&&w| w > 0) {
                    // In place: this piece lands on values the peer's own
                    // push w - 1 reads, or in a slot whose piece the peer's
                    // kernel must have reduced (its w-th); wait (bounded).
                    let (at, value) = match plan.wait_on {
                        ce_reduce::WaitOn::PeerPushes => {
                            let (wh, wv) = ce_reduce::counter_slot(w as u64 - 1, plan.streams);
                            (mine + 4 * wh as u64, wv)
                        }
                        ce_reduce::WaitOn::PeerConsumed => (consumed[0], w),
                    };
                    let args = allreduce::CerArgs {
                        landed_at: at,
                        count: value as u64,
                        ctrl: ring.ctrl_device(),
                        timeout_ns: ring.timeout_ns(),
                        peer: peer as u32,
                        ..Default::default()
                    };
                    // SAFETY: the live ring's counter and control words;
                    // `fw` is oxccl_cer_wait of this context.
                    unsafe { allreduce::launch_cer_wait(fw.raw(), side, args)? };
                }
                // SAFETY: this rank's input (checked by prepare) into the
                // peer's mapped output part (checked by the peer's prepare,
                // free since the barrier above: the peer's kernel reads it
                // only after this piece's count lands), or in place into the
                // peer's scratch (its first piece) or the part of the peer's
                // buffer that the wait above found sent.
                unsafe { copy_async(x, side)? };
                // This stream's half of the counter (plan_pushed keeps the
                // pieces under 2^31), with the 32-bit write the pulls
                // already use.
                // SAFETY: the peer's landed counter in its mapped window,
                // live as long as the ring.
                unsafe { stream_write32(side, theirs + 4 * h as u64, v)? };
            }
            for s in &sides {
                self.join_side(*s, stream)?;
            }
        }
        if zone.is_some() {
            // In place the peer's kernel reads this rank's pieces from the
            // peer's own part of its buffer, which the gather overwrites:
            // both kernels end first.
            barrier()?;
        }
        // SAFETY: this rank's reduced part (complete in stream order) into
        // the peer's mapped output at the same part, which the peer neither
        // reads nor writes in this call (in place: any more, after the
        // barrier above); live until the barrier below.
        unsafe { self.queue_gather(&plan.gather, stream, sd)? };
        if plan.kind == ce_reduce::Kind::AllReduce {
            barrier()?;
        }
        if zone.is_some() {
            // Back to 0 for the next call: the peer wrote its last count
            // before this rank's kernel ended, and writes the next one only
            // after the next call's first barrier, which this rank reaches
            // after this write.
            for h in 0..sides.len() as u64 {
                // SAFETY: this rank's own counter in its ring window.
                unsafe { stream_write32(stream, mine + 4 * h, 0)? };
            }
        }
        if plan.landing.is_some() {
            CE_IN_PLACE_PUSHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if slots.is_some() {
            CE_RING_PUSHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        CE_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

impl CopyEngineState {
    /// Side stream `i` (0 or 1) and its events, created on first use (this
    /// rank's context current).
    pub(super) fn side_at(&self, i: usize) -> Result<CeSide> {
        let mut sides = lock(&self.side);
        let side = &mut sides[i];
        if let Some(sd) = *side {
            return Ok(sd);
        }
        let sd = guarded("cuStreamCreate", || {
            let mut ev: [cu::CUevent; 2] = [std::ptr::null_mut(); 2];
            // This rank's context is current (the caller's scope).
            // 1: CU_STREAM_NON_BLOCKING (no implicit sync with stream 0).
            let st = cu::stream_create(1)?;
            for i in 0..ev.len() {
                // 2: CU_EVENT_DISABLE_TIMING (ordering only).
                match cu::event_create(2) {
                    Ok(e) => ev[i] = e,
                    Err(err) => {
                        // SAFETY: on a failure the ones made are destroyed
                        // before returning, once, with nothing queued.
                        unsafe {
                            for made in ev.iter().filter(|x| !x.is_null()) {
                                let _ = cu::event_destroy(*made);
                            }
                            let _ = cu::stream_destroy(st);
                        }
                        return Err(err.into());
                    }
                }
            }
            Ok(CeSide {
                stream: st as usize,
                fork: ev[0] as usize,
                join: ev[1] as usize,
            })
        })?;
        *side = Some(sd);
        Ok(sd)
    }

    /// Frees the scratch and destroys the side streams and their events.
    ///
    /// # Safety
    /// This rank's context is current and synchronised, and nothing queued
    /// uses them any more.
    pub(super) unsafe fn release(&self) {
        // SAFETY: the caller's contract; each is freed once (taken out).
        unsafe {
            if let Some(p) = lock(&self.scratch).take() {
                let _ = cu::mem_free(p);
            }
            for sd in lock(&self.side).iter_mut().filter_map(Option::take) {
                let _ = cu::event_destroy(sd.fork as cu::CUevent);
                let _ = cu::event_destroy(sd.join as cu::CUevent);
                let _ = cu::stream_destroy(sd.stream as cu::CUstream);
            }
        }
    }
}
