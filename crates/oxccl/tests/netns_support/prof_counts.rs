//! The C test profiler (oxccl-net's `oxtest_profiler.c`) in rank
//! processes: built once by the parent test, loaded by the ranks through
//! `NCCL_PROFILER_PLUGIN`; each rank runs all-reduces, prints the
//! profiler's counters of its rank on one `OXH_PROF` line, and the parent
//! checks them against the calls made.

use super::{format_logs, RankEnd};
use oxccl::{Communicator, RedOp};

/// The test profiler as v6, asking for collectives, their API events and
/// proxy operations and steps; its path.
pub fn build() -> String {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../oxccl-net/tests/plugins/oxtest_profiler.c");
    // Coll, ProxyOp, ProxyStep, CollApi.
    let mask = format!("MASK={}", (1 << 1) | (1 << 3) | (1 << 4) | (1 << 9));
    let so = oxccl_net::testing::build_c_plugin(
        &src,
        &["PROFILER_VERSION=6", &mask],
        "oxccl-profiler-ranks",
        "libnccl-profiler-oxtest.so",
    );
    so.to_str().unwrap().to_string()
}

/// `int name[16][n]`'s entry `[rank][i]` in the loaded test profiler.
fn prof_int(name: &str, n: usize, rank: usize, i: usize) -> i32 {
    let lib = std::env::var("NCCL_PROFILER_PLUGIN").expect("NCCL_PROFILER_PLUGIN");
    let f = std::ffi::CString::new(lib).unwrap();
    let s = std::ffi::CString::new(name).unwrap();
    assert!(rank < 16 && i < n);
    // SAFETY: the library is loaded already (RTLD_NOLOAD only takes a
    // reference); both names are C strings.
    let h = unsafe { libc::dlopen(f.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!h.is_null(), "the profiler is not loaded");
    // SAFETY: a live handle and a C string.
    let p = unsafe { libc::dlsym(h, s.as_ptr()) } as *const i32;
    assert!(!p.is_null(), "the profiler exports no {name}");
    // SAFETY: the plugin defines `int name[16][n]`; no call into it is in
    // flight (this rank's operations completed).
    unsafe { *p.add(rank * n + i) }
}

/// The rank's side: `calls` all-reduces of `count` floats, checked, then
/// the profiler's counters of this rank: `OXH_PROF key=value ...`.
pub fn run(c: &Communicator, calls: usize, count: usize) {
    let (r, n) = (c.rank(), c.size());
    for _ in 0..calls {
        let send: Vec<f32> = (0..count).map(|i| ((i + r) % 5) as f32).collect();
        let mut recv = vec![-1f32; count];
        c.all_reduce(&send, &mut recv, RedOp::Sum)
            .unwrap_or_else(|e| panic!("all_reduce: {e}"));
        for (i, v) in recv.iter().enumerate() {
            let want: usize = (0..n).map(|q| (i + q) % 5).sum();
            assert_eq!(*v, want as f32, "element {i}");
        }
    }
    let kind = |k| prof_int("oxtest_prof_started", 16, r, k);
    let stopped = |k| prof_int("oxtest_prof_stopped", 16, r, k);
    let state = |s| prof_int("oxtest_prof_states", 32, r, s);
    let one = |name| prof_int(name, 1, r, 0);
    println!(
        "OXH_PROF rank={r} coll={} group_api={} coll_api={} proxy_op={} proxy_op_stopped={} proxy_step={} proxy_step_stopped={} declared={} send_steps={} sends={} recvs={} nch={} peer={} send_wait={} recv_wait={} in_progress={} peer_wait={} bad={}",
        kind(1),
        kind(8),
        kind(9),
        kind(3),
        stopped(3),
        kind(4),
        stopped(4),
        one("oxtest_prof_proxy_declared_steps"),
        one("oxtest_prof_proxy_send_steps"),
        one("oxtest_prof_proxy_sends"),
        one("oxtest_prof_proxy_recvs"),
        one("oxtest_prof_coll_nch"),
        one("oxtest_prof_proxy_peer"),
        state(9),
        state(10),
        state(19),
        state(20),
        one("oxtest_prof_bad"),
    );
}

/// The parent's side, for two ranks on two hosts that ran [`run`] with
/// `calls` all-reduces: on each rank one group API and one collective API
/// event per all-reduce, and per all-reduce one proxy operation per
/// channel and direction to the other rank, each with the steps it
/// declared (the plugin checks their numbering, parents and states'
/// order), every step's states counted exactly.
pub fn check_two_hosts(ends: &[RankEnd], calls: usize) {
    assert_eq!(ends.len(), 2);
    for e in ends {
        let line = e
            .log
            .lines()
            .find_map(|l| l.split_once("OXH_PROF ").map(|(_, v)| v))
            .unwrap_or_else(|| {
                panic!("rank {} printed no counters\n{}", e.rank, format_logs(ends))
            });
        let field = |k: &str| -> i32 {
            line.split(' ')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("no {k} in {line}"))
                .parse()
                .unwrap()
        };
        let calls = calls as i32;
        let nch = field("nch");
        assert!(nch >= 1, "{line}");
        assert_eq!(field("rank"), e.rank as i32, "{line}");
        assert_eq!(field("bad"), 0, "{line}");
        assert_eq!(field("coll"), calls, "{line}");
        assert_eq!(field("group_api"), calls, "{line}");
        assert_eq!(field("coll_api"), calls, "{line}");
        // The other rank is the ring's next and previous rank.
        let ops = calls * nch * 2;
        assert_eq!(field("proxy_op"), ops, "{line}");
        assert_eq!(field("proxy_op_stopped"), ops, "{line}");
        assert_eq!(field("sends"), ops / 2, "{line}");
        assert_eq!(field("recvs"), ops / 2, "{line}");
        assert_eq!(field("peer"), 1 - e.rank as i32, "{line}");
        let (steps, sends) = (field("declared"), field("send_steps"));
        // Two ranks: a reduce-scatter step and an all-gather step per
        // channel and direction at least.
        assert!(sends >= ops / 2 * 2, "{line}");
        assert_eq!(steps, 2 * sends, "{line}");
        assert_eq!(field("proxy_step"), steps, "{line}");
        assert_eq!(field("proxy_step_stopped"), steps, "{line}");
        assert_eq!(field("send_wait"), sends, "{line}");
        assert_eq!(field("peer_wait"), sends, "{line}");
        assert_eq!(field("recv_wait"), steps - sends, "{line}");
        assert_eq!(field("in_progress"), ops, "{line}");
        eprintln!("rank {}: {line}", e.rank);
    }
}
