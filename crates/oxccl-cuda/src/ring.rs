//! The ring path: collectives and grouped sends/receives over FIFO
//! connections (`kernels/ring.cu`), for any number of ranks, one process or
//! one process per GPU, through peer device memory or through host memory.
//!
//! Setup is collective (every rank of the communicator calls
//! [`Ring::setup`] with the same configuration) and runs four rounds of the
//! bootstrap's all-gather, each carrying an "ok" byte so that a rank that
//! fails locally makes every rank fail with a message naming it, instead of
//! leaving the others waiting:
//!
//! 1. who: process nonce (same process; the host comes from the bootstrap,
//!    which honours NCCL_HOSTID), PCI bus id,
//!    `NCCL_P2P_DISABLE`;
//! 2. whether this rank reaches every other GPU peer-to-peer
//!    (`cuDeviceCanAccessPeer` on the device with that bus id);
//! 3. the window: device memory (`cuMemAlloc` + an IPC handle) when every
//!    rank said yes, else pinned host memory in a /dev/shm file;
//! 4. whether every peer window could be mapped (and, for peers on other
//!    hosts, their TCP proxies connected).
//!
//! With ranks on other hosts every window is pinned host memory and each
//! such peer's window is replaced by a local shadow that proxy threads keep
//! in step over the network (`netproxy.rs`: TCP, with one more round that
//! agrees on the connections per peer; `netplugin.rs`: an NCCL network
//! plugin, with two more rounds that swap its listen handles and connect).

use std::ffi::{c_void, CString};
use std::time::Duration;

use oxccl_core::{DataType, Error, ErrorKind, RedOp, Result};

use crate::driver as cu;
use crate::loader::guarded;

// The ring program's decisions (settings, thresholds, kernel choice,
// channel counts, window layout) live in the pure core.
pub use oxccl_core::gpu::ring::*;
use oxccl_core::gpu::{Collective, RingKernel};

/// The one-rank PreMulSum kernel of (`t`, `op`), `oxccl_scale_*` (ring.cu,
/// `scale_run`), in the same program as [`kernel_name`]'s.
pub fn scale_kernel_name(t: DataType, op: RedOp) -> String {
    kernel_name(t, op).replacen("oxccl_ring_", "oxccl_scale_", 1)
}

/// The arguments of `oxccl_scale_*`: `count` elements from `input` to
/// `output` (the same buffer in place) times the scalar (`scale` for
/// floating types, `iscale`'s bits for integers, or the one at
/// `scalar_ptr` in device memory when not 0). No ring: the window fields
/// are 0 and unused.
pub fn scale_args(
    input: u64,
    output: u64,
    count: u64,
    scale: f64,
    iscale: u64,
    scalar_ptr: u64,
) -> RingArgs {
    RingArgs {
        c: RingCommon {
            nranks: 1,
            ..RingCommon::default()
        },
        input,
        output,
        count,
        scale,
        iscale,
        scalar_ptr,
        // The scale kernel reads no mode.
        mode: RingKernel::ring(Collective::AllReduce).mode(),
        root: 0,
    }
}

/// The small one-shot all-reduce kernel of (`t`, `op`), `oxccl_small_*`, in
/// the same program as [`kernel_name`]'s (ring.cu, `small_oneshot_ll_run`).
pub fn small_kernel_name(t: DataType, op: RedOp) -> String {
    kernel_name(t, op).replacen("oxccl_ring_", "oxccl_small_", 1)
}

/// Every rank of a group of one process in one launch, `oxccl_one_launch_*`
/// (ring.cu, `one_launch_run`; [`oxccl_core::gpu::one_launch`]), in the same program as
/// [`kernel_name`]'s.
pub fn one_launch_kernel_name(t: DataType, op: RedOp) -> String {
    kernel_name(t, op).replacen("oxccl_ring_", "oxccl_one_launch_", 1)
}

/// `oxccl_ring_<type>_<op>` of the pair whose kernels compute (`t`, `op`)
/// ([`crate::kernels::ring_kernel_of`]).
pub fn kernel_name(t: DataType, op: RedOp) -> String {
    let (t, op) = crate::kernels::ring_kernel_of(t, op);
    format!(
        "oxccl_ring_{}_{}",
        crate::kernels::type_tag(t),
        crate::kernels::op_tag(op).unwrap_or("sum")
    )
}

/// `struct RingCommon` of `ring.cu`, field for field (96 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RingCommon {
    peers: u64,
    state: u64,
    ctrl: u64,
    /// Device table: the rank at each ring position (after the peers table).
    order: u64,
    region: u64,
    slot: u64,
    timeout_ns: u64,
    nranks: u32,
    rank: u32,
    nch: u32,
    nslots: u32,
    ll_bytes: u64,
    ll_nslots: u32,
    /// This rank's ring position.
    pos: u32,
    /// Device table of Simple slots kept apart from the windows (GPUDirect
    /// RDMA; `slots_of` in ring.cu), or 0.
    data: u64,
}

/// `struct RingArgs` of `ring.cu` (152 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RingArgs {
    c: RingCommon,
    /// Input.
    pub input: u64,
    /// Output.
    pub output: u64,
    /// Elements (reduce-scatter, all-gather: per rank).
    pub count: u64,
    /// Float avg / PreMulSum multiplier.
    pub scale: f64,
    /// Integer PreMulSum multiplier (two's complement bits).
    pub iscale: u64,
    /// A PreMulSum scalar in device memory, else 0.
    pub scalar_ptr: u64,
    /// The kernel ([`RingKernel::mode`]).
    pub mode: u32,
    /// Broadcast's or reduce's root.
    pub root: u32,
}

/// `struct P2pOp` of `ring.cu` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct P2pOp {
    ptr: u64,
    bytes: u64,
    peer: u32,
    recv: u32,
    nch: u32,
    /// 1: LL lines over the pair's channel 0.
    ll: u32,
}

/// `struct P2pArgs` of `ring.cu` (2168 bytes, under the 4 KiB parameter limit).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct P2pArgs {
    c: RingCommon,
    nops: u32,
    nitems: u32,
    ops: [P2pOp; P2P_MAX_OPS],
    self_dst: u64,
    self_src: u64,
    self_bytes: u64,
}

impl P2pArgs {
    /// A launch with no operations and no self copy.
    fn empty(c: RingCommon) -> P2pArgs {
        P2pArgs {
            c,
            nops: 0,
            nitems: 0,
            ops: [P2pOp::default(); P2P_MAX_OPS],
            self_dst: 0,
            self_src: 0,
            self_bytes: 0,
        }
    }
}

pub use oxccl_core::gpu::window::WindowKind;
use oxccl_core::gpu::window::{peer_path, PeerPath, PeerSite, WindowDescriptor};

use crate::transport::{
    host_register, open_peer_window, shm_map, HostMapping, NetworkLink, WindowMapping,
};

#[derive(Debug)]
enum Local {
    Device(u64),
    Shm {
        addr: usize,
        len: usize,
        name: CString,
        unlinked: bool,
    },
}

/// One rank's ring state (see the module doc).
#[derive(Debug)]
pub struct Ring {
    ctx: cu::CUcontext,
    common: RingCommon,
    /// This rank's window and the peers' windows mapped here.
    windows: Windows,
    state: u64,
    ctrl_host: *mut u32,
    same_process: Vec<bool>,
    same_host: Vec<bool>,
    /// Ranks of the communicator on this rank's GPU (itself
    /// included), and the GPU's SMs ([`pdl_fits`]).
    sharing: u32,
    sms: u32,
    bytes: u64,
    /// Why the kernels were stopped from outside (a peer died), if they were.
    stopper: std::sync::Arc<Stopper>,
    /// What the kernel choice depends on ([`plan`]).
    thresholds: Thresholds,
    /// The network path: proxies for the peers on other hosts.
    net: NetProxies,
    /// The ranks in ring order (`order[common.pos] == rank`).
    order: Vec<usize>,
}

/// A rank's ring windows: its own (where peers write to it) and the
/// peers' as mapped here (IPC handles, shared host memory, peer access).
#[derive(Debug)]
struct Windows {
    /// Where the windows live.
    kind: WindowKind,
    /// This rank's window.
    local: Local,
    /// The kernels' window table in device memory.
    peers_buf: u64,
    /// The peers' windows as mapped here, and the network path's host
    /// window (closed at drop, with this ring's context current).
    mappings: Vec<Box<dyn WindowMapping>>,
    /// The kernels' window table as uploaded ([`region_at`]).
    table: Vec<u64>,
}

