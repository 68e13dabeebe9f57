//! `oxccl kernels --out DIR`: writes every GPU kernel a run may load,
//! compiled for the given architectures, into DIR under the names the
//! library looks for first (`oxccl_cuda::compile`, "prebuilt"). Shipped as
//! `oxccl-kernels/` beside `libnccl.so.2` (or named by `OXCCL_KERNEL_DIR`),
//! they make a first start as fast as a cached one and need no NVRTC.

use std::path::PathBuf;

use oxccl_cuda::{compile, kernels};

/// `oxccl kernels` arguments.
#[derive(clap::Args)]
pub struct KernelsArgs {
    /// Folder to write the CUBINs into (created when missing)
    #[arg(long)]
    out: PathBuf,
    /// GPU architectures, as compute capability x 10 (90: H100/H200), comma separated
    #[arg(long, default_value = "90", value_delimiter = ',')]
    arch: Vec<u32>,
}

/// Runs `oxccl kernels`; the process exit status.
pub fn main(a: &KernelsArgs) -> i32 {
    let sources = kernels::runtime_sources();
    let cache = compile::default_cache_dir();
    let mut total = 0usize;
    for &arch in &a.arch {
        if !(50..=200).contains(&arch) {
            eprintln!("oxccl kernels: --arch {arch} is not a compute capability x 10 (e.g. 90)");
            return 2;
        }
        let t = std::time::Instant::now();
        match compile::write_prebuilt(&a.out, arch, &sources, cache.as_deref()) {
            Ok(files) => {
                let bytes: usize = files.iter().map(|f| f.1).sum();
                total += files.len();
                println!(
                    "sm_{arch}: {} kernels, {:.1} MiB, in {:.1} s",
                    files.len(),
                    bytes as f64 / (1 << 20) as f64,
                    t.elapsed().as_secs_f64()
                );
            }
            Err(e) => {
                eprintln!("oxccl kernels: sm_{arch}: {}", e.message());
                return 1;
            }
        }
    }
    println!(
        "{total} files in {}: ship them as oxccl-kernels/ beside libnccl.so.2, or set OXCCL_KERNEL_DIR",
        a.out.display()
    );
    0
}
