//! One-shot all-reduce across two GPUs of one process, over peer mappings.
//!
//! See `kernels/allreduce.cu` for the protocol. Host side: both GPUs get the
//! same launch (same grid, same barrier sequence numbers) on their own
//! stream; nothing waits on the host, so a call costs one launch per GPU.

use std::collections::HashMap;
use std::ffi::c_void;

use crate::driver as cu;
use oxccl_core::gpu::config::DeviceConfig;
use oxccl_core::gpu::PairKernel;
use oxccl_core::{DataType, Error, RedOp, Result};

use crate::compile;
use crate::device::{DeviceBuffer, Gpu, Module};
use crate::kernels;

// The kernels' block size, unroll, most blocks and barrier budget, and
// their grids: pure decisions of the core.
pub use oxccl_core::gpu::pair::{
    copy_blocks, copy_kernel_blocks, reduce_grid, BUDGET, MAX_BLOCKS, THREADS, UNROLL,
};
/// Words of a block's mailbox slot (`OXCCL_MBOX`: input, output, bits, spare).
pub const MBOX_WORDS: usize = 4;
/// The first of the two words after the flags and the mailboxes that the
/// kernels' waits read (`OXCCL_CTL_WORD`, common.cuh `pair_wait`): the
/// ring's host-mapped control words (abort, error) and the timeout in ns.
/// Zero (no ring): the waits have no bound.
pub const CTL_WORD: usize = (1 + MBOX_WORDS) * MAX_BLOCKS as usize;
/// Words of the flags buffer: flags, the mailbox, the two control words.
pub const FLAG_WORDS: usize = CTL_WORD + 2;

/// `ArArgs.bits`: take the two-shot all-reduce even out of place.
pub const BIT_TWO_SHOT: u64 = 4;

/// `struct CpArgs` of `allreduce.cu` (the `oxccl_pcopy` kernel), field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CpArgs {
    /// This GPU's input (send buffer) or 0.
    pub input: u64,
    /// This GPU's output (receive buffer) or 0.
    pub output: u64,
    /// This GPU's flags + mailbox.
    pub my_flags: u64,
    /// The peer's flags + mailbox.
    pub peer_flags: u64,
    /// All-gather: bytes per rank; broadcast: all; p2p: bytes to receive.
    pub bytes: u64,
    /// First barrier value of this call.
    pub seq: u64,
    /// The copy kernel's mode ([`PairKernel::mode`]).
    pub mode: u32,
    /// 0 or 1.
    pub rank: u32,
    /// Broadcast's root.
    pub root: u32,
    /// Padding.
    pub pad: u32,
    /// P2p: a copy to itself done by the same grid (gather, scatter,
    /// all-to-all): destination, source, bytes (0: none).
    pub self_dst: u64,
    /// See `self_dst`.
    pub self_src: u64,
    /// See `self_dst`.
    pub self_bytes: u64,
}
/// `struct CerArgs` of `allreduce.cu` (the `oxccl_cer_<type>_<op>`
/// kernels of the copy-engine reduction, [`crate::ce_reduce`]), field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CerArgs {
    /// This rank's input, at its part.
    pub input: u64,
    /// This rank's output, at its part.
    pub output: u64,
    /// The scratch ring's first slot.
    pub scratch: u64,
    /// The ring's flags (32-bit words).
    pub flags: u64,
    /// Elements of the part.
    pub count: u64,
    /// Elements per piece (a slot).
    pub piece: u64,
    /// Slots.
    pub slots: u32,
    /// 0 or 1.
    pub rank: u32,
    /// Pushed pieces ([`crate::ce_reduce::plan_pushed`]): the u64 counter of
    /// pieces the peer landed in `output` (this rank's ring window,
    /// [`crate::ring::CE_LANDED`]; its block counter follows); 0: the slot
    /// ring.
    pub landed_at: u64,
    /// Pushed: the ring's control words (abort, error, peer, block).
    pub ctrl: u64,
    /// Pushed: the waits' timeout in ns (0: none).
    pub timeout_ns: u64,
    /// Pushed: the peer's rank.
    pub peer: u32,
    /// Pushed: halvings of the last piece ([`crate::ce_reduce::Reduce`]).
    pub taper: u32,
    /// Pushed in place: where pieces after the first land
    /// ([`crate::ce_reduce::Landing::zone`]; `scratch` takes the first, and
    /// `landed_at` is then [`crate::ring::CE_PUSHED`]); 0: in `output`.
    pub zone: u64,
    /// Pushed: copy streams the pieces alternate on (1 or 2;
    /// [`crate::ce_reduce::counter_slot`]).
    pub streams: u32,
    /// Pushed into a slot ring ([`crate::ce_reduce::plan_pushed_ring`]):
    /// the peer's u32 of pieces this kernel reduced (its ring window, as
    /// mapped here); 0: not a slot ring.
    pub consumed_at: u64,
}

