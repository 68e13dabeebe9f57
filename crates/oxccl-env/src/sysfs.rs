//! The machine's files for the topology walk: [`SysRoot`] is the thin file
//! access behind [`oxccl_core::topo::SysfsView`], rooted at `/` (the machine)
//! or at a folder holding a recorded machine; the walk itself is pure
//! ([`oxccl_core::topo::read_topology`]). [`machine_topology`] is what the
//! library uses: `NCCL_TOPO_FILE`'s topology or the machine's tree, read
//! once per process.

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

/// The topology the library uses, read on first use and kept for the
/// process (hardware does not move under a running job, and a big server's
/// tree is a few thousand files): the XML file `NCCL_TOPO_FILE` names (the
/// format `oxccl topo --xml` and `NCCL_TOPO_DUMP_FILE` write) when it is
/// set, else the machine's sysfs tree (no NVLink or P2P: NVML adds those).
/// A file that cannot be read or parsed is named in a WARN, and the
/// machine's tree is used.
pub fn machine_topology() -> &'static Topology {
    static TOPOLOGY: OnceLock<Topology> = OnceLock::new();
    TOPOLOGY.get_or_init(|| {
        let file = crate::params().get(&oxccl_core::params::TOPO_FILE);
        let (t, warning) = topology_from(
            file.as_deref(),
            |p| std::fs::read_to_string(p),
            || read_topology(&SysRoot::machine()),
        );
        if let Some(w) = warning {
            crate::warn!("{w}");
        }
        t
    })
}

/// The topology of `file` (read by `read`) when one is named, else
/// `walk()`'s; with a warning naming the file when it was named and could
/// not be used.
pub fn topology_from(
    file: Option<&str>,
    read: impl FnOnce(&str) -> std::io::Result<String>,
    walk: impl FnOnce() -> Topology,
) -> (Topology, Option<String>) {
    let Some(path) = file.filter(|f| !f.is_empty()) else {
        return (walk(), None);
    };
    let why = match read(path) {
        Ok(text) => match Topology::from_xml(&text) {
            Ok(t) => return (t, None),
            Err(e) => format!("line {}: {}", e.line, e.msg),
        },
        Err(e) => e.to_string(),
    };
    (
        walk(),
        Some(format!(
            "NCCL_TOPO_FILE={path} cannot be used ({why}): the machine's own topology is used instead"
        )),
    )
}

/// Where `rank` writes the topology (`NCCL_TOPO_DUMP_FILE`), when it is
/// the dumping rank (`NCCL_TOPO_DUMP_FILE_RANK`, 0 unless set).
pub fn topology_dump_path(p: &oxccl_core::params::Params, rank: usize) -> Option<PathBuf> {
    let file = p
        .get(&oxccl_core::params::TOPO_DUMP_FILE)
        .filter(|f| !f.is_empty())?;
    let dumper = p.get(&oxccl_core::params::TOPO_DUMP_FILE_RANK).unwrap_or(0);
    (i64::try_from(rank).ok() == Some(dumper)).then(|| PathBuf::from(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topology_file_is_used_when_it_reads_and_named_when_it_does_not() {
        let xml = "<system version=\"1\"><cpu numaid=\"3\"/></system>";
        let walked = || Topology::default();
        let (t, w) = topology_from(Some("/t.xml"), |_| Ok(xml.to_string()), walked);
        assert_eq!((t.cpus.len(), t.cpus[0].numaid, w), (1, 3, None));
        let (t, w) = topology_from(None, |_| panic!("no file named"), walked);
        assert_eq!((t, w), (Topology::default(), None));
        let (t, w) = topology_from(Some(""), |_| panic!("empty is unset"), walked);
        assert_eq!((t, w), (Topology::default(), None));
        let missing = || Err(std::io::Error::from(std::io::ErrorKind::NotFound));
        let (t, w) = topology_from(Some("/gone.xml"), |_| missing(), walked);
        assert_eq!(t, Topology::default());
        let w = w.expect("a warning");
        assert!(
            w.contains("NCCL_TOPO_FILE=/gone.xml") && w.contains("not found"),
            "{w}"
        );
        let (_, w) = topology_from(Some("/bad.xml"), |_| Ok("<gpu/>".into()), walked);
        assert!(w.expect("a warning").contains("<system>"));
    }

    #[test]
    fn only_the_dumping_rank_dumps() {
        use oxccl_core::params::Params;
        let p = Params::from_pairs(&[("NCCL_TOPO_DUMP_FILE", "/tmp/t.xml")]);
        assert_eq!(topology_dump_path(&p, 0), Some(PathBuf::from("/tmp/t.xml")));
        assert_eq!(topology_dump_path(&p, 1), None);
        let p = Params::from_pairs(&[
            ("NCCL_TOPO_DUMP_FILE", "/tmp/t.xml"),
            ("NCCL_TOPO_DUMP_FILE_RANK", "2"),
        ]);
        assert_eq!(topology_dump_path(&p, 0), None);
        assert_eq!(topology_dump_path(&p, 2), Some(PathBuf::from("/tmp/t.xml")));
        assert_eq!(
            topology_dump_path(&Params::from_pairs(&[] as &[(&str, &str)]), 0),
            None
        );
    }

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
