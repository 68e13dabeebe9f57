//! Every kernel compiles for sm_90 with NVRTC, and the disk cache works.
//!
//! Needs NVRTC (CUDA 13.0: the toolkit, or pip's `nvidia-cuda-nvrtc==13.0.88`;
//! see `oxccl_cuda::loader::nvrtc_search_dirs`). Without it the tests print
//! `SKIPPED: NVRTC not found (...)`, unless `OXCCL_REQUIRE_NVRTC=1` (CI), where
//! they fail. No GPU is needed.

use oxccl_core::{DataType, RedOp};
use oxccl_cuda::compile::{self, Origin};
use oxccl_cuda::{allreduce, kernels, loader};

fn nvrtc_or_skip(test: &str) -> bool {
    match loader::nvrtc() {
        Ok(info) => {
            eprintln!(
                "{test}: NVRTC {}.{} at {}",
                info.version.0, info.version.1, info.path
            );
            true
        }
        Err(e) => {
            if std::env::var("OXCCL_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
                panic!("OXCCL_REQUIRE_NVRTC=1 but {e}");
            }
            skip_notice(&format!("SKIPPED: {test}: NVRTC not found ({e})"));
            false
        }
    }
}

#[test]
fn every_kernel_compiles_for_sm90() {
    if !nvrtc_or_skip("every_kernel_compiles_for_sm90") {
        return;
    }
    for src in kernels::ALL {
        let t = std::time::Instant::now();
        // OXCCL_WARM_CACHE=DIR also stores the CUBINs there (scripts/gpu-test.sh
        // --build ships them, so the GPU machine's first start compiles nothing).
        let cubin = match std::env::var_os("OXCCL_WARM_CACHE") {
            Some(d) => compile::compile_cached(src, 90, Some(std::path::Path::new(&d)))
                .unwrap_or_else(|e| panic!("{e}"))
                .image
                .to_vec(),
            None => compile::compile_now(src, 90).unwrap_or_else(|e| panic!("{e}")),
        };
        assert!(
            cubin.starts_with(b"\x7fELF"),
            "{}: not an ELF CUBIN",
            src.name
        );
        eprintln!(
            "{}: {} bytes of sm_90 CUBIN in {:.0} ms",
            src.name,
            cubin.len(),
            t.elapsed().as_secs_f64() * 1e3
        );
    }
}

#[test]
fn all_reduce_kernels_exist_for_every_type_and_op() {
    if !nvrtc_or_skip("all_reduce_kernels_exist_for_every_type_and_op") {
        return;
    }
    let dir = tempdir("names");
    let img = compile::compile_cached(&kernels::ALLREDUCE, 90, Some(&dir)).unwrap();
    let bytes = img.image.as_slice();
    let mut n = 0;
    for t in DataType::ALL {
        let premul = RedOp::PreMulSum(oxccl_core::Scalar::F64(1.0));
        for op in RedOp::BUILTIN.into_iter().chain([premul]) {
            let name = allreduce::kernel_name(t, op).unwrap();
            assert!(
                bytes.windows(name.len()).any(|w| w == name.as_bytes()),
                "{name} is not in the CUBIN"
            );
            n += 1;
        }
    }
    assert_eq!(n, 72);
    assert!(
        bytes.windows(11).any(|w| w == b"oxccl_pcopy"),
        "oxccl_pcopy is not in the CUBIN"
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "oxccl-cuda-test-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn second_compile_comes_from_the_disk_cache() {
    if !nvrtc_or_skip("second_compile_comes_from_the_disk_cache") {
        return;
    }
    let dir = tempdir("cache");
    let first = compile::compile_cached(&kernels::COPY, 90, Some(&dir)).unwrap();
    // Another "process": the in-memory table is keyed by folder, so a fresh
    // folder with the same file tests the disk path.
    let file = first.cache_file.clone().expect("the CUBIN was stored");
    let name = file.file_name().unwrap().to_str().unwrap().to_string();
    assert!(name.starts_with("copy-sm_90-nvrtc"), "{name}");
    let dir2 = tempdir("cache2");
    std::fs::create_dir_all(&dir2).unwrap();
    std::fs::copy(&file, dir2.join(&name)).unwrap();
    let again = compile::compile_cached(&kernels::COPY, 90, Some(&dir2)).unwrap();
    assert_eq!(again.origin, Origin::DiskCache);
    assert_eq!(again.image, first.image);
    let third = compile::compile_cached(&kernels::COPY, 90, Some(&dir2)).unwrap();
    assert_eq!(third.origin, Origin::Memory);
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(dir2);
}

#[test]
fn cache_key_changes_with_arch_and_version() {
    let a = compile::cache_file_name(&kernels::COPY, 90, (13, 0));
    assert_ne!(a, compile::cache_file_name(&kernels::COPY, 80, (13, 0)));
    assert_ne!(a, compile::cache_file_name(&kernels::COPY, 90, (13, 1)));
    assert_ne!(
        a,
        compile::cache_file_name(&kernels::ALLREDUCE, 90, (13, 0))
    );
}

/// Prints a skip notice on the real stderr: libtest captures the print macros
/// of passing tests, so `eprintln!` would hide the skip in CI logs.
fn skip_notice(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{msg}");
}
