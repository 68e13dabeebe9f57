//! The CUDA backend: one *worker* thread drives `-g` GPUs, one rank each
//! (nccl-tests' `-g`), through an NCCL-API library loaded with `dlopen`
//! (oxccl's `libnccl.so`, or `--lib PATH`), and the `--compare` library
//! beside it on the same device buffers.
//!
//! Two planes:
//!
//! - **Data**: each rank's communicator of the measured library (and of the
//!   compared one), created with `ncclCommInitRank` inside one group per
//!   worker, its own non-blocking stream, and device buffers from
//!   `cuMemAlloc`. Every call of one iteration is one NCCL group across the
//!   worker's ranks (and across the `-m` operations for all_reduce and
//!   sendrecv). Times come from CUDA events recorded on each rank's stream
//!   around the `-n` iterations (or around `-G` replays of a graph captured
//!   from them), so each rank has its own time and `-a` combines them.
//! - **Control**: an oxccl host communicator over the workers (threads or
//!   processes, shared memory) carries the libraries' unique ids from
//!   worker 0, agreement that setup worked everywhere, barriers before each
//!   timed loop, and the per-rank times and wrong-element counts.
//!
//! Checks: inputs come from the same generators as the CPU backend
//! ([`super::data`]), written on the host and copied to the device; results
//! are copied back and compared exactly (`#wrong` per size).
//!
//! No wait is unbounded: GPU waits poll until `-T` (or
//! [`super::GPU_DEFAULT_TIMEOUT`]), and blocking library calls (creation,
//! group ends) are watched by [`super::bench::watchdog`]. A GPU that did not
//! finish ends the process at once (`_exit(1)`): its queued work still
//! references the buffers, so nothing can be freed safely.

use super::bench::Activity;
use super::coll::Counts;
use super::common::{self, Line, Meta, RankInfo, Report, INFO_BYTES};
use super::compare::{self, CmpComm, Lib};
use super::data::Gen;
use super::Settings;
use oxccl::gpu::tools::timing::{self as bench_gpu, PerfEvent, PerfGpu, PerfMem, PerfStream};
use oxccl::raw::OpDesc;
use oxccl::{Communicator, Config, DataType, Error, ErrorKind, RedOp, UniqueId};
use std::ffi::c_void;
use std::io::Write;
use std::time::{Duration, Instant};

/// One rank of this worker: its GPU, stream and timing events.
struct Dev {
    rank: usize,
    info: bench_gpu::DeviceInfo,
    start: PerfEvent,
    stop: PerfEvent,
    stream: PerfStream,
    gpu: PerfGpu,
}

/// One rank's device buffers for one data type, sized for the sweep's largest counts.
struct DevBufs {
    send: PerfMem,
    /// Receive (out-of-place) or only (in-place) buffers: one per operation of a `-m` group.
    slots: Vec<PerfMem>,
}

/// Which library a half runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Which {
    Main,
    Cmp,
}

/// A call of one iteration: (local rank index, operation), issued as one group.
type Call = Vec<(usize, OpDesc)>;

struct Worker<'a> {
    s: &'a Settings,
    act: &'a Activity,
    slot: usize,
    /// Communicators first: they are destroyed before the streams and contexts they use.
    main: Vec<CmpComm>,
    cmp: Option<Vec<CmpComm>>,
    devs: Vec<Dev>,
    control: Communicator,
    n: usize,
    limit: Duration,
    report: Option<Report>,
    /// The root of the lines being run (rooted collectives).
    root: usize,
    errors: usize,
    ctx: String,
    progress: Option<super::progress::Progress>,
    corrupt: bool,
    /// A GPU did not finish in time: nothing may be freed.
    stuck: bool,
}

fn cuda_err(e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::UnhandledCuda, e.to_string())
}

/// Ends the process now, without destructors: a GPU still runs work that
/// references this process's buffers, and the libraries' teardown may wait
/// for it for ever.
fn die() -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process; it touches no memory of ours.
    unsafe { libc::_exit(1) }
}

