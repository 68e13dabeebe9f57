//! `oxccl run [--check] -- CMD...`: starts CMD with oxccl's `libnccl.so.2`
//! in `LD_PRELOAD` (before what was there), so that CMD and every process it
//! starts (torchrun's workers, srun's tasks, a shell's children) bind their
//! NCCL calls to oxccl. The exit status is CMD's (128 + N when a signal N
//! ended it).
//!
//! `--check` watches the job while it runs: every [`POLL`] it lists the
//! command's descendants from /proc (as a child subreaper, so processes
//! whose parent exited stay in the job), reads each one's mapped files and
//! LD_PRELOAD, and at the end says for each process which library its NCCL
//! calls bind to ([`binding`], pure) and whether that is oxccl's (by the
//! file's identity or its content, [`is_oxccl_file`]). A process that lives
//! shorter than one poll can be missed.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clap::Args;

/// How often `--check` looks at the job's processes (torch maps libnccl
/// seconds after start; a 20 ms poll of a few dozen processes costs < 1 % of a core).
pub const POLL: Duration = Duration::from_millis(20);

/// Text that every oxccl libnccl carries (its `NCCL_DEBUG=INFO` version
/// line) and NVIDIA's does not: how a copy is recognised wherever it lies.
pub const OXCCL_MARKER: &[u8] = b"oxccl version ";

#[derive(Args)]
#[command(
    about = "Run a command with oxccl's libnccl.so.2 preloaded for it and its children",
    after_help = "Examples:\n  oxccl run -- torchrun --nproc-per-node=8 train.py\n  oxccl run --check -- python3 train.py\n\nThe library is found beside the oxccl executable, in ../lib (an install prefix), \
or in the Python package when oxccl came from the wheel; --lib names another. LD_PRELOAD is \
inherited by every process the command starts. Exit status: the command's (128+N after signal N), \
127 when it cannot be started, 2 for a bad command line."
)]
pub struct RunArgs {
    /// After the command ends, say for each process of the job whether its NCCL calls bound to oxccl (on stderr)
    #[arg(long)]
    pub check: bool,
    /// The libnccl.so.2 to preload instead of the one shipped with this oxccl
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,
    /// The command and its arguments (after `--`)
    #[arg(required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `lib` first, then the entries already in `existing` (LD_PRELOAD's
/// separators are spaces and colons), without a second copy of `lib`.
pub fn preload_value(lib: &str, existing: Option<&str>) -> String {
    let mut v = vec![lib];
    for e in existing.unwrap_or("").split([' ', ':']) {
        if !e.is_empty() && e != lib {
            v.push(e);
        }
    }
    v.join(":")
}

/// One process as `--check` last saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcFacts {
    pub pid: i32,
    /// Its command line, spaces between arguments.
    pub cmdline: String,
    /// Mapped files whose name starts with `libnccl`, in map order, plus any
    /// other mapped file known to be oxccl's.
    pub nccl_files: Vec<String>,
    /// Its LD_PRELOAD entries.
    pub preload: Vec<String>,
}

/// Which file a process's NCCL calls bind to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// No NCCL library mapped (a launcher, a shell).
    None,
    /// One library serves them: preloaded (the loader binds preloads before
    /// every library but the executable) or the only one mapped.
    One { file: String, preloaded: bool },
    /// Several mapped and none preloaded: each caller binds to the first in
    /// its own search order.
    Several(Vec<String>),
}

/// The dynamic loader's rule, applied to what /proc shows: a preloaded
/// library that is mapped wins; else the only mapped one; else it depends
/// on the caller.
pub fn binding(p: &ProcFacts) -> Binding {
    if let Some(f) = p.preload.iter().find(|f| p.nccl_files.contains(f)) {
        return Binding::One {
            file: f.clone(),
            preloaded: true,
        };
    }
    match p.nccl_files.as_slice() {
        [] => Binding::None,
        [one] => Binding::One {
            file: one.clone(),
            preloaded: false,
        },
        many => Binding::Several(many.to_vec()),
    }
}

