//! Soak: many collectives of mixed kinds, types and sizes between local
//! processes, sampling each rank's resident memory, open descriptors, its
//! `/dev/shm/oxccl-<pid>-*` segments and its mappings of /dev/shm files as it
//! goes, and printing the samples as a table. Fails (exit 1) on any error, any
//! wrong result, growth beyond the tolerances after warm-up (the first
//! sampling interval), or a segment left behind. See docs/reliability.md.
//!
//! Usage: `soak [--ops N] [--ranks N] [--sample-every N] [--seed N]
//! [--rss-slack-mib N] [--fd-slack N]` (defaults: 100000 ops, 4 ranks,
//! a sample every 10000 ops, RSS slack 16 MiB, fd slack 0). The transport is
//! whatever the environment selects (`NCCL_SHM_DISABLE=1` for TCP).
//! `bench/soak.sh` runs it over shared memory and over TCP.

#![forbid(unsafe_code)]

use oxccl::{Communicator, Element, Group, RedOp, UniqueId};
use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

#[derive(Clone, Copy)]
struct Opts {
    ops: u64,
    ranks: usize,
    every: u64,
    seed: u64,
    rss_slack_kib: u64,
    fd_slack: u64,
}

fn parse_opts(args: &[String]) -> Opts {
    let mut o = Opts {
        ops: 100_000,
        ranks: 4,
        every: 10_000,
        seed: 1,
        rss_slack_kib: 16 << 10,
        fd_slack: 0,
    };
    let mut i = 0;
    while i < args.len() {
        let v = || -> u64 {
            args.get(i + 1)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("{} needs a number", args[i]))
        };
        match args[i].as_str() {
            "--ops" => o.ops = v(),
            "--ranks" => o.ranks = v() as usize,
            "--sample-every" => o.every = v().max(1),
            "--seed" => o.seed = v(),
            "--rss-slack-mib" => o.rss_slack_kib = v() << 10,
            "--fd-slack" => o.fd_slack = v(),
            a => panic!("unknown argument {a}"),
        }
        i += 2;
    }
    o
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> [u8; 128] {
    let mut o = [0u8; 128];
    for (i, c) in o.iter_mut().enumerate() {
        *c = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex id");
    }
    o
}

/// splitmix64: the same sequence on every rank, so all pick the same op.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element types whose small integer values survive every reduction exactly.
trait Val: Element + PartialEq + std::fmt::Debug + Default {
    fn of(x: u32) -> Self;
}
macro_rules! val {
    ($($t:ty),*) => { $(impl Val for $t { fn of(x: u32) -> Self { x as $t } })* };
}
val!(u8, i32, u32, i64, f32, f64);

/// Indices checked in a block of `n` elements: first, middle, last.
fn spots(n: usize) -> [usize; 3] {
    [0, n / 2, n - 1]
}

fn want<T: Val>(what: &str, op: u64, got: T, exp: u32) -> Result<(), String> {
    if got == T::of(exp) {
        Ok(())
    } else {
        Err(format!("op {op} {what}: got {got:?}, expected {exp}"))
    }
}

/// One operation of kind `k` with `count` elements per rank.
fn run_op<T: Val>(c: &Communicator, op: u64, k: u64, count: usize) -> Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    let e = |x: oxccl::Error| format!("op {op}: {x}");
    let pat = |who: usize, j: usize| (who + 1 + j % 5) as u32;
    match k {
        // all_reduce: 30 %
        0..=29 => {
            let send: Vec<T> = (0..count).map(|j| T::of(pat(r, j))).collect();
            let mut recv = vec![T::default(); count];
            c.all_reduce(&send, &mut recv, RedOp::Sum).map_err(e)?;
            for j in spots(count) {
                let exp = (n * (n + 1) / 2 + n * (j % 5)) as u32;
                want("all_reduce", op, recv[j], exp)?;
            }
        }
        // all_gather: 20 %
        30..=49 => {
            let send: Vec<T> = (0..count).map(|j| T::of(pat(r, j))).collect();
            let mut recv = vec![T::default(); count * n];
            c.all_gather(&send, &mut recv).map_err(e)?;
            for src in 0..n {
                for j in spots(count) {
                    want("all_gather", op, recv[src * count + j], pat(src, j))?;
                }
            }
        }
        // reduce_scatter: 20 %
        50..=69 => {
            let send: Vec<T> = (0..count * n).map(|j| T::of(pat(r, j))).collect();
            let mut recv = vec![T::default(); count];
            c.reduce_scatter(&send, &mut recv, RedOp::Sum).map_err(e)?;
            for j in spots(count) {
                let g = r * count + j;
                let exp = (n * (n + 1) / 2 + n * (g % 5)) as u32;
                want("reduce_scatter", op, recv[j], exp)?;
            }
        }
        // broadcast: 15 %
        70..=84 => {
            let root = (op % n as u64) as usize;
            let send: Vec<T> = (0..count).map(|j| T::of(pat(r, j))).collect();
            let mut recv = vec![T::default(); count];
            c.broadcast(&send, &mut recv, root).map_err(e)?;
            for j in spots(count) {
                want("broadcast", op, recv[j], pat(root, j))?;
            }
        }
        // send/recv around the ring in one group: 15 %
        _ => {
            let to = (r + 1) % n;
            let from = (r + n - 1) % n;
            let send: Vec<T> = (0..count).map(|j| T::of(pat(r, j))).collect();
            let mut recv = vec![T::default(); count];
            {
                let mut g = Group::new();
                g.send(c, &send, to).recv(c, &mut recv, from);
                g.run().map_err(e)?;
            }
            for j in spots(count) {
                want("send/recv", op, recv[j], pat(from, j))?;
            }
        }
    }
    Ok(())
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn count_dir(path: &str, prefix: &str) -> u64 {
    std::fs::read_dir(path)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .count() as u64
        })
        .unwrap_or(0)
}

