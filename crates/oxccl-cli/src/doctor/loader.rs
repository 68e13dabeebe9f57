//! Which `libnccl.so.2` a program would load: the files `oxccl_core::elf`
//! decides over, read through the [`System`] root (so fixtures work): ELF
//! files by ranged reads (a 1 GiB `libtorch_cuda.so` costs a few KiB),
//! `/etc/ld.so.cache`, `/etc/ld.so.conf`. Nothing here decides.

use std::os::unix::fs::FileExt;

use oxccl_core::elf::{self, CacheEntry, LoaderEnv, LoaderFs, Probe, ReadAt};

use super::checks::ProgramFacts;
use crate::system::System;

/// The largest loader cache read (real ones are tens of KiB).
const MAX_CACHE_FILE: u64 = 64 << 20;

/// The library the program check looks for.
pub const NCCL_SONAME: &str = "libnccl.so.2";

struct FileAt(std::fs::File, u64);

impl ReadAt for FileAt {
    fn size(&self) -> u64 {
        self.1
    }
    fn read_at(&mut self, off: u64, buf: &mut [u8]) -> bool {
        self.0.read_exact_at(buf, off).is_ok()
    }
}

/// The machine's files as the loader sees them, under the root.
pub struct SysFs<'a>(pub &'a System);

impl LoaderFs for SysFs<'_> {
    fn probe(&self, path: &str) -> Probe {
        read_elf(self.0, path)
    }
}

fn read_elf(sys: &System, path: &str) -> Probe {
    let p = sys.path(path);
    match std::fs::metadata(&p) {
        Ok(m) if m.is_file() => match std::fs::File::open(&p) {
            Ok(f) => match elf::parse_from(&mut FileAt(f, m.len())) {
                Ok(d) => Probe::Elf(d),
                Err(e) => Probe::Unusable(e.0),
            },
            Err(e) => Probe::Unusable(format!("cannot be opened: {e}")),
        },
        _ => Probe::Missing,
    }
}

/// The SONAME of an ELF file (a path on this machine, already rooted).
pub fn soname(p: &std::path::Path) -> Option<String> {
    let m = std::fs::metadata(p).ok()?;
    let f = std::fs::File::open(p).ok()?;
    elf::parse_from(&mut FileAt(f, m.len())).ok()?.soname
}

/// `/etc/ld.so.cache` under the root, parsed; or why not.
pub fn read_cache(sys: &System) -> Result<Vec<CacheEntry>, String> {
    let p = sys.path("/etc/ld.so.cache");
    let m = std::fs::metadata(&p).map_err(|e| format!("/etc/ld.so.cache: {e}"))?;
    if !m.is_file() || m.len() > MAX_CACHE_FILE {
        return Err(format!(
            "/etc/ld.so.cache: not a regular file of at most {} MiB",
            MAX_CACHE_FILE >> 20
        ));
    }
    let data = std::fs::read(&p).map_err(|e| format!("/etc/ld.so.cache: {e}"))?;
    elf::parse_cache(&data).map_err(|e| format!("/etc/ld.so.cache: {e}"))
}

/// The loader's inputs for a `machine` program: LD_PRELOAD, LD_LIBRARY_PATH,
/// the cache (or ld.so.conf's folders), the default folders.
pub fn loader_env(sys: &System, machine: u16) -> LoaderEnv {
    let mut conf_dirs = Vec::new();
    super::search::ld_so_conf_dirs(sys, "/etc/ld.so.conf", 0, &mut conf_dirs);
    LoaderEnv {
        preload: sys.var("LD_PRELOAD").map(str::to_string),
        library_path: sys.var("LD_LIBRARY_PATH").map(str::to_string),
        cache: read_cache(sys),
        conf_dirs,
        default_dirs: elf::default_dirs(machine),
    }
}

/// The program's machine path, symlinks resolved under the root (what
/// `$ORIGIN` is for an executable); relative paths are the working
/// directory's on the real root.
fn machine_path(sys: &System, program: &str) -> Result<String, String> {
    let given = if program.starts_with('/') {
        program.to_string()
    } else if sys.is_real() {
        std::env::current_dir()
            .map_err(|e| format!("working directory: {e}"))?
            .join(program)
            .display()
            .to_string()
    } else {
        format!("/{program}")
    };
    let rooted = sys.path(&given);
    let canon =
        std::fs::canonicalize(&rooted).map_err(|e| format!("{given}: cannot be read ({e})"))?;
    Ok(sys.unroot(&canon))
}

/// Reads `program` and finds the libnccl.so.2 it would load.
pub fn program_facts(sys: &System, program: &str, given: bool) -> ProgramFacts {
    let mut f = ProgramFacts {
        program: program.to_string(),
        given,
        result: Err(String::new()),
        version: None,
        cache_note: None,
    };
    let path = match machine_path(sys, program) {
        Ok(p) => p,
        Err(e) => {
            f.result = Err(e);
            return f;
        }
    };
    let d = match read_elf(sys, &path) {
        Probe::Elf(d) => d,
        Probe::Unusable(e) => {
            f.result = Err(format!("{path}: {e}"));
            return f;
        }
        Probe::Missing => {
            f.result = Err(format!("{path}: not a regular file"));
            return f;
        }
    };
    f.program = path.clone();
    let env = loader_env(sys, d.machine);
    if let Err(e) = &env.cache {
        f.cache_note = Some(e.clone());
    }
    let lookup = elf::find(&path, &d, NCCL_SONAME, &env, &SysFs(sys));
    if let Some(p) = lookup.resolution.path() {
        let rooted = sys.path(p);
        let canon = std::fs::canonicalize(&rooted).unwrap_or(rooted);
        let target = sys.unroot(&canon);
        f.version = Some(super::search::nccl_version(&canon, p, &target));
    }
    f.result = Ok((d, lookup));
    f
}

/// PyTorch's `libtorch_cuda.so` where pip or conda put it, if any: the
/// program whose libnccl.so.2 matters most on a training machine.
pub fn default_program(sys: &System) -> Option<String> {
    for prefix in super::search::python_prefixes(sys) {
        for sp in ["site-packages", "dist-packages"] {
            if let Some(p) = sys
                .glob(&format!(
                    "{prefix}/lib/python3*/{sp}/torch/lib/libtorch_cuda.so"
                ))
                .into_iter()
                .next()
            {
                return Some(p);
            }
        }
    }
    None
}
