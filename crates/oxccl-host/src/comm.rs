//! A host communicator: transports to its peers, chosen by where the peer
//! is, and the execution of operations and groups over them. Peers are
//! connected at creation only where the bounded collectives need them; the
//! others on first use (see `connect.rs`).
//!
//! Transport per pair (symmetric, so both ends agree without talking):
//! same process → in-process rings (unless `NCCL_P2P_DISABLE`); same host →
//! shared-memory rings (unless `NCCL_SHM_DISABLE`); otherwise TCP, or a
//! network plugin's connections when `NCCL_NET_PLUGIN` (or `libnccl-net.so`)
//! gives one (see `oxccl_net::choose`).

mod eager;

use crate::connect::{connect_peers, install, Connecting, Connector};
use crate::exec::{drive, OpLabel, RankOf, SlotTask, Streams, Task, WaitPolicy, Work, SLOT_STREAM};
use crate::oneshot::{self, Progress, ShmOneShot, SlotCall};
use crate::proxy_events::ProxyTrack;
use crate::transport::net::slot_bytes;
use crate::transport::{LinkKind, PeerControl, RecvHalf, SendHalf, ShmRingLayout, ShmSegment};
pub use eager::EAGER_MAX_BYTES;
use oxccl_bootstrap::Bootstrap;
use oxccl_core::algo::{Algo, Choice, Proto, Selection};
use oxccl_core::engine::{Buffers, Engine, Header, StreamSeqs};
use oxccl_core::profiler_plugin::{self as prof_names, SeqNumbers};
use oxccl_core::schedule::{build, Request, Shape, Shaped};
use oxccl_core::tuner::{choose, LinkModel, Plan, TuneInput};
use oxccl_core::tuner_plugin::{self, Verdict};
use oxccl_core::{byte_len, CollKind, DataType, Error, ErrorKind, RedOp, Reduction, Result};
use oxccl_env::Subsys;
use oxccl_net::profiler_group::GroupEvents;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// Settings of a host communicator (resolved from the parameter registry by the caller).
#[derive(Debug, Clone)]
pub struct HostConfig {
    pub shm_disable: bool,
    pub p2p_disable: bool,
    pub algos: Selection<Algo>,
    pub protos: Selection<Proto>,
    /// Bytes of each stream's ring (shared memory, in-process) or socket buffer (TCP).
    pub capacity: usize,
    pub min_channels: Option<usize>,
    pub max_channels: Option<usize>,
    /// Channels for collectives (OXCCL_HOST_NCHANNELS); default by transport.
    pub nchannels: Option<usize>,
    pub timeout: Duration,
    /// How long a TCP connection may go unanswered before it counts as
    /// broken (`OXCCL_LINK_TIMEOUT_MS`); `None`: `timeout`.
    pub link_timeout: Option<Duration>,
    pub spin: Duration,
    /// How peers reached over the network are reached: `NCCL_NET_PLUGIN`,
    /// `NCCL_NET`, `NCCL_IB_DISABLE`, `NCCL_IB_HCA`.
    pub net: oxccl_net::NetSettings,
    /// `NCCL_TUNER_PLUGIN` (unset: `libnccl-tuner.so` when there is one).
    pub tuner_plugin: Option<String>,
    /// `NCCL_PROFILER_PLUGIN` (unset: `libnccl-profiler.so` when there is one).
    pub profiler_plugin: Option<String>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            shm_disable: false,
            p2p_disable: false,
            algos: Selection::all(),
            protos: Selection::all(),
            capacity: 1 << 20,
            min_channels: None,
            max_channels: None,
            nchannels: None,
            timeout: Duration::from_secs(600),
            link_timeout: None,
            spin: Duration::from_micros(2000),
            net: oxccl_net::NetSettings::default(),
            tuner_plugin: None,
            profiler_plugin: None,
        }
    }
}

/// Channels per peer as `(collective, point-to-point)`: two for collectives on
/// rings (enough for the double tree), four on TCP (several sockets per peer
/// carry more than one); p2p gets its own so that sends and receives never
/// share a stream with collectives. `any_tcp`: some pair of the communicator
/// talks over TCP. (Also used by `oxccl doctor` to size /dev/shm.)
pub fn host_channels(cfg: &HostConfig, any_tcp: bool) -> (usize, usize) {
    let coll = cfg
        .nchannels
        .or(cfg.max_channels)
        .unwrap_or(if any_tcp { 4 } else { 2 })
        .clamp(1, 32);
    (coll, if any_tcp { 2 } else { 1 })
}

/// Data bytes of each stream's ring: the configured size, a multiple of 8, at least 256.
pub fn ring_capacity(cfg: &HostConfig) -> usize {
    cfg.capacity.max(256) & !7
}

/// One operation as the C ABI and the Rust API hand it over: raw buffers.
#[derive(Debug, Clone, Copy)]
pub struct OpDesc {
    pub kind: CollKind,
    pub send: *const u8,
    pub recv: *mut u8,
    /// Elements, as NCCL counts them for `kind`.
    pub count: usize,
    pub dtype: DataType,
    pub op: RedOp,
    /// Root (broadcast, reduce, gather, scatter) or peer (send, recv).
    pub root: usize,
}

/// A host communicator.
pub struct HostComm {
    rank: usize,
    nranks: usize,
    bootstrap: Bootstrap,
    tx: Vec<Vec<Box<dyn SendHalf>>>,
    rx: Vec<Vec<Box<dyn RecvHalf>>>,
    controls: Vec<Option<PeerControl>>,
    kinds: Vec<Option<LinkKind>>,
    seqs: StreamSeqs,
    /// oxccl's own plan for the last (collective, bytes) planned: loops
    /// repeat their sizes, and planning cost ~1,300 of a generic call's
    /// ~7,800 instructions (callgrind).
    last_plan: Option<(CollKind, usize, Plan)>,
    coll_channels: usize,
    p2p_channels: usize,
    link: LinkModel,
    cfg: HostConfig,
    abort: Arc<AtomicBool>,
    failed: Option<Error>,
    /// How peers not connected yet are connected on first use.
    connector: Connector,
    /// Small collectives' one-shot slots, when every rank is another process
    /// of this host (at most ONE_SHOT_MAX_RANKS of them).
    oneshot: Option<ShmOneShot>,
    /// The network plugin (and its device) chosen for peers on other hosts,
    /// if one was: other layers (the GPU network path) use the same.
    net_plugin: Option<(std::sync::Arc<dyn oxccl_net::Net>, usize)>,
    /// The tuner plugin's context for this communicator, when one loaded
    /// and its init succeeded: it gets the last word on each plan.
    tuner: Option<std::sync::Arc<std::sync::Mutex<oxccl_net::tuner::TunerComm>>>,
    /// The profiler plugin's context for this communicator, when one loaded
    /// and its init succeeded, with the collectives' sequence numbers.
    profiler: Option<(oxccl_net::profiler::ProfilerComm, SeqNumbers)>,
}

/// After a failed init: unlinks what every rank of this host (this one
/// included) left in /dev/shm for this communicator (`hint` is in the names).
/// Safe for live peers too: a failure before the final barrier keeps every
/// rank from passing it, and after it every segment is mapped.
fn remove_local_segments(bootstrap: &Bootstrap, hint: &str) {
    for (q, p) in bootstrap.peers().iter().enumerate() {
        if q == bootstrap.rank() || bootstrap.is_same_host(q) {
            for name in crate::transport::shm::unlink_segments_of(p.pid, hint) {
                oxccl_env::info!(
                    Subsys::INIT | Subsys::SHM,
                    "removed shared-memory segment {name} of rank {q} (pid {}) after the failed init",
                    p.pid
                );
            }
        }
    }
}

impl HostComm {
    /// Connects this rank to every peer of `bootstrap` and returns the communicator.
    ///
    /// Every wait uses the bootstrap's init timeout and ends within about a
    /// second when a peer dies; the error names the step and the rank. On
    /// failure this rank tells the others why
    /// ([`Bootstrap::announce_failure`]) and unlinks the shared-memory
    /// segments of this communicator that any rank of this host left behind.
    pub fn init(bootstrap: Bootstrap, cfg: HostConfig, abort: Arc<AtomicBool>) -> Result<HostComm> {
        let mut hint = None;
        match Self::connect(&bootstrap, cfg, abort, &mut hint) {
            Ok(finish) => {
                bootstrap.init_done();
                Ok(finish(bootstrap))
            }
            Err(e) => {
                bootstrap.announce_failure(&e);
                if let Some(hint) = hint {
                    remove_local_segments(&bootstrap, &hint);
                }
                Err(e)
            }
        }
    }

