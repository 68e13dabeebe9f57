//! The machine's files for the topology walk: [`SysRoot`] is the thin file
//! access behind [`oxccl_core::topo::SysfsView`], rooted at `/` (the machine)
//! or at a folder holding a recorded machine; the walk itself is pure
//! ([`oxccl_core::topo::read_topology`]). [`machine_topology`] is what the
//! library uses: the machine's tree, read once per process.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use oxccl_core::topo::{read_topology, SysfsView, Topology};

/// Files read under `root` (`/sys/...` means `root/sys/...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysRoot {
    root: PathBuf,
}

impl SysRoot {
    /// The machine itself.
    pub fn machine() -> SysRoot {
        SysRoot::new("/")
    }

    /// A recorded machine under `root`.
    pub fn new(root: impl Into<PathBuf>) -> SysRoot {
        SysRoot { root: root.into() }
    }

    /// `p` (absolute, as on the machine) under the root.
    pub fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    /// The root.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl SysfsView for SysRoot {
    fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.path(path)).ok()
    }

    fn read_bytes(&self, path: &str) -> Option<Vec<u8>> {
        std::fs::read(self.path(path)).ok()
    }

    /// `.keep` (what holds a recorded machine's empty folder in git) is left out.
    fn list(&self, dir: &str) -> Vec<String> {
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

    fn link_name(&self, path: &str) -> Option<String> {
        let target = std::fs::read_link(self.path(path)).ok()?;
        Some(target.file_name()?.to_str()?.to_string())
    }
}

/// The machine's topology from sysfs (no NVLink or P2P: NVML adds those),
/// read on first use and kept for the process: hardware does not move
/// under a running job, and a big server's tree is a few thousand files.
pub fn machine_topology() -> &'static Topology {
    static TOPOLOGY: OnceLock<Topology> = OnceLock::new();
    TOPOLOGY.get_or_init(|| read_topology(&SysRoot::machine()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_files_folders_and_links_under_the_root() {
        let dir = std::env::temp_dir().join(format!("oxccl-sysroot-{}", std::process::id()));
        let dev = dir.join("sys/devices/pci0000:00/0000:00:06.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("class"), "0x030200\n").unwrap();
        std::fs::write(dev.join("vendor"), "0x10de\n").unwrap();
        std::fs::write(dev.join(".keep"), "").unwrap();
        std::os::unix::fs::symlink("../../../kernel/iommu_groups/23", dev.join("iommu_group"))
            .unwrap();
        let r = SysRoot::new(&dir);
        let d = "/sys/devices/pci0000:00/0000:00:06.0";
        assert_eq!(r.read(&format!("{d}/class")).as_deref(), Some("0x030200\n"));
        assert_eq!(r.read_bytes(&format!("{d}/vendor")).unwrap(), b"0x10de\n");
        assert_eq!(r.list(d), ["class", "iommu_group", "vendor"]);
        assert_eq!(
            r.link_name(&format!("{d}/iommu_group")).as_deref(),
            Some("23")
        );
        assert_eq!(r.read("/missing"), None);
        assert!(r.list("/missing").is_empty());
        let t = read_topology(&r);
        let g = t.gpus();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].pci.busid, "0000:00:06.0");
        assert_eq!(g[0].pci.iommu_group, Some(23));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
