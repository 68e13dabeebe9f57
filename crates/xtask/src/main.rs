//! oxccl's build and install commands, run as `cargo xtask ...` (the alias
//! is in `.cargo/config.toml`):
//!
//! * `cargo xtask build [--debug]`: builds `libnccl.so` and the `oxccl` CLI
//!   and adds `libnccl.so.2`, the name programs load (the SONAME), beside the
//!   library as a symlink, so later rebuilds are followed.
//! * `cargo xtask install --prefix DIR [--debug]`: builds, then lays out
//!   `bin/`, `lib/`, `include/` and `lib/pkgconfig/nccl.pc` under `DIR` the way
//!   NCCL's packages do.
//!
//! Argument parsing and the pkg-config text are pure (`args`, `pkgconfig`);
//! this file only runs cargo and writes files.

#![forbid(unsafe_code)]

mod args;
mod pkgconfig;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use args::{Profile, Task, UsageError};
use pkgconfig::PkgConfigError;

/// Where the files of one build are.
struct Built {
    /// `target/<profile>/libnccl.so` (the name `-lnccl` finds).
    library: PathBuf,
    /// `target/<profile>/libnccl.so.2`, a symlink to `libnccl.so`.
    soname_link: PathBuf,
    /// `target/<profile>/oxccl`.
    cli: PathBuf,
    /// `crates/oxccl-nccl/include/nccl.h`.
    header: PathBuf,
}

#[derive(Debug)]
enum XtaskError {
    Usage(UsageError),
    /// `cargo build` could not be started, or failed.
    Cargo(String),
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    PkgConfig(PkgConfigError),
}

impl fmt::Display for XtaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XtaskError::Usage(e) => write!(f, "{e}\n\n{}", args::USAGE),
            XtaskError::Cargo(e) => write!(f, "{e}"),
            XtaskError::Io {
                action,
                path,
                source,
            } => write!(f, "cannot {action} {}: {source}", path.display()),
            XtaskError::PkgConfig(e) => write!(f, "{e}"),
        }
    }
}

/// An `io::Result` mapped to an error naming what was being done to which path.
fn at<T>(result: io::Result<T>, action: &'static str, path: &Path) -> Result<T, XtaskError> {
    result.map_err(|source| XtaskError::Io {
        action,
        path: path.to_path_buf(),
        source,
    })
}

/// The workspace root: this crate lives in `<root>/crates/xtask`.
fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .ancestors()
        .nth(2)
        .unwrap_or(manifest_dir)
        .to_path_buf()
}

/// cargo's target directory: `CARGO_TARGET_DIR` when set (relative to the
/// directory cargo was run from, as cargo reads it), else `<root>/target`.
fn target_dir(root: &Path) -> Result<PathBuf, XtaskError> {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => at(
            std::path::absolute(&dir),
            "resolve CARGO_TARGET_DIR",
            Path::new(&dir),
        ),
        None => Ok(root.join("target")),
    }
}

/// Replaces whatever is at `link` with a symlink to `target`.
fn replace_with_symlink(target: &str, link: &Path) -> Result<(), XtaskError> {
    remove_if_present(link)?;
    at(
        std::os::unix::fs::symlink(target, link),
        "create symlink",
        link,
    )
}

fn remove_if_present(path: &Path) -> Result<(), XtaskError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => at(Err(e), "remove", path),
        _ => Ok(()),
    }
}

/// Copies `from` to a new file at `to` (removing what was there first, so a
/// program still running the old library keeps its copy).
fn install_file(from: &Path, to: &Path) -> Result<(), XtaskError> {
    remove_if_present(to)?;
    at(std::fs::copy(from, to), "copy to", to).map(|_| ())
}

fn build(root: &Path, profile: Profile) -> Result<Built, XtaskError> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(&cargo);
    command
        .current_dir(root)
        .args(["build", "-p", "oxccl-nccl", "-p", "oxccl-cli"])
        .args(profile.cargo_flag());
    let status = command
        .status()
        .map_err(|e| XtaskError::Cargo(format!("cannot run {command:?}: {e}")))?;
    if !status.success() {
        return Err(XtaskError::Cargo(format!("{command:?} failed ({status})")));
    }

    let out = target_dir(root)?.join(profile.dir_name());
    let built = Built {
        library: out.join("libnccl.so"),
        soname_link: out.join("libnccl.so.2"),
        cli: out.join("oxccl"),
        header: root.join("crates/oxccl-nccl/include/nccl.h"),
    };
    for file in [&built.library, &built.cli, &built.header] {
        at(std::fs::metadata(file), "find the built file", file)?;
    }
    // Relative, so the link survives moving the target directory.
    replace_with_symlink("libnccl.so", &built.soname_link)?;
    Ok(built)
}

fn install(built: &Built, prefix: &Path) -> Result<(), XtaskError> {
    let prefix = at(std::path::absolute(prefix), "resolve --prefix", prefix)?;
    let header_text = at(
        std::fs::read_to_string(&built.header),
        "read",
        &built.header,
    )?;
    let version = pkgconfig::header_version(&header_text).map_err(XtaskError::PkgConfig)?;
    let pc = pkgconfig::pc_text(&prefix, version).map_err(XtaskError::PkgConfig)?;

    let bin = prefix.join("bin");
    let lib = prefix.join("lib");
    let include = prefix.join("include");
    let pkgconfig_dir = lib.join("pkgconfig");
    for dir in [&bin, &lib, &include, &pkgconfig_dir] {
        at(std::fs::create_dir_all(dir), "create directory", dir)?;
    }
    // NCCL's packages: the real file under the SONAME, the linker name a
    // symlink to it.
    install_file(&built.library, &lib.join("libnccl.so.2"))?;
    replace_with_symlink("libnccl.so.2", &lib.join("libnccl.so"))?;
    install_file(&built.cli, &bin.join("oxccl"))?;
    install_file(&built.header, &include.join("nccl.h"))?;
    let pc_path = pkgconfig_dir.join("nccl.pc");
    at(std::fs::write(&pc_path, pc), "write", &pc_path)?;

    println!(
        "installed oxccl (NCCL {version}) under {}:",
        prefix.display()
    );
    for path in [
        bin.join("oxccl"),
        lib.join("libnccl.so.2"),
        lib.join("libnccl.so"),
        include.join("nccl.h"),
        pc_path,
    ] {
        println!("  {}", path.display());
    }
    println!(
        "build C programs with -I {} -L {} -lnccl (or `pkg-config --cflags --libs nccl` with PKG_CONFIG_PATH={}),\n\
         run them with LD_LIBRARY_PATH={}",
        include.display(),
        lib.display(),
        pkgconfig_dir.display(),
        lib.display()
    );
    Ok(())
}

fn run(task: Task) -> Result<(), XtaskError> {
    let root = workspace_root();
    match task {
        Task::Help => println!("{}", args::USAGE),
        Task::Build { profile } => {
            let built = build(&root, profile)?;
            println!("built ({}):", profile.dir_name());
            println!("  {}  (link with -lnccl)", built.library.display());
            println!(
                "  {} -> libnccl.so  (the name programs load)",
                built.soname_link.display()
            );
            println!("  {}", built.cli.display());
            println!("  header: {}", built.header.display());
        }
        Task::Install { prefix, profile } => {
            let built = build(&root, profile)?;
            install(&built, &prefix)?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match args::parse(&argv).map_err(XtaskError::Usage).and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
