//! The machine's topology as the library sees it: NUMA nodes, the PCI tree
//! with GPUs and NICs, NVLinks and peer-to-peer status, the path between two
//! GPUs as `nvidia-smi topo -m` names it, the ring and trees planned over
//! the GPUs, and the XML form (`NCCL_TOPO_FILE`, `NCCL_TOPO_DUMP_FILE`).
//!
//! One detection serves the library (ring setup learns where its GPU sits)
//! and the `oxccl topo` / `oxccl doctor` tools: [`read_sysfs`] walks sysfs
//! (the walk is pure, [`read_topology`], over thin file access) and [`nvml`]
//! asks the driver's management library for what sysfs does not show;
//! [`Topology::merge_nvml`] joins the two.
//!
//! ```
//! // A machine recorded under a folder reads like the real one (`/`).
//! let t = oxccl::topo::read_sysfs(std::path::Path::new("/nonexistent"));
//! assert!(t.gpus().is_empty());
//! ```

pub use oxccl_core::topo::*;
pub use oxccl_env::sysfs::SysRoot;

/// The topology sysfs shows under `root` (`/` for this machine, or a folder
/// holding a recorded one): CPUs, PCI tree, GPUs, NICs; no NVLink or P2P.
pub fn read_sysfs(root: &std::path::Path) -> Topology {
    read_topology(&SysRoot::new(root))
}

/// NVML's view of this machine now, in this process: every GPU's NVLinks
/// and, with `with_p2p`, the peer-to-peer read status between GPUs. `Err`
/// names what is missing (no `libnvidia-ml.so.1`, no driver). A hanging
/// driver hangs this call: tools that must not hang call it in a child
/// process.
pub fn nvml(with_p2p: bool) -> std::result::Result<NvmlReport, String> {
    oxccl_cuda::nvml::probe(with_p2p)
}

/// Writes the topology this process uses (`NCCL_TOPO_FILE`'s or the
/// machine's, with NVML's links merged in when `with_gpu`) to `path` as
/// XML (`NCCL_TOPO_DUMP_FILE`); says where at INFO, or why not in a WARN.
pub(crate) fn dump(path: &std::path::Path, with_gpu: bool) {
    let mut t = oxccl_env::sysfs::machine_topology().clone();
    if with_gpu {
        if let Ok(r) = nvml(false) {
            t.merge_nvml(&r);
        }
    }
    match std::fs::write(path, t.to_xml()) {
        Ok(()) => oxccl_env::info!(
            oxccl_env::log::Subsys::GRAPH,
            "NCCL_TOPO_DUMP_FILE: wrote the topology ({} GPUs, {} NICs) to {}",
            t.gpus().len(),
            t.nics().len(),
            path.display()
        ),
        Err(e) => oxccl_env::warn!(
            "NCCL_TOPO_DUMP_FILE={}: cannot write the topology there: {e}",
            path.display()
        ),
    }
}
