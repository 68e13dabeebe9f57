//! Device collectives on raw addresses: what the C ABI maps `ncclAllReduce`
//! and the rest onto. A caller holds device pointers and a `CUstream`;
//! [`locate_buffers`] finds where they are, [`Communicator::prepare_device`]
//! checks an operation ([`DeviceOp`]) into a [`DeviceLaunch`], and
//! [`launch_all`] queues a group. Rust code holding cudarc's buffers and
//! streams uses [`super::StreamComm`] and [`super::GpuGroup`] instead,
//! which build on these.

use super::cuda::{self, Memory};
use crate::{Communicator, Error, OpDesc, RedOp, Result};
use oxccl_core::gpu::rooted::{self, RootedCall};
use oxccl_core::{CollKind, DataType, Scalar};
use oxccl_net::profiler::{
    DescrUnion, Event, EventDescr, KernelLaunchDescr, ProfilerRef, PROFILE_KERNEL_LAUNCH,
};
use oxccl_net::profiler_group::{start_group, stop_group, GroupEvents, OpEvent};
use std::ffi::c_void;
use std::sync::Arc;

/// Device memory of `bytes` in the calling thread's current context
/// (`cuMemAlloc`, so it can be shared with other processes); `None` without
/// a driver or a current context.
pub fn alloc_on_current_device(bytes: usize) -> Result<Option<u64>> {
    cuda::mem_alloc_current(bytes)
}

/// Frees memory of [`alloc_on_current_device`]; `false` when `ptr` is not
/// such an allocation.
pub fn free_device_allocation(ptr: u64) -> Result<bool> {
    cuda::mem_free(ptr)
}

/// Where the two buffers of an operation are, from [`locate_buffers`]:
/// both device memory of one GPU, with each allocation's extent for the
/// count checks.
#[derive(Debug, Clone, Copy)]
pub struct DeviceBuffers {
    pub(super) ordinal: i32,
    pub(super) extents: [cuda::Extent; 2],
}

impl DeviceBuffers {
    /// The GPU the buffers are on.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }
}

/// Where an operation runs: `None` for the host backend (no CUDA driver, or
/// both buffers are host memory: NULL, pageable, pinned), `Some` for the
/// CUDA executor (device buffers of one GPU; a NULL buffer takes the
/// other's GPU). Device memory mixed with host memory, or on two GPUs, is
/// an error, never a host run (the host would dereference device pointers).
pub fn locate_buffers(send: *const c_void, recv: *const c_void) -> Result<Option<DeviceBuffers>> {
    if !cuda::available() {
        return Ok(None);
    }
    let (ms, es) = cuda::locate(send)?;
    // In place (PyTorch's all-reduces are): one driver call, not two
    // (~0.1 us of the ~1 us a call spends around its launch).
    let (mr, er) = if std::ptr::eq(recv, send) {
        (ms, es)
    } else {
        cuda::locate(recv)?
    };
    let ordinal = match (ms, mr) {
        (Memory::Host, Memory::Host) => return Ok(None),
        (Memory::Device(a), Memory::Device(b)) if a != b => {
            return Err(Error::invalid_argument(format!(
                "sendbuff is on GPU {a} but recvbuff is on GPU {b}"
            )))
        }
        (Memory::Device(a), Memory::Device(_)) => a,
        (Memory::Device(a), Memory::Host) if recv.is_null() => a,
        (Memory::Host, Memory::Device(b)) if send.is_null() => b,
        (Memory::Device(a), Memory::Host) => {
            return Err(Error::invalid_argument(format!(
                "sendbuff is device memory of GPU {a} but recvbuff is host memory: both must be host memory or both device memory"
            )))
        }
        (Memory::Host, Memory::Device(b)) => {
            return Err(Error::invalid_argument(format!(
                "recvbuff is device memory of GPU {b} but sendbuff is host memory: both must be host memory or both device memory"
            )))
        }
    };
    Ok(Some(DeviceBuffers {
        ordinal,
        extents: [es, er],
    }))
}

/// The reduction of an operation on device buffers.
#[derive(Debug, Clone, Copy)]
pub enum DeviceRedOp {
    /// A reduction whose operand, if any, is known now.
    Op(RedOp),
    /// A pre-multiplied sum whose scalar of type `DataType` is at this
    /// address: device memory is read by the kernel, host memory now.
    PreMulSumAt(usize, DataType),
}

/// One operation on device memory as raw addresses (the C ABI's form;
/// [`super::StreamComm`] builds it from cudarc's types).
#[derive(Debug, Clone, Copy)]
pub struct DeviceOp {
    /// The collective or send/receive.
    pub kind: CollKind,
    /// The send buffer's device address (0 where the operation reads none).
    pub send: u64,
    /// The receive buffer's device address (0 where it writes none).
    pub recv: u64,
    /// Elements, per rank where NCCL counts per rank.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction (ignored by copies).
    pub op: DeviceRedOp,
    /// Root, or the peer of a send/receive.
    pub root: usize,
    /// The `CUstream` (`cudaStream_t`) the operation is queued on.
    pub stream: usize,
}

