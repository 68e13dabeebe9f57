//! What the dynamic loader reads to decide which `libnccl.so.2` a program
//! loads, and the decision itself, as pure functions.
//!
//! - [`parse`] / [`parse_from`]: a 64-bit little-endian ELF file's dynamic
//!   section: `DT_NEEDED`, `DT_SONAME`, `DT_RPATH`, `DT_RUNPATH`,
//!   `DF_1_NODEFLIB`. Program headers → `PT_DYNAMIC` → the entries; the
//!   string table (`DT_STRTAB`, a virtual address) is found through the
//!   `PT_LOAD` segment that maps it. Reads go through [`ReadAt`], so a 1 GiB
//!   `libtorch_cuda.so` costs a few small reads (header, program headers,
//!   the dynamic segment, one read per string), never the whole file.
//! - [`parse_cache`]: `/etc/ld.so.cache` in the `glibc-ld.so.cache1.1`
//!   format (name → path entries with their architecture flags).
//! - [`resolve`] and [`find`]: the loader's search order for one name, over
//!   a [`LoaderFs`] that says what a path holds (the caller's I/O):
//!   an `LD_PRELOAD` object whose SONAME is the name; then the `DT_RPATH`s of
//!   the requesting object and the objects that loaded it up to the program,
//!   only when the requesting object has no `DT_RUNPATH`; `LD_LIBRARY_PATH`;
//!   the requesting object's `DT_RUNPATH`; the loader cache (or, when it
//!   cannot be read, the folders of `/etc/ld.so.conf` that `ldconfig` would
//!   have indexed); the default folders. `DF_1_NODEFLIB` drops the last two.
//!   `$ORIGIN` is the requesting object's folder. A candidate for another
//!   machine, or one that is not an ELF file, is passed over as the loader
//!   does. [`find`] walks `DT_NEEDED` breadth first, as the loader maps
//!   dependencies, to the first object that needs the name: its context
//!   (RPATH chain, RUNPATH) decides.
//!
//! Simplifications, stated: `$LIB` and `$PLATFORM` are not expanded (such a
//! folder is reported and passed over); glibc-hwcaps subfolders and the
//! cache's hwcap entries are not told apart; an empty `LD_LIBRARY_PATH`
//! entry (the working directory) is ignored; secure-execution mode (setuid
//! programs ignore `LD_LIBRARY_PATH`) is not modelled.
//!
//! Bad input never panics: every offset and size is checked, and sizes are
//! bounded ([`MAX_PHNUM`], [`MAX_DYN_BYTES`], [`MAX_STRING`],
//! [`MAX_CACHE_ENTRIES`], [`MAX_OBJECTS`]).

use std::fmt;

/// `e_machine` of x86-64.
pub const EM_X86_64: u16 = 62;
/// `e_machine` of AArch64.
pub const EM_AARCH64: u16 = 183;
/// `e_type` of an executable.
pub const ET_EXEC: u16 = 2;
/// `e_type` of a shared object (and of position-independent executables).
pub const ET_DYN: u16 = 3;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: i64 = 0;
const DT_NEEDED: i64 = 1;
const DT_STRTAB: i64 = 5;
const DT_STRSZ: i64 = 10;
const DT_SONAME: i64 = 14;
const DT_RPATH: i64 = 15;
const DT_RUNPATH: i64 = 29;
const DT_FLAGS_1: i64 = 0x6fff_fffb;
const DF_1_NODEFLIB: u64 = 0x800;

const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;
const DYN_SIZE: usize = 16;

/// Most program headers read (real files have about 10–15).
pub const MAX_PHNUM: usize = 512;
/// Largest dynamic segment read: 4096 entries (real files have under 100).
pub const MAX_DYN_BYTES: u64 = 4096 * DYN_SIZE as u64;
/// Longest string read from the string table (a path: PATH_MAX).
pub const MAX_STRING: usize = 4096;
/// Most `DT_NEEDED` entries kept.
pub const MAX_NEEDED: usize = 1024;
/// Most entries of a loader cache.
pub const MAX_CACHE_ENTRIES: usize = 1 << 17;
/// Most objects [`find`] maps while looking for the one that needs a name.
pub const MAX_OBJECTS: usize = 256;
/// Most folders taken from one path list (`LD_LIBRARY_PATH`, an RPATH...).
pub const MAX_LIST: usize = 256;

/// Why a file could not be read as what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfError(pub String);

impl fmt::Display for ElfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ElfError {}

fn err<T>(msg: impl Into<String>) -> Result<T, ElfError> {
    Err(ElfError(msg.into()))
}

/// Random access to a file's bytes (the caller's I/O).
pub trait ReadAt {
    /// The file's size in bytes.
    fn size(&self) -> u64;
    /// Fills `buf` from byte `off`; false when the range is outside the file
    /// or the read fails.
    fn read_at(&mut self, off: u64, buf: &mut [u8]) -> bool;
}

/// [`ReadAt`] over bytes in memory.
pub struct Bytes<'a>(pub &'a [u8]);