/// The network path's proxies: host threads that move a rank's regions to
/// and from peers on other hosts while its kernels fill and drain them.
#[derive(Debug)]
struct NetProxies {
    /// The proxies, over oxccl's own sockets or a network plugin.
    links: Vec<Box<dyn NetworkLink>>,
    /// (peer, host address of its shadow window).
    shadows: Vec<(usize, usize)>,
    /// Connections per peer of another host (agreed by every rank).
    streams: u32,
    /// Host and device addresses of the window the network proxies fill
    /// (this rank's regions for peers on other hosts): the window itself
    /// when it is host memory, else a second, host-memory window beside the
    /// device one (ranks of this host then stay peer-to-peer). (0, 0): none.
    window: (usize, u64),
    /// GPUDirect RDMA through the plugin, as decided (None: no plugin path).
    gdr: Option<oxccl_core::gpu::gdr::GdrChoice>,
    /// GPU memory for the plugin links' slots and the kernels' table of
    /// it (`RingCommon::data`), freed after the proxies stop.
    gpu_bufs: Vec<u64>,
}

// SAFETY: the raw pointers are driver allocations owned by this value; every
// use makes `ctx` current first, and the control words are only read or
// written with volatile accesses (the GPU is the other party).
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

/// The bootstrap all-gather: this rank's bytes in, every rank's bytes out.
pub type Exchange<'a> = &'a dyn Fn(&[u8]) -> Result<Vec<Vec<u8>>>;

/// What the ring needs from the communicator's bootstrap.
pub struct RingBoot<'a> {
    /// The all-gather.
    pub exchange: Exchange<'a>,
    /// Per rank: on this host (the bootstrap's verdict, which honours
    /// NCCL_HOSTID).
    pub same_host: Vec<bool>,
    /// The `index`-th TCP connection to a rank (collective between the
    /// two: both call it for each other with the same index), for the
    /// network path. The index keeps connection s at both ends the same
    /// one: accepted connections may finish their handshakes in any order.
    pub stream: &'a dyn Fn(usize, u32) -> Result<std::net::TcpStream>,
    /// The network plugin and device the communicator chose for peers on
    /// other hosts (`NCCL_NET_PLUGIN`); the network path then goes through it
    /// (`netplugin.rs`) instead of TCP. The same on every rank (the host
    /// communicator's settings check makes sure).
    pub net: Option<(std::sync::Arc<dyn oxccl_net::Net>, usize)>,
}

/// What stops the kernels from outside: the control words' address and why.
#[derive(Debug, Default)]
struct Stopper {
    ctrl: std::sync::atomic::AtomicUsize,
    peer_error: std::sync::Mutex<Option<Error>>,
}

impl Stopper {
    fn fail(&self, why: Error) {
        let mut g = self.peer_error.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            *g = Some(why);
        }
        drop(g);
        let c = self.ctrl.load(std::sync::atomic::Ordering::Acquire);
        if c != 0 {
            // SAFETY: the first control word; the block is freed only after
            // every user of this Stopper (the proxies) stopped.
            unsafe { std::ptr::write_volatile(c as *mut u32, 1) };
        }
    }
}

/// Where this rank's GPU sits, for choosing NICs by PCI distance.
struct GpuPlace {
    gpu: cu::CUdevice,
    busid: String,
    site: oxccl_core::topo::GpuSite,
}

impl GpuPlace {
    /// The current context's GPU.
    fn current() -> Result<GpuPlace> {
        let gpu = cu::ctx_get_device()?;
        let busid = bus_id(gpu).map(|b| bus_text(&b)).unwrap_or_default();
        let site = crate::topo::local_record(&busid, 0, Vec::new()).site;
        Ok(GpuPlace { gpu, busid, site })
    }

    /// A plugin device's place from its PCI path (its NUMA node from sysfs;
    /// -1 or absent: the GPU's); `None` without a path.
    fn nic_site(&self, props: &oxccl_net::Properties) -> Option<oxccl_core::topo::GpuSite> {
        let at = oxccl_core::topo::pci_path_site(props.pci_path.as_deref()?, self.site.numaid)?;
        let numa = std::fs::read_to_string(format!("/sys/bus/pci/devices/{}/numa_node", at.busid))
            .ok()
            .and_then(|t| t.trim().parse::<i64>().ok())
            .filter(|v| *v >= 0)
            .map_or(self.site.numaid, |v| v as u32);
        Some(oxccl_core::topo::GpuSite { numaid: numa, ..at })
    }
}

/// GPUDirect RDMA for this rank's GPU and the plugin's device `dev`
/// ([`oxccl_core::gpu::gdr::decide`]), logged on NET as NCCL does.
fn gdr_choice(
    net: &dyn oxccl_net::Net,
    dev: usize,
    cfg: &RingConfig,
    gpu: &GpuPlace,
) -> Result<oxccl_core::gpu::gdr::GdrChoice> {
    use cu::CUdevice_attribute as A;
    use oxccl_core::gpu::gdr::{decide, GdrFacts, GdrLevel};
    let props = net.properties(dev)?;
    let attr = |a| cu::device_attribute(gpu.gpu, a).unwrap_or(0);
    let nic = gpu.nic_site(&props);
    let facts = GdrFacts {
        net_cuda: props.supports_cuda(),
        net_dmabuf: props.supports_dmabuf(),
        net_force_flush: props.force_flush,
        net_has_flush: net.has_iflush(),
        gpu_rdma: attr(A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED) != 0,
        gpu_dmabuf: attr(A::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) != 0,
        gpu_cc: (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) as u32,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) as u32,
        ),
        distance: GdrLevel::of_path(nic.map(|n| oxccl_core::topo::site_path(&gpu.site, &n))),
    };
    let c = decide(&facts, &cfg.gdr).map_err(Error::invalid_usage)?;
    oxccl_env::info!(
        oxccl_env::log::Subsys::NET,
        "GPU Direct RDMA {} for GPU {} / NET/{}/{dev} ({})",
        if c.any() { "Enabled" } else { "Disabled" },
        gpu.busid,
        net.name(),
        c.why
    );
    Ok(c)
}

/// A number that tells this process from every other one on the host (PID
/// namespaces can repeat PIDs).
fn process_nonce() -> u64 {
    static N: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        t ^ ((std::process::id() as u64) << 40) ^ (&N as *const _ as u64)
    })
}

/// Round-1 record: who and where.
struct SetupRecord {
    ok: bool,
    nonce: u64,
    ordinal: i32,
    bus: [u8; 16],
    p2p_disable: bool,
    /// SMs of the rank's GPU (0: unknown).
    sms: u32,
}

impl SetupRecord {
    const LEN: usize = 1 + 8 + 4 + 16 + 1 + 4;
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::LEN);
        v.push(self.ok as u8);
        v.extend_from_slice(&self.nonce.to_le_bytes());
        v.extend_from_slice(&self.ordinal.to_le_bytes());
        v.extend_from_slice(&self.bus);
        v.push(self.p2p_disable as u8);
        v.extend_from_slice(&self.sms.to_le_bytes());
        v
    }
    fn decode(b: &[u8], rank: usize) -> Result<SetupRecord> {
        if b.len() != Self::LEN {
            return Err(Error::internal(format!(
                "GPU ring setup: rank {rank} sent a {}-byte record (expected {})",
                b.len(),
                Self::LEN
            )));
        }
        let mut bus = [0u8; 16];
        bus.copy_from_slice(&b[13..29]);
        Ok(SetupRecord {
            ok: b[0] == 1,
            nonce: u64::from_le_bytes(b[1..9].try_into().unwrap_or_default()),
            ordinal: i32::from_le_bytes(b[9..13].try_into().unwrap_or_default()),
            bus,
            p2p_disable: b[29] == 1,
            sms: u32::from_le_bytes(b[30..34].try_into().unwrap_or_default()),
        })
    }
}

/// Every rank's verdict byte: the first rank that is not ok, with its message.
fn all_ok(round: &str, all: &[Vec<u8>]) -> Result<()> {
    for (r, b) in all.iter().enumerate() {
        if b.first() != Some(&1) {
            let why = String::from_utf8_lossy(b.get(1..).unwrap_or_default()).into_owned();
            return Err(Error::remote(format!(
                "GPU ring setup ({round}): rank {r} failed{}",
                if why.is_empty() {
                    String::new()
                } else {
                    format!(": {why}")
                }
            )));
        }
    }
    Ok(())
}

