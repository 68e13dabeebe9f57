//! Start-up and memory against the rank count, ranks as threads of this
//! process (developer tool behind `scripts/bench-scale.sh`). Usage:
//! `scale_probe N [COLL]` with COLL `all_reduce` (default) or `all_to_all`.
//!
//! Every rank thread starts at one instant, creates its communicator, runs
//! one 8-byte collective (float64, checked exactly) and waits at a barrier
//! (an all-reduce) for the others, then all are destroyed. Prints one line:
//! `ranks N init_max_s X first_max_s Y hwm_mb Z`: the slowest rank's
//! creation, the slowest rank's time from the start to its finished first
//! collective, and the process's peak resident memory (VmHWM) read before
//! teardown.
//!
//! `scale_probe --process`: one rank of a job whose ranks are processes
//! (started by `scripts/bench-hosts-mpi.sh`, possibly on several hosts), the
//! way `bench/mpi/scale_probe.c` measures an MPI rank. The rank comes from
//! `RANK` and `WORLD_SIZE`, the rendezvous from `NCCL_COMM_ID`, and
//! `LAUNCH_T0` (seconds since the epoch, set just before the launch) is the
//! start the times count from. Each rank creates its communicator, runs one
//! 8-byte float64 all-reduce (checked exactly) and reads its peak resident
//! memory; the ranks then all-reduce the slowest times and the memory, and
//! rank 0 prints the C probe's line: `ranks N launch_to_init_s A
//! launch_to_first_s B peak_mb_total C peak_mb_per_rank D`.
use oxccl::{Communicator, RedOp, UniqueId};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Peak resident memory (VmHWM) in kB.
fn peak_rss_kb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .unwrap_or(f64::NAN)
}

fn peak_rss_mb() -> f64 {
    peak_rss_kb() / 1000.0
}

fn env_num<T: std::str::FromStr>(name: &str) -> Result<T, String> {
    let v = std::env::var(name).map_err(|_| format!("{name} is not set"))?;
    v.trim()
        .parse()
        .map_err(|_| format!("{name}={v}: not a number"))
}

/// Seconds since the epoch.
fn epoch_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One rank of a job of processes (`--process`); see the module docs.
fn process_rank() -> Result<(), String> {
    let start = epoch_s();
    let rank: usize = env_num("RANK")?;
    let n: usize = env_num("WORLD_SIZE")?;
    let t0: f64 = env_num("LAUNCH_T0").unwrap_or(start);
    if rank >= n {
        return Err(format!("RANK={rank} is not a rank of WORLD_SIZE={n}"));
    }
    let id =
        UniqueId::new().map_err(|e| format!("rank {rank}: unique id from NCCL_COMM_ID: {e}"))?;
    let c = Communicator::init_rank(n, &id, rank).map_err(|e| format!("rank {rank}: init: {e}"))?;
    let init = epoch_s() - t0;
    let send = [(rank + 1) as f64];
    let mut recv = [0.0f64];
    c.all_reduce(&send, &mut recv, RedOp::Sum)
        .map_err(|e| format!("rank {rank}: first all_reduce: {e}"))?;
    let first = epoch_s() - t0;
    let want = (n * (n + 1) / 2) as f64;
    let ok = recv[0] == want;
    // In the C probe's unit (kB / 1024), so the two tables line up.
    let hwm = peak_rss_kb() / 1024.0;
    let mut worst = [init, first, if ok { 0.0 } else { 1.0 }];
    c.all_reduce_in_place(&mut worst, RedOp::Max)
        .map_err(|e| format!("rank {rank}: all_reduce of the times: {e}"))?;
    let mut total = [hwm];
    c.all_reduce_in_place(&mut total, RedOp::Sum)
        .map_err(|e| format!("rank {rank}: all_reduce of the memory: {e}"))?;
    c.destroy()
        .map_err(|e| format!("rank {rank}: destroy: {e}"))?;
    if !ok {
        return Err(format!(
            "rank {rank}: first all_reduce gave {}, want {want}",
            recv[0]
        ));
    }
    if worst[2] != 0.0 {
        return Err(format!(
            "rank {rank}: another rank's first all_reduce was wrong"
        ));
    }
    if rank == 0 {
        println!(
            "ranks {n} launch_to_init_s {:.3} launch_to_first_s {:.3} peak_mb_total {:.1} peak_mb_per_rank {:.2}",
            worst[0],
            worst[1],
            total[0],
            total[0] / n as f64
        );
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--process") {
        if let Err(e) = process_rank() {
            eprintln!("scale_probe: {e}");
            std::process::exit(1);
        }
        return;
    }
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4);
    let coll = args.get(2).map_or("all_reduce", |s| s.as_str()).to_string();
    if coll != "all_reduce" && coll != "all_to_all" {
        eprintln!("scale_probe: COLL is all_reduce or all_to_all, not {coll}");
        std::process::exit(2);
    }
    let id = UniqueId::new().expect("unique id");
    let start = Barrier::new(n);
    let done = Barrier::new(n + 1);
    let release = Barrier::new(n + 1);
    let t0 = std::sync::OnceLock::<Instant>::new();
    let results: Vec<(Duration, Duration)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (id, start, done, release, t0, coll) =
                    (&id, &start, &done, &release, &t0, &coll);
                s.spawn(move || {
                    start.wait();
                    let t = *t0.get_or_init(Instant::now);
                    let c = Communicator::init_rank(n, id, r).expect("init");
                    let init = t.elapsed();
                    if coll == "all_reduce" {
                        let send = [r as f64];
                        let mut recv = [0.0f64];
                        c.all_reduce(&send, &mut recv, RedOp::Sum)
                            .expect("all_reduce");
                        assert_eq!(recv[0], (n * (n - 1) / 2) as f64, "rank {r}");
                    } else {
                        let send: Vec<f64> = (0..n).map(|q| (r * n + q) as f64).collect();
                        let mut recv = vec![0.0f64; n];
                        c.all_to_all(&send, &mut recv).expect("all_to_all");
                        for (q, v) in recv.iter().enumerate() {
                            assert_eq!(*v, (q * n + r) as f64, "rank {r}");
                        }
                    }
                    let first = t.elapsed();
                    let mut one = [0.0f64];
                    c.all_reduce_in_place(&mut one, RedOp::Sum)
                        .expect("barrier");
                    done.wait();
                    release.wait();
                    c.destroy().expect("destroy");
                    (init, first)
                })
            })
            .collect();
        done.wait();
        let hwm = peak_rss_mb();
        release.wait();
        let res: Vec<(Duration, Duration)> = hs
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect();
        let init = res.iter().map(|r| r.0).max().unwrap_or_default();
        let first = res.iter().map(|r| r.1).max().unwrap_or_default();
        println!(
            "ranks {n} coll {coll} init_max_s {:.3} first_max_s {:.3} hwm_mb {hwm:.1}",
            init.as_secs_f64(),
            first.as_secs_f64()
        );
        res
    });
    assert_eq!(results.len(), n);
}