/// Mappings of shared-memory files in this process (segments are unlinked
/// from /dev/shm once every rank has mapped them, so the directory alone
/// would not show a leaked mapping).
fn shm_maps() -> u64 {
    std::fs::read_to_string("/proc/self/maps")
        .map(|m| m.lines().filter(|l| l.contains("/dev/shm/")).count() as u64)
        .unwrap_or(0)
}

/// `SAMPLE rank op rss_kib fds shm_segments shm_maps`; the segments counted
/// are this process's (`/dev/shm/oxccl-<pid>-*`: other jobs on the host may
/// have their own).
fn sample(rank: usize, op: u64) -> String {
    format!(
        "SAMPLE {rank} {op} {} {} {} {}",
        status_kib("VmRSS:"),
        count_dir("/proc/self/fd", ""),
        count_dir("/dev/shm", &format!("oxccl-{}-", std::process::id())),
        shm_maps()
    )
}

fn child(o: Opts, rank: usize, id: &UniqueId) -> Result<(), String> {
    let c = Communicator::init_rank(o.ranks, id, rank).map_err(|e| format!("init: {e}"))?;
    println!("{}", sample(rank, 0));
    // Per kind: operations and bytes per rank's send buffer.
    let mut tally = [(0u64, 0u64); 5];
    for op in 0..o.ops {
        let h = mix(o.seed ^ op.wrapping_mul(0x1000_0001));
        let kind = h % 100;
        let bytes = 8usize << ((h >> 8) % 18); // 8 B .. 1 MiB
        let ty = (h >> 16) % 6;
        let count = |sz: usize| (bytes / sz).max(1);
        let slot = match kind {
            0..=29 => 0,
            30..=49 => 1,
            50..=69 => 2,
            70..=84 => 3,
            _ => 4,
        };
        tally[slot].0 += 1;
        tally[slot].1 += bytes as u64;
        match ty {
            0 => run_op::<f32>(&c, op, kind, count(4)),
            1 => run_op::<f64>(&c, op, kind, count(8)),
            2 => run_op::<i32>(&c, op, kind, count(4)),
            3 => run_op::<i64>(&c, op, kind, count(8)),
            4 => run_op::<u32>(&c, op, kind, count(4)),
            _ => run_op::<u8>(&c, op, kind, count(1)),
        }?;
        if (op + 1) % o.every == 0 || op + 1 == o.ops {
            println!("{}", sample(rank, op + 1));
        }
    }
    if let Some(e) = c.async_error() {
        return Err(format!("async error: {e}"));
    }
    if rank == 0 {
        let names = [
            "all_reduce",
            "all_gather",
            "reduce_scatter",
            "broadcast",
            "send/recv",
        ];
        for (n, (ops, b)) in names.iter().zip(tally) {
            println!("MIX {n} {ops} {b}");
        }
    }
    c.destroy().map_err(|e| format!("destroy: {e}"))?;
    println!("{}", sample(rank, u64::MAX));
    Ok(())
}