    /// The work of [`HostComm::init`]; `hint` receives the name hint of this
    /// communicator's segments once it is known.
    fn connect(
        bootstrap: &Bootstrap,
        mut cfg: HostConfig,
        abort: Arc<AtomicBool>,
        hint: &mut Option<String>,
    ) -> Result<Box<dyn FnOnce(Bootstrap) -> HostComm>> {
        let rank = bootstrap.rank();
        let n = bootstrap.nranks();
        let peers = bootstrap.peers().to_vec();
        // More ranks on this host than CPUs: a waiting rank that spins holds
        // the CPU its peer needs (4 ranks on 2 cores measured 116 us per 8-byte
        // all_reduce with 50 us spins); yield at once instead.
        let local = peers
            .iter()
            .filter(|p| p.host_hash == peers[rank].host_hash)
            .count();
        let cpus = std::thread::available_parallelism()
            .map(|c| c.get())
            .unwrap_or(1);
        if local > cpus && !cfg.spin.is_zero() {
            oxccl_env::info!(
                Subsys::INIT,
                "{local} ranks on this host share {cpus} CPUs: waiting ranks yield instead of spinning"
            );
            cfg.spin = Duration::ZERO;
        }
        let kind_of = |a: usize, b: usize| -> LinkKind {
            let (pa, pb) = (&peers[a], &peers[b]);
            let same_host = pa.host_hash == pb.host_hash;
            let same_proc = same_host && pa.process_token == pb.process_token;
            if same_proc && !cfg.p2p_disable {
                LinkKind::InProc
            } else if same_host && !cfg.shm_disable {
                LinkKind::Shm
            } else {
                LinkKind::Tcp
            }
        };
        let pairs = PairKinds::of(&peers, cfg.shm_disable, cfg.p2p_disable);
        let any_tcp = pairs.any_tcp;
        // The network for pairs that would use TCP: a plugin's device, or
        // oxccl's sockets (decided only when some pair needs it, so a
        // single-host job never loads a plugin).
        let network = if any_tcp {
            oxccl_net::choose(&cfg.net).map_err(|e| e.context(format!("rank {rank}")))?
        } else {
            oxccl_net::Network::Socket {
                reason: "no peer on another host".to_string(),
            }
        };
        let plugin = match &network {
            oxccl_net::Network::Plugin {
                net, dev, props, ..
            } => Some((net.clone(), *dev, props.clone())),
            oxccl_net::Network::Socket { .. } => None,
        };
        let kind_of = |a: usize, b: usize| -> LinkKind {
            match kind_of(a, b) {
                LinkKind::Tcp if plugin.is_some() => LinkKind::Net,
                k => k,
            }
        };
        let link = if any_tcp {
            LinkModel::TCP
        } else if pairs.all_inproc {
            LinkModel::INPROC
        } else {
            LinkModel::SHM
        };
        let (coll_channels, p2p_channels) = host_channels(&cfg, any_tcp);
        let nch = coll_channels + p2p_channels;
        let cap = ring_capacity(&cfg);

        // A key shared by all ranks of this communicator, for the in-process
        // registry, and the settings every rank must share: streams per peer
        // and every input of the tuner's plan (its slice size and channels
        // decide how bytes are cut on the wire, and no header carries the
        // slice). Ranks that differ from rank 0 fail here with both settings
        // named, the others through their notice: before this check, a different NCCL_BUFFSIZE or
        // NCCL_PROTO gave silently wrong all-reduce results over TCP, a hang
        // between threads, and a different channel count an internal error.
        // The transport of a pair is decided by each end alone from its own
        // NCCL_SHM_DISABLE / NCCL_P2P_DISABLE, so those must agree too.
        // Slots fit every device a channel may use: the smallest largest
        // transfer among the plugin's usable devices (the same on every
        // host of a uniform cluster; rank 0's check below catches others).
        let net_slot = plugin.as_ref().map(|(net, _, props)| {
            let max = oxccl_net::usable_devices(net.as_ref(), cfg.net.ib_hca.as_deref())
                .iter()
                .map(|(_, p)| p.max_p2p_bytes)
                .min()
                .unwrap_or(props.max_p2p_bytes)
                .min(props.max_p2p_bytes);
            slot_bytes(cap.max(1 << 20), max)
        });
        // The device of each stream to peers on other hosts: spread over
        // the plugin's usable devices, the rank's index on its host
        // offsetting the start (NCCL_CROSS_NIC decides).
        let net_devs = plugin.as_ref().map(|(net, dev, _)| {
            let local = peers[..rank]
                .iter()
                .filter(|p| p.host_hash == peers[rank].host_hash)
                .count();
            crate::transport::net::channel_devices(net.as_ref(), *dev, &cfg.net, rank, local, nch)
        });
        // NCCL also looks for tuners and profilers in the network plugin's
        // library (already loaded when one is in use).
        let net_library = match &network {
            oxccl_net::Network::Plugin { .. } => match oxccl_net::load(
                oxccl_net::library_candidates(cfg.net.plugin.as_deref()).as_deref(),
            ) {
                oxccl_net::LoadOutcome::Loaded(p) => Some(p.library().to_string()),
                _ => None,
            },
            oxccl_net::Network::Socket { .. } => None,
        };
        // A tuner decides plans too: every rank must load the same one.
        let tuner_lib =
            oxccl_net::tuner::load_tuner(cfg.tuner_plugin.as_deref(), net_library.as_deref());
        let settings = format!(
            "{coll_channels}+{p2p_channels} channels, {}-byte rings (NCCL_BUFFSIZE), NCCL_ALGO={}, NCCL_PROTO={}, NCCL_MIN_NCHANNELS={:?}, NCCL_MAX_NCHANNELS={:?}, NCCL_SHM_DISABLE={}, NCCL_P2P_DISABLE={}, network {}{}{}",
            cfg.capacity,
            cfg.algos,
            cfg.protos,
            cfg.min_channels,
            cfg.max_channels,
            u8::from(cfg.shm_disable),
            u8::from(cfg.p2p_disable),
            network.name(),
            net_slot.map(|s| format!(" ({s}-byte slots)")).unwrap_or_default(),
            tuner_lib
                .as_ref()
                .map(|t| format!(", tuner {} ({})", t.name(), t.version().symbol()))
                .unwrap_or_default()
        );
        let step = |what: &str| {
            let what = format!("rank {rank} of {n}: init ({what})");
            move |e: Error| e.context(&what)
        };
        let mut mine = vec![0u8; 8];
        getrandom::getrandom(&mut mine).map_err(|e| Error::system(format!("getrandom: {e}")))?;
        mine.extend_from_slice(settings.as_bytes());
        // Rank 0's key and settings down a tree (O(log n) rounds; a ring
        // allgather took n-1): a rank whose settings differ from rank 0's
        // fails here, and its notice fails the others at the final barrier.
        let root = bootstrap
            .broadcast(0, &mine)
            .map_err(step("exchanging settings"))?;
        let key = u64::from_le_bytes(
            root.get(..8)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| Error::internal("bootstrap broadcast returned a short key"))?,
        );
        // Segment names carry the key, so that survivors of a rank killed
        // before it unlinked its segment find it (unlink_segments_of).
        let seg_hint = format!("rx{key:016x}");
        *hint = Some(seg_hint.clone());
        if root.get(8..) != Some(settings.as_bytes()) {
            let theirs = &root;
            return Err(Error::invalid_usage(format!(
                "rank 0 runs with {}, rank {rank} with {settings}: every rank needs the same NCCL_BUFFSIZE, NCCL_ALGO, NCCL_PROTO, NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS, OXCCL_HOST_NCHANNELS, NCCL_SHM_DISABLE and NCCL_P2P_DISABLE, the same network for peers on other hosts (NCCL_NET_PLUGIN, NCCL_NET) and the same tuner (NCCL_TUNER_PLUGIN)",
                String::from_utf8_lossy(theirs.get(8..).unwrap_or(&[]))
            )));
        }
        let mut per_host: HashMap<u64, usize> = HashMap::new();
        for p in &peers {
            *per_host.entry(p.host_hash).or_default() += 1;
        }
        let profiler = oxccl_net::profiler::load_profiler(
            cfg.profiler_plugin.as_deref(),
            net_library.as_deref(),
        )
            .and_then(|lib| {
                // No communicator names in oxccl: the plugin gets "".
                match oxccl_net::profiler::ProfilerComm::init(lib, key, "", per_host.len(), n, rank) {
                    Ok(p) => Some((p, SeqNumbers::default())),
                    Err(why) => {
                        oxccl_env::warn!(
                            "PROFILER/Plugin: rank {rank}: {why}; this communicator runs without a profiler"
                        );
                        None
                    }
                }
            });
        let tuner = tuner_lib.and_then(|lib| {
            let local_min = per_host.values().copied().min().unwrap_or(1);
            let local_max = per_host.values().copied().max().unwrap_or(1);
            // The communicator's random key stands for NCCL's commHash.
            match oxccl_net::tuner::TunerComm::init(lib, key, n, per_host.len(), local_min, local_max) {
                Ok(t) => Some(std::sync::Arc::new(std::sync::Mutex::new(t))),
                Err(why) => {
                    oxccl_env::warn!(
                        "TUNER/Plugin: rank {rank}: {why}; this communicator runs on oxccl's own tuning"
                    );
                    None
                }
            }
        });

