//! The ring program's decisions: its settings ([`RingConfig`]), what a
//! communicator's kernel choice depends on ([`Thresholds`]), which kernel
//! and how many blocks a collective takes ([`plan`]), channel counts for
//! collectives and sends/receives, what ranks sharing a GPU may launch, and
//! the layout of the windows the kernels share (`kernels/ring.cu` mirrors
//! the constants here). Every function is pure: both ends of a connection
//! compute the same answer from the same inputs, and every answer is tested
//! here without a GPU.

use std::time::Duration;

use super::kernel::{Collective, RingKernel};
use crate::algo::{Algo, Proto};

/// Bytes before a region's slots (`RING_HDR`: tail, head and LL head lines).
pub const HDR_BYTES: u64 = 384;
/// Byte offset, in a channel-0 region's header, of the pushed reduction's
/// landed counter (`RING_CE_LANDED`, a u32 the peer's copy stream writes;
/// two_process.rs) and, 4 bytes on, the reducing kernel's block counter.
pub const CE_LANDED: u64 = 296;
/// Byte offset, in a channel-0 region's header, of the in-place pushed
/// reduction's counter (`RING_CE_PUSHED`: a u64 whose low word the other
/// rank's copy stream writes after each push; this rank's kernel and copy
/// stream wait on it, and this rank's stream puts it back to 0 after the
/// call's last barrier: copy_engine_reduce.rs, `plan_pushed_in_place`).
pub const CE_PUSHED: u64 = 312;
/// Byte offset, in a channel-0 region's header, of how many pieces the
/// other rank's kernel has reduced of an in-place reduce-scatter that this
/// rank pushes into the other rank's scratch ring (`RING_CE_CONSUMED`, a
/// u32 that kernel writes; this rank's copy stream waits on it before it
/// refills a slot, and this rank's stream puts it back to 0 after the
/// call's first barrier: copy_engine_reduce.rs, `plan_pushed_ring`).
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

/// Most ranks of the one-shot and two-shot kernels (`DIRECT_MAX_RANKS` of ring.cu).
pub const ONE_SHOT_MAX_RANKS: usize = 8;

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
    /// one-shot LL kernel where the ranks are at most [`ONE_SHOT_MAX_RANKS`] (0: never).
    pub oneshot_max: u64,
    /// All-reduces above `oneshot_max`, of at most this many bytes (and
    /// within `ll_max`), take the two-shot LL kernel instead of the LL ring
    /// where the ranks are 3 to [`ONE_SHOT_MAX_RANKS`] on one host (0: never).
    pub twoshot_max: u64,
    /// All-gathers and reduce-scatters whose per-rank block, and all-reduces
    /// whose n-th part, is at most this many bytes take the direct kernels
    /// over Simple slots (all-gather and reduce-scatter one-shot and all-reduce two-shot over
    /// Simple) instead of the Simple ring, where the ranks are 3
    /// to [`ONE_SHOT_MAX_RANKS`] on one host (0: never).
    pub direct_max: u64,
    /// All-reduces of at most this many bytes take the one-shot kernel over
    /// Simple slots when some peer is on another host (LL cannot cross the
    /// network proxies), at most [`ONE_SHOT_MAX_RANKS`] ranks (0: never).
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
    /// OXCCL_RING_ORDER ((`parse_ring_order` of oxccl-cuda)): the ranks in
    /// ring order, instead of the order the topology picks
    /// ([`crate::topo::rank_ring`]). Empty: none.
    pub ring_order: Vec<u32>,
    /// GPUDirect RDMA settings for a network plugin's path ([`super::gdr`]).
    pub gdr: super::gdr::GdrSettings,
    /// `NCCL_IB_HCA`: the plugin devices (of a network named IB) the
    /// channels may spread over.
    pub ib_hca: Option<String>,
    /// `NCCL_CROSS_NIC`: how the channels pick among those devices
    /// ([`crate::topo::nic_per_channel`]).
    pub cross_nic: crate::topo::CrossNic,
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
pub fn topo_channels(worst: crate::topo::Path, default: u32) -> u32 {
    use crate::topo::Path;
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
/// (start early: (`launch_raw` of oxccl-cuda)). An early launch's blocks
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
/// `oxccl_ring_p2p`, `oxccl_small_*` and `oxccl_one_launch_*` (two blocks).
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
pub fn ring_channels(sites: &[crate::topo::GpuSite], order: &[usize], default: u32) -> u32 {
    let n = order.len();
    if n < 2 {
        return default;
    }
    (0..n)
        .filter_map(|p| {
            let (a, b) = (sites.get(order[p])?, sites.get(order[(p + 1) % n])?);
            Some(topo_channels(crate::topo::site_path(a, b), default))
        })
        .min()
        .unwrap_or(default)
}

impl RingConfig {
    /// The ring settings for `NCCL_BUFFSIZE` (bytes per connection), the
    /// channel bounds, the rank count and the timeout: 4 slots of
    /// buffsize/8 (512 KiB by default; 16 KiB..1 MiB, a 16-byte multiple);
    /// `max_channels` channels, else 32 up to [`ONE_SHOT_MAX_RANKS`] (8) ranks
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
        let mut ch = max_channels.unwrap_or(if nranks <= ONE_SHOT_MAX_RANKS { 32 } else { 16 });
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
            gdr: Default::default(),
            ib_hca: None,
            cross_nic: Default::default(),
            channels_set: min_channels.is_some() || max_channels.is_some(),
            ring_order: Vec::new(),
        }
    }

    /// Bytes of one rank's window for `nranks` ranks.
    pub fn window_bytes(&self, nranks: usize) -> u64 {
        nranks.saturating_sub(1) as u64 * self.channels as u64 * self.region()
    }

    /// Bytes of one (rank, channel) region: the header, the Simple slots
    /// and the LL slots.
    pub fn region(&self) -> u64 {
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
    } else if (3..=ONE_SHOT_MAX_RANKS).contains(&nranks) {
        (128 << 10) / (nranks as u64 - 1)
    } else {
        0
    }
}

