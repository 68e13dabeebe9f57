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

/// `oxccl kernels --list DIR` over a folder laid out as `oxccl kernels
/// --out` writes it (file names from the library's own naming, ELF and PTX
/// headers as NVRTC's output starts): each program of each architecture is
/// reported with the file the library would load (its own CUBIN; PTX for a
/// newer GPU), a program without a file is named as one that would compile
/// (exit 1), and nothing needs NVRTC or a GPU.
#[test]
fn list_says_which_file_each_program_loads_from() {
    use oxccl::gpu::tools::compile::{prebuilt_name, Target};
    use oxccl::gpu::tools::kernels;
    let dir = std::env::temp_dir().join(format!("oxccl-kernels-list-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let programs = kernels::prebuilt_sources(90);
    for src in &programs {
        std::fs::write(
            dir.join(prebuilt_name(src, Target::Cubin(90))),
            b"\x7fELF-cubin",
        )
        .unwrap();
        std::fs::write(
            dir.join(prebuilt_name(src, Target::Ptx(90))),
            b"//\n.version 9.0\n.target sm_90\n\0",
        )
        .unwrap();
    }
    let list = |archs: &str| {
        let o = Command::new(BIN)
            .args(["kernels", "--list", "--dir"])
            .arg(&dir)
            .args(["--arch", archs])
            .output()
            .expect("oxccl runs");
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (rc, out, err) = list("90,120");
    assert_eq!(rc, 0, "{out}{err}");
    let n = programs.len();
    assert!(
        out.contains(&format!(
            "sm_90: {n} programs: {n} CUBIN, 0 PTX, 0 to compile"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "sm_120: {n} programs: 0 CUBIN, {n} PTX, 0 to compile"
        )),
        "{out}"
    );
    let f32 = kernels::ring_program(oxccl_core::DataType::Float32);
    let cubin = prebuilt_name(&f32, Target::Cubin(90));
    assert!(
        out.lines()
            .any(|l| l.starts_with("sm_90 ring-f32.cu") && l.ends_with(&cubin)),
        "{out}"
    );
    // An sm_80 GPU has no CUBIN of its major version and no older PTX here.
    let (rc, out, _) = list("80");
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.contains("sm_80 ring-f32.cu") && out.contains("not prebuilt"),
        "{out}"
    );
    // One program missing: named, exit 1.
    std::fs::remove_file(dir.join(&cubin)).unwrap();
    std::fs::remove_file(dir.join(prebuilt_name(&f32, Target::Ptx(90)))).unwrap();
    let (rc, out, _) = list("90");
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("sm_90 ring-f32.cu") && l.contains("NVRTC compiles it")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "sm_90: {n} programs: {} CUBIN, 0 PTX, 1 to compile",
            n - 1
        )),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn list_of_a_folder_that_does_not_exist_fails() {
    let o = Command::new(BIN)
        .args([
            "kernels",
            "--list",
            "--dir",
            "/nonexistent/oxccl-kernels",
            "--arch",
            "90",
        ])
        .output()
        .expect("oxccl runs");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("/nonexistent/oxccl-kernels is not a folder")
    );
}