        // Connections only to the peers of the bounded collectives (ring
        // neighbours, tree links, every peer up to ONE_SHOT_MAX_RANKS ranks);
        // the others on first use. Each pair gets its own rings, so nothing
        // here grows with the rank count (it made 6 MiB of rings per pair of
        // ranks: 12.5 GB for 64 ranks as threads).
        let kinds: Vec<Option<LinkKind>> = (0..n)
            .map(|q| (q != rank).then(|| kind_of(rank, q)))
            .collect();
        let connector = Connector {
            rank,
            nranks: n,
            key,
            seg_hint: seg_hint.clone(),
            kinds: kinds.clone(),
            nch,
            cap,
            link_timeout: cfg.link_timeout.unwrap_or(cfg.timeout),
            plugin: plugin
                .as_ref()
                .zip(net_devs)
                .map(|((net, _, _), devs)| (net.clone(), devs)),
            net_slot,
        };
        let mut tx: Vec<Vec<Box<dyn SendHalf>>> = (0..n).map(|_| Vec::new()).collect();
        let mut rx: Vec<Vec<Box<dyn RecvHalf>>> = (0..n).map(|_| Vec::new()).collect();
        let mut controls: Vec<Option<PeerControl>> = (0..n).map(|_| None).collect();
        let eager = oxccl_core::peers::init_peers(rank, n);
        let links = connect_peers(&mut [Connecting::new(&connector, bootstrap, &abort, &eager)])
            .map_err(step("connecting"))?;
        for link in links.into_iter().flatten().flatten() {
            install(&mut tx, &mut rx, &mut controls, link);
        }
        // Init returns on every rank only once every rank is connected (a
        // rank that fails makes the others fail here, not at their first call).
        // Small collectives take one-shot slots when every rank is another
        // process of this host and there are at most ONE_SHOT_MAX_RANKS (8) of
        // them: each rank's slots are a segment of their own that every peer
        // maps, so this stays bounded. Decided alike on every rank: the link
        // kinds are symmetric and NCCL_ALGO was checked equal above.
        let all_shm = pairs.all_shm;
        let slot_bytes = if all_shm
            && n <= oxccl_core::peers::ONE_SHOT_MAX_RANKS
            && cfg.algos.allows(CollKind::AllReduce, Algo::OneShot)
        {
            oneshot::area_bytes(oneshot::ONESHOT_MAX_BYTES)
        } else {
            0
        };
        let slots = if slot_bytes > 0 {
            let layout = ShmRingLayout {
                npeers: 0,
                nchannels: 1,
                capacity: cap,
            };
            let mine = ShmSegment::create_rings_and_slots(layout, &seg_hint, slot_bytes)
                .map_err(step("one-shot slots"))?;
            let names = bootstrap
                .allgather(mine.name().as_bytes())
                .map_err(step("exchanging one-shot slot segment names"))?;
            let mut segs = Vec::with_capacity(n);
            for (q, name) in names.iter().enumerate() {
                if q == rank {
                    segs.push(mine.clone());
                    continue;
                }
                let name = String::from_utf8_lossy(name).to_string();
                let seg = ShmSegment::open_rings_and_slots(&name, layout, slot_bytes)
                    .map_err(step(&format!("opening rank {q}'s one-shot slots")))?;
                segs.push(seg);
            }
            Some((
                ShmOneShot::new(rank, segs, oneshot::ONESHOT_MAX_BYTES)?,
                names,
            ))
        } else {
            None
        };
        bootstrap.barrier().map_err(step("final barrier"))?;
        // Every rank has mapped every slot segment: the names can go (the
        // mappings stay). Each rank unlinks every rank's, so one killed right
        // after the barrier leaves nothing in /dev/shm.
        let oneshot = match slots {
            Some((slots, names)) => {
                for name in &names {
                    crate::transport::shm::unlink_name(&String::from_utf8_lossy(name))?;
                }
                Some(slots)
            }
            None => None,
        };
        if rank == 0 {
            let order: Vec<String> = (0..n).map(|r| r.to_string()).collect();
            for c in 0..coll_channels {
                oxccl_env::info!(
                    Subsys::INIT,
                    "Channel {c:02}/{coll_channels:02} : {}",
                    order.join(" ")
                );
            }
        }
        for (q, k) in kinds.iter().enumerate() {
            if let (Some(k), true) = (k, controls[q].is_some()) {
                oxccl_env::info!(
                    Subsys::INIT | Subsys::SHM,
                    "Channel 00/{nch} : {rank}[{rank}] -> {q}[{q}] via {}",
                    transport_label(*k, &network)
                );
            }
        }
        Ok(Box::new(move |bootstrap| HostComm {
            rank,
            nranks: n,
            bootstrap,
            tx,
            rx,
            controls,
            kinds,
            seqs: StreamSeqs::new(n, nch),
            last_plan: None,
            coll_channels,
            p2p_channels,
            link,
            cfg,
            abort,
            failed: None,
            connector,
            oneshot,
            net_plugin: match &network {
                oxccl_net::Network::Plugin { net, dev, .. } => Some((net.clone(), *dev)),
                oxccl_net::Network::Socket { .. } => None,
            },
            tuner,
            profiler,
        }))
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The network plugin and device chosen for peers on other hosts, if any.
    pub fn net_plugin(&self) -> Option<(std::sync::Arc<dyn oxccl_net::Net>, usize)> {
        self.net_plugin.clone()
    }
    /// The tuner plugin's context for this communicator, when one loaded
    /// (the GPU path asks it too).
    pub fn tuner(&self) -> Option<std::sync::Arc<std::sync::Mutex<oxccl_net::tuner::TunerComm>>> {
        self.tuner.clone()
    }
    /// Whether a profiler plugin was loaded for this communicator.
    pub fn has_profiler(&self) -> bool {
        self.profiler.is_some()
    }
    /// The profiler plugin's context and the collective sequence numbers,
    /// for the GPU path's events (one numbering per communicator, whatever
    /// the buffers).
    pub fn profiler(&mut self) -> Option<(&oxccl_net::profiler::ProfilerComm, &mut SeqNumbers)> {
        self.profiler.as_mut().map(|(p, s)| (&*p, s))
    }
    /// Ranks in the communicator.
    pub fn nranks(&self) -> usize {
        self.nranks
    }
    /// The bootstrap (for out-of-band exchanges such as split).
    pub fn bootstrap(&self) -> &Bootstrap {
        &self.bootstrap
    }
    /// How each peer is reached (None for self).
    pub fn link_kinds(&self) -> &[Option<LinkKind>] {
        &self.kinds
    }
    /// The peers this rank holds a connection to: those of the bounded
    /// collectives from creation, others once an operation talked to them.
    pub fn connected_peers(&self) -> Vec<usize> {
        (0..self.nranks)
            .filter(|&q| self.controls[q].is_some())
            .collect()
    }
    /// The error that put this communicator in its error state, if any.
    pub fn async_error(&self) -> Option<&Error> {
        self.failed.as_ref()
    }
    /// The abort flag (set it from any thread to make waits return).
    pub fn abort_flag(&self) -> &Arc<AtomicBool> {
        &self.abort
    }

    /// The tuner's plan for an operation of `bytes` (nccl-tests' size).
    ///
    /// With a tuner plugin, the plugin sees oxccl's cost table for the call
    /// and its answer decides (`oxccl_core::tuner_plugin`); a failing call
    /// leaves oxccl's own plan. Rank 0 logs each such plan on `TUNING`.
    pub fn plan(&self, kind: CollKind, bytes: usize) -> Result<Plan> {
        match self.tuned_plan(kind, bytes)? {
            Some(p) => Ok(p),
            None => choose(&self.tune_input(kind, bytes)),
        }
    }

    fn tune_input(&self, kind: CollKind, bytes: usize) -> TuneInput<'_> {
        TuneInput {
            kind,
            bytes,
            nranks: self.nranks,
            link: self.link,
            algos: &self.cfg.algos,
            protos: &self.cfg.protos,
            capacity: self.cfg.capacity,
            min_channels: self.cfg.min_channels,
            max_channels: Some(self.coll_channels),
        }
    }

    /// The tuner plugin's plan, when there is a plugin and it changed
    /// oxccl's decision (`None`: oxccl's own plan stands).
    fn tuned_plan(&self, kind: CollKind, bytes: usize) -> Result<Option<Plan>> {
        let Some(tuner) = &self.tuner else {
            return Ok(None);
        };
        let input = self.tune_input(kind, bytes);
        let given = tuner_plugin::cost_table(&input);
        let mut returned = given;
        let mut t = tuner.lock().unwrap_or_else(|p| p.into_inner());
        let nch = match t.get_coll_info(tuner_plugin::func_id(kind), bytes, &mut returned) {
            Ok(nch) => nch,
            Err(why) => {
                oxccl_env::info!(Subsys::TUNING, "{why}: oxccl's own plan");
                return Ok(None);
            }
        };
        let (plan, verdict) = tuner_plugin::apply(&input, &given, &returned, nch)?;
        if self.rank == 0 {
            oxccl_env::info!(
                Subsys::TUNING,
                "{} (tuner {}: {verdict:?})",
                oxccl_core::logfmt::tuning_line(
                    kind.nccl_name(),
                    bytes as u64,
                    plan.algo.name(),
                    plan.proto.name(),
                    plan.nchannels as u32
                ),
                t.lib().name()
            );
        }
        Ok(match verdict {
            Verdict::Applied | Verdict::ChannelsOnly => Some(plan),
            Verdict::Unchanged | Verdict::NothingRunnable => None,
        })
    }

    /// Runs a group of operations on this communicator.
    ///
    /// # Safety
    /// Every pointer in `ops` must be valid for the bytes its operation reads or
    /// writes (NCCL's rules for the collective, `count` elements of `dtype`)
    /// until this call returns, and no other thread may access written bytes.
    pub unsafe fn run(&mut self, ops: &[OpDesc]) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { run_group(&mut [(self, ops)]) }
    }

    /// The first peer whose control connection reports it gone or failed
    /// (non-blocking): for watchers of work that does not run through the
    /// host transports, such as GPU kernels waiting on a peer.
    pub fn check_peers(&mut self) -> Result<()> {
        for c in self.controls.iter_mut().flatten() {
            c.check()?;
        }
        Ok(())
    }

    /// [`check_peers`](Self::check_peers) for watchers of work that may not
    /// involve every peer (the GPU watchdog): a peer that said goodbye
    /// (destroyed its communicator after its last call) is not a failure
    /// here; one that died or reported an error is.
    pub fn check_peers_alive(&mut self) -> Result<()> {
        for c in self.controls.iter_mut().flatten() {
            match c.check() {
                Err(_) if c.left() => {}
                r => r?,
            }
        }
        Ok(())
    }

    /// Tells every peer in another process that this rank is leaving
    /// normally ([`PeerControl::goodbye`]), before the communicator is dropped.
    pub fn goodbye(&mut self) {
        for c in self.controls.iter_mut().flatten() {
            c.goodbye();
        }
    }

    fn poison_all(&mut self, err: &Error) {
        for c in self.controls.iter_mut().flatten() {
            c.poison(err);
        }
    }
}