/// Blocks of the copy-engine reduction's kernel. Per piece it reads twice
/// and writes once what the copy engine brings at ~390 GB/s, ~1.2 TB/s of
/// this GPU's memory in all; 32 blocks of 512 threads (a quarter of an
/// H200's SMs) stream that with 16-byte accesses (the pair kernels move
/// ~370 GB/s per direction over NVLink with 32 blocks, where each access
/// has a far longer latency), and the other SMs stay free for the caller.
pub const CER_BLOCKS: u32 = 32;

/// Launches a copy-engine reduction kernel (the context that owns `f` and
/// `stream` must be current).
///
/// # Safety
/// `args` must describe live device memory of this GPU: `input`/`output`
/// hold `count` elements, the scratch holds `slots` × `piece` elements and
/// the flags; the copy stream that fills the slots must be queued with the
/// matching schedule (or the kernel waits forever). Pushed (`landed_at`
/// set): the counter and the control words are live, and the peer queues
/// the matching pushes (a peer that does not is met by the bounded wait).
pub unsafe fn launch_cer(f: cu::CUfunction, stream: cu::CUstream, args: CerArgs) -> Result<()> {
    // SAFETY: one CerArgs (repr(C), the kernel's layout); the caller vouches
    // for its pointers.
    unsafe {
        crate::device::launch_struct(
            f,
            CER_BLOCKS,
            THREADS,
            stream,
            &args,
            true,
            "cuLaunchKernel(oxccl_cer)",
        )
    }
}

/// Launches `oxccl_cer_wait` (one thread: until the u32 at `landed_at`
/// reaches `count`, bounded by the ring's control words and `timeout_ns`)
/// on a copy stream.
///
/// # Safety
/// `landed_at` and `ctrl` are the live ring's; `f` is `oxccl_cer_wait` of
/// the current context.
pub unsafe fn launch_cer_wait(
    f: cu::CUfunction,
    stream: cu::CUstream,
    args: CerArgs,
) -> Result<()> {
    // SAFETY: one CerArgs (repr(C), the kernel's layout); the kernel reads
    // only the counter and the control words, which the caller vouches for.
    unsafe {
        crate::device::launch_struct(
            f,
            1,
            32,
            stream,
            &args,
            true,
            "cuLaunchKernel(oxccl_cer_wait)",
        )
    }
}

/// Bytes of the flags buffer each GPU of a pair allocates (zeroed).
pub const FLAG_BYTES: usize = FLAG_WORDS * 8;

/// `struct ArArgs` of `allreduce.cu`, field for field (96 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ArArgs {
    /// This GPU's input.
    pub input: u64,
    /// This GPU's output.
    pub output: u64,
    /// This GPU's flags + mailbox.
    pub my_flags: u64,
    /// The peer's flags + mailbox (a peer pointer).
    pub peer_flags: u64,
    /// Elements.
    pub count: u64,
    /// First barrier value of this call.
    pub seq: u64,
    /// Float avg's pre-multiplier.
    pub scale: f64,
    /// Integer avg's divisor.
    pub nranks: u32,
    /// 0 or 1.
    pub rank: u32,
    /// Integer PreMulSum's scalar (two's complement bits).
    pub iscale: u64,
    /// PreMulSum with a device-resident scalar: its address, else 0.
    pub scalar_ptr: u64,
    /// The reducing kernel's mode ([`PairKernel::mode`]).
    pub mode: u32,
    /// Reduce's root.
    pub root: u32,
    /// Mailbox bits chosen by the host (`BIT_TWO_SHOT`).
    pub bits: u64,
}

impl ArArgs {
    /// An all-reduce's arguments with the optional fields zeroed.
    #[allow(clippy::too_many_arguments)]
    pub fn all_reduce(
        input: u64,
        output: u64,
        my_flags: u64,
        peer_flags: u64,
        count: u64,
        rank: u32,
    ) -> ArArgs {
        ArArgs {
            input,
            output,
            my_flags,
            peer_flags,
            count,
            seq: 0,
            scale: 0.5,
            nranks: 2,
            rank,
            iscale: 0,
            scalar_ptr: 0,
            mode: PairKernel::AllReduce.mode(),
            root: 0,
            bits: 0,
        }
    }
}

/// `oxccl_ar1_<type>_<op>`.
pub fn kernel_name(t: DataType, op: RedOp) -> Option<String> {
    Some(format!(
        "oxccl_ar1_{}_{}",
        kernels::type_tag(t),
        kernels::op_tag(op)?
    ))
}

