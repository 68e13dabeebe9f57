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

use cudarc::driver::sys::{self, CUresult};
use oxccl_core::{DataType, Error, ErrorKind, RedOp, Result};

use crate::device::check;
use crate::loader::guarded;

/// Bytes before a region's slots (`RING_HDR`: tail, head and LL head lines).
pub const HDR_BYTES: u64 = 384;
/// Byte offset, in a channel-0 region's header, of the pushed reduction's
/// landed counter (`RING_CE_LANDED`, a u32 the peer's copy stream writes;
/// xp.rs) and, 4 bytes on, the reducing kernel's block counter.
pub const CE_LANDED: u64 = 296;
/// Byte offset, in a channel-0 region's header, of the in-place pushed
/// reduction's counter (`RING_CE_PUSHED`: a u64 whose low word the other
/// rank's copy stream writes after each push; this rank's kernel and copy
/// stream wait on it, and this rank's stream puts it back to 0 after the
/// call's last barrier: ce_reduce.rs, `plan_pushed_in_place`).
pub const CE_PUSHED: u64 = 312;
/// Byte offset, in a channel-0 region's header, of how many pieces the
/// other rank's kernel has reduced of an in-place reduce-scatter that this
/// rank pushes into the other rank's scratch ring (`RING_CE_CONSUMED`, a
/// u32 that kernel writes; this rank's copy stream waits on it before it
/// refills a slot, and this rank's stream puts it back to 0 after the
/// call's first barrier: ce_reduce.rs, `plan_pushed_ring`).
pub const CE_CONSUMED: u64 = 308;

/// Where channel `ch` of (`owner`, `other`) lives, as `rank` reaches it:
/// the host's mirror of `region_of` in ring.cu. `table` is the kernels'
/// window table (`n` ranks: each rank's window, then this rank's own
/// regions for each rank), `region` the bytes per (rank, channel) region.
/// `None` for a pair the kernels never ask for (neither end is `rank`,
/// or both are) or an index past the table.
pub fn region_at(
    table: &[u64],
    rank: usize,
    nch: u32,
    region: u64,
    owner: usize,
    other: usize,
    ch: u32,
) -> Option<u64> {
    let n = table.len() / 2;
    if owner == other || (owner != rank && other != rank) || owner >= n || other >= n || ch >= nch {
        return None;
    }
    let idx = if other < owner { other } else { other - 1 } as u64;
    let base = if owner == rank {
        table[n + other]
    } else {
        table[owner]
    };
    Some(base + (idx * nch as u64 + ch as u64) * region)
}
/// Bytes of one LL slot: 1024 16-byte lines, 8 KiB of data (a block of 512
/// threads moves it with two lines per thread).
pub const LL_SLOT_BYTES: u64 = 16 << 10;
/// LL slots per connection.
pub const LL_NSLOTS: u32 = 8;
/// Most point-to-point operations in one launch (`RING_P2P_MAX_OPS`).
pub const P2P_MAX_OPS: usize = 64;
/// Threads per block (the kernels' `__launch_bounds__`).
pub const THREADS: u32 = 512;
/// Most blocks of a point-to-point launch: with at most [`P2P_MAX_OPS`] ops
/// of at most 32 channels, 128 blocks hold <= 16 items each, the kernel's
/// `RING_P2P_MAX_ITEMS`; and 128 <= 132 SMs, so every block is
/// resident (a block waits for other GPUs, never for a block of its own grid).
pub const P2P_MAX_BLOCKS: u32 = 128;
/// Most channels a window has (a collective launches one block per channel).
pub const MAX_CHANNELS: u32 = 32;

/// `kernels/ring.cu` modes.
pub const RM_ALLREDUCE: u32 = 0;
/// Reduce-scatter (`count` per rank).
pub const RM_REDUCE_SCATTER: u32 = 1;
/// All-gather (`count` per rank).
pub const RM_ALLGATHER: u32 = 2;
/// Broadcast from `root`.
pub const RM_BROADCAST: u32 = 3;
/// Reduce to `root`.
pub const RM_REDUCE: u32 = 4;
/// All-reduce over the LL protocol.
pub const RM_ALLREDUCE_LL: u32 = 5;
/// One-shot all-reduce over LL slots (every rank to every rank).
pub const RM_ALLREDUCE_LL1: u32 = 6;
/// One-shot all-reduce over Simple slots (across hosts).
pub const RM_ALLREDUCE_1S: u32 = 7;
/// One-shot all-gather over LL slots (every rank's block to every rank).
pub const RM_ALLGATHER_LL1: u32 = 8;
/// One-shot reduce-scatter over LL slots (block p of every rank to rank p).
pub const RM_REDUCE_SCATTER_LL1: u32 = 9;
/// One-shot broadcast over LL slots (the root's lines to every rank).
pub const RM_BROADCAST_LL1: u32 = 10;
/// One-shot reduce over LL slots (every other rank's lines to the root).
pub const RM_REDUCE_LL1: u32 = 11;
/// Two-shot all-reduce over LL slots (3 to [`LL1_MAX_RANKS`] ranks of one
/// host): block p of every rank to rank p, reduced there, sent to every rank.
pub const RM_ALLREDUCE_LL2: u32 = 12;
/// One-shot all-gather over Simple slots (3 to [`LL1_MAX_RANKS`] ranks of
/// one host): each rank's block written into every peer's slots at once.
pub const RM_ALLGATHER_1S: u32 = 13;
/// One-shot reduce-scatter over Simple slots: block p of every rank into
/// rank p's slots, folded there in rank order.
pub const RM_REDUCE_SCATTER_1S: u32 = 14;
/// Two-shot all-reduce over Simple slots: [`RM_REDUCE_SCATTER_1S`] of the
/// message's n blocks, then [`RM_ALLGATHER_1S`] of the reduced ones.
pub const RM_ALLREDUCE_2S: u32 = 15;
/// Most ranks of the one-shot all-reduces (`RING_LL1_MAX_RANKS`).
pub const LL1_MAX_RANKS: usize = 8;

/// Settings of the ring path (from the communicator's parameters).
#[derive(Debug, Clone)]
pub struct RingConfig {
    /// `NCCL_P2P_DISABLE=1`: go through host memory.
    pub p2p_disable: bool,
    /// Channels (blocks per collective, connections per peer).
    pub channels: u32,
    /// Bytes per slot (a multiple of 16).
    pub slot: usize,
    /// Slots per connection.
    pub nslots: u32,
    /// A GPU wait longer than this ends the kernel with an error.
    pub timeout: Duration,
    /// All-reduces of at most this many bytes take the LL protocol (0: never).
    pub ll_max: u64,
    /// All-reduces of at most this many bytes (and within `ll_max`) take the
    /// one-shot LL kernel where the ranks are at most [`LL1_MAX_RANKS`] (0: never).
    pub oneshot_max: u64,
    /// All-reduces above `oneshot_max`, of at most this many bytes (and
    /// within `ll_max`), take the two-shot LL kernel instead of the LL ring
    /// where the ranks are 3 to [`LL1_MAX_RANKS`] on one host (0: never).
    pub twoshot_max: u64,
    /// All-gathers and reduce-scatters whose per-rank block, and all-reduces
    /// whose n-th part, is at most this many bytes take the direct kernels
    /// over Simple slots ([`RM_ALLGATHER_1S`], [`RM_REDUCE_SCATTER_1S`],
    /// [`RM_ALLREDUCE_2S`]) instead of the Simple ring, where the ranks are 3
    /// to [`LL1_MAX_RANKS`] on one host (0: never).
    pub direct_max: u64,
    /// All-reduces of at most this many bytes take the one-shot kernel over
    /// Simple slots when some peer is on another host (LL cannot cross the
    /// network proxies), at most [`LL1_MAX_RANKS`] ranks (0: never).
    pub oneshot_net_max: u64,
    /// Sends and receives of at most this many bytes take LL lines
    /// (NCCL_P2P_LL_THRESHOLD; 0: never; at most [`P2P_LL_CAP`] per channel).
    pub p2p_ll_max: u64,
    /// Every operation with peers takes the ring, even where the two-GPU
    /// one-shot kernels could run (NCCL_ALGO without OneShot/TwoShot).
    pub force: bool,
    /// TCP connections (each with its own sender and receiver thread) per
    /// peer of another host (NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD,
    /// 1..=16; 0: [`auto_net_streams`]; the ranks take the smallest value
    /// any of them asks for).
    pub net_streams: u32,
    /// `channels` came from NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS: the
    /// topology does not change it ([`topo_channels`]).
    pub channels_set: bool,
    /// OXCCL_RING_ORDER ([`crate::topo::parse_ring_order`]): the ranks in
    /// ring order, instead of the order the topology picks
    /// ([`oxccl_core::topo::rank_ring`]). Empty: none.
    pub ring_order: Vec<u32>,
}

/// Connections per peer on another host when the user set none: as many as
/// keep this rank at <= 16 connections (32 proxy threads) in all, at most 8.
///
/// Measured on 2xH200 (2 processes as 2 hosts, PyTorch all_reduce
/// over loopback, 2026-11-30): 1 / 4 / 8 connections gave 1.41 / 4.55 / 5.37
/// GB/s busbw at 2 MB and 2.36 / 7.39 / 11.34 at 128 MB (NCCL's sockets:
/// 2.87 and 3.40).
pub fn auto_net_streams(cross_peers: usize) -> u32 {
    (16 / cross_peers.max(1)).clamp(1, 8) as u32
}

/// GB/s one ring block (512 threads) moves over a peer link: 24 blocks
/// gave 268 GB/s busbw on the 2xH200 NVLink pair (11.2 each; 2026-11-30,
/// performance-gpu.md), so 11 is what a block is counted for.
const BLOCK_GBPS: u32 = 11;

/// Channels worth using on a ring whose slowest hop is `worst`, at most
/// `default`: the hop's rate over `BLOCK_GBPS`, rounded up. NVLink: ~25
/// GB/s per link each way (18 on H200: 32 channels, measured; NV4 bridges:
/// 10). PCIe paths: ~50 GB/s at best (Gen5 x16), so 5; across the CPUs'
/// interconnect (SYS) 4. The PCIe figures are link rates, not measured
/// here (no PCIe-only machine); NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS
/// override all of it.
pub fn topo_channels(worst: oxccl_core::topo::Path, default: u32) -> u32 {
    use oxccl_core::topo::Path;
    let gbps = match worst {
        // Ranks sharing a GPU: copies inside its memory.
        Path::Itself => return default,
        Path::Nv(n) => 25 * n,
        Path::Pix | Path::Pxb | Path::Phb | Path::Node => 50,
        Path::Sys => 40,
    };
    gbps.div_ceil(BLOCK_GBPS).clamp(1, default.max(1))
}

/// Whether a launch of `blocks` blocks on a GPU where `sharing` ranks of
/// the communicator run (`sms` SMs) may be programmatic
/// (start early: [`crate::device::launch_raw`]). An early launch's blocks
/// hold SMs while they wait for the kernel before them, so every rank on
/// the GPU may hold its kernel and its next at once, and each kernel waits
/// for the other ranks' blocks, which must still find SMs: 2 x blocks x
/// sharing must fit. 4 ranks sharing an H200 (132 SMs), 32-block LL
/// all-reduces, hung under CUDA graphs until the kernels' timeout; the same
/// calls with OXCCL_CUDA_PDL=0 completed (2026-12-01). One rank
/// per GPU (the usual case) always may; an unknown SM count (0) never
/// with several.
pub fn pdl_fits(blocks: u32, sharing: u32, sms: u32) -> bool {
    sharing <= 1 || 2 * blocks as u64 * sharing as u64 <= sms as u64
}

/// Blocks of a ring kernel (`oxccl_ring_*`) one SM holds at once: one. The
/// CUBINs' register counts (sm_90): 128 a thread for
/// `oxccl_ring_*` (512 threads: all of an SM's 65,536 registers), 64 for
/// `oxccl_ring_p2p`, `oxccl_ll1_*` and `oxccl_joint_*` (two blocks).
pub const RING_BLOCKS_PER_SM: u32 = 1;
/// Blocks of the send/receive kernel (`oxccl_ring_p2p`) one SM holds: two.
pub const P2P_BLOCKS_PER_SM: u32 = 2;
/// Items (op, channel) one block of the send/receive kernel serves at most
/// (`RING_P2P_MAX_ITEMS` in ring.cu).
pub const P2P_MAX_ITEMS: u32 = 16;

/// The channel bound where ranks share GPUs, with what set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareCap {
    /// Most channels.
    pub channels: u32,
    /// Ranks on the GPU that set it.
    pub ranks: u32,
    /// Its SMs.
    pub sms: u32,
}

/// The most channels a communicator may have where some GPU runs more than
/// one of its ranks (`gpus`: each rank's host, GPU bus id and SM count;
/// a count of 0, unknown, sets no bound). A channel's block waits for
/// the same channel of the other ranks, so every rank's blocks on a GPU
/// must be resident at once: SMs x [`RING_BLOCKS_PER_SM`] over the ranks
/// there, the least over such GPUs. None where each GPU runs one rank.
/// Measured (12 ranks sharing an H200 at 16 channels, 192 blocks on 132
/// SMs): a 64 MiB all-reduce ended in the kernels' timeout; 9 ranks (144
/// blocks) completed, in two waves (2026-12-01).
pub fn shared_channel_cap(gpus: &[(u64, [u8; 16], u32)]) -> Option<ShareCap> {
    let mut best: Option<ShareCap> = None;
    for (i, g) in gpus.iter().enumerate() {
        // Count each GPU once, at its first rank.
        if g.2 == 0 || gpus[..i].iter().any(|h| h.0 == g.0 && h.1 == g.1) {
            continue;
        }
        let ranks = gpus.iter().filter(|h| h.0 == g.0 && h.1 == g.1).count() as u32;
        if ranks < 2 {
            continue;
        }
        let channels = (g.2 * RING_BLOCKS_PER_SM / ranks).clamp(1, MAX_CHANNELS);
        if best.is_none_or(|b| channels < b.channels) {
            best = Some(ShareCap {
                channels,
                ranks,
                sms: g.2,
            });
        }
    }
    best
}

