//! Starting the ranks: child processes of this binary (the default), threads,
//! or one process of an external launcher's world; and waiting for them
//! without ever hanging.
//!
//! Own children are this executable started again with `OXCCL_PERF_RANK`
//! (the first global rank of the child), `OXCCL_PERF_ID` (the unique id, 256
//! hex digits) and `OXCCL_PERF_PARENT` (the parent's pid) set. The parent
//! holds the rendezvous root and polls the children: when one dies (a signal,
//! or an exit status other than 0 or 7) it says which rank, gives the others
//! two seconds to finish reporting, and kills them. Children die with the
//! parent (`PR_SET_PDEATHSIG`).

use super::bench::{self, Activity};
use super::{Launch, Settings};
use crate::UsageError;
use oxccl::UniqueId;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const ENV_RANK: &str = "OXCCL_PERF_RANK";
const ENV_ID: &str = "OXCCL_PERF_ID";
const ENV_PARENT: &str = "OXCCL_PERF_PARENT";
const ENV_CMP_ID: &str = "OXCCL_PERF_COMPARE_ID";

/// True in a rank process started by this tool's own launcher.
pub fn is_child() -> bool {
    std::env::var_os(ENV_RANK).is_some()
}

/// `--compare`: the other library's unique id, from the library (launching
/// side) or from `OXCCL_PERF_COMPARE_ID` (a child).
fn compare_id(s: &mut Settings, child: bool) -> Result<(), String> {
    let Some(lib) = &s.compare else {
        return Ok(());
    };
    if s.backend == super::Backend::Cuda {
        // The CUDA backend's worker 0 makes both libraries' ids and hands
        // them out over the control communicator (see `gpu`).
        return Ok(());
    }
    let id = if child {
        std::env::var(ENV_CMP_ID)
            .ok()
            .and_then(|h| unhex(&h))
            .ok_or_else(|| format!("{ENV_CMP_ID} is missing or not 256 hex digits"))?
    } else {
        lib.unique_id()
            .map_err(|e| format!("--compare {}: {e}", lib.path.display()))?
    };
    s.compare_id = Some(id);
    Ok(())
}

/// One process of an external launcher's world.
#[derive(Clone, Debug)]
pub struct External {
    pub launcher: &'static str,
    pub rank: usize,
    pub world: usize,
    pub local_rank: Option<usize>,
    /// The rendezvous address (`NCCL_COMM_ID` syntax).
    pub comm_id: String,
}

fn env_usize(name: &str) -> Result<Option<usize>, UsageError> {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().map(Some).map_err(|_| {
            UsageError(format!(
                "environment {name}={v}: expected a non-negative integer"
            ))
        }),
        Err(_) => Ok(None),
    }
}

