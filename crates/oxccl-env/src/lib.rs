//! The process's environment: parameters, logs and the machine's files.
//!
//! Thin I/O around the pure registry and log formatting in `oxccl_core`:
//!
//! * [`params()`] reads the environment and the configuration files once
//!   (`NCCL_CONF_FILE` if set, else `~/.nccl.conf` then `/etc/nccl.conf`; a missing file
//!   is fine) into [`oxccl_core::params::Params`]. The environment wins over files, an
//!   earlier file over a later one.
//! * [`sysfs`]: the machine's files for the topology walk (the pure walk is
//!   `oxccl_core::topo::read_topology`), rooted at `/` or at a recorded machine.
//! * The `NCCL_DEBUG` logger ([`log`]) writes lines shaped like NCCL's to stdout (NCCL's
//!   default sink) or to `NCCL_DEBUG_FILE`. Use the macros [`warn!`], [`info!`] and
//!   [`trace!`].
//!
//! Start-up order, without recursion: `params()` never logs. The logger is built from
//! `params()` on first use; right after, once per process, it reports the loading
//! warnings (WARN) and echoes every honoured parameter that was set (INFO, subsystem
//! ENV: `NAME set by environment to VALUE.`), writing those lines itself.

#![forbid(unsafe_code)]

pub mod log;
pub mod sysfs;

pub use log::{last_error, set_device, Level, Subsys};

use oxccl_core::params::{self, Params};
use std::panic::Location;
use std::sync::OnceLock;

struct Loaded {
    params: Params,
    /// Problems reading files (beyond what `Params` reports), with the line
    /// that found each.
    io_warnings: Vec<(String, &'static Location<'static>)>,
}

static LOADED: OnceLock<Loaded> = OnceLock::new();

/// The parameters of this process, loaded once from the environment and the
/// configuration files.
pub fn params() -> &'static Params {
    &loaded().params
}

/// Every warning from loading the parameters: unknown names, malformed values, bad
/// configuration lines and unreadable files. The C shell and `oxccl doctor` print these.
pub fn param_warnings() -> Vec<String> {
    located_param_warnings()
        .into_iter()
        .map(|(w, _)| w)
        .collect()
}

/// [`param_warnings`], each with the source line that found the problem (the
/// logger's WARN lines name it).
pub fn located_param_warnings() -> Vec<(String, &'static Location<'static>)> {
    let l = loaded();
    let mut w = l.io_warnings.clone();
    w.extend(l.params.located_warnings());
    w
}

fn loaded() -> &'static Loaded {
    LOADED.get_or_init(load)
}

/// The configuration files to read, in precedence order.
pub fn conf_files(env: &[(String, String)]) -> Vec<String> {
    let get = |k: &str| {
        env.iter()
            .find(|(n, v)| n == k && !v.trim().is_empty())
            .map(|(_, v)| v.trim().to_string())
    };
    if let Some(f) = get(params::CONF_FILE.name) {
        return vec![f];
    }
    let mut files = Vec::new();
    if let Some(home) = get("HOME") {
        files.push(format!("{}/.nccl.conf", home.trim_end_matches('/')));
    }
    files.push("/etc/nccl.conf".to_string());
    files
}

fn load() -> Loaded {
    // vars_os: a non-UTF-8 variable must not panic the library; such names or values
    // cannot be ours anyway.
    let env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let mut io_warnings = Vec::new();
    let mut files = Vec::new();
    for path in conf_files(&env) {
        match read_conf_file(&path) {
            Ok(text) => files.push((path, text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if env.iter().any(|(k, _)| k == params::CONF_FILE.name) {
                    io_warnings.push((
                        format!("NCCL_CONF_FILE {path} does not exist"),
                        Location::caller(),
                    ));
                }
            }
            Err(e) => io_warnings.push((
                format!("cannot read configuration file {path}: {e}"),
                Location::caller(),
            )),
        }
    }
    let params = Params::from_sources(&env, &files).unwrap_or_default();
    Loaded {
        params,
        io_warnings,
    }
}

/// Bytes of a configuration file read at most: real files are a few lines;
/// `NCCL_CONF_FILE=/dev/zero` must not make the first call allocate without
/// bound (found by `tests/fuzz_conf_file.rs`).
const CONF_FILE_MAX: u64 = 1 << 20;

/// Reads a configuration file: regular files only (a FIFO would block the
/// first oxccl call forever), at most [`CONF_FILE_MAX`] bytes.
fn read_conf_file(path: &str) -> std::io::Result<String> {
    use std::io::Read;
    // stat before open: opening a FIFO for reading blocks until a writer comes.
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    if meta.len() > CONF_FILE_MAX {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {CONF_FILE_MAX} bytes"),
        ));
    }
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(CONF_FILE_MAX)
        .read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::conf_files;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn conf_file_order() {
        assert_eq!(
            conf_files(&env(&[("HOME", "/home/u/")])),
            vec!["/home/u/.nccl.conf", "/etc/nccl.conf"]
        );
        assert_eq!(conf_files(&env(&[])), vec!["/etc/nccl.conf"]);
        assert_eq!(
            conf_files(&env(&[("HOME", "/h"), ("NCCL_CONF_FILE", "/x/n.conf")])),
            vec!["/x/n.conf"]
        );
        assert_eq!(
            conf_files(&env(&[("HOME", "/h"), ("NCCL_CONF_FILE", " ")])),
            vec!["/h/.nccl.conf", "/etc/nccl.conf"]
        );
    }
}
