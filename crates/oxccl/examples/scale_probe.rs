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
use oxccl::{Communicator, RedOp, UniqueId};
use std::sync::Barrier;
use std::time::{Duration, Instant};

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1000.0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
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