/// The all-reduce size up to which the two-shot LL kernel replaces the LL
/// ring by default: LL's own bound ([`DEFAULT_LL_MAX`]) for 3 to
/// [`ONE_SHOT_MAX_RANKS`] ranks, none for 2 (there the one-shot sends what the
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
/// the small kernel ([`fits_small_two_shot`], same method): 4 ranks 64-256 KiB 6.0-6.8, 8
/// ranks 32-128 KiB 10.7-11.4. Not yet measured on 4 or 8 GPUs.
pub fn default_twoshot_max(nranks: usize) -> u64 {
    if (3..=ONE_SHOT_MAX_RANKS).contains(&nranks) {
        DEFAULT_LL_MAX
    } else {
        0
    }
}

/// The per-rank block up to which all-gathers, reduce-scatters and
/// all-reduces (a rank's n-th of the message) take the direct kernels over
/// Simple slots by default, for 3 to [`ONE_SHOT_MAX_RANKS`] ranks of one host
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
    if (3..=ONE_SHOT_MAX_RANKS).contains(&nranks) {
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
        3..=ONE_SHOT_MAX_RANKS => (256 << 10) / (nranks as u64 - 1),
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
    /// than [`ONE_SHOT_MAX_RANKS`] ranks).
    pub twoshot_max: u64,
    /// Ranks of the communicator (the two-shot's blocks are 1/n of it).
    pub nranks: u32,
    /// All-gathers and reduce-scatters with blocks, and all-reduces past
    /// LL with n-th parts, of at most this many bytes take the direct
    /// Simple kernels (0 across hosts and for 2 or more than
    /// [`ONE_SHOT_MAX_RANKS`] ranks).
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
    /// by the ring's setup (oxccl-cuda), [`P2P_MAX_BLOCKS`] in [`Thresholds::of`]).
    pub p2p_blocks_max: u32,
}

