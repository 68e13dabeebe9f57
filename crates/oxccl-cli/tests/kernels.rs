//! `oxccl kernels`: arguments it cannot use are refused before anything
//! compiles (exit 2, the argument named), and nothing is written.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_oxccl");

fn run(tag: &str, args: &[&str]) -> (i32, String, std::path::PathBuf) {
    let out = std::env::temp_dir().join(format!("oxccl-kernels-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let o = Command::new(BIN)
        .arg("kernels")
        .arg("--out")
        .arg(&out)
        .args(args)
        .output()
        .expect("oxccl runs");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        out,
    )
}

#[test]
fn an_architecture_that_is_not_a_compute_capability_is_refused() {
    let (rc, err, out) = run("arch", &["--arch", "90,5000"]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("--arch 5000"), "{err}");
    assert!(!out.exists(), "{} was written", out.display());
}

#[test]
fn zero_jobs_is_refused() {
    let (rc, err, out) = run("jobs", &["--arch", "90", "--jobs", "0"]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("--jobs 0"), "{err}");
    assert!(!out.exists());
}