/// An operation on device buffers, checked and ready to queue on its
/// stream ([`DeviceLaunch::launch`], or [`launch_all`] for a group).
pub struct DeviceLaunch {
    pub(super) launch: cuda::Launch,
    /// A broadcast, reduce, gather or scatter of a communicator of several
    /// ranks: the call every rank must agree on before it is queued.
    pub(super) rooted: Option<(Communicator, RootedCall)>,
    /// The call as a profiler plugin's events describe it; `None` without
    /// a profiler (no allocation then).
    pub(super) profile: Option<Box<Profiled>>,
}

/// An operation on device buffers of a communicator with a profiler plugin.
pub(super) struct Profiled {
    pub(super) comm: Communicator,
    pub(super) op: OpEvent,
    pub(super) graph_captured: bool,
}

impl std::fmt::Debug for DeviceLaunch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceLaunch(..)")
    }
}

impl DeviceLaunch {
    /// Queues the operation on its stream; returns without waiting for the
    /// GPU (a rooted collective first waits for every rank's call: see
    /// [`launch_all`]).
    pub fn launch(self) -> Result<()> {
        if self.rooted.is_some() || self.profile.is_some() {
            return launch_all(vec![self]);
        }
        self.launch.enqueue()
    }
}

/// Queues operations of one group (several ranks and communicators):
/// sends and receives of one communicator are merged into one launch, so
/// they meet their peers' whatever order they were added in.
///
/// Broadcasts, reduces, gathers and scatters are first checked across the
/// ranks of their communicator (`OXCCL_CHECK_ROOTS`): ranks whose rooted
/// calls differ (root, count or type) all fail here with `InvalidUsage`,
/// and nothing of the group is queued.
///
/// With a profiler plugin, each communicator's part of the group gets
/// NCCL's events around the launch ([`profile_start`]).
pub fn launch_all(launches: Vec<DeviceLaunch>) -> Result<()> {
    agree_on_rooted_calls(&launches)?;
    if launches.iter().all(|l| l.profile.is_none()) {
        return cuda::launch_all(launches.into_iter().map(|l| l.launch).collect());
    }
    let events = profile_start(&launches);
    // Kernel launch events (v5, v6, when the plugin asks for them): one per
    // communicator's part, around the group's launch, under its group API
    // event, with the stream of its first call.
    let kernel_launches: Vec<Option<Event>> = events
        .iter()
        .map(|(prof, ev, stream)| {
            if !prof.starts(PROFILE_KERNEL_LAUNCH) {
                return None;
            }
            let mut d = EventDescr {
                kind: PROFILE_KERNEL_LAUNCH,
                parent_obj: ev
                    .events
                    .group_api
                    .as_ref()
                    .map_or(std::ptr::null_mut(), |g| g.as_ptr()),
                rank: ev.rank as i32,
                u: DescrUnion {
                    kernel_launch: KernelLaunchDescr { stream: *stream },
                },
            };
            prof.start(&mut d)
        })
        .collect();
    let r = cuda::launch_all(launches.into_iter().map(|l| l.launch).collect());
    for ((prof, ev, _), kl) in events.into_iter().zip(kernel_launches) {
        if let Some(k) = kl {
            prof.stop(k);
        }
        stop_group(&prof, ev.events);
    }
    r
}

/// A communicator's events of a group being launched, and its rank.
struct CommEvents {
    events: GroupEvents,
    rank: usize,
}

/// Starts the profiler events of a group of launches, per communicator
/// (in the order of their first call): the group API event, an API event
/// per call, the group event and an event per collective or send/receive
/// ([`start_group`]), on the communicator's profiler context and with its
/// collective sequence numbers, which the host path shares.
///
/// When they stop, as NCCL's: the API events at once (a call only
/// enqueues); the operations', the group's and the group API event once
/// the group's kernels and copies are queued on their streams, which is
/// where NCCL stops them too (after handing the plan's network work to its
/// proxy thread, before the kernel has run). The kernel's progress is not
/// an event of theirs.
///
/// Returns each communicator's profiler, events and the stream of its first
/// call.
fn profile_start(launches: &[DeviceLaunch]) -> Vec<(ProfilerRef, CommEvents, *mut c_void)> {
    let mut per: Vec<(&Communicator, Vec<OpEvent>, bool)> = Vec::new();
    for p in launches.iter().filter_map(|l| l.profile.as_deref()) {
        match per
            .iter_mut()
            .find(|(c, _, _)| Arc::ptr_eq(&c.inner, &p.comm.inner))
        {
            Some((_, ops, captured)) => {
                ops.push(p.op);
                *captured |= p.graph_captured;
            }
            None => per.push((&p.comm, vec![p.op], p.graph_captured)),
        }
    }
    let mut out = Vec::with_capacity(per.len());
    for (c, ops, captured) in per {
        // A destroyed or poisoned communicator: no events (the launch
        // reports what is wrong).
        let Ok(mut g) = c.lock_raw() else { continue };
        let Some((prof, seqs)) = g.as_mut().and_then(|h| h.profiler()) else {
            continue;
        };
        let events = start_group(prof, seqs, c.rank(), captured, &ops);
        let ev = CommEvents {
            events,
            rank: c.rank(),
        };
        out.push((prof.share(), ev, ops[0].stream));
    }
    out
}