/// Runs `f`; every rank learns whether every rank's `f` succeeded. A local
/// failure is returned as it is; another rank's names that rank.
fn agree<T>(round: &str, exchange: Exchange, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let r = f();
    let mine = match &r {
        Ok(_) => vec![1u8],
        Err(e) => {
            let mut v = vec![0u8];
            v.extend_from_slice(
                e.message()
                    .as_bytes()
                    .get(..400)
                    .unwrap_or(e.message().as_bytes()),
            );
            v
        }
    };
    let all = exchange(&mine)?;
    let t = r?;
    all_ok(round, &all)?;
    Ok(t)
}

fn bus_id(dev: cu::CUdevice) -> Result<[u8; 16]> {
    let b = guarded("cuDeviceGetPCIBusId", || Ok(cu::device_pci_bus_id(dev)?))?;
    Ok(b.map(|c| c as u8))
}

/// The bus id `cuDeviceGetPCIBusId` wrote, as text.
fn bus_text(bus: &[u8; 16]) -> String {
    let end = bus.iter().position(|&c| c == 0).unwrap_or(16);
    String::from_utf8_lossy(&bus[..end]).into_owned()
}

fn device_by_bus(bus: &[u8; 16]) -> Option<cu::CUdevice> {
    let end = bus.iter().position(|&c| c == 0).unwrap_or(16);
    let s = CString::new(&bus[..end]).ok()?;
    guarded("cuDeviceGetByPCIBusId", || {
        Ok(cu::device_by_pci_bus_id(&s)?)
    })
    .ok()
}

fn can_access(a: cu::CUdevice, b: cu::CUdevice) -> bool {
    if a == b {
        return true;
    }
    matches!(
        guarded("cuDeviceCanAccessPeer", || Ok(cu::device_can_access_peer(
            a, b
        )?)),
        Ok(true)
    )
}

fn shm_name() -> CString {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    CString::new(format!(
        "/oxccl-gpu-{}-{:x}-{n}",
        std::process::id(),
        process_nonce() & 0xffff_ffff
    ))
    .unwrap_or_default()
}

fn dev_alloc_zeroed(bytes: usize) -> Result<u64> {
    guarded("cuMemAlloc", || {
        // A context is current (the caller's scope).
        let p = cu::mem_alloc(bytes.max(16))?;
        // SAFETY: the memset covers the allocation and the synchronize
        // completes it; on failure it is freed once, with nothing queued.
        unsafe {
            let r = cu::memset_d8(p, 0, bytes.max(16)).and_then(|_| cu::ctx_synchronize());
            if let Err(e) = r {
                let _ = cu::mem_free(p);
                return Err(e.into());
            }
        }
        Ok(p)
    })
}

impl Ring {
    /// Sets up this rank's ring (collective: see the module doc). `ctx` is
    /// this rank's (retained) context on device `dev`.
    pub fn setup(
        dev: cu::CUdevice,
        ctx: cu::CUcontext,
        rank: usize,
        nranks: usize,
        cfg: &RingConfig,
        boot: &RingBoot,
    ) -> Result<Ring> {
        let exchange = boot.exchange;
        let _scope = crate::device::CtxScope::enter(ctx)?;
        // This GPU's SMs (0: unknown): in the rank records (the channel
        // bound where ranks share a GPU) and this rank's launch bounds.
        let sms = crate::device::sm_count(dev).unwrap_or(0);
        // Round 1: who.
        let who = {
            let r = bus_id(dev).map(|bus| SetupRecord {
                ok: true,
                nonce: process_nonce(),
                ordinal: dev,
                bus,
                p2p_disable: cfg.p2p_disable,
                sms,
            });
            let mine = match &r {
                Ok(w) => w.encode(),
                Err(_) => {
                    let mut v = vec![0u8; SetupRecord::LEN];
                    v[0] = 0;
                    v
                }
            };
            let all = exchange(&mine)?;
            r?;
            let mut v = Vec::with_capacity(nranks);
            for (i, b) in all.iter().enumerate() {
                let w = SetupRecord::decode(b, i)?;
                if !w.ok {
                    return Err(Error::remote(format!(
                        "GPU ring setup: rank {i} could not read its GPU's PCI bus id"
                    )));
                }
                v.push(w);
            }
            v
        };
        if who.len() != nranks {
            return Err(Error::internal("GPU ring setup: wrong number of records"));
        }
        if boot.same_host.len() != nranks {
            return Err(Error::internal("GPU ring setup: wrong host table"));
        }
        // Ranks on other hosts: the network path (netproxy.rs). Every rank
        // sees one when there are two hosts, so the choice below agrees.
        let cross = boot.same_host.iter().any(|x| !x);
        let same_process: Vec<bool> = who
            .iter()
            .enumerate()
            .map(|(i, w)| boot.same_host[i] && w.nonce == who[rank].nonce)
            .collect();
        // Ranks of other processes count too: under MPS their kernels run
        // beside ours as those of one process do.
        let sharing = who
            .iter()
            .zip(&boot.same_host)
            .filter(|(w, &here)| here && w.bus == who[rank].bus)
            .count() as u32;
        // Round 2: can this rank reach every GPU peer-to-peer?
        let any_disable = who.iter().any(|w| w.p2p_disable);
        let mut reach = !any_disable;
        if reach {
            for (i, w) in who.iter().enumerate() {
                // Ranks on other hosts are the network path's, whatever
                // their bus ids (another host's may equal one here).
                if i == rank || !boot.same_host[i] {
                    continue;
                }
                reach &= match device_by_bus(&w.bus) {
                    Some(d) => can_access(dev, d),
                    None => false,
                };
            }
        }
        let verdicts = exchange(&[reach as u8])?;
        // Across hosts too: the ranks of each host keep peer-to-peer between
        // them, and the proxies fill a host-memory window of their own.
        let kind = if verdicts.iter().all(|v| v.first() == Some(&1)) {
            WindowKind::Device
        } else {
            WindowKind::Host
        };
        // Round 3: where each GPU sits (sysfs, NVML; `topo.rs`): the ring
        // order, and on one host over peer-to-peer the channel count.
        let (order, cfg) = {
            let host = (0..nranks)
                .find(|&r| r == rank || boot.same_host[r])
                .unwrap_or(rank) as u64;
            let mine =
                crate::topo::local_record(&bus_text(&who[rank].bus), host, cfg.ring_order.clone());
            let all = exchange(&mine.encode())?;
            let recs = all
                .iter()
                .enumerate()
                .map(|(i, b)| crate::topo::Record::decode(b, i))
                .collect::<Result<Vec<_>>>()?;
            let sites: Vec<_> = recs.iter().map(|r| r.site.clone()).collect();
            let hosts: Vec<u64> = recs.iter().map(|r| r.host).collect();
            let order = match crate::topo::forced_order(&recs[0], nranks)? {
                Some(o) => o,
                None => oxccl_core::topo::rank_ring(&sites, &hosts),
            };
            // Only what is known lowers the count: every rank's NVML answered
            // (else an NVLink pair would look like PCIe), all on one host
            // over peer-to-peer (and no channel setting from the user:
            // setup_channels).
            let topo = (!cross && kind == WindowKind::Device && recs.iter().all(|r| r.nvml))
                .then(|| ring_channels(&sites, &order, cfg.channels));
            let gpus: Vec<(u64, [u8; 16], u32)> = recs
                .iter()
                .zip(&who)
                .map(|(r, w)| (r.host, w.bus, w.sms))
                .collect();
            let share = shared_channel_cap(&gpus);
            let mut eff = cfg.clone();
            eff.channels =
                setup_channels(cfg, nranks, kind == WindowKind::Host || cross, topo, share);
            if let Some(s) = share.filter(|s| cfg.channels_set && s.channels < cfg.channels) {
                oxccl_env::warn!(
                    "NCCL_MIN_NCHANNELS/NCCL_MAX_NCHANNELS asked for {} channels; {} ranks share \
                     one GPU of {} SMs, which runs {} of each rank's ring blocks at once: {} \
                     channels",
                    cfg.channels,
                    s.ranks,
                    s.sms,
                    s.channels,
                    eff.channels
                );
            }
            let n = order.len();
            let hops: Vec<String> = (0..n.min(16))
                .map(|p| {
                    let (a, b) = (order[p], order[(p + 1) % n]);
                    format!(
                        "{a}->{b} {}",
                        oxccl_core::topo::site_path(&sites[a], &sites[b])
                    )
                })
                .collect();
            oxccl_env::info!(
                oxccl_env::log::Subsys::GRAPH,
                "GPU ring order{}: {} ({}{}); {} channels{}{}",
                if recs[0].forced_order.is_empty() {
                    " from the topology"
                } else {
                    " from OXCCL_RING_ORDER"
                },
                order
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
                hops.join(", "),
                if n > 16 { ", ..." } else { "" },
                eff.channels,
                match share {
                    Some(s) => format!(
                        " (at most {}: {} ranks share a GPU of {} SMs)",
                        s.channels, s.ranks, s.sms
                    ),
                    None => String::new(),
                },
                if recs.iter().all(|r| r.nvml) {
                    ""
                } else {
                    " (NVML not available on every rank: NVLinks unknown)"
                }
            );
            (order, eff)
        };
        let cfg = &cfg;
        let pos = order.iter().position(|&r| r == rank).unwrap_or(rank);
        let common = RingCommon {
            peers: 0,
            state: 0,
            ctrl: 0,
            order: 0,
            region: cfg.region(),
            slot: cfg.slot as u64,
            timeout_ns: cfg.timeout.as_nanos().min(u64::MAX as u128) as u64,
            nranks: nranks as u32,
            rank: rank as u32,
            nch: cfg.channels,
            nslots: cfg.nslots,
            ll_bytes: LL_SLOT_BYTES,
            ll_nslots: LL_NSLOTS,
            pos: pos as u32,
            data: 0,
        };
        let bytes = cfg.window_bytes(nranks);
        let mut me = Ring {
            ctx,
            common,
            windows: Windows {
                kind,
                local: Local::Device(0),
                peers_buf: 0,
                mappings: Vec::new(),
                table: Vec::new(),
            },
            state: 0,
            ctrl_host: std::ptr::null_mut(),
            same_process,
            same_host: boot.same_host.clone(),
            sharing,
            sms,
            bytes,
            stopper: Default::default(),
            thresholds: Thresholds {
                p2p_blocks_max: p2p_resident_blocks(sharing, sms),
                ..Thresholds::of(cfg, nranks, cross)
            },
            net: NetProxies {
                links: Vec::new(),
                shadows: Vec::new(),
                streams: 1,
                window: (0, 0),
                gdr: None,
                gpu_bufs: Vec::new(),
            },
            order,
        };
        if cross {
            // Both ends must open the same number of connections: the
            // smallest any rank asks for (every rank sees `cross`, so every
            // rank takes part in this exchange).
            let want = match cfg.net_streams {
                0 => auto_net_streams(boot.same_host.iter().filter(|x| !**x).count()),
                n => n.clamp(1, 16),
            };
            let all = exchange(&want.to_le_bytes())?;
            me.net.streams = all
                .iter()
                .filter_map(|b| {
                    b.get(..4)
                        .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                })
                .min()
                .unwrap_or(1)
                .clamp(1, 16);
        }
        // Round 3: the window, its control words and counters; descriptors out.
        let desc = agree("window", exchange, || me.make_window(nranks))?;
        let all = exchange(&desc)?;
        // Round 4: map every peer's window (a shadow for peers on other
        // hosts) and connect the network path's proxies.
        agree("mapping", exchange, || {
            me.map_peers(&who, &all, &boot.same_host)?;
            if boot.net.is_some() {
                return Ok(());
            }
            me.start_proxies(boot)
        })?;
        if let (true, Some((net, dev))) = (cross, &boot.net) {
            // Rounds 5 and 6: the plugin's connections (every rank takes
            // part: `cross` and `net` are the same on every rank).
            me.start_plugin(net, *dev, exchange, cfg)?;
        }
        if let Local::Shm { name, unlinked, .. } = &mut me.windows.local {
            // Every peer has mapped it: the name is no longer needed, and a
            // crash from here on leaves nothing behind in /dev/shm.
            // SAFETY: NUL-terminated name of the file we created.
            unsafe { libc::shm_unlink(name.as_ptr()) };
            *unlinked = true;
        }
        Ok(me)
    }

