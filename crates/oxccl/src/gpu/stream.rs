//! The typed API on device buffers: cudarc's slices and views in, a launch
//! on a cudarc stream out.
//!
//! cudarc tracks, per buffer, the last read and write as events; taking a
//! buffer's address through [`DevicePtr::device_ptr`] or
//! [`DevicePtrMut::device_ptr_mut`] makes the stream wait for them, and the
//! guard it returns records this stream's work on the buffer when dropped,
//! after the launch: so the collective is ordered with the buffer's other
//! work on any stream, as cudarc's own kernels are.

use super::raw::{launch_all, locate_buffers, DeviceLaunch, DeviceOp, DeviceRedOp};
use super::{bad_root, lengths};
use super::{CudaStream, DevicePtr, DevicePtrMut};
use crate::{CollKind, Communicator, Element, Error, RedOp, Result};
use cudarc::driver::SyncOnDrop;
use std::ffi::c_void;

/// A rank's collectives on device buffers, queued on one CUDA stream
/// ([`Communicator::on_stream`]). Each call checks its buffers (on this
/// rank's GPU, lengths as the collective needs), queues the work on the
/// stream and returns without waiting for the GPU: synchronise the stream
/// (or an event on it) before reading the result on the host. Calls made
/// while the stream is captured into a CUDA graph are captured with it.
///
/// ```no_run
/// use oxccl::gpu::{CudaContext, GpuChoice};
/// use oxccl::{Communicator, Config, RedOp, UniqueId};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let (nranks, rank, id) = (2, 0, UniqueId::new()?);
/// let ctx = CudaContext::new(0)?;
/// let stream = ctx.default_stream();
/// let cfg = Config { gpu: GpuChoice::Device(0), ..Config::default() };
/// let comm = Communicator::init_rank_config(nranks, &id, rank, cfg)?;
/// let mut grads = stream.clone_htod(&vec![1.0f32; 1 << 20])?;
/// comm.on_stream(&stream).all_reduce_in_place(&mut grads, RedOp::Sum)?;
/// let host: Vec<f32> = stream.clone_dtoh(&grads)?; // waits for the stream
/// assert!(host.iter().all(|&x| x == nranks as f32));
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct StreamComm<'a> {
    pub(super) comm: &'a Communicator,
    pub(super) stream: &'a CudaStream,
}

impl<'a> StreamComm<'a> {
    /// The communicator.
    pub fn comm(&self) -> &'a Communicator {
        self.comm
    }
    /// The stream.
    pub fn stream(&self) -> &'a CudaStream {
        self.stream
    }

    /// `recv = op over ranks of send` (`ncclAllReduce`).
    pub fn all_reduce<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: RedOp,
    ) -> Result<()> {
        GpuGroup::one(|g| g.all_reduce(self, send, recv, op).map(drop))
    }
    /// In-place all-reduce.
    pub fn all_reduce_in_place<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        op: RedOp,
    ) -> Result<()> {
        GpuGroup::one(|g| g.all_reduce_in_place(self, buf, op).map(drop))
    }
    /// Root's `send` to every rank's `recv` (`ncclBroadcast`); `send` is
    /// read on the root only.
    pub fn broadcast<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        root: usize,
    ) -> Result<()> {
        GpuGroup::one(|g| g.broadcast(self, send, recv, root).map(drop))
    }
    /// In-place broadcast (`ncclBcast`).
    pub fn broadcast_in_place<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        root: usize,
    ) -> Result<()> {
        GpuGroup::one(|g| g.broadcast_in_place(self, buf, root).map(drop))
    }
    /// `recv` on the root = op over ranks of `send` (`ncclReduce`); `recv`
    /// is written on the root only.
    pub fn reduce<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: RedOp,
        root: usize,
    ) -> Result<()> {
        GpuGroup::one(|g| g.reduce(self, send, recv, op, root).map(drop))
    }
    /// Every rank's `send` into block `rank` of every `recv` (`ncclAllGather`).
    pub fn all_gather<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        GpuGroup::one(|g| g.all_gather(self, send, recv).map(drop))
    }
    /// Block `rank` of op over ranks of `send` into `recv` (`ncclReduceScatter`).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: RedOp,
    ) -> Result<()> {
        GpuGroup::one(|g| g.reduce_scatter(self, send, recv, op).map(drop))
    }
    /// Block q of `send` to rank q, block q of `recv` from rank q (`ncclAlltoAll`).
    pub fn all_to_all<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        GpuGroup::one(|g| g.all_to_all(self, send, recv).map(drop))
    }
    /// Every rank's `send` into block `rank` of the root's `recv` (`ncclGather`).
    pub fn gather<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        root: usize,
    ) -> Result<()> {
        GpuGroup::one(|g| g.gather(self, send, recv, root).map(drop))
    }
    /// Block `rank` of the root's `send` into every `recv` (`ncclScatter`).
    pub fn scatter<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        root: usize,
    ) -> Result<()> {
        GpuGroup::one(|g| g.scatter(self, send, recv, root).map(drop))
    }
    /// Sends `buf` to `peer` (`ncclSend`). Alone it pairs with the peer's
    /// receive only when no other send/receive between the two is pending;
    /// exchanges in both directions go in a [`GpuGroup`].
    pub fn send<T: Element>(&self, buf: &impl DevicePtr<T>, peer: usize) -> Result<()> {
        GpuGroup::one(|g| g.send(self, buf, peer).map(drop))
    }
    /// Receives into `buf` from `peer` (`ncclRecv`).
    pub fn recv<T: Element>(&self, buf: &mut impl DevicePtrMut<T>, peer: usize) -> Result<()> {
        GpuGroup::one(|g| g.recv(self, buf, peer).map(drop))
    }
}