/// Trades each communicator's rooted calls of the group with its other
/// ranks (one all-gather of [`rooted::RECORD_LEN`] bytes per rank over the
/// host transport, for every communicator of the group at once, so one
/// thread may drive several ranks) and refuses the group on a mismatch.
/// Every rank checks the same records, so all refuse together.
fn agree_on_rooted_calls(launches: &[DeviceLaunch]) -> Result<()> {
    let mut per_comm: Vec<(&Communicator, Vec<RootedCall>)> = Vec::new();
    for (c, call) in launches.iter().filter_map(|l| l.rooted.as_ref()) {
        match per_comm
            .iter_mut()
            .find(|(x, _)| Arc::ptr_eq(&x.inner, &c.inner))
        {
            Some((_, calls)) => calls.push(*call),
            None => per_comm.push((c, vec![*call])),
        }
    }
    if per_comm.is_empty() {
        return Ok(());
    }
    let mine: Vec<[u8; rooted::RECORD_LEN]> = per_comm
        .iter()
        .map(|(_, calls)| rooted::encode(calls))
        .collect();
    let mut all: Vec<Vec<u8>> = per_comm
        .iter()
        .map(|(c, _)| vec![0u8; rooted::RECORD_LEN * c.size()])
        .collect();
    let ops: Vec<(&Communicator, OpDesc)> = per_comm
        .iter()
        .zip(mine.iter().zip(all.iter_mut()))
        .map(|((c, _), (m, a))| {
            let op = OpDesc {
                kind: CollKind::AllGather,
                send: m.as_ptr(),
                recv: a.as_mut_ptr(),
                count: rooted::RECORD_LEN,
                dtype: DataType::Uint8,
                op: RedOp::Sum,
                root: 0,
            };
            (*c, op)
        })
        .collect();
    // The library's own exchange: no profiler events.
    // SAFETY: every operation's send buffer is one record of RECORD_LEN
    // bytes in `mine`, its receive buffer RECORD_LEN x its communicator's
    // ranks in `all`; both live until this call returns.
    unsafe { crate::run_group_raw_with(&ops, false) }.map_err(|e| {
        Error::new(
            e.kind(),
            format!(
                "checking the roots of a broadcast, reduce, gather or scatter on device buffers with the other ranks: {}",
                e.message()
            ),
        )
    })?;
    for ((c, _), records) in per_comm.iter().zip(&all) {
        let records: Vec<Vec<u8>> = records
            .chunks(rooted::RECORD_LEN)
            .map(<[u8]>::to_vec)
            .collect();
        if let Err(why) = rooted::check(&records) {
            return Err(Error::invalid_usage(format!("rank {}: {why}", c.rank())));
        }
    }
    Ok(())
}

/// Reads the scalar of a pre-multiplied sum from host memory.
///
/// # Safety
/// `addr` points at a readable value of type `t`.
pub unsafe fn read_scalar(addr: usize, t: DataType) -> Scalar {
    use oxccl_core::float as fl;
    use Scalar::{F64, I64, U64};
    let p = addr as *const u8;
    // SAFETY: the caller guarantees a readable value of type `t` at `p`;
    // read_unaligned makes no alignment assumption.
    unsafe {
        match t {
            DataType::Int8 => I64(p.cast::<i8>().read_unaligned() as i64),
            DataType::Uint8 => U64(p.read_unaligned() as u64),
            DataType::Int32 => I64(p.cast::<i32>().read_unaligned() as i64),
            DataType::Uint32 => U64(p.cast::<u32>().read_unaligned() as u64),
            DataType::Int64 => I64(p.cast::<i64>().read_unaligned()),
            DataType::Uint64 => U64(p.cast::<u64>().read_unaligned()),
            DataType::Float16 => F64(fl::f16_to_f32(p.cast::<u16>().read_unaligned()) as f64),
            DataType::Float32 => F64(p.cast::<f32>().read_unaligned() as f64),
            DataType::Float64 => F64(p.cast::<f64>().read_unaligned()),
            DataType::Bfloat16 => F64(fl::bf16_to_f32(p.cast::<u16>().read_unaligned()) as f64),
            DataType::Float8e4m3 => F64(fl::e4m3_to_f32(p.read_unaligned()) as f64),
            DataType::Float8e5m2 => F64(fl::e5m2_to_f32(p.read_unaligned()) as f64),
        }
    }
}