    /// Allocates the window, counters and control words; this rank's descriptor.
    fn make_window(&mut self, nranks: usize) -> Result<Vec<u8>> {
        let n = nranks;
        let nch = self.common.nch as usize;
        // Counters: Simple sent, Simple received, LL sent, LL received,
        // barriers (ring.cu, `counter`).
        self.state = dev_alloc_zeroed(5 * n * nch * 8)?;
        // 64 bytes of portable mapped pinned memory.
        let host = guarded("cuMemHostAlloc", || {
            Ok(cu::mem_host_alloc(
                64,
                cu::CU_MEMHOSTALLOC_PORTABLE | cu::CU_MEMHOSTALLOC_DEVICEMAP,
            )?)
        })?;
        self.ctrl_host = host as *mut u32;
        self.stopper
            .ctrl
            .store(host as usize, std::sync::atomic::Ordering::Release);
        // SAFETY: 64 bytes just allocated.
        unsafe { std::ptr::write_bytes(host as *mut u8, 0, 64) };
        let dctrl = guarded("cuMemHostGetDevicePointer", || {
            // SAFETY: `host` is mapped pinned memory.
            Ok(unsafe { cu::mem_host_device_pointer(host) }?)
        })?;
        self.common.ctrl = dctrl;
        self.common.state = self.state;
        let len = self.bytes.max(16) as usize;
        let desc = match self.windows.kind {
            WindowKind::Device => {
                let p = dev_alloc_zeroed(len)?;
                self.windows.local = Local::Device(p);
                let h = guarded("cuIpcGetMemHandle", || {
                    // SAFETY: `p` is a cuMemAlloc allocation of this context.
                    Ok(unsafe { cu::ipc_get_mem_handle(p) }?)
                })?;
                WindowDescriptor::device(p, h.reserved.map(|c| c as u8))
            }
            WindowKind::Host => {
                let name = shm_name();
                let addr = shm_map(&name, len, true)?;
                self.windows.local = Local::Shm {
                    addr,
                    len,
                    name: name.clone(),
                    unlinked: false,
                };
                let dp = host_register(addr, len)?;
                self.net.window = (addr, dp);
                WindowDescriptor::host(dp, name.as_bytes())?
            }
        };
        Ok(desc.encode())
    }

    /// Maps every peer's window and writes the device table of window
    /// addresses (`region_of` in ring.cu: each rank's window as reached from
    /// here, then where this rank's regions for each rank are).
    fn map_peers(
        &mut self,
        who: &[SetupRecord],
        all: &[Vec<u8>],
        same_host: &[bool],
    ) -> Result<()> {
        let n = who.len();
        let rank = self.common.rank as usize;
        let mut table = vec![0u64; 2 * n];
        if same_host.len() != n || all.len() != n {
            return Err(Error::internal(
                "GPU ring setup: host table, descriptors and records differ in length",
            ));
        }
        let len = self.bytes.max(16) as usize;
        if self.windows.kind == WindowKind::Device && same_host.iter().any(|x| !x) {
            // Device window and peers on other hosts: the proxies' regions
            // go in a host window of their own (only this process maps it).
            let w = HostMapping::anonymous(len)?;
            self.net.window = (w.host_addr().unwrap_or(0), w.device_addr());
            self.windows.mappings.push(Box::new(w));
        }
        let descs = all
            .iter()
            .enumerate()
            .map(|(i, d)| WindowDescriptor::decode(d, i))
            .collect::<Result<Vec<_>>>()?;
        table[n..].copy_from_slice(&own_regions(same_host, descs[rank].addr, self.net.window.1));
        for (i, d) in descs.iter().enumerate() {
            let site = PeerSite {
                is_self: i == rank,
                same_host: same_host[i],
                same_process: self.same_process[i],
                same_gpu: who[i].ordinal == who[rank].ordinal,
            };
            let path = peer_path(d.kind, site);
            table[i] = match open_peer_window(path, d, i, who[i].ordinal, len)? {
                None => d.addr,
                Some(m) => {
                    if path == PeerPath::Network {
                        // The proxies keep this shadow of the peer's window in step.
                        self.net.shadows.push((i, m.host_addr().unwrap_or(0)));
                    }
                    let at = m.device_addr();
                    self.windows.mappings.push(m);
                    at
                }
            };
        }
        // One allocation: the 2n window addresses, then the ring order (n u32).
        let p = dev_alloc_zeroed(2 * n * 8 + n * 4)?;
        self.windows.peers_buf = p;
        self.common.peers = p;
        self.common.order = p + 2 * n as u64 * 8;
        let mut bytes: Vec<u8> = table.iter().flat_map(|v| v.to_le_bytes()).collect();
        bytes.extend(self.order.iter().flat_map(|&r| (r as u32).to_le_bytes()));
        self.windows.table = table;
        guarded("cuMemcpyHtoD", || {
            // SAFETY: `p` holds 2 * n * 8 + n * 4 bytes, `bytes` as many.
            // Synchronized: the DMA from pageable memory may land after the
            // copy returns, and the kernels run on the user's streams, which
            // may be non-blocking (exec's copy_to_device).
            unsafe { cu::memcpy_htod(p, bytes.as_ptr() as *const c_void, bytes.len()) }?;
            Ok(cu::ctx_synchronize()?)
        })
    }