/// One line of the `--check` report for a process; `oxccl_file` says
/// whether a file is oxccl's.
pub fn verdict(p: &ProcFacts, oxccl_file: &dyn Fn(&str) -> bool) -> (bool, String) {
    let who = format!("pid {} ({})", p.pid, p.cmdline);
    match binding(p) {
        Binding::None => (true, format!("{who}: no libnccl loaded")),
        Binding::One { file, preloaded } => {
            let how = if preloaded {
                "preloaded"
            } else {
                "the only libnccl mapped"
            };
            if oxccl_file(&file) {
                (
                    true,
                    format!("{who}: NCCL calls bind to oxccl ({file}, {how})"),
                )
            } else {
                (
                    false,
                    format!("{who}: NCCL calls bind to {file} ({how}), not oxccl"),
                )
            }
        }
        Binding::Several(files) => {
            let ox: Vec<&String> = files.iter().filter(|f| oxccl_file(f)).collect();
            (
                false,
                format!(
                    "{who}: several libnccl mapped and none preloaded ({}): {}",
                    files.join(", "),
                    if ox.is_empty() {
                        "none is oxccl".to_string()
                    } else {
                        "calls may bind to either (LD_PRELOAD was dropped on the way?)".to_string()
                    }
                ),
            )
        }
    }
}

/// Whether a file is oxccl's library: the preloaded file itself (same
/// device and inode), else a copy, known by [`OXCCL_MARKER`] in its bytes.
pub fn is_oxccl_file(path: &Path, ours: Option<(u64, u64)>) -> bool {
    if let (Some(id), Ok(m)) = (ours, std::fs::metadata(path)) {
        if (m.dev(), m.ino()) == id {
            return true;
        }
    }
    contains_marker(path)
}

/// Reads the file in 1 MiB blocks looking for [`OXCCL_MARKER`].
fn contains_marker(path: &Path) -> bool {
    use std::io::Read;
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    let mut buf = vec![0u8; 1 << 20];
    let keep = OXCCL_MARKER.len() - 1;
    let mut have = 0;
    loop {
        let n = match f.read(&mut buf[have..]) {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        let end = have + n;
        if buf[..end]
            .windows(OXCCL_MARKER.len())
            .any(|w| w == OXCCL_MARKER)
        {
            return true;
        }
        // Keep the tail: the marker may straddle two reads.
        let tail = end.saturating_sub(keep);
        buf.copy_within(tail..end, 0);
        have = end - tail;
    }
}

/// The library to preload: `--lib`, else [`crate::libpath::find`].
fn library(a: &RunArgs) -> Result<PathBuf, String> {
    let p = match &a.lib {
        Some(p) if p.is_file() => p.clone(),
        Some(p) => return Err(format!("--lib {}: no such file", p.display())),
        None => crate::libpath::find().map_err(|tried| {
            format!(
                "oxccl's libnccl.so.2 is not beside this executable, in ../lib or in the oxccl Python package (looked at {}); build it with `cargo xtask build`, install with `cargo xtask install --prefix DIR` or `pip install` the wheel, or pass --lib PATH",
                tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            )
        })?,
    };
    // Absolute: the job's processes change directories.
    std::fs::canonicalize(&p).map_err(|e| format!("--lib {}: {e}", p.display()))
}

pub fn main(a: &RunArgs) -> i32 {
    let lib = match library(a) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("oxccl run: {e}");
            return 2;
        }
    };
    let lib_s = lib.display().to_string();
    let existing = std::env::var("LD_PRELOAD").ok();
    let preload = preload_value(&lib_s, existing.as_deref());
    if a.check {
        // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    }
    let mut cmd = Command::new(&a.command[0]);
    cmd.args(&a.command[1..]).env("LD_PRELOAD", &preload);
    let pid = match cmd.spawn() {
        Ok(c) => c.id() as i32,
        Err(e) => {
            eprintln!(
                "oxccl run: cannot start {}: {e}",
                a.command[0].to_string_lossy()
            );
            return 127;
        }
    };
    // Ctrl-C reaches the whole foreground group: the command decides, the
    // launcher only reports (as a shell's `system()` does).
    // SAFETY: setting a signal's disposition to SIG_IGN has no handler to run.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
    }
    if a.check {
        let (status, seen) = watch(pid);
        report(&seen, &lib);
        status
    } else {
        wait_for(pid)
    }
}

