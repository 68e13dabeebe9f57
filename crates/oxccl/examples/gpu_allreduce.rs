//! All-reduces "gradients" in GPU memory between processes, through
//! `oxccl::Communicator`'s device API, and checks the result.
//!
//! Usage: `gpu_allreduce [nranks] [elements]` (default 2 ranks, 1 Mi
//! elements). It starts `nranks` copies of itself; rank r takes GPU
//! `r % device count` (ranks may share one GPU), fills its gradients with
//! `(r + 1) * (i % 1024) / 64` (values whose sums f32 holds exactly), sums
//! them over the ranks in place on its stream, and compares every element
//! with the float64 reference. It exits non-zero
//! naming the first rank that failed.
//!
//! ```text
//! cargo run --release -p oxccl --example gpu_allreduce -- 2 1048576
//! ```

use oxccl::gpu::{CudaContext, GpuChoice};
use oxccl::{Communicator, Config, RedOp, UniqueId};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Environment of a child rank: its rank, the rank count, the elements and
/// the unique id (hex).
const ENV_RANK: &str = "GPU_ALLREDUCE_RANK";
const ENV_NRANKS: &str = "GPU_ALLREDUCE_NRANKS";
const ENV_ELEMENTS: &str = "GPU_ALLREDUCE_ELEMENTS";
const ENV_ID: &str = "GPU_ALLREDUCE_ID";

/// How long the ranks may take together: kernel compilation on a first
/// start (~30 s without a kernel cache) plus the run.
const LIMIT: Duration = Duration::from_secs(150);

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Result<[u8; 128], String> {
    let mut o = [0u8; 128];
    if s.len() != 256 {
        return Err(format!("{ENV_ID} has {} hex digits, not 256", s.len()));
    }
    for (i, c) in o.iter_mut().enumerate() {
        *c = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| format!("{ENV_ID}: {e}"))?;
    }
    Ok(o)
}

/// Rank `rank`'s gradient `i`.
fn gradient(rank: usize, i: usize) -> f32 {
    (rank + 1) as f32 * (i % 1024) as f32 / 64.0
}

/// Why rank `rank` failed at `what`.
fn fail(rank: usize, what: &str, e: impl std::fmt::Display) -> String {
    format!("rank {rank}: {what}: {e}")
}

/// One rank: joins, all-reduces its gradients on its GPU, checks them.
pub fn run_rank(nranks: usize, rank: usize, id: &UniqueId, elements: usize) -> Result<(), String> {
    // cudarc panics where libcuda is missing: ask oxccl's guarded probe first.
    if !oxccl::gpu::available() {
        return Err(format!("rank {rank}: no CUDA driver with a GPU here"));
    }
    let ndev = CudaContext::device_count().map_err(|e| fail(rank, "no CUDA device", e))?;
    if ndev < 1 {
        return Err(format!("rank {rank}: no CUDA device"));
    }
    let ordinal = rank % ndev as usize;
    let ctx = CudaContext::new(ordinal).map_err(|e| fail(rank, "CUDA context", e))?;
    // A stream of its own: ranks sharing a GPU must not share a stream
    // (each rank's kernel would queue behind the other's).
    let stream = ctx.new_stream().map_err(|e| fail(rank, "stream", e))?;
    let cfg = Config {
        gpu: GpuChoice::Device(ordinal as i32),
        ..Config::default()
    };
    let comm =
        Communicator::init_rank_config(nranks, id, rank, cfg).map_err(|e| fail(rank, "init", e))?;
    if comm.device() != Some(ordinal as i32) {
        return Err(format!(
            "rank {rank}: the communicator has no GPU state on GPU {ordinal} (see the WARN lines)"
        ));
    }
    let host: Vec<f32> = (0..elements).map(|i| gradient(rank, i)).collect();
    let mut grads = stream
        .clone_htod(&host)
        .map_err(|e| fail(rank, "copy in", e))?;
    comm.on_stream(&stream)
        .all_reduce_in_place(&mut grads, RedOp::Sum)
        .map_err(|e| fail(rank, "all_reduce", e))?;
    let out: Vec<f32> = stream
        .clone_dtoh(&grads)
        .map_err(|e| fail(rank, "copy out", e))?;
    if let Some(e) = comm.gpu_error() {
        return Err(fail(rank, "GPU operation", e));
    }
    for (i, &got) in out.iter().enumerate() {
        let want: f64 = (0..nranks).map(|r| gradient(r, i) as f64).sum();
        if got as f64 != want {
            return Err(format!(
                "rank {rank}: element {i} is {got}, the float64 reference {want}"
            ));
        }
    }
    comm.destroy().map_err(|e| fail(rank, "destroy", e))?;
    println!("rank {rank}/{nranks} on GPU {ordinal}: {elements} gradients summed, all correct");
    Ok(())
}