impl ReadAt for Bytes<'_> {
    fn size(&self) -> u64 {
        self.0.len() as u64
    }
    fn read_at(&mut self, off: u64, buf: &mut [u8]) -> bool {
        let Ok(start) = usize::try_from(off) else {
            return false;
        };
        match start
            .checked_add(buf.len())
            .and_then(|end| self.0.get(start..end))
        {
            Some(s) => {
                buf.copy_from_slice(s);
                true
            }
            None => false,
        }
    }
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    b.get(o..o + 2)
        .map_or(0, |s| u16::from_le_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    b.get(o..o + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    b.get(o..o + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// What the loader reads from one ELF file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dynamic {
    /// `e_type`: [`ET_EXEC`] or [`ET_DYN`].
    pub elf_type: u16,
    /// `e_machine` ([`EM_X86_64`], [`EM_AARCH64`]...).
    pub machine: u16,
    /// Has a `PT_DYNAMIC` segment (false: statically linked).
    pub dynamic: bool,
    /// `DT_NEEDED`, in order.
    pub needed: Vec<String>,
    pub soname: Option<String>,
    /// `DT_RPATH` as written (a `:`-separated list).
    pub rpath: Option<String>,
    /// `DT_RUNPATH` as written.
    pub runpath: Option<String>,
    /// `DF_1_NODEFLIB`: the loader cache and default folders are not searched.
    pub nodeflib: bool,
}

/// Reads the dynamic section of a 64-bit little-endian ELF file in memory.
pub fn parse(data: &[u8]) -> Result<Dynamic, ElfError> {
    parse_from(&mut Bytes(data))
}

/// Reads the dynamic section of a 64-bit little-endian ELF file through `r`.
pub fn parse_from<R: ReadAt + ?Sized>(r: &mut R) -> Result<Dynamic, ElfError> {
    let size = r.size();
    let mut h = [0u8; EHDR_SIZE];
    if size < EHDR_SIZE as u64 || !r.read_at(0, &mut h) {
        return err("not an ELF file (shorter than an ELF header)");
    }
    if h[..4] != *b"\x7fELF" {
        return err("not an ELF file (no \\x7fELF magic)");
    }
    if h[4] != 2 {
        return err(format!(
            "a {} ELF file (only 64-bit ones are read)",
            if h[4] == 1 { "32-bit" } else { "bad-class" }
        ));
    }
    if h[5] != 1 {
        return err("a big-endian ELF file (only little-endian ones are read)");
    }
    let elf_type = u16_at(&h, 16);
    if elf_type != ET_EXEC && elf_type != ET_DYN {
        return err(format!(
            "ELF type {elf_type} is neither an executable nor a shared object"
        ));
    }
    let machine = u16_at(&h, 18);
    let phoff = u64_at(&h, 32);
    let phentsize = usize::from(u16_at(&h, 54));
    let phnum = usize::from(u16_at(&h, 56));
    if phnum == 0 {
        return err("no program headers (not loadable)");
    }
    if phnum > MAX_PHNUM {
        return err(format!(
            "{phnum} program headers (more than {MAX_PHNUM} are not read)"
        ));
    }
    if phentsize != PHDR_SIZE {
        return err(format!(
            "program header size {phentsize} (a 64-bit ELF has {PHDR_SIZE})"
        ));
    }
    let table_len = phnum * PHDR_SIZE;
    if phoff
        .checked_add(table_len as u64)
        .is_none_or(|end| end > size)
    {
        return err("the program headers lie outside the file");
    }
    let mut ph = vec![0u8; table_len];
    if !r.read_at(phoff, &mut ph) {
        return err("the program headers cannot be read");
    }
    // (vaddr, file offset, file size) of each PT_LOAD; the PT_DYNAMIC's (offset, size).
    let mut loads: Vec<(u64, u64, u64)> = Vec::new();
    let mut dynseg: Option<(u64, u64)> = None;
    for e in ph.chunks_exact(PHDR_SIZE) {
        let p_type = u32_at(e, 0);
        let offset = u64_at(e, 8);
        let vaddr = u64_at(e, 16);
        let filesz = u64_at(e, 32);
        match p_type {
            PT_LOAD => loads.push((vaddr, offset, filesz)),
            PT_DYNAMIC if dynseg.is_none() => dynseg = Some((offset, filesz)),
            _ => {}
        }
    }
    let mut out = Dynamic {
        elf_type,
        machine,
        ..Dynamic::default()
    };
    let Some((doff, dsize)) = dynseg else {
        return Ok(out); // statically linked
    };
    out.dynamic = true;
    if dsize > MAX_DYN_BYTES {
        return err(format!(
            "a dynamic segment of {dsize} bytes (more than {MAX_DYN_BYTES} are not read)"
        ));
    }
    if doff.checked_add(dsize).is_none_or(|end| end > size) {
        return err("the dynamic segment lies outside the file");
    }
    let mut d = vec![0u8; dsize as usize];
    if !r.read_at(doff, &mut d) {
        return err("the dynamic segment cannot be read");
    }
    let mut needed = Vec::new();
    let (mut strtab, mut strsz) = (None, None);
    let (mut soname, mut rpath, mut runpath) = (None, None, None);
    for e in d.chunks_exact(DYN_SIZE) {
        let tag = u64_at(e, 0) as i64;
        let val = u64_at(e, 8);
        match tag {
            DT_NULL => break,
            DT_NEEDED if needed.len() < MAX_NEEDED => needed.push(val),
            DT_STRTAB => strtab = Some(val),
            DT_STRSZ => strsz = Some(val),
            DT_SONAME => soname = Some(val),
            DT_RPATH => rpath = Some(val),
            DT_RUNPATH => runpath = Some(val),
            DT_FLAGS_1 => out.nodeflib = val & DF_1_NODEFLIB != 0,
            _ => {}
        }
    }
    let wants_strings =
        !needed.is_empty() || soname.is_some() || rpath.is_some() || runpath.is_some();
    if !wants_strings {
        return Ok(out);
    }
    let (Some(strtab), Some(strsz)) = (strtab, strsz) else {
        return err("DT_STRTAB or DT_STRSZ missing");
    };
    // The string table's virtual address → file offset, through the PT_LOAD mapping it.
    let stroff = loads
        .iter()
        .find_map(|&(vaddr, offset, filesz)| {
            let rel = strtab.checked_sub(vaddr)?;
            (rel < filesz).then(|| offset.checked_add(rel)).flatten()
        })
        .ok_or_else(|| {
            ElfError(format!(
                "DT_STRTAB {strtab:#x} is not inside any PT_LOAD segment"
            ))
        })?;
    if stroff.checked_add(strsz).is_none_or(|end| end > size) {
        return err("the string table lies outside the file");
    }
    let mut string = |off: u64| -> Result<String, ElfError> {
        if off >= strsz {
            return err(format!("string offset {off} beyond DT_STRSZ {strsz}"));
        }
        let n = (strsz - off).min(MAX_STRING as u64 + 1) as usize;
        let mut buf = vec![0u8; n];
        if !r.read_at(stroff + off, &mut buf) {
            return err("a string cannot be read");
        }
        match buf.iter().position(|&b| b == 0) {
            Some(end) => Ok(String::from_utf8_lossy(&buf[..end]).into_owned()),
            None if n > MAX_STRING => err(format!("a string longer than {MAX_STRING} bytes")),
            None => err("a string without its terminating NUL"),
        }
    };
    for off in needed {
        out.needed.push(string(off)?);
    }
    out.soname = soname.map(&mut string).transpose()?;
    out.rpath = rpath.map(&mut string).transpose()?;
    out.runpath = runpath.map(&mut string).transpose()?;
    Ok(out)
}

/// A machine's name for reports (`x86-64`, `AArch64`, `machine 40`).
pub fn machine_name(m: u16) -> String {
    match m {
        EM_X86_64 => "x86-64".into(),
        EM_AARCH64 => "AArch64".into(),
        3 => "i386".into(),
        40 => "ARM".into(),
        21 => "PowerPC64".into(),
        243 => "RISC-V".into(),
        other => format!("machine {other}"),
    }
}

// ---------------------------------------------------------------- ld.so.cache

/// The magic and version at the start of a new-format loader cache.
pub const CACHE_MAGIC: &[u8; 20] = b"glibc-ld.so.cache1.1";
const CACHE_HEADER: usize = 48;
const CACHE_ENTRY: usize = 24;
/// An entry's flags: an ELF library for the C library of glibc 2.x (`libc6`).
const FLAG_ELF_LIBC6: u32 = 0x0003;
const FLAG_X8664_LIB64: u32 = 0x0300;
const FLAG_AARCH64_LIB64: u32 = 0x0a00;

/// One loader cache entry: a library name (its SONAME) and the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    /// Type (low byte) and architecture (second byte) flags.
    pub flags: u32,
    pub name: String,
    pub path: String,
    pub hwcap: u64,
}

impl CacheEntry {
    /// Whether the loader of a `machine` program would take this entry.
    pub fn fits(&self, machine: u16) -> bool {
        if self.flags & 0xff != FLAG_ELF_LIBC6 {
            return false;
        }
        let arch = self.flags & 0xff00;
        match machine {
            EM_X86_64 => arch == FLAG_X8664_LIB64,
            EM_AARCH64 => arch == FLAG_AARCH64_LIB64,
            _ => true,
        }
    }
}

/// Reads a `glibc-ld.so.cache1.1` loader cache (the format glibc's
/// `ldconfig` writes since 2.32; older files start with the old format's
/// `ld.so-1.7.0` header and are refused with that said). Offsets of the
/// names and paths count from the start of the file.
pub fn parse_cache(data: &[u8]) -> Result<Vec<CacheEntry>, ElfError> {
    if data.starts_with(b"ld.so-1.7.0") {
        return err("an old-format loader cache (ld.so-1.7.0), not read");
    }
    if data.len() < CACHE_HEADER || data[..20] != *CACHE_MAGIC {
        return err("not a loader cache (no glibc-ld.so.cache1.1 header)");
    }
    let nlibs = u32_at(data, 20) as usize;
    // Byte 28: 0 unset, 2 little-endian, 3 big-endian.
    if data[28] == 3 {
        return err("a big-endian loader cache");
    }
    if nlibs > MAX_CACHE_ENTRIES {
        return err(format!(
            "{nlibs} cache entries (more than {MAX_CACHE_ENTRIES} are not read)"
        ));
    }
    let end = CACHE_HEADER + nlibs * CACHE_ENTRY;
    if end > data.len() {
        return err(format!(
            "{nlibs} cache entries do not fit in {} bytes",
            data.len()
        ));
    }
    let string = |off: u32| -> Result<String, ElfError> {
        let s = data
            .get(off as usize..)
            .ok_or_else(|| ElfError(format!("string offset {off} beyond the file")))?;
        let s = &s[..s.len().min(MAX_STRING + 1)];
        let n = s
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| ElfError(format!("the string at {off} has no NUL")))?;
        Ok(String::from_utf8_lossy(&s[..n]).into_owned())
    };
    let mut out = Vec::with_capacity(nlibs);
    for e in data[CACHE_HEADER..end].chunks_exact(CACHE_ENTRY) {
        out.push(CacheEntry {
            flags: u32_at(e, 0),
            name: string(u32_at(e, 4))?,
            path: string(u32_at(e, 8))?,
            hwcap: u64_at(e, 16),
        });
    }
    Ok(out)
}