impl Drop for HostComm {
    fn drop(&mut self) {
        crate::connect::forget_inproc_ends(self.connector.key, self.rank);
    }
}

fn transport_label(k: LinkKind, network: &oxccl_net::Network) -> String {
    match (k, network) {
        (LinkKind::InProc, _) => "P2P/direct pointer".to_string(),
        (LinkKind::Shm, _) => "SHM/direct/direct".to_string(),
        (LinkKind::Net, oxccl_net::Network::Plugin { net, dev, .. }) => {
            format!("NET/{}/{dev}", net.name())
        }
        (LinkKind::Tcp | LinkKind::Net, _) => "NET/Socket/0".to_string(),
    }
}

/// Element counts (send, recv) for a collective on `n` ranks, and whether this
/// rank uses each buffer.
fn extents(op: &OpDesc, rank: usize, n: usize) -> (usize, usize, bool, bool) {
    let c = op.count;
    let root = rank == op.root;
    match op.kind {
        CollKind::AllReduce => (c, c, true, true),
        CollKind::Broadcast => (c, c, root, true),
        CollKind::Reduce => (c, c, true, root),
        CollKind::AllGather => (c, c.saturating_mul(n), true, true),
        CollKind::ReduceScatter => (c.saturating_mul(n), c, true, true),
        CollKind::AllToAll => (c.saturating_mul(n), c.saturating_mul(n), true, true),
        CollKind::Gather => (c, c.saturating_mul(n), true, root),
        CollKind::Scatter => (c.saturating_mul(n), c, root, true),
        CollKind::Send => (c, 0, true, false),
        CollKind::Recv => (0, c, false, true),
    }
}

/// Whether the buffers are NCCL's in-place layout for the collective.
fn in_place_layout(op: &OpDesc, rank: usize, esize: usize) -> bool {
    let s = op.send as usize;
    let r = op.recv as usize;
    if s == 0 || r == 0 {
        return false;
    }
    let blk = op.count.wrapping_mul(esize);
    match op.kind {
        CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => s == r,
        CollKind::AllGather => s == r.wrapping_add(rank.wrapping_mul(blk)),
        CollKind::ReduceScatter => r == s.wrapping_add(rank.wrapping_mul(blk)),
        CollKind::Gather => rank == op.root && s == r.wrapping_add(op.root.wrapping_mul(blk)),
        CollKind::Scatter => rank == op.root && r == s.wrapping_add(op.root.wrapping_mul(blk)),
        _ => false,
    }
}

impl OpDesc {
    /// Names the operation in messages, formatted only when one is made.
    fn label(&self) -> OpLabel {
        OpLabel {
            kind: self.kind,
            count: self.count,
            dtype: self.dtype,
            op: self.op,
        }
    }
}

/// Refuses a root (or a send's or receive's peer) outside the communicator.
fn check_root(op: &OpDesc, n: usize) -> Result<()> {
    if matches!(
        op.kind,
        CollKind::Broadcast
            | CollKind::Reduce
            | CollKind::Gather
            | CollKind::Scatter
            | CollKind::Send
            | CollKind::Recv
    ) && op.root >= n
    {
        let what = if matches!(op.kind, CollKind::Send | CollKind::Recv) {
            "peer"
        } else {
            "root"
        };
        return Err(Error::invalid_argument(format!(
            "{}: {what} {} is out of range for a communicator of {n} ranks (valid: 0..={})",
            op.kind.snake_name(),
            op.root,
            n - 1
        )));
    }
    Ok(())
}

/// A collective of 0 elements: it moves nothing and meets no one, so a group
/// of only these is checked and done, as NCCL discards them (2 ranks as
/// processes: 1.7-2.5 µs through the step engine, where MPI takes 0.01).
/// Sends and receives of 0 still pair up.
fn is_empty_collective(op: &OpDesc) -> bool {
    op.count == 0 && !matches!(op.kind, CollKind::Send | CollKind::Recv)
}

struct Prepared<'b> {
    task: Task<'b>,
}