/// Operations on device buffers issued together (`ncclGroupStart` /
/// `ncclGroupEnd`): the sends and receives of one communicator become one
/// launch, so they never deadlock whatever their order, and one thread can
/// drive several ranks (each on its own stream). Each addition is checked
/// at once; [`GpuGroup::run`] queues them all. Dropped without `run`,
/// nothing is queued.
///
/// ```no_run
/// use oxccl::gpu::{CudaContext, GpuGroup};
/// # fn f(comm: &oxccl::Communicator) -> oxccl::Result<()> {
/// # let ctx = CudaContext::new(0).unwrap();
/// let stream = ctx.default_stream();
/// let (me, n) = (comm.rank(), comm.size());
/// let out = stream.clone_htod(&vec![me as u32; 256]).unwrap();
/// let mut back = stream.alloc_zeros::<u32>(256).unwrap();
/// let on = comm.on_stream(&stream);
/// let mut g = GpuGroup::new();
/// g.send(&on, &out, (me + 1) % n)?;
/// g.recv(&on, &mut back, (me + n - 1) % n)?;
/// g.run()?;
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct GpuGroup<'a> {
    launches: Vec<DeviceLaunch>,
    /// Each buffer's cudarc guard, dropped after the launches are queued
    /// (it records this stream's use of the buffer).
    guards: Vec<SyncOnDrop<'a>>,
}

impl std::fmt::Debug for GpuGroup<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuGroup({} operations)", self.launches.len())
    }
}