struct Sample {
    rank: usize,
    op: u64,
    rss: u64,
    fds: u64,
    shm: u64,
    maps: u64,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let o = parse_opts(&args[1..]);
    if let Ok(r) = std::env::var("SOAK_RANK") {
        let rank: usize = r.parse().expect("SOAK_RANK");
        let id = UniqueId::from_bytes(&unhex(&std::env::var("SOAK_ID").expect("SOAK_ID")))
            .expect("SOAK_ID is a unique id");
        return match child(o, rank, &id) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("soak rank {rank}: FAIL: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let id = UniqueId::new().expect("unique id");
    let exe = std::env::current_exe().expect("current_exe");
    let t0 = Instant::now();
    let kids: Vec<_> = (0..o.ranks)
        .map(|r| {
            Command::new(&exe)
                .args(&args[1..])
                .env("SOAK_RANK", r.to_string())
                .env("SOAK_ID", hex(id.as_bytes()))
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    let pids: Vec<u32> = kids.iter().map(|k| k.id()).collect();
    let ours = || -> u64 {
        pids.iter()
            .map(|p| count_dir("/dev/shm", &format!("oxccl-{p}-")))
            .sum()
    };
    let readers: Vec<_> = kids
        .into_iter()
        .map(|mut k| {
            let out = k.stdout.take().expect("piped");
            std::thread::spawn(move || {
                let lines: Vec<String> =
                    BufReader::new(out).lines().map_while(|l| l.ok()).collect();
                (k.wait().map(|s| s.success()).unwrap_or(false), lines)
            })
        })
        .collect();
    let mut ok = true;
    let mut samples = Vec::new();
    let mut mix_lines = Vec::new();
    for (r, h) in readers.into_iter().enumerate() {
        let (success, lines) = h.join().expect("reader thread");
        if !success {
            eprintln!("soak: rank {r} failed");
            ok = false;
        }
        for l in lines {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() == 4 && f[0] == "MIX" {
                mix_lines.push(format!(
                    "{:>15} {:>8} ops {:>10.1} MiB",
                    f[1],
                    f[2],
                    f[3].parse::<f64>().unwrap_or(0.0) / 1048576.0
                ));
            }
            if f.len() == 7 && f[0] == "SAMPLE" {
                let p = |i: usize| f[i].parse::<u64>().unwrap_or(0);
                samples.push(Sample {
                    rank: p(1) as usize,
                    op: p(2),
                    rss: p(3),
                    fds: p(4),
                    shm: p(5),
                    maps: p(6),
                });
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let shm_after = ours();
    println!(
        "soak: {} ops x {} ranks, {secs:.1} s ({:.0} ops/s), transport: {}",
        o.ops,
        o.ranks,
        o.ops as f64 / secs,
        if std::env::var("NCCL_SHM_DISABLE").is_ok_and(|v| v == "1") {
            "TCP (NCCL_SHM_DISABLE=1)"
        } else {
            "default (shared memory between local ranks)"
        }
    );
    println!(
        "mix (8 B - 1 MiB per rank, f32/f64/i32/i64/u32/u8; bytes = the size drawn, per rank):"
    );
    for l in &mix_lines {
        println!("{l}");
    }
    println!(
        "{:>4} {:>10} {:>10} {:>6} {:>5} {:>8}",
        "rank", "op", "rss_kib", "fds", "shm", "shm_maps"
    );
    samples.sort_by_key(|s| (s.rank, s.op));
    for s in &samples {
        let op = if s.op == u64::MAX {
            "destroyed".to_string()
        } else {
            s.op.to_string()
        };
        println!(
            "{:>4} {op:>10} {:>10} {:>6} {:>5} {:>8}",
            s.rank, s.rss, s.fds, s.shm, s.maps
        );
    }
    // Baseline: each rank's first sample after warm-up (the first interval).
    for r in 0..o.ranks {
        let mine: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.rank == r && s.op != u64::MAX)
            .collect();
        let Some(base) = mine.iter().find(|s| s.op >= o.every.min(o.ops)) else {
            eprintln!("soak: rank {r} reported no sample after warm-up");
            ok = false;
            continue;
        };
        let last = mine.last().expect("non-empty");
        let peak_rss = mine.iter().filter(|s| s.op >= base.op).map(|s| s.rss).max();
        let peak_fds = mine.iter().filter(|s| s.op >= base.op).map(|s| s.fds).max();
        let peak_shm = mine.iter().filter(|s| s.op >= base.op).map(|s| s.shm).max();
        println!(
            "rank {r}: after warm-up (op {}) rss {} -> {} KiB (peak {}), fds {} -> {} (peak {}), shm {} -> {} (peak {}), shm maps {} -> {}",
            base.op,
            base.rss,
            last.rss,
            peak_rss.unwrap_or(0),
            base.fds,
            last.fds,
            peak_fds.unwrap_or(0),
            base.shm,
            last.shm,
            peak_shm.unwrap_or(0),
            base.maps,
            last.maps
        );
        if last.rss > base.rss + o.rss_slack_kib {
            eprintln!(
                "soak: rank {r}: RSS grew {} KiB (> {} KiB)",
                last.rss - base.rss,
                o.rss_slack_kib
            );
            ok = false;
        }
        if last.fds > base.fds + o.fd_slack {
            eprintln!(
                "soak: rank {r}: open descriptors grew {} -> {}",
                base.fds, last.fds
            );
            ok = false;
        }
        if last.maps > base.maps {
            eprintln!(
                "soak: rank {r}: shm mappings grew {} -> {}",
                base.maps, last.maps
            );
            ok = false;
        }
        if last.shm > base.shm {
            eprintln!(
                "soak: rank {r}: shm segments grew {} -> {}",
                base.shm, last.shm
            );
            ok = false;
        }
    }
    println!("segments of the ranks left in /dev/shm after they exited: {shm_after}");
    if shm_after > 0 {
        eprintln!("soak: shared-memory segments left behind");
        ok = false;
    }
    if ok {
        println!("soak: PASS (no errors, all spot checks exact, resources flat)");
        ExitCode::SUCCESS
    } else {
        println!("soak: FAIL");
        ExitCode::FAILURE
    }
}