/// The default folders the loader searches last, for a `machine` program:
/// Debian's multiarch folders, then the `lib64` folders of Fedora-style
/// systems, then `/lib` and `/usr/lib` (glibc builds use one of these sets;
/// folders that do not exist cost nothing).
pub fn default_dirs(machine: u16) -> Vec<String> {
    let triple = match machine {
        EM_X86_64 => Some("x86_64-linux-gnu"),
        EM_AARCH64 => Some("aarch64-linux-gnu"),
        _ => None,
    };
    let mut v = Vec::new();
    if let Some(t) = triple {
        v.push(format!("/lib/{t}"));
        v.push(format!("/usr/lib/{t}"));
    }
    v.extend(["/lib64", "/usr/lib64", "/lib", "/usr/lib"].map(String::from));
    v
}

// ---------------------------------------------------------------- search order

/// What a path holds, as the loader would see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Nothing there (or not a regular file).
    Missing,
    /// A file the loader would pass over, and why (not ELF, unreadable...).
    Unusable(String),
    Elf(Dynamic),
}

/// The caller's view of the files: `path` is absolute, as on the machine.
pub trait LoaderFs {
    fn probe(&self, path: &str) -> Probe;
}

/// The process environment and loader configuration the search reads.
#[derive(Debug, Clone)]
pub struct LoaderEnv {
    pub preload: Option<String>,
    pub library_path: Option<String>,
    /// The loader cache, or why it could not be read.
    pub cache: Result<Vec<CacheEntry>, String>,
    /// `/etc/ld.so.conf`'s folders (searched in the cache's place when it cannot be read).
    pub conf_dirs: Vec<String>,
    /// The default folders ([`default_dirs`]).
    pub default_dirs: Vec<String>,
}