/// Validates one operation and builds its engine and buffers.
///
/// # Safety
/// As [`HostComm::run`].
unsafe fn prepare<'b>(
    comm: &mut HostComm,
    op: &OpDesc,
    scratch: &'b mut Vec<u8>,
) -> Result<Prepared<'b>> {
    let n = comm.nranks;
    let rank = comm.rank;
    let name = op.kind.snake_name();
    check_root(op, n)?;
    let e = op.dtype.size();
    let (sc, rc, use_s, use_r) = extents(op, rank, n);
    // The message is formatted only on overflow (two strings a call cost
    // ~10% of the generic path's instructions).
    let bytes = |count: usize, side: &str| match count.checked_mul(op.dtype.size()) {
        Some(b) => Ok(b),
        None => byte_len(count, op.dtype, &format!("{name}: {side} buffer")),
    };
    let sbytes = bytes(sc, "send")?;
    let rbytes = bytes(rc, "receive")?;
    if sbytes > isize::MAX as usize || rbytes > isize::MAX as usize {
        return Err(Error::invalid_argument(format!(
            "{name}: count {} of {} is larger than any buffer can be",
            op.count, op.dtype
        )));
    }
    if use_s && sbytes > 0 && op.send.is_null() {
        return Err(Error::invalid_argument(format!(
            "{name}: sendbuff is NULL with count {}",
            op.count
        )));
    }
    if use_r && rbytes > 0 && op.recv.is_null() {
        return Err(Error::invalid_argument(format!(
            "{name}: recvbuff is NULL with count {}",
            op.count
        )));
    }
    let in_place = in_place_layout(op, rank, e);
    // Checked on the raw addresses, before any slice exists: overlapping
    // shared and exclusive slices must never be made, even briefly.
    if !in_place && use_s && use_r && sbytes > 0 && rbytes > 0 {
        let (s0, r0) = (op.send as usize, op.recv as usize);
        if s0 < r0.saturating_add(rbytes) && r0 < s0.saturating_add(sbytes) {
            return Err(Error::invalid_argument(format!(
                "{name}: sendbuff and recvbuff overlap but are not the in-place layout of {name}"
            )));
        }
    }
    // With the in-place form the engine sees one buffer: the larger of the two.
    let (send_slice, recv_slice): (Option<&'b [u8]>, &'b mut [u8]) = if in_place {
        let (ptr, len) = match op.kind {
            CollKind::ReduceScatter | CollKind::Scatter => (op.send as *mut u8, sbytes),
            _ => (op.recv, rbytes),
        };
        // SAFETY: the caller guarantees the buffer is valid for these bytes and
        // exclusively ours for the call; for in-place layouts the send bytes lie
        // inside this one buffer, which is the only slice made.
        (None, unsafe { mut_slice(ptr, len) })
    } else {
        let s = if use_s && sbytes > 0 {
            // SAFETY: valid for sbytes by the caller's contract; only read.
            unsafe { std::slice::from_raw_parts(op.send, sbytes) }
        } else {
            &[]
        };
        let r = if use_r {
            // SAFETY: valid for rbytes of writes by the caller's contract, and
            // disjoint from the send bytes (overlap was refused above).
            unsafe { mut_slice(op.recv, rbytes) }
        } else {
            &mut []
        };
        (Some(s), r)
    };
    let total_bytes = match op.kind {
        CollKind::AllGather | CollKind::AllToAll => rbytes,
        CollKind::ReduceScatter => sbytes,
        CollKind::Gather => rbytes.max(sbytes.saturating_mul(n)),
        CollKind::Scatter => sbytes.max(rbytes.saturating_mul(n)),
        _ => sbytes.max(rbytes),
    };
    let p2p = matches!(op.kind, CollKind::Send | CollKind::Recv);
    // A tuner plugin's choice (an NCCL algorithm) overrides the one-shot
    // slots, which are oxccl's own.
    let tuned = if p2p {
        None
    } else {
        comm.tuned_plan(op.kind, total_bytes)?
    };
    if tuned.is_none() && comm.oneshot.as_ref().is_some_and(|s| oneshot_fits(op, s)) {
        let call = slot_call(op);
        return Ok(Prepared {
            task: Task {
                engine: Work::Slots(SlotTask {
                    call,
                    red: if call.reduces() {
                        Some(Reduction::new(op.dtype, op.op, n)?)
                    } else {
                        None
                    },
                    seq: None,
                    waiting_for: (rank + 1) % n,
                    done: false,
                }),
                bufs: Buffers {
                    send: send_slice,
                    recv: recv_slice,
                    scratch: &mut scratch[..],
                },
                streams: HashSet::from([SLOT_STREAM]),
                what: op.label(),
            },
        });
    }
    let (plan, nch, base_ch) = if p2p {
        let nch = comm.p2p_channels;
        (
            Plan {
                algo: Algo::Ring,
                proto: Proto::Simple,
                shaped: Shaped::Ring,
                nchannels: nch,
                slice: comm.cfg.capacity / 2,
                est_us: 0.0,
            },
            nch,
            comm.coll_channels,
        )
    } else {
        let p = match (tuned, comm.last_plan) {
            (Some(p), _) => p,
            (None, Some((k, b, p))) if k == op.kind && b == total_bytes => p,
            (None, _) => {
                let p = choose(&comm.tune_input(op.kind, total_bytes))?;
                comm.last_plan = Some((op.kind, total_bytes, p));
                p
            }
        };
        (p, p.nchannels, 0)
    };
    let red = if matches!(
        op.kind,
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
    ) {
        Some(Reduction::new(op.dtype, op.op, n)?)
    } else {
        None
    };
    let req = Request {
        kind: op.kind,
        count: op.count,
        root: op.root,
        rank,
        nranks: n,
        in_place,
    };
    let mut program = build(
        &req,
        plan.shaped,
        &Shape {
            nchannels: nch,
            slice: plan.slice,
            elem: e,
        },
    );
    for l in &mut program.lanes {
        l.channel += base_ch;
    }
    scratch.resize(program.scratch_bytes, 0);
    let (tx, rx) = program.streams();
    let mut streams = HashSet::new();
    streams.extend(tx.into_iter().map(|(p, c)| (p, c, true)));
    streams.extend(rx.into_iter().map(|(p, c)| (p, c, false)));
    let header = Header {
        seq: 0,
        kind: op.kind,
        dtype: op.dtype,
        op: if red.is_some() { op.op.wire_code() } else { 0 },
        nchannels: nch as u8,
        count: op.count as u64,
        root: op.root as u32,
        algo: plan.shaped as u8,
    };
    oxccl_env::info!(
        Subsys::COLL,
        "{}: opCount {:x} sendbuff {:p} recvbuff {:p} count {} datatype {} op {} root {} comm rank {} [nranks={}] -> Algo {} proto {} nchannels {}",
        op.kind.nccl_name(),
        comm.seqs.sent(),
        op.send,
        op.recv,
        op.count,
        op.dtype as i32,
        op.op.wire_code(),
        op.root,
        rank,
        n,
        plan.algo,
        plan.proto,
        nch
    );
    let mut engine = Engine::new(program, red, header, rank, &mut comm.seqs);
    // In place, the destination lines were just read (the input): they are
    // cached, and streaming stores would only evict them (measured slower).
    if !in_place && total_bytes >= crate::stream_copy::NT_THRESHOLD {
        engine.set_bulk_copy(crate::stream_copy::nt_copy);
    }
    Ok(Prepared {
        task: Task {
            engine: Work::Engine(engine),
            bufs: Buffers {
                send: send_slice,
                recv: recv_slice,
                scratch: &mut scratch[..],
            },
            streams,
            what: op.label(),
        },
    })
}

/// A mutable slice from a raw pointer, empty for zero length.
///
/// # Safety
/// `ptr` valid for `len` bytes of reads and writes, not aliased, for `'a`.
unsafe fn mut_slice<'a>(ptr: *mut u8, len: usize) -> &'a mut [u8] {
    if len == 0 || ptr.is_null() {
        &mut []
    } else {
        // SAFETY: by this function's contract.
        unsafe { std::slice::from_raw_parts_mut(ptr, len) }
    }
}

/// Runs one group: the operations of several communicators driven by this
/// thread, all issued together (NCCL's group semantics: send/recv pairs never
/// deadlock whatever their order; operations sharing a stream keep issue order).
///
/// # Safety
/// As [`HostComm::run`], for every operation.
pub unsafe fn run_group(items: &mut [(&mut HostComm, &[OpDesc])]) -> Result<()> {
    // Without a profiler, the usual case, nothing to start or stop: the
    // events' per-call allocation was 250 of the ~610 instructions of an
    // empty call through `oxccl perf` (callgrind, `oxccl perf all_gather
    // --ranks 1 -b 0 -e 0`: 611 a call before, 358 after).
    if items.iter().all(|(c, _)| c.profiler.is_none()) {
        // SAFETY: forwarded from this function's contract.
        return unsafe { run_group_inner(items, &[]) };
    }
    // Profiler events span the whole group: started before anything is
    // prepared, stopped once it completed or failed.
    let events = profile_start(items);
    // SAFETY: forwarded from this function's contract.
    let r = unsafe { run_group_inner(items, &events) };
    profile_stop(items, events);
    r
}

/// [`run_group`] for the library's own exchanges (the GPU path's agreement
/// on a group's rooted calls): a profiler sees no events of them, and no
/// collective sequence number is taken.
///
/// # Safety
/// As [`run_group`].
pub unsafe fn run_group_unprofiled(items: &mut [(&mut HostComm, &[OpDesc])]) -> Result<()> {
    // SAFETY: forwarded from this function's contract.
    unsafe { run_group_inner(items, &[]) }
}

/// Starts the events the profiler of each communicator starts (NCCL's
/// rules, [`oxccl_net::profiler::enabled_by`]; the events, their order and
/// parents: [`oxccl_net::profiler_group::start_group`]); each operation's
/// descriptor names the plan it runs (algorithm, protocol, channels).
fn profile_start(items: &mut [(&mut HostComm, &[OpDesc])]) -> Vec<Option<GroupEvents>> {
    use oxccl_net::profiler::PROFILE_COLL;
    use oxccl_net::profiler_group::{start_group, OpEvent};
    let mut out = Vec::with_capacity(items.len());
    for (comm, ops) in items.iter_mut() {
        // The plans first (they need `&comm`; only when collectives are
        // started: with a tuner plugin each costs a getCollInfo), then the
        // events.
        let Some(wants_coll) = comm.profiler.as_ref().map(|(p, _)| p.starts(PROFILE_COLL)) else {
            out.push(None);
            continue;
        };
        let events: Vec<OpEvent> = ops
            .iter()
            .map(|op| {
                let p2p = matches!(op.kind, CollKind::Send | CollKind::Recv);
                let (algo, proto, nch) = if p2p {
                    (Algo::Ring, Proto::Simple, comm.p2p_channels)
                } else if wants_coll {
                    comm.profile_plan(op)
                } else {
                    (Algo::Ring, Proto::Simple, 0)
                };
                OpEvent {
                    kind: op.kind,
                    send: op.send.cast(),
                    recv: op.recv.cast(),
                    count: op.count,
                    dtype: op.dtype,
                    root: op.root,
                    algo: prof_names::algo_name(algo),
                    proto: prof_names::proto_name(proto),
                    n_channels: nch,
                    n_warps: 0,
                    stream: std::ptr::null_mut(),
                }
            })
            .collect();
        let rank = comm.rank;
        let Some((prof, seqs)) = comm.profiler.as_mut() else {
            out.push(None);
            continue;
        };
        out.push(Some(start_group(prof, seqs, rank, false, &events)));
    }
    out
}

/// Stops what [`profile_start`] started: the operations, their group, then
/// the group API event.
fn profile_stop(items: &mut [(&mut HostComm, &[OpDesc])], events: Vec<Option<GroupEvents>>) {
    for ((comm, _), ev) in items.iter_mut().zip(events) {
        if let (Some((prof, _)), Some(ev)) = (comm.profiler.as_ref(), ev) {
            oxccl_net::profiler_group::stop_group(prof, ev);
        }
    }
}

impl HostComm {
    /// The algorithm, protocol and channels an operation will run with, for
    /// the profiler's descriptor (what `prepare` decides, without building).
    fn profile_plan(&self, op: &OpDesc) -> (Algo, Proto, usize) {
        if matches!(op.kind, CollKind::Send | CollKind::Recv) {
            return (Algo::Ring, Proto::Simple, self.p2p_channels);
        }
        let bytes = op_total_bytes(op, self.rank, self.nranks);
        match self.tuned_plan(op.kind, bytes) {
            Ok(Some(p)) => return (p.algo, p.proto, p.nchannels),
            Ok(None) => {}
            Err(_) => return (Algo::Ring, Proto::Simple, self.coll_channels),
        }
        if self.oneshot.as_ref().is_some_and(|s| oneshot_fits(op, s)) {
            return (Algo::OneShot, Proto::Simple, 1);
        }
        choose(&self.tune_input(op.kind, bytes))
            .map_or((Algo::Ring, Proto::Simple, self.coll_channels), |p| {
                (p.algo, p.proto, p.nchannels)
            })
    }
}

