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
