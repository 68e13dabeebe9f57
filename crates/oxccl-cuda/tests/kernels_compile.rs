//! Every kernel compiles for sm_90 with NVRTC into the folder `oxccl kernels`
//! writes, the library finds it there, and the disk cache works.
//!
//! Needs NVRTC (CUDA 13.0: the toolkit, or pip's `nvidia-cuda-nvrtc==13.0.88`;
//! see `oxccl_cuda::loader::nvrtc_search_dirs`). The tests that compile are
//! `#[ignore = "needs NVRTC: ..."]` and fail without it; CI (`.ci/run`) and
//! scripts/gpu-test.sh run them with `--ignored`. No GPU is needed.

use oxccl_core::{DataType, RedOp};
use oxccl_cuda::compile::{self, Origin};
use oxccl_cuda::{allreduce, kernels, loader, ring};

/// Panics unless NVRTC loads: these tests are `#[ignore]`d and run where it
/// is installed (CI's `.ci/run`, scripts/gpu-test.sh).
fn require_nvrtc(test: &str) {
    match loader::nvrtc() {
        Ok(info) => eprintln!(
            "{test}: NVRTC {}.{} at {}",
            info.version.0, info.version.1, info.path
        ),
        Err(e) => panic!("{test}: needs NVRTC: {e}"),
    }
}

/// Architectures the prebuilt-folder test builds: `OXCCL_PREBUILD_ARCHS`
/// (e.g. `80,90,100`), else sm_90 alone. One architecture is about 12
/// CPU-minutes of NVRTC (some 6 minutes on CI's two cores; the earlier
/// compile of ring.cu whole took as long on one), so CI builds sm_90 only;
/// the three together are for a release (`oxccl kernels` builds them).
fn prebuild_archs() -> Vec<u32> {
    std::env::var("OXCCL_PREBUILD_ARCHS")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .map(|v| {
            v.split(',')
                .map(|a| {
                    a.trim()
                        .parse()
                        .unwrap_or_else(|_| panic!("OXCCL_PREBUILD_ARCHS: {a:?} is not a number"))
                })
                .collect()
        })
        .unwrap_or_else(|| vec![90])
}

/// The folder `oxccl kernels --out` would write for [`prebuild_archs`]. With
/// `OXCCL_WARM_CACHE=DIR` every CUBIN also lands in that disk cache
/// (scripts/gpu-test.sh --build ships it to the GPU machine).
fn prebuilt_folder() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempdir("prebuilt-all");
        let warm = std::env::var_os("OXCCL_WARM_CACHE").map(std::path::PathBuf::from);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let t = std::time::Instant::now();
        let built = compile::prebuild(
            &dir,
            &kernels::prebuild_jobs(&prebuild_archs(), false),
            threads,
            warm.as_deref(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        for b in &built {
            eprintln!(
                "{} {}: {} bytes of CUBIN in {:.1} s",
                b.name,
                b.target.tag(),
                b.bytes,
                b.seconds
            );
        }
        eprintln!(
            "prebuilt {} programs, {} bytes, in {:.0} s on {threads} threads",
            built.len(),
            built.iter().map(|b| b.bytes).sum::<usize>(),
            t.elapsed().as_secs_f64()
        );
        dir
    })
}