/// Which rule put a candidate on the search path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// The name has a `/`: that path and no search.
    Direct,
    /// An `LD_PRELOAD` object whose SONAME is the name.
    Preload,
    /// `DT_RPATH` of this object (the requesting one or one that loaded it).
    Rpath {
        of: String,
    },
    LdLibraryPath,
    /// `DT_RUNPATH` of the requesting object.
    Runpath {
        of: String,
    },
    /// The loader cache (`/etc/ld.so.cache`).
    Cache,
    /// `/etc/ld.so.conf`'s folders, standing in for a cache that cannot be read.
    ConfDirs,
    /// The default folders.
    Default,
}

impl Rule {
    /// Short name: `LD_PRELOAD`, `DT_RPATH of /x`, ...
    pub fn name(&self) -> String {
        match self {
            Rule::Direct => "the path itself".into(),
            Rule::Preload => "LD_PRELOAD".into(),
            Rule::Rpath { of } => format!("DT_RPATH of {of}"),
            Rule::LdLibraryPath => "LD_LIBRARY_PATH".into(),
            Rule::Runpath { of } => format!("DT_RUNPATH of {of}"),
            Rule::Cache => "the loader cache (/etc/ld.so.cache)".into(),
            Rule::ConfDirs => "/etc/ld.so.conf folders (the loader cache could not be read)".into(),
            Rule::Default => "the default folders".into(),
        }
    }

    /// Why this rule wins over the later ones, for a report.
    pub fn why(&self) -> &'static str {
        match self {
            Rule::Direct => "a name with a slash is opened as it is",
            Rule::Preload => "an LD_PRELOAD object with that SONAME is loaded before any search, so it beats RPATH and LD_LIBRARY_PATH",
            Rule::Rpath { .. } => "DT_RPATH (used when there is no DT_RUNPATH) is searched before LD_LIBRARY_PATH",
            Rule::LdLibraryPath => "LD_LIBRARY_PATH is searched before DT_RUNPATH, the loader cache and the default folders",
            Rule::Runpath { .. } => "DT_RUNPATH is searched after LD_LIBRARY_PATH and before the loader cache",
            Rule::Cache => "nothing earlier in the search order has it; the loader cache does",
            Rule::ConfDirs => "nothing earlier has it; ldconfig would have indexed this folder",
            Rule::Default => "nothing earlier has it; the default folders come last",
        }
    }
}

/// What became of one candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Missing,
    /// There, but passed over (wrong machine, not ELF, a preload with another SONAME...).
    Skipped(String),
    /// The file the loader takes.
    Loaded,
    /// There and usable, but a candidate before it is taken.
    Shadowed,
}

/// One candidate of the search, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub rule: Rule,
    /// The folder or entry as written (`$ORIGIN/../lib`), or the cache's key.
    pub written: String,
    /// The candidate file (absolute, `.` and `..` folded).
    pub path: String,
    pub outcome: Outcome,
}

/// The search for one name from one requesting object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    pub name: String,
    /// The object whose dependency (or dlopen) this is.
    pub requester: String,
    pub steps: Vec<Step>,
}

impl Resolution {
    /// The step that is loaded.
    pub fn loaded(&self) -> Option<&Step> {
        self.steps.iter().find(|s| s.outcome == Outcome::Loaded)
    }
    /// The path that is loaded.
    pub fn path(&self) -> Option<&str> {
        self.loaded().map(|s| s.path.as_str())
    }
}

/// The folder of an absolute path (`/a/b/c` → `/a/b`; `/c` → `/`).
pub fn dirname(p: &str) -> &str {
    match p.rfind('/') {
        Some(0) => "/",
        Some(i) => &p[..i],
        None => ".",
    }
}

