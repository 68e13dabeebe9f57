//! One rank's benchmark: per data type, op and size, warm-up, a barrier,
//! timed iterations, checked iterations; out-of-place then in-place. Rank 0
//! prints the table and writes the JSON file.
//!
//! Test hooks (not in `--help`): `OXCCL_PERF_TEST_ABORT_RANK=<rank>` makes that
//! rank call `abort()` after its first timed loop, to exercise the launcher's
//! handling of a dying rank; `OXCCL_PERF_TEST_CORRUPT_RANK=<rank>` makes that
//! rank flip a bit of its first result element before each check, to exercise
//! the failure path (`#wrong`, FAILED, exit status 7).

use super::coll::Counts;
use super::common::{self, Line, Meta, RankInfo, Report, INFO_BYTES};
use super::compare::CmpComm;
use super::data::Gen;
use super::Settings;
use oxccl::raw::OpDesc;
use oxccl::{Communicator, Config, DataType, Error, ErrorKind, RedOp, UniqueId};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What the ranks of this process are doing, for the `-T` watchdog.
pub struct Activity {
    epoch: Instant,
    /// Per local rank: milliseconds since `epoch` + 1 when its current call began; 0 when idle.
    busy: Vec<AtomicU64>,
    /// Per local rank: its global rank.
    ranks: Vec<AtomicU64>,
    comms: Mutex<Vec<Communicator>>,
    done: AtomicBool,
}

impl Activity {
    pub fn new(n: usize) -> Activity {
        Activity {
            epoch: Instant::now(),
            busy: (0..n).map(|_| AtomicU64::new(0)).collect(),
            ranks: (0..n).map(|_| AtomicU64::new(0)).collect(),
            comms: Mutex::new(Vec::new()),
            done: AtomicBool::new(false),
        }
    }
    pub(super) fn begin(&self, slot: usize) {
        let ms = self.epoch.elapsed().as_millis() as u64 + 1;
        self.busy[slot].store(ms, Ordering::Relaxed);
    }
    pub(super) fn end(&self, slot: usize) {
        self.busy[slot].store(0, Ordering::Relaxed);
    }
    pub(super) fn register(&self, slot: usize, rank: usize, c: &Communicator) {
        self.ranks[slot].store(rank as u64, Ordering::Relaxed);
        if let Ok(mut v) = self.comms.lock() {
            v.push(c.clone());
        }
    }
    /// Every rank of the process has returned.
    pub fn finish(&self) {
        self.done.store(true, Ordering::Release);
    }
}

/// `-T`: when a call runs longer than `t`, abort every communicator of the
/// process; if the ranks still have not returned 5 s later, exit.
pub fn watchdog(s: &Settings, act: &Activity, t: Duration) {
    let limit = t.as_millis() as u64;
    while !act.done.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(50));
        let now = act.epoch.elapsed().as_millis() as u64 + 1;
        let late = act.busy.iter().enumerate().find(|(_, b)| {
            let b = b.load(Ordering::Relaxed);
            b != 0 && now.saturating_sub(b) > limit
        });
        if let Some((slot, _)) = late {
            eprintln!(
                "oxccl perf: rank {}: a {} call did not finish within -T/--timeout {} s; aborting the communicators",
                act.ranks[slot].load(Ordering::Relaxed),
                s.coll.name(),
                t.as_secs()
            );
            if let Ok(v) = act.comms.lock() {
                v.iter().for_each(|c| c.abort());
            }
            let t0 = Instant::now();
            while !act.done.load(Ordering::Acquire) {
                if t0.elapsed() > Duration::from_secs(5) {
                    eprintln!("oxccl perf: the ranks did not stop after the abort; exiting");
                    std::process::exit(1);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            return;
        }
    }
}

/// Buffers of one data type, sized for the largest size of the sweep.
struct Bufs {
    send: Vec<u8>,
    /// Receive (out-of-place) or only (in-place) buffers: one per operation of a `-m` group.
    slots: Vec<Vec<u8>>,
}