impl Thresholds {
    /// A communicator of `nranks` ranks with `cfg`, on one host or not:
    /// what the ring's setup (oxccl-cuda) keeps (LL cannot cross the network proxies; the
    /// one-shot kernels serve at most [`ONE_SHOT_MAX_RANKS`]).
    pub fn of(cfg: &RingConfig, nranks: usize, cross: bool) -> Thresholds {
        let small = nranks <= ONE_SHOT_MAX_RANKS;
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

/// The kernel and blocks of a ring-path `collective` moving `bytes`
/// through each link: all-reduces take the one-shot Simple kernel across
/// hosts, else LL when small (the one-shot LL kernel when smaller, the
/// two-shot LL kernel in between for 3-8 ranks), else the direct two-shot
/// over Simple slots (3-8 ranks), else the Simple ring; the other
/// collectives take their one-shot LL kernel when small, the direct one
/// over Simple slots (all-gather, reduce-scatter) when within its bound,
/// else the Simple ring.
pub fn plan(collective: Collective, bytes: u64, t: &Thresholds) -> (RingKernel, u32) {
    let simple = coll_channels(bytes, t.channels, t.coll_chunk);
    let ring = (RingKernel::ring(collective), simple);
    // Every all-reduce combination the plan names exists (RingKernel::ALL).
    let all_reduce = |a, p| RingKernel::new(Collective::AllReduce, a, p).unwrap_or(ring.0);
    // Small all-gathers and reduce-scatters (`bytes`: one rank's block,
    // which each rank sends to every other) take the one-shot LL kernel
    // ([`Thresholds::oneshot_block_max`]), a block per 4 KiB of the rank's
    // block: against a block per 8 KiB, 16-256 KB all-gathers under CUDA
    // graphs took 5.36-6.00 us instead of 6.11-6.33, reduce-scatters
    // 5.43-6.11 instead of 6.50-6.74 (2 processes, 2xH200, two rounds each,
    // 2026-11-30).
    let one_shot = || -> Option<(RingKernel, u32)> {
        let k = RingKernel::new(collective, Algo::OneShot, Proto::LL)?;
        (bytes <= t.oneshot_block_max)
            .then(|| (k, ll_channels(bytes.saturating_mul(2), t.channels)))
    };
    // Past that, blocks within the direct bound take the direct Simple
    // kernels, a channel per 32 KiB of the block as the ring's.
    // (Broadcast and reduce have no direct kernel.)
    let direct = || {
        let k = RingKernel::new(collective, Algo::OneShot, Proto::Simple)?;
        (bytes <= t.direct_max).then_some((k, simple))
    };
    match collective {
        Collective::AllGather | Collective::ReduceScatter => {
            return one_shot().or_else(direct).unwrap_or(ring)
        }
        // A small broadcast's root (a reduce's root) moves (n - 1) x `bytes`
        // as an all-gather's rank does its block: the same bound. The ring
        // took 7.4-10.5 us for 32 B-512 KB broadcasts against NCCL's
        // 6.2-8.2, reduces 7.1-9.0 against 5.9-7.9 (2 processes, 2xH200,
        // eager, 2026-11-30), where one-shot all-gathers took 5.0-6.5.
        Collective::Broadcast | Collective::Reduce => return one_shot().unwrap_or(ring),
        Collective::AllReduce => {}
    }
    // One rank's block of the message (the two-shots' unit).
    let block = bytes.div_ceil(t.nranks.max(1) as u64);
    if bytes <= t.oneshot_net_max {
        (all_reduce(Algo::OneShot, Proto::Simple), simple)
    } else if bytes <= t.ll_max && bytes <= t.oneshot_max {
        // A block per 4 KiB: 512 LL lines, one per thread. With a block
        // per 8 KiB (two lines per thread) 8-64 KB all-reduces took
        // 4.9-5.0 us under CUDA graphs against 4.1-4.3 (2 processes,
        // 2xH200, 2026-11-30; 128 KB 5.09 against 4.60; a block per
        // 2 KiB was no better: 3.97-4.65).
        (
            all_reduce(Algo::OneShot, Proto::LL),
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
            all_reduce(Algo::TwoShot, Proto::LL),
            ll_channels(block.saturating_mul(2), t.channels),
        )
    } else if bytes <= t.ll_max {
        (
            all_reduce(Algo::Ring, Proto::LL),
            ll_channels(bytes, t.channels),
        )
    } else if block <= t.direct_max {
        // A channel per 32 KiB of a rank's block (the kernel splits the
        // block's range among them).
        (
            all_reduce(Algo::TwoShot, Proto::Simple),
            coll_channels(block, t.channels, t.coll_chunk),
        )
    } else {
        ring
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

/// Blocks of `oxccl_scale_*` for `count` elements: a thread per 8, at most
/// 1,024 blocks of [`THREADS`] (a grid-stride loop takes the rest).
pub fn scale_blocks(count: u64) -> u32 {
    count.div_ceil(8 * THREADS as u64).clamp(1, 1024) as u32
}

/// Whether a one-shot LL collective ([`RingKernel::is_one_shot_ll`]) of `count`
/// elements of `elem` bytes (an all-gather's or reduce-scatter's: one
/// rank's block) over `blocks` blocks fits the small kernel:
/// every block's part, in whole 8-byte lines as ring.cu cuts it, within
/// one LL slot of `ll_bytes` (half of it data) and 2 lines per thread of
/// [`THREADS`]. With the default 32 channels that is every one-shot
/// all-reduce size (2 ranks: to 256 KiB, 32 blocks of 8 KiB) and every
/// one-shot copy, reduce-scatter and reduce to 256 KiB per rank (2 ranks
/// take the one-shot LL kernel to 512 KiB: the ring kernel's loop has
/// those); fewer channels (NCCL_MAX_NCHANNELS) leave more to the loop.
pub fn fits_small_one_shot(count: u64, elem: u64, blocks: u32, ll_bytes: u64) -> bool {
    if elem == 0 || elem > 8 || blocks == 0 {
        return false;
    }
    let pack = 8 / elem;
    // Saturating: a count near u64::MAX rounds up past it (and fits nothing).
    let per = count
        .div_ceil(blocks as u64)
        .div_ceil(pack)
        .saturating_mul(pack);
    let slot = (ll_bytes / 2 / elem) / pack * pack;
    per <= slot && per / pack <= 2 * THREADS as u64
}

/// Whether a two-shot LL all-reduce (two-shot over LL) of `count`
/// elements of `elem` bytes among `nranks` ranks over `blocks` blocks fits
/// the small kernel (ring.cu `small_twoshot_ll_run`): as [`fits_small_one_shot`] for one
/// rank's block, `count / nranks` rounded up to whole 8-byte lines as the
/// kernel cuts it. With the default channels that is every two-shot size
/// (512 KiB for 4 ranks: 32 blocks of 4 KiB of each rank block).
pub fn fits_small_two_shot(count: u64, elem: u64, nranks: u32, blocks: u32, ll_bytes: u64) -> bool {
    if elem == 0 || elem > 8 || nranks == 0 {
        return false;
    }
    let pack = 8 / elem;
    let block = count
        .div_ceil(nranks as u64)
        .div_ceil(pack)
        .saturating_mul(pack);
    fits_small_one_shot(block, elem, blocks, ll_bytes)
}

/// Whether a launch of `kernel` (as [`plan`] chose it) runs in the small
/// kernel (`oxccl_small_*`): a one-shot over LL that fits [`fits_small_one_shot`], or a
/// two-shot over LL that fits [`fits_small_two_shot`].
pub fn small_kernel_fits(
    kernel: RingKernel,
    count: u64,
    elem: u64,
    nranks: u32,
    blocks: u32,
) -> bool {
    if kernel.is_one_shot_ll() {
        fits_small_one_shot(count, elem, blocks, LL_SLOT_BYTES)
    } else if (kernel.algorithm(), kernel.protocol()) == (Algo::TwoShot, Proto::LL) {
        fits_small_two_shot(count, elem, nranks, blocks, LL_SLOT_BYTES)
    } else {
        false
    }
}

// ring.cu's small_oneshot_ll_run takes a step's slot with a mask.
const _: () = assert!(LL_NSLOTS.is_power_of_two());

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Algo::{OneShot, Ring, TwoShot};
    use crate::algo::Proto::{Simple, LL};
    use crate::gpu::kernel::Collective::{
        self, AllGather, AllReduce, Broadcast, Reduce, ReduceScatter,
    };

    /// The ring program's kernel of (`c`, `a`, `p`), which the test knows exists.
    fn kern(c: Collective, a: Algo, p: Proto) -> RingKernel {
        RingKernel::new(c, a, p).unwrap()
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
    fn channels_from_the_slowest_hop() {
        use crate::topo::{GpuSite, NvLink, Path};
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
        use crate::topo::{rank_ring, Topology};
        let load = |name: &str| {
            let f = format!(
                "{}/../oxccl-cli/tests/fixtures/{name}/topo.xml",
                env!("CARGO_MANIFEST_DIR")
            );
            let t = Topology::from_xml(&std::fs::read_to_string(&f).unwrap()).unwrap();
            t.gpus().iter().map(|g| g.site()).collect::<Vec<_>>()
        };
        let plan = |sites: &[crate::topo::GpuSite], ranks: &[usize]| {
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
        let gpu = |bus: &str, up: [&str; 3]| crate::topo::GpuSite {
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
                    let (m, blocks) = plan(AllReduce, bytes, &t);
                    if m == kern(AllReduce, OneShot, LL) {
                        assert!(
                            fits_small_one_shot(count, elem, blocks, LL_SLOT_BYTES),
                            "{n} {elem} {bytes}"
                        );
                    }
                }
            }
            // The other one-shot LL modes (bytes: one rank's block), to
            // 256 KiB per rank; 2 ranks' 512 KiB goes to the loop.
            for mode in [AllGather, ReduceScatter, Broadcast, Reduce] {
                for elem in [1u64, 2, 4, 8] {
                    for bytes in [elem, 8, 24, 4096, 4100, 65536, 73720, 174760, 262144] {
                        let (m, blocks) = plan(mode, bytes, &t);
                        assert_eq!(
                            m.is_one_shot_ll(),
                            bytes <= t.oneshot_block_max,
                            "{n} {mode} {bytes}"
                        );
                        if m.is_one_shot_ll() {
                            assert!(
                                fits_small_one_shot(bytes / elem, elem, blocks, LL_SLOT_BYTES),
                                "{n} {mode} {elem} {bytes}"
                            );
                        }
                    }
                }
                let (m, blocks) = plan(mode, 512 << 10, &t);
                if n == 2 {
                    assert!(m.is_one_shot_ll());
                    assert!(!fits_small_one_shot(512 << 10, 1, blocks, LL_SLOT_BYTES));
                }
            }
        }
        assert!(kern(AllReduce, OneShot, LL).is_one_shot_ll());
        assert!(!kern(AllReduce, Ring, LL).is_one_shot_ll());
        assert!(!kern(AllReduce, OneShot, Simple).is_one_shot_ll());
        assert!(!RingKernel::ring(AllGather).is_one_shot_ll());
        // A block's part of exactly one slot (8 KiB of data) fits, a line
        // more does not; 4 channels leave 256 KiB to the ring kernel.
        assert!(fits_small_one_shot(2048, 4, 1, LL_SLOT_BYTES));
        assert!(!fits_small_one_shot(2050, 4, 1, LL_SLOT_BYTES));
        assert!(fits_small_one_shot(65536, 4, 32, LL_SLOT_BYTES));
        assert!(!fits_small_one_shot(65536, 4, 4, LL_SLOT_BYTES));
        // Odd counts round each part up to whole lines, as the kernel does.
        assert!(fits_small_one_shot(4095, 1, 1, LL_SLOT_BYTES));
        assert!(fits_small_one_shot(8191, 1, 1, LL_SLOT_BYTES));
        assert!(!fits_small_one_shot(8193, 1, 1, LL_SLOT_BYTES));
        assert!(!fits_small_one_shot(1, 0, 1, LL_SLOT_BYTES));
        assert!(!fits_small_one_shot(1, 16, 1, LL_SLOT_BYTES));
        assert!(!fits_small_one_shot(1, 4, 0, LL_SLOT_BYTES));
        assert!(fits_small_one_shot(0, 4, 1, LL_SLOT_BYTES));
        // Every two-shot size of 3, 4 and 8 ranks at the default channels,
        // every type size, takes the small kernel.
        for n in [3usize, 4, 8] {
            let cfg = RingConfig::new(false, 4 << 20, None, None, n, Duration::from_secs(1));
            let t = Thresholds::of(&cfg, n, false);
            for elem in [1u64, 2, 4, 8] {
                for bytes in [24u64 << 10, 40 << 10, 65544, 128 << 10, 300000, 512 << 10] {
                    let (m, blocks) = plan(AllReduce, bytes, &t);
                    if m == kern(AllReduce, TwoShot, LL) {
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
        assert!(fits_small_two_shot(8 * 2048, 4, 8, 1, LL_SLOT_BYTES));
        assert!(!fits_small_two_shot(
            8 * 2048 + 8 * 2,
            4,
            8,
            1,
            LL_SLOT_BYTES
        ));
        assert!(!fits_small_two_shot(1, 4, 0, 1, LL_SLOT_BYTES));
        assert!(!small_kernel_fits(kern(AllReduce, Ring, LL), 8, 4, 4, 1));
        assert!(small_kernel_fits(kern(AllReduce, OneShot, LL), 8, 4, 4, 1));
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
            plan(AllReduce, bytes, &Thresholds::of(&cfg, n, cross))
        };
        // One host, 2 ranks: one-shot LL to 256 KiB, ring LL to 1 MiB,
        // then the Simple ring on 32 channels (one per 32 KiB).
        assert_eq!(plan_at(2, false, 8), (kern(AllReduce, OneShot, LL), 1));
        assert_eq!(
            plan_at(2, false, 4 << 10),
            (kern(AllReduce, OneShot, LL), 1)
        );
        assert_eq!(
            plan_at(2, false, (4 << 10) + 1),
            (kern(AllReduce, OneShot, LL), 2)
        );
        assert_eq!(
            plan_at(2, false, 128 << 10),
            (kern(AllReduce, OneShot, LL), 32)
        );
        assert_eq!(
            plan_at(2, false, 256 << 10),
            (kern(AllReduce, OneShot, LL), 32)
        );
        assert_eq!(
            plan_at(2, false, (256 << 10) + 1),
            (kern(AllReduce, Ring, LL), 32)
        );
        assert_eq!(
            plan_at(2, false, (128 << 10) + 1).0,
            kern(AllReduce, OneShot, LL)
        );
        assert_eq!(
            plan_at(2, false, 512 << 10),
            (kern(AllReduce, Ring, LL), 32)
        );
        assert_eq!(plan_at(2, false, 1 << 20), (kern(AllReduce, Ring, LL), 32));
        assert_eq!(
            plan_at(2, false, (1 << 20) + 16),
            (RingKernel::ring(AllReduce), 32)
        );
        assert_eq!(
            plan_at(2, false, 1 << 30),
            (RingKernel::ring(AllReduce), 32)
        );
        // 3 ranks: one-shot to 64 KiB, two-shot LL to 512 KiB, then Simple
        // (a block per 4 KiB of a rank's third).
        assert_eq!(
            plan_at(3, false, 64 << 10),
            (kern(AllReduce, OneShot, LL), 16)
        );
        assert_eq!(
            plan_at(3, false, (64 << 10) + 8),
            (kern(AllReduce, TwoShot, LL), 6)
        );
        assert_eq!(
            plan_at(3, false, 512 << 10),
            (kern(AllReduce, TwoShot, LL), 32)
        );
        assert_eq!(
            plan_at(3, false, (512 << 10) + 16).0,
            kern(AllReduce, TwoShot, Simple)
        );
        // 4 ranks: one-shot to ~42 KiB (each rank writes 3 copies), then
        // two-shot LL to 512 KiB, then the two-shot over Simple slots (a
        // channel per 32 KiB of a rank's quarter) to 4 MiB (1 MiB each).
        assert_eq!(
            plan_at(4, false, 40 << 10),
            (kern(AllReduce, OneShot, LL), 10)
        );
        assert_eq!(
            plan_at(4, false, 48 << 10),
            (kern(AllReduce, TwoShot, LL), 3)
        );
        assert_eq!(
            plan_at(4, false, 512 << 10),
            (kern(AllReduce, TwoShot, LL), 32)
        );
        assert_eq!(
            plan_at(4, false, (512 << 10) + 16),
            (kern(AllReduce, TwoShot, Simple), 5)
        );
        assert_eq!(
            plan_at(4, false, 4 << 20),
            (kern(AllReduce, TwoShot, Simple), 32)
        );
        assert_eq!(
            plan_at(4, false, (4 << 20) + 16),
            (RingKernel::ring(AllReduce), 32)
        );
        // 8 ranks: 32 channels (not 16), one-shot to ~18 KiB,
        // two-shot LL to 512 KiB.
        assert_eq!(
            plan_at(8, false, 16 << 10),
            (kern(AllReduce, OneShot, LL), 4)
        );
        assert_eq!(
            plan_at(8, false, 32 << 10),
            (kern(AllReduce, TwoShot, LL), 1)
        );
        assert_eq!(
            plan_at(8, false, 512 << 10),
            (kern(AllReduce, TwoShot, LL), 16)
        );
        assert_eq!(
            plan_at(8, false, (512 << 10) + 16),
            (kern(AllReduce, TwoShot, Simple), 3)
        );
        assert_eq!(
            plan_at(8, false, 8 << 20),
            (kern(AllReduce, TwoShot, Simple), 32)
        );
        assert_eq!(
            plan_at(8, false, (8 << 20) + 16),
            (RingKernel::ring(AllReduce), 32)
        );
        assert_eq!(
            plan_at(8, false, 1 << 30),
            (RingKernel::ring(AllReduce), 32)
        );
        // 9 ranks: neither one-shot nor two-shot kernel.
        assert_eq!(plan_at(9, false, 8), (kern(AllReduce, Ring, LL), 1));
        assert_eq!(plan_at(9, false, 64 << 10), (kern(AllReduce, Ring, LL), 8));
        assert_eq!(
            plan_at(9, false, 1 << 20),
            (RingKernel::ring(AllReduce), 16)
        );
        // The direct kernels off (OXCCL_CUDA_DIRECT_MAX=0): the Simple ring
        // past LL.
        let mut nod = RingConfig::new(false, 4 << 20, None, None, 4, Duration::from_secs(1));
        nod.direct_max = 0;
        let t4 = Thresholds::of(&nod, 4, false);
        assert_eq!(
            plan(AllReduce, 1 << 20, &t4),
            (RingKernel::ring(AllReduce), 32)
        );
        assert_eq!(
            plan(AllGather, 1 << 20, &t4),
            (RingKernel::ring(AllGather), 32)
        );
        assert_eq!(
            plan(ReduceScatter, 1 << 20, &t4),
            (RingKernel::ring(ReduceScatter), 32)
        );
        // Two-shot off (OXCCL_CUDA_TWOSHOT_MAX=0, NCCL_ALGO without
        // TwoShot): the LL ring between the one-shot and LL's bounds.
        let mut no2 = RingConfig::new(false, 4 << 20, None, None, 8, Duration::from_secs(1));
        no2.twoshot_max = 0;
        let t8 = Thresholds::of(&no2, 8, false);
        assert_eq!(
            plan(AllReduce, 32 << 10, &t8),
            (kern(AllReduce, Ring, LL), 4)
        );
        // LL at every size (NCCL_PROTO=LL): two-shot to its own bound only.
        let mut ll = RingConfig::new(false, 4 << 20, None, None, 4, Duration::from_secs(1));
        ll.ll_max = u64::MAX;
        let t4 = Thresholds::of(&ll, 4, false);
        assert_eq!(
            plan(AllReduce, 1 << 20, &t4),
            (kern(AllReduce, Ring, LL), 32)
        );
        ll.twoshot_max = u64::MAX;
        let t4 = Thresholds::of(&ll, 4, false);
        assert_eq!(
            plan(AllReduce, 1 << 20, &t4),
            (kern(AllReduce, TwoShot, LL), 32)
        );
        // The two-shot's bound above LL's (OXCCL_CUDA_TWOSHOT_MAX=4M alone):
        // the two-shot to it, then the Simple kernels (the two-shot over
        // Simple slots to 8 MiB); NCCL_PROTO without LL turns it off (it
        // is an LL kernel).
        let mut wide = RingConfig::new(false, 4 << 20, None, None, 8, Duration::from_secs(1));
        wide.twoshot_max = 4 << 20;
        let t8 = Thresholds::of(&wide, 8, false);
        assert_eq!(
            plan(AllReduce, 16 << 10, &t8),
            (kern(AllReduce, OneShot, LL), 4)
        );
        assert_eq!(
            plan(AllReduce, 4 << 20, &t8),
            (kern(AllReduce, TwoShot, LL), 32)
        );
        assert_eq!(
            plan(AllReduce, (4 << 20) + 16, &t8),
            (kern(AllReduce, TwoShot, Simple), 17)
        );
        wide.ll_max = 0;
        let t8 = Thresholds::of(&wide, 8, false);
        assert_eq!(t8.twoshot_max, 0);
        assert_eq!(
            plan(AllReduce, 1 << 20, &t8),
            (kern(AllReduce, TwoShot, Simple), 4)
        );
        // Not for 2 ranks even when asked (the one-shot serves them).
        let mut two = RingConfig::new(false, 4 << 20, None, None, 2, Duration::from_secs(1));
        two.twoshot_max = u64::MAX;
        assert_eq!(
            plan(AllReduce, 512 << 10, &Thresholds::of(&two, 2, false)),
            (kern(AllReduce, Ring, LL), 32)
        );
        // Across hosts: no LL; 2 ranks one-shot Simple at every size, 8
        // ranks up to 256 KiB / 7, then the ring.
        assert_eq!(plan_at(2, true, 8), (kern(AllReduce, OneShot, Simple), 1));
        assert_eq!(
            plan_at(2, true, 1 << 30),
            (kern(AllReduce, OneShot, Simple), 32)
        );
        assert_eq!(
            plan_at(8, true, 32 << 10),
            (kern(AllReduce, OneShot, Simple), 1)
        );
        assert_eq!(plan_at(8, true, 64 << 10), (RingKernel::ring(AllReduce), 1));
        assert_eq!(plan_at(9, true, 8), (RingKernel::ring(AllReduce), 1));
        // Small all-gathers and reduce-scatters (bytes: one rank's block)
        // take the one-shot LL kernel while (n - 1) blocks fit LL's 512 KiB;
        // larger ones, and every one across hosts, the Simple ring.
        let cfg = RingConfig::new(false, 4 << 20, None, None, 8, Duration::from_secs(1));
        let t = Thresholds::of(&cfg, 8, false);
        // 8 ranks: blocks to 512 KiB / 7 (~73 KiB).
        assert_eq!(plan(AllGather, 8, &t), (kern(AllGather, OneShot, LL), 1));
        assert_eq!(
            plan(ReduceScatter, 64 << 10, &t),
            (kern(ReduceScatter, OneShot, LL), 16)
        );
        // Past that, to 1 MiB blocks, the one-shot over Simple slots (a
        // channel per 32 KiB of the block, 32 at most), then the ring.
        assert_eq!(
            plan(AllGather, 80 << 10, &t),
            (kern(AllGather, OneShot, Simple), 3)
        );
        assert_eq!(
            plan(ReduceScatter, 1 << 20, &t),
            (kern(ReduceScatter, OneShot, Simple), 32)
        );
        assert_eq!(
            plan(AllGather, (1 << 20) + 1, &t),
            (RingKernel::ring(AllGather), 32)
        );
        // 2 ranks: blocks to 512 KiB.
        let two = RingConfig::new(false, 4 << 20, None, None, 2, Duration::from_secs(1));
        let t2 = Thresholds::of(&two, 2, false);
        assert_eq!(
            plan(AllGather, 512 << 10, &t2),
            (kern(AllGather, OneShot, LL), 32)
        );
        // (never the direct kernels: the ring of 2 is one step each way)
        assert_eq!(
            plan(AllGather, (512 << 10) + 1, &t2),
            (RingKernel::ring(AllGather), 17)
        );
        assert_eq!(t2.direct_max, 0);
        // One-shot kernels off (OXCCL_CUDA_ONESHOT_MAX=0, NCCL_ALGO): the ring.
        let mut off = two.clone();
        off.oneshot_max = 0;
        let t2o = Thresholds::of(&off, 2, false);
        assert_eq!(
            plan(ReduceScatter, 8, &t2o),
            (RingKernel::ring(ReduceScatter), 1)
        );
        let t2x = Thresholds::of(&two, 2, true);
        assert_eq!(plan(AllGather, 8, &t2x), (RingKernel::ring(AllGather), 1));
        assert_eq!(
            plan(ReduceScatter, 8, &t2x),
            (RingKernel::ring(ReduceScatter), 1)
        );
        // Broadcasts and reduces: the same bound on the whole buffer (the
        // root sends, or receives, n - 1 copies of it).
        assert_eq!(plan(Broadcast, 8, &t), (kern(Broadcast, OneShot, LL), 1));
        assert_eq!(plan(Reduce, 64 << 10, &t), (kern(Reduce, OneShot, LL), 16));
        assert_eq!(
            plan(Broadcast, 80 << 10, &t),
            (RingKernel::ring(Broadcast), 3)
        );
        assert_eq!(
            plan(Reduce, 512 << 10, &t2),
            (kern(Reduce, OneShot, LL), 32)
        );
        assert_eq!(
            plan(Broadcast, (512 << 10) + 1, &t2),
            (RingKernel::ring(Broadcast), 17)
        );
        assert_eq!(plan(Broadcast, 8, &t2o), (RingKernel::ring(Broadcast), 1));
        assert_eq!(plan(Reduce, 8, &t2x), (RingKernel::ring(Reduce), 1));
        // The other collectives keep their mode, one block per 32 KiB
        // within a host, 64 KiB across hosts.
        assert_eq!(
            plan(ReduceScatter, 1 << 30, &t),
            (RingKernel::ring(ReduceScatter), 32)
        );
        assert_eq!(
            plan(ReduceScatter, 1 << 20, &t2),
            (RingKernel::ring(ReduceScatter), 32)
        );
        assert_eq!(
            plan(ReduceScatter, 1 << 20, &t2x),
            (RingKernel::ring(ReduceScatter), 16)
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

    /// Counts whose rounding up to whole lines passes u64::MAX fit no
    /// small kernel (they overflowed before; the property test over every
    /// plan found it with 1-byte elements).
    #[test]
    fn huge_counts_fit_no_small_kernel() {
        for elem in [1, 2, 4, 8] {
            for blocks in [1, 2, 32] {
                assert!(!fits_small_one_shot(u64::MAX, elem, blocks, LL_SLOT_BYTES));
                assert!(!fits_small_two_shot(
                    u64::MAX,
                    elem,
                    1,
                    blocks,
                    LL_SLOT_BYTES
                ));
                assert!(!fits_small_two_shot(
                    u64::MAX - 3,
                    elem,
                    3,
                    blocks,
                    LL_SLOT_BYTES
                ));
            }
        }
    }
}