    /// Opens the plugin's listens for every peer on another host, swaps the
    /// handles, connects every link and starts a proxy per peer.
    fn start_plugin(
        &mut self,
        net: &std::sync::Arc<dyn oxccl_net::Net>,
        dev: usize,
        exchange: Exchange,
        cfg: &RingConfig,
    ) -> Result<()> {
        use crate::netplugin::{GpuSlots, Listens, PeerPlan, PluginLink, PluginProxy};
        let timeout = cfg.timeout;
        let window = self.net.window.0;
        if window == 0 {
            return Err(Error::internal("GPU plugin path without a host window"));
        }
        let (n, nch) = (self.common.nranks as usize, self.common.nch as usize);
        const H: usize = 128;
        // Handles by (peer, channel): for n x nch x 128 bytes per rank.
        if n * nch * H > 1 << 20 {
            return Err(Error::invalid_usage(format!(
                "the GPU plugin path's handle table ({n} ranks x {nch} channels) is over 1 MiB"
            )));
        }
        let mut listens: Vec<Option<Listens>> = (0..n).map(|_| None).collect();
        let shadows = self.net.shadows.clone();
        // Channel c on devs[c]: the NICs nearest this rank's GPU, spread,
        // or rail-aligned by NCCL_CROSS_NIC (oxccl_core::topo::nic_per_channel);
        // the communicator's device when the plugin's devices cannot be listed.
        let place = GpuPlace::current()?;
        let local = (0..self.common.rank as usize)
            .filter(|&r| self.same_host(r))
            .count();
        let devs = {
            let nics: Vec<_> = oxccl_net::usable_devices(net.as_ref(), cfg.ib_hca.as_deref())
                .into_iter()
                .map(|(d, p)| (d, place.nic_site(&p)))
                .collect();
            let d = oxccl_core::topo::nic_per_channel(
                &place.site,
                &nics,
                local,
                nch as u32,
                cfg.cross_nic,
            );
            if d.len() == nch {
                d
            } else {
                vec![dev; nch]
            }
        };
        oxccl_env::info!(
            oxccl_env::log::Subsys::NET,
            "{}",
            oxccl_core::topo::nic_channels_line(
                &format!("GPU {}", place.busid),
                net.name(),
                &devs,
                cfg.cross_nic
            )
        );
        let blob = agree("plugin listen", exchange, || {
            let mut blob = vec![0u8; n * nch * H];
            for &(peer, _) in &shadows {
                let (l, hs) = Listens::open(net.clone(), &devs)?;
                for (c, h) in hs.iter().enumerate() {
                    blob[(peer * nch + c) * H..][..H].copy_from_slice(h);
                }
                listens[peer] = Some(l);
            }
            Ok(blob)
        })?;
        let all = exchange(&blob)?;
        let layout = self.net_layout();
        let me = self.common.rank;
        let deadline = std::time::Instant::now() + timeout.min(Duration::from_secs(120));
        let stopper = self.stopper.clone();
        // GPUDirect RDMA: a local choice (each end registers its own
        // memory as it likes); made inside the agreed step, so a failure
        // here fails every rank's setup at the same round.
        let mut gpu: Vec<GpuSlots> = vec![GpuSlots::default(); n];
        let ctx = self.ctx;
        let proxies = agree("plugin connect", exchange, || {
            let choice = gdr_choice(net.as_ref(), devs[0], cfg, &place)?;
            if choice.any() {
                let len = crate::netplugin::gpu_slots_bytes(&layout);
                let mut table = vec![0u64; 2 * n];
                for &(peer, _) in &shadows {
                    let g = &mut gpu[peer];
                    g.dmabuf = choice.registration == oxccl_core::gpu::gdr::Registration::DmaBuf;
                    g.flush = choice.flush;
                    if choice.send {
                        g.send = dev_alloc_zeroed(len)?;
                        self.net.gpu_bufs.push(g.send);
                        table[peer] = g.send;
                    }
                    if choice.recv {
                        g.recv = dev_alloc_zeroed(len)?;
                        self.net.gpu_bufs.push(g.recv);
                        table[n + peer] = g.recv;
                    }
                }
                let t = dev_alloc_zeroed(2 * n * 8)?;
                self.net.gpu_bufs.push(t);
                let bytes: Vec<u8> = table.iter().flat_map(|v| v.to_le_bytes()).collect();
                guarded("cuMemcpyHtoD", || {
                    // SAFETY: `t` holds 2 * n * 8 bytes, `bytes` as many;
                    // synchronized (see map_peers).
                    unsafe { cu::memcpy_htod(t, bytes.as_ptr() as *const c_void, bytes.len()) }?;
                    Ok(cu::ctx_synchronize()?)
                })?;
                self.common.data = t;
            }
            self.net.gdr = Some(choice);
            let mut plans = Vec::new();
            for &(peer, shadow) in &shadows {
                let theirs = all
                    .get(peer)
                    .filter(|b| b.len() == n * nch * H)
                    .ok_or_else(|| Error::internal("GPU plugin path: handle table size"))?;
                let mut hs = Vec::new();
                for c in 0..nch {
                    let mut h = [0u8; H];
                    h.copy_from_slice(&theirs[(me as usize * nch + c) * H..][..H]);
                    hs.push(h);
                }
                plans.push(PeerPlan {
                    peer: peer as u32,
                    shadow,
                    mine: listens[peer]
                        .as_ref()
                        .ok_or_else(|| Error::internal("GPU plugin path: no listens"))?,
                    theirs: hs,
                    gpu: gpu[peer],
                });
            }
            // SAFETY: the window, the shadows and the GPU buffers stay
            // until Drop, which stops every proxy (and so closes every
            // link) first; our context is current (setup's scope).
            let links = unsafe {
                PluginLink::connect_all(net, &devs, layout, me, window, plans, deadline, ctx)
            }?;
            let mut ps: Vec<Box<dyn NetworkLink>> = Vec::new();
            for link in links {
                let st = stopper.clone();
                ps.push(Box::new(PluginProxy::start(
                    link,
                    std::sync::Arc::new(move |e: Error| st.fail(e)),
                )?));
            }
            Ok(ps)
        })?;
        self.net.links = proxies;
        Ok(())
    }

    /// Connects and starts a proxy for every peer on another host.
    fn start_proxies(&mut self, boot: &RingBoot) -> Result<()> {
        let window = self.net.window.0;
        if window == 0 {
            return if self.net.shadows.is_empty() {
                Ok(())
            } else {
                Err(Error::internal("GPU network path without a host window"))
            };
        }
        let layout = self.net_layout();
        let me = self.common.rank;
        let n = self.net.streams;
        for &(peer, shadow) in &self.net.shadows.clone() {
            for s in 0..n {
                let stream = (boot.stream)(peer, s)?;
                let channels: Vec<u32> = (0..layout.nch).filter(|c| c % n == s).collect();
                let st = self.stopper.clone();
                let on: crate::netproxy::OnError = std::sync::Arc::new(move |e: Error| st.fail(e));
                // SAFETY: the shadow and the window are mapped until Drop,
                // which stops every proxy first; both are page-aligned.
                let p = unsafe {
                    crate::netproxy::Proxy::start(
                        crate::netproxy::Link {
                            layout,
                            me,
                            peer: peer as u32,
                            shadow,
                            window,
                            channels,
                        },
                        stream,
                        on,
                    )
                }?;
                self.net.links.push(Box::new(p));
            }
        }
        Ok(())
    }

    /// Where the windows live.
    pub fn kind(&self) -> WindowKind {
        self.windows.kind
    }

    /// Whether rank `r` runs in this process.
    pub fn same_process(&self, r: usize) -> bool {
        self.same_process.get(r).copied().unwrap_or(false)
    }