impl<'a> GpuGroup<'a> {
    /// An empty group.
    pub fn new() -> GpuGroup<'a> {
        GpuGroup::default()
    }

    /// Runs one operation added by `add` as a group of one.
    fn one(add: impl FnOnce(&mut GpuGroup<'a>) -> Result<()>) -> Result<()> {
        let mut g = GpuGroup::new();
        add(&mut g)?;
        g.run()
    }

    /// Checks and prepares one operation; `have` the buffers' lengths
    /// (send, recv) in elements, `count` NCCL's count.
    #[allow(clippy::too_many_arguments)]
    fn add<T: Element>(
        &mut self,
        on: &StreamComm<'a>,
        kind: CollKind,
        (send, recv): (u64, u64),
        have: (usize, usize),
        count: usize,
        op: RedOp,
        root: usize,
    ) -> Result<&mut Self> {
        let comm = on.comm;
        let (rank, nranks) = (comm.rank(), comm.size());
        let name = kind.nccl_name();
        if let Some(why) = bad_root(kind, root, nranks) {
            return Err(Error::invalid_argument(format!("{name}: {why}")));
        }
        let (want_s, want_r) = lengths(kind, count, nranks, rank == root);
        for (what, got, want) in [("send", have.0, want_s), ("recv", have.1, want_r)] {
            if got < want {
                return Err(Error::invalid_argument(format!(
                    "{name}: {what} has {got} elements; this call needs {want}"
                )));
            }
        }
        // Nothing to move or meet (as the C ABI: sends and receives of 0
        // still pair up).
        if count == 0 && !matches!(kind, CollKind::Send | CollKind::Recv) {
            comm.check_not_stopped()?;
            return Ok(self);
        }
        let (s, r) = (send as *const c_void, recv as *const c_void);
        let Some(bufs) = locate_buffers(s, r)? else {
            return Err(Error::invalid_argument(format!(
                "{name}: the buffers are not device memory (or no CUDA driver is loaded)"
            )));
        };
        let d = DeviceOp {
            kind,
            send,
            recv,
            count,
            dtype: T::DTYPE,
            op: DeviceRedOp::Op(op),
            root,
            stream: on.stream.cu_stream() as usize,
        };
        // SAFETY: the addresses come from cudarc buffers borrowed for 'a
        // (their guards are kept in this group), which outlives the launch
        // (queued at `run`); the stream is the buffers' context's (cudarc
        // waits across streams through the guards' events).
        let l = unsafe { comm.prepare_device(&d, &bufs) }?;
        self.launches.push(l);
        Ok(self)
    }

    /// Keeps a read guard and returns the address.
    fn read<T, B: DevicePtr<T>>(&mut self, b: &'a B, stream: &'a CudaStream) -> (u64, usize) {
        let (p, g) = b.device_ptr(stream);
        self.guards.push(g);
        (p, b.len())
    }

    /// Keeps a write guard and returns the address.
    fn write<T, B: DevicePtrMut<T>>(
        &mut self,
        b: &'a mut B,
        stream: &'a CudaStream,
    ) -> (u64, usize) {
        let len = b.len();
        let (p, g) = b.device_ptr_mut(stream);
        self.guards.push(g);
        (p, len)
    }

    /// Adds an all-reduce.
    pub fn all_reduce<T: Element>(
        &mut self,
        on: &StreamComm<'a>,
        send: &'a impl DevicePtr<T>,
        recv: &'a mut impl DevicePtrMut<T>,
        op: RedOp,
    ) -> Result<&mut Self> {
        let (s, ns) = self.read(send, on.stream);
        let (r, nr) = self.write(recv, on.stream);
        self.add::<T>(on, CollKind::AllReduce, (s, r), (ns, nr), ns, op, 0)
    }
    /// Adds an in-place all-reduce.
    pub fn all_reduce_in_place<T: Element>(
        &mut self,
        on: &StreamComm<'a>,
        buf: &'a mut impl DevicePtrMut<T>,
        op: RedOp,
    ) -> Result<&mut Self> {
        let (p, n) = self.write(buf, on.stream);
        self.add::<T>(on, CollKind::AllReduce, (p, p), (n, n), n, op, 0)
    }
    /// Adds a broadcast from `root`.
    pub fn broadcast<T: Element>(
        &mut self,
        on: &StreamComm<'a>,
        send: &'a impl DevicePtr<T>,
        recv: &'a mut impl DevicePtrMut<T>,
        root: usize,
    ) -> Result<&mut Self> {
        let (s, ns) = self.read(send, on.stream);
        let (r, nr) = self.write(recv, on.stream);
        let k = CollKind::Broadcast;
        self.add::<T>(on, k, (s, r), (ns, nr), nr, RedOp::Sum, root)
    }
    /// Adds an in-place broadcast from `root`.
    pub fn broadcast_in_place<T: Element>(
        &mut self,
        on: &StreamComm<'a>,
        buf: &'a mut impl DevicePtrMut<T>,
        root: usize,
    ) -> Result<&mut Self> {
        let (p, n) = self.write(buf, on.stream);
        let k = CollKind::Broadcast;
        self.add::<T>(on, k, (p, p), (n, n), n, RedOp::Sum, root)
    }
    /// Adds a reduce to `root`.
    pub fn reduce<T: Element>(
        &mut self,
        on: &StreamComm<'a>,
        send: &'a impl DevicePtr<T>,
        recv: &'a mut impl DevicePtrMut<T>,
        op: RedOp,
        root: usize,
    ) -> Result<&mut Self> {
        let (s, ns) = self.read(send, on.stream);
        let (r, nr) = self.write(recv, on.stream);
        self.add::<T>(on, CollKind::Reduce, (s, r), (ns, nr), ns, op, root)
    }
    /// Adds an all-gather: `recv` holds `size()` blocks of `send`'s length.
    pub fn all_gather<T: Element>(
        &mut self,
        on: &StreamComm<'a>,
        send: &'a impl DevicePtr<T>,
        recv: &'a mut impl DevicePtrMut<T>,
    ) -> Result<&mut Self> {
        let (s, ns) = self.read(send, on.stream);
        let (r, nr) = self.write(recv, on.stream);
        let k = CollKind::AllGather;
        self.add::<T>(on, k, (s, r), (ns, nr), ns, RedOp::Sum, 0)
    }
    /// Adds a reduce-scatter: `send` holds `size()` blocks of `recv`'s length.
    pub fn reduce_scatter<T: Element>(
        &mut self,
        on: &StreamComm<'a>,
        send: &'a impl DevicePtr<T>,
        recv: &'a mut impl DevicePtrMut<T>,
        op: RedOp,
    ) -> Result<&mut Self> {
        let (s, ns) = self.read(send, on.stream);
        let (r, nr) = self.write(recv, on.stream);
        let k = CollKind::ReduceScatter;
        self.add::<T>(on, k, (s, r), (ns, nr), nr, op, 0)
    }
    /// Adds an all-to-all: both buffers hold `size()` blocks.
    pub fn all_to_all<T: Element>(
        &mut self,
        on: &StreamComm<'a>,
        send: &'a impl DevicePtr<T>,
        recv: &'a mut impl DevicePtrMut<T>,
    ) -> Result<&mut Self> {
        let n = on.comm.size();
        let (s, ns) = self.read(send, on.stream);
        let (r, nr) = self.write(recv, on.stream);
        if ns % n != 0 {
            return Err(Error::invalid_argument(format!(
                "AlltoAll: send of {ns} elements is not a multiple of {n} ranks"
            )));
        }
        let k = CollKind::AllToAll;
        self.add::<T>(on, k, (s, r), (ns, nr), ns / n, RedOp::Sum, 0)
    }
    /// Adds a gather to `root`: the root's `recv` holds `size()` blocks of
    /// `send`'s length.
    pub fn gather<T: Element>(
        &mut self,
        on: &StreamComm<'a>,
        send: &'a impl DevicePtr<T>,
        recv: &'a mut impl DevicePtrMut<T>,
        root: usize,
    ) -> Result<&mut Self> {
        let (s, ns) = self.read(send, on.stream);
        let (r, nr) = self.write(recv, on.stream);
        let k = CollKind::Gather;
        self.add::<T>(on, k, (s, r), (ns, nr), ns, RedOp::Sum, root)
    }
    /// Adds a scatter from `root`: the root's `send` holds `size()` blocks
    /// of `recv`'s length.
    pub fn scatter<T: Element>(
        &mut self,
        on: &StreamComm<'a>,
        send: &'a impl DevicePtr<T>,
        recv: &'a mut impl DevicePtrMut<T>,
        root: usize,
    ) -> Result<&mut Self> {
        let (s, ns) = self.read(send, on.stream);
        let (r, nr) = self.write(recv, on.stream);
        let k = CollKind::Scatter;
        self.add::<T>(on, k, (s, r), (ns, nr), nr, RedOp::Sum, root)
    }
    /// Adds a send of `buf` to `peer`.
    pub fn send<T: Element>(
        &mut self,
        on: &StreamComm<'a>,
        buf: &'a impl DevicePtr<T>,
        peer: usize,
    ) -> Result<&mut Self> {
        let (s, n) = self.read(buf, on.stream);
        self.add::<T>(on, CollKind::Send, (s, 0), (n, 0), n, RedOp::Sum, peer)
    }
    /// Adds a receive into `buf` from `peer`.
    pub fn recv<T: Element>(
        &mut self,
        on: &StreamComm<'a>,
        buf: &'a mut impl DevicePtrMut<T>,
        peer: usize,
    ) -> Result<&mut Self> {
        let (r, n) = self.write(buf, on.stream);
        self.add::<T>(on, CollKind::Recv, (0, r), (0, n), n, RedOp::Sum, peer)
    }

    /// Queues every operation on its stream (`ncclGroupEnd`); returns
    /// without waiting for the GPUs.
    pub fn run(mut self) -> Result<()> {
        let launches = std::mem::take(&mut self.launches);
        let r = match launches.len() {
            0 => Ok(()),
            1 => launches
                .into_iter()
                .next()
                .map_or(Ok(()), DeviceLaunch::launch),
            _ => launch_all(launches),
        };
        // The guards record the streams' use of the buffers now, after the launches.
        drop(self.guards);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_follow_nccl_counts() {
        // count 3 per rank on 4 ranks.
        let l = |k, root| lengths(k, 3, 4, root);
        assert_eq!(l(CollKind::AllReduce, false), (3, 3));
        assert_eq!(l(CollKind::ReduceScatter, false), (12, 3));
        assert_eq!(l(CollKind::AllGather, false), (3, 12));
        assert_eq!(l(CollKind::AllToAll, false), (12, 12));
        assert_eq!(l(CollKind::Broadcast, true), (3, 3));
        assert_eq!(l(CollKind::Broadcast, false), (0, 3));
        assert_eq!(l(CollKind::Reduce, false), (3, 0));
        assert_eq!(l(CollKind::Gather, true), (3, 12));
        assert_eq!(l(CollKind::Gather, false), (3, 0));
        assert_eq!(l(CollKind::Scatter, true), (12, 3));
        assert_eq!(l(CollKind::Scatter, false), (0, 3));
        assert_eq!(l(CollKind::Send, false), (3, 0));
        assert_eq!(l(CollKind::Recv, false), (0, 3));
        // Count 0 and one rank.
        assert_eq!(lengths(CollKind::AllGather, 0, 1, true), (0, 0));
        assert_eq!(lengths(CollKind::ReduceScatter, 5, 1, true), (5, 5));
    }
}