struct Runner<'a> {
    s: &'a Settings,
    act: &'a Activity,
    slot: usize,
    comm: Communicator,
    rank: usize,
    n: usize,
    report: Option<Report>,
    /// The root of the lines being run (rooted collectives).
    root: usize,
    /// Lines (size x half) with wrong elements, over all ranks.
    errors: usize,
    abort_after_timing: bool,
    corrupt: bool,
    /// What is running, for error messages.
    ctx: String,
    /// Rank 0's progress bar, when stderr is a terminal.
    progress: Option<super::progress::Progress>,
    /// `--compare`: this rank's communicator of the other library.
    cmp: Option<CmpComm>,
}

/// Runs global rank `rank` (local rank `local`) to the end; returns 0, 7
/// (wrong results) or 1 (a failure, already reported on stderr).
pub fn rank_main(
    s: &Settings,
    act: &Activity,
    slot: usize,
    rank: usize,
    local: usize,
    id: &UniqueId,
) -> i32 {
    let cfg = Config {
        timeout: s.timeout,
        name: Some(format!("oxccl perf rank {rank}")),
        ..Config::default()
    };
    let comm = match Communicator::init_rank_config(s.nranks, id, rank, cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("oxccl perf: rank {rank}: communicator init failed: {e}");
            return 1;
        }
    };
    act.register(slot, rank, &comm);
    let cmp = match (&s.compare, &s.compare_id) {
        (Some(lib), Some(id)) => match CmpComm::init(lib, s.nranks, id, rank) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!(
                    "oxccl perf: rank {rank}: --compare {}: {e}",
                    lib.path.display()
                );
                comm.abort();
                return 1;
            }
        },
        _ => None,
    };
    let hook = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            == Some(rank)
    };
    let mut r = Runner {
        s,
        act,
        slot,
        comm,
        rank,
        n: s.nranks,
        report: (rank == 0).then(Report::new),
        root: s.root,
        errors: 0,
        abort_after_timing: hook("OXCCL_PERF_TEST_ABORT_RANK"),
        corrupt: hook("OXCCL_PERF_TEST_CORRUPT_RANK"),
        ctx: "startup".into(),
        progress: None,
        cmp,
    };
    match r.run(local) {
        Ok(()) => {
            if r.errors > 0 {
                7
            } else {
                0
            }
        }
        Err(e) => {
            let hint = if e.kind() == ErrorKind::Timeout && s.timeout.is_some() {
                " (-T/--timeout)"
            } else {
                ""
            };
            eprintln!("oxccl perf: rank {rank}: {} failed: {e}{hint}", r.ctx);
            r.comm.abort();
            1
        }
    }
}

