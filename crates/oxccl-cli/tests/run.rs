//! `oxccl run` with real processes: LD_PRELOAD reaches the command and its
//! children with oxccl's library first, the exit status is the command's,
//! and `--check` tells a process bound to oxccl (the library preloaded, or
//! a copy of it elsewhere) from one bound to another libnccl.so.2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_oxccl");

/// oxccl's libnccl.so, built for this test as a dev-dependency (cargo
/// puts the cdylib in target/<profile>/deps beside the test executable).
fn oxccl_lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let p = deps.join("libnccl.so");
    assert!(
        p.is_file(),
        "{} missing: oxccl-nccl is a dev-dependency and should be built",
        p.display()
    );
    p
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("runtest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn oxccl_run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(BIN);
    c.arg("run")
        .args(args)
        .stdin(Stdio::null())
        .env_remove("LD_PRELOAD");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run oxccl run")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A program that loads libnccl.so.2 by name, prints its ncclGetVersion
/// code and stays alive long enough for a few polls of `--check`.
const PROG: &str = r#"
import ctypes, os, time
lib = ctypes.CDLL("libnccl.so.2")
v = ctypes.c_int(0)
assert lib.ncclGetVersion(ctypes.byref(v)) == 0
# One write of the whole line: processes that share the pipe may not
# interleave it (print writes its pieces separately when unbuffered).
os.write(1, f"version {v.value}\n".encode())
time.sleep(0.6)
"#;

/// A stand-in for NVIDIA's library: SONAME libnccl.so.2, ncclGetVersion only.
fn fake_nccl(dir: &Path) -> PathBuf {
    let src = dir.join("fake.c");
    std::fs::write(
        &src,
        "int ncclGetVersion(int *v) { *v = 99999; return 0; }\n",
    )
    .unwrap();
    let so = dir.join("libnccl.so.2");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o"])
        .arg(&so)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success(), "cc failed for the fake libnccl.so.2");
    so
}

#[test]
fn preload_reaches_children_first_and_exit_status_is_the_command_s() {
    let lib = std::fs::canonicalize(oxccl_lib()).unwrap();
    let lib = lib.display().to_string();
    // The grandchild prints the LD_PRELOAD it inherited; then the job exits 7.
    let o = oxccl_run(
        &[
            "--lib",
            &lib,
            "--",
            "sh",
            "-c",
            "sh -c 'echo \"$LD_PRELOAD\"'; exit 7",
        ],
        &[("LD_PRELOAD", "/nonexistent/earlier.so")],
    );
    assert_eq!(o.status.code(), Some(7), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        out.trim(),
        format!("{lib}:/nonexistent/earlier.so"),
        "{}",
        text(&o)
    );
    // A command that cannot start: 127, named.
    let o = oxccl_run(&["--lib", &lib, "--", "/nonexistent/cmd"], &[]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot start /nonexistent/cmd"));
    // A missing --lib is a usage error naming the argument.
    let o = oxccl_run(&["--lib", "/nonexistent/libnccl.so.2", "--", "true"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--lib /nonexistent/libnccl.so.2"));
    // Killed by a signal: 128 + its number.
    let o = oxccl_run(&["--lib", &lib, "--", "sh", "-c", "kill -TERM $$"], &[]);
    assert_eq!(o.status.code(), Some(128 + 15), "{}", text(&o));
}

#[test]
fn check_tells_oxccl_bound_processes_from_others() {
    let dir = tmpdir("check");
    let prog = dir.join("prog.py");
    std::fs::write(&prog, PROG).unwrap();
    // oxccl's library twice under plain names: the one preloaded, and a copy
    // (another file: recognised by content, not by path or inode).
    let pre = dir.join("pre");
    let copy = dir.join("copy");
    let fake = dir.join("fake");
    for d in [&pre, &copy, &fake] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::copy(oxccl_lib(), pre.join("libnccl.so.2")).unwrap();
    std::fs::copy(oxccl_lib(), copy.join("libnccl.so.2")).unwrap();
    let fake_so = fake_nccl(&fake);
    let p = prog.display();
    let script = format!(
        "python3 {p} & \
         LD_PRELOAD={copy}/libnccl.so.2 python3 {p}; \
         env -u LD_PRELOAD LD_LIBRARY_PATH={fake} python3 {p}; \
         wait; exit 5",
        copy = copy.display(),
        fake = fake.display()
    );
    let pre_lib = pre.join("libnccl.so.2").display().to_string();
    let o = oxccl_run(
        &["--check", "--lib", &pre_lib, "--", "sh", "-c", &script],
        &[],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(5), "{t}");
    let out = String::from_utf8_lossy(&o.stdout);
    // Two processes got oxccl (22705 is its NCCL version code), one the fake.
    assert_eq!(out.matches("version 22705").count(), 2, "{t}");
    assert_eq!(out.matches("version 99999").count(), 1, "{t}");
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("prog.py")).collect();
    let bound_to = |file: &str, ok: bool| {
        lines
            .iter()
            .filter(|l| {
                l.contains(&format!("bind to {}", if ok { "oxccl (" } else { "" }))
                    && l.contains(file)
            })
            .filter(|l| l.trim_start().starts_with(if ok { "✔" } else { "✘" }))
            .count()
    };
    assert!(bound_to(&pre_lib, true) >= 1, "{t}");
    assert!(
        bound_to(&format!("{}/libnccl.so.2", copy.display()), true) >= 1,
        "{t}"
    );
    assert!(bound_to(&fake_so.display().to_string(), false) >= 1, "{t}");
    assert!(err.contains("not oxccl"), "{t}");
    let _ = std::fs::remove_dir_all(&dir);
}
