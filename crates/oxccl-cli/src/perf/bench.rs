//! One rank's benchmark: per data type, op and size, warm-up, a barrier,
//! timed iterations, checked iterations; out-of-place then in-place. Rank 0
//! prints the table and writes the JSON file.
//!
//! Test hooks (not in `--help`): `OXCCL_PERF_TEST_ABORT_RANK=<rank>` makes that
//! rank call `abort()` after its first timed loop, to exercise the launcher's
//! handling of a dying rank; `OXCCL_PERF_TEST_CORRUPT_RANK=<rank>` makes that
//! rank flip a bit of its first result element before each check, to exercise
//! the failure path (`#wrong`, FAILED, exit status 7).

use super::coll::{Coll, Counts};
use super::compare::CmpComm;
use super::data::{self, encode, Gen};
use super::fmt::{self, Half};
use super::{Launch, Settings};
use oxccl::{CollKind, Communicator, Config, DataType, Error, ErrorKind, OpDesc, RedOp, UniqueId};
use serde_json::{json, Value};
use std::io::Write;
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
    fn begin(&self, slot: usize) {
        let ms = self.epoch.elapsed().as_millis() as u64 + 1;
        self.busy[slot].store(ms, Ordering::Relaxed);
    }
    fn end(&self, slot: usize) {
        self.busy[slot].store(0, Ordering::Relaxed);
    }
    fn register(&self, slot: usize, rank: usize, c: &Communicator) {
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

/// Rank 0's accumulated output.
#[derive(Default)]
struct Report {
    results: Vec<Value>,
    bw_sum: f64,
    bw_count: usize,
}

struct Runner<'a> {
    s: &'a Settings,
    act: &'a Activity,
    slot: usize,
    comm: Communicator,
    rank: usize,
    n: usize,
    report: Option<Report>,
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
        report: (rank == 0).then(Report::default),
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

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "host".into())
}

const INFO_BYTES: usize = 64;

