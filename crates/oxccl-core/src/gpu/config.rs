//! What a device communicator reads from the parameters, once, when it is
//! created: the ring program's settings ([`RingConfig::from_params`],
//! `NCCL_ALGO` / `NCCL_PROTO` taken from the same parsed selections the
//! host path uses) and the executor's other settings ([`DeviceConfig`]).
//! A communicator keeps its copy: nothing is read again during a call, and
//! two communicators of one process may hold different values.

use std::time::Duration;

use super::ring::{default_ll_max, RingConfig};
use crate::algo::{Algo, Proto, Selection};
use crate::params::{self, Params};
use crate::types::CollKind;

/// Transfers of at least this many bytes (the largest of a call) take the
/// copy engines by default when both GPUs pull; twice as many when only one
/// does (a broadcast, a one-way send). Measured on 2×H200, `-g 2`, copy
/// engine against copy kernel (docs/performance-gpu.md, "Large: copy engines, 2 processes"):
/// both ways, the kernel's reads share the links and drop to ~290–330 GB/s
/// each, so a 64 MiB send/receive took 203.5 µs against 210.1 and an
/// all-gather of 64 MiB per rank 207.6 against 240.0 (32 MiB: even); one
/// way the kernel reads at ~345 GB/s, so a 64 MiB broadcast took 206.0
/// against 194.4 and the engine is even at 128 MiB and ahead from 256 MiB
/// (715.3 against 738.1). The engine's ~35 µs start makes the difference.
pub const DEFAULT_CE_MIN: u64 = 64 << 20;

/// All-reduces of at least this many bytes take the copy engines by
/// default. From an A/B on 2×H200 (`scripts/perf-gpu.sh ce_ar`, 2026-11-30): a
/// fit of the copy-engine times (1 GiB 3,015 µs, 4 GiB 11,785) is ~89 µs +
/// S / 367 GB/s, against the SM kernel's S / 337 (256 MiB 810 µs, 512 MiB
/// 1,607): the copy engines lose at 256 MiB (843 against 810) and win from
/// ~512 MiB (~1,552 against 1,607).
pub const DEFAULT_CE_AR_MIN: u64 = 512 << 20;

/// Most bytes per pushed piece by default (`OXCCL_CUDA_CE_PUSH`; a part
/// takes a quarter of itself per piece when that is less, at least 16 MiB).
/// 2 processes, 2×H200, 2026-11-30, two rounds, GB/s bus bandwidth at 1 / 2
/// / 4 GiB, out of place: all-reduce 364–368 / 374–375 / 379 pushed against
/// 350–356 / 363 / 366 pulled (NCCL 328 / 339 / 345); reduce-scatter 352 /
/// 360–362 / 369–370 against 332 / 340 / 345–346 (NCCL 274 / 285 / 292).
/// 32 MiB pieces lost 1–2% from 1 GiB (a piece costs ~20 µs of copy-stream
/// work besides its copy), 16 MiB 3–5%.
pub const DEFAULT_CE_PUSH_PIECE: u64 = 64 << 20;

/// Most blocks of a two-GPU pair kernel launch ([`super::pair::MAX_BLOCKS`]).
pub use super::pair::MAX_BLOCKS as PAIR_MAX_BLOCKS;