    /// The device address (as this rank reaches it) of the pushed
    /// reduction's landed counter of (`owner`, `other`): in `owner`'s window,
    /// written by `other` ([`CE_LANDED`]). The block counter is the next word.
    pub fn ce_landed_word(&self, owner: usize, other: usize) -> Option<u64> {
        let c = &self.common;
        region_at(
            &self.windows.table,
            c.rank as usize,
            c.nch,
            c.region,
            owner,
            other,
            0,
        )
        .map(|a| a + CE_LANDED)
    }

    /// The device address (as this rank reaches it) of the in-place pushed
    /// reduction's counter of (`owner`, `other`): in `owner`'s window,
    /// written by `other` ([`CE_PUSHED`]).
    pub fn ce_pushed_word(&self, owner: usize, other: usize) -> Option<u64> {
        self.ce_landed_word(owner, other)
            .map(|a| a - CE_LANDED + CE_PUSHED)
    }

    /// The device address (as this rank reaches it) of the slot-ring pushed
    /// reduction's consumed count of (`owner`, `other`): in `owner`'s window,
    /// written by `other`'s kernel ([`CE_CONSUMED`]).
    pub fn ce_consumed_word(&self, owner: usize, other: usize) -> Option<u64> {
        self.ce_landed_word(owner, other)
            .map(|a| a - CE_LANDED + CE_CONSUMED)
    }

    /// GPUDirect RDMA on the plugin path: (sends read GPU memory,
    /// receives land in it).
    pub fn gpu_direct(&self) -> (bool, bool) {
        self.net
            .gdr
            .as_ref()
            .map_or((false, false), |g| (g.send, g.recv))
    }

    /// Whether rank `r` is on this rank's host (else the network path serves it).
    pub fn same_host(&self, r: usize) -> bool {
        self.same_host.get(r).copied().unwrap_or(true)
    }

    /// What the kernel choice depends on ([`plan`]).
    pub fn thresholds(&self) -> Thresholds {
        self.thresholds
    }

    /// Whether a launch of `blocks` blocks on this rank's stream may be
    /// programmatic ([`pdl_fits`]).
    pub fn may_pdl(&self, blocks: u32) -> bool {
        pdl_fits(blocks, self.sharing, self.sms)
    }

    /// The window layout as the network proxies (TCP and plugin) see it.
    fn net_layout(&self) -> crate::netproxy::Layout {
        crate::netproxy::Layout {
            nranks: self.common.nranks,
            nch: self.common.nch,
            nslots: self.common.nslots,
            slot: self.common.slot,
            region: self.common.region,
        }
    }

    /// The ranks in ring order.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// Channels of the window (most blocks a collective launches).
    pub fn channels(&self) -> u32 {
        self.common.nch
    }

    /// Device and pinned bytes this rank holds for the ring.
    pub fn footprint(&self) -> u64 {
        self.bytes + 4 * self.common.nranks as u64 * self.common.nch as u64 * 8 + 64
    }

    /// Tells the kernels of this rank to stop because `why` (a peer died):
    /// waits end within about a millisecond, and a wait that ended so
    /// reports `why`; later launches are refused with it.
    pub fn fail_peer(&self, why: Error) {
        self.stopper.fail(why);
    }

    fn peer_error(&self) -> Option<Error> {
        self.stopper
            .peer_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Tells the kernels of this rank to stop (`ncclCommAbort`): their waits
    /// end within about a millisecond.
    pub fn abort(&self) {
        if !self.ctrl_host.is_null() {
            // SAFETY: the first of our 16 control words; the GPU reads it.
            unsafe { std::ptr::write_volatile(self.ctrl_host, 1) };
        }
    }

    /// The error a kernel of this rank recorded, if any.
    pub fn error(&self) -> Option<Error> {
        if self.ctrl_host.is_null() {
            return None;
        }
        // SAFETY: words 1..4 of our control block, written by the GPU.
        let (code, peer, ch) = unsafe {
            (
                std::ptr::read_volatile(self.ctrl_host.add(1)),
                std::ptr::read_volatile(self.ctrl_host.add(2)),
                std::ptr::read_volatile(self.ctrl_host.add(3)),
            )
        };
        match code {
            0 => None,
            1 => Some(Error::new(
                ErrorKind::Remote,
                format!(
                    "a GPU collective waited for rank {peer} (channel {ch}) longer than the \
                     timeout ({:.0} s, OXCCL_TIMEOUT_MS): that rank did not make the matching \
                     call, or died",
                    self.common.timeout_ns as f64 / 1e9
                ),
            )),
            2 => Some(self.peer_error().unwrap_or_else(|| {
                Error::invalid_usage(format!(
                    "a GPU collective waiting for rank {peer} (channel {ch}) was aborted"
                ))
            })),
            _ => Some(Error::remote(format!(
                "GPU collective ended by error code {code} (peer {peer}, channel {ch})"
            ))),
        }
    }

    /// Why launches are refused after an abort: the peer failure the
    /// watchdog saw, or the abort itself.
    pub fn abort_reason(&self) -> Error {
        self.peer_error()
            .unwrap_or_else(|| Error::invalid_usage("communicator aborted"))
    }

    /// Whether the communicator was aborted.
    pub fn aborted(&self) -> bool {
        // SAFETY: word 0 of our control block.
        !self.ctrl_host.is_null() && unsafe { std::ptr::read_volatile(self.ctrl_host) } != 0
    }

    /// A collective's arguments (the caller fills the scalar fields).
    pub fn args(
        &self,
        kernel: RingKernel,
        input: u64,
        output: u64,
        count: u64,
        root: u32,
    ) -> RingArgs {
        // The kernels count the root of a broadcast or reduce by its ring position.
        let root = match kernel.collective() {
            Collective::Broadcast | Collective::Reduce => {
                self.order
                    .iter()
                    .position(|&r| r == root as usize)
                    .unwrap_or(root as usize) as u32
            }
            _ => root,
        };
        RingArgs {
            c: self.common,
            input,
            output,
            count,
            scale: 1.0 / self.common.nranks as f64,
            iscale: 0,
            scalar_ptr: 0,
            mode: kernel.mode(),
            root,
        }
    }

    /// The arguments of a barrier with rank `peer` (`oxccl_ring_barrier`).
    pub fn barrier_args(&self, peer: usize) -> RingArgs {
        self.args(
            RingKernel::ring(Collective::AllReduce),
            0,
            0,
            0,
            peer as u32,
        )
    }

    /// The device address of the kernels' control words (abort, error,
    /// peer, block; host-mapped memory of this context).
    pub fn ctrl_device(&self) -> u64 {
        self.common.ctrl
    }

    /// How long a wait may last (the kernels' timeout; zero: no limit).
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.common.timeout_ns)
    }

    /// [`Ring::timeout`] in ns, as every kernel's wait takes it.
    pub fn timeout_ns(&self) -> u64 {
        self.common.timeout_ns
    }

    /// The channels a send or receive of `bytes` to another rank runs on
    /// (what [`Ring::p2p_launches`] gives it).
    pub fn p2p_op_channels(&self, bytes: usize) -> u32 {
        let (t, nch) = (&self.thresholds, self.common.nch);
        let ll = bytes as u64 <= t.p2p_ll_max
            && bytes as u64 <= P2P_LL_CAP * p2p_max_channels(nch) as u64;
        if ll {
            p2p_ll_channels(bytes as u64, nch)
        } else {
            p2p_channels(bytes as u64, nch, t.p2p_wide_min)
        }
    }

    /// The launches of a group's sends and receives with other ranks
    /// (`(peer, pointer, bytes)`), with `self_copy` in the first (see
    /// [`p2p_launch_args`]).
    pub fn p2p_launches(
        &self,
        sends: &[(usize, u64, usize)],
        recvs: &[(usize, u64, usize)],
        self_copy: Option<crate::ce::Xfer>,
    ) -> Result<Vec<(u32, P2pArgs)>> {
        p2p_launch_args(self.common, &self.thresholds, sends, recvs, self_copy)
    }
}