/// The channels a ring is set up with: the configured count (the default
/// for `nranks` or NCCL_MIN/MAX_NCHANNELS), lowered to what the ring's
/// slowest hop is worth (`topo`: [`ring_channels`], where known and the
/// user set no count), to 16 beyond 4 ranks when the window is pinned host
/// memory or some peers are on other hosts (`host_path`; NCCL_P2P_DISABLE's
/// windows would take (n - 1) x 32 x 2.1 MiB of pinned memory each, 476 MiB
/// at 8 ranks, for a path PCIe bounds at ~5 channels' worth; across hosts
/// the network bounds the rate, and 16 stays), and to
/// what ranks sharing a GPU run at once (`share`, whatever the user set:
/// above it the kernels wait on blocks that never start).
pub fn setup_channels(
    cfg: &RingConfig,
    nranks: usize,
    host_path: bool,
    topo: Option<u32>,
    share: Option<ShareCap>,
) -> u32 {
    let mut ch = cfg.channels;
    if !cfg.channels_set {
        if let Some(t) = topo {
            ch = ch.min(t);
        }
        if host_path && nranks > 4 {
            ch = ch.min(16);
        }
    }
    if let Some(s) = share {
        ch = ch.min(s.channels);
    }
    ch.max(1)
}

/// The channels for a ring in `order` over `sites` (the fewest any hop is
/// worth, [`topo_channels`]).
pub fn ring_channels(sites: &[oxccl_core::topo::GpuSite], order: &[usize], default: u32) -> u32 {
    let n = order.len();
    if n < 2 {
        return default;
    }
    (0..n)
        .filter_map(|p| {
            let (a, b) = (sites.get(order[p])?, sites.get(order[(p + 1) % n])?);
            Some(topo_channels(oxccl_core::topo::site_path(a, b), default))
        })
        .min()
        .unwrap_or(default)
}

impl RingConfig {
    /// The ring settings for `NCCL_BUFFSIZE` (bytes per connection), the
    /// channel bounds, the rank count and the timeout: 4 slots of
    /// buffsize/8 (512 KiB by default; 16 KiB..1 MiB, a 16-byte multiple);
    /// `max_channels` channels, else 32 up to [`LL1_MAX_RANKS`] (8) ranks
    /// and 16 beyond, at least `min_channels`, within 1..=32
    /// ([`setup_channels`] may lower it when the ring is set up).
    ///
    /// Why 32: one block moves ~12-20 GB/s over NVLink, and on the 2xH200
    /// machine 16 channels gave 189 GB/s busbw at 512 MB, 32 gave 265
    /// (NCCL 312). On an NVSwitch machine each ring hop has a GPU's 18
    /// links as the pair does (NCCL's ring: 365-370 GB/s on 2 to 8 H100,
    /// flat in n), so 8 ranks need the pair's 32, not 16 (~189 GB/s, the
    /// earlier setting). The window is (ranks - 1) x channels x 2.1 MiB (4
    /// slots and the LL slots): 68 MiB for 2 ranks, 204 MiB for 4, 476 MiB
    /// for 8 (NCCL on 8xH100: 1.06 GB a rank after its first collectives,
    /// NVIDIA/nccl#1685); beyond 8 ranks 16 channels (15 ranks: 476 MiB).
    pub fn new(
        p2p_disable: bool,
        buffsize: u64,
        min_channels: Option<u32>,
        max_channels: Option<u32>,
        nranks: usize,
        timeout: Duration,
    ) -> RingConfig {
        let slot = (buffsize / 8).clamp(16 << 10, 1 << 20) / 16 * 16;
        let mut ch = max_channels.unwrap_or(if nranks <= LL1_MAX_RANKS { 32 } else { 16 });
        if let Some(m) = min_channels {
            ch = ch.max(m);
        }
        RingConfig {
            p2p_disable,
            channels: ch.clamp(1, MAX_CHANNELS),
            slot: slot as usize,
            nslots: 4,
            timeout,
            ll_max: default_ll_max(nranks),
            oneshot_max: default_oneshot_max(nranks),
            twoshot_max: default_twoshot_max(nranks),
            direct_max: default_direct_max(nranks),
            oneshot_net_max: default_oneshot_net_max(nranks),
            p2p_ll_max: default_p2p_ll_max(nranks),
            force: false,
            net_streams: 0,
            channels_set: min_channels.is_some() || max_channels.is_some(),
            ring_order: Vec::new(),
        }
    }

    /// Bytes of one rank's window for `nranks` ranks.
    pub fn window_bytes(&self, nranks: usize) -> u64 {
        nranks.saturating_sub(1) as u64 * self.channels as u64 * self.region()
    }

    fn region(&self) -> u64 {
        HDR_BYTES + self.nslots as u64 * self.slot as u64 + LL_NSLOTS as u64 * LL_SLOT_BYTES
    }
}

/// The all-reduce size up to which LL is taken by default (bytes), for
/// more than 2 ranks. Measured on 2xH200, 2 processes, CUDA graphs
/// (`oxccl perf --ranks 2 -G 10`, NCCL_PROTO=LL against Simple, 2026-11-30):
/// LL 9.4 / 11.6 / 19.7 / 35.8 us at 64 KiB / 512 KiB / 1 MiB / 2 MiB,
/// Simple 17.3 / 18.3 / 19.7 / 23.3: they crossed at 1 MiB.
pub const DEFAULT_LL_MAX: u64 = 512 << 10;

/// [`DEFAULT_LL_MAX`], but 1 MiB for 2 ranks: there the ring LL took
/// 13.9 us for a 1 MiB all-reduce under CUDA graphs against the Simple
/// ring's 18.6 (NCCL 12.8-13.0; 14.4 against 20.1 eager; 2 MiB 21.9 either
/// way, 2 processes, 2xH200, 2026-11-30, two rounds). Not measured for more
/// ranks (no 4- or 8-GPU machine yet), so they keep 512 KiB.
pub fn default_ll_max(nranks: usize) -> u64 {
    if nranks == 2 {
        1 << 20
    } else {
        DEFAULT_LL_MAX
    }
}

/// The most bytes a rank's egress may reach in the one-shot LL copies and
/// reduce-scatters ([`Thresholds::oneshot_block_max`]), however far
/// `ll_max` goes (unless LL is forced at every size). At 1 MiB per rank the
/// Simple ring won (2 processes, graphs, 2xH200, 2026-11-30): all-gathers 14.7 us
/// against one-shot LL's 15.8, reduce-scatters 14.2 against 16.6, reduces
/// of 1 MiB 8.8 against 11.7 (broadcasts 9.6 against 8.9).
pub const ONESHOT_LL_MAX: u64 = 512 << 10;

/// Sends and receives of at most this many bytes take LL by default (NCCL's
/// NCCL_P2P_LL_THRESHOLD default is 16 KiB; the knob means the same here).
/// Why LL: a Simple transfer pays a system-scope fence before its tail and
/// another before its head; LL lines carry their flags (2-process all-to-alls
/// of 64 B-32 KB took 8.0-8.9 µs under CUDA graphs on Simple, NCCL 6.1-7.5).
/// Why 512 KiB: with LL spread over a channel per 16 KiB
/// ([`p2p_ll_channels`]), 2-process sends under CUDA graphs took 6.0 / 6.9 /
/// 9.0 / 11.1 / 15.2 µs at 32 K / 128 K / 256 K / 512 K / 1 M against Simple's
/// 9.1 / 10.1 / 11.1 / 12.8 / 15.0 (NCCL 7.6 / 7.9 / 9.3 / 12.1 / 14.6;
/// 2xH200, 2026-11-30, one job): LL wins to 512 KiB, even at 1 MiB.
pub const DEFAULT_P2P_LL_MAX: u64 = 512 << 10;

/// [`DEFAULT_P2P_LL_MAX`] for 2 ranks; with more, 512 KiB / (n - 1) (at
/// least NCCL's 16 KiB), so a rank whose group sends to every peer (an
/// all-to-all) keeps its LL egress near what was measured with one peer.
/// Not measured past 2 ranks (no 4- or 8-GPU machine yet).
pub fn default_p2p_ll_max(nranks: usize) -> u64 {
    (DEFAULT_P2P_LL_MAX / nranks.saturating_sub(1).max(1) as u64).max(16 << 10)
}

/// The most one channel of a send or receive may take LL for: what one
/// connection's LL slots hold ([`LL_NSLOTS`] x half of [`LL_SLOT_BYTES`],
/// 64 KiB), so a send never waits inside the launch for its receiver to
/// free a slot. A whole op: this x [`p2p_max_channels`].
pub const P2P_LL_CAP: u64 = LL_NSLOTS as u64 * LL_SLOT_BYTES / 2;

/// The all-reduce size up to which the one-shot LL kernel is taken by
/// default: each rank sends (n - 1) x the message, so the bound shrinks with
/// the rank count (256 KiB for 2 ranks, 128 KiB / (n - 1) beyond: ~43 KiB
/// for 4, ~18 KiB for 8; none past 8 ranks). Measured on 2xH200, 2
/// processes, CUDA graphs (2026-11-30, `oxccl perf --ranks 2 -G 10`):
/// one-shot / ring LL 4.8 / 7.3 us at 8 B, 5.8 / 7.6 at 32 KiB, 6.1 / 7.8 at
/// 128 KiB, 10.2 / 9.5 at 512 KiB. Then (same machine, 2026-12-01, two rounds):
/// 256 KiB 5.50 / 6.85 under graphs, 6.1 / 7.4 eager (NCCL 8.0 / 8.7-11.5);
/// 512 KiB 8.95 / 8.27 and 1 MiB 15.9 / 13.8 under graphs (one slot of LL
/// lines per block up to 256 KiB; beyond, a block waits for its peer to free
/// slots). More ranks: not measured (no 4- or 8-GPU machine yet), the old bound.
pub fn default_oneshot_max(nranks: usize) -> u64 {
    if nranks == 2 {
        256 << 10
    } else if (3..=LL1_MAX_RANKS).contains(&nranks) {
        (128 << 10) / (nranks as u64 - 1)
    } else {
        0
    }
}

/// The all-reduce size up to which the two-shot LL kernel replaces the LL
/// ring by default: LL's own bound ([`DEFAULT_LL_MAX`]) for 3 to
/// [`LL1_MAX_RANKS`] ranks, none for 2 (there the one-shot sends what the
/// two-shot would, in one crossing) or more than 8. Why: the two-shot moves
/// the ring's bytes (2 (n - 1) / n of the message out of each rank) in two
/// crossings where the LL ring makes 2 (n - 1) dependent steps, each a
/// wait on the previous rank's lines; on NVSwitch machines (every
/// pair one NVLink hop) the n - 1 peers are reached at once. Measured with
/// the ranks sharing one H200, under CUDA graphs, three rounds alternated
/// (2026-12-01, `scripts/perf-gpu.sh twoshot`, the two-shot then in
/// the ring kernel): 4 ranks 64-256 KiB 8.5-8.9 us against the LL ring's
/// 13.7-16.0, 512 KiB 12.1-12.8 against 16.4-16.9; 8 ranks 32-256 KiB
/// 15.1-16.5 against 28.2-31.2, 512 KiB 21.0-23.3 against 32.2-32.9. In
/// the small kernel ([`ll2_fast`], same method): 4 ranks 64-256 KiB 6.0-6.8, 8
/// ranks 32-128 KiB 10.7-11.4. Not yet measured on 4 or 8 GPUs.
pub fn default_twoshot_max(nranks: usize) -> u64 {
    if (3..=LL1_MAX_RANKS).contains(&nranks) {
        DEFAULT_LL_MAX
    } else {
        0
    }
}

/// The per-rank block up to which all-gathers, reduce-scatters and
/// all-reduces (a rank's n-th of the message) take the direct kernels over
/// Simple slots by default, for 3 to [`LL1_MAX_RANKS`] ranks of one host
/// ([`RingConfig::direct_max`]). Why: the Simple ring makes n - 1 (2 (n - 1)
/// for an all-reduce) dependent steps where these make one (two) crossings
/// of the same bytes. Measured with the ranks sharing one H200, under CUDA
/// graphs, two rounds against the Simple ring (2026-12-01, µs per
/// call): 4 ranks' all-reduces of 1 / 2 / 4 / 8 / 16 MiB 20.6 / 23.9 / 34.6 /
/// 57.3 / 104 against 33.1 / 36.9 / 44.1 / 58.4 / 98; 8 ranks' 33.7 / 40.7 /
/// 65 / 114 / 215 against 69 / 75 / 87.6 / 112.5 / 196; all-gathers and
/// reduce-scatters of 4 ranks 13-23 against 19-27 to 4 MiB, of 8 ranks
/// 19-37 against 38-51; about even with the ring at 8 MiB (blocks of 2 MiB
/// for 4 ranks, 1 MiB for 8) and 6-12% behind at 16 MiB (5 ranks won to 32
/// MiB). So the bound is 1 MiB per block. On one GPU the ranks share its
/// memory; on NVSwitch (not yet measured) the links decide, and
/// `scripts/perf-gpu.sh direct` runs both beside NCCL to move it.
pub fn default_direct_max(nranks: usize) -> u64 {
    if (3..=LL1_MAX_RANKS).contains(&nranks) {
        DEFAULT_DIRECT_MAX
    } else {
        0
    }
}

/// [`default_direct_max`]'s bound: 1 MiB per rank block.
pub const DEFAULT_DIRECT_MAX: u64 = 1 << 20;

/// The all-reduce size up to which the one-shot Simple kernel is taken
/// across hosts by default. With 2 ranks the one-shot sends what the ring
/// sends (S each way) in one crossing instead of three dependent ones, so
/// every size; with n > 2 it sends (n - 1) S against the ring's 2 (n - 1) S / n,
/// so only small messages (256 KiB / (n - 1)).
pub fn default_oneshot_net_max(nranks: usize) -> u64 {
    match nranks {
        2 => u64::MAX,
        3..=LL1_MAX_RANKS => (256 << 10) / (nranks as u64 - 1),
        _ => 0,
    }
}

