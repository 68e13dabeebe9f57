//! What the CPU ([`super::bench`]) and CUDA ([`super::gpu`]) backends share:
//! the operations of one call, the check data written into a rank's buffers
//! and the check of its results, the rank list, the table header, one table
//! line per size, and the JSON document.

use super::coll::{Coll, Counts};
use super::data::{self, encode, Gen};
use super::fmt::{self, Half};
use super::progress::Progress;
use super::stats::iter_stats;
use super::Settings;
use oxccl::raw::OpDesc;
use oxccl::{CollKind, DataType, Error, ErrorKind, RedOp};
use serde_json::{json, Value};
use std::io::Write;

/// Bytes of one rank's [`RankInfo`] in the rank exchange.
pub const INFO_BYTES: usize = 256;
const HOST_BYTES: usize = 64;
const PCI_BYTES: usize = 32;

/// Who a rank is and where it runs, for the header and the JSON file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankInfo {
    pub pid: u32,
    /// GPU ordinal (CUDA) or local rank (CPU).
    pub dev: u32,
    pub host: String,
    /// `0000:18:00` for a GPU, `cpu` for host ranks.
    pub pci: String,
    /// GPU name or CPU model.
    pub name: String,
}

fn put(dst: &mut [u8], s: &str) {
    let b = s.as_bytes();
    let n = b.len().min(dst.len() - 1);
    dst[..n].copy_from_slice(&b[..n]);
}

fn get(src: &[u8]) -> String {
    let end = src.iter().position(|&b| b == 0).unwrap_or(src.len());
    String::from_utf8_lossy(&src[..end]).into_owned()
}

impl RankInfo {
    pub fn encode(&self) -> [u8; INFO_BYTES] {
        let mut b = [0u8; INFO_BYTES];
        b[..4].copy_from_slice(&self.pid.to_le_bytes());
        b[4..8].copy_from_slice(&self.dev.to_le_bytes());
        let (h, rest) = b[8..].split_at_mut(HOST_BYTES);
        put(h, &self.host);
        let (p, n) = rest.split_at_mut(PCI_BYTES);
        put(p, &self.pci);
        put(n, &self.name);
        b
    }