/// The launches (blocks, arguments) of a group's sends and receives with
/// other ranks (`(peer, pointer, bytes)`): the k-th launch carries the k-th send
/// and the k-th receive with each peer, so every launch's partners are
/// in the peers' launch of the same index.
pub fn p2p_launch_args(
    common: RingCommon,
    thresholds: &Thresholds,
    sends: &[(usize, u64, usize)],
    recvs: &[(usize, u64, usize)],
    self_copy: Option<crate::ce::Xfer>,
) -> Result<Vec<(u32, P2pArgs)>> {
    let n = common.nranks as usize;
    let mut per: Vec<Vec<P2pOp>> = Vec::new();
    let mut seen = vec![[0usize; 2]; n];
    for (dir, list) in [(0u32, sends), (1u32, recvs)] {
        for &(peer, ptr, bytes) in list {
            if bytes == 0 {
                continue;
            }
            if peer >= n {
                return Err(Error::invalid_argument(format!(
                    "peer {peer} does not exist ({n} ranks)"
                )));
            }
            let k = seen[peer][dir as usize];
            seen[peer][dir as usize] += 1;
            if per.len() <= k {
                per.push(Vec::new());
            }
            // Both ends decide from the same size and the same
            // thresholds (LL only within a host).
            // (At most one connection's LL slots per channel, so a send
            // never waits inside the launch for its receiver.)
            let ll = bytes as u64 <= thresholds.p2p_ll_max
                && bytes as u64 <= P2P_LL_CAP * p2p_max_channels(common.nch) as u64;
            per[k].push(P2pOp {
                ptr,
                bytes: bytes as u64,
                peer: peer as u32,
                recv: dir,
                nch: if ll {
                    p2p_ll_channels(bytes as u64, common.nch)
                } else {
                    p2p_channels(bytes as u64, common.nch, thresholds.p2p_wide_min)
                },
                ll: ll as u32,
            });
        }
    }
    let mut out = Vec::new();
    for ops in per {
        for chunk in ops.chunks(P2P_MAX_OPS) {
            if chunk.len() < ops.len() {
                return Err(Error::invalid_usage(format!(
                    "more than {P2P_MAX_OPS} sends and receives with distinct peers in one \
                     group on device buffers are not supported by oxccl yet ({} here)",
                    ops.len()
                )));
            }
            let mut a = P2pArgs::empty(common);
            a.nops = chunk.len() as u32;
            for (d, s) in a.ops.iter_mut().zip(chunk) {
                *d = *s;
                a.nitems += s.nch;
            }
            out.push((p2p_blocks(a.nitems, thresholds.p2p_blocks_max), a));
        }
    }
    if let Some(x) = self_copy.filter(|x| x.bytes > 0) {
        if out.is_empty() {
            out.push((1, P2pArgs::empty(common)));
        }
        let (blocks, a) = &mut out[0];
        a.self_dst = x.dst;
        a.self_src = x.src;
        a.self_bytes = x.bytes;
        // Blocks of their own past the items, which copy from the start
        // (the kernel: blocks past `nitems` hold no item); past the cap,
        // every block copies after its items.
        *blocks = (a.nitems + self_copy_blocks(x.bytes))
            .min(thresholds.p2p_blocks_max.min(P2P_MAX_BLOCKS))
            .max(*blocks);
    }
    Ok(out)
}

/// Launches a ring collective (the context that owns `f` and `stream` must be current).
///
/// # Safety
/// `args` must come from [`Ring::args`] of a live ring, with input and
/// output device memory of this GPU that holds what the mode reads and
/// writes, and every other rank must make the matching call.
pub unsafe fn launch_ring(
    f: cu::CUfunction,
    blocks: u32,
    stream: cu::CUstream,
    args: RingArgs,
    pdl: bool,
) -> Result<()> {
    // SAFETY: one RingArgs (repr(C), the kernel's layout); the caller vouches
    // for its pointers.
    unsafe {
        crate::device::launch_struct(
            f,
            blocks,
            THREADS,
            stream,
            &args,
            pdl,
            "cuLaunchKernel(ring)",
        )
    }
}

/// Launches `oxccl_one_launch_*` on rank 0's stream.
///
/// # Safety
/// `args` from [`oxccl_core::gpu::one_launch::args`] of every rank's checked call: each
/// buffer device memory of its rank's GPU, of the sizes the mode uses, and
/// reachable from rank 0's context (the same GPU, or peer access enabled
/// when the communicator was created); `f` from rank 0's context.
pub unsafe fn launch_one_launch(
    f: cu::CUfunction,
    blocks: u32,
    stream: cu::CUstream,
    args: oxccl_core::gpu::one_launch::OneLaunchArgs,
) -> Result<()> {
    // SAFETY: one OneLaunchArgs (repr(C), the kernel's layout, 344 bytes); the
    // caller vouches for its pointers.
    unsafe {
        crate::device::launch_struct(
            f,
            blocks,
            THREADS,
            stream,
            &args,
            true,
            "cuLaunchKernel(one launch)",
        )
    }
}

/// Launches `oxccl_ring_barrier` (one block of one warp) with `peer`:
/// both ranks' streams meet there ([`Ring::barrier_args`]).
///
/// # Safety
/// `args` from [`Ring::barrier_args`] of a live ring whose peer makes the
/// matching launch.
pub unsafe fn launch_barrier(
    f: cu::CUfunction,
    stream: cu::CUstream,
    args: RingArgs,
    pdl: bool,
) -> Result<()> {
    // SAFETY: one RingArgs (repr(C), the kernel's layout); it touches only
    // the ring's counters, windows and control words.
    unsafe {
        crate::device::launch_struct(f, 1, 32, stream, &args, pdl, "cuLaunchKernel(ring barrier)")
    }
}

/// Launches `oxccl_ring_p2p`.
///
/// # Safety
/// As [`launch_ring`], for the operations' buffers.
pub unsafe fn launch_p2p(
    f: cu::CUfunction,
    blocks: u32,
    stream: cu::CUstream,
    args: &P2pArgs,
    pdl: bool,
) -> Result<()> {
    // SAFETY: one P2pArgs (repr(C), the kernel's layout, 2,144 bytes: under
    // the 4 KiB parameter limit); the caller vouches for its pointers.
    unsafe {
        crate::device::launch_struct(
            f,
            blocks,
            THREADS,
            stream,
            args,
            pdl,
            "cuLaunchKernel(ring p2p)",
        )
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: everything freed here was allocated or opened by this value,
        // once; errors are ignored in drop. Our context is made current for
        // the device frees and restored after.
        unsafe {
            let saved = cu::ctx_get_current().unwrap_or(std::ptr::null_mut());
            if cu::ctx_set_current(self.ctx).is_ok() {
                // The proxies keep running until our kernels are done (they
                // may need them to finish); then they stop, before anything
                // they read or write is freed.
                let _ = cu::ctx_synchronize();
                self.stop_proxies();
                self.windows.mappings.clear();
                match &self.windows.local {
                    Local::Device(p) if *p != 0 => {
                        let _ = cu::mem_free(*p);
                    }
                    Local::Shm {
                        addr,
                        len,
                        name,
                        unlinked,
                    } => {
                        let _ = cu::mem_host_unregister(*addr as *mut c_void);
                        libc::munmap(*addr as *mut c_void, *len);
                        if !unlinked {
                            libc::shm_unlink(name.as_ptr());
                        }
                    }
                    _ => {}
                }
                for p in [self.windows.peers_buf, self.state]
                    .into_iter()
                    .chain(self.net.gpu_bufs.drain(..))
                {
                    if p != 0 {
                        let _ = cu::mem_free(p);
                    }
                }
                if !self.ctrl_host.is_null() {
                    let _ = cu::mem_free_host(self.ctrl_host as *mut c_void);
                }
            }
            let _ = cu::ctx_set_current(saved);
        }
        self.stop_proxies();
    }
}

impl Ring {
    fn stop_proxies(&mut self) {
        // What the finished kernels wrote must cross before the connection
        // closes (5 s at most: a dead peer cannot hold destroy longer).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        for l in &self.net.links {
            l.drain(deadline);
        }
        for l in &self.net.links {
            l.halt();
        }
        for mut l in self.net.links.drain(..) {
            l.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_kernel() {
        assert_eq!(std::mem::size_of::<RingCommon>(), 96);
        assert_eq!(std::mem::size_of::<RingArgs>(), 152);
        assert_eq!(std::mem::size_of::<P2pOp>(), 32);
        assert_eq!(
            std::mem::size_of::<P2pArgs>(),
            96 + 8 + 32 * P2P_MAX_OPS + 24
        );
        assert!(std::mem::size_of::<P2pArgs>() <= 4096);
        assert_eq!(
            small_kernel_name(DataType::Float32, RedOp::Sum),
            "oxccl_small_f32_sum"
        );
        assert_eq!(
            one_launch_kernel_name(DataType::Int8, RedOp::Max),
            "oxccl_one_launch_i8_max"
        );
    }

    /// The setup records come from other ranks: any bytes decode to an
    /// error or a record, never a panic.
    #[test]
    fn setup_records_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let good = SetupRecord {
            ok: true,
            nonce: 7,
            ordinal: 1,
            bus: [b'0'; 16],
            p2p_disable: false,
            sms: 132,
        }
        .encode();
        assert!(SetupRecord::decode(&good, 0).is_ok());
        for i in 0..5000 {
            let len = (next() % 140) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if i % 2 == 0 && len <= good.len() {
                b = good.clone();
                let k = (next() as usize) % b.len();
                b[k] = next() as u8;
            }
            let _ = SetupRecord::decode(&b, i);
            let _ = all_ok("test", &[b]);
        }
        assert!(all_ok("test", &[vec![1], vec![0, b'x']])
            .unwrap_err()
            .message()
            .contains("rank 1 failed: x"));
    }