/// What the kernel choice of a ring communicator depends on (from its
/// configuration and where its ranks are; see [`plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Channels of the window (most blocks a collective launches).
    pub channels: u32,
    /// All-reduces up to this many bytes take LL (0 across hosts).
    pub ll_max: u64,
    /// ... and the one-shot LL kernel up to this many (0 across hosts).
    pub oneshot_max: u64,
    /// ... and above that, the two-shot LL kernel up to this many, which
    /// may pass `ll_max` (0 across hosts, without LL, and for 2 or more
    /// than [`LL1_MAX_RANKS`] ranks).
    pub twoshot_max: u64,
    /// Ranks of the communicator (the two-shot's blocks are 1/n of it).
    pub nranks: u32,
    /// All-gathers and reduce-scatters with blocks, and all-reduces past
    /// LL with n-th parts, of at most this many bytes take the direct
    /// Simple kernels (0 across hosts and for 2 or more than
    /// [`LL1_MAX_RANKS`] ranks).
    pub direct_max: u64,
    /// All-reduces up to this many bytes take the one-shot Simple kernel
    /// (0 unless a peer is on another host).
    pub oneshot_net_max: u64,
    /// All-gathers and reduce-scatters whose per-rank block is at most this
    /// take the one-shot LL kernel: while a rank's egress, (n - 1) x the
    /// block, stays within `ll_max` (one-shot and ring move the same bytes
    /// for these; LL wins while it is small). 0: never.
    pub oneshot_block_max: u64,
    /// Sends and receives up to this many bytes take LL (0 across hosts).
    pub p2p_ll_max: u64,
    /// Sends and receives from this many bytes may spread over 32 channels
    /// ([`P2P_WIDE_MIN`] within a host, `u64::MAX` across hosts).
    pub p2p_wide_min: u64,
    /// Bytes per channel of a Simple collective ([`coll_channels`]):
    /// [`COLL_CHUNK`] within a host, [`COLL_CHUNK_NET`] across hosts.
    pub coll_chunk: u64,
    /// Most blocks of a send/receive launch ([`p2p_resident_blocks`]; set
    /// by [`Ring::setup`], [`P2P_MAX_BLOCKS`] in [`Thresholds::of`]).
    pub p2p_blocks_max: u32,
}

impl Thresholds {
    /// A communicator of `nranks` ranks with `cfg`, on one host or not:
    /// what [`Ring::setup`] keeps (LL cannot cross the network proxies; the
    /// one-shot kernels serve at most [`LL1_MAX_RANKS`]).
    pub fn of(cfg: &RingConfig, nranks: usize, cross: bool) -> Thresholds {
        let small = nranks <= LL1_MAX_RANKS;
        Thresholds {
            channels: cfg.channels,
            ll_max: if cross { 0 } else { cfg.ll_max },
            oneshot_max: if cross || !small { 0 } else { cfg.oneshot_max },
            // An LL kernel: none where LL is not allowed (NCCL_PROTO).
            twoshot_max: if cross || !small || nranks < 3 || cfg.ll_max == 0 {
                0
            } else {
                cfg.twoshot_max
            },
            nranks: nranks as u32,
            direct_max: if cross || !small || nranks < 3 {
                0
            } else {
                cfg.direct_max
            },
            oneshot_net_max: if cross && small {
                cfg.oneshot_net_max
            } else {
                0
            },
            oneshot_block_max: if cross || !small || cfg.oneshot_max == 0 || nranks < 2 {
                0
            } else if cfg.ll_max == u64::MAX {
                u64::MAX
            } else {
                cfg.ll_max.min(ONESHOT_LL_MAX) / (nranks as u64 - 1)
            },
            p2p_ll_max: if cross || cfg.ll_max == 0 {
                0
            } else {
                cfg.p2p_ll_max
                    .min(P2P_LL_CAP * p2p_max_channels(cfg.channels) as u64)
            },
            p2p_wide_min: if cross { u64::MAX } else { P2P_WIDE_MIN },
            coll_chunk: if cross { COLL_CHUNK_NET } else { COLL_CHUNK },
            p2p_blocks_max: P2P_MAX_BLOCKS,
        }
    }
}

/// The kernel mode and blocks of a ring-path collective of `mode` moving
/// `bytes` through each link: all-reduces take the one-shot Simple kernel
/// across hosts, else LL when small (the one-shot LL kernel when smaller,
/// the two-shot LL kernel in between for 3-8 ranks), else the ring; the
/// other collectives keep their mode.
pub fn plan(mode: u32, bytes: u64, t: &Thresholds) -> (u32, u32) {
    let simple = coll_channels(bytes, t.channels, t.coll_chunk);
    // Small all-gathers and reduce-scatters (`bytes`: one rank's block,
    // which each rank sends to every other) take the one-shot LL kernel
    // ([`Thresholds::oneshot_block_max`]), a block per 4 KiB of the rank's
    // block: against a block per 8 KiB, 16-256 KB all-gathers under CUDA
    // graphs took 5.36-6.00 us instead of 6.11-6.33, reduce-scatters
    // 5.43-6.11 instead of 6.50-6.74 (2 processes, 2xH200, two rounds each,
    // 2026-11-30).
    let one_shot = |m: u32| -> Option<(u32, u32)> {
        (bytes <= t.oneshot_block_max)
            .then(|| (m, ll_channels(bytes.saturating_mul(2), t.channels)))
    };
    // Past that, blocks within the direct bound take the direct Simple
    // kernels, a channel per 32 KiB of the block as the ring's.
    let direct = |m: u32| (bytes <= t.direct_max).then_some((m, simple));
    match mode {
        RM_ALLGATHER => {
            return one_shot(RM_ALLGATHER_LL1)
                .or_else(|| direct(RM_ALLGATHER_1S))
                .unwrap_or((mode, simple))
        }
        RM_REDUCE_SCATTER => {
            return one_shot(RM_REDUCE_SCATTER_LL1)
                .or_else(|| direct(RM_REDUCE_SCATTER_1S))
                .unwrap_or((mode, simple));
        }
        // A small broadcast's root (a reduce's root) moves (n - 1) x `bytes`
        // as an all-gather's rank does its block: the same bound. The ring
        // took 7.4-10.5 us for 32 B-512 KB broadcasts against NCCL's
        // 6.2-8.2, reduces 7.1-9.0 against 5.9-7.9 (2 processes, 2xH200,
        // eager, 2026-11-30), where one-shot all-gathers took 5.0-6.5.
        RM_BROADCAST => return one_shot(RM_BROADCAST_LL1).unwrap_or((mode, simple)),
        RM_REDUCE => return one_shot(RM_REDUCE_LL1).unwrap_or((mode, simple)),
        RM_ALLREDUCE => {}
        _ => return (mode, simple),
    }
    // One rank's block of the message (the two-shots' unit).
    let block = bytes.div_ceil(t.nranks.max(1) as u64);
    if bytes <= t.oneshot_net_max {
        (RM_ALLREDUCE_1S, simple)
    } else if bytes <= t.ll_max && bytes <= t.oneshot_max {
        // A block per 4 KiB: 512 LL lines, one per thread. With a block
        // per 8 KiB (two lines per thread) 8-64 KB all-reduces took
        // 4.9-5.0 us under CUDA graphs against 4.1-4.3 (2 processes,
        // 2xH200, 2026-11-30; 128 KB 5.09 against 4.60; a block per
        // 2 KiB was no better: 3.97-4.65).
        (
            RM_ALLREDUCE_LL1,
            ll_channels(bytes.saturating_mul(2), t.channels),
        )
    } else if bytes <= t.twoshot_max {
        // A block per 4 KiB of a rank's block (1/n of the message), as
        // the one-shot reduce-scatter's: each block then sends and
        // receives one slot's lines per peer and step up to LL's bound.
        // Its own bound may pass LL's (set above 512 KiB it replaces the
        // Simple ring there, as published two-shot kernels do to ~4 MB on
        // 8 GPUs; not measured on such a machine yet).
        (
            RM_ALLREDUCE_LL2,
            ll_channels(block.saturating_mul(2), t.channels),
        )
    } else if bytes <= t.ll_max {
        (RM_ALLREDUCE_LL, ll_channels(bytes, t.channels))
    } else if block <= t.direct_max {
        // A channel per 32 KiB of a rank's block (the kernel splits the
        // block's range among them).
        (
            RM_ALLREDUCE_2S,
            coll_channels(block, t.channels, t.coll_chunk),
        )
    } else {
        (RM_ALLREDUCE, simple)
    }
}

/// Where this rank's own regions for each rank are (the second half of the
/// kernels' window table, `region_of` in ring.cu): its window `own` for
/// ranks of its host, the proxies' host window `net` (device address) for
/// ranks on other hosts; with no separate host window (`net` 0: the window
/// is host memory already, or no rank is elsewhere) `own` for every rank.
pub fn own_regions(same_host: &[bool], own: u64, net: u64) -> Vec<u64> {
    same_host
        .iter()
        .map(|&here| if here || net == 0 { own } else { net })
        .collect()
}

/// Blocks of an LL all-reduce of `bytes`: one per 8 KiB (an LL slot's data),
/// so every channel's part fits one round of slots.
pub fn ll_channels(bytes: u64, channels: u32) -> u32 {
    bytes.div_ceil(8 << 10).clamp(1, channels.max(1) as u64) as u32
}

/// Blocks (channels) of a collective moving `bytes` through each link: one
/// per `chunk` ([`Thresholds::coll_chunk`]), so a small message keeps one
/// block (one chain of flag round trips) and 1 MiB already spreads over 32
/// within a host. Both ends compute it from the same count, type and
/// configuration.
pub fn coll_channels(bytes: u64, channels: u32, chunk: u64) -> u32 {
    bytes
        .div_ceil(chunk.max(1))
        .clamp(1, channels.max(1) as u64) as u32
}

/// [`coll_channels`]' bytes per channel within a host: 32 KiB. Against 64
/// KiB, under CUDA graphs, 2 processes, two rounds each (2xH200,
/// 2026-12-01, NCCL beside): reduce-scatters of 2 MB (1 MiB through each link) 13.4
/// µs against 14.2 (NCCL 13.8), all-gathers of 2 MB 13.7 against 14.6 (NCCL
/// 15.9), broadcasts of 1 MB 9.27 against 9.53, reduces of 1 MB 8.64
/// against 8.78; 512 KB - 4 MB otherwise even (the two chunks give the same
/// channels from 2 MiB through a link).
pub const COLL_CHUNK: u64 = 32 << 10;

/// [`coll_channels`]' bytes per channel across hosts: 64 KiB (the old
/// rule; not measured through the network proxies with 32 KiB).
pub const COLL_CHUNK_NET: u64 = 64 << 10;

/// Channels of one send or receive of `bytes`: one per 32 KiB, at most 16,
/// and at most 32 from `wide_min` ([`Thresholds::p2p_wide_min`]: within a
/// host [`P2P_WIDE_MIN`], else never; the two ends compute the same from
/// the same byte count). One per 128 KiB left a 128 KiB transfer to one
/// block: 2-process all-to-alls of 256 KB (128 KiB per peer) took 15.7 µs
/// against NCCL's 10.6.
pub fn p2p_channels(bytes: u64, channels: u32, wide_min: u64) -> u32 {
    let max = if bytes >= wide_min {
        channels.clamp(1, 32)
    } else {
        p2p_max_channels(channels)
    };
    bytes.div_ceil(32 << 10).clamp(1, max as u64) as u32
}

/// Sends and receives of at least this many bytes may spread over 32
/// channels: 2-process sends of 4 / 8 MB took 28.3 / 43.3 µs on 32 against
/// 29.8-30.0 / 47.7-47.8 on 16, all-to-alls of 8 MB (4 MB per peer) 29.8
/// against 30.9-31.2; 2 MB sends lost on 32 (21.1 against 20.9; eager,
/// 2xH200, 2026-11-30). Within a host only: not measured
/// through the network proxies. With [`P2P_MAX_OPS`] ops of 32 channels,
/// [`P2P_MAX_BLOCKS`] blocks hold at most 16 items each, the kernel's
/// `RING_P2P_MAX_ITEMS`.
pub const P2P_WIDE_MIN: u64 = 4 << 20;

/// Most channels of one send or receive below [`P2P_WIDE_MIN`], and of any
/// LL one: 16. With 32 (and LL to 2 MiB), 2 MB sends lost 12% and 1 MB
/// all-to-alls 16%; Simple 2 MB sends 1% (2 processes, 2xH200, 2026-11-30).
pub fn p2p_max_channels(channels: u32) -> u32 {
    channels.clamp(1, 16)
}

/// Channels of one LL send or receive of `bytes`: one per 16 KiB (at least
/// enough that no channel carries more than its slots hold, [`P2P_LL_CAP`]),
/// at most [`p2p_max_channels`]. One channel (one block) per LL op left a
/// 64 KiB send at 11.96 µs against 8.28 for 32 KiB; a channel per 8, 16
/// or 32 KiB timed alike (2xH200, 2026-11-30, 2 processes, eager, noisy).
pub fn p2p_ll_channels(bytes: u64, channels: u32) -> u32 {
    let max = p2p_max_channels(channels) as u64;
    let by_size = bytes.div_ceil(16 << 10).clamp(1, max);
    by_size.max(bytes.div_ceil(P2P_LL_CAP)).min(max) as u32
}

/// The blocks of a point-to-point launch of `items` (op, channel) items:
/// a block per item, at most `resident` ([`p2p_resident_blocks`]) unless
/// the items need more ([`P2P_MAX_ITEMS`] a block), at most
/// [`P2P_MAX_BLOCKS`].
pub fn p2p_blocks(items: u32, resident: u32) -> u32 {
    let most = resident
        .max(items.div_ceil(P2P_MAX_ITEMS))
        .min(P2P_MAX_BLOCKS);
    items.clamp(1, most.max(1))
}