impl External {
    /// The launcher this process runs under, if any (and not one of our own children).
    pub fn detect(threads: usize) -> Result<Option<External>, UsageError> {
        if std::env::var_os(ENV_RANK).is_some() {
            return Ok(None);
        }
        let kinds: [(&'static str, &str, &str, &str); 3] = [
            ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
            (
                "Open MPI",
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            ),
            ("Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        ];
        for (launcher, rk, ws, lr) in kinds {
            let (Some(rank), Some(world)) = (env_usize(rk)?, env_usize(ws)?) else {
                continue;
            };
            if world == 0 || rank >= world {
                return Err(UsageError(format!(
                    "{launcher}: {rk}={rank} is not a rank of {ws}={world}"
                )));
            }
            let local_rank = env_usize(lr)?;
            let comm_id = match std::env::var("NCCL_COMM_ID") {
                Ok(c) if !c.trim().is_empty() => c,
                _ => {
                    let (Ok(addr), Ok(port)) =
                        (std::env::var("MASTER_ADDR"), std::env::var("MASTER_PORT"))
                    else {
                        return Err(UsageError(format!(
                            "running as rank {rank} of {world} under {launcher} but there is no rendezvous address: set NCCL_COMM_ID=<host>:<port>, or MASTER_ADDR and MASTER_PORT"
                        )));
                    };
                    let mut port: u16 = port.trim().parse().map_err(|_| {
                        UsageError(format!(
                            "environment MASTER_PORT={port}: expected a port number 1-65535"
                        ))
                    })?;
                    if std::env::var("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Ok("True") {
                        // torchrun's agent already serves its TCP store on MASTER_PORT.
                        port = port.checked_add(1).ok_or_else(|| {
                            UsageError("MASTER_PORT 65535 leaves no port for oxccl's rendezvous (it uses MASTER_PORT + 1 under torchrun's agent store)".into())
                        })?;
                    }
                    let addr = addr.trim();
                    if addr.contains(':') && !addr.starts_with('[') {
                        format!("[{addr}]:{port}")
                    } else {
                        format!("{addr}:{port}")
                    }
                }
            };
            let _ = threads;
            return Ok(Some(External {
                launcher,
                rank,
                world,
                local_rank,
                comm_id,
            }));
        }
        Ok(None)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 128]> {
    let s = s.trim();
    if s.len() != 256 {
        return None;
    }
    let mut out = [0u8; 128];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Checks that the JSON file can be written before any rank starts.
fn check_json_path(s: &Settings) -> Result<(), UsageError> {
    if let Some(p) = &s.json {
        std::fs::File::create(p).map_err(|e| {
            UsageError(format!(
                "-J/--output_file {}: cannot be written ({e})",
                p.display()
            ))
        })?;
    }
    Ok(())
}

/// Runs the ranks this invocation is responsible for; returns the exit status.
pub fn run(mut s: Settings) -> i32 {
    let child = std::env::var(ENV_RANK);
    if let Err(e) = compare_id(&mut s, child.is_ok()) {
        eprintln!("oxccl perf: {e}");
        return 1;
    }
    // A child of our own launcher?
    if let Ok(first) = child {
        return run_child(&s, &first);
    }
    let writes_json = match &s.launch {
        Launch::External(e) => e.rank == 0,
        _ => true,
    };
    if writes_json {
        if let Err(e) = check_json_path(&s) {
            eprintln!("oxccl perf: {}", e.0);
            return 2;
        }
    }
    match &s.launch {
        Launch::External(e) => {
            // The library reads its environment once, at its first call: set
            // the rendezvous address before that. Every rank derives the same
            // id from it and global rank 0 starts the root.
            std::env::set_var("NCCL_COMM_ID", &e.comm_id);
            let id = match UniqueId::new() {
                Ok(id) => id,
                Err(err) => {
                    eprintln!(
                        "oxccl perf: rank {} of {} ({}): NCCL_COMM_ID={}: {err}",
                        e.rank, e.world, e.launcher, e.comm_id
                    );
                    return 1;
                }
            };
            let t = s.threads;
            let ranks = (0..t)
                .map(|k| (e.rank * t + k, e.local_rank.unwrap_or(e.rank) * t + k))
                .collect();
            run_ranks(&s, ranks, &id)
        }
        Launch::Thread => match UniqueId::new() {
            Ok(id) => run_ranks(&s, (0..s.workers()).map(|r| (r, r)).collect(), &id),
            Err(e) => {
                eprintln!("oxccl perf: cannot start the rendezvous: {e}");
                1
            }
        },
        Launch::Process => run_parent(&s),
    }
}

fn run_child(s: &Settings, first: &str) -> i32 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl(PR_SET_PDEATHSIG) takes an integer signal and touches no memory.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
        }
        // The parent may have died before the prctl: then we were re-parented.
        if let Ok(p) = std::env::var(ENV_PARENT) {
            if p.parse::<u32>().ok() != Some(std::os::unix::process::parent_id()) {
                eprintln!("oxccl perf: the launching process {p} is gone; exiting");
                return 1;
            }
        }
    }
    let Ok(first) = first.parse::<usize>() else {
        eprintln!("oxccl perf: {ENV_RANK}={first}: not a rank number");
        return 2;
    };
    let Some(bytes) = std::env::var(ENV_ID).ok().and_then(|h| unhex(&h)) else {
        eprintln!("oxccl perf: {ENV_ID} is missing or not 256 hex digits");
        return 2;
    };
    let id = match UniqueId::from_bytes(&bytes) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("oxccl perf: {ENV_ID}: {e}");
            return 2;
        }
    };
    let ranks = (first..first + s.threads).map(|r| (r, r)).collect();
    run_ranks(s, ranks, &id)
}

/// Runs `ranks` (global rank, local rank) as threads of this process; returns
/// 1 if any failed, else 7 if any result was wrong, else 0. With the CUDA
/// backend these are workers: worker `w` drives ranks `w * ngpus ..`.
pub fn run_ranks(s: &Settings, ranks: Vec<(usize, usize)>, id: &UniqueId) -> i32 {
    let act = Activity::new(ranks.len());
    let codes: Vec<i32> = std::thread::scope(|sc| {
        let act = &act;
        if let Some(t) = s.wait_limit() {
            sc.spawn(move || bench::watchdog(s, act, t));
        }
        let handles: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(slot, &(rank, local))| {
                std::thread::Builder::new()
                    .name(format!("rank{rank}"))
                    .spawn_scoped(sc, move || match s.backend {
                        super::Backend::Cuda => {
                            super::gpu::worker_main(s, act, slot, rank, local, id)
                        }
                        _ => bench::rank_main(s, act, slot, rank, local, id),
                    })
                    .expect("spawn a rank thread")
            })
            .collect();
        let codes = handles
            .into_iter()
            .zip(&ranks)
            .map(|(h, &(rank, _))| {
                h.join().unwrap_or_else(|_| {
                    eprintln!("oxccl perf: rank {rank} panicked");
                    1
                })
            })
            .collect();
        act.finish();
        codes
    });
    if codes.contains(&1) || codes.iter().any(|&c| c != 0 && c != 7) {
        1
    } else if codes.contains(&7) {
        7
    } else {
        0
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => "signal",
    }
}