/// The size of an operation as the tuner counts it (nccl-tests' size).
fn op_total_bytes(op: &OpDesc, rank: usize, n: usize) -> usize {
    let (sc, rc, use_s, use_r) = extents(op, rank, n);
    let e = op.dtype.size();
    let sbytes = if use_s { sc.saturating_mul(e) } else { 0 };
    let rbytes = if use_r { rc.saturating_mul(e) } else { 0 };
    match op.kind {
        CollKind::AllGather | CollKind::AllToAll => rbytes,
        CollKind::ReduceScatter => sbytes,
        CollKind::Gather => rbytes.max(sbytes.saturating_mul(n)),
        CollKind::Scatter => sbytes.max(rbytes.saturating_mul(n)),
        _ => sbytes.max(rbytes),
    }
}

/// [`run_group`] without the profiler's group and operation events;
/// `events[i]` are those of `items[i]` (none at all without a profiler),
/// whose operations' events are the parents of their proxy events.
///
/// # Safety
/// As [`run_group`].
unsafe fn run_group_inner(
    items: &mut [(&mut HostComm, &[OpDesc])],
    events: &[Option<GroupEvents>],
) -> Result<()> {
    for (comm, _) in items.iter() {
        if let Some(e) = &comm.failed {
            return Err(Error::new(
                ErrorKind::InvalidUsage,
                format!(
                    "rank {} of {}: the communicator is in an error state after: {e}; destroy or abort it",
                    comm.rank, comm.nranks
                ),
            ));
        }
    }
    if items
        .iter()
        .all(|(_, ops)| ops.iter().all(is_empty_collective))
    {
        for (comm, ops) in items.iter() {
            for op in ops.iter() {
                check_root(op, comm.nranks)?;
            }
        }
        return Ok(());
    }
    // One small collective alone: the slots, without the group machinery
    // (with a tuner plugin, `prepare` decides between slots and its choice).
    // Looked at before the eager path, which takes no collective.
    if let [(comm, [op])] = items {
        if comm.tuner.is_none() && comm.oneshot.as_ref().is_some_and(|s| oneshot_fits(op, s)) {
            // SAFETY: forwarded from this function's contract.
            return unsafe { run_oneshot(comm, op) };
        }
    }
    // Small sends and receives alone: straight through the rings.
    if let [(comm, ops)] = items {
        if eager::takes(comm, ops) {
            // SAFETY: forwarded from this function's contract.
            return unsafe { eager::run(comm, ops) };
        }
    }
    // Scratch buffers outlive the tasks that borrow them.
    let mut scratch: Vec<Vec<Vec<u8>>> = items
        .iter()
        .map(|(_, ops)| vec![Vec::new(); ops.len()])
        .collect();
    let mut groups: Vec<Vec<Task<'_>>> = Vec::with_capacity(items.len());
    let mut timeout = Duration::ZERO;
    let mut spin = Duration::ZERO;
    // Argument errors leave the communicator usable: nothing was sent, and the
    // per-stream sequence numbers that the operations prepared before the
    // faulty one took are given back (else every later call on those streams
    // fails as "mismatched operations").
    let saved: Vec<StreamSeqs> = items.iter().map(|(c, _)| c.seqs.clone()).collect();
    let mut self_copies: Vec<(usize, *const u8, *mut u8)> = Vec::new();
    let mut failure: Option<Error> = None;
    'prep: for ((comm, ops), scr) in items.iter_mut().zip(scratch.iter_mut()) {
        timeout = timeout.max(comm.cfg.timeout);
        spin = spin.max(comm.cfg.spin);
        let rank = comm.rank;
        match self_pairs(rank, ops) {
            Ok(v) => self_copies.extend(v),
            Err(e) => {
                failure = Some(e);
                break 'prep;
            }
        }
        // Receive buffers of one group must not overlap anything else in it
        // (self send/recv pairs are local copies, checked by self_pairs).
        let others: Vec<OpDesc> = ops
            .iter()
            .filter(|op| !is_self_p2p(op, rank))
            .copied()
            .collect();
        if let Err(e) = check_group_overlaps(&others, rank, comm.nranks) {
            failure = Some(e);
            break 'prep;
        }
        let mut tasks = Vec::with_capacity(ops.len());
        for (op, s) in ops.iter().zip(scr.iter_mut()) {
            if is_self_p2p(op, rank) {
                continue;
            }
            // SAFETY: forwarded from this function's contract.
            match unsafe { prepare(comm, op, s) } {
                Ok(p) => tasks.push(p.task),
                Err(e) => {
                    failure = Some(e);
                    break 'prep;
                }
            }
        }
        groups.push(tasks);
    }
    if let Some(e) = failure {
        for ((comm, _), seqs) in items.iter_mut().zip(saved) {
            comm.seqs = seqs;
        }
        return Err(e);
    }
    // Peers this group talks to that are not connected yet (all-to-all,
    // gather, scatter, send/receive, a forced one-shot): connected now, by
    // both ends of each pair in this same call.
    let needed: Vec<Vec<usize>> = items
        .iter()
        .zip(&groups)
        .map(|((comm, _), tasks)| {
            let mut v: Vec<usize> = tasks
                .iter()
                .flat_map(|t| t.streams.iter().map(|k| k.0))
                .filter(|&q| q != comm.rank && comm.controls.get(q).is_some_and(|c| c.is_none()))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect();
    if needed.iter().any(|v| !v.is_empty()) {
        let made = {
            let mut connecting: Vec<Connecting<'_>> = items
                .iter()
                .zip(&needed)
                .map(|((comm, _), peers)| {
                    Connecting::new(&comm.connector, &comm.bootstrap, &comm.abort, peers)
                })
                .collect();
            connect_peers(&mut connecting)
        };
        match made {
            Ok(made) => {
                for ((comm, _), links) in items.iter_mut().zip(made) {
                    for link in links.into_iter().flatten() {
                        crate::connect::log_lazy(comm.rank, &link);
                        install(&mut comm.tx, &mut comm.rx, &mut comm.controls, link);
                    }
                }
            }
            Err(e) => {
                let e = if items.len() == 1 {
                    e.context(format!("rank {} of {}", items[0].0.rank, items[0].0.nranks))
                } else {
                    e
                };
                oxccl_env::warn!("{e}");
                drop(groups);
                for (comm, _) in items.iter_mut() {
                    comm.failed = Some(e.clone());
                    comm.poison_all(&e);
                }
                return Err(e);
            }
        }
    }
    for &(bytes, src, dst) in &self_copies {
        // SAFETY: both pointers are valid for `bytes` by this function's
        // contract (checked non-null above); `copy` allows them to overlap.
        unsafe { std::ptr::copy(src, dst, bytes) };
    }
    let mut streams: Vec<Streams<'_>> = items
        .iter_mut()
        .zip(&groups)
        .enumerate()
        .map(|(ci, ((comm, ops), tasks))| {
            let who = RankOf {
                rank: comm.rank,
                nranks: comm.nranks,
            };
            // The proxy events start here, once the peers are connected.
            let proxy = match events.get(ci) {
                Some(Some(ev)) => proxy_tracks(comm, ops, tasks, &ev.op_events),
                _ => Vec::new(),
            };
            Streams {
                proxy,
                tx: &mut comm.tx,
                rx: &mut comm.rx,
                controls: &mut comm.controls,
                abort: &comm.abort,
                oneshot: comm.oneshot.as_mut(),
                who,
            }
        })
        .collect();
    let result = drive(&mut streams, &mut groups, WaitPolicy { timeout, spin });
    drop(streams);
    drop(groups);
    if let Err(e) = &result {
        oxccl_env::warn!("{e}");
        for (comm, _) in items.iter_mut() {
            comm.fail(e);
        }
    }
    result
}

/// The proxy event trackers of one communicator's tasks (by task index),
/// when its profiler starts proxy operations: each task's network steps,
/// under its operation's event. Tasks are the operations that are not
/// sends or receives to this rank itself, in order.
fn proxy_tracks(
    comm: &HostComm,
    ops: &[OpDesc],
    tasks: &[Task<'_>],
    parents: &[*mut std::ffi::c_void],
) -> Vec<Option<ProxyTrack>> {
    use oxccl_net::profiler::PROFILE_PROXY_OP;
    let Some((prof, _)) = comm
        .profiler
        .as_ref()
        .filter(|(p, _)| p.starts(PROFILE_PROXY_OP))
    else {
        return Vec::new();
    };
    let net = |q: usize| matches!(comm.kinds.get(q), Some(Some(LinkKind::Tcp | LinkKind::Net)));
    debug_assert_eq!(
        ops.iter().filter(|op| !is_self_p2p(op, comm.rank)).count(),
        tasks.len()
    );
    ops.iter()
        .zip(parents)
        .filter(|(op, _)| !is_self_p2p(op, comm.rank))
        .zip(tasks)
        .map(|((_, &parent), t)| match &t.engine {
            Work::Engine(e) => ProxyTrack::new(prof.share(), e, &net, comm.rank, parent),
            Work::Slots(_) => None,
        })
        .collect()
}

impl HostComm {
    /// Puts the communicator in its error state after `e` and tells the peers.
    fn fail(&mut self, e: &Error) {
        self.failed = Some(e.clone());
        // An abort is this rank's decision, not its peers' misuse: they
        // see a remote error, as `ncclCommAbort`'s contract says (the
        // abort's own InvalidUsage kind used to travel in the poison).
        if self.abort.load(std::sync::atomic::Ordering::Acquire) {
            self.poison_all(&Error::remote(e.message()));
        } else {
            self.poison_all(e);
        }
    }
}

/// `op` as the one-shot slots see it.
fn slot_call(op: &OpDesc) -> SlotCall {
    SlotCall {
        kind: op.kind,
        count: op.count,
        dtype: op.dtype,
        op: op.op,
        root: op.root,
    }
}

/// Whether the one-shot slots take `op` ([`SlotCall::fits`]).
fn oneshot_fits(op: &OpDesc, slots: &ShmOneShot) -> bool {
    slot_call(op).fits(slots.nranks(), slots.max_bytes())
}

/// Polls before the wait looks at the clock: a peer that is on time posts
/// within a few hundred nanoseconds, and reading the clock costs tens.
const FREE_POLLS: u32 = 64;
/// After the spin, how long a waiting rank yields its CPU before it sleeps:
/// under load the peer it waits for needs that CPU, and a sleep of 50 us per
/// wait (the step engine's) made 8 B calls take 58-87 us at a load average of
/// 4.5 on 2 cores.
const YIELD_FOR: Duration = Duration::from_millis(2);
/// The longest sleep of a slot wait before it looks at abort, the timeout
/// and the peers' liveness again (a post wakes it earlier).
const SLOT_CHECK_EVERY: Duration = Duration::from_micros(200);

/// One small collective over the one-shot slots, blocking: argument
/// checks (as [`prepare`]'s, formatting only on failure), post, wait (spin,
/// yield, then sleep until the awaited peer's post wakes it; observing
/// abort, the timeout, the peers' liveness, and a peer that started another
/// operation on the streams), take the result.
///
/// # Safety
/// As [`HostComm::run`].
unsafe fn run_oneshot(comm: &mut HostComm, op: &OpDesc) -> Result<()> {
    let (rank, n) = (comm.rank, comm.nranks);
    let call = slot_call(op);
    let name = op.kind.snake_name();
    let e = op.dtype.size();
    let (sc, rc, use_s, use_r) = extents(op, rank, n);
    // Small by `fits`: no overflow.
    let (sbytes, rbytes) = (sc * e, rc * e);
    if use_s && sbytes > 0 && op.send.is_null() {
        return Err(Error::invalid_argument(format!(
            "{name}: sendbuff is NULL with count {}",
            op.count
        )));
    }
    if use_r && rbytes > 0 && op.recv.is_null() {
        return Err(Error::invalid_argument(format!(
            "{name}: recvbuff is NULL with count {}",
            op.count
        )));
    }
    if !in_place_layout(op, rank, e) && use_s && use_r && sbytes > 0 && rbytes > 0 {
        let (s0, r0) = (op.send as usize, op.recv as usize);
        if s0 < r0.saturating_add(rbytes) && r0 < s0.saturating_add(sbytes) {
            return Err(Error::invalid_argument(format!(
                "{name}: sendbuff and recvbuff overlap but are not the in-place layout of {name}"
            )));
        }
    }
    let red = if call.reduces() {
        Some(Reduction::new(op.dtype, op.op, n)?)
    } else {
        None
    };
    let Some(slots) = comm.oneshot.as_mut() else {
        return Err(Error::internal("one-shot collective without slots"));
    };
    let seq = slots.next_seq();
    let posted = call.posted_bytes(rank, n);
    let input = if posted > 0 {
        // SAFETY: the posted bytes are the ones this rank's send buffer
        // holds for the call (valid by the caller's contract, checked
        // non-null above); dropped before the output slice (which may be
        // the same memory, in place) is made.
        unsafe { std::slice::from_raw_parts(op.send, posted) }
    } else {
        &[]
    };
    // First until every peer posted the call before (this rank's slot is
    // free), then post, then until the posts this rank reads are there.
    let mut is_posted = false;
    let waited = wait_slots(
        slots,
        |slots, from| {
            if !is_posted {
                if let w @ Progress::Waiting { .. } = slots.clear_to_post(from)? {
                    return Ok(w);
                }
                slots.post(&call, input, red.as_ref())?;
                is_posted = true;
            }
            slots.progress(seq, &call, from)
        },
        rank,
        n,
        &comm.abort,
        &mut comm.controls,
        &mut comm.rx[..],
        comm.coll_channels,
        WaitPolicy {
            timeout: comm.cfg.timeout,
            spin: comm.cfg.spin,
        },
    );
    match waited {
        Ok(()) => {
            let want = call.output_bytes(rank, n);
            // SAFETY: the receive buffer holds `want` bytes for the call and
            // is ours by the caller's contract (checked non-null above where
            // used); the input slice is gone.
            let out = unsafe { mut_slice(op.recv, want) };
            slots.finish(seq, &call, out, red.as_ref());
            Ok(())
        }
        Err(e) => {
            let e = e.context(format!(
                "rank {rank} of {n}: {name}(count {}, {}, {})",
                op.count, op.dtype, op.op
            ));
            oxccl_env::warn!("{e}");
            comm.fail(&e);
            Err(e)
        }
    }
}

/// Polls `step` (given the peer to look at first) until it says
/// [`Progress::Ready`].
#[allow(clippy::too_many_arguments)]
fn wait_slots(
    slots: &mut ShmOneShot,
    mut step: impl FnMut(&mut ShmOneShot, usize) -> Result<Progress>,
    rank: usize,
    n: usize,
    abort: &AtomicBool,
    controls: &mut [Option<PeerControl>],
    rx: &mut [Vec<Box<dyn RecvHalf>>],
    coll_channels: usize,
    policy: WaitPolicy,
) -> Result<()> {
    let mut waiting_for = (rank + 1) % n;
    let mut polls = 0u32;
    let mut since: Option<std::time::Instant> = None;
    let mut last_check = None;
    loop {
        let seq = match step(slots, waiting_for)? {
            Progress::Ready => return Ok(()),
            Progress::Waiting {
                waiting_for: q,
                seq,
            } => {
                waiting_for = q;
                seq
            }
        };
        // Ranks that outnumber the CPUs (no spin) yield from the first miss:
        // the peer they wait for may need this very CPU.
        if polls < FREE_POLLS && !policy.spin.is_zero() {
            polls += 1;
            std::hint::spin_loop();
            continue;
        }
        let now = std::time::Instant::now();
        let t0 = *since.get_or_insert(now);
        // Abort, liveness, a peer on another operation, the timeout: every
        // 200 us of waiting, as the step engine's loop checks them, the
        // first after 200 us too: a liveness check reads each control
        // socket (a system call per peer, about 1 us), and at the first
        // miss of every call it made 4 ranks on 2 CPUs pay 3 of them per
        // call, on the CPUs their peers needed.
        let l = *last_check.get_or_insert(now);
        if now.duration_since(l) >= SLOT_CHECK_EVERY {
            last_check = Some(now);
            if abort.load(std::sync::atomic::Ordering::Acquire) {
                return Err(Error::new(
                    ErrorKind::InvalidUsage,
                    "operation aborted (ncclCommAbort or ncclCommRevoke)",
                ));
            }
            // Each verdict is checked against the slot once more: a peer may
            // post, finish, and then send on the streams or leave between the
            // first look and the verdict (a rank preempted there, under load,
            // saw a false mismatch). Its post comes before either, so a
            // second look that finds it posted clears it.
            for q in (0..n).filter(|&q| q != rank && !slots.posted(q, seq)) {
                if let Some(Some(c)) = controls.get_mut(q) {
                    if let Err(e) = c.check_while_waiting() {
                        if !slots.posted(q, seq) {
                            return Err(e);
                        }
                    }
                }
                // A peer that has not posted this call but sent collective
                // bytes runs another operation: calls differ between ranks.
                let sent = rx.get_mut(q).is_some_and(|chans| {
                    chans
                        .iter_mut()
                        .take(coll_channels)
                        .any(|c| c.peek().is_ok_and(|b| !b.is_empty()))
                });
                if sent && !slots.posted(q, seq) {
                    return Err(Error::invalid_usage(format!(
                        "mismatched operations: rank {q} started another collective while this \
                         rank waits in a small one (every rank must call the same \
                         collectives in the same order)"
                    )));
                }
            }
            if now.duration_since(t0) >= policy.timeout {
                return Err(Error::timeout(format!(
                    "operation did not complete within {:.1} s (OXCCL_TIMEOUT_MS): waiting for rank {waiting_for}'s one-shot slot",
                    policy.timeout.as_secs_f64()
                )));
            }
        }
        // Spin, then yield (under load the awaited rank may need this very
        // CPU), then sleep until its post wakes this rank (see
        // crate::oneshot) or the next check is due. A sleep from the first
        // miss measured worse under load: a rank woken by a post waits its
        // turn on a busy CPU (4 ranks on 2 CPUs, 8 B broadcast: 43-50 us a
        // call sleeping, 3-6 us yielding; 2 ranks beside 2 busy processes,
        // 16-100 us a call after spins of 10-200 us, 0.4-16 us after 2 ms).
        let waited = now.duration_since(t0);
        if waited < policy.spin {
            std::hint::spin_loop();
        } else if waited < policy.spin + YIELD_FOR {
            std::thread::yield_now();
        } else {
            let l = last_check.unwrap_or(now);
            let left = SLOT_CHECK_EVERY.saturating_sub(now.duration_since(l));
            slots.sleep_until_posted(waiting_for, seq, left.max(Duration::from_micros(10)));
        }
    }
}

/// A send to or a receive from this rank itself.
fn is_self_p2p(op: &OpDesc, rank: usize) -> bool {
    matches!(op.kind, CollKind::Send | CollKind::Recv) && op.root == rank
}

/// Pairs this rank's sends to itself with its receives from itself, in issue
/// order: each pair is a local copy `(bytes, from, to)`. NCCL allows them in
/// a group, and PyTorch's all-to-all over send/recv issues one per rank;
/// without this they failed with "no stream to rank R" (an internal error).
fn self_pairs(rank: usize, ops: &[OpDesc]) -> Result<Vec<(usize, *const u8, *mut u8)>> {
    let pick = |k: CollKind| {
        ops.iter()
            .filter(move |o| o.kind == k && o.root == rank)
            .collect::<Vec<_>>()
    };
    let (sends, recvs) = (pick(CollKind::Send), pick(CollKind::Recv));
    // Argument errors first, as for operations with a peer.
    let mut out = Vec::with_capacity(sends.len());
    for o in sends.iter().chain(&recvs) {
        let name = o.kind.snake_name();
        let bytes = byte_len(o.count, o.dtype, &format!("{name} to self"))?;
        if bytes > isize::MAX as usize {
            return Err(Error::invalid_argument(format!(
                "{name}: count {} of {} is larger than any buffer can be",
                o.count, o.dtype
            )));
        }
        let ptr = if o.kind == CollKind::Send {
            o.send
        } else {
            o.recv as *const u8
        };
        if bytes > 0 && ptr.is_null() {
            return Err(Error::invalid_argument(format!(
                "{name} (self): buffer is NULL with count {}",
                o.count
            )));
        }
    }
    if sends.len() != recvs.len() {
        return Err(Error::invalid_usage(format!(
            "rank {rank}: {} send(s) to itself but {} receive(s) from itself in one group; a send to self needs a matching receive from self in the same group",
            sends.len(),
            recvs.len()
        )));
    }
    for (s, r) in sends.into_iter().zip(recvs) {
        if s.count != r.count || s.dtype != r.dtype {
            return Err(Error::invalid_usage(format!(
                "rank {rank}: a send to itself of count {} ({}) meets a receive from itself of count {} ({})",
                s.count, s.dtype, r.count, r.dtype
            )));
        }
        out.push((s.count * s.dtype.size(), s.send, r.recv));
    }
    Ok(out)
}

/// Byte ranges an operation touches on this rank: `(start, len, written)`;
/// an in-place layout is one written range.
fn op_ranges(op: &OpDesc, rank: usize, n: usize) -> Vec<(usize, usize, bool)> {
    let e = op.dtype.size();
    let (sc, rc, use_s, use_r) = extents(op, rank, n);
    let (sb, rb) = (sc.saturating_mul(e), rc.saturating_mul(e));
    if in_place_layout(op, rank, e) {
        return match op.kind {
            CollKind::ReduceScatter | CollKind::Scatter => vec![(op.send as usize, sb, true)],
            _ => vec![(op.recv as usize, rb, true)],
        };
    }
    let mut v = Vec::new();
    if use_s && sb > 0 && !op.send.is_null() {
        v.push((op.send as usize, sb, false));
    }
    if use_r && rb > 0 && !op.recv.is_null() {
        v.push((op.recv as usize, rb, true));
    }
    v
}

/// Receive buffers of one group must not overlap any other buffer of the
/// group. Checked on the raw addresses before any slice is made.
fn check_group_overlaps(ops: &[OpDesc], rank: usize, n: usize) -> Result<()> {
    let mut ranges: Vec<(usize, usize, bool)> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let mine = op_ranges(op, rank, n);
        for a in &mine {
            for b in &ranges {
                if (a.2 || b.2) && a.0 < b.0.saturating_add(b.1) && b.0 < a.0.saturating_add(a.1) {
                    return Err(Error::invalid_argument(format!(
                        "a receive buffer in this group overlaps another buffer of the group (operation {i}, {})",
                        op.kind
                    )));
                }
            }
        }
        ranges.extend(mine);
    }
    Ok(())
}

/// What the links between every pair of ranks have in common, found in
/// O(n) from the hosts and processes of the ranks: every rank used to check
/// every pair, 10^9 checks in all at 1,024 ranks. A pair's link is
/// in-process (same process, `NCCL_P2P_DISABLE` off), else shared memory
/// (same host, `NCCL_SHM_DISABLE` off), else the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PairKinds {
    /// Some pair talks over the network.
    any_tcp: bool,
    /// Every pair is in-process (true for a single rank).
    all_inproc: bool,
    /// There is a pair and every pair uses shared memory.
    all_shm: bool,
}