/// The executor's settings of a device communicator, read once from the
/// parameters when it is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// One-shot and two-shot LL collectives that fit take the small kernel
    /// (`OXCCL_CUDA_LL1_FAST`, [`super::ring::small_kernel_fits`]).
    pub small_kernel: bool,
    /// Calls of every local rank up to this many bytes per rank run as one
    /// launch (`OXCCL_CUDA_JOINT_MAX`; 0: never).
    pub one_launch_max: u64,
    /// ... also where those ranks are on several GPUs (`OXCCL_CUDA_JOINT_PEERS`).
    pub one_launch_peers: bool,
    /// Most blocks of a pair kernel launch (`OXCCL_CUDA_AR_BLOCKS`,
    /// 1..=[`PAIR_MAX_BLOCKS`]).
    pub pair_blocks: u32,
    /// Out-of-place pair all-reduces of at least this many elements take the
    /// two-shot kernel too (`OXCCL_CUDA_AR_TWO_SHOT`; 0: never, 1: always).
    pub pair_two_shot_min: u64,
    /// Copies of at least this many bytes take the copy engines
    /// (`OXCCL_CUDA_CE_MIN`, [`DEFAULT_CE_MIN`] when unset; 0: never).
    pub ce_min: u64,
    /// `OXCCL_CUDA_CE_AR_MIN` when set (unset: [`DEFAULT_CE_AR_MIN`] in one
    /// process, the two-process path's own defaults between processes).
    pub ce_ar_min_set: Option<u64>,
    /// Most bytes of a pushed piece (`OXCCL_CUDA_CE_PUSH`,
    /// [`DEFAULT_CE_PUSH_PIECE`] when unset; 0: reductions pull).
    pub ce_push: u64,
    /// Copy streams of pushed pieces (`OXCCL_CUDA_CE_PUSH_STREAMS`, 1 or 2).
    pub ce_push_streams: u64,
    /// In-place reductions between two processes push their pieces
    /// (`OXCCL_CUDA_CE_PUSH_IN_PLACE`).
    pub ce_push_in_place: bool,
}

impl DeviceConfig {
    /// The settings `p` holds.
    pub fn from_params(p: &Params) -> DeviceConfig {
        DeviceConfig {
            small_kernel: p.get(&params::CUDA_LL1_FAST),
            one_launch_max: p.get(&params::CUDA_JOINT_MAX),
            one_launch_peers: p.get(&params::CUDA_JOINT_PEERS),
            pair_blocks: p
                .get(&params::CUDA_AR_BLOCKS)
                .map(|v| v.clamp(1, PAIR_MAX_BLOCKS))
                .unwrap_or(PAIR_MAX_BLOCKS),
            pair_two_shot_min: p.get(&params::CUDA_AR_TWO_SHOT).unwrap_or(0),
            ce_min: p.get(&params::CUDA_CE_MIN).unwrap_or(DEFAULT_CE_MIN),
            ce_ar_min_set: p.get(&params::CUDA_CE_AR_MIN),
            ce_push: p
                .get(&params::CUDA_CE_PUSH)
                .unwrap_or(DEFAULT_CE_PUSH_PIECE),
            ce_push_streams: p.get(&params::CUDA_CE_PUSH_STREAMS).clamp(1, 2),
            ce_push_in_place: p.get(&params::CUDA_CE_PUSH_IN_PLACE),
        }
    }

    /// All-reduces of at least this many bytes take the copy engines in one
    /// process (0: never).
    pub fn ce_ar_min(&self) -> u64 {
        self.ce_ar_min_set.unwrap_or(DEFAULT_CE_AR_MIN)
    }

    /// Whether an out-of-place pair all-reduce of `count` elements takes
    /// the two-shot kernel (in place always does).
    pub fn pair_two_shot(&self, count: u64) -> bool {
        self.pair_two_shot_min != 0 && count >= self.pair_two_shot_min
    }
}

impl Default for DeviceConfig {
    /// The settings with no parameter set.
    fn default() -> DeviceConfig {
        DeviceConfig::from_params(&Params::default())
    }
}

/// `OXCCL_RING_ORDER`'s text as ranks; an item that is not a number
/// becomes `u32::MAX` (shown as `?`), which the ring's setup then refuses
/// on every rank alike.
pub fn parse_ring_order(text: &str) -> Vec<u32> {
    text.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().unwrap_or(u32::MAX))
        .collect()
}

