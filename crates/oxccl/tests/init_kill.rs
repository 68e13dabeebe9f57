//! SIGKILL of a rank at a random moment of init (real processes, over
//! shared memory and over TCP): 96 jobs of 3 or 4 ranks, the victim and the
//! delay (0-100 ms after the last rank was started) drawn at random, 8 jobs
//! at a time. Every survivor must exit within the init timeout (5 s) + 2 s of
//! the kill with an error naming the dead rank (from init, or from the run
//! when init finished first), and no job may leave a segment in /dev/shm.
//!
//! Children started by [`Procs::spawn`] init with a 5 s init timeout, then
//! run small all-reduces until one fails. TCP jobs give each rank its own
//! `NCCL_HOSTID`, so ranks look like separate hosts: no shared memory and no
//! pid checks, only sockets tell that a peer died.

mod common;

use common::*;
use oxccl::{Communicator, Config, RedOp, UniqueId};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const TEST: &str = "sigkill_at_random_moments_of_init";
const INIT_TIMEOUT: Duration = Duration::from_secs(5);
/// Jobs of the sweep, alternately over shared memory and TCP.
const JOBS: usize = 96;
/// Jobs at a time: most wait on a socket; a job whose victim died before
/// joining waits out the init timeout.
const PARALLEL: usize = 8;
/// Set in TCP jobs: the child takes `NCCL_HOSTID=host<rank>`.
const SEPARATE_HOSTS: &str = "OXCCL_TEST_SEPARATE_HOSTS";
/// Exit codes of a child: init failed, a collective failed, none failed.
const EXIT_INIT_ERROR: i32 = 3;
const EXIT_RUN_ERROR: i32 = 4;
const EXIT_NO_ERROR: i32 = 5;

fn child(ctx: &ChildCtx) {
    if std::env::var_os(SEPARATE_HOSTS).is_some() {
        // Before anything reads the parameters.
        std::env::set_var("NCCL_HOSTID", format!("host{}", ctx.rank));
    }
    let cfg = Config {
        init_timeout: Some(INIT_TIMEOUT),
        ..test_config(|_| {})
    };
    let c = match Communicator::init_rank_config(ctx.nranks, &ctx.id, ctx.rank, cfg) {
        Ok(c) => c,
        Err(e) => {
            println!("ERR init: {e}");
            std::process::exit(EXIT_INIT_ERROR);
        }
    };
    event("ready");
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        if let Err(e) = c.all_reduce_in_place(&mut [1u64; 4], RedOp::Sum) {
            println!("ERR run: {e}");
            drop(c);
            std::process::exit(EXIT_RUN_ERROR);
        }
    }
    std::process::exit(EXIT_NO_ERROR);
}

/// One job's plan.
#[derive(Debug, Clone, Copy)]
struct Job {
    tcp: bool,
    nranks: usize,
    victim: usize,
    delay_ms: u64,
}

/// What one job found.
#[derive(Debug, Default)]
struct Outcome {
    survivors: usize,
    /// Survivors alive past INIT_TIMEOUT + 2 s after the kill.
    hung: Vec<String>,
    /// Survivors that exited without an error naming the victim.
    unnamed: Vec<String>,
    /// Survivors whose error came from the run (init had completed).
    from_run: usize,
    leaked: Vec<String>,
    slowest: Duration,
}

/// Segments in /dev/shm made by any of `pids`.
fn segments_of(pids: &[u32]) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|f| pids.iter().any(|p| f.starts_with(&format!("oxccl-{p}-"))))
        .collect()
}