/// Folds `.`, `..` and repeated slashes of an absolute path (`..` stops at `/`).
pub fn normalize(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

/// A path-list entry with `$ORIGIN` / `${ORIGIN}` replaced by `origin`; an
/// error for `$LIB`, `$PLATFORM` or any other token, and for relative folders.
pub fn expand(dir: &str, origin: &str) -> Result<String, String> {
    let d = dir.replace("${ORIGIN}", origin).replace("$ORIGIN", origin);
    if d.contains('$') {
        return Err(format!(
            "{dir}: $LIB/$PLATFORM tokens are not expanded here"
        ));
    }
    if !d.starts_with('/') {
        return Err(format!("{dir}: relative to the working directory"));
    }
    Ok(normalize(&d))
}

/// One object of the loading chain: its path and what it says.
#[derive(Debug, Clone)]
pub struct Object<'a> {
    pub path: &'a str,
    pub dynamic: &'a Dynamic,
}

fn accept(p: &Probe, machine: u16) -> Result<(), String> {
    match p {
        Probe::Missing => Err(String::new()),
        Probe::Unusable(why) => Err(why.clone()),
        Probe::Elf(d) if d.machine != machine => Err(format!(
            "an {} object; the program is {}",
            machine_name(d.machine),
            machine_name(machine)
        )),
        Probe::Elf(_) => Ok(()),
    }
}

/// Searches for `name` as the loader does when `chain.last()` needs it (or
/// dlopens it by name); `chain[0]` is the program, each next object was
/// loaded by the one before. Every candidate is listed: the first usable one
/// is [`Outcome::Loaded`], usable later ones are [`Outcome::Shadowed`].
pub fn resolve(name: &str, chain: &[Object<'_>], env: &LoaderEnv, fs: &dyn LoaderFs) -> Resolution {
    resolve_inner(name, chain, env, fs, true, true)
}

struct Search<'e> {
    name: &'e str,
    fs: &'e dyn LoaderFs,
    machine: u16,
    /// List every candidate (false: stop at the loaded one).
    full: bool,
    done: bool,
    res: Resolution,
}

impl Search<'_> {
    /// Adds a candidate (probed unless `outcome` is given); true when the search may stop.
    fn push(&mut self, rule: Rule, written: &str, path: String, outcome: Option<Outcome>) -> bool {
        let outcome =
            outcome.unwrap_or_else(|| match accept(&self.fs.probe(&path), self.machine) {
                Err(why) if why.is_empty() => Outcome::Missing,
                Err(why) => Outcome::Skipped(why),
                Ok(()) if self.done => Outcome::Shadowed,
                Ok(()) => Outcome::Loaded,
            });
        // A path already listed adds nothing (the cache and a default folder often agree).
        if self
            .res
            .steps
            .iter()
            .any(|s| s.path == path && s.outcome != Outcome::Missing)
        {
            return self.done && !self.full;
        }
        if outcome == Outcome::Loaded {
            self.done = true;
        }
        self.res.steps.push(Step {
            rule,
            written: written.to_string(),
            path,
            outcome,
        });
        self.done && !self.full
    }

    /// `name` in each folder of `dirs` (with `$ORIGIN` = `origin`).
    fn dirs(&mut self, rule: &Rule, dirs: &[String], origin: &str) -> bool {
        for d in dirs {
            let stop = match expand(d, origin) {
                Ok(dir) => {
                    let path = normalize(&format!("{dir}/{}", self.name));
                    self.push(rule.clone(), d, path, None)
                }
                Err(why) => self.push(rule.clone(), d, d.clone(), Some(Outcome::Skipped(why))),
            };
            if stop {
                return true;
            }
        }
        false
    }
}

fn list(s: &str, seps: &[char]) -> Vec<String> {
    s.split(seps)
        .filter(|d| !d.is_empty())
        .take(MAX_LIST)
        .map(str::to_string)
        .collect()
}

