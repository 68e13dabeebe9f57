//! What the `oxccl perf` test files share: the command with no outer
//! launcher's world in its environment, and a run with a deadline.

use std::ffi::OsStr;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `BIN perf ARGS...`, with the variables of torchrun, Slurm, Open MPI and
/// oxccl's own launcher removed (a test must never join an outer world).
pub fn perf_command(bin: impl AsRef<OsStr>, args: &[&str]) -> Command {
    let mut c = Command::new(bin);
    c.arg("perf").args(args);
    for v in [
        "RANK",
        "WORLD_SIZE",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "NCCL_COMM_ID",
        "OXCCL_PERF_RANK",
    ] {
        c.env_remove(v);
    }
    c.stdin(Stdio::null());
    c
}

/// Runs with a deadline; panics (after killing it) if it runs past `secs`.
pub fn run_for(mut c: Command, secs: u64) -> Output {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start oxccl");
    let t0 = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "oxccl ran past {secs} s\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
