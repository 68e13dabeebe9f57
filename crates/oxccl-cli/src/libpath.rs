//! Where oxccl's own `libnccl.so.2` is, seen from the `oxccl` executable:
//! the three layouts it is shipped in. The search is pure over a folder
//! listing ([`candidates`]); [`find`] only reads the file system.

use std::path::{Path, PathBuf};

/// The files to try for an executable in `bin_dir`, in order:
///
/// 1. beside it (`cargo xtask build` leaves `oxccl`, `libnccl.so.2` and
///    `libnccl.so` together in target/release);
/// 2. `../lib/libnccl.so.2` (`cargo xtask install --prefix DIR`: DIR/bin, DIR/lib);
/// 3. `../oxccl/lib/libnccl.so.2` (the wheel installed with `pip install
///    --target DIR`: DIR/bin/oxccl beside the package DIR/oxccl);
/// 4. `../lib/pythonX.Y/site-packages/oxccl/lib/libnccl.so.2` for each
///    `python*` folder in `python_dirs` (the wheel: pip puts the executable
///    in the environment's `bin/` and the package under `lib/`; the same for
///    `pip install --user` in `~/.local`).
pub fn candidates(bin_dir: &Path, python_dirs: &[String]) -> Vec<PathBuf> {
    let mut v = vec![
        bin_dir.join("libnccl.so.2"),
        bin_dir.join("libnccl.so"),
        bin_dir.join("../lib/libnccl.so.2"),
        bin_dir.join("../oxccl/lib/libnccl.so.2"),
    ];
    let mut py: Vec<&String> = python_dirs
        .iter()
        .filter(|d| d.starts_with("python"))
        .collect();
    py.sort();
    for d in py {
        for sp in ["site-packages", "dist-packages"] {
            v.push(bin_dir.join(format!("../lib/{d}/{sp}/oxccl/lib/libnccl.so.2")));
        }
    }
    v
}

/// oxccl's library for the running executable, or the places looked at
/// (for the error message).
pub fn find() -> Result<PathBuf, Vec<PathBuf>> {
    let Some(bin_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    else {
        return Err(Vec::new());
    };
    let python_dirs: Vec<String> = std::fs::read_dir(bin_dir.join("../lib"))
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    let tried = candidates(&bin_dir, &python_dirs);
    match tried.iter().find(|p| p.is_file()) {
        Some(p) => Ok(p.clone()),
        None => Err(tried),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_beside_then_prefix_then_wheel() {
        let c = candidates(
            Path::new("/v/bin"),
            &["python3.12".into(), "libfoo.so".into(), "python3.11".into()],
        );
        let s: Vec<String> = c.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            s,
            [
                "/v/bin/libnccl.so.2",
                "/v/bin/libnccl.so",
                "/v/bin/../lib/libnccl.so.2",
                "/v/bin/../oxccl/lib/libnccl.so.2",
                "/v/bin/../lib/python3.11/site-packages/oxccl/lib/libnccl.so.2",
                "/v/bin/../lib/python3.11/dist-packages/oxccl/lib/libnccl.so.2",
                "/v/bin/../lib/python3.12/site-packages/oxccl/lib/libnccl.so.2",
                "/v/bin/../lib/python3.12/dist-packages/oxccl/lib/libnccl.so.2",
            ]
        );
    }
}