    pub fn decode(b: &[u8]) -> RankInfo {
        let u = |r: std::ops::Range<usize>| u32::from_le_bytes(b[r].try_into().expect("4 bytes"));
        RankInfo {
            pid: u(0..4),
            dev: u(4..8),
            host: get(&b[8..8 + HOST_BYTES]),
            pci: get(&b[8 + HOST_BYTES..8 + HOST_BYTES + PCI_BYTES]),
            name: get(&b[8 + HOST_BYTES + PCI_BYTES..INFO_BYTES]),
        }
    }
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

pub fn cpu_model() -> String {
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

/// The operation(s) of one call of global rank `r` of `n`: `send` is the
/// out-of-place input, `buf` the output (out-of-place) or the only buffer
/// (in-place), each sized for `c`. The pointers may be device addresses:
/// they are only carried, never dereferenced here.
#[allow(clippy::too_many_arguments)]
pub fn descs(
    s: &Settings,
    root: usize,
    r: usize,
    n: usize,
    in_place: bool,
    dt: DataType,
    op: RedOp,
    c: Counts,
    send: *mut u8,
    buf: *mut u8,
) -> Vec<OpDesc> {
    let (p, es) = (c.param, dt.size());
    let coll = s.coll;
    let root = if coll.rooted() { root } else { 0 };
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

/// Writes rank `r`'s inputs made by `g` into `send` (out-of-place) or `slot`
/// (in-place), and poison where results go in `slot`.
#[allow(clippy::too_many_arguments)]
pub fn fill(
    coll: Coll,
    r: usize,
    n: usize,
    in_place: bool,
    g: &Gen,
    c: Counts,
    send: &mut [u8],
    slot: &mut [u8],
) {
    let (dt, p) = (g.dt, c.param);
    let input = |k: usize| encode(dt, g.value(r, k));
    if in_place {
        data::write_poison(slot, dt, 0, c.send.max(c.recv));
        match coll {
            Coll::AllGather | Coll::Gather => data::write(slot, dt, r * p, p, input),
            Coll::ReduceScatter | Coll::Scatter => data::write(slot, dt, 0, p * n, input),
            _ => data::write(slot, dt, 0, p, input),
        }
    } else {
        data::write(send, dt, 0, c.send, input);
        data::write_poison(slot, dt, 0, c.recv);
    }
}

/// Wrong elements of rank `r`'s result in `buf`.
#[allow(clippy::too_many_arguments)]
pub fn verify(
    coll: Coll,
    root: usize,
    r: usize,
    n: usize,
    in_place: bool,
    g: &Gen,
    c: Counts,
    buf: &[u8],
) -> u64 {
    let (dt, p) = (g.dt, c.param);
    let tol = g.tolerance();
    let e = |v: i64| encode(dt, v);
    let base = if in_place { r * p } else { 0 };
    match coll {
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
        Coll::Scatter => data::count_wrong(buf, dt, base, p, 0, |k| e(g.value(root, r * p + k))),
        Coll::SendRecv => data::count_wrong(buf, dt, 0, p, 0, |k| e(g.value((r + n - 1) % n, k))),
        Coll::Reduce | Coll::Gather => 0,
    }
}

/// Per-rank times combined as `-a` says.
pub fn combine(average: u8, times: &[f64]) -> f64 {
    match average {
        0 => times[0],
        2 => times.iter().copied().fold(f64::INFINITY, f64::min),
        3 => times.iter().copied().fold(0.0, f64::max),
        _ => times.iter().sum::<f64>() / times.len() as f64,
    }
}

/// What the run is, for the header and the JSON file.
#[derive(Clone, Debug)]
pub struct Meta {
    /// `cpu` or `cuda`.
    pub backend: &'static str,
    /// CPU model and cores, or the GPUs (`2 x NVIDIA H200`).
    pub machine: String,
    /// The measured library: `oxccl` (host API) or the loaded file's name.
    pub library: String,
    pub library_version: String,
    /// The measured library's file (CUDA backend).
    pub library_path: Option<String>,
    pub launch: String,
    /// `ncclGetVersion`'s code of the measured library (oxccl's C API: 22705).
    pub nccl_version: i64,
}

/// `ncclGetVersion`'s code oxccl's `libnccl.so.2` reports (NCCL 2.27.5's ABI).
pub const OXCCL_NCCL_VERSION_CODE: i64 = 22705;

/// The local time as nccl-tests prints it (`%Y-%m-%d %H:%M:%S`).
pub fn local_time() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as libc::time_t;
    // SAFETY: `tm` is a plain C struct that zeroed bytes initialise validly.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live locals; localtime_r (the reentrant
    // form) writes only into `tm`.
    let ok = !unsafe { libc::localtime_r(&now, &mut tm) }.is_null();
    if !ok {
        return "1970-01-01 00:00:00".into();
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// Rank 0's accumulated output.
#[derive(Default)]
pub struct Report {
    pub results: Vec<Value>,
    pub bw_sum: f64,
    pub bw_count: usize,
    /// `start_time` of the JSON document.
    pub start_time: String,
}

/// The numbers of one table line, over all ranks: per-rank seconds per
/// operation (out-of-place, in-place when the collective has it, the
/// `--compare` library when there is one) and wrong elements (out-of-place,
/// in-place, compare; `None` for the compare's when it was not checked).
pub struct Line<'a> {
    pub dt: DataType,
    pub opname: &'a str,
    pub c: Counts,
    pub oop: &'a [f64],
    pub ip: Option<&'a [f64]>,
    pub cmp: Option<&'a [f64]>,
    pub wrong: [u64; 3],
    /// The root of this line (rooted collectives).
    pub root: usize,
    /// `-I`: per iteration, the slowest rank's seconds (out-of-place, in-place).
    pub per_iter: [Option<&'a [f64]>; 2],
}

impl Report {
    /// An empty report whose run starts now.
    pub fn new() -> Report {
        Report {
            start_time: local_time(),
            ..Report::default()
        }
    }

    /// Prints one table line (erasing the progress bar first) and records it.
    pub fn line(&mut self, s: &Settings, n: usize, l: &Line<'_>, progress: Option<&Progress>) {
        let coll = s.coll;
        let es = l.dt.size();
        let checked = s.check > 0;
        let alg = coll.alg_bytes(l.c.param, es, n);
        let factor = coll.bus_factor(n);
        let mk = |t: f64, w: u64| {
            let algbw = if t > 0.0 { alg / 1e9 / t } else { 0.0 };
            Half {
                time_us: t * 1e6,
                algbw,
                busbw: algbw * factor,
                wrong: checked.then_some(w),
            }
        };
        let t_oop = combine(s.average, l.oop);
        let h_oop = mk(t_oop, l.wrong[0]);
        let h_ip = l.ip.map(|t| mk(combine(s.average, t), l.wrong[1]));
        let size = (l.c.send.max(l.c.recv) * es) as u64;
        let root: i64 = if coll.rooted() { l.root as i64 } else { -1 };
        let stats = l
            .per_iter
            .map(|t| t.map(|t| iter_stats(&t[s.per_iter_skip.min(t.len() - 1)..])));
        let t_cmp = l.cmp.map(|t| combine(s.average, t));
        let h_cmp = t_cmp.map(|t| mk(t, l.wrong[2]));
        let ratio = match t_cmp {
            Some(t) if h_oop.time_us > 0.0 => t * 1e6 / h_oop.time_us,
            _ => 0.0,
        };
        let mut text = fmt::line_start(size, l.c.param, l.dt.name(), l.opname, root);
        text += &fmt::half_cells(Some(&h_oop));
        if s.per_iter {
            text += &fmt::iter_cells(stats[0].as_ref());
        }
        text += &fmt::half_cells(h_ip.as_ref());
        if s.per_iter {
            text += &fmt::iter_cells(stats[1].as_ref());
        }
        if let Some(h) = &h_cmp {
            text += &fmt::compare_cells(h, ratio);
        }
        if s.timestamps {
            text += &format!("{:>21}", local_time());
        }
        if let Some(p) = progress {
            p.clear();
        }
        {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        }
        self.bw_sum += h_oop.busbw;
        self.bw_count += 1;
        if let Some(h) = &h_ip {
            self.bw_sum += h.busbw;
            self.bw_count += 1;
        }
        let time_key = if s.cputime { "cpu_time" } else { "time" };
        let half_json = |h: &Half| {
            json!({
                time_key: h.time_us,
                "alg_bw": h.algbw,
                "bus_bw": h.busbw,
                "nwrong": h.wrong,
            })
        };
        let mut v = json!({
            "size": size,
            "count": l.c.param,
            "type": l.dt.name(),
            "redop": l.opname,
            "root": format!("{root:6}"),
            "out_of_place": half_json(&h_oop),
            "in_place": h_ip.as_ref().map(half_json),
        });
        let keys = ["out_of_place_per_iter", "in_place_per_iter"];
        for ((key, times), st) in keys.iter().zip(l.per_iter).zip(stats) {
            if let (Some(times), Some(st)) = (times, st) {
                let us = |x: f64| x * 1e6;
                v[*key] = json!({
                    "skipped_iterations": s.per_iter_skip,
                    "min_us": us(st.min),
                    "max_us": us(st.max),
                    "avg_us": us(st.avg),
                    "p50_us": us(st.p50),
                    "p95_us": us(st.p95),
                    "p99_us": us(st.p99),
                    "stdev_us": us(st.stdev),
                    "cv_pct": st.cv_pct,
                    "times_us": times.iter().map(|&x| us(x)).collect::<Vec<_>>(),
                });
            }
        }
        v["actual_iterations"] = json!(s.iters);
        v["experiment_name"] = json!("");
        if let Some(h) = &h_cmp {
            v["compare"] = json!({
                "time_us": h.time_us,
                "alg_bw": h.algbw,
                "bus_bw": h.busbw,
                "nwrong": h.wrong,
                "ratio": ratio,
            });
        }
        self.results.push(v);
    }

    fn avg(&self) -> f64 {
        if self.bw_count > 0 {
            self.bw_sum / self.bw_count as f64
        } else {
            0.0
        }
    }

    /// Prints the footer and writes the JSON file (`-J`).
    pub fn finish(
        &self,
        s: &Settings,
        n: usize,
        meta: &Meta,
        ranks: &[RankInfo],
        errors: usize,
    ) -> Result<(), Error> {
        let avg = self.avg();
        {
            let mut out = std::io::stdout().lock();
            let mut text = fmt::footer(errors, avg);
            if s.memory_report {
                text = text.replacen("#\n", &memory_line(s, meta, n), 1);
            }
            let _ = write!(out, "{text}");
            let _ = writeln!(out);
            let _ = out.flush();
        }
        if let Some(path) = &s.json {
            let doc = json_doc(s, n, meta, ranks, self, errors, avg);
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
        Ok(())
    }
}

/// The header above the table: settings, the rank list, the column heads.
pub fn print_header(s: &Settings, n: usize, meta: &Meta, ranks: &[RankInfo]) {
    let mut o = String::new();
    o += &format!(
        "# oxccl perf version {} (nccl-tests output format) backend {}\n",
        oxccl::VERSION,
        meta.backend
    );
    if let Some(p) = &meta.library_path {
        o += &format!(
            "# library: {} {} ({p})\n",
            meta.library, meta.library_version
        );
    }
    o += &format!("# Collective test starting: {}\n", s.coll.name());
    let step = if s.stepfactor > 1 {
        format!("{}(factor)", s.stepfactor)
    } else {
        format!("{}(bytes)", s.stepbytes)
    };
    o += &format!(
        "# nThread {} nGpus {} minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} agg iters: {} validation: {} graph: {} unalign: {}\n",
        s.threads, s.ngpus, s.minbytes, s.maxbytes, step, s.warmup, s.iters, s.agg, s.check, s.graph, s.unalign
    );
    o += match s.blocking {
        1 => "# Blocking Enabled: wait and barrier after each inner iteration (-m)\n",
        2 => "# Blocking Enabled: wait after each inner iteration (-m), no barrier\n",
        3 => "# Blocking Enabled: wait and barrier after each outer iteration (-n)\n",
        _ => "",
    };
    if s.per_iter {
        o += "# Per-Iteration Report: host clock per iteration; i_* take the slowest rank of each iteration";
        if s.per_iter_skip > 0 {
            o += &format!("; summary skips first {} iterations", s.per_iter_skip);
        }
        o += "\n";
    }
    if s.parallel_init {
        o += "# Parallel Init Enabled: the ranks create their communicators concurrently\n";
    }
    o += &format!("# nRanks {n} launch {}\n", meta.launch);
    o += "#\n# Using devices\n";
    for (r, i) in ranks.iter().enumerate() {
        o += &format!(
            "#  Rank {r:2} Group {:2} Pid {:6} on {:>10} device {:2} [{}] {}\n",
            0, i.pid, i.host, i.dev, i.pci, i.name
        );
    }
    o += "#\n";
    let extra = s.compare.as_ref().map(|l| fmt::compare_header(&l.label()));
    let cols = fmt::Columns {
        cputime: s.cputime,
        timestamps: s.timestamps,
        per_iter: s.per_iter,
    };
    for (i, l) in fmt::column_header_with(cols).iter().enumerate() {
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

/// `-M 1`'s line (nccl-tests' "GPU memory usage"): what one rank's buffers
/// take, then the closing `#`.
fn memory_line(s: &Settings, meta: &Meta, n: usize) -> String {
    let need = super::memory::Need {
        coll: s.coll,
        max_bytes: s.sizes.last().copied().unwrap_or(0),
        types: &s.types,
        nranks: n,
        local_ranks: 1,
        agg: s.agg,
        unalign: s.unalign as u64,
    };
    let b = super::memory::per_rank_bytes(&need);
    let label = if meta.backend == "cuda" {
        "GPU memory usage"
    } else {
        "Host memory usage"
    };
    format!(
        "# {label:<20} : User-Allocated {} | Total {}\n#\n",
        fmt::mem_string(b),
        fmt::mem_string(b)
    )
}

/// The environment as the JSON's `env` lists it.
fn env_list() -> Vec<String> {
    json_env(std::env::vars())
}

/// NCCL's, oxccl's, CUDA's and the launchers' variables as `NAME=value`,
/// sorted, without any whose name marks a secret and without those the
/// launching `oxccl perf` sets for its rank processes: `OXCCL_PERF_ID` and
/// `OXCCL_PERF_COMPARE_ID` carry the unique ids, whose bytes include the
/// rendezvous secret.
fn json_env(vars: impl Iterator<Item = (String, String)>) -> Vec<String> {
    const PREFIXES: [&str; 6] = ["NCCL_", "OXCCL_", "CUDA_", "SLURM_", "OMPI_", "TORCH"];
    const SECRET: [&str; 4] = ["SECRET", "TOKEN", "PASSWORD", "KEY"];
    const LAUNCHER_SET: [&str; 4] = [
        "OXCCL_PERF_ID",
        "OXCCL_PERF_COMPARE_ID",
        "OXCCL_PERF_RANK",
        "OXCCL_PERF_PARENT",
    ];
    let mut v: Vec<String> = vars
        .filter(|(k, _)| PREFIXES.iter().any(|p| k.starts_with(p)))
        .filter(|(k, _)| !SECRET.iter().any(|w| k.to_ascii_uppercase().contains(w)))
        .filter(|(k, _)| !LAUNCHER_SET.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    v.sort();
    v
}

/// The `-J` document: nccl-tests' layout and field names (version 3), with
/// what oxccl adds under `oxccl`.
fn json_doc(
    s: &Settings,
    n: usize,
    meta: &Meta,
    ranks: &[RankInfo],
    rep: &Report,
    errors: usize,
    avg: f64,
) -> Value {
    let hosts = {
        let mut h: Vec<&str> = ranks.iter().map(|r| r.host.as_str()).collect();
        h.sort_unstable();
        h.dedup();
        h.len()
    };
    let mut config = json!({
        "nthreads": s.threads,
        "ngpus": s.ngpus,
        "minimum_bytes": s.minbytes,
        "maximum_bytes": s.maxbytes,
    });
    if s.stepfactor > 1 {
        config["step_factor"] = json!(s.stepfactor);
    } else {
        config["step_bytes"] = json!(s.stepbytes);
    }
    for (k, v) in [
        ("warmup_iters", json!(s.warmup)),
        ("iterations", json!(s.iters)),
        ("aggregated_iterations", json!(s.agg)),
        ("validation", json!(s.check)),
        ("graph", json!(s.graph)),
        ("blocking_collectives", json!(s.blocking != 0)),
        ("per_iter_timing", json!(s.per_iter)),
        ("per_iter_skip", json!(s.per_iter_skip)),
        ("parallel_init", json!(s.parallel_init)),
        (
            "devices",
            ranks
                .iter()
                .enumerate()
                .map(|(r, i)| {
                    json!({
                        "rank": r, "group": 0, "pid": i.pid, "hostname": i.host,
                        "device": i.dev, "device_hex": i.pci, "device_info": i.name,
                    })
                })
                .collect(),
        ),
    ] {
        config[k] = v;
    }
    json!({
        "version": 3,
        "start_time": rep.start_time,
        "args": std::env::args().collect::<Vec<_>>(),
        "env": env_list(),
        "nccl_version": meta.nccl_version,
        "config": config,
        "results": rep.results,
        "out_of_bounds": { "count": errors, "okay": errors == 0 },
        "average_bus_bandwidth": { "bandwidth": avg, "okay": "unchecked" },
        "errors": [],
        "end_time": local_time(),
        "oxccl": {
            "tool": "oxccl perf",
            "oxccl_version": oxccl::VERSION,
            "library": meta.library,
            "library_version": meta.library_version,
            "library_path": meta.library_path,
            "collective": s.coll.name(),
            "backend": meta.backend,
            "host": ranks.first().map_or_else(hostname, |r| r.host.clone()),
            "hosts": hosts,
            "machine": meta.machine,
            "launch": meta.launch,
            "nranks": n,
            "ops": s.ops.iter().map(|o| o.name()).collect::<Vec<_>>(),
            "datatypes": s.types.iter().map(|t| t.name()).collect::<Vec<_>>(),
            "roots": s.coll.rooted().then_some(&s.roots),
            "average": s.average,
            "blocking": s.blocking,
            "run_cycles": s.cycles,
            "report_cputime": s.cputime,
            "report_timestamps": s.timestamps,
            "unalign": s.unalign,
            "memory_report": s.memory_report,
            "timeout_s": s.timeout.map(|t| t.as_secs()),
            "compare": s.compare.as_ref().map(|l| json!({
                "path": l.path.display().to_string(),
                "library": l.label(),
                "nccl_version": super::compare::version_string(l.version),
                "version_code": l.version,
            })),
        },
    })
}

/// The launch mode's name for the header and JSON.
pub fn launch_name(s: &Settings) -> String {
    match &s.launch {
        super::Launch::Process if s.hosts > 1 => {
            format!("process, {} pretend hosts (NCCL_HOSTID)", s.hosts)
        }
        super::Launch::Process => "process".into(),
        super::Launch::Thread => "thread".into(),
        super::Launch::External(e) => format!("external ({})", e.launcher),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_env_leaves_out_secrets_and_the_launchers_ids() {
        let vars = [
            ("NCCL_DEBUG", "WARN"),
            ("OXCCL_AUTH_SECRET", "s3"),
            ("OXCCL_PERF_ID", "4f58"),
            ("OXCCL_PERF_COMPARE_ID", "4f59"),
            ("OXCCL_PERF_RANK", "0"),
            ("OXCCL_PERF_PARENT", "42"),
            ("OXCCL_TIMEOUT_MS", "1000"),
            ("HF_TOKEN", "t"),
            ("CUDA_VISIBLE_DEVICES", "0,1"),
            ("PATH", "/bin"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        assert_eq!(
            json_env(vars.into_iter()),
            [
                "CUDA_VISIBLE_DEVICES=0,1",
                "NCCL_DEBUG=WARN",
                "OXCCL_TIMEOUT_MS=1000"
            ]
        );
    }

    #[test]
    fn iteration_statistics_use_nearest_rank() {
        let t: Vec<f64> = (1..=10).map(f64::from).collect();
        let st = iter_stats(&t);
        assert_eq!((st.min, st.max, st.avg), (1.0, 10.0, 5.5));
        assert_eq!((st.p50, st.p95, st.p99), (6.0, 10.0, 10.0));
        assert!((st.stdev - 8.25f64.sqrt()).abs() < 1e-12);
        let one = iter_stats(&[2.0]);
        assert_eq!((one.p99, one.stdev, one.cv_pct), (2.0, 0.0, 0.0));
    }

    #[test]
    fn local_time_has_nccl_tests_layout() {
        let t = local_time();
        assert_eq!(t.len(), 19, "{t}");
        assert_eq!(&t[4..5], "-");
        assert_eq!(&t[10..11], " ");
    }

    #[test]
    fn rank_info_round_trips_and_truncates() {
        let i = RankInfo {
            pid: 1234,
            dev: 1,
            host: "node-a".into(),
            pci: "0000:18:00".into(),
            name: "NVIDIA H200".into(),
        };
        assert_eq!(RankInfo::decode(&i.encode()), i);
        let long = RankInfo {
            host: "h".repeat(200),
            name: "n".repeat(400),
            ..i
        };
        let d = RankInfo::decode(&long.encode());
        assert_eq!(d.host.len(), HOST_BYTES - 1);
        assert!(d.name.starts_with("nnn"));
    }
}