fn run_job(job: Job) -> Outcome {
    let id = UniqueId::new().unwrap();
    let env: &[(&str, &str)] = if job.tcp {
        &[(SEPARATE_HOSTS, "1")]
    } else {
        &[]
    };
    let mut p = Procs::spawn(TEST, job.nranks, &id, env);
    std::thread::sleep(Duration::from_millis(job.delay_ms));
    p.signal(job.victim, libc::SIGKILL);
    let all: Vec<usize> = (0..job.nranks).collect();
    let limit = INIT_TIMEOUT + Duration::from_secs(2);
    let exits = p.wait_exit(&all, limit);
    // Let the output readers catch up with the last lines: a survivor that
    // exited has printed its ERR line, but on a loaded machine (load average
    // 30 on 2 cores) a fixed 50 ms left some unread.
    let catch_up = Instant::now() + Duration::from_secs(2);
    while Instant::now() < catch_up
        && all
            .iter()
            .zip(&exits)
            .any(|(&r, e)| r != job.victim && e.is_some() && !p.log(r).contains("ERR "))
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = Outcome::default();
    for (&r, exit) in all.iter().zip(&exits) {
        if r == job.victim {
            continue;
        }
        out.survivors += 1;
        let log = p.log(r);
        let Some(took) = exit else {
            out.hung
                .push(format!("{job:?}: rank {r} alive after {limit:?}:\n{log}"));
            continue;
        };
        out.slowest = out.slowest.max(*took);
        let code = p.status(r).and_then(|s| s.code());
        // libtest may have printed "test name ... " first.
        let err = log
            .lines()
            .find_map(|l| l.find("ERR ").map(|at| &l[at..]))
            .unwrap_or("");
        let named = [" ", ":", ")", ",", "'"]
            .iter()
            .any(|end| err.contains(&format!("rank {}{end}", job.victim)));
        let ok_code = matches!(code, Some(EXIT_INIT_ERROR) | Some(EXIT_RUN_ERROR));
        if !(ok_code && named) {
            out.unnamed.push(format!(
                "{job:?}: rank {r} exited {code:?} without naming rank {}: {err}\n{log}",
                job.victim
            ));
        }
        if code == Some(EXIT_RUN_ERROR) {
            out.from_run += 1;
        }
    }
    let pids = p.pids.clone();
    drop(p);
    out.leaked = segments_of(&pids);
    // Leave nothing behind for later tests whatever happened.
    for f in &out.leaked {
        let _ = std::fs::remove_file(format!("/dev/shm/{f}"));
    }
    out
}

#[test]
fn sigkill_at_random_moments_of_init() {
    if let Some(ctx) = child_ctx() {
        child(&ctx);
        return;
    }
    let _w = Watchdog::new(TEST, Duration::from_secs(240));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    eprintln!("{TEST}: seed {seed:#x}");
    let jobs: Vec<Job> = (0..JOBS)
        .map(|i| {
            let nranks = 3 + (i / 2) % 2;
            let r = mix(seed ^ i as u64);
            Job {
                tcp: i % 2 == 1,
                nranks,
                victim: (r % nranks as u64) as usize,
                delay_ms: (r >> 16) % 101,
            }
        })
        .collect();
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..PARALLEL {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&job) = jobs.get(i) else { break };
                let o = run_job(job);
                results.lock().unwrap().push((job, o));
            });
        }
    });
    let results = results.into_inner().unwrap();
    let total = |f: &dyn Fn(&Outcome) -> usize| results.iter().map(|(_, o)| f(o)).sum::<usize>();
    let survivors = total(&|o| o.survivors);
    let hung = total(&|o| o.hung.len());
    let unnamed = total(&|o| o.unnamed.len());
    let from_run = total(&|o| o.from_run);
    let leaked = total(&|o| o.leaked.len());
    let slowest = results
        .iter()
        .map(|(_, o)| o.slowest)
        .max()
        .unwrap_or_default();
    eprintln!(
        "{TEST}: {} jobs, {survivors} survivors in {:.1} s: {hung} alive past {:?}, {unnamed} without an error naming the victim, {from_run} failed in the run (init had finished), {leaked} segments left; slowest exit {slowest:?} after the kill",
        results.len(),
        t0.elapsed().as_secs_f64(),
        INIT_TIMEOUT + Duration::from_secs(2),
    );
    let mut problems = Vec::new();
    for (job, o) in &results {
        problems.extend(o.hung.iter().cloned());
        problems.extend(o.unnamed.iter().cloned());
        if !o.leaked.is_empty() {
            problems.push(format!("{job:?}: left {:?} in /dev/shm", o.leaked));
        }
    }
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n----\n")
    );
    assert_eq!(results.len(), JOBS);
}
