//! For tests in this workspace: builds the repo's test plugin
//! (`crates/oxccl-net-test-plugin`) with cargo and returns it under the file
//! name NCCL's rules give `NCCL_NET_PLUGIN=oxtest` (`libnccl-net-oxtest.so`).
//! Not for production use: it runs `cargo`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the plugin (`features`: "" or e.g. "only-v8") into a target
/// directory beside the calling test binary's, and copies it to
/// `target/oxtest-lib/<owner>-<features or "oxtest">/libnccl-net-oxtest.so`
/// (each test binary its own copy: a process may have another one loaded).
/// Panics when the build fails (a test helper).
pub fn build_test_plugin(features: &str, owner: &str) -> PathBuf {
    // Once per (features, owner) and process: tests of one binary run in
    // parallel threads, and two of them copying to the same file raced (one
    // renamed the other's temporary away).
    static BUILT: std::sync::Mutex<Vec<(String, String, PathBuf)>> =
        std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, _, p)) = built.iter().find(|(f, o, _)| f == features && o == owner) {
        return p.clone();
    }
    let dst = build_uncached(features, owner);
    built.push((features.to_string(), owner.to_string(), dst.clone()));
    dst
}

fn build_uncached(features: &str, owner: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let target = profile_dir.parent().expect("target dir");
    let (tdir, sub) = if features.is_empty() {
        (target.to_path_buf(), "oxtest")
    } else {
        (target.join(format!("oxtest-{features}")), features)
    };
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-p", "oxccl-net-test-plugin"])
        .arg("--target-dir")
        .arg(&tdir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if !features.is_empty() {
        cmd.args(["--features", features]);
    }
    let out = cmd.output().expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build of the test plugin failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let so = tdir.join("debug").join("libnccl_net_oxtest.so");
    assert!(so.exists(), "{} missing after cargo build", so.display());
    let dir = target.join("oxtest-lib").join(format!("{owner}-{sub}"));
    std::fs::create_dir_all(&dir).expect("plugin dir");
    let dst = dir.join("libnccl-net-oxtest.so");
    // Copy to a new file and rename: a process may have the old one loaded.
    let tmp = dir.join(format!(".tmp{}", std::process::id()));
    std::fs::copy(&so, &tmp).expect("copy plugin");
    std::fs::rename(&tmp, &dst).expect("rename plugin");
    dst
}

/// The C test tuner (`tests/plugins/oxtest_tuner.c` of this crate).
pub fn tuner_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/plugins/oxtest_tuner.c")
}

/// Compiles the C file `source` with `cc -shared -fPIC` and `defines`
/// (`-D` flags without the `-D`) into
/// `target/oxtest-lib/<dir>/<file>`, once per process and output. Panics
/// when the compiler fails (a test helper).
pub fn build_c_plugin(source: &Path, defines: &[&str], dir: &str, file: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let exe = std::env::current_exe().expect("current_exe");
    let target = exe
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .expect("target dir");
    let out_dir = target.join("oxtest-lib").join(dir);
    let out = out_dir.join(file);
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if built.contains(&out) {
        return out;
    }
    std::fs::create_dir_all(&out_dir).expect("plugin dir");
    // Compile to a new file and rename: another test process may have the
    // old one loaded.
    let tmp = out_dir.join(format!(".tmp{}-{file}", std::process::id()));
    let mut cmd = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".to_string()));
    cmd.args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
        .arg(&tmp)
        .arg(source);
    for d in defines {
        cmd.arg(format!("-D{d}"));
    }
    let o = cmd.output().expect("run cc");
    assert!(
        o.status.success(),
        "cc {} {defines:?} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::rename(&tmp, &out).expect("rename plugin");
    built.push(out.clone());
    out
}
