//! Configuration files as the process loads them (`NCCL_CONF_FILE`,
//! `~/.nccl.conf`): the text parser itself is fuzzed in
//! `oxccl-core/tests/fuzz_parsers.rs`; here real files go through
//! `oxccl_env::params()` in a child process (the parameters load once per
//! process), which must finish promptly, within a memory limit, and keep
//! the well-formed settings.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SEED: &str = include_str!("../../../fuzz/corpus/conf/nccl.conf");

/// In the child: load the parameters and print a few of them.
#[test]
#[ignore = "child process of the conf-file fuzz test (started by run_child)"]
fn child_entry() {
    assert!(
        std::env::var_os("FUZZ_CONF_CHILD").is_some(),
        "child_entry is the child of the conf-file fuzz test: it runs when run_child starts it"
    );
    let p = oxccl_env::params();
    println!("NCCL_DEBUG={:?}", p.raw("NCCL_DEBUG"));
    for w in oxccl_env::param_warnings() {
        println!("warning: {}", w.chars().take(200).collect::<String>());
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("0");
    println!("VmHWM_KiB={hwm}");
}

/// The child's peak resident memory in KiB, from its output.
fn peak_kib(out: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix("VmHWM_KiB="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Runs `child_entry` with `env`, under a 1 GiB address-space limit and a
/// 10 s wall-clock limit. Returns (finished in time and succeeded, stdout).
fn run_child(env: &[(&str, &str)], home: Option<&str>) -> (bool, String) {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -v 1048576 2>/dev/null; exec \"$0\" --ignored --exact child_entry --nocapture --test-threads=1")
        .arg(exe)
        .env("FUZZ_CONF_CHILD", "1")
        .env_remove("NCCL_CONF_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    match home {
        Some(h) => cmd.env("HOME", h),
        None => cmd.env_remove("HOME"),
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn");
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            let out =
                std::io::read_to_string(child.stdout.take().expect("piped")).unwrap_or_default();
            return (st.success(), out);
        }
        if t.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            return (false, "timed out".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("oxccl-fuzz-conf-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

/// Mutated seed files (deterministic edits), non-UTF-8 bytes, CRLF, a
/// directory, a missing file: each loads, and a valid NCCL_DEBUG line survives
/// whatever garbage surrounds it.
#[test]
fn odd_files_load() {
    let dir = tmpdir("odd");
    let mut cases: Vec<(String, Vec<u8>)> = vec![
        ("seed".into(), SEED.as_bytes().to_vec()),
        ("crlf".into(), SEED.replace('\n', "\r\n").into_bytes()),
        ("nul".into(), b"NCCL_DEBUG=WARN\n\0\0\0=\0\n".to_vec()),
        ("bom".into(), b"\xef\xbb\xbfNCCL_DEBUG=WARN\n".to_vec()),
        (
            "latin1".into(),
            b"NCCL_DEBUG=WARN\nNCCL_ALGO=\xe9\n".to_vec(),
        ),
        (
            "long_line".into(),
            format!("NCCL_DEBUG=WARN\nNCCL_ALGO={}\n", "ring,".repeat(20_000)).into_bytes(),
        ),
        (
            "many_lines".into(),
            "NCCL_DEBUG=WARN\n".repeat(50_000).into_bytes(),
        ),
    ];
    let mut x: u32 = 12345;
    for i in 0..8 {
        let mut b = SEED.as_bytes().to_vec();
        for _ in 0..(4 + i) {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let at = (x >> 8) as usize % b.len();
            b[at] = (x >> 20) as u8;
        }
        cases.push((format!("mutated{i}"), b));
    }
    for (name, bytes) in &cases {
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("write");
        let (ok, out) = run_child(
            &[("NCCL_CONF_FILE", path.to_str().expect("utf-8 path"))],
            None,
        );
        assert!(ok, "{name}: the child failed or hung: {out}");
        assert!(out.contains("NCCL_DEBUG="), "{name}: {out}");
        assert!(
            peak_kib(&out) < 256 << 10,
            "{name}: peak memory {} KiB",
            peak_kib(&out)
        );
        if ["seed", "crlf"].contains(&name.as_str()) {
            assert!(out.contains("NCCL_DEBUG=Some(\"INFO\")"), "{name}: {out}");
        }
    }
    for path in [dir.to_str().unwrap(), "/nonexistent/nccl.conf"] {
        let (ok, out) = run_child(&[("NCCL_CONF_FILE", path)], None);
        assert!(ok, "{path}: {out}");
    }
    // ~/.nccl.conf through HOME.
    std::fs::write(dir.join(".nccl.conf"), "NCCL_DEBUG=TRACE\n").unwrap();
    let (ok, out) = run_child(&[], dir.to_str());
    assert!(ok && out.contains("NCCL_DEBUG=Some(\"TRACE\")"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: `NCCL_CONF_FILE` pointing at an endless source used to be read
/// with an unbounded `read_to_string` (`/dev/zero` grew the first `params()`
/// call to 515 MiB before failing; a FIFO no one writes to blocked it forever).
/// The loader now reads regular files only, at most 1 MiB.
#[test]
fn endless_conf_file_is_bounded() {
    let t = Instant::now();
    let (ok, out) = run_child(&[("NCCL_CONF_FILE", "/dev/zero")], None);
    assert!(ok, "NCCL_CONF_FILE=/dev/zero: {out}");
    // Under the 1 GiB limit std's read_to_string fails with OutOfMemory and the
    // loader warns; the bug is that it got that far: a bounded reader stops at
    // a few MiB.
    assert!(
        peak_kib(&out) < 64 << 10,
        "NCCL_CONF_FILE=/dev/zero: peak memory {} KiB after {:?}: {out}",
        peak_kib(&out),
        t.elapsed()
    );
    let dir = tmpdir("fifo");
    let fifo = dir.join("fifo");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    if made {
        let (ok, out) = run_child(&[("NCCL_CONF_FILE", fifo.to_str().unwrap())], None);
        assert!(ok, "NCCL_CONF_FILE=<fifo>: {out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