/// A child rank's side: its arguments from the environment.
pub fn child_main() -> Result<(), String> {
    let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set"));
    let num = |k: &str| -> Result<usize, String> {
        var(k)?
            .parse()
            .map_err(|e| format!("{k} is not a number: {e}"))
    };
    let (rank, nranks, elements) = (num(ENV_RANK)?, num(ENV_NRANKS)?, num(ENV_ELEMENTS)?);
    let id = UniqueId::from_bytes(&unhex(&var(ENV_ID)?)?).map_err(|e| e.to_string())?;
    run_rank(nranks, rank, &id, elements)
}

/// Whether this process is a child rank.
pub fn is_child() -> bool {
    std::env::var_os(ENV_RANK).is_some()
}

/// Starts `nranks` ranks as processes of `exe args` (which call
/// [`child_main`]), and waits for all within [`LIMIT`]; kills them all on
/// the first failure or at the limit.
pub fn launch(exe: &Path, args: &[String], nranks: usize, elements: usize) -> Result<(), String> {
    // The rendezvous root runs in this process while the ranks meet.
    let id = UniqueId::new().map_err(|e| format!("unique id: {e}"))?;
    let mut kids: Vec<Child> = Vec::with_capacity(nranks);
    for r in 0..nranks {
        let k = Command::new(exe)
            .args(args)
            .env(ENV_RANK, r.to_string())
            .env(ENV_NRANKS, nranks.to_string())
            .env(ENV_ELEMENTS, elements.to_string())
            .env(ENV_ID, hex(id.as_bytes()))
            .spawn();
        match k {
            Ok(k) => kids.push(k),
            Err(e) => {
                kill_all(&mut kids);
                return Err(format!("cannot start rank {r}: {e}"));
            }
        }
    }
    let t0 = Instant::now();
    let mut done = vec![false; nranks];
    while done.iter().any(|d| !d) {
        for (r, k) in kids.iter_mut().enumerate() {
            if done[r] {
                continue;
            }
            match k.try_wait() {
                Ok(Some(s)) if s.success() => done[r] = true,
                Ok(Some(s)) => {
                    kill_all(&mut kids);
                    return Err(format!("rank {r} failed ({s})"));
                }
                Ok(None) => {}
                Err(e) => {
                    kill_all(&mut kids);
                    return Err(format!("rank {r}: cannot wait for it: {e}"));
                }
            }
        }
        if t0.elapsed() > LIMIT {
            kill_all(&mut kids);
            return Err(format!("the ranks did not finish within {LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn kill_all(kids: &mut [Child]) {
    for k in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
}

#[allow(dead_code)] // a test includes this file and has its own main
fn main() {
    if is_child() {
        if let Err(e) = child_main() {
            eprintln!("gpu_allreduce: {e}");
            std::process::exit(1);
        }
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nranks = args.first().and_then(|s| s.parse().ok()).unwrap_or(2);
    let elements = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1 << 20);
    let r = std::env::current_exe()
        .map_err(|e| format!("cannot find this program: {e}"))
        .and_then(|exe| launch(&exe, &args, nranks, elements));
    match r {
        Ok(()) => println!("gpu_allreduce: {nranks} ranks, {elements} gradients each: correct"),
        Err(e) => {
            eprintln!("gpu_allreduce: {e}");
            std::process::exit(1);
        }
    }
}