impl PairKinds {
    fn of(peers: &[oxccl_bootstrap::PeerInfo], shm_disable: bool, p2p_disable: bool) -> PairKinds {
        use std::collections::HashMap;
        let n = peers.len();
        // Ranks per host, ranks per process (host hash, process token).
        let mut hosts: HashMap<u64, usize> = HashMap::new();
        let mut procs: HashMap<(u64, u64), usize> = HashMap::new();
        for p in peers {
            *hosts.entry(p.host_hash).or_default() += 1;
            *procs.entry((p.host_hash, p.process_token)).or_default() += 1;
        }
        let mut procs_per_host: HashMap<u64, usize> = HashMap::new();
        for &(h, _) in procs.keys() {
            *procs_per_host.entry(h).or_default() += 1;
        }
        let same_host_pair = hosts.values().any(|&c| c >= 2);
        let same_proc_pair = procs.values().any(|&c| c >= 2);
        let other_proc_pair = procs_per_host.values().any(|&c| c >= 2);
        PairKinds {
            any_tcp: hosts.len() > 1
                || (shm_disable && (other_proc_pair || (p2p_disable && same_host_pair))),
            all_inproc: n < 2 || (procs.len() == 1 && !p2p_disable),
            all_shm: n > 1 && hosts.len() == 1 && !shm_disable && (p2p_disable || !same_proc_pair),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_bootstrap::PeerInfo;

    fn brute(peers: &[PeerInfo], shm_disable: bool, p2p_disable: bool) -> PairKinds {
        let kind = |a: &PeerInfo, b: &PeerInfo| {
            let same_host = a.host_hash == b.host_hash;
            let same_proc = same_host && a.process_token == b.process_token;
            if same_proc && !p2p_disable {
                LinkKind::InProc
            } else if same_host && !shm_disable {
                LinkKind::Shm
            } else {
                LinkKind::Tcp
            }
        };
        let n = peers.len();
        let pairs: Vec<LinkKind> = (0..n)
            .flat_map(|a| (a + 1..n).map(move |b| (a, b)))
            .map(|(a, b)| kind(&peers[a], &peers[b]))
            .collect();
        PairKinds {
            any_tcp: pairs.contains(&LinkKind::Tcp),
            all_inproc: pairs.iter().all(|&k| k == LinkKind::InProc),
            all_shm: n > 1 && pairs.iter().all(|&k| k == LinkKind::Shm),
        }
    }

    /// Every layout of up to 4 ranks over up to 2 hosts and 2 processes per
    /// host, under the four settings, agrees with checking every pair.
    #[test]
    fn pair_kinds_match_checking_every_pair() {
        let mut checked = 0;
        for n in 0..=4usize {
            // Each rank's (host, process): 4 choices, 4^n layouts.
            for code in 0..4usize.pow(n as u32) {
                let peers: Vec<PeerInfo> = (0..n)
                    .map(|r| {
                        let c = code / 4usize.pow(r as u32) % 4;
                        let (host, proc_) = ((c / 2) as u64, (c % 2) as u64);
                        PeerInfo {
                            rank: r,
                            hostname: format!("h{host}"),
                            host_hash: 100 + host,
                            pid: 7,
                            process_token: 10 * host + proc_,
                            listen_addr: "127.0.0.1:1".parse().unwrap(),
                            data_addr: "127.0.0.1:1".parse().unwrap(),
                        }
                    })
                    .collect();
                for (shm, p2p) in [(false, false), (true, false), (false, true), (true, true)] {
                    assert_eq!(
                        PairKinds::of(&peers, shm, p2p),
                        brute(&peers, shm, p2p),
                        "layout {code} of {n} ranks, NCCL_SHM_DISABLE={shm} NCCL_P2P_DISABLE={p2p}"
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 4 * (1 + 4 + 16 + 64 + 256));
    }
}