    #[test]
    fn p2p_launches_pair_the_kth_transfers_and_carry_the_self_copy() {
        let common = RingCommon {
            nranks: 3,
            rank: 0,
            nch: 32,
            ..RingCommon::default()
        };
        let cfg = RingConfig::new(false, 4 << 20, None, None, 3, Duration::from_secs(1));
        let t = Thresholds::of(&cfg, 3, false);
        // Two sends to 1 (small: LL; large: Simple over channels), one
        // receive from 2, a zero-byte send to 2 (dropped).
        let sends = [
            (1usize, 0x100u64, 8usize),
            (1, 0x200, 1 << 20),
            (2, 0x300, 0),
        ];
        let recvs = [(2usize, 0x400u64, 16 << 10)];
        let self_copy = crate::ce::Xfer {
            dst: 0x900,
            src: 0x800,
            bytes: 100 << 10,
        };
        let l = p2p_launch_args(common, &t, &sends, &recvs, Some(self_copy)).unwrap();
        assert_eq!(
            l.len(),
            2,
            "the k-th transfers with each peer share launch k"
        );
        let (b0, a0) = &l[0];
        assert_eq!(a0.nops, 2);
        assert_eq!(
            (a0.ops[0].peer, a0.ops[0].recv, a0.ops[0].ll, a0.ops[0].nch),
            (1, 0, 1, 1)
        );
        // 16 KiB is within NCCL's LL bound, as a receive too.
        assert_eq!(
            (a0.ops[1].peer, a0.ops[1].recv, a0.ops[1].ll, a0.ops[1].nch),
            (2, 1, 1, 1)
        );
        assert_eq!(a0.nitems, 2);
        assert_eq!(
            (a0.self_dst, a0.self_src, a0.self_bytes),
            (0x900, 0x800, 100 << 10)
        );
        assert_eq!(
            *b0,
            2 + self_copy_blocks(100 << 10),
            "blocks of the self copy's own past the 2 items"
        );
        // At the cap the grid stops growing (its blocks then copy after
        // their items).
        let big = crate::ce::Xfer {
            bytes: 64 << 20,
            ..self_copy
        };
        let l_big = p2p_launch_args(common, &t, &sends, &recvs, Some(big)).unwrap();
        assert_eq!(l_big[0].0, P2P_MAX_BLOCKS);
        let (b1, a1) = &l[1];
        assert_eq!(a1.nops, 1);
        assert_eq!((a1.ops[0].ll, a1.ops[0].nch), (0, 16));
        assert_eq!(a1.self_bytes, 0, "the self copy rides once");
        assert_eq!(*b1, 16);
        // Ranks sharing a GPU (p2p_blocks_max lowered by Ring::setup): the
        // items and the self copy's blocks stay within it.
        let shared = Thresholds {
            p2p_blocks_max: 10,
            ..t
        };
        let l = p2p_launch_args(common, &shared, &sends, &recvs, Some(big)).unwrap();
        assert_eq!((l[0].0, l[1].0), (10, 10));
        // Across hosts nothing is LL.
        let far = Thresholds::of(&cfg, 3, true);
        let l = p2p_launch_args(common, &far, &sends, &recvs, None).unwrap();
        assert!(l
            .iter()
            .all(|(_, a)| a.ops[..a.nops as usize].iter().all(|o| o.ll == 0)));
        // A self copy alone still gets a launch; nothing at all gets none.
        let l = p2p_launch_args(common, &t, &[], &[], Some(self_copy)).unwrap();
        assert_eq!((l.len(), l[0].1.nops, l[0].1.self_bytes), (1, 0, 100 << 10));
        assert!(p2p_launch_args(common, &t, &[(1, 1, 0)], &[], None)
            .unwrap()
            .is_empty());
        // A peer outside the communicator is an error, not a panic.
        let e = p2p_launch_args(common, &t, &[(3, 1, 8)], &[], None).unwrap_err();
        assert!(e.message().contains("peer 3"), "{e}");
    }

    #[test]
    fn p2p_ll_only_within_a_host_and_within_the_slots() {
        let mut cfg = RingConfig::new(false, 4 << 20, None, None, 2, Duration::from_secs(1));
        assert_eq!(
            Thresholds::of(&cfg, 2, false).p2p_ll_max,
            DEFAULT_P2P_LL_MAX
        );
        assert_eq!(default_p2p_ll_max(2), 512 << 10);
        assert_eq!(default_p2p_ll_max(3), 256 << 10);
        assert_eq!(default_p2p_ll_max(8), (512 << 10) / 7);
        assert_eq!(default_p2p_ll_max(64), 16 << 10);
        assert_eq!(default_p2p_ll_max(1), 512 << 10);
        assert_eq!(Thresholds::of(&cfg, 2, true).p2p_ll_max, 0);
        // At most one connection's LL slots per channel, 16 channels.
        cfg.p2p_ll_max = 1 << 30;
        assert_eq!(Thresholds::of(&cfg, 8, false).p2p_ll_max, 16 * P2P_LL_CAP);
        assert_eq!(P2P_LL_CAP, 64 << 10);
        let mut narrow = cfg.clone();
        narrow.channels = 2;
        assert_eq!(Thresholds::of(&narrow, 2, false).p2p_ll_max, 2 * P2P_LL_CAP);
        // A channel per 16 KiB, at most 16, never more than the slots hold.
        assert_eq!(p2p_ll_channels(8, 32), 1);
        assert_eq!(p2p_ll_channels(16 << 10, 32), 1);
        assert_eq!(p2p_ll_channels((16 << 10) + 1, 32), 2);
        assert_eq!(p2p_ll_channels(512 << 10, 32), 16);
        assert_eq!(p2p_ll_channels(1 << 20, 32), 16);
        assert_eq!(p2p_ll_channels(100 << 10, 2), 2);
        // A window of 2 channels: 128 KiB is LL on both, 128 KiB + 16 is
        // Simple (one channel's part would overflow its slots).
        let common = RingCommon {
            nranks: 2,
            rank: 0,
            nch: 2,
            ..RingCommon::default()
        };
        let t = Thresholds::of(&cfg, 2, false);
        let op = |bytes: usize| {
            let l = p2p_launch_args(common, &t, &[(1, 0x100, bytes)], &[], None).unwrap();
            (l[0].1.ops[0].ll, l[0].1.ops[0].nch)
        };
        assert_eq!(op(128 << 10), (1, 2));
        assert_eq!(op((128 << 10) + 16), (0, 2));
        cfg.ll_max = 0; // NCCL_PROTO without LL
        assert_eq!(Thresholds::of(&cfg, 2, false).p2p_ll_max, 0);
        assert_eq!(p2p_channels(128 << 10, 32, P2P_WIDE_MIN), 4);
        assert_eq!(p2p_channels((32 << 10) + 1, 32, P2P_WIDE_MIN), 2);
        assert_eq!(p2p_channels((4 << 20) - 16, 32, P2P_WIDE_MIN), 16);
        assert_eq!(p2p_channels(4 << 20, 32, P2P_WIDE_MIN), 32);
        assert_eq!(p2p_channels(4 << 20, 32, u64::MAX), 16);
        assert_eq!(p2p_channels(4 << 20, 16, P2P_WIDE_MIN), 16);
        // The most items any launch gives one block fit the kernel's 16.
        let items = P2P_MAX_OPS as u32 * p2p_channels(u64::MAX / 2, 32, 0);
        assert!(items.div_ceil(p2p_blocks(items, P2P_MAX_BLOCKS)) <= 16);
        assert!(items.div_ceil(p2p_blocks(items, 1)) <= 16);
    }
}
