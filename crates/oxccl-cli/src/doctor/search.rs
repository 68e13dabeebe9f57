//! Where the doctor looks for libraries and how it reads their versions:
//! the folders of `/etc/ld.so.conf`, the Python prefixes pip installs into,
//! and an NCCL library's version (asked in a child process, or from its
//! file name). Shared by the library search ([`super::probe`]) and the
//! program's loader view ([`super::loader`]).

use std::io::Read;
use std::path::Path;

use super::checks;
use crate::child::{run_sub, CHILD_TIMEOUT};
use crate::system::System;

/// Folders of `/etc/ld.so.conf` (following `include` globs), under the root.
pub(super) fn ld_so_conf_dirs(sys: &System, file: &str, depth: u32, out: &mut Vec<String>) {
    if depth > 4 {
        return;
    }
    let Some(text) = sys.read(file) else { return };
    for l in text.lines() {
        let l = l.split('#').next().unwrap_or("").trim();
        if l.is_empty() {
            continue;
        }
        if let Some(pat) = l.strip_prefix("include") {
            let pat = pat.trim();
            let pat = if pat.starts_with('/') {
                pat.to_string()
            } else {
                format!("/etc/{pat}")
            };
            for f in sys.glob(&pat) {
                ld_so_conf_dirs(sys, &f, depth + 1, out);
            }
        } else if l.starts_with('/') {
            out.push(l.to_string());
        }
    }
}

/// Where conda installs live: /opt/conda, $CONDA_PREFIX, ~/miniconda3, ~/anaconda3.
pub(super) fn conda_prefixes(sys: &System) -> Vec<String> {
    let mut conda = vec!["/opt/conda".to_string()];
    if let Some(c) = sys.var("CONDA_PREFIX") {
        conda.push(c.to_string());
    }
    if let Some(h) = sys.var("HOME") {
        conda.push(format!("{h}/miniconda3"));
        conda.push(format!("{h}/anaconda3"));
    }
    conda
}

/// Prefixes whose `lib/python3*/{site,dist}-packages` pip installs into:
/// /usr, /usr/local, conda's, $VIRTUAL_ENV, the virtual environment of the
/// first `python3` on PATH (a `pyvenv.cfg` above its `bin/`: used without
/// activating it, as containers and job scripts do), ~/.local.
pub(super) fn python_prefixes(sys: &System) -> Vec<String> {
    let mut py = vec!["/usr".to_string(), "/usr/local".to_string()];
    py.extend(conda_prefixes(sys));
    if let Some(v) = sys.var("VIRTUAL_ENV") {
        py.push(v.trim_end_matches('/').to_string());
    }
    let first_python = sys
        .var("PATH")
        .unwrap_or("")
        .split(':')
        .map(|d| d.trim_end_matches('/'))
        .find(|d| d.starts_with('/') && sys.exists(&format!("{d}/python3")));
    if let Some(venv) = first_python
        .and_then(|d| d.strip_suffix("/bin"))
        .filter(|v| sys.exists(&format!("{v}/pyvenv.cfg")))
    {
        if !py.iter().any(|p| p == venv) {
            py.push(venv.to_string());
        }
    }
    if let Some(h) = sys.var("HOME") {
        py.push(format!("{h}/.local"));
    }
    py
}

pub(super) fn is_elf(p: &Path) -> bool {
    let mut b = [0u8; 4];
    std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
        && b == *b"\x7fELF"
}

pub(super) fn nccl_version(
    canon: &Path,
    path: &str,
    target: &str,
) -> Result<(String, &'static str), String> {
    let by_name = checks::version_from_name(target).or_else(|| checks::version_from_name(path));
    // Real libraries are asked, also under a fixture root (a test may plant a
    // built one); fake ones (fixtures) only have their name to go by.
    if is_elf(canon) {
        match run_sub(
            "doctor",
            &["--probe-nccl".as_ref(), canon.as_os_str()],
            CHILD_TIMEOUT,
        ) {
            Ok(out) => {
                if let Ok(code) = out.trim().parse::<i64>() {
                    return Ok((checks::decode_nccl_version(code), "ncclGetVersion"));
                }
                return by_name
                    .map(|v| (v, "file name"))
                    .ok_or_else(|| format!("unreadable probe output {:?}", out.trim()));
            }
            Err(e) => {
                return by_name.map(|v| (v, "file name")).ok_or(e);
            }
        }
    }
    by_name
        .map(|v| (v, "file name"))
        .ok_or_else(|| "not a loadable library and no version in its name".into())
}