/// Runs worker `worker` (local worker `local`: its GPUs are `local * ngpus
/// ..`) to the end; returns 0, 7 (wrong results) or 1 (a failure, reported).
pub fn worker_main(
    s: &Settings,
    act: &Activity,
    slot: usize,
    worker: usize,
    local: usize,
    id: &UniqueId,
) -> i32 {
    let g = s.ngpus;
    let first = worker * g;
    let who = if g == 1 {
        format!("rank {first}")
    } else {
        format!("ranks {first}-{}", first + g - 1)
    };
    let cfg = Config {
        timeout: s.timeout,
        name: Some(format!("oxccl perf control {worker}")),
        ..Config::default()
    };
    let control = match Communicator::init_rank_config(s.workers(), id, worker, cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("oxccl perf: {who}: control communicator init failed: {e}");
            return 1;
        }
    };
    act.register(slot, first, &control);
    let corrupt = std::env::var("OXCCL_PERF_TEST_CORRUPT_RANK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|r| (first..first + g).contains(&r));
    let mut w = match Worker::setup(s, act, slot, control, worker, local, corrupt, &who) {
        Ok(w) => w,
        Err(code) => return code,
    };
    match w.run() {
        Ok(()) => {
            let code = if w.errors > 0 { 7 } else { 0 };
            // Destroying communicators may wait for peers: watched.
            w.act.begin(w.slot);
            compare::destroy_all(std::mem::take(&mut w.main));
            if let Some(c) = w.cmp.take() {
                compare::destroy_all(c);
            }
            w.act.end(w.slot);
            code
        }
        Err(e) => {
            let hint = if e.kind() == ErrorKind::Timeout {
                " (-T/--timeout)"
            } else {
                ""
            };
            eprintln!("oxccl perf: {who}: {} failed: {e}{hint}", w.ctx);
            // A peer's kernels may wait for ours for ever, and ours for
            // theirs: stop here rather than in a teardown that may hang.
            w.control.abort();
            die();
        }
    }
}

impl<'a> Worker<'a> {
    /// Control-plane agreement: every worker says whether its part of a
    /// step worked; true when all did.
    fn agree(control: &Communicator, act: &Activity, slot: usize, ok: bool) -> bool {
        let mut fails = [u32::from(!ok)];
        act.begin(slot);
        let r = control.all_reduce_in_place(&mut fails, RedOp::Sum);
        act.end(slot);
        r.is_ok() && fails[0] == 0
    }

