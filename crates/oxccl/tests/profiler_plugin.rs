//! A profiler plugin (`NCCL_PROFILER_PLUGIN`) receives the host path's
//! group API, collective and point-to-point API, group, collective and
//! point-to-point events: the C test profiler of oxccl-net, compiled with
//! cc, on four ranks as threads. The events it counted must match the
//! calls made, per rank and kind, started and stopped, with NCCL's parents
//! and descriptor fields (function, count, datatype, root, peer,
//! algorithm, protocol, channels, per-function sequence numbers) and the
//! group API states in NCCL's order, for each ABI version from v6 down to
//! v1 (v1's numbers checked as numbers; v1 to v4 never see API events); a
//! plugin's mask starts the kinds it asks for and, as NCCL does, their
//! parents and nothing else; one whose init fails is refused and the job
//! runs.

mod common;

use common::*;
use oxccl::{Communicator, Group, RedOp};
use oxccl_net::testing::build_c_plugin;
use std::ffi::{c_void, CStr, CString};
use std::path::Path;

const NRANKS: usize = 4;
const MAX_RANKS: usize = 16;

fn profiler(defines: &[&str], dir: &str) -> String {
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../oxccl-net/tests/plugins/oxtest_profiler.c");
    build_c_plugin(&src, defines, dir, "libnccl-profiler-oxtest.so")
        .to_str()
        .unwrap()
        .to_string()
}

fn comms_with(profiler: &str) -> Vec<Communicator> {
    let cfg = test_config(|h| h.profiler_plugin = Some(profiler.to_string()));
    init_threads(NRANKS, &cfg).expect("init")
}