/// Every program the library can ask for on each architecture built is in
/// the prebuilt folder as that architecture's own CUBIN and holds the
/// kernels the launch code looks up, so on those GPUs nothing compiles at
/// run time. fp8 programs exist from sm_89 on, and not before.
#[test]
#[ignore = "needs NVRTC: every program is prebuilt for each architecture"]
fn every_program_is_prebuilt_for_each_architecture() {
    require_nvrtc("every_program_is_prebuilt_for_each_architecture");
    let dir = prebuilt_folder();
    let premul = RedOp::PreMulSum(oxccl_core::Scalar::F64(1.0));
    for arch in prebuild_archs() {
        let found = |src: &kernels::KernelSource, names: &[String]| {
            let c = compile::find_prebuilt(src, arch, dir)
                .unwrap_or_else(|| panic!("{} for sm_{arch} is not prebuilt", src.name));
            assert_eq!(c.origin, Origin::Prebuilt, "{}", src.name);
            let file = c.cache_file.as_ref().unwrap().display().to_string();
            assert!(file.contains(&format!("-sm_{arch}-")), "{file}");
            for n in names {
                assert!(has(&c.image, n), "{n} is not in {file}");
            }
        };
        let mut programs = 0;
        for t in DataType::ALL {
            let runs = kernels::type_runs_on(t, arch);
            for op in RedOp::BUILTIN.into_iter().chain([premul]) {
                let src = kernels::ring_variant(t, op);
                if runs {
                    let names = [
                        ring::kernel_name(t, op),
                        ring::small_kernel_name(t, op),
                        ring::joint_kernel_name(t, op),
                        ring::scale_kernel_name(t, op),
                    ];
                    found(&src, &names);
                    programs += 1;
                } else {
                    assert!(compile::find_prebuilt(&src, arch, dir).is_none());
                }
            }
            for op in kernels::CE_OPS {
                let src = kernels::ce_reduce_variant(t, op);
                if runs {
                    found(&src, &[kernels::ce_reduce_kernel(t, op)]);
                    programs += 1;
                }
            }
        }
        found(
            &kernels::ring_p2p(),
            &["oxccl_ring_p2p".into(), "oxccl_ring_barrier".into()],
        );
        found(&kernels::COPY, &["oxccl_copy".into()]);
        let pair: Vec<String> = DataType::ALL
            .into_iter()
            .filter(|&t| kernels::type_runs_on(t, arch))
            .flat_map(|t| {
                RedOp::BUILTIN
                    .into_iter()
                    .chain([premul])
                    .map(move |op| allreduce::kernel_name(t, op).unwrap())
            })
            .chain(["oxccl_pcopy".to_string()])
            .collect();
        found(&kernels::ALLREDUCE, &pair);
        programs += 3;
        assert_eq!(programs, kernels::prebuilt_sources(arch).len());
        let fp8 = if arch >= kernels::FP8_MIN_ARCH {
            12
        } else {
            10
        };
        assert_eq!(programs, fp8 * (6 + 4) + 3, "sm_{arch}");
    }
    // Tens of MiB; no other test reads the folder.
    let _ = std::fs::remove_dir_all(dir);
}

/// The copy-engine reductions compile one at a time, each with its kernel
/// and the barrier kernel (`oxccl_pcopy`), none of the pair kernels; every
/// type compiles (sum), and every op (float, bfloat16, fp8, int8).
#[test]
#[ignore = "needs NVRTC: copy engine reductions compile one at a time"]
fn copy_engine_reductions_compile_one_at_a_time() {
    require_nvrtc("copy_engine_reductions_compile_one_at_a_time");
    let check = |t: DataType, op| {
        let src = kernels::ce_reduce_variant(t, op);
        let img = compile_timed(&src);
        let name = kernels::ce_reduce_kernel(t, op);
        assert!(has(&img, &name), "{name} is not in {}", src.name);
        assert!(has(&img, "oxccl_pcopy"));
        assert!(
            !has(&img, "oxccl_ar1_"),
            "{}: pair kernels compiled too",
            src.name
        );
    };
    for t in DataType::ALL {
        check(t, oxccl_cuda::ce_reduce::Op::Sum);
    }
    for t in [
        DataType::Float32,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Int8,
    ] {
        for op in kernels::CE_OPS {
            check(t, op);
        }
    }
}

