//! ABI checks of `libnccl.so`: exported symbols, SONAME, `nccl.h` compiling
//! as C and C++ (with and without CUDA's headers), the `ncclConfig_t` layout,
//! and C programs linked against the library.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const CRATE: &str = env!("CARGO_MANIFEST_DIR");

/// `target/<profile>/libnccl.so`, built by `cargo build -p oxccl-nccl` into
/// the target directory and profile of this test (`cargo test` builds the
/// package's rlib for its tests but not its cdylib).
fn lib_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>")
            .to_path_buf();
        let target = profile_dir.parent().expect("target dir");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-p", "oxccl-nccl", "--lib"])
            .arg("--target-dir")
            .arg(target)
            .current_dir(CRATE);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        run(&mut cmd);
        assert!(
            profile_dir.join("libnccl.so").exists(),
            "{} missing after cargo build",
            profile_dir.join("libnccl.so").display()
        );
        profile_dir
    })
    .clone()
}

fn include_dir() -> PathBuf {
    Path::new(CRATE).join("include")
}

fn c_dir() -> PathBuf {
    Path::new(CRATE).join("tests").join("c")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("oxccl-nccl-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{text}",
        out.status
    );
    text
}

#[test]
fn exported_symbols_match_the_allowlist() {
    let so = lib_dir().join("libnccl.so");
    let out = run(Command::new("nm").args(["-D", "--defined-only"]).arg(&so));
    let mut got: Vec<String> = out
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect();
    got.sort();
    let want_text = std::fs::read_to_string(Path::new(CRATE).join("exports.txt")).unwrap();
    let want: Vec<String> = want_text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    let extra: Vec<_> = got.iter().filter(|s| !want.contains(s)).collect();
    let missing: Vec<_> = want.iter().filter(|s| !got.contains(s)).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "exports differ from exports.txt\n extra: {extra:?}\n missing: {missing:?}"
    );
    // Every name has its profiling twin.
    for s in &want {
        if let Some(base) = s.strip_prefix('p') {
            assert!(want.iter().any(|w| w == base), "{s} without {base}");
        } else {
            assert!(want.contains(&format!("p{s}")), "{s} without p{s}");
        }
    }
    // Everything PyTorch 2.9.1, 2.11 and 2.15 import (torch-imports/, the
    // wheels' undefined nccl* symbols), and what nccl-tests calls.
    let mut needed: Vec<String> = [
        "ncclCommQueryProperties",
        "ncclTeamLsa",
        "ncclTeamWorld",
        "ncclScatter",
        "ncclCommCuDevice",
    ]
    .map(str::to_string)
    .to_vec();
    for v in ["2.9.1", "2.11.0", "2.15.0"] {
        let f = Path::new(CRATE).join(format!("torch-imports/torch-{v}.txt"));
        let t = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let names: Vec<&str> = t
            .lines()
            .filter(|l| !l.starts_with('#'))
            .flat_map(str::split_whitespace)
            .collect();
        assert!(
            names.len() >= 30,
            "{}: only {} names",
            f.display(),
            names.len()
        );
        needed.extend(names.into_iter().map(str::to_string));
    }
    for s in &needed {
        assert!(want.contains(s), "{s} is needed but not exported");
    }
}

#[test]
fn soname_is_libnccl_so_2() {
    let so = lib_dir().join("libnccl.so");
    let out = run(Command::new("readelf").arg("-d").arg(&so));
    assert!(
        out.lines()
            .any(|l| l.contains("(SONAME)") && l.contains("[libnccl.so.2]")),
        "no SONAME libnccl.so.2 in:\n{out}"
    );
}

fn compile_header(compiler: &str, std: &str, ext: &str, fake_cuda: bool) {
    let d = scratch(&format!("hdr-{compiler}-{fake_cuda}"));
    let src = d.join(format!("header_only.{ext}"));
    std::fs::copy(c_dir().join("header_only.c"), &src).unwrap();
    let mut cmd = Command::new(compiler);
    cmd.arg(format!("-std={std}"))
        .args(["-Wall", "-Wextra", "-Werror", "-pedantic"])
        .arg("-I")
        .arg(include_dir());
    if fake_cuda {
        cmd.arg("-DWITH_FAKE_CUDA")
            .arg("-I")
            .arg(c_dir().join("fakecuda"));
    }
    cmd.arg("-c").arg(&src).arg("-o").arg(d.join("a.o"));
    run(&mut cmd);
}

#[test]
fn header_compiles_as_c99() {
    compile_header("cc", "c99", "c", false);
}

#[test]
fn header_compiles_as_cxx11() {
    compile_header("c++", "c++11", "cc", false);
}

#[test]
fn header_takes_cuda_stream_from_cuda_headers() {
    compile_header("cc", "c99", "c", true);
    compile_header("c++", "c++11", "cc", true);
}

#[test]
fn config_layout_matches_nccl_2_27() {
    let d = scratch("layout");
    run(Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-I"])
        .arg(include_dir())
        .arg(c_dir().join("layout.c"))
        .arg("-o")
        .arg(d.join("layout")));
    let out = run(&mut Command::new(d.join("layout")));
    // NCCL 2.27's ncclConfig_t on x86-64: the 2.30 layout (reference/nccl-api.md
    // §1.3) up to nvlsCTAs, the last field 2.27 added; 2.28+ append after it.
    let want = "sizeof 72\nsize 0\nmagic 8\nversion 12\nblocking 16\ncgaClusterSize 20\n\
minCTAs 24\nmaxCTAs 28\nnetName 32\nsplitShare 40\ntrafficClass 44\ncommName 48\n\
collnetEnable 56\nCTAPolicy 60\nshrinkShare 64\nnvlsCTAs 68\nncclUniqueId 128\n\
ncclSimInfo_t 24\nncclTeam_t 12\n";
    assert_eq!(out, want);
}

fn build_and_run(name: &str, extra: &[&str]) -> String {
    let d = scratch(name);
    let lib = lib_dir();
    let exe = d.join(name);
    run(Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-O1", "-I"])
        .arg(include_dir())
        .arg(c_dir().join(format!("{name}.c")))
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lnccl")
        .args(extra));
    // The program must bind to this libnccl.so (its DT_NEEDED is the SONAME).
    let needed = run(Command::new("readelf").arg("-d").arg(&exe));
    assert!(needed.contains("[libnccl.so.2]"), "{needed}");
    std::fs::copy(lib.join("libnccl.so"), d.join("libnccl.so.2")).unwrap();
    run(Command::new(&exe)
        .env("LD_LIBRARY_PATH", &d)
        .env("OXCCL_TIMEOUT_MS", "60000")
        .env("NCCL_DEBUG", "WARN")
        .env("NCCL_DEBUG_FILE", d.join("nccl-%p.log")))
}

#[test]
fn c_program_single_thread() {
    let out = build_and_run("single_thread", &[]);
    assert!(out.contains("all checks passed"), "{out}");
}

#[test]
fn c_program_one_rank_per_pthread() {
    let out = build_and_run("threads", &["-lpthread"]);
    assert!(out.contains("all checks passed"), "{out}");
}

#[test]
fn c_program_shrink_without_two_ranks() {
    let out = build_and_run("shrink", &["-lpthread"]);
    assert!(out.contains("all checks passed"), "{out}");
}