fn resolve_inner(
    name: &str,
    chain: &[Object<'_>],
    env: &LoaderEnv,
    fs: &dyn LoaderFs,
    full: bool,
    with_preload: bool,
) -> Resolution {
    let requester = chain.last().map_or("", |o| o.path);
    let machine = chain.first().map_or(EM_X86_64, |o| o.dynamic.machine);
    let mut s = Search {
        name,
        fs,
        machine,
        full,
        done: false,
        res: Resolution {
            name: name.to_string(),
            requester: requester.to_string(),
            steps: Vec::new(),
        },
    };
    if name.contains('/') {
        s.push(Rule::Direct, name, normalize(name), None);
        return s.res;
    }
    let Some(req) = chain.last() else {
        return s.res;
    };
    // 1. LD_PRELOAD: a preloaded object whose SONAME (or, without one, file name) is `name`.
    if with_preload {
        let entries = list(env.preload.as_deref().unwrap_or(""), &[' ', ':']);
        for e in &entries {
            let path = if e.contains('/') {
                Some(normalize(e))
            } else {
                // Searched like a library, from the program.
                resolve_inner(e, &chain[..1], env, fs, false, false)
                    .path()
                    .map(str::to_string)
            };
            let Some(path) = path else {
                if s.push(Rule::Preload, e, e.clone(), Some(Outcome::Missing)) {
                    return s.res;
                }
                continue;
            };
            let probe = fs.probe(&path);
            let base = path.rsplit('/').next().unwrap_or("");
            let outcome = match (&probe, accept(&probe, machine)) {
                (_, Err(why)) if why.is_empty() => Outcome::Missing,
                (_, Err(why)) => Outcome::Skipped(why),
                (Probe::Elf(d), Ok(())) => match &d.soname {
                    Some(so) if so == name => {
                        if s.done {
                            Outcome::Shadowed
                        } else {
                            Outcome::Loaded
                        }
                    }
                    None if base == name => {
                        if s.done {
                            Outcome::Shadowed
                        } else {
                            Outcome::Loaded
                        }
                    }
                    Some(so) => {
                        Outcome::Skipped(format!("preloaded, but its SONAME is {so}, not {name}"))
                    }
                    None => Outcome::Skipped(format!(
                        "preloaded, but it has no SONAME and is not named {name}"
                    )),
                },
                _ => Outcome::Missing,
            };
            if s.push(Rule::Preload, e, path, Some(outcome)) {
                return s.res;
            }
        }
    }
    // 2. DT_RPATH of the requester and of each object that loaded it, when the requester has no DT_RUNPATH.
    if req.dynamic.runpath.is_none() {
        for o in chain.iter().rev() {
            if let Some(rp) = &o.dynamic.rpath {
                let rule = Rule::Rpath {
                    of: o.path.to_string(),
                };
                if s.dirs(&rule, &list(rp, &[':']), dirname(o.path)) {
                    return s.res;
                }
            }
        }
    }
    // 3. LD_LIBRARY_PATH (`:` or `;` separated).
    if let Some(lp) = &env.library_path {
        if s.dirs(&Rule::LdLibraryPath, &list(lp, &[':', ';']), "/") {
            return s.res;
        }
    }
    // 4. DT_RUNPATH of the requester.
    if let Some(rp) = &req.dynamic.runpath {
        let rule = Rule::Runpath {
            of: req.path.to_string(),
        };
        if s.dirs(&rule, &list(rp, &[':']), dirname(req.path)) {
            return s.res;
        }
    }
    if req.dynamic.nodeflib {
        return s.res;
    }
    // 5. The loader cache, or the folders ldconfig would have indexed.
    match &env.cache {
        Ok(entries) => {
            for e in entries.iter().filter(|e| e.name == name && e.fits(machine)) {
                if s.push(Rule::Cache, name, normalize(&e.path), None) {
                    return s.res;
                }
            }
        }
        Err(_) => {
            if s.dirs(&Rule::ConfDirs, &env.conf_dirs, "/") {
                return s.res;
            }
        }
    }
    // 6. The default folders.
    s.dirs(&Rule::Default, &env.default_dirs, "/");
    s.res
}

/// How `name` gets loaded for a program: through which object, by which rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// From the program to the object that needs `name` (the program alone
    /// when `dlopen` is true).
    pub chain: Vec<String>,
    /// No mapped object needs `name`: the resolution is that of
    /// `dlopen(name)` from the program.
    pub dlopen: bool,
    pub resolution: Resolution,
    /// Objects mapped while looking (the program included).
    pub objects: usize,
    /// Dependencies that were not found on the way (name, requester).
    pub missing: Vec<(String, String)>,
}