/// A ring kernel compiles alone (what a first collective waits for), holds
/// its kernel and the p2p one, and none of the other 71.
#[test]
#[ignore = "needs NVRTC: ring kernels compile one at a time"]
fn ring_kernels_compile_one_at_a_time() {
    require_nvrtc("ring_kernels_compile_one_at_a_time");
    let one = |t, op| compile_timed(&kernels::ring_variant(t, op));
    let img = one(DataType::Float32, RedOp::Sum);
    assert!(has(&img, "oxccl_ring_f32_sum") && has(&img, "oxccl_ring_p2p"));
    assert!(!has(&img, "oxccl_ring_i8_sum") && !has(&img, "oxccl_ring_f32_max"));
    // The small one-shot all-reduce and the one-rank scaling ride along.
    assert!(has(
        &img,
        &ring::small_kernel_name(DataType::Float32, RedOp::Sum)
    ));
    assert!(has(
        &img,
        &ring::scale_kernel_name(DataType::Float32, RedOp::Sum)
    ));
    // Every rank of a group of one process in one launch (joint.rs) too.
    assert!(has(
        &img,
        &ring::joint_kernel_name(DataType::Float32, RedOp::Sum)
    ));
    let premul = RedOp::PreMulSum(oxccl_core::Scalar::F64(1.0));
    let img = one(DataType::Float8e5m2, premul);
    assert!(has(&img, "oxccl_ring_e5m2_premulsum"));
    assert!(has(&img, "oxccl_ll1_e5m2_premulsum") && has(&img, "oxccl_scale_e5m2_premulsum"));
    assert!(has(&img, "oxccl_joint_e5m2_premulsum"));
    let p2p = compile::compile_now(&kernels::ring_p2p(), 90).unwrap();
    assert!(has(&p2p, "oxccl_ring_p2p") && !has(&p2p, "oxccl_ring_f32_sum"));
    // The blocks an SM holds, which the bound for ranks sharing a GPU
    // counts on (ring::RING_BLOCKS_PER_SM, ring::P2P_BLOCKS_PER_SM): a
    // kernel change that takes more registers must lower those constants.
    for (image, kernel, per_sm) in [
        (&img, "oxccl_ring_e5m2_premulsum", ring::RING_BLOCKS_PER_SM),
        (&img, "oxccl_ring_p2p", ring::P2P_BLOCKS_PER_SM),
        (&p2p, "oxccl_ring_p2p", ring::P2P_BLOCKS_PER_SM),
    ] {
        let regs = register_count(image, kernel);
        eprintln!("{kernel}: {regs} registers a thread");
        assert!(
            regs * ring::THREADS * per_sm <= SM90_REGISTERS,
            "{kernel}: {regs} registers x {} threads x {per_sm} blocks > {SM90_REGISTERS}",
            ring::THREADS
        );
    }
    // Variants are distinct programs with distinct cache files.
    let a = compile::cache_file_name(
        &kernels::ring_variant(DataType::Int8, RedOp::Sum),
        90,
        (13, 0),
    );
    let b = compile::cache_file_name(
        &kernels::ring_variant(DataType::Int8, RedOp::Max),
        90,
        (13, 0),
    );
    assert!(a.starts_with("ring-i8-sum-") && b.starts_with("ring-i8-max-") && a != b);
}