    /// GPUs, streams, the libraries' ids and communicators; on failure the
    /// exit status (the failing worker printed why; the others exit quietly).
    #[allow(clippy::too_many_arguments)]
    fn setup(
        s: &'a Settings,
        act: &'a Activity,
        slot: usize,
        control: Communicator,
        worker: usize,
        local: usize,
        corrupt: bool,
        who: &str,
    ) -> Result<Worker<'a>, i32> {
        let g = s.ngpus;
        let lib = s.lib.as_ref().expect("the CUDA backend has a library");
        let fail = |what: &str| {
            eprintln!("oxccl perf: {who}: {what}");
        };
        // 1. The libraries' unique ids, made by worker 0 (whose process
        //    hosts the libraries' rendezvous roots) and broadcast.
        let mut ids = [0u8; 257];
        if worker == 0 {
            let made = lib
                .unique_id()
                .map_err(|e| format!("--lib {}: {e}", lib.path.display()))
                .and_then(|m| {
                    ids[..128].copy_from_slice(&m);
                    match &s.compare {
                        Some(c) => c
                            .unique_id()
                            .map_err(|e| format!("--compare {}: {e}", c.path.display()))
                            .map(|x| ids[128..256].copy_from_slice(&x)),
                        None => Ok(()),
                    }
                });
            match made {
                Ok(()) => ids[256] = 1,
                Err(e) => fail(&e),
            }
        }
        act.begin(slot);
        let r = control.broadcast_in_place(&mut ids[..], 0);
        act.end(slot);
        if let Err(e) = r {
            fail(&format!("receiving the libraries' unique ids failed: {e}"));
            return Err(1);
        }
        if ids[256] != 1 {
            return Err(1);
        }
        let main_id: [u8; 128] = ids[..128].try_into().expect("128 bytes");
        let cmp_id: [u8; 128] = ids[128..256].try_into().expect("128 bytes");
        // 2. This worker's GPUs.
        let opened: Result<Vec<Dev>, String> = (0..g)
            .map(|i| {
                let rank = worker * g + i;
                let devices = bench_gpu::device_count().map_err(|e| e.to_string())?;
                let ordinal = match local * g + i {
                    o if s.share_gpus && devices > 0 => o % devices,
                    o => o,
                };
                if ordinal >= devices {
                    return Err(format!(
                        "rank {rank} needs GPU {ordinal} (local rank x -g) and this machine has {devices} (accepted: at most {devices} ranks per host)"
                    ));
                }
                let mk = || -> Result<Dev, Error> {
                    let gpu = PerfGpu::open(ordinal)?;
                    Ok(Dev {
                        rank,
                        info: bench_gpu::device_info(ordinal)?,
                        start: gpu.event()?,
                        stop: gpu.event()?,
                        stream: gpu.stream()?,
                        gpu,
                    })
                };
                mk().map_err(|e| format!("GPU {ordinal}: {e}"))
            })
            .collect();
        let devs = match opened {
            Ok(d) => Some(d),
            Err(e) => {
                fail(&e);
                None
            }
        };
        if !Self::agree(&control, act, slot, devs.is_some()) {
            return Err(1);
        }
        let devs = devs.expect("agreed");
        // 3. Communicators: the measured library's, then the compared one's.
        let ranks: Vec<usize> = devs.iter().map(|d| d.rank).collect();
        let make = |l: &Lib, id: &[u8; 128], flag: &str| {
            act.begin(slot);
            let r = CmpComm::init_all(l, s.nranks, id, &ranks, |i| {
                devs[i].gpu.make_current().map_err(|e| e.to_string())
            });
            act.end(slot);
            r.map_err(|e| format!("{flag} {}: {e}", l.path.display()))
        };
        let main = match make(lib, &main_id, "--lib") {
            Ok(c) => Some(c),
            Err(e) => {
                fail(&e);
                None
            }
        };
        if !Self::agree(&control, act, slot, main.is_some()) {
            die_after_init(main);
        }
        let cmp = match &s.compare {
            None => None,
            Some(c) => match make(c, &cmp_id, "--compare") {
                Ok(c) => Some(c),
                Err(e) => {
                    fail(&e);
                    None
                }
            },
        };
        if !Self::agree(&control, act, slot, s.compare.is_none() || cmp.is_some()) {
            die_after_init(main);
        }
        let limit = s.wait_limit().unwrap_or(super::GPU_DEFAULT_TIMEOUT);
        Ok(Worker {
            s,
            act,
            slot,
            main: main.expect("agreed"),
            cmp,
            devs,
            control,
            n: s.nranks,
            limit,
            report: (worker == 0).then(Report::new),
            root: s.root,
            errors: 0,
            ctx: "startup".into(),
            progress: None,
            corrupt,
            stuck: false,
        })
    }

    fn lib(&self, which: Which) -> &'a Lib {
        match which {
            Which::Main => self.s.lib.as_ref().expect("the CUDA backend has a library"),
            Which::Cmp => self.s.compare.as_ref().expect("--compare library"),
        }
    }

    fn comms(&self, which: Which) -> &[CmpComm] {
        match which {
            Which::Main => &self.main,
            Which::Cmp => self.cmp.as_deref().expect("--compare communicators"),
        }
    }

    /// Issues one call (a group across this worker's ranks), watched.
    fn issue(&self, which: Which, call: &[(usize, OpDesc)]) -> Result<(), Error> {
        let comms = self.comms(which);
        let items: Vec<(&CmpComm, *mut c_void, &OpDesc)> = call
            .iter()
            .map(|(i, d)| (&comms[*i], self.devs[*i].stream.raw(), d))
            .collect();
        self.act.begin(self.slot);
        // SAFETY: every pointer in `call` is an address inside this rank's
        // device buffers (`DevBufs`, sized by `alloc` for the sweep's largest
        // counts, alive until the type's sweep ends), and the stream is that
        // rank's live stream on the same GPU; see `calls`.
        let r = unsafe { compare::issue(self.lib(which), &items) };
        self.act.end(self.slot);
        r.map_err(|e| {
            let flag = if which == Which::Cmp {
                "--compare"
            } else {
                "--lib"
            };
            Error::new(
                ErrorKind::Remote,
                format!("{flag} {}: {e}", self.lib(which).path.display()),
            )
        })
    }

    /// Waits for every local stream, at most until the deadline.
    fn wait_all(&mut self) -> Result<(), Error> {
        let deadline = Instant::now() + self.limit;
        for d in &self.devs {
            if !d.stream.wait(deadline).map_err(cuda_err)? {
                self.stuck = true;
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "GPU {} (rank {}) did not finish its queued work within {} s",
                        d.info.ordinal,
                        d.rank,
                        self.limit.as_secs()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn barrier(&self) -> Result<(), Error> {
        let mut x = [0f32];
        self.act.begin(self.slot);
        let r = self.control.all_reduce_in_place(&mut x, RedOp::Sum);
        self.act.end(self.slot);
        r
    }

    fn meta(&self, ranks: &[RankInfo]) -> Meta {
        let lib = self.lib(Which::Main);
        let default = super::default_lib_path().is_some_and(|p| p == lib.path);
        // "2 x NVIDIA H200" (per distinct name, in rank order).
        let mut names: Vec<(String, usize)> = Vec::new();
        for r in ranks {
            match names.iter_mut().find(|(n, _)| *n == r.name) {
                Some((_, k)) => *k += 1,
                None => names.push((r.name.clone(), 1)),
            }
        }
        let machine = names
            .iter()
            .map(|(n, k)| format!("{k} x {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let file = lib.path.file_name().map_or_else(
            || lib.path.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        );
        Meta {
            backend: "cuda",
            machine,
            library: if default { "oxccl".into() } else { file },
            library_version: if default {
                oxccl::VERSION.into()
            } else {
                compare::version_string(lib.version)
            },
            library_path: Some(lib.path.display().to_string()),
            launch: common::launch_name(self.s),
            nccl_version: i64::from(lib.version),
        }
    }

    fn run(&mut self) -> Result<(), Error> {
        self.ctx = "the rank exchange".into();
        let g = self.devs.len();
        let host = common::hostname();
        let mut mine = vec![0u8; INFO_BYTES * g];
        for (d, out) in self.devs.iter().zip(mine.chunks_exact_mut(INFO_BYTES)) {
            let info = RankInfo {
                pid: std::process::id(),
                dev: d.info.ordinal as u32,
                host: host.clone(),
                pci: d.info.pci.clone(),
                name: d.info.name.clone(),
            };
            out.copy_from_slice(&info.encode());
        }
        let mut all = vec![0u8; INFO_BYTES * self.n];
        self.act.begin(self.slot);
        let r = self.control.all_gather(&mine, &mut all);
        self.act.end(self.slot);
        r?;
        let ranks: Vec<RankInfo> = all.chunks_exact(INFO_BYTES).map(RankInfo::decode).collect();
        let meta = self.meta(&ranks);
        let s = self.s;
        if self.report.is_some() {
            common::print_header(s, self.n, &meta, &ranks);
            let per_type = s.sizes.len() * s.ops.len().max(1);
            self.progress = super::progress::Progress::on_terminal(per_type * s.types.len());
        }
        for &dt in &s.types {
            self.ctx = format!("allocating device buffers for {}", dt.name());
            let bufs = self.alloc(dt);
            let ok = bufs.is_ok();
            if !Self::agree(&self.control, self.act, self.slot, ok) {
                return Err(bufs.err().unwrap_or_else(|| {
                    Error::new(
                        ErrorKind::Remote,
                        "another rank could not allocate its buffers",
                    )
                }));
            }
            let bufs = bufs?;
            let ops: Vec<Option<RedOp>> = if s.coll.reduces() {
                s.ops.iter().map(|&o| Some(o)).collect()
            } else {
                vec![None]
            };
            self.ctx = format!("filling device buffers for {}", dt.name());
            self.prefill(dt, ops[0], &bufs)?;
            for _ in 0..20 {
                self.barrier()?;
            }
            for &op in &ops {
                for &root in &s.roots {
                    self.root = root;
                    let mut cycle = 0;
                    while s.cycles == 0 || cycle < s.cycles {
                        cycle += 1;
                        for &bytes in &s.sizes {
                            if let Some(p) = self.progress.as_mut() {
                                p.start_case(bytes);
                            }
                            let r = self.case(dt, op, bytes, &bufs);
                            if let Some(p) = self.progress.as_mut() {
                                if r.is_err() {
                                    p.clear();
                                } else {
                                    p.finish_case();
                                }
                            }
                            r?;
                        }
                    }
                }
            }
            self.wait_all()?;
        }
        if let Some(p) = self.progress.take() {
            p.clear();
        }
        if let Some(rep) = &self.report {
            rep.finish(s, self.n, &meta, &ranks, self.errors)?;
        }
        Ok(())
    }

    /// Largest send and slot extents (elements) of the sweep.
    fn extents(&self, dt: DataType) -> (usize, usize) {
        let (mut send, mut slot) = (0usize, 0usize);
        for &b in &self.s.sizes {
            let c = self.s.coll.counts(b, dt.size(), self.n);
            send = send.max(c.send);
            slot = slot.max(c.recv).max(c.send);
        }
        (send, slot)
    }

    fn alloc(&self, dt: DataType) -> Result<Vec<DevBufs>, Error> {
        let es = dt.size();
        let (send, slot) = self.extents(dt);
        let nslots = if self.s.coll.groups_agg() {
            self.s.agg as usize
        } else {
            1
        };
        self.devs
            .iter()
            .map(|d| {
                Ok(DevBufs {
                    send: d.gpu.alloc(send * es).map_err(cuda_err)?,
                    slots: (0..nslots)
                        .map(|_| d.gpu.alloc(slot * es).map_err(cuda_err))
                        .collect::<Result<_, _>>()?,
                })
            })
            .collect()
    }

    /// Valid inputs everywhere before the timed loops (seed 0, largest size;
    /// a smaller size's input is a prefix of it).
    fn prefill(&self, dt: DataType, op: Option<RedOp>, bufs: &[DevBufs]) -> Result<(), Error> {
        let es = dt.size();
        let (send, slot) = self.extents(dt);
        let gen = Gen::new(dt, op, self.n, 0);
        let imgs = self.per_rank(|rank| {
            let mut img = vec![0u8; send.max(slot) * es];
            super::data::write(&mut img, dt, 0, send.max(slot), |k| {
                super::data::encode(dt, gen.value(rank, k))
            });
            img
        });
        for ((d, b), img) in self.devs.iter().zip(bufs).zip(&imgs) {
            let _ = d;
            b.send.write(0, &img[..send * es]).map_err(cuda_err)?;
            for m in &b.slots {
                m.write(0, &img[..slot * es]).map_err(cuda_err)?;
            }
        }
        Ok(())
    }

    /// `f(rank)` for each local rank, on a thread each when there are several.
    fn per_rank<T: Send>(&self, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
        let ranks: Vec<usize> = self.devs.iter().map(|d| d.rank).collect();
        if ranks.len() == 1 {
            return vec![f(ranks[0])];
        }
        std::thread::scope(|sc| {
            let f = &f;
            let hs: Vec<_> = ranks.iter().map(|&r| sc.spawn(move || f(r))).collect();
            hs.into_iter()
                .map(|h| h.join().expect("a check thread panicked"))
                .collect()
        })
    }

    /// The calls of one iteration: one group across the local ranks (and,
    /// for all_reduce and sendrecv, across the `-m` operations), else `-m`
    /// such groups.
    fn calls(
        &self,
        in_place: bool,
        dt: DataType,
        op: RedOp,
        c: Counts,
        bufs: &[DevBufs],
    ) -> Vec<Call> {
        let s = self.s;
        let one = |slot: usize| -> Call {
            self.devs
                .iter()
                .zip(bufs)
                .enumerate()
                .flat_map(|(i, (d, b))| {
                    common::descs(
                        s,
                        self.root,
                        d.rank,
                        self.n,
                        in_place,
                        dt,
                        op,
                        c,
                        b.send.ptr() as usize as *mut u8,
                        b.slots[slot].ptr() as usize as *mut u8,
                    )
                    .into_iter()
                    .map(move |o| (i, o))
                })
                .collect()
        };
        let nslots = bufs[0].slots.len();
        if nslots > 1 {
            vec![(0..nslots).flat_map(one).collect()]
        } else {
            vec![one(0); s.agg as usize]
        }
    }

    /// Times and checks one half on `which` library: per local rank seconds
    /// per operation, and wrong elements here (`None`: not checked).
    fn half(
        &mut self,
        which: Which,
        in_place: bool,
        dt: DataType,
        op: Option<RedOp>,
        c: Counts,
        bufs: &[DevBufs],
    ) -> Result<(Vec<f64>, Option<u64>), Error> {
        let s = self.s;
        let red = op.unwrap_or(RedOp::Sum);
        let calls = self.calls(in_place, dt, red, c, bufs);
        let blocking = s.blocking != 0;
        for _ in 0..s.warmup {
            for call in &calls {
                self.issue(which, call)?;
                if blocking {
                    self.wait_all()?;
                }
            }
        }
        self.wait_all()?;
        self.barrier()?;
        let ops_per_loop = (s.iters * s.agg) as f64;
        let secs: Vec<f64> = if s.graph == 0 {
            for d in &self.devs {
                d.start.record(&d.stream).map_err(cuda_err)?;
            }
            let issued = Instant::now();
            for _ in 0..s.iters {
                for call in &calls {
                    self.issue(which, call)?;
                    if blocking {
                        self.wait_all()?;
                    }
                }
            }
            let issue_secs = issued.elapsed().as_secs_f64() / ops_per_loop;
            for d in &self.devs {
                d.stop.record(&d.stream).map_err(cuda_err)?;
            }
            let gpu = self.elapsed(ops_per_loop)?;
            if s.cputime {
                vec![issue_secs; gpu.len()]
            } else {
                gpu
            }
        } else {
            // Capture the -n iterations on every local stream, then time -G replays.
            let mut begun = 0;
            let mut r: Result<(), Error> = Ok(());
            for d in &self.devs {
                match d.stream.begin_capture() {
                    Ok(()) => begun += 1,
                    Err(e) => {
                        r = Err(cuda_err(e));
                        break;
                    }
                }
            }
            if r.is_ok() {
                'iters: for _ in 0..s.iters {
                    for call in &calls {
                        if let Err(e) = self.issue(which, call) {
                            r = Err(e);
                            break 'iters;
                        }
                    }
                }
            }
            // Every capture begun must end, whatever failed.
            let graphs: Vec<_> = self.devs[..begun]
                .iter()
                .map(|d| d.stream.end_capture())
                .collect();
            r?;
            let graphs = graphs
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
                .and_then(|mut v| {
                    // Instantiated only now: no capture of this thread is open.
                    for g in v.iter_mut() {
                        g.instantiate()?;
                    }
                    Ok(v)
                })
                .map_err(|e| {
                    cuda_err(format!(
                        "-G/--cudagraph: {e} (the library's calls could not be captured in a CUDA graph)"
                    ))
                })?;
            self.barrier()?;
            for d in &self.devs {
                d.start.record(&d.stream).map_err(cuda_err)?;
            }
            let issued = Instant::now();
            for _ in 0..s.graph {
                for (d, gr) in self.devs.iter().zip(&graphs) {
                    gr.launch(&d.stream).map_err(cuda_err)?;
                }
            }
            let issue_secs = issued.elapsed().as_secs_f64() / (ops_per_loop * s.graph as f64);
            for d in &self.devs {
                d.stop.record(&d.stream).map_err(cuda_err)?;
            }
            let mut t = self.elapsed(ops_per_loop * s.graph as f64)?;
            if s.cputime {
                t.iter_mut().for_each(|x| *x = issue_secs);
            }
            drop(graphs);
            t
        };
        let checks = match which {
            Which::Main => s.check,
            Which::Cmp => s.check.min(1),
        };
        if checks == 0 {
            return Ok((secs, None));
        }
        let mut wrong = 0;
        for k in 0..checks {
            wrong += self.check(which, in_place, dt, op, c, bufs, k + 1)?;
        }
        Ok((secs, Some(wrong)))
    }

    /// Per local rank: seconds per operation from its events, over `ops` operations.
    fn elapsed(&mut self, ops: f64) -> Result<Vec<f64>, Error> {
        let deadline = Instant::now() + self.limit;
        let mut out = Vec::with_capacity(self.devs.len());
        for d in &self.devs {
            if !d.stop.wait(deadline).map_err(cuda_err)? {
                self.stuck = true;
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "the timed loop on GPU {} (rank {}) did not finish within {} s",
                        d.info.ordinal,
                        d.rank,
                        self.limit.as_secs()
                    ),
                ));
            }
            let ms = d.stop.elapsed_ms_since(&d.start).map_err(cuda_err)?;
            out.push(ms as f64 / 1e3 / ops);
        }
        Ok(out)
    }

    /// One checked call with seed `seed`: inputs written from the host, one
    /// call, results read back and compared; wrong elements over the local ranks.
    #[allow(clippy::too_many_arguments)]
    fn check(
        &mut self,
        which: Which,
        in_place: bool,
        dt: DataType,
        op: Option<RedOp>,
        c: Counts,
        bufs: &[DevBufs],
        seed: u64,
    ) -> Result<u64, Error> {
        let s = self.s;
        let es = dt.size();
        let (n, coll) = (self.n, s.coll);
        let g = Gen::new(dt, op, n, seed);
        let imgs = self.per_rank(|rank| {
            let mut send = vec![0u8; c.send * es];
            let mut slot = vec![0u8; c.send.max(c.recv) * es];
            common::fill(coll, rank, n, in_place, &g, c, &mut send, &mut slot);
            (send, slot)
        });
        for (b, (send, slot)) in bufs.iter().zip(&imgs) {
            if !in_place {
                b.send.write(0, send).map_err(cuda_err)?;
            }
            b.slots[0].write(0, slot).map_err(cuda_err)?;
        }
        drop(imgs);
        let red = op.unwrap_or(RedOp::Sum);
        let call: Call = self
            .devs
            .iter()
            .zip(bufs)
            .enumerate()
            .flat_map(|(i, (d, b))| {
                common::descs(
                    s,
                    self.root,
                    d.rank,
                    n,
                    in_place,
                    dt,
                    red,
                    c,
                    b.send.ptr() as usize as *mut u8,
                    b.slots[0].ptr() as usize as *mut u8,
                )
                .into_iter()
                .map(move |o| (i, o))
            })
            .collect();
        self.issue(which, &call)?;
        self.wait_all()?;
        let mut results = Vec::with_capacity(bufs.len());
        for b in bufs {
            let mut out = vec![0u8; c.send.max(c.recv) * es];
            b.slots[0].read(0, &mut out).map_err(cuda_err)?;
            if self.corrupt && which == Which::Main && c.param > 0 {
                out[0] ^= 1;
            }
            results.push(out);
        }
        let ranks: Vec<usize> = self.devs.iter().map(|d| d.rank).collect();
        let root = self.root;
        let wrong: u64 = std::thread::scope(|sc| {
            let hs: Vec<_> = ranks
                .iter()
                .zip(&results)
                .map(|(&r, buf)| {
                    let g = &g;
                    sc.spawn(move || common::verify(coll, root, r, n, in_place, g, c, buf))
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("a check thread panicked"))
                .sum()
        });
        Ok(wrong)
    }

    fn case(
        &mut self,
        dt: DataType,
        op: Option<RedOp>,
        bytes: u64,
        bufs: &[DevBufs],
    ) -> Result<(), Error> {
        let s = self.s;
        let coll = s.coll;
        let c = coll.counts(bytes, dt.size(), self.n);
        let opname = op.map_or("none", |o| o.name());
        let base = format!("{} of {} B ({} {}", coll.name(), bytes, dt.name(), opname);
        self.ctx = format!("{base}, out-of-place)");
        let oop = self.half(Which::Main, false, dt, op, c, bufs)?;
        let cmp = if self.cmp.is_some() {
            self.ctx = format!("{base}, out-of-place, --compare library)");
            Some(self.half(Which::Cmp, false, dt, op, c, bufs)?)
        } else {
            None
        };
        let ip = if coll.has_in_place() {
            self.ctx = format!("{base}, in-place)");
            Some(self.half(Which::Main, true, dt, op, c, bufs)?)
        } else {
            None
        };
        self.ctx = format!("{} of {} B (collecting results)", coll.name(), bytes);
        let mut wrong = [
            oop.1.unwrap_or(0),
            ip.as_ref().and_then(|x| x.1).unwrap_or(0),
            cmp.as_ref().and_then(|x| x.1).unwrap_or(0),
        ];
        self.act.begin(self.slot);
        let r = self.control.all_reduce_in_place(&mut wrong, RedOp::Sum);
        self.act.end(self.slot);
        r?;
        // Per worker: its ranks' out-of-place, in-place and compare times.
        let g = self.devs.len();
        let zeros = vec![0.0; g];
        let mut mine = oop.0.clone();
        mine.extend_from_slice(ip.as_ref().map_or(&zeros, |x| &x.0));
        mine.extend_from_slice(cmp.as_ref().map_or(&zeros, |x| &x.0));
        let mut all = vec![0f64; 3 * self.n];
        self.act.begin(self.slot);
        let r = self.control.all_gather(&mine, &mut all);
        self.act.end(self.slot);
        r?;
        let column = |k: usize| -> Vec<f64> {
            all.chunks_exact(3 * g)
                .flat_map(|w| w[k * g..(k + 1) * g].iter().copied())
                .collect()
        };
        self.errors += usize::from(wrong[0] > 0) + usize::from(ip.is_some() && wrong[1] > 0);
        let Some(rep) = self.report.as_mut() else {
            return Ok(());
        };
        let (t_oop, t_ip, t_cmp) = (column(0), column(1), column(2));
        let line = Line {
            dt,
            opname,
            c,
            oop: &t_oop,
            ip: ip.as_ref().map(|_| t_ip.as_slice()),
            cmp: cmp.as_ref().map(|_| t_cmp.as_slice()),
            wrong,
            root: self.root,
            per_iter: [None, None],
        };
        rep.line(s, self.n, &line, self.progress.as_ref());
        Ok(())
    }
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        if self.stuck {
            die();
        }
    }
}

/// Setup failed after this worker's communicators may exist: a peer may be
/// inside a library call that waits for them, and destroying them may wait
/// for the peer. End the process (the failing worker already said why).
fn die_after_init(comms: Option<Vec<CmpComm>>) -> ! {
    if let Some(v) = comms {
        v.into_iter().for_each(CmpComm::abort);
    }
    die();
}