impl RingConfig {
    /// The ring settings of a communicator of `nranks` ranks from `p`,
    /// `timeout` (else `OXCCL_TIMEOUT_MS`), and the algorithms and protocols
    /// that `NCCL_ALGO` / `NCCL_PROTO` allow as `p` parsed them.
    pub fn from_params(p: &Params, nranks: usize, timeout: Option<Duration>) -> RingConfig {
        let algos = p.get(&params::ALGO).unwrap_or_default();
        let protos = p.get(&params::PROTO).unwrap_or_default();
        RingConfig::from_selections(p, &algos, &protos, nranks, timeout)
    }

    /// [`RingConfig::from_params`] with `NCCL_ALGO` / `NCCL_PROTO` already
    /// parsed (the host path's configuration holds them): the GPU and host
    /// paths then decide from the same values.
    pub fn from_selections(
        p: &Params,
        algos: &Selection<Algo>,
        protos: &Selection<Proto>,
        nranks: usize,
        timeout: Option<Duration>,
    ) -> RingConfig {
        let mut cfg = RingConfig::new(
            p.get(&params::P2P_DISABLE),
            p.get(&params::BUFFSIZE),
            p.get(&params::MIN_NCHANNELS),
            p.get(&params::MAX_NCHANNELS),
            nranks,
            timeout.unwrap_or_else(|| p.get(&params::TIMEOUT_MS)),
        );
        if let Some(o) = p.get(&params::RING_ORDER) {
            cfg.ring_order = parse_ring_order(&o);
        }
        cfg.select(algos, protos, nranks);
        // OXCCL_CUDA_LL_MAX moves LL's bound where NCCL_PROTO allows LL.
        if let Some(b) = p.get(&params::CUDA_LL_MAX) {
            if cfg.ll_max != 0 {
                cfg.ll_max = b;
            }
        }
        if let Some(b) = p.get(&params::CUDA_ONESHOT_MAX) {
            cfg.oneshot_max = b;
            cfg.oneshot_net_max = b;
        }
        if let Some(b) = p.get(&params::CUDA_TWOSHOT_MAX) {
            cfg.twoshot_max = b;
        }
        if let Some(b) = p.get(&params::CUDA_DIRECT_MAX) {
            cfg.direct_max = b;
        }
        if let Some(t) = p.get(&params::P2P_LL_THRESHOLD) {
            cfg.p2p_ll_max = t.max(0) as u64;
        }
        cfg.force |= p.get(&params::CUDA_RING);
        cfg.gdr = super::gdr::GdrSettings {
            level: p.get(&params::NET_GDR_LEVEL),
            read: p.get(&params::NET_GDR_READ),
            dmabuf: p.get(&params::DMABUF_ENABLE),
            force_flush: p.get(&params::NET_FORCE_FLUSH),
        };
        cfg.ib_hca = p.get(&params::IB_HCA);
        cfg.cross_nic = p.get(&params::CROSS_NIC);
        // The GPU network path's connections per peer, NCCL's way: threads x
        // sockets per thread (each connection here has its own two threads).
        // Neither set: 0, the ring picks by the number of peers on other
        // hosts (auto_net_streams).
        let (nthreads, nsocks) = (
            p.get(&params::SOCKET_NTHREADS),
            p.get(&params::NSOCKS_PERTHREAD),
        );
        cfg.net_streams = if nthreads.is_none() && nsocks.is_none() {
            0
        } else {
            let (t, s) = (nthreads.unwrap_or(1).max(1), nsocks.unwrap_or(1).max(1));
            t.saturating_mul(s).clamp(1, 16)
        };
        cfg
    }