/// An exported symbol of a loaded plugin.
fn sym(file: &str, name: &str) -> *mut c_void {
    let f = CString::new(file).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: the library is loaded already (RTLD_NOLOAD): this only takes
    // another reference; both names are C strings.
    let h = unsafe { libc::dlopen(f.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!h.is_null(), "{file} is not loaded");
    // SAFETY: a live handle and a C string.
    let p = unsafe { libc::dlsym(h, n.as_ptr()) };
    assert!(!p.is_null(), "{file} exports no {name}");
    p
}

fn int(file: &str, name: &str) -> i32 {
    // SAFETY: an `int` the plugin defines; no plugin call is in flight.
    unsafe { *(sym(file, name) as *const i32) }
}

/// Kinds (as bits) and states the plugin counts per rank.
const NKINDS: usize = 16;
const NSTATES: usize = 32;
/// `ncclProfileGroup`, `Coll`, `P2p`, `GroupApi`, `CollApi`, `P2pApi` as
/// the bit numbers the plugin counts them by.
const GROUP: usize = 0;
const COLL: usize = 1;
const P2P: usize = 2;
const PROXY_OP: usize = 3;
const PROXY_STEP: usize = 4;
const GROUP_API: usize = 8;
const COLL_API: usize = 9;
const P2P_API: usize = 10;
/// `ncclProfilerGroupStartApiStop`, `ncclProfilerGroupEndApiStart`.
const GROUP_START_API_STOP: usize = 23;
const GROUP_END_API_START: usize = 24;
/// `ncclProfilerProxyStepSendWait`, `RecvWait`, `ProxyOpInProgress_v4`,
/// `ProxyStepSendPeerWait_v4`.
const SEND_WAIT: usize = 9;
const RECV_WAIT: usize = 10;
const PROXY_OP_IN_PROGRESS: usize = 19;
const SEND_PEER_WAIT: usize = 20;

/// `name[rank][k]` of an `int [MAX_RANKS][NKINDS]` array.
fn per_kind(file: &str, name: &str, rank: usize, k: usize) -> i32 {
    assert!(rank < MAX_RANKS && k < NKINDS);
    // SAFETY: the plugin defines `int name[MAX_RANKS][NKINDS]`.
    unsafe { *(sym(file, name) as *const i32).add(rank * NKINDS + k) }
}

/// Checks, on every rank, that exactly the kinds in `want` (bit number,
/// events, of which outside the plugin's mask) were started and stopped,
/// every other kind never, that each group API event had its two states
/// (`group_apis` of each), and that the plugin found nothing wrong.
fn assert_kinds(so: &str, want: &[(usize, i32, i32)], group_apis: i32) {
    for r in 0..NRANKS {
        for k in 0..NKINDS {
            let (n, unasked) = want
                .iter()
                .find(|w| w.0 == k)
                .map_or((0, 0), |w| (w.1, w.2));
            assert_eq!(
                per_kind(so, "oxtest_prof_started", r, k),
                n,
                "rank {r} kind {k}"
            );
            assert_eq!(
                per_kind(so, "oxtest_prof_stopped", r, k),
                n,
                "rank {r} kind {k}"
            );
            assert_eq!(
                per_kind(so, "oxtest_prof_unasked", r, k),
                unasked,
                "rank {r} kind {k} outside the mask"
            );
        }
        for s in 0..NSTATES {
            let n = if s == GROUP_START_API_STOP || s == GROUP_END_API_START {
                group_apis
            } else {
                0
            };
            assert_eq!(
                code(so, "oxtest_prof_states", NSTATES, r, s),
                n,
                "rank {r} state {s}"
            );
        }
        assert_eq!(at::<i32>(so, "oxtest_prof_bad", r), 0, "rank {r}");
    }
}

/// `name[rank]` of an array of `T`.
fn at<T: Copy>(file: &str, name: &str, rank: usize) -> T {
    assert!(rank < MAX_RANKS);
    // SAFETY: the plugin defines `T name[MAX_RANKS]`.
    unsafe { *(sym(file, name) as *const T).add(rank) }
}

/// `name[rank]` of a `char [MAX_RANKS][32]` array.
fn text(file: &str, name: &str, rank: usize) -> String {
    // SAFETY: the plugin defines `char name[MAX_RANKS][32]`, each
    // NUL-terminated (strncpy of 31 then a 0).
    unsafe { CStr::from_ptr((sym(file, name) as *const i8).add(rank * 32)) }
        .to_string_lossy()
        .into_owned()
}

/// The calls of the test: 3 single all-reduces of odd counts (one of 0),
/// a broadcast from rank 2, one group of an all-reduce and a send/receive
/// ring step. Returns (groups, collectives, point-to-points) per rank.
fn make_calls(comms: &[Communicator]) -> (i32, i32, i32) {
    on_ranks(comms, |c| {
        let r = c.rank();
        for count in [1001usize, 0, 7] {
            let send: Vec<f32> = (0..count).map(|i| (i + r) as f32).collect();
            let mut recv = vec![0f32; count];
            c.all_reduce(&send, &mut recv, RedOp::Sum).unwrap();
            for (i, v) in recv.iter().enumerate() {
                let want: usize = (0..NRANKS).map(|q| i + q).sum();
                assert_eq!(*v, want as f32);
            }
        }
        let mut b = vec![r as i64; 33];
        c.broadcast_in_place(&mut b, 2).unwrap();
        assert!(b.iter().all(|&v| v == 2));
        let mut g = Group::new();
        let mut x = vec![1f64; 5];
        let to = (r + 1) % NRANKS;
        let from = (r + NRANKS - 1) % NRANKS;
        let out = vec![r as u8; 17];
        let mut inp = vec![0u8; 17];
        g.all_reduce_in_place(c, &mut x, RedOp::Sum)
            .send(c, &out, to)
            .recv(c, &mut inp, from);
        g.run().unwrap();
        assert!(x.iter().all(|&v| v == NRANKS as f64));
        assert!(inp.iter().all(|&v| v == from as u8));
    });
    (5, 5, 2)
}

/// `name[rank][i]` of an `int [MAX_RANKS][n]` array.
fn code(file: &str, name: &str, n: usize, rank: usize, i: usize) -> i32 {
    assert!(rank < MAX_RANKS && i < n);
    // SAFETY: the plugin defines `int name[MAX_RANKS][n]`.
    unsafe { *(sym(file, name) as *const i32).add(rank * n + i) }
}

/// Runs the calls with `so` loaded and checks what it received; returns
/// the algorithm and protocol named for each rank's last collective.
fn check_events(so: &str, version: i32) -> Vec<(String, String)> {
    let comms = comms_with(so);
    assert_eq!(int(so, "oxtest_prof_version"), version);
    let (groups, colls, p2ps) = make_calls(&comms);
    // The plugin asks for groups, collectives and point-to-points; from v5
    // on it also gets the API events above them (one group API event per
    // group, one API event per call), as NCCL starts them.
    let mut want = vec![(GROUP, groups, 0), (COLL, colls, 0), (P2P, p2ps, 0)];
    if version >= 5 {
        want.extend([
            (GROUP_API, groups, groups),
            (COLL_API, colls, colls),
            (P2P_API, p2ps, p2ps),
        ]);
    }
    assert_kinds(so, &want, if version >= 5 { groups } else { 0 });
    let mut plans = Vec::new();
    for r in 0..NRANKS {
        if version >= 5 {
            // The last calls: the group's all-reduce of 5 doubles and its
            // receive of 17 bytes, in the outermost group.
            assert_eq!(at::<i32>(so, "oxtest_prof_group_api_depth", r), 1);
            assert_eq!(text(so, "oxtest_prof_coll_api_func", r), "AllReduce");
            assert_eq!(text(so, "oxtest_prof_coll_api_dtype", r), "ncclFloat64");
            assert_eq!(at::<usize>(so, "oxtest_prof_coll_api_count", r), 5);
            assert_eq!(at::<i32>(so, "oxtest_prof_coll_api_root", r), 0);
            assert_eq!(text(so, "oxtest_prof_p2p_api_func", r), "Recv");
            assert_eq!(text(so, "oxtest_prof_p2p_api_dtype", r), "ncclUint8");
            assert_eq!(at::<usize>(so, "oxtest_prof_p2p_api_count", r), 17);
        }
        // The last collective: the group's all-reduce of 5 doubles, the
        // fourth all-reduce of this communicator (sequence numbers from 0).
        assert_eq!(text(so, "oxtest_prof_coll_func", r), "AllReduce");
        assert_eq!(text(so, "oxtest_prof_coll_dtype", r), "ncclFloat64");
        assert_eq!(at::<usize>(so, "oxtest_prof_coll_count", r), 5);
        assert_eq!(at::<u64>(so, "oxtest_prof_coll_seq", r), 3);
        let algo = text(so, "oxtest_prof_coll_algo", r);
        // 40 bytes on 4 ranks: the tuner picks one-shot (oxccl's own name,
        // which v1's numbers have none for).
        let unnamed = if version == 1 { "(unknown)" } else { "OneShot" };
        assert!(["Ring", "Tree", unnamed].contains(&algo.as_str()), "{algo}");
        let proto = text(so, "oxtest_prof_coll_proto", r);
        assert!(
            ["LL", "LL128", "Simple"].contains(&proto.as_str()),
            "{proto}"
        );
        assert!(at::<i32>(so, "oxtest_prof_coll_nch", r) >= 1);
        // The last point-to-point: the receive from the previous rank.
        assert_eq!(text(so, "oxtest_prof_p2p_func", r), "Recv");
        assert_eq!(
            at::<i32>(so, "oxtest_prof_p2p_peer", r) as usize,
            (r + NRANKS - 1) % NRANKS
        );
        assert_eq!(at::<usize>(so, "oxtest_prof_p2p_count", r), 17);
        assert_eq!(text(so, "oxtest_prof_p2p_dtype", r), "ncclUint8");
        plans.push((algo, proto));
    }
    assert_eq!(int(so, "oxtest_prof_inits"), NRANKS as i32);
    drop(comms);
    assert_eq!(int(so, "oxtest_prof_finalizes"), NRANKS as i32);
    plans
}

#[test]
fn events_match_the_calls() {
    let _w = Watchdog::new("profiler events", std::time::Duration::from_secs(180));
    let so = profiler(&[], "oxccl-profiler-all");
    check_events(&so, 6);
}

/// Each ABI version gets the same events through its own descriptor: the
/// same counts and fields as v6 (the plan named the same), v1 as NCCL's
/// numbers.
#[test]
fn every_version_gets_its_events() {
    let _w = Watchdog::new("profiler versions", std::time::Duration::from_secs(600));
    let so = profiler(&["PROFILER_VERSION=6"], "oxccl-profiler-v6");
    let want = check_events(&so, 6);
    for v in (1..=5).rev() {
        let so = profiler(
            &[&format!("PROFILER_VERSION={v}")],
            &format!("oxccl-profiler-v{v}"),
        );
        let got = check_events(&so, v);
        for r in 0..NRANKS {
            let (algo, proto) = &want[r];
            if v > 1 {
                assert_eq!(&got[r], &want[r], "v{v} rank {r}");
                continue;
            }
            // ncclFunc_t AllReduce 4, ncclFloat64 8; Recv 7, ncclUint8 1;
            // NCCL_ALGO_* (oxccl's own: NCCL_ALGO_UNDEF as a byte) and
            // NCCL_PROTO_*.
            let algo_code = match algo.as_str() {
                "Tree" => 0,
                "Ring" => 1,
                "OneShot" => 255,
                other => panic!("v6 named algorithm {other}"),
            };
            let proto_code = ["LL", "LL128", "Simple"]
                .iter()
                .position(|p| p == proto)
                .unwrap() as i32;
            let codes: Vec<i32> = (0..4)
                .map(|i| code(&so, "oxtest_prof_coll_codes", 4, r, i))
                .collect();
            assert_eq!(codes, vec![4, 8, algo_code, proto_code], "v1 rank {r}");
            assert_eq!(code(&so, "oxtest_prof_p2p_codes", 2, r, 0), 7);
            assert_eq!(code(&so, "oxtest_prof_p2p_codes", 2, r, 1), 1);
        }
    }
}

#[test]
fn activation_mask_is_honoured_and_broken_profilers_are_refused() {
    let _w = Watchdog::new("profiler mask", std::time::Duration::from_secs(180));
    // Collectives only (v5): no point-to-point events, and, as NCCL starts
    // them, the group API, collective API and group events above the
    // collectives (the plugin checks the parents).
    let so = profiler(&["PROFILER_VERSION=5", "MASK=2"], "oxccl-profiler-coll");
    let comms = comms_with(&so);
    let (groups, colls, _) = make_calls(&comms);
    assert_kinds(
        &so,
        &[
            (GROUP_API, groups, groups),
            (COLL_API, colls, colls),
            (GROUP, groups, groups),
            (COLL, colls, 0),
        ],
        groups,
    );
    drop(comms);
    // The API events only (v6): no group or operation events.
    let so = profiler(&["PROFILER_VERSION=6", "MASK=0x700"], "oxccl-profiler-api");
    let comms = comms_with(&so);
    let (groups, colls, p2ps) = make_calls(&comms);
    assert_kinds(
        &so,
        &[
            (GROUP_API, groups, 0),
            (COLL_API, colls, 0),
            (P2P_API, p2ps, 0),
        ],
        groups,
    );
    drop(comms);
    // Groups only (v6): the group API event above them, nothing below (no
    // operation, API call or proxy event).
    let so = profiler(&["PROFILER_VERSION=6", "MASK=1"], "oxccl-profiler-group");
    let comms = comms_with(&so);
    let (groups, _, _) = make_calls(&comms);
    assert_kinds(
        &so,
        &[(GROUP_API, groups, groups), (GROUP, groups, 0)],
        groups,
    );
    drop(comms);
    // A v4 plugin asking for every kind up to the API events gets none of
    // those (v4 has none; the plugin counts any kind its version lacks as
    // wrong).
    let so = profiler(
        &["PROFILER_VERSION=4", "MASK=0xfff"],
        "oxccl-profiler-v4-all",
    );
    let comms = comms_with(&so);
    let (groups, colls, p2ps) = make_calls(&comms);
    assert_kinds(
        &so,
        &[(GROUP, groups, 0), (COLL, colls, 0), (P2P, p2ps, 0)],
        0,
    );
    drop(comms);
    // init fails: the communicators work without it.
    let so = profiler(&["FAIL_INIT"], "oxccl-profiler-fail");
    let comms = comms_with(&so);
    make_calls(&comms);
    assert_eq!(int(&so, "oxtest_prof_inits"), NRANKS as i32);
    for r in 0..NRANKS {
        assert_eq!(per_kind(&so, "oxtest_prof_started", r, 1), 0, "rank {r}");
    }
}

/// Ranks as threads whose every pair talks over TCP sockets (shared memory
/// and in-process rings disabled): the network transfers NCCL's proxy
/// drives, with ring all-reduces on `CHANNELS` channels.
const CHANNELS: usize = 2;
fn tcp_comms_with(profiler: &str) -> Vec<Communicator> {
    let cfg = test_config(|h| {
        h.profiler_plugin = Some(profiler.to_string());
        h.shm_disable = true;
        h.p2p_disable = true;
        h.algos = oxccl_core::algo::Selection::parse("Ring").unwrap();
        h.min_channels = Some(CHANNELS);
        h.max_channels = Some(CHANNELS);
        h.nchannels = Some(CHANNELS);
    });
    init_threads(NRANKS, &cfg).expect("init")
}

/// `calls` all-reduces of `count` floats on every rank, checked.
fn all_reduces(comms: &[Communicator], calls: usize, count: usize) {
    on_ranks(comms, |c| {
        let r = c.rank();
        for _ in 0..calls {
            let send: Vec<f32> = (0..count).map(|i| ((i + r) % 7) as f32).collect();
            let mut recv = vec![0f32; count];
            c.all_reduce(&send, &mut recv, RedOp::Sum).unwrap();
            for (i, v) in recv.iter().enumerate() {
                let want: usize = (0..NRANKS).map(|q| (i + q) % 7).sum();
                assert_eq!(*v, want as f32, "rank {r} element {i}");
            }
        }
    });
}

/// Over TCP, each ring all-reduce gives on every rank one proxy operation
/// per channel and direction (sending to the next rank, receiving from the
/// previous one), each with the steps it declared, numbered in order under
/// it, each step with its states in NCCL's order (the plugin checks the
/// order and parents; the test the counts), for v6, v4 (the first with
/// the peer-wait and in-progress states) and v1.
#[test]
fn network_transfers_give_proxy_events() {
    let _w = Watchdog::new("profiler proxy events", std::time::Duration::from_secs(300));
    const CALLS: usize = 3;
    // Odd, and large enough for several steps per channel.
    const COUNT: usize = 300_001;
    // Collectives, proxy operations and steps.
    let mask = (1 << COLL) | (1 << PROXY_OP) | (1 << PROXY_STEP);
    for v in [6, 4, 1] {
        let so = profiler(
            &[&format!("PROFILER_VERSION={v}"), &format!("MASK={mask}")],
            &format!("oxccl-profiler-proxy-v{v}"),
        );
        let comms = tcp_comms_with(&so);
        all_reduces(&comms, CALLS, COUNT);
        let calls = CALLS as i32;
        for r in 0..NRANKS {
            assert_eq!(at::<i32>(&so, "oxtest_prof_bad", r), 0, "v{v} rank {r}");
            assert_eq!(at::<i32>(&so, "oxtest_prof_coll_nch", r), CHANNELS as i32);
            let ops = calls * 2 * CHANNELS as i32;
            assert_eq!(
                per_kind(&so, "oxtest_prof_started", r, PROXY_OP),
                ops,
                "v{v} rank {r}"
            );
            assert_eq!(
                per_kind(&so, "oxtest_prof_stopped", r, PROXY_OP),
                ops,
                "v{v} rank {r}"
            );
            assert_eq!(at::<i32>(&so, "oxtest_prof_proxy_sends", r), ops / 2);
            assert_eq!(at::<i32>(&so, "oxtest_prof_proxy_recvs", r), ops / 2);
            // A ring all-reduce of N ranks: 2(N-1) steps per channel and
            // direction at least (more when a step is cut in chunks).
            let steps = at::<i32>(&so, "oxtest_prof_proxy_declared_steps", r);
            let sends = at::<i32>(&so, "oxtest_prof_proxy_send_steps", r);
            let per_op_min = 2 * (NRANKS as i32 - 1);
            assert!(sends >= ops / 2 * per_op_min, "v{v} rank {r}: {sends}");
            // The ring sends what it receives: as many steps each way.
            assert_eq!(steps, 2 * sends, "v{v} rank {r}");
            assert_eq!(per_kind(&so, "oxtest_prof_started", r, PROXY_STEP), steps);
            assert_eq!(per_kind(&so, "oxtest_prof_stopped", r, PROXY_STEP), steps);
            let state = |s| code(&so, "oxtest_prof_states", NSTATES, r, s);
            assert_eq!(state(SEND_WAIT), sends, "v{v} rank {r}");
            assert_eq!(state(RECV_WAIT), steps - sends, "v{v} rank {r}");
            let (peer_wait, in_progress) = if v >= 4 { (sends, ops) } else { (0, 0) };
            assert_eq!(state(SEND_PEER_WAIT), peer_wait, "v{v} rank {r}");
            assert_eq!(state(PROXY_OP_IN_PROGRESS), in_progress, "v{v} rank {r}");
            // No other state but the group API events' two (v5 on).
            let group_api = if v >= 5 { 2 * calls } else { 0 };
            let total: i32 = (0..NSTATES).map(state).sum();
            assert_eq!(
                total,
                steps + peer_wait + in_progress + group_api,
                "v{v} rank {r}"
            );
            // The last operation: one of this rank's ring neighbours.
            let peer = at::<i32>(&so, "oxtest_prof_proxy_peer", r) as usize;
            assert!(
                peer == (r + 1) % NRANKS || peer == (r + NRANKS - 1) % NRANKS,
                "v{v} rank {r}: peer {peer}"
            );
            assert!(at::<i32>(&so, "oxtest_prof_proxy_channel", r) < CHANNELS as i32);
        }
        drop(comms);
    }
    // Ranks of one process reach each other without a network: no proxy
    // events, whatever the mask asks.
    let so = profiler(
        &["PROFILER_VERSION=6", &format!("MASK={mask}")],
        "oxccl-profiler-proxy-local",
    );
    let comms = comms_with(&so);
    all_reduces(&comms, CALLS, COUNT);
    for r in 0..NRANKS {
        assert_eq!(per_kind(&so, "oxtest_prof_started", r, COLL), CALLS as i32);
        assert_eq!(per_kind(&so, "oxtest_prof_started", r, PROXY_OP), 0);
        assert_eq!(per_kind(&so, "oxtest_prof_started", r, PROXY_STEP), 0);
        assert_eq!(at::<i32>(&so, "oxtest_prof_bad", r), 0, "rank {r}");
    }
    drop(comms);
    // Groups only, over TCP: no proxy event (nor anything below groups).
    let so = profiler(
        &["PROFILER_VERSION=6", "MASK=1"],
        "oxccl-profiler-proxy-groups",
    );
    let comms = tcp_comms_with(&so);
    all_reduces(&comms, CALLS, COUNT);
    let groups = CALLS as i32;
    assert_kinds(
        &so,
        &[(GROUP_API, groups, groups), (GROUP, groups, 0)],
        groups,
    );
}