/// `src` compiled for sm_90 now (no cache), with its size and time on stderr.
fn compile_timed(src: &kernels::KernelSource) -> Vec<u8> {
    let t0 = std::time::Instant::now();
    let img = compile::compile_now(src, 90).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "{}: {} bytes in {:.0} ms",
        src.name,
        img.len(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    img
}

/// Registers of one SM of sm_90.
const SM90_REGISTERS: u32 = 65536;

/// The register count a CUBIN (ELF64) records for `kernel`: the
/// EIATTR_REGCOUNT attribute (0x2f: symbol index, count) in its `.nv.info`
/// section. Panics where the image has none for it (the test then fails).
fn register_count(img: &[u8], kernel: &str) -> u32 {
    let u16_at = |o: usize| u16::from_le_bytes(img[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(img[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(img[o..o + 8].try_into().unwrap()) as usize;
    let cstr = |o: usize| {
        let end = img[o..].iter().position(|&b| b == 0).unwrap();
        std::str::from_utf8(&img[o..o + end]).unwrap()
    };
    // Section headers: (name, type, offset, size, link).
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let secs: Vec<(usize, u32, usize, usize, usize)> = (0..shnum)
        .map(|i| {
            let h = shoff + i * shentsize;
            (
                u32_at(h) as usize,
                u32_at(h + 4),
                u64_at(h + 0x18),
                u64_at(h + 0x20),
                u32_at(h + 0x28) as usize,
            )
        })
        .collect();
    let names = secs[shstrndx].2;
    let symtab = secs.iter().find(|s| s.1 == 2).expect("a symbol table");
    let symstr = secs[symtab.4].2;
    let info = secs
        .iter()
        .find(|s| cstr(names + s.0) == ".nv.info")
        .expect("a .nv.info section");
    let (mut o, end) = (info.2, info.2 + info.3);
    while o + 2 <= end {
        let (format, attr) = (img[o], img[o + 1]);
        if format != 4 {
            // Formats without a size field: 2 (no value) or 4 bytes.
            o += if format == 1 { 2 } else { 4 };
            continue;
        }
        let size = u16_at(o + 2);
        if attr == 0x2f && size >= 8 {
            let sym = u32_at(o + 4) as usize;
            if cstr(symstr + u32_at(symtab.2 + sym * 24) as usize) == kernel {
                return u32_at(o + 8);
            }
        }
        o += 4 + size;
    }
    panic!("no register count for {kernel}");
}

/// Whether a compiled image holds `name` (a kernel's symbol).
fn has(img: &[u8], name: &str) -> bool {
    img.windows(name.len()).any(|w| w == name.as_bytes())
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
#[ignore = "needs NVRTC: second compile comes from the disk cache"]
fn second_compile_comes_from_the_disk_cache() {
    require_nvrtc("second_compile_comes_from_the_disk_cache");
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

/// `oxccl kernels`' files: found under the prebuilt name without NVRTC's
/// version, the same bytes as a compile; another architecture, or a file
/// that is not an ELF CUBIN, is not taken.
#[test]
#[ignore = "needs NVRTC: prebuilt kernels are found before the cache"]
fn prebuilt_kernels_are_found_before_the_cache() {
    require_nvrtc("prebuilt_kernels_are_found_before_the_cache");
    let cache = tempdir("pb-cache");
    let dir = tempdir("prebuilt");
    let files = compile::write_prebuilt(&dir, 90, &[kernels::COPY], Some(&cache)).unwrap();
    assert_eq!(files.len(), 1);
    let name = files[0]
        .0
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        name.starts_with("copy-sm_90-") && !name.contains("nvrtc"),
        "{name}"
    );
    let got = compile::from_prebuilt(&kernels::COPY, 90, &dir).expect("found");
    assert_eq!(got.origin, Origin::Prebuilt);
    assert_eq!(
        *got.image,
        compile::compile_now(&kernels::COPY, 90).unwrap()
    );
    assert!(compile::from_prebuilt(&kernels::COPY, 80, &dir).is_none());
    assert!(compile::from_prebuilt(&kernels::ALLREDUCE, 90, &dir).is_none());
    let bad = tempdir("prebuilt-bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join(&name), b"not a cubin").unwrap();
    assert!(compile::from_prebuilt(&kernels::COPY, 90, &bad).is_none());
    for d in [cache, dir, bad] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// A GPU without its own CUBIN takes one of the same major version and a
/// lower minor one (sm_90's on a 9.x GPU, never an sm_80 one on sm_89,
/// which lacks the fp8 kernels), else PTX not newer than itself (newest
/// first); PTX is a NUL-terminated text, as cuModuleLoadData reads it.
#[test]
#[ignore = "needs NVRTC: compatible cubins then ptx are found"]
fn compatible_cubins_then_ptx_are_found() {
    require_nvrtc("compatible_cubins_then_ptx_are_found");
    use compile::Target;
    let dir = tempdir("prebuilt-compat");
    let src = kernels::COPY;
    let jobs = [
        (src, Target::Cubin(80)),
        (src, Target::Cubin(90)),
        (src, Target::Ptx(80)),
        (src, Target::Ptx(90)),
    ];
    let built = compile::prebuild(&dir, &jobs, 2, None).unwrap();
    assert_eq!(built.len(), 4);
    let origin_of = |arch| {
        compile::find_prebuilt(&src, arch, &dir).map(|c| {
            let file = c.cache_file.unwrap();
            (
                c.origin,
                file.file_name().unwrap().to_str().unwrap().to_string(),
            )
        })
    };
    let (o, f) = origin_of(90).unwrap();
    assert!(o == Origin::Prebuilt && f.starts_with("copy-sm_90-"), "{f}");
    let (o, f) = origin_of(86).unwrap();
    assert!(o == Origin::Prebuilt && f.starts_with("copy-sm_80-"), "{f}");
    // sm_89: not the sm_80 CUBIN; the compute_80 PTX.
    let (o, f) = origin_of(89).unwrap();
    assert!(
        o == Origin::PrebuiltPtx && f.starts_with("copy-compute_80-"),
        "{f}"
    );
    let (o, f) = origin_of(120).unwrap();
    assert!(
        o == Origin::PrebuiltPtx && f.starts_with("copy-compute_90-"),
        "{f}"
    );
    let ptx = compile::find_prebuilt(&src, 120, &dir).unwrap().image;
    assert_eq!(ptx.last(), Some(&0));
    assert!(has(&ptx, ".entry oxccl_copy"));
    // Older than anything built: nothing; another program: nothing.
    assert!(origin_of(75).is_none());
    assert!(compile::find_prebuilt(&kernels::ring_p2p(), 90, &dir).is_none());
    // A file of another source under a matching stem is not taken.
    assert!(
        compile::prebuilt_candidates(&src, 100, ["copy-sm_100-0000000000000000.cubin"]).is_empty()
    );
    let _ = std::fs::remove_dir_all(dir);
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