    /// Applies what `algos` and `protos` (`NCCL_ALGO`, `NCCL_PROTO`) allow
    /// all-reduces: without LL (or LL128) they stay on Simple, without
    /// Simple they take LL at every size; without OneShot and TwoShot every
    /// operation with peers takes the ring (also where two GPUs of one
    /// process could take the pair kernels), without one of them that
    /// kernel is never taken. Selections that allow everything change
    /// nothing.
    pub fn select(&mut self, algos: &Selection<Algo>, protos: &Selection<Proto>, nranks: usize) {
        let ar = CollKind::AllReduce;
        let ll = protos.allows(ar, Proto::LL) || protos.allows(ar, Proto::LL128);
        self.ll_max = match (ll, protos.allows(ar, Proto::Simple)) {
            (false, _) => 0,
            (true, false) => u64::MAX,
            (true, true) => default_ll_max(nranks),
        };
        self.force = !(algos.allows(ar, Algo::OneShot) || algos.allows(ar, Algo::TwoShot));
        if !algos.allows(ar, Algo::OneShot) {
            self.oneshot_max = 0;
            self.oneshot_net_max = 0;
        }
        if !algos.allows(ar, Algo::TwoShot) {
            self.twoshot_max = 0;
        }
        if self.force {
            self.direct_max = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(env: &[(&str, &str)]) -> Params {
        Params::from_pairs(env)
    }

    #[test]
    fn device_defaults_and_settings() {
        let d = DeviceConfig::default();
        assert_eq!(
            d,
            DeviceConfig {
                small_kernel: true,
                one_launch_max: 256 << 10,
                one_launch_peers: false,
                pair_blocks: 128,
                pair_two_shot_min: 0,
                ce_min: DEFAULT_CE_MIN,
                ce_ar_min_set: None,
                ce_push: DEFAULT_CE_PUSH_PIECE,
                ce_push_streams: 1,
                ce_push_in_place: false,
            }
        );
        assert_eq!(d.ce_ar_min(), DEFAULT_CE_AR_MIN);
        assert!(!d.pair_two_shot(u64::MAX));
        let d = DeviceConfig::from_params(&params(&[
            ("OXCCL_CUDA_LL1_FAST", "0"),
            ("OXCCL_CUDA_JOINT_MAX", "0"),
            ("OXCCL_CUDA_JOINT_PEERS", "1"),
            ("OXCCL_CUDA_AR_BLOCKS", "500"),
            ("OXCCL_CUDA_AR_TWO_SHOT", "1000"),
            ("OXCCL_CUDA_CE_MIN", "0"),
            ("OXCCL_CUDA_CE_AR_MIN", "1M"),
            ("OXCCL_CUDA_CE_PUSH", "16M"),
            ("OXCCL_CUDA_CE_PUSH_STREAMS", "7"),
            ("OXCCL_CUDA_CE_PUSH_IN_PLACE", "1"),
        ]));
        assert!(!d.small_kernel && d.one_launch_peers && d.ce_push_in_place);
        assert_eq!((d.one_launch_max, d.ce_min), (0, 0));
        assert_eq!(d.pair_blocks, PAIR_MAX_BLOCKS);
        assert_eq!((d.ce_ar_min_set, d.ce_ar_min()), (Some(1 << 20), 1 << 20));
        assert_eq!((d.ce_push, d.ce_push_streams), (16 << 20, 2));
        assert!(!d.pair_two_shot(999) && d.pair_two_shot(1000));
        let d = DeviceConfig::from_params(&params(&[
            ("OXCCL_CUDA_AR_BLOCKS", "0"),
            ("OXCCL_CUDA_CE_PUSH_STREAMS", "0"),
            ("OXCCL_CUDA_AR_TWO_SHOT", "1"),
        ]));
        assert_eq!((d.pair_blocks, d.ce_push_streams), (1, 1));
        assert!(!d.pair_two_shot(0) && d.pair_two_shot(1));
    }

    #[test]
    fn ring_config_from_the_parameters() {
        let t = Some(Duration::from_secs(3));
        // Nothing set: RingConfig::new's defaults.
        let d = RingConfig::from_params(&params(&[]), 4, t);
        let n = RingConfig::new(false, 4 << 20, None, None, 4, Duration::from_secs(3));
        assert_eq!(format!("{d:?}"), format!("{n:?}"));
        // NCCL_PROTO without LL: no LL; LL only: LL at every size, and
        // OXCCL_CUDA_LL_MAX moves only a bound LL has.
        let c = RingConfig::from_params(
            &params(&[("NCCL_PROTO", "Simple"), ("OXCCL_CUDA_LL_MAX", "4M")]),
            2,
            t,
        );
        assert_eq!(c.ll_max, 0);
        let c = RingConfig::from_params(&params(&[("NCCL_PROTO", "LL")]), 2, t);
        assert_eq!(c.ll_max, u64::MAX);
        let c = RingConfig::from_params(&params(&[("NCCL_PROTO", "LL128,Simple")]), 2, t);
        assert_eq!(c.ll_max, 1 << 20);
        let c = RingConfig::from_params(&params(&[("OXCCL_CUDA_LL_MAX", "4M")]), 2, t);
        assert_eq!(c.ll_max, 4 << 20);
        // NCCL_ALGO=Ring: the ring for everything, no one-shot, two-shot or
        // direct kernels; without TwoShot only that one goes.
        let c = RingConfig::from_params(&params(&[("NCCL_ALGO", "Ring")]), 4, t);
        assert!(c.force);
        assert_eq!(
            (
                c.oneshot_max,
                c.oneshot_net_max,
                c.twoshot_max,
                c.direct_max
            ),
            (0, 0, 0, 0)
        );
        let c = RingConfig::from_params(&params(&[("NCCL_ALGO", "^TwoShot")]), 4, t);
        assert!(!c.force);
        assert_eq!(c.twoshot_max, 0);
        assert_eq!(c.oneshot_max, n.oneshot_max);
        assert_eq!(c.direct_max, n.direct_max);
        // NCCL_ALGO for another collective only: all-reduces keep everything.
        let c = RingConfig::from_params(&params(&[("NCCL_ALGO", "broadcast:ring")]), 4, t);
        assert!(!c.force && c.oneshot_max == n.oneshot_max);
        // The per-kernel bounds and the rest.
        let c = RingConfig::from_params(
            &params(&[
                ("OXCCL_CUDA_ONESHOT_MAX", "1K"),
                ("OXCCL_CUDA_TWOSHOT_MAX", "2K"),
                ("OXCCL_CUDA_DIRECT_MAX", "3K"),
                ("NCCL_P2P_LL_THRESHOLD", "-5"),
                ("OXCCL_CUDA_RING", "1"),
                ("OXCCL_RING_ORDER", "1, 0,x"),
                ("NCCL_SOCKET_NTHREADS", "4"),
            ]),
            2,
            None,
        );
        assert_eq!((c.oneshot_max, c.oneshot_net_max), (1024, 1024));
        assert_eq!((c.twoshot_max, c.direct_max, c.p2p_ll_max), (2048, 3072, 0));
        assert!(c.force);
        assert_eq!(c.ring_order, [1, 0, u32::MAX]);
        assert_eq!(c.net_streams, 4);
        assert_eq!(c.timeout, Duration::from_millis(600_000));
        let c = RingConfig::from_params(
            &params(&[
                ("NCCL_SOCKET_NTHREADS", "8"),
                ("NCCL_NSOCKS_PERTHREAD", "8"),
            ]),
            2,
            t,
        );
        assert_eq!(c.net_streams, 16);
        let c = RingConfig::from_params(&params(&[("NCCL_NSOCKS_PERTHREAD", "0")]), 2, t);
        assert_eq!(c.net_streams, 1);
        // Selections parsed elsewhere win over the text in `p`.
        let p = params(&[("NCCL_PROTO", "LL")]);
        let simple = Selection::<Proto>::parse("Simple").unwrap();
        let c = RingConfig::from_selections(&p, &Selection::default(), &simple, 2, t);
        assert_eq!(c.ll_max, 0);
    }

    #[test]
    fn ring_order_text() {
        assert_eq!(parse_ring_order(""), Vec::<u32>::new());
        assert_eq!(parse_ring_order(" 3 ,1,,2 "), [3, 1, 2]);
        assert_eq!(parse_ring_order("0,-1"), [0, u32::MAX]);
    }
}