impl Runner<'_> {
    /// One library call (a group of `ops`), visible to the watchdog.
    fn call(&self, ops: &[OpDesc]) -> Result<(), Error> {
        self.act.begin(self.slot);
        // SAFETY: every pointer in `ops` comes from `Bufs` vectors that this
        // rank owns, that nothing else touches during the call, and that are
        // sized (by `alloc`) for the largest counts of the sweep; see `descs`.
        let r = unsafe { self.comm.run_raw(ops) };
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

    fn run(&mut self, local: usize) -> Result<(), Error> {
        // Who is where, for the rank list.
        self.ctx = "the rank exchange".into();
        let mut me = [0u8; INFO_BYTES];
        me[..4].copy_from_slice(&std::process::id().to_le_bytes());
        me[4..8].copy_from_slice(&(local as u32).to_le_bytes());
        let h = hostname();
        let hb = h.as_bytes();
        let hl = hb.len().min(INFO_BYTES - 8);
        me[8..8 + hl].copy_from_slice(&hb[..hl]);
        let mut all = vec![0u8; INFO_BYTES * self.n];
        self.act.begin(self.slot);
        let r = self.comm.all_gather(&me, &mut all);
        self.act.end(self.slot);
        r?;
        let ranks: Vec<(u32, u32, String)> = all
            .chunks_exact(INFO_BYTES)
            .map(|c| {
                let pid = u32::from_le_bytes(c[..4].try_into().expect("4"));
                let dev = u32::from_le_bytes(c[4..8].try_into().expect("4"));
                let end = c[8..]
                    .iter()
                    .position(|&b| b == 0)
                    .unwrap_or(INFO_BYTES - 8);
                (
                    pid,
                    dev,
                    String::from_utf8_lossy(&c[8..8 + end]).into_owned(),
                )
            })
            .collect();
        if self.report.is_some() {
            self.print_header(&ranks);
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
        if let Some(p) = self.progress.take() {
            p.clear();
        }
        if let Some(rep) = &self.report {
            let avg = if rep.bw_count > 0 {
                rep.bw_sum / rep.bw_count as f64
            } else {
                0.0
            };
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "{}", fmt::footer(self.errors, avg));
            let _ = writeln!(out);
            let _ = out.flush();
            if let Some(path) = &s.json {
                let doc = self.json_doc(&ranks, avg);
                let text = serde_json::to_string_pretty(&doc).expect("JSON of plain values");
                if let Err(e) = std::fs::write(path, text + "\n") {
                    eprintln!(
                        "oxccl perf: -J/--output_file {}: cannot be written ({e})",
                        path.display()
                    );
                    return Err(Error::new(
                        ErrorKind::System,
                        format!("writing {}: {e}", path.display()),
                    ));
                }
            }
        }
        Ok(())
    }

    fn launch_name(&self) -> String {
        match &self.s.launch {
            Launch::Process => "process".into(),
            Launch::Thread => "thread".into(),
            Launch::External(e) => format!("external ({})", e.launcher),
        }
    }

    fn print_header(&self, ranks: &[(u32, u32, String)]) {
        let s = self.s;
        let mut o = String::new();
        o += &format!(
            "# oxccl perf version {} (nccl-tests output format) backend cpu\n",
            oxccl::VERSION
        );
        o += &format!("# Collective test starting: {}\n", s.coll.name());
        let step = if s.stepfactor > 1 {
            format!("{}(factor)", s.stepfactor)
        } else {
            format!("{}(bytes)", s.stepbytes)
        };
        o += &format!(
            "# nThread {} nGpus 1 minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} agg iters: {} validation: {} graph: 0\n",
            s.threads, s.minbytes, s.maxbytes, step, s.warmup, s.iters, s.agg, s.check
        );
        o += &format!("# nRanks {} launch {}\n", self.n, self.launch_name());
        o += "#\n# Using devices\n";
        let model = cpu_model();
        for (r, (pid, dev, host)) in ranks.iter().enumerate() {
            o += &format!(
                "#  Rank {r:2} Group {:2} Pid {pid:6} on {host:>10} device {dev:2} [cpu] {model}\n",
                0
            );
        }
        o += "#\n";
        let extra = s.compare.as_ref().map(|l| fmt::compare_header(&l.label()));
        for (i, l) in fmt::column_header().iter().enumerate() {
            o += l;
            if let Some(x) = &extra {
                o += &x[i];
            }
            o.push('\n');
        }
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(o.as_bytes());
        let _ = out.flush();
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
        Bufs {
            send: vec![0u8; send * es],
            slots: (0..nslots).map(|_| vec![0u8; slot * es]).collect(),
        }
    }

    /// The operation(s) of one call: `send` is the out-of-place input, `buf`
    /// the output (out-of-place) or the only buffer (in-place), each sized for
    /// `c` by `alloc`.
    fn descs(
        &self,
        in_place: bool,
        dt: DataType,
        op: RedOp,
        c: Counts,
        send: *mut u8,
        buf: *mut u8,
    ) -> Vec<OpDesc> {
        let (r, n, p, es) = (self.rank, self.n, c.param, dt.size());
        let coll = self.s.coll;
        let root = if coll.rooted() { self.s.root } else { 0 };
        let op = if coll.reduces() { op } else { RedOp::Sum };
        let one = |send: *const u8, recv: *mut u8| OpDesc {
            kind: coll.kind(),
            send,
            recv,
            count: p,
            dtype: dt,
            op,
            root,
        };
        let block = |k: usize| buf.wrapping_add(k * p * es);
        match (coll, in_place) {
            (Coll::SendRecv, _) => vec![
                OpDesc {
                    kind: CollKind::Send,
                    send,
                    recv: std::ptr::null_mut(),
                    count: p,
                    dtype: dt,
                    op,
                    root: (r + 1) % n,
                },
                OpDesc {
                    kind: CollKind::Recv,
                    send: std::ptr::null(),
                    recv: buf,
                    count: p,
                    dtype: dt,
                    op,
                    root: (r + n - 1) % n,
                },
            ],
            (Coll::AllGather | Coll::Gather, true) => vec![one(block(r), buf)],
            (Coll::ReduceScatter | Coll::Scatter, true) => vec![one(buf, block(r))],
            (_, true) => vec![one(buf, buf)],
            (_, false) => vec![one(send, buf)],
        }
    }

    /// Writes inputs made by `g` (and poison where results go) into the send
    /// buffer and the first `nslots` slots.
    fn fill(&self, in_place: bool, g: &Gen, c: Counts, bufs: &mut Bufs, nslots: usize) {
        let (dt, r, n, p) = (g.dt, self.rank, self.n, c.param);
        let input = |k: usize| encode(dt, g.value(r, k));
        if in_place {
            for b in &mut bufs.slots[..nslots] {
                data::write_poison(b, dt, 0, c.send.max(c.recv));
                match self.s.coll {
                    Coll::AllGather | Coll::Gather => data::write(b, dt, r * p, p, input),
                    Coll::ReduceScatter | Coll::Scatter => data::write(b, dt, 0, p * n, input),
                    _ => data::write(b, dt, 0, p, input),
                }
            }
        } else {
            data::write(&mut bufs.send, dt, 0, c.send, input);
            for b in &mut bufs.slots[..nslots] {
                data::write_poison(b, dt, 0, c.recv);
            }
        }
    }

    /// Wrong elements of this rank's result in `buf`.
    fn verify(&self, in_place: bool, g: &Gen, c: Counts, buf: &[u8]) -> u64 {
        let (dt, r, n, p, root) = (g.dt, self.rank, self.n, c.param, self.s.root);
        let tol = g.tolerance();
        let e = |v: i64| encode(dt, v);
        let base = if in_place { r * p } else { 0 };
        match self.s.coll {
            Coll::AllReduce => data::count_wrong(buf, dt, 0, p, tol, |k| e(g.reduced(k))),
            Coll::Reduce if r == root => data::count_wrong(buf, dt, 0, p, tol, |k| e(g.reduced(k))),
            Coll::Broadcast => data::count_wrong(buf, dt, 0, p, 0, |k| e(g.value(root, k))),
            Coll::AllGather => (0..n)
                .map(|q| data::count_wrong(buf, dt, q * p, p, 0, |k| e(g.value(q, k))))
                .sum(),
            Coll::Gather if r == root => (0..n)
                .map(|q| data::count_wrong(buf, dt, q * p, p, 0, |k| e(g.value(q, k))))
                .sum(),
            Coll::ReduceScatter => {
                data::count_wrong(buf, dt, base, p, tol, |k| e(g.reduced(r * p + k)))
            }
            Coll::AllToAll => (0..n)
                .map(|q| data::count_wrong(buf, dt, q * p, p, 0, |k| e(g.value(q, r * p + k))))
                .sum(),
            Coll::Scatter => {
                data::count_wrong(buf, dt, base, p, 0, |k| e(g.value(root, r * p + k)))
            }
            Coll::SendRecv => {
                data::count_wrong(buf, dt, 0, p, 0, |k| e(g.value((r + n - 1) % n, k)))
            }
            Coll::Reduce | Coll::Gather => 0,
        }
    }

    /// Times and checks one half; returns (seconds per operation, wrong elements here).
    fn half(
        &mut self,
        in_place: bool,
        dt: DataType,
        op: Option<RedOp>,
        c: Counts,
        bufs: &mut Bufs,
    ) -> Result<(f64, u64), Error> {
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
        let t0 = Instant::now();
        for _ in 0..s.iters {
            for call in &calls {
                self.call(call)?;
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
                bufs.slots[0][0] ^= 1;
            }
            wrong += self.verify(in_place, &g, c, &bufs.slots[0]);
        }
        Ok((secs, wrong))
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

    fn combine(&self, times: &[f64]) -> f64 {
        match self.s.average {
            0 => times[0],
            2 => times.iter().copied().fold(f64::INFINITY, f64::min),
            3 => times.iter().copied().fold(0.0, f64::max),
            _ => times.iter().sum::<f64>() / times.len() as f64,
        }
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
            ip.map_or(0, |x| x.1),
            cmp.and_then(|x| x.1).unwrap_or(0),
        ];
        self.act.begin(self.slot);
        let r = self.comm.all_reduce_in_place(&mut wrong, RedOp::Sum);
        self.act.end(self.slot);
        r?;
        let mine = [oop.0, ip.map_or(0.0, |x| x.0), cmp.map_or(0.0, |x| x.0)];
        let mut all = vec![0f64; 3 * self.n];
        self.act.begin(self.slot);
        let r = self.comm.all_gather(&mine, &mut all);
        self.act.end(self.slot);
        r?;
        let column = |k: usize| all.iter().skip(k).step_by(3).copied().collect::<Vec<_>>();
        let t_oop = self.combine(&column(0));
        let t_ip = self.combine(&column(1));
        let t_cmp = self.combine(&column(2));
        let checked = s.check > 0;
        self.errors += usize::from(wrong[0] > 0) + usize::from(ip.is_some() && wrong[1] > 0);
        let Some(rep) = self.report.as_mut() else {
            return Ok(());
        };
        let alg = coll.alg_bytes(c.param, es, self.n);
        let factor = coll.bus_factor(self.n);
        let mk = |t: f64, w: u64| {
            let algbw = if t > 0.0 { alg / 1e9 / t } else { 0.0 };
            Half {
                time_us: t * 1e6,
                algbw,
                busbw: algbw * factor,
                wrong: checked.then_some(w),
            }
        };
        let h_oop = mk(t_oop, wrong[0]);
        let h_ip = ip.map(|_| mk(t_ip, wrong[1]));
        let size = (c.send.max(c.recv) * es) as u64;
        let root: i64 = if coll.rooted() { s.root as i64 } else { -1 };
        let h_cmp = cmp.map(|_| mk(t_cmp, wrong[2]));
        let ratio = if h_oop.time_us > 0.0 {
            t_cmp * 1e6 / h_oop.time_us
        } else {
            0.0
        };
        let mut line = fmt::data_line(
            size,
            c.param,
            dt.name(),
            opname,
            root,
            &h_oop,
            h_ip.as_ref(),
        );
        if let Some(h) = &h_cmp {
            line += &fmt::compare_cells(h, ratio);
        }
        if let Some(p) = &self.progress {
            p.clear();
        }
        {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
        rep.bw_sum += h_oop.busbw;
        rep.bw_count += 1;
        if let Some(h) = &h_ip {
            rep.bw_sum += h.busbw;
            rep.bw_count += 1;
        }
        let half_json = |h: &Half| {
            json!({
                "time_us": h.time_us,
                "algbw_gbps": h.algbw,
                "busbw_gbps": h.busbw,
                "wrong": h.wrong,
            })
        };
        rep.results.push(json!({
            "size": size,
            "count": c.param,
            "type": dt.name(),
            "redop": opname,
            "root": root,
            "out_of_place": half_json(&h_oop),
            "in_place": h_ip.as_ref().map(half_json),
        }));
        if let (Some(h), Some(last)) = (&h_cmp, rep.results.last_mut()) {
            let mut v = half_json(h);
            v["ratio"] = json!(ratio);
            last["compare"] = v;
        }
        Ok(())
    }

    fn json_doc(&self, ranks: &[(u32, u32, String)], avg: f64) -> Value {
        let s = self.s;
        let rep = self.report.as_ref().expect("rank 0");
        let hosts = {
            let mut h: Vec<&str> = ranks.iter().map(|r| r.2.as_str()).collect();
            h.sort_unstable();
            h.dedup();
            h.len()
        };
        json!({
            "tool": "oxccl perf",
            "oxccl_version": oxccl::VERSION,
            "library": "oxccl",
            "library_version": oxccl::VERSION,
            "collective": s.coll.name(),
            "backend": "cpu",
            "host": ranks.first().map_or_else(hostname, |r| r.2.clone()),
            "hosts": hosts,
            "compare": s.compare.as_ref().map(|l| json!({
                "path": l.path.display().to_string(),
                "library": l.label(),
                "nccl_version": super::compare::version_string(l.version),
                "version_code": l.version,
            })),
            "machine": format!("{} x{}", cpu_model(),
                std::thread::available_parallelism().map_or(1, |n| n.get())),
            "config": {
                "nranks": self.n,
                "nthreads": s.threads,
                "launch": self.launch_name(),
                "minbytes": s.minbytes,
                "maxbytes": s.maxbytes,
                "stepbytes": s.stepbytes,
                "stepfactor": s.stepfactor,
                "iters": s.iters,
                "warmup_iters": s.warmup,
                "agg_iters": s.agg,
                "check": s.check,
                "average": s.average,
                "blocking": s.blocking,
                "root": s.coll.rooted().then_some(s.root),
                "ops": s.ops.iter().map(|o| o.name()).collect::<Vec<_>>(),
                "datatypes": s.types.iter().map(|t| t.name()).collect::<Vec<_>>(),
                "timeout_s": s.timeout.map(|t| t.as_secs()),
            },
            "ranks": ranks.iter().enumerate().map(|(r, (pid, dev, host))| json!({
                "rank": r, "group": 0, "pid": pid, "host": host, "device": dev,
            })).collect::<Vec<_>>(),
            "results": rep.results,
            "out_of_bounds": self.errors,
            "avg_busbw_gbps": avg,
            "ok": self.errors == 0,
        })
    }
}