/// Maps the program's dependencies breadth first (the loader's order) until
/// an object needs `name`, then resolves `name` from that object. At most
/// [`MAX_OBJECTS`] objects are mapped.
pub fn find(
    program_path: &str,
    program: &Dynamic,
    name: &str,
    env: &LoaderEnv,
    fs: &dyn LoaderFs,
) -> Lookup {
    // (path, dynamic, parent index)
    let mut objs: Vec<(String, Dynamic, Option<usize>)> =
        vec![(program_path.to_string(), program.clone(), None)];
    let mut seen: Vec<String> = Vec::new();
    let mut missing = Vec::new();
    let chain_of = |objs: &Vec<(String, Dynamic, Option<usize>)>, mut i: usize| -> Vec<usize> {
        let mut v = vec![i];
        while let Some(p) = objs[i].2 {
            v.push(p);
            i = p;
        }
        v.reverse();
        v
    };
    let mut i = 0;
    while i < objs.len() {
        let idx = chain_of(&objs, i);
        let needs = objs[i].1.needed.clone();
        for need in needs {
            let chain: Vec<Object<'_>> = idx
                .iter()
                .map(|&k| Object {
                    path: &objs[k].0,
                    dynamic: &objs[k].1,
                })
                .collect();
            if need == name {
                let resolution = resolve(name, &chain, env, fs);
                return Lookup {
                    chain: idx.iter().map(|&k| objs[k].0.clone()).collect(),
                    dlopen: false,
                    resolution,
                    objects: objs.len(),
                    missing,
                };
            }
            if seen.contains(&need) || objs.len() >= MAX_OBJECTS {
                continue;
            }
            seen.push(need.clone());
            let r = resolve_inner(&need, &chain, env, fs, false, true);
            drop(chain);
            match r.path().map(str::to_string) {
                Some(p) => {
                    if let Probe::Elf(d) = fs.probe(&p) {
                        // An object already mapped under another name (its SONAME) is not mapped twice.
                        if !objs.iter().any(|o| o.0 == p) {
                            objs.push((p, d, Some(i)));
                        }
                    }
                }
                None => missing.push((need, objs[i].0.clone())),
            }
        }
        i += 1;
    }
    let chain = [Object {
        path: program_path,
        dynamic: program,
    }];
    Lookup {
        chain: vec![program_path.to_string()],
        dlopen: true,
        resolution: resolve(name, &chain, env, fs),
        objects: objs.len(),
        missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A minimal ELF64 LE shared object with the given dynamic strings.
    pub(crate) fn build(
        machine: u16,
        needed: &[&str],
        soname: Option<&str>,
        rpath: Option<&str>,
        runpath: Option<&str>,
    ) -> Vec<u8> {
        let mut strtab = vec![0u8];
        let mut add = |s: &str| {
            let o = strtab.len() as u64;
            strtab.extend_from_slice(s.as_bytes());
            strtab.push(0);
            o
        };
        let mut dyns: Vec<(i64, u64)> = needed.iter().map(|n| (DT_NEEDED, add(n))).collect();
        if let Some(s) = soname {
            dyns.push((DT_SONAME, add(s)));
        }
        if let Some(s) = rpath {
            dyns.push((DT_RPATH, add(s)));
        }
        if let Some(s) = runpath {
            dyns.push((DT_RUNPATH, add(s)));
        }
        let base = 0x1000u64;
        let phoff = 64u64;
        let dynoff = phoff + 2 * 56;
        let ndyn = dyns.len() + 3;
        let stroff = dynoff + (ndyn * 16) as u64;
        dyns.push((DT_STRTAB, base + stroff));
        dyns.push((DT_STRSZ, strtab.len() as u64));
        dyns.push((DT_NULL, 0));
        let total = stroff + strtab.len() as u64;
        let mut f = vec![0u8; 64];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2;
        f[5] = 1;
        f[6] = 1;
        f[16..18].copy_from_slice(&ET_DYN.to_le_bytes());
        f[18..20].copy_from_slice(&machine.to_le_bytes());
        f[32..40].copy_from_slice(&phoff.to_le_bytes());
        f[52..54].copy_from_slice(&64u16.to_le_bytes());
        f[54..56].copy_from_slice(&56u16.to_le_bytes());
        f[56..58].copy_from_slice(&2u16.to_le_bytes());
        let ph = |t: u32, off: u64, size: u64| {
            let mut p = vec![0u8; 56];
            p[..4].copy_from_slice(&t.to_le_bytes());
            p[8..16].copy_from_slice(&off.to_le_bytes());
            p[16..24].copy_from_slice(&(base + off).to_le_bytes());
            p[32..40].copy_from_slice(&size.to_le_bytes());
            p[40..48].copy_from_slice(&size.to_le_bytes());
            p
        };
        f.extend(ph(PT_LOAD, 0, total));
        f.extend(ph(PT_DYNAMIC, dynoff, (ndyn * 16) as u64));
        for (t, v) in dyns {
            f.extend_from_slice(&t.to_le_bytes());
            f.extend_from_slice(&v.to_le_bytes());
        }
        f.extend(strtab);
        f
    }

    struct Fs(HashMap<String, Probe>);
    impl LoaderFs for Fs {
        fn probe(&self, p: &str) -> Probe {
            self.0.get(p).cloned().unwrap_or(Probe::Missing)
        }
    }

    fn lib(soname: &str) -> Probe {
        Probe::Elf(parse(&build(EM_X86_64, &[], Some(soname), None, None)).unwrap())
    }

    fn env() -> LoaderEnv {
        LoaderEnv {
            preload: None,
            library_path: None,
            cache: Ok(vec![CacheEntry {
                flags: 0x0303,
                name: "libnccl.so.2".into(),
                path: "/usr/lib/x86_64-linux-gnu/libnccl.so.2".into(),
                hwcap: 0,
            }]),
            conf_dirs: vec![],
            default_dirs: default_dirs(EM_X86_64),
        }
    }

    fn fs() -> Fs {
        let mut m = HashMap::new();
        for p in [
            "/app/lib/libnccl.so.2",
            "/llp/libnccl.so.2",
            "/usr/lib/x86_64-linux-gnu/libnccl.so.2",
            "/pre/libnccl.so.2",
        ] {
            m.insert(p.to_string(), lib("libnccl.so.2"));
        }
        Fs(m)
    }

    #[test]
    fn parses_what_it_builds() {
        let b = build(
            EM_X86_64,
            &["libnccl.so.2", "libc.so.6"],
            Some("libx.so"),
            Some("$ORIGIN/../lib"),
            None,
        );
        let d = parse(&b).unwrap();
        assert_eq!(d.needed, ["libnccl.so.2", "libc.so.6"]);
        assert_eq!(d.soname.as_deref(), Some("libx.so"));
        assert_eq!(d.rpath.as_deref(), Some("$ORIGIN/../lib"));
        assert_eq!(d.runpath, None);
        assert!(d.dynamic);
        for n in 0..b.len() {
            let _ = parse(&b[..n]);
        }
        assert!(parse(b"\x7fELF").is_err());
        assert!(parse(&[0u8; 100]).unwrap_err().0.contains("magic"));
    }

    #[test]
    fn order_rpath_ldlp_runpath_cache() {
        let fs = fs();
        let mut e = env();
        e.library_path = Some("/llp".into());
        let rp = parse(&build(
            EM_X86_64,
            &["libnccl.so.2"],
            None,
            Some("$ORIGIN/../lib"),
            None,
        ))
        .unwrap();
        let chain = [Object {
            path: "/app/bin/prog",
            dynamic: &rp,
        }];
        let r = resolve("libnccl.so.2", &chain, &e, &fs);
        let l = r.loaded().unwrap();
        assert_eq!(l.path, "/app/lib/libnccl.so.2");
        assert!(matches!(l.rule, Rule::Rpath { .. }));
        assert!(r
            .steps
            .iter()
            .any(|s| s.rule == Rule::LdLibraryPath && s.outcome == Outcome::Shadowed));
        // The same with RUNPATH: LD_LIBRARY_PATH wins.
        let rn = parse(&build(
            EM_X86_64,
            &["libnccl.so.2"],
            None,
            Some("/ignored"),
            Some("$ORIGIN/../lib"),
        ))
        .unwrap();
        let chain = [Object {
            path: "/app/bin/prog",
            dynamic: &rn,
        }];
        let r = resolve("libnccl.so.2", &chain, &e, &fs);
        assert_eq!(r.loaded().unwrap().rule, Rule::LdLibraryPath);
        assert!(
            !r.steps.iter().any(|s| matches!(s.rule, Rule::Rpath { .. })),
            "RPATH ignored with RUNPATH"
        );
        // Without LD_LIBRARY_PATH: RUNPATH, then the cache.
        e.library_path = None;
        let r = resolve("libnccl.so.2", &chain, &e, &fs);
        assert!(matches!(r.loaded().unwrap().rule, Rule::Runpath { .. }));
        let plain = parse(&build(EM_X86_64, &["libnccl.so.2"], None, None, None)).unwrap();
        let chain = [Object {
            path: "/app/bin/prog",
            dynamic: &plain,
        }];
        let r = resolve("libnccl.so.2", &chain, &e, &fs);
        assert_eq!(r.loaded().unwrap().rule, Rule::Cache);
        // LD_PRELOAD beats everything, when its SONAME matches.
        e.preload = Some("/pre/libnccl.so.2".into());
        let r = resolve("libnccl.so.2", &chain, &e, &fs);
        assert_eq!(r.loaded().unwrap().rule, Rule::Preload);
    }

    #[test]
    fn wrong_machine_is_passed_over() {
        let mut fs = fs();
        fs.0.insert(
            "/app/lib/libnccl.so.2".into(),
            Probe::Elf(parse(&build(EM_AARCH64, &[], Some("libnccl.so.2"), None, None)).unwrap()),
        );
        let rp = parse(&build(
            EM_X86_64,
            &["libnccl.so.2"],
            None,
            Some("/app/lib"),
            None,
        ))
        .unwrap();
        let chain = [Object {
            path: "/app/bin/prog",
            dynamic: &rp,
        }];
        let r = resolve("libnccl.so.2", &chain, &env(), &fs);
        assert!(matches!(r.steps[0].outcome, Outcome::Skipped(_)), "{r:?}");
        assert_eq!(r.loaded().unwrap().rule, Rule::Cache);
    }

    #[test]
    fn find_walks_dependencies() {
        let mut fs = fs();
        let torch = parse(&build(
            EM_X86_64,
            &["libnccl.so.2"],
            Some("libtorch_cuda.so"),
            Some("$ORIGIN/../../nvidia/nccl/lib"),
            None,
        ))
        .unwrap();
        fs.0.insert("/sp/torch/lib/libtorch_cuda.so".into(), Probe::Elf(torch));
        fs.0.insert(
            "/sp/nvidia/nccl/lib/libnccl.so.2".into(),
            lib("libnccl.so.2"),
        );
        let prog = parse(&build(
            EM_X86_64,
            &["libmissing.so", "libtorch_cuda.so"],
            None,
            Some("/sp/torch/lib"),
            None,
        ))
        .unwrap();
        let l = find("/bin/app", &prog, "libnccl.so.2", &env(), &fs);
        assert!(!l.dlopen);
        assert_eq!(l.chain, ["/bin/app", "/sp/torch/lib/libtorch_cuda.so"]);
        assert_eq!(
            l.resolution.path(),
            Some("/sp/nvidia/nccl/lib/libnccl.so.2")
        );
        assert_eq!(
            l.missing,
            [("libmissing.so".to_string(), "/bin/app".to_string())]
        );
        let none = parse(&build(EM_X86_64, &[], None, None, None)).unwrap();
        let l = find("/bin/sh", &none, "libnccl.so.2", &env(), &fs);
        assert!(l.dlopen);
        assert_eq!(l.resolution.loaded().unwrap().rule, Rule::Cache);
    }

    #[test]
    fn cache_round_trip() {
        let mut f = CACHE_MAGIC.to_vec();
        f.extend(1u32.to_le_bytes());
        f.extend(0u32.to_le_bytes());
        f.push(2);
        f.resize(CACHE_HEADER, 0);
        let key = (CACHE_HEADER + CACHE_ENTRY) as u32;
        let val = key + 13;
        f.extend(0x0303u32.to_le_bytes());
        f.extend(key.to_le_bytes());
        f.extend(val.to_le_bytes());
        f.extend([0u8; 12]);
        f.extend(b"libnccl.so.2\0/x/libnccl.so.2\0");
        let c = parse_cache(&f).unwrap();
        assert_eq!(c[0].name, "libnccl.so.2");
        assert_eq!(c[0].path, "/x/libnccl.so.2");
        assert!(c[0].fits(EM_X86_64) && !c[0].fits(EM_AARCH64));
        for n in 0..f.len() {
            let _ = parse_cache(&f[..n]);
        }
    }

    #[test]
    fn paths() {
        assert_eq!(normalize("/a/b/../../../c/./d//e"), "/c/d/e");
        assert_eq!(expand("$ORIGIN/../lib", "/app/bin").unwrap(), "/app/lib");
        assert_eq!(expand("${ORIGIN}", "/x").unwrap(), "/x");
        assert!(expand("$LIB/x", "/").is_err());
        assert!(expand("lib", "/").is_err());
        assert_eq!(dirname("/a"), "/");
        assert_eq!(dirname("/a/b"), "/a");
    }
}