/// Most blocks of a send/receive launch that `sharing` ranks on a GPU of
/// `sms` SMs can all hold at once (a block whose partner block never
/// starts waits for it): SMs x [`P2P_BLOCKS_PER_SM`] over the ranks;
/// [`P2P_MAX_BLOCKS`] for a GPU of its own or an unknown SM count.
pub fn p2p_resident_blocks(sharing: u32, sms: u32) -> u32 {
    if sharing <= 1 || sms == 0 {
        P2P_MAX_BLOCKS
    } else {
        (sms * P2P_BLOCKS_PER_SM / sharing).clamp(1, P2P_MAX_BLOCKS)
    }
}

/// Blocks a point-to-point launch adds for a copy of `bytes` to itself: one
/// per 32 KiB (a block copies ~30 GB/s from local memory, so ~1 µs each),
/// at most [`P2P_MAX_BLOCKS`] with the items'. They copy beside the
/// transfers: done by the items' blocks after their transfers, the copy
/// cost 2-process all-to-alls of 2 MB (1 MiB to itself) ~2 µs, 17.3 µs
/// against NCCL's 15.4, and scatters of 32 MB (16 MiB) 6.5 µs, 62.0 out of
/// place against 55.5 in place (2xH200, 2026-11-30, eager).
pub fn self_copy_blocks(bytes: u64) -> u32 {
    bytes.div_ceil(32 << 10).clamp(1, P2P_MAX_BLOCKS as u64) as u32
}

/// The algorithm and protocol of a ring launch's mode, as the TUNING log
/// line names them ([`oxccl_core::logfmt::tuning_line`]): the ring over
/// Simple slots or LL lines, or a one-shot kernel (every rank writes to
/// every rank in one crossing).
pub fn mode_algo(mode: u32) -> (&'static str, &'static str) {
    match mode {
        RM_ALLREDUCE_LL => ("Ring", "LL"),
        RM_ALLREDUCE_LL1
        | RM_ALLGATHER_LL1
        | RM_REDUCE_SCATTER_LL1
        | RM_BROADCAST_LL1
        | RM_REDUCE_LL1 => ("OneShot", "LL"),
        RM_ALLREDUCE_1S | RM_ALLGATHER_1S | RM_REDUCE_SCATTER_1S => ("OneShot", "Simple"),
        RM_ALLREDUCE_LL2 => ("TwoShot", "LL"),
        RM_ALLREDUCE_2S => ("TwoShot", "Simple"),
        _ => ("Ring", "Simple"),
    }
}

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
        mode: RM_ALLREDUCE,
        root: 0,
    }
}

/// Blocks of `oxccl_scale_*` for `count` elements: a thread per 8, at most
/// 1,024 blocks of [`THREADS`] (a grid-stride loop takes the rest).
pub fn scale_blocks(count: u64) -> u32 {
    count.div_ceil(8 * THREADS as u64).clamp(1, 1024) as u32
}

/// The small one-shot all-reduce kernel of (`t`, `op`), `oxccl_ll1_*`, in
/// the same program as [`kernel_name`]'s (ring.cu, `ll1_fast_run`).
pub fn ll1_kernel_name(t: DataType, op: RedOp) -> String {
    kernel_name(t, op).replacen("oxccl_ring_", "oxccl_ll1_", 1)
}

/// Whether `mode` is one of the one-shot LL modes that the small kernel
/// (`oxccl_ll1_*`, ring.cu `ll1_fast_run`) runs when [`ll1_fast`] holds:
/// all-reduce, all-gather, reduce-scatter, broadcast, reduce.
pub fn is_one_shot_ll(mode: u32) -> bool {
    matches!(
        mode,
        RM_ALLREDUCE_LL1
            | RM_ALLGATHER_LL1
            | RM_REDUCE_SCATTER_LL1
            | RM_BROADCAST_LL1
            | RM_REDUCE_LL1
    )
}

/// Whether a one-shot LL collective ([`is_one_shot_ll`]) of `count`
/// elements of `elem` bytes (an all-gather's or reduce-scatter's: one
/// rank's block) over `blocks` blocks fits the small kernel:
/// every block's part, in whole 8-byte lines as ring.cu cuts it, within
/// one LL slot of `ll_bytes` (half of it data) and 2 lines per thread of
/// [`THREADS`]. With the default 32 channels that is every one-shot
/// all-reduce size (2 ranks: to 256 KiB, 32 blocks of 8 KiB) and every
/// one-shot copy, reduce-scatter and reduce to 256 KiB per rank (2 ranks
/// take the one-shot LL kernel to 512 KiB: the ring kernel's loop has
/// those); fewer channels (NCCL_MAX_NCHANNELS) leave more to the loop.
pub fn ll1_fast(count: u64, elem: u64, blocks: u32, ll_bytes: u64) -> bool {
    if elem == 0 || elem > 8 || blocks == 0 {
        return false;
    }
    let pack = 8 / elem;
    let per = count.div_ceil(blocks as u64).div_ceil(pack) * pack;
    let slot = (ll_bytes / 2 / elem) / pack * pack;
    per <= slot && per / pack <= 2 * THREADS as u64
}

/// Whether a two-shot LL all-reduce ([`RM_ALLREDUCE_LL2`]) of `count`
/// elements of `elem` bytes among `nranks` ranks over `blocks` blocks fits
/// the small kernel (ring.cu `ll2_fast_run`): as [`ll1_fast`] for one
/// rank's block, `count / nranks` rounded up to whole 8-byte lines as the
/// kernel cuts it. With the default channels that is every two-shot size
/// (512 KiB for 4 ranks: 32 blocks of 4 KiB of each rank block).
pub fn ll2_fast(count: u64, elem: u64, nranks: u32, blocks: u32, ll_bytes: u64) -> bool {
    if elem == 0 || elem > 8 || nranks == 0 {
        return false;
    }
    let pack = 8 / elem;
    let block = count.div_ceil(nranks as u64).div_ceil(pack) * pack;
    ll1_fast(block, elem, blocks, ll_bytes)
}

/// Whether a launch of `mode` (as [`plan`] chose it) runs in the small
/// kernel (`oxccl_ll1_*`): a one-shot LL mode that fits [`ll1_fast`], or a
/// two-shot that fits [`ll2_fast`].
pub fn small_kernel_fits(mode: u32, count: u64, elem: u64, nranks: u32, blocks: u32) -> bool {
    if is_one_shot_ll(mode) {
        ll1_fast(count, elem, blocks, LL_SLOT_BYTES)
    } else if mode == RM_ALLREDUCE_LL2 {
        ll2_fast(count, elem, nranks, blocks, LL_SLOT_BYTES)
    } else {
        false
    }
}

// ring.cu's ll1_fast_run takes a step's slot with a mask.
const _: () = assert!(LL_NSLOTS.is_power_of_two());

/// Every rank of a group of one process in one launch, `oxccl_joint_*`
/// (ring.cu, `joint_run`; [`crate::joint`]), in the same program as
/// [`kernel_name`]'s.
pub fn joint_kernel_name(t: DataType, op: RedOp) -> String {
    kernel_name(t, op).replacen("oxccl_ring_", "oxccl_joint_", 1)
}

/// `oxccl_ring_<type>_<op>`.
pub fn kernel_name(t: DataType, op: RedOp) -> String {
    format!(
        "oxccl_ring_{}_{}",
        crate::allreduce::type_tag(t),
        crate::allreduce::op_tag(op).unwrap_or("sum")
    )
}

/// `struct RingCommon` of `ring.cu`, field for field (64 bytes).
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
}

/// `struct RingArgs` of `ring.cu` (144 bytes).
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
    /// `RM_*`.
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

/// Where the windows live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// Device memory, mapped by peers through CUDA IPC or peer access.
    Device,
    /// Pinned host memory in /dev/shm (no peer-to-peer, or NCCL_P2P_DISABLE=1).
    Host,
}

impl WindowKind {
    /// How NCCL's INFO lines name the transport.
    pub fn transport(self, same_process: bool) -> &'static str {
        match (self, same_process) {
            (WindowKind::Device, true) => "P2P/direct pointer",
            (WindowKind::Device, false) => "P2P/IPC",
            (WindowKind::Host, _) => "SHM/host memory",
        }
    }
}

#[derive(Debug)]
enum Mapping {
    /// cuIpcOpenMemHandle's pointer.
    Ipc(u64),
    /// A peer's /dev/shm window mapped and registered here.
    Shm { addr: usize, len: usize },
    /// A peer context retained for peer access (released at drop).
    Ctx(sys::CUdevice),
}

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
    kind: WindowKind,
    ctx: sys::CUcontext,
    common: RingCommon,
    local: Local,
    peers_buf: u64,
    state: u64,
    ctrl_host: *mut u32,
    mappings: Vec<Mapping>,
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
    /// The network path's proxies (peers on other hosts).
    proxies: Vec<crate::netproxy::Proxy>,
    /// (peer, host address of its shadow window).
    shadows: Vec<(usize, usize)>,
    /// Connections per peer of another host (agreed by every rank).
    net_streams: u32,
    /// The network path's proxies over a plugin (instead of `proxies`).
    plugin_proxies: Vec<crate::netplugin::PluginProxy>,
    /// Host and device addresses of the window the network proxies fill
    /// (this rank's regions for peers on other hosts): the window itself
    /// when it is host memory, else a second, host-memory window beside the
    /// device one (ranks of this host then stay peer-to-peer). (0, 0): none.
    net_window: (usize, u64),
    /// The ranks in ring order (`order[common.pos] == rank`).
    order: Vec<usize>,
    /// The kernels' window table as uploaded ([`region_at`]).
    table: Vec<u64>,
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
struct Who {
    ok: bool,
    nonce: u64,
    ordinal: i32,
    bus: [u8; 16],
    p2p_disable: bool,
    /// SMs of the rank's GPU (0: unknown).
    sms: u32,
}

