//! The machine as the checks see it: every file read goes through one root
//! (`--sysroot`, default `/`), so tests point the checks at recorded trees.
//! Reading lives here (thin, never fails: a missing or unreadable file is
//! `None`); deciding lives in the check functions.

use std::path::{Path, PathBuf};

/// A read-only view of a machine rooted at `root`.
#[derive(Debug, Clone)]
pub struct System {
    /// The root every absolute path is read under.
    pub root: PathBuf,
    /// The environment the checks judge (the process's own).
    pub env: Vec<(String, String)>,
}

impl System {
    /// A view of `root` with the process environment.
    pub fn new(root: PathBuf) -> System {
        let env = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        System { root, env }
    }

    /// Whether this is the machine itself (root `/`), where OS calls
    /// (statvfs, getifaddrs, dlopen) stand for the files.
    pub fn is_real(&self) -> bool {
        self.root == Path::new("/")
    }

    /// `p` (absolute, as on the machine) under the root.
    pub fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    /// A file's text, or `None` when it is missing, unreadable or not UTF-8.
    pub fn read(&self, p: &str) -> Option<String> {
        std::fs::read_to_string(self.path(p)).ok()
    }

    /// Whether `p` exists under the root.
    pub fn exists(&self, p: &str) -> bool {
        self.path(p).exists()
    }

    /// The entry names of a folder, sorted (empty when it cannot be read).
    /// `.keep` (what holds a recorded machine's empty folder in git) is left out.
    pub fn list(&self, dir: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.path(dir))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| n != ".keep")
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// An environment variable.
    pub fn var(&self, k: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }

    /// The machine path (as the machine would name it) of a path under the root.
    pub fn unroot(&self, p: &Path) -> String {
        match p.strip_prefix(&self.root) {
            Ok(rest) => format!("/{}", rest.display()),
            Err(_) => p.display().to_string(),
        }
    }

    /// Expands `*` in the final or middle components of an absolute pattern
    /// (`/usr/lib/python3*/site-packages`), under the root. Sorted machine paths.
    pub fn glob(&self, pattern: &str) -> Vec<String> {
        let mut found = vec![String::new()];
        for comp in pattern.split('/').filter(|c| !c.is_empty()) {
            let mut next = Vec::new();
            for base in &found {
                if let Some((pre, post)) = comp.split_once('*') {
                    for name in self.list(if base.is_empty() { "/" } else { base }) {
                        if name.starts_with(pre)
                            && name.ends_with(post)
                            && name.len() >= pre.len() + post.len()
                        {
                            next.push(format!("{base}/{name}"));
                        }
                    }
                } else {
                    let p = format!("{base}/{comp}");
                    if self.exists(&p) {
                        next.push(p);
                    }
                }
            }
            found = next;
        }
        found.retain(|p| !p.is_empty());
        found.sort();
        found
    }
}