/// Puts the scalar of `op` (avg, PreMulSum with an immediate scalar) into `args`.
pub fn set_scalar(args: &mut ArArgs, op: RedOp) {
    if let RedOp::PreMulSum(s) = op {
        args.scale = s.as_f64();
        args.iscale = s.as_u64_bits();
    }
}

/// Launches `oxccl_pcopy` (the context that owns `f` and `stream` must be current).
///
/// # Safety
/// As [`launch_half`], for the copy's buffers.
pub unsafe fn launch_copy(
    f: cu::CUfunction,
    blocks: u32,
    stream: cu::CUstream,
    args: CpArgs,
) -> Result<()> {
    // SAFETY: one CpArgs (repr(C), the kernel's layout); the caller vouches
    // for its pointers.
    unsafe {
        crate::device::launch_struct(f, blocks, THREADS, stream, &args, true, "cuLaunchKernel")
    }
}

/// Launches this GPU's half of a one-shot all-reduce on `stream` (the
/// context that owns `f` and `stream` must be current).
///
/// # Safety
/// `args` must describe live device memory: `input`/`output` hold `count`
/// elements on this GPU, `my_flags`/`peer_flags` are [`FLAG_BYTES`] flag
/// buffers of this GPU and of a peer this context has peer access to, and
/// the peer must launch its half with the same `count`, type, `seq` and grid.
pub unsafe fn launch_half(
    f: cu::CUfunction,
    blocks: u32,
    stream: cu::CUstream,
    args: ArArgs,
) -> Result<()> {
    // SAFETY: one ArArgs (repr(C), the kernel's layout); the caller vouches
    // for its pointers.
    unsafe {
        crate::device::launch_struct(f, blocks, THREADS, stream, &args, true, "cuLaunchKernel")
    }
}

/// A buffer and a byte offset into it.
#[derive(Debug, Clone, Copy)]
pub struct At<'a, 'g> {
    /// The buffer.
    pub buf: &'a DeviceBuffer<'g>,
    /// Byte offset of the first element.
    pub offset: usize,
}

impl<'a, 'g> From<&'a DeviceBuffer<'g>> for At<'a, 'g> {
    fn from(buf: &'a DeviceBuffer<'g>) -> Self {
        At { buf, offset: 0 }
    }
}

impl At<'_, '_> {
    fn ptr_for(&self, bytes: usize, what: &str) -> Result<u64> {
        if self
            .offset
            .checked_add(bytes)
            .is_none_or(|e| e > self.buf.len())
        {
            return Err(Error::invalid_argument(format!(
                "{what}: bytes {}..{} are outside a buffer of {} bytes",
                self.offset,
                self.offset.saturating_add(bytes),
                self.buf.len()
            )));
        }
        Ok(self.buf.ptr() + self.offset as u64)
    }
}