impl Runner<'_> {
    /// One library call (a group of `ops`), visible to the watchdog.
    fn call(&self, ops: &[OpDesc]) -> Result<(), Error> {
        self.act.begin(self.slot);
        // SAFETY: every pointer in `ops` comes from `Bufs` vectors that this
        // rank owns, that nothing else touches during the call, and that are
        // sized (by `alloc`) for the largest counts of the sweep; see `descs`.
        let r = unsafe { oxccl::raw::run(&self.comm, ops) };
        self.act.end(self.slot);
        r
    }

    /// A barrier: an all-reduce of one element.
    fn barrier(&self) -> Result<(), Error> {
        let mut x = [0f32];
        self.act.begin(self.slot);
        let r = self.comm.all_reduce_in_place(&mut x, RedOp::Sum);
        self.act.end(self.slot);
        r
    }

    fn meta(&self) -> Meta {
        Meta {
            backend: "cpu",
            machine: format!(
                "{} x{}",
                common::cpu_model(),
                std::thread::available_parallelism().map_or(1, |n| n.get())
            ),
            library: "oxccl".into(),
            library_version: oxccl::VERSION.into(),
            library_path: None,
            launch: common::launch_name(self.s),
            nccl_version: common::OXCCL_NCCL_VERSION_CODE,
        }
    }

    fn run(&mut self, local: usize) -> Result<(), Error> {
        // Who is where, for the rank list.
        self.ctx = "the rank exchange".into();
        let me = RankInfo {
            pid: std::process::id(),
            dev: local as u32,
            host: common::hostname(),
            pci: "cpu".into(),
            name: common::cpu_model(),
        }
        .encode();
        let mut all = vec![0u8; INFO_BYTES * self.n];
        self.act.begin(self.slot);
        let r = self.comm.all_gather(&me, &mut all);
        self.act.end(self.slot);
        r?;
        let ranks: Vec<RankInfo> = all.chunks_exact(INFO_BYTES).map(RankInfo::decode).collect();
        let meta = self.meta();
        if self.report.is_some() {
            common::print_header(self.s, self.n, &meta, &ranks);
        }
        let s = self.s;
        if self.report.is_some() {
            let per_type = s.sizes.len() * s.ops.len().max(1);
            self.progress = super::progress::Progress::on_terminal(per_type * s.types.len());
        }
        for &dt in &s.types {
            let mut bufs = self.alloc(dt);
            // Settle after allocating (and first-touching) the buffers: ranks
            // finish that at different times, and the first size's timing
            // otherwise absorbs the skew (measured: 49 us instead of 3 us for
            // the first 8-byte row with 2 ranks, -w 20).
            for _ in 0..200 {
                self.barrier()?;
            }
            let ops: Vec<Option<RedOp>> = if s.coll.reduces() {
                s.ops.iter().map(|&o| Some(o)).collect()
            } else {
                vec![None]
            };
            for op in ops {
                for &root in &s.roots {
                    self.root = root;
                    let mut cycle = 0;
                    while s.cycles == 0 || cycle < s.cycles {
                        cycle += 1;
                        for &bytes in &s.sizes {
                            if let Some(p) = self.progress.as_mut() {
                                p.start_case(bytes);
                            }
                            let r = self.case(dt, op, bytes, &mut bufs);
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
        }
        if let Some(p) = self.progress.take() {
            p.clear();
        }
        if let Some(rep) = &self.report {
            rep.finish(s, self.n, &meta, &ranks, self.errors)?;
        }
        Ok(())
    }

    fn alloc(&self, dt: DataType) -> Bufs {
        let es = dt.size();
        let (mut send, mut slot) = (0usize, 0usize);
        for &b in &self.s.sizes {
            let c = self.s.coll.counts(b, es, self.n);
            send = send.max(c.send);
            slot = slot.max(c.recv).max(c.send);
        }
        let nslots = if self.s.coll.groups_agg() {
            self.s.agg as usize
        } else {
            1
        };
        // -u: every buffer starts `unalign` elements past its allocation.
        let pad = self.s.unalign * es;
        Bufs {
            send: vec![0u8; send * es + pad],
            slots: (0..nslots).map(|_| vec![0u8; slot * es + pad]).collect(),
        }
    }

    /// The operation(s) of one call (see [`common::descs`]).
    #[allow(clippy::too_many_arguments)]
    fn descs(
        &self,
        in_place: bool,
        dt: DataType,
        op: RedOp,
        c: Counts,
        send: *mut u8,
        buf: *mut u8,
    ) -> Vec<OpDesc> {
        // -u: the operations start `unalign` elements into each buffer.
        let pad = self.s.unalign * dt.size();
        common::descs(
            self.s,
            self.root,
            self.rank,
            self.n,
            in_place,
            dt,
            op,
            c,
            send.wrapping_add(pad),
            buf.wrapping_add(pad),
        )
    }

    /// Writes inputs made by `g` (and poison where results go) into the send
    /// buffer and the first `nslots` slots.
    fn fill(&self, in_place: bool, g: &Gen, c: Counts, bufs: &mut Bufs, nslots: usize) {
        let pad = self.s.unalign * g.dt.size();
        for b in &mut bufs.slots[..nslots] {
            common::fill(
                self.s.coll,
                self.rank,
                self.n,
                in_place,
                g,
                c,
                &mut bufs.send[pad..],
                &mut b[pad..],
            );
        }
    }

    /// Wrong elements of this rank's result in `buf`.
    fn verify(&self, in_place: bool, g: &Gen, c: Counts, buf: &[u8]) -> u64 {
        let pad = self.s.unalign * g.dt.size();
        common::verify(
            self.s.coll,
            self.root,
            self.rank,
            self.n,
            in_place,
            g,
            c,
            &buf[pad..],
        )
    }

    /// Times and checks one half; returns (seconds per operation, wrong
    /// elements here, `-I`: seconds of each iteration).
    fn half(
        &mut self,
        in_place: bool,
        dt: DataType,
        op: Option<RedOp>,
        c: Counts,
        bufs: &mut Bufs,
    ) -> Result<(f64, u64, Vec<f64>), Error> {
        let s = self.s;
        let red = op.unwrap_or(RedOp::Sum);
        let agg = s.agg as usize;
        let nslots = bufs.slots.len();
        self.fill(in_place, &Gen::new(dt, op, self.n, 0), c, bufs, nslots);
        // The calls of one iteration.
        let send = bufs.send.as_mut_ptr();
        let calls: Vec<Vec<OpDesc>> = if nslots > 1 {
            vec![bufs
                .slots
                .iter_mut()
                .flat_map(|b| self.descs(in_place, dt, red, c, send, b.as_mut_ptr()))
                .collect()]
        } else {
            let d = self.descs(in_place, dt, red, c, send, bufs.slots[0].as_mut_ptr());
            vec![d; agg]
        };
        for _ in 0..s.warmup {
            for call in &calls {
                self.call(call)?;
            }
        }
        self.barrier()?;
        let mut per_iter = Vec::with_capacity(if s.per_iter { s.iters as usize } else { 0 });
        let t0 = Instant::now();
        for _ in 0..s.iters {
            let ti = Instant::now();
            for call in &calls {
                self.call(call)?;
            }
            if s.per_iter {
                per_iter.push(ti.elapsed().as_secs_f64());
            }
        }
        let secs = t0.elapsed().as_secs_f64() / (s.iters * s.agg) as f64;
        if self.abort_after_timing {
            eprintln!(
                "oxccl perf: rank {}: OXCCL_PERF_TEST_ABORT_RANK: aborting",
                self.rank
            );
            std::process::abort();
        }
        let mut wrong = 0;
        for k in 0..s.check {
            let g = Gen::new(dt, op, self.n, k + 1);
            self.fill(in_place, &g, c, bufs, 1);
            let send = bufs.send.as_mut_ptr();
            let d = self.descs(in_place, dt, red, c, send, bufs.slots[0].as_mut_ptr());
            self.call(&d)?;
            if self.corrupt && c.param > 0 {
                bufs.slots[0][s.unalign * dt.size()] ^= 1;
            }
            wrong += self.verify(in_place, &g, c, &bufs.slots[0]);
        }
        Ok((secs, wrong, per_iter))
    }

    /// `--compare`: times the other library on the out-of-place case (same
    /// buffers, warm-up and iterations) and checks one iteration; returns
    /// (seconds per operation, wrong elements here or None unchecked).
    fn cmp_half(
        &mut self,
        dt: DataType,
        op: Option<RedOp>,
        c: Counts,
        bufs: &mut Bufs,
    ) -> Result<(f64, Option<u64>), Error> {
        let s = self.s;
        let red = op.unwrap_or(RedOp::Sum);
        let agg = s.agg as usize;
        let nslots = bufs.slots.len();
        self.fill(false, &Gen::new(dt, op, self.n, 0), c, bufs, nslots);
        let send = bufs.send.as_mut_ptr();
        let calls: Vec<Vec<OpDesc>> = if nslots > 1 {
            vec![bufs
                .slots
                .iter_mut()
                .flat_map(|b| self.descs(false, dt, red, c, send, b.as_mut_ptr()))
                .collect()]
        } else {
            let d = self.descs(false, dt, red, c, send, bufs.slots[0].as_mut_ptr());
            vec![d; agg]
        };
        let cmp = self.cmp.as_ref().expect("--compare communicator");
        let run = |ops: &[OpDesc]| -> Result<(), Error> {
            self.act.begin(self.slot);
            // SAFETY: as in `call`: the pointers come from this rank's `Bufs`,
            // sized by `alloc` for the sweep's largest counts.
            let r = unsafe { cmp.run(ops) };
            self.act.end(self.slot);
            r.map_err(|e| Error::new(ErrorKind::Remote, format!("--compare library: {e}")))
        };
        for _ in 0..s.warmup {
            for call in &calls {
                run(call)?;
            }
        }
        self.barrier()?;
        let t0 = Instant::now();
        for _ in 0..s.iters {
            for call in &calls {
                run(call)?;
            }
        }
        let secs = t0.elapsed().as_secs_f64() / (s.iters * s.agg) as f64;
        if s.check == 0 {
            return Ok((secs, None));
        }
        let g = Gen::new(dt, op, self.n, 1);
        self.fill(false, &g, c, bufs, 1);
        let send = bufs.send.as_mut_ptr();
        let d = self.descs(false, dt, red, c, send, bufs.slots[0].as_mut_ptr());
        run(&d)?;
        Ok((secs, Some(self.verify(false, &g, c, &bufs.slots[0]))))
    }

    fn case(
        &mut self,
        dt: DataType,
        op: Option<RedOp>,
        bytes: u64,
        bufs: &mut Bufs,
    ) -> Result<(), Error> {
        let s = self.s;
        let coll = s.coll;
        let es = dt.size();
        let c = coll.counts(bytes, es, self.n);
        let opname = op.map_or("none", |o| o.name());
        self.ctx = format!(
            "{} of {} B ({} {}, out-of-place)",
            coll.name(),
            bytes,
            dt.name(),
            opname
        );
        let oop = self.half(false, dt, op, c, bufs)?;
        let cmp = if self.cmp.is_some() {
            self.ctx = self
                .ctx
                .replace("out-of-place", "out-of-place, --compare library");
            let r = self.cmp_half(dt, op, c, bufs)?;
            self.ctx = self.ctx.replace(", --compare library", "");
            Some(r)
        } else {
            None
        };
        let ip = if coll.has_in_place() {
            self.ctx = self.ctx.replace("out-of-place", "in-place");
            Some(self.half(true, dt, op, c, bufs)?)
        } else {
            None
        };
        self.ctx = format!("{} of {} B (collecting results)", coll.name(), bytes);
        let mut wrong = [
            oop.1,
            ip.as_ref().map_or(0, |x| x.1),
            cmp.and_then(|x| x.1).unwrap_or(0),
        ];
        self.act.begin(self.slot);
        let r = self.comm.all_reduce_in_place(&mut wrong, RedOp::Sum);
        self.act.end(self.slot);
        r?;
        let mine = [
            oop.0,
            ip.as_ref().map_or(0.0, |x| x.0),
            cmp.map_or(0.0, |x| x.0),
        ];
        let mut all = vec![0f64; 3 * self.n];
        self.act.begin(self.slot);
        let r = self.comm.all_gather(&mine, &mut all);
        self.act.end(self.slot);
        r?;
        let column = |k: usize| all.iter().skip(k).step_by(3).copied().collect::<Vec<_>>();
        // -I: per iteration, the slowest rank (out-of-place, in-place).
        let slowest = if s.per_iter {
            let it = s.iters as usize;
            let mut mine = oop.2.clone();
            mine.extend(ip.as_ref().map_or_else(|| vec![0.0; it], |x| x.2.clone()));
            let mut every = vec![0f64; 2 * it * self.n];
            self.act.begin(self.slot);
            let r = self.comm.all_gather(&mine, &mut every);
            self.act.end(self.slot);
            r?;
            let max_of = |half: usize| -> Vec<f64> {
                (0..it)
                    .map(|i| {
                        every
                            .chunks_exact(2 * it)
                            .map(|w| w[half * it + i])
                            .fold(0.0, f64::max)
                    })
                    .collect()
            };
            Some([max_of(0), max_of(1)])
        } else {
            None
        };
        self.errors += usize::from(wrong[0] > 0) + usize::from(ip.is_some() && wrong[1] > 0);
        let root = self.root;
        let Some(rep) = self.report.as_mut() else {
            return Ok(());
        };
        let (t_oop, t_ip, t_cmp) = (column(0), column(1), column(2));
        let per_iter = match &slowest {
            Some([o, i]) => [Some(o.as_slice()), ip.as_ref().map(|_| i.as_slice())],
            None => [None, None],
        };
        let line = Line {
            dt,
            opname,
            c,
            oop: &t_oop,
            ip: ip.map(|_| t_ip.as_slice()),
            cmp: cmp.map(|_| t_cmp.as_slice()),
            wrong,
            root,
            per_iter,
        };
        rep.line(s, self.n, &line, self.progress.as_ref());
        Ok(())
    }
}