/// The exit status to return for a wait status.
fn exit_code(st: i32) -> i32 {
    let s = std::process::ExitStatus::from_raw(st);
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

fn wait_for(pid: i32) -> i32 {
    let mut st = 0;
    loop {
        // SAFETY: waitpid on our own child with a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        if r == pid {
            return exit_code(st);
        }
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return 127;
        }
    }
}

/// Polls the job until `pid` exits, reaping orphans adopted on the way;
/// the command's exit status and what was seen of each process.
fn watch(pid: i32) -> (i32, BTreeMap<i32, ProcFacts>) {
    let mut seen: BTreeMap<i32, ProcFacts> = BTreeMap::new();
    let me = std::process::id() as i32;
    loop {
        for p in descendants(me) {
            if let Some(f) = read_proc(p) {
                let e = seen.entry(p).or_default();
                // Keep what was mapped: a process that is exiting unmaps it.
                if f.nccl_files.len() >= e.nccl_files.len() || e.pid == 0 {
                    *e = f;
                }
            }
        }
        loop {
            let mut st = 0;
            // SAFETY: waitpid for any child, not blocking, valid out-pointer.
            let r = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
            if r == pid {
                return (exit_code(st), seen);
            }
            if r <= 0 {
                break;
            }
        }
        std::thread::sleep(POLL);
    }
}

/// Every process below `root` (from each /proc/PID/stat's parent).
fn descendants(root: i32) -> Vec<i32> {
    let mut parent: Vec<(i32, i32)> = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if let Some(pp) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| parse_ppid(&s))
            {
                parent.push((pid, pp));
            }
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    out.remove(0);
    out
}

/// The parent pid in a /proc/PID/stat line (after the `)` that ends the name).
pub fn parse_ppid(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The file paths in /proc/PID/maps whose name starts with `libnccl`, in order.
pub fn nccl_maps(maps: &str) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for l in maps.lines() {
        let Some(path) = l.split_whitespace().nth(5) else {
            continue;
        };
        let name = path.rsplit('/').next().unwrap_or("");
        if path.starts_with('/') && name.starts_with("libnccl") && !v.iter().any(|x| x == path) {
            v.push(path.to_string());
        }
    }
    v
}

