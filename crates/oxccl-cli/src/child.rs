//! Child processes of this executable: a probe that loads a library (NVML,
//! libcuda, libnccl) runs as `oxccl <sub> --probe-...` under a timeout, so a
//! hanging or crashing driver costs the tool seconds, never the tool.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a child that loads a library may take.
pub const CHILD_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs this executable with subcommand `sub` and `args`, waits at most
/// `timeout` (then kills it); its stdout, or why not.
pub fn run_sub(sub: &str, args: &[&std::ffi::OsStr], timeout: Duration) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let mut child = Command::new(exe)
        .arg(sub)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the probe: {e}"))?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut out = String::new();
                if let Some(mut so) = child.stdout.take() {
                    let _ = so.read_to_string(&mut out);
                }
                if status.success() {
                    return Ok(out);
                }
                let why = out.trim();
                return Err(match status.code() {
                    Some(c) if !why.is_empty() => format!("{why} (probe exit {c})"),
                    Some(c) => format!("the probe exited with status {c}"),
                    None => "the probe was killed by a signal (the library crashed it)".into(),
                });
            }
            Ok(None) if start.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "loading it did not finish within {} s (killed)",
                    timeout.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("waiting for the probe: {e}")),
        }
    }
}