fn describe(st: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = st.signal() {
        format!("was killed by signal {sig} ({})", signal_name(sig))
    } else {
        format!("exited with status {}", st.code().unwrap_or(-1))
    }
}

fn abnormal(st: &ExitStatus) -> bool {
    !matches!(st.code(), Some(0) | Some(7))
}

struct Kid {
    child: Child,
    first: usize,
    status: Option<ExitStatus>,
}

impl Kid {
    fn who(&self, threads: usize) -> String {
        if threads == 1 {
            format!("rank {} (pid {})", self.first, self.child.id())
        } else {
            format!(
                "ranks {}-{} (pid {})",
                self.first,
                self.first + threads - 1,
                self.child.id()
            )
        }
    }
}

fn run_parent(s: &Settings) -> i32 {
    let id = match UniqueId::new() {
        Ok(id) => id,
        Err(e) => {
            eprintln!("oxccl perf: cannot start the rendezvous: {e}");
            return 1;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("oxccl perf: cannot find this executable to start the ranks: {e}");
            return 1;
        }
    };
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let idhex = hex(id.as_bytes());
    let mut kids: Vec<Kid> = Vec::new();
    let procs = s.workers().div_ceil(s.threads);
    for first in (0..s.workers()).step_by(s.threads) {
        let mut cmd = Command::new(&exe);
        if let Some(h) = super::pretend_host(first / s.threads, procs, s.hosts) {
            cmd.env("NCCL_HOSTID", h);
        }
        let spawned = cmd
            .args(&args)
            .env(ENV_RANK, first.to_string())
            .env(ENV_ID, &idhex)
            .env(ENV_PARENT, std::process::id().to_string())
            .env(
                ENV_CMP_ID,
                s.compare_id.map(|i| hex(&i)).unwrap_or_default(),
            )
            .stdin(Stdio::null())
            .spawn();
        match spawned {
            Ok(child) => kids.push(Kid {
                child,
                first: first * s.ngpus,
                status: None,
            }),
            Err(e) => {
                eprintln!("oxccl perf: cannot start rank {first}: {e}");
                for k in &mut kids {
                    let _ = k.child.kill();
                    let _ = k.child.wait();
                }
                return 1;
            }
        }
    }
    wait_children(&mut kids, s.threads * s.ngpus)
}

/// Polls the children until all exited; after the first abnormal exit the
/// rest get two seconds, then SIGKILL.
fn wait_children(kids: &mut [Kid], threads: usize) -> i32 {
    const GRACE: Duration = Duration::from_secs(2);
    let mut failed_at: Option<Instant> = None;
    loop {
        let mut fresh: Vec<usize> = Vec::new();
        for (i, k) in kids.iter_mut().enumerate() {
            if k.status.is_none() {
                match k.child.try_wait() {
                    Ok(Some(st)) => {
                        k.status = Some(st);
                        fresh.push(i);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        eprintln!("oxccl perf: cannot wait for {}: {e}", k.who(threads));
                        let _ = k.child.kill();
                    }
                }
            }
        }
        // A death by signal is the cause; an error exit at the same moment is
        // usually a peer reporting it.
        fresh.sort_by_key(|&i| {
            use std::os::unix::process::ExitStatusExt;
            kids[i].status.and_then(|s| s.signal()).is_none()
        });
        for i in fresh {
            let st = kids[i].status.expect("just set");
            if abnormal(&st) && failed_at.is_none() {
                let alive = kids.iter().filter(|k| k.status.is_none()).count();
                eprintln!(
                    "oxccl perf: {} {}{}",
                    kids[i].who(threads),
                    describe(&st),
                    if alive > 0 {
                        "; stopping the other ranks"
                    } else {
                        ""
                    }
                );
                failed_at = Some(Instant::now());
            }
        }
        if kids.iter().all(|k| k.status.is_some()) {
            break;
        }
        if failed_at.is_some_and(|t| t.elapsed() > GRACE) {
            for k in kids.iter_mut().filter(|k| k.status.is_none()) {
                let _ = k.child.kill();
                k.status = k.child.wait().ok();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if failed_at.is_some() {
        1
    } else if kids
        .iter()
        .any(|k| k.status.is_some_and(|s| s.code() == Some(7)))
    {
        7
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let mut b = [0u8; 128];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i * 7) as u8;
        }
        assert_eq!(unhex(&hex(&b)), Some(b));
        assert_eq!(unhex("zz"), None);
    }
}
