//! `oxccl kernels --out DIR`: writes every GPU kernel a run may load,
//! compiled for the given architectures, into DIR under the names the
//! library looks for first (`oxccl::gpu::tools::compile`, "prebuilt"): a CUBIN of
//! every program for each architecture and, with `--ptx`, PTX of every
//! program for the newest one (the driver compiles it for newer GPUs).
//! Shipped as `oxccl-kernels/` beside `libnccl.so.2` (or named by
//! `OXCCL_KERNEL_DIR`), they make a first start as fast as a cached one and
//! need no NVRTC.
//!
//! `oxccl kernels --list [--dir DIR] [--arch ...]` compiles nothing: for
//! each architecture it says which file of the folder the library would
//! load for each program (its own CUBIN, a compatible one, PTX) and which
//! programs it would have to compile, without a GPU. The folder is `--dir`,
//! else the library's (`OXCCL_KERNEL_DIR`, else `oxccl-kernels/` beside
//! this program), else `oxccl-kernels/` beside the `libnccl.so.2` that
//! `oxccl run` would preload (the wheel's, in the Python package).

use std::path::PathBuf;

use oxccl::gpu::tools::compile::{self, Target};
use oxccl::gpu::tools::kernels;

/// `oxccl kernels` arguments.
#[derive(clap::Args)]
pub struct KernelsArgs {
    /// Folder to write the kernels into (created when missing)
    #[arg(long, required_unless_present = "list", conflicts_with = "list")]
    out: Option<PathBuf>,
    /// Compile nothing: say which prebuilt file each program would load from for each --arch (exit 1 when one would compile)
    #[arg(long)]
    list: bool,
    /// With --list: the folder to look in (default: OXCCL_KERNEL_DIR, else oxccl-kernels beside this program or beside the libnccl.so.2 that `oxccl run` preloads)
    #[arg(long, requires = "list")]
    dir: Option<PathBuf>,
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
    if a.list {
        return list(a.dir.clone(), &archs);
    }
    let Some(out) = a.out.as_ref() else {
        eprintln!("oxccl kernels: --out DIR or --list is needed");
        return 2;
    };
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
    let built = match compile::prebuild(out, &jobs, threads, cache.as_deref()) {
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
        out.display(),
        t.elapsed().as_secs_f64()
    );
    0
}

/// The folder `--list` looks in without `--dir`: the library's own choice
/// for this program, else `oxccl-kernels/` beside the library `oxccl run`
/// finds (the wheel keeps the program in `bin/` and the library and its
/// kernels in the Python package).
fn packaged_dir() -> Option<PathBuf> {
    compile::prebuilt_dir().or_else(|| {
        let d = crate::libpath::find().ok()?.parent()?.join("oxccl-kernels");
        std::fs::canonicalize(d).ok().filter(|d| d.is_dir())
    })
}

/// `oxccl kernels --list`: one line per (architecture, program), then a
/// count per architecture; 1 when a program has nothing prebuilt for an
/// architecture (a GPU of it would compile that program with NVRTC).
fn list(dir: Option<PathBuf>, archs: &[u32]) -> i32 {
    let Some(dir) = dir.or_else(packaged_dir) else {
        eprintln!(
            "oxccl kernels --list: no prebuilt kernels: OXCCL_KERNEL_DIR is unset and there is no oxccl-kernels folder beside this program or beside libnccl.so.2 (name one with --dir)"
        );
        return 1;
    };
    if !dir.is_dir() {
        eprintln!("oxccl kernels --list: {} is not a folder", dir.display());
        return 1;
    }
    println!("prebuilt kernels in {}", dir.display());
    let mut missing = 0;
    for &arch in archs {
        let (mut cubins, mut ptx, mut none) = (0, 0, 0);
        for src in kernels::prebuilt_sources(arch) {
            let found = compile::find_prebuilt(&src, arch, &dir);
            let what = match &found {
                Some(c) => {
                    let file = c
                        .cache_file
                        .as_ref()
                        .and_then(|f| f.file_name())
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    // By the file: a second architecture served by the
                    // same PTX reads it from memory.
                    if file.ends_with(".ptx") {
                        ptx += 1;
                        format!("PTX (the driver compiles it at load): {file}")
                    } else {
                        cubins += 1;
                        format!("CUBIN: {file}")
                    }
                }
                None => {
                    none += 1;
                    "not prebuilt: NVRTC compiles it at first use".to_string()
                }
            };
            println!("sm_{arch} {:<16} {what}", src.name);
        }
        println!(
            "sm_{arch}: {} programs: {cubins} CUBIN, {ptx} PTX, {none} to compile",
            cubins + ptx + none
        );
        missing += none;
    }
    i32::from(missing > 0)
}