impl Who {
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
    fn decode(b: &[u8], rank: usize) -> Result<Who> {
        if b.len() != Self::LEN {
            return Err(Error::internal(format!(
                "GPU ring setup: rank {rank} sent a {}-byte record (expected {})",
                b.len(),
                Self::LEN
            )));
        }
        let mut bus = [0u8; 16];
        bus.copy_from_slice(&b[13..29]);
        Ok(Who {
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

fn bus_id(dev: sys::CUdevice) -> Result<[u8; 16]> {
    let mut b = [0 as std::ffi::c_char; 16];
    guarded("cuDeviceGetPCIBusId", || {
        // SAFETY: writes at most 16 bytes, NUL-terminated.
        unsafe {
            check(
                sys::cuDeviceGetPCIBusId(b.as_mut_ptr(), 16, dev),
                "cuDeviceGetPCIBusId",
            )
        }
    })?;
    Ok(b.map(|c| c as u8))
}

/// The bus id `cuDeviceGetPCIBusId` wrote, as text.
fn bus_text(bus: &[u8; 16]) -> String {
    let end = bus.iter().position(|&c| c == 0).unwrap_or(16);
    String::from_utf8_lossy(&bus[..end]).into_owned()
}

fn device_by_bus(bus: &[u8; 16]) -> Option<sys::CUdevice> {
    let end = bus.iter().position(|&c| c == 0).unwrap_or(16);
    let s = CString::new(&bus[..end]).ok()?;
    let mut d: sys::CUdevice = 0;
    guarded("cuDeviceGetByPCIBusId", || {
        // SAFETY: `s` is NUL-terminated; writes one int.
        unsafe {
            check(
                sys::cuDeviceGetByPCIBusId(&mut d, s.as_ptr()),
                "cuDeviceGetByPCIBusId",
            )
        }
    })
    .ok()?;
    Some(d)
}

fn can_access(a: sys::CUdevice, b: sys::CUdevice) -> bool {
    if a == b {
        return true;
    }
    let mut can = 0;
    guarded("cuDeviceCanAccessPeer", || {
        // SAFETY: writes one int; both are valid devices.
        unsafe {
            check(
                sys::cuDeviceCanAccessPeer(&mut can, a, b),
                "cuDeviceCanAccessPeer",
            )
        }
    })
    .is_ok()
        && can == 1
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

/// Maps `len` bytes of the shm file `name` (created when `create`) read-write.
fn shm_map(name: &CString, len: usize, create: bool) -> Result<usize> {
    let flags = if create {
        libc::O_RDWR | libc::O_CREAT | libc::O_EXCL
    } else {
        libc::O_RDWR
    };
    let show = name.to_string_lossy();
    // SAFETY: NUL-terminated name; plain flags.
    let fd = unsafe { libc::shm_open(name.as_ptr(), flags, 0o600) };
    if fd < 0 {
        return Err(Error::system(format!(
            "shm_open(/dev/shm{show}): {}",
            std::io::Error::last_os_error()
        )));
    }
    let r = (|| {
        if create {
            // SAFETY: fd is ours; reserves the blocks so a full /dev/shm fails
            // here, not with SIGBUS on first touch.
            let e = unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) };
            if e != 0 {
                return Err(Error::system(format!(
                    "cannot reserve {len} bytes in /dev/shm for the GPU ring's host window ({}): \
                     /dev/shm is too small (containers: --shm-size or --ipc=host)",
                    std::io::Error::from_raw_os_error(e)
                )));
            }
        }
        // SAFETY: maps a file we hold open; len is its size.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::system(format!(
                "mmap of /dev/shm{show} ({len} bytes): {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(p as usize)
    })();
    // SAFETY: fd is ours; the mapping (if any) stays valid after close.
    unsafe { libc::close(fd) };
    if r.is_err() && create {
        // SAFETY: NUL-terminated name of the file we created.
        unsafe { libc::shm_unlink(name.as_ptr()) };
    }
    r
}

/// `len` bytes of zeroed anonymous memory (a shadow window).
fn anon_map(len: usize) -> Result<usize> {
    // SAFETY: a fresh private anonymous mapping; no file, no fixed address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::system(format!(
            "mmap of {len} bytes for the GPU network path's shadow window: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(p as usize)
}

/// Registers host memory with CUDA (portable, device-mapped); its device address.
fn host_register(addr: usize, len: usize) -> Result<u64> {
    guarded("cuMemHostRegister", || {
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: [addr, addr+len) is a live mapping we own; registered once
        // in this process (peers in this process use the owner's address).
        unsafe {
            check(
                sys::cuMemHostRegister_v2(
                    addr as *mut c_void,
                    len,
                    sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP,
                ),
                "cuMemHostRegister",
            )?;
            if let Err(e) = check(
                sys::cuMemHostGetDevicePointer_v2(&mut d, addr as *mut c_void, 0),
                "cuMemHostGetDevicePointer",
            ) {
                sys::cuMemHostUnregister(addr as *mut c_void);
                return Err(e);
            }
        }
        Ok(d)
    })
}

fn dev_alloc_zeroed(bytes: usize) -> Result<u64> {
    guarded("cuMemAlloc", || {
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: a context is current (the caller's scope); the memset covers
        // the allocation and the synchronize completes it.
        unsafe {
            check(sys::cuMemAlloc_v2(&mut p, bytes.max(16)), "cuMemAlloc")?;
            let r = check(sys::cuMemsetD8_v2(p, 0, bytes.max(16)), "cuMemsetD8")
                .and_then(|_| check(sys::cuCtxSynchronize(), "cuCtxSynchronize"));
            if let Err(e) = r {
                sys::cuMemFree_v2(p);
                return Err(e);
            }
        }
        Ok(p)
    })
}

impl Ring {
    /// Sets up this rank's ring (collective: see the module doc). `ctx` is
    /// this rank's (retained) context on device `dev`.
    pub fn setup(
        dev: sys::CUdevice,
        ctx: sys::CUcontext,
        rank: usize,
        nranks: usize,
        cfg: &RingConfig,
        boot: &RingBoot,
    ) -> Result<Ring> {
        let exchange = boot.exchange;
        let _scope = crate::capi::CtxScope::enter(ctx)?;
        // This GPU's SMs (0: unknown): in the rank records (the channel
        // bound where ranks share a GPU) and this rank's launch bounds.
        let sms = crate::device::sm_count(dev).unwrap_or(0);
        // Round 1: who.
        let who = {
            let r = bus_id(dev).map(|bus| Who {
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
                    let mut v = vec![0u8; Who::LEN];
                    v[0] = 0;
                    v
                }
            };
            let all = exchange(&mine)?;
            r?;
            let mut v = Vec::with_capacity(nranks);
            for (i, b) in all.iter().enumerate() {
                let w = Who::decode(b, i)?;
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
        };
        let bytes = cfg.window_bytes(nranks);
        let mut me = Ring {
            kind,
            ctx,
            common,
            local: Local::Device(0),
            peers_buf: 0,
            table: Vec::new(),
            state: 0,
            ctrl_host: std::ptr::null_mut(),
            mappings: Vec::new(),
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
            proxies: Vec::new(),
            shadows: Vec::new(),
            net_streams: 1,
            plugin_proxies: Vec::new(),
            net_window: (0, 0),
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
            me.net_streams = all
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
            me.start_plugin(net, *dev, exchange, cfg.timeout)?;
        }
        if let Local::Shm { name, unlinked, .. } = &mut me.local {
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
        let mut host: *mut c_void = std::ptr::null_mut();
        guarded("cuMemHostAlloc", || {
            // SAFETY: writes one pointer; 64 bytes of portable mapped pinned memory.
            unsafe {
                check(
                    sys::cuMemHostAlloc(
                        &mut host,
                        64,
                        sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
                    ),
                    "cuMemHostAlloc",
                )
            }
        })?;
        self.ctrl_host = host as *mut u32;
        self.stopper
            .ctrl
            .store(host as usize, std::sync::atomic::Ordering::Release);
        // SAFETY: 64 bytes just allocated.
        unsafe { std::ptr::write_bytes(host as *mut u8, 0, 64) };
        let mut dctrl: sys::CUdeviceptr = 0;
        guarded("cuMemHostGetDevicePointer", || {
            // SAFETY: `host` is mapped pinned memory.
            unsafe {
                check(
                    sys::cuMemHostGetDevicePointer_v2(&mut dctrl, host, 0),
                    "cuMemHostGetDevicePointer",
                )
            }
        })?;
        self.common.ctrl = dctrl;
        self.common.state = self.state;
        let len = self.bytes.max(16) as usize;
        // Descriptor: kind, address (for ranks of this process), IPC handle, shm name.
        let mut d = vec![0u8; 1 + 8 + 64 + 64];
        match self.kind {
            WindowKind::Device => {
                let p = dev_alloc_zeroed(len)?;
                self.local = Local::Device(p);
                let mut h = sys::CUipcMemHandle_st { reserved: [0; 64] };
                guarded("cuIpcGetMemHandle", || {
                    // SAFETY: `p` is a cuMemAlloc allocation of this context.
                    unsafe { check(sys::cuIpcGetMemHandle(&mut h, p), "cuIpcGetMemHandle") }
                })?;
                d[0] = 1;
                d[1..9].copy_from_slice(&p.to_le_bytes());
                for (o, c) in d[9..73].iter_mut().zip(h.reserved.iter()) {
                    *o = *c as u8;
                }
            }
            WindowKind::Host => {
                let name = shm_name();
                let addr = shm_map(&name, len, true)?;
                self.local = Local::Shm {
                    addr,
                    len,
                    name: name.clone(),
                    unlinked: false,
                };
                let dp = host_register(addr, len)?;
                self.net_window = (addr, dp);
                d[0] = 2;
                d[1..9].copy_from_slice(&dp.to_le_bytes());
                let nb = name.as_bytes();
                d[73..73 + nb.len().min(63)].copy_from_slice(&nb[..nb.len().min(63)]);
            }
        }
        Ok(d)
    }

    /// Maps every peer's window and writes the device table of window
    /// addresses (`region_of` in ring.cu: each rank's window as reached from
    /// here, then where this rank's regions for each rank are).
    fn map_peers(&mut self, who: &[Who], all: &[Vec<u8>], same_host: &[bool]) -> Result<()> {
        let n = who.len();
        let rank = self.common.rank as usize;
        let mut table = vec![0u64; 2 * n];
        let len = self.bytes.max(16) as usize;
        if self.kind == WindowKind::Device && same_host.iter().any(|x| !x) {
            // Device window and peers on other hosts: the proxies' regions
            // go in a host window of their own (only this process maps it).
            let a = anon_map(len)?;
            match host_register(a, len) {
                Ok(dp) => {
                    self.mappings.push(Mapping::Shm { addr: a, len });
                    self.net_window = (a, dp);
                }
                Err(e) => {
                    // SAFETY: our mapping of `len` bytes, unused.
                    unsafe { libc::munmap(a as *mut c_void, len) };
                    return Err(e);
                }
            }
        }
        let own = all
            .get(rank)
            .and_then(|d| d.get(1..9))
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
            .unwrap_or(0);
        if same_host.len() != n {
            return Err(Error::internal(
                "GPU ring setup: host table and records differ in length",
            ));
        }
        table[n..].copy_from_slice(&own_regions(same_host, own, self.net_window.1));
        for (i, d) in all.iter().enumerate() {
            if d.len() != 137 {
                return Err(Error::internal(format!(
                    "GPU ring setup: rank {i}'s window descriptor has {} bytes",
                    d.len()
                )));
            }
            let addr = u64::from_le_bytes(d[1..9].try_into().unwrap_or_default());
            if i == rank {
                table[i] = addr;
                continue;
            }
            if !same_host[i] {
                // Another host: a local shadow of its window (netproxy.rs).
                let a = anon_map(len)?;
                match host_register(a, len) {
                    Ok(dp) => {
                        self.mappings.push(Mapping::Shm { addr: a, len });
                        self.shadows.push((i, a));
                        table[i] = dp;
                        continue;
                    }
                    Err(e) => {
                        // SAFETY: our mapping of `len` bytes, unused.
                        unsafe { libc::munmap(a as *mut c_void, len) };
                        return Err(e);
                    }
                }
            }
            table[i] = match (d[0], self.same_process[i]) {
                (1, true) => {
                    // Another rank of this process: its pointer, with peer access.
                    if who[i].ordinal != who[rank].ordinal {
                        self.enable_peer(who[i].ordinal)?;
                    }
                    addr
                }
                (1, false) => {
                    let mut h = sys::CUipcMemHandle_st { reserved: [0; 64] };
                    for (o, c) in h.reserved.iter_mut().zip(d[9..73].iter()) {
                        *o = *c as std::ffi::c_char;
                    }
                    let mut p: sys::CUdeviceptr = 0;
                    guarded("cuIpcOpenMemHandle", || {
                        // SAFETY: a handle from cuIpcGetMemHandle of another
                        // process on this host; writes one pointer.
                        unsafe {
                            check(
                                sys::cuIpcOpenMemHandle_v2(
                                    &mut p,
                                    h,
                                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                                ),
                                &format!("cuIpcOpenMemHandle (rank {i}'s window)"),
                            )
                        }
                    })?;
                    self.mappings.push(Mapping::Ipc(p));
                    p
                }
                (2, true) => addr,
                (2, false) => {
                    let end = d[73..].iter().position(|&c| c == 0).unwrap_or(64);
                    let name = CString::new(&d[73..73 + end])
                        .map_err(|_| Error::internal("shm name with NUL"))?;
                    let a = shm_map(&name, len, false)?;
                    match host_register(a, len) {
                        Ok(dp) => {
                            self.mappings.push(Mapping::Shm { addr: a, len });
                            dp
                        }
                        Err(e) => {
                            // SAFETY: our mapping of `len` bytes, unused.
                            unsafe { libc::munmap(a as *mut c_void, len) };
                            return Err(e);
                        }
                    }
                }
                (k, _) => {
                    return Err(Error::internal(format!(
                        "GPU ring setup: rank {i} sent window kind {k}"
                    )))
                }
            };
        }
        // One allocation: the 2n window addresses, then the ring order (n u32).
        let p = dev_alloc_zeroed(2 * n * 8 + n * 4)?;
        self.peers_buf = p;
        self.common.peers = p;
        self.common.order = p + 2 * n as u64 * 8;
        let mut bytes: Vec<u8> = table.iter().flat_map(|v| v.to_le_bytes()).collect();
        bytes.extend(self.order.iter().flat_map(|&r| (r as u32).to_le_bytes()));
        self.table = table;
        guarded("cuMemcpyHtoD", || {
            // SAFETY: `p` holds 2 * n * 8 + n * 4 bytes, `bytes` as many.
            // Synchronized: the DMA from pageable memory may land after the
            // copy returns, and the kernels run on the user's streams, which
            // may be non-blocking (capi's copy_to_device).
            unsafe {
                check(
                    sys::cuMemcpyHtoD_v2(p, bytes.as_ptr() as *const c_void, bytes.len()),
                    "cuMemcpyHtoD",
                )?;
                check(sys::cuCtxSynchronize(), "cuCtxSynchronize")
            }
        })
    }

    /// Opens the plugin's listens for every peer on another host, swaps the
    /// handles, connects every link and starts a proxy per peer.
    fn start_plugin(
        &mut self,
        net: &std::sync::Arc<dyn oxccl_net::Net>,
        dev: usize,
        exchange: Exchange,
        timeout: Duration,
    ) -> Result<()> {
        use crate::netplugin::{Listens, PeerPlan, PluginLink, PluginProxy};
        let window = self.net_window.0;
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
        let shadows = self.shadows.clone();
        let blob = agree("plugin listen", exchange, || {
            let mut blob = vec![0u8; n * nch * H];
            for &(peer, _) in &shadows {
                let (l, hs) = Listens::open(net.clone(), dev, nch as u32)?;
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
        let proxies = agree("plugin connect", exchange, || {
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
                });
            }
            // SAFETY: the window and the shadows stay mapped until Drop,
            // which stops every proxy (and so closes every link) first.
            let links =
                unsafe { PluginLink::connect_all(net, dev, layout, me, window, plans, deadline) }?;
            let mut ps = Vec::new();
            for link in links {
                let st = stopper.clone();
                ps.push(PluginProxy::start(
                    link,
                    std::sync::Arc::new(move |e: Error| st.fail(e)),
                )?);
            }
            Ok(ps)
        })?;
        self.plugin_proxies = proxies;
        Ok(())
    }

    /// Connects and starts a proxy for every peer on another host.
    fn start_proxies(&mut self, boot: &RingBoot) -> Result<()> {
        let window = self.net_window.0;
        if window == 0 {
            return if self.shadows.is_empty() {
                Ok(())
            } else {
                Err(Error::internal("GPU network path without a host window"))
            };
        }
        let layout = self.net_layout();
        let me = self.common.rank;
        let n = self.net_streams;
        for &(peer, shadow) in &self.shadows.clone() {
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
                self.proxies.push(p);
            }
        }
        Ok(())
    }

    fn enable_peer(&mut self, ordinal: i32) -> Result<()> {
        let mut pctx: sys::CUcontext = std::ptr::null_mut();
        guarded("cuDevicePrimaryCtxRetain", || {
            // SAFETY: writes one handle for a device of this process.
            unsafe {
                check(
                    sys::cuDevicePrimaryCtxRetain(&mut pctx, ordinal),
                    "cuDevicePrimaryCtxRetain",
                )
            }
        })?;
        self.mappings.push(Mapping::Ctx(ordinal));
        guarded("cuCtxEnablePeerAccess", || {
            // SAFETY: our context is current (setup's scope); pctx is retained.
            let r = unsafe { sys::cuCtxEnablePeerAccess(pctx, 0) };
            if r == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                return Ok(());
            }
            check(r, "cuCtxEnablePeerAccess")
        })
    }

    /// Where the windows live.
    pub fn kind(&self) -> WindowKind {
        self.kind
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
            &self.table,
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
    pub fn args(&self, mode: u32, input: u64, output: u64, count: u64, root: u32) -> RingArgs {
        // The kernels count the root of a broadcast or reduce by its ring position.
        let root = match mode {
            RM_BROADCAST | RM_REDUCE => self
                .order
                .iter()
                .position(|&r| r == root as usize)
                .unwrap_or(root as usize) as u32,
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
            mode,
            root,
        }
    }

    /// The arguments of a barrier with rank `peer` (`oxccl_ring_barrier`).
    pub fn barrier_args(&self, peer: usize) -> RingArgs {
        self.args(RM_ALLREDUCE, 0, 0, 0, peer as u32)
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
    f: sys::CUfunction,
    blocks: u32,
    stream: sys::CUstream,
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

/// Launches `oxccl_joint_*` on rank 0's stream.
///
/// # Safety
/// `args` from [`crate::joint::args`] of every rank's checked call: each
/// buffer device memory of its rank's GPU, of the sizes the mode uses, and
/// reachable from rank 0's context (the same GPU, or peer access enabled
/// when the communicator was created); `f` from rank 0's context.
pub unsafe fn launch_joint(
    f: sys::CUfunction,
    blocks: u32,
    stream: sys::CUstream,
    args: crate::joint::JointArgs,
) -> Result<()> {
    // SAFETY: one JointArgs (repr(C), the kernel's layout, 344 bytes); the
    // caller vouches for its pointers.
    unsafe {
        crate::device::launch_struct(
            f,
            blocks,
            THREADS,
            stream,
            &args,
            true,
            "cuLaunchKernel(joint)",
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
    f: sys::CUfunction,
    stream: sys::CUstream,
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
    f: sys::CUfunction,
    blocks: u32,
    stream: sys::CUstream,
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
            let mut saved: sys::CUcontext = std::ptr::null_mut();
            sys::cuCtxGetCurrent(&mut saved);
            if sys::cuCtxSetCurrent(self.ctx) == CUresult::CUDA_SUCCESS {
                // The proxies keep running until our kernels are done (they
                // may need them to finish); then they stop, before anything
                // they read or write is freed.
                sys::cuCtxSynchronize();
                self.stop_proxies();
                for m in self.mappings.drain(..) {
                    match m {
                        Mapping::Ipc(p) => {
                            sys::cuIpcCloseMemHandle(p);
                        }
                        Mapping::Shm { addr, len } => {
                            sys::cuMemHostUnregister(addr as *mut c_void);
                            libc::munmap(addr as *mut c_void, len);
                        }
                        Mapping::Ctx(d) => {
                            sys::cuDevicePrimaryCtxRelease_v2(d);
                        }
                    }
                }
                match &self.local {
                    Local::Device(p) if *p != 0 => {
                        sys::cuMemFree_v2(*p);
                    }
                    Local::Shm {
                        addr,
                        len,
                        name,
                        unlinked,
                    } => {
                        sys::cuMemHostUnregister(*addr as *mut c_void);
                        libc::munmap(*addr as *mut c_void, *len);
                        if !unlinked {
                            libc::shm_unlink(name.as_ptr());
                        }
                    }
                    _ => {}
                }
                for p in [self.peers_buf, self.state] {
                    if p != 0 {
                        sys::cuMemFree_v2(p);
                    }
                }
                if !self.ctrl_host.is_null() {
                    sys::cuMemFreeHost(self.ctrl_host as *mut c_void);
                }
            }
            sys::cuCtxSetCurrent(saved);
        }
        self.stop_proxies();
    }
}

impl Ring {
    fn stop_proxies(&mut self) {
        // What the finished kernels wrote must cross before the connection
        // closes (5 s at most: a dead peer cannot hold destroy longer).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        for p in &self.proxies {
            p.drain(deadline);
        }
        for p in &self.plugin_proxies {
            p.drain(deadline);
        }
        for p in &self.plugin_proxies {
            p.halt();
        }
        for mut p in self.plugin_proxies.drain(..) {
            p.stop();
        }
        for p in &self.proxies {
            p.halt();
        }
        for mut p in self.proxies.drain(..) {
            p.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_has_an_algorithm_and_protocol() {
        assert_eq!(mode_algo(RM_ALLREDUCE), ("Ring", "Simple"));
        assert_eq!(mode_algo(RM_ALLREDUCE_LL), ("Ring", "LL"));
        assert_eq!(mode_algo(RM_BROADCAST_LL1), ("OneShot", "LL"));
        assert_eq!(mode_algo(RM_ALLREDUCE_1S), ("OneShot", "Simple"));
        assert_eq!(mode_algo(RM_ALLREDUCE_LL2), ("TwoShot", "LL"));
        assert_eq!(mode_algo(RM_ALLGATHER_1S), ("OneShot", "Simple"));
        assert_eq!(mode_algo(RM_REDUCE_SCATTER_1S), ("OneShot", "Simple"));
        assert_eq!(mode_algo(RM_ALLREDUCE_2S), ("TwoShot", "Simple"));
        assert_eq!(mode_algo(RM_REDUCE), ("Ring", "Simple"));
    }

    #[test]
    fn region_at_mirrors_the_kernels_region_of() {
        // 3 ranks seen from rank 1, 2 channels, 1000-byte regions: windows
        // at 10_000 * (r + 1), this rank's own regions at 90_000 + r.
        let table = [10_000, 20_000, 30_000, 90_000, 90_001, 90_002];
        let at = |owner, other, ch| region_at(&table, 1, 2, 1000, owner, other, ch);
        // Own regions: index of the other rank among the rest of them.
        assert_eq!(at(1, 0, 0), Some(90_000));
        assert_eq!(at(1, 2, 1), Some(90_002 + 1000 * 3));
        // Another's window, at this rank's index among its others.
        assert_eq!(at(0, 1, 0), Some(10_000));
        assert_eq!(at(2, 1, 1), Some(30_000 + 1000 * 3));
        // Pairs the kernels never ask for, and indices past the table.
        assert_eq!(at(0, 2, 0), None);
        assert_eq!(at(1, 1, 0), None);
        assert_eq!(at(3, 1, 0), None);
        assert_eq!(at(0, 1, 2), None);
    }

    #[test]
    fn layouts_match_the_kernel() {
        assert_eq!(std::mem::size_of::<RingCommon>(), 88);
        assert_eq!(std::mem::size_of::<RingArgs>(), 144);
        assert_eq!(std::mem::size_of::<P2pOp>(), 32);
        assert_eq!(
            std::mem::size_of::<P2pArgs>(),
            88 + 8 + 32 * P2P_MAX_OPS + 24
        );
        assert!(std::mem::size_of::<P2pArgs>() <= 4096);
    }

    #[test]
    fn channels_from_the_slowest_hop() {
        use oxccl_core::topo::{GpuSite, NvLink, Path};
        assert_eq!(topo_channels(Path::Nv(18), 32), 32);
        assert_eq!(topo_channels(Path::Nv(18), 16), 16);
        assert_eq!(topo_channels(Path::Nv(4), 32), 10);
        assert_eq!(topo_channels(Path::Nv(1), 32), 3);
        for p in [Path::Pix, Path::Pxb, Path::Phb, Path::Node] {
            assert_eq!(topo_channels(p, 32), 5, "{p}");
        }
        assert_eq!(topo_channels(Path::Sys, 32), 4);
        assert_eq!(topo_channels(Path::Sys, 2), 2);
        assert_eq!(topo_channels(Path::Itself, 32), 32);
        assert_eq!(topo_channels(Path::Itself, 0), 0);
        let site = |bus: &str, numa: u32, to: Option<&str>| GpuSite {
            busid: bus.into(),
            numaid: numa,
            bridges: vec![],
            nvlinks: to
                .map(|t| NvLink {
                    target: t.into(),
                    count: 18,
                    tclass: "0x030200".into(),
                })
                .into_iter()
                .collect(),
        };
        // The 2xH200 pair: NV18 both ways, 32.
        let pair = [
            site("0000:00:06.0", 0, Some("0000:00:07.0")),
            site("0000:00:07.0", 0, Some("0000:00:06.0")),
        ];
        assert_eq!(ring_channels(&pair, &[0, 1], 32), 32);
        // A third GPU on the other socket: its two hops are SYS, so 4.
        let three = [
            pair[0].clone(),
            pair[1].clone(),
            site("0000:80:00.0", 1, None),
        ];
        assert_eq!(ring_channels(&three, &[0, 1, 2], 32), 4);
        assert_eq!(ring_channels(&three, &[0], 32), 32);
        assert_eq!(ring_channels(&three, &[], 32), 32);
    }

    /// The ring order and channels on the machines recorded as fixtures
    /// (crates/oxccl-cli/tests/fixtures): the 8-GPU NVSwitch box of issue
    /// 10, the 2xH200 pair we run on, and a PCIe box of two switches.
    #[test]
    fn ring_plans_for_the_recorded_machines() {
        use oxccl_core::topo::{rank_ring, Topology};
        let load = |name: &str| {
            let f = format!(
                "{}/../oxccl-cli/tests/fixtures/{name}/topo.xml",
                env!("CARGO_MANIFEST_DIR")
            );
            let t = Topology::from_xml(&std::fs::read_to_string(&f).unwrap()).unwrap();
            t.gpus().iter().map(|g| g.site()).collect::<Vec<_>>()
        };
        let plan = |sites: &[oxccl_core::topo::GpuSite], ranks: &[usize]| {
            let s: Vec<_> = ranks.iter().map(|&g| sites[g].clone()).collect();
            let order = rank_ring(&s, &vec![0; s.len()]);
            let cfg = RingConfig::new(false, 4 << 20, None, None, s.len(), Duration::from_secs(1));
            let ch = ring_channels(&s, &order, cfg.channels);
            (order, ch)
        };
        // DGX-class 8 GPUs, every pair NV18 through the NVSwitches: rank
        // order, and 32 channels (NV18 is worth 32, not 16).
        let dgx = load("dgx8");
        assert_eq!(dgx.len(), 8);
        assert_eq!(
            plan(&dgx, &[0, 1, 2, 3, 4, 5, 6, 7]),
            ((0..8).collect(), 32)
        );
        // 4 of them: 32 channels.
        assert_eq!(plan(&dgx, &[0, 1, 2, 3]), (vec![0, 1, 2, 3], 32));
        // The 2xH200 pair.
        assert_eq!(plan(&load("h200x2"), &[0, 1]), (vec![0, 1], 32));
        // Two PCIe switches of two GPUs (PIX inside, NODE across): ranks
        // numbered across the switches still get neighbours on one switch,
        // and PCIe's 5 channels.
        // The pcie_acs fixture's tree (its topo.xml records only NVML's
        // facts; `oxccl topo --sysroot` shows these bridges).
        let gpu = |bus: &str, up: [&str; 3]| oxccl_core::topo::GpuSite {
            busid: bus.into(),
            numaid: 0,
            bridges: up.iter().map(|b| b.to_string()).collect(),
            nvlinks: vec![],
        };
        let pcie = [
            gpu(
                "0000:13:00.0",
                ["0000:00:01.0", "0000:11:00.0", "0000:12:08.0"],
            ),
            gpu(
                "0000:14:00.0",
                ["0000:00:01.0", "0000:11:00.0", "0000:12:10.0"],
            ),
            gpu(
                "0000:23:00.0",
                ["0000:10:02.0", "0000:21:00.0", "0000:22:08.0"],
            ),
            gpu(
                "0000:24:00.0",
                ["0000:10:02.0", "0000:21:00.0", "0000:22:10.0"],
            ),
        ];
        let (order, ch) = plan(&pcie, &[0, 2, 1, 3]);
        let pos = |r: usize| order.iter().position(|&x| x == r).unwrap();
        let adjacent =
            |a: usize, b: usize| (pos(a) + 1) % 4 == pos(b) || (pos(b) + 1) % 4 == pos(a);
        // Ranks 0 and 2 are GPUs 0 and 1 (one switch); ranks 1 and 3 GPUs 2 and 3.
        assert!(adjacent(0, 2) && adjacent(1, 3), "{order:?}");
        assert_eq!(ch, 5);
    }

    #[test]
    fn config_from_buffsize() {
        let c = RingConfig::new(false, 4 << 20, None, None, 2, Duration::from_secs(1));
        assert_eq!((c.slot, c.nslots, c.channels), (512 << 10, 4, 32));
        assert_eq!(
            c.window_bytes(2),
            32 * (HDR_BYTES + 4 * (512 << 10) + LL_NSLOTS as u64 * LL_SLOT_BYTES)
        );
        let c = RingConfig::new(false, 4 << 20, None, None, 8, Duration::from_secs(1));
        assert_eq!(c.channels, 32);
        // 7 x 32 regions of 2.1 MiB: the 476 MiB the doc names.
        assert_eq!(c.window_bytes(8) >> 20, 476);
        let c = RingConfig::new(false, 4 << 20, None, None, 9, Duration::from_secs(1));
        assert_eq!(c.channels, 16);
        let c = RingConfig::new(false, 1024, Some(40), None, 2, Duration::from_secs(1));
        assert_eq!((c.slot, c.channels), (16 << 10, MAX_CHANNELS));
        let c = RingConfig::new(
            true,
            (256 << 10) + 7,
            None,
            Some(4),
            2,
            Duration::from_secs(1),
        );
        assert_eq!((c.slot % 16, c.channels), (0, 4));
        assert_eq!(c.window_bytes(1), 0);
        assert_eq!(
            c.window_bytes(3),
            2 * 4 * (HDR_BYTES + 4 * c.slot as u64 + LL_NSLOTS as u64 * LL_SLOT_BYTES)
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
        let good = Who {
            ok: true,
            nonce: 7,
            ordinal: 1,
            bus: [b'0'; 16],
            p2p_disable: false,
            sms: 132,
        }
        .encode();
        assert!(Who::decode(&good, 0).is_ok());
        for i in 0..5000 {
            let len = (next() % 140) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if i % 2 == 0 && len <= good.len() {
                b = good.clone();
                let k = (next() as usize) % b.len();
                b[k] = next() as u8;
            }
            let _ = Who::decode(&b, i);
            let _ = all_ok("test", &[b]);
        }
        assert!(all_ok("test", &[vec![1], vec![0, b'x']])
            .unwrap_err()
            .message()
            .contains("rank 1 failed: x"));
    }

    /// The kernel plan for 2, 4 and 8 ranks (as on 8 H200
    /// on NVSwitch, where every pair is one NVLink hop and any ring order
    /// is as good as another), on one host and across hosts, at the default
    /// configuration.
    #[test]
    fn the_small_kernel_takes_what_fits_one_slot() {
        // Every one-shot size of 2, 4 and 8 ranks at the default channels,
        // every type size.
        for n in [2usize, 4, 8] {
            let cfg = RingConfig::new(false, 4 << 20, None, None, n, Duration::from_secs(1));
            let t = Thresholds::of(&cfg, n, false);
            for elem in [1u64, 2, 4, 8] {
                for bytes in [elem, 8, 24, 4096, 4100, 65536, 131072, 262144] {
                    let count = bytes / elem;
                    let (m, blocks) = plan(RM_ALLREDUCE, bytes, &t);
                    if m == RM_ALLREDUCE_LL1 {
                        assert!(
                            ll1_fast(count, elem, blocks, LL_SLOT_BYTES),
                            "{n} {elem} {bytes}"
                        );
                    }
                }
            }
            // The other one-shot LL modes (bytes: one rank's block), to
            // 256 KiB per rank; 2 ranks' 512 KiB goes to the loop.
            for mode in [RM_ALLGATHER, RM_REDUCE_SCATTER, RM_BROADCAST, RM_REDUCE] {
                for elem in [1u64, 2, 4, 8] {
                    for bytes in [elem, 8, 24, 4096, 4100, 65536, 73720, 174760, 262144] {
                        let (m, blocks) = plan(mode, bytes, &t);
                        assert_eq!(
                            is_one_shot_ll(m),
                            bytes <= t.oneshot_block_max,
                            "{n} {mode} {bytes}"
                        );
                        if is_one_shot_ll(m) {
                            assert!(
                                ll1_fast(bytes / elem, elem, blocks, LL_SLOT_BYTES),
                                "{n} {mode} {elem} {bytes}"
                            );
                        }
                    }
                }
                let (m, blocks) = plan(mode, 512 << 10, &t);
                if n == 2 {
                    assert!(is_one_shot_ll(m));
                    assert!(!ll1_fast(512 << 10, 1, blocks, LL_SLOT_BYTES));
                }
            }
        }
        assert!(is_one_shot_ll(RM_ALLREDUCE_LL1));
        assert!(!is_one_shot_ll(RM_ALLREDUCE_LL));
        assert!(!is_one_shot_ll(RM_ALLREDUCE_1S));
        assert!(!is_one_shot_ll(RM_ALLGATHER));
        // A block's part of exactly one slot (8 KiB of data) fits, a line
        // more does not; 4 channels leave 256 KiB to the ring kernel.
        assert!(ll1_fast(2048, 4, 1, LL_SLOT_BYTES));
        assert!(!ll1_fast(2050, 4, 1, LL_SLOT_BYTES));
        assert!(ll1_fast(65536, 4, 32, LL_SLOT_BYTES));
        assert!(!ll1_fast(65536, 4, 4, LL_SLOT_BYTES));
        // Odd counts round each part up to whole lines, as the kernel does.
        assert!(ll1_fast(4095, 1, 1, LL_SLOT_BYTES));
        assert!(ll1_fast(8191, 1, 1, LL_SLOT_BYTES));
        assert!(!ll1_fast(8193, 1, 1, LL_SLOT_BYTES));
        assert!(!ll1_fast(1, 0, 1, LL_SLOT_BYTES));
        assert!(!ll1_fast(1, 16, 1, LL_SLOT_BYTES));
        assert!(!ll1_fast(1, 4, 0, LL_SLOT_BYTES));
        assert!(ll1_fast(0, 4, 1, LL_SLOT_BYTES));
        assert_eq!(
            ll1_kernel_name(DataType::Float32, RedOp::Sum),
            "oxccl_ll1_f32_sum"
        );
        // Every two-shot size of 3, 4 and 8 ranks at the default channels,
        // every type size, takes the small kernel.
        for n in [3usize, 4, 8] {
            let cfg = RingConfig::new(false, 4 << 20, None, None, n, Duration::from_secs(1));
            let t = Thresholds::of(&cfg, n, false);
            for elem in [1u64, 2, 4, 8] {
                for bytes in [24u64 << 10, 40 << 10, 65544, 128 << 10, 300000, 512 << 10] {
                    let (m, blocks) = plan(RM_ALLREDUCE, bytes, &t);
                    if m == RM_ALLREDUCE_LL2 {
                        let count = bytes / elem;
                        assert!(
                            small_kernel_fits(m, count, elem, n as u32, blocks),
                            "{n} {elem} {bytes}"
                        );
                    }
                }
            }
        }
        // One rank block per block of one slot (8 KiB of data): 8 ranks of
        // 2,048 floats each fit one block, a line more does not.
        assert!(ll2_fast(8 * 2048, 4, 8, 1, LL_SLOT_BYTES));
        assert!(!ll2_fast(8 * 2048 + 8 * 2, 4, 8, 1, LL_SLOT_BYTES));
        assert!(!ll2_fast(1, 4, 0, 1, LL_SLOT_BYTES));
        assert!(!small_kernel_fits(RM_ALLREDUCE_LL, 8, 4, 4, 1));
        assert!(small_kernel_fits(RM_ALLREDUCE_LL1, 8, 4, 4, 1));
    }

    #[test]
    fn early_launches_only_where_every_rank_keeps_its_sms() {
        // One rank per GPU: always (its own kernel is wholly resident before
        // the next one's blocks start).
        assert!(pdl_fits(128, 1, 132));
        assert!(pdl_fits(u32::MAX, 1, 0));
        // 4 ranks sharing an H200: the 32-block LL kernels that hung under
        // graphs may not; small kernels (the one-shot's 1-16 blocks) may.
        assert!(!pdl_fits(32, 4, 132));
        assert!(pdl_fits(16, 4, 132));
        assert!(!pdl_fits(17, 4, 132));
        // 8 ranks: up to 8 blocks each; 2 ranks: up to 33.
        assert!(pdl_fits(8, 8, 132));
        assert!(!pdl_fits(16, 8, 132));
        assert!(pdl_fits(33, 2, 132));
        assert!(!pdl_fits(34, 2, 132));
        // SMs unknown: never with several ranks on the GPU.
        assert!(!pdl_fits(1, 2, 0));
    }

    #[test]
    fn plans_for_two_four_and_eight_ranks() {
        let plan_at = |n: usize, cross: bool, bytes: u64| {
            let cfg = RingConfig::new(false, 4 << 20, None, None, n, Duration::from_secs(1));
            plan(RM_ALLREDUCE, bytes, &Thresholds::of(&cfg, n, cross))
        };
        // One host, 2 ranks: one-shot LL to 256 KiB, ring LL to 1 MiB,
        // then the Simple ring on 32 channels (one per 32 KiB).
        assert_eq!(plan_at(2, false, 8), (RM_ALLREDUCE_LL1, 1));
        assert_eq!(plan_at(2, false, 4 << 10), (RM_ALLREDUCE_LL1, 1));
        assert_eq!(plan_at(2, false, (4 << 10) + 1), (RM_ALLREDUCE_LL1, 2));
        assert_eq!(plan_at(2, false, 128 << 10), (RM_ALLREDUCE_LL1, 32));
        assert_eq!(plan_at(2, false, 256 << 10), (RM_ALLREDUCE_LL1, 32));
        assert_eq!(plan_at(2, false, (256 << 10) + 1), (RM_ALLREDUCE_LL, 32));
        assert_eq!(plan_at(2, false, (128 << 10) + 1).0, RM_ALLREDUCE_LL1);
        assert_eq!(plan_at(2, false, 512 << 10), (RM_ALLREDUCE_LL, 32));
        assert_eq!(plan_at(2, false, 1 << 20), (RM_ALLREDUCE_LL, 32));
        assert_eq!(plan_at(2, false, (1 << 20) + 16), (RM_ALLREDUCE, 32));
        assert_eq!(plan_at(2, false, 1 << 30), (RM_ALLREDUCE, 32));
        // 3 ranks: one-shot to 64 KiB, two-shot LL to 512 KiB, then Simple
        // (a block per 4 KiB of a rank's third).
        assert_eq!(plan_at(3, false, 64 << 10), (RM_ALLREDUCE_LL1, 16));
        assert_eq!(plan_at(3, false, (64 << 10) + 8), (RM_ALLREDUCE_LL2, 6));
        assert_eq!(plan_at(3, false, 512 << 10), (RM_ALLREDUCE_LL2, 32));
        assert_eq!(plan_at(3, false, (512 << 10) + 16).0, RM_ALLREDUCE_2S);
        // 4 ranks: one-shot to ~42 KiB (each rank writes 3 copies), then
        // two-shot LL to 512 KiB, then the two-shot over Simple slots (a
        // channel per 32 KiB of a rank's quarter) to 4 MiB (1 MiB each).
        assert_eq!(plan_at(4, false, 40 << 10), (RM_ALLREDUCE_LL1, 10));
        assert_eq!(plan_at(4, false, 48 << 10), (RM_ALLREDUCE_LL2, 3));
        assert_eq!(plan_at(4, false, 512 << 10), (RM_ALLREDUCE_LL2, 32));
        assert_eq!(plan_at(4, false, (512 << 10) + 16), (RM_ALLREDUCE_2S, 5));
        assert_eq!(plan_at(4, false, 4 << 20), (RM_ALLREDUCE_2S, 32));
        assert_eq!(plan_at(4, false, (4 << 20) + 16), (RM_ALLREDUCE, 32));
        // 8 ranks: 32 channels (not 16), one-shot to ~18 KiB,
        // two-shot LL to 512 KiB.
        assert_eq!(plan_at(8, false, 16 << 10), (RM_ALLREDUCE_LL1, 4));
        assert_eq!(plan_at(8, false, 32 << 10), (RM_ALLREDUCE_LL2, 1));
        assert_eq!(plan_at(8, false, 512 << 10), (RM_ALLREDUCE_LL2, 16));
        assert_eq!(plan_at(8, false, (512 << 10) + 16), (RM_ALLREDUCE_2S, 3));
        assert_eq!(plan_at(8, false, 8 << 20), (RM_ALLREDUCE_2S, 32));
        assert_eq!(plan_at(8, false, (8 << 20) + 16), (RM_ALLREDUCE, 32));
        assert_eq!(plan_at(8, false, 1 << 30), (RM_ALLREDUCE, 32));
        // 9 ranks: neither one-shot nor two-shot kernel.
        assert_eq!(plan_at(9, false, 8), (RM_ALLREDUCE_LL, 1));
        assert_eq!(plan_at(9, false, 64 << 10), (RM_ALLREDUCE_LL, 8));
        assert_eq!(plan_at(9, false, 1 << 20), (RM_ALLREDUCE, 16));
        // The direct kernels off (OXCCL_CUDA_DIRECT_MAX=0): the Simple ring
        // past LL.
        let mut nod = RingConfig::new(false, 4 << 20, None, None, 4, Duration::from_secs(1));
        nod.direct_max = 0;
        let t4 = Thresholds::of(&nod, 4, false);
        assert_eq!(plan(RM_ALLREDUCE, 1 << 20, &t4), (RM_ALLREDUCE, 32));
        assert_eq!(plan(RM_ALLGATHER, 1 << 20, &t4), (RM_ALLGATHER, 32));
        assert_eq!(
            plan(RM_REDUCE_SCATTER, 1 << 20, &t4),
            (RM_REDUCE_SCATTER, 32)
        );
        // Two-shot off (OXCCL_CUDA_TWOSHOT_MAX=0, NCCL_ALGO without
        // TwoShot): the LL ring between the one-shot and LL's bounds.
        let mut no2 = RingConfig::new(false, 4 << 20, None, None, 8, Duration::from_secs(1));
        no2.twoshot_max = 0;
        let t8 = Thresholds::of(&no2, 8, false);
        assert_eq!(plan(RM_ALLREDUCE, 32 << 10, &t8), (RM_ALLREDUCE_LL, 4));
        // LL at every size (NCCL_PROTO=LL): two-shot to its own bound only.
        let mut ll = RingConfig::new(false, 4 << 20, None, None, 4, Duration::from_secs(1));
        ll.ll_max = u64::MAX;
        let t4 = Thresholds::of(&ll, 4, false);
        assert_eq!(plan(RM_ALLREDUCE, 1 << 20, &t4), (RM_ALLREDUCE_LL, 32));
        ll.twoshot_max = u64::MAX;
        let t4 = Thresholds::of(&ll, 4, false);
        assert_eq!(plan(RM_ALLREDUCE, 1 << 20, &t4), (RM_ALLREDUCE_LL2, 32));
        // The two-shot's bound above LL's (OXCCL_CUDA_TWOSHOT_MAX=4M alone):
        // the two-shot to it, then the Simple kernels (the two-shot over
        // Simple slots to 8 MiB); NCCL_PROTO without LL turns it off (it
        // is an LL kernel).
        let mut wide = RingConfig::new(false, 4 << 20, None, None, 8, Duration::from_secs(1));
        wide.twoshot_max = 4 << 20;
        let t8 = Thresholds::of(&wide, 8, false);
        assert_eq!(plan(RM_ALLREDUCE, 16 << 10, &t8), (RM_ALLREDUCE_LL1, 4));
        assert_eq!(plan(RM_ALLREDUCE, 4 << 20, &t8), (RM_ALLREDUCE_LL2, 32));
        assert_eq!(
            plan(RM_ALLREDUCE, (4 << 20) + 16, &t8),
            (RM_ALLREDUCE_2S, 17)
        );
        wide.ll_max = 0;
        let t8 = Thresholds::of(&wide, 8, false);
        assert_eq!(t8.twoshot_max, 0);
        assert_eq!(plan(RM_ALLREDUCE, 1 << 20, &t8), (RM_ALLREDUCE_2S, 4));
        // Not for 2 ranks even when asked (the one-shot serves them).
        let mut two = RingConfig::new(false, 4 << 20, None, None, 2, Duration::from_secs(1));
        two.twoshot_max = u64::MAX;
        assert_eq!(
            plan(RM_ALLREDUCE, 512 << 10, &Thresholds::of(&two, 2, false)),
            (RM_ALLREDUCE_LL, 32)
        );
        // Across hosts: no LL; 2 ranks one-shot Simple at every size, 8
        // ranks up to 256 KiB / 7, then the ring.
        assert_eq!(plan_at(2, true, 8), (RM_ALLREDUCE_1S, 1));
        assert_eq!(plan_at(2, true, 1 << 30), (RM_ALLREDUCE_1S, 32));
        assert_eq!(plan_at(8, true, 32 << 10), (RM_ALLREDUCE_1S, 1));
        assert_eq!(plan_at(8, true, 64 << 10), (RM_ALLREDUCE, 1));
        assert_eq!(plan_at(9, true, 8), (RM_ALLREDUCE, 1));
        // Small all-gathers and reduce-scatters (bytes: one rank's block)
        // take the one-shot LL kernel while (n - 1) blocks fit LL's 512 KiB;
        // larger ones, and every one across hosts, the Simple ring.
        let cfg = RingConfig::new(false, 4 << 20, None, None, 8, Duration::from_secs(1));
        let t = Thresholds::of(&cfg, 8, false);
        // 8 ranks: blocks to 512 KiB / 7 (~73 KiB).
        assert_eq!(plan(RM_ALLGATHER, 8, &t), (RM_ALLGATHER_LL1, 1));
        assert_eq!(
            plan(RM_REDUCE_SCATTER, 64 << 10, &t),
            (RM_REDUCE_SCATTER_LL1, 16)
        );
        // Past that, to 1 MiB blocks, the one-shot over Simple slots (a
        // channel per 32 KiB of the block, 32 at most), then the ring.
        assert_eq!(plan(RM_ALLGATHER, 80 << 10, &t), (RM_ALLGATHER_1S, 3));
        assert_eq!(
            plan(RM_REDUCE_SCATTER, 1 << 20, &t),
            (RM_REDUCE_SCATTER_1S, 32)
        );
        assert_eq!(plan(RM_ALLGATHER, (1 << 20) + 1, &t), (RM_ALLGATHER, 32));
        // 2 ranks: blocks to 512 KiB.
        let two = RingConfig::new(false, 4 << 20, None, None, 2, Duration::from_secs(1));
        let t2 = Thresholds::of(&two, 2, false);
        assert_eq!(plan(RM_ALLGATHER, 512 << 10, &t2), (RM_ALLGATHER_LL1, 32));
        // (never the direct kernels: the ring of 2 is one step each way)
        assert_eq!(plan(RM_ALLGATHER, (512 << 10) + 1, &t2), (RM_ALLGATHER, 17));
        assert_eq!(t2.direct_max, 0);
        // One-shot kernels off (OXCCL_CUDA_ONESHOT_MAX=0, NCCL_ALGO): the ring.
        let mut off = two.clone();
        off.oneshot_max = 0;
        let t2o = Thresholds::of(&off, 2, false);
        assert_eq!(plan(RM_REDUCE_SCATTER, 8, &t2o), (RM_REDUCE_SCATTER, 1));
        let t2x = Thresholds::of(&two, 2, true);
        assert_eq!(plan(RM_ALLGATHER, 8, &t2x), (RM_ALLGATHER, 1));
        assert_eq!(plan(RM_REDUCE_SCATTER, 8, &t2x), (RM_REDUCE_SCATTER, 1));
        // Broadcasts and reduces: the same bound on the whole buffer (the
        // root sends, or receives, n - 1 copies of it).
        assert_eq!(plan(RM_BROADCAST, 8, &t), (RM_BROADCAST_LL1, 1));
        assert_eq!(plan(RM_REDUCE, 64 << 10, &t), (RM_REDUCE_LL1, 16));
        assert_eq!(plan(RM_BROADCAST, 80 << 10, &t), (RM_BROADCAST, 3));
        assert_eq!(plan(RM_REDUCE, 512 << 10, &t2), (RM_REDUCE_LL1, 32));
        assert_eq!(plan(RM_BROADCAST, (512 << 10) + 1, &t2), (RM_BROADCAST, 17));
        assert_eq!(plan(RM_BROADCAST, 8, &t2o), (RM_BROADCAST, 1));
        assert_eq!(plan(RM_REDUCE, 8, &t2x), (RM_REDUCE, 1));
        // The other collectives keep their mode, one block per 32 KiB
        // within a host, 64 KiB across hosts.
        assert_eq!(
            plan(RM_REDUCE_SCATTER, 1 << 30, &t),
            (RM_REDUCE_SCATTER, 32)
        );
        assert_eq!(
            plan(RM_REDUCE_SCATTER, 1 << 20, &t2),
            (RM_REDUCE_SCATTER, 32)
        );
        assert_eq!(
            plan(RM_REDUCE_SCATTER, 1 << 20, &t2x),
            (RM_REDUCE_SCATTER, 16)
        );
    }

    #[test]
    fn own_regions_split_by_host() {
        // Two hosts of two ranks, this rank 1: device window for 0 and
        // itself, the proxies' window for 2 and 3.
        assert_eq!(
            own_regions(&[true, true, false, false], 0xd000, 0xa000),
            [0xd000, 0xd000, 0xa000, 0xa000]
        );
        // The window is host memory already (no second one): every rank.
        assert_eq!(
            own_regions(&[true, false, false], 0xd000, 0),
            [0xd000, 0xd000, 0xd000]
        );
        // One host.
        assert_eq!(own_regions(&[true, true], 7, 0), [7, 7]);
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

    /// Ranks sharing a GPU get no more channels (ring blocks) than the GPU
    /// runs at once; send/receive launches no more blocks; one rank per
    /// GPU keeps the configured counts.
    #[test]
    fn ranks_sharing_a_gpu_keep_every_block_resident() {
        let bus = |b: u8| {
            let mut x = [b'0'; 16];
            x[15] = b;
            x
        };
        // 8 GPUs of 132 SMs, a rank each: no bound.
        let own: Vec<_> = (0..8).map(|i| (0u64, bus(i), 132u32)).collect();
        assert_eq!(shared_channel_cap(&own), None);
        // n ranks on one H200: 132 / n (12 ranks: 11, where 16 hung).
        for (n, want) in [
            (2, 32),
            (4, 32),
            (5, 26),
            (6, 22),
            (7, 18),
            (8, 16),
            (9, 14),
            (12, 11),
        ] {
            let one: Vec<_> = (0..n).map(|_| (0u64, bus(0), 132u32)).collect();
            let cap = shared_channel_cap(&one).unwrap();
            assert_eq!(
                (cap.channels, cap.ranks, cap.sms),
                (want, n as u32, 132),
                "{n}"
            );
        }
        // 200 ranks on one GPU: at least one channel.
        let many: Vec<_> = (0..200).map(|_| (0u64, bus(0), 132u32)).collect();
        assert_eq!(shared_channel_cap(&many).unwrap().channels, 1);
        // The tightest GPU sets it: 3 ranks on a 132-SM GPU (44), 2 on a
        // 58-SM one (29); the same bus id on another host is another GPU.
        let mixed = [
            (0, bus(0), 132),
            (0, bus(0), 132),
            (0, bus(0), 132),
            (0, bus(1), 58),
            (0, bus(1), 58),
            (1, bus(0), 132),
        ];
        let cap = shared_channel_cap(&mixed).unwrap();
        assert_eq!((cap.channels, cap.ranks, cap.sms), (29, 2, 58));
        let hosts = [(0, bus(0), 132), (1, bus(0), 132)];
        assert_eq!(shared_channel_cap(&hosts), None);
        // An unknown SM count sets no bound.
        assert_eq!(shared_channel_cap(&[(0, bus(0), 0), (0, bus(0), 0)]), None);

        let t = Duration::from_secs(1);
        let c8 = RingConfig::new(false, 4 << 20, None, None, 8, t);
        let share8 = shared_channel_cap(&vec![(0u64, bus(0), 132u32); 8]);
        // 8 GPUs of their own: 32; NVLink-poor topology lowers it; 8 ranks
        // on one GPU: 16.
        assert_eq!(setup_channels(&c8, 8, false, None, None), 32);
        assert_eq!(setup_channels(&c8, 8, false, Some(5), None), 5);
        assert_eq!(setup_channels(&c8, 8, false, None, share8), 16);
        // Host-memory windows (or peers on other hosts) beyond 4 ranks: 16.
        assert_eq!(setup_channels(&c8, 8, true, None, None), 16);
        let c4 = RingConfig::new(false, 4 << 20, None, None, 4, t);
        assert_eq!(setup_channels(&c4, 4, true, None, None), 32);
        // The user's count: the topology does not lower it, sharing does.
        let u = RingConfig::new(false, 4 << 20, Some(32), None, 8, t);
        assert_eq!(setup_channels(&u, 8, true, Some(5), None), 32);
        assert_eq!(setup_channels(&u, 8, false, Some(5), share8), 16);

        // Send/receive launches: 2 blocks an SM over the ranks sharing it.
        assert_eq!(p2p_resident_blocks(1, 132), P2P_MAX_BLOCKS);
        assert_eq!(p2p_resident_blocks(8, 0), P2P_MAX_BLOCKS);
        assert_eq!(p2p_resident_blocks(2, 132), P2P_MAX_BLOCKS);
        assert_eq!(p2p_resident_blocks(8, 132), 33);
        assert_eq!(p2p_resident_blocks(1000, 132), 1);
        // 8 ranks' all-to-all: 14 ops x 16 channels = 224 items on 33 blocks.
        assert_eq!(p2p_blocks(224, 33), 33);
        assert_eq!(p2p_blocks(20, 33), 20);
        assert_eq!(p2p_blocks(0, 33), 1);
        // More items than 16 a block allows: as many blocks as they need.
        assert_eq!(p2p_blocks(64 * 32, 1), P2P_MAX_BLOCKS);
        assert_eq!(p2p_blocks(1000, 33), 63);
        for items in [1u32, 15, 16, 17, 224, 528, 529, 2048] {
            for res in [1u32, 33, 128] {
                let b = p2p_blocks(items, res);
                assert!(items.div_ceil(b) <= P2P_MAX_ITEMS, "{items} {res}");
                assert!((1..=P2P_MAX_BLOCKS).contains(&b));
            }
        }
    }

    #[test]
    fn channel_counts() {
        assert_eq!(self_copy_blocks(0), 1);
        assert_eq!(self_copy_blocks(32 << 10), 1);
        assert_eq!(self_copy_blocks((32 << 10) + 1), 2);
        assert_eq!(self_copy_blocks(1 << 20), 32);
        assert_eq!(self_copy_blocks(1 << 30), P2P_MAX_BLOCKS);
        assert_eq!(coll_channels(0, 16, COLL_CHUNK_NET), 1);
        assert_eq!(coll_channels(8, 16, COLL_CHUNK_NET), 1);
        assert_eq!(coll_channels(64 << 10, 16, COLL_CHUNK_NET), 1);
        assert_eq!(coll_channels((64 << 10) + 1, 16, COLL_CHUNK_NET), 2);
        assert_eq!(coll_channels(1 << 30, 16, COLL_CHUNK_NET), 16);
        assert_eq!(coll_channels(1 << 30, 0, COLL_CHUNK_NET), 1);
        assert_eq!(coll_channels(32 << 10, 32, COLL_CHUNK), 1);
        assert_eq!(coll_channels((32 << 10) + 1, 32, COLL_CHUNK), 2);
        assert_eq!(coll_channels(1 << 20, 32, COLL_CHUNK), 32);
        assert_eq!(coll_channels(1 << 20, 32, COLL_CHUNK_NET), 16);
        assert_eq!(coll_channels(5, 32, 0), 5);
        assert_eq!(p2p_channels(1, 16, P2P_WIDE_MIN), 1);
        assert_eq!(p2p_channels(1 << 30, 32, P2P_WIDE_MIN), 32);
        assert_eq!(p2p_channels(1 << 30, 32, u64::MAX), 16);
        assert_eq!(p2p_blocks(64 * 16, P2P_MAX_BLOCKS), P2P_MAX_BLOCKS);
        assert_eq!(default_oneshot_net_max(2), u64::MAX);
        assert_eq!(default_oneshot_net_max(3), 128 << 10);
        assert_eq!(default_oneshot_net_max(9), 0);
        assert_eq!(default_oneshot_max(2), 256 << 10);
        assert_eq!(default_oneshot_max(3), 64 << 10);
        assert_eq!(default_oneshot_max(1), 0);
        assert_eq!(default_oneshot_max(9), 0);
        assert_eq!(auto_net_streams(1), 8);
        assert_eq!(auto_net_streams(0), 8);
        assert_eq!(auto_net_streams(4), 4);
        assert_eq!(auto_net_streams(7), 2);
        assert_eq!(auto_net_streams(64), 1);
        assert_eq!(ll_channels(8, 32), 1);
        assert_eq!(ll_channels(64 << 10, 32), 8);
        assert_eq!(ll_channels(1 << 30, 32), 32);
        // Every block serves at most 16 items (RING_P2P_MAX_ITEMS).
        assert!((P2P_MAX_OPS as u32 * 16).div_ceil(P2P_MAX_BLOCKS) <= 16);
    }
}