/// A two-GPU one-shot all-reduce: peer access both ways, a flag word per
/// block on each GPU, the kernels loaded on both.
pub struct OneShot2<'g> {
    gpus: [&'g Gpu; 2],
    flags: [DeviceBuffer<'g>; 2],
    modules: [Module<'g>; 2],
    functions: HashMap<String, [cu::CUfunction; 2]>,
    seq: u64,
    /// Most blocks a launch uses (`OXCCL_CUDA_AR_BLOCKS`, read at creation).
    max_blocks: u32,
}

impl<'g> OneShot2<'g> {
    /// Sets up `gpus[0]` as rank 0 and `gpus[1]` as rank 1: enables peer
    /// access both ways, allocates zeroed flags and loads the kernels (compiled
    /// by NVRTC or taken from the cache).
    pub fn new(gpus: [&'g Gpu; 2]) -> Result<OneShot2<'g>> {
        gpus[0].enable_peer_access(gpus[1])?;
        gpus[1].enable_peer_access(gpus[0])?;
        let mut flags = Vec::new();
        let mut modules = Vec::new();
        for g in gpus {
            let f = g.alloc(FLAG_BYTES)?;
            f.fill(0)?;
            flags.push(f);
            let img = compile::compile(&kernels::ALLREDUCE, g.arch()?)?;
            modules.push(g.load_module(&img.image)?);
        }
        let [f0, f1]: [DeviceBuffer<'g>; 2] = flags
            .try_into()
            .map_err(|_| Error::internal("two flag buffers"))?;
        let [m0, m1]: [Module<'g>; 2] = modules
            .try_into()
            .map_err(|_| Error::internal("two modules"))?;
        Ok(OneShot2 {
            gpus,
            flags: [f0, f1],
            modules: [m0, m1],
            functions: HashMap::new(),
            seq: 1,
            max_blocks: DeviceConfig::from_params(oxccl_env::params()).pair_blocks,
        })
    }

    /// `recv[r] = send[0] op send[1]` on both GPUs, `count` elements of `t`.
    /// Queued on each GPU's stream; returns without waiting. `recv[r]` may be
    /// `send[r]` (in place). Buffers must be on their rank's GPU.
    pub fn all_reduce(
        &mut self,
        send: [At<'_, 'g>; 2],
        recv: [At<'_, 'g>; 2],
        count: usize,
        t: DataType,
        op: RedOp,
    ) -> Result<()> {
        let name = kernel_name(t, op).ok_or_else(|| {
            Error::invalid_argument(format!(
                "the one-shot GPU all-reduce has no kernel for op {}",
                op.name()
            ))
        })?;
        if count == 0 {
            return Ok(());
        }
        let bytes = count * t.size();
        for r in 0..2 {
            if send[r].buf.gpu().ordinal() != self.gpus[r].ordinal()
                || recv[r].buf.gpu().ordinal() != self.gpus[r].ordinal()
            {
                return Err(Error::invalid_argument(format!(
                    "rank {r}'s buffers must be on GPU {}",
                    self.gpus[r].ordinal()
                )));
            }
        }
        let s = [
            send[0].ptr_for(bytes, "send 0")?,
            send[1].ptr_for(bytes, "send 1")?,
        ];
        let d = [
            recv[0].ptr_for(bytes, "recv 0")?,
            recv[1].ptr_for(bytes, "recv 1")?,
        ];
        for r in 0..2 {
            if d[r] != s[r] && d[r] < s[r] + bytes as u64 && s[r] < d[r] + bytes as u64 {
                return Err(Error::invalid_argument(format!(
                    "rank {r}: send and recv overlap without being the same buffer"
                )));
            }
        }
        let (blocks, budget) = reduce_grid(count as u64, t, self.max_blocks);
        let seq = self.seq;
        self.seq += budget; // past every barrier value this call can use
        let functions = match self.functions.get(&name) {
            Some(f) => *f,
            None => {
                let f = [
                    self.modules[0].function(&name)?,
                    self.modules[1].function(&name)?,
                ];
                self.functions.insert(name, f);
                f
            }
        };
        for r in 0..2 {
            let mut args = ArArgs::all_reduce(
                s[r],
                d[r],
                self.flags[r].ptr(),
                self.flags[1 - r].ptr(),
                count as u64,
                r as u32,
            );
            args.seq = seq;
            set_scalar(&mut args, op);
            self.gpus[r].bind()?;
            // SAFETY: every pointer in `args` is inside a live allocation
            // (checked) on a GPU that this one has peer access to; the flags
            // hold FLAG_WORDS words; both halves get the same count, type,
            // seq and grid.
            unsafe { launch_half(functions[r], blocks, self.gpus[r].stream(), args)? };
        }
        Ok(())
    }

    /// Waits for both GPUs.
    pub fn synchronize(&self) -> Result<()> {
        self.gpus[0].synchronize()?;
        self.gpus[1].synchronize()
    }

    /// The GPUs, in rank order.
    pub fn gpus(&self) -> [&'g Gpu; 2] {
        self.gpus
    }
}

/// Copies `bytes` from `src` to `dst` with the copy kernel on `gpu`'s stream
/// (either may be a peer's buffer when peer access is enabled).
pub fn copy(
    gpu: &Gpu,
    module: &Module<'_>,
    dst: At<'_, '_>,
    src: At<'_, '_>,
    bytes: usize,
) -> Result<()> {
    let d = dst.ptr_for(bytes, "copy dst")?;
    let s = src.ptr_for(bytes, "copy src")?;
    let f: cu::CUfunction = module.function("oxccl_copy")?;
    let (mut d, mut s, mut n) = (d, s, bytes as u64);
    let blocks = copy_kernel_blocks(bytes as u64);
    let mut params = [
        &mut d as *mut u64 as *mut c_void,
        &mut s as *mut u64 as *mut c_void,
        &mut n as *mut u64 as *mut c_void,
    ];
    // SAFETY: oxccl_copy(void*, const void*, u64): three 8-byte values; the
    // ranges are inside live allocations (checked).
    unsafe { gpu.launch(f, blocks, THREADS, &mut params) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_kernels() {
        // allreduce.cu's struct CpArgs and struct ArArgs, field for field.
        assert_eq!(std::mem::size_of::<CpArgs>(), 88);
        assert_eq!(std::mem::size_of::<ArArgs>(), 96);
        assert_eq!(std::mem::size_of::<CerArgs>(), 112);
        assert_eq!(std::mem::offset_of!(CerArgs, landed_at), 56);
        assert_eq!(std::mem::offset_of!(CerArgs, peer), 80);
        assert_eq!(std::mem::offset_of!(CerArgs, zone), 88);
        assert_eq!(std::mem::offset_of!(CerArgs, streams), 96);
        assert_eq!(std::mem::offset_of!(CerArgs, consumed_at), 104);
    }
}
