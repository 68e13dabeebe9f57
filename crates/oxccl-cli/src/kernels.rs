//! `oxccl kernels --out DIR`: writes every GPU kernel a run may load,
//! compiled for the given architectures, into DIR under the names the
//! library looks for first (`oxccl::gpu::tools::compile`, "prebuilt"): a CUBIN of
//! every program for each architecture and, with `--ptx`, PTX of every
//! program for the newest one (the driver compiles it for newer GPUs).
//! Shipped as `oxccl-kernels/` beside `libnccl.so.2` (or named by
//! `OXCCL_KERNEL_DIR`), they make a first start as fast as a cached one and
//! need no NVRTC.

use std::path::PathBuf;

use oxccl::gpu::tools::compile::{self, Target};
use oxccl::gpu::tools::kernels;

/// `oxccl kernels` arguments.
#[derive(clap::Args)]
pub struct KernelsArgs {
    /// Folder to write the kernels into (created when missing)
    #[arg(long)]
    out: PathBuf,
    /// GPU architectures, as compute capability x 10 (80: A100, 90: H100/H200, 100: B200), comma separated
    #[arg(long, default_value = "80,90,100", value_delimiter = ',')]
    arch: Vec<u32>,
    /// Also write PTX for the newest of --arch, which the driver compiles at load on newer GPUs
    #[arg(long)]
    ptx: bool,
    /// Programs compiled at once (default: the CPUs this process may use)
    #[arg(long)]
    jobs: Option<usize>,
}

/// Runs `oxccl kernels`; the process exit status.
pub fn main(a: &KernelsArgs) -> i32 {
    let mut archs = a.arch.clone();
    archs.sort_unstable();
    archs.dedup();
    if let Some(bad) = archs.iter().find(|a| !(50..=200).contains(*a)) {
        eprintln!("oxccl kernels: --arch {bad} is not a compute capability x 10 (e.g. 90)");
        return 2;
    }
    if archs.is_empty() {
        eprintln!("oxccl kernels: --arch names no architecture");
        return 2;
    }
    let threads = a.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    if threads == 0 {
        eprintln!("oxccl kernels: --jobs 0: at least one program must compile at a time");
        return 2;
    }
    let jobs = kernels::prebuild_jobs(&archs, a.ptx);
    let cache = compile::default_cache_dir();
    let t = std::time::Instant::now();
    let built = match compile::prebuild(&a.out, &jobs, threads, cache.as_deref()) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("oxccl kernels: {}", e.message());
            return 1;
        }
    };
    let mut targets: Vec<Target> = built.iter().map(|b| b.target).collect();
    targets.dedup();
    for target in &targets {
        let of: Vec<_> = built.iter().filter(|b| b.target == *target).collect();
        let bytes: usize = of.iter().map(|b| b.bytes).sum();
        let cpu: f64 = of.iter().map(|b| b.seconds).sum();
        println!(
            "{}: {} programs, {:.1} MiB, {:.0} s of compiling",
            target.tag(),
            of.len(),
            bytes as f64 / (1 << 20) as f64,
            cpu
        );
    }
    println!(
        "{} files in {} ({:.0} s on {threads} threads): ship them as oxccl-kernels/ beside libnccl.so.2, or set OXCCL_KERNEL_DIR",
        built.len(),
        a.out.display(),
        t.elapsed().as_secs_f64()
    );
    0
}