fn read_proc(pid: i32) -> Option<ProcFacts> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline)
        .split('\0')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if cmdline.is_empty() {
        // Exited (a zombie) or a kernel thread: nothing to learn.
        return None;
    }
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let preload = environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"LD_PRELOAD="))
        .map(|v| {
            String::from_utf8_lossy(v)
                .split([' ', ':'])
                .filter(|s| !s.is_empty())
                .map(|s| {
                    std::fs::canonicalize(s)
                        .map_or_else(|_| s.to_string(), |p| p.display().to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    Some(ProcFacts {
        pid,
        cmdline,
        nccl_files: nccl_maps(&maps),
        preload,
    })
}

fn report(seen: &BTreeMap<i32, ProcFacts>, lib: &Path) {
    let ours = std::fs::metadata(lib).ok().map(|m| (m.dev(), m.ino()));
    let mut memo: BTreeMap<String, bool> = BTreeMap::new();
    let mut is_ox = |f: &str| -> bool {
        *memo
            .entry(f.to_string())
            .or_insert_with(|| is_oxccl_file(Path::new(f), ours))
    };
    // Decide each file once, then judge every process on the answers.
    for p in seen.values() {
        for f in &p.nccl_files {
            is_ox(f);
        }
    }
    let known = |f: &str| memo.get(f).copied().unwrap_or(false);
    let lines: Vec<(bool, String)> = seen.values().map(|p| verdict(p, &known)).collect();
    let bad = lines.iter().filter(|(ok, _)| !ok).count();
    let with_nccl = seen
        .values()
        .filter(|p| binding(p) != Binding::None)
        .count();
    eprintln!(
        "oxccl run --check: {} process(es) seen, {with_nccl} with a libnccl, {bad} not bound to oxccl (library {})",
        seen.len(),
        lib.display()
    );
    for (ok, l) in lines {
        eprintln!("  {} {l}", if ok { "✔" } else { "✘" });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_goes_first_once() {
        assert_eq!(preload_value("/o/libnccl.so.2", None), "/o/libnccl.so.2");
        assert_eq!(
            preload_value("/o/libnccl.so.2", Some("/a.so /o/libnccl.so.2:/b.so")),
            "/o/libnccl.so.2:/a.so:/b.so"
        );
    }

    #[test]
    fn stat_and_maps_are_read() {
        assert_eq!(parse_ppid("42 (a) b) c) S 17 42 42 0"), Some(17));
        let maps = "7f00-7f01 r--p 0 08:01 5 /usr/lib/libc.so.6\n\
                    7f01-7f02 r-xp 0 08:01 9 /x/libnccl.so.2\n\
                    7f02-7f03 r--p 0 08:01 9 /x/libnccl.so.2\n\
                    7f03-7f04 rw-p 0 00:00 0 \n\
                    7f04-7f05 r--p 0 08:01 7 /venv/nvidia/nccl/lib/libnccl.so.2 (deleted)\n";
        assert_eq!(
            nccl_maps(maps),
            ["/x/libnccl.so.2", "/venv/nvidia/nccl/lib/libnccl.so.2"]
        );
    }

    #[test]
    fn bindings_follow_the_loader() {
        let p = |files: &[&str], pre: &[&str]| ProcFacts {
            pid: 1,
            cmdline: "x".into(),
            nccl_files: files.iter().map(|s| s.to_string()).collect(),
            preload: pre.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(binding(&p(&[], &["/o.so"])), Binding::None);
        // Preloaded and mapped wins over PyTorch's own copy, whatever the order.
        assert_eq!(
            binding(&p(
                &["/nv/libnccl.so.2", "/o/libnccl.so.2"],
                &["/o/libnccl.so.2"]
            )),
            Binding::One {
                file: "/o/libnccl.so.2".into(),
                preloaded: true
            }
        );
        assert_eq!(
            binding(&p(&["/nv/libnccl.so.2"], &[])),
            Binding::One {
                file: "/nv/libnccl.so.2".into(),
                preloaded: false
            }
        );
        let two = p(&["/nv/libnccl.so.2", "/o/libnccl.so.2"], &[]);
        assert!(matches!(binding(&two), Binding::Several(_)));
        let ox = |f: &str| f.starts_with("/o/");
        assert!(!verdict(&two, &ox).0);
        assert!(verdict(&p(&["/o/libnccl.so.2"], &[]), &ox).0);
        let (ok, line) = verdict(&p(&["/nv/libnccl.so.2"], &["/o/libnccl.so.2"]), &ox);
        assert!(
            !ok && line.contains("/nv/libnccl.so.2") && line.contains("not oxccl"),
            "{line}"
        );
    }

    #[test]
    fn marker_is_found_across_block_edges() {
        let dir = std::env::temp_dir().join(format!("oxccl-run-marker-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("lib");
        // The marker straddles the first 1 MiB read.
        let mut data = vec![0u8; (1 << 20) - 5];
        data.extend_from_slice(OXCCL_MARKER);
        data.extend_from_slice(b"0.1.0");
        std::fs::write(&f, &data).unwrap();
        assert!(contains_marker(&f));
        std::fs::write(&f, vec![0u8; 3 << 20]).unwrap();
        assert!(!contains_marker(&f));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
